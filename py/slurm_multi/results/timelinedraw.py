"""How a job's timeline is written: JOBDIR/timeline.json (the data), timeline.txt (a table and a
bar chart for a terminal) and timeline.png (when matplotlib is importable: `pip install
'slurm-multi[timeline]'`). The timeline itself is built in results.timeline."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_multi.common import HelperError
from slurm_multi.results.jobdir import stage_order
from slurm_multi.results.shared import short, utc_iso, write_atomic
from slurm_multi.results.timeline import Lane, Segment, Timeline, timeline_json_text
from slurm_multi.results.values import format_number

TIMELINE_JSON, TIMELINE_TXT, TIMELINE_PNG = "timeline.json", "timeline.txt", "timeline.png"
MAX_PNG_LANES = 256  # beyond this a lane is a pixel high: timeline.txt and timeline.json say more
CHART_WIDTH = 60  # columns of timeline.txt's bars
STAGE_LETTERS = {
    "prepare": "p",
    "fitness": "f",
    "image": "i",
    "barrier": "b",
    "run": "r",
    "save-outputs": "s",
}
STAGE_COLOURS = {
    "prepare": "#9e9e9e",
    "fitness": "#d62728",
    "image": "#1f77b4",
    "barrier": "#ff7f0e",
    "run": "#2ca02c",
    "save-outputs": "#9467bd",
}
OTHER_COLOURS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf", "#7f7f7f")
EVENT_MARKERS = {"release": "*", "go": "v", "container_start": ">", "first_output": "o", "exit": "x"}
# timeline.png's layout, in inches: fixed margins (a "tight" layout draws everything twice).
PNG_WIDTH, PNG_LEFT, PNG_RIGHT, PNG_TOP, PNG_BOTTOM, PNG_LANE = 12.0, 1.9, 2.0, 0.45, 0.6, 0.34
PNG_LEGEND_LINE = 0.17


# ----------------------------------------------------------------------------- timeline.txt


def _letters(lanes: Sequence[Lane]) -> dict[str, str]:
    """One letter per stage name: the usual ones, then a free first letter, else `#`."""
    letters = dict(STAGE_LETTERS)
    for lane in lanes:
        for stage in lane.stages:
            if stage.name not in letters:
                free = next((c for c in stage.name.lower() if c.isalpha() and c not in letters.values()), "#")
                letters[stage.name] = free
    return letters


def _bar(lane: Lane, path: Sequence[Segment], wall: float, letters: dict[str, str]) -> str:
    """CHART_WIDTH columns: the letter of the stage at each column's middle, a capital where the
    critical path runs on this lane, `.` where the node does nothing."""
    cells = ["."] * CHART_WIDTH
    width = wall / CHART_WIDTH
    ceil = math.ceil

    for stage in reversed(lane.stages):  # an overlap shows the earlier stage
        # The columns whose middle lies in [start, end), as one slice (1,000 lanes: no loop per column).
        first = max(ceil(stage.start / width - 0.5), 0)
        stop = min(ceil(stage.end / width - 0.5), CHART_WIDTH)
        if stop > first:
            cells[first:stop] = [letters.get(stage.name, "#")] * (stop - first)
    for segment in path:
        if segment.rank == lane.rank:
            first = max(ceil(segment.start / width - 0.5), 0)
            stop = min(ceil(segment.end / width - 0.5), CHART_WIDTH)
            if stop > first:
                cells[first:stop] = [cell.upper() for cell in cells[first:stop]]
    return "".join(cells)


def timeline_text(timeline: Timeline, title: str) -> str:
    """timeline.txt: a table of stage intervals per node, the critical path, the shares and a bar
    chart (what timeline.png shows, for a terminal)."""
    start = f" from {utc_iso(timeline.origin)}" if timeline.origin is not None else ""
    lines = [
        f"timeline: {title}: {format_number(round(timeline.wall, 2))} s{start} (seconds from the job start)"
    ]
    names = stage_order({s.name: 0 for lane in timeline.lanes for s in lane.stages})
    flagged = {(s.stage, s.rank) for s in timeline.stragglers}
    rows = [["rank", "node", "source", *names]]
    for lane in timeline.lanes:
        cells = []
        firsts: dict[str, Any] = {}
        for interval in lane.stages:
            firsts.setdefault(interval.name, interval)  # = lane.first(name), one pass per lane
        for name in names:
            stage = firsts.get(name)
            if stage is None:
                cells.append("-")
                continue
            cell = f"{stage.start:.1f}-{stage.end:.1f}"
            if stage.status not in (None, "ok"):
                cell += f" {stage.status}"
            cells.append(cell + (" !" if (name, lane.rank) in flagged else ""))
        source = "status.json~" if lane.approximate else lane.source
        rows.append([str(lane.rank), lane.node, source, *cells])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    if timeline.path:
        chain = " > ".join(f"r{p.rank} {p.stage} {p.start:.1f}-{p.end:.1f}" for p in timeline.path)
        lines.append(f"critical path: {chain}")
    if timeline.text:
        lines.append(f"time: {timeline.text}")
    lines += [f"straggler (!): {s.describe()}" for s in timeline.stragglers]
    if timeline.approximate:
        lines.append("status.json~: no events file; stage seconds laid end to end from the job start")
    if timeline.wall > 0 and any(lane.stages for lane in timeline.lanes):
        letters = _letters(timeline.lanes)
        used = [name for name in names if name in letters]
        label_width = max(len(f"r{lane.rank}") for lane in timeline.lanes)
        end = f"{format_number(round(timeline.wall, 1))} s"
        lines.append("")
        lines.append(f"  {'':{label_width}} |0 s{end:>{CHART_WIDTH - 3}}|")
        for lane in timeline.lanes:
            bar = _bar(lane, timeline.path, timeline.wall, letters)
            lines.append(f"  {'r' + str(lane.rank):{label_width}} |{bar}|")
        legend = ", ".join(f"{letters[name]} {name}" for name in used)
        lines.append(f"  {legend}; CAPITALS: the critical path; . nothing")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- timeline.png


def _colour(stage: str, names: Sequence[str]) -> str:
    if stage in STAGE_COLOURS:
        return STAGE_COLOURS[stage]
    others = [n for n in names if n not in STAGE_COLOURS]
    return OTHER_COLOURS[others.index(stage) % len(OTHER_COLOURS)] if stage in others else "#7f7f7f"


def timeline_png(timeline: Timeline, title: str) -> bytes:
    """timeline.png's bytes: one lane per node (rank 0 at the top, the critical path in a row above
    it), stages coloured, sub-steps as a thin dark band inside them, the critical path outlined in
    black, stragglers in dashed red, point events as small markers.

    Raises ImportError without matplotlib, imported here only (it costs ~0.4 s). The Agg canvas
    directly, not pyplot: no global figure state, no backend to choose.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lanes = timeline.lanes
    names = stage_order({s.name: 0 for lane in lanes for s in lane.stages})
    rows = {lane.rank: index + 1 for index, lane in enumerate(lanes)}  # row 0: the critical path
    bar = 0.6
    steps = [(rows[lane.rank], s) for lane in lanes for s in lane.steps]
    kinds: dict[str, list[tuple[float, float]]] = {}
    for lane in lanes:
        for event in lane.events:
            kinds.setdefault(event["event"], []).append((event["t"], rows[lane.rank] - bar / 2 - 0.1))
    legend = len(names) + 4 + min(len(kinds), 12)  # (at most: sub-step, path, straggler, approximate)
    height_in = PNG_TOP + max(PNG_BOTTOM + PNG_LANE * (len(lanes) + 1.2), PNG_LEGEND_LINE * legend)
    figure = Figure(figsize=(PNG_WIDTH, height_in), dpi=100)
    FigureCanvasAgg(figure)
    figure.subplots_adjust(
        left=PNG_LEFT / PNG_WIDTH, right=1 - PNG_RIGHT / PNG_WIDTH,
        bottom=PNG_BOTTOM / height_in, top=1 - PNG_TOP / height_in,
    )  # fmt: skip
    axes = figure.add_subplot()
    for name in names:
        for approximate in (False, True):
            spans = [
                (rows[lane.rank], s.start, s.seconds)
                for lane in lanes
                if lane.approximate is approximate
                for s in lane.stages
                if s.name == name
            ]
            if spans:
                axes.barh(
                    [r for r, _, _ in spans], [w for _, _, w in spans], left=[x for _, x, _ in spans],
                    height=bar, color=_colour(name, names), edgecolor="white", linewidth=0.5,
                    hatch="//" if approximate else None, alpha=0.55 if approximate else 1.0,
                )  # fmt: skip
    if steps:
        # Sub-steps that overlap on one node (rank 0 saves while it streams) get bands of their own.
        ends: dict[tuple[float, int], float] = {}
        placed = []
        for row, step in sorted(steps, key=lambda item: (item[0], item[1].start)):
            level = 0
            while ends.get((row, level), float("-inf")) > step.start:
                level += 1
            ends[(row, level)] = step.start + step.seconds
            placed.append((row + bar / 2 - 0.09 - 0.16 * min(level, 3), step))
        axes.barh(
            [y for y, _ in placed], [s.seconds for _, s in placed],
            left=[s.start for _, s in placed], height=0.14, color="#333333", zorder=2,
        )  # fmt: skip
        for y, step in placed:
            if step.seconds > timeline.wall / 20:
                axes.text(
                    step.start + step.seconds / 2, y, step.name,
                    ha="center", va="center", fontsize=5.5, color="white", zorder=4,
                )  # fmt: skip
    for segment in timeline.path:
        axes.barh(
            [0], [segment.seconds], left=[segment.start], height=bar,
            color=_colour(segment.stage, names), edgecolor="black", linewidth=0.8,
        )  # fmt: skip
        if segment.rank in rows:  # and outlined on its node's lane
            axes.barh(
                [rows[segment.rank]], [segment.seconds], left=[segment.start], height=bar,
                fill=False, edgecolor="black", linewidth=2.2, zorder=3,
            )  # fmt: skip
        if segment.seconds > timeline.wall / 25:
            axes.text(
                segment.start + segment.seconds / 2, 0, f"r{segment.rank} {segment.stage}",
                ha="center", va="center", fontsize=7, color="white", zorder=4,
            )  # fmt: skip
    for straggler in timeline.stragglers:
        lane = next((lane for lane in lanes if lane.rank == straggler.rank), None)
        stage = lane.first(straggler.stage) if lane is not None else None
        if lane is not None and stage is not None:
            axes.barh(
                [rows[lane.rank]], [stage.seconds], left=[stage.start], height=bar + 0.12,
                fill=False, edgecolor="red", linewidth=1.5, linestyle="--", zorder=4,
            )  # fmt: skip
    for kind, points in kinds.items():
        axes.plot(
            [t for t, _ in points], [y for _, y in points], linestyle="",
            marker=EVENT_MARKERS.get(kind, "."), color="black", markersize=4, zorder=5,
        )  # fmt: skip
    axes.set_yticks(range(len(lanes) + 1))
    labels = ["critical path"] + [f"r{lane.rank} {short(lane.node, 24)}" for lane in lanes]
    axes.set_yticklabels(labels, fontsize=8 if len(lanes) <= 40 else 5)
    axes.set_ylim(len(lanes) + 0.6, -0.6)
    axes.set_xlim(0, max(timeline.wall, 0.001) * 1.01)
    axes.set_xlabel("seconds from the job start", fontsize=8)
    axes.tick_params(axis="x", labelsize=8)
    axes.grid(axis="x", linestyle=":", linewidth=0.5)
    axes.set_title(f"{title}: {timeline.text or 'no stage times'}", fontsize=8, loc="left")
    handles: list[Any] = [Patch(facecolor=_colour(n, names), label=n) for n in names]
    if steps:
        handles.append(Patch(facecolor="#333333", label="sub-step"))
    handles.append(Patch(facecolor="none", edgecolor="black", linewidth=2.2, label="critical path"))
    if timeline.stragglers:
        handles.append(Patch(facecolor="none", edgecolor="red", linestyle="--", label="straggler"))
    if timeline.approximate:
        handles.append(Patch(facecolor="#cccccc", hatch="//", label="approximate (status.json)"))
    handles += [
        Line2D([], [], marker=EVENT_MARKERS.get(k, "."), color="black", linestyle="", markersize=5, label=k)
        for k in list(kinds)[:12]
    ]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    buffer = io.BytesIO()
    # No Software key: the same job directory gives the same bytes (with one matplotlib version).
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


