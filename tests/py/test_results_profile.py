"""The profile is part of the verdict: `reports wait --state-file` records each report's bytes and
state, and collect judges every rank of a profiled job by it (results/profile.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.reports import STATE_KIND
from slurm_multi.results import collect
from slurm_multi.results.profile import FLUSH_FILE
from test_results import FULL_CSV, make_job, read_perf, read_summary

REPO = Path(__file__).resolve().parents[2]


def profiled_job(root: Path, nnodes: int = 2, optional: bool = False, profile: str = "nsys") -> Path:
    job = {
        "job_id": "77",
        "model": "toy_model",
        "nnodes": nnodes,
        "results_csv": "perf_toy.csv",
        "nodes": [f"node{r + 1}" for r in range(nnodes)],
        "profile": profile,
        "settings": {"SM_PROFILE": profile, "SM_PROFILE_OPTIONAL": "true" if optional else "false"},
    }
    return make_job(root, nnodes, csvs={nnodes - 1: FULL_CSV}, job=job)


def flush_record(jobdir: Path, reports: dict[int, tuple[int, str]], qdstrm: tuple[int, ...] = ()) -> None:
    """profile-flush.json as `reports wait --state-file` writes it (rank -> bytes, state)."""
    folder = jobdir / "profile"
    document = {
        "kind": STATE_KIND,
        "version": 1,
        "directory": str(folder),
        "pattern": "*.nsys-rep",
        "expect": len(reports),
        "settle_seconds": 40,
        "waited_seconds": 41.0,
        "ok": all(state == "settled" for _, state in reports.values()) and not qdstrm,
        "summary": "",
        "reports": [
            {"path": str(folder / f"77_node{r + 1}_rank{r}.nsys-rep"), "bytes": size, "state": state}
            for r, (size, state) in sorted(reports.items())
        ],
        "qdstrm": [str(folder / f"77_node{r + 1}_rank{r}.qdstrm") for r in qdstrm],
    }
    (jobdir / FLUSH_FILE).write_text(json.dumps(document))


def test_every_rank_with_a_settled_report_is_a_complete_profile(tmp_path: Path):
    jobdir = profiled_job(tmp_path / "77")
    flush_record(jobdir, {0: (600_000_000, "settled"), 1: (600_000_000, "settled")})
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS", summary.reasons
    assert summary.profile is not None and summary.profile.describe() == "profile: 2 of 2 reports (1.2 GB)"
    section = read_summary(jobdir)["profile"]
    assert (section["type"], section["complete"], section["reports"], section["expected"]) == (
        "nsys",
        True,
        2,
        2,
    )
    assert section["ranks"][1] == {
        "rank": 1,
        "node": "node2",
        "report": str(jobdir / "profile" / "77_node2_rank1.nsys-rep"),
        "bytes": 600_000_000,
        "settled": True,
        "reason": None,
    }


@pytest.mark.parametrize(
    ("reports", "qdstrm", "reason"),
    [
        ({0: (5_000, "settled"), 1: (0, "empty")}, (), "node2 (rank 1): empty report (0 bytes)"),
        ({0: (5_000, "settled")}, (), "node2 (rank 1): no report after the 40 s settle"),
        ({0: (5_000, "settled"), 1: (9_000, "growing")}, (), "node2 (rank 1): report still changing"),
        ({0: (5_000, "settled"), 1: (9_000, "settled")}, (1,), "node2 (rank 1): a .qdstrm is left"),
        # Another job's report (rank 7 of 2) never stands in for a missing one.
        ({0: (5_000, "settled"), 7: (5_000, "settled")}, (), "node2 (rank 1): no report"),
    ],
)
def test_a_rank_without_one_complete_report_fails_the_job_and_keeps_the_rows(
    tmp_path: Path, reports: dict[int, tuple[int, str]], qdstrm: tuple[int, ...], reason: str
):
    jobdir = profiled_job(tmp_path / "77")
    flush_record(jobdir, reports, qdstrm)
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir)])
    assert result.exit_code == 1, result.output
    summary = read_summary(jobdir)
    assert summary["verdict"] == "FAILURE"
    assert summary["reasons"] == [
        "profile incomplete: 1 of 2 reports (the profile line names the ranks); "
        "--profile-optional true accepts a job without every report"
    ]
    assert f"  profile: INCOMPLETE, 1 of 2: {reason}" in result.stderr
    assert summary["profile"]["ranks"][1]["settled"] is False
    assert summary["profile"]["ranks"][1]["reason"]
    # The run was measured: its rows are written, and they say the run itself succeeded.
    rows = read_perf(jobdir)
    assert [row["performance"] for row in rows] == ["100.5", "9.8"]


def test_with_profile_optional_an_incomplete_profile_is_said_but_the_verdict_is_the_runs(tmp_path: Path):
    jobdir = profiled_job(tmp_path / "77", optional=True)
    flush_record(jobdir, {0: (5_000, "settled"), 1: (0, "empty")})
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir)])
    assert result.exit_code == 0, result.output
    assert (
        "  profile: INCOMPLETE, 1 of 2: node2 (rank 1): empty report (0 bytes) "
        "(--profile-optional: the verdict stands)"
    ) in result.stderr
    summary = read_summary(jobdir)
    assert (summary["verdict"], summary["profile"]["complete"], summary["profile"]["optional"]) == (
        "SUCCESS",
        False,
        True,
    )


@pytest.mark.parametrize("content", [None, "{not json", '{"kind": "something else"}'])
def test_no_readable_flush_record_is_no_report_for_any_rank(tmp_path: Path, content: str | None):
    jobdir = profiled_job(tmp_path / "77")
    if content is not None:
        (jobdir / FLUSH_FILE).write_text(content)
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert summary.profile is not None and [r.settled for r in summary.profile.ranks] == [False, False]
    assert all(r.reason.startswith("no report: ") and FLUSH_FILE in r.reason for r in summary.profile.ranks)


def test_a_report_size_no_file_has_counts_as_no_bytes(tmp_path: Path):
    """profile-flush.json is another process's file: a size of 400 digits is no size (as -1 or "x")."""
    jobdir = profiled_job(tmp_path / "77")
    flush_record(jobdir, {0: (10**400, "settled"), 1: (600_000_000, "settled")})
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS", summary.reasons
    assert summary.profile is not None and summary.profile.describe() == "profile: 2 of 2 reports (600.0 MB)"
    assert read_summary(jobdir)["profile"]["ranks"][0]["bytes"] == 0


