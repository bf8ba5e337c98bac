"""The job page's timeline picture: timeline.json drawn as inline SVG.

The same picture as timeline.png (results.timelinedraw, whose colours it uses): one lane per node,
the critical path in a row above them, stages coloured, sub-steps as a thin dark band, the critical
path outlined in black, stragglers in dashed red, approximate lanes faded, point events as small
marks. SVG needs no matplotlib: the batch step draws it right after the verdict for the price of a
few string joins, and every box says what it is when the pointer rests on it (its <title>).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from slurm_multi.report.page import esc
from slurm_multi.results.jobdir import stage_order
from slurm_multi.results.timelinedraw import MAX_PNG_LANES, OTHER_COLOURS, STAGE_COLOURS

WIDTH, LEFT, RIGHT, TOP, LANE, BAR = 1100, 150, 20, 26, 22, 16
LEGEND_ROW = 18


def colour(stage: str, names: Sequence[str]) -> str:
    if stage in STAGE_COLOURS:
        return STAGE_COLOURS[stage]
    others = [n for n in names if n not in STAGE_COLOURS]
    return OTHER_COLOURS[others.index(stage) % len(OTHER_COLOURS)] if stage in others else "#7f7f7f"


def ticks(wall: float) -> list[float]:
    """About six round tick values from 0 to `wall` (1, 2 or 5 times a power of ten apart)."""
    if wall <= 0:
        return [0.0]
    raw = wall / 6
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(wall / step) + 1)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _span(interval: dict[str, Any]) -> str:
    return f"{interval['start']:.2f}-{interval['end']:.2f} s"


def _intervals(items: Any, name_key: str) -> list[dict[str, Any]]:
    """The well-formed intervals of a lane (a hand-edited timeline.json costs only its bad items)."""
    found = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        start, end = _number(item.get("start")), _number(item.get("end"))
        if start is None or end is None or end < start or not isinstance(item.get(name_key), str):
            continue
        found.append(dict(item, start=start, end=end, name=item[name_key]))
    return found


class Canvas:
    """x in seconds from the job start to SVG pixels, and the shapes, in drawing order."""

    def __init__(self, wall: float, rows: int) -> None:
        self.wall = max(wall, 0.001)
        self.scale = (WIDTH - LEFT - RIGHT) / self.wall
        self.height = TOP + LANE * rows
        self.shapes: list[str] = []

    def x(self, seconds: float) -> float:
        return LEFT + min(max(seconds, 0.0), self.wall) * self.scale

    def rect(
        self,
        row: int,
        start: float,
        end: float,
        title: str,
        height: float = BAR,
        shift: float = 0.0,
        **style: str,
    ) -> None:
        """A box from `start` to `end` seconds in lane `row`, `height` high, centred in the lane
        and moved down by `shift` pixels; `style`'s keys are SVG attributes (`_` for `-`)."""
        x0, x1 = self.x(start), self.x(end)
        y = TOP + LANE * row + (LANE - height) / 2 + shift
        attrs = "".join(f' {k.replace("_", "-")}="{esc(v)}"' for k, v in style.items())
        self.shapes.append(
            f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 0.8):.1f}" height="{height:.1f}"{attrs}>'
            f"<title>{esc(title)}</title></rect>"
        )

    def text(self, x: float, y: float, content: str, anchor: str = "start", size: int = 11) -> None:
        self.shapes.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">{esc(content)}</text>'
        )


def _lanes(timeline: dict[str, Any]) -> list[dict[str, Any]]:
    lanes = []
    for lane in timeline.get("nodes") or []:
        if isinstance(lane, dict):
            lanes.append(lane)
    return lanes


