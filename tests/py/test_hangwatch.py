"""The hang watch on real processes: quiet and idle is hung; quiet but computing, or chatty but
idle, is not; the cause (stopped, sleeping) is told from a waiter (blocked in a socket wait)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_engine import engine
from slurm_multi import hangwatch
from slurm_multi.common import HelperError
from slurm_multi.events import parse_line
from slurm_multi.hangwatch import Target, Thread, classify, hang_line

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    # Each started in a session of its own: the whole tree goes (a stand-in slurmstepd's task outlived
    # its parent's kill, a loop left running after the suite).
    for proc in started:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
        proc.wait()


def start(procs: list[subprocess.Popen], argv: list[str], out: Path) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=out.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(proc)
    return proc


def run_watch(pid: int, out: Path, tmp_path: Path, timeout: float) -> int:
    return hangwatch.watch(
        Target(pid=pid), str(out), timeout, str(tmp_path), 1, "node2", poll=0.1, progress_every=0.2,
        diagnostics=str(tmp_path / "diagnostics"),
    )  # fmt: skip


def test_a_rank_that_sleeps_without_output_is_hung_and_the_cause(procs: list, tmp_path: Path) -> None:
    out = tmp_path / "node.log"
    proc = start(procs, ["sh", "-c", "echo started; sleep 60"], out)
    began = time.time()
    assert run_watch(proc.pid, out, tmp_path, 1.0) == hangwatch.EXIT_HUNG
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert hang["role"] == "cause" and hang["state"] == "sleeping"
    assert hang["rank"] == 1 and hang["node"] == "node2" and hang["hang_timeout"] == 1.0
    assert hang["quiet_seconds"] >= 1.0 and began - 1 <= hang["last_progress_epoch"] <= hang["detected_epoch"]
    assert {p["comm"] for p in hang["processes"]} >= {"sh", "sleep"}
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["rank"] == 1 and progress["last_output_epoch"] == hang["last_output_epoch"]
    listing = (tmp_path / "diagnostics" / "hang-processes.txt").read_text()
    assert "sleep" in listing and "WCHAN" in listing
    assert (tmp_path / "diagnostics" / "kernel-stacks.txt").read_text().startswith("== pid")
    assert (tmp_path / "diagnostics" / "sockets.txt").exists()
    assert hang_line(hang).startswith("hung: no output and no CPU for 1 s since ")


def test_quiet_but_computing_is_not_hung(procs: list, tmp_path: Path) -> None:
    out = tmp_path / "node.log"
    busy = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    proc = start(procs, [sys.executable, "-c", busy], out)
    assert run_watch(proc.pid, out, tmp_path, 1.0) == 0
    assert not (tmp_path / "hang.json").exists()
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["cpu_seconds"] > 0.5 and progress["last_cpu_epoch"] > progress["last_output_epoch"]


def test_chatty_but_idle_is_not_hung(procs: list, tmp_path: Path) -> None:
    out = tmp_path / "node.log"
    proc = start(
        procs, ["sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo tick $i; sleep 0.25; done"], out
    )
    assert run_watch(proc.pid, out, tmp_path, 1.0) == 0
    assert not (tmp_path / "hang.json").exists()
    # Its first output line is on the node's timeline, once.
    events = [parse_line(line) for line in (tmp_path / "events.log").read_bytes().splitlines()]
    assert [(e["event"], e["rank"], e["host"]) for e in events] == [("first_output", 1, "node2")]


def test_the_first_line_is_on_the_timeline_within_the_time_it_took(
    procs: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 1-s poll put a toy's first line, printed 0.1 s in, at 1 s on the timeline (and the batch
    # step's warm helper, woken by it, imported at the workload's end): until the first line the
    # watch looks again after 0.05 s, then twice the last wait, up to the poll; then every poll.
    waits: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        real_sleep(seconds)

    out = tmp_path / "node.log"
    line = "import time\ntime.sleep(0.3)\nprint(repr(time.time()), flush=True)\ntime.sleep(2.5)\n"
    proc = start(procs, [sys.executable, "-c", line], out)
    monkeypatch.setattr(hangwatch.time, "sleep", sleep)
    assert hangwatch.watch(Target(pid=proc.pid), str(out), 30.0, str(tmp_path), 0, "node1", poll=1.0) == 0
    printed_at = float(out.read_text().split()[0])
    events = [parse_line(line) for line in (tmp_path / "events.log").read_bytes().splitlines()]
    assert [e["event"] for e in events] == ["first_output"]
    first = events[0]["t"]
    # Looked at again after 0.05, 0.1, 0.2 ... s: the line was seen within the wait that followed it.
    before = [w for w in waits if w < 1.0]
    assert before[:3] == [0.05, 0.1, 0.2] and before == sorted(before)
    assert printed_at <= first <= printed_at + max(before) + 0.5
    # Then every poll (1 s), the line seen.
    assert waits[len(before) :] and set(waits[len(before) :]) == {1.0}


def test_a_stopped_rank_is_the_cause(procs: list, tmp_path: Path) -> None:
    out = tmp_path / "node.log"
    proc = start(procs, [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"], out)
    os.kill(proc.pid, signal.SIGSTOP)
    assert run_watch(proc.pid, out, tmp_path, 0.8) == hangwatch.EXIT_HUNG
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert (hang["role"], hang["state"]) == ("cause", "stopped")
    assert "SIGSTOP" in hang["detail"] and f"[{proc.pid}]" in hang["detail"]


def watch_connected(procs: list, tmp_path: Path, body: str) -> dict:
    """Watch a Python workload connected to a socket of ours (`s`) that runs `body`; its hang.json."""
    out = tmp_path / "node.log"
    server = socket.create_server(("127.0.0.1", 0))
    code = "import select, socket, threading\n"
    code += f"s = socket.create_connection(('127.0.0.1', {server.getsockname()[1]}))\n"
    proc = start(procs, [sys.executable, "-c", code + body], out)
    conn, _ = server.accept()
    try:
        assert run_watch(proc.pid, out, tmp_path, 1.0) == hangwatch.EXIT_HUNG
    finally:
        conn.close()
        server.close()
    hang = json.loads((tmp_path / "hang.json").read_text())
    if not any(p["wchan"] for p in hang["processes"]):
        pytest.fail(f"wait channels unreadable for our own child: {hang['processes']}")
    return hang


def test_a_rank_blocked_on_a_socket_is_a_waiter(procs: list, tmp_path: Path) -> None:
    hang = watch_connected(procs, tmp_path, "print('connected', flush=True)\ns.recv(1)")
    assert (hang["role"], hang["state"]) == ("waiter", "socket-wait"), hang
    assert hang_line(hang).startswith("waiting on another rank: no output and no CPU for ")


def test_a_workload_that_ends_is_not_watched_further(procs: list, tmp_path: Path) -> None:
    out = tmp_path / "node.log"
    proc = start(procs, ["sh", "-c", "sleep 0.3"], out)
    assert run_watch(proc.pid, out, tmp_path, 5.0) == 0
    assert not (tmp_path / "hang.json").exists()
    # It ended before the first periodic write: progress.json still says when it last moved.
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["rank"] == 1 and progress["updated_epoch"] >= progress["last_output_epoch"]


def threads(*rows: tuple[str, str, str]) -> list[Thread]:
    """One single-threaded process per row."""
    return [Thread(100 + i, 100 + i, state, comm, wchan) for i, (comm, state, wchan) in enumerate(rows)]


@pytest.mark.parametrize(
    ("rows", "frozen", "expected"),
    [
        ([("python3", "D", "__refrigerator")], True, ("cause", "frozen")),
        ([("python3", "T", "do_signal_stop"), ("python3", "S", "ep_poll")], False, ("cause", "stopped")),
        ([("python3", "D", "io_schedule"), ("python3", "S", "ep_poll")], False, ("cause", "disk-sleep")),
        ([("python3", "R", ""), ("python3", "S", "ep_poll")], False, ("cause", "spinning")),
        ([("py", "S", "futex_wait_queue"), ("py", "S", "ep_poll")], False, ("waiter", "socket-wait")),
        ([("python3", "S", "sk_wait_data")], False, ("waiter", "socket-wait")),
        ([("sh", "S", "do_wait"), ("sleep", "S", "hrtimer_nanosleep")], False, ("cause", "sleeping")),
        ([("docker-init", "S", "ep_poll"), ("sleep", "S", "do_nanosleep")], False, ("cause", "sleeping")),
        ([("python3", "S", "")], False, ("cause", "sleeping")),
        ([("docker-init", "S", "do_sigtimedwait")], False, ("cause", "sleeping")),
    ],
)  # fmt: skip
def test_classify_tells_the_cause_from_the_waiters(
    rows: list, frozen: bool, expected: tuple[str, str]
) -> None:
    role, state, detail = classify(threads(*rows), frozen, "docker pause")
    assert (role, state) == expected and detail


def test_the_command_refuses_bad_arguments_in_one_line(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "hang-watch", "--pid", "1", "--timeout", "0",
         "--output", "x", "--node-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "must be positive" in proc.stderr and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "hang-watch", "--timeout", "5"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_a_thread_is_spinning_only_when_runnable_in_every_look() -> None:
    looks = [
        [Thread(1, 1, "R", "py", ""), Thread(1, 2, "S", "py", "ep_poll"), Thread(1, 3, "R", "py", "")],
        [
            Thread(1, 1, "S", "py", "futex_wait_queue"),
            Thread(1, 2, "S", "py", "ep_poll"),
            Thread(1, 3, "R", "py", ""),
        ],
        [
            Thread(1, 1, "S", "py", "futex_wait_queue"),
            Thread(1, 2, "R", "py", ""),
            Thread(1, 3, "R", "py", ""),
        ],
    ]
    merged = {t.tid: t for t in hangwatch.merge_samples(looks)}
    assert (merged[1].state, merged[1].wchan) == ("S", "futex_wait_queue")
    assert (merged[2].state, merged[2].wchan) == ("S", "ep_poll")
    assert merged[3].state == "R"
    # Briefly runnable threads of a waiter do not make it spinning (its main thread on a futex, a
    # helper in epoll: unclear until collect compares the ranks).
    waiter = [[t for t in look if t.tid != 3] for look in looks]
    assert classify(hangwatch.merge_samples(waiter), False)[:2] == ("unclear", "lock-wait")
    assert classify(hangwatch.merge_samples(looks), False)[:2] == ("cause", "spinning")
    # A thread seen only in some looks (it came and went) is not spinning either.
    assert hangwatch.merge_samples([[Thread(1, 9, "R", "py", "")], []])[0].state == "S"


def test_diagnostics_never_run_the_containers_binaries_with_privilege(tmp_path: Path) -> None:
    # A workload that hangs on purpose may have replaced /bin/cat or py-spy: a docker shim records
    # how the snapshot calls into the container; none of it may be --privileged.
    shim = tmp_path / "docker"
    calls = tmp_path / "calls"
    probe = 'case "$*" in *"command -v py-spy"*) echo /usr/bin/py-spy ;; esac'
    shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >>{calls}\n{probe}\n')
    shim.chmod(0o755)
    target = Target(container="sm-1-r0", docker=str(shim))
    me = os.getpid()
    hang = {"processes": [{"pid": me, "tid": me, "state": "S", "wchan": "do_select", "comm": "python3"}]}
    hangwatch.snapshot(target, hang, str(tmp_path / "diagnostics"))
    lines = calls.read_text().splitlines()
    assert lines and not [line for line in lines if "--privileged" in line]
    assert "exec sm-1-r0 /usr/bin/py-spy dump --pid" in "\n".join(lines)
    assert (tmp_path / "diagnostics" / "kernel-stacks.txt").read_text().startswith(f"== pid {me}")


def test_the_container_s_first_process_is_asked_of_the_engine_s_socket_not_the_docker_cli(
    procs: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workload = start(procs, ["sleep", "60"], tmp_path / "out")
    created = json.dumps({"State": {"Pid": 0, "Running": False}}).encode()
    running = json.dumps({"State": {"Pid": workload.pid, "Running": True}}).encode()
    answers: dict = {"/containers/sm-1-r0/json": created}
    path, server = engine(tmp_path, answers)
    shim = tmp_path / "docker-cli-was-run"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").write_text(f"#!/bin/sh\ntouch {shim}\n")
    (tmp_path / "bin" / "docker").chmod(0o755)
    try:
        target = Target(container="sm-1-r0")
        threading.Timer(0.3, lambda: answers.update({"/containers/sm-1-r0/json": running})).start()
        assert target.start(5)  # created, not yet running: it waits for it
        assert target.init_pid == workload.pid and target.alive()
        assert not Target(container="sm-9-r9").start(0.5)  # no such container (404): never ran
    finally:
        server.close()
    assert not shim.exists()
    # A tcp:// engine is the docker CLI's to ask.
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")
    assert not Target(container="sm-1-r0").start(0.3)
    assert shim.exists()


def _peer(job: Path, rank: int, name: str, document: dict) -> None:
    (job / f"node_{rank}").mkdir(parents=True, exist_ok=True)
    (job / f"node_{rank}" / name).write_text(json.dumps(document))


def test_a_peer_is_accounted_for_by_its_hang_its_status_or_progress_after_the_cause(tmp_path: Path) -> None:
    peers = hangwatch.Peers(str(tmp_path), 5, 3.0)
    _peer(tmp_path, 1, "hang.json", {"role": "waiter"})
    _peer(tmp_path, 2, "status.json", {"state": "FAILED"})
    _peer(tmp_path, 3, "progress.json", {"last_output_epoch": 50.0, "last_cpu_epoch": 120.0})
    _peer(tmp_path, 4, "progress.json", {"last_output_epoch": 90.0, "last_cpu_epoch": 99.0})
    assert [peers.accounted(r, since=100.0) for r in (1, 2, 3, 4)] == [True, True, True, False]
    # No node dir yet, or a record that cannot be read: not accounted for (and no traceback).
    assert not peers.accounted(0, since=100.0)
    (tmp_path / "node_4" / "progress.json").write_text('{"last_output_epoch": "x"')
    assert not peers.accounted(4, since=100.0)
    (tmp_path / "node_4" / "progress.json").write_text("[1]")
    assert not peers.accounted(4, since=100.0)


def watch_in_job(procs: list, job: Path, rank: int, argv: list[str], timeout: float, peers: int, hold: float):
    """The watch of rank `rank` of a `peers`-rank job in `job`, on a real process: (exit, hang.json)."""
    node_dir = job / f"node_{rank}"
    node_dir.mkdir(parents=True, exist_ok=True)
    proc = start(procs, argv, node_dir / "node.log")
    code = hangwatch.watch(
        Target(pid=proc.pid), str(node_dir / "node.log"), timeout, str(node_dir), rank, f"node{rank + 1}",
        poll=0.1, progress_every=0.2, peers=hangwatch.Peers(str(job), peers, hold),
    )  # fmt: skip
    return code, json.loads((node_dir / "hang.json").read_text())


def test_a_cause_holds_its_stop_until_the_waiters_have_spoken_and_no_longer(
    procs: list, tmp_path: Path
) -> None:
    """Stopping the cause ends the others' wait: a waiter not yet classified would be lost. The
    cause's watch waits for rank 0's hang.json (written 1 s into the hold), then returns at once."""
    job = tmp_path / "job"
    writer = subprocess.Popen(
        ["sh", "-c", f"while [ ! -e {job}/node_1/hang.json ]; do sleep 0.05; done; sleep 1; "
         f"mkdir -p {job}/node_0 && echo '{{}}' >{job}/node_0/hang.json"]
    )  # fmt: skip
    procs.append(writer)
    code, hang = watch_in_job(procs, job, 1, ["sh", "-c", "echo started; sleep 60"], 1.0, 2, 30.0)
    assert code == hangwatch.EXIT_HUNG
    assert hang["peers_unaccounted"] == [] and 0.8 <= hang["held_seconds"] < 30


def test_a_cause_gives_up_on_silent_peers_after_the_hold(procs: list, tmp_path: Path) -> None:
    code, hang = watch_in_job(procs, tmp_path / "job", 0, ["sh", "-c", "echo started; sleep 60"], 0.5, 3, 0.6)
    assert code == hangwatch.EXIT_HUNG
    assert hang["peers_unaccounted"] == [1, 2] and hang["held_seconds"] >= 0.5


def test_a_waiter_holds_its_stop_too_until_the_others_have_spoken(procs: list, tmp_path: Path) -> None:
    """Stopping a waiter closes its sockets: the ranks still waiting on it fail and move, and one
    whose watch had not spoken yet was lost from the summary (a CI run: rank 0 timed out beside the
    cause and stopped at once; rank 2, its quiet clock restarted by a CPU blip, failed before it read
    the cause's word). A waiter holds like a cause: here until ranks 0 and 1 speak, 1 s in."""
    job = tmp_path / "job"
    writer = subprocess.Popen(
        ["sh", "-c", f"while [ ! -e {job}/node_2/hang.json ]; do sleep 0.05; done; sleep 1; "
         f"mkdir -p {job}/node_0 {job}/node_1 && echo '{{}}' >{job}/node_0/hang.json && "
         f"echo '{{}}' >{job}/node_1/hang.json"]
    )  # fmt: skip
    procs.append(writer)
    server = socket.create_server(("127.0.0.1", 0))
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {server.getsockname()[1]}))\n"
    code += "print('connected', flush=True)\ns.recv(1)"
    try:
        result, hang = watch_in_job(procs, job, 2, [sys.executable, "-c", code], 1.0, 3, 60.0)
    finally:
        server.close()
    assert result == hangwatch.EXIT_HUNG and hang["role"] == "waiter"
    assert hang["peers_unaccounted"] == [] and 0.8 <= hang["held_seconds"] < 30
    # It announced nothing: only a cause makes the others speak.
    assert not (job / hangwatch.CAUSE_FILE).exists()


