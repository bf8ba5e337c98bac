"""The fakes in tests/fakes/ behave like the real nsys / nsight-slurm as far as we know them.

Local processes and loopback only; `srun` is replaced by a recording stub where the wrapper's argv is
the subject.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from slurm_multi.coordinator import probe
from slurm_multi.reports import wait_for_reports

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
NSYS = FAKES / "nsys"
NS_HOME = FAKES / "nsight-slurm-home"
NSIGHT_SLURM = NS_HOME / "bin" / "nsight-slurm"
CONNECTOR = NS_HOME / "bin" / "nsight-slurm-connector"
BUSYBOX = shutil.which("busybox")
# the fake nsys must run under busybox sh (it is mounted into busybox-only containers)
SHELLS = ([[BUSYBOX, "sh"]] if BUSYBOX else []) + [["/bin/sh"]]
REPORT_BYTES = len(b"FAKE-NSYS-REP session=") + 6 * 64 * 1024  # plus the variable part of the header


def until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "NSYS_FAKE", "NSIGHT_FAKE", "FAKE_RECORD"))
    }
    clean["PATH"] = f"{Path(sys.executable).parent}:{clean.get('PATH', '/usr/bin:/bin')}"
    clean["NSYS_FAKE_STATE"] = str(tmp_path / "nsys-state")
    clean["NSYS_FAKE_WRITE_SECONDS"] = "0.3"
    return clean


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    """Background processes started in their own session; their whole group is killed afterwards."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def spawn(procs: list, argv: list, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [str(a) for a in argv],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    procs.append(proc)
    return proc


