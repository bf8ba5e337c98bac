"""`slurm-multi job plan --batch-args`: the batch step's argv and environment, parsed once against the
settings table, validated with the manifest, and emitted as the bash every node gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy" / "build_manifest.json"


def plan(tmp_path, argv, env=None):
    """Run the plan as the batch step does; return (exit, stdout, stderr, the emitted bash's values)."""
    emit = tmp_path / "plan.sh"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "MAD_"))}
    base.update(PYTHONPATH=str(ROOT / "py"), **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "plan", "--batch-args", "--emit", str(emit),
         "--submit-dir", str(tmp_path), "--", *argv],
        env=base, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    values = {}
    if proc.returncode == 0 and emit.exists():
        dump = subprocess.run(
            ["bash", "-c", f"source {emit}; "
             'for v in ${!SM_@} ${!PLAN_@}; do printf "%s=%s\\n" "$v" "${!v}"; done; '
             'printf "CMD=%s\\n" "${SM_CMD[*]}"'],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        values = dict(line.split("=", 1) for line in dump.stdout.splitlines())
    return proc.returncode, proc.stdout, proc.stderr, values


def test_help_goes_to_stdout_and_the_plan_says_so(tmp_path):
    code, out, err, values = plan(tmp_path, ["--help", "--image", "x"])
    assert code == 0 and out.startswith("Usage: sbatch -N NODES sbatch/multi.sbatch")
    assert "--hang-timeout SECONDS" in out and values["PLAN_ACTION"] == "help"


def test_a_dry_run_emits_every_resolved_value_and_writes_nothing(tmp_path):
    code, _, err, v = plan(
        tmp_path, ["--dry-run", "-N", "3", "--manifest", str(TOY), "--timeout", "77", "--", "sh", "x"]
    )
    assert code == 0, err
    assert v["PLAN_ACTION"] == "dry-run" and v["PLAN_NNODES"] == "3"
    assert v["SM_TIMEOUT"] == "77" and v["SM_RUNTIME"] == "docker" and v["SM_HANG_TIMEOUT"] == "900"
    assert v["SM_SETTINGS_RESOLVED"] == "1" and v["CMD"] == "sh x"
    assert not (tmp_path / "slurm_output").exists()


def test_no_node_count_in_a_dry_run_means_two(tmp_path):
    assert plan(tmp_path, ["--dry-run", "--image", "x"])[3]["PLAN_NNODES"] == "2"


def test_a_real_job_writes_job_json_with_what_sbatch_asked_for(tmp_path):
    env = {"SLURM_JOB_ID": "91", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "2"}
    code, _, err, v = plan(tmp_path, ["--runtime", "none", "--", "true"], env)
    assert code == 0, err
    assert v["PLAN_ACTION"] == "run" and v["SM_NTASKS_PER_NODE"] == "2"
    job = json.loads(Path(v["SM_JOBDIR"], "job.json").read_text())
    assert job["tasks_per_node"] == 2 and job["nnodes"] == 2
    assert job["settings"]["SM_NTASKS_PER_NODE"] == "2" and job["settings"]["SM_STOP_GRACE"] == "30"


def test_minus_n_after_the_script_inside_a_real_job_is_refused(tmp_path):
    env = {"SLURM_JOB_ID": "92", "SLURM_JOB_NUM_NODES": "1"}
    code, _, err, _ = plan(tmp_path, ["-N", "4", "--image", "x"], env)
    assert code == 2
    assert err.startswith("slurm-multi: -N 4 after the script is the dry run's node count, not sbatch's")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--nodes", "0"], "--nodes '0' is not a node count"),
        (["--nodes=x"], "--nodes 'x' is not a node count"),
        (["-N", "0"], "-N '0' is not a node count"),
    ],
)
def test_a_bad_node_count_names_the_flag_as_typed(tmp_path, argv, says):
    code, _, err, _ = plan(tmp_path, ["--dry-run", *argv, "--image", "x"])
    assert code == 2 and err.startswith(f"slurm-multi: {says} (a whole number >= 1)")
    code, _, err, _ = plan(
        tmp_path, ["--nodes", "4", "--image", "x"], {"SLURM_JOB_ID": "93", "SLURM_JOB_NUM_NODES": "1"}
    )
    assert code == 2 and err.startswith("slurm-multi: --nodes 4 after the script is the dry run's node count")


