"""The batch step's watch over its node tasks (`slurm-multi job watch`, beside every job's srun)
and `mark_lost` (`slurm-multi job mark-lost`); their click commands are in slurm_multi.job.

It reads what the nodes write (status.json, their stage events) and what Slurm says of the nodes
(`scontrol show node`): a rank whose status.json says it failed, or a node Slurm reports DOWN or
failed, starts the peer grace at once; when it is over, exit 10 tells the batch step to stop the
others. A node Slurm declared dead gets a "lost" status.json for each of its ranks.

With --wake-fd, once every rank's workload has printed its first line (or the rank is past its run)
it writes one empty line there and closes it: the batch step's warm collect (slurm_multi.warm) then
pays for its imports while the workload runs, not while the nodes and their containers start.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence

from slurm_multi import statusfile
from slurm_multi.events import node_stage, workload_started
from slurm_multi.logline import talk

EXIT_STOP = 10  # `job watch`: a node failed and the peer grace is over: stop the step
BAD_NODE_STATES = ("DOWN", "FAIL", "NODE_FAIL")
WAKE_EVERY = 0.25  # how often the stages are read until every rank runs (one events file, mostly)


def _alive(pid: int) -> bool:
    """The process exists and has not exited (a zombie waiting to be reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X")


def slurm_node_states(nodes: Sequence[str]) -> dict[str, str]:
    """Slurm's state of each node (`scontrol show node -o`), e.g. IDLE, MIXED, DOWN*, ALLOCATED+DRAIN."""
    import subprocess

    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states: dict[str, str] = {}
    for line in out.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        if name and state:
            states[name.group(1)] = state.group(1)
    return states


def is_bad_state(state: str, not_responding: bool = False) -> bool:
    """DOWN or failed; with `not_responding`, also a node Slurm cannot reach (`*`, NOT_RESPONDING)."""
    import re

    upper = state.upper()
    if not_responding and ("*" in upper or "NOT_RESPONDING" in upper):
        return True
    return any(bad in part for part in re.split(r"[+*]", upper) for bad in BAD_NODE_STATES)


def write_lost_status(jobdir: str, rank: int, node: str, state: str) -> None:
    """A rank on a node Slurm declared dead will never stage: record that, so nobody waits for it."""
    directory = os.path.join(jobdir, f"node_{rank}")
    if statusfile.has_status(directory):
        return
    reason = f"Slurm reports {node} {state}: the node (or its slurmd) died during the job"
    # Exit 137, no stages, no image: status "failed", as the node's own status.json would say.
    document = statusfile.status_document(rank, node, 137, reason, "", (), terminated=False)
    statusfile.write_status(statusfile.status_path(directory), document)


def mark_lost(
    jobdir: str, nodes: Sequence[str], tasks_per_node: int, not_responding: bool = False
) -> list[tuple[str, str]]:
    """Record a lost status for every rank on a node Slurm reports dead; return (node, state) pairs.

    `not_responding` (the teardown's view: the job is ending, an unreachable node will not stage)
    also counts a node Slurm cannot reach but has not declared DOWN yet. The watch leaves it out: a
    missed ping during a run is not a failed node.
    """
    lost = []
    states = slurm_node_states(nodes)
    for index, node in enumerate(nodes):
        state = states.get(node, "")
        if state and is_bad_state(state, not_responding):
            for local in range(tasks_per_node):
                write_lost_status(jobdir, index * tasks_per_node + local, node, state)
            lost.append((node, state))
    return lost


def _exit_waiter(pid: int):  # noqa: ANN202 - a callable taking seconds
    """A wait of at most N seconds that returns the moment `pid` exits (a pidfd: the verdict does not
    wait out a poll interval after the last rank ended); a plain sleep where pidfds are missing."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return time.sleep
    import select

    return lambda seconds: select.select([fd], [], [], seconds)


class Waker:
    """Writes one empty line to each of `fds` (then closes them) once every rank's workload has started
    (events.workload_started). Ranks are read in order from the first not yet started, so each look
    reads one events file until that rank's workload runs, not every rank's."""

    def __init__(self, fds: int | Sequence[int] | None, jobdir: str, ranks: int) -> None:
        self.fds = [fds] if isinstance(fds, int) else list(fds or ())
        self.jobdir, self.ranks, self.first, self.next_at = jobdir, ranks, 0, 0.0

    def look(self, now: float) -> None:
        if not self.fds or now < self.next_at:
            return
        self.next_at = now + WAKE_EVERY
        while self.first < self.ranks and workload_started(self.jobdir, self.first):
            self.first += 1
        if self.first >= self.ranks:
            self.close(b"\n")

    def close(self, line: bytes = b"") -> None:
        for fd in self.fds:
            try:
                if line:
                    os.write(fd, line)
            except OSError:  # the woken helper is gone: the batch step starts it cold
                pass
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


def watch(
    jobdir: str,
    nodes: Sequence[str],
    tasks_per_node: int,
    srun_pid: int,
    peer_grace: float,
    progress_every: float,
    check_every: float = 1.0,
    node_check_every: float = 2.0,
    wake_fd: int | Sequence[int] | None = None,
) -> int:
    """Wait for the worker step; 0 when it ended, EXIT_STOP when a rank failed `peer_grace` ago."""
    ranks = len(nodes) * tasks_per_node
    ended = _exit_waiter(srun_pid)
    waker = Waker(wake_fd, jobdir, ranks)
    try:
        return _watch(jobdir, nodes, ranks, tasks_per_node, srun_pid, peer_grace, progress_every, check_every,
                      node_check_every, ended, waker)  # fmt: skip
    finally:
        waker.close()


def _watch(
    jobdir: str,
    nodes: Sequence[str],
    ranks: int,
    tasks_per_node: int,
    srun_pid: int,
    peer_grace: float,
    progress_every: float,
    check_every: float,
    node_check_every: float,
    ended: object,
    waker: Waker,
) -> int:
    stop_at: float | None = None
    now = time.monotonic()
    next_check, next_nodes, next_progress = now, now + node_check_every, now + progress_every
    while _alive(srun_pid):
        ended(0.1)  # type: ignore[operator]
        now = time.monotonic()
        waker.look(now)
        if stop_at is not None:
            if now >= stop_at:
                return EXIT_STOP
            continue
        if now >= next_nodes and nodes:
            next_nodes = now + node_check_every
            lost = mark_lost(jobdir, nodes, tasks_per_node)
            if lost:
                node, state = lost[0]
                talk(
                    "multi",
                    f"Slurm reports {node} {state}; "
                    f"the other nodes get {peer_grace:g} s before they are stopped",
                )
                stop_at = now + peer_grace
                continue
        if now >= next_check:
            next_check = now + check_every
            for rank in range(ranks):
                status = statusfile.read_status(statusfile.status_path(os.path.join(jobdir, f"node_{rank}")))
                if status is not None and status.readable and status.exit_code != 0:
                    reason = status.reason or f"exit {status.exit_code}"
                    node = status.document.get(statusfile.NODE, "?")
                    # Before its run (prepare, fitness, image, barrier) nothing runs that a grace would
                    # let finish: the others are stopped at once (one may hang on a bad node's engine).
                    stages = status.document.get(statusfile.STAGES)
                    grace = peer_grace if isinstance(stages, dict) and "run" in stages else 0.0
                    talk("multi", f"node_{rank} ({node}) failed: {reason}; "
                         f"the other nodes get {grace:g} s before they are stopped")  # fmt: skip
                    stop_at = now + grace
                    break
        if now >= next_progress:
            next_progress = now + progress_every
            talk("multi", "progress: " + " ".join(f"node_{r}={node_stage(jobdir, r)}" for r in range(ranks)))
    return 0
