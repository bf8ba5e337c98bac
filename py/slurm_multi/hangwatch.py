"""The hang watch beside a node's workload (`slurm-multi node hang-watch …`, lib/run.sh).

A rank is hung when, for --timeout seconds after GO, its workload has printed no new output line
AND its processes have used no CPU time. Both signals are needed: a rank that is quiet but
computing, or chatty but idle, is not hung.

- Output: the size of the file the workload's output lands in (the node log).
- CPU: for a docker container, its cgroup's CPU usage (cgroup v1 cpuacct.usage or v2 cpu.stat);
  for a bare workload, the summed utime+stime of the watched process and its descendants; for a
  pyxis rank (a Slurm step of its own: its tasks are children of the step's slurmstepd on this
  node, not of the srun that started it), that of the slurmstepd's descendants.
  Less than CPU_BUSY_FRACTION of one core between two polls counts as no CPU: an idle runtime
  still ticks a little (timers, a keep-alive thread), and that is not progress.

One stuck rank soon makes every other rank wait in its collective, so several ranks go quiet
within moments of each other. When the timeout is reached the watch tells the cause from the
waiters by the processes' state: frozen (docker pause, cgroup freezer), stopped (SIGSTOP), in
uninterruptible sleep, spinning, or merely sleeping: a cause; every process asleep and a main
thread blocked in a socket or poll wait: a waiter; asleep with only helper threads in network waits
(every main thread on a lock or a condition): unclear, since a rank waiting in gloo and a rank
deadlocked on a lock while a helper polls look alike; collect makes it a waiter when another rank
is clearly the cause, and names it a suspect otherwise. A hang whose node failed under it (its
docker engine, local disk or clock: slurm_multi.nodefault) says so (`node_fault`): the node is bad,
not the workload. It then writes hang.json into the node dir, snapshots diagnostics (processes
with state and wait channel, kernel stacks where readable, open sockets, py-spy dumps when the
image has py-spy), and exits 3. The caller stops the workload. Every rank that speaks (a cause, a
waiter, an unclear one) first holds that stop (up to --hold seconds) until every other rank is
accounted for: stopping any rank ends the others' wait (their sockets close, they fail), and a
waiter whose own watch had not yet looked would be missing from the job's summary. Only a cause
announces itself (hang-cause.json), so that the others speak. While watching it writes
progress.json every --progress-every seconds: when this rank last printed and last used CPU.

Exit: 0 the workload ended (or never started), 3 hung, 2 bad arguments.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from slurm_multi import shell
from slurm_multi.events import write_event
from slurm_multi.statusfile import has_status

EXIT_HUNG = 3
CPU_BUSY_FRACTION = 0.02  # of one core, between two polls: below it, the processes are idle
# Until the workload's first line the watch looks again after FIRST_LOOK s, then after twice the
# last wait, up to --poll: `first_output` on the timeline is late by at most the time the
# workload had run before it (a 1-s poll put a toy's first line, printed 0.1 s in, at 1 s), and the
# batch step's warm helpers, woken by it, import before the workload's end.
FIRST_LOOK = 0.05
# Wait channels of a thread blocked on the network (a socket read, accept, poll/epoll/select).
SOCKET_WAITS = (
    "sk_wait_data", "wait_woken", "inet_csk_accept", "tcp_recvmsg", "unix_stream_read_generic",
    "ep_poll", "do_epoll_wait", "poll_schedule_timeout", "do_select", "do_sys_poll", "sock_",
)  # fmt: skip
INIT_COMMANDS = ("docker-init", "tini", "tini-static")  # docker run --init: not the workload
CAUSE_STATES = ("frozen", "stopped", "disk-sleep", "spinning", "sleeping")
ROLES = ("cause", "waiter", "unclear")  # unclear: a waiter if another rank is clearly the cause
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


# ---- processes -----------------------------------------------------------------------------------


@dataclass
class Thread:
    """One thread of the workload as /proc shows it (wchan is filled in later)."""

    pid: int
    tid: int
    state: str
    comm: str
    wchan: str = ""

    def as_dict(self) -> dict[str, Any]:
        """hang.json's `processes` entry: the fields in this order."""
        return asdict(self)


