"""perf.csv's values as madengine writes them: its `performance:` line, its HuggingFace fallback, the
model's log error scan fields, the per-job columns (n_gpus, training_precision, pipeline,
build_number, gpu_architecture) and the default timeout.

The expected values are madengine's own results (ROCm/madengine deployment/base.py
PERFORMANCE_LOG_PATTERN, container_runner.py, container_runner_helpers.py), written out here; the
job directories are judged by the real collect, the job.json they hold written by the real plan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi.cli import group
from slurm_multi.context import resolve
from slurm_multi.results import collect, logscan, parse_perf_lines
from slurm_multi.results.logmetrics import read_perf_log
from test_results import make_job, ok_status, read_perf, read_summary

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the performance line

# line -> (value, metric) as madengine's regex reads it (None: it finds no performance there).
MADENGINE_PERF_LINES = [
    ("performance: 14164 samples_per_second", ("14164", "samples_per_second")),
    ("performance: 14164/s, samples_per_second", ("14164", "samples_per_second")),
    ("performance: 14164/s samples_per_second", ("14164", "samples_per_second")),
    ("performance: 14164, samples_per_second", ("14164", "samples_per_second")),
    ("performance: 14164,/s metric", ("14164", "metric")),
    ("performance: 14164, /s metric", ("14164", "metric")),
    ("performance: 14164 /s sps", ("14164", "sps")),
    ("performance: 14164 /s, sps", ("14164", "sps")),
    ("performance: 1.5e3 tokens/sec", ("1.5e3", "tokens/sec")),
    ("performance: 3.0E-2 loss", ("3.0E-2", "loss")),
    ("performance: -0.5 loss", ("-0.5", "loss")),
    ("performance: +2 x", ("+2", "x")),
    ("performance: .5 x", (".5", "x")),
    ("performance: 12. x", ("12.", "x")),
    ("performance: 12 (simulated)", ("12", "(simulated)")),
    ("performance:\t8\tsps", ("8", "sps")),
    ("performance: 5 x;y", ("5", "x;y")),
    ("performance: 5 sps.", ("5", "sps.")),
    ("performance: 7 / s", ("7", "/")),
    ("my_performance: 3 x", ("3", "x")),
    ("[rank0] performance: 7082.1 samples_per_second node_id: 2", ("7082.1", "samples_per_second")),
    ("performance:14164 sps", None),
    ("performance: 14164", None),
    ("performance: 14164/s", None),
    ("Performance: 1 x", None),
    ("PERFORMANCE: 1 x", None),
    ("performance : 1 x", None),
    ("performance: 1,234 sps", None),
    ("performance: nan sps", None),
    ("performance: inf sps", None),
    ("performance: 1.2.3 x", None),
    ("performance: 0x10 x", None),
    ("performance: 5 ,x", None),
    ("throughput performance: fast things", None),
]


@pytest.mark.parametrize(("line", "expected"), MADENGINE_PERF_LINES)
def test_a_performance_line_reads_as_madengines_regex_reads_it(line: str, expected: tuple[str, str] | None):
    found = [(p.value, p.metric) for p in parse_perf_lines(f"{line}\n")]
    assert found == ([(float(expected[0]), expected[1])] if expected else [])


def test_a_value_madengine_reads_as_infinite_is_no_value_here():
    """madengine takes `1e999` (and writes inf): a perf.csv value here is a finite number."""
    assert parse_perf_lines("performance: 1e999 sps\n") == []


def test_the_value_and_metric_do_not_reach_into_the_next_line():
    """madengine searches the whole log, so its `\\s+` crosses line ends; here a line is judged alone."""
    assert parse_perf_lines("performance: 14164\nsamples_per_second done\n") == []


def test_log_line_rows_carry_madengines_value_and_metric(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 1, logs={0: "warmup\nperformance: 14164/s, samples_per_second\n"})
    collect(jobdir)
    assert [(r["performance"], r["metric"], r["status"]) for r in read_perf(jobdir)] == [
        ("14164", "samples_per_second", "SUCCESS")
    ]


# ----------------------------------------------------------------------------- the HuggingFace fallback

HF_LOG = (
    "{'loss': 2.31, 'learning_rate': 5e-05, 'epoch': 0.5}\n"
    "{'train_runtime': 12.5, 'train_samples_per_second': 4.23, 'train_steps_per_second': 0.5}\n"
    "***** train metrics *****\n"
    "  train_samples_per_second =       4.24\n"
)


def test_the_first_train_samples_per_second_is_read_in_both_of_huggingfaces_spellings():
    assert read_perf_log(HF_LOG) == ([], 4.23)
    assert read_perf_log("  train_samples_per_second =   1.5e+02\n") == ([], 150.0)
    assert read_perf_log('"train_samples_per_second": 7\n') == ([], 7.0)
    assert read_perf_log("train_samples_per_second\n") == ([], None)


def test_without_a_performance_line_the_huggingface_value_is_the_result(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, logs={0: HF_LOG, 1: "worker done\n"})
    summary = collect(jobdir)
    assert (summary.verdict, summary.source) == ("SUCCESS", "log")
    assert read_summary(jobdir)["log_metrics"] == {
        "samples_per_second": {
            "rule": "sum (throughput); from train_samples_per_second",
            "value": 4.23,
            "values": [{"rank": 0, "node": "node1", "value": 4.23}],
        }
    }
    assert [(r["performance"], r["metric"], r["status"]) for r in read_perf(jobdir)] == [
        ("4.23", "samples_per_second", "SUCCESS")
    ]


def test_a_performance_line_on_any_node_wins_over_the_huggingface_value(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, logs={0: HF_LOG, 1: "performance: 10 tokens_per_second\n"})
    collect(jobdir)
    assert [(r["performance"], r["metric"]) for r in read_perf(jobdir)] == [("10", "tokens_per_second")]


# ----------------------------------------------------------------------------- the log error scan fields


def job_with_scan(root: Path, logs: dict[int, str], statuses: dict | None = None, **scan: Any) -> Path:
    """A 2-node job whose CSV has a result, with the log error scan fields in job.json."""
    csv = "model,performance,metric\ntoy,100.5,samples_per_second\n"
    jobdir = make_job(root, 2, csvs={0: csv}, logs=logs, statuses=statuses)
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps({**job, **scan}))
    return jobdir


def hits(summary: Any) -> list[tuple[int, int, str]]:
    return [(node.rank, hit.line, hit.pattern) for node in summary.nodes for hit in node.log_errors]


def test_the_models_patterns_replace_the_defaults_as_literal_substrings(tmp_path: Path):
    logs = {0: "RuntimeError: ignored now\nFATAL ERROR: disk\n", 1: "ok x(y ok\nfatal error\nxxy\n"}
    jobdir = job_with_scan(tmp_path / "job", logs, log_error_patterns=["FATAL ERROR", "x(y"])
    summary = collect(jobdir)
    assert hits(summary) == [(0, 2, "FATAL ERROR"), (1, 1, "x(y")]
    assert summary.verdict == "FAILURE"
    assert summary.reasons == [
        "node1 (rank 0): error pattern 'FATAL ERROR' at node.log:2 (FATAL ERROR: disk)",
        "node2 (rank 1): error pattern 'x(y' at node.log:1 (ok x(y ok)",
    ]


def test_a_literal_pattern_can_name_a_tracebacks_header(tmp_path: Path):
    traceback = 'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\nKeyError: 1\n'
    header = "Traceback (most recent call last)"
    jobdir = job_with_scan(tmp_path / "job", {1: traceback}, log_error_patterns=[header])
    assert hits(collect(jobdir)) == [(1, 1, header)]


def test_a_line_holding_a_benign_text_never_counts(tmp_path: Path):
    logs = {
        0: "RuntimeError: stream closed (expected in teardown)\nRuntimeError: real\n",
        1: "FutureWarning: RuntimeError will be raised\n[rocprofv3] CUDA error in tracer\n",
    }
    jobdir = job_with_scan(tmp_path / "job", logs, log_error_benign_patterns=["expected in teardown"])
    assert hits(collect(jobdir)) == [(0, 2, "RuntimeError")]


def test_a_traceback_ending_in_a_benign_line_counts_nothing(tmp_path: Path):
    traceback = 'Traceback (most recent call last):\n  File "t.py", line 1, in <module>\nKeyboardInterrupt\n'
    jobdir = job_with_scan(tmp_path / "job", {0: traceback}, log_error_benign_patterns=["KeyboardInterrupt"])
    assert collect(jobdir).verdict == "SUCCESS"
    jobdir = job_with_scan(tmp_path / "plain", {0: traceback})
    assert hits(collect(jobdir)) == [(0, 3, "Traceback")]


def test_with_the_scan_off_only_exit_codes_judge(tmp_path: Path):
    failed = ok_status(1, "node2")
    failed.update(exit_code=3, status="failed")
    logs = {0: "RuntimeError: boom\nTraceback (most recent call last):\n  x\nValueError: v\n", 1: "fine\n"}
    jobdir = job_with_scan(tmp_path / "job", logs, log_error_pattern_scan=False)
    summary = collect(jobdir)
    assert (summary.verdict, hits(summary)) == ("SUCCESS", [])
    jobdir = job_with_scan(tmp_path / "failed", logs, statuses={1: failed}, log_error_pattern_scan=False)
    summary = collect(jobdir)
    assert (summary.verdict, summary.reasons) == ("FAILURE", ["node2 (rank 1): container exited 3"])


def run_collect_cli(jobdir: Path, *options: str) -> Any:
    return CliRunner().invoke(group, ["results", "collect", str(jobdir), "--no-picture", *options])


def test_error_pattern_options_add_to_and_replace_the_models_patterns(tmp_path: Path):
    logs = {0: "FATAL ERROR: disk\nWatchdog caught collective operation timeout\nRuntimeError: x\n"}
    jobdir = job_with_scan(tmp_path / "job", logs, log_error_patterns=["FATAL ERROR"])
    run_collect_cli(jobdir, "--error-pattern", "Watchdog")
    assert [(e["line"], e["pattern"]) for e in read_summary(jobdir)["nodes"][0]["log_errors"]] == [
        (1, "FATAL ERROR"),
        (2, "Watchdog"),
    ]
    run_collect_cli(jobdir, "--error-pattern", "Watchdog", "--no-default-patterns")
    assert [(e["line"], e["pattern"]) for e in read_summary(jobdir)["nodes"][0]["log_errors"]] == [
        (2, "Watchdog")
    ]
    jobdir = job_with_scan(tmp_path / "off", logs, log_error_pattern_scan=False)
    run_collect_cli(jobdir, "--error-pattern", "Watchdog")  # asked for by hand: it still counts
    assert [(e["line"], e["pattern"]) for e in read_summary(jobdir)["nodes"][0]["log_errors"]] == [
        (2, "Watchdog")
    ]


@pytest.mark.parametrize(
    ("fields", "warning"),
    [
        ({"log_error_pattern_scan": "no"}, "job.json log_error_pattern_scan 'no' is not true or false"),
        ({"log_error_patterns": "FATAL"}, "job.json log_error_patterns is not a list of non-empty strings"),
    ],
)
def test_a_hand_edited_scan_field_of_another_shape_is_a_warning(tmp_path: Path, fields: dict, warning: str):
    jobdir = job_with_scan(tmp_path / "job", {0: "RuntimeError: boom\n"}, **fields)
    summary = collect(jobdir)
    assert any(w.startswith(warning) for w in summary.warnings), summary.warnings
    assert hits(summary) == [(0, 1, "RuntimeError")]  # the defaults, as without the field


CHUNK_SIZES = [(1 << 20, 1 << 16), (5, 8)]  # (characters a chunk, bytes of the first read)
LITERAL_LOG_PIECES = [
    "FATAL ERROR: disk", "fatal error", "x(y", "xxy", "a$b", "ok", "", "Traceback (most recent call last):",
    '  File "t.py", line 1', "KeyError: 1", "expected in teardown", "FutureWarning: FATAL ERROR", "é x(y",
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(LITERAL_LOG_PIECES), max_size=30), st.sampled_from(CHUNK_SIZES))
def test_a_log_read_in_chunks_gives_what_its_lines_give_for_literal_patterns(pieces: list[str], sizes):
    """The chunk prefilter takes a literal pattern's text as the literal every hit holds."""
    patterns = logscan.literal_patterns(["FATAL ERROR", "x(y", "a$b", "Traceback (most recent call last)"])
    benign = ["expected in teardown"]
    text = "".join(piece + "\n" for piece in pieces)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.log"
        path.write_text(text)
        saved = logscan.SCAN_CHUNK_CHARS, logscan.READ_BLOCK
        logscan.SCAN_CHUNK_CHARS, logscan.READ_BLOCK = sizes
        try:
            assert logscan.scan_log_file(path, patterns, benign=benign) == logscan.scan_log_errors(
                text, patterns, benign=benign
            )
        finally:
            logscan.SCAN_CHUNK_CHARS, logscan.READ_BLOCK = saved


