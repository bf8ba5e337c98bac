"""slurm-multi report JOBDIR: JOBDIR/report.html, one self-contained page of what collect judged, over
job dirs of every kind (a SUCCESS, a FAILURE with a hang and its stacks, a requeued job, an
incomplete profile, a 1,000-node job, files missing or broken). What the page is made of is read
back with the standard library's HTML parser, as a browser's DOM would show it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from report_dom import Dom
from slurm_multi import attempts
from slurm_multi.cli import group
from slurm_multi.report.jobpage import section_names
from slurm_multi.report.timelinesvg import ticks, timeline_svg
from slurm_multi.results import collect
from test_results import FULL_CSV, make_job
from test_results_hangs import CAUSE_LINE, WAITERS_LINE, cause_and_waiters_job
from test_results_profile import flush_record, profiled_job

REPO = Path(__file__).resolve().parents[2]
PRIMUS_JOB = REPO / "tests" / "py" / "data" / "results" / "jobs" / "primus_2node"


def report(*args: str):
    return CliRunner().invoke(group, ["report", *args])


def page_of(jobdir: Path) -> tuple[str, Dom]:
    result = report(str(jobdir))
    assert result.exit_code == 0, result.output
    assert f"page: {jobdir / 'report.html'}" in result.stderr
    text = (jobdir / "report.html").read_text()
    return text, Dom(text)


def assert_self_contained(text: str, dom: Dom) -> None:
    """No script, no stylesheet or font fetched, no absolute link: a copied dir shows the same page."""
    assert not {"script", "link", "iframe", "object", "embed"} & dom.tags
    assert "@import" not in text and "url(" not in text
    for ref in dom.refs:
        assert ref.startswith("data:image/png;base64,") or not (
            ref.startswith(("/", "http:", "https:", "file:"))
        )


# ----------------------------------------------------------------------------- jobs of every kind


def test_a_success_page_has_the_verdict_the_stages_the_chosen_csv_and_the_rows(tmp_path: Path):
    jobdir = Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))
    collect(jobdir)
    text, dom = page_of(jobdir)
    assert_self_contained(text, dom)
    assert dom.by_id["verdict"] == "SUCCESS"
    assert "reasons" not in dom.by_id and "None: every node ended well" in dom.by_id["reasons-section"]
    assert all(name in dom.by_id for name in section_names())
    stage_table = dom.by_id["stage-table"]
    assert "gpu-a02" in stage_table and "613.95" in stage_table and "12.90" in stage_table
    assert "chosen" in dom.by_id["candidates"] and "node_1/perf_primus.csv" in dom.by_id["candidates"]
    assert "10132.5" in dom.by_id["perf-rows"] and "522.3" in dom.by_id["perf-rows"]
    assert 'href="node_1/perf_primus.csv"' in text and 'href="summary.json"' in text  # relative links
    assert "<svg" in text and "critical path" in dom.by_id["timeline"]


def test_a_failure_with_a_hang_shows_every_reason_the_cause_the_waiters_and_their_stacks(tmp_path: Path):
    jobdir = cause_and_waiters_job(tmp_path / "88", csv=True)
    snapshot = jobdir / "node_1" / "diagnostics"
    snapshot.mkdir()
    (snapshot / "kernel-stacks.txt").write_text("== pid 4242 (python3)\n[<0>] do_signal_stop+0x1/0x2\n")
    (snapshot / "py-spy.txt").write_text("Thread 4242 (idle): MainThread\n    all_reduce (dist.py:12)\n")
    (snapshot / "hang-processes.txt").write_text(
        "PID TID S WCHAN COMMAND\n4242 4242 T do_signal_stop python3\n"
    )
    collect(jobdir)
    text, dom = page_of(jobdir)
    assert_self_contained(text, dom)
    assert dom.by_id["verdict"] == "FAILURE"
    assert dom.by_class["reason"] == [CAUSE_LINE, WAITERS_LINE]
    hang = dom.by_id["hang-table"]
    assert "cause" in hang and "node2" in hang and "frozen" in hang and "waiter" in hang and "node3" in hang
    assert "do_signal_stop+0x1/0x2" in dom.by_id["hang"] and "all_reduce (dist.py:12)" in dom.by_id["hang"]
    assert '<details open><summary><a href="node_1/diagnostics/py-spy.txt">' in text  # the stacks open
    assert '<details><summary><a href="node_1/diagnostics/hang-processes.txt">' in text


def test_a_requeued_job_lists_its_earlier_attempt_and_links_its_files(tmp_path: Path):
    jobdir = make_job(tmp_path / "123", 2, csvs={1: FULL_CSV})
    earlier = jobdir / "attempt_0"
    earlier.mkdir()
    record = attempts.record(0, "fitness", 7, "node9", ["node9\tdocker engine not answering"], now=1764504000)
    attempts.write(str(earlier / attempts.RECORD), record)
    (earlier / "summary.json").write_text("{}\n")
    collect(jobdir)
    text, dom = page_of(jobdir)
    table = dom.by_id["attempts"]
    assert (
        "fitness" in table
        and "node9: docker engine not answering" in table
        and "2025-11-30T12:00:00Z" in table
    )
    assert 'href="attempt_0/summary.json"' in text


def test_a_results_csv_name_no_file_can_have_is_listed_unlinked_not_a_crash(tmp_path: Path):
    """job.json is the job's file: a results_csv of 300 characters (ENAMETOOLONG) is a name, no file."""
    name = "A" * 300 + ".csv"
    jobdir = make_job(tmp_path / "job", 2, csvs={0: FULL_CSV})
    job = json.loads((jobdir / "job.json").read_text())
    (jobdir / "job.json").write_text(json.dumps(dict(job, results_csv=name)))
    collect(jobdir)
    text, dom = page_of(jobdir)
    assert f"node_0/{name}" in dom.by_id["candidates"]
    assert f'href="node_0/{name}"' not in text


