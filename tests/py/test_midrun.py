"""A node lost or failed during the run: the batch step's watch (reach, lost.json), the node's own
fault (nodefault, `node fault`, status.json's node_fault, the hang watch's), and collect's judgement
(results.midrun) that makes it a bad node with the cause `run`."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from fake_engine import engine
from slurm_multi import attempts, events, hangwatch, job, lost, nodefault, reach, statusfile, watch
from slurm_multi.results.collect import collect
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.midrun import judge_run

REPO = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}


# ---- reach: the batch host dials the nodes -------------------------------------------------------


class Dialer:
    """A network whose answers the test sets: host -> answered."""

    def __init__(self, **answers: bool) -> None:
        self.answers = answers
        self.asked: list[list[str]] = []

    def __call__(self, addresses: dict) -> dict[str, bool]:
        self.asked.append(sorted(addresses))
        return {host: self.answers.get(host, True) for host in addresses}


def _reach(dialer: Dialer, *hosts: str, lost_after: float = 10) -> reach.Reach:
    return reach.Reach(hosts, 1, lost_after, dial=dialer, addresses={h: ("10.0.0.1", 1) for h in hosts})


def test_a_node_silent_for_lost_after_seconds_is_lost_once_and_no_longer_dialled() -> None:
    net = Dialer()
    view = _reach(net, "node2", "node3")
    assert view.look(0, True) == []
    net.answers["node2"] = False
    assert view.look(2, True) == []  # silent since 2
    assert view.look(11, True) == []  # 9 s: not yet
    assert view.look(12, True) == [("node2", 10)]
    assert view.look(14, True) == [] and net.asked[-1] == ["node3"]


def test_an_answer_between_silences_starts_the_count_again() -> None:
    net = Dialer(node2=False)
    view = _reach(net, "node2", "node3")
    net.answers["node2"] = True
    view.look(0, True)
    net.answers["node2"] = False
    view.look(1, True)
    net.answers["node2"] = True
    view.look(8, True)
    net.answers["node2"] = False
    assert view.look(9, True) == [] and view.look(18, True) == []
    assert view.look(19, True) == [("node2", 10)]


def test_a_node_that_never_answered_is_never_judged() -> None:
    # A site whose firewall drops the port: no node answers ever; Slurm's DOWN still counts.
    view = _reach(Dialer(node2=False), "node2", "node3")
    assert [view.look(t, True) for t in (0, 20, 40)] == [[], [], []]


def test_nothing_is_judged_while_the_controller_is_silent_or_every_node_is() -> None:
    net = Dialer()
    view = _reach(net, "node2", "node3")
    view.look(0, True)
    net.answers.update(node2=False, node3=False)
    # The batch host's own network is in doubt: every node silent at once.
    assert view.look(1, True) == [] and view.look(30, True) == []
    net.answers["node3"] = True
    assert view.look(31, False) == []  # nor when scontrol did not answer this round
    assert view.look(32, True) == [("node2", 31)]


def test_with_one_other_node_its_silence_is_judged_when_the_controller_answers() -> None:
    net = Dialer()
    view = _reach(net, "node2")
    view.look(0, True)
    net.answers["node2"] = False
    view.look(1, True)
    assert view.look(11, True) == [("node2", 10)]


def test_dial_all_counts_an_accept_and_a_refusal_as_an_answer_and_silence_as_none() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, not listening: the kernel refuses (RST)
    # Silent: a listener whose accept queue is full drops every further SYN (a node whose network
    # is gone answers nothing either).
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = [socket.socket() for _ in range(3)]
    for sock in queued:
        sock.setblocking(False)
        sock.connect_ex(full.getsockname())
    time.sleep(0.2)
    try:
        started = time.monotonic()
        found = reach.dial_all(
            {"up": listener.getsockname(), "refused": closed.getsockname(), "silent": full.getsockname()},
            timeout=0.5,
        )
        assert time.monotonic() - started < 3  # one bound for the round, not one per node
    finally:
        for sock in (listener, closed, full, *queued):
            sock.close()
    assert found == {"up": True, "refused": True, "silent": False}


# ---- lost.json and the batch step's watch ---------------------------------------------------------


def test_lost_json_keeps_the_first_record_of_a_node(tmp_path: Path) -> None:
    assert lost.record(str(tmp_path), "node2", "network", "silent", [1], now=5.0)
    assert not lost.record(str(tmp_path), "node2", "slurm", "DOWN later", [1], now=9.0)
    assert lost.read(str(tmp_path)) == {
        "node2": {"how": "network", "reason": "silent", "at": 5.0, "ranks": [1]}
    }
    with pytest.raises(ValueError, match="how 'hung'"):
        lost.record(str(tmp_path), "node3", "hung", "x", [2])


def fake_scontrol(tmp_path: Path, states: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {states}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_the_watch_loses_a_node_silent_on_the_network_and_stops_the_others_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=ALLOCATED'", monkeypatch)
    monkeypatch.setattr(socket, "gethostname", lambda: "node1")
    monkeypatch.setattr(reach, "resolve", lambda hosts, port: {h: ("10.0.0.2", port) for h in hosts})
    monkeypatch.setattr(reach, "LOST_AFTER", 0.0)
    answers = iter([True])  # node2 answers once, then is silent
    dialled: list[list[str]] = []

    def dial(addresses: dict) -> dict[str, bool]:
        dialled.append(sorted(addresses))
        return {host: next(answers, False) for host in addresses}

    monkeypatch.setattr(reach, "dial_all", dial)
    jobdir = tmp_path / "job"
    step = subprocess.Popen(["sleep", "30"])
    try:
        rc = watch.watch(str(jobdir), ["node1", "node2"], 2, step.pid, peer_grace=0.2, progress_every=60,
                         node_check_every=0.05, reach_port=12345)  # fmt: skip
    finally:
        step.kill()
        step.wait()
    assert rc == watch.EXIT_STOP
    assert dialled[0] == ["node2"]  # the batch host (node1) is not dialled
    record = lost.read(str(jobdir))["node2"]
    assert record["how"] == "network" and record["ranks"] == [2, 3]
    assert record["reason"].startswith("node2 stopped answering on the network")
    for rank in (2, 3):  # both of its ranks: nobody waits for them
        status = statusfile.read_status(str(jobdir / f"node_{rank}" / "status.json"))
        assert status is not None and status.exit_code == 137 and "stopped answering" in status.reason
    assert not (jobdir / "node_0").exists()
    assert "node2 stopped answering on the network" in capsys.readouterr().err


def test_the_watch_dials_the_nodes_at_once_so_a_loss_in_the_first_seconds_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=ALLOCATED'", monkeypatch)
    monkeypatch.setattr(socket, "gethostname", lambda: "node1")
    monkeypatch.setattr(reach, "resolve", lambda hosts, port: {h: ("10.0.0.2", port) for h in hosts})
    dialled: list[float] = []
    monkeypatch.setattr(
        reach,
        "dial_all",
        lambda addresses: dialled.append(time.monotonic()) or dict.fromkeys(addresses, True),
    )
    step = subprocess.Popen(["sleep", "1"])
    started = time.monotonic()
    rc = watch.watch(str(tmp_path / "job"), ["node1", "node2"], 1, step.pid, peer_grace=5, progress_every=60,
                     node_check_every=30, reach_port=12345)  # fmt: skip
    assert rc == 0
    step.wait()
    assert dialled and dialled[0] - started < 0.5  # not a round's interval later: node2 answered once


def test_the_watch_records_how_slurm_lost_a_node_and_the_teardown_stages_the_watchs_lost_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=DOWN*'", monkeypatch)
    jobdir = tmp_path / "job"
    assert watch.mark_lost(str(jobdir), ["node1", "node2"], 1) == [
        ("node2", watch.slurm_reason("node2", "DOWN*"))
    ]
    assert lost.read(str(jobdir))["node2"]["how"] == "slurm"
    # A node the watch lost on the network (lost.json) that Slurm still calls fine: the teardown's
    # mark-lost writes its ranks' lost status.json, so the teardown does not wait for them.
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node3 State=ALLOCATED'", monkeypatch)
    other = tmp_path / "other"
    lost.record(str(other), "node3", "network", "node3 stopped answering on the network", [1])
    result = CliRunner().invoke(job.cli, ["mark-lost", "--jobdir", str(other), "--nodes", "node1 node3"])
    assert result.exit_code == 0, result.output
    status = statusfile.read_status(str(other / "node_1" / "status.json"))
    assert status is not None and status.reason == "node3 stopped answering on the network"


def test_the_watch_dials_a_port_of_the_window_only_the_jobs_token_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from slurm_multi.net import port_window, read_local_port_range

    monkeypatch.setenv("SM_BARRIER_TOKEN", "s3cret-token")
    port = job.reach_port(29500, "4242")
    start, end = port_window(read_local_port_range())
    assert start <= port < end and port != 29500
    assert job.reach_port(29500, "4242") == port  # every look of the job: the same port
    monkeypatch.setenv("SM_BARRIER_TOKEN", "another-token")
    assert job.reach_port(29500, "4242") != port  # another user cannot work it out
    assert job.reach_port(0, "4242") == 0
    monkeypatch.delenv("SM_BARRIER_TOKEN")
    assert job.reach_port(29500, "4242") == 0
    # Never the workload's MASTER_PORT, even when the token picks it.
    picked = reach.secret_port("t", "1", 0, (32768, 60999))
    assert reach.secret_port("t", "1", picked, (32768, 60999)) == picked + 1


# ---- the node's own fault ------------------------------------------------------------------------


def test_a_clock_step_during_the_run_is_the_nodes_fault_a_slew_is_not() -> None:
    wall, boot = [1000.0], [50.0]
    clock = nodefault.ClockWatch(wall=lambda: wall[0], boot=lambda: boot[0])
    wall[0], boot[0] = 1010.5, 61.0  # 0.5 s of drift in 10 s
    assert clock.fault() == ""
    wall[0] = 4611.0  # stepped an hour forward
    assert clock.fault() == "its clock jumped 3600 s forward during the run (more than 2 s)"
    wall[0] = 1000.0
    assert "jumped 11 s back" in clock.fault()


def test_a_docker_engine_that_does_not_answer_is_the_nodes_fault(tmp_path: Path) -> None:
    path, server = engine(tmp_path, {"/_ping": b"OK"})
    try:
        assert nodefault.engine_fault({"DOCKER_HOST": f"unix://{path}"}, "node2") == ""
    finally:
        server.close()
    os.unlink(path)
    found = nodefault.engine_fault({"DOCKER_HOST": f"unix://{path}"}, "node2")
    assert found.startswith("the docker engine on node2 stopped answering during the run")
    assert nodefault.engine_fault({"DOCKER_HOST": "tcp://10.0.0.1:2375"}, "node2") == ""  # not ours to ask
    hung = socket.socket(socket.AF_UNIX)  # accepts, never answers
    hung.bind(str(tmp_path / "hung.sock"))
    hung.listen(1)
    try:
        found = nodefault.engine_fault({"DOCKER_HOST": f"unix://{tmp_path}/hung.sock"}, "node2", timeout=0.3)
    finally:
        hung.close()
    assert "no answer within 0.3 s" in found


def test_a_disk_that_fails_or_hangs_is_the_nodes_fault_a_full_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert nodefault.disk_fault(str(tmp_path)) == ""
    assert not (tmp_path / nodefault.PROBE_NAME).exists()
    assert nodefault.disk_fault(str(tmp_path / "gone")) == ""  # a scratch dir removed: no disk fault

    def failing(code: int):  # noqa: ANN202
        def fsync(fd: int) -> None:
            raise OSError(code, os.strerror(code))

        return fsync

    monkeypatch.setattr(os, "fsync", failing(errno.EIO))
    assert nodefault.disk_fault(str(tmp_path)) == (
        f"its local disk failed during the run (writing in {tmp_path}: Input/output error)"
    )
    monkeypatch.setattr(os, "fsync", failing(errno.EROFS))
    assert "Read-only file system" in nodefault.disk_fault(str(tmp_path))
    # Full: the workload may have filled it itself; a requeue would carry that to every node.
    monkeypatch.setattr(os, "fsync", failing(errno.ENOSPC))
    assert nodefault.disk_fault(str(tmp_path)) == ""
    monkeypatch.setattr(os, "fsync", lambda fd: time.sleep(2))
    started = time.monotonic()
    assert "hung during the run" in nodefault.disk_fault(str(tmp_path), timeout=0.2)
    assert time.monotonic() - started < 1.5  # the caller is not held by the disk


def test_node_fault_prints_the_hang_watchs_fault_else_what_it_finds_else_nothing(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "slurm_multi", "node", "fault", "--node", "node2"]
    env = {**ENV, "DOCKER_HOST": f"unix://{tmp_path}/none.sock"}
    healthy = subprocess.run([*cmd, "--runtime", "none", "--scratch", str(tmp_path)],
                             capture_output=True, text=True, env=env)  # fmt: skip
    assert healthy.returncode == 0 and healthy.stdout == "", healthy.stderr
    dead = subprocess.run([*cmd, "--runtime", "docker", "--scratch", str(tmp_path)],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert dead.returncode == 0 and dead.stdout.startswith("the docker engine on node2 stopped answering")
    (tmp_path / "hang.json").write_text(json.dumps({"rank": 1, "node_fault": "its clock jumped 60 s back"}))
    named = subprocess.run([*cmd, "--runtime", "docker", "--hang-json", str(tmp_path / "hang.json")],
                           capture_output=True, text=True, env=env)  # fmt: skip
    assert named.stdout == "its clock jumped 60 s back\n"


def test_status_json_carries_the_node_fault_only_when_there_is_one(tmp_path: Path) -> None:
    plain = statusfile.status_document(1, "node2", 3, "container exited 3", "", (), terminated=False)
    assert statusfile.NODE_FAULT not in plain
    path = tmp_path / "node_1" / "status.json"
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "status", "--file", str(path), "--rank", "1", "--node",
         "node2", "--exit-code", "125", "--reason", "x: container exited 125", "--node-fault",
         "the docker engine on node2 stopped answering during the run"],
        capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        json.loads(path.read_text())["node_fault"]
        == "the docker engine on node2 stopped answering during the run"
    )


def test_a_node_fault_is_printed_and_stored_with_its_secrets_masked(tmp_path: Path) -> None:
    # hang.json is a file on the shared disk and --node-fault text we did not write: masked as a reason
    (tmp_path / "hang.json").write_text(json.dumps({"node_fault": "disk dead awsSECRETvalue12345"}))
    env = {**ENV, "AWS_SECRET_ACCESS_KEY": "awsSECRETvalue12345", "API_TOKEN": "tok_abcdef_123456"}
    printed = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "fault", "--runtime", "none", "--hang-json",
         str(tmp_path / "hang.json")], capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert printed.returncode == 0 and printed.stdout == "disk dead ***\n", printed.stderr
    path = tmp_path / "node_1" / "status.json"
    stored = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "status", "--file", str(path), "--rank", "1", "--node",
         "node2", "--exit-code", "1", "--node-fault", "docker down tok_abcdef_123456"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    assert "tok_abcdef" not in path.read_text()
    assert json.loads(path.read_text())["node_fault"] == "docker down ***"


class StuckTarget:
    """A workload that is alive and never moves (the hang watch's Target, without a process)."""

    container, step = "sm-1-r1", ""

    def alive(self) -> bool:
        return True

    def cpu_seconds(self) -> float:
        return 1.0

    def frozen(self) -> tuple[bool, str]:
        return False, ""

    def threads(self) -> list:
        return [hangwatch.Thread(10, 10, "S", "python", "pipe_write")]

    def start(self, wait: float, parent: int = 0) -> bool:
        return True


def test_a_hang_under_which_the_node_failed_names_the_nodes_fault(tmp_path: Path) -> None:
    now = [1000.0]

    def clock() -> float:
        now[0] += 1
        return now[0]

    (tmp_path / "node.log").write_text("")
    fault = "the docker engine on node2 stopped answering"
    rc = hangwatch.watch(StuckTarget(), str(tmp_path / "node.log"), 5, str(tmp_path), 1, "node2", poll=0.001,
                         clock=clock, node_check=lambda: fault)  # fmt: skip
    assert rc == hangwatch.EXIT_HUNG
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert hang["node_fault"] == fault
    assert hangwatch.hang_line(hang).startswith("hung because its node failed: the docker engine on node2")
    assert nodefault.read_hang_fault(str(tmp_path / "hang.json")) == hang["node_fault"]
    # A hang in the workload on a healthy node: no node fault, the line says hung.
    rc = hangwatch.watch(StuckTarget(), str(tmp_path / "node.log"), 5, str(tmp_path), 1, "node2", poll=0.001,
                         clock=clock, node_check=lambda: "")  # fmt: skip
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert "node_fault" not in hang and hangwatch.hang_line(hang).startswith("hung: no output")


# ---- collect: the bad nodes of the run ------------------------------------------------------------


def _report(rank: int, node: str, status: str = "ok", node_fault: str = "") -> NodeReport:
    return NodeReport(rank, node, status=status, node_fault=node_fault)


def test_a_lost_node_and_a_nodes_own_fault_are_bad_nodes_of_the_run(tmp_path: Path) -> None:
    hosts = ["node1", "node2", "node3", "node4"]
    lost.record(str(tmp_path), "node2", "network", "node2 stopped answering on the network", [1])
    lost.record(str(tmp_path), "node4", "vanished", watch.vanished_reason("node4", 3), [3])
    nodes = [_report(0, "node1", "terminated"), _report(1, "node2", "failed"),
             _report(2, "node3", "failed", node_fault="its local disk failed during the run"),
             _report(3, "node4", "failed")]  # fmt: skip
    # The evidence: the batch host's (peers), the node's own (local), a task that may never have
    # started for a reason another user caused (none: requeued around, not quarantined).
    assert judge_run(tmp_path, nodes, hosts) == [
        {"rank": 1, "node": "node2", "cause": "run",
         "reason": "lost during the run: node2 stopped answering on the network", "evidence": "peers"},
        {"rank": 2, "node": "node3", "cause": "run", "reason": "its local disk failed during the run",
         "evidence": "local"},
        {"rank": 3, "node": "node4", "cause": "run",
         "reason": "lost during the run: the task of rank 3 on node4 vanished without a status, and the "
                   "reaper could not reach it", "evidence": "none"},
    ]  # fmt: skip


def test_a_hang_or_a_workloads_failure_on_healthy_nodes_names_no_node(tmp_path: Path) -> None:
    nodes = [_report(0, "node1", "failed"), _report(1, "node2", "terminated"), _report(2, "node3", "missing")]
    assert judge_run(tmp_path, nodes, ["node1", "node2", "node3"]) == []


def test_with_several_ranks_per_node_the_bad_node_is_named_once_by_its_index(tmp_path: Path) -> None:
    nodes = [_report(r, f"node{r // 2 + 1}", "failed", node_fault="disk" if r >= 2 else "") for r in range(4)]
    assert [(b["rank"], b["node"]) for b in judge_run(tmp_path, nodes, ["node1", "node2"], 2)] == [
        (1, "node2")
    ]


def test_after_the_reaper_a_rank_without_a_status_on_a_node_it_did_not_reach_loses_that_node(
    tmp_path: Path,
) -> None:
    statusfile.write_status(str(tmp_path / "node_0" / "status.json"),
                            statusfile.status_document(0, "node1", 143, "", "", (), True))  # fmt: skip
    argv = ["mark-lost", "--jobdir", str(tmp_path), "--nodes", "node1 node2", "--tasks-per-node", "2",
            "--vanished"]  # fmt: skip
    # The reaper step never started (a node of it down): nothing is known, nobody is blamed.
    result = CliRunner().invoke(job.cli, argv)
    assert result.exit_code == 0 and lost.read(str(tmp_path)) == {}, result.output
    # It reached node1 (its two ranks' `reap` events), not node2.
    for rank in (0, 1):
        (tmp_path / f"node_{rank}").mkdir(exist_ok=True)
        assert events.write_event(str(tmp_path / f"node_{rank}"), "reap", 1.0, rank=rank, host="node1")
    result = CliRunner().invoke(job.cli, argv)
    assert result.exit_code == 0, result.output
    # node1's rank 1 has no status either, but the reaper reached node1: not lost. node2's ranks 2
    # and 3: its node is lost, once, by its first rank.
    assert {n: e["how"] for n, e in lost.read(str(tmp_path)).items()} == {"node2": "vanished"}
    assert lost.read(str(tmp_path))["node2"]["reason"] == watch.vanished_reason("node2", 2)
    assert all((tmp_path / f"node_{r}" / "status.json").exists() for r in (2, 3))
    assert "vanished without a status" in result.output


def _job(root: Path) -> Path:
    job_json = {"job_id": "77", "model": "m", "nnodes": 3, "nodes": ["node1", "node2", "node3"],
                "settings": {"SM_FITNESS": "on"}}  # fmt: skip
    root.mkdir()
    (root / "job.json").write_text(json.dumps(job_json))
    for rank, node in enumerate(job_json["nodes"]):
        status = statusfile.status_document(rank, node, 143, "terminated by a signal", "",
                                            ("run:20:terminated",), terminated=True)  # fmt: skip
        statusfile.write_status(str(root / f"node_{rank}" / "status.json"), status)
    return root


def test_collect_names_a_node_lost_mid_run_a_bad_node_and_writes_its_cause_for_the_requeue(
    tmp_path: Path,
) -> None:
    jobdir = _job(tmp_path / "job")
    reason = watch.slurm_reason("node2", "DOWN+NOT_RESPONDING")
    lost.record(str(jobdir), "node2", "slurm", reason, [1])
    summary = collect(jobdir, write=False)
    assert summary.verdict == "FAILURE"
    assert summary.bad_nodes == [
        {
            "rank": 1,
            "node": "node2",
            "cause": "run",
            "reason": f"lost during the run: {reason}",
            "evidence": "peers",
        }
    ]
    assert summary.reasons[0] == f"bad node node2 (node 1): lost during the run: {reason}"
    bad = tmp_path / "bad"
    argv = [sys.executable, "-m", "slurm_multi", "results", "collect", str(jobdir), "--no-picture"]
    proc = subprocess.run([*argv, "--bad-nodes", str(bad)], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 1, proc.stderr
    assert bad.read_text() == f"1\tnode2\tlost during the run: {reason}\tpeers\trun\n"


def test_a_requeue_for_a_node_lost_during_the_run_is_recorded_with_the_cause_run() -> None:
    document = attempts.record(0, "run", 40, "node2", ["node2\tlost during the run: x"], now=0)
    assert document["cause"] == "run" and document["bad_nodes"] == [
        {"node": "node2", "reason": "lost during the run: x"}
    ]