# ----------------------------------------------------------------------------- the plan writes job.json


def write_manifest(path: Path, model: dict[str, Any], context: dict[str, Any] | None = None,
                   deployment: dict[str, Any] | None = None) -> Path:  # fmt: skip
    entry = {"name": "toy_model", "scripts": "run.sh", "args": "--steps 2", **model}
    document = {
        "built_images": {"m": {"docker_image": "toy/model:local"}},
        "built_models": {"m": entry},
        "context": context or {},
        "deployment_config": deployment or {},
    }
    path.write_text(json.dumps(document))
    return path


def run_plan(tmp_path: Path, manifest: Path, env: dict[str, str] | None = None) -> tuple[int, str, dict]:
    """`slurm-multi job plan` writing job.json for a 2-node job, in an environment without the
    variables the plan reads (ours, Slurm's, madengine's, a CI's pipeline and BUILD_NUMBER)."""
    skipped = ("SM_", "SLURM", "MAD_", "pipeline", "BUILD_NUMBER")
    base = {k: v for k, v in os.environ.items() if not k.startswith(skipped)}
    base.update(PYTHONPATH=str(REPO / "py"), SM_MANIFEST=str(manifest), SM_OUT=str(tmp_path / "out"))
    base.update(SM_RUNTIME="docker", **(env or {}))
    proc = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "plan", "--job-id", "7", "--nnodes", "2",
         "--nodes", "n1 n2", "--write"],
        env=base, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    path = tmp_path / "out" / "toy_model" / "7" / "job.json"
    return proc.returncode, proc.stderr, json.loads(path.read_text()) if proc.returncode == 0 else {}