def test_a_waiter_speaks_when_a_cause_is_announced_not_at_its_own_timeout(
    procs: list, tmp_path: Path
) -> None:
    """A rank waiting on a hung one speaks as soon as the cause's watch announces it (3 polls of
    quiet, at least 2 s), long before its own 60 s timeout, which a CPU blip of its runtime may
    have restarted: then the cause's hold finds it and it is listed as a waiter."""
    job = tmp_path / "job"
    job.mkdir()
    # Announced half a second after the watch started (as the cause's watch writes it: renamed in).
    (tmp_path / "cause").write_text(
        json.dumps({"rank": 1, "node": "node2", "detected_epoch": time.time() + 0.5})
    )
    writer = subprocess.Popen(["sh", "-c", f"sleep 0.5; mv {tmp_path}/cause {job}/{hangwatch.CAUSE_FILE}"])
    procs.append(writer)
    began = time.time()
    # The cause (rank 1) and the third rank have spoken: its hold ends at once.
    for rank in (1, 2):
        (job / f"node_{rank}").mkdir()
        (job / f"node_{rank}" / "hang.json").write_text("{}")
    code, hang = watch_in_job(procs, job, 0, ["sh", "-c", "echo started; sleep 60"], 60.0, 3, 30.0)
    assert code == hangwatch.EXIT_HUNG and time.time() - began < 10
    assert hang["spoke_for"]["rank"] == 1 and hang["spoke_for"]["node"] == "node2"
    assert 2.0 <= hang["quiet_seconds"] < 10
    assert hang["peers_unaccounted"] == [] and hang["held_seconds"] < 1
    # It is not a second cause: the announcement stays the cause's.
    assert json.loads((job / hangwatch.CAUSE_FILE).read_text())["rank"] == 1