def run(argv: list, env: dict[str, str], cwd: Path, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


# --- nsys --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", SHELLS, ids=lambda s: " ".join(Path(p).name for p in s))
def test_nsys_writes_the_report_only_when_the_session_ends_and_it_grows(
    shell: list[str], env: dict[str, str], tmp_path: Path, procs: list
) -> None:
    env["NSYS_FAKE_WRITE_SECONDS"] = "1.2"
    app = "while [ ! -e go ]; do sleep 0.05; done; exit 3"
    (tmp_path / "out").mkdir()  # nsys does not create directories
    proc = spawn(
        procs, [*shell, NSYS, "profile", "-t", "cuda,nvtx", "-o", "out/rank0", "sh", "-c", app], env, tmp_path
    )
    report, qdstrm = tmp_path / "out" / "rank0.nsys-rep", tmp_path / "out" / "rank0.qdstrm"
    until(qdstrm.exists, what=".qdstrm while the app runs")
    time.sleep(0.3)
    assert not report.exists()  # nothing but the stream while the session is open
    (tmp_path / "go").touch()
    sizes = []
    while proc.poll() is None:
        if report.exists():
            sizes.append(report.stat().st_size)
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    assert proc.returncode == 3  # the app's exit status
    assert sizes == sorted(sizes) and len(set(sizes)) >= 3, sizes  # it grew in place
    assert sizes[0] == 0
    assert report.stat().st_size >= REPORT_BYTES
    assert not qdstrm.exists()
    assert "Generating 'out/rank0.qdstrm'" in stdout
    assert "Generated:\n    out/rank0.nsys-rep" in stdout


def test_nsys_expands_q_env_h_p_and_percent_in_the_output_name(env: dict[str, str], tmp_path: Path) -> None:
    env.update(SLURM_JOB_ID="42", SLURMD_NODENAME="node1", SLURM_PROCID="3")
    env.pop("UNSET_VAR", None)
    name = "%q{SLURM_JOB_ID}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}_%q{UNSET_VAR}_%h_%%"
    result = run([NSYS, "profile", f"--output={name}", "true"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    host = Path("/proc/sys/kernel/hostname").read_text().strip()
    assert (tmp_path / f"42_node1_rank3__{host}_%.nsys-rep").exists()
    pid_result = run([NSYS, "profile", "-o", "p%p", "true"], env, tmp_path)
    assert pid_result.returncode == 0
    assert len(list(tmp_path.glob("p[0-9]*.nsys-rep"))) == 1


def test_nsys_default_name_is_report_n_and_never_overwrites(env: dict[str, str], tmp_path: Path) -> None:
    for _ in range(2):
        assert run([NSYS, "profile", "true"], env, tmp_path).returncode == 0
    assert sorted(p.name for p in tmp_path.glob("*.nsys-rep")) == ["report1.nsys-rep", "report2.nsys-rep"]
    again = run([NSYS, "profile", "-o", "report1", "true"], env, tmp_path)
    assert again.returncode == 1 and "--force-overwrite true" in again.stderr
    assert (
        run([NSYS, "profile", "-o", "report1", "--force-overwrite", "true", "true"], env, tmp_path).returncode
        == 0
    )


def test_nsys_sigterm_ends_the_session_and_writes_the_report(
    env: dict[str, str], tmp_path: Path, procs: list
) -> None:
    proc = spawn(procs, [NSYS, "profile", "-o", "term", "sleep", "30"], env, tmp_path)
    until((tmp_path / "term.qdstrm").exists, what=".qdstrm")
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM  # the app died of the forwarded SIGTERM
    assert (tmp_path / "term.nsys-rep").stat().st_size >= REPORT_BYTES
    assert not (tmp_path / "term.qdstrm").exists()


def test_nsys_sigkill_leaves_only_the_qdstrm(env: dict[str, str], tmp_path: Path, procs: list) -> None:
    proc = spawn(procs, [NSYS, "profile", "-o", "killed", "sleep", "30"], env, tmp_path)
    until((tmp_path / "killed.qdstrm").exists, what=".qdstrm")
    proc.kill()
    proc.wait(timeout=10)
    time.sleep(0.5)
    assert not (tmp_path / "killed.nsys-rep").exists()
    assert (tmp_path / "killed.qdstrm").exists()
    # the leftover stream can still be converted
    imported = run([NSYS, "import", "killed.qdstrm"], env, tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert (tmp_path / "killed.nsys-rep").stat().st_size > 0


def test_nsys_stop_ends_running_sessions_and_waits_for_their_reports(
    env: dict[str, str], tmp_path: Path, procs: list
) -> None:
    proc = spawn(
        procs, [NSYS, "profile", "--session-new=mine", "-o", "stopped", "sleep", "30"], env, tmp_path
    )
    until((tmp_path / "stopped.qdstrm").exists, what=".qdstrm")
    stopped = run([NSYS, "stop", "--session=mine"], env, tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert (tmp_path / "stopped.nsys-rep").stat().st_size >= REPORT_BYTES  # written when stop returns
    proc.wait(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM
    none_left = run([NSYS, "stop"], env, tmp_path)
    assert none_left.returncode == 1 and "no active session" in none_left.stderr


def test_nsys_accepts_the_playbook_options(env: dict[str, str], tmp_path: Path) -> None:
    options = [
        "-t",
        "cuda-sw,nvtx,python-gil",
        "--cuda-graph-trace=graph",
        "--sample=none",
        "--cpuctxsw=none",
        "--capture-range=cudaProfilerApi",
        "--capture-range-end=repeat",
        "--kill",
        "none",
        "--wait=primary",
        "--force-overwrite",
        "true",
        "-f",
        "-w",
        "--stats=false",
        "--delay",
        "0",
        "--duration",
        "100",
        "--trace",
        "cuda",
        "-o",
        "pb",
    ]
    result = run([NSYS, "profile", *options, "sh", "-c", "exit 0"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "pb.nsys-rep").exists()


def test_nsys_rejects_unknown_options_like_the_real_tool(env: dict[str, str], tmp_path: Path) -> None:
    result = run([NSYS, "profile", "--bogus-flag", "touch", "ran"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == "nsys: unrecognised option '--bogus-flag'\n"
    assert not (tmp_path / "ran").exists()


def test_nsys_does_not_create_missing_directories(env: dict[str, str], tmp_path: Path) -> None:
    result = run([NSYS, "profile", "-o", "missing/dir/r", "touch", "ran"], env, tmp_path)
    assert result.returncode == 1
    assert result.stderr == "nsys: cannot create missing/dir/r.nsys-rep\n"
    assert not (tmp_path / "ran").exists()


def test_nsys_version_and_call_recording(env: dict[str, str], tmp_path: Path) -> None:
    env.update(FAKE_RECORD_DIR=str(tmp_path / "rec"), SLURM_PROCID="1", ODD='quote " back \\ tab \t end')
    version = run([NSYS, "--version"], env, tmp_path)
    assert version.stdout.startswith("NVIDIA Nsight Systems version 2025.3.1.90-fake")
    run([NSYS, "profile", "-o", "r", "true"], env, tmp_path)
    calls = [json.loads(line) for line in (tmp_path / "rec" / "nsys.jsonl").read_text().splitlines()]
    assert [c["argv"][1:] for c in calls] == [["--version"], ["profile", "-o", "r", "true"]]
    assert calls[1]["cwd"] == str(tmp_path)
    assert calls[1]["env"]["SLURM_PROCID"] == "1"
    assert calls[1]["env"]["ODD"] == env["ODD"]


# --- nsight-slurm -------------------------------------------------------------------------------------


@pytest.fixture
def job(env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """A job environment for the wrapper; the coordinator it may start is killed afterwards."""
    env.update(
        SLURM_JOB_ID="4242",
        SLURM_SUBMIT_DIR=str(tmp_path),
        SLURMD_NODENAME="127.0.0.1",
        NSIGHT_FAKE_CONNECT_TIMEOUT="5",
    )
    yield env
    info_path = job_dir(tmp_path) / "coordinator.json"
    if info_path.exists():
        try:
            os.kill(json.loads(info_path.read_text())["pid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError):
            pass


def job_dir(tmp_path: Path, job_id: str = "4242") -> Path:
    return tmp_path / ".nsight-slurm" / "jobs" / job_id


def ns(args: list, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return run([NSIGHT_SLURM, *args], env, cwd)


def test_configure_keeps_state_under_the_submit_dir(job: dict[str, str], tmp_path: Path) -> None:
    assert ns(["configure", "tool-path", NSYS], job, tmp_path).returncode == 0
    assert ns(["configure", "tool-command", "profile"], job, tmp_path).returncode == 0
    assert ns(["configure", "profiling-mode", "cuda-api"], job, tmp_path).returncode == 0
    assert (
        ns(["configure", "tool-options", "-t", "cuda,nvtx", "--sample=none"], job, tmp_path).returncode == 0
    )
    assert ns(["disable", "pyxis"], job, tmp_path).returncode == 0
    config = json.loads((job_dir(tmp_path) / "config.json").read_text())
    assert config["tool-path"] == str(NSYS)
    assert config["profiling-mode"] == "cuda-api"
    assert config["tool-options"] == ["-t", "cuda,nvtx", "--sample=none"]
    assert config["pyxis"] is False
    shown = ns(["configure"], job, tmp_path).stdout
    assert f"tool-path: {NSYS}" in shown and "tool-options: -t cuda,nvtx --sample=none" in shown
    assert "profiling-mode: cuda-api" in shown
    bad = ns(["configure", "profiling-mode", "sometimes"], job, tmp_path)
    assert bad.returncode == 1 and bad.stderr.startswith("[Nsight ERROR] unknown profiling mode")
    calls = (job_dir(tmp_path) / "calls.jsonl").read_text().splitlines()
    assert len(calls) == 7


def test_configure_refuses_a_non_empty_report_output(job: dict[str, str], tmp_path: Path) -> None:
    workspace = tmp_path / "reports"
    workspace.mkdir()
    (workspace / "direct").mkdir()
    refused = ns(["configure", "report-output", workspace], job, tmp_path)
    assert refused.returncode == 1
    assert refused.stderr == f"[Nsight ERROR] report output directory is not empty: {workspace}\n"
    fresh = tmp_path / "workspace"
    assert ns(["configure", "report-output", fresh], job, tmp_path).returncode == 0
    assert fresh.is_dir()
    (fresh / "manifest.json").write_text("{}")
    # re-running the same configure sequence is idempotent
    assert ns(["configure", "report-output", fresh], job, tmp_path).returncode == 0


def test_wrapper_needs_a_job(env: dict[str, str], tmp_path: Path) -> None:
    result = ns(["configure", "tool-path", "x"], env, tmp_path)
    assert result.returncode == 1 and result.stderr.startswith("[Nsight ERROR] SLURM_JOB_ID is not set")


def test_coordinator_start_is_idempotent_and_reachable_on_the_published_ipv4(
    job: dict[str, str], tmp_path: Path
) -> None:
    first = ns(["coordinator", "start"], job, tmp_path)
    assert first.returncode == 0, first.stderr
    info = json.loads((job_dir(tmp_path) / "coordinator.json").read_text())
    assert info["endpoint"] == f"tcp://127.0.0.1:{info['port']}"
    second = ns(["coordinator", "start"], job, tmp_path)
    assert second.returncode == 0 and "already running" in second.stdout
    assert json.loads((job_dir(tmp_path) / "coordinator.json").read_text())["pid"] == info["pid"]
    assert probe(info["endpoint"], timeout=5)["connected"] is True  # dialled with IPv6 on, like connectors
    stopped = ns(["coordinator", "stop", "--force"], job, tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert not (job_dir(tmp_path) / "coordinator.json").exists()
    until(
        lambda: not Path(f"/proc/{info['pid']}").exists() or "Z" in stat_state(info["pid"]),
        what="coordinator exit",
    )


def stat_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "gone"


@pytest.fixture
def srun_stub(tmp_path: Path, job: dict[str, str]) -> Path:
    """A recording stand-in for srun (only the wrapper's argv is under test here)."""
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    out = tmp_path / "srun-argv.txt"
    stub = bin_dir / "srun"
    stub.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > '{out}'\n")
    stub.chmod(0o755)
    job["PATH"] = f"{bin_dir}:{job['PATH']}"
    return out


def test_srun_reruns_srun_with_the_connector_in_front(
    job: dict[str, str], tmp_path: Path, srun_stub: Path
) -> None:
    result = ns(["srun", "-N", "2", "--ntasks-per-node=1", "--", "python3", "train.py", "--x"], job, tmp_path)
    assert result.returncode == 0, result.stderr
    argv = srun_stub.read_text().splitlines()
    assert argv[1:] == [
        "-N",
        "2",
        "--ntasks-per-node=1",
        "--export=ALL",
        "--job-name=nsight-slurm-connector",
        str(CONNECTOR.resolve()),
        "python3",
        "train.py",
        "--x",
    ]


def test_srun_with_pyxis_appends_a_second_container_mounts(
    job: dict[str, str], tmp_path: Path, srun_stub: Path
) -> None:
    assert ns(["enable", "pyxis"], job, tmp_path).returncode == 0
    result = ns(["srun", "-J", "worker", "--container-mounts=/a:/a", "--", "cmd"], job, tmp_path)
    assert result.returncode == 0, result.stderr
    argv = srun_stub.read_text().splitlines()
    home = NS_HOME.resolve()
    assert argv[1:] == [
        "-J",
        "worker",
        "--container-mounts=/a:/a",
        "--export=ALL",
        f"--container-mounts={home}:{home}:ro",
        str(CONNECTOR.resolve()),
        "cmd",
    ]


def test_srun_without_double_dash_is_an_error(job: dict[str, str], tmp_path: Path, srun_stub: Path) -> None:
    result = ns(["srun", "-N", "1", "cmd"], job, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("[Nsight ERROR] srun: missing '--'")
    assert not srun_stub.exists()


def setup_profiled_job(job: dict[str, str], tmp_path: Path) -> Path:
    """configure + coordinator start as slurm-multi does it; ranks write straight to <tmp>/direct."""
    direct = tmp_path / "direct"
    direct.mkdir()
    steps = [
        ["configure", "tool-path", NSYS],
        ["configure", "tool-command", "profile"],
        ["configure", "profiling-mode", "at-launch"],
        [
            "configure",
            "tool-options",
            "-t",
            "cuda,nvtx",
            "--wait=primary",
            "-o",
            f"{direct}/%q{{SLURM_JOB_ID}}_%q{{SLURMD_NODENAME}}_rank%q{{SLURM_PROCID}}",
        ],
        ["configure", "report-output", tmp_path / "workspace"],
        ["coordinator", "start"],
    ]
    for step in steps:
        result = ns(step, job, tmp_path)
        assert result.returncode == 0, (step, result.stderr)
    return direct


def start_rank(procs: list, job: dict[str, str], tmp_path: Path, rank: int) -> subprocess.Popen:
    rank_env = {**job, "SLURM_PROCID": str(rank), "SLURMD_NODENAME": f"node{rank}"}
    return spawn(procs, [CONNECTOR, "sleep", "30"], rank_env, tmp_path)


def registered(tmp_path: Path, count: int) -> Callable[[], bool]:
    def check() -> bool:
        path = job_dir(tmp_path) / "sessions.json"
        try:
            return len(json.loads(path.read_text())["sessions"]) >= count
        except (OSError, ValueError):
            return False

    return check


def test_connectors_join_and_stop_job_makes_nsys_write_every_report(
    job: dict[str, str], tmp_path: Path, procs: list
) -> None:
    direct = setup_profiled_job(job, tmp_path)
    ranks = [start_rank(procs, job, tmp_path, rank) for rank in range(2)]
    until(registered(tmp_path, 2), what="both connectors registered")
    until(lambda: len(list(direct.glob("*.qdstrm"))) == 2, what="both nsys sessions running")
    assert list(direct.glob("*.nsys-rep")) == []
    stopped = ns(["stop", "--job", "4242", "--timeout", "20"], job, tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    for proc in ranks:
        proc.wait(timeout=10)
        assert proc.returncode == 128 + signal.SIGTERM  # the tool's status
    reports = sorted(p.name for p in direct.glob("*.nsys-rep"))
    assert reports == ["4242_node0_rank0.nsys-rep", "4242_node1_rank1.nsys-rep"]
    waited = wait_for_reports(
        str(direct), expect=2, settle_seconds=0.2, timeout_seconds=5, poll_seconds=0.05, say=lambda m: None
    )
    assert waited.ok, waited.summary
    sessions = json.loads((job_dir(tmp_path) / "sessions.json").read_text())["sessions"]
    assert {s["state"] for s in sessions} == {"stopped"}
    assert ns(["coordinator", "stop"], job, tmp_path).returncode == 0


def test_sigterm_to_the_connector_reaches_nsys_and_writes_the_report(
    job: dict[str, str], tmp_path: Path, procs: list
) -> None:
    direct = setup_profiled_job(job, tmp_path)
    rank = start_rank(procs, job, tmp_path, 0)
    until(lambda: len(list(direct.glob("*.qdstrm"))) == 1, what="nsys session running")
    rank.send_signal(signal.SIGTERM)
    rank.wait(timeout=10)
    assert rank.returncode == 128 + signal.SIGTERM
    assert (direct / "4242_node0_rank0.nsys-rep").stat().st_size >= REPORT_BYTES
    assert list(direct.glob("*.qdstrm")) == []


def test_stop_job_reports_connectors_that_never_acknowledge(
    job: dict[str, str], tmp_path: Path, procs: list
) -> None:
    setup_profiled_job(job, tmp_path)
    rank = start_rank(procs, {**job, "NSIGHT_FAKE_IGNORE_STOP": "1"}, tmp_path, 0)
    until(registered(tmp_path, 1), what="connector registered")
    stopped = ns(["stop", "--job", "4242", "--timeout", "0.5"], job, tmp_path)
    assert stopped.returncode == 1
    assert "1 session(s) did not acknowledge within 0.5 s: rank 0 on node0" in stopped.stderr
    refused = ns(["coordinator", "stop"], job, tmp_path)
    assert refused.returncode == 1 and "--force" in refused.stderr
    rank.send_signal(signal.SIGTERM)  # what slurm-multi's teardown does next (scancel --signal=TERM)
    rank.wait(timeout=10)


def test_connector_times_out_when_the_coordinator_address_is_unreachable(
    job: dict[str, str], tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = job_dir(tmp_path)
    state.mkdir(parents=True)
    (state / "coordinator.json").write_text(json.dumps({"endpoint": f"tcp://127.0.0.1:{port}", "pid": 1}))
    (state / "config.json").write_text(json.dumps({"tool-path": str(NSYS), "tool-options": ["-o", "r"]}))
    job.update(NSIGHT_FAKE_CONNECT_TIMEOUT="1", FAKE_RECORD_DIR=str(tmp_path / "rec"))
    started = time.monotonic()
    result = run([CONNECTOR, "touch", "ran"], job, tmp_path)
    assert result.returncode == 1
    assert result.stderr == "[Nsight ERROR] Timeout connecting to Coordinator\n"
    assert 0.9 <= time.monotonic() - started < 10
    assert not (tmp_path / "ran").exists() and not (tmp_path / "rec" / "nsys.jsonl").exists()
    recorded = json.loads((tmp_path / "rec" / "nsight-slurm-connector.jsonl").read_text())
    assert recorded["argv"][1:] == ["touch", "ran"] and recorded["env"]["SLURM_JOB_ID"] == "4242"


def test_connector_without_coordinator_state_is_a_clear_error(job: dict[str, str], tmp_path: Path) -> None:
    result = run([CONNECTOR, "true"], job, tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("[Nsight ERROR] no coordinator for job 4242")


# --- nvidia-smi / amd-smi: processes, memory and per-host knobs (the fitness stage's GPU check) ----------

NVIDIA_SMI = FAKES / "nvidia-smi"
AMD_SMI = FAKES / "amd-smi"


@pytest.fixture
def gpu_env(tmp_path: Path) -> dict[str, str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVIDIA_", "FAKE_AMDSMI_", "FAKE_GPU_"))
    }
    clean["FAKE_NVIDIA_GPUS"] = clean["FAKE_AMDSMI_GPUS"] = "4"
    return clean


def lines_of(argv: list, env: dict[str, str], cwd: Path) -> list[str]:
    result = run(argv, env, cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_nvidia_smi_lists_compute_processes_and_memory_without_units(gpu_env: dict, tmp_path: Path) -> None:
    gpu_env["FAKE_NVIDIA_PROCS"] = "1:4242:2048,1:77:100,3:9:5"
    apps = lines_of(
        [NVIDIA_SMI, "--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"],
        gpu_env,
        tmp_path,
    )
    uuid = "GPU-5f1c7a2e-0d3b-4c1a-9e8f-00000000000{}"
    assert apps == [f"{uuid.format(1)}, 4242, 2048", f"{uuid.format(1)}, 77, 100", f"{uuid.format(3)}, 9, 5"]
    gpus = lines_of(
        [NVIDIA_SMI, "--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits"],
        gpu_env,
        tmp_path,
    )
    # a GPU's used memory defaults to the sum of its processes'
    assert gpus == [
        f"0, {uuid.format(0)}, 0, 81559",
        f"1, {uuid.format(1)}, 2148, 81559",
        f"2, {uuid.format(2)}, 0, 81559",
        f"3, {uuid.format(3)}, 5, 81559",
    ]


def test_nvidia_smi_prints_units_unless_nounits_and_nothing_without_processes(
    gpu_env: dict, tmp_path: Path
) -> None:
    gpu_env.update(FAKE_NVIDIA_MEM_USED="2:30000", FAKE_NVIDIA_MEM_TOTAL="40960")
    assert lines_of(
        [NVIDIA_SMI, "--query-gpu=memory.used,memory.total", "--format=csv,noheader"], gpu_env, tmp_path
    ) == ["0 MiB, 40960 MiB", "0 MiB, 40960 MiB", "30000 MiB, 40960 MiB", "0 MiB, 40960 MiB"]
    assert (
        lines_of(
            [NVIDIA_SMI, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            gpu_env,
            tmp_path,
        )
        == []
    )
    gpu_env["FAKE_NVIDIA_PROCS"] = "0:1:1x"
    bad = run([NVIDIA_SMI, "--query-compute-apps=pid", "--format=csv,noheader"], gpu_env, tmp_path)
    assert bad.returncode == 2 and "FAKE_NVIDIA_PROCS: bad entry '0:1:1x'" in bad.stderr


def test_amd_smi_process_json_has_the_real_tools_shape(gpu_env: dict, tmp_path: Path) -> None:
    gpu_env.update(FAKE_AMDSMI_GPUS="2", FAKE_AMDSMI_PROCS="1:4242:2048")
    result = run([AMD_SMI, "process", "--json"], gpu_env, tmp_path)
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert listing[0] == {"gpu": 0, "process_list": [{"process_info": "No running processes detected"}]}
    info = listing[1]["process_list"][0]["process_info"]
    assert listing[1]["gpu"] == 1 and info["pid"] == 4242 and info["name"] == "python3"
    assert info["mem_usage"] == {"value": 2048 << 20, "unit": "B"}
    assert info["memory_usage"]["vram_mem"] == {"value": 2048 << 20, "unit": "B"}
    assert set(info["usage"]) == {"gfx", "enc"}


def test_amd_smi_metric_mem_usage_and_the_unchanged_metric_output(gpu_env: dict, tmp_path: Path) -> None:
    gpu_env.update(FAKE_AMDSMI_GPUS="2", FAKE_AMDSMI_MEM_USED="1:150000", FAKE_AMDSMI_NOISE="warning")
    result = run([AMD_SMI, "metric", "-m", "--json"], gpu_env, tmp_path)
    assert result.stdout.startswith("WARNING: User is missing")  # the noise knobs still apply
    memory = json.loads(result.stdout.split("\n", 1)[1])
    assert [m["mem_usage"]["used_vram"] for m in memory] == [
        {"value": 0, "unit": "MB"},
        {"value": 150000, "unit": "MB"},
    ]
    assert memory[1]["mem_usage"]["total_vram"] == {"value": 196592, "unit": "MB"}
    assert memory[1]["mem_usage"]["free_vram"] == {"value": 46592, "unit": "MB"}
    plain = json.loads(run([AMD_SMI, "metric", "--json"], gpu_env, tmp_path).stdout.split("\n", 1)[1])
    assert "mem_usage" not in plain[0] and "power" in plain[0]


@pytest.mark.parametrize("tool", ["nvidia-smi", "amd-smi"])
def test_gpu_fakes_read_per_host_knobs_from_fake_gpu_host_dir(
    tool: str, gpu_env: dict, tmp_path: Path
) -> None:
    host_dir = tmp_path / "hosts"
    host_dir.mkdir()
    host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    (host_dir / "some-other-node.env").write_text("FAKE_NVIDIA_PROCS=0:1:1\nFAKE_AMDSMI_PROCS=0:1:1\n")
    gpu_env["FAKE_GPU_HOST_DIR"] = str(host_dir)
    argv = (
        [FAKES / tool, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        if tool == "nvidia-smi"
        else [FAKES / tool, "process", "--json"]
    )

    def pids() -> list[int]:
        out = run(argv, gpu_env, tmp_path)
        assert out.returncode == 0, out.stderr
        if tool == "nvidia-smi":
            return [int(line.split(",")[0]) for line in out.stdout.splitlines()]
        return [
            p["process_info"]["pid"]
            for g in json.loads(out.stdout)
            for p in g["process_list"]
            if isinstance(p["process_info"], dict)
        ]

    assert pids() == []  # another host's file does not apply here
    (host_dir / f"{host}.env").write_text(
        "# seeded for this node only\n\nFAKE_NVIDIA_PROCS=2:4242:64\nFAKE_AMDSMI_PROCS=2:4242:64\n"
    )
    # the file wins over the environment
    gpu_env["FAKE_NVIDIA_PROCS"] = gpu_env["FAKE_AMDSMI_PROCS"] = "0:1:1"
    assert pids() == [4242]
    (host_dir / f"{host}.env").write_text("PATH=/nowhere\n")
    refused = run(argv, gpu_env, tmp_path)
    assert refused.returncode == 2 and "KEY=VALUE line: PATH=/nowhere" in refused.stderr