# The per-job perf.csv columns the plan writes into job.json.
JOB_COLUMNS = ("n_gpus", "gpus_per_node", "training_precision", "pipeline", "build_number",
               "gpu_architecture")  # fmt: skip


def test_the_plan_carries_the_models_columns_and_scan_fields_into_job_json_and_perf_csv(tmp_path: Path):
    manifest = write_manifest(
        tmp_path / "m.json",
        {
            "n_gpus": "-1",
            "training_precision": "fp16",
            "log_error_pattern_scan": "yes",
            "log_error_patterns": ["FATAL ERROR", "x, y"],
            "log_error_benign_patterns": ["expected in teardown"],
        },
        context={"docker_env_vars": {"MAD_SYSTEM_GPU_ARCHITECTURE": "gfx942"}},
        deployment={"slurm": {"gpus_per_node": 4}},
    )
    code, err, job = run_plan(tmp_path, manifest, {"pipeline": "nightly", "BUILD_NUMBER": "42"})
    assert code == 0, err
    assert {k: job[k] for k in JOB_COLUMNS} == {
        "n_gpus": 8,
        "gpus_per_node": 4,
        "training_precision": "fp16",
        "pipeline": "nightly",
        "build_number": "42",
        "gpu_architecture": "gfx942",
    }
    assert (job["log_error_pattern_scan"], job["log_error_patterns"], job["log_error_benign_patterns"]) == (
        True, ["FATAL ERROR", "x, y"], ["expected in teardown"]
    )  # fmt: skip
    jobdir = tmp_path / "out" / "toy_model" / "7"
    logs = {0: "performance: 10 samples_per_second\nRuntimeError: not a pattern of this model\n",
            1: "performance: 12 samples_per_second\nx, y (expected in teardown)\n"}  # fmt: skip
    make_job(jobdir, 2, logs=logs, job={})  # the node dirs; job.json stays the plan's
    summary = collect(jobdir)
    assert (summary.verdict, summary.reasons) == ("SUCCESS", [])
    (row,) = read_perf(jobdir)
    assert {c: row[c] for c in (*JOB_COLUMNS, "nnodes", "performance", "metric")} == {
        "n_gpus": "8",
        "nnodes": "2",
        "gpus_per_node": "4",
        "training_precision": "fp16",
        "pipeline": "nightly",
        "build_number": "42",
        "gpu_architecture": "gfx942",
        "performance": "22",
        "metric": "samples_per_second",
    }
    (jobdir / "node_1" / "node.log").write_text("performance: 12 samples_per_second\nFATAL ERROR\n")
    assert hits(collect(jobdir)) == [(1, 2, "FATAL ERROR")]