def test_a_rank_that_moves_when_a_cause_is_announced_shows_it_at_once_and_keeps_running(
    procs: list, tmp_path: Path
) -> None:
    """A printing rank never speaks for the cause; its progress record is written every poll while
    the cause is known, so the cause's hold counts it as moving within a poll."""
    job = tmp_path / "job"
    (job / "node_2").mkdir(parents=True)
    announcement = {"rank": 1, "node": "node2", "detected_epoch": time.time() + 1}
    (job / hangwatch.CAUSE_FILE).write_text(json.dumps(announcement))
    proc = start(procs, ["sh", "-c", "i=0; while [ $i -lt 30 ]; do echo $i; i=$((i+1)); sleep 0.1; done"],
                 job / "node_2" / "node.log")  # fmt: skip
    records = []

    def clock() -> float:
        now = time.time()
        try:
            records.append(json.loads((job / "node_2" / "progress.json").read_text())["updated_epoch"])
        except (OSError, ValueError):
            pass
        return now

    code = hangwatch.watch(
        Target(pid=proc.pid), str(job / "node_2" / "node.log"), 60.0, str(job / "node_2"), 2, "node3",
        poll=0.1, progress_every=30.0, peers=hangwatch.Peers(str(job), 3, 5.0), clock=clock,
    )  # fmt: skip
    assert code == 0 and not (job / "node_2" / "hang.json").exists()
    # Rewritten poll after poll (progress_every is 30 s), not once.
    assert len(set(records)) >= 10


