"""Shared pieces of the benchmarks: summary statistics, the row document, and its JSON file.

Every bench module measures something against a baseline taken in the same run and emits rows:

    {"row": "...", "what": "...", "baseline": "...", "median_s": x, "spread_s": [min, max],
     "baseline_median_s": y, "baseline_spread_s": [min, max], "ratio": x / y,
     "target": "<= 2.0x" | null, "met": true | false | null, "runs": n, "notes": "..."}

A row that could not be measured carries `"skipped": "<why>"` and nulls for the numbers.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))
from slurm_multi.shell import write_atomic  # noqa: E402 - the one atomic writer

TARGET_RE = re.compile(r"\s*<=\s*([0-9]+(?:\.[0-9]+)?)\s*x\s*")
ROW_KEYS = (
    "row", "what", "baseline", "median_s", "spread_s", "baseline_median_s", "baseline_spread_s",
    "ratio", "target", "met", "runs", "notes",
)  # fmt: skip


def median(samples: Sequence[float]) -> float:
    if not samples:
        raise ValueError("median of no samples")
    return float(statistics.median(samples))


def spread(samples: Sequence[float]) -> list[float]:
    """[min, max]: with 3-10 runs the full range is more honest than an interquartile range."""
    if not samples:
        raise ValueError("spread of no samples")
    return [float(min(samples)), float(max(samples))]


def ratio(measured: float, baseline: float) -> float | None:
    """measured / baseline, or None when the baseline is zero or not a number."""
    if not (math.isfinite(measured) and math.isfinite(baseline)) or baseline <= 0:
        return None
    return measured / baseline


def target_limit(target: str | None) -> float | None:
    """`"<= 2.0x"` -> 2.0; None for no target. Anything else is a programming error."""
    if target is None:
        return None
    match = TARGET_RE.fullmatch(target)
    if not match:
        raise ValueError(f"target {target!r} is not of the form '<= 2.0x'")
    return float(match.group(1))


def target_met(value: float | None, target: str | None) -> bool | None:
    limit = target_limit(target)
    if limit is None or value is None:
        return None
    return value <= limit


def make_row(
    row: str,
    what: str,
    baseline: str,
    samples: Sequence[float],
    baseline_samples: Sequence[float],
    *,
    target: str | None = None,
    notes: str = "",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One table row from the raw samples (seconds) of the measured thing and of its baseline."""
    measured, base = median(samples), median(baseline_samples)
    value = ratio(measured, base)
    doc: dict[str, Any] = {
        "row": row,
        "what": what,
        "baseline": baseline,
        "median_s": measured,
        "spread_s": spread(samples),
        "baseline_median_s": base,
        "baseline_spread_s": spread(baseline_samples),
        "ratio": value,
        "target": target,
        "met": target_met(value, target),
        "runs": len(samples),
        "baseline_runs": len(baseline_samples),
        "notes": notes,
        "samples_s": [float(s) for s in samples],
        "baseline_samples_s": [float(s) for s in baseline_samples],
    }
    if extra:
        doc.update(extra)
    return doc


def skipped_row(row: str, what: str, baseline: str, why: str, target: str | None = None) -> dict[str, Any]:
    return {
        "row": row,
        "what": what,
        "baseline": baseline,
        "median_s": None,
        "spread_s": None,
        "baseline_median_s": None,
        "baseline_spread_s": None,
        "ratio": None,
        "target": target,
        "met": None,
        "runs": 0,
        "notes": why,
        "skipped": why,
    }


def timed(func: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, on the monotonic high-resolution clock."""
    start = time.perf_counter()
    result = func()
    return time.perf_counter() - start, result


def format_seconds(value: float | None) -> str:
    """A short human duration: 840 µs, 12.3 ms, 1.42 s."""
    if value is None or not math.isfinite(value):
        return "-"
    if value < 1e-3:
        return f"{value * 1e6:.0f} µs"
    if value < 1.0:
        return f"{value * 1e3:.3g} ms" if value < 0.1 else f"{value * 1e3:.0f} ms"
    return f"{value:.3g} s"


def talk(area: str, message: str) -> None:
    """Progress on stderr (stdout is the table), in the toolkit's log format."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    host = os.environ.get("HOSTNAME") or os.uname().nodename
    print(f"{stamp} {host} r- bench {area}: {message}", file=sys.stderr, flush=True)


def write_rows(rows: list[dict[str, Any]], out: str | None) -> None:
    """Write the rows as one JSON list to `out` (atomically), or to stdout when out is None/'-'."""
    text = json.dumps(rows, indent=2) + "\n"
    if out in (None, "-"):
        sys.stdout.write(text)
        return
    write_atomic(out, text, mode=None)  # (/dev/null or a pipe is written through, never replaced)


def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def helper_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a helper runs with: the repo's py/ first on PYTHONPATH, as `make` sets it."""
    env = dict(os.environ)
    py = str(repo_root() / "py")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != py]
    env["PYTHONPATH"] = os.pathsep.join([py, *parts])
    if extra:
        env.update(extra)
    return env


def main(argv: list[str] | None = None) -> int:
    """`benchlib.py skip ROW WHY OUT`: write a skipped row (bench/run's hooks use it)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4 or args[0] != "skip":
        print("usage: benchlib.py skip ROW WHY OUT.json", file=sys.stderr)
        return 2
    _, row, why, out = args
    write_rows([skipped_row(row, "", "", why)], out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
