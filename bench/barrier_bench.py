"""Barrier release latency for N simulated ranks on loopback, against a plain TCP echo floor.

One run: a fresh server process listens on 127.0.0.1 (a kernel-chosen port); once it is listening,
ONE client process opens N connections at once (a selectors loop, so 4096 clients are cheap); on
each, the server greets, the client sends one line and reads one line back. The figure is the time
from the first connect attempt to the last reply received.

- measured: slurm_multi.barrier.BarrierServer with nnodes = N + 1 and the image already released;
  the server greets with `CHALLENGE <nonce>`, each client answers `READY <mac> <nonce> <rank>
  start` signed with the token, and the server answers GO (signed, checked by the client) to every
  rank only once all N are in. The clients' HMAC work is inside the figure (one process does it
  for all N here; on a cluster each node does its own).
- floor: a minimal selectors echo server that greets with a line of the same size and then echoes
  each line as soon as it arrives; the very same client driver, client count, concurrency, round
  trips and line sizes, without any HMAC.

The barrier has to wait for the last READY before it answers anyone, while the echo answers each
line at once, so the ratio includes that wait by design: it is what "release latency" means.
"""

from __future__ import annotations

import errno
import gc
import multiprocessing
import os
import resource
import secrets
import selectors
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from benchlib import format_seconds, make_row, median, sizes_args, sizes_parser, skipped_row, talk, write_rows  # noqa: E402  # noqa: E402

from slurm_multi.auth import new_nonce  # noqa: E402
from slurm_multi.wire import challenge_line, parse_challenge, reply_line, request_line  # noqa: E402

LOOPBACK = "127.0.0.1"
SIZES = (16, 256, 1024, 4096)
TARGET_SIZE = 4096
TARGET = "<= 2.0x"
IMAGE_ID = "sha256:" + "b" * 64
RUN_TIMEOUT = 60.0  # one run; a healthy 4096-rank run takes well under a second
BACKLOG = 4096  # the barrier's own listen() backlog; the floor uses the same
FD_HEADROOM = 64


# --------------------------------------------------------------------------------------------------
# The client driver (shared by both measurements, so the comparison is fair)


@dataclass
class DriveResult:
    """Times are seconds since the first connect attempt."""

    last_reply: float
    all_sent: float
    first_reply: float
    errors: list[str] = field(default_factory=list)


# respond(greeting, line, expect) -> (line to send, reply to expect), once the greeting arrived.
Respond = Callable[[bytes, bytes, bytes], tuple[bytes, bytes]]


class _Client:
    __slots__ = ("index", "sock", "line", "expect", "buf", "greeted")

    def __init__(self, index: int, line: bytes, expect: bytes) -> None:
        self.index = index
        self.sock: socket.socket | None = None
        self.line = line
        self.expect = expect
        self.buf = bytearray()
        self.greeted = False


def drive_clients(
    address: tuple[str, int],
    lines: Sequence[bytes],
    expect: Sequence[bytes],
    *,
    concurrency: int | None = None,
    timeout: float = RUN_TIMEOUT,
    respond: Respond | None = None,
) -> DriveResult:
    """Connect len(lines) clients (at most `concurrency` open at once), send one line each, read
    one line each; every reply must equal `expect[i]` (without its newline). With `respond`, each
    client first reads the server's greeting line and sends what `respond(greeting, lines[i],
    expect[i])` returns, expecting the reply it names."""
    if len(lines) != len(expect):
        raise ValueError("lines and expect differ in length")
    limit = len(lines) if concurrency is None else max(1, concurrency)
    sel = selectors.DefaultSelector()
    pending = [_Client(i, line, exp.rstrip(b"\n")) for i, (line, exp) in enumerate(zip(lines, expect))]
    pending.reverse()
    errors: list[str] = []
    open_count = done = 0
    all_sent = first_reply = last_reply = -1.0
    sent = 0
    start = time.perf_counter()
    deadline = start + timeout

    def fail(client: _Client, why: str) -> None:
        nonlocal open_count
        errors.append(f"client {client.index}: {why}")
        _close(sel, client)
        open_count -= 1

    def send(client: _Client) -> bool:
        nonlocal sent, all_sent
        assert client.sock is not None
        try:
            client.sock.send(client.line)  # one short line always fits a fresh socket buffer
        except OSError as exc:
            fail(client, f"send: {exc.strerror}")
            return False
        sent += 1
        if sent == len(lines):
            all_sent = time.perf_counter() - start
        return True

    def launch() -> None:
        nonlocal open_count
        while pending and open_count < limit:
            client = pending.pop()
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            client.sock = sock
            open_count += 1
            code = sock.connect_ex(address)
            if code not in (0, errno.EINPROGRESS):
                fail(client, f"connect: {os.strerror(code)}")
                continue
            sel.register(sock, selectors.EVENT_WRITE, client)

    try:
        launch()
        while (done + len(errors)) < len(lines):
            now = time.perf_counter()
            if now >= deadline:
                errors.append(f"timeout: {done} of {len(lines)} replies after {timeout:.0f} s")
                break
            for key, mask in sel.select(min(1.0, deadline - now)):
                client: _Client = key.data
                sock = client.sock
                assert sock is not None
                if mask & selectors.EVENT_WRITE:
                    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if code:
                        fail(client, f"connect: {os.strerror(code)}")
                        continue
                    if respond is None and not send(client):
                        continue
                    sel.modify(sock, selectors.EVENT_READ, client)
                    continue
                try:
                    chunk = sock.recv(512)
                except OSError as exc:
                    fail(client, f"recv: {exc.strerror}")
                    continue
                if not chunk:
                    fail(client, f"closed before a reply (got {bytes(client.buf)[:60]!r})")
                    continue
                client.buf += chunk
                newline = client.buf.find(b"\n")
                # Rank 0's WAIT (its signed "I have your READY") comes before the GO: read past it.
                while newline >= 0 and client.greeted and client.buf.startswith(b"WAIT "):
                    del client.buf[: newline + 1]
                    newline = client.buf.find(b"\n")
                if newline < 0:
                    continue
                reply = bytes(client.buf[:newline])
                if respond is not None and not client.greeted:
                    del client.buf[: newline + 1]
                    client.greeted = True
                    line, expected = respond(reply, client.line, client.expect)
                    client.line, client.expect = line, expected.rstrip(b"\n")
                    send(client)
                    continue
                if reply != client.expect:
                    fail(client, f"unexpected reply {reply[:60]!r}")
                    continue
                stamp = time.perf_counter() - start
                if first_reply < 0:
                    first_reply = stamp
                last_reply = stamp
                done += 1
                _close(sel, client)
                open_count -= 1
            launch()
    finally:
        for key in list(sel.get_map().values()):
            _close(sel, key.data)
        sel.close()
    return DriveResult(last_reply, all_sent, first_reply, errors)