# ----------------------------------------------------------------------------- writing


def write_timeline(root: Path, timeline: Timeline, title: str, picture: bool = True) -> str:
    """JOBDIR/timeline.json and timeline.txt, and timeline.png when `picture` and matplotlib is
    importable (without `picture` the line says how to draw it later).

    Returns the line the summary prints after `timeline:`. Never raises: the timeline is
    information, and a job directory it cannot be written to has already failed summary.json.
    """
    written = []
    try:
        write_atomic(root / TIMELINE_JSON, timeline_json_text(timeline), durable=False)
        written.append(str(root / TIMELINE_JSON))
        write_atomic(root / TIMELINE_TXT, timeline_text(timeline, title), durable=False)
        written.append(TIMELINE_TXT)
    except HelperError as exc:
        return f"not written: {exc}"
    note = ""
    if not picture:
        note = f"{TIMELINE_PNG}: bin/sm-collect {root} draws it"
    elif len(timeline.lanes) > MAX_PNG_LANES:
        note = f"{TIMELINE_PNG} is not drawn for more than {MAX_PNG_LANES} nodes"
    else:
        try:
            picture = timeline_png(timeline, title)
            write_atomic(root / TIMELINE_PNG, picture, durable=False)
            written.append(TIMELINE_PNG)
        except ImportError:
            note = f"{TIMELINE_PNG} needs matplotlib: pip install 'slurm-multi[timeline]'"
        except HelperError as exc:
            note = f"{TIMELINE_PNG} not written: {exc}"
        except Exception as exc:  # a picture is never worth a traceback
            note = f"{TIMELINE_PNG} not drawn ({type(exc).__name__}: {short(str(exc), 120)})"
    return ", ".join(written) + (f"; {note}" if note else "")