@pytest.mark.parametrize("key", ["qdstrm", "reports"])
@pytest.mark.parametrize("value", [5, "x", {"a": 1}, None])
def test_a_flush_record_list_that_is_no_list_holds_no_entry(tmp_path: Path, key: str, value: object):
    jobdir = profiled_job(tmp_path / "77")
    flush_record(jobdir, {0: (600_000_000, "settled"), 1: (600_000_000, "settled")})
    document = json.loads((jobdir / FLUSH_FILE).read_text())
    document[key] = value
    document["settle_seconds"] = 10**400
    (jobdir / FLUSH_FILE).write_text(json.dumps(document))
    summary = collect(jobdir)
    assert summary.profile is not None
    if key == "qdstrm":
        assert summary.verdict == "SUCCESS" and summary.profile.complete
    else:  # no report listed: every rank's is missing ("after the settle": its seconds are no number)
        assert summary.verdict == "FAILURE"
        assert [r.reason for r in summary.profile.ranks] == ["no report after the settle"] * 2


def test_a_fifo_as_the_flush_record_is_no_record_not_a_hang(tmp_path: Path):
    import subprocess
    import sys

    jobdir = profiled_job(tmp_path / "77")
    os.mkfifo(jobdir / FLUSH_FILE)
    code = "import sys; from slurm_multi.results import collect; print(collect(sys.argv[1]).verdict)"
    env = {**os.environ, "PYTHONPATH": str(REPO / "py")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(jobdir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "FAILURE"  # no record of the flush: no report for any rank
    ranks = read_summary(jobdir)["profile"]["ranks"]
    assert all(r["reason"].startswith("no report: ") and FLUSH_FILE in r["reason"] for r in ranks)


def test_a_job_that_was_not_profiled_has_no_profile_section(tmp_path: Path):
    jobdir = profiled_job(tmp_path / "77", profile="none")
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS" and summary.profile is None
    assert read_summary(jobdir)["profile"] is None


def test_reports_wait_state_file_records_each_reports_bytes_and_state(tmp_path: Path):
    folder = tmp_path / "profile"
    folder.mkdir()
    (folder / "77_node1_rank0.nsys-rep").write_bytes(b"x" * 1234)
    (folder / "77_node2_rank1.nsys-rep").write_bytes(b"")
    state = tmp_path / "flush.json"
    args = [
        "reports",
        "wait",
        str(folder),
        "--expect",
        "2",
        "--settle-seconds",
        "0",
        "--timeout-seconds",
        "0.3",
    ]
    result = CliRunner().invoke(group, [*args, "--poll-seconds", "0.05", "--state-file", str(state)])
    assert result.exit_code == 3  # one of the two is empty: it never counts
    document = json.loads(state.read_text())
    assert (document["kind"], document["ok"], document["expect"]) == (STATE_KIND, False, 2)
    assert [(Path(r["path"]).name, r["bytes"], r["state"]) for r in document["reports"]] == [
        ("77_node1_rank0.nsys-rep", 1234, "settled"),
        ("77_node2_rank1.nsys-rep", 0, "empty"),
    ]
    assert "stayed empty after nsys finished writing" in document["summary"]
    (folder / "77_node2_rank1.nsys-rep").write_bytes(b"y" * 10)
    result = CliRunner().invoke(group, [*args, "--poll-seconds", "0.05", "--state-file", str(state)])
    assert result.exit_code == 0, result.output
    assert json.loads(state.read_text())["ok"] is True


def test_the_flush_file_has_one_name_in_bash_and_python():
    text = (REPO / "lib" / "profile.sh").read_text()
    assert re.findall(r"^PROFILE_FLUSH_FILE=(\S+)$", text, re.MULTILINE) == [FLUSH_FILE]
    assert os.sep not in FLUSH_FILE


# ---- a madengine manifest's profiler tools (rocprofv3, rpd, ...) ------------------------------------


def tool_job(root: Path, tools: list[str], optional: bool = False) -> Path:
    job = {"job_id": "78", "model": "mad_model", "nnodes": 2, "results_csv": "perf_toy.csv",
           "nodes": ["node1", "node2"], "profiler_tools": tools,
           "settings": {"SM_PROFILE_OPTIONAL": "true" if optional else "false"}}  # fmt: skip
    return make_job(root, 2, csvs={1: FULL_CSV}, job=job)


def tool_output(jobdir: Path, rank: int, folder: str, text: str = "kernel,ns\n") -> None:
    where = jobdir / f"node_{rank}" / "tools" / folder / "run-1"
    where.mkdir(parents=True)
    (where / "kernel_stats.csv").write_text(text)


def test_every_rank_with_its_tools_output_is_a_complete_tool_profile(tmp_path: Path):
    jobdir = tool_job(tmp_path / "78", ["rocprofv3", "rpd"])
    for rank in (0, 1):
        tool_output(jobdir, rank, "rocprof_output")
        tool_output(jobdir, rank, "rpd_output")
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS", summary.reasons
    section = read_summary(jobdir)["profile"]
    assert (section["type"], section["complete"], section["reports"], section["expected"]) == (
        "rocprofv3,rpd", True, 2, 2)  # fmt: skip


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (None, "node2 (rank 1): rocprofv3: no rocprof_output/ in node_1/tools"),
        ("", "node2 (rank 1): rocprofv3: empty rocprof_output/ in node_1/tools"),
    ],
)
def test_a_rank_without_its_tools_output_fails_the_job_unless_optional(tmp_path: Path, make, reason):
    for optional in (False, True):
        jobdir = tool_job(tmp_path / str(optional) / "78", ["rocprofv3"], optional)
        tool_output(jobdir, 0, "rocprof_output")
        if make is not None:
            tool_output(jobdir, 1, "rocprof_output", make)
        result = CliRunner().invoke(group, ["results", "collect", str(jobdir)])
        assert f"  profile: INCOMPLETE, 1 of 2: {reason}" in result.stderr
        assert result.exit_code == (0 if optional else 1), result.output
        assert read_summary(jobdir)["verdict"] == ("SUCCESS" if optional else "FAILURE")


def test_a_manifest_without_profiler_tools_has_no_profile_section(tmp_path: Path):
    assert collect(tool_job(tmp_path / "78", [])).profile is None
