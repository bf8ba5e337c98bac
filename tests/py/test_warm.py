"""`slurm-multi warm AREA COMMAND`: a command started before its moment runs the same command, with
the same result, as its cold start; an unused one ends quietly; a torn argv is one line, never a
traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_multi import warm

REPO = Path(__file__).resolve().parents[2]
PRIMUS_JOB = REPO / "tests" / "py" / "data" / "results" / "jobs" / "primus_2node"


def env(**extra: str) -> dict[str, str]:
    kept = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "PYTHON"))}
    return {**kept, "PYTHONPATH": str(REPO / "py"), **extra}


def argv_bytes(words: list[str], wake: bool = True) -> bytes:
    data = b"\n" if wake else b""
    return data + f"{len(words)}\n".encode() + b"".join(os.fsencode(w) + b"\0" for w in words)


STATUS_CMD = "node status"
COLLECT = "results collect"
MAD_OUTPUTS = "results mad-outputs"


def warm_run(command: str, stdin: bytes, cwd: Path, **extra: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-m", "slurm_multi", "warm", *command.split()]
    return subprocess.run(argv, input=stdin, env=env(**extra), cwd=cwd, capture_output=True, check=False)


def cold_run(command: str, words: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "slurm_multi", *command.split(), *words], env=env(**extra),
                          cwd=cwd, capture_output=True, check=False)  # fmt: skip


def status(path: Path) -> list[str]:
    return [
        "--file", str(path), "--rank", "0", "--node", "node1", "--exit-code", "3",
        "--reason", "stage run failed: exit 3", "--image-id", "sha256:abc",
        "--stage", "prepare:0.21:ok", "--stage", "run:1.5:failed:3",
    ]  # fmt: skip


def test_the_warm_status_writer_writes_what_the_cold_one_writes(tmp_path: Path) -> None:
    cold, hot = tmp_path / "cold.json", tmp_path / "warm.json"
    a = cold_run(STATUS_CMD, status(cold), tmp_path)
    b = warm_run(STATUS_CMD, argv_bytes(status(hot)), tmp_path)
    assert a.returncode == b.returncode == 0, b.stderr
    assert json.loads(hot.read_text()) == json.loads(cold.read_text())
    assert json.loads(hot.read_text())["stages"]["run"] == {
        "seconds": 1.5,
        "status": "failed",
        "exit_code": 3,
    }


def test_an_argv_without_a_wake_first_imports_then_runs(tmp_path: Path) -> None:
    out = tmp_path / "status.json"
    done = warm_run(STATUS_CMD, argv_bytes(status(out), wake=False), tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["exit_code"] == 3


def test_the_warm_collect_judges_and_exits_as_the_cold_one(tmp_path: Path) -> None:
    results = []
    for name, runner in (("cold", cold_run), ("warm", None)):
        job = tmp_path / name
        subprocess.run(["cp", "-r", str(PRIMUS_JOB), str(job)], check=True)
        words = [str(job), "--no-picture"]
        done = cold_run(COLLECT, words, tmp_path) if runner else warm_run(
            COLLECT, argv_bytes(words), tmp_path)  # fmt: skip
        summary = json.loads((job / "summary.json").read_text())
        said = done.stderr.replace(os.fsencode(job), b"JOB")  # the warm helper ends without teardown
        results.append((done.returncode, summary["verdict"], (job / "perf.csv").read_text(), said))
    assert results[0] == results[1] and b"SUCCESS" in results[1][3]


def test_a_usage_error_of_the_helper_is_its_own_one_line_and_code(tmp_path: Path) -> None:
    errfile = tmp_path / "error"
    words = [str(tmp_path / "nope")]
    cold = cold_run(COLLECT, words, tmp_path)
    hot = warm_run(COLLECT, argv_bytes(words), tmp_path, SM_ERROR_FILE=str(errfile))
    assert hot.returncode == cold.returncode == 2
    assert hot.stderr == cold.stderr and len(hot.stderr.splitlines()) == 1
    assert errfile.read_bytes() == hot.stderr


@pytest.mark.parametrize("stdin", [b"", b"\n"])
def test_a_helper_nobody_needed_ends_quietly_having_written_nothing(tmp_path: Path, stdin: bytes) -> None:
    done = warm_run(STATUS_CMD, stdin, tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "stdin, says",
    [
        (b"\n3\nonly\0two\0", "the pipe closed before its whole argv came"),
        (b"\nthree\na\0", "did not start with a word count"),
        (b"\n1\na\0b\0", "2 words came, not 1"),
        (b"\n2\na\0b", "the pipe closed before its whole argv came"),
    ],
)
def test_a_torn_or_garbled_argv_is_one_line_and_exit_2(tmp_path: Path, stdin: bytes, says: str) -> None:
    done = warm_run(STATUS_CMD, stdin, tmp_path)
    assert done.returncode == 2
    assert done.stderr.decode().startswith("slurm-multi: warm node status: ") and says in done.stderr.decode()
    assert len(done.stderr.splitlines()) == 1 and b"Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, says",
    [([], b"Missing argument"), (["node"], b"Missing argument"), (["os", "x"], b"no command 'os'"),
     (["node", "status", "x"], b"unexpected extra argument")],
)  # fmt: skip
def test_what_names_no_command_is_one_line_at_once(tmp_path: Path, argv: list[str], says: bytes) -> None:
    done = subprocess.run([sys.executable, "-m", "slurm_multi", "warm", *argv], input=b"", env=env(),
                          cwd=tmp_path, capture_output=True, check=False)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("argv", [["node", "nope"], ["results", "nope"]])
def test_a_command_its_area_lacks_is_one_line_once_woken(tmp_path: Path, argv: list[str]) -> None:
    done = warm_run(" ".join(argv), argv_bytes([]), tmp_path)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert f"no command '{' '.join(argv)}'".encode() in done.stderr and b"Traceback" not in done.stderr


def test_words_keep_every_byte_a_bash_variable_can_hold() -> None:
    read, write = os.pipe()
    words = ["", "a b", "line\nbreak", "caf\u00e9", os.fsdecode(b"\xff\xfe raw"), "-" * 5000]
    os.write(write, argv_bytes(words, wake=False))
    os.close(write)
    try:
        assert warm.read_argv(read, b"") == words
    finally:
        os.close(read)


def test_the_argv_is_read_without_waiting_for_the_pipe_to_close() -> None:
    # A background process that inherited the pipe's write end holds it open: the count, not the end
    # of file, says where the argv ends.
    read, write = os.pipe()
    os.write(write, argv_bytes(["a", "b"]))
    try:
        started = time.monotonic()
        rest = warm.wait_for_wake(read)
        assert rest is not None and warm.read_argv(read, rest) == ["a", "b"]
        assert time.monotonic() - started < 5
    finally:
        os.close(read)
        os.close(write)


def test_a_warm_helper_imports_its_command_only_once_woken(tmp_path: Path) -> None:
    # (importlib.import_module escapes `-X importtime`: ask the process itself what it imported.)
    code = (
        "import sys; from slurm_multi import cli; rc = cli.run(['warm', 'node', 'status']); "
        "print('slurm_multi.node_cli' in sys.modules); sys.exit(rc)"
    )

    def imported(stdin: bytes) -> str:
        done = subprocess.run([sys.executable, "-c", code], input=stdin, env=env(), cwd=tmp_path,
                              capture_output=True, text=False, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.decode().strip()

    assert imported(b"") == "False"  # never woken: ended without importing it
    assert imported(b"\n") == "True"  # woken, then unused


def test_the_warm_mad_outputs_writes_what_the_cold_command_writes(tmp_path: Path) -> None:
    # madengine's record files after the verdict: pandas is imported while the job runs (warm_up).
    written = []
    for name in ("cold", "warm"):
        job = tmp_path / name
        subprocess.run(["cp", "-r", str(PRIMUS_JOB), str(job)], check=True)
        assert cold_run(COLLECT, [str(job), "--no-picture"], tmp_path).returncode == 0
        done = (
            cold_run(MAD_OUTPUTS, [str(job)], tmp_path)
            if name == "cold"
            else warm_run(MAD_OUTPUTS, argv_bytes([str(job)]), tmp_path)
        )
        assert done.returncode == 0, done.stderr
        assert b"madengine files:" in done.stderr
        written.append(
            {f: (job / f).read_text() for f in ("perf_entry.json", "perf_super.json", "perf_super.csv")}
        )
    assert written[0] == written[1]
    missing = warm_run(MAD_OUTPUTS, argv_bytes([str(tmp_path / "nowhere")]), tmp_path)
    assert missing.returncode == 2 and b"Traceback" not in missing.stderr


def test_the_warm_collect_of_a_manifest_job_writes_madengine_files_and_page_as_the_cold_one(
    tmp_path: Path,
) -> None:
    # The batch step's one warm helper of a manifest job: collect --mad-outputs --page, pandas
    # imported while the job runs (WARM_UP), the same files as the cold command and the separate
    # mad-outputs wrote.
    written = []
    for name in ("cold", "warm", "apart"):
        job = tmp_path / name
        subprocess.run(["cp", "-r", str(PRIMUS_JOB), str(job)], check=True)
        words = [str(job), "--no-picture", "--mad-outputs", "--page"]
        if name == "apart":
            assert cold_run(COLLECT, [str(job), "--no-picture"], tmp_path).returncode == 0
            done = cold_run(MAD_OUTPUTS, [str(job), "--page"], tmp_path)
        else:
            done = (
                cold_run(COLLECT, words, tmp_path)
                if name == "cold"
                else warm_run(COLLECT, argv_bytes(words), tmp_path)
            )
        assert done.returncode == 0, done.stderr
        assert b"madengine files:" in done.stderr and (job / "report.html").is_file()
        written.append(
            {f: (job / f).read_text() for f in ("perf_entry.json", "perf_super.json", "perf_super.csv")}
        )
    assert written[0] == written[1] == written[2]
    # Woken, it pays pandas' import before its argv comes.
    code = (
        "import sys; from slurm_multi import cli; rc = cli.run(['warm', 'results', 'collect']); "
        "print('pandas' in sys.modules)"
    )
    woken = subprocess.run(
        [sys.executable, "-c", code], input=b"\n", env=env(), cwd=tmp_path, capture_output=True, check=False
    )
    assert woken.returncode == 0 and woken.stdout.strip() == b"True", woken.stderr