def _start_ticks(pid: int) -> str:
    """When `pid` started, in clock ticks since boot ("" when it is gone)."""
    parsed = _stat_fields(_read(f"/proc/{pid}/stat") or "")
    return parsed[1][19] if parsed and len(parsed[1]) > 19 else ""


def _stat_fields(text: str) -> tuple[str, list[str]] | None:
    """(comm, fields after comm) of a /proc/<pid>/stat line; comm may hold spaces and parens."""
    start, end = text.find("("), text.rfind(")")
    if start < 0 or end < start:
        return None
    return text[start + 1 : end], text[end + 2 :].split()


def all_parents() -> dict[int, int]:
    """pid -> ppid for every process on the host (one pass over /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parsed = _stat_fields(_read(f"/proc/{entry}/stat") or "")
            if parsed and len(parsed[1]) > 1:
                parents[int(entry)] = int(parsed[1][1])
    return parents


def process_tree(root: int) -> list[int]:
    """root and every descendant of it, root first."""
    parents = all_parents()
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in parents or pid == root:
            tree.append(pid)
            todo.extend(children.get(pid, []))
    return [pid for pid in tree if os.path.exists(f"/proc/{pid}")]


def tree_cpu_seconds(pids: Sequence[int]) -> float:
    """utime+stime (with waited-for children's) of these processes, in seconds."""
    total = 0
    for pid in pids:
        parsed = _stat_fields(_read(f"/proc/{pid}/stat") or "")
        if parsed and len(parsed[1]) > 14:
            fields = parsed[1]
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / CLK_TCK


def threads_of(pids: Sequence[int]) -> list[Thread]:
    threads = []
    for pid in pids:
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit())
        except OSError:
            continue
        for tid in tids:
            parsed = _stat_fields(_read(f"/proc/{pid}/task/{tid}/stat") or "")
            if not parsed or not parsed[1]:
                continue
            wchan = (_read(f"/proc/{pid}/task/{tid}/wchan") or "").strip()
            threads.append(Thread(pid, tid, parsed[1][0], parsed[0], "" if wchan == "0" else wchan))
    return threads


def merge_samples(samples: Sequence[Sequence[Thread]]) -> list[Thread]:
    """One view of the threads from several looks: a thread's state is the one it showed most often,
    except R, which must hold in every look. A waiter's thread is briefly runnable now and then (a
    wake-up, a keep-alive); that is not spinning, and its CPU time already said it is idle."""
    seen: dict[int, list[Thread]] = {}
    for sample in samples:
        for thread in sample:
            seen.setdefault(thread.tid, []).append(thread)
    merged = []
    for looks in seen.values():
        states = [t.state for t in looks]
        if len(looks) == len(samples) and all(state == "R" for state in states):
            best = "R"
        else:
            others = [state for state in states if state != "R"]
            best = max(sorted(set(others)), key=others.count) if others else "S"
        wchan = next((t.wchan for t in reversed(looks) if t.wchan), "")
        merged.append(Thread(looks[-1].pid, looks[-1].tid, best, looks[-1].comm, wchan))
    return sorted(merged, key=lambda t: (t.pid, t.tid))


def sampled_threads(target: Any, samples: int = 5, interval: float = 0.1) -> list[Thread]:
    looks = []
    for index in range(samples):
        if index:
            time.sleep(interval)
        looks.append(target.threads())
    return merge_samples(looks)


