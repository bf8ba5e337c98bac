"""Turn timings measured by bench/cluster_bench.sh into bench rows (one JSON file per call).

With --cpu / --baseline-cpu (bench/cpu_profile.py summaries, one per run) the row carries `cpu`:
the mean CPU seconds per run by role on each side and their difference; when the row misses its
target, its notes say where the CPU went (save, relay, load, tee, python, other).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchlib import make_row, write_rows
from cpu_profile import ROLES, compare_note, mean_summaries


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--row", required=True)
    parser.add_argument("--what", required=True)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--samples", required=True, type=floats)
    parser.add_argument("--baseline-samples", required=True, type=floats)
    parser.add_argument("--target")
    parser.add_argument("--notes", default="")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu", type=Path, action="append", default=[], help="a measured run's CPU profile")
    parser.add_argument("--baseline-cpu", type=Path, action="append", default=[], help="a baseline run's")
    args = parser.parse_args(argv)
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
        extra=cpu_extra(args.cpu, args.baseline_cpu),
    )
    cpu = row.get("cpu", {})
    if row["met"] is False and cpu.get("measured") and cpu.get("baseline"):
        note = compare_note(cpu["measured"], cpu["baseline"])
        row["notes"] = f"{row['notes'].rstrip('.')}; {note}" if row["notes"] else note
    write_rows([row], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
