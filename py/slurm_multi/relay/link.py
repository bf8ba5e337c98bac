"""One relay link: a socket to a parent or a child, its read buffer, its key and frame count.

A link carries the handshake's lines, then the frames (slurm_multi.relay.protocol). `collect` reads
the status lines (READY, WAIT, DONE, FAIL) that a node's children send up on their links.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from slurm_multi import net
from slurm_multi.relay.protocol import FRAME, MAX_LINE, frame_tag, parse_status
from slurm_multi.relay.tree import Plan
from slurm_multi.wire import ProtocolError

ABORT_SEND_TIMEOUT = 1.0  # what a line or frame to a peer that may be gone (a DENY, an abort) waits


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
    sent: int = 0  # stream bytes (D payloads) sent on this link
    last_sent: float = 0.0  # when the last frame went (time.monotonic())

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


def collect(
    plan: Plan,
    links: list[Link],
    verb: str,
    deadline: float,
    *,
    stop_on_fail: bool = True,
    quiet_for: float | None = None,
    beat: Callable[[], None] | None = None,
) -> dict[int, tuple[bool, int, str]]:
    """One READY / DONE / FAIL line from each link, by rank; with stop_on_fail, until a FAIL.

    With `quiet_for`, a link's deadline moves on each time it sends WAIT (its subtree is still
    streaming: a long chain's tail lags rank 0 by what the links buffer), and `beat` sends our own
    WAIT up meanwhile, so only a subtree that makes no progress for that long is given up on.
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
                outcome = _take_status(link, verb, until, quiet_for)
                if outcome is not None and done(link, outcome):
                    return results
            now = time.monotonic()
            for link in [link for link in pending.values() if until[link.rank] <= now]:
                why = (
                    f"showed no progress for {net.secs(quiet_for)} s after the trailer (no DONE, no WAIT)"
                    if quiet_for is not None
                    else f"was not {verb} within {net.secs(plan.connect_timeout)} s"
                )
                if done(link, (False, 0, why)):
                    return results
            if not pending:
                break
            if quiet_for is not None and beat is not None:
                beat()
            wait = min(until[link.rank] for link in pending.values()) - now
            for key, _ in sel.select(max(0.0, min(wait, plan.heartbeat, 1.0))):
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
    link: Link, verb: str, until: dict[int, float], quiet_for: float | None
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