@pytest.mark.parametrize(
    ("model", "deployment", "env", "n_gpus", "gpus_per_node"),
    [
        ({"n_gpus": "-1"}, {}, {}, 2, 1),  # nothing says: madengine's 1 GPU per node
        ({"n_gpus": "-1"}, {}, {"MAD_SYSTEM_NGPUS": "8"}, 16, 8),  # -1 is the system's GPUs
        ({"n_gpus": "0"}, {}, {}, 0, 0),  # a model that asks for no GPU: a CPU run
        ({"n_gpus": "2"}, {}, {}, 4, 2),
        ({"n_gpus": "2"}, {}, {"SLURM_GPUS_ON_NODE": "8"}, 16, 8),  # the container gets the node's GPUs
        ({"n_gpus": "-1"}, {"slurm": {"gpus_per_node": 4}}, {"SLURM_GPUS_ON_NODE": "8"}, 8, 4),
    ],
)
def test_n_gpus_is_the_jobs_gpus_never_the_manifests_minus_one(
    tmp_path: Path, model: dict, deployment: dict, env: dict, n_gpus: int, gpus_per_node: int
):
    manifest = write_manifest(tmp_path / "m.json", model, deployment=deployment)
    code, err, job = run_plan(tmp_path, manifest, env)
    assert code == 0, err
    assert (job["n_gpus"], job["gpus_per_node"]) == (n_gpus, gpus_per_node)


