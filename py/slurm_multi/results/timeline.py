"""The job's timeline: where its wall time went, from every node's events.log (lib/timeline.sh writes
it, slurm_multi.events reads it, and an older job directory's events.jsonl too).

Each node appends one line per event (`stage_start`/`stage_end`, `image_load_start`, `release`,
`go`, ...). Collect reads them into one lane per node: stage intervals, sub-steps (any `X_start` /
`X_end` pair, e.g. `image_save`) and point events, in seconds from the job start (the earliest event
of any node). A node without events gets its lane from status.json's stage seconds, laid end to end
from the job start and marked approximate.

The critical path is the chain of stage intervals that decided when the job ended (docs/results.md,
"The timeline"):

1. the node that finished last (the latest end of any stage): its stages after the barrier;
2. the barrier, on that node, from the moment the last node arrived at it;
3. before that, the stages of the node that arrived at the barrier last (the gate); when the gate is
   a worker whose image stage was waiting for rank 0's `release`, rank 0's stages up to the release,
   then the gate's image stage from the release on.

Without a barrier (one node, or a job that failed before it), it is the last node's stages. Each
stage's share of the wall time is its time on that path; the rest (gaps between the path's pieces)
is `other`. A stage whose path time is mostly one sub-step names it: `image 62% (rank 0 save)`.

Nothing here raises on what a node left: a missing events file is no event, a torn or garbage line
is skipped and counted in one warning per file. Cross-node times assume the nodes' clocks agree
(NTP); the picture is as good as they are.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.events import events_path, parse_events, read_events_file
from slurm_multi.results.imagemoves import image_moved
from slurm_multi.results.jobdir import NodeReport, stage_order
from slurm_multi.results.shared import document_text, utc_iso
from slurm_multi.results.stragglers import Straggler
from slurm_multi.results.values import format_number

MAX_EVENTS_BYTES = 16 * 1024 * 1024  # a node that logs more than this is looping: the rest is ignored
# A stage's share names its biggest sub-step when that covers at least this much of the stage's time
# on the critical path.
DOMINANT_SHARE = 0.5


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Interval:
    """A stage or sub-step on one node, in seconds from the job start."""

    name: str
    start: float
    end: float
    status: str | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Lane:
    """One node's row: its stages, sub-steps and point events (times from the job start)."""

    rank: int
    node: str
    source: str  # "events", "status" (approximate, from status.json) or "none"
    stages: list[Interval] = field(default_factory=list)
    steps: list[Interval] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def approximate(self) -> bool:
        return self.source == "status"

    @property
    def end(self) -> float | None:
        times = [s.end for s in self.stages] + [e["t"] for e in self.events]
        return max(times) if times else None

    def first(self, stage: str) -> Interval | None:
        return next((s for s in self.stages if s.name == stage), None)

    def event_time(self, name: str) -> float | None:
        return next((e["t"] for e in self.events if e["event"] == name), None)


@dataclass(frozen=True)
class Segment:
    """A piece of the critical path: a stage interval (or part of one) on one node."""

    rank: int
    node: str
    stage: str
    start: float
    end: float
    approximate: bool = False

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "stage": self.stage,
            "start": _r(self.start),
            "end": _r(self.end),
            "seconds": _r(self.seconds),
        }


@dataclass(frozen=True)
class Share:
    """A stage's time on the critical path, as a fraction of the wall time."""

    stage: str  # a stage name, or "other" (gaps between the path's pieces)
    seconds: float
    share: float
    dominant: str | None = None  # `rank 0 save`: the sub-step that took most of it

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "seconds": _r(self.seconds),
            "share": round(self.share, 4),
            "dominant": self.dominant,
        }

    def describe(self) -> str:
        text = f"{self.stage} {round(self.share * 100)}%"
        return f"{text} ({self.dominant})" if self.dominant else text