def classify(threads: Sequence[Thread], frozen: bool, frozen_detail: str = "") -> tuple[str, str, str]:
    """(role, state, detail) of a quiet rank from its workload threads' states and wait channels."""
    work = [t for t in threads if t.comm not in INIT_COMMANDS]
    if frozen:
        return "cause", "frozen", frozen_detail or "cgroup frozen"
    if not work:
        return "cause", "sleeping", "no workload process left"

    def names(states: str) -> str:
        picked = sorted({f"{t.comm}[{t.pid}]" for t in work if t.state in states})
        return ", ".join(picked[:5]) + (" …" if len(picked) > 5 else "")

    if any(t.state in "Tt" for t in work):
        return "cause", "stopped", f"SIGSTOP or a debugger: {names('Tt')}"
    if any(t.state == "D" for t in work):
        return "cause", "disk-sleep", f"uninterruptible sleep: {names('D')}"
    if any(t.state == "R" for t in work):
        return "cause", "spinning", f"running without CPU progress: {names('R')}"
    on_net = [t for t in work if t.wchan and any(w in t.wchan for w in SOCKET_WAITS)]
    waiting = sorted({t.wchan for t in on_net})
    if any(t.tid == t.pid for t in on_net):
        return "waiter", "socket-wait", "blocked in a socket wait (" + ", ".join(waiting[:3]) + ")"
    if waiting:
        # Only helper threads wait on the network; every main thread sleeps elsewhere (a lock, a
        # condition). That is a rank waiting in gloo (its main thread waits on the worker that waits
        # on the socket) or a rank deadlocked on a lock while a helper polls: not told apart from
        # here. Collect decides: a waiter when another rank is clearly the cause, else a suspect.
        mains = ", ".join(sorted({t.wchan or "?" for t in work if t.tid == t.pid and t not in on_net})[:3])
        helpers = ", ".join(waiting[:3])
        return (
            "unclear",
            "lock-wait",
            f"main thread asleep off the network ({mains}); helpers wait on it ({helpers})",
        )
    known = sorted({t.wchan for t in work if t.wchan})
    if known:
        return "cause", "sleeping", "asleep, not on the network (" + ", ".join(known[:3]) + ")"
    return "cause", "sleeping", "asleep (wait channels not readable here)"


# ---- what is watched -----------------------------------------------------------------------------


def _cgroup_mounts() -> dict[str, str]:
    """Mount point per cgroup v1 controller ('cpuacct', 'freezer') and 'unified' for cgroup v2."""
    mounts: dict[str, str] = {}
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or not rparts:
            continue
        if rparts[0] == "cgroup2":
            mounts.setdefault("unified", parts[4])
        elif rparts[0] == "cgroup" and len(rparts) > 2:
            for option in rparts[2].split(","):
                if option in ("cpuacct", "freezer"):
                    mounts.setdefault(option, parts[4])
    return mounts


def step_daemon(step: str) -> int:
    """The pid of this node's slurmstepd of `step` (JOB.STEP), 0 when there is none (yet)."""
    want = f"slurmstepd: [{step}]"
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            text = _read(f"/proc/{entry}/cmdline")
            if text and text.split("\0", 1)[0].strip() == want:
                return int(entry)
    return 0


