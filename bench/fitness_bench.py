"""The fitness stage's network check for N simulated nodes on loopback, against a kernel floor.

One run: N slurm_multi.fitness.mesh.Mesh objects, each with its own listener (an address of its
own on the loopback, 127.1.x.y, and a port of its own: the `host:port` test aid), all driven by ONE
selectors loop in ONE process, as run_stage drives one node: timers, then events; a node says its
HELLO once its ring probe is done.
Each node dials its partners (mesh.partners: ring neighbours and two offsets drawn from the job ID)
with the real protocol: a greeting, a signed JOIN, a signed WELCOME, a signed HELLO, a signed GOT,
and the ring probe (PROBE_BYTES, small: this row is about connections, not bandwidth). The figure
is the time from the first listen to the last node done.

- floor: the very same connections (every node to each of its partners, and the probe's), with no
  protocol: the listener sends one line, the dialer reads it and closes; the same loop.

The simulation is O(N) by construction: one process does every node's work, on one core. A real
node does only its own share, so the per-node figures (seconds / N, CPU seconds / N) are what a
node pays; the scaling row judges a node's CPU seconds at 1,024 nodes against 64 (on a machine
whose cores other processes share, the wall time holds the waits for a core: the load average is
in the notes). Beside the partners, the old design at 64 nodes: every node dials every other
(`--no-full-mesh` leaves it out).
"""

from __future__ import annotations

import gc
import heapq
import os
import resource
import selectors
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

import benchlib  # noqa: E402
from barrier_bench import ensure_nofile  # noqa: E402
from benchlib import format_seconds, make_row, median, skipped_row, talk, write_rows  # noqa: E402

from slurm_multi.fitness.mesh import Mesh, partners  # noqa: E402
from slurm_multi.fitness.protocol import Hello  # noqa: E402

LOOPBACK = "127.0.0.1"


def address(rank: int) -> str:
    """Each simulated node's own loopback address (127.1.x.y: all of 127/8 is the loopback): with one
    address for every node, the job's thousands of dials (and their TIME_WAITs, 60 s each) would
    share one range of ephemeral ports, which no real cluster does."""
    return f"127.1.{rank // 250}.{rank % 250 + 1}"


SIZES = (64, 256, 1024)
SMALL, LARGE = 64, 1024  # the scaling row: per-node time at LARGE against SMALL
TARGET = "<= 2.0x"
TOKEN, JOB = "bench-fitness-token", "424242"
PROBE_BYTES = 64 << 10
RUN_TIMEOUT = 120.0
FD_HEADROOM = 256


class Key(NamedTuple):
    """What Links.on_event reads of a selector key: its data."""

    data: Any


