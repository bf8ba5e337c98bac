"""Merge row files into the benchmark table: markdown on stdout, JSON under the results directory.

Each input file holds one row object or a JSON list of rows (see benchlib.py for the fields). The
JSON document goes to `<results-dir>/<UTC timestamp>.json` and is copied to `latest.json`.

Exit codes: 0 written (targets missed are reported, not fatal unless --strict), 1 a target missed
with --strict, 2 an input file is missing or malformed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import format_seconds, talk  # noqa: E402

COLUMNS = (
    "Row", "Measured (median, spread)", "Baseline (median, spread)", "Added (median, spread)", "Ratio",
    "Target", "Met",
)  # fmt: skip
SCHEMA = 1


class ReportError(Exception):
    """A row file that cannot be used; the message names the file and the problem."""


def load_rows(paths: Sequence[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ReportError(f"{path}: cannot read ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise ReportError(f"{path}: not JSON ({exc})") from None
        items = data if isinstance(data, list) else [data]
        for number, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("row"), str) or not item["row"]:
                raise ReportError(f"{path}: item {number} is not a row object with a 'row' name")
            rows.append(item)
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_bytes(value: float | None) -> str:
    """A row whose unit is bytes (`unit: bytes`): 45.7 kB, 1.31 GB."""
    if value is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} bytes"


def format_measure(
    median: float | None, spread: Sequence[float] | None, runs: int | None = None, fmt=format_seconds
) -> str:
    """`213 ms (208 ms – 247 ms, n=5)`; `-` when there is no number."""
    if median is None:
        return "-"
    parts = []
    if spread and len(spread) == 2:
        parts.append(f"{fmt(spread[0])} – {fmt(spread[1])}")
    if runs:
        parts.append(f"n={runs}")
    return f"{fmt(median)} ({', '.join(parts)})" if parts else fmt(median)


def signed_seconds(value: float, fmt=format_seconds) -> str:
    """`+620 ms`, `-40 ms`: a difference, with its sign."""
    return ("-" if value < 0 else "+") + fmt(abs(value))


def format_added(median: float | None, spread: Sequence[float] | None, fmt=format_seconds) -> str:
    """`+620 ms (+410 ms – +900 ms)` for a paired row; `-` for any other."""
    if median is None:
        return "-"
    if spread and len(spread) == 2:
        low, high = signed_seconds(spread[0], fmt), signed_seconds(spread[1], fmt)
        return f"{signed_seconds(median, fmt)} ({low} – {high})"
    return signed_seconds(median, fmt)


def format_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def format_met(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "**no**"


def table_row(row: dict[str, Any]) -> list[str]:
    if row.get("skipped"):
        return [row["row"], f"skipped ({row['skipped']})", "-", "-", "-", row.get("target") or "-", "-"]
    fmt = format_bytes if row.get("unit") == "bytes" else format_seconds
    return [
        row["row"],
        format_measure(row.get("median_s"), row.get("spread_s"), row.get("runs"), fmt),
        format_measure(
            row.get("baseline_median_s"), row.get("baseline_spread_s"), row.get("baseline_runs"), fmt
        ),
        format_added(row.get("added_s"), row.get("added_spread_s"), fmt),
        format_ratio(row.get("ratio")),
        row.get("target") or "-",
        format_met(row.get("met")),
    ]


def render_markdown(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        f"## slurm-multi bench — {meta['created']} on {meta['host']} "
        f"({meta['cpus']} CPUs, Python {meta['python']})",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join(["---"] + ["---:"] * 4 + ["---"] * 2) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(value) for value in table_row(row)) + " |")
    lines.append("")
    lines.append(
        "Ratio = measured median / baseline median; spread = min – max of the runs. Added = the median "
        "of measured minus baseline over pairs run side by side (rows measured in pairs only)."
    )
    lines.append("")
    for row in rows:
        if row.get("skipped"):
            continue
        what, baseline = str(row.get("what", "")).rstrip("."), str(row.get("baseline", "")).rstrip(".")
        text = f"- **{row['row']}**: {what}; baseline: {baseline}."
        if row.get("notes"):
            text += f" {str(row['notes']).rstrip('.')}."
        lines.append(_cell(text))
    missed = [row["row"] for row in rows if row.get("met") is False]
    if missed:
        lines.append("")
        lines.append(f"Targets missed: {', '.join(missed)}.")
    return "\n".join(lines) + "\n"


def targets_met(rows: Sequence[dict[str, Any]]) -> bool | None:
    judged = [row["met"] for row in rows if row.get("met") is not None]
    return all(judged) if judged else None


def run_meta(created: float | None = None) -> dict[str, Any]:
    when = time.gmtime(created if created is not None else time.time())
    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", when),
        "stamp": time.strftime("%Y%m%dT%H%M%SZ", when),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _write_atomic(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)


def write_results(results_dir: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write `<stamp>.json` (never overwriting an earlier run) and `latest.json`; return the first."""
    results_dir.mkdir(parents=True, exist_ok=True)
    document = {"schema": SCHEMA, **meta, "targets_met": targets_met(rows), "rows": list(rows)}
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    path = results_dir / f"{meta['stamp']}.json"
    suffix = 1
    while path.exists():
        suffix += 1
        path = results_dir / f"{meta['stamp']}-{suffix}.json"
    _write_atomic(path, text)
    _write_atomic(results_dir / "latest.json", text)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("row_files", nargs="+", type=Path, metavar="ROWS.json")
    parser.add_argument("--results-dir", type=Path, default=Path("bench/results"))
    parser.add_argument("--strict", action="store_true", help="exit 1 when a row misses its target")
    args = parser.parse_args(argv)
    try:
        rows = load_rows(args.row_files)
    except ReportError as exc:
        talk("report", f"error: {exc}; re-run that benchmark")
        return 2
    meta = run_meta()
    path = write_results(args.results_dir, rows, meta)
    sys.stdout.write(render_markdown(rows, meta))
    sys.stdout.flush()
    talk("report", f"wrote {path} and {args.results_dir / 'latest.json'}")
    if args.strict and targets_met(rows) is False:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
