"""What the fitness tests share: node processes started as the nodes start them (real sockets on
127.0.0.1, each "node" its own port: the `host:port` test aid of --hosts), and reports written by
hand as run_stage writes them, for the judges."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slurm_multi.fitness.mesh import Mesh
from slurm_multi.fitness.protocol import Hello

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
TOKEN = "fitness-test-token"
JOB = "4242"
REPORT_KEYS = {
    "version",
    "stopped",
    "rank",
    "host",
    "nnodes",
    "job_id",
    "hosts",
    "ports",
    "started_at",
    "seconds",
    "timeout",
    "ok",
    "reason",
    "local",
    "thresholds",
    "checks",
    "bad",
}
NETWORK_KEYS = {
    "port",
    "candidates",
    "ports_taken",
    "listening",
    "listen_error",
    "partners",
    "connections",
    "reached",
    "heard",
    "errors",
    "token_rejected_by",
    "rejected",
    "ring",
    "offsets",
    "peers",
}


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on right now (bound to 0, then released)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def make_tools(tmp_path: Path) -> Path:
    """A PATH holding only what the fakes need (no real GPU tool of the machine leaks in)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "hostname", "cat", "sleep"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def node_env(tools: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_", "SM_", "SLURM", "DOCKER_"))}
    env.update(PYTHONPATH=str(REPO / "py"), PATH=str(tools), SM_BARRIER_TOKEN=TOKEN)
    env.update(extra)
    return env


def start_node(tmp_path: Path, env: dict[str, str], rank: int, hosts: str, *args: str) -> subprocess.Popen:
    out = tmp_path / f"node_{rank}" / "fitness.json"
    out.parent.mkdir(exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "slurm_multi",
        "fitness",
        "run",
        "--rank",
        str(rank),
        "--nnodes",
        str(len(hosts.split())),
        "--hosts",
        hosts,
        "--port",
        "1",
        "--job-id",
        JOB,
        "--runtime",
        "none",
        "--out",
        str(out),
        *args,
    ]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Node:
    def __init__(self, proc: subprocess.Popen, out: Path) -> None:
        stdout, stderr = proc.communicate(timeout=60)
        self.rc, self.stdout, self.stderr = proc.returncode, stdout, stderr
        self.report: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}

    def bad_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("fitness: ")]


def run_nodes(
    tmp_path: Path, envs: list[dict[str, str]], *args: str, ranks: list[int] | None = None
) -> list[Node]:
    """Start the given ranks (all by default) of a len(envs)-node job at once; wait for all."""
    ports = free_ports(len(envs))
    hosts = " ".join(f"127.0.0.1:{port}" for port in ports)
    ranks = list(range(len(envs))) if ranks is None else ranks
    procs = [start_node(tmp_path, envs[rank], rank, hosts, *args) for rank in ranks]
    return [Node(proc, tmp_path / f"node_{rank}" / "fitness.json") for proc, rank in zip(procs, ranks)]


def run_meshes(tokens: list[str], probe_bytes: int, seconds: float = 10.0) -> list[Mesh]:
    """Every rank of a len(tokens)-node job in this process (rank r with tokens[r]), each with its own
    selector, driven as run_stage drives one (timers, then events) until all are done or the deadline
    passes; each says its HELLO at once."""
    n = len(tokens)
    ports = free_ports(n)
    start = time.monotonic()
    deadline = start + seconds
    sels = [selectors.DefaultSelector() for _ in range(n)]
    hosts, candidates = ["127.0.0.1"] * n, [[port] for port in ports]
    meshes = [
        Mesh(sels[r], r, hosts, candidates, JOB, tokens[r], probe_bytes, 2.0, deadline - 2, deadline)
        for r in range(n)
    ]
    for rank, mesh in enumerate(meshes):
        mesh.listen()
        mesh.set_hello(Hello(rank, "127.0.0.1", ports[rank], 0.0, None, None, "ok"), start)
    try:
        while not all(mesh.done() for mesh in meshes) and time.monotonic() < deadline:
            for mesh, sel in zip(meshes, sels):
                mesh.on_timers(time.monotonic())
                mesh.on_events(sel.select(0.01 if n == 2 else 0), time.monotonic())
    finally:
        for mesh, sel in zip(meshes, sels):
            mesh.close(0.0)
            sel.close()
    return meshes


def view(
    rank: int, n: int, reached: list[int] | None = None, heard: list[int] | None = None, **more: Any
) -> dict:
    """A report as run_stage writes it, with only what the judges read: everyone reached and heard,
    every clock alike, no ring rate, unless told otherwise (`cpu_bound`: the ranks whose ring rate
    was measured while their sender waited for a CPU)."""
    peers = [q for q in range(n) if q != rank]
    reached = peers if reached is None else reached
    heard = peers if heard is None else heard
    rates: dict[int, float | None] = more.pop("rates", {})
    offsets: dict[int, float] = more.pop("offsets", {})
    verdicts: dict[int, str] = more.pop("verdicts", {})
    cpu_bound: set[int] = set(more.pop("cpu_bound", ()))
    net = {
        "port": 20000 + rank,
        "listening": more.pop("listening", True),
        "reached": reached,
        "heard": heard,
        "errors": more.pop("errors", {}),
        "token_rejected_by": more.pop("token_rejected_by", []),
        "rejected": [{"from": "x", "rank": r, "reason": "bad token"} for r in more.pop("rejected", [])],
        "ring": {"to": (rank + 1) % n, "bytes_per_s": rates.get(rank), "cpu_bound": rank in cpu_bound},
        "offsets": {str(q): offsets.get(q, 0.0) - offsets.get(rank, 0.0) for q in [rank, *heard]},
        "peers": {
            str(q): {
                "host": f"node{q}",
                "verdict": verdicts.get(q, "ok"),
                "ring_to": (q + 1) % n,
                "ring_bytes_per_s": rates.get(q),
                "ring_cpu_bound": q in cpu_bound,
            }
            for q in heard
        },
    }
    local = more.pop("local", "")
    assert not more, more
    return {
        "rank": rank,
        "host": f"node{rank}",
        "nnodes": n,
        "hosts": [f"node{q}" for q in range(n)],
        "ports": [20000 + q for q in range(n)],
        "timeout": 10.0,
        "local": {"ok": not local, "reason": local},
        "checks": {"network": net},
    }


HINT = "(is the job token the same on every node?)"


def reasons(found: list[dict]) -> dict[int, str]:
    return {entry["rank"]: entry["reason"] for entry in found}


def cli(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"], **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "slurm_multi", "fitness", *argv],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )
