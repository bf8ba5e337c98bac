"""results mad-outputs: madengine's perf_entry.*, perf_super.* and perf_entry_super.* files, made from a
job dir that the real collect judged, with each result row's own config row (madengine's superset
fixtures: a `--config configs/default.csv` beside the model's script, rows dummy/model-1..3)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.results import PERF_COLUMNS
from slurm_multi.results.commands import run_collect
from slurm_multi.results.madoutputs import Result, config_candidates, match_config
from test_results import make_job

REPO = Path(__file__).resolve().parents[2]
CONFIG_CSV = (
    "model,benchmark,config_value,batch_size,datatype,max_tokens\n"
    "dummy/model-1,throughput,128,8,float16,1024\n"
    "dummy/model-2,serving,256,16,float32,2048\n"
    "dummy/model-3,latency,512,32,bfloat16,4096\n"
)
RESULTS_CSV = (
    "model,performance,metric,benchmark,temperature\n"
    "dummy/model-1,1234.56,tokens/s,throughput,45\n"
    "dummy/model-2,2345.67,requests/s,serving,51.5\n"
    "dummy/model-3,,ms,latency,\n"
)
# madengine's perf_super key order for a multiple-results row (update_perf_super.py, SLURM path).
COMMON = [c for c in PERF_COLUMNS if c not in ("model", "performance", "metric", "status")]
MULTI_KEYS = [*COMMON, "model", "performance", "metric", "multi_results", "status", "configs"]
MADE = (
    "perf_entry.json", "perf_entry.csv", "perf_super.json", "perf_super.csv", "perf_entry_super.json",
    "perf_entry_super.csv",
)  # fmt: skip


def checkout(root: Path, config: str | None = CONFIG_CSV, where: str = "scripts/dummy/configs") -> Path:
    """A model checkout as madengine's fixtures lay it out: scripts/dummy/run.sh, its configs beside."""
    (root / "scripts" / "dummy").mkdir(parents=True, exist_ok=True)
    (root / "scripts" / "dummy" / "run.sh").write_text("#!/bin/bash\n")
    (root / "build_manifest.json").write_text("{}")
    if config is not None:
        (root / where).mkdir(parents=True, exist_ok=True)
        (root / where / "default.csv").write_text(config)
    return root


def manifest_job(root: Path, job_id: str = "123", args: str = "--config configs/default.csv", **extra: Any):
    """job.json as the plan writes it for a manifest model (the keys mad-outputs reads)."""
    return {
        "job_id": job_id,
        "model_key": "dummy_perf_super",
        "model": "dummy_perf_super",
        "nnodes": 1,
        "nodes": ["node1"],
        "results_csv": "perf_toy.csv",
        "image": "dummy:local",
        "args": args,
        "tags": "dummies,perf_super_test",
        "manifest": str(root / "build_manifest.json"),
        "settings": {"SM_COLLECT": "true"},
        "manifest_values": {"scalars": {"SM_MODEL_SCRIPTS": "scripts/dummy/run.sh"}},
        **extra,
    }


def collected(
    jobdir: Path, job: dict[str, Any] | None, csv_text: str | None = RESULTS_CSV, **kw: Any
) -> Path:
    """A one-node job dir judged by the real collect (perf.csv, summary.json)."""
    logs = {0: "performance: 14164 samples_per_second\n"} if csv_text is None else None
    make_job(jobdir, 1, csvs={0: csv_text} if csv_text is not None else None, logs=logs, job=job)
    run_collect(jobdir, None, None, [], False, kw.get("perf_csv"), False, False)
    return jobdir


def mad_outputs(*args: str):
    return CliRunner().invoke(group, ["results", "mad-outputs", *args])


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def talk_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " results: " in line or line.startswith("slurm-multi:")]


# ----------------------------------------------------------------------------- records