def test_an_announcement_before_this_watch_started_or_its_own_is_not_a_cause(tmp_path: Path) -> None:
    peers = hangwatch.Peers(str(tmp_path), 3, 5.0)
    assert peers.cause(0, since=100.0) is None  # none yet
    peers.announce({"rank": 1, "node": "node2", "detected_epoch": 90.0})
    assert peers.cause(0, since=100.0) is None  # a requeued attempt's
    peers.announce({"rank": 1, "node": "node2", "detected_epoch": 110.0})
    assert peers.cause(0, since=100.0) == {"rank": 1, "node": "node2", "detected_epoch": 110.0}
    assert peers.cause(1, since=100.0) is None  # its own
    (tmp_path / hangwatch.CAUSE_FILE).write_text('{"rank": "x"')
    assert peers.cause(0, since=100.0) is None


def test_a_requeued_attempt_takes_the_cause_file_with_it():
    text = (REPO / "lib" / "job.sh").read_text()
    body = text[text.index("job::keep_attempt() {") :]
    assert hangwatch.CAUSE_FILE in body[: body.index("\n}\n")]


def test_a_pid_another_process_got_is_not_the_workload(procs: list, tmp_path: Path) -> None:
    proc = start(procs, ["sleep", "30"], tmp_path / "node.log")
    target = Target(pid=proc.pid)
    assert target.start(1.0) and target.alive() and target.start_ticks
    target.start_ticks = str(int(target.start_ticks) + 1)  # as if the PID had been reused
    assert not target.alive()


