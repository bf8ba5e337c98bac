"""The fitness stage's sockets: the mesh of every node with every other, and the ring probe.

Every node listens on its port on all IPv4 addresses (SO_REUSEADDR; a port already taken is a local
failure naming it), dials every other node's port (every IPv4 address of its name in turn), retrying
until the deadline, and speaks slurm_multi.fitness.protocol on each connection.

The ring probe: rank r sends --probe-bytes to rank (r+1) % N on a connection of its own and measures
the rate until the receiver acknowledges them all (bytes / seconds from the first byte sent to the
last ACK). At --probe-seconds (or when the HELLOs are due) the probe stops, resets its connection,
and the rate is the bytes acknowledged / the seconds until the last acknowledgement (0 when none
came): a slow link never makes the stage time out.

A node is done once it has delivered its HELLO to every peer (GOT) and received every peer's HELLO,
or at the deadline; it keeps listening until every peer has delivered to it.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

from slurm_multi import auth
from slurm_multi.fitness.protocol import (
    BAD_TOKEN,
    MAX_LINE,
    Hello,
    ProtocolError,
    Rejected,
    ack_line,
    claimed_rank,
    decode,
    err_line,
    got_line,
    greeting_line,
    hello_line,
    join_line,
    parse_ack,
    parse_got,
    parse_greeting,
    parse_hello,
    parse_join,
    parse_welcome,
    welcome_line,
)
from slurm_multi.net import connect_addresses, describe, secs

ATTEMPT_TIMEOUT = 1.0  # one connect attempt: a dropped SYN never answers
HANDSHAKE_TIMEOUT = 2.0  # greeting, JOIN/WELCOME, HELLO/GOT: our peers answer at once
BACKOFF_START, BACKOFF_MAX = 0.02, 0.25  # a peer usually starts a moment late: retry soon
ACK_EVERY, ACK_SECONDS = 256 << 10, 0.1
PROBE_CHUNK = 1 << 20  # one send() of probe bytes (zeros: nothing on a cluster's path compresses)
MAX_REJECTED = 20  # rejected connections kept in the report


def _errno_text(code: int) -> str:
    return describe(OSError(code, os.strerror(code)))


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


class Mesh:
    """This node's side of the mesh; the caller's loop feeds it events and timer ticks."""

    def __init__(
        self,
        sel: selectors.BaseSelector,
        me: int,
        hosts: Sequence[str],
        ports: Sequence[int],
        job: str,
        token: str,
        probe_bytes: int,
        probe_seconds: float,
        hello_by: float,
        deadline: float,
    ) -> None:
        self.sel, self.me, self.job, self.token = sel, me, job, token
        self.hosts, self.ports = list(hosts), list(ports)
        self.n = len(hosts)
        self.probe_bytes, self.probe_seconds = probe_bytes, probe_seconds
        self.hello_by, self.deadline = hello_by, deadline
        self.peers = [q for q in range(self.n) if q != me]
        self.dials = {q: Dial(q, hosts[q], ports[q], "mesh") for q in self.peers}
        successor = (me + 1) % self.n
        self.probe = Dial(successor, hosts[successor], ports[successor], "probe") if probe_bytes > 0 else None
        self.ring: dict[str, Any] = {
            "to": successor,
            "bytes": 0,
            "seconds": 0.0,
            "bytes_per_s": None,
            "complete": False,
            "error": "",
        }
        if self.probe is None:
            self.ring["error"] = "no probe (--probe-bytes 0)"
        self.listener: socket.socket | None = None
        self.listen_error = ""
        self.heard: dict[int, dict[str, Any]] = {}
        self.reached: set[int] = set()
        self.token_rejected_by: set[int] = set()
        self.rejected: list[dict[str, Any]] = []
        self.hello: Hello | None = None
        self.conns: set[Conn] = set()
        self.scratch = bytearray(PROBE_CHUNK)
        self.payload = memoryview(bytes(PROBE_CHUNK))

    # -- setup and state ---------------------------------------------------------------------------

    def listen(self) -> None:
        port = self.ports[self.me]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - every IPv4 address: peers dial whichever they resolve
            sock.listen(max(128, 4 * self.n))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                self.listen_error = (
                    f"port {port} is already in use on this node (another job's, or a stale stage?)"
                )
            else:
                self.listen_error = f"cannot listen on port {port} ({describe(exc)})"
            return
        sock.setblocking(False)
        self.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, self)

    def probe_done(self) -> bool:
        return self.probe is None or self.probe.done

    def done(self) -> bool:
        delivered = all(dial.done for dial in self.dials.values())
        heard_all = self.listener is None or len(self.heard) == len(self.peers)
        return delivered and heard_all and self.probe_done()

    def not_heard(self) -> list[int]:
        return [q for q in self.peers if q not in self.heard]

    def set_hello(self, hello: Hello, now: float) -> None:
        self.hello = hello
        for conn in list(self.conns):
            if conn.dial is not None and conn.state == "joined":
                self._send_hello(conn, now)

    def next_timer(self) -> float:
        times = [self.deadline]
        for dial in [*self.dials.values(), *([self.probe] if self.probe else [])]:
            if not dial.done and dial.conn is None:
                times.append(dial.next_at)
        if self.probe is not None and not self.probe.done:
            times.append(self.hello_by)
        times += [conn.until for conn in self.conns]
        return min(times)

    # -- timers --------------------------------------------------------------------------------------

    def on_timers(self, now: float) -> None:
        probe = self.probe
        if probe is not None and not probe.done and now >= self.hello_by:
            if probe.conn is not None and probe.conn.state == "send":
                self._finish_probe(
                    probe.conn, now, f"stopped at the bound after {probe.conn.acked} bytes acknowledged"
                )
            else:
                if probe.conn is not None:
                    self._close(probe.conn)
                    probe.conn = None
                probe.done = True
                self.ring["error"] = (
                    f"no probe connection to {probe.host} (rank {probe.rank}) in time: "
                    f"{probe.error or 'no answer'}"
                )
        for dial in [*self.dials.values(), *([self.probe] if self.probe else [])]:
            if not dial.done and dial.conn is None and now >= dial.next_at and now < self.deadline:
                self._start_dial(dial, now)
        for conn in [c for c in self.conns if now >= c.until]:
            self._on_timeout(conn, now)

    def _on_timeout(self, conn: Conn, now: float) -> None:
        if conn.dial is None and conn.state == "probe" and now < self.deadline:
            if conn.count > conn.acked:
                self._ack(conn, now)  # what came before the link stalled
            conn.until = self.deadline
        elif conn.dial is None:
            self._close(conn)  # a silent client, or the deadline
        elif conn.state == "send":
            self._finish_probe(conn, now, f"stopped at the bound after {conn.acked} bytes acknowledged")
        elif conn.state == "connect":
            self._fail(conn, "timed out", now)
        else:
            waited = {
                "greet": "no fitness greeting",
                "welcome": "no answer to JOIN",
                "got": "no GOT for our HELLO",
            }
            self._fail(conn, f"{waited.get(conn.state, 'no answer')} within {secs(HANDSHAKE_TIMEOUT)} s", now)

    # -- dialing -------------------------------------------------------------------------------------

    def _start_dial(self, dial: Dial, now: float) -> None:
        if dial.addresses is None:
            try:
                dial.addresses = connect_addresses(dial.host) or None
            except OSError as exc:
                dial.error = f"{dial.host} does not resolve ({describe(exc)})"
            if dial.addresses is None:
                dial.error = dial.error or f"{dial.host} has no IPv4 address"
                self._retry(dial, now)
                return
        address = dial.addresses[dial.attempts % len(dial.addresses)]
        dial.attempts += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex((address, dial.port))
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            dial.error = _errno_text(code)
            self._retry(dial, now)
            return
        conn = Conn(sock, now + ATTEMPT_TIMEOUT, f"{address}:{dial.port}", dial)
        dial.conn = conn
        self._add(conn, selectors.EVENT_WRITE)

    def _retry(self, dial: Dial, now: float) -> None:
        dial.next_at = now + dial.backoff
        dial.backoff = min(dial.backoff * 2, BACKOFF_MAX)

    def _fail(self, conn: Conn, error: str, now: float) -> None:
        """A dialled connection that broke: note why and dial again later."""
        dial = conn.dial
        assert dial is not None
        if dial.purpose == "probe" and conn.state == "send":
            self._finish_probe(conn, now, f"{error} after {conn.acked} bytes acknowledged")
            return
        self._close(conn)
        dial.conn = None
        dial.error = error
        self._retry(dial, now)

    def _on_dial_line(self, conn: Conn, text: str, now: float) -> None:
        dial = conn.dial
        assert dial is not None
        if conn.state == "greet":
            conn.challenge = parse_greeting(text)
            conn.nonce = auth.new_nonce()
            nbytes = self.probe_bytes if dial.purpose == "probe" else 0
            self._queue(
                conn,
                join_line(
                    self.token, self.job, conn.challenge, conn.nonce, self.me, dial.rank, dial.purpose, nbytes
                ),
            )
            conn.state = "welcome"
        elif conn.state == "welcome":
            parse_welcome(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank, dial.purpose)
            if dial.purpose == "probe":
                conn.state, conn.total, conn.started = "send", self.probe_bytes, now
                conn.until = min(now + self.probe_seconds, self.hello_by)
                self._pump_probe(conn)
            else:
                conn.state, conn.until = "joined", float("inf")
                if self.hello is not None:
                    self._send_hello(conn, now)
        elif conn.state == "got":
            parse_got(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank)
            self.reached.add(dial.rank)
            dial.done, dial.error = True, ""
            self._close(conn)
            dial.conn = None
        elif conn.state == "send":
            conn.acked, conn.last_ack = (
                parse_ack(text, self.token, self.job, conn.challenge, conn.nonce, conn.total),
                now,
            )
            if conn.acked >= conn.total:
                self._finish_probe(conn, now, "")
        else:
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def _send_hello(self, conn: Conn, now: float) -> None:
        assert self.hello is not None
        hello = self.hello._replace(sent=time.time())
        self._queue(conn, hello_line(self.token, self.job, conn.challenge, conn.nonce, hello))
        conn.state, conn.until = "got", now + HANDSHAKE_TIMEOUT

    def _pump_probe(self, conn: Conn) -> None:
        """Send probe bytes until the socket's buffer is full or all are sent."""
        while conn.count < conn.total and not conn.outbuf:
            chunk = self.payload[: min(len(self.payload), conn.total - conn.count)]
            try:
                sent = conn.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                break
            conn.count += sent
        self._want(conn)

    def _finish_probe(self, conn: Conn, now: float, error: str) -> None:
        complete = conn.acked >= conn.total > 0
        seconds = (conn.last_ack if conn.acked else now) - conn.started
        rate = conn.acked / max(seconds, 1e-6) if conn.acked else 0.0
        self.ring.update(
            bytes=conn.acked,
            seconds=round(seconds, 6),
            bytes_per_s=round(rate),
            complete=complete,
            error=error,
        )
        assert self.probe is not None
        self.probe.done, self.probe.conn = True, None
        if not complete:  # reset: what is still queued must not compete with the HELLOs
            try:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self._close(conn)

    # -- accepting -----------------------------------------------------------------------------------

    def _accept(self, now: float) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # EMFILE and the like: the peer retries
            if len(self.conns) > 4 * self.n + 64:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, now + HANDSHAKE_TIMEOUT, f"{addr[0]}:{addr[1]}")
            conn.challenge = auth.new_nonce()
            self._add(conn, selectors.EVENT_READ)
            self._queue(conn, greeting_line(conn.challenge))

    def _on_accepted_line(self, conn: Conn, text: str, now: float) -> None:
        if conn.state == "join":
            try:
                join = parse_join(text, self.token, self.job, conn.challenge, self.me, self.n)
            except ProtocolError as exc:
                if str(exc) == BAD_TOKEN and len(self.rejected) < MAX_REJECTED:
                    self.rejected.append(
                        {"from": conn.addr, "rank": claimed_rank(text, self.n), "reason": BAD_TOKEN}
                    )
                self._queue(conn, err_line(str(exc)))
                conn.state, conn.until = "drain", now + HANDSHAKE_TIMEOUT
                return
            conn.nonce, conn.rank = join.nonce, join.rank
            self._queue(
                conn, welcome_line(self.token, self.job, conn.challenge, conn.nonce, self.me, join.purpose)
            )
            conn.until = self.deadline
            if join.purpose == "probe":
                conn.state, conn.total, conn.last_ack = "probe", join.nbytes, now
                early, conn.inbuf = bytes(conn.inbuf), bytearray()
                self._count_probe(conn, len(early), now)
            else:
                conn.state = "hello"
        elif conn.state == "hello":
            hello = parse_hello(text, self.token, self.job, conn.challenge, conn.nonce, conn.rank, self.n)
            received = time.time()
            self.heard.setdefault(
                hello.rank,
                {
                    "host": hello.host,
                    "verdict": hello.verdict,
                    "ring_to": hello.ring_to,
                    "ring_bytes_per_s": hello.ring_rate,
                    "offset": round(hello.sent - received, 6),
                },
            )
            self._queue(conn, got_line(self.token, self.job, conn.challenge, conn.nonce, self.me))
            conn.state = "drain"
        elif conn.state != "drain":
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def _count_probe(self, conn: Conn, received: int, now: float) -> None:
        conn.count += received
        if conn.count > conn.total:
            raise ProtocolError("more probe bytes than announced")
        if (
            conn.count == conn.total
            or conn.count - conn.acked >= ACK_EVERY
            or (conn.count > conn.acked and now - conn.last_ack >= ACK_SECONDS)
        ):
            self._ack(conn, now)
        elif conn.count > conn.acked:  # acknowledged within ACK_SECONDS even if no more come (a stall)
            conn.until = min(self.deadline, conn.last_ack + ACK_SECONDS)
        if conn.count == conn.total:
            conn.state = "drain"

    def _ack(self, conn: Conn, now: float) -> None:
        conn.acked, conn.last_ack, conn.until = conn.count, now, self.deadline
        self._queue(conn, ack_line(self.token, self.job, conn.challenge, conn.nonce, conn.count))

    # -- plumbing ------------------------------------------------------------------------------------

    def _add(self, conn: Conn, mask: int) -> None:
        self.conns.add(conn)
        conn.mask = mask
        self.sel.register(conn.sock, mask, conn)

    def _want(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        mask = selectors.EVENT_READ
        if conn.outbuf or conn.state == "connect" or (conn.state == "send" and conn.count < conn.total):
            mask |= selectors.EVENT_WRITE
        if mask != conn.mask:
            conn.mask = mask
            self.sel.modify(conn.sock, mask, conn)

    def _queue(self, conn: Conn, data: bytes) -> None:
        conn.outbuf += data
        self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            del conn.outbuf[:sent]
        self._want(conn)

    def _close(self, conn: Conn) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.sock.close()

    def close(self, linger: float = 0.5) -> None:
        """Flush what is still queued (a GOT, an ACK) for up to `linger` s, then close everything."""
        until = time.monotonic() + linger
        while any(conn.outbuf for conn in self.conns) and time.monotonic() < until:
            for key, _ in self.sel.select(max(0.0, until - time.monotonic())):
                if isinstance(key.data, Conn) and key.data.outbuf:
                    try:
                        self._flush(key.data)
                    except OSError:
                        self._close(key.data)
        for conn in list(self.conns):
            self._close(conn)
        if self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()

    def on_event(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        if key.data is self:
            self._accept(now)
            return
        conn: Conn = key.data
        try:
            self._on_conn_event(conn, mask, now)
        except Rejected as exc:
            if conn.dial is not None:
                if str(exc) == BAD_TOKEN:
                    self.token_rejected_by.add(conn.dial.rank)
                self._fail(conn, f"rejected: {exc}", now)
            else:
                self._close(conn)
        except (ProtocolError, OSError) as exc:
            error = describe(exc) if isinstance(exc, OSError) else str(exc)
            if conn.dial is not None:
                self._fail(conn, error, now)
            else:  # tell the dialer why (best effort), then drop it
                if isinstance(exc, ProtocolError):
                    try:
                        conn.sock.send(err_line(str(exc)))
                    except OSError:
                        pass
                self._close(conn)

    def _on_conn_event(self, conn: Conn, mask: int, now: float) -> None:
        if mask & selectors.EVENT_WRITE:
            if conn.state == "connect":
                code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
                conn.state, conn.until = "greet", now + HANDSHAKE_TIMEOUT
            self._flush(conn)
            if conn.state == "send":
                self._pump_probe(conn)
        if not mask & selectors.EVENT_READ or conn not in self.conns:
            return
        if conn.state == "probe":
            received = conn.sock.recv_into(self.scratch)
            if not received:
                self._close(conn)
                return
            self._count_probe(conn, received, now)
            return
        data = conn.sock.recv(65536)
        if not data:
            if conn.dial is not None:
                raise ProtocolError("connection closed by the peer")
            self._close(conn)
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
            text = decode(line)
            if conn.dial is not None:
                self._on_dial_line(conn, text, now)
            else:
                self._on_accepted_line(conn, text, now)
        if conn in self.conns and conn.state == "probe" and conn.inbuf:
            early, conn.inbuf = len(conn.inbuf), bytearray()
            self._count_probe(conn, early, now)

    # -- the record ----------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        offsets = {str(self.me): 0.0, **{str(q): info["offset"] for q, info in sorted(self.heard.items())}}
        peers = {
            str(q): {key: info[key] for key in ("host", "verdict", "ring_to", "ring_bytes_per_s")}
            for q, info in sorted(self.heard.items())
        }
        return {
            "port": self.ports[self.me],
            "listening": self.listener is not None,
            "listen_error": self.listen_error,
            "reached": sorted(self.reached),
            "heard": sorted(self.heard),
            "errors": {
                str(q): d.error for q, d in sorted(self.dials.items()) if q not in self.reached and d.error
            },
            "token_rejected_by": sorted(self.token_rejected_by),
            "rejected": self.rejected,
            "ring": self.ring,
            "offsets": offsets,
            "peers": peers,
        }
