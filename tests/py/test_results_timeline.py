"""results collect: the timeline, where the job's time went.

Every node appends events to node_<rank>/events.log (lib/timeline.sh; older job directories have
events.jsonl, one JSON object per line, and are read the same); collect writes
timeline.json, timeline.txt and (with matplotlib) timeline.png, and puts a `time:` line in the
printed summary and summary.json. Every test reads real job directories built in tmp_path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.events import format_event, parse_event
from slurm_multi.results import collect, timelinedraw

REPO = Path(__file__).resolve().parents[2]
T0 = 1_764_500_000.0  # 2025-11-30T10:53:20Z, the first event of the jobs below
FULL_CSV = "model,performance,metric\ntoy,100.5,samples_per_second\n"

# The 3-node job of docs/results.md: rank 0 builds and saves the image into the cache (20-60 s),
# releases it at 60.5 s; the workers load it; rank 1 is the last to reach the barrier (63 s) and the
# last to finish (96.5 s).
PLANS = {
    0: [("prepare", 0, 1), ("image", 1, 61), ("barrier", 61, 64), ("run", 64, 94),
        ("save-outputs", 94, 94.5)],
    1: [("prepare", 0, 1.2), ("image", 1.2, 63), ("barrier", 63, 64), ("run", 64, 96),
        ("save-outputs", 96, 96.5)],
    2: [("prepare", 0, 1.1), ("image", 1.1, 62), ("barrier", 62, 64), ("run", 64, 95),
        ("save-outputs", 95, 95.2)],
}  # fmt: skip
STEPS = {
    0: [("image_save", 20, 60), ("release", 60.5, None)],
    1: [("image_load", 60.6, 62.5)],
    2: [("image_load", 60.6, 61.9)],
}


# ----------------------------------------------------------------------------- helpers


def event(t: float, name: str, rank: int = 0, **keys: Any) -> str:
    """One line of events.log, as lib/timeline.sh writes it."""
    return format_event(name, T0 + t, rank=rank, host=f"node{rank + 1}", **keys)


def json_event(t: float, name: str, rank: int = 0, **keys: Any) -> str:
    """One line of an older job directory's events.jsonl."""
    return json.dumps({"t": T0 + t, "event": name, "rank": rank, "host": f"node{rank + 1}", **keys})


def plan_events(
    rank: int, plan: list[tuple[str, float, float]], steps: list[Any] = (), as_line: Any = event
) -> list[str]:
    """The node's lines (events.log's form; `as_line=json_event`: an older events.jsonl's)."""
    event = as_line
    lines = []
    for stage, start, end in plan:
        lines.append(event(start, "stage_start", rank, stage=stage))
        lines.append(event(end, "stage_end", rank, stage=stage, status="ok"))
    for name, start, end in steps:
        if end is None:
            lines.append(event(start, name, rank))
        else:
            lines += [event(start, f"{name}_start", rank), event(end, f"{name}_end", rank)]
    run = next((start, end) for stage, start, end in plan if stage == "run") if plan else None
    if run:
        lines += [event(run[0], "go", rank), event(run[0] + 0.2, "container_start", rank)]
        lines += [event(run[0] + 2, "first_output", rank), event(run[1], "exit", rank, code=0)]
    return lines


def status_of(rank: int, plan: list[tuple[str, float, float]]) -> dict[str, Any]:
    stages = {stage: {"seconds": round(end - start, 2), "status": "ok"} for stage, start, end in plan}
    node = f"node{rank + 1}"
    return {"rank": rank, "node": node, "exit_code": 0, "status": "ok", "reason": "", "stages": stages}


