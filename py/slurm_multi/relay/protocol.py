"""The relay's wire format: pure functions that build or parse one line or one frame.

One TCP connection per parent -> child link; lines are ASCII and end in `\\n`:

    parent -> child   SM-RELAY/1 HELLO <nonce_p>
    child  -> parent  AUTH <rank_c> <purpose> <nonce_c> <mac(token, nonce_p, rank_c, purpose, "child")>
    parent -> child   OK <rank_p> <mac(token, nonce_c, nonce_p, rank_p, rank_c, purpose, "parent")>
                      | DENY <reason>
    parent -> child   SM-RELAY/1 STREAM <purpose>                   (the header)
    child  -> parent  READY | FAIL <reason>                       (its whole subtree is connected)
    parent -> child   frames: 1 type byte + 4-byte big-endian length + 16-byte tag + payload
                        D  1..4 MiB of the stream (the payload forwarded downstream byte for byte)
                        P  empty: rank 0's source is quiet but rank 0 is alive (keeps stall timers quiet)
                        E  the trailer: total length (8 bytes BE) + the stream's chain digest (32 bytes)
                        A  abort: the first failure's one-line reason (UTF-8), forwarded unchanged
                      a layered stream (slurm_multi.relay.sections) adds:
                        L  first: the layer count and what each rank holds (JSON)
                        S  a section starts: its label (4 bytes BE); its D frames follow
                        T  instead of E: per receiving threshold its total and chain digest, and the
                           bytes of every layer's blob (JSON)
    child  -> parent  READY <tag> (its whole subtree is connected) | FAIL <reason>, then WAIT (every
                      few seconds while it streams or waits for its own subtree), then
                      DONE <nodes verified in its subtree> <tag> | FAIL <reason>

The token (from $SM_BARRIER_TOKEN) never crosses the wire: both sides prove they hold it with
slurm_multi.auth's challenge-response, and each link then has its own key,
`mac(token, "link", nonce_p, nonce_c, rank_p, rank_c, purpose)`. Every frame's tag is
HMAC-SHA256(link key, seq || type || length || sha256(payload)), cut to 16 bytes, with seq counting
the link's frames from 0. A receiver checks it before the payload goes anywhere (stdout or a child),
so a forged, altered, reordered or replayed frame (another link's, or this link's earlier one) is
never written: the node fails naming its upstream. Each hop hashes each payload once (the digest
the tags of every link are made from) and chains the digests, `chain = sha256(chain || digest)`;
the trailer carries rank 0's chain and the total, so every node also checks that it got rank 0's
stream, not only its parent's. The stream is authenticated, not encrypted: an image is not a
secret on a cluster whose users share its registry and nodes, and encrypting would cost a second
pass over every byte on every hop; docs/relay.md says so.

Every function here is pure and raises ProtocolError and nothing else on a bad line or frame; the
lines share the barrier's framing, rank and token rules (slurm_multi.wire). Where the bytes go is
slurm_multi.relay.link (one connection) and slurm_multi.relay.forward (the stream).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import struct

from slurm_multi import auth
from slurm_multi.wire import ProtocolError, decode_line
from slurm_multi.words import is_rank

MAGIC = "SM-RELAY/1"
DEFAULT_PURPOSE = "image"
PURPOSE_RE = re.compile(r"[a-z0-9][a-z0-9._:-]{0,63}")

FRAME = struct.Struct("!cI16s")  # type, payload length, tag
TAGGED = struct.Struct("!QcI")  # what a tag covers before the payload's digest: seq, type, length
TAG_BYTES = 16
DATA, PING, END, ABORT = b"D", b"P", b"E", b"A"
LAYOUT, SECTION, LAYERED_END = b"L", b"S", b"T"  # a layered stream's (slurm_multi.relay.sections)
SECTION_LABEL = struct.Struct("!I")
MAX_META = 1 << 20  # an L or T frame's JSON
TRAILER = struct.Struct("!Q32s")  # total length, chain digest
EMPTY_DIGEST = hashlib.sha256(b"").digest()
CHAIN_START = bytes(32)
CHUNK = 1 << 20  # what rank 0 puts in one frame
MAX_FRAME = 4 << 20  # the most a receiver accepts in one frame
MAX_LINE = 512  # bytes per protocol line, newline included
MAX_REASON = 400


def _decode(line: bytes | str) -> str:
    return decode_line(line, MAX_LINE)


def _rank(text: str) -> int:
    if not is_rank(text):
        raise ProtocolError(f"bad rank {text[:20]!r}")
    return int(text)


def clean_reason(text: str) -> str:
    """One printable line of at most MAX_REASON characters (peer text is never trusted as is)."""
    flat = " ".join(text.split())
    flat = "".join(ch if ch.isprintable() and ch.isascii() else "?" for ch in flat)
    return (flat[: MAX_REASON - 3] + "...") if len(flat) > MAX_REASON else flat or "no reason given"


def hello_line(nonce: str) -> bytes:
    return f"{MAGIC} HELLO {nonce}\n".encode()


def parse_hello(line: bytes | str) -> str:
    parts = _decode(line).split(" ")
    if len(parts) != 3 or parts[0] != MAGIC or parts[1] != "HELLO":
        raise ProtocolError("not a relay greeting")
    if not auth.is_nonce(parts[2]):
        raise ProtocolError("bad nonce")
    return parts[2]


def auth_line(token: str, nonce_p: str, rank: int, purpose: str, nonce_c: str) -> bytes:
    proof = auth.mac(token, nonce_p, str(rank), purpose, "child")
    return f"AUTH {rank} {purpose} {nonce_c} {proof}\n".encode()


def parse_auth(line: bytes | str) -> tuple[int, str, str, str]:
    """(rank, purpose, child nonce, proof) from an AUTH line."""
    parts = _decode(line).split(" ")
    if len(parts) != 5 or parts[0] != "AUTH":
        raise ProtocolError("malformed AUTH")
    if not PURPOSE_RE.fullmatch(parts[2]):
        raise ProtocolError("bad purpose")
    if not auth.is_nonce(parts[3]):
        raise ProtocolError("bad nonce")
    return _rank(parts[1]), parts[2], parts[3], parts[4]


def parent_proof(token: str, nonce_c: str, nonce_p: str, rank_p: int, rank_c: int, purpose: str) -> str:
    return auth.mac(token, nonce_c, nonce_p, str(rank_p), str(rank_c), purpose, "parent")


def parse_answer(line: bytes | str) -> tuple[str, int, str]:
    """("OK", parent rank, proof) or ("DENY", 0, reason)."""
    text = _decode(line)
    verb, _, rest = text.partition(" ")
    if verb == "DENY":
        return "DENY", 0, clean_reason(rest)
    parts = rest.split(" ")
    if verb != "OK" or len(parts) != 2:
        raise ProtocolError("expected OK or DENY")
    return "OK", _rank(parts[0]), parts[1]


def header_line(purpose: str) -> bytes:
    return f"{MAGIC} STREAM {purpose}\n".encode()


def parse_header(line: bytes | str) -> str:
    """The stream's purpose from the header line (magic + version)."""
    parts = _decode(line).split(" ")
    if len(parts) != 3 or parts[1] != "STREAM":
        raise ProtocolError("not a stream header")
    if parts[0] != MAGIC:
        if parts[0].startswith("SM-RELAY/"):
            raise ProtocolError(f"unsupported version {parts[0]!r} (this relay speaks {MAGIC})")
        raise ProtocolError("bad magic")
    if not PURPOSE_RE.fullmatch(parts[2]):
        raise ProtocolError("bad purpose")
    return parts[2]