def timeline_svg(timeline: dict[str, Any]) -> str:
    """The <svg> of a timeline.json document ("" when it has no stage to draw)."""
    wall = _number(timeline.get("wall_seconds")) or 0.0
    lanes = _lanes(timeline)
    path = timeline.get("critical_path") if isinstance(timeline.get("critical_path"), dict) else {}
    segments = _intervals(path.get("segments"), "stage")
    drawn = lanes if len(lanes) <= MAX_PNG_LANES else []
    stages = {id(lane): _intervals(lane.get("stages"), "stage") for lane in drawn}
    if wall <= 0 or not (segments or any(stages.values())):
        return ""
    names = stage_order(
        {s["name"]: 0 for found in stages.values() for s in found} | {s["name"]: 0 for s in segments}
    )
    legend_rows = 1
    canvas = Canvas(wall, len(drawn) + 1 + legend_rows + 1)
    _axis(canvas, len(drawn) + 1)
    canvas.text(LEFT - 8, TOP + LANE / 2 + 4, "critical path", anchor="end")
    for segment in segments:
        title = f"critical path: r{segment.get('rank')} {segment['name']} {_span(segment)}"
        canvas.rect(
            0,
            segment["start"],
            segment["end"],
            title,
            fill=colour(segment["name"], names),
            stroke="black",
            stroke_width="0.8",
        )
    rows = {}
    for index, lane in enumerate(drawn, start=1):
        rank = lane.get("rank")
        rows[rank] = index
        label = f"r{rank} {str(lane.get('node') or '?')[:22]}"
        canvas.text(LEFT - 8, TOP + LANE * index + LANE / 2 + 4, label, anchor="end")
        faded = {"fill_opacity": "0.5"} if lane.get("approximate") else {}
        for stage in stages[id(lane)]:
            status = stage.get("status") or "ok"
            title = f"r{rank} {lane.get('node')} {stage['name']} {_span(stage)} ({status})"
            if lane.get("approximate"):
                title += ", approximate: from status.json"
            canvas.rect(
                index,
                stage["start"],
                stage["end"],
                title,
                fill=colour(stage["name"], names),
                stroke="white",
                stroke_width="0.5",
                **faded,
            )
            if stage.get("straggler"):
                canvas.rect(
                    index,
                    stage["start"],
                    stage["end"],
                    f"straggler: {title}",
                    fill="none",
                    stroke="#d00",
                    stroke_width="1.6",
                    stroke_dasharray="4 2",
                    height=BAR + 4,
                )
        for step in _intervals(lane.get("steps"), "step"):
            title = f"r{rank} {step['name']} {_span(step)}"
            canvas.rect(index, step["start"], step["end"], title, height=4, shift=BAR / 2 - 3, fill="#333")
        _events(canvas, index, lane)
    for segment in segments:
        if segment.get("rank") in rows:
            title = f"critical path on r{segment.get('rank')}: {segment['name']}"
            canvas.rect(
                rows[segment.get("rank")],
                segment["start"],
                segment["end"],
                title,
                fill="none",
                stroke="black",
                stroke_width="2",
            )
    _legend(canvas, names, len(drawn) + 2)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{canvas.height + 4}" '
        f'viewBox="0 0 {WIDTH} {canvas.height + 4}" font-family="sans-serif" role="img" '
        'aria-label="timeline: one lane per node">\n' + "\n".join(canvas.shapes) + "\n</svg>"
    )


def _axis(canvas: Canvas, rows: int) -> None:
    bottom = TOP + LANE * rows
    for value in ticks(canvas.wall):
        x = canvas.x(value)
        canvas.shapes.append(
            f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{bottom}" stroke="#ccc" '
            'stroke-dasharray="2 3"/>'
        )
        canvas.text(x, TOP - 8, f"{value:g} s", anchor="middle", size=10)


def _events(canvas: Canvas, row: int, lane: dict[str, Any]) -> None:
    for event in lane.get("events") or []:
        t = _number(event.get("t")) if isinstance(event, dict) else None
        if t is None:
            continue
        x, y = canvas.x(t), TOP + LANE * row + 2
        canvas.shapes.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="black">'
            f"<title>r{esc(lane.get('rank'))} {esc(event.get('event'))} at {t:.2f} s</title></circle>"
        )


def _legend(canvas: Canvas, names: Sequence[str], row: int) -> None:
    y = TOP + LANE * row
    x = float(LEFT)
    items = [(name, colour(name, names)) for name in names]
    for name, fill in items:
        canvas.shapes.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="{esc(fill)}"/>')
        canvas.text(x + 16, y + 10, name, size=10)
        x += 24 + 7 * len(name)
    canvas.shapes.append(
        f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="none" stroke="black" stroke-width="2"/>'
    )
    canvas.text(x + 16, y + 10, "critical path", size=10)
    x += 100
    canvas.shapes.append(
        f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" fill="none" stroke="#d00" '
        'stroke-dasharray="4 2"/>'
    )
    canvas.text(x + 16, y + 10, "straggler", size=10)
    x += 80
    canvas.shapes.append(f'<circle cx="{x + 6:.1f}" cy="{y + 6:.1f}" r="2.2" fill="black"/>')
    canvas.text(x + 14, y + 10, "event (release, go, exit, ...)", size=10)
