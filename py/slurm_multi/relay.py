"""Node-to-node relay for one byte stream (a `docker save`): no shared storage, forward as received.

Rank 0 reads the stream on stdin and sends it to its children; every other rank connects to its
parent, writes the stream to stdout (the caller pipes it into `docker load`) and forwards the same
bytes to its own children while it receives them. Nothing holds more than one frame (1 MiB).

Topology: ranks 0..N-1 in a tree of fanout K: the parent of r is (r-1)//K, its children are
r*K+1 .. r*K+K below N. K=1 (the default) is a chain: r-1 -> r -> r+1.

Ports: rank r listens on `derive_ports(MASTER_PORT, SLURM_JOB_ID + 64 + r*count, ...)`
(slurm_multi.net's derivation: the same on every node, outside the ephemeral range, never
MASTER_PORT, clear of the barrier's own candidates), on the address `choose_bind_address` picks
(never loopback). A child computes its parent's candidates the same way and dials them at
`connect_addresses(parent host)`.

Wire format (one TCP connection per parent -> child link; lines are ASCII and end in `\\n`):

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
pass over every byte on every hop; docs/relay.md says so. A stream that ends without a trailer, an
abort, or a mismatch fails the node with a one-line reason naming the upstream. A node whose
upstream fails aborts its children at once, so the whole subtree fails within seconds; a parent that
sends nothing for --stall-timeout seconds (or a child that takes nothing for that long) is given up
on.

Exit codes: 0 stream delivered and verified (rank 0: by every node), 1 runtime failure, 2 usage
or rejected (wrong token, wrong purpose), 3 timeout (a peer never came, or stalled).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import select
import selectors
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import click

from slurm_multi import EXIT_FAILURE, auth, net
from slurm_multi.common import HelperError, talk, timeout_error, usage_error
from slurm_multi.wire import DEFAULT_TOKEN_ENV, ProtocolError, decode_line, read_token
from slurm_multi.words import is_rank

MAGIC = "SM-RELAY/1"
DEFAULT_PURPOSE = "image"
PURPOSE_RE = re.compile(r"[a-z0-9][a-z0-9._:-]{0,63}")

FRAME = struct.Struct("!cI16s")  # type, payload length, tag
TAGGED = struct.Struct("!QcI")  # what a tag covers before the payload's digest: seq, type, length
TAG_BYTES = 16
DATA, PING, END, ABORT = b"D", b"P", b"E", b"A"
TRAILER = struct.Struct("!Q32s")  # total length, chain digest
EMPTY_DIGEST = hashlib.sha256(b"").digest()
CHAIN_START = bytes(32)
CHUNK = 1 << 20  # what rank 0 puts in one frame
MAX_FRAME = 4 << 20  # the most a receiver accepts in one frame
MAX_LINE = 512  # bytes per protocol line, newline included
MAX_REASON = 400

# Relay ports sit past anything the barrier may use (at most MAX_CANDIDATES, plus MASTER_PORT).
RELAY_PORT_OFFSET = 2 * net.MAX_CANDIDATES
DEFAULT_PORT_COUNT = 4
HANDSHAKE_TIMEOUT = 10.0  # a child's wait for the stream header once its parent proved the token
MAX_PENDING = 64  # handshakes a parent keeps open at once
BACKOFF_START, BACKOFF_MAX = 0.05, 1.0
READY_GRACE = 10.0  # a parent waits this much longer than a child, so the child's reason arrives
ABORT_SEND_TIMEOUT = 1.0
F_SETPIPE_SZ = 1031  # fcntl: a 1 MiB pipe moves the stream in fewer, larger reads and writes
# A peer that vanishes without a FIN (a node powered off) is noticed by the stall timer first;
# keepalive is the backstop for an idle link (rank 0 waiting on its source, the DONE wait), so it
# probes sooner than the barrier's. No Nagle delay on the status lines and small last frames.
KEEPALIVE = net.Keepalive(idle=10, interval=5, probes=3, nodelay=True)

Log = Callable[[str], None]


def _talk(message: str) -> None:
    talk("relay", message)


# --------------------------------------------------------------------------------------------------
# Topology and names


def parent_of(rank: int, fanout: int) -> int | None:
    """The rank this rank receives from (None for rank 0)."""
    return None if rank == 0 else (rank - 1) // fanout


def children_of(rank: int, fanout: int, nnodes: int) -> list[int]:
    """The ranks this rank forwards to, in order."""
    first = rank * fanout + 1
    return list(range(first, min(first + fanout, nnodes)))


def size_text(nbytes: int) -> str:
    """812 MB, 1.07 GB, 2.5 MB, 4096 bytes: decimal units, three digits, as a person reads a transfer."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale * (10 if unit == "kB" else 1):
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"


def rate_text(nbytes: int, seconds: float) -> str:
    return f"{nbytes / 1e6 / seconds:.0f} MB/s" if seconds > 0 else "- MB/s"


# --------------------------------------------------------------------------------------------------
# Ports


def relay_ports(
    rank: int,
    master_port: int | None,
    job_id: int | None,
    override: int | None = None,
    count: int = DEFAULT_PORT_COUNT,
    local_range: tuple[int, int] | None = None,
) -> list[int]:
    """The candidate ports rank `rank` listens on: the same on every node of the job.

    The barrier's derivation with the job id moved past the barrier's own candidates and by
    `count` per rank, so ranks never share a candidate (two ranks may share a host).
    --port P (override) gives rank r the ports P + r*count, and its successors.
    """
    if override is not None:
        return net.candidate_ports((), None, None, override + rank * count, count)
    if master_port is None or job_id is None:
        raise usage_error(
            "relay: no port to use; give --master-port and --job-id (MASTER_PORT and SLURM_JOB_ID), "
            "or --port (SM_RELAY_PORT) on every node"
        )
    try:
        return net.candidate_ports(
            (), master_port, job_id + RELAY_PORT_OFFSET + rank * count, None, count, local_range
        )
    except HelperError as exc:
        raise usage_error(f"relay: {exc.format_message().removeprefix('barrier: ')}") from None


# --------------------------------------------------------------------------------------------------
# Protocol lines and frames (pure functions; they raise ProtocolError and nothing else)


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