def make_job(
    root: Path,
    plans: dict[int, list[tuple[str, float, float]]],
    events: dict[int, list[str] | str | bytes | None] | None = None,
    job: dict[str, Any] | None = None,
    events_file: str = "events.log",
) -> Path:
    """A successful job directory: status.json from the plans; events.log (or `events_file`) as
    given (a list of lines, raw text/bytes, or None for none); by default every node's events from
    its plan."""
    root.mkdir(parents=True)
    meta = {"job_id": "57", "model": "toy_model", "nnodes": len(plans), "results_csv": "perf_toy.csv"}
    meta["nodes"] = [f"node{rank + 1}" for rank in plans]
    (root / "job.json").write_text(json.dumps({**meta, **(job or {})}))
    for rank, plan in plans.items():
        node_dir = root / f"node_{rank}"
        node_dir.mkdir()
        (node_dir / "status.json").write_text(json.dumps(status_of(rank, plan)))
        (node_dir / "node.log").write_text("done\n")
        lines = plan_events(rank, plan, STEPS.get(rank, [])) if events is None else events.get(rank)
        if isinstance(lines, list):
            (node_dir / events_file).write_text("".join(line + "\n" for line in lines))
        elif isinstance(lines, str):
            (node_dir / events_file).write_text(lines)
        elif isinstance(lines, bytes):
            (node_dir / events_file).write_bytes(lines)
    (root / f"node_{max(plans)}" / "perf_toy.csv").write_text(FULL_CSV)
    return root


def read_timeline(jobdir: Path) -> dict[str, Any]:
    return json.loads((jobdir / "timeline.json").read_text())


def path_of(timeline: dict[str, Any]) -> list[tuple[int, str, float, float]]:
    return [(s["rank"], s["stage"], s["start"], s["end"]) for s in timeline["critical_path"]["segments"]]


def run_collect(jobdir: Path) -> Any:
    return CliRunner().invoke(group, ["results", "collect", str(jobdir)])


# ----------------------------------------------------------------------------- events of 3 nodes