def _close(sel: selectors.BaseSelector, client: _Client) -> None:
    if client.sock is None:
        return
    try:
        sel.unregister(client.sock)
    except (KeyError, ValueError):
        pass
    client.sock.close()
    client.sock = None


# --------------------------------------------------------------------------------------------------
# Servers (each in its own process, started before the clock starts)


def serve_barrier(conn: Connection, clients: int, token: str, timeout: float) -> None:
    from slurm_multi.barrier import BarrierServer

    ensure_nofile(clients + FD_HEADROOM)
    server = BarrierServer(
        token, clients + 1, LOOPBACK, [0], image_id=IMAGE_ID, linger=0, log=lambda _message: None
    )
    conn.send(server.port)
    outcome = server.serve(until=time.monotonic() + timeout)
    conn.send((outcome.exit_code, outcome.message))


def serve_echo(conn: Connection, clients: int, timeout: float, greeting: bytes = b"") -> None:
    """A minimal echo server: send `greeting` on accept, answer each line at once, close at the
    client's EOF."""
    ensure_nofile(clients + FD_HEADROOM)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOPBACK, 0))
    listener.listen(BACKLOG)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, None)
    conn.send(listener.getsockname()[1])
    buffers: dict[socket.socket, bytearray] = {}
    answered = 0
    deadline = time.monotonic() + timeout
    while (answered < clients or buffers) and time.monotonic() < deadline:
        for key, _mask in sel.select(0.5):
            if key.data is None:
                while True:
                    try:
                        sock, _addr = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    sock.setblocking(False)
                    buffers[sock] = bytearray()
                    sel.register(sock, selectors.EVENT_READ, sock)
                    if greeting:
                        sock.send(greeting)  # as short as the barrier's challenge: it fits
                continue
            sock = key.data
            try:
                chunk = sock.recv(4096)
            except OSError:
                chunk = b""
            if not chunk:
                sel.unregister(sock)
                sock.close()
                del buffers[sock]
                continue
            buf = buffers[sock]
            buf += chunk
            newline = buf.find(b"\n")
            if newline >= 0:
                sock.send(bytes(buf[: newline + 1]))
                del buf[:]
                answered += 1
    conn.send((0 if answered >= clients else 1, f"echoed {answered} lines"))


