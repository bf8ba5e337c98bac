"""`slurm-multi reports wait`: reports count only once non-empty and byte-stable, with no .qdstrm left,
and (with --since-file) only when new or changed since the snapshot taken before the job."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_multi import EXIT_TIMEOUT, EXIT_USAGE
from slurm_multi.reports import (
    Settler,
    WaitResult,
    human_bytes,
    read_snapshot,
    scan,
    take_snapshot,
    wait_for_reports,
    write_snapshot,
)
from slurm_multi.reports_cli import cli

MB = 1_000_000


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# --- Settler: the logic, fed snapshots and a clock -------------------------------------------------


def test_a_report_settles_only_after_its_size_is_unchanged_for_the_window() -> None:
    settler = Settler(expect=1, settle_seconds=60)
    settler.observe({"r/rank0.nsys-rep": 5 * MB}, [], now=0)
    assert not settler.done(59.9)
    assert settler.done(60)
    assert settler.settled(60) == ["r/rank0.nsys-rep"]


def test_a_growing_report_resets_its_settle_clock() -> None:
    settler = Settler(expect=1, settle_seconds=60)
    settler.observe({"a.nsys-rep": 1 * MB}, [], now=0)
    settler.observe({"a.nsys-rep": 2 * MB}, [], now=50)
    assert settler.kind("a.nsys-rep", 60) == "growing"
    assert not settler.done(100)
    assert settler.done(110)


def test_zero_byte_reports_never_count_however_long_they_stay() -> None:
    # the seed's bug: 11 reports existed, all 0 bytes, and the count looked settled
    settler = Settler(expect=2, settle_seconds=20)
    snapshot = {f"rank{i}.nsys-rep": 0 for i in range(11)}
    settler.observe(snapshot, [], now=0)
    settler.observe(snapshot, [], now=500)
    assert settler.settled(500) == []
    assert not settler.done(500)
    assert "0/2 settled" in settler.progress(500, waited=500)
    assert "11 empty" in settler.progress(500, waited=500)


def test_a_fresh_empty_report_holds_the_wait_even_when_enough_others_settled() -> None:
    settler = Settler(expect=1, settle_seconds=10)
    settler.observe({"a.nsys-rep": MB}, [], now=0)
    settler.observe({"a.nsys-rep": MB, "b.nsys-rep": 0}, [], now=9)  # b is about to be written
    assert not settler.done(12)
    assert settler.done(19)  # b stayed empty for a whole window: it no longer holds the wait


def test_a_report_still_changing_holds_the_wait_even_when_the_count_is_reached() -> None:
    settler = Settler(expect=1, settle_seconds=10)
    settler.observe({"a.nsys-rep": MB, "b.nsys-rep": MB}, [], now=0)
    settler.observe({"a.nsys-rep": MB, "b.nsys-rep": 2 * MB}, [], now=15)
    assert len(settler.settled(15)) == 1
    assert not settler.done(15)
    assert settler.done(25)


def test_a_leftover_qdstrm_holds_the_wait() -> None:
    settler = Settler(expect=1, settle_seconds=0)
    settler.observe({"a.nsys-rep": MB}, ["a.qdstrm"], now=0)
    assert not settler.done(100)
    assert "1 .qdstrm" in settler.progress(100, waited=100)
    settler.observe({"a.nsys-rep": MB}, [], now=101)
    assert settler.done(101)


def test_baseline_reports_must_be_joined_by_expect_new_ones() -> None:
    settler = Settler(expect=2, baseline=3, settle_seconds=5)
    old = {f"old{i}.nsys-rep": MB for i in range(3)}
    settler.observe(old, [], now=0)
    assert not settler.done(10)
    settler.observe({**old, "new0.nsys-rep": MB}, [], now=10)
    assert not settler.done(20)
    settler.observe({**old, "new0.nsys-rep": MB, "new1.nsys-rep": MB}, [], now=20)
    assert settler.done(25)
    assert len(settler.settled(25)) == 5


def test_a_vanished_report_is_forgotten_and_a_renamed_one_starts_over() -> None:
    settler = Settler(expect=1, settle_seconds=10)
    settler.observe({"a.tmp.nsys-rep": MB}, [], now=0)
    settler.observe({"a.nsys-rep": MB}, [], now=8)
    assert list(settler.files) == ["a.nsys-rep"]
    assert not settler.done(15)
    assert settler.done(18)


def test_nothing_is_done_before_the_first_snapshot() -> None:
    assert not Settler(expect=0, settle_seconds=0).done(0)


def test_state_lines_name_each_file_and_its_state() -> None:
    settler = Settler(expect=4, settle_seconds=60)
    settler.observe({"d/rank0.nsys-rep": 3 * MB, "d/rank1.nsys-rep": 0, "d/rank2.nsys-rep": MB}, [], now=0)
    settler.observe(
        {"d/rank0.nsys-rep": 3 * MB, "d/rank1.nsys-rep": 0, "d/rank2.nsys-rep": 12 * MB},
        ["d/rank3.qdstrm"],
        now=99.5,
    )
    lines = settler.state_lines(100, relative_to="d")
    assert "rank0.nsys-rep: settled (3.0 MB)" in lines
    assert any(line.startswith("rank1.nsys-rep: 0 bytes") for line in lines)
    assert "rank2.nsys-rep: growing: 12.0 MB, changed 0.5 s ago" in lines
    assert "rank3.qdstrm still present" in lines
    progress = settler.progress(100, waited=14)
    assert progress == "1/4 settled, 1 growing (12.0 MB), 1 empty, 1 .qdstrm, waited 14 s"


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 bytes"
    assert human_bytes(999) == "999 bytes"
    assert human_bytes(12 * MB) == "12.0 MB"
    assert human_bytes(3_500_000_000) == "3.5 GB"


def test_human_bytes_of_a_count_no_float_holds_is_still_one_short_line() -> None:
    assert human_bytes(10**15) == "1000.0 TB"
    assert human_bytes(10**400) == "1.0e+388 TB"


# --- wait_for_reports with a fake clock over a real directory --------------------------------------


def test_wait_times_out_naming_every_file_state(tmp_path: Path) -> None:
    (tmp_path / "rank0.nsys-rep").write_bytes(b"x" * 2000)
    (tmp_path / "rank1.nsys-rep").write_bytes(b"")
    (tmp_path / "rank2.qdstrm").write_bytes(b"stream")
    clock = FakeClock()
    said: list[str] = []
    result = wait_for_reports(
        str(tmp_path),
        expect=3,
        settle_seconds=5,
        timeout_seconds=30,
        clock=clock,
        sleep=clock.sleep,
        say=said.append,
    )
    assert not result.ok
    assert result.settled == [str(tmp_path / "rank0.nsys-rep")]
    assert "rank0.nsys-rep: settled (2.0 kB)" in result.lines
    assert any(line.startswith("rank1.nsys-rep: 0 bytes") for line in result.lines)
    assert "rank2.qdstrm still present" in result.lines
    assert "1/3 settled" in result.summary and ".qdstrm left" in result.summary
    assert any("1/3 settled" in line and "waited" in line for line in said)  # progress was reported


def fake_wait(directory: Path, expect: int, timeout: float) -> WaitResult:
    """wait_for_reports on a fake clock (settle window 5 s), silent."""
    clock = FakeClock()
    return wait_for_reports(
        str(directory), expect=expect, settle_seconds=5, timeout_seconds=timeout, clock=clock,
        sleep=clock.sleep, say=lambda _: None,
    )  # fmt: skip


def test_a_report_that_stays_empty_after_nsys_finished_ends_the_wait_without_the_timeout(
    tmp_path: Path,
) -> None:
    # nsys has finished with both (no .qdstrm) and rank1's conversion failed: nothing more will
    # come, so the wait says so after the settle window, not after the 600 s timeout.
    (tmp_path / "rank0.nsys-rep").write_bytes(b"x" * 2000)
    (tmp_path / "rank1.nsys-rep").write_bytes(b"")
    result = fake_wait(tmp_path, expect=2, timeout=600)
    assert not result.ok
    assert 5 <= result.waited < 10
    assert result.summary == (
        "reports: 1 of 2 stayed empty after nsys finished writing (rank1.nsys-rep); "
        "not waiting for the timeout"
    )
    assert result.files[str(tmp_path / "rank1.nsys-rep")] == (0, "empty")
    # While a .qdstrm is left, or a report is missing, it is not over.
    (tmp_path / "rank2.qdstrm").write_bytes(b"stream")
    held = fake_wait(tmp_path, expect=2, timeout=30)
    assert held.waited >= 30
    (tmp_path / "rank2.qdstrm").unlink()
    missing = fake_wait(tmp_path, expect=3, timeout=30)
    assert missing.waited >= 30


def test_wait_for_a_directory_that_never_appears_times_out(tmp_path: Path) -> None:
    clock = FakeClock()
    result = wait_for_reports(
        str(tmp_path / "late"), timeout_seconds=10, clock=clock, sleep=clock.sleep, say=lambda m: None
    )
    assert not result.ok
    assert "did not appear within 10 s" in result.summary


def test_scan_matches_names_and_finds_qdstrm_only_where_asked(tmp_path: Path) -> None:
    (tmp_path / "a.nsys-rep").write_bytes(b"1")
    (tmp_path / "notes.txt").write_bytes(b"1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.nsys-rep").write_bytes(b"22")
    (tmp_path / "sub" / "b.qdstrm").write_bytes(b"")
    flat = scan(str(tmp_path), "*.nsys-rep", recursive=False)
    deep = scan(str(tmp_path), "*.nsys-rep", recursive=True)
    assert flat == ({str(tmp_path / "a.nsys-rep"): 1}, [])
    assert deep is not None
    assert deep[0] == {str(tmp_path / "a.nsys-rep"): 1, str(tmp_path / "sub" / "b.nsys-rep"): 2}
    assert deep[1] == [str(tmp_path / "sub" / "b.qdstrm")]
    assert scan(str(tmp_path / "missing"), "*", recursive=False) is None


# --- the command, with real files and short settle windows -----------------------------------------


def grow(path: Path, chunks: int, pause: float, start_delay: float = 0.0) -> threading.Thread:
    """Like nsys at session end: create the report empty, then append to it for a while."""

    def run() -> None:
        time.sleep(start_delay)
        path.write_bytes(b"")
        for _ in range(chunks):
            time.sleep(pause)
            with open(path, "ab") as handle:
                handle.write(b"\0" * 65536)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def invoke(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(cli, ["wait", *args])


def wait_cli(directory: Path, *extra: str, settle: str, timeout: str, poll: str = "0.1"):  # noqa: ANN201
    """`slurm-multi reports wait DIR` with short windows (seconds as strings, as typed)."""
    windows = ["--settle-seconds", settle, "--timeout-seconds", timeout, "--poll-seconds", poll]
    return invoke(str(directory), *extra, *windows)


def test_cli_waits_until_a_growing_report_stops_growing(tmp_path: Path) -> None:
    report = tmp_path / "rank0.nsys-rep"
    writer = grow(report, chunks=6, pause=0.25)
    started = time.monotonic()
    result = wait_cli(tmp_path, settle="0.8", timeout="20")
    elapsed = time.monotonic() - started
    writer.join()
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(report)
    assert report.stat().st_size == 6 * 65536  # it was complete when the wait ended
    assert elapsed >= 6 * 0.25 + 0.8 - 0.3


def test_cli_waits_for_a_directory_created_late(tmp_path: Path) -> None:
    late = tmp_path / "direct"

    def create() -> None:
        time.sleep(0.4)
        late.mkdir()
        (late / "x.nsys-rep").write_bytes(b"report")

    threading.Thread(target=create, daemon=True).start()
    result = wait_cli(late, settle="0.3", timeout="10")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(late / "x.nsys-rep")


def test_cli_times_out_with_exit_3_while_a_qdstrm_is_left(tmp_path: Path) -> None:
    (tmp_path / "rank0.nsys-rep").write_bytes(b"")
    (tmp_path / "rank0.qdstrm").write_bytes(b"stream")
    result = wait_cli(tmp_path, settle="0.1", timeout="0.5")
    assert result.exit_code == EXIT_TIMEOUT
    assert "rank0.nsys-rep: 0 bytes" in result.stderr
    assert "rank0.qdstrm still present" in result.stderr
    assert "timed out after 0.5 s" in result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_cli_counts_reports_on_top_of_the_baseline(tmp_path: Path) -> None:
    for i in range(2):
        (tmp_path / f"old{i}.nsys-rep").write_bytes(b"old")
    result = wait_cli(tmp_path, "--baseline", "2", "--expect", "1", settle="0.1", timeout="0.6")
    assert result.exit_code == EXIT_TIMEOUT
    assert "2/3 settled" in result.stderr
    writer = grow(tmp_path / "new.nsys-rep", chunks=2, pause=0.1)
    result = wait_cli(tmp_path, "--baseline", "2", "--expect", "1", settle="0.3", timeout="10")
    writer.join()
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 3


def test_cli_custom_pattern_and_recursive(tmp_path: Path) -> None:
    (tmp_path / "rescued").mkdir()
    (tmp_path / "rescued" / "r.sqlite").write_bytes(b"data")
    flat = wait_cli(tmp_path, "--pattern", "*.sqlite", settle="0", timeout="0.3")
    deep = wait_cli(tmp_path, "--pattern", "*.sqlite", "--recursive", settle="0", timeout="5")
    assert flat.exit_code == EXIT_TIMEOUT
    assert deep.exit_code == 0, deep.output
    assert deep.stdout.strip() == os.path.join(str(tmp_path), "rescued", "r.sqlite")


@pytest.mark.parametrize(
    "args",
    [["--expect", "-1"], ["--settle-seconds", "soon"], ["--poll-seconds", "0"], ["--timeout-seconds", "-5"]],
)
def test_cli_rejects_bad_options_as_usage_errors(tmp_path: Path, args: list[str]) -> None:
    result = invoke(str(tmp_path), *args)
    assert result.exit_code == EXIT_USAGE
    assert "Traceback" not in result.output


def test_cli_rejects_a_file_given_as_the_directory(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    result = invoke(str(target), "--timeout-seconds", "1")
    assert result.exit_code == EXIT_USAGE
    assert "Traceback" not in result.output


# --- a baseline snapshot taken before the job: old reports never count ----------------------------


def old_report(path: Path, size: int = 4096, age_seconds: float = 3600) -> None:
    """A settled report an earlier job left behind (an hour old by its mtime)."""
    path.write_bytes(b"\0" * size)
    past = time.time() - age_seconds
    os.utime(path, (past, past))


def snapshot_cli(out: Path, *directories: Path, extra: tuple[str, ...] = ()):  # noqa: ANN201
    return CliRunner().invoke(cli, ["snapshot", *map(str, directories), "--out", str(out), *extra])


def test_two_stale_reports_do_not_satisfy_expect_2(tmp_path: Path) -> None:
    reports = tmp_path / "profile"
    reports.mkdir()
    old_report(reports / "4100_node1_rank0.nsys-rep")
    old_report(reports / "4100_node2_rank1.nsys-rep")
    baseline = tmp_path / "baseline.json"
    taken = snapshot_cli(baseline, reports)
    assert taken.exit_code == 0, taken.output
    assert "snapshot: 2 file(s) in" in taken.stderr
    result = wait_cli(reports, "--expect", "2", "--since-file", str(baseline), settle="0.1", timeout="0.6")
    assert result.exit_code == EXIT_TIMEOUT, result.output
    assert "0/2 settled" in result.stderr
    assert "2 unchanged since before the job, not counted" in result.stderr
    assert result.stdout == ""
    # The same directory without the baseline: the old reports satisfy it (the bug this fixes).
    assert wait_cli(reports, "--expect", "2", settle="0.1", timeout="5").exit_code == 0


def test_a_stale_report_rewritten_during_the_job_counts(tmp_path: Path) -> None:
    # A requeued job keeps its job id, so its reports keep their names: rewritten in place.
    report = tmp_path / "4242_node1_rank0.nsys-rep"
    old_report(report, size=4096)
    baseline = tmp_path / "baseline.json"
    assert snapshot_cli(baseline, tmp_path).exit_code == 0
    unchanged = wait_cli(tmp_path, "--since-file", str(baseline), settle="0.1", timeout="0.5")
    assert unchanged.exit_code == EXIT_TIMEOUT
    writer = grow(report, chunks=3, pause=0.1)  # truncated, then rewritten by the new session
    result = wait_cli(tmp_path, "--since-file", str(baseline), settle="0.4", timeout="10")
    writer.join()
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(report)
    assert report.stat().st_size == 3 * 65536


def test_a_stale_report_rewritten_with_the_same_size_counts(tmp_path: Path) -> None:
    report = tmp_path / "r.nsys-rep"
    old_report(report, size=100)
    before = take_snapshot([str(tmp_path)], "*.nsys-rep", recursive=False)
    report.write_bytes(b"\1" * 100)  # same size, same inode, new mtime
    assert scan(str(tmp_path), "*.nsys-rep", False, before) == ({str(report): 100}, [])
    replaced = tmp_path / "r.tmp"
    replaced.write_bytes(b"\2" * 100)
    stat = report.stat()
    os.utime(replaced, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replaced, report)  # same size and mtime, but a new inode
    assert scan(str(tmp_path), "*.nsys-rep", False, before) == ({str(report): 100}, [])


def test_one_new_report_and_one_stale_count_one(tmp_path: Path) -> None:
    old_report(tmp_path / "4100_node1_rank0.nsys-rep")
    baseline = tmp_path / "baseline.json"
    assert snapshot_cli(baseline, tmp_path).exit_code == 0
    new = tmp_path / "4242_node1_rank0.nsys-rep"
    new.write_bytes(b"\0" * 4096)
    count = CliRunner().invoke(cli, ["count", str(tmp_path), "--since-file", str(baseline)])
    assert count.exit_code == 0, count.output
    assert count.stdout.strip() == "1"
    assert CliRunner().invoke(cli, ["count", str(tmp_path)]).stdout.strip() == "2"
    result = wait_cli(tmp_path, "--expect", "2", "--since-file", str(baseline), settle="0.1", timeout="0.6")
    assert result.exit_code == EXIT_TIMEOUT
    assert "1/2 settled" in result.stderr
    assert result.stdout.strip() == str(new)  # what did settle is still printed
    result = wait_cli(tmp_path, "--expect", "1", "--since-file", str(baseline), settle="0.1", timeout="5")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(new)


def test_a_stale_qdstrm_no_longer_holds_the_wait(tmp_path: Path) -> None:
    # An earlier job was SIGKILLed mid-write and left its raw stream behind.
    (tmp_path / "4100_node1_rank0.qdstrm").write_bytes(b"stream")
    baseline = tmp_path / "baseline.json"
    assert snapshot_cli(baseline, tmp_path).exit_code == 0
    (tmp_path / "4242_node1_rank0.nsys-rep").write_bytes(b"\0" * 4096)
    assert wait_cli(tmp_path, settle="0.1", timeout="0.5").exit_code == EXIT_TIMEOUT
    result = wait_cli(tmp_path, "--since-file", str(baseline), settle="0.1", timeout="5")
    assert result.exit_code == 0, result.output
    # ... while a .qdstrm of THIS job still does.
    (tmp_path / "4242_node2_rank1.qdstrm").write_bytes(b"stream")
    held = wait_cli(tmp_path, "--since-file", str(baseline), settle="0.1", timeout="0.5")
    assert held.exit_code == EXIT_TIMEOUT
    assert "4242_node2_rank1.qdstrm still present" in held.stderr


def test_the_snapshot_names_files_by_real_path_so_any_spelling_of_the_directory_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "real").mkdir()
    old_report(tmp_path / "real" / "old.nsys-rep")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    baseline = tmp_path / "baseline.json"
    assert snapshot_cli(baseline, tmp_path / "link", tmp_path / "missing").exit_code == 0
    document = json.loads(baseline.read_text())
    assert list(document["files"]) == [os.path.realpath(tmp_path / "real" / "old.nsys-rep")]
    assert set(document["files"][list(document["files"])[0]]) == {"size", "mtime_ns", "inode"}
    monkeypatch.chdir(tmp_path)
    assert scan("real", "*.nsys-rep", False, read_snapshot(str(baseline))) == ({}, [])


def test_snapshot_round_trip_and_a_missing_directory_is_empty(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    old_report(tmp_path / "d" / "a.nsys-rep", size=7)
    (tmp_path / "d" / "notes.txt").write_text("x")
    taken = take_snapshot([str(tmp_path / "d"), str(tmp_path / "later")], "*.nsys-rep", recursive=False)
    write_snapshot(taken, str(tmp_path / "s.json"), [str(tmp_path / "d")], "*.nsys-rep")
    assert read_snapshot(str(tmp_path / "s.json")).files == taken.files
    assert [os.path.basename(p) for p in taken.files] == ["a.nsys-rep"]
    assert not list(tmp_path.glob("s.json.tmp*"))


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("{not json", "is not JSON"),
        ('{"files": {}}', "is not a report snapshot"),
        ('{"kind": "slurm-multi reports snapshot", "version": 9, "files": {}}', "snapshot version 9"),
        ('{"kind": "slurm-multi reports snapshot", "version": 1, "files": {"x": {"size": 1}}}', "malformed"),
        ("[" * 100_000 + "]" * 100_000, "is not JSON (maximum recursion depth exceeded"),  # RecursionError
        (
            '{"kind": "slurm-multi reports snapshot", "version": 1, '
            '"files": {"x": {"size": Infinity, "mtime_ns": 1, "inode": 1}}}',
            "entry 'x' is malformed",  # int(inf): OverflowError
        ),
    ],
)
def test_a_bad_since_file_is_a_one_line_usage_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    since = tmp_path / "baseline.json"
    if content is not None:
        since.write_text(content)
    for args in (
        ["wait", str(tmp_path), "--since-file", str(since), "--timeout-seconds", "1"],
        ["count", str(tmp_path), "--since-file", str(since)],
    ):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == EXIT_USAGE, result.output
        assert message in result.stderr
        assert "reports snapshot DIR --out" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert "Traceback" not in result.output


def test_a_state_file_that_is_a_directory_is_refused_before_the_wait(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    result = wait_cli(
        tmp_path, "--expect", "0", "--state-file", str(tmp_path / "state"), settle="0", timeout="1"
    )
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--state-file" in result.stderr and "is a directory" in result.stderr
    assert "waiting for" not in result.stderr  # refused before the wait began


def test_a_state_file_that_cannot_be_written_is_one_line_and_a_failure(tmp_path: Path) -> None:
    state = tmp_path / "missing" / "state.json"
    result = wait_cli(tmp_path, "--expect", "0", "--state-file", str(state), settle="0", timeout="1")
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.strip().splitlines()[-1] == (
        f"slurm-multi: reports: cannot write the --state-file {state}: No such file or directory; "
        "check the directory"
    )


def test_snapshot_of_a_file_instead_of_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    result = snapshot_cli(tmp_path / "s.json", tmp_path / "file")
    assert result.exit_code == EXIT_USAGE
    assert "Traceback" not in result.output
