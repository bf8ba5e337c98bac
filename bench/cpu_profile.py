"""Where a cluster bench run's CPU goes: every process's CPU seconds on the test cluster, by role.

    cpu_profile.py start DIR [--max-seconds N]   # begin recording (returns once it records)
    ... the measured thing (a job, a hand-written pipeline) ...
    cpu_profile.py stop DIR --out FILE.json [--source-node node1] [--root PID] [--job-nodes LIST]
    cpu_profile.py off DIR                        # cleanup: stop a recorder left running

The recorder is one background process. It turns on the kernel's process accounting (acct(2), root
only) into DIR/acct, so every process that exits while it records leaves its exact CPU time, and it
polls /proc every 50 ms for the argv and the node (the network namespace of that node's slurmd) of the
processes it sees. Processes alive at both ends (dockerd, containerd) count their CPU delta. Only
processes in a test-cluster node's namespaces count (a job's steps, `tests/cluster/exec`): other
work on the host is left out. Without acct (not root) the poll alone undercounts short processes;
the summary says so.

The summary (`--out`) holds the CPU seconds by role -- save (the source node's dockerd and
containerd and the `docker save` CLI), relay (each `slurm-multi relay` process), load (the other
nodes' daemons and `docker load` CLIs), tee, other python helpers, other -- plus the machine's busy
CPU seconds from /proc/stat over the same window and each long process's wall time.

For a job it also splits the CPU at the container: a workload container's own processes (everything
below its containerd-shim but runc) against everything else, by node (`job_cpu_s_by_node`). With
`--root PID`, host processes below PID (a batch step run on the host by salloc, and its srun) count
as node `batch`: on a real cluster the batch step runs on the job's first node. With `--job-nodes
node1,node2` the other nodes' processes (idle engines) count as the host's, outside the job.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import struct
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
ACCT_V3 = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")  # struct acct_v3, linux/acct.h: 64 bytes
POLL_S = 0.05
RECHECK_TICKS = 6  # re-read a new process's argv and namespace this often: it may exec or setns
ROLES = ("save", "relay", "load", "tee", "python", "other")
WORD_RE = re.compile(r"[a-z][a-z_.]*")  # a helper's area or command (not a path, a job id, an option)


# --------------------------------------------------------------------------------------------------
# /proc and acct(2)


def read_stat(pid: int | str) -> tuple[str, int, int, float] | None:
    """(comm, ppid, starttime ticks, utime+stime seconds) of a live pid, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    right = data.rfind(b")")
    comm = data[data.find(b"(") + 1 : right].decode(errors="replace")
    fields = data[right + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, starttime 22.
    return comm, int(fields[1]), int(fields[19]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def read_argv(pid: int | str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def read_netns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def machine_times() -> dict[str, float]:
    """CPU seconds since boot by kind, all CPUs together (the `cpu` line of /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as handle:
        values = [int(v) / CLK_TCK for v in handle.readline().split()[1:]]
    return dict(zip(STAT_FIELDS, values + [0.0] * len(STAT_FIELDS)))


def busy_of(times: Mapping[str, float]) -> float:
    return sum(value for key, value in times.items() if key not in ("idle", "iowait"))


def node_namespaces(state: Path) -> dict[str, str]:
    """Network namespace -> node name, from each node's slurmd pid file (tests/cluster/lib.sh's layout)."""
    found: dict[str, str] = {}
    for pidfile in sorted(state.glob("*/slurmd.pid")):
        try:
            ns = read_netns(int(pidfile.read_text().strip()))
        except (OSError, ValueError):
            continue
        if ns:
            found[ns] = pidfile.parent.name
    return found


def comp_t(value: int) -> int:
    """The kernel's comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (((value >> 13) & 7) * 3)


def parse_acct(data: bytes) -> list[dict[str, Any]]:
    """acct_v3 records: pid, ppid, comm, start (epoch s), wall and CPU seconds. Others are skipped."""
    records = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        fields = ACCT_V3.unpack_from(data, offset)
        if fields[1] & 0x0F != 3:  # ac_version
            continue
        pid, ppid, btime, etime, utime, stime = fields[6:12]
        records.append(
            {
                "pid": pid,
                "ppid": ppid,
                "comm": fields[18].split(b"\0")[0].decode(errors="replace"),
                "start": float(btime),
                "wall_s": etime / 100.0,  # AHZ: the kernel writes etime and comp_t times in 1/100 s
                "cpu_s": (comp_t(utime) + comp_t(stime)) / 100.0,
            }
        )
    return records


def set_acct(path: str | None) -> bool:
    """Process accounting on into PATH (None: off). False when the kernel refuses (not root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.acct(None if path is None else os.fsencode(path)) == 0


# --------------------------------------------------------------------------------------------------
# the recorder


class Recorder:
    """Polls /proc: every process it sees, with its latest argv, node and CPU."""

    def __init__(self, namespaces: Mapping[str, str]) -> None:
        self.namespaces = dict(namespaces)
        self.procs: dict[str, dict[str, Any]] = {}  # "pid:starttime" -> what is known
        self.young: dict[str, int] = {}
        self.boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])

    def _look(self, pid: str, first: bool) -> None:
        stat = read_stat(pid)
        if stat is None:
            return
        comm, ppid, start, cpu = stat
        key = f"{pid}:{start}"
        entry = self.procs.get(key)
        if entry is None:
            entry = self.procs[key] = {
                "pid": int(pid),
                "start": self.boot + start / CLK_TCK,
                "cpu_at_start": cpu if first else 0.0,
                "alive_at_start": first,
            }
            self.young[key] = RECHECK_TICKS
        entry.update(comm=comm, ppid=ppid, cpu_last=cpu, seen_last=time.time())
        if key in self.young:
            entry["argv"] = read_argv(pid) or entry.get("argv", [])
            entry["node"] = self.namespaces.get(read_netns(pid) or "", "host")
            self.young[key] -= 1
            if self.young[key] <= 0:
                del self.young[key]

    def snapshot(self, first: bool = False, everyone: bool = False) -> None:
        """Look at new processes (and young ones again); with `everyone`, at every process."""
        live = {key.split(":")[0] for key in self.procs}
        young = {key.split(":")[0] for key in self.young}
        for name in os.listdir("/proc"):
            if name.isdigit() and (first or everyone or name not in live or name in young):
                self._look(name, first)

    def finish(self) -> None:
        """Last CPU reading of every process still alive."""
        now = time.time()
        for key, entry in list(self.procs.items()):
            stat = read_stat(entry["pid"])
            if stat is not None and f"{entry['pid']}:{stat[2]}" == key:
                entry.update(cpu_last=stat[3], alive_at_end=True, seen_last=now)


def record(directory: Path, max_seconds: float, state: Path, use_acct: bool = True) -> int:
    """The background recorder: acct on, poll until SIGTERM (or max_seconds), acct off, write."""
    stop = False

    def on_term(_signo: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    acct_file = directory / "acct"
    acct_file.write_bytes(b"")
    acct_on = use_acct and set_acct(str(acct_file))
    try:
        recorder = Recorder(node_namespaces(state))
        times0 = machine_times()
        started = time.time()
        recorder.snapshot(first=True)
        (directory / "started").write_text(f"{started}\n")
        deadline = time.monotonic() + max_seconds
        tick = 0
        while not stop and time.monotonic() < deadline:
            time.sleep(POLL_S)
            tick += 1
            # Without acct an exited process keeps its last reading: refresh everyone twice a second.
            recorder.snapshot(everyone=not acct_on and tick % 10 == 0)
        recorder.finish()
        times1 = machine_times()
        ended = time.time()
    finally:
        if acct_on:
            set_acct(None)
    doc = {
        "started": started,
        "ended": ended,
        "acct": acct_on,
        "machine_s": {key: times1[key] - times0[key] for key in STAT_FIELDS},
        "procs": list(recorder.procs.values()),
    }
    temp = directory / ".procs.json.tmp"
    temp.write_text(json.dumps(doc))
    os.replace(temp, directory / "procs.json")
    return 0


# --------------------------------------------------------------------------------------------------
# attribution


def role_of(comm: str, argv: list[str], node: str, source_node: str, parent: str = "") -> str:
    """Which part of an image transport a process is: save, relay, load, tee, python or other.

    The docker engine's work (dockerd, containerd, and dockerd's re-executed children such as
    docker-untar, comm `exe`) is the save on the source node and a load on every other node."""
    words = set(argv)
    daemon = comm in ("dockerd", "containerd") or comm.startswith("containerd")
    if daemon or (parent == "dockerd" and (comm == "exe" or argv[:1] == ["docker-untar"])):
        return "save" if node == source_node else "load"
    if comm == "docker":
        if "save" in words:
            return "save"
        if "load" in words:
            return "load"
        return "other"
    if comm == "tee":
        return "tee"
    if comm.startswith("python") or any(a.endswith(("/python", "/python3")) for a in argv[:1]):
        return "relay" if "relay" in words and ("send" in words or "recv" in words) else "python"
    return "other"


def label_of(comm: str, argv: list[str]) -> str:
    """A short name for a process: `docker load`, `slurm-multi relay recv`, `python barrier`, `bash`."""
    if argv[:1] == ["docker-untar"] or comm == "exe":
        return "dockerd: docker-untar" if argv[:1] == ["docker-untar"] else "dockerd: exe"
    if comm == "docker" and len(argv) > 1:
        verbs = [a for a in argv[1:] if not a.startswith("-")][:2]
        return "docker " + " ".join(verbs)
    if "slurm_multi" in argv:  # python -m slurm_multi AREA COMMAND ...
        verbs = [a for a in argv[argv.index("slurm_multi") + 1 :] if WORD_RE.fullmatch(a)][:2]
        return " ".join(["slurm-multi", *verbs])
    module = next((a for a in argv if a.startswith("slurm_multi.")), "")
    if module:  # a module entry of an older tree (python -m slurm_multi.warm statusfile)
        verbs = [a for a in argv[argv.index(module) + 1 :] if WORD_RE.fullmatch(a)][:1]
        return " ".join(["python -m", module, *verbs])
    return comm


def attribute(
    doc: Mapping[str, Any],
    acct: Iterable[Mapping[str, Any]],
    source_node: str,
    root: int | None = None,
    job_nodes: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """One entry per process that ran on a cluster node while recording: node, role, CPU and wall,
    and whether it is a workload container's own process.

    Exited processes take their CPU from acct (exact); live ones from the last poll; a process alive
    at the start counts only what it used since. A process the poll never saw inherits its node and
    argv-less name from its parent (acct gives the ppid and the 16-byte comm). With `root`, a host
    process below that pid is on node `batch`; with `job_nodes`, the other nodes' processes count
    as the host's (not measured)."""
    only = set(job_nodes)
    seen = {entry["pid"]: entry for entry in doc["procs"]}
    started, ended = doc["started"], doc["ended"]
    acct_by_pid: dict[int, Mapping[str, Any]] = {}
    for rec in acct:
        polled = seen.get(rec["pid"])
        if polled is not None and abs(polled["start"] - rec["start"]) > 2.0:
            polled = None
        acct_by_pid[rec["pid"]] = rec
        if polled is None:
            seen.setdefault(
                rec["pid"],
                {"pid": rec["pid"], "ppid": rec["ppid"], "comm": rec["comm"], "argv": [], "node": None,
                 "start": rec["start"], "cpu_at_start": 0.0, "alive_at_start": False},
            )  # fmt: skip

    def node_of(pid: int, depth: int = 0) -> str:
        entry = seen.get(pid)
        if entry is None or depth > 64:
            return "host"
        if entry.get("node"):
            return str(entry["node"])
        return node_of(int(entry.get("ppid", 0)), depth + 1)

    def ancestors(pid: int) -> list[tuple[int, str]]:
        """(pid, comm) of each parent, nearest first (as far as the recording knows them)."""
        chain: list[tuple[int, str]] = []
        entry = seen.get(int(seen.get(pid, {}).get("ppid", 0)))
        while entry is not None and len(chain) < 64:
            chain.append((int(entry["pid"]), str(entry.get("comm", ""))))
            entry = seen.get(int(entry.get("ppid", 0)))
        return chain

    def in_container(pid: int, comm: str) -> bool:
        # The shim is the runtime; runc (create, init before its exec, delete) is too: both sides
        # of a job pay them. What the shim runs once runc is done is the workload's.
        if comm.startswith("runc"):
            return False
        return any(name.startswith("containerd-shim") for _, name in ancestors(pid))

    out = []
    for pid, entry in seen.items():
        rec = acct_by_pid.get(pid)
        if rec is not None and abs(entry["start"] - rec["start"]) <= 2.0:
            cpu, wall, comm = rec["cpu_s"], rec["wall_s"], rec["comm"] or entry.get("comm", "")
            exited = True
        else:
            cpu, wall, comm = entry.get("cpu_last", 0.0), None, entry.get("comm", "")
            exited = False
        if entry.get("alive_at_start"):
            cpu -= entry.get("cpu_at_start", 0.0)
            if not exited and not entry.get("alive_at_end"):
                continue  # gone without an acct record: nothing reliable to add
        elif not exited and not entry.get("alive_at_end"):
            # Seen by the poll, exited, but no acct record (no acct, or not root): its last poll.
            pass
        node = node_of(pid)
        if root is not None and node == "host" and (pid == root or root in dict(ancestors(pid))):
            node = "batch"
        elif only and node not in only:
            node = "host"
        if cpu < 0:
            continue
        if wall is None:
            wall = max(0.0, min(ended, entry.get("seen_last", ended)) - max(started, entry["start"]))
        argv = list(entry.get("argv") or [])
        parent = str(seen.get(int(entry.get("ppid", 0)), {}).get("comm", ""))
        out.append(
            {
                "pid": pid,
                "node": node,
                "comm": comm,
                "label": label_of(comm, argv),
                "role": "host" if node == "host" else role_of(comm, argv, node, source_node, parent),
                "cpu_s": round(cpu, 3),
                "wall_s": round(wall, 3),
                "container": node != "host" and in_container(pid, comm),
            }
        )
    return out


def summarize(everything: list[dict[str, Any]], doc: Mapping[str, Any]) -> dict[str, Any]:
    """CPU seconds by role, by role and node, and the biggest processes; the machine's busy time.

    Processes on the host (not in a node's namespaces: the bench itself, slurmctld, and whatever
    else this machine runs meanwhile) count apart, in host_cpu_s; what no process was charged
    (interrupts, the network stack's softirqs) is the machine's busy time minus both."""
    procs = [proc for proc in everything if proc["role"] != "host"]
    host = [proc for proc in everything if proc["role"] == "host"]
    by_role = {role: 0.0 for role in ROLES}
    by_node_role: dict[str, float] = {}
    for proc in procs:
        by_role[proc["role"]] += proc["cpu_s"]
        key = f"{proc['role']}@{proc['node']}"
        by_node_role[key] = by_node_role.get(key, 0.0) + proc["cpu_s"]
    top = sorted(procs, key=lambda p: p["cpu_s"], reverse=True)[:12]
    host_by_label: dict[str, float] = {}
    for proc in host:
        host_by_label[proc["label"]] = host_by_label.get(proc["label"], 0.0) + proc["cpu_s"]
    machine = doc["machine_s"]
    total, host_total = sum(p["cpu_s"] for p in procs), sum(p["cpu_s"] for p in host)
    outside = [proc for proc in procs if not proc.get("container")]
    job_by_node: dict[str, float] = {}
    job_by_label: dict[str, float] = {}
    for proc in outside:
        job_by_node[proc["node"]] = job_by_node.get(proc["node"], 0.0) + proc["cpu_s"]
        job_by_label[proc["label"]] = job_by_label.get(proc["label"], 0.0) + proc["cpu_s"]
    return {
        "window_s": round(doc["ended"] - doc["started"], 3),
        "acct": bool(doc["acct"]),
        "machine_busy_s": round(busy_of(machine), 3),
        "machine_s": {key: round(value, 3) for key, value in machine.items()},
        "total_cpu_s": round(total, 3),
        "host_cpu_s": round(host_total, 3),
        "unattributed_s": round(busy_of(machine) - total - host_total, 3),
        "host_top": {
            label: round(value, 3)
            for label, value in sorted(host_by_label.items(), key=lambda kv: kv[1], reverse=True)[:6]
        },
        "cpu_s": {role: round(value, 3) for role, value in by_role.items()},
        "cpu_s_by_node": {key: round(value, 3) for key, value in sorted(by_node_role.items())},
        "container_cpu_s": round(sum(p["cpu_s"] for p in procs if p.get("container")), 3),
        "job_cpu_s_by_node": {key: round(value, 3) for key, value in sorted(job_by_node.items())},
        "job_by_label": top_labels(job_by_label),
        "processes": len(procs),
        "top": [
            {k: p[k] for k in ("label", "node", "role", "cpu_s", "wall_s")} for p in top if p["cpu_s"] > 0
        ],
    }


def top_labels(by_label: Mapping[str, float], count: int = 10) -> dict[str, float]:
    ranked = sorted(by_label.items(), key=lambda kv: kv[1], reverse=True)[:count]
    return {label: round(value, 3) for label, value in ranked}


def job_cpu_per_node(summary: Mapping[str, Any], nodes: int) -> float:
    """CPU seconds per node of everything but the workload containers' own processes (the batch
    step's share counted with the nodes')."""
    return sum(summary.get("job_cpu_s_by_node", {}).values()) / nodes


def mean_summaries(summaries: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The per-run mean of several summaries' numbers (roles and the machine's busy time)."""
    if not summaries:
        return {}
    n = len(summaries)
    roles = {role: round(sum(s["cpu_s"].get(role, 0.0) for s in summaries) / n, 3) for role in ROLES}
    keys = sorted({key for s in summaries for key in s.get("cpu_s_by_node", {})})

    def mean_of(field: str) -> dict[str, float]:
        names = sorted({name for s in summaries for name in s.get(field, {})})
        return {name: round(sum(s.get(field, {}).get(name, 0.0) for s in summaries) / n, 3) for name in names}

    return {
        "runs": n,
        "acct": all(s.get("acct") for s in summaries),
        "window_s": round(sum(s["window_s"] for s in summaries) / n, 3),
        "machine_busy_s": round(sum(s["machine_busy_s"] for s in summaries) / n, 3),
        "total_cpu_s": round(sum(s["total_cpu_s"] for s in summaries) / n, 3),
        "host_cpu_s": round(sum(s.get("host_cpu_s", 0.0) for s in summaries) / n, 3),
        "unattributed_s": round(sum(s.get("unattributed_s", 0.0) for s in summaries) / n, 3),
        "cpu_s": roles,
        "cpu_s_by_node": {
            key: round(sum(s.get("cpu_s_by_node", {}).get(key, 0.0) for s in summaries) / n, 3)
            for key in keys
        },
        "container_cpu_s": round(sum(s.get("container_cpu_s", 0.0) for s in summaries) / n, 3),
        "job_cpu_s_by_node": mean_of("job_cpu_s_by_node"),
        "job_by_label": top_labels(mean_of("job_by_label")),
        "top_last_run": list(summaries[-1].get("top", [])),
    }


def compare_note(measured: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    """`CPU s per run, toolkit vs hand: save 3.1 vs 3.0, relay 2.2 vs 0, ...; machine busy ...`."""
    parts = [
        f"{role} {measured['cpu_s'].get(role, 0.0):.2f} vs {baseline['cpu_s'].get(role, 0.0):.2f}"
        for role in ROLES
        if measured["cpu_s"].get(role, 0.0) or baseline["cpu_s"].get(role, 0.0)
    ]
    text = "CPU s per run, measured vs baseline: " + ", ".join(parts)
    text += f"; total {measured['total_cpu_s']:.2f} vs {baseline['total_cpu_s']:.2f}"
    text += f"; host {measured['host_cpu_s']:.2f} vs {baseline['host_cpu_s']:.2f}"
    text += f"; kernel, unattributed {measured['unattributed_s']:.2f} vs {baseline['unattributed_s']:.2f}"
    text += f"; machine busy {measured['machine_busy_s']:.2f} vs {baseline['machine_busy_s']:.2f}"
    text += f" over {measured['window_s']:.2f} vs {baseline['window_s']:.2f} s"
    if not (measured.get("acct") and baseline.get("acct")):
        text += " (no process accounting: short processes undercounted)"
    return text


# --------------------------------------------------------------------------------------------------
# the commands


def start(directory: Path, max_seconds: float, state: Path, use_acct: bool = True) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("started", "procs.json"):
        (directory / name).unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # the recorder: its own session, its output nowhere
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(directory / "recorder.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(log, 2)  # never the caller's stderr: a pipe read to its end would wait for us
        code = 1
        try:
            code = record(directory, max_seconds, state, use_acct)
        finally:
            os._exit(code)
    (directory / "recorder.pid").write_text(f"{pid}\n")
    deadline = time.monotonic() + 10
    while not (directory / "started").exists():
        if time.monotonic() > deadline or os.waitpid(pid, os.WNOHANG) != (0, 0):
            print(f"cpu_profile: the recorder did not start (see {directory})", file=sys.stderr)
            return 1
        time.sleep(0.01)
    return 0


def stop_recorder(directory: Path) -> bool:
    """SIGTERM the recorder and wait (at most 10 s) for procs.json. False if there was none."""
    try:
        pid = int((directory / "recorder.pid").read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 10
    while not (directory / "procs.json").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    (directory / "recorder.pid").unlink(missing_ok=True)
    return (directory / "procs.json").exists()


def stop(
    directory: Path, out: Path, source_node: str, root: int | None = None, job_nodes: Iterable[str] = ()
) -> int:
    if not stop_recorder(directory):
        print(f"cpu_profile: no recording in {directory}", file=sys.stderr)
        return 1
    doc = json.loads((directory / "procs.json").read_text())
    acct = parse_acct((directory / "acct").read_bytes()) if (directory / "acct").exists() else []
    procs = attribute(doc, acct, source_node, root, job_nodes)
    summary = summarize(procs, doc)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    if not os.environ.get("BENCH_CPU_KEEP"):
        (directory / "acct").unlink(missing_ok=True)
        (directory / "procs.json").unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_start = sub.add_parser("start", help="begin recording into DIR")
    p_start.add_argument("dir", type=Path)
    p_start.add_argument("--max-seconds", type=float, default=900.0)
    p_start.add_argument("--no-acct", action="store_true", help="poll only (no process accounting)")
    p_start.add_argument(
        "--state", type=Path, default=Path(os.environ.get("SM_CLUSTER_STATE", "/run/sm-cluster"))
    )
    p_stop = sub.add_parser("stop", help="end recording and write the summary")
    p_stop.add_argument("dir", type=Path)
    p_stop.add_argument("--out", type=Path, required=True)
    p_stop.add_argument("--source-node", default="node1")
    p_stop.add_argument("--root", type=int, help="host processes below this pid are the job's batch step")
    p_stop.add_argument("--job-nodes", default="", help="comma-separated: only these nodes are measured")
    p_off = sub.add_parser("off", help="stop a recorder left running (cleanup)")
    p_off.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "start":
        return start(args.dir, args.max_seconds, args.state, not args.no_acct)
    if args.command == "stop":
        return stop(
            args.dir, args.out, args.source_node, args.root, [n for n in args.job_nodes.split(",") if n]
        )
    if not stop_recorder(args.dir) and (args.dir / "acct").exists():
        set_acct(None)  # a recorder that died without its cleanup left our accounting on
    return 0


if __name__ == "__main__":
    sys.exit(main())
