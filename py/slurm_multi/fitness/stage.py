"""The fitness stage on one node: its local checks and the mesh at once, within --timeout; its report.

One selector loop drives the mesh (slurm_multi.fitness.mesh) while the local checks run in threads
(slurm_multi.fitness.checks, .gpucheck); the HELLO goes out once both are done, or when it is due.
SIGTERM (scancel, a time limit, the task ending because a peer failed first) ends the loop: the
report is still written, marked stopped, with what was found so far. The report's verdict is
`judge`'s over the report itself (slurm_multi.fitness.verdict). After ~2 s of waiting the stage logs
once which peers it has not heard from.

The report (--out, written atomically: a temp file in the same dir, then a rename; keys stable):
    {"version": 1, "rank", "host", "nnodes", "job_id", "hosts": [...], "ports": [[candidates], ...],
     "started_at": epoch s, "seconds": the stage's wall time, "timeout",
     "ok": this node's view found nothing bad (null when stopped, unless a local check failed),
     "reason": this node's own reason in that view or "",
     "stopped": "" or why the stage ended before its verdict (slurm_multi.fitness.verdict says what
                it counts for; a check that had not finished by then is null under "checks"),
     "local": {"ok", "reason"}  (the verdict its HELLO carried),
     "thresholds": {"slow_factor", "clock_bound", "min_rate": bytes/s, 0 = no floor},
     "checks": {
       "runtime": {"kind", "status": ok|failed|skipped, "ok", "reason", "detail", "seconds"},
       "disk": [{"path", "checked", "need_bytes", "reserve_bytes", "free_bytes", "free_inodes",
                 "total_inodes", "min_inodes", "ok", "reason"}],
       "gpus": {"status", "ok", "reason", "tool", "needed", "count", "mem_fraction",
                "gpus": [{"index", "uuid", "used_mib", "total_mib"}],
                "processes": [{"gpu", "pid", "mib"}],
                "offenders": [{"gpu", "pid", "mib", "total_mib", "why": process|memory}], "seconds"},
       "network": {"port": the candidate it listens on or null, "candidates", "ports_taken": [the
                   candidates another process held], "listening", "listen_error",
                   "partners": [the ranks it dials and hears from: slurm_multi.fitness.mesh],
                   "connections": {"dialled": connect attempts, "accepted": connections accepted},
                   "reached": [ranks], "heard": [ranks],
                   "errors": {rank: last dial error}, "token_rejected_by": [ranks that answered
                   ERR bad token], "rejected": [{"from", "rank", "reason"}],
                   "ring": {"to", "bytes", "seconds", "bytes_per_s", "complete", "error", "cpu_wait",
                            "cpu_bound"} | null
                           (null with N == 1),
                   "offsets": {rank: seconds, this node 0.0},
                   "peers": {rank: {"host", "port", "verdict", "ring_to", "ring_bytes_per_s",
                                     "ring_cpu_bound"}}}},
     "bad": [{"rank", "host", "reason"}]}
"""

from __future__ import annotations

import selectors
import signal
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from slurm_multi.fitness.checks import (
    TOOL_GRACE,
    Pending,
    check_disks,
    check_runtime,
    disk_entry,
    disk_timeout_figures,
    docker_disk,
    kill_tool,
    local_verdict,
    runtime_figures,
    runtime_timeout_figures,
)
from slurm_multi.fitness.gpucheck import check_gpus, gpu_figures, gpu_timeout_figures
from slurm_multi.fitness.mesh import Mesh, partners
from slurm_multi.fitness.protocol import HELLO_MARGIN, HELLO_MARGIN_SHARE, Hello
from slurm_multi.fitness.verdict import judge
from slurm_multi.logline import talk
from slurm_multi.net import secs

AREA = "fitness"
VERSION = 1
PROGRESS_AFTER = 2.0  # one line naming the peers not heard from yet


class Options(NamedTuple):
    rank: int
    nnodes: int
    hosts: list[str]
    ports: list[list[int]]  # each rank's candidate ports
    job_id: str
    token: str
    timeout: float
    runtime: str
    runtime_timeout: float
    disks: list[tuple[str, int]]
    disk_reserve: int
    min_inodes: int
    disk_timeout: float
    gpus_needed: int
    gpu_mem_fraction: float
    gpu_timeout: float
    probe_bytes: int
    probe_seconds: float
    slow_factor: float
    clock_bound: float
    out: str
    min_rate: float = 0.0  # bytes/s, 0 = no floor
    docker_image: str = ""
    image_bytes: int = 0