def test_each_result_row_carries_its_own_config_row_its_extra_columns_and_its_status(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    assert all((jobdir / name).is_file() for name in MADE)
    records = load(jobdir / "perf_super.json")
    # madengine gave every row dummy/model-1's config row (its caller pops `model` before matching).
    assert [(r["model"], r["configs"]["model"], r["configs"]["benchmark"]) for r in records] == [
        ("dummy_perf_super_dummy/model-1", "dummy/model-1", "throughput"),
        ("dummy_perf_super_dummy/model-2", "dummy/model-2", "serving"),
        ("dummy_perf_super_dummy/model-3", "dummy/model-3", "latency"),
    ]
    assert records[1]["configs"] == {
        "model": "dummy/model-2", "benchmark": "serving", "config_value": 256, "batch_size": 16,
        "datatype": "float32", "max_tokens": 2048,
    }  # fmt: skip
    assert [list(r) for r in records] == [MULTI_KEYS] * 3
    assert [(r["performance"], r["metric"], r["status"]) for r in records] == [
        (1234.56, "tokens/s", "SUCCESS"),
        (2345.67, "requests/s", "SUCCESS"),
        (None, "ms", "FAILURE"),  # no performance: FAILURE, and None where madengine writes NaN
    ]
    assert [r["multi_results"] for r in records] == [
        {"benchmark": "throughput", "temperature": 45.0},
        {"benchmark": "serving", "temperature": 51.5},
        {"benchmark": "latency"},  # an empty cell is left out
    ]
    assert (records[0]["machine_name"], records[0]["args"], records[0]["tags"]) == (
        "123", "--config configs/default.csv", "dummies,perf_super_test"
    )  # fmt: skip
    assert load(jobdir / "perf_entry_super.json") == records
    assert "warning" not in result.stderr


def test_perf_entry_is_perf_csv_row_by_row_plus_each_rows_configs(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    assert mad_outputs(str(jobdir)).exit_code == 0
    entries = load(jobdir / "perf_entry.json")
    perf = csv_rows(jobdir / "perf.csv")
    assert isinstance(entries, list) and [list(e) for e in entries] == [[*perf[0], "configs"]] * 3
    assert [{k: v for k, v in e.items() if k != "configs"} for e in entries] == perf
    assert [e["configs"]["model"] for e in entries] == ["dummy/model-1", "dummy/model-2", "dummy/model-3"]
    assert list(perf[0])[-2:] == ["benchmark", "temperature"]  # the extra columns, as perf.csv has them
    assert (jobdir / "perf_entry.csv").read_bytes() == (jobdir / "perf.csv").read_bytes()


def test_perf_super_csv_holds_configs_and_multi_results_as_json_and_none_as_an_empty_cell(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    assert mad_outputs(str(jobdir)).exit_code == 0
    rows = csv_rows(jobdir / "perf_super.csv")
    assert list(rows[0]) == MULTI_KEYS
    records = load(jobdir / "perf_super.json")
    assert [json.loads(r["configs"]) for r in rows] == [r["configs"] for r in records]
    assert [json.loads(r["multi_results"]) for r in rows] == [r["multi_results"] for r in records]
    assert [r["performance"] for r in rows] == ["1234.56", "2345.67", ""]
    assert (jobdir / "perf_entry_super.csv").read_bytes() == (jobdir / "perf_super.csv").read_bytes()


def test_a_single_config_row_applies_to_every_result_row(tmp_path: Path):
    root = checkout(tmp_path / "checkout", config="model,batch_size\ndummy/other,64\n")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    assert [r["configs"] for r in load(jobdir / "perf_super.json")] == [
        {"model": "dummy/other", "batch_size": 64}
    ] * 3


def test_a_result_row_no_config_row_matches_has_configs_none_and_a_warning(tmp_path: Path):
    config = "model,benchmark\ndummy/model-1,throughput\ndummy/model-2,serving\n"
    root = checkout(tmp_path / "checkout", config=config)
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    assert [r["configs"] and r["configs"]["model"] for r in load(jobdir / "perf_super.json")] == [
        "dummy/model-1", "dummy/model-2", None,
    ]  # fmt: skip
    assert (
        "warning: dummy_perf_super_dummy/model-3: no --config row has model 'dummy/model-3'" in result.stderr
    )


def result_row(model: str, **values: Any) -> Result:
    return Result(dict(values, model=model), model, 1.0, {})


def test_a_config_row_matches_by_exact_model_first_then_by_benchmark():
    configs = [
        {"model": "dummy/model-1", "benchmark": "serving"},
        {"model": "dummy/model-1", "benchmark": "throughput"},
        {"model": "Dummy-Model-10", "benchmark": "throughput"},
        {"model": None, "benchmark": "throughput"},
    ]
    assert match_config(configs, result_row("dummy/model-1", benchmark="throughput")) is configs[1]
    assert match_config(configs, result_row("dummy/model-1")) is configs[0]  # no benchmark: model decides
    # model-1's rows are substrings of model-10: the exact (normalised) match wins.
    assert match_config(configs, result_row("dummy_model_10", benchmark="throughput")) is configs[2]
    assert match_config(configs, result_row("dummy/model-1", benchmark="latency")) is None
    assert match_config(configs, result_row("")) is None
    # The docstring's substring rule: a result model that holds the config's model.
    assert match_config(configs[:2], result_row("bench_dummy/model-1_fp8")) is configs[0]


def test_a_config_that_is_named_but_missing_is_configs_none_and_one_warning(tmp_path: Path):
    root = checkout(tmp_path / "checkout", config=None)
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    assert [r["configs"] for r in load(jobdir / "perf_super.json")] == [None] * 3
    (warning,) = [line for line in result.stderr.splitlines() if "warning" in line]
    assert (
        f"--config configs/default.csv not found (tried {root}/scripts/dummy/configs/default.csv" in warning
    )


@pytest.mark.parametrize("content", [b'model,x\n"unclosed\n', b"", b"model,x\n\xff\xfe,1\n"])
def test_a_config_that_cannot_be_read_is_configs_none_and_a_warning_not_a_traceback(
    tmp_path: Path, content: bytes
):
    root = checkout(tmp_path / "checkout")
    (root / "scripts" / "dummy" / "configs" / "default.csv").write_bytes(content)
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    assert [r["configs"] for r in load(jobdir / "perf_super.json")] == [None] * 3
    assert "unreadable" in result.stderr and "Traceback" not in result.output


def test_without_config_in_the_args_configs_are_none_and_nothing_is_warned(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root, args="--steps 20"))
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    assert [r["configs"] for r in load(jobdir / "perf_super.json")] == [None] * 3
    assert [e["configs"] for e in load(jobdir / "perf_entry.json")] == [None] * 3
    assert "warning" not in result.stderr


def test_a_json_config_is_attached_as_it_is(tmp_path: Path):
    root = checkout(tmp_path / "checkout", config=None)
    (root / "scripts" / "dummy" / "cfg.json").write_text('{"batch_size": 32, "lr": 0.001}')
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root, args="--config cfg.json --steps 2"))
    assert mad_outputs(str(jobdir)).exit_code == 0
    assert [r["configs"] for r in load(jobdir / "perf_super.json")] == [{"batch_size": 32, "lr": 0.001}] * 3