def test_an_incomplete_profile_is_a_reason_and_each_ranks_report_is_listed(tmp_path: Path):
    jobdir = profiled_job(tmp_path / "77")
    flush_record(jobdir, {0: (600_000_000, "settled"), 1: (0, "empty")})
    (jobdir / "profile").mkdir()
    (jobdir / "profile" / "77_node1_rank0.nsys-rep").write_bytes(b"x")
    collect(jobdir)
    text, dom = page_of(jobdir)
    assert dom.by_id["verdict"] == "FAILURE"
    assert any("profile incomplete" in r for r in dom.by_class["reason"])
    assert "INCOMPLETE, 1 of 2" in dom.by_id["profile"]
    profile = dom.by_id["profile-table"]
    assert "empty report (0 bytes)" in profile and "600.0 MB" in profile
    assert (
        'href="profile/77_node1_rank0.nsys-rep"' in text
    )  # an absolute path inside the job dir, linked relatively


def test_a_thousand_node_job_page_is_written_and_its_timeline_shows_the_critical_path_only(tmp_path: Path):
    sys.path.insert(0, str(REPO / "bench"))
    import collect_bench

    jobdir = collect_bench.make_jobdir(tmp_path, 1000, log_lines=2, as_left=True)
    collect(jobdir, picture=False)
    started = time.monotonic()
    text, dom = page_of(jobdir)
    assert time.monotonic() - started < 20  # seconds on a loaded 2-core machine; ~0.3 s alone
    assert dom.by_id["verdict"] == "SUCCESS"
    assert "node0999" in dom.by_id["stage-table"]
    assert "More than 256 nodes" in dom.by_id["timeline"]


def test_without_timeline_json_or_perf_csv_the_page_says_so_and_is_still_written(tmp_path: Path):
    jobdir = make_job(tmp_path / "123", 2, csvs={1: FULL_CSV})
    collect(jobdir)
    (jobdir / "timeline.json").unlink()
    (jobdir / "perf.csv").write_text('model,performance\n"unterminated\n')
    result = report(str(jobdir))
    assert result.exit_code == 0, result.output
    assert "warning: " in result.stderr and "perf.csv" in result.stderr
    dom = Dom((jobdir / "report.html").read_text())
    assert "No timeline.json" in dom.by_id["timeline"] and "No perf.csv rows" in dom.by_id["perf"]
    assert "page: " in dom.by_id["warnings"]


def test_text_from_the_job_is_escaped_never_markup(tmp_path: Path):
    jobdir = make_job(tmp_path / "123", 1, csvs={0: FULL_CSV})
    collect(jobdir)
    summary = json.loads((jobdir / "summary.json").read_text())
    summary.update(verdict="FAILURE", reasons=['node1 (rank 0): <script>alert("x")</script> & more'])
    (jobdir / "summary.json").write_text(json.dumps(summary))
    text, dom = page_of(jobdir)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert dom.by_class["reason"] == ['node1 (rank 0): <script>alert("x")</script> & more']