class Target:
    """The workload: a docker container (by name), a process tree (by pid), or a Slurm step's tasks
    on this node (by JOB.STEP: the pyxis runtime)."""

    def __init__(self, container: str = "", pid: int = 0, step: str = "", docker: str = "docker") -> None:
        self.container, self.pid, self.step, self.docker = container, pid, step, docker
        self.init_pid = 0
        self.cgroup: dict[str, str] = {}  # controller -> path of its cgroup dir
        self.start_ticks = ""  # init_pid's start time (/proc stat field 22): a reused PID has another

    def start(self, wait_seconds: float, parent: int = 0) -> bool:
        """Find the container's init process (it may not have started yet); False if it never ran
        (or the process that started this watch went away meanwhile)."""
        deadline = time.monotonic() + wait_seconds
        if self.step:
            while time.monotonic() < deadline and (not parent or os.getppid() == parent):
                self.init_pid = step_daemon(self.step)
                if self.init_pid:
                    self.start_ticks = _start_ticks(self.init_pid)
                    return self.alive()
                time.sleep(0.2)
            return False
        if not self.container:
            self.init_pid = self.pid
            self.start_ticks = _start_ticks(self.pid)
            return self.alive()
        while time.monotonic() < deadline and (not parent or os.getppid() == parent):
            pid, running = self._state()
            if running and pid > 0:
                self.init_pid = pid
                self.start_ticks = _start_ticks(self.init_pid)
                self._find_cgroups()
                return True
            time.sleep(0.2)
        return False

    def _state(self) -> tuple[int, bool]:
        """The container's first PID and whether it runs: asked on the engine's socket (the docker
        CLI's start costs the node more CPU than the answer, just as the workload starts), else of
        the docker CLI (a tcp:// DOCKER_HOST, or another docker command given)."""
        if self.docker == "docker":
            from slurm_multi import dockerapi

            state = dockerapi.container_state(os.environ, self.container)
            if state is not None:
                return state
        fields = self._docker("inspect", "-f", "{{.State.Pid}} {{.State.Running}}", self.container).split()
        if len(fields) == 2 and fields[0].isdigit():
            return int(fields[0]), fields[1] == "true"
        return 0, False

    def _docker(self, *args: str, timeout: float = 10) -> str:
        import subprocess  # the CLI is the fallback (tcp://, --docker) and the diagnostics' only

        try:
            return subprocess.run(
                [self.docker, *args], capture_output=True, text=True, timeout=timeout, check=False
            ).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def _find_cgroups(self) -> None:
        mounts = _cgroup_mounts()
        for line in (_read(f"/proc/{self.init_pid}/cgroup") or "").splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            controllers, path = parts[1].split(","), parts[2]
            if parts[0] == "0" and parts[1] == "" and "unified" in mounts:
                self.cgroup.setdefault("unified", mounts["unified"] + path)
            for name in ("cpuacct", "freezer"):
                if name in controllers and name in mounts:
                    self.cgroup.setdefault(name, mounts[name] + path)

    def alive(self) -> bool:
        """The workload's first process exists and has not exited (a zombie counts as ended), and
        it is still the process that started (not another that got its PID)."""
        parsed = _stat_fields(_read(f"/proc/{self.init_pid}/stat") or "") if self.init_pid > 0 else None
        if not (parsed and len(parsed[1]) > 19 and parsed[1][0] not in ("Z", "X")):
            return False
        return not self.start_ticks or parsed[1][19] == self.start_ticks

    def pids(self) -> list[int]:
        """The workload's processes: the tree under its first process (a step: under its slurmstepd,
        which is Slurm's, not the workload)."""
        if not self.init_pid:
            return []
        tree = process_tree(self.init_pid)
        return tree[1:] if self.step else tree

    def cpu_seconds(self) -> float:
        """The workload's CPU time so far: its cgroup's, else its process tree's."""
        if "cpuacct" in self.cgroup:
            text = _read(os.path.join(self.cgroup["cpuacct"], "cpuacct.usage"))
            if text and text.strip().isdigit():
                return int(text) / 1e9
        if "unified" in self.cgroup:
            usage = _line_value(_read(os.path.join(self.cgroup["unified"], "cpu.stat")), "usage_usec ")
            if _whole(usage):
                return int(usage) / 1e6
        return tree_cpu_seconds(self.pids())

    def frozen(self) -> tuple[bool, str]:
        if "freezer" in self.cgroup:
            state = (_read(os.path.join(self.cgroup["freezer"], "freezer.state")) or "").strip()
            if state in ("FROZEN", "FREEZING"):
                return True, f"cgroup freezer {state}" + (" (docker pause)" if self.container else "")
        if "unified" in self.cgroup and _line_value(
            _read(os.path.join(self.cgroup["unified"], "cgroup.events")), "frozen "
        ).startswith("1"):
            return True, "cgroup frozen" + (" (docker pause)" if self.container else "")
        if (
            self.container
            and self._docker("inspect", "-f", "{{.State.Paused}}", self.container).strip() == "true"
        ):
            return True, "docker pause"
        return False, ""

    def threads(self) -> list[Thread]:
        threads = threads_of(self.pids())
        if self.container and any(not t.wchan for t in threads):
            # Container processes belong to another user: their wait channels are readable to the
            # docker daemon (root), so ask it, as `docker top` runs ps there.
            wchans = {}
            for line in self._docker("top", self.container, "-eLo", "pid,lwp,wchan:40").splitlines()[1:]:
                fields = line.split()
                if len(fields) >= 3 and fields[1].isdigit():
                    wchans[int(fields[1])] = "" if fields[2] in ("-", "0") else fields[2]
            for thread in threads:
                thread.wchan = thread.wchan or wchans.get(thread.tid, "")
        return threads


