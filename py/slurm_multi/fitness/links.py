"""The fitness mesh's sockets: one listener, the dials and every connection, on the stage's selector.

`Dial` is one peer this node dials, with its candidate ports and its retry timing. `Links` owns the
plumbing and nothing of the meaning: it listens (on the first free candidate port), connects,
accepts, keeps each connection's buffers and selector mask, sends what it is given (and the ring
probe's bytes), and cuts what arrives into protocol lines or counts of probe bytes. What a line
means, what to answer and when to give up is its handler's (slurm_multi.fitness.mesh.Mesh), told
through four calls: `on_accepted`, `on_line`, `on_probe_bytes` and `on_broken` (a connection that
broke: an OSError, or a ProtocolError from a line, the handler's own included).

Whatever goes wrong on one connection stays there (as in slurm_multi.barrier_conns): a send that
fails (a peer that reset the connection, SO_LINGER(1, 0)) is kept on the connection and reported
from its next event, never raised into the stage; anything else a connection's event raises drops
that connection alone. Nobody without the token can take a peer's place: an accepted connection is
`pending` until its handler `trust`s it (a JOIN that verifies), which it must earn within
TOKEN_DEADLINE; each source address holds at most `per_source` pending connections (its oldest
goes first), and when the whole table is full the oldest pending connection of the busiest source
makes room, never a trusted one. Out of file descriptors, the oldest pending connection goes, or
the listener pauses for a moment.

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
from collections.abc import Sequence
from typing import Protocol

from slurm_multi.fitness.protocol import MAX_LINE, ProtocolError, decode
from slurm_multi.net import Backoff, bind_first_free, describe

HANDSHAKE_TIMEOUT = 2.0  # JOIN/WELCOME, HELLO/GOT: our peers answer at once
# Our listener greets every connection as it accepts it: a candidate port that does not within this
# is held by something else (a squatter, a silent listener), and the dialer moves on to the next.
GREETING_TIMEOUT = 1.0
TOKEN_DEADLINE = 1.0  # an accepted connection shows the token (a JOIN that verifies) within this
BACKOFF_START, BACKOFF_MAX = 0.02, 0.1  # a peer usually starts a moment late: retry soon
PROBE_CHUNK = 1 << 20  # one send() of probe bytes (zeros: nothing on a cluster's path compresses)
ACCEPT_BATCH = 64  # connections accepted per event: a flood cannot starve the readers
PAUSE_SECONDS = 0.2  # out of file descriptors with nothing pending to drop: stop accepting this long
OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Dial:
    """One peer this node dials: `mesh` (to deliver our HELLO) or `probe` (the ring probe), on its
    candidate `ports` in order until one is `known` (a WELCOME or a HELLO signed by the peer said it)."""

    __slots__ = (
        "rank",
        "host",
        "ports",
        "known",
        "purpose",
        "addresses",
        "attempts",
        "next_at",
        "backoff",
        "error",
        "errors",
        "refused",
        "conn",
        "done",
    )

    def __init__(self, rank: int, host: str, ports: Sequence[int], purpose: str) -> None:
        self.rank, self.host, self.ports, self.purpose = rank, host, list(ports), purpose
        self.known: int | None = None
        self.addresses: list[str] | None = None
        self.attempts = 0
        self.next_at = 0.0
        self.backoff = Backoff(BACKOFF_START, BACKOFF_MAX)
        self.error = ""  # the last error, whatever the port
        self.errors: dict[int, str] = {}  # the last error on each candidate port
        self.refused = False  # the last attempt was refused: nothing listens on that candidate yet
        self.conn: Conn | None = None
        self.done = False

    def target(self) -> tuple[str, int]:
        """The address and port of the next attempt: every address of the host on one candidate,
        then the next candidate (or always the known port)."""
        assert self.addresses
        count = len(self.addresses)
        address = self.addresses[self.attempts % count]
        port = self.known or self.ports[(self.attempts // count) % len(self.ports)]
        return address, port

    def note(self, port: int, error: str, refused: bool = False) -> None:
        self.error = error
        self.errors[port] = error
        self.refused = refused

    def said(self) -> str:
        """What the dial met, for the report: its one error, or each candidate's."""
        if len(self.ports) == 1 or self.known is not None or len(self.errors) <= 1:
            return self.error
        return "; ".join(f"port {port}: {error}" for port, error in sorted(self.errors.items()))

    def retry(self, now: float) -> None:
        """Dial again a little later, twice as late each time up to BACKOFF_MAX. After a refusal
        (nothing listens there: the peer has not started yet, or listens on another candidate)
        the next candidate is tried at once, until every candidate was tried since the last wait:
        a peer that starts late listens on its first free candidate, and a wait after each of
        four refusals put that candidate's next try 0.3 s away (the 2-node toy's mesh took 0.32 s
        where its peer started 0.16 s late)."""
        tries = len(self.addresses or ()) * len(self.ports) if self.known is None else 1
        if self.refused and tries > 1 and self.attempts % tries:
            self.next_at = now
            return
        self.next_at = now + self.backoff.next()