@dataclass
class Timeline:
    """The job's timeline: every node's lane, the critical path, the shares (timeline.json)."""

    origin: float | None  # the job start, epoch seconds; None when no time of day is known
    wall: float  # seconds from the job start to the last node's end
    lanes: list[Lane]
    path: list[Segment]
    shares: list[Share]
    stragglers: list[Straggler]
    picture: str = ""  # what writing it produced, for the printed summary

    @property
    def approximate(self) -> bool:
        return any(lane.approximate for lane in self.lanes)

    @property
    def text(self) -> str | None:
        """`image 62% (rank 0 save), barrier 3%, run 33% of 96.4 s`; None without a path."""
        if not self.shares:
            return None
        shown = [s for s in self.shares if round(s.share * 100) >= 1] or self.shares[:1]
        text = f"{', '.join(s.describe() for s in shown)} of {format_number(round(self.wall, 1))} s"
        if any(segment.approximate for segment in self.path):
            text += " (approximate: from status.json stage times)"
        return text

    def to_dict(self) -> dict[str, Any]:
        flagged = {(s.stage, s.rank) for s in self.stragglers}
        return {
            "job_start": self.origin,
            "job_start_utc": utc_iso(self.origin) if self.origin is not None else None,
            "wall_seconds": _r(self.wall),
            "approximate": self.approximate,
            "nodes": [_lane_dict(lane, flagged) for lane in self.lanes],
            "critical_path": {
                "segments": [segment.to_dict() for segment in self.path],
                "shares": [share.to_dict() for share in self.shares],
                "text": self.text,
            },
            "stragglers": [s.to_dict() for s in self.stragglers],
        }


def _r(seconds: float) -> float:
    return round(seconds, 3) + 0.0  # + 0.0: never -0.0


def _lane_dict(lane: Lane, flagged: set[tuple[str, int]]) -> dict[str, Any]:
    rank = lane.rank
    return {
        "rank": rank,
        "node": lane.node,
        "source": lane.source,
        "approximate": lane.approximate,
        "stages": [  # _r inlined: 1,000 lanes are 15,000 of these
            {
                "stage": s.name,
                "start": round(s.start, 3) + 0.0,
                "end": round(s.end, 3) + 0.0,
                "seconds": round(s.end - s.start, 3) + 0.0,
                "status": s.status,
                "straggler": (s.name, rank) in flagged if flagged else False,
            }
            for s in lane.stages
        ],
        "steps": [
            {"step": s.name, "start": _r(s.start), "end": _r(s.end), "seconds": _r(s.seconds)}
            for s in lane.steps
        ],
        "events": [dict(e, t=_r(e["t"])) for e in lane.events],
    }


# ----------------------------------------------------------------------------- reading