# --------------------------------------------------------------------------------------------------
# One link (socket + a small read buffer for the lines before the frames)


@dataclass(eq=False)
class Link:
    sock: socket.socket
    rank: int  # the peer's rank
    name: str  # "rank 2 (node3)"
    where: str  # "10.0.0.3:21544"
    own_nonce: str = ""
    peer_nonce: str = ""
    buf: bytearray = field(default_factory=bytearray)
    failed: str = ""  # why this child was given up on
    key: bytes = b""  # the link key (link_key), once both sides proved the token
    seq: int = 0  # the next frame's number on this link (sent, or expected)
    started: float = 0.0  # a pending handshake: when it was accepted

    def tagged(self, frame: bytearray | memoryview, kind: bytes, length: int, digest: bytes) -> None:
        """Put this link's tag for its next frame into `frame`'s header and count the frame."""
        FRAME.pack_into(frame, 0, kind, length, frame_tag(self.key, self.seq, kind, length, digest))
        self.seq += 1

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_line(self, timeout: float) -> bytes:
        """One line (newline included); ProtocolError when too long or the peer closed first."""
        deadline = time.monotonic() + timeout
        while True:
            newline = self.buf.find(b"\n")
            if newline >= 0:
                line = bytes(self.buf[: newline + 1])
                del self.buf[: newline + 1]
                return line
            if len(self.buf) >= MAX_LINE:
                raise ProtocolError("line too long")
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(MAX_LINE)
            if not chunk:
                raise ConnectionError("closed the connection")
            self.buf += chunk

    def feed(self) -> bool:
        """Read what is there (the socket is readable); False at EOF."""
        chunk = self.sock.recv(MAX_LINE)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def take_line(self) -> bytes | None:
        newline = self.buf.find(b"\n")
        if newline < 0:
            if len(self.buf) >= MAX_LINE:
                raise ProtocolError("line too long")
            return None
        line = bytes(self.buf[: newline + 1])
        del self.buf[: newline + 1]
        return line

    def read_into(self, view: memoryview) -> None:
        """Fill `view` exactly (leftover line bytes first); ConnectionError at EOF."""
        got = 0
        if self.buf:
            got = min(len(self.buf), len(view))
            view[:got] = self.buf[:got]
            del self.buf[:got]
        recv_into = self.sock.recv_into
        need = len(view)
        while got < need:
            n = recv_into(view[got:], need - got)
            if n == 0:
                raise ConnectionError("closed the connection")
            got += n

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer when `fd` is a pipe (best effort; a no-op for files)."""
    import fcntl

    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)
    except OSError:
        pass


def write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


# --------------------------------------------------------------------------------------------------
# A node


@dataclass
class Plan:
    """Everything one node needs to know; the same inputs on every node give the same tree."""

    rank: int
    nnodes: int
    token: str
    fanout: int = 1
    hosts: Sequence[str] = ()  # host names in rank order (for dialing and for messages)
    parent_host: str | None = None  # instead of hosts[parent]
    ports_of: Callable[[int], list[int]] = field(default=lambda rank: [])
    purpose: str = DEFAULT_PURPOSE
    connect_timeout: float = 120.0
    stall_timeout: float = 30.0
    loopback: bool = False  # bench and tests only: listen on and dial 127.0.0.1
    log: Log = _talk

    def name(self, rank: int) -> str:
        host = self.hosts[rank] if rank < len(self.hosts) else None
        if self.parent_host and rank == parent_of(self.rank, self.fanout):
            host = self.parent_host
        return f"rank {rank} ({host})" if host else f"rank {rank}"

    @property
    def me(self) -> str:
        host = self.hosts[self.rank] if self.rank < len(self.hosts) else socket.gethostname()
        return f"{host} (rank {self.rank})"


@dataclass
class Result:
    total: int  # payload bytes
    digest: str  # the stream's chain digest (hex): the same on every node that verified it
    seconds: float  # first byte -> every node below has verified
    nodes: int  # nodes that verified the stream (rank 0: all receivers; others: self + subtree)


class Node:
    """One rank: dial the parent, gather the children, then move the stream frame by frame."""

    def __init__(self, plan: Plan) -> None:
        if plan.fanout < 1:
            raise usage_error("relay: --fanout must be at least 1")
        if not 0 <= plan.rank < plan.nnodes:
            raise usage_error(f"relay: --rank {plan.rank} is not in 0..{plan.nnodes - 1}")
        if not PURPOSE_RE.fullmatch(plan.purpose):
            raise usage_error(f"relay: --purpose {plan.purpose!r} must match {PURPOSE_RE.pattern}")
        self.plan = plan
        self.parent = parent_of(plan.rank, plan.fanout)
        self.child_ranks = children_of(plan.rank, plan.fanout, plan.nnodes)
        self.up: Link | None = None
        self.children: list[Link] = []
        self.listener: socket.socket | None = None
        self.refused: list[str] = []  # peers refused while gathering (shown if a child never comes)
        self.met: dict[str, str] = {}  # candidate address -> what answered there that was not our parent
        self.heartbeat = max(0.05, min(5.0, plan.stall_timeout / 3))
        self._next_beat = 0.0
        self.buffer = bytearray(FRAME.size + MAX_FRAME)
        self.view = memoryview(self.buffer)
        self.fault = parse_fault(os.environ.get("SM_RELAY_FAULT", ""), plan.rank)
        self._flip: int | None = None  # the fault hook's byte to flip in the frame being forwarded

    # -- errors ------------------------------------------------------------------------------------

    def fail(self, message: str, code: int = EXIT_FAILURE) -> HelperError:
        return HelperError(f"relay: {self.plan.me}: {message}", code)

    # -- setup: listen, dial the parent, gather the children ---------------------------------------

    def listen(self) -> None:
        plan = self.plan
        if plan.loopback:
            address = net.LOOPBACK
        else:
            own = plan.hosts[plan.rank] if plan.hosts else socket.gethostname()
            try:
                choice = net.choose_bind_address(own)
            except HelperError:
                raise self.fail(
                    f"{own} resolves only to loopback and this host has no routable IPv4 address to listen on"
                ) from None
            address = choice.address
            if choice.why:
                plan.log(choice.why)
        ports = plan.ports_of(plan.rank)
        if not ports:
            raise usage_error("relay: no candidate port to listen on")
        try:
            sock, busy = net.bind_first_free(address, ports, 64)
        except OSError as exc:
            raise self.fail(f"cannot listen on {address}:{exc.filename}: {net.describe(exc)}") from None
        if sock is not None:
            self.listener = sock
            kids = ", ".join(plan.name(r) for r in self.child_ranks)
            plan.log(f"listening on {address}:{sock.getsockname()[1]} for {kids}")
            return
        raise self.fail(
            f"every candidate port on {address} is in use ({','.join(busy)}); set --port (SM_RELAY_PORT) "
            "to a free range on every node"
        )

    def dial_parent(self, deadline: float) -> Link:
        plan = self.plan
        assert self.parent is not None
        pname = plan.name(self.parent)
        host = plan.parent_host or (plan.hosts[self.parent] if self.parent < len(plan.hosts) else None)
        if host is None and not plan.loopback:
            raise usage_error(f"relay: {plan.me}: no host for {pname}; give --nodes or --parent-host")
        ports = plan.ports_of(self.parent)
        if plan.loopback:
            addresses = [net.LOOPBACK]
        else:
            try:
                addresses = net.connect_addresses(str(host))
            except OSError as exc:
                raise usage_error(
                    f"relay: {plan.me}: cannot resolve {host} ({pname}): {net.describe(exc)}"
                ) from None
        last_error, backoff = "nothing tried", BACKOFF_START
        while True:
            for address in addresses:
                for port in ports:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    try:
                        sock = net.dial_once(address, port, left)
                    except OSError as exc:
                        last_error = net.describe(exc)
                        continue
                    link = Link(sock, self.parent, pname, f"{address}:{port}")
                    try:
                        if self._handshake_as_child(link):
                            self._say_met(link.where)
                            return link
                        last_error = f"{link.where} {self.met[link.where]}"
                    except (OSError, ProtocolError) as exc:
                        last_error = f"{link.where}: {net.describe(exc)}"
                        self.met[link.where] = net.describe(exc)
                    except HelperError:
                        link.close()
                        raise
                    link.close()
            if time.monotonic() >= deadline:
                span = f"{ports[0]}-{ports[-1]}" if len(ports) > 1 else str(ports[0])
                shown = net.LOOPBACK if plan.loopback else host
                met = "; ".join(f"{where}: {what}" for where, what in self.met.items())
                hint = (
                    "; every node must get the same job token ($SM_BARRIER_TOKEN or --token-env)"
                    if "token" in met
                    else "; is its relay running?"
                )
                raise timeout_error(
                    f"relay: {plan.me}: {pname} did not answer on {shown}:{span} within "
                    f"{net.secs(plan.connect_timeout)} s (last error: {last_error}"
                    + (f"; met: {met}" if met else "")
                    + f"){hint}"
                )
            time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _say_met(self, where: str) -> None:
        """Name what answered on the candidates before our parent did (a squatter, a stale relay)."""
        others = {w: what for w, what in self.met.items() if w != where}
        if others:
            self.plan.log(
                "before our parent at "
                + where
                + ": "
                + "; ".join(f"{w} {what}" for w, what in others.items())
            )

    def _handshake_as_child(self, link: Link) -> bool:
        """True when `link` is our authenticated parent; False when it is another rank's relay."""
        plan = self.plan
        net.keepalive(link.sock, KEEPALIVE)
        try:
            nonce_p = parse_hello(link.read_line(net.PROOF_TIMEOUT))
        except ProtocolError as exc:
            raise ProtocolError(f"not a relay ({exc})") from None
        link.own_nonce, link.peer_nonce = auth.new_nonce(), nonce_p
        link.send(auth_line(plan.token, nonce_p, plan.rank, plan.purpose, link.own_nonce))
        verb, rank_p, text = parse_answer(link.read_line(net.PROOF_TIMEOUT))
        if verb == "DENY":
            # Unsigned: our parent's word or anyone's on this port. Never the end: the next candidate.
            self.met[link.where] = f"refused us: {text}"
            return False
        if rank_p != self.parent:
            self.met[link.where] = f"rank {rank_p}'s relay"
            return False
        if not auth.check(
            plan.token, text, link.own_nonce, nonce_p, str(rank_p), str(plan.rank), plan.purpose, "parent"
        ):
            self.met[link.where] = "an OK without the job token's proof"
            return False
        link.key = link_key(plan.token, nonce_p, link.own_nonce, rank_p, plan.rank, plan.purpose)
        purpose = parse_header(link.read_line(HANDSHAKE_TIMEOUT))
        if purpose != plan.purpose:
            raise usage_error(f"relay: {plan.me}: {link.name} sends {purpose!r}, we expect {plan.purpose!r}")
        return True

    def _greet(self, sock: socket.socket, where: str) -> Link | None:
        """A fresh connection: our HELLO goes out at once; its AUTH is read when it comes."""
        link = Link(sock, -1, "an unknown peer", where, own_nonce=auth.new_nonce(), started=time.monotonic())
        try:
            net.keepalive(sock, KEEPALIVE)
            sock.settimeout(ABORT_SEND_TIMEOUT)
            link.send(hello_line(link.own_nonce))
        except OSError:
            link.close()
            return None
        return link

    def _handshake_as_parent(self, link: Link, line: bytes, waiting: dict[int, None]) -> Link | None:
        """The peer's AUTH line: our child, with OK and the header sent; None when refused."""
        plan, where, nonce_p = self.plan, link.where, link.own_nonce
        try:
            rank, purpose, nonce_c, given = parse_auth(line)
        except ProtocolError as exc:
            self._refuse(
                link,
                f"no valid AUTH ({net.describe(exc)})",
                f"bad handshake from {where}: {net.describe(exc)}",
            )
            return None
        if not auth.check(plan.token, given, nonce_p, str(rank), purpose, "child"):
            self._refuse(link, "wrong token", f"rank {rank} from {where} has a wrong token")
            return None
        if purpose != plan.purpose:
            self._refuse(link, f"purpose {purpose} is not {plan.purpose}", f"rank {rank} wants {purpose!r}")
            return None
        if rank not in self.child_ranks:
            self._refuse(link, f"not my child (rank {rank}'s parent is not rank {plan.rank})", "")
            return None
        if rank not in waiting:
            self._refuse(link, "rank already connected", f"a second rank {rank} from {where}")
            return None
        link.rank, link.name = rank, plan.name(rank)
        link.peer_nonce = nonce_c
        link.key = link_key(plan.token, nonce_p, nonce_c, plan.rank, rank, plan.purpose)
        proof = parent_proof(plan.token, nonce_c, nonce_p, plan.rank, rank, plan.purpose)
        try:
            link.send(f"OK {plan.rank} {proof}\n".encode() + header_line(plan.purpose))
        except OSError as exc:
            link.close()
            self.refused.append(f"{link.name} dropped during the handshake ({net.describe(exc)})")
            return None
        return link

    def _refuse(self, link: Link, reason: str, note: str) -> None:
        try:
            link.sock.settimeout(ABORT_SEND_TIMEOUT)
            link.send(f"DENY {reason}\n".encode())
        except OSError:
            pass
        link.close()
        if note:
            self.refused.append(note)
            hint = "; check $SM_BARRIER_TOKEN on that node" if "token" in note else ""
            self.plan.log(f"refused a connection: {note}{hint}")

    def gather_children(self, deadline: float) -> None:
        """Accept and authenticate every child, then wait until each reports its subtree READY.

        Handshakes run side by side: a connection that sends no valid AUTH within PROOF_TIMEOUT is
        dropped, so idle or slow connections (a squatter, a port scan) never keep a child out."""
        plan = self.plan
        assert self.listener is not None
        waiting = dict.fromkeys(self.child_ranks)
        pending: dict[int, Link] = {}  # by file descriptor: greeted, AUTH not yet complete
        self.listener.setblocking(False)

        def drop(link: Link) -> None:
            sel.unregister(link.sock)
            del pending[link.sock.fileno()]

        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ, None)
            while waiting:
                now = time.monotonic()
                if now >= deadline:
                    for link in pending.values():
                        link.close()
                    missing = ", ".join(plan.name(r) for r in waiting)
                    refused = f"; refused meanwhile: {'; '.join(self.refused[-3:])}" if self.refused else ""
                    raise timeout_error(
                        f"relay: {plan.me}: {missing} did not connect within "
                        f"{net.secs(plan.connect_timeout)} s{refused}; "
                        "is its relay recv running with the same --nodes/--job-id/token?"
                    )
                for link in [link for link in pending.values() if now - link.started >= net.PROOF_TIMEOUT]:
                    drop(link)
                    self._refuse(
                        link,
                        "no AUTH in time",
                        f"{link.where} sent no AUTH within {net.secs(net.PROOF_TIMEOUT)} s",
                    )
                wait = min(
                    [deadline - now, 1.0]
                    + [link.started + net.PROOF_TIMEOUT - now for link in pending.values()]
                )
                for key, _ in sel.select(max(0.0, wait)):
                    if key.data is None:
                        self._accept_all(sel, pending)
                        continue
                    link = key.data
                    try:
                        alive = link.feed()
                        line = link.take_line()
                    except (OSError, ProtocolError) as exc:
                        alive, line = False, None
                        self.refused.append(f"bad handshake from {link.where}: {net.describe(exc)}")
                    if line is None and alive:
                        continue
                    drop(link)
                    if line is None:
                        link.close()
                        continue
                    child = self._handshake_as_parent(link, line, waiting)
                    if child is not None:
                        del waiting[child.rank]
                        self.children.append(child)
                        plan.log(f"{child.name} connected from {child.where}")
            for link in pending.values():
                link.close()
        self.listener.close()
        self.listener = None
        self.children.sort(key=lambda link: link.rank)
        statuses = self._collect(self.children, "READY", deadline + READY_GRACE)
        for link in self.children:
            ok, _, why = statuses[link.rank]
            if not ok:
                raise self.fail(f"{link.name} cannot take the stream: {why}")

    def _accept_all(self, sel: selectors.BaseSelector, pending: dict[int, Link]) -> None:
        """Every connection waiting on the listener, greeted; the oldest pending one goes when too
        many are open at once (a flood costs the flood, not our file descriptors)."""
        assert self.listener is not None
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.refused.append(f"accept failed ({net.describe(exc)})")
                return
            link = self._greet(sock, net.peer(addr))
            if link is None:
                continue
            if len(pending) >= MAX_PENDING:
                oldest = min(pending.values(), key=lambda other: other.started)
                sel.unregister(oldest.sock)
                del pending[oldest.sock.fileno()]
                oldest.close()
            pending[sock.fileno()] = link
            sel.register(sock, selectors.EVENT_READ, link)

    def _collect(
        self,
        links: list[Link],
        verb: str,
        deadline: float,
        *,
        stop_on_fail: bool = True,
        quiet_for: float | None = None,
    ) -> dict[int, tuple[bool, int, str]]:
        """One READY / DONE / FAIL line from each link, by rank; with stop_on_fail, until a FAIL.

        With `quiet_for`, a link's deadline moves on each time it sends WAIT (its subtree is still
        streaming: a long chain's tail lags rank 0 by what the links buffer), and we send WAIT up
        meanwhile, so only a subtree that makes no progress for that long is given up on.
        """
        results: dict[int, tuple[bool, int, str]] = {}
        pending = {link.sock.fileno(): link for link in links}
        until = {link.rank: deadline for link in links}

        def done(link: Link, outcome: tuple[bool, int, str]) -> bool:
            results[link.rank] = outcome
            sel.unregister(link.sock)
            del pending[link.sock.fileno()]
            return stop_on_fail and not outcome[0]

        with selectors.DefaultSelector() as sel:
            for link in links:
                sel.register(link.sock, selectors.EVENT_READ, link)
            while pending:
                for link in list(pending.values()):  # leftover bytes may already hold the line
                    outcome = self._take_status(link, verb, until, quiet_for)
                    if outcome is not None and done(link, outcome):
                        return results
                now = time.monotonic()
                for link in [link for link in pending.values() if until[link.rank] <= now]:
                    why = (
                        f"showed no progress for {net.secs(quiet_for)} s after the trailer (no DONE, no WAIT)"
                        if quiet_for is not None
                        else f"was not {verb} within {net.secs(self.plan.connect_timeout)} s"
                    )
                    if done(link, (False, 0, why)):
                        return results
                if not pending:
                    break
                if quiet_for is not None:
                    self._beat()
                wait = min(until[link.rank] for link in pending.values()) - now
                for key, _ in sel.select(max(0.0, min(wait, self.heartbeat, 1.0))):
                    link = key.data
                    try:
                        alive = link.feed()
                    except OSError as exc:
                        alive, why = False, net.describe(exc)
                    else:
                        why = "closed the connection"
                    if not alive and done(link, (False, 0, f"{why} before {verb}")):
                        return results
        return results

    def _take_status(
        self, link: Link, verb: str, until: dict[int, float], quiet_for: float | None
    ) -> tuple[bool, int, str] | None:
        """The next status line already read from `link` (WAITs only move its deadline)."""
        while True:
            try:
                line = link.take_line()
                if line is None:
                    return None
                if line == b"WAIT\n" and quiet_for is not None:
                    until[link.rank] = time.monotonic() + quiet_for
                    continue
                return parse_status(line, verb, link.key)
            except ProtocolError as exc:
                return False, 0, f"protocol error ({exc})"

    def _beat(self) -> None:
        """Tell the parent we are alive and streaming (at most every `heartbeat` seconds)."""
        now = time.monotonic()
        if self.up is None or now < self._next_beat:
            return
        self._next_beat = now + self.heartbeat
        try:
            self.up.sock.send(b"WAIT\n", socket.MSG_DONTWAIT)
        except OSError:
            pass  # a broken upstream shows on the next read

    # -- streaming ---------------------------------------------------------------------------------

    def _forward(
        self, frame: memoryview | bytearray, kind: bytes, length: int, digest: bytes, sent_so_far: int
    ) -> None:
        """Send one frame (header + payload, the header rewritten per child with that link's tag)
        to every live child; a child that fails is dropped, the others go on."""
        for link in self.children:
            if link.failed:
                continue
            link.tagged(frame, kind, length, digest)
            try:
                if self._flip is not None and kind == DATA:
                    copy = bytearray(frame)  # the fault hook: a bad link after the tag was made
                    copy[FRAME.size + self._flip] ^= 0xFF
                    link.sock.sendall(copy)
                else:
                    link.sock.sendall(frame)
            except OSError as exc:
                if isinstance(exc, (socket.timeout, TimeoutError)):
                    why = (
                        f"took no bytes for {net.secs(self.plan.stall_timeout)} s after "
                        f"{size_text(sent_so_far)}: it is frozen, its output is blocked, or its link is down"
                    )
                else:
                    said = self._failure_said(link)
                    why = (
                        f"failed after {size_text(sent_so_far)}: {said}"
                        if said
                        else f"dropped the connection after {size_text(sent_so_far)} ({net.describe(exc)})"
                    )
                link.failed = why
                link.close()
                self.plan.log(f"{link.name} {why}; going on with the others")
        self._flip = None

    @staticmethod
    def _failure_said(link: Link) -> str:
        """The FAIL reason a child sent before it dropped the link (read without waiting)."""
        try:
            link.sock.setblocking(False)
            while len(link.buf) < 64 * MAX_LINE and (chunk := link.sock.recv(MAX_LINE)):
                link.buf += chunk
        except OSError:
            pass
        for line in bytes(link.buf).splitlines():
            if line.startswith(b"FAIL "):
                return clean_reason(line[5:].decode("utf-8", "replace"))
        return ""

    def _live(self) -> list[Link]:
        return [link for link in self.children if not link.failed]

    def _abort_children(self, reason: str) -> None:
        payload = abort_payload(reason)
        frame = bytearray(FRAME.size) + payload
        digest = hashlib.sha256(payload).digest()
        for link in self._live():
            try:
                link.tagged(frame, ABORT, len(payload), digest)
                link.sock.settimeout(ABORT_SEND_TIMEOUT)
                link.sock.sendall(frame)
                link.sock.shutdown(socket.SHUT_WR)
                # Closing with the child's WAITs unread would reset the link and could drop the
                # abort still queued for it; read them away first.
                link.sock.setblocking(False)
                while link.sock.recv(65536):
                    pass
            except OSError:
                pass
            link.close()

    def _report_up(self, line: str | bytes) -> None:
        if self.up is None:
            return
        try:
            self.up.sock.settimeout(ABORT_SEND_TIMEOUT)
            self.up.send(line if isinstance(line, bytes) else f"{line}\n".encode())
        except OSError:
            pass

    def stream_from(self, source_fd: int) -> tuple[int, bytes, float]:
        """Rank 0: frames from `source_fd` to the children; (total, chain digest, start time)."""
        sha256 = hashlib.sha256
        view, total, stream = self.view, 0, CHAIN_START
        ping = bytearray(FRAME.size)
        ping_every = max(0.05, min(5.0, self.plan.stall_timeout / 3))
        widen_pipe(source_fd)
        started = time.monotonic()
        payload = view[FRAME.size :]
        while True:
            ready, _, _ = select.select([source_fd], [], [], ping_every)
            if not ready:
                self._forward(ping, PING, 0, EMPTY_DIGEST, total)
                self._check_children()
                continue
            got = os.readv(source_fd, [payload[:CHUNK]])
            if got == 0:
                break
            # A pipe hands out what is buffered; top the frame up while more is already waiting.
            while got < CHUNK and select.select([source_fd], [], [], 0)[0]:
                more = os.readv(source_fd, [payload[got:CHUNK]])
                if more == 0:
                    break
                got += more
            digest = sha256(payload[:got]).digest()
            stream = chain(stream, digest)
            total += got
            self._forward(view[: FRAME.size + got], DATA, got, digest, total)
            self._check_children()
        return total, stream, started

    def _check_children(self) -> None:
        if self.children and not self._live():
            failures = "; ".join(f"{link.name} {link.failed}" for link in self.children)
            raise self.fail(f"no child left to send to: {failures}")

    def stream_through(self, out_fd: int | None) -> tuple[int, bytes, float]:
        """A receiver: every frame's tag checked before its payload goes to `out_fd` or a child;
        then the trailer against what arrived."""
        plan, up = self.plan, self.up
        assert up is not None
        sha256 = hashlib.sha256
        view, total, stream = self.view, 0, CHAIN_START
        header = view[: FRAME.size]
        up.sock.settimeout(plan.stall_timeout)
        started = time.monotonic()
        if out_fd is not None:
            widen_pipe(out_fd)
        while True:
            try:
                up.read_into(header)
                kind, length, tag = parse_frame_header(header)
                body = view[FRAME.size : FRAME.size + length]
                up.read_into(body)
            except (socket.timeout, TimeoutError):
                raise timeout_error(
                    f"relay: {plan.me}: no bytes from {up.name} for {net.secs(plan.stall_timeout)} s after "
                    f"{size_text(total)}: {up.name.split(' (')[0]} is frozen or its link is down"
                ) from None
            except ProtocolError as exc:
                raise self.fail(f"protocol error from {up.name} after {size_text(total)}: {exc}") from None
            except OSError as exc:
                cut = "" if isinstance(exc, ConnectionError) and not exc.errno else f" ({net.describe(exc)})"
                raise self.fail(
                    f"stream from {up.name} ended after {size_text(total)} of an unfinished stream{cut}: "
                    f"{up.name.split(' (')[0]} died or its link broke"
                ) from None
            digest = sha256(body).digest() if length else EMPTY_DIGEST
            if not hmac.compare_digest(tag, frame_tag(up.key, up.seq, kind, length, digest)):
                raise self.fail(
                    f"frame {up.seq} from {up.name} (after {size_text(total)}) does not match its tag "
                    "(the sha256 digest of its bytes under the link key): changed on the way, forged, "
                    "reordered or replayed; nothing of it was written or forwarded"
                )
            up.seq += 1
            if kind == DATA:
                self._beat()
                if self.fault is not None:
                    self._inject(total, length)
                self._forward(view[: FRAME.size + length], DATA, length, digest, total + length)
                if out_fd is not None:
                    try:
                        write_all(out_fd, body)
                    except OSError as exc:
                        raise self.fail(
                            f"cannot write the stream to stdout after {size_text(total)} "
                            f"({net.describe(exc)}); did the reader (docker load) exit? see its error above"
                        ) from None
                stream = chain(stream, digest)
                total += length
            elif kind == PING:
                self._forward(view[: FRAME.size], PING, 0, EMPTY_DIGEST, total)
            elif kind == ABORT:
                reason = clean_reason(bytes(body).decode("utf-8", "replace"))
                raise self.fail(f"{up.name} aborted the stream after {size_text(total)}: {reason}")
            else:
                return self._verify(body, total, stream, started)

    def _inject(self, total: int, length: int) -> None:
        """The end-to-end tests' fault (SM_RELAY_FAULT=<rank>:corrupt|die:<offset>), on this rank
        only, once the stream passes <offset>: `corrupt` flips one byte of what this node forwards,
        after its tag was made (its own copy stays intact, as after a bad link); `die` SIGKILLs this
        process."""
        kind, offset = self.fault  # type: ignore[misc]
        if total + length <= offset:
            return
        self.fault = None
        if kind == "die":
            self.plan.log(f"SM_RELAY_FAULT: dying (SIGKILL) after {size_text(total)}")
            os.kill(os.getpid(), 9)
        self.plan.log(f"SM_RELAY_FAULT: flipping the byte at offset {offset} of what this node forwards")
        self._flip = max(0, offset - total)

    def _verify(
        self, body: memoryview, total: int, stream: bytes, started: float
    ) -> tuple[int, bytes, float]:
        up = self.up
        assert up is not None
        try:
            their_total, their_stream = parse_trailer(body)
        except ProtocolError as exc:
            raise self.fail(f"bad trailer from {up.name}: {exc}") from None
        if their_total != total:
            raise self.fail(
                f"received {total} bytes from {up.name} but the stream had {their_total}: bytes were lost"
            )
        if their_stream != stream:
            raise self.fail(
                f"the stream from {up.name} ({size_text(total)}) is not rank 0's: chain digest "
                f"{stream.hex()[:16]}..., rank 0 sent {their_stream.hex()[:16]}...; a node upstream "
                "relayed other bytes"
            )
        return total, stream, started

    def finish(self, total: int, stream: bytes) -> int:
        """Send the trailer to each child and collect DONE; the nodes verified below us."""
        payload = trailer_payload(total, stream)
        frame = bytearray(FRAME.size) + payload
        digest = hashlib.sha256(payload).digest()
        for link in self._live():
            try:
                link.tagged(frame, END, len(payload), digest)
                link.sock.sendall(frame)
            except OSError as exc:
                said = self._failure_said(link)
                link.failed = (
                    f"failed: {said}" if said else f"dropped before the trailer ({net.describe(exc)})"
                )
                link.close()
        live = self._live()
        window = self.plan.stall_timeout
        statuses = self._collect(
            live, "DONE", time.monotonic() + window, stop_on_fail=False, quiet_for=window
        )
        verified = 0
        for link in live:
            ok, count, why = statuses.get(link.rank, (False, 0, "did not answer"))
            if ok:
                verified += count
            else:
                link.failed = why
        failures = [f"{link.name}: {link.failed}" for link in self.children if link.failed]
        if failures:
            raise self.fail(
                f"the stream ({size_text(total)}) reached {verified} node(s) below us but failed for "
                + "; ".join(failures)
            )
        return verified

    def close(self) -> None:
        for link in self.children:
            link.close()
        if self.up is not None:
            self.up.close()
        if self.listener is not None:
            self.listener.close()

    # -- the whole run -----------------------------------------------------------------------------

    def run(
        self,
        source_fd: int | None = None,
        out_fd: int | None = None,
        on_verified: Callable[[], None] | None = None,
    ) -> Result:
        plan = self.plan
        deadline = time.monotonic() + plan.connect_timeout
        try:
            if self.child_ranks:
                self.listen()
            if self.parent is not None:
                self.up = self.dial_parent(deadline)
                plan.log(f"connected to {self.up.name} at {self.up.where}")
            if self.child_ranks:
                self.gather_children(deadline)
                for link in self.children:  # a child that takes nothing this long is given up on
                    link.sock.settimeout(plan.stall_timeout)
            if self.up is not None:
                self.up.sock.settimeout(plan.stall_timeout)
                self.up.send(status_line(self.up.key, "READY"))
            if self.parent is None:
                if source_fd is None:
                    raise usage_error("relay: rank 0 needs a source")
                plan.log(f"every node below is ready ({len(self.children)} direct); streaming")
                total, digest, started = self.stream_from(source_fd)
            else:
                total, digest, started = self.stream_through(out_fd)
                if on_verified is not None:
                    on_verified()
        except HelperError as exc:
            self._abort_children(exc.format_message().removeprefix("relay: "))
            self._report_up(f"FAIL {clean_reason(exc.format_message().removeprefix('relay: '))}")
            self.close()
            raise
        except BaseException:
            self._abort_children(f"{plan.me}: relay stopped")
            self.close()
            raise
        try:
            below = self.finish(total, digest)
        except HelperError as exc:
            self._report_up(f"FAIL {clean_reason(exc.format_message().removeprefix('relay: '))}")
            self.close()
            raise
        seconds = time.monotonic() - started
        if self.up is not None:
            self._report_up(status_line(self.up.key, "DONE", below + 1))
        self.close()
        return Result(total, digest.hex(), seconds, below if self.parent is None else below + 1)


