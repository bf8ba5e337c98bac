"""The helpers on every job's critical path start without click (`python -m …`), and their
click commands are passthroughs to the same main: same input, same output.

- `python -m slurm_multi.plan`                 = `slurm-multi job plan`        (batch step, before srun)
- `python -m slurm_multi.node prepare`         = `slurm-multi node prepare`    (every task, first)
- `python -m slurm_multi.barrier_main serve`   = `slurm-multi barrier serve`   (rank 0, beside prepare)
- `python -m slurm_multi.barrier_main join`    = `slurm-multi barrier join`    (every worker, idem)
- `python -m slurm_multi.results.collect_main` = `slurm-multi results collect` (batch step, at the end)
- `python -m slurm_multi.fitness run`          (every node, first: the fitness verdict waits on it)
- `python -m slurm_multi.watch`                 = `slurm-multi job watch`       (batch step, beside srun)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from slurm_multi import EXIT_FAILURE, EXIT_USAGE
from slurm_multi import argv as options
from slurm_multi.common import HelperError, run_main

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "examples" / "toy" / "build_manifest.json"
PRIMUS_JOB = REPO / "tests" / "py" / "data" / "results" / "jobs" / "primus_2node"
# click's own directory on the path too: an entry that imported click would find it (and be caught).
CLICK_PATH = str(Path(click.__file__).resolve().parents[1])
STAMP = re.compile(r"^\S+Z \S+ r\S+ ", re.M)  # talk()'s `<UTC time> <host> r<rank> ` prefix

PLAN = ("-S", "-m", "slurm_multi.plan")
PREPARE = ("-S", "-m", "slurm_multi.node", "prepare")
COLLECT = ("-S", "-m", "slurm_multi.results.collect_main")
SERVE = ("-S", "-m", "slurm_multi.barrier_main", "serve")
JOIN = ("-S", "-m", "slurm_multi.barrier_main", "join")
PORT = ("-S", "-m", "slurm_multi.barrier_main", "port")
CLICK_PLAN = ("-m", "slurm_multi", "job", "plan")
CLICK_PREPARE = ("-m", "slurm_multi", "node", "prepare")
CLICK_COLLECT = ("-m", "slurm_multi", "results", "collect")


# The click-free entries (the hot helpers' own parsers, slurm_multi.argv) start without click. The
# standard library is imported as it is needed (STYLE.md, "Libraries as they are"): no bans here.


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "MAD_", "PYTHON"))}
    env.update(PYTHONPATH=f"{REPO / 'py'}{os.pathsep}{CLICK_PATH}", SLURMD_NODENAME="node1", **extra)
    return env


def run(entry: tuple[str, ...], args: list[str], env: dict[str, str], cwd: Path, importtime: bool = False):
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, *entry, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, check=False)  # fmt: skip


def imported(stderr: str) -> list[str]:
    """The modules `-X importtime` reports."""
    return [line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")]


def talk_lines(stderr: str) -> str:
    """stderr without importtime's lines, with talk()'s time and host made comparable."""
    kept = [line + "\n" for line in stderr.splitlines() if not line.startswith("import time:")]
    return STAMP.sub("", "".join(kept))


def plan_args(emit: Path, submit: Path) -> list[str]:
    ours = ["--batch-args", "--emit", str(emit), "--submit-dir", str(submit), "--nodes", "n1 n2", "--"]
    return [*ours, "--manifest", str(TOY), "--dry-run", "-N", "2", "--timeout", "77", "--", "sh", "-c", "hi"]


def hung_and_profiled_job(root: Path) -> Path:
    """A copy of the 2-node fixture with hang evidence and a profile: collect's lazy imports all run."""
    jobdir = Path(shutil.copytree(PRIMUS_JOB, root / "4711"))
    (jobdir / "node_1" / "hang.json").write_text(json.dumps({"role": "cause", "state": "frozen"}))
    (jobdir / "node_0" / "hang.json").write_text(json.dumps({"role": "waiter", "state": "socket-wait"}))
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps({**job, "profile": "nsys"}))
    return jobdir


# ---------------------------------------------------------------------------------------- no click


