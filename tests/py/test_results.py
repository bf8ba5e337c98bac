"""results: pick the best per-node CSV, judge a job directory, write perf.csv + summary.json.

Every test reads real files: fixtures under tests/py/data/results, or job directories built in tmp_path.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi import results
from slurm_multi.cli import group
from slurm_multi.results import (
    PERF_COLUMNS,
    collect,
    combine_metric,
    parse_perf_lines,
    pick_best,
    scan_log_errors,
    score_csv,
)

DATA = Path(__file__).parent / "data" / "results"
CSVS = DATA / "csv"
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
            "stage": {"seconds": 0.05, "status": "ok"},
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


# ----------------------------------------------------------------------------- score_csv


def test_a_header_with_spaces_after_commas_still_finds_performance():
    candidate = score_csv(CSVS / "leading_space_header.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error) == (2, 1, None)
    assert candidate.header == ("model", "performance", "metric", "batch_size")


def test_a_utf8_bom_before_the_header_is_tolerated():
    candidate = score_csv(CSVS / "bom_header.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error) == (1, 1, None)
    assert candidate.header[0] == "model"


def test_na_nan_none_null_and_blank_count_as_empty():
    candidate = score_csv(CSVS / "na_values.csv")
    assert (candidate.rows, candidate.non_empty) == (9, 1)


@pytest.mark.parametrize(
    ("name", "error_part"),
    [
        ("no_performance_column.csv", "no 'performance' column (columns: model, throughput, metric)"),
        ("truncated_quote.csv", "malformed CSV at line 3"),
        ("truncated_row.csv", "row 3 has 2 fields, the header has 3"),
        ("ragged.csv", "row 2 has 5 fields"),
        ("binary.csv", "binary file"),
        ("empty.csv", "empty file"),
        ("does_not_exist.csv", "cannot read: No such file or directory"),
    ],
)
def test_a_broken_file_is_a_candidate_with_its_error_not_a_crash(name: str, error_part: str):
    candidate = score_csv(CSVS / name)
    assert candidate.error is not None and error_part in candidate.error
    assert (candidate.rows, candidate.non_empty, candidate.usable) == (0, 0, False)


def test_a_non_utf8_file_is_reported(tmp_path: Path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"model,performance,metric\nm\xfcnchen,1.0,x\n")
    assert "not UTF-8 text (byte 0xfc" in score_csv(path).error


def test_a_header_only_file_has_no_error_and_no_rows():
    candidate = score_csv(CSVS / "header_only.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error, candidate.usable) == (0, 0, None, False)


# ----------------------------------------------------------------------------- pick_best


def test_primus_present_but_empty_rank0_csv_loses_to_the_last_rank():
    chosen, candidates = pick_best([CSVS / "primus_rank0_empty.csv", CSVS / "primus_last_rank.csv"])
    assert chosen is not None and chosen.path.endswith("primus_last_rank.csv")
    assert [(c.rows, c.non_empty) for c in candidates] == [(2, 0), (2, 2)]


def test_of_64_nodes_only_the_last_rank_has_numbers(tmp_path: Path):
    paths = []
    for rank in range(64):
        path = tmp_path / f"node_{rank}" / "perf.csv"
        path.parent.mkdir()
        path.write_text(FULL_CSV if rank == 63 else EMPTY_CSV)
        paths.append(path)
    chosen, candidates = pick_best(paths)
    assert chosen is not None and chosen.path == str(paths[63])
    assert len(candidates) == 64 and sum(c.non_empty for c in candidates) == 2


def test_a_tie_on_values_goes_to_more_rows_then_to_the_later_candidate(tmp_path: Path):
    one_row = tmp_path / "a.csv"
    one_row.write_text("model,performance,metric\nm,1,x\n")
    two_rows = tmp_path / "b.csv"
    two_rows.write_text("model,performance,metric\nm,1,x\nm,,y\n")
    same = tmp_path / "c.csv"
    same.write_text("model,performance,metric\nm,2,x\nm,,y\n")
    assert pick_best([two_rows, one_row])[0].path == str(two_rows)
    assert pick_best([two_rows, same])[0].path == str(same)
    assert pick_best([same, two_rows])[0].path == str(two_rows)


def test_broken_and_empty_candidates_never_win():
    names = ["empty.csv", "binary.csv", "header_only.csv", "truncated_quote.csv", "primus_rank0_empty.csv"]
    chosen, candidates = pick_best([CSVS / n for n in names])
    assert chosen is None and len(candidates) == 5


# ----------------------------------------------------------------------------- results pick (CLI)


def test_pick_prints_the_chosen_path_on_stdout():
    result = run_cli("pick", str(CSVS / "primus_rank0_empty.csv"), str(CSVS / "primus_last_rank.csv"))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{CSVS / 'primus_last_rank.csv'}\n"


def test_pick_json_lists_every_candidate_with_its_score_and_error():
    paths = [str(CSVS / "empty.csv"), str(CSVS / "leading_space_header.csv")]
    result = run_cli("pick", "--json", *paths)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["chosen"] == paths[1]
    assert payload["candidates"] == [
        {"path": paths[0], "rows": 0, "non_empty": 0, "error": "empty file"},
        {"path": paths[1], "rows": 2, "non_empty": 1, "error": None},
    ]


def test_pick_without_any_value_exits_1_with_one_line_naming_the_candidates():
    paths = [str(CSVS / n) for n in ("empty.csv", "header_only.csv", "primus_rank0_empty.csv")]
    result = run_cli("pick", *paths)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "slurm-multi: results: no candidate CSV has a performance value (3 candidates: "
    )
    assert "empty.csv: empty file" in lines[0] and "0 of 2 rows with performance" in lines[0]
    assert "Traceback" not in result.output


def test_pick_json_without_any_value_still_prints_json_with_chosen_null_and_exits_1():
    result = run_cli("pick", "--json", str(CSVS / "binary.csv"))
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["chosen"] is None and "binary file" in payload["candidates"][0]["error"]


def test_pick_with_no_arguments_is_a_usage_error():
    assert run_cli("pick").exit_code == 2


# ----------------------------------------------------------------------------- hypothesis


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_text_as_a_candidate_never_crashes_pick(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.csv"
        path.write_text(text, encoding="utf-8", newline="")
        chosen, (candidate,) = pick_best([path])
        assert candidate.non_empty <= candidate.rows
        assert chosen is None or chosen.non_empty > 0


CELL = st.one_of(
    st.sampled_from(["", " ", "N/A", "n/a", "nan", "NaN", "none", "null", "NULL", " nan "]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)
COLUMN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda name: name != "performance"
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(COLUMN, min_size=0, max_size=4, unique=True),
    st.integers(min_value=0, max_value=4),
    st.sampled_from(["performance", " performance", "performance ", "Performance"]),
    st.lists(st.lists(CELL, min_size=5, max_size=5), max_size=20),
)
def test_the_score_equals_an_independent_count_for_well_formed_csvs(
    others: list[str], position: int, perf_name: str, rows: list[list[str]]
):
    header = list(others)
    position = min(position, len(header))
    header.insert(position, perf_name)
    body = [row[: len(header)] for row in rows]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerows([header, *body])
    documented_empty = {"", "n/a", "na", "nan", "-nan", "none", "null", "<na>", "#n/a"}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gen.csv"
        path.write_text(buffer.getvalue(), encoding="utf-8", newline="")
        candidate = score_csv(path)
    assert candidate.error is None
    assert candidate.rows == len(body)
    assert candidate.non_empty == sum(
        1 for row in body if row[position].strip().lower() not in documented_empty
    )


# ----------------------------------------------------------------------------- scan_log_errors


@pytest.mark.parametrize("name", ["torchrun_sigterm_cleanup.log", "torchrun_sigterm_cleanup_torch1.log"])
def test_the_traceback_torchrun_prints_when_it_sigterms_its_workers_is_not_an_error(name: str):
    text = (LOGS / name).read_text()
    assert "SignalException" in text and "death signal, shutting down workers" in text
    assert scan_log_errors(text) == []
    assert scan_log_errors(text, [*results.DEFAULT_ERROR_PATTERNS, "Exception", "signal"]) == []


def test_a_real_traceback_counts_once_at_its_exception_line_despite_interleaved_ranks():
    hits = scan_log_errors((LOGS / "real_traceback_rank_prefixed.log").read_text())
    assert [(h.line, h.pattern) for h in hits] == [(10, "RuntimeError"), (17, "Traceback")]
    assert hits[0].text == "RuntimeError: CUDA error: an illegal memory access was encountered"
    assert hits[1].text == "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"


def test_a_traceback_with_any_exception_counts_as_traceback():
    hits = scan_log_errors((LOGS / "plain_traceback.log").read_text())
    assert [(h.line, h.pattern, h.text) for h in hits] == [
        (7, "Traceback", "KeyError: 'libero_object_no_noops_id'")
    ]


def test_a_traceback_cut_off_by_the_end_of_the_log_has_no_error_line_so_it_does_not_count():
    text = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n    main()\n'
    assert scan_log_errors(text) == []


@pytest.mark.parametrize(
    ("line", "pattern"),
    [
        ("RuntimeError: NCCL communicator was aborted", "RuntimeError"),
        ("CUDA error: device-side assert triggered", "CUDA error"),
        ("HIP error: invalid device function", "HIP error"),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", "NCCL error"),
        ("Segmentation fault (core dumped)", "Segmentation fault"),
        ("Memory cgroup out of memory: Killed process 4242 (python3)", "out of memory"),
        ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", "out of memory"),
        ("container killed: OOM", "out of memory"),
        ("ModuleNotFoundError: No module named 'apex'", "ModuleNotFoundError"),
        ("Aborted (core dumped)", "core dumped"),
    ],
)
def test_each_default_error_pattern_catches_its_line(line: str, pattern: str):
    hits = scan_log_errors(f"ok\n{line}\n")
    assert [(h.line, h.pattern) for h in hits] == [(2, pattern)]


@pytest.mark.parametrize(
    "line", ["BLOOM-176B loaded", "zoom=2 room=3", "NCCL INFO Channel 00/0", "no errors"]
)
def test_ordinary_lines_are_not_errors(line: str):
    assert scan_log_errors(line) == []


def test_user_patterns_are_named_by_their_regex():
    hits = scan_log_errors("a\nFATAL: disk full\n", ["FATAL|PANIC"])
    assert [(h.line, h.pattern) for h in hits] == [(2, "FATAL|PANIC")]


# ----------------------------------------------------------------------------- log metrics


def test_perf_lines_are_parsed_with_prefixes_node_ids_and_trailing_commas():
    lines = parse_perf_lines(
        "performance: 14164.2 samples_per_second\n"
        "[rank0] performance: 7082.1 samples_per_second node_id: 2\n"
        "performance: 1.5e3 tokens/s, node_id: 1\n"
        "throughput performance: fast things\n"
        "my_performance: 3 x\n"
    )
    assert [(p.line, p.value, p.metric, p.node_id) for p in lines] == [
        (1, 14164.2, "samples_per_second", None),
        (2, 7082.1, "samples_per_second", 2),
        (3, 1500.0, "tokens/s", 1),
    ]


@pytest.mark.parametrize(
    ("metric", "values", "expected", "rule"),
    [
        ("samples_per_second", [7082.1, 7082.1], 14164.2, "sum (throughput)"),
        ("tokens/s", [10.0, 20.0], 30.0, "sum (throughput)"),
        ("TFLOPS", [100.0, 110.0], 210.0, "sum (throughput)"),
        ("GB/s", [1.0, 2.0], 3.0, "sum (throughput)"),
        ("ttft_ms", [12.0, 14.0], 13.0, "mean (latency)"),
        ("step_time", [1.0, 3.0], 2.0, "mean (latency)"),
        ("p99_latency", [5.0, 7.0], 6.0, "mean (latency)"),
        ("peak_memory_GB", [30.5, 41.25], 41.25, "max (memory)"),
        ("vram_MiB", [100.0, 50.0], 100.0, "max (memory)"),
        ("accuracy", [0.91, 0.93], 0.92, "mean (unknown metric kind)"),
        ("tok_per_s_per_gpu", [500.0, 520.0], 510.0, "mean (per-device throughput)"),
        ("TFLOPS_per_gpu", [500.0, 520.0], 510.0, "mean (per-device throughput)"),
    ],
)
def test_metrics_combine_across_nodes_by_meaning(metric, values, expected, rule):
    value, used = combine_metric(metric, values)
    assert used == rule
    assert value == pytest.approx(expected)


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
        "log_metrics", "nodes", "reasons", "warnings", "perf_rows",
    ]  # fmt: skip
    assert summary_json["nodes"][1]["stages"] == {
        "prepare": 0.19, "image": 12.9, "barrier": 31.6, "run": 613.95, "stage": 0.07
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
    assert (row["build_duration"], row["docker_file"], row["n_gpus"]) == (
        "4.5",
        "examples/toy/Dockerfile",
        "-1",
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
    assert "rank  node     status  exit  prepare  image  barrier  run     stage" in result.stderr


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
    ],
)
def test_collect_cli_usage_errors_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...]):
    jobdir = make_job(tmp_path / "job", 1, csvs={0: FULL_CSV})
    result = run_cli(*[a.format(jobdir=jobdir) for a in args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not (jobdir / "perf.csv").exists()


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


def test_a_node_beyond_nnodes_is_judged_and_warned_about(tmp_path: Path):
    jobdir = make_job(tmp_path / "job", 3, csvs={2: FULL_CSV})
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps(dict(job, nnodes=2)))
    summary = collect(jobdir)
    assert [n.rank for n in summary.nodes] == [0, 1, 2]
    assert summary.warnings == ["node_2 beyond nnodes 2: judged like the others"]


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


# ----------------------------------------------------------------------------- fast paths (same answers)

LOG_PIECES = [
    "step 3/20 | loss 2.31",
    "no errors here",
    "room zoom bloom",
    "hiperror and ncclsystemerror in lower case",
    "RuntimeError: boom",
    "xRuntimeErrorx",
    "xOOMx",
    "container killed: OOM",
    "Out Of Memory",
    "CUDA error: bad",
    "[rank0]: Traceback (most recent call last):",
    "Traceback (most recent call last):",
    '  File "x.py", line 3, in <module>',
    "    raise KeyError(1)",
    "KeyError: 1",
    "[rank0]: ValueError: bad",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 15",
    "FATAL: disk full",
    "end of line",
    "",
    "   ",
    "İſK ünïcode \x00 \x1b[31m",
]
LOG_LINE_ENDS = ["\n", "\r\n", "\r"]
USER_PATTERN_SETS = [(), ("FATAL",), (r"^FATAL", r"line$"), (r"(?<=x)OOM",), (r"(?i)end of",)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(LOG_PIECES), st.sampled_from(LOG_LINE_ENDS)), max_size=60),
    st.booleans(),
    st.sampled_from(USER_PATTERN_SETS),
    st.booleans(),
    st.sampled_from([(1 << 20, 64 * 1024), (1, 1), (7, 16), (64, 100)]),
    st.binary(max_size=3),
)
def test_scan_log_file_gives_what_scanning_the_files_lines_gives(
    lines, final_end, extra, defaults, sizes, junk
):
    """scan_log_file reads in chunks and skips chunks without a possible hit; the reference is
    scan_log_errors over the lines of the file opened as text with newline=""."""
    data = "".join(text + end for text, end in lines)
    data = data if final_end else data.rstrip("\r\n")
    patterns = results.compile_patterns(list(extra), defaults=defaults)
    chunk_chars, read_block = sizes
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "node.log"
        path.write_bytes(data.encode() + junk)
        with open(path, encoding="utf-8", errors="replace", newline="") as handle:
            expected = scan_log_errors(handle, patterns)
        saved = results.SCAN_CHUNK_CHARS, results.READ_BLOCK
        results.SCAN_CHUNK_CHARS, results.READ_BLOCK = chunk_chars, read_block
        try:
            assert results.scan_log_file(path, patterns) == expected
        finally:
            results.SCAN_CHUNK_CHARS, results.READ_BLOCK = saved


def test_a_hit_deep_in_a_log_larger_than_a_chunk_keeps_its_line_number(tmp_path: Path):
    lines = [f"iteration {n} | loss 2.0\r\n" if n % 3 else f"iteration {n}\r" for n in range(1, 150001)]
    lines[120000] = "RuntimeError: late\n"
    path = tmp_path / "node.log"
    path.write_text("".join(lines), newline="")
    assert path.stat().st_size > 2 * results.SCAN_CHUNK_CHARS
    hits = results.scan_log_file(path, results.DEFAULT_ERROR_PATTERNS)
    assert [(h.line, h.pattern, h.text) for h in hits] == [(120001, "RuntimeError", "RuntimeError: late")]


LITERAL_ALPHABET = st.sampled_from(
    ["RuntimeError", "CUDA error", "HIP error", "hipErrorX", "NCCL error", "RCCL error", "ncclSystemError",
     "ncclInternalError", "Segmentation fault", "SIGSEGV", "OOM", "oUT oF MeMoRy", "OutOfMemoryError",
     "ModuleNotFoundError", "core dumped", "x", "_", " ", "-", "é", "İ", "ſ", "K", "Runtime", "Error",
     "error"]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(LITERAL_ALPHABET, max_size=6).map("".join))
def test_the_chunk_prefilter_never_rules_out_a_line_a_default_pattern_matches(line: str):
    prefilter = results._prefilter(tuple(p.regex for p in results.DEFAULT_ERROR_PATTERNS))
    if any(p.regex is not None and p.regex.search(line) for p in results.DEFAULT_ERROR_PATTERNS):
        assert prefilter.may_hit(line)
        assert prefilter.may_hit(f"before\n{line}\r\nafter")


def test_every_default_pattern_has_literals_so_clean_logs_skip_the_regexes():
    for pattern in results.DEFAULT_ERROR_PATTERNS:
        if pattern.regex is not None:
            assert (pattern.regex.pattern, pattern.regex.flags) in results._REQUIRED_LITERALS, pattern.name
    prefilter = results._prefilter(tuple(p.regex for p in results.DEFAULT_ERROR_PATTERNS))
    assert not prefilter.always and not prefilter.regexes
    assert not prefilter.may_hit("iteration 10 | lm loss 2.3 | no errors, room to zoom\n" * 50)


def test_out_of_memory_matches_no_character_whose_lower_case_is_not_in_the_phrase():
    """The prefilter looks for 'out of memory' in text.lower(): true only if every character the
    case-insensitive regex accepts for a letter of it lower-cases to that letter."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    for letter in set("out of memory"):
        assert {c.lower() for c in re.findall(f"(?i:{letter})", every)} == {letter}


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
def test_the_summary_json_writer_writes_what_json_dumps_writes(value: Any):
    assert results._dumps_indent2(value) == json.dumps(value, indent=2, ensure_ascii=False)


def test_the_summary_json_writer_leaves_odd_keys_and_objects_to_json():
    assert results._dumps_indent2({1: [2.5, {None: True}]}) == json.dumps(
        {1: [2.5, {None: True}]}, indent=2, ensure_ascii=False
    )
    with pytest.raises(TypeError):
        results._dumps_indent2({"a": object()})


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

    assert outcome(lambda: results._read_json(path)) == outcome(text_mode)
