"""The batch step's watch over its node tasks (`slurm-multi job watch`, beside every job's srun)
and `mark_lost` (`slurm-multi job mark-lost`); their click commands are in slurm_multi.job.

It reads what the nodes write (status.json, their stage events), what Slurm says of the nodes
(`scontrol show node`) and, with a reach port, whether the batch host still reaches them
(slurm_multi.reach): a rank whose status.json says it failed, a node Slurm reports DOWN or failed,
or a node silent on the network for reach.LOST_AFTER seconds, starts the peer grace at once; when
it is over, exit 10 tells the batch step to stop the others. A lost node is recorded, with how it
was lost, in the batch step's lost.json (slurm_multi.lost: collect names it a bad node), and each
of its ranks gets a "lost" status.json, so that nobody waits for them.

With --wake-fd, once every rank's workload has printed its first line (or the rank is past its run)
it writes one empty line there and closes it: the batch step's warm collect (slurm_multi.warm) then
pays for its imports while the workload runs, not while the nodes and their containers start.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Sequence
from typing import Any

from slurm_multi import lost as lost_nodes
from slurm_multi import statusfile
from slurm_multi.events import has_event, node_stage, workload_started
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


def slurm_node_states(nodes: Sequence[str]) -> dict[str, str] | None:
    """Slurm's state of each node (`scontrol show node -o`), e.g. IDLE, MIXED, DOWN*, ALLOCATED+DRAIN;
    None when the controller did not answer."""
    import subprocess

    try:
        done = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    out = done.stdout
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


def slurm_reason(node: str, state: str) -> str:
    """How a node Slurm reports dead (or unreachable) was lost, in one line."""
    return f"Slurm reports {node} {state}: the node (or its slurmd) died during the job"


def network_reason(node: str, silent: float) -> str:
    """How a node that stopped answering the batch host was lost, in one line."""
    return f"{node} stopped answering on the network: no answer to the batch host for {silent:.0f} s"


def vanished_reason(node: str, rank: int) -> str:
    """How a rank whose task ended without a status, and that the reaper could not stage, was lost."""
    return f"the task of rank {rank} on {node} vanished without a status, and the reaper could not reach it"


def write_lost_status(jobdir: str, rank: int, node: str, state: str, reason: str = "") -> None:
    """A rank on a node the job lost will never stage: record that, so nobody waits for it. The
    reason is Slurm's word on the node (`state`) unless `reason` says how else it was lost."""
    directory = os.path.join(jobdir, f"node_{rank}")
    if statusfile.has_status(directory):
        return
    reason = reason or slurm_reason(node, state)
    # Exit 137, no stages, no image: status "failed", as the node's own status.json would say.
    document = statusfile.status_document(rank, node, 137, reason, "", (), terminated=False)
    statusfile.write_status(statusfile.status_path(directory), document)


def ranks_of(index: int, tasks_per_node: int) -> list[int]:
    return list(range(index * tasks_per_node, (index + 1) * tasks_per_node))


def lose(jobdir: str, nodes: Sequence[str], tasks_per_node: int, node: str, how: str, reason: str) -> bool:
    """Record `node` lost (lost.json) and each of its ranks' lost status.json; True when it is new."""
    ranks = ranks_of(list(nodes).index(node), tasks_per_node)
    new = lost_nodes.record(jobdir, node, how, reason, ranks)
    for rank in ranks:
        write_lost_status(jobdir, rank, node, "", reason)
    return new


def mark_vanished(jobdir: str, nodes: Sequence[str], tasks_per_node: int) -> list[tuple[str, str]]:
    """The teardown's last word, after the reaper step: a rank that still has no status.json, on a
    node the reaper did not reach while it reached others (each node it reaches says so: a `reap`
    event), vanished with its node: the node is lost. When the reaper reached no node (its step
    never started: a node of it down), nothing is known and nobody is blamed."""
    total = len(nodes) * tasks_per_node
    reached = {r for r in range(total) if has_event(os.path.join(jobdir, f"node_{r}"), "reap")}
    if not reached:
        return []
    lost = []
    for index, node in enumerate(nodes):
        for rank in ranks_of(index, tasks_per_node):
            if rank not in reached and not statusfile.has_status(os.path.join(jobdir, f"node_{rank}")):
                reason = vanished_reason(node, rank)
                if lose(jobdir, nodes, tasks_per_node, node, "vanished", reason):
                    lost.append((node, reason))
                break
    return lost