def test_the_job_plan_imports_no_click(tmp_path: Path) -> None:
    done = run(PLAN, plan_args(tmp_path / "plan.sh", tmp_path), base_env(), tmp_path, importtime=True)
    assert done.returncode == 0, done.stderr
    modules = imported(done.stderr)
    assert "slurm_multi.context" in modules and "slurm_multi.plan" not in modules  # runpy runs it
    assert not [m for m in modules if m == "click" or m.startswith("click.")]
    assert "socket" not in modules  # a log line's host name is os.uname's


def test_node_prepare_imports_no_click(tmp_path: Path) -> None:
    env = base_env(SM_IMAGE="toy/model:local", SM_MANIFEST=str(TOY))
    done = run(PREPARE, ["--scratch", str(tmp_path / "s"), "--no-detect", "--", "true"], env, tmp_path, True)
    assert done.returncode == 0, done.stderr
    modules = imported(done.stderr)
    assert "slurm_multi.mounts" in modules and "slurm_multi.gpus" in modules
    assert not [m for m in modules if m == "click" or m.startswith("click.")]


@pytest.mark.parametrize(("tool", "vendor"), [("nvidia-smi", "NVIDIA"), ("amd-smi", "AMD")])
def test_node_prepare_finds_the_gpu_tool_on_the_path(tool: str, vendor: str, tmp_path: Path) -> None:
    # Detection as on a node: the fakes of tests/fakes answer as the vendor's tool would.
    fakes = tmp_path / "bin"
    fakes.mkdir()
    (fakes / tool).symlink_to(REPO / "tests" / "fakes" / tool)
    env = base_env(SM_RUNTIME="none")
    env["PATH"] = f"{fakes}{os.pathsep}{env['PATH']}"
    done = run(PREPARE, ["--scratch", str(tmp_path / "s"), "--", "true"], env, tmp_path, True)
    assert done.returncode == 0, done.stderr
    assert f"GPUs detected: {vendor} (0,1,2,3,4,5,6,7)" in done.stderr, done.stderr


def test_results_collect_imports_no_click_even_for_a_hung_profiled_job(tmp_path: Path) -> None:
    jobdir = hung_and_profiled_job(tmp_path)
    args = [str(jobdir), "--no-picture", "--perf-csv", str(tmp_path / "perf.csv")]
    done = run(COLLECT, args, base_env(), tmp_path, importtime=True)
    assert done.returncode == EXIT_FAILURE, done.stderr  # hung, and no profile reports
    modules = imported(done.stderr)
    assert {"slurm_multi.hangwatch", "slurm_multi.reports", "slurm_multi.results.perfcsv"} <= set(modules)
    assert not [m for m in modules if m == "click" or m.startswith("click.")]


def test_collect_imports_the_hang_watch_and_the_reports_only_for_such_a_job(tmp_path: Path) -> None:
    jobdir = Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))
    done = run(COLLECT, [str(jobdir), "--no-picture"], base_env(), tmp_path, importtime=True)
    assert done.returncode == 0, done.stderr
    modules = set(imported(done.stderr))
    assert not modules & {"slurm_multi.hangwatch", "slurm_multi.reports", "slurm_multi.results.perfcsv",
                          "matplotlib"}  # fmt: skip