def test_three_nodes_with_events_give_lanes_the_critical_path_and_the_shares(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", PLANS)
    result = run_collect(jobdir)
    assert result.exit_code == 0, result.output
    timeline = read_timeline(jobdir)
    assert timeline["job_start"] == T0 and timeline["job_start_utc"] == "2025-11-30T10:53:20Z"
    assert timeline["wall_seconds"] == 96.5 and timeline["approximate"] is False
    lane = timeline["nodes"][1]
    assert (lane["rank"], lane["node"], lane["source"], lane["approximate"]) == (1, "node2", "events", False)
    assert [(s["stage"], s["start"], s["end"], s["status"]) for s in lane["stages"]] == [
        ("prepare", 0.0, 1.2, "ok"), ("image", 1.2, 63.0, "ok"), ("barrier", 63.0, 64.0, "ok"),
        ("run", 64.0, 96.0, "ok"), ("save-outputs", 96.0, 96.5, "ok"),
    ]  # fmt: skip
    assert lane["stages"][1]["seconds"] == 61.8
    assert lane["steps"] == [{"step": "image_load", "start": 60.6, "end": 62.5, "seconds": 1.9}]
    assert [(e["event"], e["t"]) for e in lane["events"]] == [
        ("go", 64.0), ("container_start", 64.2), ("first_output", 66.0), ("exit", 96.0)
    ]  # fmt: skip
    assert lane["events"][-1]["code"] == 0
    assert [(e["event"], e["t"]) for e in timeline["nodes"][0]["events"]][0] == ("release", 60.5)
    # rank 0 until its release, rank 1's image from there (it arrived last), rank 1 to the end
    assert path_of(timeline) == [
        (0, "prepare", 0.0, 1.0), (0, "image", 1.0, 60.5), (1, "image", 60.5, 63.0),
        (1, "barrier", 63.0, 64.0), (1, "run", 64.0, 96.0), (1, "save-outputs", 96.0, 96.5),
    ]  # fmt: skip
    shares = timeline["critical_path"]["shares"]
    assert [(s["stage"], s["seconds"], s["share"], s["dominant"]) for s in shares] == [
        ("prepare", 1.0, 0.0104, None), ("image", 62.0, 0.6425, "rank 0 save"),
        ("barrier", 1.0, 0.0104, None), ("run", 32.0, 0.3316, None), ("save-outputs", 0.5, 0.0052, None),
    ]  # fmt: skip
    text = "prepare 1%, image 64% (rank 0 save), barrier 1%, run 33%, save-outputs 1% of 96.5 s"
    assert timeline["critical_path"]["text"] == text
    summary = json.loads((jobdir / "summary.json").read_text())
    assert summary["time"] == text and summary["verdict"] == "SUCCESS"
    assert f"  time: {text}\n" in result.stderr
    assert f"  timeline: {jobdir / 'timeline.json'}, timeline.txt" in result.stderr


def test_the_path_stays_on_the_gate_when_its_image_did_not_wait_for_the_release(tmp_path: Path):
    plans = {rank: list(plan) for rank, plan in PLANS.items()}
    plans[1][0] = ("prepare", 0, 61)  # a slow prepare: its image starts after rank 0's release
    plans[1][1] = ("image", 61, 63)
    jobdir = make_job(tmp_path / "57", plans)
    collect(jobdir)
    assert path_of(read_timeline(jobdir))[:3] == [
        (1, "prepare", 0.0, 61.0), (1, "image", 61.0, 63.0), (1, "barrier", 63.0, 64.0)
    ]  # fmt: skip


def test_the_barrier_on_the_path_starts_when_the_last_node_arrived(tmp_path: Path):
    plans = {rank: list(plan) for rank, plan in PLANS.items()}
    plans[2][3:] = [("run", 64, 99), ("save-outputs", 99, 99.5)]  # rank 2 ends last, rank 1 arrived last
    jobdir = make_job(tmp_path / "57", plans)
    collect(jobdir)
    assert path_of(read_timeline(jobdir))[2:] == [
        (1, "image", 60.5, 63.0), (2, "barrier", 63.0, 64.0), (2, "run", 64.0, 99.0),
        (2, "save-outputs", 99.0, 99.5),
    ]  # fmt: skip


def test_one_node_without_a_barrier_its_stages_are_the_path(tmp_path: Path):
    plan = [("prepare", 0, 0.5), ("image", 0.5, 2.5), ("run", 2.5, 10.5), ("save-outputs", 10.5, 11)]
    events = {0: plan_events(0, plan, [("image_load", 0.6, 2.4)])}
    jobdir = make_job(tmp_path / "57", {0: plan}, events=events)
    summary = collect(jobdir)
    assert [(s[1], s[2], s[3]) for s in path_of(read_timeline(jobdir))] == [(n, a, b) for n, a, b in plan]
    assert summary.timeline is not None
    assert summary.timeline.text == "prepare 5%, image 18% (rank 0 load), run 73%, save-outputs 5% of 11 s"


def test_a_stage_that_never_ended_is_unfinished_at_the_nodes_last_event(tmp_path: Path):
    plan = [("prepare", 0, 1), ("image", 1, 3), ("barrier", 3, 4), ("run", 4, 9)]
    lines = plan_events(0, plan)
    lines = [line for line in lines if " stage_end " not in line or "stage=run" not in line]  # killed in run
    jobdir = make_job(tmp_path / "57", {0: plan}, events={0: lines})
    collect(jobdir)
    run = read_timeline(jobdir)["nodes"][0]["stages"][-1]
    assert (run["stage"], run["start"], run["end"], run["status"]) == ("run", 4.0, 9.0, "unfinished")


# ----------------------------------------------------------------------------- status.json only


def test_without_events_the_lanes_are_status_seconds_end_to_end_from_job_json_started(tmp_path: Path):
    events: dict[int, Any] = {rank: None for rank in PLANS}
    jobdir = make_job(tmp_path / "57", PLANS, events=events, job={"started": "2025-11-30T10:53:19Z"})
    result = run_collect(jobdir)
    assert result.exit_code == 0, result.output
    timeline = read_timeline(jobdir)
    assert timeline["job_start"] == T0 - 1 and timeline["approximate"] is True
    lane = timeline["nodes"][2]
    assert (lane["source"], lane["approximate"], lane["events"], lane["steps"]) == ("status", True, [], [])
    assert [(s["stage"], s["start"], s["end"]) for s in lane["stages"]] == [
        ("prepare", 0.0, 1.1), ("image", 1.1, 62.0), ("barrier", 62.0, 64.0), ("run", 64.0, 95.0),
        ("save-outputs", 95.0, 95.2),
    ]  # fmt: skip
    assert timeline["wall_seconds"] == 96.5
    # no release event: the gate's own stages before the barrier
    assert path_of(timeline)[:3] == [
        (1, "prepare", 0.0, 1.2), (1, "image", 1.2, 63.0), (1, "barrier", 63.0, 64.0)
    ]  # fmt: skip
    text = read_timeline(jobdir)["critical_path"]["text"]
    assert text.endswith(" of 96.5 s (approximate: from status.json stage times)")
    assert json.loads((jobdir / "summary.json").read_text())["time"] == text


def test_without_events_and_without_a_start_time_the_times_are_relative(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", {0: PLANS[0]}, events={0: None})
    collect(jobdir)
    timeline = read_timeline(jobdir)
    assert (timeline["job_start"], timeline["job_start_utc"], timeline["wall_seconds"]) == (None, None, 94.5)


def test_a_node_without_events_among_nodes_with_events_is_laid_from_the_first_event(tmp_path: Path):
    events = {0: plan_events(0, PLANS[0], STEPS[0]), 1: None, 2: plan_events(2, PLANS[2], STEPS[2])}
    jobdir = make_job(tmp_path / "57", PLANS, events=events)
    collect(jobdir)
    timeline = read_timeline(jobdir)
    assert timeline["job_start"] == T0 and timeline["approximate"] is True
    assert [lane["source"] for lane in timeline["nodes"]] == ["events", "status", "events"]
    assert timeline["nodes"][1]["stages"][0]["start"] == 0.0


def test_a_job_with_no_stage_times_has_an_empty_path_and_no_time_line(tmp_path: Path):
    root = tmp_path / "57"
    root.mkdir()
    (root / "job.json").write_text(json.dumps({"job_id": "57", "model": "m", "nnodes": 2}))
    result = run_collect(root)
    assert result.exit_code == 1
    timeline = read_timeline(root)
    assert [lane["source"] for lane in timeline["nodes"]] == ["none", "none"]
    assert timeline["critical_path"] == {"segments": [], "shares": [], "text": None}
    assert json.loads((root / "summary.json").read_text())["time"] is None
    assert "  time:" not in result.stderr


# ----------------------------------------------------------------------------- what a node left


def test_torn_and_garbage_lines_are_skipped_and_counted_in_one_warning(tmp_path: Path):
    good = plan_events(1, PLANS[1])
    bad = [
        "not an event at all",
        "[1, 2, 3]",
        "go rank=1",  # no time
        "soon go",
        "nan go",
        f"{T0} go rank=1 stray",  # a field that is not KEY=VALUE
        f"{T0} go =1",  # no key
        f"{T0}",  # no event
        f"{T0} %20 rank=1",  # a blank name
        "-5 go",  # before 1970
        json.dumps({"event": "go"}),  # the old JSON form: no time
        json.dumps({"t": "soon", "event": "go"}),
        '{"t": NaN, "event": "go"}',
        json.dumps({"t": T0, "event": ""}),
        json.dumps({"t": True, "event": "go"}),
    ]
    raw = "\n".join(good[:4] + bad + good[4:]).encode() + b"\n\xff\xfe\x00 binary\n"
    events = {0: plan_events(0, PLANS[0], STEPS[0]), 1: raw, 2: plan_events(2, PLANS[2], STEPS[2])}
    jobdir = make_job(tmp_path / "57", PLANS, events=events)
    result = run_collect(jobdir)
    assert result.exit_code == 0, result.output
    warnings = json.loads((jobdir / "summary.json").read_text())["warnings"]
    assert warnings == ["node_1/events.log: 16 lines skipped (not events)"]
    assert "warning: node_1/events.log: 16 lines skipped" in result.stderr
    lane = read_timeline(jobdir)["nodes"][1]
    assert [s["stage"] for s in lane["stages"]] == ["prepare", "image", "barrier", "run", "save-outputs"]


def test_a_torn_last_line_is_named_as_such(tmp_path: Path):
    # Cut after `stage=`: it would read as an event with an empty stage; without its line end it is none.
    torn = event(99.1, "stage_start", 0, stage="run")
    lines = "".join(line + "\n" for line in plan_events(0, PLANS[0])) + torn[: torn.index("stage=") + 6]
    jobdir = make_job(tmp_path / "57", {0: PLANS[0]}, events={0: lines})
    summary = collect(jobdir)
    assert summary.warnings == ["node_0/events.log: 1 line skipped (the last one torn (no line end))"]
    assert read_timeline(jobdir)["nodes"][0]["stages"][-1]["stage"] == "save-outputs"


def test_a_torn_last_line_of_an_old_events_jsonl_is_named_as_such(tmp_path: Path):
    lines = "".join(line + "\n" for line in plan_events(0, PLANS[0], as_line=json_event))
    jobdir = make_job(tmp_path / "57", {0: PLANS[0]}, events={0: lines + '{"t": 1764500099.1, "ev'},
                      events_file="events.jsonl")  # fmt: skip
    summary = collect(jobdir)
    assert summary.warnings == ["node_0/events.jsonl: 1 line skipped (the last one torn (no line end))"]
    assert read_timeline(jobdir)["nodes"][0]["stages"][-1]["stage"] == "save-outputs"


def test_an_old_job_directorys_events_jsonl_gives_the_same_timeline(tmp_path: Path):
    new = make_job(tmp_path / "new" / "57", PLANS)
    old_events = {rank: plan_events(rank, PLANS[rank], STEPS[rank], as_line=json_event) for rank in PLANS}
    old = make_job(tmp_path / "old" / "57", PLANS, events=old_events, events_file="events.jsonl")
    assert not list(old.glob("node_*/events.log"))
    assert (collect(new).warnings, collect(old).warnings) == ([], [])
    assert read_timeline(old) == read_timeline(new)
    assert read_timeline(old)["nodes"][0]["source"] == "events"
    # A job directory with both (never written so): events.log is the node's events.
    (new / "node_0" / "events.jsonl").write_text(json_event(0, "stage_start", 0, stage="other") + "\n")
    collect(new)
    assert read_timeline(new) == read_timeline(old)


def test_an_unreadable_events_file_is_a_warning_and_the_lane_comes_from_status_json(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", {0: PLANS[0], 1: PLANS[1]}, events={0: plan_events(0, PLANS[0])})
    (jobdir / "node_1" / "events.log").mkdir()  # a directory: EISDIR
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS"
    assert len(summary.warnings) == 1 and summary.warnings[0].startswith("node_1/events.log: unreadable (")
    assert [lane["source"] for lane in read_timeline(jobdir)["nodes"]] == ["events", "status"]


def test_an_empty_events_file_is_no_events(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", {0: PLANS[0]}, events={0: ""})
    summary = collect(jobdir)
    assert summary.warnings == [] and read_timeline(jobdir)["nodes"][0]["source"] == "status"


def test_parse_event_types_the_values_and_drops_the_nodes_own_keys():
    line = event(0, "image_stream_end", 3, bytes=12, why="x" * 300, note="a b%c\nd", neg=-3, sci="1e9",
                 lead="007", ok=True)  # fmt: skip
    assert line.count(" ") == 10 and "\n" not in line  # time, name, 9 fields: none broke a field or the line
    assert parse_event(line.encode()) == {
        "t": T0, "event": "image_stream_end", "bytes": 12, "why": "x" * 197 + "...", "note": "a b%c\\x0ad",
        "neg": -3, "sci": 1e9, "lead": "007", "ok": "true",
    }  # fmt: skip
    assert parse_event(b"1764500000 x big=1e999") == {"t": T0, "event": "x"}  # not finite: left out
    assert parse_event(b"1e300 x") is None  # past year 9999
    assert parse_event(b"-5 x") is None


def test_parse_event_of_an_old_json_line_keeps_plain_values_and_drops_the_rest():
    line = {"t": T0, "event": "image_stream_end", "rank": 3, "host": "n4", "bytes": 12, "ok": True,
            "why": "x" * 300, "list": [1], "obj": {"a": 1}, "none": None}  # fmt: skip
    parsed = parse_event(json.dumps(line).encode())
    assert parsed is not None
    assert parsed == {
        "t": T0, "event": "image_stream_end", "bytes": 12, "ok": True, "why": "x" * 197 + "...", "none": None
    }  # fmt: skip
    assert parse_event(b'{"t": 1764500000, "event": "x", "big": Infinity}') == {"t": T0, "event": "x"}
    assert parse_event(b'{"t": 1e300, "event": "x"}') is None  # past year 9999
    assert parse_event(b'{"t": -5, "event": "x"}') is None


def test_events_written_by_lib_timeline_sh_are_read_back_by_collect(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", {0: PLANS[0]}, events={0: None})
    script = f"""
    source {REPO / "lib" / "timeline.sh"}
    export SM_NODE_DIR={jobdir / "node_0"} SM_RANK=0
    timeline::event stage_start stage=prepare
    timeline::event stage_end stage=prepare status=ok
    timeline::event stage_start stage=image
    timeline::event image_stream_start
    timeline::event image_stream_end bytes=1048576 'note=a "quoted" \\\\ value'
    timeline::event stage_end stage=image status=failed
    timeline::event exit code=3
    """
    subprocess.run(["bash", "-c", script], check=True)
    collect(jobdir)
    lane = read_timeline(jobdir)["nodes"][0]
    assert lane["source"] == "events"
    assert [(s["stage"], s["status"]) for s in lane["stages"]] == [("prepare", "ok"), ("image", "failed")]
    assert [s["step"] for s in lane["steps"]] == ["image_stream"]
    assert [(e["event"], e.get("code")) for e in lane["events"]] == [("exit", 3)]


# ----------------------------------------------------------------------------- stragglers


@pytest.mark.parametrize(
    "image_seconds, flagged",
    [
        ([10.0, 10.0, 15.0], False),  # exactly 1.5x the median of the others: not over
        ([10.0, 10.0, 15.05], True),  # just over
        ([0.3, 0.3, 0.99], False),  # 3.3x and 0.69 s over, but under 1 s: noise
        ([0.3, 0.3, 1.0], True),
    ],
)
def test_a_straggler_took_over_1_5x_the_median_of_the_others_and_at_least_1_s(
    tmp_path: Path, image_seconds: list[float], flagged: bool
):
    plans = {
        rank: [("prepare", 0, 0.1), ("image", 0.1, 0.1 + took), ("barrier", 0.1 + took, 16), ("run", 16, 20)]
        for rank, took in enumerate(image_seconds)
    }
    jobdir = make_job(tmp_path / "57", plans)
    result = run_collect(jobdir)
    timeline = read_timeline(jobdir)
    images = [lane["stages"][1]["straggler"] for lane in timeline["nodes"]]
    assert images == [False, False, flagged]
    assert [(s["stage"], s["rank"]) for s in timeline["stragglers"]] == ([("image", 2)] if flagged else [])
    assert ("straggler: node3 (rank 2) image" in result.stderr) is flagged
    assert ("straggler (!): node3 (rank 2) image" in (jobdir / "timeline.txt").read_text()) is flagged


def test_a_long_barrier_wait_is_never_a_straggler(tmp_path: Path):
    plans = {
        0: [("prepare", 0, 1), ("image", 1, 3), ("barrier", 3, 30), ("run", 30, 40)],
        1: [("prepare", 0, 1), ("image", 1, 29), ("barrier", 29, 30), ("run", 30, 40)],
        2: [("prepare", 0, 1), ("image", 1, 3), ("barrier", 3, 30), ("run", 30, 40)],
    }
    jobdir = make_job(tmp_path / "57", plans)
    collect(jobdir)
    assert [(s["stage"], s["rank"]) for s in read_timeline(jobdir)["stragglers"]] == [("image", 1)]


# ----------------------------------------------------------------------------- the files


def test_the_png_is_drawn_when_matplotlib_is_installed(tmp_path: Path):
    pytest.importorskip("matplotlib")
    jobdir = make_job(tmp_path / "57", PLANS)
    result = run_collect(jobdir)
    png = (jobdir / "timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert f"  timeline: {jobdir / 'timeline.json'}, timeline.txt, timeline.png\n" in result.stderr
    collect(jobdir)  # the same job directory, the same picture
    assert (jobdir / "timeline.png").read_bytes() == png
    assert sorted(p.name for p in jobdir.iterdir() if p.name.startswith(".")) == []  # no temp files left


def test_without_matplotlib_timeline_txt_is_written_and_one_line_says_what_the_png_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` raises ImportError
    jobdir = make_job(tmp_path / "57", PLANS)
    result = run_collect(jobdir)
    assert result.exit_code == 0, result.output
    assert not (jobdir / "timeline.png").exists()
    assert (jobdir / "timeline.json").is_file()
    lines = [line for line in result.stderr.splitlines() if "needs matplotlib" in line]
    assert lines == [
        f"  timeline: {jobdir / 'timeline.json'}, timeline.txt; "
        "timeline.png needs matplotlib: pip install 'slurm-multi[timeline]'"
    ]
    text = (jobdir / "timeline.txt").read_text()
    assert text.splitlines()[:5] == [
        "timeline: job 57 (toy_model, 3 nodes): 96.5 s from 2025-11-30T10:53:20Z"
        " (seconds from the job start)",
        "  rank  node   source  prepare  image     barrier    run        save-outputs",
        "  0     node1  events  0.0-1.0  1.0-61.0  61.0-64.0  64.0-94.0  94.0-94.5",
        "  1     node2  events  0.0-1.2  1.2-63.0  63.0-64.0  64.0-96.0  96.0-96.5",
        "  2     node3  events  0.0-1.1  1.1-62.0  62.0-64.0  64.0-95.0  95.0-95.2",
    ]
    assert (
        "critical path: r0 prepare 0.0-1.0 > r0 image 1.0-60.5 > r1 image 60.5-63.0 > r1 barrier 63.0-64.0"
        " > r1 run 64.0-96.0 > r1 save-outputs 96.0-96.5"
    ) in text
    assert "time: prepare 1%, image 64% (rank 0 save), barrier 1%, run 33%, save-outputs 1% of 96.5 s" in text
    bars = [line for line in text.splitlines() if line.startswith("  r") and "|" in line]
    assert len(bars) == 3 and all(len(line) == len(bars[0]) for line in bars)
    assert bars[1].endswith("RRRR|") and "PIII" in bars[0]  # capitals: the critical path


def test_no_picture_draws_nothing_and_says_how_to_draw_it_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The batch step's collect: the verdict without matplotlib's import or the drawing.
    def never(*_: Any) -> bytes:
        raise AssertionError("drawn although --no-picture")

    monkeypatch.setattr(timelinedraw, "timeline_png", never)
    jobdir = make_job(tmp_path / "57", PLANS)
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir), "--no-picture"])
    assert result.exit_code == 0, result.output
    assert not (jobdir / "timeline.png").exists()
    assert (jobdir / "timeline.json").is_file() and (jobdir / "summary.json").is_file()
    later = f"timeline.png: bin/sm-collect {jobdir} draws it"
    assert f"  timeline: {jobdir / 'timeline.json'}, timeline.txt; {later}\n" in result.stderr


def test_more_nodes_than_the_png_can_show_get_no_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(timelinedraw, "MAX_PNG_LANES", 2)
    jobdir = make_job(tmp_path / "57", PLANS)
    result = run_collect(jobdir)
    assert not (jobdir / "timeline.png").exists()
    assert "timeline.png is not drawn for more than 2 nodes" in result.stderr


def test_a_picture_that_fails_to_draw_costs_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def broken(*_: Any) -> bytes:
        raise RuntimeError("no fonts")

    monkeypatch.setattr(timelinedraw, "timeline_png", broken)
    jobdir = make_job(tmp_path / "57", PLANS)
    result = run_collect(jobdir)
    assert result.exit_code == 0
    assert "timeline.png not drawn (RuntimeError: no fonts)" in result.stderr


def test_the_timeline_files_are_the_same_bytes_on_every_collect(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", PLANS)
    collect(jobdir)
    names = ("timeline.json", "timeline.txt", "summary.json")
    first = [(jobdir / name).read_bytes() for name in names]
    collect(jobdir)
    assert [(jobdir / name).read_bytes() for name in names] == first


def test_timeline_json_has_the_documented_keys(tmp_path: Path):
    jobdir = make_job(tmp_path / "57", PLANS)
    collect(jobdir)
    timeline = read_timeline(jobdir)
    assert list(timeline) == [
        "job_start", "job_start_utc", "wall_seconds", "approximate", "nodes", "critical_path", "stragglers"
    ]  # fmt: skip
    lane, path = timeline["nodes"][0], timeline["critical_path"]
    assert list(lane) == ["rank", "node", "source", "approximate", "stages", "steps", "events"]
    assert list(lane["stages"][0]) == ["stage", "start", "end", "seconds", "status", "straggler"]
    assert list(lane["steps"][0]) == ["step", "start", "end", "seconds"]
    assert list(path) == ["segments", "shares", "text"]
    assert list(path["segments"][0]) == ["rank", "node", "stage", "start", "end", "seconds"]
    assert list(path["shares"][0]) == ["stage", "seconds", "share", "dominant"]


def test_the_batch_steps_own_events_are_on_rank_0s_lane_from_their_own_file(tmp_path: Path):
    """<jobdir>/batch/events.log (the nsight-slurm flush, lib/profile-nsight.sh): node_0/events.log
    stays rank 0's task's alone, and the timeline shows the batch step's events on rank 0's lane."""
    jobdir = make_job(tmp_path / "57", {0: PLANS[0], 1: PLANS[1]},
                      events={r: plan_events(r, PLANS[r]) for r in (0, 1)})  # fmt: skip
    (jobdir / "batch").mkdir()
    (jobdir / "batch" / "events.log").write_text(
        event(96.6, "nsight_flush_start", reason="teardown") + "\n"
        + event(98.1, "nsight_flush_end", settled=1, expected=2) + "\n" + "torn"
    )  # fmt: skip
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS"
    assert summary.warnings == ["batch/events.log: 1 line skipped (the last one torn (no line end))"]
    lanes = read_timeline(jobdir)["nodes"]
    assert [(s["step"], s["start"], s["end"]) for s in lanes[0]["steps"]] == [("nsight_flush", 96.6, 98.1)]
    assert lanes[1]["steps"] == []
    assert [s["stage"] for s in lanes[0]["stages"]] == [p[0] for p in PLANS[0]]
