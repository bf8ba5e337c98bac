"""The barrier server's connections: accepting, one line in and one answer out per connection, the
per-connection limits and deadlines, and closing, on one single-threaded selectors loop.

What a line means and what to answer (who is ready, GO or ABORT) is BarrierServer's, in
slurm_multi.barrier: it is the `Handler` this loop tells about each line, each connection that
goes, and each line from rank 0's control pipe.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from slurm_multi import auth
from slurm_multi.common import HelperError, usage_error
from slurm_multi.net import Keepalive, bind_first_free, keepalive, peer
from slurm_multi.wire import MAX_LINE, challenge_line

DRAIN_SECONDS = 1.0  # after an answer, keep reading (and discarding) so close() does not RST it
NOTE_BUDGET, NOTE_WINDOW = 40, 10.0  # per-connection log lines allowed per window (floods are summed)
# A worker node that dies without a FIN would otherwise count as present until the timeout; the
# connections idle for minutes, so the probes may be slow (docs/barrier.md documents these). The
# clients' dials carry the same.
KEEPALIVE = Keepalive(idle=30, interval=10, probes=3)

Log = Callable[[str], None]


def bind_listener(address: str, ports: Sequence[int]) -> tuple[socket.socket, str, int]:
    """The first free candidate port on `address`, listening (non-blocking); the port it got."""
    if not ports:
        raise usage_error("barrier: no candidate port to listen on")
    try:
        sock, tried = bind_first_free(address, ports, 4096)
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise HelperError(
                f"barrier: cannot listen on {address}: not an address of this host; "
                "check MASTER_ADDR or pass --bind ADDR"
            ) from None
        if isinstance(exc, socket.gaierror):
            raise usage_error(f"barrier: cannot listen on {address}: {exc.strerror}") from None
        raise HelperError(f"barrier: cannot listen on {address}:{exc.filename}: {exc.strerror}") from None
    if sock is not None:
        sock.setblocking(False)
        return sock, address, sock.getsockname()[1]
    raise HelperError(
        f"barrier: every candidate port on {address} is in use ({','.join(tried)}); "
        "set SM_BARRIER_PORT (or --port) to a free port on every node"
    )


class Conn:
    """One connection the server holds (a plain class with slots: one per worker, thousands)."""

    __slots__ = ("sock", "peer", "buf", "out", "kind", "challenge", "nonce", "rank", "phase",
                 "close_after_flush", "draining", "closed")  # fmt: skip

    def __init__(self, sock: socket.socket, peer: str, challenge: str = "") -> None:
        self.sock, self.peer = sock, peer
        self.buf, self.out = bytearray(), bytearray()
        self.kind = "new"  # new -> worker | done
        self.challenge = challenge  # S, sent on accept: the client's line must be signed over it
        self.nonce = ""  # the client's C: our reply is signed over it
        self.rank, self.phase = 0, ""
        self.close_after_flush = self.draining = self.closed = False


class Handler(Protocol):
    """What the connections tell the barrier's decisions (BarrierServer)."""

    def on_line(self, conn: Conn, line: bytes) -> None:
        """A connection's one line (without its newline), within the limits."""

    def on_gone(self, conn: Conn) -> None:
        """A connection closed by its peer (or dropped after a surprise), before it is closed here."""

    def on_control_line(self, text: str) -> None:
        """A line from rank 0's control pipe, decoded and stripped."""

    def on_control_closed(self) -> None:
        """Rank 0's control pipe reached its end."""


