"""The judgement of a job (Summary) and how it is written: JOBDIR/perf.csv, JOBDIR/summary.json
(both deterministic, so a re-run on a finished job dir is byte-identical) and the short table
collect prints on stderr."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.results.hangs import Hang
from slurm_multi.results.jobdir import NodeReport, stage_order
from slurm_multi.results.pick import Candidate
from slurm_multi.results.profile import ProfileCheck
from slurm_multi.results.shared import AREA, document_text, write_atomic
from slurm_multi.results.stragglers import Straggler
from slurm_multi.results.timeline import Timeline
from slurm_multi.results.values import format_number
from slurm_multi.results.worldsize import WorldCheck

MAX_TABLE_REASONS = 20  # reasons printed on stderr; summary.json keeps them all


@dataclass
class Summary:
    verdict: str
    job_id: str
    model: str
    nnodes: int
    results_csv: str | None
    chosen_csv: str | None
    candidates: list[Candidate]
    source: str
    log_metrics: dict[str, Any]
    nodes: list[NodeReport]
    reasons: list[str]
    warnings: list[str]
    perf_header: list[str]
    perf_rows: list[list[str]]
    hang: Hang | None = None  # what the hang watch left; its lines lead `reasons`
    stragglers: list[Straggler] = field(default_factory=list)  # information, never a reason
    timeline: Timeline | None = None  # where the time went (information, never a reason)
    world: WorldCheck | None = None  # the launcher's one world, when the job asked for one
    profile: ProfileCheck | None = None  # a profiled job's reports, one per rank
    bad_nodes: list[dict[str, Any]] = field(default_factory=list)  # the fitness verdict (slurm_multi.fitness)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # a requeued job's earlier attempts

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "job_id": self.job_id,
            "model": self.model,
            "nnodes": self.nnodes,
            "results_csv": self.results_csv,
            "chosen_csv": self.chosen_csv,
            "candidates": [c.to_dict() for c in self.candidates],
            "source": self.source,
            "log_metrics": self.log_metrics,
            "nodes": [n.to_dict() for n in self.nodes],
            "reasons": list(self.reasons),
            "hang": self.hang.to_dict() if self.hang else None,
            "stragglers": [s.to_dict() for s in self.stragglers],
            "world": self.world.to_dict() if self.world else None,
            "profile": self.profile.to_dict() if self.profile else None,
            "bad_nodes": list(self.bad_nodes),
            "attempts": list(self.attempts),
            "time": self.timeline.text if self.timeline else None,
            "warnings": list(self.warnings),
            "perf_rows": len(self.perf_rows),
        }


def perf_csv_text(summary: Summary) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(summary.perf_header)
    writer.writerows(summary.perf_rows)
    return buffer.getvalue()


def summary_json_text(summary: Summary) -> str:
    return document_text(summary.to_dict())


def write_outputs(root: Path, summary: Summary) -> None:
    """JOBDIR/perf.csv and JOBDIR/summary.json, each written atomically."""
    write_atomic(root / "perf.csv", perf_csv_text(summary))
    write_atomic(root / "summary.json", summary_json_text(summary))


def summary_table(summary: Summary, root: Path) -> list[str]:
    """The short human report collect prints on stderr (the warnings are talked before it)."""
    lines = [f"{AREA}: job {summary.job_id} ({summary.model}, {summary.nnodes} nodes): {summary.verdict}"]
    if summary.chosen_csv:
        chosen = next(c for c in summary.candidates if c.path == summary.chosen_csv)
        lines.append(f"  chosen CSV: {chosen.describe()} (of {len(summary.candidates)} candidates)")
    elif summary.source == "log":
        lines.append(f"  source: 'performance:' log lines ({len(summary.log_metrics)} metrics)")
    else:
        lines.append(f"  chosen CSV: none ({len(summary.candidates)} candidates)")
    lines.append(f"  perf rows: {len(summary.perf_rows)} -> {root / 'perf.csv'}")
    stages = stage_order({name: 0 for node in summary.nodes for name in node.stages})
    rows = [["rank", "node", "status", "exit", *stages]]
    for node in summary.nodes:
        exit_code = "" if node.exit_code is None else str(node.exit_code)
        timings = [format_number(node.stages[s]) if s in node.stages else "-" for s in stages]
        rows.append([str(node.rank), node.node, node.status, exit_code or "-", *timings])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"  reason: {reason}" for reason in summary.reasons[:MAX_TABLE_REASONS]]
    if len(summary.reasons) > MAX_TABLE_REASONS:
        lines.append(f"  reason: +{len(summary.reasons) - MAX_TABLE_REASONS} more (see summary.json)")
    if summary.world is not None:
        lines.append(f"  {summary.world.describe()}")
    if summary.profile is not None:
        lines.append(f"  {summary.profile.describe()}")
    for bad in summary.bad_nodes:
        lines.append(f"  bad node: {bad['node']} (node {bad['rank']}): {bad['reason']}")
    for attempt in summary.attempts:
        named = ", ".join(f"{b.get('node')}: {b.get('reason')}" for b in attempt.get("bad_nodes") or [])
        lines.append(
            f"  earlier attempt {attempt.get('attempt')} ({attempt.get('dir')}): requeued after "
            f"{attempt.get('requeued_after_s')} s without {named or '?'} ({attempt.get('cause')})"
        )
    lines += [f"  straggler: {straggler.describe()}" for straggler in summary.stragglers]
    if summary.timeline is not None:
        if summary.timeline.text:
            lines.append(f"  time: {summary.timeline.text}")
        if summary.timeline.picture:
            lines.append(f"  timeline: {summary.timeline.picture}")
    return lines
