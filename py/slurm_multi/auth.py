r"""Challenge-response keyed by the job's token, shared by the barrier and the relay.

The token never crosses the wire. Each side sends a fresh random nonce; the peer proves that it
holds the token by answering with `mac(token, peer_nonce, field, ...)`, the HMAC-SHA256 of the
peer's nonce joined with the message's own fields (rank, purpose, ...). A recorded answer is
useless later (the nonce is new every time) and cannot be moved to another rank or purpose (the
fields are inside the MAC). Both sides check the other before trusting anything it sends.

Message encoding (decided once, here): the fields are joined with `|` and encoded as UTF-8, so
`mac(k, "a", "b")` is HMAC-SHA256(k, b"a|b"). `|` is not escaped: callers keep it out of their
fields (nonces are hex, ranks are digits, purposes are fixed words), which is why ("a|b",) and
("a", "b") MAC alike. The key is the token's UTF-8 bytes; the MAC is 64 lowercase hex characters.

The same MAC from bash. Short and portable, but the key is in openssl's argv, which any user on
the node can read in /proc/<pid>/cmdline (or `ps`) while it runs:

    printf '%s' "$nonce|$rank|$purpose" | openssl dgst -sha256 -hmac "$KEY" -r   # hex, then ' *stdin'

What OpenSSL offers to keep the key out of argv (checked against OpenSSL 3.0 and its man pages):

- `openssl dgst -hmac KEY`, `openssl dgst -mac HMAC -macopt key:KEY|hexkey:HEX` and
  `openssl mac -digest SHA256 -macopt key:KEY|hexkey:HEX HMAC` all take the key on the command
  line; `-macopt hexkey:` only hides its spelling, not the secret. OpenSSL 3.0 (the version on
  current clusters) has no option to read a MAC key from a file, a descriptor or the environment
  (`-passin` is for private-key pass phrases only; openssl/openssl#13382 and #24584 ask for one).
- Newer OpenSSL documents `openssl dgst -hmac-env VAR` and `-hmac-stdin` (the master man page,
  3.6); where `openssl dgst -help` lists `-hmac-env`, use
  `printf '%s' "$msg" | openssl dgst -sha256 -hmac-env SM_BARRIER_TOKEN -r`.
- Anywhere, HMAC can be built from two plain digests, feeding the key through a pipe written by
  bash's builtin `printf` (builtins never show in /proc/<pid>/cmdline):
  HMAC(K, m) = SHA256((K0 ^ opad) || SHA256((K0 ^ ipad) || m)), K0 = K padded with zero bytes to
  64 bytes (a token is at most 64 bytes, so K0 is never a hash of K), ipad = 0x36..., opad = 0x5c...

      hmac_sha256() {  # KEY MESSAGE -> lowercase hex on stdout; the key stays out of every argv
        local key=$1 msg=$2 i byte ipad='' opad='' inner
        (( ${#key} <= 64 )) || return 1
        for (( i = 0; i < 64; i++ )); do
          if (( i < ${#key} )); then printf -v byte '%d' "'${key:i:1}"; else byte=0; fi
          printf -v ipad '%s\\x%02x' "$ipad" $(( byte ^ 0x36 ))
          printf -v opad '%s\\x%02x' "$opad" $(( byte ^ 0x5c ))
        done
        inner=$( { printf "$ipad"; printf '%s' "$msg"; } | openssl dgst -sha256 -binary \
                 | od -An -v -tx1 | tr -d ' \n' | sed 's/../\\x&/g')
        { printf "$opad"; printf "$inner"; } | openssl dgst -sha256 -r | cut -d' ' -f1
      }

  (For ASCII tokens, which the barrier's token rule guarantees. tests/py/test_auth.py runs both
  recipes against `mac()`.) Simplest of all where Python is present: call this module, with the
  token in the environment.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

NONCE_HEX = 32  # a nonce is 16 random bytes written as 32 lowercase hex characters
MAC_HEX = 64  # HMAC-SHA256 as lowercase hex
SEPARATOR = "|"
_HEX = {length: re.compile(f"[0-9a-f]{{{length}}}") for length in (NONCE_HEX, MAC_HEX)}


def is_hex(text: object, length: int) -> bool:
    """True for exactly `length` lowercase hex characters (ASCII only)."""
    pattern = _HEX.get(length) or re.compile(f"[0-9a-f]{{{length}}}")
    return isinstance(text, str) and pattern.fullmatch(text) is not None


def new_nonce() -> str:
    """A fresh challenge: 16 random bytes as 32 lowercase hex characters."""
    return secrets.token_hex(NONCE_HEX // 2)


def is_nonce(text: str) -> bool:
    """True for exactly 32 lowercase hex characters (ASCII only)."""
    return is_hex(text, NONCE_HEX)


def mac(token: str, *fields: str) -> str:
    """Lowercase hex HMAC-SHA256 keyed by `token` over `"|".join(fields)` (both UTF-8)."""
    message = SEPARATOR.join(fields).encode("utf-8")
    return hmac.new(token.encode("utf-8"), message, hashlib.sha256).hexdigest()


def check(token: str, given: str, *fields: str) -> bool:
    """Whether `given` is `mac(token, *fields)`, compared in constant time; False when malformed."""
    if not is_hex(given, MAC_HEX):
        return False
    return hmac.compare_digest(given, mac(token, *fields))
