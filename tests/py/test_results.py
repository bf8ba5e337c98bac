"""results collect: judge a job directory, write perf.csv + summary.json (the CLI too), read job.json.

Every test reads real files: fixtures under tests/py/data/results, or job directories built in tmp_path.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi.cli import group
from slurm_multi.results import PERF_COLUMNS, collect, shared

DATA = Path(__file__).parent / "data" / "results"
LOGS = DATA / "logs"
PRIMUS_JOB = DATA / "jobs" / "primus_2node"
PRIMUS_EXTRAS = ["mode", "precision", "batch_size", "global_batch_size", "seq_len", "device", "num_gpus"]


# ----------------------------------------------------------------------------- helpers


def ok_status(rank: int, node: str, run_seconds: float = 3.2) -> dict[str, Any]:
    return {
        "rank": rank,
        "node": node,
        "exit_code": 0,
        "status": "ok",
        "reason": "",
        "stages": {
            "prepare": {"seconds": 0.12, "status": "ok"},
            "image": {"seconds": 1.5, "status": "ok"},
            "barrier": {"seconds": 0.4, "status": "ok"},
            "run": {"seconds": run_seconds, "status": "ok", "exit_code": 0},
            "save-outputs": {"seconds": 0.05, "status": "ok"},
        },
    }


def make_job(
    root: Path,
    nnodes: int,
    csvs: dict[int, str] | None = None,
    logs: dict[int, str] | None = None,
    statuses: dict[int, Any] | None = None,
    skip: tuple[int, ...] = (),
    job: dict[str, Any] | None = None,
) -> Path:
    """A job directory as the node script leaves it; `skip` ranks never staged anything."""
    root.mkdir(parents=True, exist_ok=True)
    meta = {
        "job_id": "123",
        "model_key": "toy-2node",
        "model": "toy_model",
        "nnodes": nnodes,
        "results_csv": "perf_toy.csv",
        "image": "toy/model:local",
        "image_id": "sha256:abc",
        "args": "--steps 20",
        "tags": "toy,demo",
        "nodes": [f"node{r + 1}" for r in range(nnodes)],
    }
    if job is not None:
        meta = job
    if meta:
        (root / "job.json").write_text(json.dumps(meta))
    for rank in range(nnodes):
        if rank in skip:
            continue
        node_dir = root / f"node_{rank}"
        node_dir.mkdir()
        status = (statuses or {}).get(rank, ok_status(rank, f"node{rank + 1}"))
        text = status if isinstance(status, str) else json.dumps(status)
        (node_dir / "status.json").write_text(text)
        (node_dir / "node.log").write_text((logs or {}).get(rank, "step 20/20 done\n"))
        if csvs and rank in csvs:
            (node_dir / "perf_toy.csv").write_text(csvs[rank])
    return root


def copy_primus(tmp_path: Path) -> Path:
    return Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))


def read_perf(jobdir: Path) -> list[dict[str, str]]:
    with open(jobdir / "perf.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def read_summary(jobdir: Path) -> dict[str, Any]:
    return json.loads((jobdir / "summary.json").read_text())


def run_cli(*args: str):
    return CliRunner().invoke(group, ["results", *args])


EMPTY_CSV = "model,performance,metric\ntoy,,samples_per_second\ntoy,,ms_per_step\n"
FULL_CSV = "model,performance,metric\ntoy,100.5,samples_per_second\ntoy,9.8,ms_per_step\n"


# ----------------------------------------------------------------------------- log metrics


def test_collect_falls_back_to_log_lines_when_no_node_has_a_csv(tmp_path: Path):
    logs = {0: (LOGS / "perf_lines_node0.log").read_text(), 1: (LOGS / "perf_lines_node1.log").read_text()}
    jobdir = make_job(tmp_path / "job", 2, logs=logs)
    summary = collect(jobdir)
    assert (summary.verdict, summary.source, summary.chosen_csv) == ("SUCCESS", "log", None)
    metrics = read_summary(jobdir)["log_metrics"]
    assert metrics["samples_per_second"] == {
        "rule": "sum (throughput)",
        "value": 14164.2,
        "values": [
            {"rank": 0, "node": "node1", "value": 7082.1},  # node 0 printed it twice: the last one counts
            {"rank": 1, "node": "node2", "value": 7082.1},
        ],
    }
    assert {m: (v["rule"], v["value"]) for m, v in metrics.items()} == {
        "samples_per_second": ("sum (throughput)", 14164.2),
        "ttft_ms": ("mean (latency)", 13.0),
        "peak_memory_GB": ("max (memory)", 41.25),
        "accuracy": ("mean (unknown metric kind)", 0.92),
        "tok_per_s_per_gpu": ("mean (per-device throughput)", 510.0),
    }
    rows = read_perf(jobdir)
    assert [(r["model"], r["performance"], r["metric"], r["status"]) for r in rows] == [
        ("toy_model", "14164.2", "samples_per_second", "SUCCESS"),
        ("toy_model", "13", "ttft_ms", "SUCCESS"),
        ("toy_model", "41.25", "peak_memory_GB", "SUCCESS"),
        ("toy_model", "0.92", "accuracy", "SUCCESS"),
        ("toy_model", "510", "tok_per_s_per_gpu", "SUCCESS"),
    ]


# ----------------------------------------------------------------------------- collect


def test_primus_job_is_success_from_the_last_ranks_csv(tmp_path: Path):
    jobdir = copy_primus(tmp_path)
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS", summary.reasons
    with open(jobdir / "perf.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert header == list(PERF_COLUMNS) + PRIMUS_EXTRAS
    rows = read_perf(jobdir)
    assert [(r["model"], r["performance"], r["metric"], r["status"]) for r in rows] == [
        ("primus_llama3_8b_Llama-3.1-8B", "10132.5", "tok_per_s_per_gpu", "SUCCESS"),
        ("primus_llama3_8b_Llama-3.1-8B", "522.3", "TFLOPS_per_gpu", "SUCCESS"),
    ]
    row = rows[0]
    assert row["machine_name"] == "4711" and row["deployment_type"] == "slurm"
    assert row["nnodes"] == "2" and row["n_gpus"] == "16" and row["gpus_per_node"] == "8"
    assert row["docker_sha"].startswith("sha256:5f1c0ffee") and row["docker_image"] == "rocm/primus:v25.9"
    assert row["docker_file"] == "docker/primus.ubuntu.amd.Dockerfile" and row["launcher"] == "torchrun"
    assert row["test_duration"] == "613.95"
    assert row["additional_docker_run_options"] == "--shm-size 64G -e HF_TOKEN=***"
    assert (row["mode"], row["precision"], row["num_gpus"]) == ("pretrain", "BF16", "16")
    summary_json = read_summary(jobdir)
    assert summary_json["chosen_csv"] == "node_1/perf_primus.csv"
    assert summary_json["candidates"] == [
        {"path": "node_0/perf_primus.csv", "rows": 2, "non_empty": 0, "error": None},
        {"path": "node_1/perf_primus.csv", "rows": 2, "non_empty": 2, "error": None},
    ]
    assert list(summary_json) == [
        "verdict", "job_id", "model", "nnodes", "results_csv", "chosen_csv", "candidates", "source",
        "log_metrics", "nodes", "reasons", "hang", "stragglers", "world", "profile", "bad_nodes", "attempts",
        "time", "warnings", "perf_rows",
    ]  # fmt: skip
    assert summary_json["nodes"][1]["stages"] == {
        "prepare": 0.19, "image": 12.9, "barrier": 31.6, "run": 613.95, "save-outputs": 0.07
    }  # fmt: skip
    assert summary_json["perf_rows"] == 2 and summary_json["source"] == "csv"


def test_collect_twice_and_on_a_copied_job_dir_gives_byte_identical_outputs(tmp_path: Path):
    jobdir = copy_primus(tmp_path)
    collect(jobdir)
    first = ((jobdir / "perf.csv").read_bytes(), (jobdir / "summary.json").read_bytes())
    collect(jobdir)
    assert ((jobdir / "perf.csv").read_bytes(), (jobdir / "summary.json").read_bytes()) == first
    copied = Path(shutil.copytree(jobdir, tmp_path / "elsewhere" / "4711"))
    collect(copied)
    assert ((copied / "perf.csv").read_bytes(), (copied / "summary.json").read_bytes()) == first
    assert sorted(p.name for p in jobdir.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_all_empty_csvs_give_one_failure_row_and_exit_1(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, csvs={0: EMPTY_CSV, 1: EMPTY_CSV})
    result = run_cli("collect", str(jobdir))
    assert result.exit_code == 1
    assert "FAILURE" in result.stderr and result.stdout == ""
    rows = read_perf(jobdir)
    assert len(rows) == 1
    assert (rows[0]["model"], rows[0]["performance"], rows[0]["status"]) == ("toy_model", "", "FAILURE")
    summary = read_summary(jobdir)
    assert summary["verdict"] == "FAILURE" and summary["chosen_csv"] is None
    assert summary["reasons"] == [
        "no candidate CSV has a performance value (2 candidates: "
        "node_0/perf_toy.csv: 0 of 2 rows with performance; "
        "node_1/perf_toy.csv: 0 of 2 rows with performance)"
    ]


def test_a_node_with_no_error_and_an_empty_csv_is_not_a_failure(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 3, csvs={0: EMPTY_CSV, 1: EMPTY_CSV, 2: FULL_CSV})
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS" and summary.reasons == []
    assert summary.chosen_csv == "node_2/perf_toy.csv"


def test_one_failed_worker_makes_the_job_fail_but_the_chosen_csv_is_still_written(tmp_path: Path):
    failed = ok_status(1, "node2")
    failed.update(exit_code=3, status="failed")
    failed["stages"]["run"].update(status="failed", exit_code=3)
    jobdir = make_job(tmp_path / "job", 2, csvs={0: EMPTY_CSV, 1: FULL_CSV}, statuses={1: failed})
    result = run_cli("collect", str(jobdir))
    assert result.exit_code == 1
    summary = read_summary(jobdir)
    assert summary["verdict"] == "FAILURE"
    assert summary["reasons"] == ["node2 (rank 1): container exited 3"]
    assert summary["chosen_csv"] == "node_1/perf_toy.csv" and len(summary["candidates"]) == 2
    assert [(n["node"], n["status"], n["exit_code"]) for n in summary["nodes"]] == [
        ("node1", "ok", 0),
        ("node2", "failed", 3),
    ]
    assert [(r["performance"], r["status"]) for r in read_perf(jobdir)] == [
        ("100.5", "FAILURE"),
        ("9.8", "FAILURE"),
    ]
    assert "node2 (rank 1): container exited 3" in result.stderr


def test_a_timed_out_node_names_its_stage_and_reason(tmp_path: Path):
    timed_out = ok_status(0, "node1")
    timed_out.update(exit_code=124, status="timeout", reason="barrier: rank 0 did not answer after 120 s")
    timed_out["stages"]["barrier"]["status"] = "timeout"
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV}, statuses={0: timed_out})
    assert collect(jobdir).reasons == [
        "node1 (rank 0): timed out in stage barrier: barrier: rank 0 did not answer after 120 s"
    ]


def test_a_node_that_never_staged_is_named_as_missing(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 3, csvs={0: FULL_CSV, 1: EMPTY_CSV}, skip=(2,))
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert summary.reasons == ["node3 (rank 2): no status.json (task never staged)"]
    assert [(n.rank, n.status) for n in summary.nodes] == [(0, "ok"), (1, "ok"), (2, "missing")]


def test_a_real_traceback_in_a_node_log_fails_the_job_naming_line_and_pattern(tmp_path: Path):
    logs = {1: (LOGS / "real_traceback_rank_prefixed.log").read_text()}
    jobdir = make_job(tmp_path / "job", 2, csvs={0: FULL_CSV}, logs=logs)
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert summary.reasons == [
        "node2 (rank 1): error pattern 'RuntimeError' at node.log:10 "
        "(RuntimeError: CUDA error: an illegal memory access was encountered; +1 more)"
    ]
    assert [e["line"] for e in read_summary(jobdir)["nodes"][1]["log_errors"]] == [10, 17]


def test_torchrun_cleanup_traceback_in_a_node_log_does_not_fail_the_job(tmp_path: Path):
    logs = {r: (LOGS / "torchrun_sigterm_cleanup.log").read_text() for r in (0, 1)}
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV}, logs=logs)
    assert collect(jobdir).verdict == "SUCCESS"


def test_a_malformed_status_json_counts_the_node_as_failed(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV}, statuses={0: '{"rank": 0, "exit'})
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert summary.nodes[0].status == "unreadable"
    assert summary.reasons[0].startswith("node1 (rank 0): status.json unreadable: ")


def test_no_csv_and_no_perf_lines_is_a_failure_row(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2)
    summary = collect(jobdir)
    assert (summary.verdict, summary.source) == ("FAILURE", "none")
    assert summary.reasons == [
        "no result CSV (perf_toy.csv) in any node and no 'performance: <value> <metric>' line in any node.log"
    ]
    assert [r["status"] for r in read_perf(jobdir)] == ["FAILURE"]


def test_an_empty_job_directory_is_a_failure_not_a_crash(tmp_path: Path):
    jobdir = tmp_path / "slurm-multi-99"
    jobdir.mkdir()
    summary = collect(jobdir)
    assert (summary.verdict, summary.job_id, summary.nnodes) == ("FAILURE", "99", 0)
    assert "no node_<rank> directories" in summary.reasons[0]


def test_without_job_json_the_manifest_and_model_fill_the_metadata(tmp_path: Path):
    jobdir = make_job(tmp_path / "job-555", 2, csvs={1: FULL_CSV}, job={})
    manifest = tmp_path / "build_manifest.json"
    manifest.write_text(
        json.dumps(
            {
                "built_images": {
                    "toy-2node": {
                        "docker_image": "toy/model:local",
                        "base_docker": "scratch",
                        "build_duration": 4.5,
                    }
                },
                "built_models": {
                    "toy-2node": {
                        "name": "toy_model",
                        "args": "--steps 20",
                        "tags": ["toy", "demo"],
                        "dockerfile": "examples/toy/Dockerfile",
                        "n_gpus": "-1",
                        "multiple_results": "perf_toy.csv",
                    }
                },
            }
        )
    )
    summary = collect(jobdir, manifest=manifest, model="toy-2node")
    assert (summary.verdict, summary.job_id, summary.model, summary.nnodes) == (
        "SUCCESS",
        "555",
        "toy_model",
        2,
    )
    assert "job.json missing" in summary.warnings[0]
    row = read_perf(jobdir)[0]
    assert (row["model"], row["tags"], row["docker_image"], row["base_docker"]) == (
        "toy_model_toy", "toy,demo", "toy/model:local", "scratch"
    )  # fmt: skip
    # The model's n_gpus -1 ("all GPUs") is not a count: 2 nodes x madengine's 1 GPU per node.
    assert (row["build_duration"], row["docker_file"], row["n_gpus"], row["gpus_per_node"]) == (
        "4.5",
        "examples/toy/Dockerfile",
        "2",
        "1",
    )


def test_job_json_wins_over_the_manifest(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV})
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"built_models": {"toy-2node": {"name": "other", "args": "--x"}}}))
    collect(jobdir, manifest=manifest)
    row = read_perf(jobdir)[0]
    assert (row["model"], row["args"]) == ("toy_model_toy", "--steps 20")


# ----------------------------------------------------------------------------- results collect (CLI)


def test_collect_cli_success_exits_0_and_prints_the_table_on_stderr(tmp_path: Path):
    jobdir = copy_primus(tmp_path)
    result = run_cli("collect", str(jobdir))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert "results: job 4711 (primus_llama3_8b, 2 nodes): SUCCESS" in result.stderr
    assert "chosen CSV: node_1/perf_primus.csv: 2 of 2 rows with performance" in result.stderr
    assert "rank  node     status  exit  prepare  image  barrier  run     save-outputs" in result.stderr


def test_collect_cli_json_prints_the_summary_on_stdout(tmp_path: Path):
    jobdir = copy_primus(tmp_path)
    result = run_cli("collect", "--json", str(jobdir))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == read_summary(jobdir)


def test_collect_cli_extra_error_pattern_fails_the_job(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV}, logs={0: "ok\nWARN: checksum mismatch\n"})
    result = run_cli("collect", str(jobdir), "--error-pattern", "checksum mismatch")
    assert result.exit_code == 1
    assert "node1 (rank 0): error pattern 'checksum mismatch' at node.log:2" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("collect", "/nonexistent/job/dir"),
        ("collect", "{jobdir}", "--error-pattern", "(unclosed"),
        ("collect", "{jobdir}", "--manifest", "/nonexistent/manifest.json"),
        ("collect", "{jobdir}", "--manifest", "{jobdir}/node_0/node.log"),
        ("collect", "{jobdir}", "--perf-csv", "{jobdir}"),
        ("collect", "{jobdir}", "--perf-csv", "/nonexistent/dir/perf.csv"),
        ("collect", "{jobdir}", "--perf-csv", "{jobdir}/perf_entry.csv"),
        ("collect", "{jobdir}", "--perf-csv", "bad\x00name.csv"),
    ],
)
def test_collect_cli_usage_errors_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...]):
    jobdir = make_job(tmp_path / "job", 1, csvs={0: FULL_CSV})
    result = run_cli(*[a.format(jobdir=jobdir) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.stderr.splitlines()) == 1
    assert not (jobdir / "perf.csv").exists()


# ----------------------------------------------------------------------------- values and rows not counted


@pytest.mark.parametrize("value", ["error", "-", "inf", "-inf", "1.2.3", "12 samples/s", "nan", "N/A", ""])
def test_a_job_whose_only_values_are_not_finite_numbers_is_a_failure(tmp_path: Path, value: str):
    """Regression: `error`, `-` and `inf` used to count as results and made the job SUCCESS."""
    only = f"model,performance,metric\ntoy,{value},samples_per_second\n"
    jobdir = make_job(tmp_path / "job", 2, csvs={0: EMPTY_CSV, 1: only})
    summary = collect(jobdir)
    assert (summary.verdict, summary.chosen_csv) == ("FAILURE", None)
    assert summary.reasons[0].startswith("no candidate CSV has a performance value")
    assert [(r["performance"], r["status"]) for r in read_perf(jobdir)] == [("", "FAILURE")]


def test_a_row_that_is_not_a_number_is_written_empty_as_a_failure_row_and_warned_about(tmp_path: Path):
    mixed = "model,performance,metric\ntoy,100.5,samples_per_second\ntoy,error,ms_per_step\n"
    jobdir = make_job(tmp_path / "job", 1, csvs={0: mixed})
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS"
    assert [(r["performance"], r["status"]) for r in read_perf(jobdir)] == [
        ("100.5", "SUCCESS"),
        ("", "FAILURE"),
    ]
    assert read_summary(jobdir)["warnings"] == [
        "node_0/perf_toy.csv line 3: performance 'error' is not a finite number; counted as empty"
    ]


def test_a_truncated_last_row_is_dropped_with_a_warning_and_the_job_still_succeeds(tmp_path: Path):
    """Regression: one truncated last row threw the whole CSV away and made the job FAILURE."""
    jobdir = make_job(tmp_path / "job", 2, csvs={0: EMPTY_CSV, 1: FULL_CSV + "toy,12"})
    result = run_cli("collect", str(jobdir))
    assert result.exit_code == 0, result.output
    warning = "node_1/perf_toy.csv line 4: 2 fields, the header has 3 (truncated or ragged); row dropped"
    summary = read_summary(jobdir)
    assert (summary["verdict"], summary["warnings"]) == ("SUCCESS", [warning])
    assert summary["candidates"][1] == {
        "path": "node_1/perf_toy.csv",
        "rows": 2,
        "non_empty": 2,
        "error": None,
    }
    assert [r["performance"] for r in read_perf(jobdir)] == ["100.5", "9.8"]
    assert f" results: warning: {warning}\n" in result.stderr


def test_rows_dropped_from_a_csv_that_is_not_chosen_are_still_warned_about(tmp_path: Path):
    broken = 'model,performance,metric\ntoy,,samples_per_second\ntoy,"unterminated'
    jobdir = make_job(tmp_path / "job", 2, csvs={0: broken, 1: FULL_CSV})
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS" and summary.chosen_csv == "node_1/perf_toy.csv"
    assert summary.warnings == [
        "node_0/perf_toy.csv line 3: malformed CSV (unexpected end of data; truncated file?); row dropped"
    ]


def test_warnings_beyond_twenty_are_counted_on_stderr_and_all_kept_in_summary_json(tmp_path: Path):
    ragged = "model,performance,metric\n" + "toy,1\n" * 6
    jobdir = make_job(tmp_path / "job", 5, csvs={r: ragged for r in range(4)} | {4: FULL_CSV})
    result = run_cli("collect", str(jobdir))
    assert result.exit_code == 0, result.output
    assert len(read_summary(jobdir)["warnings"]) == 24  # 4 files x (5 rows + 1 count)
    talked = [line for line in result.stderr.splitlines() if " results: warning: " in line]
    assert len(talked) == 21 and talked[-1].endswith("warning: +4 more (see summary.json)")


# ----------------------------------------------------------------------------- job.json


def job_json_as_the_batch_step_writes_it(nnodes: int) -> dict[str, Any]:
    """Every top-level key lib/job.sh writes, plus the two objects it is going to add."""
    return {
        "job_id": "321",
        "model_key": "toy-2node",
        "model": "toy_model",
        "nnodes": nnodes,
        "nodes": [f"node{r + 1}" for r in range(nnodes)],
        "results_csv": "perf_toy.csv",
        "image": "toy/model:local",
        "args": "--steps 20",
        "tags": "toy,demo",
        "dockerfile": "examples/toy/Dockerfile",
        "base_docker": "scratch",
        "n_gpus": "-1",
        "gpus_per_node": "8",
        "launcher": "torchrun",
        "build_duration": "4.5",
        "additional_docker_run_options": "--shm-size 1G -e HF_TOKEN=hf_abc",
        "manifest": "/nonexistent/build_manifest.json",
        "profile": "none",
        "runtime": "docker",
        "started": "2026-11-30T10:00:00Z",
        "settings": {"SM_COLLECT": "true", "SM_OUT": "slurm_output"},
        "manifest_values": {"SM_MODEL_NAME": "other_model", "SM_RESULTS_CSV": "other.csv", "model": "x"},
    }


def test_collect_needs_no_manifest_job_json_has_every_fact(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV}, job=job_json_as_the_batch_step_writes_it(2))
    summary = collect(jobdir)
    assert (summary.verdict, summary.job_id, summary.model, summary.warnings) == (
        "SUCCESS", "321", "toy_model", []
    )  # fmt: skip
    row = read_perf(jobdir)[0]
    assert {
        c: row[c] for c in ("docker_file", "base_docker", "gpus_per_node", "launcher", "build_duration")
    } == {
        "docker_file": "examples/toy/Dockerfile",
        "base_docker": "scratch",
        "gpus_per_node": "8",
        "launcher": "torchrun",
        "build_duration": "4.5",
    }
    assert row["additional_docker_run_options"] == "--shm-size 1G -e HF_TOKEN=***"


def test_settings_manifest_values_and_unknown_job_json_keys_change_nothing(tmp_path: Path):
    full = job_json_as_the_batch_step_writes_it(2)
    plain = {k: v for k, v in full.items() if k not in ("settings", "manifest_values")}
    later = dict(full, future_key={"nested": [1, 2]}, relative_change="99", status="SUCCESS")
    outputs = []
    for name, job in (("plain", plain), ("full", full), ("later", later)):
        jobdir = make_job(tmp_path / name / "321", 2, csvs={1: FULL_CSV}, job=job)
        collect(jobdir)
        outputs.append(((jobdir / "perf.csv").read_bytes(), (jobdir / "summary.json").read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]


# ----------------------------------------------------------------------------- odd job directories


def test_ties_between_nodes_go_to_the_higher_rank_in_numeric_order(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 11, csvs={9: FULL_CSV, 10: FULL_CSV})
    summary = collect(jobdir)
    assert summary.chosen_csv == "node_10/perf_toy.csv"
    assert [c.path for c in summary.candidates] == ["node_9/perf_toy.csv", "node_10/perf_toy.csv"]


def test_a_failed_image_stage_is_named_in_the_reason(tmp_path: Path):
    failed = ok_status(1, "node2")
    failed.update(exit_code=1, status="failed", reason="docker load: no space left on device")
    failed["stages"]["image"]["status"] = "failed"
    jobdir = make_job(tmp_path / "job", 2, csvs={0: FULL_CSV}, statuses={1: failed})
    assert collect(jobdir).reasons == [
        "node2 (rank 1): stage image failed (exit 1): docker load: no space left on device"
    ]


def test_unreadable_node_entries_never_crash_collect(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 3, csvs={0: FULL_CSV})
    (jobdir / "node_1" / "status.json").unlink()
    (jobdir / "node_1" / "status.json").mkdir()
    shutil.rmtree(jobdir / "node_2")
    (jobdir / "node_2").write_text("not a directory")
    (jobdir / "node_0" / "node.log").write_bytes(b"\xff\xfe garbage \x00 RuntimeError: boom\n")
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert summary.reasons == [
        "node1 (rank 0): error pattern 'RuntimeError' at node.log:1 "
        "(\ufffd\ufffd garbage \\x00 RuntimeError: boom)",
        "node2 (rank 1): status.json unreadable: Is a directory",
        "node3 (rank 2): no status.json (task never staged)",
    ]


@pytest.mark.parametrize(
    "seconds",
    [10**400, -(10**400), "1e999", "nan", True, [1]],
    ids=["huge", "-huge", "1e999", "nan", "bool", "list"],
)
def test_a_stage_time_that_is_no_finite_number_is_left_out_not_a_crash(tmp_path: Path, seconds: Any):
    status = ok_status(0, "node1")
    status["stages"]["run"]["seconds"] = seconds
    jobdir = make_job(tmp_path / "job", 2, csvs={0: FULL_CSV}, statuses={0: status})
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS"
    assert "run" not in summary.nodes[0].stages
    assert summary.nodes[0].stages["image"] == 1.5
    assert summary.nodes[1].stages["run"] == 3.2


def test_a_node_beyond_nnodes_is_judged_and_warned_about(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 3, csvs={2: FULL_CSV})
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps(dict(job, nnodes=2)))
    summary = collect(jobdir)
    assert [n.rank for n in summary.nodes] == [0, 1, 2]
    assert summary.warnings == ["node_2 beyond 2 ranks: judged like the others"]


def test_secret_values_from_the_environment_are_masked_in_log_excerpts(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue")
    logs = {0: "RuntimeError: 401 for token hf_supersecretvalue\n"}
    jobdir = make_job(tmp_path / "job", 1, csvs={0: FULL_CSV}, logs=logs)
    summary = collect(jobdir)
    assert "hf_supersecretvalue" not in (jobdir / "summary.json").read_text()
    assert summary.nodes[0].log_errors[0].text == "RuntimeError: 401 for token ***"


@pytest.mark.parametrize("content", ["", "[1, 2]", '{"job_id": ', "[" * 100000])
def test_a_broken_job_json_is_a_warning_and_the_rest_is_derived(tmp_path: Path, content: str):
    jobdir = make_job(tmp_path / "job-77", 2, csvs={1: FULL_CSV})
    (jobdir / "job.json").write_text(content)
    summary = collect(jobdir)
    assert (summary.verdict, summary.job_id, summary.nnodes) == ("FAILURE", "77", 2)
    assert summary.warnings and "job.json" in summary.warnings[0]
    assert summary.reasons == [
        "no result CSV name known and no 'performance: <value> <metric>' line in any node.log"
    ]


def test_a_broken_manifest_is_a_usage_error(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 1, csvs={0: FULL_CSV})
    manifest = tmp_path / "m.json"
    manifest.write_text("[" * 100000)
    result = run_cli("collect", str(jobdir), "--manifest", str(manifest))
    assert result.exit_code == 2
    assert result.stderr.startswith("slurm-multi: results: cannot read manifest ")
    assert len(result.stderr.splitlines()) == 1


def test_an_absurd_nnodes_is_ignored_and_derived_from_the_node_dirs(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV})
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps(dict(job, nnodes="9" * 5000, nodes="x")))
    summary = collect(jobdir)
    assert (summary.verdict, summary.nnodes) == ("SUCCESS", 2)


@pytest.mark.parametrize("per_node", [6, 11, 12.0, -3])  # small: safe even where the cap is missing
def test_tasks_per_node_beyond_the_rank_cap_is_taken_as_1_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_node: float
):
    """job.json's tasks_per_node 1e9 once made a node name per rank (11 GB): ranks are capped as
    nnodes is (MAX_NODES, made 10 here so that the uncapped count stays small in this test)."""
    import importlib

    collect_module = importlib.import_module("slurm_multi.results.collect")  # not the function
    monkeypatch.setattr(collect_module, "MAX_NODES", 10)
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV})
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps(dict(job, tasks_per_node=per_node)))
    summary = collect(jobdir)
    assert (summary.verdict, [n.node for n in summary.nodes]) == ("SUCCESS", ["node1", "node2"])
    assert [w for w in summary.warnings if "tasks_per_node" in w] == [
        f"job.json tasks_per_node {per_node} is not a count of tasks per node (at most 10 ranks in all); "
        "taken as 1"
    ]
    assert collect_module.tasks_per_node(5, 2) == 5 and collect_module.tasks_per_node("x", 2) == 1
    assert collect_module.tasks_per_node(10**9, 2) == 1 and collect_module.tasks_per_node(1e300, 2) == 1


# ----------------------------------------------------------------------------- summary.json, JSON reading

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6), inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_the_reused_item_encoder_writes_what_json_dumps_writes(value: Any):
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    assert shared.encode_item(value) == expected


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), JSON_VALUES, min_size=1, max_size=6))
def test_summary_json_and_timeline_json_are_laid_out_one_key_and_one_list_item_per_line(document):
    text = shared.document_text(document)
    assert json.loads(text) == json.loads(json.dumps(document))  # tuples read back as lists
    lines = text.split("\n")[:-1]  # \n only: a string may hold U+0085 or U+2028 as they are
    assert (lines[0], lines[-1], text[-1]) == ("{", "}", "\n")
    at = 1
    for key, value in document.items():
        head = lines[at]
        assert head.startswith("  " + json.dumps(key, ensure_ascii=False) + ": ")
        if isinstance(value, (list, tuple)) and value:
            assert head.endswith("[")
            items = lines[at + 1 : at + 1 + len(value)]
            read = [json.loads(line.strip().rstrip(",")) for line in items]
            assert read == json.loads(json.dumps(list(value)))
            assert lines[at + 1 + len(value)].startswith("  ]")
            at += len(value) + 2
        else:
            at += 1
    assert at == len(lines) - 1


def test_the_item_encoder_refuses_what_json_refuses():
    with pytest.raises(TypeError):
        shared.encode_item({"a": object()})


@pytest.mark.parametrize(
    "data",
    [b'{"a": 1,\r\n "b": [1,\r 2]}', b'{\r\n"a": "x\ty"}', b'{"a": "x\r\ny"}', b"\xef\xbb\xbf{}",
     b'{"a": "\xff"}', b"[1, 2]", b"", b"{\"a\": 1} x"],
)  # fmt: skip
def test_json_files_read_as_they_read_in_text_mode(tmp_path: Path, data: bytes):
    path = tmp_path / "status.json"
    path.write_bytes(data)

    def outcome(read) -> Any:
        try:
            return read()
        except ValueError as exc:
            return type(exc).__name__, str(exc)

    def text_mode() -> Any:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)

    assert outcome(lambda: shared.read_json(path)) == outcome(text_mode)


@pytest.mark.parametrize("status", ["terminated", "aborted", "lost"])
def test_a_node_stopped_or_aborted_with_exit_code_0_is_still_a_failure(tmp_path: Path, status: str):
    # A status that is not ok fails the node whatever its exit code (the check is an `or`).
    stopped = ok_status(0, "node1")
    stopped.update(status=status, reason=f"{status} by the teardown")
    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV}, statuses={0: stopped})
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert len(summary.reasons) == 1 and summary.reasons[0].startswith("node1 (rank 0): ")


# ----------------------------------------------------------------------------- reading what the nodes left


def test_fifos_under_the_names_collect_reads_neither_hang_it_nor_stop_the_verdict(tmp_path: Path):
    """collect opens each file without a stat first: a FIFO (no writer) must read as empty, not block."""
    import os
    import subprocess
    import sys

    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV})
    for leaf in ("node.log", "events.log", "progress.json", "hang.json", "perf_toy.csv"):
        target = jobdir / "node_0" / leaf
        target.unlink(missing_ok=True)
        os.mkfifo(target)
    code = "import sys; from slurm_multi.results import collect; print(collect(sys.argv[1]).verdict)"
    done = subprocess.run(
        [sys.executable, "-c", code, str(jobdir)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SUCCESS"  # rank 0's files: empty, as a node that wrote nothing
    summary = read_summary(jobdir)
    assert summary["chosen_csv"] == "node_1/perf_toy.csv"
    assert summary["candidates"][0] == {"path": "node_0/perf_toy.csv", "rows": 0, "non_empty": 0,
                                        "error": "empty file"}  # fmt: skip


def test_collect_pauses_the_cyclic_collector_and_gives_it_back_as_it_was(tmp_path: Path):
    import gc

    from slurm_multi.common import HelperError

    jobdir = make_job(tmp_path / "job", 2, csvs={1: FULL_CSV})
    assert gc.isenabled()
    collect(jobdir)
    assert gc.isenabled()
    with pytest.raises(HelperError):
        collect(tmp_path / "nowhere")
    assert gc.isenabled()
    gc.disable()
    try:
        collect(jobdir)
        assert not gc.isenabled()
    finally:
        gc.enable()
