"""Shared pieces of the benchmarks: summary statistics, the row document, and its JSON file.

Every bench module measures something against a baseline taken in the same run and emits rows:

    {"row": "...", "what": "...", "baseline": "...", "median_s": x, "spread_s": [min, max],
     "baseline_median_s": y, "baseline_spread_s": [min, max], "ratio": x / y,
     "target": "<= 2.0x" | null, "met": true | false | null, "runs": n, "notes": "..."}

A row measured in pairs (each measured run beside its own baseline run, interleaved) also carries
what the measured side adds: `"added_s"` (the median of the pairs' differences), `"added_spread_s"`
([min, max]) and `"added_iqr_s"` ([first, third quartile]); its target may be on that instead of
the ratio: `"<= 0.8 s added"`.

A row that could not be measured carries `"skipped": "<why>"` and nulls for the numbers.
"""

from __future__ import annotations

import argparse
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

# `<= 2.0x` judges the ratio; `<= 0.8 s added` (or `CPU-s added`) judges a paired row's added_s.
TARGET_RE = re.compile(r"\s*<=\s*([0-9]+(?:\.[0-9]+)?)\s*(x|s added|CPU-s added)\s*")
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


def quartiles(samples: Sequence[float]) -> list[float]:
    """[first, third quartile] (statistics' inclusive method: within the samples' range)."""
    if not samples:
        raise ValueError("quartiles of no samples")
    if len(samples) == 1:
        return [float(samples[0])] * 2
    first, _, third = statistics.quantiles(samples, n=4, method="inclusive")
    return [float(first), float(third)]


def ratio(measured: float, baseline: float) -> float | None:
    """measured / baseline, or None when the baseline is zero or not a number."""
    if not (math.isfinite(measured) and math.isfinite(baseline)) or baseline <= 0:
        return None
    return measured / baseline


def _target(target: str) -> re.Match[str]:
    match = TARGET_RE.fullmatch(target)
    if not match:
        raise ValueError(f"target {target!r} is not of the form '<= 2.0x' or '<= 0.8 s added'")
    return match


def target_limit(target: str | None) -> float | None:
    """`"<= 2.0x"` -> 2.0, `"<= 0.8 s added"` -> 0.8; None for no target. Anything else is a
    programming error."""
    return None if target is None else float(_target(target).group(1))


def target_on_added(target: str | None) -> bool:
    """True when the target judges the seconds added (a paired row), not the ratio."""
    return target is not None and _target(target).group(2) != "x"


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
    paired: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One table row from the raw samples (seconds) of the measured thing and of its baseline.

    paired: samples[i] and baseline_samples[i] were measured side by side (interleaved, one pair
    after the other); the row then says what the measured side adds, from the pairs' differences."""
    measured, base = median(samples), median(baseline_samples)
    value = ratio(measured, base)
    added: dict[str, Any] = {}
    if paired:
        if len(samples) != len(baseline_samples):
            sizes = f"{len(samples)} samples vs {len(baseline_samples)} baseline samples"
            raise ValueError(f"paired row {row!r}: {sizes}")
        diffs = [float(a) - float(b) for a, b in zip(samples, baseline_samples)]
        added = {
            "added_s": median(diffs),
            "added_spread_s": spread(diffs),
            "added_iqr_s": quartiles(diffs),
            "added_samples_s": diffs,
        }
    elif target_on_added(target):
        raise ValueError(f"row {row!r}: target {target!r} needs paired samples")
    judged = added.get("added_s") if target_on_added(target) else value
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
        "met": target_met(judged, target),
        "runs": len(samples),
        "baseline_runs": len(baseline_samples),
        "notes": notes,
        "samples_s": [float(s) for s in samples],
        "baseline_samples_s": [float(s) for s in baseline_samples],
        **added,
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


def sizes_parser(doc: str, sizes: Sequence[int], what: str) -> argparse.ArgumentParser:
    """A bench's command line: --sizes (`what`, comma-separated), --repeats, --out; the bench adds
    its own flags, then reads them with `sizes_args`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, sizes)), help=f"{what}, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each side per size")
    parser.add_argument("--out", default="-", help="write the rows (JSON list) here; '-' = stdout")
    return parser


def sizes_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, low: int = 1
) -> tuple[argparse.Namespace, list[int]]:
    """The parsed arguments and the sizes (each at least `low`); parser.error (exit 2) otherwise."""
    args = parser.parse_args(argv)
    sizes = int_list(parser, "--sizes", args.sizes, low)
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    return args, sizes


def int_list(parser: argparse.ArgumentParser, flag: str, text: str, low: int = 1) -> list[int]:
    """A bench's comma-separated sizes (`--sizes 16,256`), each at least `low`; parser.error (exit 2)
    for anything else."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        parser.error(f"{flag} {text!r}: expected comma-separated integers")
    if not values or min(values) < low:
        parser.error(f"{flag} {text!r}: expected integers of {low} or more")
    return values


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