def listen_backlog_cap(path: str = "/proc/sys/net/core/somaxconn") -> int | None:
    """The kernel's cap on listen() backlogs, or None when it cannot be read."""
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def ensure_nofile(needed: int) -> int:
    """Raise the open-files limit to `needed` (the hard limit too when root); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft >= needed:
        return soft
    want_hard = hard if hard == resource.RLIM_INFINITY or hard >= needed else needed
    for limits in ((needed, want_hard), (min(needed, hard), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            break
        except (ValueError, OSError):
            continue
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------------------------------
# One measurement


def sign_ready(token: str) -> Respond:
    """What a worker does with rank 0's challenge: sign READY for the rank in `line`, and expect
    the one GO rank 0 would sign for it (comparing to it is checking rank 0's MAC)."""

    def respond(greeting: bytes, line: bytes, _expect: bytes) -> tuple[bytes, bytes]:
        challenge, nonce, rank = parse_challenge(greeting), new_nonce(), line.decode()
        return (
            request_line(token, "READY", challenge, nonce, rank, "start"),
            reply_line(token, "GO", challenge, nonce, rank, IMAGE_ID),
        )

    return respond


def _ctx() -> Any:
    return multiprocessing.get_context("fork")


def measure_once(kind: str, clients: int, token: str, timeout: float = RUN_TIMEOUT) -> DriveResult:
    """Start a fresh `kind` ("barrier" | "echo") server process, drive `clients` against it."""
    parent, child = _ctx().Pipe()
    target: Callable[..., None]
    if kind == "barrier":
        target, args = serve_barrier, (child, clients, token, timeout)
    elif kind == "echo":
        target, args = serve_echo, (child, clients, timeout, challenge_line(new_nonce()))
    else:
        raise ValueError(kind)
    proc = _ctx().Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        if not parent.poll(30):
            raise RuntimeError(f"{kind} server did not start within 30 s")
        port = parent.recv()
        ranks = range(1, clients + 1)
        respond: Respond
        if kind == "barrier":
            lines, expect = [str(rank).encode() for rank in ranks], [b""] * clients
            respond = sign_ready(token)
        else:
            # The same line sizes, signed ahead of time: the floor does no HMAC work.
            lines = [request_line(token, "READY", new_nonce(), new_nonce(), str(r), "start") for r in ranks]
            expect = [line.rstrip(b"\n") for line in lines]

            def respond(greeting: bytes, line: bytes, expected: bytes) -> tuple[bytes, bytes]:
                return line, expected

        gc.collect()
        gc.disable()
        try:
            result = drive_clients((LOOPBACK, port), lines, expect, timeout=timeout, respond=respond)
        finally:
            gc.enable()
        if not parent.poll(timeout):
            result.errors.append(f"{kind} server did not finish")
        else:
            code, message = parent.recv()
            if code != 0:
                result.errors.append(f"{kind} server: {message}")
        return result
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.terminate()
            proc.join(5)
        parent.close()
        child.close()


def bench_size(clients: int, repeats: int, warmup: bool = True) -> dict[str, Any]:
    """One table row: `repeats` barrier runs and `repeats` echo runs, interleaved."""
    name = f"barrier release, {clients} ranks"
    what = f"{clients} simulated workers, first connect -> last GO, BarrierServer on 127.0.0.1"
    baseline = f"TCP connect + one-line echo, same driver and {clients} clients"
    target = TARGET if clients == TARGET_SIZE else None
    have = ensure_nofile(clients + FD_HEADROOM)
    if have < clients + FD_HEADROOM:
        why = f"open-files limit {have} < {clients + FD_HEADROOM}; run `ulimit -n {2 * clients}` first"
        return skipped_row(name, what, baseline, why, target)
    token = "bench-" + secrets.token_hex(8)
    if warmup:
        for kind in ("barrier", "echo"):
            measure_once(kind, clients, token)
    results: dict[str, list[DriveResult]] = {"barrier": [], "echo": []}
    for round_number in range(repeats):
        order = ("barrier", "echo") if round_number % 2 == 0 else ("echo", "barrier")
        for kind in order:
            result = measure_once(kind, clients, token)
            if result.errors:
                raise RuntimeError(f"{name}: {kind} run failed: {'; '.join(result.errors[:3])}")
            results[kind].append(result)
    barrier_runs, echo_runs = results["barrier"], results["echo"]
    first_go = median([r.first_reply for r in barrier_runs])
    last_sent = median([r.all_sent for r in barrier_runs])
    notes = (
        f"All {clients} clients connect at once from one selectors loop; the barrier answers only "
        f"after the last READY (median: last READY sent {format_seconds(last_sent)}, first GO "
        f"{format_seconds(first_go)}), the echo answers each line at once"
    )
    backlog = listen_backlog_cap()
    if backlog is not None and backlog < clients:
        notes += (
            f"; net.core.somaxconn is {backlog} < {clients}: the accept queue overflows and SYN "
            "retransmits (1 s each) inflate both sides"
        )
    return make_row(
        name,
        what,
        baseline,
        [r.last_reply for r in barrier_runs],
        [r.last_reply for r in echo_runs],
        target=target,
        notes=notes,
        extra={
            "clients": clients,
            "concurrency": clients,
            "barrier_first_go_s": first_go,
            "barrier_last_ready_sent_s": last_sent,
        },
    )


def run(sizes: Sequence[int] = SIZES, repeats: int = 5, warmup: bool = True) -> list[dict[str, Any]]:
    rows = []
    for clients in sizes:
        talk("barrier", f"{clients} ranks: {repeats} runs each of barrier and echo floor")
        row = bench_size(clients, repeats, warmup)
        if row.get("skipped"):
            talk("barrier", f"{clients} ranks: skipped: {row['skipped']}")
        else:
            talk(
                "barrier",
                f"{clients} ranks: barrier {format_seconds(row['median_s'])}, "
                f"floor {format_seconds(row['baseline_median_s'])}, ratio {row['ratio']:.2f}x",
            )
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = sizes_parser(__doc__, SIZES, "client counts")
    parser.add_argument("--no-warmup", action="store_true", help="skip the uncounted first run per size")
    args, sizes = sizes_args(parser, argv)
    write_rows(run(sizes, args.repeats, not args.no_warmup), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