def test_the_config_is_looked_for_beside_the_script_first_then_up_to_the_checkout_root(tmp_path: Path):
    root = checkout(tmp_path / "checkout", config="model,where\nx,scripts\n", where="scripts/configs")
    (root / "configs").mkdir()
    (root / "configs" / "default.csv").write_text("model,where\nx,root\n")
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(root))
    assert mad_outputs(str(jobdir)).exit_code == 0
    assert load(jobdir / "perf_super.json")[0]["configs"] == {"model": "x", "where": "scripts"}
    (root / "scripts" / "configs" / "default.csv").unlink()
    assert mad_outputs(str(jobdir)).exit_code == 0
    assert load(jobdir / "perf_super.json")[0]["configs"] == {"model": "x", "where": "root"}


def test_config_candidates_follow_madengines_order_and_end_at_the_checkout_root():
    assert config_candidates("c.csv", "scripts/MAD-private/pyt_atom/sub/run.sh", "/co") == [
        "/co/scripts/MAD-private/pyt_atom/sub/c.csv",
        "/co/scripts/MAD-private/c.csv",  # madengine's repository root comes before the walk up
        "/co/scripts/MAD-private/pyt_atom/c.csv",
        "/co/c.csv",
    ]
    assert config_candidates("/abs/c.csv", "scripts/x/run.sh", "/co") == ["/abs/c.csv"]
    assert config_candidates("c.csv", "", "") == ["c.csv"]