class NodeSelector:
    """One node's view of the shared selector: its registrations carry its index."""

    def __init__(self, shared: selectors.BaseSelector, index: int) -> None:
        self.shared, self.index = shared, index

    def register(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self.shared.register(fileobj, events, (self.index, data))

    def modify(self, fileobj: Any, events: int, data: Any = None) -> Any:
        return self.shared.modify(fileobj, events, (self.index, data))

    def unregister(self, fileobj: Any) -> Any:
        return self.shared.unregister(fileobj)

    def select(self, timeout: float | None = None) -> list:
        return []  # (Links.close_all's linger: the simulation closes with none)


class Run(NamedTuple):
    seconds: float
    cpu_seconds: float
    connections: list[int]  # per node: dialled + accepted
    errors: list[str]


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now, one per simulated node (bound to 0, then released)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((LOOPBACK, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def simulate(n: int, full_mesh: bool = False, timeout: float = RUN_TIMEOUT) -> Run:
    """Every node of an n-node job's fitness mesh in this process (the module docstring)."""
    ports = free_ports(n)
    shared = selectors.DefaultSelector()
    start, cpu0 = time.monotonic(), _cpu()
    deadline = start + timeout
    hosts, candidates = [address(r) for r in range(n)], [[port] for port in ports]
    meshes = []
    for r in range(n):
        peers = dialled(r, n, full_mesh)
        meshes.append(
            Mesh(
                NodeSelector(shared, r),
                r,
                hosts,
                candidates,
                JOB,
                TOKEN,
                PROBE_BYTES,
                2.0,
                deadline - 2,
                deadline,
                peers,
            )  # fmt: skip
        )
    for mesh in meshes:
        mesh.listen()
    # The loop's own work follows what happens (a heap of the nodes' next timers, the nodes an event
    # touched), not N: what grows with N is the nodes' work.
    due = [(start, r) for r in range(n)]
    pending = set(range(n))

    def after(r: int, now: float) -> None:
        mesh = meshes[r]
        if mesh.hello is None and mesh.probe_done():  # as run_stage: the HELLO once the probe is done
            ring = mesh.ring["bytes_per_s"]
            mesh.set_hello(Hello(r, hosts[r], ports[r], 0.0, (r + 1) % n, ring, "ok"), now)
        if r in pending and mesh.done():
            pending.discard(r)
        heapq.heappush(due, (mesh.next_timer(), r))

    try:
        while pending and time.monotonic() < deadline:
            now = time.monotonic()
            fired = set()
            while due and due[0][0] <= now:
                fired.add(heapq.heappop(due)[1])
            for r in fired:
                meshes[r].on_timers(now)
                after(r, now)
            wait = max(0.0, min(due[0][0] if due else deadline, deadline) - time.monotonic())
            touched = set()
            for key, mask in shared.select(wait):
                r, data = key.data
                meshes[r].on_event(Key(data), mask, time.monotonic())  # type: ignore[arg-type]
                touched.add(r)
            for r in touched:
                after(r, time.monotonic())
        seconds, cpu = time.monotonic() - start, _cpu() - cpu0
    finally:
        for mesh in meshes:
            mesh.close(0.0)
        shared.close()
    errors = [_why_not_done(meshes[r]) for r in sorted(pending)]
    connections = []
    for mesh in meshes:
        figures = mesh.figures()
        connections.append(figures["connections"]["dialled"] + figures["connections"]["accepted"])
        if figures["heard"] != mesh.peers and not errors:
            errors.append(f"rank {mesh.me}: heard {len(figures['heard'])} of {len(mesh.peers)} partners")
    return Run(seconds, cpu, connections, errors)


def dialled(r: int, n: int, full_mesh: bool) -> list[int]:
    """The ranks rank r dials: its partners (the design), or every other rank (the full mesh)."""
    return [q for q in range(n) if q != r] if full_mesh else partners(r, n, JOB)


def fds_needed(n: int, full_mesh: bool) -> int:
    """At most, at one moment: every node's listener, both ends of every dial and of the probe's."""
    return n + 2 * sum(len(dialled(r, n, full_mesh)) + 1 for r in range(n)) + FD_HEADROOM


def _why_not_done(mesh: Mesh) -> str:
    undelivered = {q: dial.said() or "no answer" for q, dial in mesh.dials.items() if not dial.done}
    return (
        f"rank {mesh.me} not done: {mesh.listen_error or 'listening'}; not delivered to {undelivered}; "
        f"not heard from {mesh.not_heard()}; probe {'done' if mesh.probe_done() else 'running'}"
    )


def floor(n: int, full_mesh: bool = False, timeout: float = RUN_TIMEOUT) -> Run:
    """The same connections without the protocol: each node's listener sends one line to every
    connection it accepts; each dial (to every partner, and the probe's to the ring successor) reads
    it and closes. One selectors loop, one process, as `simulate`."""
    sel = selectors.DefaultSelector()
    start, cpu0 = time.monotonic(), _cpu()
    listeners = []
    for r in range(n):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address(r), 0))
        sock.listen(128)
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, ("listener", None))
        listeners.append(sock)
    addresses = [sock.getsockname() for sock in listeners]
    dials = [(r, q) for r in range(n) for q in [*dialled(r, n, full_mesh), (r + 1) % n]]
    counts = [0] * n
    for r, q in dials:
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(addresses[q])
        sel.register(sock, selectors.EVENT_READ, ("dial", None))
        counts[r] += 1
        counts[q] += 1
    left = len(dials)
    deadline = start + timeout
    try:
        while left and time.monotonic() < deadline:
            for key, _mask in sel.select(1.0):
                kind, _ = key.data
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if kind == "listener":
                    while True:
                        try:
                            conn, _addr = sock.accept()
                        except BlockingIOError:
                            break
                        conn.send(b"FITNESS 0123456789abcdef0123456789abcdef\n")
                        conn.close()
                    continue
                sock.recv(128)
                sel.unregister(sock)
                sock.close()
                left -= 1
        seconds, cpu = time.monotonic() - start, _cpu() - cpu0
    finally:
        for key in list(sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
    return Run(seconds, cpu, counts, [f"{left} dials unanswered"] if left else [])


def _without_gc(measure: Any, *args: Any) -> Run:
    """One measurement with the cyclic GC off (as barrier_bench's driver): its passes grow with every
    simulated node's objects in this one process, which no real node holds."""
    gc.collect()
    gc.disable()
    try:
        return measure(*args)
    finally:
        gc.enable()


def _connections(runs: Sequence[Run]) -> dict[str, Any]:
    counts = runs[0].connections
    return {
        "connections_per_node_max": max(counts),
        "connections_per_node_mean": round(statistics.fmean(counts), 1),
        "connections_total": sum(counts) // 2,
    }


def bench_size(n: int, repeats: int, full_mesh: bool = False) -> tuple[dict[str, Any], list[Run]]:
    design = "full mesh (before)" if full_mesh else "partners"
    name = f"fitness mesh, {n} simulated nodes" + (", full mesh (before)" if full_mesh else "")
    what = f"{n} nodes' fitness meshes ({design}) in one process on loopback: first listen -> last node done"
    baseline = "the same connections with no protocol (connect, accept, one line, close), same loop"
    need = fds_needed(n, full_mesh)
    have = ensure_nofile(need)
    if have < need:
        return skipped_row(name, what, baseline, f"open-files limit {have} < {need}"), []
    simulate(min(n, 16), full_mesh)  # warm up: imports, the first HMACs
    runs, floors = [], []
    for _ in range(repeats):
        run = _without_gc(simulate, n, full_mesh)
        if run.errors:
            raise RuntimeError(f"{name}: {'; '.join(run.errors[:3])}")
        runs.append(run)
        base = _without_gc(floor, n, full_mesh)
        if base.errors:
            raise RuntimeError(f"{name} floor: {'; '.join(base.errors[:3])}")
        floors.append(base)
    load = os.getloadavg()[0]
    per_node = median([r.seconds / n for r in runs])
    cpu_node = median([r.cpu_seconds / n for r in runs])
    figures = _connections(runs)
    notes = (
        f"one process simulates every node on one core (its wall time is O(N) by construction); per "
        f"node: {format_seconds(per_node)} wall, {format_seconds(cpu_node)} CPU; connections per node "
        f"max {figures['connections_per_node_max']}, mean {figures['connections_per_node_mean']} "
        f"({figures['connections_total']} in all); probe {PROBE_BYTES >> 10} KiB; load average "
        f"{load:.1f} on {os.cpu_count()} CPUs"
    )
    row = make_row(
        name,
        what,
        baseline,
        [r.seconds for r in runs],
        [b.seconds for b in floors],
        notes=notes,
        extra={
            "nodes": n,
            "design": design,
            "per_node_s": per_node,
            "cpu_s": median([r.cpu_seconds for r in runs]),
            "cpu_per_node_s": cpu_node,
            "load_average": load,
            **figures,
        },
    )
    return row, runs


def scaling_row(small: dict[str, Any], small_runs: Sequence[Run], large: dict[str, Any],
                large_runs: Sequence[Run]) -> dict[str, Any]:  # fmt: skip
    """A node's share at LARGE nodes against its share at SMALL: CPU seconds / N of each run (the
    work a node does; the wall time on a machine whose cores other processes share also holds the
    waits for a core: it is in the notes)."""
    n_small, n_large = small["nodes"], large["nodes"]
    return make_row(
        f"fitness mesh CPU per node, {n_large} vs {n_small} nodes",
        f"a node's share of the simulation's CPU seconds at {n_large} nodes (CPU s / N)",
        f"the same at {n_small} nodes",
        [r.cpu_seconds / n_large for r in large_runs],
        [r.cpu_seconds / n_small for r in small_runs],
        target=TARGET,
        notes=(
            f"wall per node {format_seconds(large['per_node_s'])} vs {format_seconds(small['per_node_s'])} "
            f"(ratio {large['per_node_s'] / small['per_node_s']:.2f}x; load average "
            f"{large['load_average']:.1f} vs {small['load_average']:.1f} on {os.cpu_count()} CPUs); "
            f"connections per node (max) {large['connections_per_node_max']} vs "
            f"{small['connections_per_node_max']}"
        ),
        extra={"wall_per_node_ratio": large["per_node_s"] / small["per_node_s"]},
    )


def run(sizes: Sequence[int] = SIZES, repeats: int = 5, full_mesh: bool = True) -> list[dict[str, Any]]:
    rows, measured = [], {}
    for n in sizes:
        talk("fitness", f"{n} nodes: {repeats} runs each of the mesh and the floor")
        row, runs = bench_size(n, repeats)
        rows.append(row)
        measured[n] = (row, runs)
        if runs:
            talk("fitness", f"{n} nodes: {format_seconds(row['median_s'])}, {row['notes']}")
    small, large = min(sizes), max(sizes)
    if small != large and measured[small][1] and measured[large][1]:
        rows.append(scaling_row(*measured[small], *measured[large]))
    if full_mesh and small <= SMALL:
        row, runs = bench_size(small, repeats, full_mesh=True)
        rows.append(row)
        if runs:
            talk("fitness", f"{small} nodes, full mesh: {format_seconds(row['median_s'])}, {row['notes']}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = benchlib.sizes_parser(__doc__, SIZES, "node counts")
    parser.add_argument("--no-full-mesh", action="store_true", help="skip the full mesh row")
    args, sizes = benchlib.sizes_args(parser, argv, low=2)
    write_rows(run(sizes, args.repeats, not args.no_full_mesh), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