def run_node(
    plan: Plan,
    source_fd: int | None = None,
    out_fd: int | None = None,
    on_verified: Callable[[], None] | None = None,
) -> Result:
    """Run one rank to the end (the importable core of `relay send` / `relay recv`)."""
    return Node(plan).run(source_fd, out_fd, on_verified)


# --------------------------------------------------------------------------------------------------
# CLI

CONTEXT = {"help_option_names": ["-h", "--help"]}


def parse_fault(text: str, rank: int) -> tuple[str, int] | None:
    """SM_RELAY_FAULT=<rank>:corrupt|die:<offset> (the end-to-end tests' fault injection): this
    rank's fault, or None. Anything else is ignored: production never sets it."""
    match = re.fullmatch(r"([0-9]+):(corrupt|die):([0-9]+)", text.strip())
    if not match or int(match.group(1)) != rank:
        return None
    return match.group(2), int(match.group(3))


def parse_nodes(text: str | None) -> list[str]:
    """`node1,node2,node3` -> names in rank order (as `scontrol show hostnames | paste -sd,`)."""
    if text is None:
        return []
    names = [part.strip() for part in text.split(",")]
    if not names or any(not name or " " in name for name in names):
        raise usage_error(f"relay: --nodes {text!r} must be host names separated by commas, in rank order")
    return names


