"""The challenge-response MAC shared by the barrier and the relay (slurm_multi.auth)."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import shutil
import subprocess
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi import auth

# RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
RFC4231_KEY = "Jefe"
RFC4231_DATA = "what do ya want for nothing?"
RFC4231_SHA256 = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not on PATH")


def test_mac_matches_rfc4231_test_case_2():
    assert auth.mac(RFC4231_KEY, RFC4231_DATA) == RFC4231_SHA256


def test_mac_joins_fields_with_a_bar():
    assert auth.mac("k", "a", "b", "c") == auth.mac("k", "a|b|c")
    assert auth.mac("k", "a", "b") != auth.mac("k", "ab")
    assert auth.mac("k", "a", "b") != auth.mac("k", "b", "a")
    assert auth.mac("k") == auth.mac("k", "")


def test_mac_is_lowercase_hex_of_64_characters():
    value = auth.mac("token", "nonce", "1", "relay")
    assert len(value) == auth.MAC_HEX == 64
    assert value == value.lower() and int(value, 16) >= 0


def test_check_accepts_the_right_mac():
    nonce = auth.new_nonce()
    assert auth.check("s3cret", auth.mac("s3cret", nonce, "2", "relay"), nonce, "2", "relay")


def test_check_refuses_a_wrong_token():
    nonce = auth.new_nonce()
    assert not auth.check("s3cret", auth.mac("guess", nonce, "2", "relay"), nonce, "2", "relay")


def test_check_refuses_other_fields():
    nonce = auth.new_nonce()
    given = auth.mac("s3cret", nonce, "2", "relay")
    assert not auth.check("s3cret", given, nonce, "3", "relay")
    assert not auth.check("s3cret", given, auth.new_nonce(), "2", "relay")


@pytest.mark.parametrize(
    "given",
    ["", "zz", RFC4231_SHA256.upper(), RFC4231_SHA256[:-1], RFC4231_SHA256 + "0", " " + RFC4231_SHA256[1:],
     "g" * 64, "\u0661" * 64, None, b"00" * 32],
)  # fmt: skip
def test_check_is_false_for_a_malformed_mac(given):
    assert auth.check(RFC4231_KEY, given, RFC4231_DATA) is False


def test_new_nonce_is_fresh_lowercase_hex():
    nonces = {auth.new_nonce() for _ in range(100)}
    assert len(nonces) == 100
    assert all(auth.is_nonce(n) and len(n) == auth.NONCE_HEX == 32 for n in nonces)


@pytest.mark.parametrize("text", ["", "0" * 31, "0" * 33, "A" * 32, "g" * 32, "\u0661" * 32, " " + "0" * 31])
def test_is_nonce_rejects_everything_but_32_lowercase_hex(text):
    assert not auth.is_nonce(text)


def _docstring_bash_function() -> str:
    doc = auth.__doc__ or ""
    start = doc.index("hmac_sha256() {")
    end = doc.index("\n      }\n", start) + len("\n      }\n")
    return textwrap.dedent("      " + doc[start:end])


@needs_openssl
def test_openssl_dgst_hmac_recipe_gives_the_same_mac():
    fields = (auth.new_nonce(), "3", "relay:image")
    out = subprocess.run(
        ["bash", "-c", 'printf "%s" "$MSG" | openssl dgst -sha256 -hmac "$KEY" -r'],
        env={**os.environ, "KEY": "job-token_42", "MSG": "|".join(fields)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split()[0] == auth.mac("job-token_42", *fields)


@needs_openssl
@pytest.mark.parametrize("token", ["Jefe", "x", "!#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "k" * 64])
def test_bash_recipe_without_the_key_in_argv_gives_the_same_mac(token):
    fields = (auth.new_nonce(), "12", "relay:image")
    script = _docstring_bash_function() + 'hmac_sha256 "$KEY" "$MSG"\n'
    out = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, "KEY": token, "MSG": "|".join(fields)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == auth.mac(token, *fields)


@settings(max_examples=300)
@given(st.text(max_size=150), st.lists(st.text(max_size=20), max_size=4))
def test_mac_is_the_stdlib_s_hmac_sha256_for_any_token_and_fields(token: str, fields: list[str]):
    """Keys shorter and longer than SHA-256's block (64 bytes), any UTF-8."""
    try:
        key, message = token.encode("utf-8"), "|".join(fields).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: neither side takes it
        return
    assert auth.mac(token, *fields) == hmac.new(key, message, hashlib.sha256).hexdigest()


@settings(max_examples=300)
@given(st.text(alphabet="0123456789abcdefABCDEF\n ٣", max_size=70) | st.text(max_size=70))
def test_is_hex_is_the_regex_rule(text: str):
    for length in (auth.NONCE_HEX, auth.MAC_HEX, len(text)):
        assert auth.is_hex(text, length) == bool(re.fullmatch(f"[0-9a-f]{{{length}}}", text))