def mark_lost(
    jobdir: str, nodes: Sequence[str], tasks_per_node: int, not_responding: bool = False
) -> list[tuple[str, str]]:
    """Record every node Slurm reports dead as lost; return the newly lost (node, reason) pairs.

    `not_responding` (the teardown's view: the job is ending, an unreachable node will not stage)
    also counts a node Slurm cannot reach but has not declared DOWN yet. The watch leaves it out: a
    missed ping during a run is not a failed node. A node the watch already found lost (lost.json,
    e.g. silent on the network) gets its ranks' lost status.json here too.
    """
    return lost_by_states(jobdir, nodes, tasks_per_node, slurm_node_states(nodes) or {}, not_responding)


def lost_by_states(
    jobdir: str, nodes: Sequence[str], tasks_per_node: int, states: dict[str, str], not_responding: bool
) -> list[tuple[str, str]]:
    lost = []
    known = lost_nodes.read(jobdir)
    for index, node in enumerate(nodes):
        state = states.get(node, "")
        if node in known:
            for rank in ranks_of(index, tasks_per_node):
                write_lost_status(jobdir, rank, node, "", str(known[node].get("reason", "")))
        elif state and is_bad_state(state, not_responding):
            reason = slurm_reason(node, state)
            if lose(jobdir, nodes, tasks_per_node, node, "slurm", reason):
                lost.append((node, reason))
    return lost


class Lookout:
    """The watch's round over the nodes: Slurm's word on each (DOWN, failed), then, with a reach port,
    which of them the batch host no longer reaches (slurm_multi.reach); each newly lost node is
    recorded (lost.json, its ranks' status.json) and returned with its reason."""

    def __init__(self, jobdir: str, nodes: Sequence[str], tasks_per_node: int, reach_port: int = 0) -> None:
        self.jobdir, self.nodes, self.tasks_per_node = jobdir, list(nodes), tasks_per_node
        self.reach_port = reach_port
        self.reach: Any = None

    def look(self, now: float) -> list[tuple[str, str]]:
        states = slurm_node_states(self.nodes)
        lost = lost_by_states(self.jobdir, self.nodes, self.tasks_per_node, states or {}, False)
        if self.reach_port:
            if self.reach is None:  # the names resolved once, at the first round
                from slurm_multi.reach import Reach

                here = socket.gethostname().split(".")[0]
                self.reach = Reach([n for n in self.nodes if n.split(".")[0] != here], self.reach_port)
            named = {node for node, _ in lost}
            for node, silent in self.reach.look(now, states is not None):
                reason = network_reason(node, silent)
                if node in named:
                    continue
                if lose(self.jobdir, self.nodes, self.tasks_per_node, node, "network", reason):
                    lost.append((node, reason))
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
    reach_port: int = 0,
) -> int:
    """Wait for the worker step; 0 when it ended, EXIT_STOP when a rank failed (or its node was lost)
    `peer_grace` ago. With `reach_port`, a node silent on the network is lost too (Lookout)."""
    ranks = len(nodes) * tasks_per_node
    ended = _exit_waiter(srun_pid)
    waker = Waker(wake_fd, jobdir, ranks)
    lookout = Lookout(jobdir, nodes, tasks_per_node, reach_port)
    try:
        return _watch(jobdir, lookout, ranks, srun_pid, peer_grace, progress_every, check_every,
                      node_check_every, ended, waker)  # fmt: skip
    finally:
        waker.close()


def _watch(
    jobdir: str,
    lookout: Lookout,
    ranks: int,
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
    # The nodes are looked at once at the start: a node is judged silent only once it has answered
    # the batch host (slurm_multi.reach), and a loss in the job's first seconds must count too.
    next_check, next_nodes, next_progress = now, now, now + progress_every
    while _alive(srun_pid):
        ended(0.1)  # type: ignore[operator]
        now = time.monotonic()
        waker.look(now)
        if stop_at is not None:
            if now >= stop_at:
                return EXIT_STOP
            continue
        if now >= next_nodes and lookout.nodes:
            lost = lookout.look(now)
            next_nodes = time.monotonic() + node_check_every
            if lost:
                talk("multi", f"{lost[0][1]}; the other nodes get {peer_grace:g} s before they are stopped")
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