def _plan_from_options(
    rank: int,
    nnodes: int | None,
    nodes: str | None,
    parent_host: str | None,
    fanout: int,
    master_port: int | None,
    job_id: int | None,
    port: int | None,
    count: int,
    connect_timeout: float,
    stall_timeout: float,
    token_env: str,
    purpose: str,
) -> Plan:
    hosts = parse_nodes(nodes)
    if hosts and nnodes is not None and nnodes != len(hosts):
        raise usage_error(f"relay: --nnodes {nnodes} but --nodes names {len(hosts)} hosts")
    total = nnodes if nnodes is not None else len(hosts)
    if total < 2:
        raise usage_error("relay: give --nodes (host names in rank order) or --nnodes >= 2")
    if not 0 <= rank < total:
        raise usage_error(f"relay: --rank {rank} is not in 0..{total - 1}")
    if not PURPOSE_RE.fullmatch(purpose):
        raise usage_error(f"relay: --purpose {purpose!r} must match {PURPOSE_RE.pattern}")
    relay_ports(rank, master_port, job_id, port, count)  # a usage error now, not on the first dial

    def ports_of(r: int) -> list[int]:
        return relay_ports(r, master_port, job_id, port, count)

    try:
        token = read_token(token_env)  # the barrier's token rule: one rule, one place
    except HelperError as exc:
        raise usage_error(f"relay: {exc.format_message().removeprefix('barrier: ')}") from None
    os.environ.setdefault("SM_RANK", str(rank))
    return Plan(
        rank,
        total,
        token,
        fanout=fanout,
        hosts=hosts,
        parent_host=parent_host,
        ports_of=ports_of,
        purpose=purpose,
        connect_timeout=connect_timeout,
        stall_timeout=stall_timeout,
    )


