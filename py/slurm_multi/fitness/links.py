"""The fitness mesh's sockets: one listener, the dials and every connection, on the stage's selector.

`Dial` is one peer this node dials, with its retry timing. `Links` owns the plumbing and nothing of
the meaning: it listens, connects, accepts, keeps each connection's buffers and selector mask,
sends what it is given (and the ring probe's bytes), and cuts what arrives into protocol lines or
counts of probe bytes. What a line means, what to answer and when to give up is its handler's
(slurm_multi.fitness.mesh.Mesh), told through four calls: `on_accepted`, `on_line`,
`on_probe_bytes` and `on_broken` (a connection that broke: an OSError, or a ProtocolError from a
line, the handler's own included).

A connection's state says how its bytes are read: `connect` (a dial in progress), `probe` (raw
bytes, counted), `send` (this side pumps probe bytes), `drain` (what arrives is ignored; what is
queued still goes); in any other state what arrives is lines, at most MAX_LINE bytes each.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import time
from typing import Protocol

from slurm_multi.fitness.protocol import MAX_LINE, ProtocolError, decode
from slurm_multi.net import describe

HANDSHAKE_TIMEOUT = 2.0  # greeting, JOIN/WELCOME, HELLO/GOT: our peers answer at once
BACKOFF_START, BACKOFF_MAX = 0.02, 0.25  # a peer usually starts a moment late: retry soon
PROBE_CHUNK = 1 << 20  # one send() of probe bytes (zeros: nothing on a cluster's path compresses)


class Dial:
    """One peer this node dials: `mesh` (to deliver our HELLO) or `probe` (the ring probe)."""

    __slots__ = (
        "rank",
        "host",
        "port",
        "purpose",
        "addresses",
        "attempts",
        "next_at",
        "backoff",
        "error",
        "conn",
        "done",
    )

    def __init__(self, rank: int, host: str, port: int, purpose: str) -> None:
        self.rank, self.host, self.port, self.purpose = rank, host, port, purpose
        self.addresses: list[str] | None = None
        self.attempts = 0
        self.next_at = 0.0
        self.backoff = BACKOFF_START
        self.error = ""
        self.conn: Conn | None = None
        self.done = False

    def retry(self, now: float) -> None:
        """Dial again a little later, twice as late each time up to BACKOFF_MAX."""
        self.next_at = now + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)


class Conn:
    """One TCP connection, dialled (`dial` set) or accepted, and where it is in the protocol."""

    __slots__ = (
        "sock",
        "dial",
        "state",
        "inbuf",
        "outbuf",
        "challenge",
        "nonce",
        "until",
        "rank",
        "total",
        "count",
        "acked",
        "last_ack",
        "started",
        "addr",
        "mask",
    )

    def __init__(self, sock: socket.socket, until: float, addr: str, dial: Dial | None = None) -> None:
        self.sock, self.until, self.addr, self.dial = sock, until, addr, dial
        self.state = "connect" if dial else "join"
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.challenge = self.nonce = ""
        self.rank = dial.rank if dial else -1
        self.total = self.count = self.acked = 0  # probe: bytes to send/receive, sent/received, acked
        self.last_ack = self.started = 0.0
        self.mask = 0


class Handler(Protocol):
    """What a connection's events mean (the Mesh)."""

    def on_accepted(self, conn: Conn, now: float) -> None: ...

    def on_line(self, conn: Conn, text: str, now: float) -> None: ...

    def on_probe_bytes(self, conn: Conn, received: int, now: float) -> None: ...

    def on_broken(self, conn: Conn, exc: OSError | ProtocolError, now: float) -> None: ...