def test_the_barrier_serve_and_join_import_no_click(tmp_path: Path) -> None:
    """Both run a real barrier on loopback: rank 0 released on its pipe, rank 1 gets GO."""
    env = base_env(SM_BARRIER_TOKEN="t0k3n-for-the-test")
    port = str(_free_port())
    argv = ["--nnodes", "2", "--bind", "127.0.0.1", "--port", port, "--image-id", "sha256:" + "a" * 64]
    serve = subprocess.Popen([sys.executable, "-X", "importtime", *SERVE, *argv, "--timeout", "20"],
                             env=env, cwd=tmp_path, stderr=subprocess.PIPE, text=True)  # fmt: skip
    argv = ["--rank", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--port", port]
    join = run(
        JOIN, [*argv, "--connect-timeout", "20", "--wait-timeout", "20"], env, tmp_path, importtime=True
    )
    _, served = serve.communicate(timeout=30)
    assert (serve.returncode, join.returncode) == (0, 0), served + join.stderr
    assert join.stdout == "sha256:" + "a" * 64 + "\n"
    for stderr in (served, join.stderr):
        modules = imported(stderr)
        assert "slurm_multi.barrier" in modules
        assert not [m for m in modules if m == "click" or m.startswith("click.")]
        # (slurm_multi.words and auth; a peer's name goes to the resolver without the idna codec, net)


def test_the_fitness_check_imports_no_click(tmp_path: Path) -> None:
    out = tmp_path / "fitness.json"
    argv = ["run", "--rank", "0", "--nnodes", "1", "--hosts", "node1", "--runtime", "none",
            "--probe-bytes", "0", "--out", str(out), "--disk", f"{tmp_path}=0"]  # fmt: skip
    done = run(("-S", "-m", "slurm_multi.fitness"), argv, base_env(), tmp_path, importtime=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["ok"] is True
    modules = imported(done.stderr)
    assert "slurm_multi.auth" in modules  # (the entry itself runs as __main__)
    assert not [m for m in modules if m == "click" or m.startswith("click.")]


def test_the_watch_imports_no_click(tmp_path: Path) -> None:
    step = subprocess.Popen(["sleep", "0.2"])
    argv = ["--jobdir", str(tmp_path), "--nodes", "", "--srun-pid", str(step.pid)]
    done = run(("-S", "-m", "slurm_multi.watch"), argv, base_env(), tmp_path, importtime=True)
    step.wait()
    assert done.returncode == 0, done.stderr
    modules = imported(done.stderr)
    assert "slurm_multi.events" in modules
    assert not [m for m in modules if m == "click" or m.startswith("click.")]


def test_the_hang_watch_imports_no_slow_stdlib(tmp_path: Path) -> None:
    """It starts beside every rank's container; the docker CLI and the diagnostics' tools (subprocess)
    are for a tcp:// engine and a hang only."""
    workload = subprocess.Popen(["sleep", "0.5"])
    (tmp_path / "node").mkdir()
    argv = ["--pid", str(workload.pid), "--timeout", "30", "--poll", "0.1", "--output", str(tmp_path / "log"),
            "--node-dir", str(tmp_path / "node")]  # fmt: skip
    done = run(("-S", "-m", "slurm_multi.hangwatch"), argv, base_env(), tmp_path, importtime=True)
    workload.wait()
    assert done.returncode == 0, done.stderr  # the workload ended: the watch with it
    modules = imported(done.stderr)
    assert "slurm_multi.events" in modules


def test_the_status_writer_imports_no_slow_stdlib(tmp_path: Path) -> None:
    """It starts warm beside every rank's container (lib/run.sh) and writes status.json after it."""
    argv = [sys.executable, "-X", "importtime", "-S", "-m", "slurm_multi.warm", "statusfile"]
    # A wake (import now), then the pipe closes: nothing asked of it, exit 0.
    done = subprocess.run(argv, input="\n", env=base_env(), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    modules = imported(done.stderr)
    assert "slurm_multi.statusfile" in modules


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nodes", "n1"], "Missing option '--jobdir'"),
        (["--jobdir", "/tmp", "--nodes", "n1", "--srun-pid", "x"], "Invalid value for '--srun-pid': 'x'"),
        (["--jobdir", "/tmp", "--nodes", "n1", "--srun-pid", "1", "--peer-grace", "-1"], "'--peer-grace'"),
    ],
)
def test_job_watch_errors_are_the_same_one_line_either_way(
    tmp_path: Path, args: list[str], says: str
) -> None:
    entries = (("-S", "-m", "slurm_multi.watch"), ("-m", "slurm_multi", "job", "watch"))
    fast, slow = (run(entry, args, base_env(), tmp_path) for entry in entries)
    assert fast.returncode == slow.returncode == EXIT_USAGE
    assert fast.stderr == slow.stderr and len(fast.stderr.splitlines()) == 1 and says in fast.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_barrier_options_take_their_environment_variables_as_click_did(tmp_path: Path) -> None:
    """MASTER_PORT, SLURM_JOB_ID and SM_BARRIER_PORT fill the options not given; a given option wins;
    a bad value in a variable is one line naming both."""
    flags = run(PORT, ["--master-port", "29500", "--job-id", "4242"], base_env(), tmp_path)
    from_env = run(PORT, [], base_env(MASTER_PORT="29500", SLURM_JOB_ID="4242"), tmp_path)
    assert flags.returncode == from_env.returncode == 0, flags.stderr + from_env.stderr
    assert flags.stdout == from_env.stdout and len(flags.stdout.split()) == 4
    given = run(PORT, ["--override", "21000", "--count", "2"], base_env(SM_BARRIER_PORT="30000"), tmp_path)
    assert given.stdout.split() == ["21000", "21001"]
    bad = run(PORT, [], base_env(MASTER_PORT="29500", SLURM_JOB_ID="x"), tmp_path)
    assert bad.returncode == EXIT_USAGE and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "slurm-multi: barrier port: Invalid value for '--job-id' (env var: 'SLURM_JOB_ID'): 'x' is not a "
        "whole number; Usage: slurm-multi barrier port [OPTIONS] (--help lists the options)"
    ]
    nothing = run(PORT, [], base_env(), tmp_path)  # no derivation input at all: a usage error
    assert nothing.returncode == EXIT_USAGE and len(nothing.stderr.splitlines()) == 1, nothing.stderr
    env = base_env(MASTER_ADDR="127.0.0.1", MASTER_PORT="1", SM_BARRIER_TOKEN="t")
    required = run(JOIN, ["--rank", "1", "--nnodes", "2", "--connect-timeout", "0"], env, tmp_path)
    assert "Missing option" not in required.stderr  # --master-addr came from MASTER_ADDR


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nnodes", "0"], "Invalid value for '--nnodes': '0' is less than 1"),
        (["--nnodes", "2", "--count", "33"], "'--count': '33' is not in the range 1<=x<=32"),
        (["--nnodes", "2", "--timeout", "-1"], "'--timeout': '-1' is not a finite number at least 0"),
        (["--nnodes", "2", "--timeout", "nan"], "'--timeout': 'nan' is not a finite number at least 0"),
        (["--nnodes", "2", "--port", "70000"], "'--port': '70000' is not in the range 1<=x<=65535"),
        ([], "Missing option '--nnodes' (INTEGER)"),
    ],
)  # fmt: skip
def test_barrier_serve_refuses_in_one_line_as_click_did(tmp_path: Path, argv: list[str], says: str) -> None:
    done = run(SERVE, argv, base_env(SM_BARRIER_TOKEN="t"), tmp_path)
    assert done.returncode == EXIT_USAGE, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("slurm-multi: barrier serve: ") and line.endswith(
        f"{says}; Usage: slurm-multi barrier serve [OPTIONS] (--help lists the options)"
    )