def test_model_dir_setting_is_the_checkout_root_over_the_manifests_directory(tmp_path: Path):
    root = checkout(tmp_path / "checkout", config="model,where\nx,model-dir\n")
    elsewhere = tmp_path / "manifests"
    elsewhere.mkdir()
    job = manifest_job(root, manifest=str(elsewhere / "build_manifest.json"))
    job["settings"]["SM_MODEL_DIR"] = str(root)
    jobdir = collected(tmp_path / "jobs" / "1", job)
    assert mad_outputs(str(jobdir)).exit_code == 0
    assert load(jobdir / "perf_super.json")[0]["configs"] == {"model": "x", "where": "model-dir"}


def test_a_log_metric_job_gets_madengines_single_result_records(tmp_path: Path):
    root = checkout(tmp_path / "checkout", config="model,batch_size\na,1\nb,2\n")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root), csv_text=None)
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    (record,) = load(jobdir / "perf_super.json")
    assert list(record) == [*PERF_COLUMNS, "configs", "multi_results"]
    assert (record["model"], record["performance"], record["metric"], record["status"]) == (
        "dummy_perf_super", "14164", "samples_per_second", "SUCCESS"
    )  # fmt: skip
    assert record["multi_results"] is None
    assert record["configs"] == [{"model": "a", "batch_size": 1}, {"model": "b", "batch_size": 2}]
    entry = load(jobdir / "perf_entry.json")
    assert isinstance(entry, dict) and entry == {k: v for k, v in record.items() if k != "multi_results"}


def test_a_chosen_csv_named_relative_to_another_directory_is_found_in_the_job_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root = checkout(tmp_path / "checkout")
    (tmp_path / "jobs").mkdir()
    monkeypatch.chdir(tmp_path / "jobs")
    collected(Path("123"), manifest_job(root))  # summary.json: chosen_csv "123/node_0/perf_toy.csv"
    monkeypatch.chdir(tmp_path)
    result = mad_outputs(str(tmp_path / "jobs" / "123"))
    assert result.exit_code == 0, result.output
    assert len(load(tmp_path / "jobs" / "123" / "perf_super.json")) == 3


