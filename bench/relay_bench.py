"""Relay throughput through a chain of 1, 32 and 128 hops on loopback, against a plain TCP copy.

One run: `loopback_chain` forks one process per rank on 127.0.0.1 (the real node code of
slurm_multi.relay: handshake, 1 MiB frames, sha256 on every node, forwarding, trailer check, DONE
rippling back to rank 0); rank 0 reads a synthetic stream from a pipe fed by a feeder process (as
`docker save` would), every receiver writes to /dev/null. The figure is rank 0's first byte ->
every hop verified.

- 1 hop: measured against the floor, one plain TCP copy of the same bytes between two processes
  (1 MiB sendall / recv_into, no framing, no hashing).
- 32 and 128 hops: measured against the 1-hop run of the same round, so the ratio is the time
  ratio (the throughput ratio 32/1 is its inverse, given in the notes).

All processes share this machine's CPUs, so with more hops than cores the chain is CPU-bound and
the time grows with the hops: the 32/1 and 128/1 ratios measure the relay's per-hop cost (the notes
give it in CPU seconds per GB per hop), not what a chain of real nodes (one hop per node, each with
its own cores and NIC) would see; there, throughput is that of the slowest single hop.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import secrets
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from benchlib import format_seconds, int_list, make_row, median, talk, write_rows  # noqa: E402

from slurm_multi.common import HelperError, usage_error  # noqa: E402
from slurm_multi.net import LOOPBACK, secs  # noqa: E402
from slurm_multi.relay import CHUNK, Log, Plan, Result, relay_ports, run_node, widen_pipe  # noqa: E402

HOPS = (1, 32, 128)
DEFAULT_BYTES = 10**9


# --------------------------------------------------------------------------------------------------
# The loopback chain (one process per hop on 127.0.0.1)


@dataclass
class BenchResult:
    hops: int
    nbytes: int
    seconds: float  # rank 0's first byte -> every hop verified
    cpu_seconds: float  # user + system CPU of every hop and the feeder

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def _bench_feeder(write_fd: int, nbytes: int, close_fds: Sequence[int]) -> None:
    for fd in close_fds:
        os.close(fd)
    block = memoryview(os.urandom(CHUNK))
    widen_pipe(write_fd)
    left = nbytes
    while left:
        n = os.write(write_fd, block[: min(left, CHUNK)])
        left -= n
    os.close(write_fd)


def _bench_node(plan: Plan, source_fd: int | None, conn: object, close_fds: Sequence[int]) -> None:
    for fd in close_fds:  # only rank 0 and the feeder may hold the source pipe, or it never ends
        os.close(fd)
    out_fd = None if source_fd is not None else os.open(os.devnull, os.O_WRONLY)
    try:
        result = run_node(plan, source_fd, out_fd)
        conn.send(("ok", result))  # type: ignore[attr-defined]
    except HelperError as exc:
        conn.send(("error", f"{exc.format_message()} (exit {exc.exit_code})"))  # type: ignore[attr-defined]


def loopback_chain(
    hops: int,
    nbytes: int,
    *,
    fanout: int = 1,
    master_port: int = 29500,
    job_id: int | None = None,
    timeout: float = 600.0,
    stall_timeout: float = 120.0,
    log: Log | None = None,
) -> BenchResult:
    """Move `nbytes` of synthetic data from rank 0 through `hops` more ranks, one process each.

    Every process runs the real node code (frames, sha256, forwarding); receivers write to
    /dev/null. The time runs from rank 0's first byte until every rank has verified the trailer.
    With 128 hops on 2 CPUs each process waits long for a CPU, so the stall timeout is longer than
    a node's default: a scheduling hiccup shows in the time instead of failing the run.
    """
    if hops < 1 or nbytes < 0:
        raise usage_error("relay: bench needs --hops >= 1 and --bytes >= 0")
    ctx = multiprocessing.get_context("fork")
    token = secrets.token_hex(24)
    job = secrets.randbelow(1 << 20) if job_id is None else job_id
    nnodes = hops + 1

    def ports_of(rank: int) -> list[int]:
        return relay_ports(rank, master_port, job)

    quiet: Log = log or (lambda _message: None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    read_fd, write_fd = os.pipe()
    feeder = ctx.Process(target=_bench_feeder, args=(write_fd, nbytes, [read_fd]), daemon=True)
    procs, pipes = [], []
    for rank in range(nnodes):
        plan = Plan(
            rank,
            nnodes,
            token,
            fanout=fanout,
            hosts=[f"hop{r}" for r in range(nnodes)],
            ports_of=ports_of,
            connect_timeout=60,
            stall_timeout=stall_timeout,
            loopback=True,
            log=quiet,
        )
        parent_conn, child_conn = ctx.Pipe(duplex=False)
        source, close = (read_fd, [write_fd]) if rank == 0 else (None, [read_fd, write_fd])
        proc = ctx.Process(target=_bench_node, args=(plan, source, child_conn, close), daemon=True)
        proc.start()
        child_conn.close()
        procs.append(proc)
        pipes.append(parent_conn)
    feeder.start()  # before closing our copies: it inherits both ends and closes the read end
    os.close(read_fd)
    os.close(write_fd)
    results: list[tuple[str, object]] = []
    try:
        deadline = time.monotonic() + timeout
        for rank, pipe in enumerate(pipes):
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise HelperError(f"relay: bench: rank {rank} did not finish within {secs(timeout)} s")
            results.append(pipe.recv())
    finally:
        for proc in [*procs, feeder]:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [str(value) for status, value in results if status != "ok"]
    if errors:
        raise HelperError(f"relay: bench failed: {errors[0]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    head = results[0][1]
    assert isinstance(head, Result)
    digests = {value.digest for _, value in results if isinstance(value, Result)}
    if len(digests) != 1 or head.total != nbytes or head.nodes != hops:
        raise HelperError(f"relay: bench: inconsistent results {results!r}")
    return BenchResult(hops, nbytes, head.seconds, cpu)


# --------------------------------------------------------------------------------------------------
# The floor: a plain TCP copy


def _floor_receiver(listener: socket.socket, conn: Any) -> None:
    sock, _ = listener.accept()
    buf = memoryview(bytearray(CHUNK))
    total = 0
    while n := sock.recv_into(buf):
        total += n
    conn.send(total)


def tcp_floor(nbytes: int) -> tuple[float, float]:
    """(seconds, CPU seconds of both ends) to copy `nbytes` from one process to another over
    loopback TCP, nothing else."""
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    ctx = multiprocessing.get_context("fork")
    listener = socket.socket()
    listener.bind((LOOPBACK, 0))
    listener.listen(1)
    address = listener.getsockname()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_floor_receiver, args=(listener, child), daemon=True)
    proc.start()
    listener.close()
    block = memoryview(os.urandom(CHUNK))
    try:
        with socket.create_connection(address) as sock:
            start = time.perf_counter()
            left = nbytes
            while left:
                step = min(left, CHUNK)
                sock.sendall(block[:step])
                left -= step
            sock.shutdown(socket.SHUT_WR)
            if not parent.poll(60) or parent.recv() != nbytes:
                raise RuntimeError("the floor's receiver did not get every byte")
            seconds = time.perf_counter() - start
    finally:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum((a.ru_utime - b.ru_utime) + (a.ru_stime - b.ru_stime) for a, b in zip(after, before))
    return seconds, cpu


def measure_chain(hops: int, nbytes: int) -> tuple[float, float]:
    """(seconds, CPU seconds of all processes) of one loopback chain run."""
    result = loopback_chain(hops, nbytes, timeout=max(120.0, hops * nbytes / 2e7))
    return result.seconds, result.cpu_seconds


def _mb_s(nbytes: int, seconds: float) -> str:
    return f"{nbytes / 1e6 / seconds:.0f} MB/s" if seconds > 0 else "-"


def run(
    hops: Sequence[int] = HOPS, nbytes: int = DEFAULT_BYTES, repeats: int = 3, warmup: bool = True
) -> list[dict[str, Any]]:
    hops = sorted(set(hops) | {1})
    cpus = os.cpu_count() or 1
    if warmup:
        measure_chain(1, min(nbytes, 10**8))
    samples: dict[int, list[float]] = {h: [] for h in hops}
    cpu: dict[int, list[float]] = {h: [] for h in hops}
    floor: list[float] = []
    floor_cpu: list[float] = []
    for round_number in range(repeats):
        talk("relay", f"round {round_number + 1}/{repeats}: TCP floor and {', '.join(map(str, hops))} hop(s)")
        seconds, used = tcp_floor(nbytes)
        floor.append(seconds)
        floor_cpu.append(used)
        for count in hops:
            seconds, used = measure_chain(count, nbytes)
            samples[count].append(seconds)
            cpu[count].append(used)
            talk("relay", f"{count} hop(s): {format_seconds(seconds)} ({_mb_s(nbytes, seconds)})")
    size = f"{nbytes / 1e9:.3g} GB" if nbytes >= 10**8 else f"{nbytes / 1e6:.3g} MB"
    one = median(samples[1])
    rows = [
        make_row(
            f"relay chain, 1 hop, {size}",
            f"rank 0 -> rank 1 on 127.0.0.1: frames, sha256 on both ends, trailer check ({size} from a pipe)",
            "plain TCP copy of the same bytes between two processes (no framing, no hashing)",
            samples[1],
            floor,
            notes=(
                f"relay {_mb_s(nbytes, one)}, floor {_mb_s(nbytes, median(floor))}; "
                f"{_per_hop(cpu[1], 1, nbytes)}; {cpus} CPU(s)"
            ),
            extra={"hops": 1, "bytes": nbytes, "mb_per_s": nbytes / 1e6 / one, "cpus": cpus},
        )
    ]
    longest = max(hops)
    gb = nbytes / 1e9
    per_hop = [used / (longest + 1) / gb for used in cpu[longest]]
    per_end = [used / 2 / gb for used in floor_cpu]
    rows.append(
        make_row(
            "relay CPU per GB per hop",
            f"CPU seconds per GB of one relay process in the {longest}-hop chain (each frame's tag checked, "
            "re-tagged per child, chained; the feeder and rank 0 count as one process)",
            "CPU seconds per GB of one end of the plain TCP copy (sendall / recv_into, nothing else)",
            per_hop,
            per_end,
            notes=(
                f"relay {median(per_hop):.2f} CPU s/GB per process, TCP copy {median(per_end):.2f} CPU s/GB "
                "per end (the relay's ratio is its whole per-byte cost: framing, one sha256 pass, forwarding)"
            ),
            extra={"hops": longest, "bytes": nbytes, "cpus": cpus},
        )
    )
    for count in hops:
        if count == 1:
            continue
        measured = median(samples[count])
        rows.append(
            make_row(
                f"relay chain, {count} hops, {size}",
                f"{count + 1} relay processes in a chain on 127.0.0.1, {size}, every hop verifies",
                f"the 1-hop chain in the same rounds ({_mb_s(nbytes, one)})",
                samples[count],
                samples[1],
                notes=(
                    f"{_mb_s(nbytes, measured)}; throughput ratio {count}/1 = {one / measured:.3f}; "
                    f"{_per_hop(cpu[count], count, nbytes)}; all {count + 1} processes share {cpus} CPU(s), "
                    "so this measures the per-hop cost, not a chain of real nodes"
                ),
                extra={
                    "hops": count,
                    "bytes": nbytes,
                    "mb_per_s": nbytes / 1e6 / measured,
                    "throughput_ratio": one / measured,
                    "cpus": cpus,
                },
            )
        )
    return rows


def _per_hop(cpu_seconds: list[float], hops: int, nbytes: int) -> str:
    """CPU seconds per GB per hop (rank 0 and the feeder counted as one more hop)."""
    if not nbytes:
        return "per-hop CPU -"
    per = median(cpu_seconds) / (hops + 1) / (nbytes / 1e9)
    return f"{per:.2f} CPU s per GB per relay process (~{1000 / per:.0f} MB/s per core)" if per > 0 else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hops", default=",".join(map(str, HOPS)), help="chain lengths, comma-separated")
    parser.add_argument("--bytes", type=int, default=DEFAULT_BYTES, help="stream size per run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (the floor and every chain once each)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the uncounted first run")
    parser.add_argument("--out", default="-", help="write the rows (JSON list) here; '-' = stdout")
    args = parser.parse_args(argv)
    hops = int_list(parser, "--hops", args.hops)
    if args.repeats < 1 or args.bytes < 1:
        parser.error("--bytes and --repeats must be positive")
    write_rows(run(hops, args.bytes, args.repeats, not args.no_warmup), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
