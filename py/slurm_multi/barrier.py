"""TCP barrier between the nodes of one job: rank 0 serves, workers join, rank 0 can abort.

Nobody may enter `docker run` against a half-loaded image, and no shared filesystem is needed to
know that. Rank 0's task starts `barrier serve --control-stdin` on a pipe, builds or loads its
image, then writes `RELEASE <id>` (or `ABORT <reason>`) to the pipe; the pipe closing before a
release aborts the workers too. (`barrier release|abort` do the same over TCP, for a server started
by hand or a worker that gives up.) Every worker runs `barrier join`, which prints rank 0's image
ID once the barrier opens.

Protocol: a challenge, then one signed line each way (slurm_multi.wire says it all); ports and
addresses: slurm_multi.net. This module is the server's decisions (BarrierServer: who is ready,
GO or ABORT, the holds, the outcome) and its clients; the server's connections (accepting, lines,
limits, deadlines) are slurm_multi.barrier_conns, the command line slurm_multi.barrier_cli.

`image` READYs are answered as soon as the image is released (a worker learns the image ID to load);
`start` READYs are answered once every rank 1..nnodes-1 holds a live `start` connection and the image
is released, and then the server exits 0.

Exit codes: 0 released/OK, 1 aborted or failed, 2 usage or rejected by rank 0, 3 timeout.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from slurm_multi import EXIT_FAILURE, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, auth
from slurm_multi.barrier_conns import KEEPALIVE, Conn, Connections, Log
from slurm_multi.common import HelperError, talk, timeout_error, usage_error
from slurm_multi.layers.chain import claim_fits, parse_claim
from slurm_multi.net import (
    PROOF_TIMEOUT,
    Backoff,
    connect_addresses,
    describe,
    dial_once,
    keepalive,
    secs,
)
from slurm_multi.wire import (
    MAX_LINE,
    PHASES,
    Message,
    ProtocolError,
    Reply,
    parse_challenge,
    parse_line,
    parse_reply,
    reply_line,
    request_line,
)
from slurm_multi.words import CACHE_SEEN_HEX, is_held_id, is_image_id

# A worker usually dials a moment before rank 0 listens: a round every BACKOFF_START for the first
# QUICK_SECONDS of a dial (rank 0's server starts beside its prepare, within a second of the
# workers' joins; a round of refused connects costs microseconds), then twice as long each time.
# Doubling from the start put a round 0.16-0.3 s after rank 0 listened, while rank 0 waited for
# the worker's image READY (the warm 2-node toy: refused first in 47 of 81 runs).
BACKOFF_START, BACKOFF_MAX, QUICK_SECONDS = 0.02, 2.0, 2.0
FLUSH_SECONDS = 2.0  # how long the server waits for its last lines to leave


def _talk(message: str) -> None:
    talk("barrier", message)


def format_ranks(ranks: Iterable[int]) -> str:
    """`[1, 2, 3, 5]` -> `1-3,5` so thousands of ranks still fit a log line."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "none"
    spans: list[str] = []
    start = prev = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        spans.append(
            str(start) if start == prev else f"{start}-{prev}" if prev > start + 1 else f"{start},{prev}"
        )
        if rank is not None:
            start = prev = rank
    return ",".join(spans)