class EndsWhileLookedAt(Target):
    """A workload that exits the moment the watch samples its threads."""

    def threads(self) -> list[Thread]:
        os.kill(self.pid, signal.SIGKILL)
        time.sleep(0.2)
        return super().threads()


def test_a_workload_that_ends_while_it_is_classified_is_not_recorded_as_hung(
    procs: list, tmp_path: Path
) -> None:
    out = tmp_path / "node.log"
    proc = start(procs, ["sh", "-c", "echo started; exec sleep 60"], out)
    code = hangwatch.watch(
        EndsWhileLookedAt(pid=proc.pid), str(out), 0.5, str(tmp_path), 0, "node1",
        poll=0.1, progress_every=0.2,
    )  # fmt: skip
    assert code == 0 and not (tmp_path / "hang.json").exists()


def test_main_threads_decide_between_waiter_and_unclear() -> None:
    """Threads of one process (pid 7): a main thread in a socket wait makes a waiter; a main thread
    on a lock with only a helper on the network is unclear (a gloo waiter, or a deadlock)."""
    on_lock = [Thread(7, 7, "S", "python3", "futex_do_wait"), Thread(7, 8, "S", "python3", "do_select")]
    assert classify(on_lock, False)[:2] == ("unclear", "lock-wait")
    reading = [Thread(7, 7, "S", "python3", "sk_wait_data"), Thread(7, 8, "S", "python3", "futex_do_wait")]
    assert classify(reading, False)[:2] == ("waiter", "socket-wait")


