"""Turn timings measured by bench/cluster_bench.sh into bench rows (one JSON file per call)."""

from __future__ import annotations

import argparse
import sys

from benchlib import make_row, write_rows


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


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
    )
    write_rows([row], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