def test_without_build_number_it_is_zero_and_the_environments_architecture_wins(tmp_path: Path):
    manifest = write_manifest(
        tmp_path / "m.json", {}, context={"docker_env_vars": {"MAD_SYSTEM_GPU_ARCHITECTURE": "gfx90a"}}
    )
    code, err, job = run_plan(tmp_path, manifest, {"MAD_SYSTEM_GPU_ARCHITECTURE": "gfx942"})
    assert code == 0, err
    assert (job["build_number"], job["pipeline"], job["gpu_architecture"], job["training_precision"]) == (
        "0", "", "gfx942", ""
    )  # fmt: skip
    assert (job["log_error_pattern_scan"], job["log_error_patterns"], job["log_error_benign_patterns"]) == (
        True, [], []
    )  # fmt: skip


def test_secret_values_are_masked_in_the_new_job_json_columns(tmp_path: Path):
    secret = "hf_abcdefghijklmnop"
    manifest = write_manifest(tmp_path / "m.json", {"log_error_patterns": [f"token {secret} refused"]})
    code, err, job = run_plan(tmp_path, manifest, {"HF_TOKEN": secret, "pipeline": f"ci-{secret}"})
    assert code == 0, err
    assert (job["pipeline"], job["log_error_patterns"]) == ("ci-***", ["token *** refused"])