def test_a_rank_deadlocked_on_a_lock_while_a_helper_polls_a_socket_is_not_a_waiter(
    procs: list, tmp_path: Path
) -> None:
    """Its main thread blocks on a lock it holds; a helper thread sits in select() on a socket.
    The old watch called it a waiter because one thread polled a socket."""
    hang = watch_connected(
        procs, tmp_path,
        "threading.Thread(target=lambda: select.select([s], [], []), daemon=True).start()\n"
        "lock = threading.Lock(); lock.acquire()\nprint('deadlocked', flush=True)\nlock.acquire()\n",
    )  # fmt: skip
    assert (hang["role"], hang["state"]) == ("unclear", "lock-wait"), hang
    assert "main thread asleep off the network (futex" in hang["detail"]
    assert hang_line(hang).startswith("hung or waiting on another rank (not told apart): ")


# ---- a pyxis rank: a Slurm step's tasks under its slurmstepd -------------------------------------

STEPD = (  # its sys.executable is lost with its argv[0]: the interpreter comes as an argument
    "import subprocess, sys\nchild = subprocess.Popen([sys.argv[2], '-c', sys.argv[1]])\nchild.wait()\n"
)


def start_step(procs: list, out: Path, step: str, task: str) -> subprocess.Popen:
    """A stand-in for slurmstepd (its cmdline says `slurmstepd: [JOB.STEP]`) whose child is the task."""
    argv = [
        "bash",
        "-c",
        f'exec -a "slurmstepd: [{step}]" "$0" -c "$1" "$2" "$0"',
        sys.executable,
        STEPD,
        task,
    ]
    return start(procs, argv, out)