def status_line(key: bytes, verb: str, count: int = 0) -> bytes:
    """READY <tag> or DONE <count> <tag>, tagged with the link key (a forged DONE would tell rank 0
    that a node verified the stream when it did not)."""
    if verb == "READY":
        return f"READY {line_tag(key, 'ready')}\n".encode()
    return f"DONE {count} {line_tag(key, 'done', str(count))}\n".encode()


def parse_status(line: bytes | str, verb: str, key: bytes = b"") -> tuple[bool, int, str]:
    """A child's READY / DONE <n> (ok, n, "") or FAIL <reason> (False, 0, reason); with `key`,
    READY and DONE must carry the link's tag."""
    text = _decode(line)
    head, _, rest = text.partition(" ")
    if key and head == verb:
        rest, _, tag = rest.rpartition(" ") if verb == "DONE" else ("", "", rest)
        want = line_tag(key, "ready") if verb == "READY" else line_tag(key, "done", rest)
        if not hmac.compare_digest(tag.encode(), want.encode()):
            raise ProtocolError(f"{verb} without the link's tag")
    if head == "FAIL":
        return False, 0, clean_reason(rest)
    if head != verb:
        raise ProtocolError(f"expected {verb} or FAIL")
    if verb == "READY":
        if rest:
            raise ProtocolError("malformed READY")
        return True, 0, ""
    return True, _rank(rest), ""


def parse_frame_header(raw: bytes | bytearray | memoryview) -> tuple[bytes, int, bytes]:
    """(type, length, tag) of a frame header; lengths are checked against the type."""
    if len(raw) != FRAME.size:
        raise ProtocolError("short frame header")
    kind, length, tag = FRAME.unpack(raw)
    if kind == DATA:
        if not 1 <= length <= MAX_FRAME:
            raise ProtocolError(f"data frame of {length} bytes (1..{MAX_FRAME})")
    elif kind == PING:
        if length:
            raise ProtocolError("ping frame with a payload")
    elif kind == END:
        if length != TRAILER.size:
            raise ProtocolError(f"trailer of {length} bytes, expected {TRAILER.size}")
    elif kind == ABORT:
        if length > 4 * MAX_REASON:
            raise ProtocolError("abort reason too long")
    elif kind == SECTION:
        if length != SECTION_LABEL.size:
            raise ProtocolError(f"section frame of {length} bytes, expected {SECTION_LABEL.size}")
    elif kind in (LAYOUT, LAYERED_END):
        if not 1 <= length <= MAX_META:
            raise ProtocolError(f"{kind.decode()} frame of {length} bytes (1..{MAX_META})")
    else:
        raise ProtocolError(f"unknown frame type 0x{kind[0]:02x}")
    return kind, length, tag