def test_a_chosen_csv_that_changed_since_collect_is_a_one_line_error(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    jobdir = collected(tmp_path / "jobs" / "123", manifest_job(root))
    (jobdir / "node_0" / "perf_toy.csv").write_text(RESULTS_CSV + "dummy/model-4,1,x,y,2\n")
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 2
    assert talk_lines(result.stderr) == [
        f"slurm-multi: results: chosen CSV {jobdir}/node_0/perf_toy.csv has 4 rows, perf.csv 3; it changed "
        "since collect: re-run results collect"
    ]
    assert not (jobdir / "perf_super.json").exists()


def test_values_masked_in_perf_csv_stay_masked_in_every_file(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    job = manifest_job(root, additional_docker_run_options="-e HF_TOKEN=hf_secretvalue123")
    jobdir = collected(tmp_path / "jobs" / "123", job)
    assert mad_outputs(str(jobdir)).exit_code == 0
    for name in MADE:
        text = (jobdir / name).read_text()
        assert "hf_secretvalue123" not in text and "HF_TOKEN=***" in text, name


# ----------------------------------------------------------------------------- beside the shared perf.csv


def test_perf_super_json_beside_a_shared_perf_csv_grows_by_each_jobs_records(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    shared = tmp_path / "shared" / "perf.csv"
    shared.parent.mkdir()
    for job_id in ("101", "102"):
        jobdir = collected(tmp_path / "jobs" / job_id, manifest_job(root, job_id), perf_csv=str(shared))
        result = mad_outputs(str(jobdir), "--perf-csv", str(shared))
        assert result.exit_code == 0, result.output
    beside = shared.parent
    cumulative = load(beside / "perf_super.json")
    assert [(r["machine_name"], r["configs"]["model"]) for r in cumulative] == [
        (job, f"dummy/model-{n}") for job in ("101", "102") for n in (1, 2, 3)
    ]
    assert [r["machine_name"] for r in csv_rows(beside / "perf_super.csv")] == ["101"] * 3 + ["102"] * 3
    assert load(beside / "perf_entry_super.json") == cumulative[3:] == load(jobdir / "perf_super.json")
    assert [r["machine_name"] for r in csv_rows(beside / "perf_entry_super.csv")] == ["102"] * 3
    assert [e["machine_name"] for e in load(beside / "perf_entry.json")] == ["102"] * 3
    assert f"beside {shared}: perf_super.json (6 records in all)" in result.stderr
    assert (beside / "perf.csv.lock").exists()


def test_records_madengine_left_in_perf_super_json_are_kept(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    shared = tmp_path / "perf.csv"
    earlier = [{"model": "older", "performance": float("nan"), "configs": None, "multi_results": {"a": 1}}]
    (tmp_path / "perf_super.json").write_text(json.dumps(earlier, indent=2))
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(root), perf_csv=str(shared))
    assert mad_outputs(str(jobdir), "--perf-csv", str(shared)).exit_code == 0
    records = load(tmp_path / "perf_super.json")
    assert records[0]["model"] == "older" and len(records) == 4
    rows = csv_rows(tmp_path / "perf_super.csv")
    assert list(rows[0])[:4] == ["model", "performance", "configs", "multi_results"]
    assert (rows[0]["multi_results"], rows[0]["n_gpus"], rows[1]["model"]) == (
        '{"a": 1}',
        "",
        records[1]["model"],
    )


@pytest.mark.parametrize("content", ['{"model": "x"}', "[1, 2]", "[{]", "", "null"])
def test_an_existing_perf_super_json_that_is_not_a_list_of_records_is_a_one_line_error_left_as_it_was(
    tmp_path: Path, content: str
):
    root = checkout(tmp_path / "checkout")
    shared = tmp_path / "perf.csv"
    (tmp_path / "perf_super.json").write_text(content)
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(root), perf_csv=str(shared))
    result = mad_outputs(str(jobdir), "--perf-csv", str(shared))
    assert result.exit_code == 2, result.output
    (line,) = talk_lines(result.stderr)
    assert line.startswith(f"slurm-multi: results: {tmp_path / 'perf_super.json'} is ")
    assert line.endswith("; fix or move it aside (nothing was written beside it)")
    assert (tmp_path / "perf_super.json").read_text() == content
    # (perf_entry.csv beside it is collect's.)
    assert not any(
        (tmp_path / name).exists() for name in MADE if name not in ("perf_super.json", "perf_entry.csv")
    )
    assert (jobdir / "perf_super.json").exists()  # the job dir's own files do not depend on it


def test_with_hold_on_bad_nodes_nothing_is_written_beside_the_shared_perf_csv(tmp_path: Path):
    root = checkout(tmp_path / "checkout")
    shared = tmp_path / "perf.csv"
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(root))
    summary = load(jobdir / "summary.json")
    summary["bad_nodes"] = [{"rank": 0, "node": "node1", "reason": "gpu 3 missing"}]
    (jobdir / "summary.json").write_text(json.dumps(summary))
    result = mad_outputs(str(jobdir), "--perf-csv", str(shared), "--no-perf-csv-on-bad-nodes")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "perf_super.json").exists() and (jobdir / "perf_super.json").exists()
    assert "bad nodes: nothing written beside" in result.stderr
    summary["bad_nodes"] = []
    (jobdir / "summary.json").write_text(json.dumps(summary))
    assert mad_outputs(str(jobdir), "--perf-csv", str(shared), "--no-perf-csv-on-bad-nodes").exit_code == 0
    assert len(load(tmp_path / "perf_super.json")) == 3


# ----------------------------------------------------------------------------- the command


def test_a_job_without_a_manifest_model_writes_nothing_and_says_so_in_one_line(tmp_path: Path):
    job = manifest_job(tmp_path, model_key="")
    jobdir = collected(tmp_path / "jobs" / "1", job)
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 0, result.output
    (line,) = talk_lines(result.stderr)
    assert "no manifest model (job.json has no model_key)" in line
    assert not any((jobdir / name).exists() for name in MADE)