class Connections:
    """The listener (bound in the constructor, so `port` is known at once), the accepted
    connections, a wake-up pair for signal handlers and threads, and rank 0's control pipe."""

    def __init__(
        self,
        handler: Handler,
        address: str,
        ports: Sequence[int],
        *,
        line_timeout: float,
        log: Log,
        control_fd: int | None = None,
    ) -> None:
        self._handler = handler
        self.line_timeout = line_timeout
        self._log = log
        self.listener, self.address, self.port = bind_listener(address, ports)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, "listen")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._line_deadlines: deque[tuple[float, Conn]] = deque()
        self._drain_deadlines: deque[tuple[float, Conn]] = deque()
        self._writers: set[Conn] = set()
        self._conns: set[Conn] = set()
        self._closed = False
        self._listen_paused_until = 0.0
        self._notes_left, self._notes_reset, self._notes_dropped = NOTE_BUDGET, 0.0, 0
        # Rank 0's own task talks to the server on a pipe (RELEASE <image-id> / ABORT <reason>): no
        # port to find, no token, no ready file.
        self._control_fd = control_fd
        self._control_buf = bytearray()
        if control_fd is not None:
            os.set_blocking(control_fd, False)
            self._sel.register(control_fd, selectors.EVENT_READ, "control")

    def wake(self) -> None:
        """End the current poll() at once; safe from signal handlers and threads."""
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns):
            self.drop(conn)
        if self._control_fd is not None:
            try:
                self._sel.unregister(self._control_fd)
            except (KeyError, ValueError):
                pass
        for sock in (self.listener, self._wake_r, self._wake_w):
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
            sock.close()
        self._sel.close()

    # -- logging -----------------------------------------------------------------------------------

    def note(self, message: str) -> None:
        """Per-connection log line, rate limited so a flood of bad clients cannot flood the log."""
        now = time.monotonic()
        if now >= self._notes_reset:
            self._notes_left, self._notes_reset = NOTE_BUDGET, now + NOTE_WINDOW
        if self._notes_left > 0:
            self._notes_left -= 1
            self._log(message)
        else:
            self._notes_dropped += 1

    def take_dropped(self) -> int:
        """How many notes the rate limit dropped since the last call."""
        dropped, self._notes_dropped = self._notes_dropped, 0
        return dropped

    # -- the loop ----------------------------------------------------------------------------------

    @property
    def writing(self) -> bool:
        """Some answer has not left yet."""
        return bool(self._writers)

    def poll(self, now: float, wait: float) -> None:
        """One round: expire the deadlines due at `now`, then serve what is ready within `wait` s."""
        self._expire(now)
        if self._listen_paused_until and now >= self._listen_paused_until:
            self._listen_paused_until = 0.0
            self._sel.register(self.listener, selectors.EVENT_READ, "listen")
        for key, mask in self._sel.select(max(0.0, wait)):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                self._drain_wakeups()
            elif key.data == "control":
                self._on_control()
            else:
                self._on_event(key.data, mask)

    def _on_event(self, conn: Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE and not conn.closed:
                self._flush(conn)
            if mask & selectors.EVENT_READ and not conn.closed:
                self._on_readable(conn)
        except Exception as exc:  # one connection's surprise must not take the whole barrier down
            self._log(f"internal error on {conn.peer} ({type(exc).__name__}); dropped that connection")
            self.gone(conn)

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _expire(self, now: float) -> None:
        while self._line_deadlines and self._line_deadlines[0][0] <= now:
            _, conn = self._line_deadlines.popleft()
            if conn.kind == "new" and not conn.closed:
                self.reject(conn, "line timeout")
        while self._drain_deadlines and self._drain_deadlines[0][0] <= now:
            _, conn = self._drain_deadlines.popleft()
            self.drop(conn)

    def _on_control(self) -> None:
        """Lines from rank 0's task on the control pipe; its end closing is the handler's to judge."""
        assert self._control_fd is not None
        try:
            data = os.read(self._control_fd, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._sel.unregister(self._control_fd)
            self._control_fd = None
            self._handler.on_control_closed()
            return
        self._control_buf += data
        while b"\n" in self._control_buf:
            line, _, rest = bytes(self._control_buf).partition(b"\n")
            self._control_buf = bytearray(rest)
            self._handler.on_control_line(line.decode("utf-8", "replace").strip())

    # -- connections -------------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(256):  # bounded, so a connection flood cannot starve the readers
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self._shed_load(exc)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                self.note(f"accept failed: {exc.strerror}")
                return
            sock.setblocking(False)
            try:
                keepalive(sock, KEEPALIVE)
            except OSError:
                pass
            conn = Conn(sock, peer(addr), challenge=auth.new_nonce())
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self._line_deadlines.append((time.monotonic() + self.line_timeout, conn))
            self.queue(conn, challenge_line(conn.challenge))

    def _shed_load(self, exc: OSError) -> None:
        """Out of file descriptors: drop the oldest connection that has not said anything yet."""
        while self._line_deadlines:
            _, conn = self._line_deadlines.popleft()
            if conn.kind == "new" and not conn.closed:
                self.note(f"out of file descriptors ({exc.strerror}); dropped idle {conn.peer}")
                self.drop(conn)
                return
        self.note(f"out of file descriptors ({exc.strerror}); pausing accept for 0.2 s")
        self._sel.unregister(self.listener)
        self._listen_paused_until = time.monotonic() + 0.2

    def _on_readable(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(65536 if conn.draining else 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.gone(conn)
            return
        if conn.kind != "new" or conn.draining:
            return  # one line each way: whatever follows is ignored (still read, to see EOF)
        conn.buf += data
        newline = conn.buf.find(b"\n")
        if newline < 0:
            if len(conn.buf) >= MAX_LINE:
                self.reject(conn, "line too long")
            return
        if newline + 1 > MAX_LINE:
            self.reject(conn, "line too long")
            return
        line = bytes(conn.buf[:newline])
        conn.buf.clear()
        self._handler.on_line(conn, line)

    def gone(self, conn: Conn) -> None:
        """The peer closed (or the connection broke): the handler hears it, then it is closed."""
        self._handler.on_gone(conn)
        self.drop(conn)

    def drop(self, conn: Conn) -> None:
        """Close a connection now, whatever it has not sent."""
        if conn.closed:
            return
        conn.closed = True
        self._writers.discard(conn)
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def queue(self, conn: Conn, line: bytes) -> None:
        """Send a line and keep the connection open (the challenge, WAIT)."""
        conn.out += line
        self._flush(conn)

    def send(self, conn: Conn, line: bytes) -> None:
        """Send the connection's one answer, then close it once the peer has it."""
        conn.out += line
        conn.close_after_flush = True
        conn.kind = "done"
        self._flush(conn)

    def reject(self, conn: Conn, reason: str) -> None:
        """The unsigned `ERR <reason>` answer (logged, rate limited)."""
        self.note(f"rejected {conn.peer}: {reason}")
        self.send(conn, f"ERR {reason}\n".encode())

    def _flush(self, conn: Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.drop(conn)
            return
        del conn.out[:sent]
        if conn.out:
            if conn not in self._writers:
                self._writers.add(conn)
                self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        if conn in self._writers:
            self._writers.discard(conn)
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        if conn.close_after_flush and not conn.draining:
            # Half-close and read until the peer closes: close() with unread input would send a
            # RST that can destroy the answer before the peer reads it.
            conn.draining = True
            try:
                conn.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.drop(conn)
                return
            self._drain_deadlines.append((time.monotonic() + DRAIN_SECONDS, conn))
