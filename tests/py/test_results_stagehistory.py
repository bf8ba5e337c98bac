"""results collect --perf-csv: each job's node stage times go to perf_stages.jsonl beside the shared
perf.csv (one line per job, under the same lock), which the history page reads; a line that is not a
record is a warning there, never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.results.stagehistory import STAGES_NAME, read_stage_history

PRIMUS_JOB = Path(__file__).parent / "data" / "results" / "jobs" / "primus_2node"


def collect(jobdir: Path, shared: Path, *extra: str) -> None:
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir), "--perf-csv", str(shared), *extra])
    assert result.exit_code == 0, result.output


def test_each_append_adds_one_line_with_every_nodes_stage_seconds(tmp_path: Path):
    jobdir = Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))
    shared = tmp_path / "perf.csv"
    collect(jobdir, shared)
    collect(jobdir, shared)  # each collect with --perf-csv appends, the rows and the stages alike
    lines = (tmp_path / STAGES_NAME).read_text().splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    record = json.loads(lines[0])
    assert (record["machine_name"], record["model"], record["verdict"]) == (
        "4711",
        "primus_llama3_8b",
        "SUCCESS",
    )
    assert [(n["rank"], n["node"]) for n in record["nodes"]] == [(0, "gpu-a01"), (1, "gpu-a02")]
    assert record["nodes"][1]["stages"] == {
        "prepare": 0.19, "image": 12.9, "barrier": 31.6, "run": 613.95, "save-outputs": 0.07
    }  # fmt: skip
    records, warnings = read_stage_history(tmp_path / STAGES_NAME)
    assert warnings == [] and [r["machine_name"] for r in records] == ["4711", "4711"]
    assert records[0]["nodes"][1]["stages"]["run"] == 613.95


def test_without_a_bad_node_the_requeue_hold_still_appends_the_stage_line(tmp_path: Path):
    jobdir = Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))
    shared = tmp_path / "perf.csv"
    collect(jobdir, shared, "--no-perf-csv-on-bad-nodes")  # no bad node: nothing is held
    assert len((tmp_path / STAGES_NAME).read_text().splitlines()) == 1


def test_lines_that_are_not_records_are_warnings_and_the_rest_still_count(tmp_path: Path):
    node = {"rank": 0, "node": "n1", "stages": {"run": 3.5, "image": "slow", "bad": -1}}
    good = {"machine_name": "7", "model": "m", "verdict": "SUCCESS", "nodes": [node]}
    lines = [json.dumps(good), "not json", "[1, 2]", '{"nodes": "x"}', "", json.dumps(good)[:20]]
    lines += ["{}"] * 4 + [json.dumps(dict(good, machine_name="8"))]
    path = tmp_path / STAGES_NAME
    path.write_text("\n".join(lines) + "\n")
    records, warnings = read_stage_history(path)
    assert [r["machine_name"] for r in records] == ["7", "8"]
    assert records[0]["nodes"] == [
        {"rank": 0, "node": "n1", "stages": {"run": 3.5}}
    ]  # only times that are times
    assert warnings[:2] == [
        f"{STAGES_NAME} line 2: not a stage-times record; skipped",
        f"{STAGES_NAME} line 3: not a stage-times record; skipped",
    ]
    assert len(warnings) == 6 and warnings[-1] == f"{STAGES_NAME}: +3 more lines like these skipped"


def test_a_stage_time_of_hundreds_of_digits_is_no_time(tmp_path: Path):
    node = {"rank": 0, "node": "n1", "stages": {"run": 3.5, "image": 10**400}}
    path = tmp_path / STAGES_NAME
    record = {"machine_name": "7", "model": "m", "verdict": "SUCCESS", "nodes": [node]}
    path.write_text(json.dumps(record) + "\n")
    records, warnings = read_stage_history(path)
    assert warnings == [] and records[0]["nodes"][0]["stages"] == {"run": 3.5}


def test_no_file_is_no_record_and_an_unreadable_one_is_one_warning(tmp_path: Path):
    assert read_stage_history(tmp_path / STAGES_NAME) == ([], [])
    (tmp_path / STAGES_NAME).mkdir()
    records, warnings = read_stage_history(tmp_path / STAGES_NAME)
    assert records == [] and warnings == [
        f"{STAGES_NAME}: unreadable (Is a directory); no stage times over the runs"
    ]


def test_a_cut_short_last_line_is_refused_as_perf_csv_is_and_a_whole_one_gets_its_newline(tmp_path: Path):
    # The new record glued onto a cut-short last line was lost with it (the history skips the line).
    jobdir = Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))
    shared = tmp_path / "perf.csv"
    collect(jobdir, shared)
    path = tmp_path / STAGES_NAME
    whole = path.read_text()
    path.write_text(whole + '{"machine_name": "703", "model"')
    before = (shared.read_bytes(), path.read_bytes())
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir), "--perf-csv", str(shared)])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        f"slurm-multi: results: --perf-csv {shared}: {STAGES_NAME} beside it: its last line is cut short "
        "(not a stage-times record, no newline); fix or move it aside (nothing was written)"
    )
    assert (shared.read_bytes(), path.read_bytes()) == before  # neither file touched
    path.write_text(whole.rstrip("\n"))  # a whole record, only its newline missing: kept, then ours
    collect(jobdir, shared)
    records, warnings = read_stage_history(path)
    assert warnings == [] and [r["machine_name"] for r in records] == ["4711", "4711"]