def test_barrier_join_refuses_a_phase_it_does_not_know(tmp_path: Path) -> None:
    done = run(
        JOIN, ["--rank", "1", "--nnodes", "2", "--master-addr", "h", "--phase", "late"], base_env(), tmp_path
    )
    assert done.returncode == EXIT_USAGE
    assert "Invalid value for '--phase': 'late' is not one of 'image', 'start', 'both'" in done.stderr


@pytest.mark.parametrize("entry", [PLAN, PREPARE, COLLECT, SERVE, JOIN])
def test_each_entry_prints_its_help_without_click(tmp_path: Path, entry: tuple[str, ...]) -> None:
    done = run(entry, ["--help"], base_env(), tmp_path, importtime=True)
    assert done.returncode == 0 and done.stdout.startswith("Usage: slurm-multi ")
    assert not [m for m in imported(done.stderr) if m == "click" or m.startswith("click.")]


# ---------------------------------------------------------------------------------------- same result


def test_job_plan_through_click_emits_what_the_click_free_plan_emits(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    fast = run(PLAN, plan_args(tmp_path / "a" / "plan.sh", tmp_path), base_env(), tmp_path)
    slow = run(CLICK_PLAN, plan_args(tmp_path / "b" / "plan.sh", tmp_path), base_env(), tmp_path)
    assert fast.returncode == slow.returncode == 0, fast.stderr + slow.stderr
    emitted = (tmp_path / "a" / "plan.sh").read_text()
    assert "PLAN_ACTION=dry-run" in emitted and "SM_TIMEOUT=77" in emitted
    assert emitted == (tmp_path / "b" / "plan.sh").read_text()
    assert (fast.stdout, talk_lines(fast.stderr)) == (slow.stdout, talk_lines(slow.stderr))


@pytest.mark.parametrize(
    "args",
    [
        ["--batch-args", "--", "--runtim", "pyxis"],  # the table's one-line error
        ["--batch-args", "--", "--image", "x"],  # not inside a job
        ["--nnodes", "0"],  # our parser's
        ["--bogus"],
    ],
)
def test_job_plan_errors_are_the_same_one_line_either_way(tmp_path: Path, args: list[str]) -> None:
    fast, slow = (run(entry, args, base_env(), tmp_path) for entry in (PLAN, CLICK_PLAN))
    assert fast.returncode == slow.returncode == EXIT_USAGE
    assert fast.stderr == slow.stderr and len(fast.stderr.splitlines()) == 1
    assert fast.stderr.startswith("slurm-multi: ") and "Traceback" not in fast.stderr


def test_the_plan_help_in_the_batch_args_goes_to_stdout_either_way(tmp_path: Path) -> None:
    args = ["--batch-args", "--", "--help", "--image", "x"]
    fast, slow = (run(entry, args, base_env(), tmp_path) for entry in (PLAN, CLICK_PLAN))
    assert fast.returncode == slow.returncode == 0
    assert fast.stdout == slow.stdout and fast.stdout.startswith("Usage: sbatch -N NODES sbatch/multi.sbatch")


def test_node_prepare_through_click_writes_what_the_click_free_prepare_writes(tmp_path: Path) -> None:
    env = base_env(SM_IMAGE="toy/model:local", SM_MANIFEST=str(TOY), SM_RANK="1", NNODES="2")
    outputs = []
    for name, entry in (("fast", PREPARE), ("slow", CLICK_PREPARE)):
        scratch = tmp_path / name
        args = ["--scratch", str(scratch), "--no-detect", "--node-scratch", "/scratch/r1", "--", "sh", "x"]
        done = run(entry, args, env, tmp_path)
        assert done.returncode == 0, done.stderr
        files = {p.name: p.read_text() for p in sorted(scratch.iterdir()) if p.is_file()}
        outputs.append((files, done.stdout, talk_lines(done.stderr)))
    assert "context.sh" in outputs[0][0] and "/scratch/r1/output:/sm-out" in outputs[0][0]["context.sh"]
    assert outputs[0] == outputs[1]


def test_node_prepare_errors_are_the_same_one_line_either_way(tmp_path: Path) -> None:
    env = base_env(SM_RUNTIME="docker")  # no image
    args = ["--scratch", str(tmp_path / "s"), "--no-detect"]
    fast, slow = (run(entry, args, env, tmp_path) for entry in (PREPARE, CLICK_PREPARE))
    assert fast.returncode == slow.returncode == EXIT_USAGE
    assert fast.stderr == slow.stderr
    assert fast.stderr == "slurm-multi: prepare: no image: give --image or a manifest with docker_image\n"


def test_results_collect_through_click_writes_what_the_click_free_collect_writes(tmp_path: Path) -> None:
    outputs = []
    for name, entry in (("fast", COLLECT), ("slow", CLICK_COLLECT)):
        jobdir = hung_and_profiled_job(tmp_path / name)
        done = run(entry, ["--json", str(jobdir), "--no-picture"], base_env(), tmp_path)
        summary = (jobdir / "summary.json").read_text()
        assert json.loads(done.stdout) == json.loads(summary)
        outputs.append((done.returncode, summary, (jobdir / "perf.csv").read_text(),
                        talk_lines(done.stderr).replace(str(jobdir), "JOBDIR")))  # fmt: skip
    assert outputs[0][0] == EXIT_FAILURE and "hung: " in outputs[0][1]
    assert outputs[0] == outputs[1]


def test_results_collect_usage_errors_are_the_same_one_line_either_way(tmp_path: Path) -> None:
    for args in (["/nonexistent/job"], [str(PRIMUS_JOB), "--error-pattern", "(unclosed"], []):
        fast, slow = (run(entry, args, base_env(), tmp_path) for entry in (COLLECT, CLICK_COLLECT))
        assert fast.returncode == slow.returncode == EXIT_USAGE
        assert fast.stderr == slow.stderr and len(fast.stderr.splitlines()) == 1


# ---------------------------------------------------------------------------------------- the seam


def test_a_click_free_entry_writes_its_one_line_into_sm_error_file(tmp_path: Path) -> None:
    errfile = tmp_path / "error"
    done = run(COLLECT, [str(tmp_path / "nope")], base_env(SM_ERROR_FILE=str(errfile)), tmp_path)
    assert done.returncode == EXIT_USAGE
    line = f"slurm-multi: results: job directory {tmp_path / 'nope'} does not exist; pass the directory "
    line += "the job wrote\n"
    assert errfile.read_text() == done.stderr == line


def test_without_click_helper_error_is_a_plain_exception_with_the_same_face(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from slurm_multi.common import HelperError, usage_error\n"
        "assert 'click' not in sys.modules and HelperError.__mro__[1] is Exception\n"
        "err = usage_error('area: what failed; what to do')\n"
        "said = 'area: what failed; what to do'\n"
        "assert (err.message, err.exit_code, err.format_message(), str(err)) == (said, 2, said, said)\n"
        "err.show()\n"
    )
    errfile = tmp_path / "error"
    done = subprocess.run([sys.executable, "-S", "-c", code], env=base_env(SM_ERROR_FILE=str(errfile)),
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == errfile.read_text() == "slurm-multi: area: what failed; what to do\n"


def test_with_click_helper_error_is_a_click_exception() -> None:
    assert issubclass(HelperError, click.ClickException)


def test_run_main_shows_a_helper_error_once_and_returns_its_code(capsys: pytest.CaptureFixture[str]) -> None:
    def body(argv: object) -> int:
        raise HelperError("x: it broke; fix it", 3)

    assert run_main(body, []) == 3
    assert capsys.readouterr().err == "slurm-multi: x: it broke; fix it\n"


def test_run_main_turns_a_bug_into_the_internal_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def body(argv: object) -> int:
        raise KeyError("oops")

    monkeypatch.delenv("SM_DEBUG", raising=False)
    monkeypatch.setenv("SM_ERROR_FILE", str(tmp_path / "error"))
    assert run_main(body, []) == EXIT_FAILURE
    line = "slurm-multi: internal error (KeyError: 'oops'); SM_DEBUG=1 shows the traceback\n"
    assert capsys.readouterr().err == line == (tmp_path / "error").read_text()
    monkeypatch.setenv("SM_DEBUG", "1")
    with pytest.raises(KeyError):
        run_main(body, [])


# ---------------------------------------------------------------------------------------- the parser

PARSER = options.Parser(
    "slurm-multi demo",
    "[-- ARGS...]",
    "A demo.",
    [
        options.Option("--name", metavar="NAME", required=True),
        options.Option("--count", metavar="N", convert=options.whole_number(1)),
        options.Option("--tag", options.MULTIPLE, dest="tags"),
        options.Option("--quiet", options.FLAG),
        options.Option("--write", options.SWITCH, off="--no-write"),
    ],
)


def test_the_parser_keeps_every_word_after_the_double_dash_and_the_last_value_wins() -> None:
    argv = ["w1", "--name=a", "--tag", "x", "--name", "b", "--tag=y", "--no-write", "--", "--name", "-h"]
    got = PARSER.parse(argv)
    assert got is not None
    assert (got.name, got.count, got.tags, got.quiet, got.write) == ("b", None, ["x", "y"], False, False)
    assert got.args == ["w1", "--name", "-h"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--nam", "a"], "No such option '--nam'"),
        (["--count", "2"], "Missing option '--name' (NAME)"),
        (["--name", "a", "--count", "0"], "Invalid value for '--count': '0' is less than 1"),
        (["--name", "a", "--count", "two"], "Invalid value for '--count': 'two' is not a whole number"),
        (["--name"], "Option '--name' requires an argument (NAME)"),
        (["--name", "a", "--quiet=yes"], "Option '--quiet' does not take a value"),
    ],
)
def test_the_parser_refuses_in_one_line_naming_the_option(argv: list[str], says: str) -> None:
    with pytest.raises(HelperError) as err:
        PARSER.parse(argv)
    assert err.value.exit_code == EXIT_USAGE
    usage = "Usage: slurm-multi demo [OPTIONS] [-- ARGS...] (--help lists the options)"
    assert err.value.message == f"demo: {says}; {usage}"


def test_the_parser_prints_help_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert PARSER.parse(["--count", "x", "-h"]) is None  # help first, as click does for a later error
    out = capsys.readouterr().out
    assert out.startswith("Usage: slurm-multi demo [OPTIONS] [-- ARGS...]\n\n  A demo.\n")
    assert "  --write / --no-write" in out and "[required]" in out
