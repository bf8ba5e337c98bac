"""The barrier server's connections (slurm_multi.barrier_conns) under a recording handler: what a
line, a silent or chatty peer, a peer that leaves and rank 0's control pipe turn into. What the
lines mean is BarrierServer's (test_barrier.py)."""

from __future__ import annotations

import os
import select
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from slurm_multi import barrier_conns
from slurm_multi.barrier_conns import Conn, Connections
from slurm_multi.wire import MAX_LINE, parse_challenge

LOOPBACK = "127.0.0.1"


class Recorder:
    """A Handler that keeps what it is told and answers each line with `OK <line>`."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.gone: list[Conn] = []
        self.control: list[str] = []
        self.control_closed = False
        self.io: Connections | None = None

    def on_line(self, conn: Conn, line: bytes) -> None:
        self.lines.append(line)
        assert self.io is not None
        self.io.send(conn, b"OK " + line + b"\n")

    def on_gone(self, conn: Conn) -> None:
        self.gone.append(conn)

    def on_control_line(self, text: str) -> None:
        self.control.append(text)

    def on_control_closed(self) -> None:
        self.control_closed = True


Served = tuple[Connections, Recorder, list[str]]


@pytest.fixture
def served() -> Iterator[Served]:
    handler, logs = Recorder(), []
    io = Connections(handler, LOOPBACK, [0], line_timeout=0.3, log=logs.append)
    handler.io = io
    try:
        yield io, handler, logs
    finally:
        io.close()


def pump(io: Connections, until: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "condition not reached in time"
        io.poll(time.monotonic(), 0.02)


def dial(io: Connections) -> tuple[socket.socket, str]:
    """A client and the CHALLENGE nonce it was greeted with."""
    sock = socket.create_connection((LOOPBACK, io.port), timeout=5)
    pump(io, lambda: bool(select.select([sock], [], [], 0)[0]))  # accepted, greeted
    return sock, parse_challenge(sock.makefile("rb").readline().rstrip(b"\n"))


def answer(io: Connections, sock: socket.socket) -> bytes:
    """Everything the server sends until it closes its side."""
    sock.setblocking(False)
    got = bytearray()
    closed = False

    def done() -> bool:
        nonlocal closed
        try:
            chunk = sock.recv(4096)
        except BlockingIOError:
            return False
        closed = not chunk
        got.extend(chunk)
        return closed

    pump(io, done)
    return bytes(got)


def test_a_line_reaches_the_handler_and_its_answer_ends_the_connection(served: Served) -> None:
    io, handler, _ = served
    sock, challenge = dial(io)
    assert len(challenge) == 32
    sock.sendall(b"READY x\nignored after the one line\n")
    assert answer(io, sock) == b"OK READY x\n"  # then a half-close: the client sees EOF
    assert handler.lines == [b"READY x"]
    sock.close()


@pytest.mark.parametrize(
    ("sent", "err"), [(b"x" * MAX_LINE, b"ERR line too long\n"), (b"", b"ERR line timeout\n")]
)
def test_a_line_too_long_or_too_late_is_refused_before_the_handler_sees_it(
    served: Served, sent: bytes, err: bytes
) -> None:
    io, handler, logs = served
    sock, _ = dial(io)
    sock.sendall(sent)
    assert answer(io, sock) == err
    assert handler.lines == [] and any("rejected 127.0.0.1:" in line for line in logs)
    sock.close()


def test_a_peer_that_leaves_is_told_to_the_handler_then_closed(served: Served) -> None:
    io, handler, _ = served
    sock, _ = dial(io)
    sock.close()
    pump(io, lambda: bool(handler.gone))
    assert handler.gone[0].closed


def test_control_pipe_lines_arrive_stripped_and_its_end_is_told_once() -> None:
    read_end, write_end = os.pipe()
    handler = Recorder()
    io = Connections(handler, LOOPBACK, [0], line_timeout=1, log=lambda m: None, control_fd=read_end)
    try:
        os.write(write_end, b"RELEASE sha256:abc  \nABORT half")
        pump(io, lambda: handler.control == ["RELEASE sha256:abc"])
        os.write(write_end, b" a line\n")
        os.close(write_end)
        pump(io, lambda: handler.control_closed)
        assert handler.control == ["RELEASE sha256:abc", "ABORT half a line"]
    finally:
        io.close()
        os.close(read_end)


def test_notes_are_rate_limited_and_the_dropped_ones_counted(served: Served) -> None:
    io, _, logs = served
    for n in range(barrier_conns.NOTE_BUDGET + 5):
        io.note(f"note {n}")
    assert len(logs) == barrier_conns.NOTE_BUDGET
    assert io.take_dropped() == 5 and io.take_dropped() == 0


def test_wake_ends_a_poll_at_once(served: Served) -> None:
    io, _, _ = served
    io.wake()
    started = time.monotonic()
    io.poll(started, 5.0)
    assert time.monotonic() - started < 1.0
