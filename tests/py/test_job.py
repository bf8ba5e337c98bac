"""slurm-multi job plan / watch and node prepare / status / from-job: the seam's Python side."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi import events, job, node, watch
from slurm_multi.context import model_dir_name, resolve
from slurm_multi.plan import job_dir

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy" / "build_manifest.json"


@pytest.fixture(autouse=True)
def _reachable_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check prepare's files byte for byte: whatever this machine's own name resolves
    to (127.0.1.1 on Debian) must not add GLOO_SOCKET_IFNAME (tests/py/test_barrier.py covers that)."""
    from slurm_multi import net

    monkeypatch.setattr(net, "self_name_quirk", lambda host: "")


def write_manifest(path: Path, context: dict | None = None, model: dict | None = None) -> Path:
    entry = {"name": "toy_model", "scripts": "run.sh", "args": "--steps 2", "multiple_results": "perf.csv"}
    entry.update(model or {})
    path.write_text(
        json.dumps(
            {
                "built_images": {"m": {"docker_image": "toy/model:local"}},
                "built_models": {"m": entry},
                "context": context or {},
            }
        )
    )
    return path


def invoke(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`slurm-multi ARGS` as a node runs it, in a clean environment plus `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "MAD_", "SLURM"))}
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", *args],
        env={**base, "PYTHONPATH": str(REPO / "py"), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return proc.returncode, proc.stdout, proc.stderr


# ---- job plan ------------------------------------------------------------------------------------


@given(st.text(min_size=0, max_size=40))
@settings(max_examples=300, deadline=None)
def test_the_job_dir_is_inside_out_whatever_the_model_is_called(name: str) -> None:
    ctx = resolve({"SM_MODEL": name, "SM_IMAGE": "img"})
    model = model_dir_name(ctx)
    assert model not in ("", ".", "..") and "/" not in model and not model.startswith(".")
    path = job_dir("/srv/out", "/submit", model, "42")
    assert os.path.dirname(os.path.dirname(path)) == "/srv/out"


def test_a_relative_out_is_relative_to_the_submit_dir() -> None:
    assert job_dir("./o", "/submit", "m", "7") == "/submit/o/m/7"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON (line 1 column 1"),
        ('{"built_models": [1, 2]}', "built_models must be an object, got array"),
        ('{"context": {}}', "built_models is missing"),
        ('{"built_models": {"a": {}, "b": {}}}', "several models in built_models (a, b)"),
        (
            '{"built_models": {"a": {"args": ["x"]}}}',
            "built_models.a.args must be a string, number or boolean",
        ),
        (
            '{"built_models": {"a": {}}, "context": {"docker_env_vars": []}}',
            "context.docker_env_vars must be an object",
        ),
    ],
)
def test_plan_refuses_a_bad_manifest_in_one_line_naming_file_and_key(
    tmp_path: Path, content: str, message: str
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    code, out, err = invoke(["job", "plan", "--job-id", "1", "--nnodes", "2"], {"SM_MANIFEST": str(bad)})
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert str(bad) in err or "built_models" in err
    assert message in err


def test_plan_writes_job_json_with_every_setting_and_the_manifest_values_secrets_masked(
    tmp_path: Path,
) -> None:
    manifest = write_manifest(
        tmp_path / "m.json",
        context={
            "docker_env_vars": {"HF_TOKEN": "hf_literal_env_secret", "MODE": "x"},
            "docker_build_arg": {"API_KEY": "key_literal_build_secret", "GREETING": "hi"},
        },
    )
    env = {
        "SM_MANIFEST": str(manifest),
        "SM_OUT": str(tmp_path / "out"),
        "SM_TIMEOUT": "99",
        "SM_BARRIER_TOKEN": "barrier_token_secret_value",
        "SM_RUNTIME": "docker",
    }
    code, out, err = invoke(
        ["job", "plan", "--job-id", "5", "--nnodes", "2", "--nodes", "n1 n2", "--write"], env
    )
    assert code == 0, err
    assert f"declare -g SM_JOBDIR={tmp_path}/out/toy_model/5" in out
    text = (tmp_path / "out" / "toy_model" / "5" / "job.json").read_text()
    for secret in ("hf_literal_env_secret", "key_literal_build_secret", "barrier_token_secret_value"):
        assert secret not in text
    doc = json.loads(text)
    assert doc["settings"]["SM_TIMEOUT"] == "99"
    assert doc["settings"]["SM_BARRIER_TOKEN"] == "***"
    assert doc["nodes"] == ["n1", "n2"] and doc["nnodes"] == 2
    assert doc["results_csv"] == "perf.csv" and doc["model"] == "toy_model"
    assert doc["manifest_values"]["docker_env"] == {"HF_TOKEN": "***", "MODE": "x"}
    assert doc["manifest_values"]["build_args"] == ["API_KEY=***", "GREETING=hi"]
    assert doc["manifest_values"]["workload"] == ["bash", "run.sh", "--steps", "2"]


@pytest.mark.parametrize(
    ("runtime", "ours", "sbatch", "expected"),
    [("none", None, "2", 2), ("pyxis", "3", "2", 3), ("none", None, None, 1), ("docker", None, "1", 1)],
)
def test_job_json_counts_the_ranks_per_node_from_our_option_else_sbatchs(
    tmp_path: Path, runtime: str, ours: str | None, sbatch: str | None, expected: int
) -> None:
    env = {"SM_IMAGE": "x", "SM_OUT": str(tmp_path / "out"), "SM_RUNTIME": runtime}
    env.update({"SM_NTASKS_PER_NODE": ours} if ours else {})
    env.update({"SLURM_NTASKS_PER_NODE": sbatch} if sbatch else {})
    code, _, err = invoke(["job", "plan", "--job-id", "6", "--nnodes", "2", "--write", "--", "true"], env)
    assert code == 0, err
    doc = json.loads((tmp_path / "out" / "x" / "6" / "job.json").read_text())
    assert doc["tasks_per_node"] == expected


# ---- node prepare --------------------------------------------------------------------------------


@contextlib.contextmanager
def docker_engine_socket(path: Path, status: bytes = b"200 OK") -> Iterator[str]:
    """A stand-in for the engine's socket: answers GET /_ping like dockerd."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nOK")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"unix://{path}"
    finally:
        stop.set()
        thread.join(2)
        server.close()


def prepare(tmp_path: Path, manifest: Path, **extra: str) -> Path:
    scratch = tmp_path / "scratch"
    with docker_engine_socket(tmp_path / "docker.sock") as host:
        env = {
            "SM_MANIFEST": str(manifest),
            "SM_RUNTIME": "docker",
            "PATH": "/usr/bin:/bin",
            "DOCKER_HOST": host,
        }
        node.prepare({**env, **extra}, str(scratch), (), detect=True)
    return scratch


def test_prepare_fails_in_one_line_when_the_docker_engine_does_not_answer(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.json")
    env = {"SM_MANIFEST": str(manifest), "SM_RUNTIME": "docker", "PATH": "/usr/bin:/bin",
           "DOCKER_HOST": f"unix://{tmp_path}/nothing.sock", "SLURMD_NODENAME": "node2"}  # fmt: skip
    with pytest.raises(
        node.HelperError, match="docker engine not reachable on node2: cannot talk to"
    ) as caught:
        node.prepare(env, str(tmp_path / "scratch"), (), detect=True)
    assert caught.value.exit_code == 1
    with docker_engine_socket(tmp_path / "busy.sock", b"500 Internal Server Error") as host:
        with pytest.raises(node.HelperError, match="answered 'HTTP/1.1 500 Internal Server Error'"):
            node.prepare({**env, "DOCKER_HOST": host}, str(tmp_path / "scratch"), (), detect=True)


def test_prepare_keeps_the_manifest_env_out_of_the_shell_and_in_a_private_env_file(tmp_path: Path) -> None:
    manifest = write_manifest(
        tmp_path / "m.json",
        context={
            "docker_env_vars": {"PYTHONHOME": "/nope", "LD_LIBRARY_PATH": "/x/lib", "HF_TOKEN": "hf_abcdef"}
        },
    )
    scratch = prepare(tmp_path, manifest)
    context = (scratch / "context.sh").read_text()
    assert "PYTHONHOME" not in context and "LD_LIBRARY_PATH" not in context and "hf_abcdef" not in context
    # The manifest's variables first, then madengine's (slurm_multi.madengine).
    lines = (scratch / "container.env").read_text().splitlines()
    assert lines[:3] == ["PYTHONHOME=/nope", "LD_LIBRARY_PATH=/x/lib", "HF_TOKEN=hf_abcdef"]
    assert "MAD_MODEL_NAME=toy_model" in lines
    for name in ("container.env", "secrets", "context.sh", "workload.env"):
        assert stat.S_IMODE((scratch / name).stat().st_mode) == 0o600
    assert (scratch / "secrets").read_text() == "hf_abcdef\n"


def test_prepare_refuses_a_value_docker_env_file_cannot_carry(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.json", context={"docker_env_vars": {"CERT": "line1\nline2"}})
    with pytest.raises(node.HelperError) as caught:
        prepare(tmp_path, manifest)
    assert caught.value.exit_code == 2 and "docker_env_vars CERT has a line break" in str(caught.value)
    assert not (tmp_path / "scratch" / "context.sh").exists()


def test_prepare_puts_our_sm_out_mount_first_so_it_always_wins(tmp_path: Path) -> None:
    manifest = write_manifest(
        tmp_path / "m.json",
        context={"docker_mounts": {"/data": "/shared/data"}},
        model={"additional_docker_run_options": "-v /other:/sm-out --shm-size 1G"},
    )
    scratch = prepare(tmp_path, manifest)
    context = (scratch / "context.sh").read_text()
    line = next(x for x in context.splitlines() if x.startswith("declare -ga RUN_DOCKER_OPTS="))
    assert line == (
        f"declare -ga RUN_DOCKER_OPTS=(-v {scratch}/output:/sm-out --shm-size 1G -v /shared/data:/data)"
    )


def test_prepare_output_sources_back_to_the_same_values(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path / "m.json", model={"args": "--name 'a b' \"$(touch pwned)\""})
    scratch = prepare(tmp_path, manifest)
    script = f'source {scratch}/context.sh && printf "%s\\0" "${{RUN_WORKLOAD[@]}}"'
    out = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    # Sourcing runs nothing on the host; the args reach bash in the container as written, where they
    # expand as under madengine (`bash -c "cd run_directory && bash run.sh <args>"`).
    words = out.split("\0")[:-1]
    assert words[:2] == ["bash", "-c"] and words[3:] == ["sm-mad"]
    # (run.sh is not in this manifest's dir: the image's, checked there first.)
    assert words[2].endswith("; exit 127; fi\nexec bash run.sh --name 'a b' \"$(touch pwned)\"")
    assert not (tmp_path / "pwned").exists()


# ---- status and from-job -------------------------------------------------------------------------


def test_status_document_and_its_cli(tmp_path: Path) -> None:
    path = tmp_path / "node_1" / "status.json"
    code, _, err = invoke(
        ["node", "status", "--file", str(path), "--rank", "1", "--node", "node2", "--exit-code", "3",
         "--reason", 'container exited 3 "boom"', "--stage", "prepare:0.12:ok",
         "--stage", "run:1.50:failed:3"],
        {},
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["status"] == "failed" and doc["reason"] == 'container exited 3 "boom"'
    assert doc["stages"] == {
        "prepare": {"seconds": 0.12, "status": "ok"},
        "run": {"seconds": 1.5, "status": "failed", "exit_code": 3},
    }
    code, _, err = invoke(
        [
            "node",
            "status",
            "--file",
            str(path),
            "--rank",
            "1",
            "--node",
            "n",
            "--exit-code",
            "0",
            "--stage",
            "x",
        ],
        {},
    )
    assert code == 2 and "expected NAME:SECONDS:STATUS" in err


def test_from_job_restores_settings_but_not_masked_ones_and_reads_rank0s_image(tmp_path: Path) -> None:
    jobdir = tmp_path / "job"
    (jobdir / "node_0").mkdir(parents=True)
    (jobdir / "job.json").write_text(
        json.dumps(
            {"job_id": "9", "nnodes": 2, "nodes": ["node1", "node2"], "command": ["sh", "-c", "echo hi"],
             "settings": {"SM_TIMEOUT": "50", "SM_BARRIER_TOKEN": "***", "SM_IMAGE": "img:1"}}
        )
    )  # fmt: skip
    (jobdir / "node_0" / "status.json").write_text(json.dumps({"image_id": "sha256:abc"}))
    text = node.from_job(str(jobdir), 1, {})
    assert "declare -gx SM_TIMEOUT=50" in text and "declare -gx SM_IMAGE=img:1" in text
    assert "SM_BARRIER_TOKEN" not in text
    assert "declare -gx SM_IMAGE_ID=sha256:abc" in text and "declare -gx MASTER_ADDR=node1" in text
    assert "declare -ga SM_CMD=(sh -c 'echo hi')" in text
    with pytest.raises(node.HelperError, match="rank 2 is not a rank of job 9"):
        node.from_job(str(jobdir), 2, {})


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("nnodes", "x", 'nnodes "x" is not a count from 1 to 100000'),
        ("nnodes", {"a": 1}, 'nnodes {"a": 1} is not a count'),
        ("nnodes", float("nan"), "nnodes NaN is not a count"),
        ("nnodes", 2.5, "nnodes 2.5 is not a count"),
        ("nnodes", 10**9, "nnodes 1000000000 is not a count"),
        ("tasks_per_node", "many", 'tasks_per_node "many" is not a count'),
        ("tasks_per_node", -1, "tasks_per_node -1 is not a count"),
        ("command", 5, "command 5 is not a list of words"),
        ("command", "echo hi", 'command "echo hi" is not a list of words'),
        ("nodes", "node1", 'nodes "node1" is not a list of host names'),
    ],
)
def test_from_job_names_job_json_and_a_field_it_cannot_use(
    tmp_path: Path, field: str, value: object, said: str
) -> None:
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    job = {"job_id": "9", "nnodes": 2, "nodes": ["node1", "node2"], "command": ["true"], "settings": {}}
    (jobdir / "job.json").write_text(json.dumps({**job, field: value}))
    code, out, err = invoke(["node", "from-job", str(jobdir), "--rank", "0"], {})
    assert (code, out) == (2, "")
    assert err == f"slurm-multi: node from-job: {jobdir}/job.json: {said}" + err.split(said, 1)[1]
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err


def test_from_job_of_a_job_json_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    (jobdir / "job.json").write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = invoke(["node", "from-job", str(jobdir), "--rank", "0"], {})
    assert code == 2 and err.startswith(f"slurm-multi: node from-job: job.json {jobdir}/job.json is not JSON")
    assert len(err.splitlines()) == 1


def test_from_job_takes_a_count_in_digits_and_no_count_as_the_default(tmp_path: Path) -> None:
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    job = {
        "job_id": "9",
        "nnodes": "2",
        "tasks_per_node": None,
        "nodes": None,
        "command": None,
        "settings": {},
    }
    (jobdir / "job.json").write_text(json.dumps(job))
    text = node.from_job(str(jobdir), 1, {})
    assert "declare -gx NNODES=2" in text and "declare -ga SM_CMD=()" in text


# ---- job watch -----------------------------------------------------------------------------------


@pytest.fixture
def sleeper() -> subprocess.Popen:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def fake_scontrol(tmp_path: Path, states: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' {states}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _run_stage(jobdir: Path, rank: int, first_output: bool) -> None:
    node = jobdir / f"node_{rank}"
    node.mkdir(exist_ok=True)
    lines = [events.format_event("stage_start", 1_796_000_000.0, rank=rank, host="n", stage="run")]
    if first_output:
        lines.append(events.format_event("first_output", 1_796_000_001.0, rank=rank, host="n"))
    (node / "events.log").write_text("\n".join(lines) + "\n")


def test_the_watch_wakes_the_warm_collect_once_every_rank_printed(tmp_path: Path, monkeypatch) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED'", monkeypatch)
    read, write = os.pipe()
    os.set_blocking(read, False)
    step = subprocess.Popen(["sleep", "60"])
    result: list[int] = []
    nodes = ["node1", "node2"]
    thread = threading.Thread(target=lambda: result.append(
        watch.watch(str(tmp_path), nodes, 1, step.pid, peer_grace=30, progress_every=60, wake_fd=write)
    ))  # fmt: skip
    try:
        _run_stage(tmp_path, 0, first_output=True)
        _run_stage(tmp_path, 1, first_output=False)
        thread.start()
        time.sleep(4 * watch.WAKE_EVERY)
        with pytest.raises(BlockingIOError):  # rank 1 runs but printed nothing yet: no wake
            os.read(read, 10)
        _run_stage(tmp_path, 1, first_output=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                woke = os.read(read, 10)
                break
            except BlockingIOError:
                time.sleep(0.05)
        assert woke == b"\n"
        assert os.read(read, 10) == b""  # written once, then closed: nothing else holds the pipe
    finally:
        step.kill()
        step.wait()
        thread.join(10)
        os.close(read)
    assert result == [0]


def test_a_watch_that_ends_before_the_wake_closes_its_end_unwritten(tmp_path: Path, monkeypatch) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED'", monkeypatch)
    read, write = os.pipe()
    proc = subprocess.Popen(["sleep", "0.3"])
    assert (
        watch.watch(str(tmp_path), ["node1"], 1, proc.pid, peer_grace=30, progress_every=60, wake_fd=write)
        == 0
    )
    proc.wait()
    assert os.read(read, 10) == b""  # the warm helper reads an end of file: it ends, unused
    os.close(read)


def test_watch_ends_with_the_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED'", monkeypatch)
    proc = subprocess.Popen(["sleep", "0.5"])
    # The step ends (a zombie not yet reaped counts as ended): the watch ends with exit 0.
    assert watch.watch(str(tmp_path), ["node1"], 1, proc.pid, peer_grace=30, progress_every=60) == 0
    proc.wait()


def test_watch_stops_the_others_a_peer_grace_after_a_rank_failed(
    tmp_path: Path, sleeper: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=ALLOCATED'", monkeypatch)
    (tmp_path / "node_1").mkdir()
    (tmp_path / "node_1" / "status.json").write_text(
        json.dumps({"exit_code": 3, "node": "node2", "reason": "boom"})
    )
    started = time.monotonic()
    assert (
        watch.watch(str(tmp_path), ["node1", "node2"], 1, sleeper.pid, peer_grace=0.5, progress_every=60)
        == watch.EXIT_STOP
    )
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("stages", "grace_said"),
    [({"prepare": {"status": "ok"}, "fitness": {"status": "failed"}}, "get 0 s"),
     ({"prepare": {"status": "ok"}, "run": {"status": "failed"}}, "get 600 s")],
)  # fmt: skip
def test_a_rank_that_failed_before_its_run_stops_the_others_at_once_not_after_the_peer_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stages: dict,
    grace_said: str,
) -> None:  # fmt: skip
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=ALLOCATED'", monkeypatch)
    (tmp_path / "node_1").mkdir()
    (tmp_path / "node_1" / "status.json").write_text(
        json.dumps({"exit_code": 3, "node": "node2", "reason": "bad node", "stages": stages})
    )
    short = subprocess.Popen(["sleep", "3"])
    try:
        rc = watch.watch(str(tmp_path), ["node1", "node2"], 1, short.pid, peer_grace=600, progress_every=60)
    finally:
        short.kill()
        short.wait()
    # Before the run: stopped at once; in the run: the grace holds, and the step ends first.
    assert rc == (watch.EXIT_STOP if grace_said == "get 0 s" else 0)
    assert grace_said in capsys.readouterr().err


def test_a_node_slurm_declares_down_counts_as_failed_at_once(
    tmp_path: Path, sleeper: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_scontrol(
        tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=DOWN*+DRAIN'", monkeypatch
    )
    assert (
        watch.watch(
            str(tmp_path),
            ["node1", "node2"],
            1,
            sleeper.pid,
            peer_grace=0.2,
            progress_every=60,
            node_check_every=0.1,
        )
        == watch.EXIT_STOP
    )
    doc = json.loads((tmp_path / "node_1" / "status.json").read_text())
    assert doc["exit_code"] == 137 and "Slurm reports node2 DOWN" in doc["reason"]
    assert not (tmp_path / "node_0" / "status.json").exists()


@pytest.mark.parametrize(
    ("state", "bad"),
    [("ALLOCATED", False), ("MIXED", False), ("IDLE*", False), ("DOWN", True), ("DOWN*", True),
     ("ALLOCATED+FAIL", True), ("MIXED+DRAIN", False), ("FAILING", True)],
)  # fmt: skip
def test_bad_node_states(state: str, bad: bool) -> None:
    assert watch.is_bad_state(state) is bad


@pytest.mark.parametrize(
    ("state", "bad"),
    [("ALLOCATED", False), ("MIXED*", True), ("ALLOCATED+NOT_RESPONDING", True), ("IDLE", False),
     ("DOWN", True), ("MIXED+DRAIN", False)],
)  # fmt: skip
def test_the_teardown_also_counts_a_node_slurm_cannot_reach(state: str, bad: bool) -> None:
    assert watch.is_bad_state(state, not_responding=True) is bad


def test_cli_module_runs_as_python_m(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "--help"],
        env={**os.environ, "PYTHONPATH": str(REPO / "py")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "plan" in proc.stdout and "watch" in proc.stdout


def test_the_status_writer_refuses_bad_stages(tmp_path: Path) -> None:
    path = tmp_path / "node_0" / "status.json"
    node_status = [sys.executable, "-m", "slurm_multi", "node", "status"]
    args = ["--file", str(path), "--rank", "0", "--node", "node1", "--exit-code", "143", "--reason",
            "terminated by a signal", "--image-id", "sha256:ab", "--terminated"]  # fmt: skip
    env = {"PYTHONPATH": str(REPO / "py"), "PATH": os.environ["PATH"]}
    stage = ["--stage", "run:1.5:failed:143"]
    proc = subprocess.run([*node_status, *args, *stage], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(path.read_text())
    assert doc["status"] == "failed" and doc["exit_code"] == 143
    assert doc["stages"] == {"run": {"seconds": 1.5, "status": "failed", "exit_code": 143}}
    proc = subprocess.run([*node_status, *args, "--stage", "run"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "expected NAME:SECONDS:STATUS" in proc.stderr


def test_mark_lost_at_teardown_records_a_node_slurm_cannot_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slurm kills the job as it declares the node dead; the teardown may look between the two.
    fake_scontrol(tmp_path, "'NodeName=node1 State=ALLOCATED' 'NodeName=node2 State=MIXED*'", monkeypatch)
    jobdir = tmp_path / "job"
    jobdir.mkdir()  # (the batch step made it at the start; mark-lost makes none)
    assert watch.mark_lost(str(jobdir), ["node1", "node2"], 1) == []
    assert not (jobdir / "node_1" / "status.json").exists()
    result = CliRunner().invoke(
        job.cli, ["mark-lost", "--jobdir", str(jobdir), "--nodes", "node1 node2", "--not-responding"]
    )
    assert result.exit_code == 0, result.output
    assert "Slurm reports node2 MIXED*" in result.output
    doc = json.loads((jobdir / "node_1" / "status.json").read_text())
    assert doc["status"] == "failed" and "node2 MIXED*" in doc["reason"]
    assert not (jobdir / "node_0" / "status.json").exists()


def test_mark_lost_refuses_a_job_dir_that_is_not_there_and_makes_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A mistyped --jobdir was made, with a status.json for the dead node's ranks in it, and exit 0.
    fake_scontrol(
        tmp_path, "'NodeName=node1 State=DOWN+NOT_RESPONDING' 'NodeName=node2 State=IDLE'", monkeypatch
    )
    typo = tmp_path / "x" / "typo"
    result = CliRunner().invoke(job.cli, ["mark-lost", "--jobdir", str(typo), "--nodes", "node1 node2"])
    assert result.exit_code == 2 and f"Directory '{typo}' does not exist" in result.output
    assert not (tmp_path / "x").exists()


# ---- madengine's contract in prepare ---------------------------------------------------------------

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def test_prepare_gives_an_amd_model_madengines_variables_options_and_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_AMDSMI_GPUS", "4")  # the tools run in this process's environment
    (tmp_path / "scripts" / "m").mkdir(parents=True)
    (tmp_path / "scripts" / "m" / "run.sh").write_text("echo hi\n")
    manifest = write_manifest(
        tmp_path / "m.json",
        context={"gpu_vendor": "AMD", "docker_gpus": "0,1", "docker_env_vars": {"NCCL_DEBUG": "WARN"}},
        model={"scripts": "scripts/m/run.sh", "additional_docker_run_options": "--shm-size 8G"},
    )
    scratch = prepare(tmp_path, manifest, PATH=f"{FAKES}:/usr/bin:/bin", NNODES="2", NODE_RANK="1",
                      MASTER_ADDR="n1", SM_LAUNCHER="torchrun", SM_NPROC_PER_NODE="2")  # fmt: skip
    env = dict(line.split("=", 1) for line in (scratch / "container.env").read_text().splitlines())
    assert env["NCCL_DEBUG"] == "WARN"  # the manifest's own value
    assert env["MAD_MULTI_NODE_RUNNER"] == (
        "torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --master_addr=n1 --master_port=29500"
    )
    assert (env["MAD_GPU_VENDOR"], env["MAD_SYSTEM_NGPUS"], env["MAD_RUNTIME_NGPUS"]) == ("AMD", "4", "2")
    assert env["MAD_SYSTEM_GPU_ARCHITECTURE"] == "gfx942" and env["MAD_SYSTEM_HIP_VERSION"] == "6.4"
    assert env["MAD_SYSTEM_GPU_PRODUCT_NAME"] == "AMD Instinct MI300X"
    assert env["HIP_VISIBLE_DEVICES"] == "0,1" and env["MAD_COLLECT_METRICS"] == "false"
    context = (scratch / "context.sh").read_text()
    opts = next(x for x in context.splitlines() if x.startswith("declare -ga RUN_DOCKER_OPTS="))
    # madengine's AMD options, but not --ipc=host: the manifest's --shm-size says how /dev/shm is made.
    assert "--group-add video --cap-add=SYS_PTRACE --cap-add SYS_ADMIN --device /dev/fuse" in opts
    assert "--ipc=host" not in opts and "--shm-size 8G" in opts
    assert f"-v {tmp_path}/scripts/m:/sm-model:ro" in opts and opts.endswith("-w /myworkspace/run_directory)")
    assert "declare -ga RUN_SETUP=(sh -c 'cp -RL /sm-model/. . && exec \"$@\"' sm-model)" in context


def test_prepare_copies_the_scripts_for_pyxis_and_a_users_own_value_wins(tmp_path: Path) -> None:
    (tmp_path / "scripts" / "m").mkdir(parents=True)
    (tmp_path / "scripts" / "m" / "run.sh").write_text("echo hi\n")
    manifest = write_manifest(tmp_path / "m.json", model={"scripts": "scripts/m/run.sh"})
    scratch = tmp_path / "scratch"
    env = {"SM_MANIFEST": str(manifest), "SM_RUNTIME": "pyxis", "PATH": "/usr/bin:/bin", "NNODES": "2",
           "MAD_MULTI_NODE_RUNNER": "my own runner"}  # fmt: skip
    node.prepare(env, str(scratch), (), detect=False)
    assert (scratch / "run_directory" / "run.sh").read_text() == "echo hi\n"
    workload = (scratch / "workload.env").read_text()
    assert "MAD_MULTI_NODE_RUNNER" not in workload and "declare -gx MAD_COLLECT_METRICS=true" in workload
    context = (scratch / "context.sh").read_text()
    assert f"{scratch}/run_directory:/myworkspace/run_directory" in context
    assert "declare -g RUN_WORKDIR=/myworkspace/run_directory" in context


def test_the_watch_wakes_every_warm_helper_it_was_given_once(tmp_path: Path) -> None:
    # The batch step's warm collect and warm mad-outputs: `--wake-fd` twice, one line each.
    pipes = [os.pipe(), os.pipe()]
    waker = watch.Waker([w for _, w in pipes], str(tmp_path), 2)
    _run_stage(tmp_path, 0, first_output=True)
    _run_stage(tmp_path, 1, first_output=False)
    waker.look(1.0)
    assert waker.fds  # rank 1 printed nothing yet
    _run_stage(tmp_path, 1, first_output=True)
    waker.look(1.0 + watch.WAKE_EVERY)
    assert waker.fds == [] and [os.read(r, 10) for r, _ in pipes] == [b"\n", b"\n"]
    assert [os.read(r, 10) for r, _ in pipes] == [b"", b""]  # closed: nothing else holds them
    ctx = job.watch_command.make_context("watch", ["--jobdir", "j", "--nodes", "n", "--srun-pid", "1",
                                                   "--wake-fd", "7", "--wake-fd", "9"])  # fmt: skip
    assert ctx.params["wake_fds"] == (7, 9)