@pytest.mark.parametrize(
    "args, message",
    [
        (("{tmp}/nonexistent",), "results: job directory {tmp}/nonexistent does not exist"),
        (
            ("{tmp}/jobs/1",),
            "results: {tmp}/jobs/1/perf.csv does not exist; run `slurm-multi results collect",
        ),
        (("{tmp}/jobs/1", "--perf-csv", "{tmp}"), "is a directory; pass the perf.csv file"),
        (("{tmp}/jobs/1", "--perf-csv", ""), "--perf-csv '': an empty path; pass the perf.csv file"),
        (("{tmp}/jobs/1", "--perf-csv", "{tmp}/no/dir/perf.csv"), "directory {tmp}/no/dir does not exist"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, args: tuple[str, ...], message: str):
    (tmp_path / "jobs" / "1").mkdir(parents=True)
    if "--perf-csv" in args:
        collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    result = mad_outputs(*[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    (line,) = talk_lines(result.stderr)
    assert message.format(tmp=tmp_path) in line and "Traceback" not in result.output
    assert not (tmp_path / "perf_super.json").exists()


def test_a_missing_summary_json_is_a_one_line_error(tmp_path: Path):
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    (jobdir / "summary.json").unlink()
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 2
    assert talk_lines(result.stderr) == [
        f"slurm-multi: results: cannot read {jobdir}/summary.json: No such file or directory; "
        "re-run results collect"
    ]


def test_without_pandas_the_command_fails_in_one_line_naming_the_fix(tmp_path: Path, monkeypatch):
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    result = mad_outputs(str(jobdir))
    assert result.exit_code == 1
    (line,) = talk_lines(result.stderr)
    assert "pandas is not installed for this Python; pip install pandas" in line


def test_the_installed_command_says_a_missing_jobdir_in_one_line_and_runs_from_the_tree(tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"))
    run = [sys.executable, "-m", "slurm_multi", "results", "mad-outputs"]
    missing = subprocess.run(run, env=env, capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and len(missing.stderr.splitlines()) == 1
    assert "Missing argument 'JOBDIR'" in missing.stderr and missing.stdout == ""
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    done = subprocess.run([*run, str(jobdir)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert "madengine files: 3 record(s)" in done.stderr


def test_a_re_run_on_the_same_job_dir_writes_the_same_files(tmp_path: Path):
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    assert mad_outputs(str(jobdir)).exit_code == 0
    first = {name: (jobdir / name).read_bytes() for name in MADE}
    assert mad_outputs(str(jobdir)).exit_code == 0
    assert {name: (jobdir / name).read_bytes() for name in MADE} == first
    assert json.loads(first["perf_entry.json"])[0]["model"].endswith("model-1")


def sm_collect(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "py"), SM_PYTHON=sys.executable)
    return subprocess.run([str(REPO / "bin" / "sm-collect"), *args], env=env, capture_output=True, text=True,
                          check=False, timeout=120)  # fmt: skip


def test_sm_collect_writes_the_madengine_files_from_what_collect_was_given_in_any_order(tmp_path: Path):
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    shared = tmp_path / "shared" / "perf.csv"
    shared.parent.mkdir()
    done = sm_collect("--error-pattern", "never printed", "--perf-csv", str(shared), str(jobdir), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "SUCCESS"
    assert all((jobdir / name).is_file() for name in MADE)
    assert len(load(shared.parent / "perf_super.json")) == 3
    assert f"madengine files: 3 record(s) in {jobdir}" in done.stderr and f"beside {shared}" in done.stderr


def test_sm_collect_says_a_failed_madengine_step_and_keeps_the_verdicts_exit(tmp_path: Path):
    jobdir = collected(tmp_path / "jobs" / "1", manifest_job(checkout(tmp_path / "checkout")))
    shared = tmp_path / "shared" / "perf.csv"
    shared.parent.mkdir()
    (shared.parent / "perf_super.json").write_text("not json")
    done = sm_collect(str(jobdir), "--perf-csv", str(shared))
    assert done.returncode == 0, done.stderr
    said = [x for x in done.stderr.splitlines() if x.startswith("slurm-multi:") or "collect:" in x]
    assert len(said) == 2, done.stderr
    assert said[0].startswith(f"slurm-multi: results: {shared.parent / 'perf_super.json'} is unreadable")
    warning = "collect: warning: madengine's perf_entry/perf_super files not written (see above)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \S+ r\S+ " + re.escape(warning), said[1])
