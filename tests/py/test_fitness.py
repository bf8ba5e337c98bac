"""The fitness stage (slurm_multi.fitness): local checks, the authenticated mesh, the ring probe, the
verdicts. Real sockets on 127.0.0.1 (each "node" its own port: the `host:port` test aid of --hosts),
real files, the fakes of tests/fakes for the GPU tools; node processes start as the nodes start
them, `python -m slurm_multi.fitness run`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import listening
from fake_engine import engine
from slurm_multi import auth, fitness
from slurm_multi.fitness import judge, judge_reports

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
    "listening",
    "listen_error",
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


@pytest.fixture
def tools(tmp_path: Path) -> Path:
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
        "-S",
        "-m",
        "slurm_multi.fitness",
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


# --------------------------------------------------------------------------------------------------
# Healthy jobs


@pytest.mark.parametrize("nnodes", [2, 3])
def test_healthy_nodes_all_pass_and_write_every_report_key(nnodes: int, tmp_path: Path, tools: Path) -> None:
    started = time.monotonic()
    nodes = run_nodes(tmp_path, [node_env(tools) for _ in range(nnodes)], "--timeout", "20")
    wall = time.monotonic() - started
    for rank, node in enumerate(nodes):
        assert node.rc == 0, node.stderr
        assert node.bad_lines() == []
        report = node.report
        assert set(report) == REPORT_KEYS
        assert set(report["checks"]) == {"runtime", "disk", "gpus", "network"}
        assert (report["rank"], report["nnodes"], report["job_id"], report["ok"]) == (rank, nnodes, JOB, True)
        assert report["bad"] == [] and report["local"] == {"ok": True, "reason": ""}
        net = report["checks"]["network"]
        assert set(net) == NETWORK_KEYS
        others = [q for q in range(nnodes) if q != rank]
        assert net["reached"] == others and net["heard"] == others
        assert net["ring"]["to"] == (rank + 1) % nnodes
        assert net["ring"]["complete"] is True and net["ring"]["bytes"] == fitness.DEFAULT_PROBE_BYTES
        assert net["ring"]["bytes_per_s"] > 0
        assert set(net["offsets"]) == {str(q) for q in range(nnodes)} and net["offsets"][str(rank)] == 0.0
        assert {p["verdict"] for p in net["peers"].values()} == {"ok"}
        assert report["checks"]["gpus"]["status"] == "skipped"  # no GPU tool on this PATH, none needed
        assert report["checks"]["runtime"]["status"] == "skipped"
        assert TOKEN not in node.stdout + node.stderr + json.dumps(report)  # never printed
    assert judge_reports([node.report for node in nodes], nnodes) == []
    print(
        f"healthy {nnodes}-node run on loopback: {wall:.2f} s wall for all processes, stage "
        f"{max(n.report['seconds'] for n in nodes):.3f} s"
    )


def test_single_node_job_checks_only_locally(tmp_path: Path, tools: Path) -> None:
    (node,) = run_nodes(tmp_path, [node_env(tools, SM_BARRIER_TOKEN="")])
    assert node.rc == 0, node.stderr
    assert node.report["checks"]["network"]["ring"] is None
    assert node.report["checks"]["network"]["reached"] == []


# --------------------------------------------------------------------------------------------------
# Network faults


def test_a_peer_that_never_starts_is_named_at_the_deadline(tmp_path: Path, tools: Path) -> None:
    nodes = run_nodes(tmp_path, [node_env(tools), node_env(tools)], "--timeout", "3", ranks=[0])
    (node,) = nodes
    assert node.rc == 3
    port = node.report["ports"][1]
    reason = f"no answer on port {port} within 3 s (connection refused): did its fitness stage start?"
    assert node.bad_lines() == [f"fitness: 127.0.0.1 (rank 1): {reason}"]
    assert "waiting for 127.0.0.1 (rank 1): no HELLO yet" in node.stderr  # the progress line after ~2 s
    assert node.report["checks"]["network"]["ring"]["complete"] is False
    assert node.report["bad"] == [{"rank": 1, "host": "127.0.0.1", "reason": reason}]
    # rank 0 is fine in its own view; the batch step names rank 1 for its missing report
    assert node.report["reason"] == ""
    assert judge_reports([node.report, None], 2) == [
        {
            "rank": 1,
            "host": "127.0.0.1",
            "reason": "no fitness report (the stage did not finish on that node)",
        }
    ]


def test_sigterm_before_the_verdict_writes_a_report_marked_stopped_that_blames_nobody(
    tmp_path: Path, tools: Path
) -> None:
    # Rank 0 waits for rank 1's HELLO; its task ends first (a peer failed before its run, scancel):
    # the report is still written, marked stopped, and no judge reads it as a verdict on anyone.
    ports = free_ports(2)
    hosts = f"127.0.0.1:{ports[0]} 127.0.0.1:{ports[1]}"
    proc = start_node(tmp_path, node_env(tools), 0, hosts, "--timeout", "60")
    deadline = time.monotonic() + 30
    while True:  # it listens once its handler is in place
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        try:
            socket.create_connection(("127.0.0.1", ports[0]), timeout=1).close()
            break
        except OSError:
            time.sleep(0.02)
    proc.terminate()
    node = Node(proc, tmp_path / "node_0" / "fitness.json")
    assert node.rc == 143, node.stderr
    assert node.stderr.splitlines()[-1] == (
        "slurm-multi: fitness: stopped by SIGTERM before the verdict "
        f"(report in {tmp_path}/node_0/fitness.json, marked stopped)"
    )
    report = node.report
    assert set(report) == REPORT_KEYS
    assert report["stopped"] == "SIGTERM before the verdict"
    assert (report["ok"], report["bad"], report["reason"]) == (None, [], "")
    assert report["checks"]["network"]["heard"] == []
    # The batch step's judge: rank 1 wrote nothing and is named; rank 0 is not (not heard from 1 is
    # no evidence). Both stopped (scancel of a healthy job): nobody.
    assert reasons(judge_reports([report, None], 2)) == {
        1: "no fitness report (the stage did not finish on that node)"
    }
    assert judge_reports([report, {**report, "rank": 1}], 2) == []
    assert judge(report) == []


def test_a_stopped_report_keeps_its_facts_and_votes_on_nothing() -> None:
    # 4 nodes; node3 is unreachable from node1, and node0 was stopped before it reached or heard it.
    stopped = {**view(0, 4, reached=[1, 2], heard=[1, 2]), "stopped": "SIGTERM before the verdict"}
    others = [view(1, 4, reached=[0, 2], heard=[0, 2]), view(2, 4), view(3, 4, heard=[2])]
    assert judge_reports([stopped, *others], 4) == []  # 1 of the 2 finished voters: no majority
    # The same view unmarked is evidence: node3 unreachable from 2 of 3 peers.
    assert reasons(judge_reports([{**stopped, "stopped": ""}, *others], 4)) == {
        3: "unreachable on port 20003 from 2 of 3 peers (node0, node1)"
    }
    stopped = {**view(0, 3, reached=[], heard=[]), "stopped": "SIGTERM before the verdict"}
    # A local check that finished and failed, or a failed HELLO a peer heard, still names it.
    disk = "/tmp: 0.1 GiB free, 2 GiB needed"
    full = {**view(0, 3, local=disk), "stopped": "SIGTERM before the verdict"}
    assert reasons(judge_reports([full, view(1, 3), view(2, 3)], 3)) == {0: disk}
    said = view(1, 3, verdicts={0: "nvidia-smi not found"})
    assert reasons(judge_reports([stopped, said, view(2, 3)], 3)) == {0: "nvidia-smi not found"}
    assert reasons(judge(full)) == {0: disk}


def test_a_node_with_the_wrong_token_is_refused_and_named(tmp_path: Path, tools: Path) -> None:
    envs = [node_env(tools), node_env(tools), node_env(tools, SM_BARRIER_TOKEN="some-other-jobs-token")]
    nodes = run_nodes(tmp_path, envs, "--timeout", "2")
    for good in nodes[:2]:
        assert good.rc == 3
        net = good.report["checks"]["network"]
        assert 2 not in net["heard"] and 2 not in net["reached"]  # its connections did not count
        assert 2 in net["token_rejected_by"] and 2 in {r["rank"] for r in net["rejected"]}
        (line,) = good.bad_lines()
        assert line.startswith("fitness: 127.0.0.1 (rank 2): wrong job token: its connections on port")
    wrong = nodes[2]
    assert wrong.rc == 3
    assert wrong.report["reason"].startswith("every peer rejects this node's job token on port")
    found = judge_reports([node.report for node in nodes], 3)
    assert [(b["rank"], b["reason"].split(":")[0]) for b in found] == [(2, "wrong job token")]


def test_a_port_already_in_use_is_a_local_failure_naming_it(tmp_path: Path, tools: Path) -> None:
    ports = free_ports(2)
    squatter = socket.socket()
    squatter.bind(("0.0.0.0", ports[0]))
    squatter.listen()
    try:
        hosts = f"127.0.0.1:{ports[0]} 127.0.0.1:{ports[1]}"
        node = Node(
            start_node(tmp_path, node_env(tools), 0, hosts, "--timeout", "1"),
            tmp_path / "node_0" / "fitness.json",
        )
    finally:
        squatter.close()
    assert node.rc == 3
    assert node.report["local"]["reason"] == (
        f"port {ports[0]} is already in use on this node (another job's, or a stale stage?)"
    )
    assert node.report["checks"]["network"]["listening"] is False
    assert node.report["reason"].startswith(f"port {ports[0]} is already in use")


class HandPeer:
    """Rank 1 of a 2-node job, written by hand from the module docstring's protocol: it takes the
    node's HELLO, delivers its own, and reads only `probe_read` bytes of the ring probe (acking
    them), then nothing more: a link that stalls."""

    def __init__(self, probe_read: int) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.probe_read = probe_read
        self.received = bytearray()
        self.hello: fitness.Hello | None = None
        self.first_join = threading.Event()
        self.held: list[socket.socket] = []
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(sock,), daemon=True).start()

    def line(self, sock: socket.socket) -> str:
        data = bytearray()
        while not data.endswith(b"\n"):
            chunk = sock.recv(1)
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        self.received += data
        return fitness.decode(bytes(data))

    def handle(self, sock: socket.socket) -> None:
        sock.settimeout(20)
        try:
            challenge = auth.new_nonce()
            sock.sendall(fitness.greeting_line(challenge))
            join = fitness.parse_join(self.line(sock), TOKEN, JOB, challenge, 1, 2)
            self.first_join.set()
            sock.sendall(fitness.welcome_line(TOKEN, JOB, challenge, join.nonce, 1, join.purpose))
            if join.purpose == "mesh":
                self.hello = fitness.parse_hello(self.line(sock), TOKEN, JOB, challenge, join.nonce, 0, 2)
                sock.sendall(fitness.got_line(TOKEN, JOB, challenge, join.nonce, 1))
                return
            got = 0
            while got < self.probe_read:
                chunk = sock.recv(self.probe_read - got)
                self.received += chunk
                got += len(chunk)
            sock.sendall(fitness.ack_line(TOKEN, JOB, challenge, join.nonce, got))
            self.held.append(sock)  # and never read again
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))

    def probe_node(self, node_port: int, chunks: list[int]) -> int:
        """Our ring probe to the node: announce 64 MiB, send each chunk and wait until the node has
        acknowledged all so far (it acks as bytes come, and what came before a stall); the rest of
        the 64 MiB never comes."""
        with socket.create_connection(("127.0.0.1", node_port), timeout=20) as sock:
            challenge = fitness.parse_greeting(self.line(sock))
            nonce = auth.new_nonce()
            sock.sendall(fitness.join_line(TOKEN, JOB, challenge, nonce, 1, 0, "probe", 64 << 20))
            fitness.parse_welcome(self.line(sock), TOKEN, JOB, challenge, nonce, 0, "probe")
            sent = acked = 0
            for chunk in chunks:
                sock.sendall(bytes(chunk))
                sent += chunk
                while acked < sent:
                    acked = fitness.parse_ack(self.line(sock), TOKEN, JOB, challenge, nonce, 64 << 20)
            return acked

    def deliver(self, node_port: int) -> None:
        """Our HELLO to the node, once it has dialled us (so it listens already)."""
        assert self.first_join.wait(20)
        with socket.create_connection(("127.0.0.1", node_port), timeout=20) as sock:
            challenge = fitness.parse_greeting(self.line(sock))
            nonce = auth.new_nonce()
            sock.sendall(fitness.join_line(TOKEN, JOB, challenge, nonce, 1, 0, "mesh", 0))
            fitness.parse_welcome(self.line(sock), TOKEN, JOB, challenge, nonce, 0, "mesh")
            hello = fitness.Hello(1, "127.0.0.1", time.time(), None, None, "ok")
            sock.sendall(fitness.hello_line(TOKEN, JOB, challenge, nonce, hello))
            fitness.parse_got(self.line(sock), TOKEN, JOB, challenge, nonce, 0)

    def close(self) -> None:
        listening.stop(self.listener, self.thread)
        for sock in self.held:
            sock.close()


def test_a_stalled_ring_link_is_measured_from_the_acks_and_never_stalls_the_stage(
    tmp_path: Path, tools: Path
) -> None:
    peer = HandPeer(probe_read=1 << 20)
    node_port = free_ports(1)[0]
    hosts = f"127.0.0.1:{node_port} 127.0.0.1:{peer.port}"
    proc = start_node(
        tmp_path,
        node_env(tools),
        0,
        hosts,
        "--timeout",
        "30",
        "--probe-seconds",
        "0.5",
        "--probe-bytes",
        str(64 << 20),
    )
    try:
        assert peer.first_join.wait(20)
        # 1000 bytes are less than an ACK's worth: only the stall timer acknowledges them
        assert peer.probe_node(node_port, [1000, 3 << 20]) == 1000 + (3 << 20)
        peer.deliver(node_port)
        node = Node(proc, tmp_path / "node_0" / "fitness.json")
    finally:
        peer.close()
    assert peer.errors == []
    assert node.rc == 0, node.stderr  # two nodes: two links, no median to call one slow
    ring = node.report["checks"]["network"]["ring"]
    assert ring["complete"] is False and ring["bytes"] == 1 << 20  # what the receiver acknowledged
    assert ring["bytes_per_s"] > 0 and ring["error"].startswith("stopped at the bound")
    assert node.report["seconds"] < 15  # the 0.5 s bound ended it, not the 30 s deadline
    assert (
        peer.hello is not None and peer.hello.ring_rate == ring["bytes_per_s"] and peer.hello.verdict == "ok"
    )
    assert TOKEN.encode() not in peer.received  # the token never crosses the wire


# --------------------------------------------------------------------------------------------------
# The protocol's lines


def test_a_join_signed_for_another_job_or_connection_does_not_verify() -> None:
    challenge, nonce = auth.new_nonce(), auth.new_nonce()
    line = fitness.decode(fitness.join_line(TOKEN, JOB, challenge, nonce, 1, 0, "mesh", 0))
    assert fitness.parse_join(line, TOKEN, JOB, challenge, 0, 2) == fitness.Join(nonce, 1, "mesh", 0)
    for token, job, greeted in (
        (TOKEN, "4243", challenge),
        ("x" + TOKEN, JOB, challenge),
        (TOKEN, JOB, auth.new_nonce()),
    ):
        with pytest.raises(fitness.ProtocolError, match="bad token"):
            fitness.parse_join(line, token, job, greeted, 0, 2)
    with pytest.raises(fitness.ProtocolError, match="wrong rank"):
        fitness.parse_join(line, TOKEN, JOB, challenge, 1, 3)


def test_a_hello_is_signed_over_its_verdict_and_a_welcome_over_the_clients_nonce() -> None:
    challenge, nonce = auth.new_nonce(), auth.new_nonce()
    hello = fitness.Hello(2, "node3", 1764500000.5, 0, 123456789012, "disk | full")
    line = fitness.decode(fitness.hello_line(TOKEN, JOB, challenge, nonce, hello))
    parsed = fitness.parse_hello(line, TOKEN, JOB, challenge, nonce, 2, 3)
    assert parsed == hello._replace(verdict="disk / full")  # `|` kept out of signed fields
    with pytest.raises(fitness.ProtocolError, match="bad token"):
        fitness.parse_hello(line.replace("disk / full", "ok"), TOKEN, JOB, challenge, nonce, 2, 3)
    welcome = fitness.decode(fitness.welcome_line(TOKEN, JOB, challenge, nonce, 1, "mesh"))
    fitness.parse_welcome(welcome, TOKEN, JOB, challenge, nonce, 1, "mesh")
    with pytest.raises(fitness.ProtocolError, match="not signed"):
        fitness.parse_welcome(welcome, TOKEN, JOB, challenge, auth.new_nonce(), 1, "mesh")
    with pytest.raises(fitness.Rejected, match="bad token"):
        fitness.parse_welcome("ERR bad token", TOKEN, JOB, challenge, nonce, 1, "mesh")


# --------------------------------------------------------------------------------------------------
# The runtime


@pytest.fixture
def hung_engine(tmp_path: Path) -> Iterator[str]:
    """A unix socket that accepts (the kernel's backlog does) and never answers."""
    path = str(tmp_path / "docker.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen(8)
    yield path
    sock.close()


def test_a_hung_docker_engine_fails_within_the_runtime_bound(
    tmp_path: Path, tools: Path, hung_engine: str
) -> None:
    env = node_env(tools, DOCKER_HOST=f"unix://{hung_engine}")
    node = Node(
        start_node(
            tmp_path,
            env,
            0,
            "127.0.0.1",
            "--runtime",
            "docker",
            "--runtime-timeout",
            "0.5",
            "--timeout",
            "30",
        ),
        tmp_path / "node_0" / "fitness.json",
    )
    assert node.rc == 3
    assert node.bad_lines() == [
        "fitness: 127.0.0.1 (rank 0): docker engine did not answer /_ping within 0.5 s"
    ]
    assert node.report["checks"]["runtime"]["status"] == "failed"
    assert node.report["seconds"] < 15  # the 0.5 s bound ended it, not the 30 s deadline


def test_docker_engine_answering_ping_passes_and_a_missing_socket_fails(tmp_path: Path) -> None:
    path = str(tmp_path / "ok.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    threading.Thread(target=answer, daemon=True).start()
    try:
        good = fitness.check_runtime("docker", 2.0, {"DOCKER_HOST": f"unix://{path}"}, [])
    finally:
        server.close()
    assert (good["status"], good["ok"]) == ("ok", True), good
    gone = fitness.check_runtime("docker", 2.0, {"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}, [])
    assert gone["reason"] == (
        f"docker engine at {tmp_path}/none.sock did not answer /_ping (no such file or directory); "
        "is dockerd running?"
    )
    assert fitness.check_runtime("docker", 1.0, {"DOCKER_HOST": "tcp://h:2375"}, [])["status"] == "skipped"


def test_pyxis_runtime_needs_enroot_version_to_succeed(tmp_path: Path, tools: Path) -> None:
    (tools / "enroot").symlink_to(FAKES / "enroot")
    env = {"PATH": f"{tools}:{Path(sys.executable).parent}"}
    assert fitness.check_runtime("pyxis", 10.0, env, [])["ok"] is True
    failing = tmp_path / "failing"
    failing.mkdir()
    (failing / "enroot").write_text("#!/bin/sh\necho 'enroot: broken install' >&2\nexit 4\n")
    (failing / "enroot").chmod(0o755)
    assert fitness.check_runtime("pyxis", 10.0, {"PATH": str(failing)}, [])["reason"] == (
        "enroot version failed (exit 4: enroot: broken install)"
    )
    assert fitness.check_runtime("pyxis", 10.0, {"PATH": str(tmp_path / "empty")}, [])["reason"] == (
        "enroot not found on PATH (--runtime pyxis needs it)"
    )


# --------------------------------------------------------------------------------------------------
# Disk


def test_disk_needing_more_than_is_free_fails_at_the_nearest_existing_parent(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    target = str(tmp_path / "not" / "yet")
    (entry,) = fitness.check_disks([(target, free + (1 << 30))], 0, 0)
    assert entry["checked"] == str(tmp_path) and entry["ok"] is False
    assert entry["reason"].startswith(f"{target}: ") and " free, " in entry["reason"]
    assert entry["reason"].endswith(" needed + 0 GiB reserve")
    (fine,) = fitness.check_disks([(target, 0)], 0, 0)
    assert fine["ok"] is True and fine["reason"] == ""


def test_paths_on_one_filesystem_add_up_and_the_reserve_counts(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    (alone,) = fitness.check_disks([(str(tmp_path / "a"), free // 2 + 1)], 0, 0)
    assert alone["ok"] is True
    both = fitness.check_disks(
        [(str(tmp_path / "a"), free // 2 + 1), (str(tmp_path / "b"), free // 2 + 1)], 0, 0
    )
    assert [entry["ok"] for entry in both] == [False, False]
    assert both[0]["reason"].startswith(f"{tmp_path}/a and {tmp_path}/b (one filesystem): ")
    (reserved,) = fitness.check_disks([(str(tmp_path), 0)], free + (1 << 30), 0)
    assert reserved["ok"] is False


class FakeStatvfs:
    def __init__(self, files: int, favail: int) -> None:
        self.f_bavail, self.f_frsize, self.f_files, self.f_favail = 1 << 40, 1, files, favail


@pytest.mark.parametrize(
    ("files", "favail", "ok"), [(1000000, 5, False), (1000000, 20000, True), (0, 0, True)]
)
def test_free_inodes_are_checked_unless_the_filesystem_reports_none(
    files: int, favail: int, ok: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fitness.os, "statvfs", lambda path: FakeStatvfs(files, favail))
    (entry,) = fitness.check_disks([(str(tmp_path), 0)], 0, 10000)
    assert entry["ok"] is ok
    if not ok:
        assert entry["reason"] == f"{tmp_path}: 5 free inodes, 10000 needed"


def test_a_full_disk_fails_the_node_and_names_it_in_sm_error_file(tmp_path: Path, tools: Path) -> None:
    error_file = tmp_path / "error.txt"
    env = node_env(tools, SM_ERROR_FILE=str(error_file))
    node = Node(
        start_node(tmp_path, env, 0, "127.0.0.1", "--disk", f"{tmp_path}/cache=1000000000000000000"),
        tmp_path / "node_0" / "fitness.json",
    )
    assert node.rc == 3
    (line,) = node.bad_lines()
    assert (
        line.startswith(f"fitness: 127.0.0.1 (rank 0): {tmp_path}/cache: ")
        and "GiB needed + 1 GiB reserve" in line
    )
    assert error_file.read_text() == line + "\n"
    assert node.report["checks"]["disk"][0]["need_bytes"] == 10**18


# --------------------------------------------------------------------------------------------------
# GPUs (through the fakes)


@pytest.fixture
def gpu_path(tools: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Put the chosen GPU fakes on PATH (the tools run in this process's environment)."""
    for name in list(os.environ):
        if name.startswith(("FAKE_NVIDIA_", "FAKE_AMDSMI_", "FAKE_GPU_")):
            monkeypatch.delenv(name)

    def use(*fakes: str) -> dict[str, str]:
        for fake in fakes:
            (tools / fake).symlink_to(FAKES / fake)
        monkeypatch.setenv("PATH", str(tools))
        return dict(os.environ)

    return use


def gpus(env: dict[str, str], needed: int = 0, timeout: float = 10.0) -> dict[str, Any]:
    return fitness.check_gpus(needed, 0.1, timeout, env, [])


def test_a_process_of_another_job_on_a_gpu_is_an_offender(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gpu_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_PROCS", "1:4242:2048")
    found = gpus(env, needed=8)
    assert found["status"] == "failed" and found["tool"] == "nvidia-smi" and found["count"] == 8
    assert found["reason"] == "GPU 1 held by pid 4242 (2048 MiB) of another job"
    assert found["offenders"] == [{"gpu": 1, "pid": 4242, "mib": 2048, "total_mib": None, "why": "process"}]
    assert found["gpus"][1] == {
        "index": 1,
        "uuid": "GPU-5f1c7a2e-0d3b-4c1a-9e8f-000000000001",
        "used_mib": 2048,
        "total_mib": 81559,
    }


def test_a_gpu_with_too_much_memory_in_use_is_an_offender(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gpu_path("nvidia-smi")
    monkeypatch.setenv("FAKE_NVIDIA_MEM_USED", "3:20000,5:8000")  # 8000 of 81559 MiB is under 10 %
    found = gpus(env)
    assert found["reason"] == "GPU 3: 20000 of 81559 MiB in use (more than 10%) by another job"
    assert [o["gpu"] for o in found["offenders"]] == [3]


def test_amd_processes_are_found_through_amd_smis_noise(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = gpu_path("amd-smi", "nvidia-smi")  # amd-smi wins, as in slurm_multi.gpus
    monkeypatch.setenv("FAKE_AMDSMI_NOISE", "warning,double,banner")
    monkeypatch.setenv("FAKE_AMDSMI_PROCS", "2:777:512,2:778:1")
    found = gpus(env, needed=8)
    assert found["tool"] == "amd-smi" and found["count"] == 8
    assert found["reason"] == (
        "GPU 2 held by pid 777 (512 MiB) of another job; GPU 2 held by pid 778 (1 MiB) of another job"
    )
    assert found["gpus"][2]["used_mib"] == 513 and found["gpus"][2]["total_mib"] == 196592


def test_a_gpu_seeded_on_this_host_only_is_found(
    gpu_path: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = gpu_path("amd-smi")
    host_dir = tmp_path / "gpu-hosts"
    host_dir.mkdir()
    host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    (host_dir / f"{host}.env").write_text("FAKE_AMDSMI_PROCS=0:31337:4096\n")
    monkeypatch.setenv("FAKE_GPU_HOST_DIR", str(host_dir))
    assert gpus(env)["reason"] == "GPU 0 held by pid 31337 (4096 MiB) of another job"


def test_gpu_count_tool_absence_failure_and_hang(gpu_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    none = gpu_path()
    assert gpus(none)["status"] == "skipped"
    assert gpus(none, needed=2)["reason"] == (
        "the job needs 2 GPU(s) but this node has neither amd-smi nor nvidia-smi on PATH"
    )
    env = gpu_path("nvidia-smi")
    assert gpus(env, needed=8)["status"] == "ok"
    assert gpus(env, needed=16)["reason"] == "only 8 GPU(s) (nvidia-smi), the job needs 16"
    monkeypatch.setenv("FAKE_NVIDIA_FAIL", "9")
    assert gpus(env)["reason"] == (
        "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total failed "
        "(exit 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.)"
    )
    monkeypatch.delenv("FAKE_NVIDIA_FAIL")
    (Path(env["PATH"]) / "nvidia-smi").unlink()
    env = gpu_path("amd-smi")
    monkeypatch.setenv("FAKE_AMDSMI_SLEEP", "30")
    hung = gpus(env, timeout=0.3)
    assert hung["reason"] == "amd-smi did not answer within 0.3 s (is the GPU driver hung?)"


def test_a_gpu_offender_fails_the_node_end_to_end(tmp_path: Path, tools: Path) -> None:
    (tools / "nvidia-smi").symlink_to(FAKES / "nvidia-smi")
    env = node_env(tools, FAKE_NVIDIA_PROCS="6:4343:1024", FAKE_NVIDIA_GPUS="8")
    node = Node(
        start_node(tmp_path, env, 0, "127.0.0.1", "--gpus-needed", "8"), tmp_path / "node_0" / "fitness.json"
    )
    assert node.rc == 3
    assert node.bad_lines() == [
        "fitness: 127.0.0.1 (rank 0): GPU 6 held by pid 4343 (1024 MiB) of another job"
    ]


# --------------------------------------------------------------------------------------------------
# judge(): one node's view


def view(
    rank: int, n: int, reached: list[int] | None = None, heard: list[int] | None = None, **more: Any
) -> dict:
    """A report as run_stage writes it, with only what the judges read: everyone reached and heard,
    every clock alike, no ring rate, unless told otherwise."""
    peers = [q for q in range(n) if q != rank]
    reached = peers if reached is None else reached
    heard = peers if heard is None else heard
    rates: dict[int, float | None] = more.pop("rates", {})
    offsets: dict[int, float] = more.pop("offsets", {})
    verdicts: dict[int, str] = more.pop("verdicts", {})
    net = {
        "port": 20000 + rank,
        "listening": more.pop("listening", True),
        "reached": reached,
        "heard": heard,
        "errors": more.pop("errors", {}),
        "token_rejected_by": more.pop("token_rejected_by", []),
        "rejected": [{"from": "x", "rank": r, "reason": "bad token"} for r in more.pop("rejected", [])],
        "ring": {"to": (rank + 1) % n, "bytes_per_s": rates.get(rank)},
        "offsets": {str(q): offsets.get(q, 0.0) - offsets.get(rank, 0.0) for q in [rank, *heard]},
        "peers": {
            str(q): {
                "host": f"node{q}",
                "verdict": verdicts.get(q, "ok"),
                "ring_to": (q + 1) % n,
                "ring_bytes_per_s": rates.get(q),
            }
            for q in heard
        },
    }
    local = more.pop("local", "")
    assert not more, more
    return {
        "rank": rank,
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


def test_judge_names_this_node_and_peers_whose_local_checks_failed() -> None:
    found = judge(
        view(
            0,
            3,
            local="GPU 1 held by pid 4242 (2048 MiB) of another job",
            verdicts={2: "docker engine did not answer /_ping within 3 s"},
        )
    )
    assert reasons(found) == {
        0: "GPU 1 held by pid 4242 (2048 MiB) of another job",
        2: "docker engine did not answer /_ping within 3 s",
    }
    assert found[0]["host"] == "node0"
    assert judge(view(1, 3)) == []


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        # heard nobody although peers took our HELLO: our port is unreachable
        (view(0, 3, heard=[]), {0: "unreachable on port 20000 from every peer"}),
        # nothing at all, every peer said our token is wrong
        (
            view(0, 3, reached=[], heard=[], token_rejected_by=[1, 2], errors={1: "rejected: bad token"}),
            {0: f"every peer rejects this node's job token on port 20000 {HINT}"},
        ),
        (
            view(0, 3, reached=[], heard=[], errors={1: "timed out", 2: "timed out"}),
            {0: "unreachable on port 20000 from every peer and reached none (timed out)"},
        ),
        (view(0, 3, reached=[], errors={1: "no route to host"}), {0: "reached no peer (no route to host)"}),
        # one peer silent: what we saw of it says why
        (
            view(0, 3, heard=[1]),
            {2: "accepted node0's connection on port 20002 but sent no HELLO within 10 s"},
        ),
        (
            view(0, 3, reached=[1], heard=[1], errors={2: "connection refused"}),
            {2: "no answer on port 20002 within 10 s (connection refused): did its fitness stage start?"},
        ),
        (
            view(0, 3, reached=[1], heard=[1], rejected=[2]),
            {2: f"wrong job token: its connections on port 20002 do not verify {HINT}"},
        ),
        (
            view(0, 3, reached=[1], errors={2: "timed out"}),
            {2: "does not accept connections on port 20002 from node0 (timed out)"},
        ),
        # we could not listen: peers we reached are fine, the others are named
        (
            view(0, 3, reached=[1], heard=[], listening=False, errors={2: "connection refused"}),
            {2: "does not accept connections on port 20002 from node0 (connection refused)"},
        ),
        # two nodes: whoever is silent is named, never ourselves
        (
            view(0, 2, reached=[], heard=[], errors={1: "connection refused"}),
            {1: "no answer on port 20001 within 10 s (connection refused): did its fitness stage start?"},
        ),
    ],
)
def test_judge_reachability_rules(report: dict, expected: dict[int, str]) -> None:
    assert reasons(judge(report)) == expected


def test_judge_finds_a_slow_link_and_a_skewed_clock_in_its_view() -> None:
    mb = 1e6
    found = judge(view(3, 4, rates={0: 900 * mb, 1: 40 * mb, 2: 1000 * mb, 3: 950 * mb}, offsets={1: 5.2}))
    assert reasons(found) == {
        1: "link node1->node2: 40.0 MB/s, median 925.0 MB/s; clock 5.2 s ahead of the job's median",
        2: "link node1->node2: 40.0 MB/s, median 925.0 MB/s",
    }


# --------------------------------------------------------------------------------------------------
# judge_reports(): the batch step's verdict over every report


def test_judge_reports_names_missing_reports_with_what_their_hello_said() -> None:
    reports = [
        view(0, 3, verdicts={2: "/var/lib/docker: 0.4 GiB free, 2.1 GiB needed + 1 GiB reserve"}),
        None,
        None,
    ]
    assert reasons(judge_reports(reports, 3)) == {
        1: "no fitness report (the stage did not finish on that node)",
        2: "no fitness report (the stage did not finish on that node); its HELLO said: /var/lib/docker: "
        "0.4 GiB free, 2.1 GiB needed + 1 GiB reserve",
    }
    assert reasons(
        judge_reports(
            [view(0, 2, local="enroot not found on PATH (--runtime pyxis needs it)"), view(1, 2)], 2
        )
    ) == {0: "enroot not found on PATH (--runtime pyxis needs it)"}
    assert judge_reports([view(r, 4) for r in range(4)], 4) == []


def test_judge_reports_names_a_node_unreachable_from_a_majority() -> None:
    # node3's port is blocked for node0 and node1, open for node2; node2 also misses node1 (a minority)
    reports = [
        view(0, 4, reached=[1, 2], heard=[1, 2]),
        view(1, 4, reached=[0], heard=[0, 2, 3]),
        view(2, 4, reached=[0, 3], heard=[0, 3]),
        view(3, 4, reached=[1, 2], heard=[2]),
    ]
    assert reasons(judge_reports(reports, 4)) == {
        3: "unreachable on port 20003 from 2 of 3 peers (node0, node1)",
    }
    isolated = [
        view(0, 3, reached=[1], heard=[1]),
        view(1, 3, reached=[0], heard=[0]),
        view(2, 3, reached=[], heard=[]),
    ]
    assert reasons(judge_reports(isolated, 3)) == {2: "unreachable on port 20002 from every peer"}


def test_judge_reports_cannot_tell_which_of_two_nodes_is_cut_off() -> None:
    cut = [view(0, 2, reached=[], heard=[]), view(1, 2, reached=[], heard=[])]
    assert reasons(judge_reports(cut, 2)) == {
        0: "node0 and node1 cannot reach each other on port 20000/20001",
        1: "node0 and node1 cannot reach each other on port 20000/20001",
    }
    tokens = [
        view(0, 2, reached=[], heard=[], token_rejected_by=[1]),
        view(1, 2, reached=[], heard=[], rejected=[0]),
    ]
    assert set(reasons(judge_reports(tokens, 2)).values()) == {
        "node0 and node1 do not share the job token on port 20000/20001"
    }
    one_way = [view(0, 2, reached=[], heard=[1]), view(1, 2, reached=[0], heard=[])]  # 0 cannot reach 1
    assert reasons(judge_reports(one_way, 2)) == {1: "unreachable on port 20001 from every peer"}


def test_judge_reports_names_a_wrong_token_node() -> None:
    reports = [
        view(0, 3, reached=[1], heard=[1], rejected=[2], token_rejected_by=[2]),
        view(1, 3, reached=[0], heard=[0], rejected=[2], token_rejected_by=[2]),
        view(2, 3, reached=[], heard=[], token_rejected_by=[0, 1]),
    ]
    assert reasons(judge_reports(reports, 3)) == {
        2: "wrong job token: 2 of 2 peers reject its connections on port 20002"
    }


MB = 1e6


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        # one slow link in a 4-node ring: both of its ends
        (
            {0: 1000 * MB, 1: 950 * MB, 2: 30 * MB, 3: 900 * MB},
            {
                2: "link node2->node3: 30.0 MB/s, median 925.0 MB/s",
                3: "link node2->node3: 30.0 MB/s, median 925.0 MB/s",
            },
        ),
        # node2 slow both ways (links 1->2 and 2->3): node2 alone
        (
            {0: 1000 * MB, 1: 10 * MB, 2: 12 * MB, 3: 950 * MB},
            {2: "both ring links slow: node1->node2 10.0 MB/s and node2->node3 12.0 MB/s, median 481.0 MB/s"},
        ),
        # just above the factor (0.1 x the median): fine
        ({0: 1000 * MB, 1: 950 * MB, 2: 95 * MB, 3: 900 * MB}, {}),
        # three measured links are enough, two are not
        (
            {0: 1000 * MB, 1: None, 2: 10 * MB, 3: 900 * MB},
            {
                2: "link node2->node3: 10.0 MB/s, median 900.0 MB/s",
                3: "link node2->node3: 10.0 MB/s, median 900.0 MB/s",
            },
        ),
        ({0: 1000 * MB, 1: None, 2: 10 * MB, 3: None}, {}),
    ],
)
def test_judge_reports_slow_links_in_a_four_node_ring(rates: dict, expected: dict[int, str]) -> None:
    reports = [view(r, 4, rates={r: rates[r]}) for r in range(4)]
    assert reasons(judge_reports(reports, 4)) == expected


def test_judge_reports_takes_a_missing_nodes_ring_rate_from_its_hello() -> None:
    rates = {0: 1000 * MB, 1: 950 * MB, 2: 900 * MB, 3: 20 * MB}
    reports: list[dict | None] = [view(r, 4, rates=rates) for r in range(3)] + [None]
    assert reasons(judge_reports(reports, 4))[0] == "link node3->node0: 20.0 MB/s, median 925.0 MB/s"


def test_two_nodes_report_rates_but_nothing_is_slow() -> None:
    reports = [view(r, 2, rates={0: 1000 * MB, 1: 1 * MB}) for r in range(2)]
    assert judge_reports(reports, 2) == [] and judge(reports[0]) == []


@pytest.mark.parametrize(
    ("skew", "expected"),
    [
        ({3: 5.2}, {3: "clock 5.2 s ahead of the job's median"}),
        ({1: -3.0}, {1: "clock 3.0 s behind the job's median"}),
        ({3: 1.9}, {}),
    ],
)
def test_judge_reports_names_a_skewed_clock(skew: dict[int, float], expected: dict[int, str]) -> None:
    reports = [view(r, 4, offsets=skew) for r in range(4)]
    assert reasons(judge_reports(reports, 4)) == expected
    assert reasons(judge(reports[0])) == expected  # one node's view agrees


def test_two_clocks_apart_name_both_nodes() -> None:
    reports = [view(r, 2, offsets={1: 2.5}) for r in range(2)]
    reason = (
        "clocks of node0 and node1 differ by 2.5 s (more than 2 s; with two clocks, which one is off "
        "cannot be told)"
    )
    assert reasons(judge_reports(reports, 2)) == {0: reason, 1: reason}
    assert judge_reports([view(r, 2, offsets={1: 1.5}) for r in range(2)], 2) == []


# --------------------------------------------------------------------------------------------------
# The command line


def cli(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"], **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "slurm_multi.fitness", *argv],
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


RUN = ["run", "--rank", "0", "--nnodes", "2", "--hosts", "a b", "--port", "23456", "--job-id", "7"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([*RUN[:7], "--port", "http", *RUN[9:]], "--port 'http' is not allowed; use an integer 1-65535"),
        (["run", "--rank", "2", *RUN[3:]], "--rank '2' is not allowed; use an integer 0-1"),
        ([*RUN[:5], "--hosts", "a", *RUN[7:]], "--hosts 'a' is not allowed; give 2 host names"),
        ([*RUN[:5], "--hosts", "a a", *RUN[7:]], "--hosts 'a a' is not allowed; give each rank its own host"),
        ([*RUN, "--runtime", "podman"], "--runtime 'podman' is not allowed; use docker, pyxis or none"),
        ([*RUN, "--disk", "/var/lib/docker"], "--disk '/var/lib/docker' is not allowed; use PATH=BYTES"),
        ([*RUN, "--disk", "/d=2G"], "--disk '2G' is not allowed; use an integer 0 or more"),
        (
            [*RUN, "--gpu-mem-fraction", "1.5"],
            "--gpu-mem-fraction '1.5' is not allowed; use a number at least 0",
        ),
        ([*RUN, "--timeout", "0"], "--timeout '0' is not allowed; use a number more than 0"),
        ([*RUN, "--slow-factor", "nan"], "--slow-factor 'nan' is not allowed"),
        ([*RUN, "--tmeout", "3"], "No such option '--tmeout'; Usage: python -m slurm_multi.fitness run"),
        ([*RUN, "stray"], "Unexpected extra argument 'stray'"),
        (["rn", *RUN[1:]], "'rn' is not a command; use run or judge"),
        (RUN[:5], "Missing option '--hosts'"),
        ([*RUN, "--token-env", "NO_SUCH_TOKEN"], "--token-env NO_SUCH_TOKEN: $NO_SUCH_TOKEN is not set"),
        ([*RUN[:-2]], "--job-id '' is not allowed; give the job ID"),
        (["judge", "--jobdir", "/no/such/dir", "--nnodes", "2"], "--jobdir '/no/such/dir' is not allowed"),
        (
            ["judge", "--jobdir", "/", "--nnodes", "0"],
            "--nnodes '0' is not allowed; use an integer 1 or more",
        ),
        ([], "no command given; use run or judge"),
    ],
)
def test_usage_errors_are_one_line_naming_the_flag_and_exit_2(argv: list[str], expected: str) -> None:
    result = cli(argv, {"SM_BARRIER_TOKEN": TOKEN})
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("slurm-multi: fitness: ") and expected in line, line


def test_the_token_value_is_never_shown_in_a_usage_error() -> None:
    result = cli(RUN, {"SM_BARRIER_TOKEN": "has spaces in it"})
    assert result.returncode == 2 and "has spaces" not in result.stderr
    assert "$SM_BARRIER_TOKEN is not set or not 1-64 printable ASCII characters" in result.stderr


def test_judge_command_prints_bad_nodes_as_tab_separated_lines_or_json(tmp_path: Path) -> None:
    for rank, report in enumerate(
        [view(0, 3, local="GPU 1 held by pid 4242 (2048 MiB) of another job"), view(1, 3)]
    ):
        (tmp_path / f"node_{rank}").mkdir()
        (tmp_path / f"node_{rank}" / "fitness.json").write_text(json.dumps(report))
    (tmp_path / "node_2").mkdir()
    (tmp_path / "node_2" / "fitness.json").write_text("{not json")
    text = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "3"])
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines() == [
        "0\tnode0\tGPU 1 held by pid 4242 (2048 MiB) of another job",
        "2\tnode2\tno fitness report (the stage did not finish on that node)",
    ]
    as_json = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "3", "--json"])
    assert [entry["rank"] for entry in json.loads(as_json.stdout)] == [0, 2]
    assert cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "2", "--json"]).stdout.strip() == (
        '[{"rank": 0, "host": "node0", "reason": "GPU 1 held by pid 4242 (2048 MiB) of another job"}]'
    )
    (tmp_path / "node_0" / "fitness.json").write_text(json.dumps(view(0, 2)))
    fine = cli(["judge", "--jobdir", str(tmp_path), "--nnodes", "2"])
    assert (fine.returncode, fine.stdout) == (0, "")


def _bad_node_job(root: Path) -> Path:
    """A finished 2-node job whose rank 0 found its own GPU held: its fitness stage failed."""
    reports = [view(0, 2, local="GPU 1 held by pid 4242 (2048 MiB) of another job"), view(1, 2)]
    job = {"job_id": "77", "model": "m", "nnodes": 2, "nodes": ["node0", "node1"], "results_csv": "p.csv",
           "settings": {"SM_FITNESS": "on"}}  # fmt: skip
    root.mkdir()
    (root / "job.json").write_text(json.dumps(job))
    for rank, report in enumerate(reports):
        node = root / f"node_{rank}"
        node.mkdir()
        (node / "fitness.json").write_text(json.dumps(report))
        failed = rank == 0
        stages = {"prepare": {"seconds": 0.2, "status": "ok"},
                  "fitness": {"seconds": 0.1, "status": "failed" if failed else "ok"}}  # fmt: skip
        status = {"rank": rank, "node": f"node{rank}", "exit_code": 1 if failed else 0,
                  "status": "failed" if failed else "ok", "reason": "", "stages": stages}  # fmt: skip
        (node / "status.json").write_text(json.dumps(status))
        (node / "p.csv").write_text("model,performance,metric\nm,1.5,x\n")
    return root


def test_collect_writes_the_bad_nodes_the_judge_finds_and_holds_the_perf_csv_for_a_requeue(
    tmp_path: Path,
) -> None:
    """The batch step judges the fitness reports once, in collect (--bad-nodes): the same lines as
    `fitness judge`; a job to be requeued appends no rows (--no-perf-csv-on-bad-nodes)."""
    jobdir = _bad_node_job(tmp_path / "job")
    judged = cli(["judge", "--jobdir", str(jobdir), "--nodes", "node0 node1"])
    assert judged.returncode == 0 and judged.stdout, judged.stderr
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    collect = [sys.executable, "-m", "slurm_multi.results.collect_main", str(jobdir), "--no-picture"]
    shared = tmp_path / "perf.csv"
    hold = ["--bad-nodes", str(tmp_path / "bad"), "--perf-csv", str(shared), "--no-perf-csv-on-bad-nodes"]
    held = subprocess.run([*collect, *hold], capture_output=True, text=True, env=env)
    assert held.returncode == 1, held.stderr
    assert (
        (tmp_path / "bad").read_text()
        == judged.stdout
        == "0\tnode0\tGPU 1 held by pid 4242 (2048 MiB) of another job\n"
    )
    assert not shared.exists() and "no rows appended" in held.stderr
    # Not to be requeued (the flag not given): the rows go to the shared file as before.
    kept = subprocess.run([*collect, "--bad-nodes", str(tmp_path / "bad"), "--perf-csv", str(shared)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert kept.returncode == 1 and shared.exists(), kept.stderr
    # A healthy job: the file is written, empty.
    for rank in (0, 1):
        (jobdir / f"node_{rank}" / "fitness.json").write_text(json.dumps(view(rank, 2)))
        status = json.loads((jobdir / f"node_{rank}" / "status.json").read_text())
        status.update(exit_code=0, status="ok", stages={"fitness": {"seconds": 0.1, "status": "ok"}})
        (jobdir / f"node_{rank}" / "status.json").write_text(json.dumps(status))
    fine = subprocess.run(
        [*collect, "--bad-nodes", str(tmp_path / "bad")], capture_output=True, text=True, env=env
    )
    assert fine.returncode == 0, fine.stderr
    assert (tmp_path / "bad").read_text() == ""


def test_every_run_option_is_in_the_docstrings_table_with_its_default() -> None:
    import re

    options = {option.name: option for option in fitness._run_options()}
    doc = fitness.__doc__ or ""
    table = doc[doc.find("`run` options") : doc.find("`judge` reads")]
    documented = re.findall(r"^    (--[a-z-]+) ", table, re.M)
    assert sorted(documented) == sorted(options)
    for flag, option in options.items():
        if isinstance(option.default, str) and option.default and flag not in ("--job-id", "--token-env"):
            entry = table[table.find(f"    {flag} ") :].split("\n    --")[0]
            try:
                number = float(option.default)
            except ValueError:
                shown = option.default
            else:
                shown = f"{number:g}" if number != int(number) or number < 1e6 else str(int(number))
            assert f"({shown}" in entry, (flag, option.default, entry)


def test_help_prints_the_docstring_on_stdout_and_exits_0() -> None:
    for argv in (["--help"], ["run", "--help"], ["judge", "-h"]):
        result = cli(argv)
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == fitness.__doc__


def test_the_token_rule_is_the_barriers() -> None:
    from slurm_multi import wire, words

    # one rule, slurm_multi.words's (it was a second regex here, held equal by this test)
    assert fitness.is_token is wire.is_token is words.is_token
    assert fitness.DEFAULT_TOKEN_ENV == wire.DEFAULT_TOKEN_ENV


# --------------------------------------------------------------------------------------------------
# What the integration adds: the job's port, docker's data root, one attempt's verdict


def test_the_job_port_is_the_same_on_every_node_and_none_of_the_barriers_or_relays() -> None:
    from slurm_multi import net

    args = fitness.parse_command(
        ["run", "--rank", "0", "--nnodes", "2", "--hosts", "a b", "--master-port", "29500", "--job-id", "77"]
    )
    port = fitness._job_port(args)
    assert port == fitness._job_port(args)
    window = net.read_local_port_range()
    barrier = net.derive_ports(29500, 77, window, 4)
    relay = net.derive_ports(29500, 77 + 64, window, 8)
    assert port not in barrier + relay + [29500]
    other_job = fitness.parse_command(
        ["run", "--rank", "0", "--nnodes", "2", "--hosts", "a b", "--master-port", "29500", "--job-id", "78"]
    )
    assert fitness._job_port(other_job) != port
    explicit = fitness.parse_command(
        ["run", "--rank", "0", "--nnodes", "1", "--hosts", "a", "--port", "12345", "--master-port", "29500"]
    )
    assert fitness._job_port(explicit) == 12345


def test_docker_data_root_needs_nothing_for_a_held_image_and_the_tar_size_otherwise(tmp_path: Path) -> None:
    root = tmp_path / "docker-root"
    root.mkdir()
    info = json.dumps({"DockerRootDir": str(root)}).encode()
    held = json.dumps({"Id": "sha256:" + "a" * 64}).encode()
    path, server = engine(tmp_path, {"/info": info, "/images/toy/model:local/json": held})
    env = {"DOCKER_HOST": f"unix://{path}"}
    try:
        assert fitness.docker_disk(env, "toy/model:local", 5 << 30, 2.0) == [(str(root), 0)]
        assert fitness.docker_disk(env, "other:1", 5 << 30, 2.0) == [(str(root), 5 << 30)]
    finally:
        server.close()
    # An engine that does not answer: nothing to check here (the runtime check names it).
    assert fitness.docker_disk({"DOCKER_HOST": f"unix://{tmp_path}/gone.sock"}, "x", 1, 0.5) == []
    assert fitness.docker_disk(env, "", 1, 0.5) == []


def write_node(
    jobdir: Path, rank: int, host: str, prepare: str, report: dict[str, Any] | None, reason: str = ""
) -> None:
    node = jobdir / f"node_{rank}"
    node.mkdir(parents=True)
    status = {
        "rank": rank,
        "node": host,
        "exit_code": 0 if prepare == "ok" else 2,
        "reason": reason,
        "status": "ok" if prepare == "ok" else "failed",
        "stages": {"prepare": {"seconds": 0.1, "status": prepare}},
    }
    (node / "status.json").write_text(json.dumps(status))
    if report is not None:
        (node / "fitness.json").write_text(json.dumps(report))


def fit_report(rank: int, hosts: list[str], ok: bool = True, reason: str = "") -> dict[str, Any]:
    n = len(hosts)
    peers = [r for r in range(n) if r != rank]
    return {
        "version": 1,
        "rank": rank,
        "host": hosts[rank],
        "nnodes": n,
        "hosts": hosts,
        "ports": [9] * n,
        "ok": ok,
        "reason": reason,
        "local": {"ok": ok, "reason": reason},
        "bad": [],
        "checks": {"network": {"port": 9, "reached": peers, "heard": peers, "ring": {}, "offsets": {}}},
    }


def test_one_attempts_verdict_blames_a_node_whose_own_prepare_failed_never_a_job_wide_failure(
    tmp_path: Path,
) -> None:
    hosts = ["n1", "n2", "n3"]
    # n3's docker engine is down: its prepare fails, the others pass and wait for it in the mesh.
    job = tmp_path / "job"
    write_node(job, 0, "n1", "ok", fit_report(0, hosts))
    write_node(job, 1, "n2", "ok", fit_report(1, hosts))
    write_node(job, 2, "n3", "failed", None, "prepare: docker engine not reachable on n3")
    assert fitness.judge_job(str(job), hosts) == [
        {"rank": 2, "host": "n3", "reason": "prepare: docker engine not reachable on n3"}
    ]
    # A bad manifest: every node's prepare fails alike, and nobody is to blame.
    bad_manifest = tmp_path / "manifest"
    for rank, host in enumerate(hosts):
        write_node(bad_manifest, rank, host, "failed", None, "prepare: no model 'x' in the manifest")
    assert fitness.judge_job(str(bad_manifest), hosts) == []
    # Every node fit: nothing.
    healthy = tmp_path / "healthy"
    for rank, host in enumerate(hosts):
        write_node(healthy, rank, host, "ok", fit_report(rank, hosts))
    assert fitness.judge_job(str(healthy), hosts) == []


def test_one_attempts_verdict_places_reports_by_node_index_with_several_tasks_per_node(
    tmp_path: Path,
) -> None:
    hosts = ["n1", "n2"]
    job = tmp_path / "job"
    # Two tasks per node: ranks 0, 1 on n1 and 2, 3 on n2; the first task of each node checks it.
    write_node(job, 0, "n1", "ok", fit_report(0, hosts))
    write_node(job, 1, "n1", "ok", None)
    write_node(job, 2, "n2", "ok", fit_report(1, hosts, ok=False, reason="/tmp: 1 MiB free"))
    write_node(job, 3, "n2", "ok", None)
    assert fitness.judge_job(str(job), hosts) == [{"rank": 1, "host": "n2", "reason": "/tmp: 1 MiB free"}]
    out = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "slurm_multi.fitness",
            "judge",
            "--jobdir",
            str(job),
            "--nodes",
            "n1 n2",
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO / "py")},
    )
    assert (out.returncode, out.stdout) == (0, "1\tn2\t/tmp: 1 MiB free\n"), out.stderr


def test_a_node_whose_own_fitness_command_failed_is_bad_unless_every_node_failed_it(tmp_path: Path) -> None:
    hosts = ["n1", "n2", "n3"]
    job = tmp_path / "job"
    for rank, host in enumerate(hosts):
        write_node(job, rank, host, "ok", fit_report(rank, hosts))
    env = {"PYTHONPATH": str(REPO / "py")}
    for rank, (code, why) in enumerate(
        [(0, ""), (0, ""), (3, "fitness command on n3: exited 3: no IB link")]
    ):
        out = subprocess.run(
            [sys.executable, "-m", "slurm_multi.fitness", "record-cmd",
             str(job / f"node_{rank}" / "fitness-cmd.json"), hosts[rank], str(code), why],
            capture_output=True, text=True, env=env,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
    assert fitness.judge_job(str(job), hosts) == [
        {"rank": 2, "host": "n3", "reason": "fitness command on n3: exited 3: no IB link"}
    ]
    # The check fails everywhere: the check is wrong, not the nodes.
    for rank in (0, 1):
        fitness.write_cmd_record(str(job / f"node_{rank}" / "fitness-cmd.json"), hosts[rank], 1, "exited 1")
    assert fitness.judge_job(str(job), hosts) == []
    bad = subprocess.run([sys.executable, "-m", "slurm_multi.fitness", "record-cmd", "x"],
                         capture_output=True, text=True, env=env)  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
