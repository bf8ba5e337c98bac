"""The fitness stage's network (slurm_multi.fitness.mesh, .links, .protocol): in process (two meshes
on loopback), and through node processes started as the nodes start them: healthy jobs, network
faults, the ring probe, the protocol's lines.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

import listening
from fitness_nodes import (
    JOB,
    NETWORK_KEYS,
    REPORT_KEYS,
    TOKEN,
    Node,
    free_ports,
    make_tools,
    node_env,
    reasons,
    run_meshes,
    run_nodes,
    start_node,
    view,
)
from slurm_multi import auth
from slurm_multi.fitness import cli as fitness_cli
from slurm_multi.fitness import links as links_module
from slurm_multi.fitness import mesh as mesh_module
from slurm_multi.fitness import protocol
from slurm_multi.fitness.mesh import Mesh
from slurm_multi.fitness.verdict import judge, judge_reports


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    return make_tools(tmp_path)


# --------------------------------------------------------------------------------------------------
# In process: Mesh (what each line means) over Links (the sockets)


def mesh_pair(tokens: tuple[str, str], probe_bytes: int, seconds: float = 10.0) -> list[Mesh]:
    """Ranks 0 and 1 of a 2-node job, each with its own selector, driven as run_stage drives one
    (timers, then events) until both are done or the deadline passes; each says its HELLO at once."""
    return run_meshes(list(tokens), probe_bytes, seconds)


def test_two_meshes_deliver_their_hellos_measure_the_ring_and_close_every_socket() -> None:
    meshes = mesh_pair((TOKEN, TOKEN), probe_bytes=1 << 20)
    for rank, mesh in enumerate(meshes):
        other = 1 - rank
        assert mesh.done()
        figures = mesh.figures()
        assert set(figures) == NETWORK_KEYS
        assert (figures["reached"], figures["heard"], figures["errors"]) == ([other], [other], {})
        assert figures["listening"] is True and figures["listen_error"] == ""
        assert figures["peers"][str(other)]["verdict"] == "ok"
        ring = figures["ring"]
        assert (ring["to"], ring["bytes"], ring["complete"], ring["error"]) == (other, 1 << 20, True, "")
        assert ring["bytes_per_s"] > 0
        assert not mesh.links.conns and mesh.links.listener is not None and mesh.links.listener.fileno() == -1


def dial_rounds(dial: links_module.Dial, attempts: int, refused: bool) -> tuple[list[int], list[float]]:
    """The ports `dial` tries and the waits before each next try when every attempt fails."""
    ports, waits, now = [], [], 100.0
    for _ in range(attempts):
        _, port = dial.target()
        dial.attempts += 1
        dial.note(port, "connection refused" if refused else "timed out", refused)
        dial.retry(now)
        ports.append(port)
        waits.append(round(dial.next_at - now, 3))
        now = dial.next_at
    return ports, waits


def test_a_refused_candidate_is_followed_by_the_next_at_once_until_a_round_is_done() -> None:
    # A peer that starts late listens on its first free candidate: a wait after each of four
    # refusals put that candidate's next try 0.3 s away (a 2-node mesh took 0.32 s, its peer 0.16).
    dial = links_module.Dial(1, "node2", [7001, 7002, 7003, 7004], "mesh")
    dial.addresses = ["10.0.0.2"]
    ports, waits = dial_rounds(dial, 12, refused=True)
    assert ports == [7001, 7002, 7003, 7004] * 3
    assert waits == [0, 0, 0, 0.02, 0, 0, 0, 0.04, 0, 0, 0, 0.08]
    # What answers nothing (a filtered port, a squatter that never greets) waits, twice as long
    # each time, up to the bound; and so does a known port, refused or not.
    silent = links_module.Dial(1, "node2", [7001, 7002, 7003, 7004], "mesh")
    silent.addresses = ["10.0.0.2"]
    assert dial_rounds(silent, 6, refused=False)[1] == [0.02, 0.04, 0.08, 0.1, 0.1, 0.1]
    known = links_module.Dial(1, "node2", [7001, 7002, 7003, 7004], "mesh")
    known.addresses, known.known = ["10.0.0.2"], 7003
    assert dial_rounds(known, 3, refused=True) == ([7003] * 3, [0.02, 0.04, 0.08])


@pytest.mark.parametrize(("waiting", "bound"), [(0.0, False), (0.5, True), (None, False)])
def test_a_probe_whose_sender_waited_for_a_cpu_says_its_rate_is_cpu_bound(
    monkeypatch, waiting, bound
) -> None:
    """The kernel's run delay over the probe: a share of it waiting for a CPU above a tenth marks
    the rate a lower bound (the judge never calls it slow); a kernel that does not say marks none."""
    clock = {"at": time.monotonic()}

    def cpu_waited() -> float | None:  # `waiting` s of every second since the test began
        return None if waiting is None else waiting * (time.monotonic() - clock["at"])

    monkeypatch.setattr(mesh_module, "cpu_waited", cpu_waited)
    meshes = mesh_pair((TOKEN, TOKEN), probe_bytes=8 << 20)  # (long enough for the loop's own lag)
    for mesh in meshes:
        ring = mesh.figures()["ring"]
        assert ring["complete"] and ring["cpu_bound"] is bound
        expected = None if waiting is None else pytest.approx(waiting, abs=0.15)
        assert ring["cpu_wait"] == expected


def test_the_kernels_run_delay_is_read_as_seconds_waited_for_a_cpu() -> None:
    first = mesh_module.cpu_waited()
    assert first is not None and first >= 0  # (Linux keeps it: /proc/thread-self/schedstat)
    assert mesh_module.cpu_waited() >= first


def test_a_mesh_with_another_token_is_refused_and_counts_for_nothing() -> None:
    meshes = mesh_pair((TOKEN, "some-other-jobs-token"), probe_bytes=0, seconds=3.0)
    for rank, mesh in enumerate(meshes):
        other = 1 - rank
        figures = mesh.figures()
        assert figures["reached"] == [] and figures["heard"] == []
        assert figures["token_rejected_by"] == [other]
        assert figures["errors"] == {str(other): "rejected: bad token"}
        assert {entry["rank"] for entry in figures["rejected"]} == {other}  # each retry is refused too
        assert figures["ring"]["error"] == "no probe (--probe-bytes 0)"


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
        assert net["ring"]["complete"] is True and net["ring"]["bytes"] == fitness_cli.DEFAULT_PROBE_BYTES
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
    (port,) = node.report["ports"][1]
    reason = f"no answer on port {port} within 3 s (connection refused): did its fitness stage start?"
    assert node.bad_lines() == [f"fitness: 127.0.0.1 (rank 1): {reason}"]
    assert "waiting for 127.0.0.1 (rank 1): no HELLO yet" in node.stderr  # the progress line after ~2 s
    assert node.report["checks"]["network"]["ring"]["complete"] is False
    assert node.report["bad"] == [{"rank": 1, "host": "127.0.0.1", "reason": reason, "evidence": "none"}]
    # rank 0 is fine in its own view; the batch step names rank 1 for its missing report (no
    # evidence against the node itself: a crash, or anything that kept its task from starting)
    assert node.report["reason"] == ""
    assert judge_reports([node.report, None], 2, hosts=["127.0.0.1"] * 2) == [
        {
            "rank": 1,
            "host": "127.0.0.1",
            "reason": "no fitness report (the stage did not finish on that node)",
            "evidence": "none",
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


class HandPeer:
    """Rank 1 of a 2-node job, written by hand from slurm_multi.fitness.protocol's docstring: it takes the
    node's HELLO, delivers its own, and reads only `probe_read` bytes of the ring probe (acking
    them), then nothing more: a link that stalls."""

    def __init__(self, probe_read: int, reset: bool = False) -> None:
        self.reset = reset  # then reset the probe's connection (a peer whose stage was stopped)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = self.listener.getsockname()[1]
        self.probe_read = probe_read
        self.received = bytearray()
        self.hello: protocol.Hello | None = None
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
        return protocol.decode(bytes(data))

    def handle(self, sock: socket.socket) -> None:
        sock.settimeout(20)
        try:
            challenge = auth.new_nonce()
            sock.sendall(protocol.greeting_line(challenge))
            join = protocol.parse_join(self.line(sock), TOKEN, JOB, challenge, 1, 2)
            self.first_join.set()
            sock.sendall(protocol.welcome_line(TOKEN, JOB, challenge, join.nonce, 1, join.purpose))
            if join.purpose == "mesh":
                self.hello = protocol.parse_hello(self.line(sock), TOKEN, JOB, challenge, join.nonce, 0, 2)
                sock.sendall(protocol.got_line(TOKEN, JOB, challenge, join.nonce, 1))
                return
            got = 0
            while got < self.probe_read:
                chunk = sock.recv(self.probe_read - got)
                self.received += chunk
                got += len(chunk)
            sock.sendall(protocol.ack_line(TOKEN, JOB, challenge, join.nonce, got))
            if self.reset:
                time.sleep(0.1)  # the node has the ack
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()
                return
            self.held.append(sock)  # and never read again
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(exc))

    def probe_node(self, node_port: int, chunks: list[int]) -> int:
        """Our ring probe to the node: announce 64 MiB, send each chunk and wait until the node has
        acknowledged all so far (it acks as bytes come, and what came before a stall); the rest of
        the 64 MiB never comes."""
        with socket.create_connection(("127.0.0.1", node_port), timeout=20) as sock:
            challenge = protocol.parse_greeting(self.line(sock))
            nonce = auth.new_nonce()
            sock.sendall(protocol.join_line(TOKEN, JOB, challenge, nonce, 1, 0, "probe", 64 << 20))
            protocol.parse_welcome(self.line(sock), TOKEN, JOB, challenge, nonce, 0, "probe")
            sent = acked = 0
            for chunk in chunks:
                sock.sendall(bytes(chunk))
                sent += chunk
                while acked < sent:
                    acked = protocol.parse_ack(self.line(sock), TOKEN, JOB, challenge, nonce, 64 << 20)
            return acked

    def deliver(self, node_port: int) -> None:
        """Our HELLO to the node, once it has dialled us (so it listens already)."""
        assert self.first_join.wait(20)
        with socket.create_connection(("127.0.0.1", node_port), timeout=20) as sock:
            challenge = protocol.parse_greeting(self.line(sock))
            nonce = auth.new_nonce()
            sock.sendall(protocol.join_line(TOKEN, JOB, challenge, nonce, 1, 0, "mesh", 0))
            protocol.parse_welcome(self.line(sock), TOKEN, JOB, challenge, nonce, 0, "mesh")
            hello = protocol.Hello(1, "127.0.0.1", self.port, time.time(), None, None, "ok")
            sock.sendall(protocol.hello_line(TOKEN, JOB, challenge, nonce, hello))
            protocol.parse_got(self.line(sock), TOKEN, JOB, challenge, nonce, 0)

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


def test_a_probe_its_peer_broke_off_measures_no_rate(tmp_path: Path, tools: Path) -> None:
    # A peer whose stage ended under the probe (its task stopped it after a failed prepare): the
    # acks before the reset over the time to it read as a slow link, and with 3 nodes "link
    # node2->node3 slow" named the healthy sender too (CI: a 3-node job requeued without both, never
    # runnable on 4 nodes). A broken probe is no measurement; one stopped at its bound still is.
    peer = HandPeer(probe_read=1 << 20, reset=True)
    node_port = free_ports(1)[0]
    hosts = f"127.0.0.1:{node_port} 127.0.0.1:{peer.port}"
    proc = start_node(tmp_path, node_env(tools), 0, hosts, "--timeout", "30", "--probe-bytes", str(64 << 20))
    try:
        assert peer.first_join.wait(20)
        peer.deliver(node_port)
        node = Node(proc, tmp_path / "node_0" / "fitness.json")
    finally:
        peer.close()
    assert peer.errors == []
    ring = node.report["checks"]["network"]["ring"]
    assert ring["complete"] is False and ring["bytes"] == 1 << 20, ring
    assert ring["bytes_per_s"] is None and "after 1048576 bytes acknowledged" in ring["error"], ring
    assert node.rc == 0, node.stderr


# --------------------------------------------------------------------------------------------------
# The protocol's lines


def test_a_join_signed_for_another_job_or_connection_does_not_verify() -> None:
    challenge, nonce = auth.new_nonce(), auth.new_nonce()
    line = protocol.decode(protocol.join_line(TOKEN, JOB, challenge, nonce, 1, 0, "mesh", 0))
    assert protocol.parse_join(line, TOKEN, JOB, challenge, 0, 2) == protocol.Join(nonce, 1, "mesh", 0)
    for token, job, greeted in (
        (TOKEN, "4243", challenge),
        ("x" + TOKEN, JOB, challenge),
        (TOKEN, JOB, auth.new_nonce()),
    ):
        with pytest.raises(protocol.ProtocolError, match="bad token"):
            protocol.parse_join(line, token, job, greeted, 0, 2)
    with pytest.raises(protocol.ProtocolError, match="wrong rank"):
        protocol.parse_join(line, TOKEN, JOB, challenge, 1, 3)


def test_a_hello_is_signed_over_its_verdict_and_a_welcome_over_the_clients_nonce() -> None:
    challenge, nonce = auth.new_nonce(), auth.new_nonce()
    hello = protocol.Hello(2, "node3", 21544, 1764500000.5, 0, 123456789012, "disk | full")
    line = protocol.decode(protocol.hello_line(TOKEN, JOB, challenge, nonce, hello))
    parsed = protocol.parse_hello(line, TOKEN, JOB, challenge, nonce, 2, 3)
    assert parsed == hello._replace(verdict="disk / full")  # `|` kept out of signed fields
    with pytest.raises(protocol.ProtocolError, match="bad token"):
        protocol.parse_hello(line.replace("disk / full", "ok"), TOKEN, JOB, challenge, nonce, 2, 3)
    busy = hello._replace(ring_cpu_bound=True)  # a rate measured while the sender waited for a CPU
    line = protocol.decode(protocol.hello_line(TOKEN, JOB, challenge, nonce, busy))
    assert " 123456789012+ " in line
    assert protocol.parse_hello(line, TOKEN, JOB, challenge, nonce, 2, 3) == busy._replace(
        verdict="disk / full"
    )
    with pytest.raises(protocol.ProtocolError, match="bad token"):  # the mark is signed
        protocol.parse_hello(line.replace("9012+ ", "9012 "), TOKEN, JOB, challenge, nonce, 2, 3)
    welcome = protocol.decode(protocol.welcome_line(TOKEN, JOB, challenge, nonce, 1, "mesh"))
    protocol.parse_welcome(welcome, TOKEN, JOB, challenge, nonce, 1, "mesh")
    with pytest.raises(protocol.ProtocolError, match="not signed"):
        protocol.parse_welcome(welcome, TOKEN, JOB, challenge, auth.new_nonce(), 1, "mesh")
    with pytest.raises(protocol.Rejected, match="bad token"):
        protocol.parse_welcome("ERR bad token", TOKEN, JOB, challenge, nonce, 1, "mesh")
