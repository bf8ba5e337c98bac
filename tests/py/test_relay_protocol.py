"""The relay's wire format (slurm_multi.relay.protocol): parsers reject garbage, and nothing but
ProtocolError escapes them; tags and the trailer cover what the docstring says."""

from __future__ import annotations

import hashlib

import pytest

from slurm_multi.relay import protocol
from slurm_multi.wire import ProtocolError

TOKEN = "job-token-" + "a" * 20
NONCE = "0123456789abcdef" * 2


@pytest.mark.parametrize(
    "line",
    [b"", b"\n", b"HELLO\n", f"SM-RELAY/2 HELLO {NONCE}\n".encode(), f"SM-RELAY/1 HI {NONCE}\n".encode(),
     b"SM-RELAY/1 HELLO 1234\n", f"SM-RELAY/1 HELLO {NONCE.upper()}\n".encode(), b"\xff" * 40,
     b"x" * 600 + b"\n", f"SM-RELAY/1 HELLO {NONCE} extra\n".encode()],
)  # fmt: skip
def test_the_greeting_parser_rejects_garbage(line):
    with pytest.raises(ProtocolError):
        protocol.parse_hello(line)


@pytest.mark.parametrize(
    "line",
    [b"AUTH\n", f"AUTH 01 image {NONCE} {'a' * 64}\n".encode(), f"AUTH -1 image {NONCE} x\n".encode(),
     f"AUTH 1 IMAGE {NONCE} x\n".encode(), b"AUTH 1 image nonce x\n", b"READY 1 image\n",
     f"AUTH \u0661 image {NONCE} x\n".encode()],
)  # fmt: skip
def test_the_auth_parser_rejects_garbage(line):
    with pytest.raises(ProtocolError):
        protocol.parse_auth(line)


@pytest.mark.parametrize(
    "line",
    [b"SM-RELAY/1 STREAM\n", b"SM-RELAY/9 STREAM image\n", b"NOPE/1 STREAM image\n",
     b"SM-RELAY/1 DATA image\n", b"SM-RELAY/1 STREAM Image\n", b"SM-RELAY/1 STREAM image extra\n",
     b"\x00\x01\x02\n"],
)  # fmt: skip
def test_the_header_parser_rejects_garbage(line):
    with pytest.raises(ProtocolError):
        protocol.parse_header(line)


def test_the_header_parser_names_an_unsupported_version():
    with pytest.raises(ProtocolError, match="unsupported version 'SM-RELAY/9'"):
        protocol.parse_header(b"SM-RELAY/9 STREAM image\n")
    assert protocol.parse_header(protocol.header_line("image")) == "image"


@pytest.mark.parametrize(
    "raw",
    [b"D\x00\x00\x00\x00", b"D" + (protocol.MAX_FRAME + 1).to_bytes(4, "big"), b"P\x00\x00\x00\x01",
     b"E\x00\x00\x00\x10", b"X\x00\x00\x00\x01", b"A\x00\x01\x00\x00"],
)  # fmt: skip
def test_the_frame_parser_rejects_garbage(raw):
    with pytest.raises(ProtocolError):
        protocol.parse_frame_header(raw + bytes(protocol.TAG_BYTES))
    with pytest.raises(ProtocolError, match="short frame header"):
        protocol.parse_frame_header(b"D\x00\x00\x00\x01" + bytes(protocol.TAG_BYTES - 1))


def test_the_trailer_round_trips_and_rejects_a_wrong_size():
    stream = protocol.chain(protocol.CHAIN_START, hashlib.sha256(b"abc").digest())
    payload = protocol.trailer_payload(3, stream)
    assert protocol.parse_trailer(payload) == (3, stream)
    for bad in (b"", payload[:-1], payload + b"x"):
        with pytest.raises(ProtocolError):
            protocol.parse_trailer(bad)


def test_a_tag_covers_the_sequence_the_type_the_length_and_the_payload():
    key, digest = b"k" * 32, hashlib.sha256(b"abc").digest()
    tag = protocol.frame_tag(key, 7, protocol.DATA, 3, digest)
    assert len(tag) == protocol.TAG_BYTES
    assert tag != protocol.frame_tag(key, 8, protocol.DATA, 3, digest)
    assert tag != protocol.frame_tag(key, 7, protocol.ABORT, 3, digest)
    assert tag != protocol.frame_tag(key, 7, protocol.DATA, 4, digest)
    assert tag != protocol.frame_tag(key, 7, protocol.DATA, 3, hashlib.sha256(b"abd").digest())
    assert tag != protocol.frame_tag(b"K" * 32, 7, protocol.DATA, 3, digest)
    # Each link's key is its own: the same token with other nonces or ranks gives another key.
    one = protocol.link_key(TOKEN, NONCE, "b" * 32, 0, 1, "image")
    assert one != protocol.link_key(TOKEN, NONCE, "c" * 32, 0, 1, "image")
    assert one != protocol.link_key(TOKEN, NONCE, "b" * 32, 1, 2, "image")
    assert one != protocol.link_key("other", NONCE, "b" * 32, 0, 1, "image")


def test_status_lines_and_abort_reasons_are_cleaned():
    key = b"k" * 32
    assert protocol.parse_status(protocol.status_line(key, "READY"), "READY", key) == (True, 0, "")
    assert protocol.parse_status(protocol.status_line(key, "DONE", 7), "DONE", key) == (True, 7, "")
    assert protocol.parse_status(b"FAIL it  broke\n", "DONE", key) == (False, 0, "it broke")
    # A READY or DONE without this link's tag (forged by whoever sits on the link) is no status.
    for forged in (b"READY\n", b"DONE 7\n", protocol.status_line(b"x" * 32, "DONE", 7), b"DONE 8 "
                   + protocol.status_line(key, "DONE", 7).split(b" ")[2]):  # fmt: skip
        with pytest.raises(ProtocolError):
            protocol.parse_status(forged, forged.split(b" ")[0].strip().decode(), key)
    with pytest.raises(ProtocolError):
        protocol.parse_status(b"DONE x\n", "DONE")
    reason = protocol.abort_payload("line one\nline\x07two " + "y" * 1000).decode()
    assert "\n" not in reason and "\x07" not in reason and len(reason) <= protocol.MAX_REASON