# ---- the watch -----------------------------------------------------------------------------------


class Progress:
    __slots__ = ("started", "last_output", "last_cpu", "output_size", "cpu", "printed")

    def __init__(
        self, started: float, last_output: float, last_cpu: float, output_size: int, cpu: float,
        printed: bool = False,
    ) -> None:  # fmt: skip
        self.started, self.last_output, self.last_cpu = started, last_output, last_cpu
        self.output_size, self.cpu = output_size, cpu
        self.printed = printed  # the workload's first output line is on the timeline

    @property
    def last(self) -> float:
        return max(self.last_output, self.last_cpu)


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def write_json(path: str, document: dict[str, Any]) -> None:
    """shell.write_json (atomic; its temp file goes also when a SIGTERM comes mid-write), but a
    progress record that cannot be written (shared storage gone) never stops the watch."""
    try:
        shell.write_json(path, document)
    except OSError:
        pass


CAUSE_FILE = "hang-cause.json"  # in the job dir: a cause's watch says it was found (its hold)


class Peers(NamedTuple):
    """The other ranks of the job, as a cause's hold reads them (`<job_dir>/node_<r>/`), and the
    cause's word to them (`<job_dir>/hang-cause.json`): a waiter then speaks at once instead of at
    its own timeout, which a CPU blip of its runtime may have pushed past the hold."""

    job_dir: str
    ranks: int
    hold: float

    @property
    def cause_file(self) -> str:
        return os.path.join(self.job_dir, CAUSE_FILE)

    def announce(self, hang: dict[str, Any]) -> None:
        """The cause's watch, before its hold: which rank was found hung, and when."""
        write_json(self.cause_file, {"rank": hang["rank"], "node": hang["node"],
                                     "detected_epoch": hang["detected_epoch"]})  # fmt: skip

    def cause(self, rank: int, since: float) -> dict[str, Any] | None:
        """Another rank's announcement made after `since` (this watch's start: an earlier one is a
        requeued attempt's, which job::keep_attempt moves away anyway), else None. One open per
        poll, which fails while no rank is hung. Only a regular file of this job's user counts
        (O_NOFOLLOW|O_NONBLOCK, then fstat): one somebody else put in the job dir makes no rank stop."""
        try:
            fd = os.open(self.cause_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                info = os.fstat(fd)
                if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                    return None
                record = json.loads(os.read(fd, 1 << 16))
            finally:
                os.close(fd)
            other, detected = int(record["rank"]), float(record["detected_epoch"])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            return None
        if other == rank or detected < since:
            return None
        return {"rank": other, "node": str(record.get("node", "")), "detected_epoch": detected}

    def accounted(self, rank: int, since: float) -> bool:
        """Rank's watch has spoken (hang.json), its run ended (status.json), or its progress record
        shows output or CPU after `since` (it is not waiting on the cause)."""
        node_dir = os.path.join(self.job_dir, f"node_{rank}")
        if os.path.exists(os.path.join(node_dir, "hang.json")) or has_status(node_dir):
            return True
        try:
            with open(os.path.join(node_dir, "progress.json"), encoding="utf-8") as handle:
                record = json.loads(handle.read())
            moved = max(float(record["last_output_epoch"]), float(record["last_cpu_epoch"]))
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return False
        return moved > since

    def hold_stop(self, rank: int, since: float, poll: float, clock: Any = time.time) -> list[int]:
        """Wait until every other rank is accounted for, at most `hold` seconds; the ranks that
        were not. A SIGTERM (the job is being stopped anyway) ends the wait."""
        pending = [other for other in range(self.ranks) if other != rank]
        deadline = clock() + self.hold
        try:
            while True:
                pending = [other for other in pending if not self.accounted(other, since)]
                if not pending or clock() >= deadline:
                    return pending
                time.sleep(max(0.0, min(poll, deadline - clock())))
        except Stopped:
            return pending


class Stopped(Exception):
    """SIGTERM from the run stage: the workload ended; leave the last progress record and go."""


def watch(
    target: Target,
    output: str,
    timeout: float,
    node_dir: str,
    rank: int,
    node: str,
    poll: float = 1.0,
    progress_every: float = 5.0,
    diagnostics: str = "",
    start_wait: float = 120.0,
    clock: Any = time.time,
    peers: Peers | None = None,
    node_check: Callable[[], str] | None = None,
) -> int:
    """Watch until the workload ends (0) or is hung (EXIT_HUNG, hang.json written). `node_check`
    (slurm_multi.nodefault.NodeCheck) names this node's own fault, if any, when the rank is hung."""
    try:
        started = target.start(start_wait, parent=os.getppid())
    except Stopped:
        started = False
    if not started:
        # Ended before it could be watched (a short run): its output's last write is its progress.
        try:
            moved = os.stat(output).st_mtime
        except OSError:
            return 0
        write_json(os.path.join(node_dir, "progress.json"),
                   progress_document(Progress(moved, moved, moved, 0, 0.0), rank, node, clock()))  # fmt: skip
        return 0
    now = clock()
    state = Progress(now, now, now, _file_size(output), target.cpu_seconds())
    last_poll, next_progress = now, now
    parent = os.getppid()
    try:
        return _watch_loop(target, state, output, timeout, node_dir, rank, node, poll, progress_every,
                           diagnostics, clock, parent, last_poll, next_progress, peers,
                           node_check)  # fmt: skip
    except Stopped:
        pass
    # The workload ended: its last word on progress (a short run ends before the first write).
    if _file_size(output) != state.output_size:
        state.last_output = clock()
    write_json(os.path.join(node_dir, "progress.json"), progress_document(state, rank, node, clock()))
    return 0


def _watch_loop(
    target: Target, state: Progress, output: str, timeout: float, node_dir: str, rank: int, node: str,
    poll: float, progress_every: float, diagnostics: str, clock: Any, parent: int, last_poll: float,
    next_progress: float, peers: Peers | None = None, node_check: Callable[[], str] | None = None,
) -> int:  # fmt: skip
    wait = min(poll, FIRST_LOOK)
    while target.alive():
        time.sleep(wait)
        if os.getppid() != parent:
            return 0  # the run stage that started us is gone: nobody would act on a hang
        now = clock()
        size, cpu = _file_size(output), target.cpu_seconds()
        if size != state.output_size:
            if not state.printed:
                state.printed = True
                write_event(node_dir, "first_output", now, rank=rank, host=node)  # never fails
            state.output_size, state.last_output = size, now
        wait = poll if state.printed else min(poll, 2 * wait)
        if cpu - state.cpu > CPU_BUSY_FRACTION * max(now - last_poll, 1e-3):
            state.last_cpu = now
        state.cpu, last_poll = cpu, now
        # Another rank was found hung: this one says at once whether it waits on it (quiet for a
        # few polls), or shows that it moves (its progress record now, not at the next write).
        cause = peers.cause(rank, state.started) if peers and peers.ranks > 1 else None
        if cause and now - state.last < peer_quiet(timeout, poll):
            next_progress = now
            cause = None
        if now >= next_progress:
            next_progress = now + progress_every
            write_json(os.path.join(node_dir, "progress.json"), progress_document(state, rank, node, now))
        if (cause or now - state.last >= timeout) and target.alive():
            hang = hang_document(target, state, rank, node, timeout, now)
            if not target.alive():
                break  # it ended while it was looked at: an ending, not a hang
            if cause:
                hang["spoke_for"] = cause  # before its own timeout: rank N was found hung
            fault = node_check() if node_check is not None else ""
            if fault:
                hang["node_fault"] = fault  # the node's, not the workload's: its node is bad
            write_json(os.path.join(node_dir, "hang.json"), hang)
            write_json(os.path.join(node_dir, "progress.json"), progress_document(state, rank, node, now))
            if diagnostics:
                snapshot(target, hang, diagnostics)
            if peers and peers.ranks > 1 and peers.hold > 0:
                if hang["role"] == "cause" and not cause:
                    peers.announce(hang)
                # Any rank's stop ends the others' wait (its sockets close, theirs fail and use
                # CPU): a waiter stopped at once made a quiet rank that had not looked yet move,
                # and it went unlisted. Nobody stops before the others are accounted for.
                held = clock()
                hang["peers_unaccounted"] = peers.hold_stop(rank, now, poll, clock)
                hang["held_seconds"] = round(clock() - held, 1)
                write_json(os.path.join(node_dir, "hang.json"), hang)
            print(hang["state"], hang_line(hang), flush=True)  # the caller reads: STATE LINE
            return EXIT_HUNG
    raise Stopped


def peer_quiet(timeout: float, poll: float) -> float:
    """How long a rank must have been quiet to say it waits on a cause another rank announced:
    three polls (at least 2 s), never more than the timeout itself."""
    return min(timeout, max(2.0, 3 * poll))


def progress_document(state: Progress, rank: int, node: str, now: float) -> dict[str, Any]:
    return {
        "rank": rank, "node": node, "last_output_epoch": round(state.last_output, 3),
        "last_cpu_epoch": round(state.last_cpu, 3), "cpu_seconds": round(state.cpu, 3),
        "updated_epoch": round(now, 3),
    }  # fmt: skip


def hang_document(
    target: Target, state: Progress, rank: int, node: str, timeout: float, now: float
) -> dict[str, Any]:
    frozen, frozen_detail = target.frozen()
    threads = sampled_threads(target)
    role, kind, detail = classify(threads, frozen, frozen_detail)
    return {
        "rank": rank, "node": node, "role": role, "state": kind, "detail": detail,
        "quiet_seconds": round(now - state.last, 1), "last_output_epoch": round(state.last_output, 3),
        "last_cpu_epoch": round(state.last_cpu, 3), "last_progress_epoch": round(state.last, 3),
        "detected_epoch": round(now, 3), "hang_timeout": timeout,
        "processes": [thread.as_dict() for thread in threads[:200]],
    }  # fmt: skip


def hang_line(hang: dict[str, Any]) -> str:
    """The one line the caller logs and puts in status.json's reason."""
    since = time.strftime("%H:%M:%S", time.gmtime(hang["last_progress_epoch"]))
    quiet = f"no output and no CPU for {hang['quiet_seconds']:.0f} s since {since}"
    if hang.get("node_fault"):
        return f"hung because its node failed: {hang['node_fault']} ({quiet})"
    if hang["role"] == "waiter":
        return f"waiting on another rank: {quiet} ({hang['state']}: {hang['detail']})"
    if hang["role"] == "unclear":
        return (
            f"hung or waiting on another rank (not told apart): {quiet} ({hang['state']}: {hang['detail']})"
        )
    return f"hung: {quiet} ({hang['state']}: {hang['detail']})"


# ---- diagnostics ---------------------------------------------------------------------------------


def snapshot(target: Target, hang: dict[str, Any], directory: str) -> None:
    """Processes with state and wait channel, kernel stacks where readable, sockets, py-spy."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return
    lines = [f"{'PID':>8} {'TID':>8} S {'WCHAN':<32} COMMAND"]
    lines += [
        f"{p['pid']:>8} {p['tid']:>8} {p['state']} {p['wchan'] or '-':<32} {p['comm']}"
        for p in hang["processes"]
    ]
    _write(directory, "hang-processes.txt", "\n".join(lines) + "\n")
    # Read from the host as the job's user, never by running the container's own binaries with
    # extra privilege: a workload that hangs on purpose could have replaced them.
    stacks = []
    for pid in sorted({p["pid"] for p in hang["processes"]})[:32]:
        stack = _read(f"/proc/{pid}/stack")
        stacks.append(
            f"== pid {pid} ({_comm(pid)})\n{stack if stack else '(not readable here: needs CAP_SYS_ADMIN)'}"
        )
    _write(directory, "kernel-stacks.txt", "\n".join(stacks) + "\n")
    _write(directory, "sockets.txt", _run(["ss", "-tanp"]) or "(ss not available)\n")
    if target.container:
        found = target._docker("exec", target.container, "sh", "-c", "command -v py-spy", timeout=5).strip()
        if found:
            dumps = []
            for pid in sorted({p["pid"] for p in hang["processes"] if "python" in p["comm"]})[:8]:
                inner = _inner_pid(pid) or pid
                # The container's py-spy with the container's own privileges, no more.
                argv = ("exec", target.container, found, "dump", "--pid", str(inner))
                dumps.append(f"== pid {pid}\n" + target._docker(*argv, timeout=20))
            _write(directory, "py-spy.txt", "\n".join(dumps) + "\n")
    else:
        spy = _run(["sh", "-c", "command -v py-spy"]).strip()
        if spy:
            pids = sorted({p["pid"] for p in hang["processes"] if "python" in p["comm"]})[:8]
            _write(
                directory, "py-spy.txt", "\n".join(_run([spy, "dump", "--pid", str(p)]) for p in pids) + "\n"
            )


def _line_value(text: str | None, key: str) -> str:
    """What follows `key` on the first line of `text` that starts with it ("" when none): a
    cgroup's `usage_usec 123`, /proc's `NSpid:\t4242\t7`."""
    at = -1 if text is None else (0 if text.startswith(key) else text.find("\n" + key) + 1 or -1)
    return "" if at < 0 else text[at + len(key) :].split("\n", 1)[0].strip()


def _whole(text: str) -> bool:
    """ASCII digits only, at least one (str.isdigit alone takes ² and ٣)."""
    return text.isascii() and text.isdigit()


def _inner_pid(pid: int) -> int:
    inner = _line_value(_read(f"/proc/{pid}/status"), "NSpid:").split()
    return int(inner[-1]) if inner and _whole(inner[-1]) else 0


def _comm(pid: int) -> str:
    return (_read(f"/proc/{pid}/comm") or "?").strip()


def _run(argv: Sequence[str]) -> str:
    import subprocess  # only for the diagnostics of a hang

    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _write(directory: str, name: str, text: str) -> None:
    try:
        with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError:
        pass


def check_arguments(
    container: str | None, pid: int | None, step: str | None, timeout: float, poll: float, ranks: int
) -> None:
    """`node hang-watch`'s checks click cannot say: exactly one target, positive times, a JOB.STEP step."""
    from slurm_multi.common import usage_error

    given = [
        name for name, value in (("container", container), ("pid", pid), ("step", step)) if value is not None
    ]
    if len(given) != 1:
        raise usage_error("hangwatch: give exactly one of --container, --pid, --step")
    if timeout <= 0 or poll <= 0 or ranks < 1:
        raise usage_error("hangwatch: --timeout and --poll must be positive, --ranks at least 1")
    job, dot, number = (step or "").partition(".")
    if step is not None and not (dot and _whole(job) and _whole(number)):
        raise usage_error(f"hangwatch: --step {step!r}: expected JOB.STEP, e.g. 4242.3")


def run_until_stopped(
    target: Target,
    output: str,
    timeout: float,
    node_dir: str,
    rank: int,
    node: str,
    poll: float,
    progress_every: float,
    diagnostics: str,
    peers: Peers | None,
    node_check: Callable[[], str] | None = None,
) -> int:
    """`watch` as the run stage runs it: its SIGTERM (the workload ended) ends the watch with exit 0
    and not a word on stderr. That SIGTERM can come after the watch has returned, while the
    interpreter shuts down, where Stopped printed a traceback into the node log (an error pattern: a
    SUCCESS job judged FAILURE, 1 run in ~70 e2e jobs): from the return on, SIGTERM is ignored."""
    import signal

    def stop(*_: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one Stopped, however many SIGTERMs
        raise Stopped

    signal.signal(signal.SIGTERM, stop)
    try:
        return watch(target, output, timeout, node_dir, rank, node, poll, progress_every, diagnostics,
                     peers=peers, node_check=node_check)  # fmt: skip
    except (Stopped, KeyboardInterrupt):
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
