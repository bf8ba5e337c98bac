"""The fitness stage against strangers without the token, as tests/py/test_barrier.py fuzzes the barrier:
ports another process holds, connections reset with SO_LINGER(1, 0), idle connections that would hold
the listener's table, floods, slowloris and hostile lines. Node processes on loopback (each "node"
its own candidate ports: the `host:P[,P...]` test aid), the attack from threads of the test. What must
hold: the stage never breaks, never names a healthy node, and ends within its bound."""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import squatters
from fitness_nodes import JOB, TOKEN, Node, free_ports, make_tools, node_env, start_node
from slurm_multi import auth
from slurm_multi.fitness import protocol
from slurm_multi.fitness.verdict import judge_job, judge_reports

LOOPBACK = "127.0.0.1"


@pytest.fixture
def tools(tmp_path: Path) -> Path:
    return make_tools(tmp_path)


def hosts_of(candidates: list[list[int]]) -> str:
    return " ".join(f"{LOOPBACK}:{','.join(str(p) for p in ports)}" for ports in candidates)


def listening(port: int, proc: object, seconds: float = 30) -> None:
    """Wait until a node's listener accepts (it listens once its handlers are in place)."""
    deadline = time.monotonic() + seconds
    while True:
        assert proc.poll() is None and time.monotonic() < deadline  # type: ignore[attr-defined]
        try:
            socket.create_connection((LOOPBACK, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)


def run_job(
    tmp_path: Path, tools: Path, candidates: list[list[int]], *args: str, first: int | None = None,
    before_others: Callable[[], None] | None = None,
) -> list[Node]:  # fmt: skip
    """Every rank of a len(candidates)-node job on loopback; `first` starts alone, then
    `before_others()` runs (an attack begins), then the rest start."""
    hosts = hosts_of(candidates)
    env = node_env(tools)
    order = list(range(len(candidates)))
    procs: dict[int, object] = {}
    if first is not None:
        procs[first] = start_node(tmp_path, env, first, hosts, *args)
        listening(candidates[first][0], procs[first])
        order.remove(first)
    if before_others is not None:
        before_others()
    for rank in order:
        procs[rank] = start_node(tmp_path, env, rank, hosts, *args)
    return [Node(procs[r], tmp_path / f"node_{r}" / "fitness.json") for r in range(len(candidates))]  # type: ignore[arg-type]


def assert_all_fit(nodes: list[Node], bound: float) -> None:
    for node in nodes:
        assert node.rc == 0, node.stderr
        assert node.bad_lines() == [], node.stderr
        assert "the stage broke" not in node.stderr and "Traceback" not in node.stderr
        assert node.report["bad"] == [] and node.report["seconds"] < bound
    reports = [node.report for node in nodes]
    assert judge_reports(reports, len(nodes)) == []


def fake_fitness(sock: socket.socket) -> None:
    """A squatter that speaks the greeting and refuses every JOIN, as another job's stage would."""
    sock.sendall(protocol.greeting_line(auth.new_nonce()))
    sock.settimeout(5)
    with contextlib.suppress(OSError):
        if sock.recv(4096):
            sock.sendall(protocol.err_line(protocol.BAD_TOKEN))


# --------------------------------------------------------------------------------------------------
# Ports another process holds


@pytest.mark.parametrize("kind", ["silent", "banner", "fake-fitness"])
def test_a_port_another_process_holds_sends_the_node_to_its_next_candidate(
    kind: str, tmp_path: Path, tools: Path
) -> None:
    ports = free_ports(6)
    candidates = [ports[0:2], ports[2:4], ports[4:6]]
    answer = {"silent": squatters.silent, "banner": squatters.banner, "fake-fitness": fake_fitness}[kind]
    with squatters.squatter(answer, candidates[1][0]):
        nodes = run_job(tmp_path, tools, candidates, "--timeout", "10")
    assert_all_fit(nodes, 11)
    net = nodes[1].report["checks"]["network"]
    assert (net["port"], net["ports_taken"], net["listening"]) == (candidates[1][1], [candidates[1][0]], True)
    for rank in (0, 2):
        peer = nodes[rank].report["checks"]["network"]
        assert 1 in peer["reached"] and peer["peers"]["1"]["port"] == candidates[1][1]
        assert peer["token_rejected_by"] == []  # the squatter's ERR was not rank 1's


def test_a_node_whose_every_candidate_another_process_holds_is_reported_and_never_judged(
    tmp_path: Path, tools: Path
) -> None:
    # One candidate each (--port as the old single port was): the bad node's only port is held.
    candidates = [[port] for port in free_ports(3)]
    with squatters.squatter(squatters.silent, candidates[1][0]):
        nodes = run_job(tmp_path, tools, candidates, "--timeout", "6")
    assert_all_fit(nodes, 7)
    held = nodes[1].report
    net = held["checks"]["network"]
    assert (net["listening"], net["port"], net["ports_taken"]) == (False, None, candidates[1])
    assert held["local"] == {"ok": True, "reason": ""}  # not a failure of the node
    assert net["listen_error"].startswith(f"every candidate fitness port ({candidates[1][0]}) is held")
    assert "warning: every candidate fitness port" in nodes[1].stderr
    for rank in (0, 2):  # its HELLO came and said so: nobody waits for a listener that is not there
        peer = nodes[rank].report["checks"]["network"]
        assert 1 in peer["heard"] and peer["peers"]["1"]["port"] is None
        assert nodes[rank].report["seconds"] < 5


def test_the_batch_steps_judge_never_names_a_node_for_a_port_another_process_holds(tmp_path: Path) -> None:
    # The reports as the test above writes them, judged as the batch step judges one attempt.
    from fitness_nodes import view

    job = tmp_path / "job"
    for rank in range(3):
        # rank 1 listened nowhere: nobody reached it and it heard nobody; its HELLO reached both
        reached = [q for q in range(3) if q != rank] if rank == 1 else [q for q in (0, 2) if q != rank]
        heard = [] if rank == 1 else [q for q in range(3) if q != rank]
        report = view(rank, 3, reached=reached, heard=heard)
        if rank == 1:
            report["checks"]["network"].update(listening=False, port=None, ports_taken=[20001])
        else:
            report["checks"]["network"]["peers"]["1"]["port"] = None
        (job / f"node_{rank}").mkdir(parents=True)
        (job / f"node_{rank}" / "fitness.json").write_text(json.dumps(report))
    assert judge_job(str(job), ["node0", "node1", "node2"]) == []


# --------------------------------------------------------------------------------------------------
# Strangers on a node's port while the job runs


class Attack:
    """Attacker threads against one port until stopped; what they met is kept (for the record)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.connections = 0

    def run(self, target: Callable[[], None], count: int = 1) -> None:
        for _ in range(count):
            thread = threading.Thread(target=self._loop, args=(target,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _loop(self, target: Callable[[], None]) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(Exception):  # the attacker's own trouble ends no attack
                target()

    def connect(self) -> socket.socket:
        sock = socket.create_connection((LOOPBACK, self.port), timeout=2)
        self.connections += 1
        return sock

    # -- the attacks ---------------------------------------------------------------------------------

    def idle(self, held: int = 120) -> None:
        """`held` connections open at all times: one the node drops is opened again at once."""
        socks: list[socket.socket] = []
        try:
            while not self.stop.is_set():
                while len(socks) < held:
                    socks.append(self.connect())
                readable, _, _ = select.select(socks, [], [], 0.05)
                for sock in readable:
                    with contextlib.suppress(OSError):
                        if sock.recv(4096):
                            continue  # the greeting: ignored
                    sock.close()
                    socks.remove(sock)
        finally:
            for sock in socks:
                sock.close()

    def reset(self) -> None:
        """Connect and reset at once (SO_LINGER(1, 0)): before the greeting, or right after it."""
        sock = self.connect()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        if random.random() < 0.5:
            with contextlib.suppress(OSError):
                sock.recv(64)
        sock.close()

    def flood(self) -> None:
        """Connections as fast as they open, each closed at once."""
        self.connect().close()

    def slowloris(self) -> None:
        """A JOIN one byte at a time, never finished."""
        sock = self.connect()
        try:
            for byte in b"JOIN " + b"0" * 900:
                if self.stop.is_set():
                    return
                sock.send(bytes([byte]))
                time.sleep(0.05)
        finally:
            sock.close()

    def hostile_lines(self) -> None:
        """A forged JOIN (every rank, no token), a HELLO out of turn, an overlong line, bytes."""
        sock = self.connect()
        with sock:
            greeting = sock.recv(256)
            challenge = greeting.decode("ascii", "replace").split(" ")[-1].strip()
            rank = random.randrange(3)
            choice = random.randrange(5)
            if choice == 0:
                line = protocol.join_line("x" + TOKEN, JOB, challenge, auth.new_nonce(), rank, 1, "mesh", 0)
            elif choice == 1:
                hello = protocol.Hello(rank, "evil", 1, time.time() + 3600, None, None, "GPU 0 held by pid 1")
                line = protocol.hello_line("x" + TOKEN, JOB, challenge, auth.new_nonce(), hello)
            elif choice == 2:
                line = b"A" * 70000
            elif choice == 3:
                line = os.urandom(random.randrange(1, 2000))
            else:
                line = protocol.join_line(
                    "x" + TOKEN, JOB, challenge, auth.new_nonce(), rank, 1, "probe", 1 << 20
                )
                line += b"\0" * (1 << 20)
            sock.sendall(line)
            with contextlib.suppress(OSError):
                sock.recv(256)


@contextlib.contextmanager
def attacking(port: int, *kinds: str) -> Iterator[Attack]:
    attack = Attack(port)
    try:
        yield attack
    finally:
        attack.stop.set()
        for thread in attack.threads:
            thread.join(10)


@pytest.mark.parametrize(
    "kinds",
    [
        ("idle",),
        ("reset",),
        ("flood",),
        ("slowloris",),
        ("hostile_lines",),
        ("idle", "reset", "flood", "slowloris", "hostile_lines"),
    ],
)
def test_strangers_on_a_nodes_port_never_break_the_stage_nor_name_a_healthy_node(
    kinds: tuple[str, ...], tmp_path: Path, tools: Path
) -> None:
    candidates = [[port] for port in free_ports(3)]
    with attacking(candidates[1][0]) as attack:

        def begin() -> None:
            for kind in kinds:
                attack.run(getattr(attack, kind), count=4 if kind == "slowloris" else 1)
            deadline = time.monotonic() + 5
            while attack.connections < least and time.monotonic() < deadline:
                time.sleep(0.01)  # the attack is under way before the peers dial

        least = 4 if kinds == ("slowloris",) else 20
        nodes = run_job(tmp_path, tools, candidates, "--timeout", "10", first=1, before_others=begin)
    assert_all_fit(nodes, 11)
    assert attack.connections >= least
    assert TOKEN not in json.dumps([node.report for node in nodes])


# --------------------------------------------------------------------------------------------------
# The lines, fuzzed


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.integers(2, 8))
def test_random_lines_never_break_the_parsers(text: str, nnodes: int) -> None:
    challenge, nonce = auth.new_nonce(), auth.new_nonce()
    for line in (text, "JOIN " + text, "HELLO " + text, "WELCOME " + text, "GOT " + text, "ACK " + text):
        for parse in (
            lambda t: protocol.parse_join(t, TOKEN, JOB, challenge, 0, nnodes),
            lambda t: protocol.parse_hello(t, TOKEN, JOB, challenge, nonce, 1, nnodes),
            lambda t: protocol.parse_welcome(t, TOKEN, JOB, challenge, nonce, 1, "mesh"),
            lambda t: protocol.parse_got(t, TOKEN, JOB, challenge, nonce, 1),
            lambda t: protocol.parse_ack(t, TOKEN, JOB, challenge, nonce, 100),
            protocol.parse_greeting,
        ):
            with contextlib.suppress(protocol.ProtocolError):
                parse(line)
        with contextlib.suppress(protocol.ProtocolError):
            protocol.decode(line.encode("utf-8", "surrogateescape"))