class Links:
    """The listener and the connections of one node's mesh; the stage's loop feeds `on_event`."""

    def __init__(self, sel: selectors.BaseSelector, handler: Handler, max_conns: int) -> None:
        self.sel, self.handler, self.max_conns = sel, handler, max_conns
        self.listener: socket.socket | None = None
        self.conns: set[Conn] = set()
        self.scratch = bytearray(PROBE_CHUNK)
        self.payload = memoryview(bytes(PROBE_CHUNK))

    def listen(self, port: int, backlog: int) -> OSError | None:
        """Listen on `port` of every IPv4 address; the error when it cannot bind or listen (the
        caller words it)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - every IPv4 address: peers dial whichever they resolve
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            return exc
        sock.setblocking(False)
        self.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, self)
        return None

    def connect(self, dial: Dial, address: str, until: float) -> Conn | None:
        """Start connecting to `address`:dial.port; None (dial.error says why) when it fails at once."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex((address, dial.port))
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            dial.error = describe(OSError(code, os.strerror(code)))
            return None
        conn = Conn(sock, until, f"{address}:{dial.port}", dial)
        self.add(conn, selectors.EVENT_WRITE)
        return conn

    def _accept(self, now: float) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # EMFILE and the like: the peer retries
            if len(self.conns) > self.max_conns:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, now + HANDSHAKE_TIMEOUT, f"{addr[0]}:{addr[1]}")
            self.add(conn, selectors.EVENT_READ)
            self.handler.on_accepted(conn, now)

    # -- buffers and the selector --------------------------------------------------------------------

    def add(self, conn: Conn, mask: int) -> None:
        self.conns.add(conn)
        conn.mask = mask
        self.sel.register(conn.sock, mask, conn)

    def want(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        mask = selectors.EVENT_READ
        if conn.outbuf or conn.state == "connect" or (conn.state == "send" and conn.count < conn.total):
            mask |= selectors.EVENT_WRITE
        if mask != conn.mask:
            conn.mask = mask
            self.sel.modify(conn.sock, mask, conn)

    def queue(self, conn: Conn, data: bytes) -> None:
        conn.outbuf += data
        self.flush(conn)

    def flush(self, conn: Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            del conn.outbuf[:sent]
        self.want(conn)

    def pump(self, conn: Conn) -> None:
        """Send probe bytes until the socket's buffer is full or all are sent."""
        while conn.count < conn.total and not conn.outbuf:
            chunk = self.payload[: min(len(self.payload), conn.total - conn.count)]
            try:
                sent = conn.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                break
            conn.count += sent
        self.want(conn)

    def close(self, conn: Conn) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.sock.close()

    def reset(self, conn: Conn) -> None:
        """Close with a reset: what is still queued must not compete with the HELLOs."""
        try:
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close(conn)

    def close_all(self, linger: float) -> None:
        """Flush what is still queued (a GOT, an ACK) for up to `linger` s, then close everything."""
        until = time.monotonic() + linger
        while any(conn.outbuf for conn in self.conns) and time.monotonic() < until:
            for key, _ in self.sel.select(max(0.0, until - time.monotonic())):
                if isinstance(key.data, Conn) and key.data.outbuf:
                    try:
                        self.flush(key.data)
                    except OSError:
                        self.close(key.data)
        for conn in list(self.conns):
            self.close(conn)
        if self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()

    # -- events ----------------------------------------------------------------------------------------

    def on_event(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        if key.data is self:
            self._accept(now)
            return
        conn: Conn = key.data
        try:
            self._on_conn_event(conn, mask, now)
        except (ProtocolError, OSError) as exc:
            self.handler.on_broken(conn, exc, now)

    def _on_conn_event(self, conn: Conn, mask: int, now: float) -> None:
        if mask & selectors.EVENT_WRITE:
            if conn.state == "connect":
                code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
                conn.state, conn.until = "greet", now + HANDSHAKE_TIMEOUT
            self.flush(conn)
            if conn.state == "send":
                self.pump(conn)
        if not mask & selectors.EVENT_READ or conn not in self.conns:
            return
        if conn.state == "probe":
            received = conn.sock.recv_into(self.scratch)
            if not received:
                self.close(conn)
                return
            self.handler.on_probe_bytes(conn, received, now)
            return
        data = conn.sock.recv(65536)
        if not data:
            if conn.dial is not None:
                raise ProtocolError("connection closed by the peer")
            self.close(conn)
            return
        if conn.state == "drain":
            return
        conn.inbuf += data
        while conn in self.conns and conn.state not in ("probe", "drain"):
            line, found, rest = bytes(conn.inbuf).partition(b"\n")
            if not found:
                if len(conn.inbuf) >= MAX_LINE:
                    raise ProtocolError("line too long")
                return
            conn.inbuf = bytearray(rest)
            self.handler.on_line(conn, decode(line), now)
        if conn in self.conns and conn.state == "probe" and conn.inbuf:
            early, conn.inbuf = len(conn.inbuf), bytearray()
            self.handler.on_probe_bytes(conn, early, now)