class Conn:
    """One TCP connection, dialled (`dial` set) or accepted, and where it is in the protocol."""

    __slots__ = (
        "sock",
        "dial",
        "port",
        "source",
        "pending",
        "error",
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

    def __init__(
        self, sock: socket.socket, until: float, addr: str, dial: Dial | None = None, port: int = 0
    ) -> None:
        self.sock, self.until, self.addr, self.dial, self.port = sock, until, addr, dial, port
        self.source = ""  # an accepted connection's peer address
        self.pending = False  # accepted, the token not shown yet
        self.error: OSError | None = None  # a send that failed: reported from the next event
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

    def __init__(
        self, sel: selectors.BaseSelector, handler: Handler, max_conns: int, per_source: int
    ) -> None:
        self.sel, self.handler = sel, handler
        self.max_conns, self.per_source = max_conns, per_source
        self.listener: socket.socket | None = None
        self.port: int | None = None  # the candidate it listens on
        self.taken: list[int] = []  # candidates another process holds
        self.conns: set[Conn] = set()
        self.pending: dict[str, list[Conn]] = {}  # source address -> its pending connections, oldest first
        self.paused_until = 0.0
        self.accepted = 0  # connections accepted, strangers' included
        self.scratch = bytearray(PROBE_CHUNK)
        self.payload = memoryview(bytes(PROBE_CHUNK))

    def listen(self, ports: Sequence[int], backlog: int) -> OSError | None:
        """Listen on the first free of `ports` on every IPv4 address (`port`; those another process
        holds are `taken`, and with all of them taken nothing listens); the error of one that
        cannot be bound for another reason (its `filename` the port: the caller words it)."""
        try:
            # every IPv4 address: peers dial whichever they resolve
            sock, busy = bind_first_free("0.0.0.0", ports, backlog)  # noqa: S104
        except OSError as exc:
            return exc
        self.taken = [int(port) for port in busy]
        if sock is None:
            return None
        sock.setblocking(False)
        self.listener, self.port = sock, sock.getsockname()[1]
        self.sel.register(sock, selectors.EVENT_READ, self)
        return None

    def connect(self, dial: Dial, address: str, port: int, until: float) -> Conn | None:
        """Start connecting to `address`:`port`; None (dial.error says why) when it fails at once."""
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        except OSError as exc:  # out of file descriptors: the dial retries
            dial.note(port, describe(exc))
            return None
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            code = sock.connect_ex((address, port))
        except OSError as exc:
            code = exc.errno or errno.EINVAL
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            dial.note(port, describe(OSError(code, os.strerror(code))), code == errno.ECONNREFUSED)
            return None
        conn = Conn(sock, until, f"{address}:{port}", dial, port)
        self.add(conn, selectors.EVENT_WRITE)
        return conn

    # -- accepting, and who keeps a slot -------------------------------------------------------------

    def _accept(self, now: float) -> None:
        assert self.listener is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_FDS:
                    self._shed(now)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                return
            source = str(addr[0])
            self.accepted += 1
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # reset before we looked at it
                sock.close()
                continue
            if not self._make_room(source):
                sock.close()
                continue
            conn = Conn(sock, now + TOKEN_DEADLINE, f"{addr[0]}:{addr[1]}")
            conn.source, conn.pending = source, True
            self.pending.setdefault(source, []).append(conn)
            self.add(conn, selectors.EVENT_READ)
            self.handler.on_accepted(conn, now)

    def _make_room(self, source: str) -> bool:
        """Room for one more pending connection from `source`: its own oldest pending one goes when it
        holds `per_source`; with the table full, the busiest source's oldest. False: every slot is
        held by a trusted connection."""
        mine = self.pending.get(source, [])
        if len(mine) >= self.per_source:
            self.close(mine[0])
        if len(self.conns) < self.max_conns:
            return True
        busiest = max(self.pending.values(), key=len, default=[])
        if not busiest:
            return False
        self.close(busiest[0])
        return True

    def _shed(self, now: float) -> None:
        """Out of file descriptors: drop the busiest source's oldest pending connection, or stop
        accepting for a moment (the listener would stay readable and spin the loop)."""
        busiest = max(self.pending.values(), key=len, default=[])
        if busiest:
            self.close(busiest[0])
            return
        if self.listener is not None and not self.paused_until:
            self.sel.unregister(self.listener)
            self.paused_until = now + PAUSE_SECONDS

    def tick(self, now: float) -> None:
        """The timers' call: a paused listener listens again."""
        if self.paused_until and now >= self.paused_until and self.listener is not None:
            self.paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ, self)

    def trust(self, conn: Conn) -> None:
        """An accepted connection showed the token: it keeps its slot from now on."""
        if conn.pending:
            conn.pending = False
            mine = self.pending.get(conn.source, [])
            if conn in mine:
                mine.remove(conn)
            if not mine:
                self.pending.pop(conn.source, None)

    # -- buffers and the selector --------------------------------------------------------------------

    def add(self, conn: Conn, mask: int) -> None:
        self.conns.add(conn)
        conn.mask = mask
        self.sel.register(conn.sock, mask, conn)

    def want(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        mask = selectors.EVENT_READ
        if (
            conn.outbuf
            or conn.error is not None
            or conn.state == "connect"
            or (conn.state == "send" and conn.count < conn.total)
        ):
            mask |= selectors.EVENT_WRITE
        if mask != conn.mask:
            conn.mask = mask
            self.sel.modify(conn.sock, mask, conn)

    def queue(self, conn: Conn, data: bytes) -> None:
        """Send `data` (what the socket does not take now goes when it is writable). Never raises: a
        failed send is reported from the connection's next event (on_broken)."""
        conn.outbuf += data
        self.flush(conn)

    def flush(self, conn: Conn) -> None:
        while conn.outbuf and conn.error is None:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                conn.error = exc
                break
            del conn.outbuf[:sent]
        self.want(conn)

    def pump(self, conn: Conn) -> None:
        """Send probe bytes until the socket's buffer is full or all are sent."""
        while conn.count < conn.total and not conn.outbuf and conn.error is None:
            chunk = self.payload[: min(len(self.payload), conn.total - conn.count)]
            try:
                sent = conn.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                conn.error = exc
                break
            conn.count += sent
        self.want(conn)

    def close(self, conn: Conn) -> None:
        self.trust(conn)  # out of the pending table
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
        while any(conn.outbuf and conn.error is None for conn in self.conns) and time.monotonic() < until:
            for key, _ in self.sel.select(max(0.0, until - time.monotonic())):
                if isinstance(key.data, Conn) and key.data.outbuf:
                    self.flush(key.data)
        for conn in list(self.conns):
            self.close(conn)
        if self.listener is not None:
            if not self.paused_until:
                self.sel.unregister(self.listener)
            self.listener.close()

    # -- events ----------------------------------------------------------------------------------------

    def on_event(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        if key.data is self:
            self._accept(now)
            return
        conn: Conn = key.data
        if conn not in self.conns:  # closed by an earlier event of the same round
            return
        try:
            self._on_conn_event(conn, mask, now)
        except (ProtocolError, OSError) as exc:
            self.handler.on_broken(conn, exc, now)
        except Exception as exc:  # noqa: BLE001 - one connection's surprise never takes the stage down
            self.handler.on_broken(conn, ProtocolError(f"internal error ({type(exc).__name__})"), now)

    def _on_conn_event(self, conn: Conn, mask: int, now: float) -> None:
        if conn.error is not None:
            raise conn.error
        if mask & selectors.EVENT_WRITE:
            if conn.state == "connect":
                code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
                conn.state, conn.until = "greet", now + GREETING_TIMEOUT
            self.flush(conn)
            if conn.state == "send":
                self.pump(conn)
            if conn.error is not None:
                raise conn.error
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