def test_errors_are_one_line_once_without_a_log_prefix(tmp_path):
    code, _, err, _ = plan(tmp_path, ["--runtim", "pyxis"])
    assert (code, err) == (
        2,
        "slurm-multi: unknown option '--runtim' (did you mean --runtime?); --help lists every option\n",
    )
    code, _, err, _ = plan(tmp_path, ["--image", "x", "--timeout", "-5"])
    assert code == 2 and err == (
        "slurm-multi: --timeout '-5': expected a whole number of seconds, 0 or more (SM_TIMEOUT)\n"
    )
    code, _, err, _ = plan(tmp_path, ["--image", "x"])
    assert code == 2 and "not inside a Slurm job" in err


def _quarantine_plan(tmp_path: Path, state: Path, *more: str) -> tuple[int, list[str], str]:
    """The plan of a job on node1..node3 with --state-dir STATE: (exit, PLAN_QUARANTINED, the error)."""
    emit = tmp_path / "plan.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "MAD_"))}
    env.update(PYTHONPATH=str(ROOT / "py"), SLURM_JOB_ID="4711")
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "plan", "--batch-args", "--emit", str(emit),
         "--submit-dir", str(tmp_path), "--nodes", "node1 node2 node3", "--", "--image", "x",
         "--state-dir", str(state), "--out", str(tmp_path / "out"), *more],
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    dump = subprocess.run(
        ["bash", "-c", f'source {emit}; printf "%s\\n" "${{PLAN_QUARANTINED[@]}}"; '
         'echo "E=$PLAN_QUARANTINE_ERROR"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    *lines, error = dump.stdout.splitlines()
    return proc.returncode, [line for line in lines if line], error.removeprefix("E=")


def test_the_plan_reads_the_quarantine_for_the_jobs_nodes_so_no_helper_starts_for_it(tmp_path):
    """What `quarantine check` prints for the allocation, emitted for job::respect_quarantine; an
    unreadable quarantine is its one line (the job says it and does not use the file)."""
    state = tmp_path / "state"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "py")}
    for node, reason in (("node2", "disk full"), ("node9", "not in this job")):
        add = ["add", "--state-dir", str(state), "--job", "7", "--reason", reason, node]
        subprocess.run([sys.executable, "-m", "slurm_multi", "quarantine", *add], env=env, check=True)
    checked = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "quarantine", "check", "--state-dir", str(state),
         "--nodes", "node1 node2 node3"], env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    _, quarantined, error = _quarantine_plan(tmp_path, state)
    assert quarantined == checked.stdout.splitlines() and error == ""
    assert [line.split("\t")[:3] for line in quarantined] == [["node2", "disk full", "7"]]
    _, none_in_a_dry_run, _ = _quarantine_plan(tmp_path, state, "--dry-run")
    assert none_in_a_dry_run == []
    (state / "quarantine.json").write_text("{not json")
    _, quarantined, error = _quarantine_plan(tmp_path, state)
    assert quarantined == [] and error.startswith("quarantine: ") and "quarantine.json" in error