def link_key(token: str, nonce_p: str, nonce_c: str, rank_p: int, rank_c: int, purpose: str) -> bytes:
    """The key of one parent -> child link: both nonces are fresh, so no two links share it."""
    return bytes.fromhex(auth.mac(token, "link", nonce_p, nonce_c, str(rank_p), str(rank_c), purpose))


def frame_tag(key: bytes, seq: int, kind: bytes, length: int, digest: bytes) -> bytes:
    """The tag of frame `seq` on a link: HMAC-SHA256 over seq, type, length and the payload's
    sha256, cut to 16 bytes."""
    return hmac.digest(key, TAGGED.pack(seq, kind, length) + digest, "sha256")[:TAG_BYTES]


def line_tag(key: bytes, *fields: str) -> str:
    """The tag of a status line a child sends up (READY, DONE), as 32 hex characters."""
    return hmac.digest(key, "|".join(fields).encode(), "sha256")[:TAG_BYTES].hex()


def chain(previous: bytes, digest: bytes) -> bytes:
    """The stream's digest so far: each frame's sha256 chained onto the previous value."""
    return hashlib.sha256(previous + digest).digest()


def trailer_payload(total: int, stream_digest: bytes) -> bytes:
    return TRAILER.pack(total, stream_digest)


def parse_trailer(payload: bytes | bytearray | memoryview) -> tuple[int, bytes]:
    if len(payload) != TRAILER.size:
        raise ProtocolError("bad trailer size")
    return TRAILER.unpack(payload)


def abort_payload(reason: str) -> bytes:
    return clean_reason(reason).encode("utf-8")


def section_payload(label: int) -> bytes:
    return SECTION_LABEL.pack(label)


def parse_section(payload: bytes | bytearray | memoryview) -> int:
    if len(payload) != SECTION_LABEL.size:
        raise ProtocolError("bad section size")
    return int(SECTION_LABEL.unpack(payload)[0])


def _json_payload(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _json_of(payload: bytes | bytearray | memoryview, what: str) -> dict:
    try:
        value = json.loads(bytes(payload))
    except (ValueError, RecursionError):
        raise ProtocolError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} is not an object")
    return value


def _is_count(value: object, top: int = 1 << 62) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= top


def layout_payload(layers: int, prefixes: list[int]) -> bytes:
    """The L frame: the image's layer count and, by rank, how many of them each node holds."""
    return _json_payload({"layers": layers, "prefixes": prefixes})


def parse_layout(payload: bytes | bytearray | memoryview, nnodes: int) -> tuple[int, list[int]]:
    value = _json_of(payload, "the layer layout")
    layers, prefixes = value.get("layers"), value.get("prefixes")
    if not _is_count(layers, 1 << 16) or not isinstance(prefixes, list) or len(prefixes) != nnodes:
        raise ProtocolError(f"a layer layout that is not {nnodes} prefixes of a chain")
    if not all(_is_count(p, layers) for p in prefixes):  # type: ignore[arg-type]
        raise ProtocolError("a layer layout with a prefix longer than the chain")
    return int(layers), [int(p) for p in prefixes]


def layered_trailer_payload(totals: dict[int, tuple[int, bytes]], sizes: dict[int, int]) -> bytes:
    """The T frame: per threshold (what a node's link carried) its total and chain digest; the bytes
    of every layer's blob by label (so that a node can say what it held)."""
    return _json_payload({
        "totals": {str(m): [total, digest.hex()] for m, (total, digest) in sorted(totals.items())},
        "sizes": {str(label): size for label, size in sorted(sizes.items())},
    })  # fmt: skip


def parse_layered_trailer(
    payload: bytes | bytearray | memoryview,
) -> tuple[dict[int, tuple[int, bytes]], dict[int, int]]:
    value = _json_of(payload, "the layered trailer")
    totals, sizes = value.get("totals"), value.get("sizes")
    if not isinstance(totals, dict) or not isinstance(sizes, dict):
        raise ProtocolError("a layered trailer without totals and sizes")
    out: dict[int, tuple[int, bytes]] = {}
    try:
        for key, (total, digest) in totals.items():
            chained = bytes.fromhex(digest)
            if not _is_count(total) or len(chained) != 32:
                raise ValueError
            out[int(key)] = (total, chained)
        blobs = {int(key): size for key, size in sizes.items() if _is_count(size)}
    except (ValueError, TypeError):
        raise ProtocolError("a malformed layered trailer") from None
    if len(blobs) != len(sizes):
        raise ProtocolError("a malformed layered trailer")
    return out, blobs