def _node_options(func: Callable) -> Callable:
    options = [
        click.option("--nnodes", type=click.IntRange(min=2), help="Nodes in the job [default: --nodes]"),
        click.option("--nodes", metavar="HOSTS",
                     help="Host names in rank order, comma-separated (scontrol show hostnames)."),
        click.option("--fanout", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Children per node: 1 is a chain, K a tree (parent of r is (r-1)//K)."),
        click.option("--master-port", type=click.IntRange(1, 65535), envvar="MASTER_PORT", show_envvar=True,
                     help="The job's MASTER_PORT (an input of the port derivation; never used itself)."),
        click.option("--job-id", type=click.IntRange(min=0), envvar="SLURM_JOB_ID", show_envvar=True,
                     help="SLURM job id (an input of the port derivation)."),
        click.option("--port", type=click.IntRange(1024, 65535), envvar="SM_RELAY_PORT", show_envvar=True,
                     help="Instead of the derivation: rank r listens on PORT + r*count and successors."),
        click.option("--count", type=click.IntRange(1, net.MAX_CANDIDATES), default=DEFAULT_PORT_COUNT,
                     show_default=True, help="Candidate ports per rank."),
        click.option("--connect-timeout", type=click.FloatRange(min=0), default=120, show_default=True,
                     help="Seconds for the parent to answer and every child to connect."),
        click.option("--stall-timeout", type=click.FloatRange(min=0.1), default=30, show_default=True,
                     help="Seconds without bytes from the parent (or taken by a child) before giving up."),
        click.option("--stats-file", metavar="FILE", help="Write `<bytes> <seconds>` here once verified."),
        click.option("--token-env", default=DEFAULT_TOKEN_ENV, show_default=True, metavar="NAME",
                     help="Environment variable holding the job token (never pass the token itself)."),
        click.option("--purpose", default=DEFAULT_PURPOSE, show_default=True,
                     help="What the stream is (both ends must agree; it is inside the MAC)."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


@click.group("relay", context_settings=CONTEXT)
def cli() -> None:
    """Relay a byte stream (docker save) node to node: no shared storage, forwarded as received.

    \b
    Topology: chain (--fanout 1) or tree; rank 0 reads stdin, every other rank writes stdout.
    Exit codes: 0 delivered and verified, 1 failed, 2 usage or rejected, 3 timeout.
    """


@cli.command("send", context_settings=CONTEXT)
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="Always 0.")
@_node_options
def send_cmd(rank: int, stats_file: str | None, **options: object) -> None:
    """Rank 0: send stdin to the children; exit 0 once every node has verified it.

    \b
    Example (rank 0):
      docker save toy/model:local | slurm-multi relay send --nodes "$NODES"
    """
    if rank != 0:
        raise usage_error(f"relay: send runs on rank 0 only (got --rank {rank}); use `relay recv`")
    if os.isatty(0):
        raise usage_error("relay: stdin is a terminal; pipe the stream in: docker save IMAGE | relay send")
    plan = _plan_from_options(0, parent_host=None, **options)  # type: ignore[arg-type]
    plan.log(f"rank 0 of {plan.nnodes}, fanout {plan.fanout}; waiting for {plan.nnodes - 1} nodes")
    result = run_node(plan, source_fd=0)
    write_stats(stats_file, result)
    plan.log(
        f"done: {size_text(result.total)} verified by all {result.nodes} receivers in {result.seconds:.1f} s "
        f"({rate_text(result.total, result.seconds)}, chain digest {result.digest[:16]}...)"
    )


def write_stats(path: str | None, result: Result) -> None:
    """--stats-file: `<bytes> <seconds>` of the verified stream, for the caller's timeline."""
    if path:
        with open(path, "w", encoding="ascii") as out:
            out.write(f"{result.total} {result.seconds:.3f}\n")


def _release_stdout() -> None:
    """Our copy is verified: close the pipe to `docker load` so it finishes while we wait for DONE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


@cli.command("recv", context_settings=CONTEXT)
@click.option("--rank", type=click.IntRange(min=1), required=True, help="This node's rank (1..N-1).")
@click.option("--parent-host", help="The parent's host name (wins over --nodes).")
@_node_options
@click.argument("loader", nargs=-1, type=click.UNPROCESSED, metavar="[-- LOADER...]")
def recv_cmd(
    rank: int, parent_host: str | None, stats_file: str | None, loader: tuple[str, ...], **options: object
) -> None:
    """A receiver: forward the stream to this node's children and hand it to LOADER's stdin (or
    write it to stdout). Every frame is checked before LOADER sees it; a stream that fails stops
    LOADER before it sees the end, so a cut stream is never loaded as if it were whole.

    \b
    Example (rank R):
      slurm-multi relay recv --rank "$SLURM_NODEID" --nodes "$NODES" -- docker load -q
    """
    if not loader and os.isatty(1):
        raise usage_error("relay: stdout is a terminal; give a loader: relay recv ... -- docker load")
    plan = _plan_from_options(rank, parent_host=parent_host, **options)  # type: ignore[arg-type]
    kids = children_of(rank, plan.fanout, plan.nnodes)
    plan.log(
        f"rank {rank} of {plan.nnodes}: from {plan.name((rank - 1) // plan.fanout)}"
        + (f", forwarding to {', '.join(plan.name(r) for r in kids)}" if kids else "")
    )
    if loader:
        result = _recv_into(plan, list(loader))
    else:
        result = run_node(plan, out_fd=1, on_verified=_release_stdout)
    write_stats(stats_file, result)
    plan.log(
        f"done: {size_text(result.total)} received and verified in {result.seconds:.1f} s "
        f"({rate_text(result.total, result.seconds)}, chain digest {result.digest[:16]}...)"
        + (f"; {result.nodes - 1} node(s) below verified it too" if kids else "")
    )


def _recv_into(plan: Plan, argv: list[str]) -> Result:
    """Receive into `argv`'s stdin. Its pipe closes once our copy is verified (it finishes while the
    subtree does); on any failure before that, it is killed first, so it never reads a clean EOF."""
    import subprocess

    try:
        loader = subprocess.Popen(argv, stdin=subprocess.PIPE)
    except OSError as exc:
        raise usage_error(f"relay: cannot start the loader {argv[0]!r}: {net.describe(exc)}") from None
    assert loader.stdin is not None
    verified = False

    def release() -> None:
        nonlocal verified
        verified = True
        loader.stdin.close()  # type: ignore[union-attr]

    try:
        result = run_node(plan, out_fd=loader.stdin.fileno(), on_verified=release)
    except BaseException as exc:
        if not verified:
            loader.kill()
            loader.wait()
            loader.stdin.close()
            if isinstance(exc, HelperError):
                raise HelperError(
                    f"{exc.format_message()} ({argv[0]} stopped before the end)", exc.exit_code
                ) from None
        else:
            loader.wait()
        raise
    code = loader.wait()
    if code != 0:
        raise HelperError(
            f"relay: {plan.me}: the stream arrived and was verified, but {' '.join(argv)} exited {code}",
            EXIT_FAILURE,
        )
    return result


@cli.command("port", context_settings=CONTEXT)
@click.option("--rank", type=click.IntRange(min=0), required=True, help="The rank whose ports to print.")
@click.option("--master-port", type=click.IntRange(1, 65535), envvar="MASTER_PORT", show_envvar=True)
@click.option("--job-id", type=click.IntRange(min=0), envvar="SLURM_JOB_ID", show_envvar=True)
@click.option("--port", type=click.IntRange(1024, 65535), envvar="SM_RELAY_PORT", show_envvar=True)
@click.option(
    "--count", type=click.IntRange(1, net.MAX_CANDIDATES), default=DEFAULT_PORT_COUNT, show_default=True
)
def port_cmd(rank: int, master_port: int | None, job_id: int | None, port: int | None, count: int) -> None:
    """Print the candidate ports RANK listens on, one per line (the same on every node).

    \b
    Example: slurm-multi relay port --rank 3 --master-port 29500 --job-id 4242
    """
    for candidate in relay_ports(rank, master_port, job_id, port, count):
        click.echo(candidate)