def test_a_second_run_in_one_allocation_moves_the_first_runs_files_to_run_1(tmp_path):
    """`salloc`, then the batch script twice: one job id, one job dir. The second run starts clean
    (events.log is appended to: without this its timeline held both runs) and loses nothing."""
    env = {"SLURM_JOB_ID": "93", "SLURM_JOB_NUM_NODES": "2"}
    code, _, err, v = plan(tmp_path, ["--runtime", "none", "--", "true"], env)
    assert code == 0 and v["PLAN_EARLIER_RUN"] == "", err
    jobdir = Path(v["SM_JOBDIR"])
    (jobdir / "node_0").mkdir()
    (jobdir / "node_0" / "events.log").write_text("first run\n")
    (jobdir / "batch.log").write_text("first run\n")
    (jobdir / "attempt_0").mkdir()  # a requeue's earlier attempt stays where collect reads it
    code, _, err, v = plan(tmp_path, ["--runtime", "none", "--", "true"], env)
    assert code == 0 and v["PLAN_EARLIER_RUN"] == "run_1", err
    assert sorted(p.name for p in jobdir.iterdir()) == ["attempt_0", "job.json", "run_1"]
    assert (jobdir / "run_1" / "node_0" / "events.log").read_text() == "first run\n"
    assert sorted(p.name for p in (jobdir / "run_1").iterdir()) == ["batch.log", "job.json", "node_0"]
    code, _, err, v = plan(tmp_path, ["--runtime", "none", "--", "true"], env)
    assert code == 0 and v["PLAN_EARLIER_RUN"] == "run_2", err
    assert sorted(p.name for p in jobdir.iterdir()) == ["attempt_0", "job.json", "run_1", "run_2"]


def test_a_job_dir_whose_earlier_run_cannot_be_moved_is_a_one_line_error(tmp_path, monkeypatch):
    from slurm_multi import plan as plan_module
    from slurm_multi.common import HelperError

    (tmp_path / "job.json").write_text("{}")
    (tmp_path / "run_1").mkdir()

    def refused(path, *args):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plan_module.os, "mkdir", refused)
    with pytest.raises(HelperError) as caught:
        plan_module.set_aside_earlier_run(str(tmp_path))
    assert str(caught.value) == (
        f"job: the job dir {tmp_path} holds an earlier run's files and they cannot be moved to "
        "run_2/: Permission denied"
    )
    assert (tmp_path / "job.json").exists()  # nothing moved, nothing lost


# ---- the interpreter check, answered by the plan --------------------------------------------------