def test_a_results_csvs_training_precision_column_still_wins_per_row(tmp_path: Path):
    csv = "model,performance,metric,training_precision\ntoy,1,sps,bf16\ntoy,2,sps,\n"
    jobdir = make_job(tmp_path / "job", 1, csvs={0: csv})
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps(dict(job, training_precision="fp16")))
    collect(jobdir)
    assert [r["training_precision"] for r in read_perf(jobdir)] == ["bf16", "fp16"]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"log_error_patterns": "FATAL"}, "m.log_error_patterns must be a list of strings, got string"),
        ({"log_error_patterns": ["FATAL", 3]}, "m.log_error_patterns[1] must be a string, got number"),
        ({"log_error_patterns": [""]}, "m.log_error_patterns[0] is empty (it would match every line)"),
        ({"log_error_benign_patterns": {"a": "b"}}, "m.log_error_benign_patterns must be a list of strings"),
        ({"log_error_pattern_scan": "maybe"}, "m.log_error_pattern_scan must be true or false"),
        ({"log_error_pattern_scan": [True]}, "m.log_error_pattern_scan must be a string, number or boolean"),
    ],
)
def test_a_malformed_scan_field_is_a_one_line_usage_error_of_the_plan(
    tmp_path: Path, model: dict, message: str
):
    """One line naming the manifest and the field (`... built_models.m.log_error_patterns ...`)."""
    manifest = write_manifest(tmp_path / "m.json", model)
    code, err, _ = run_plan(tmp_path, manifest)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert f"{manifest}" in err and f"built_models.{message}" in err, err


@pytest.mark.parametrize(("value", "scan"), [(False, False), (0, False), ("off", False), ("", False),
                                             ("Yes", True), (1, True), (None, True)])  # fmt: skip
def test_the_scan_switch_reads_what_madengine_reads_as_a_switch(tmp_path: Path, value: Any, scan: bool):
    manifest = write_manifest(tmp_path / "m.json", {"log_error_pattern_scan": value})
    code, err, job = run_plan(tmp_path, manifest)
    assert code == 0, err
    assert job["log_error_pattern_scan"] is scan


def test_the_environment_wins_over_the_manifests_scan_fields_and_is_checked_the_same(tmp_path: Path):
    model = {"log_error_pattern_scan": True, "log_error_patterns": ["A"]}
    manifest = write_manifest(tmp_path / "m.json", model)
    code, err, job = run_plan(tmp_path, manifest, {"SM_LOG_ERROR_PATTERN_SCAN": "off"})
    assert code == 0, err
    assert (job["log_error_pattern_scan"], job["log_error_patterns"]) == (False, ["A"])
    code, err, _ = run_plan(tmp_path, manifest, {"SM_LOG_ERROR_PATTERNS": '{"A": 1}'})
    error = err.strip().splitlines()[-1]  # after the plan's notes on the manifest, the one error line
    assert code == 2 and error.startswith("slurm-multi: manifest: SM_LOG_ERROR_PATTERNS (log_error_patterns)")
    assert "log_error_patterns must be a list of strings, got object" in error


# ----------------------------------------------------------------------------- the timeout


@pytest.mark.parametrize(
    ("model_timeout", "ours", "expected"),
    [(None, None, "7200"), (0, None, "7200"), (-5, None, "7200"), (100, None, "100"), (100, "5", "5")],
)
def test_the_timeout_is_ours_else_the_models_above_zero_else_madengines_7200(
    tmp_path: Path, model_timeout: int | None, ours: str | None, expected: str
):
    model = {} if model_timeout is None else {"timeout": model_timeout}
    env = {"SM_MANIFEST": str(write_manifest(tmp_path / "m.json", model))}
    env.update({"SM_TIMEOUT": ours} if ours else {})
    assert resolve(env).values["SM_TIMEOUT"] == expected
    assert resolve({"SM_IMAGE": "x"}).values["SM_TIMEOUT"] == "7200"