def test_a_pyxis_rank_is_its_steps_tasks_under_slurmstepd(procs: list, tmp_path: Path) -> None:
    out = tmp_path / "node.log"
    assert hangwatch.step_daemon("77.3") == 0
    stepd = start_step(procs, out, "77.3", "import time\nwhile True: time.sleep(0.05)")
    target = Target(step="77.3")
    assert target.start(5)
    assert target.init_pid == stepd.pid
    wait_for_children = time.monotonic() + 5
    while not target.pids() and time.monotonic() < wait_for_children:
        time.sleep(0.05)
    tasks = target.pids()
    assert len(tasks) == 1 and stepd.pid not in tasks  # slurmstepd is Slurm's, not the workload
    assert Target(step="77.4").start(0.3) is False  # another step: none on this node
    # Its task stopped (SIGSTOP): hung, the cause, the task named.
    os.kill(tasks[0], signal.SIGSTOP)
    try:
        assert hangwatch.watch(Target(step="77.3"), str(out), 0.8, str(tmp_path), 1, "node2", poll=0.1,
                               progress_every=0.2) == hangwatch.EXIT_HUNG  # fmt: skip
    finally:
        os.kill(tasks[0], signal.SIGCONT)
    hang = json.loads((tmp_path / "hang.json").read_text())
    assert (hang["role"], hang["state"]) == ("cause", "stopped")
    assert f"[{tasks[0]}]" in hang["detail"]
    assert stepd.pid not in {p["pid"] for p in hang["processes"]}