def test_a_python_without_click_stops_the_plan_with_one_line_naming_it_and_the_fix(tmp_path):
    # The plan is a click command: an interpreter that ran it has click; one without says so in one
    # line (into SM_ERROR_FILE too: the batch step's reason), never a traceback.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = str(bare / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SM_"))}
    env.update(PYTHONPATH=str(ROOT / "py"), SM_ERROR_FILE=str(tmp_path / "error"))
    done = subprocess.run([python, "-m", "slurm_multi", "job", "plan", "--", "--dry-run", "--image", "x"],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert (
        f"helper interpreter {python} " in done.stderr
        and "has no 'click' module; set SM_PYTHON" in done.stderr
    )
    assert (tmp_path / "error").read_text() == done.stderr


def _no_launcher_manifest(tmp_path: Path) -> Path:
    manifest = json.loads(TOY.read_text())
    del manifest["deployment_config"]["distributed"]["launcher"]
    path = tmp_path / "checkout" / "build_manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(manifest))
    return path


@pytest.mark.parametrize(
    ("argv", "launcher", "world"),
    [
        ([], "torchrun", 2),  # madengine's default: one torchrun world of 2 x 1
        (["--nproc-per-node", "3"], "torchrun", 6),
        (["--launcher", "none"], "none", 2),  # none still means none; the world is the job's ranks
    ],
)
def test_a_manifest_naming_no_launcher_runs_one_world_and_job_json_expects_it(
    tmp_path, argv, launcher, world
):
    env = {"SLURM_JOB_ID": "92", "SLURM_JOB_NUM_NODES": "2"}
    code, _, err, v = plan(tmp_path, ["--manifest", str(_no_launcher_manifest(tmp_path)), *argv], env)
    assert code == 0, err
    assert v["SM_LAUNCHER"] == launcher
    job = json.loads(Path(v["SM_JOBDIR"], "job.json").read_text())
    assert (job["launcher"], job["world_size"]) == (launcher, world)


@pytest.mark.parametrize(("nodes", "tasks", "world"), [("2", "1", 2), ("3", "2", 6), ("1", "4", None)])
def test_every_multi_node_job_expects_a_world_of_its_ranks(tmp_path, nodes, tasks, world):
    env = {"SLURM_JOB_ID": "93", "SLURM_JOB_NUM_NODES": nodes, "SLURM_NTASKS_PER_NODE": tasks}
    code, _, err, v = plan(tmp_path, ["--runtime", "none", "--", "true"], env)
    assert code == 0, err
    assert json.loads(Path(v["SM_JOBDIR"], "job.json").read_text())["world_size"] == world


@pytest.mark.parametrize(("runtime", "tasks", "refused"), [("none", "2", True), ("pyxis", "1", False)])
def test_a_one_world_launcher_on_several_tasks_per_node_is_refused_in_one_line(
    tmp_path, runtime, tasks, refused
):
    env = {"SLURM_JOB_ID": "94", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": tasks}
    argv = ["--manifest", str(_no_launcher_manifest(tmp_path)), "--runtime", runtime]
    code, _, err, _ = plan(tmp_path, [*argv, "--launcher", "torchrun"], env)
    if refused:
        assert code == 2
        assert "launcher torchrun starts 1 processes per node itself; run one task per node " in err
        assert "(--ntasks-per-node 1), not 2" in err
    else:
        assert code == 0, err


@pytest.mark.parametrize("argv, says", [
    (["-N", ""], "-N '': an empty node count; give a whole number >= 1"),
    (["--nodes="], "--nodes '': an empty node count; give a whole number >= 1"),
    (["-N", "99999999999999999999"], "-N '99999999999999999999' is not a node count (a whole number >= 1); "
                                     "a plan takes at most 100000"),
    (["-N", "٣"], "-N '٣' is not a node count (a whole number >= 1)"),
])  # fmt: skip
def test_a_node_count_is_refused_empty_non_ascii_or_past_any_machine(tmp_path, argv, says):
    # -N 10**20 filled memory for as long as it was let run; -N '' assumed 2 nodes without a word.
    code, _, err, _ = plan(tmp_path, ["--dry-run", *argv, "--image", "x"])
    assert code == 2 and err.startswith(f"slurm-multi: {says}") and len(err.splitlines()) == 1, err


def test_a_node_count_with_a_leading_zero_is_that_count(tmp_path):
    code, _, err, v = plan(tmp_path, ["--dry-run", "-N", "03", "--ntasks-per-node", "02", "--runtime", "none",
                                      "--", "true"])  # fmt: skip
    assert code == 0, err
    assert v["PLAN_NNODES"] == "3" and v["SM_NTASKS_PER_NODE"] == "2"


@pytest.mark.parametrize(
    ("before", "env", "source"),
    [
        (["--job-id", "9", "--nnodes", "3", "--write"], {}, "--nnodes"),
        ([], {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "3"}, "SLURM_JOB_NUM_NODES"),
    ],
)
def test_a_node_list_of_another_length_than_the_job_is_refused_and_writes_nothing(
    tmp_path, before, env, source
):
    # PLAN_NNODES=3 with two names (and job.json so) was planned, exit 0.
    emit = tmp_path / "plan.sh"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "MAD_"))}
    base.update(PYTHONPATH=str(ROOT / "py"), **env)
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "plan", "--batch-args", "--emit", str(emit), *before,
         "--nodes", "n1 n2", "--submit-dir", str(tmp_path), "--", "--image", "x",
         "--out", str(tmp_path / "out")],
        env=base, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"slurm-multi: job: --nodes names 2 node(s) but the job has 3 ({source}); give one name per node, "
        "in rank order"
    ]
    assert not emit.exists() and not (tmp_path / "out").exists()