def raise_nofile_limit(needed: int) -> None:
    """Raise the soft open-files limit towards the hard one when `needed` descriptors (two
    connections per peer) would not fit (as slurm_multi.barrier does for thousands of ranks)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


def run_stage(opts: Options, env: Mapping[str, str]) -> dict[str, Any]:
    """Run the stage on this node; return its report (see the module docstring)."""
    started_at, t0 = time.time(), time.monotonic()
    deadline = t0 + opts.timeout
    hello_by = deadline - min(HELLO_MARGIN, HELLO_MARGIN_SHARE * opts.timeout)
    sel = selectors.DefaultSelector()
    wake_in, wake_out = socket.socketpair()
    wake_in.setblocking(False)
    wake_out.setblocking(False)
    sel.register(wake_in, selectors.EVENT_READ, None)

    def wake() -> None:
        try:
            wake_out.send(b"!")
        except OSError:
            pass

    # SIGTERM (scancel, a time limit, the task ending because a peer failed first): the report is
    # still written, marked stopped, with what was found so far.

    stopped: list[bool] = []

    def on_signal(_signum: int, _frame: Any) -> None:
        stopped.append(True)
        wake()

    previous = signal.signal(signal.SIGTERM, on_signal)
    children: list[Any] = []
    peers = partners(opts.rank, opts.nnodes, opts.job_id)
    if opts.nnodes > 1:
        raise_nofile_limit(4 * (len(peers) + 1) + 64)
    checks = _start_checks(opts, env, t0, hello_by, wake, children)
    mesh = None
    if opts.nnodes > 1:
        mesh = Mesh(
            sel,
            opts.rank,
            opts.hosts,
            opts.ports,
            opts.job_id,
            opts.token,
            opts.probe_bytes,
            opts.probe_seconds,
            hello_by,
            deadline,
            peers,
        )
        mesh.listen()
        if mesh.all_taken:
            talk(AREA, f"warning: {mesh.listen_error}")
    local: dict[str, Any] | None = None
    noted = False
    try:
        while True:
            now = time.monotonic()
            if stopped:
                break
            if mesh is not None:
                mesh.on_timers(now)
            if local is None and all(check.finished(now) for check in checks.values()):
                local = {name: check.value() for name, check in checks.items()}
                local["ok"], local["reason"] = local_verdict(
                    local["runtime"], local["disk"], local["gpus"], mesh.local_listen_error() if mesh else ""
                )
            if mesh is not None and local is not None and mesh.hello is None and mesh.probe_done():
                ring_rate = mesh.ring["bytes_per_s"] if mesh.probe is not None else None
                mesh.set_hello(
                    Hello(
                        opts.rank,
                        opts.hosts[opts.rank],
                        mesh.links.port,
                        0.0,
                        mesh.ring["to"] if mesh.probe else None,
                        ring_rate,
                        "ok" if local["ok"] else local["reason"],
                        bool(mesh.probe is not None and mesh.ring["cpu_bound"]),
                    ),
                    now,
                )
            if (local is not None and (mesh is None or mesh.done())) or now >= deadline:
                break
            if mesh is not None and not noted and now - t0 >= PROGRESS_AFTER:
                noted = True
                waiting = mesh.not_heard()
                if waiting:
                    names = ", ".join(f"{opts.hosts[q]} (rank {q})" for q in waiting[:20])
                    more = f" and {len(waiting) - 20} more" if len(waiting) > 20 else ""
                    talk(AREA, f"waiting for {names}{more}: no HELLO yet after {secs(now - t0)} s")
            wake_at = [deadline]
            if local is None:
                wake_at += [check.bound_at for check in checks.values() if not check.done.is_set()]
            if mesh is not None:
                wake_at.append(mesh.next_timer())
                if not noted:
                    wake_at.append(t0 + PROGRESS_AFTER)
            events = []
            for key, mask in sel.select(max(0.0, min(wake_at) - time.monotonic())):
                if key.data is None:
                    try:
                        wake_in.recv(4096)
                    except OSError:
                        pass
                else:
                    events.append((key, mask))
            if mesh is not None:
                mesh.on_events(events, time.monotonic())
    finally:
        signal.signal(signal.SIGTERM, previous)
        sel.unregister(wake_in)  # a check finishing late must not spin the last flush
        if mesh is not None:
            mesh.close(0.0 if stopped else 0.5)  # stopped: the task is ending, nothing is waited for
        sel.close()
        wake_in.close()
        wake_out.close()
        for proc in children:
            if proc.poll() is None:
                kill_tool(proc)
    if local is None:  # stopped, or the deadline came first (a --timeout shorter than a check's bound)
        local = {
            name: check.result if check.done.is_set() else None if stopped else check.value()
            for name, check in checks.items()
        }
        listen_error = mesh.local_listen_error() if mesh else ""
        local["ok"], local["reason"] = local_verdict(
            local["runtime"] or {}, local["disk"] or [], local["gpus"] or {}, listen_error
        )
    network = (
        mesh.figures()
        if mesh is not None
        else {
            "port": None,
            "candidates": opts.ports[opts.rank],
            "ports_taken": [],
            "listening": False,
            "listen_error": "",
            "partners": [],
            "connections": {"dialled": 0, "accepted": 0},
            "reached": [],
            "heard": [],
            "errors": {},
            "token_rejected_by": [],
            "rejected": [],
            "ring": None,
            "offsets": {str(opts.rank): 0.0},
            "peers": {},
        }
    )
    report: dict[str, Any] = {
        "version": VERSION,
        "rank": opts.rank,
        "host": opts.hosts[opts.rank],
        "nnodes": opts.nnodes,
        "job_id": opts.job_id,
        "hosts": opts.hosts,
        "ports": opts.ports,
        "started_at": round(started_at, 6),
        "seconds": 0.0,
        "timeout": opts.timeout,
        "ok": True,
        "reason": "",
        "stopped": "SIGTERM before the verdict" if stopped else "",
        "local": {"ok": local["ok"], "reason": local["reason"]},
        "thresholds": {
            "slow_factor": opts.slow_factor,
            "clock_bound": opts.clock_bound,
            "min_rate": opts.min_rate,
        },
        "checks": {
            "runtime": local["runtime"],
            "disk": local["disk"],
            "gpus": local["gpus"],
            "network": network,
        },
        "bad": [],
    }
    report["bad"] = judge(report, opts.slow_factor, opts.clock_bound, opts.min_rate)
    report["ok"] = False if report["bad"] else None if stopped else True
    report["reason"] = next((b["reason"] for b in report["bad"] if b["rank"] == opts.rank), "")
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def _start_checks(
    opts: Options,
    env: Mapping[str, str],
    t0: float,
    hello_by: float,
    wake: Callable[[], None],
    children: list[Any],
) -> dict[str, Pending]:
    def bound(seconds: float) -> float:
        return min(t0 + seconds + TOOL_GRACE, hello_by) if opts.nnodes > 1 else t0 + seconds + TOOL_GRACE

    def runtime_error(reason: str) -> dict:
        return runtime_figures(opts.runtime, "failed", reason)

    def disk_error(reason: str) -> list[dict]:
        entries = [disk_entry(path, need, opts.disk_reserve, opts.min_inodes) for path, need in opts.disks]
        for entry in entries:
            entry["reason"] = reason
        return entries

    def gpu_error(reason: str) -> dict:
        return gpu_figures("failed", reason, None, opts.gpus_needed, opts.gpu_mem_fraction)

    return {
        "runtime": Pending(
            "runtime",
            lambda: check_runtime(opts.runtime, opts.runtime_timeout, env, children),
            bound(opts.runtime_timeout),
            lambda: runtime_timeout_figures(opts.runtime, opts.runtime_timeout),
            runtime_error,
            wake,
        ),
        "disk": Pending(
            "disk",
            lambda: check_disks(
                opts.disks + docker_disk(env, opts.docker_image, opts.image_bytes, opts.disk_timeout),
                opts.disk_reserve,
                opts.min_inodes,
            ),
            bound(opts.disk_timeout),
            lambda: disk_timeout_figures(opts.disks, opts.disk_reserve, opts.min_inodes, opts.disk_timeout),
            disk_error,
            wake,
        ),
        "gpus": Pending(
            "gpus",
            lambda: check_gpus(opts.gpus_needed, opts.gpu_mem_fraction, opts.gpu_timeout, env, children),
            bound(opts.gpu_timeout),
            lambda: gpu_timeout_figures(None, opts.gpus_needed, opts.gpu_mem_fraction, opts.gpu_timeout),
            gpu_error,
            wake,
        ),
    }
