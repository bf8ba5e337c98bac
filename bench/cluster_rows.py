"""Turn timings measured by bench/cluster_bench.sh into bench rows (one JSON file per call).

With --cpu / --baseline-cpu (bench/cpu_profile.py summaries, one per run) the row carries `cpu`:
the mean CPU seconds per run by role on each side and their difference; when the row misses its
target, its notes say where the CPU went (save, relay, load, tee, python, other).

For a job's rows (--nodes N, the job's node count) the notes say instead what every process but the
workload containers' own spent per node on each side, by node and by the biggest processes; with
--cpu-samples those per-node figures are the row's samples (one profile per run, in pair order).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchlib import make_row, write_rows
from cpu_profile import ROLES, compare_note, job_cpu_per_node, mean_summaries


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def cpu_extra(measured: list[Path], baseline: list[Path]) -> dict[str, Any]:
    """The row's `cpu` field from the profiles of both sides ({} when there are none)."""
    if not measured and not baseline:
        return {}
    mine = mean_summaries([json.loads(path.read_text()) for path in measured])
    base = mean_summaries([json.loads(path.read_text()) for path in baseline])
    doc: dict[str, Any] = {"measured": mine, "baseline": base}
    if mine and base:
        doc["delta_s"] = {role: round(mine["cpu_s"][role] - base["cpu_s"][role], 3) for role in ROLES}
        doc["delta_s"]["total"] = round(mine["total_cpu_s"] - base["total_cpu_s"], 3)
    return {"cpu": doc}


def job_note(measured: dict[str, Any], baseline: dict[str, Any], nodes: int) -> str:
    """`CPU s per node per job outside the workload's containers: toolkit 0.71 vs bare 0.15 (...)`."""
    mine, base = job_cpu_per_node(measured, nodes), job_cpu_per_node(baseline, nodes)
    by_node = ", ".join(
        f"{'batch step' if node == 'batch' else node} {value:.2f}"
        for node, value in measured.get("job_cpu_s_by_node", {}).items()
    )
    biggest = ", ".join(
        f"{label} {value:.2f}" for label, value in list(measured.get("job_by_label", {}).items())[:6]
    )
    text = f"CPU s per node per job outside the workload's containers ({measured['runs']} runs, mean): "
    text += f"toolkit {mine:.2f} vs bare {base:.2f}; the toolkit's by node {by_node}; biggest {biggest}"
    if not (measured.get("acct") and baseline.get("acct")):
        text += " (no process accounting: short processes undercounted)"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--row", required=True)
    parser.add_argument("--what", required=True)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--samples", type=floats, default=[])
    parser.add_argument("--baseline-samples", type=floats, default=[])
    parser.add_argument("--paired", action="store_true", help="samples[i] ran beside baseline-samples[i]")
    parser.add_argument("--target")
    parser.add_argument("--notes", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--unit", choices=("seconds", "bytes"), default="seconds", help="what the samples count"
    )
    parser.add_argument("--cpu", type=Path, action="append", default=[], help="a measured run's CPU profile")
    parser.add_argument("--baseline-cpu", type=Path, action="append", default=[], help="a baseline run's")
    parser.add_argument(
        "--nodes", type=int, help="a job's rows: its node count (the notes give CPU per node)"
    )
    parser.add_argument(
        "--cpu-samples",
        action="store_true",
        help="the samples are each profile's CPU s per node (needs --nodes)",
    )
    args = parser.parse_args(argv)
    if args.cpu_samples:
        if not args.nodes:
            parser.error("--cpu-samples needs --nodes")
        args.samples = [job_cpu_per_node(json.loads(path.read_text()), args.nodes) for path in args.cpu]
        args.baseline_samples = [
            job_cpu_per_node(json.loads(p.read_text()), args.nodes) for p in args.baseline_cpu
        ]
    if not args.samples or not args.baseline_samples:
        print("cluster_rows: no samples", file=sys.stderr)
        return 2
    row = make_row(
        args.row,
        args.what,
        args.baseline,
        args.samples,
        args.baseline_samples,
        target=args.target,
        notes=args.notes,
        paired=args.paired,
        extra=cpu_extra(args.cpu, args.baseline_cpu),
    )
    cpu = row.get("cpu", {})
    note = ""
    if cpu.get("measured") and cpu.get("baseline"):
        if args.nodes:
            note = job_note(cpu["measured"], cpu["baseline"], args.nodes)
        elif row["met"] is False:
            note = compare_note(cpu["measured"], cpu["baseline"])
    if note:
        row["notes"] = f"{row['notes'].rstrip('.')}; {note}" if row["notes"] else note
    if args.unit != "seconds":
        row["unit"] = args.unit  # bench/report.py prints its numbers in that unit
    write_rows([row], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