def test_a_pyxis_rank_that_computes_quietly_is_not_hung_and_its_end_ends_the_watch(
    procs: list, tmp_path: Path
) -> None:
    out = tmp_path / "node.log"
    start_step(procs, out, "78.0", "import time\nend = time.time() + 2.5\nwhile time.time() < end: pass")
    assert hangwatch.watch(Target(step="78.0"), str(out), 1.0, str(tmp_path), 1, "node2", poll=0.1,
                           progress_every=0.2) == 0  # fmt: skip
    assert not (tmp_path / "hang.json").exists()


def test_step_must_be_job_dot_step(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "node", "hang-watch", "--step", "sm-rank0", "--timeout", "5",
         "--output", str(tmp_path / "log"), "--node-dir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "py")}, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "--step 'sm-rank0': expected JOB.STEP" in proc.stderr


def test_sigterm_from_the_run_stage_ends_the_watch_quietly_with_exit_0(tmp_path: Path) -> None:
    """The run stage SIGTERMs the watch when the workload ends: exit 0 and not a word on stderr (a
    traceback or an 'internal error' line there is an error pattern in the node log: a SUCCESS job
    judged FAILURE)."""
    workload = subprocess.Popen(["sleep", "60"])
    try:
        watch = subprocess.Popen(
            [sys.executable, "-m", "slurm_multi", "node", "hang-watch", "--pid", str(workload.pid),
             "--timeout", "60", "--output", str(tmp_path / "log"), "--node-dir", str(tmp_path),
             "--poll", "0.1", "--progress-every", "0.1"],
            env={**os.environ, "PYTHONPATH": str(REPO / "py")}, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not (tmp_path / "progress.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "progress.json").exists(), "the watch never wrote its progress"
        watch.send_signal(signal.SIGTERM)
        _, err = watch.communicate(timeout=20)
        assert (watch.returncode, err) == (0, "")
    finally:
        workload.kill()
        workload.wait()


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("usage_usec 123\nuser_usec 100\n", "usage_usec ", "123"),
        ("nr_periods 0\nusage_usec 77\n", "usage_usec ", "77"),
        ("xusage_usec 5\n", "usage_usec ", ""),  # the key starts a line, or it is not the key
        ("populated 1\nfrozen 1\n", "frozen ", "1"),
        ("populated 1\nfrozen 0", "frozen ", "0"),
        ("Name:\tpython3\nNSpid:\t4242\t7\nNSsid:\t1\n", "NSpid:", "4242\t7"),
        ("", "frozen ", ""),
        (None, "frozen ", ""),  # the file could not be read
    ],
)
def test_a_cgroup_or_proc_line_is_read_by_its_key(text: str | None, key: str, value: str) -> None:
    assert hangwatch._line_value(text, key) == value


@pytest.mark.parametrize("step, ok", [("4242.3", True), ("4242", False), ("4242.", False), (".3", False),
                                      ("4242.3.1", False), ("٣.3", False), ("42x.3", False)])  # fmt: skip
def test_a_step_is_job_dot_step_in_ascii_digits(step: str, ok: bool, tmp_path: Path) -> None:
    if ok:
        hangwatch.check_arguments(None, None, step, 5, 1, 1)
    else:
        with pytest.raises(HelperError, match="expected JOB.STEP"):
            hangwatch.check_arguments(None, None, step, 5, 1, 1)