def read_events(directory: str, label: str, warnings: list[str]) -> list[dict[str, Any]] | None:
    """The events in `directory` (a node's, or the batch step's), in time order; None when it has
    no events file (no warning).

    A line that is not an event (torn by a kill mid-write, garbage) is skipped; the skipped lines
    of one file are one warning. `label` is how the warning names the directory (`node_3`).
    """
    try:
        file, data = read_events_file(directory, MAX_EVENTS_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        name = f"{label}/{os.path.basename(events_path(directory))}"  # the file that failed
        warnings.append(f"{name}: unreadable ({exc.strerror or exc}); its lane comes from status.json")
        return None
    name = f"{label}/{file}"
    if len(data) > MAX_EVENTS_BYTES:
        data = data[: data.rfind(b"\n", 0, MAX_EVENTS_BYTES) + 1]
        warnings.append(f"{name}: larger than {MAX_EVENTS_BYTES // 1024 // 1024} MiB; the rest is ignored")
    events, skipped, torn = parse_events(data)
    if skipped:
        what = "the last one torn (no line end)" if torn else "not events"
        warnings.append(f"{name}: {skipped} line{'s' if skipped > 1 else ''} skipped ({what})")
    events.sort(key=lambda e: e["t"])  # stable: a tie keeps the file's order
    return events


def split_events(
    events: Sequence[dict[str, Any]], last: float
) -> tuple[list[Interval], list[Interval], list[dict[str, Any]]]:
    """A node's events (in time order) as its stages, its sub-steps and its point events.

    Stages: stage_start/stage_end pairs of one `stage`; a start with no end (the node was killed)
    ends at `last` (the node's last event), status `unfinished`; an end with no start is dropped.
    Sub-steps: X_start then X_end (e.g. image_load); a start with no end stays a point event
    (container_start is one by design). Point events: everything else.
    """
    stages: list[Interval] = []
    steps: list[Interval] = []
    points: list[dict[str, Any]] = []
    open_stages: dict[str, float] = {}
    open_steps: dict[str, dict[str, Any]] = {}
    for event in events:
        kind, t = event["event"], event["t"]
        if kind in ("stage_start", "stage_end"):
            stage = event.get("stage")
            if not isinstance(stage, str) or not stage:
                points.append(event)
            elif kind == "stage_start":
                if stage in open_stages:  # started again without an end
                    stages.append(Interval(stage, open_stages[stage], t, "unfinished"))
                open_stages[stage] = t
            elif stage in open_stages:
                status = event.get("status") if isinstance(event.get("status"), str) else None
                stages.append(Interval(stage, open_stages.pop(stage), t, status))
        elif kind.endswith("_start") and len(kind) > len("_start"):
            earlier = open_steps.pop(kind[: -len("_start")], None)
            if earlier is not None:
                points.append(earlier)
            open_steps[kind[: -len("_start")]] = event
        elif kind.endswith("_end") and kind[: -len("_end")] in open_steps:
            name = kind[: -len("_end")]
            steps.append(Interval(name, open_steps.pop(name)["t"], t))
        else:
            points.append(event)
    stages += [Interval(name, start, max(start, last), "unfinished") for name, start in open_stages.items()]
    points += open_steps.values()
    return (
        sorted(stages, key=lambda i: i.start),
        sorted(steps, key=lambda i: i.start),
        sorted(points, key=lambda e: e["t"]),
    )


def parse_started(value: Any) -> float | None:
    """job.json's `started` (`2025-11-30T11:43:20Z`) as epoch seconds."""
    if not isinstance(value, str):
        return None
    import calendar  # only for a job without events (strptime imports calendar, datetime, locale)

    try:
        return float(calendar.timegm(time.strptime(value.strip(), "%Y-%m-%dT%H:%M:%SZ")))
    except (ValueError, OverflowError):
        return None


BATCH_DIR = "batch"  # <jobdir>/batch/events.log: the batch step's events (lib/profile-nsight.sh)


def build_timeline(
    root: Path,
    nodes: Sequence[NodeReport],
    stragglers: Sequence[Straggler],
    warnings: list[str],
    started: Any = None,
) -> Timeline:
    """Every node's lane, the critical path and the shares. `started` is job.json's `started`: the
    job start when no node has events (else the earliest event is). From the same events, each
    node's image move (NodeReport.image, slurm_multi.results.imagemoves) for summary.json."""
    raw: dict[int, list[dict[str, Any]]] = {}
    for node in nodes:
        if node.path is None or node.dirname is None:
            continue
        events = read_events(node.path, node.dirname, warnings)
        if events:
            raw[node.rank] = events
            node.image = image_moved(node.rank, events)
    # The batch step's own events (the nsight-slurm flush), in a file of its own: on rank 0's lane,
    # the batch step runs on rank 0's node.
    batch = read_events(os.path.join(root, BATCH_DIR), BATCH_DIR, warnings)
    if batch:
        raw[0] = sorted([*raw.get(0, []), *batch], key=lambda e: e["t"])
    times = [e["t"] for events in raw.values() for e in events]
    origin = min(times) if times else parse_started(started)
    base = origin or 0.0
    lanes = []
    for node in nodes:
        found = raw.get(node.rank)
        if found:
            events = [dict(e, t=e["t"] - base) for e in found]
            stages, steps, points = split_events(events, max(e["t"] for e in events))
        else:
            events, stages, steps, points = [], [], [], []
        if stages:
            stages = [
                s if s.status is not None else Interval(s.name, s.start, s.end, node.stage_status.get(s.name))
                for s in stages
            ]
            lane = Lane(node.rank, node.node, "events", stages)
        elif node.stages:  # status.json only: end to end from the job start
            lane, clock = Lane(node.rank, node.node, "status"), 0.0
            for name, seconds in node.stages.items():
                seconds = max(seconds, 0.0)
                lane.stages.append(Interval(name, clock, clock + seconds, node.stage_status.get(name)))
                clock += seconds
        else:
            lane = Lane(node.rank, node.node, "events" if events else "none")
        lane.steps, lane.events = steps, points
        lanes.append(lane)
    ends = [end for end in (lane.end for lane in lanes) if end is not None]
    wall = max(max(ends, default=0.0), 0.0)
    path = critical_path(lanes)
    return Timeline(origin, wall, lanes, path, shares(path, lanes, wall), list(stragglers))


# ----------------------------------------------------------------------------- the critical path


def _segments(lane: Lane, stages: Sequence[Interval]) -> list[Segment]:
    return [Segment(lane.rank, lane.node, s.name, s.start, s.end, lane.approximate) for s in stages]


def _before_barrier(gate: Lane, arrival: float, rank0: Lane | None) -> list[Segment]:
    """The gate's stages before the barrier; when it is a worker whose image stage waited for rank
    0's release, rank 0's stages up to the release, then the gate's image stage from it."""
    index = next(i for i, s in enumerate(gate.stages) if s.name == "barrier")
    before = [s for s in gate.stages[:index] if s.start < arrival]
    image = next((s for s in reversed(before) if s.name == "image"), None)
    if image is None or rank0 is None or rank0 is gate:
        return _segments(gate, before)
    release = rank0.event_time("release")
    if release is None or not image.start < release < image.end:
        return _segments(gate, before)
    head = [Interval(s.name, s.start, min(s.end, release)) for s in rank0.stages if s.start < release]
    tail = [Interval("image", release, image.end)] + [s for s in before if s.start >= image.end]
    return _segments(rank0, head) + _segments(gate, tail)


def critical_path(lanes: Sequence[Lane]) -> list[Segment]:
    """The chain of stage intervals that decided the job's end (the module's docstring), in time
    order, without overlaps (a piece that starts before the previous one ends is cut)."""
    staged = [lane for lane in lanes if lane.stages]
    if not staged:
        return []
    last = max(staged, key=lambda lane: (max(s.end for s in lane.stages), -lane.rank))
    barrier = last.first("barrier")
    # Who arrived at the barrier last (a tie goes to the lower rank), and when.
    arrivals = [
        (b.start, -lane.rank, lane) for lane in staged for b in [lane.first("barrier")] if b is not None
    ]
    if barrier is None or not arrivals:
        pieces = _segments(last, last.stages)
    else:
        arrival, _, gate = max(arrivals, key=lambda a: (a[0], a[1]))
        rank0 = next((lane for lane in lanes if lane.rank == 0), None)
        pieces = _before_barrier(gate, arrival, rank0)
        pieces.append(
            Segment(
                last.rank, last.node, "barrier", max(barrier.start, arrival), barrier.end, last.approximate
            )
        )
        pieces += _segments(last, last.stages[last.stages.index(barrier) + 1 :])
    path: list[Segment] = []
    for piece in pieces:
        start = max(piece.start, path[-1].end) if path else piece.start
        if piece.end > start:
            path.append(Segment(piece.rank, piece.node, piece.stage, start, piece.end, piece.approximate))
    return path


def _step_label(name: str) -> str:
    """`image_save` -> `save` (the stage says image already)."""
    return name.split("_", 1)[1] if name.startswith("image_") and "_" in name else name


def _dominant(stage: str, path: Sequence[Segment], lanes: dict[int, Lane], seconds: float) -> str | None:
    """`rank 0 save`: the (rank, sub-step) covering the most of this stage's path time, if at least
    DOMINANT_SHARE of it."""
    covered: dict[tuple[int, str], float] = {}
    for segment in path:
        if segment.stage != stage or segment.rank not in lanes:
            continue
        for step in lanes[segment.rank].steps:
            overlap = min(step.end, segment.end) - max(step.start, segment.start)
            if overlap > 0:
                key = (segment.rank, step.name)
                covered[key] = covered.get(key, 0.0) + overlap
    if not covered or seconds <= 0:
        return None
    (rank, step), longest = max(covered.items(), key=lambda item: (item[1], -item[0][0]))
    return f"rank {rank} {_step_label(step)}" if longest >= DOMINANT_SHARE * seconds else None


def shares(path: Sequence[Segment], lanes: Sequence[Lane], wall: float) -> list[Share]:
    """Each stage's time on the path as a share of the wall time, in stage order, then `other`."""
    if not path or wall <= 0:
        return []
    per_stage: dict[str, float] = {}
    for segment in path:
        per_stage[segment.stage] = per_stage.get(segment.stage, 0.0) + segment.seconds
    by_rank = {lane.rank: lane for lane in lanes}
    found = [
        Share(
            stage,
            per_stage[stage],
            per_stage[stage] / wall,
            _dominant(stage, path, by_rank, per_stage[stage]),
        )
        for stage in stage_order(per_stage)
    ]
    other = wall - sum(per_stage.values())
    if other > 0.0005:
        found.append(Share("other", other, other / wall))
    return found


def timeline_json_text(timeline: Timeline) -> str:
    """timeline.json: laid out as summary.json is (one node per line, keys in their documented order)."""
    return document_text(timeline.to_dict())