def test_a_page_written_elsewhere_links_back_into_the_job_dir(tmp_path: Path):
    jobdir = make_job(tmp_path / "jobs" / "123", 2, csvs={1: FULL_CSV})
    collect(jobdir)
    out = tmp_path / "pages" / "job123.html"
    out.parent.mkdir()
    result = report(str(jobdir), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert 'href="../jobs/123/summary.json"' in out.read_text()
    assert not (jobdir / "report.html").exists()


# ----------------------------------------------------------------------------- errors: one line


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "does not exist; run `slurm-multi results collect"), ("{not json", "cannot read"),
     ("[1, 2]", "is not the summary.json results collect writes")],
)  # fmt: skip
def test_a_missing_or_broken_summary_json_is_one_line_and_exit_2(
    tmp_path: Path, content: str | None, said: str
):
    jobdir = make_job(tmp_path / "123", 1, csvs={0: FULL_CSV})
    if content is not None:
        (jobdir / "summary.json").write_text(content)
    done = subprocess.run([sys.executable, "-m", "slurm_multi", "report", str(jobdir)], capture_output=True,
                          text=True, check=False)  # fmt: skip
    assert done.returncode == 2
    assert (
        done.stderr.count("\n") == 1
        and done.stderr.startswith("slurm-multi: report: ")
        and said in done.stderr
    )
    assert "Traceback" not in done.stderr and not (jobdir / "report.html").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [([], "give a JOBDIR or --history PERF_CSV"),
     (["jobdir", "--history", "p.csv"], "give a JOBDIR or --history"),
     (["jobdir", "--regression-pct", "3"], "--regression-pct is for --history"),
     (["--history", "p.csv", "--regression-pct", "0"], "--regression-pct"),
     (["--history", "p.csv", "--colour"], "--colour")],
)  # fmt: skip
def test_usage_errors_are_one_line_naming_the_problem(tmp_path: Path, args: list[str], said: str):
    command = [sys.executable, "-m", "slurm_multi", "report", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


def test_a_job_dir_that_is_not_there_is_exit_2(tmp_path: Path):
    result = report(str(tmp_path / "nope"))
    assert result.exit_code == 2 and "does not exist" in result.output


def test_an_unwritable_page_is_exit_1_naming_the_file(tmp_path: Path):
    jobdir = make_job(tmp_path / "123", 1, csvs={0: FULL_CSV})
    collect(jobdir)
    result = report(str(jobdir), "--out", str(tmp_path / "missing-dir" / "r.html"))
    assert result.exit_code == 1 and "cannot write" in result.output and "r.html" in result.output


# ----------------------------------------------------------------------------- the timeline picture


def test_the_svg_timeline_draws_lanes_the_critical_path_and_stragglers_from_timeline_json():
    timeline = {
        "wall_seconds": 10.0,
        "nodes": [
            {"rank": 0, "node": "node1", "approximate": False,
             "stages": [{"stage": "image", "start": 0, "end": 2, "status": "ok", "straggler": False},
                        {"stage": "run", "start": 2, "end": 9, "status": "ok", "straggler": False}],
             "steps": [{"step": "image_save", "start": 0.5, "end": 1.5}],
             "events": [{"t": 2.0, "event": "go"}]},
            {"rank": 1, "node": "node2", "approximate": True,
             "stages": [{"stage": "image", "start": 0, "end": 6, "status": "ok", "straggler": True},
                        {"stage": "run", "start": 6, "end": "bad"}, "garbage"]},
        ],
        "critical_path": {"segments": [{"rank": 1, "stage": "image", "start": 0, "end": 6}]},
    }  # fmt: skip
    svg = timeline_svg(timeline)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "<title>critical path: r1 image 0.00-6.00 s</title>" in svg
    assert "straggler: r1 node2 image 0.00-6.00 s (ok), approximate: from status.json" in svg
    assert "r0 image_save 0.50-1.50 s" in svg and "r0 go at 2.00 s" in svg
    assert 'stroke-dasharray="4 2"' in svg and 'fill-opacity="0.5"' in svg
    assert "r1 node2 run" not in svg  # a stage with a bad end is left out, not a traceback
    assert timeline_svg({"wall_seconds": 0, "nodes": []}) == ""


def test_ticks_are_round_numbers_over_the_wall_time():
    assert ticks(10) == [0, 2, 4, 6, 8, 10]
    assert ticks(96.5)[:3] == [0, 20, 40]
    assert ticks(0) == [0.0]


# ----------------------------------------------------------------------------- bin/sm-collect's --page


def test_collect_with_page_writes_the_page_after_the_verdict_and_its_failure_is_only_a_warning(
    tmp_path: Path,
):
    jobdir = Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir), "--page"])
    assert result.exit_code == 0, result.output
    assert Dom((jobdir / "report.html").read_text()).by_id["verdict"] == "SUCCESS"
    assert result.stderr.index("results: job 4711") < result.stderr.index("report: page: ")  # the table first
    (jobdir / "report.html").unlink()
    (jobdir / "report.html").mkdir()  # a page that cannot be written
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir), "--page"])
    assert result.exit_code == 0  # still the verdict's
    assert "slurm-multi: report: cannot write" in result.stderr
    assert "warning: the job's page (report.html) not written (see above)" in result.stderr