def raise_nofile_limit() -> None:
    """Raise the soft open-files limit to the hard one: thousands of ranks mean thousands of fds."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


# --------------------------------------------------------------------------------------------------
# Server

WAITING, LINGERING, FINISHING = "waiting", "lingering", "finishing"


class Outcome(NamedTuple):
    exit_code: int
    message: str


class BarrierServer:
    """Rank 0's decisions: who is ready, when to answer GO or ABORT, what each worker holds and how
    the barrier ends. Its connections (slurm_multi.barrier_conns) bind in the constructor, so `port`
    is known before serve()."""

    def __init__(
        self,
        token: str,
        nnodes: int,
        address: str,
        ports: Sequence[int],
        *,
        image_id: str | None = None,
        linger: float = 15.0,
        line_timeout: float = 10.0,
        progress_every: float = 10.0,
        log: Log = _talk,
        control_fd: int | None = None,
        image_timeout: float | None = None,
        barrier_timeout: float | None = None,
        holds_fd: int | None = None,
        planned: Sequence[str] = (),
    ) -> None:
        """holds_fd: an O_APPEND file that gets `<rank> <image-id or -> <cache-id or -> [<layers>]`
        for every image READY before the release (what each worker already holds: rank 0 moves
        nothing to a holder; the start of the image ID it sees in the shared cache's tar: rank 0
        sends the cache only to workers that see rank 0's; how many layers of `planned`, the job
        plan's layer chain, it holds: rank 0 moves only the others). A layers claim that is not a
        prefix of `planned` is refused (`ERR bad layer prefix`), as a malformed held ID is."""
        if nnodes < 1:
            raise usage_error("barrier: --nnodes must be at least 1")
        self.token = token
        self.nnodes = nnodes
        self.image_id = image_id or None
        self.linger = linger
        self.progress_every = progress_every
        self._log = log
        # control_fd: rank 0's own task talks to us on a pipe; its end closing before a release
        # means rank 0 is gone.
        self._io = Connections(
            self, address, ports, line_timeout=line_timeout, log=log, control_fd=control_fd
        )
        self.address, self.port = self._io.address, self._io.port
        self._waiters: dict[str, dict[int, Conn]] = {phase: {} for phase in PHASES}
        self._state = WAITING
        self._outcome: Outcome | None = None
        self._abort_reason = ""
        self._told_abort: set[int] = set()  # ranks that got ABORT: linger ends once all have
        self._stop_reason: str | None = None
        self._released_all = False
        self._holds_fd = holds_fd
        self._planned = list(planned)
        # Two budgets: rank 0 obtaining its image (until the release), then the workers arriving.
        self.image_timeout = image_timeout
        self.barrier_timeout = barrier_timeout
        self._released_at: float | None = None

    def request_stop(self, reason: str = "rank 0 terminated") -> None:
        """Abort the waiting workers and return from serve(); safe from signal handlers/threads."""
        self._stop_reason = reason
        self._io.wake()

    def close(self) -> None:
        self._io.close()

    def progress(self) -> str:
        workers = self.nnodes - 1
        text = f"{len(self._waiters['start'])}/{workers} workers ready (start), " + (
            "image released" if self.image_id else "image not released yet"
        )
        if self._waiters["image"]:
            text += f", {len(self._waiters['image'])} waiting for the image"
        dropped = self._io.take_dropped()
        if dropped:
            text += f", {dropped} connection events not logged"
        return text

    # -- main loop ---------------------------------------------------------------------------------

    def serve(self, until: float | None = None) -> Outcome:
        """Run until released (0), aborted or terminated (1) or `until` (time.monotonic()) passes (3)."""
        started = time.monotonic()
        next_progress = started + self.progress_every
        linger_until = flush_until = 0.0
        if self.image_id:
            self._released_at = started
        self._maybe_release()
        try:
            while True:
                now = time.monotonic()
                if self._stop_reason is not None and self._state != FINISHING:
                    if self._state == WAITING:
                        self._abort_all(self._stop_reason)
                        self._outcome = Outcome(
                            EXIT_FAILURE, f"barrier: {self._stop_reason}; told the waiting workers to abort"
                        )
                    self._state, flush_until = FINISHING, now + FLUSH_SECONDS
                deadline = self._deadline(started, until)
                if self._state == WAITING and deadline is not None and now >= deadline:
                    reason = self._timeout_reason(now - started)
                    self._log(reason)
                    self._abort_all(reason)
                    self._outcome = Outcome(EXIT_TIMEOUT, f"barrier: {reason}")
                    self._state, linger_until = LINGERING, now + self.linger
                if self._state == WAITING and self._outcome is not None:  # released or aborted
                    if self._outcome.exit_code == EXIT_OK or self.linger <= 0:
                        self._state, flush_until = FINISHING, now + FLUSH_SECONDS
                    else:
                        self._state, linger_until = LINGERING, now + self.linger
                # Linger answers late joiners with ABORT; once every worker has heard it, stop.
                everyone_told = len(self._told_abort) >= self.nnodes - 1
                if self._state == LINGERING and (now >= linger_until or everyone_told):
                    self._state, flush_until = FINISHING, now + FLUSH_SECONDS
                if self._state == FINISHING and (not self._io.writing or now >= flush_until):
                    assert self._outcome is not None
                    return self._outcome
                if self._state == WAITING and now >= next_progress:
                    self._log(self.progress())
                    next_progress = now + self.progress_every
                wait = 0.5
                if self._state == WAITING and deadline is not None:
                    wait = min(wait, deadline - now)
                self._io.poll(now, wait)
        finally:
            self.close()

    def _deadline(self, started: float, until: float | None) -> float | None:
        """The budget that runs now: the image timeout before the release, the barrier timeout after."""
        budget: float | None = None
        if self._released_at is None:
            if self.image_timeout is not None:
                budget = started + self.image_timeout
        elif self.barrier_timeout is not None:
            budget = self._released_at + self.barrier_timeout
        if until is not None:
            budget = until if budget is None else min(budget, until)
        return budget

    def _timeout_reason(self, elapsed: float) -> str:
        present = set(self._waiters["start"]) | set(self._waiters["image"])
        missing = [r for r in range(1, self.nnodes) if r not in present]
        if self._released_at is None and self.image_timeout is not None:
            parts = [f"--image-timeout ran out: rank 0 did not obtain its image within {secs(elapsed)} s"]
        elif self._released_at is not None and self.barrier_timeout is not None:
            waited = time.monotonic() - self._released_at
            parts = [
                f"--barrier-timeout ran out: not every worker arrived within {secs(waited)} s of the release"
            ]
        else:
            parts = [f"timeout after {secs(elapsed)} s"]
        if missing:
            parts.append(f"missing ranks {format_ranks(missing)} of {self.nnodes}")
            parts.append(f"connected: {format_ranks(present)}")
        if not self.image_id:
            parts.append("rank 0 never released its image")
        return "; ".join(parts)

    # -- what the connections tell us (barrier_conns.Handler) ---------------------------------------

    def on_control_line(self, text: str) -> None:
        """A line from rank 0's task on the control pipe: RELEASE <image-id> or ABORT <reason>."""
        verb, _, arg = text.partition(" ")
        if verb == "RELEASE" and is_image_id(arg):
            self._release(arg)
        elif verb == "ABORT" and arg:
            self._abort("".join(ch if ch.isprintable() else " " for ch in arg))
        else:
            self._log(f"ignored a control line from rank 0's task: {text[:80]!r}")

    def on_control_closed(self) -> None:
        if not self.image_id and not self._abort_reason and self._stop_reason is None:
            # Like an ABORT: late workers still hear it for the linger time.
            self._abort("rank 0's task ended before it released the image")

    def on_gone(self, conn: Conn) -> None:
        if conn.kind == "worker" and self._waiters[conn.phase].get(conn.rank) is conn:
            del self._waiters[conn.phase][conn.rank]
            self._io.note(f"rank {conn.rank} ({conn.phase}) from {conn.peer} disconnected before GO")

    def on_line(self, conn: Conn, line: bytes) -> None:
        try:
            msg = parse_line(line, self.token, self.nnodes, conn.challenge)
        except ProtocolError as exc:
            self._io.reject(conn, str(exc))
            return
        conn.nonce = msg.nonce
        if msg.kind == "READY":
            self._on_ready(conn, msg)
        elif msg.kind == "RELEASE":
            self._on_release(conn, msg.image_id)
        else:
            self._on_abort(conn, msg.reason)

    # -- protocol ----------------------------------------------------------------------------------

    def _reply(self, conn: Conn, verb: str, *fields: str) -> None:
        """The one answer to a verified line, signed over the connection's S and the client's C."""
        self._io.send(conn, reply_line(self.token, verb, conn.challenge, conn.nonce, *fields))

    def _go(self, conn: Conn, rank: int) -> None:
        assert self.image_id is not None
        self._reply(conn, "GO", str(rank), self.image_id)

    def _on_ready(self, conn: Conn, msg: Message) -> None:
        claim = parse_claim(msg.layers) if msg.layers else None
        if claim is not None and not claim_fits(self._planned, *claim):
            self._io.reject(conn, "bad layer prefix")  # not a prefix of the plan's chain
            return
        if self._abort_reason:
            self._reply(conn, "ABORT", self._abort_reason)
            self._told_abort.add(msg.rank)
            return
        if self._released_all or (msg.phase == "image" and self.image_id):
            self._go(conn, msg.rank)
            return
        if self._state != WAITING:
            self._io.drop(conn)
            return
        conn.kind, conn.rank, conn.phase = "worker", msg.rank, msg.phase
        waiting = self._waiters[msg.phase]
        older = waiting.get(msg.rank)
        if older is not None:
            self._io.note(f"rank {msg.rank} ({msg.phase}) reconnected from {conn.peer}; closing {older.peer}")
            older.kind = "done"
            self._io.drop(older)
        waiting[msg.rank] = conn
        if msg.phase == "image" and self._holds_fd is not None:
            try:  # one short write to an O_APPEND file: whole lines, whoever reads it meanwhile
                said = f"{msg.rank} {msg.holds or '-'} {msg.cache or '-'}" + (
                    f" {msg.layers}" if msg.layers else ""
                )
                said += "\n"
                os.write(self._holds_fd, said.encode())
            except OSError as exc:
                self._log(f"cannot record what rank {msg.rank} holds ({describe(exc)}); it gets the image")
                self._holds_fd = None
        # Signed at once, so a worker knows within seconds that this is our rank 0, and a port
        # where something greets like us but never answers is one it leaves in seconds, not hours.
        self._io.queue(conn, reply_line(self.token, "WAIT", conn.challenge, conn.nonce, str(msg.rank)))
        self._io.note(f"rank {msg.rank} ready ({msg.phase}) from {conn.peer}")
        if msg.phase == "start":
            self._maybe_release()

    def _on_release(self, conn: Conn, image_id: str) -> None:
        if self._abort_reason:
            self._reply(conn, "ABORT", self._abort_reason)
            return
        if self.image_id and self.image_id != image_id:
            self._io.reject(conn, "already released with another image")
            return
        self._reply(conn, "OK")
        self._release(image_id)

    def _release(self, image_id: str) -> None:
        if self.image_id or self._abort_reason:
            return
        self.image_id = image_id
        self._released_at = time.monotonic()
        self._log(f"rank 0 released image {image_id}")
        waiting = self._waiters["image"]
        for rank, worker in sorted(waiting.items()):
            self._go(worker, rank)
        waiting.clear()
        self._maybe_release()

    def _on_abort(self, conn: Conn, reason: str) -> None:
        self._reply(conn, "OK")
        self._abort(reason)

    def _abort(self, reason: str) -> None:
        if self._abort_reason or self._released_all:
            return
        self._log(f"rank 0 aborts the barrier: {reason}")
        self._abort_all(reason)
        self._outcome = Outcome(EXIT_FAILURE, f"barrier: aborted by rank 0: {reason}")

    def _abort_all(self, reason: str) -> None:
        self._abort_reason = reason
        told = 0
        for phase in PHASES:
            for rank, worker in self._waiters[phase].items():
                self._reply(worker, "ABORT", reason)
                self._told_abort.add(rank)
                told += 1
            self._waiters[phase].clear()
        if told:
            self._log(f"told {told} connected worker(s) to abort")

    def _maybe_release(self) -> None:
        start = self._waiters["start"]
        if self._released_all or not self.image_id or len(start) < self.nnodes - 1:
            return
        for rank, worker in sorted(start.items()):
            self._go(worker, rank)
        start.clear()
        self._released_all = True
        workers = self.nnodes - 1
        self._outcome = Outcome(EXIT_OK, f"barrier: released {workers} worker(s) with image {self.image_id}")
        self._log(f"all {workers} worker(s) ready; GO with image {self.image_id}")


# --------------------------------------------------------------------------------------------------
# Clients


class _Dialer:
    """Tries every (address, port) candidate in turn with backoff, and remembers what happened."""

    def __init__(
        self,
        host: str,
        ports: list[int],
        log: Log = _talk,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.host, self.ports, self.log, self.sleep = host, ports, log, sleep
        self.attempts = 0
        self.last_error = "none"
        self.preferred: int | None = None
        self.skip: set[int] = set()
        self.rejected: dict[int, str] = {}  # port -> what answered there instead

    def met(self) -> str:
        """`; skipped 21544: <what answered there>` for the ports that are not our rank 0."""
        return "".join(f"; skipped {port}: {why}" for port, why in sorted(self.rejected.items()))

    def reject(self, port: int, why: str) -> None:
        """Something other than our rank 0 holds `port`: never dial it again; fail once every
        candidate is such a port, naming what was met on each."""
        self.skip.add(port)
        self.rejected[port] = why
        self.log(f"{self.host}:{port} is not our rank 0 ({why}); trying the other candidates")
        if set(self.ports) <= self.skip:
            raise _no_candidate_error(self)

    def describe_target(self) -> str:
        return f"{self.host}:{','.join(str(p) for p in self.ports)}"

    def dial(self, deadline: float) -> tuple[socket.socket, int] | None:
        backoff = Backoff(BACKOFF_START, BACKOFF_MAX, quick=QUICK_SECONDS)
        next_reminder = 0.0  # the first failed round is logged, then one reminder every 30 s
        while True:
            ports = [p for p in self.ports if p not in self.skip]
            if self.preferred in ports:
                ports.remove(self.preferred)
                ports.insert(0, self.preferred)
            try:
                addresses = connect_addresses(self.host)
            except OSError as exc:
                addresses = []
                self.attempts += 1
                self.last_error = f"cannot resolve {self.host}: {exc.strerror or exc}"
            for address in addresses:
                for port in ports:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    self.attempts += 1
                    try:
                        sock = dial_once(address, port, remaining)
                    except OSError as exc:
                        self.last_error = describe(exc)
                        continue
                    try:
                        keepalive(sock, KEEPALIVE)
                    except OSError:
                        pass
                    return sock, port
            now = time.monotonic()
            if now >= deadline:
                return None
            if now >= next_reminder:
                self.log(
                    f"rank 0 not answering yet on {self.describe_target()} ({self.last_error}); "
                    f"retrying for {secs(deadline - now)} s more"
                )
                next_reminder = now + 30.0
            self.sleep(min(backoff.next(now), deadline - now))


def _read_line(sock: socket.socket, deadline: float, buf: bytearray) -> bytes | None:
    """The next line from `buf` and the socket; None when the peer closed first. socket.timeout
    past `deadline`."""
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out")
        sock.settimeout(remaining)
        chunk = sock.recv(MAX_LINE)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_LINE and b"\n" not in buf[:MAX_LINE]:
            raise ProtocolError("reply too long")
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return line


class _NoAnswer(ProtocolError):
    """The peer greeted like our rank 0 but sent no signed answer to our line within the proof
    window: our rank 0 answers every line at once (WAIT, then GO later, for a READY it keeps)."""

    def __init__(self, verb: str, seconds: float) -> None:
        super().__init__(f"it sent a CHALLENGE but no signed answer to {verb} within {secs(seconds)} s")


class _NoChallenge(ProtocolError):
    """The peer accepted the connection but never greeted us with CHALLENGE within the proof window:
    not our rank 0, which greets at once."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"it accepted but sent no CHALLENGE within {secs(seconds)} s")


def _exchange(sock: socket.socket, deadline: float, token: str, verb: str, *fields: str) -> Reply | None:
    """One conversation: rank 0's CHALLENGE, our line signed over it and a fresh nonce, its reply,
    verified. None when the peer closed first; socket.timeout past `deadline`;
    ProtocolError when the peer is not our barrier (no challenge, a reply without our MAC)."""
    buf = bytearray()
    started = time.monotonic()
    try:
        greeting = _read_line(sock, min(deadline, started + PROOF_TIMEOUT), buf)
    except (socket.timeout, TimeoutError):
        raise _NoChallenge(time.monotonic() - started) from None
    if greeting is None:
        return None
    challenge = parse_challenge(greeting)
    nonce = auth.new_nonce()
    sock.sendall(request_line(token, verb, challenge, nonce, *fields))
    asked = time.monotonic()
    try:
        line = _read_line(sock, min(deadline, asked + PROOF_TIMEOUT), buf)
    except (socket.timeout, TimeoutError):
        if deadline <= asked + PROOF_TIMEOUT:
            raise
        raise _NoAnswer(verb, time.monotonic() - asked) from None
    if line is None:
        return None
    reply = parse_reply(line, token, challenge, nonce)
    if reply.kind != "WAIT":
        return reply
    line = _read_line(sock, deadline, buf)
    if line is None:
        return None
    reply = parse_reply(line, token, challenge, nonce)
    if reply.kind == "WAIT":
        raise ProtocolError("a second WAIT")
    return reply


def _no_candidate_error(dialer: _Dialer) -> HelperError:
    """Every candidate port holds something other than our rank 0."""
    if set(dialer.rejected.values()) == {BAD_TOKEN_MET}:
        return _bad_token_error(dialer)
    if len(dialer.rejected) == 1:
        ((port, why),) = dialer.rejected.items()
        return HelperError(f"barrier: {dialer.host}:{port} is not our barrier ({why})")
    met = "; ".join(f"{port}: {why}" for port, why in sorted(dialer.rejected.items()))
    return HelperError(f"barrier: no candidate port on {dialer.host} is our rank 0 ({met})")


BAD_TOKEN_MET = "it rejected our token (ERR bad token)"


def _err_met(reason: str) -> str:
    """What an ERR other than `bad token` says about its port: ERR is unsigned, so it may be
    anyone's; the port is skipped and the final error quotes it."""
    return f"it answered ERR {reason[:120]!r}, unsigned"


def _bad_token_error(dialer: _Dialer) -> HelperError:
    return HelperError(
        f"barrier: rank 0 on {dialer.host}:{','.join(str(p) for p in sorted(dialer.skip))} "
        "rejected our token (ERR bad token); every node must get the same token variable",
        EXIT_USAGE,
    )


class BarrierAborted(HelperError):
    def __init__(self, reason: str) -> None:
        super().__init__(f"barrier: rank 0 aborted: {reason}", EXIT_FAILURE)
        self.reason = reason


def join(
    host: str,
    ports: Sequence[int],
    token: str,
    rank: int,
    *,
    phase: str = "start",
    holds: str = "",
    cache: str = "",
    layers: str = "",
    connect_timeout: float = 600.0,
    wait_timeout: float = 600.0,
    log: Log = _talk,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Send READY to rank 0 and return the image ID from its GO. `holds` (image phase only): the
    image ID this node already has, so that rank 0 moves no image to a node that holds its own;
    `cache` (image phase only): the image ID this node sees in the shared cache's tar, so that rank
    0 picks the cache only when every worker sees what it sees; `layers` (image phase only): the
    claim `layers:<k>[:<hex>]` of how many layers of the job plan's chain this node holds.

    Raises BarrierAborted (exit 1) on ABORT, HelperError exit 2 on an ERR reply, exit 3 when rank 0
    does not answer within `connect_timeout` or GO does not come within `wait_timeout` (a separate
    budget that starts at the first connection: rank 0 may spend a long time building first).
    """
    for given in (holds, cache):
        if given and (phase != "image" or not is_held_id(given)):
            raise usage_error(f"barrier: {given!r}: not an image ID (sha256:<64 hex>) of the image phase")
    if layers and (phase != "image" or parse_claim(layers) is None):
        raise usage_error(f"barrier: {layers!r}: not a layers claim (layers:<k>:<12 hex>) of the image phase")
    ready = [str(rank), phase, *([holds] if holds else [])]
    if cache or layers:
        ready += [*([] if holds else ["-"]), "cache:" + cache[7 : 7 + CACHE_SEEN_HEX] if cache else "-"]
    if layers:
        ready.append(layers)
    dialer = _Dialer(host, list(ports), log=log, sleep=sleep)
    started = time.monotonic()
    deadline = started + connect_timeout
    wait_deadline: float | None = None
    backoff = Backoff(BACKOFF_START, BACKOFF_MAX)
    while True:
        dialed = dialer.dial(deadline)
        if dialed is None:
            if dialer.rejected and set(dialer.rejected.values()) == {BAD_TOKEN_MET}:
                raise _bad_token_error(dialer)
            if wait_deadline is None:
                raise timeout_error(
                    f"barrier: rank 0 did not answer on {dialer.describe_target()} after "
                    f"{secs(time.monotonic() - started)} s ({dialer.attempts} attempts, "
                    f"last error: {dialer.last_error}{dialer.met()}); is rank 0's task running?"
                )
            raise timeout_error(
                f"barrier: lost rank 0 on {dialer.describe_target()} and could not reconnect within "
                f"the {secs(wait_timeout)} s wait budget ({dialer.attempts} attempts, "
                f"last error: {dialer.last_error}{dialer.met()})"
            )
        sock, port = dialed
        if wait_deadline is None:
            wait_deadline = time.monotonic() + wait_timeout
            deadline = wait_deadline
            log(f"rank {rank} connected to rank 0 at {host}:{port}; waiting for GO ({phase})")
        dialer.preferred = port
        try:
            with sock:
                reply = _exchange(sock, wait_deadline, token, "READY", *ready)
        except ProtocolError as exc:  # (no CHALLENGE in time included): not our rank 0
            dialer.reject(port, str(exc))
            continue
        except (socket.timeout, TimeoutError):
            raise timeout_error(
                f"barrier: no GO from rank 0 at {host}:{port} after {secs(wait_timeout)} s "
                f"(rank {rank}, phase {phase}); see rank 0's log for the missing ranks"
            ) from None
        except OSError as exc:
            reply = None
            dialer.last_error = describe(exc)
        if reply is None:
            log(f"lost the connection to rank 0 at {host}:{port}; reconnecting")
            sleep(min(backoff.next(), max(0.0, wait_deadline - time.monotonic())))
            continue
        if reply.kind == "GO" and reply.rank == rank:
            return reply.image_id
        if reply.kind == "ABORT":
            raise BarrierAborted(reply.reason)
        if reply.kind == "ERR" and reply.reason == "bad token":
            # Another job's barrier may hold one of our candidate ports; keep looking on the others.
            dialer.reject(port, BAD_TOKEN_MET)
            continue
        if reply.kind == "ERR":
            # Unsigned: our rank 0's word or anyone's on that port; never the end of the join.
            dialer.reject(port, _err_met(reply.reason))
            continue
        raise HelperError(f"barrier: unexpected {reply.kind} reply from {host}:{port}")


def control(
    host: str,
    ports: Sequence[int],
    token: str,
    verb: str,
    field: str,
    *,
    connect_timeout: float = 10.0,
    reply_timeout: float = 10.0,
    log: Log = _talk,
) -> None:
    """Send a controller line (`RELEASE <image-id>` or `ABORT <reason>`) and require rank 0's `OK`."""
    dialer = _Dialer(host, list(ports), log=log)
    started = time.monotonic()
    deadline = started + connect_timeout
    while True:
        dialed = dialer.dial(deadline)
        if dialed is None:
            if dialer.rejected and set(dialer.rejected.values()) == {BAD_TOKEN_MET}:
                raise _bad_token_error(dialer)
            raise timeout_error(
                f"barrier: rank 0's barrier did not answer on {dialer.describe_target()} after "
                f"{secs(time.monotonic() - started)} s ({dialer.attempts} attempts, "
                f"last error: {dialer.last_error}{dialer.met()}); is `barrier serve` running?"
            )
        sock, port = dialed
        try:
            with sock:
                reply = _exchange(sock, time.monotonic() + reply_timeout, token, verb, field)
        except ProtocolError as exc:  # (no CHALLENGE in time included): not our rank 0
            dialer.reject(port, str(exc))
            continue
        except (socket.timeout, TimeoutError):
            raise timeout_error(
                f"barrier: no answer from {host}:{port} after {secs(reply_timeout)} s"
            ) from None
        except OSError as exc:
            dialer.last_error = describe(exc)
            continue
        if reply is None:
            continue
        if reply.kind == "OK":
            return
        if reply.kind == "ABORT":
            raise BarrierAborted(reply.reason)
        if reply.kind == "ERR" and reply.reason == "bad token":
            dialer.reject(port, BAD_TOKEN_MET)
            continue
        if reply.kind == "ERR":
            dialer.reject(port, _err_met(reply.reason))
            continue
        raise HelperError(f"barrier: unexpected {reply.kind} reply from {host}:{port}")
