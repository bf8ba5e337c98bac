"""What the job page adds to a job: `slurm-multi report JOBDIR` against `results collect` on the same
collected job directory, each started as the batch step starts it.

The job directory is collect_bench's, as a job of today leaves it (every node dir holds status.json,
node.log, the result CSV, events.log and progress.json), collected once first (summary.json,
timeline.json, perf.csv), so the page has everything it shows:

- first row, the batch step's case (2 node dirs, the toy job's size): measured `python -m
  slurm_multi report JOBDIR`, interpreter start-up included (the batch step starts it cold, as it
  starts collect); baseline `python -m slurm_multi results collect JOBDIR --no-picture`, the command
  the batch step runs just before it. The measured median is the seconds the page adds to a job's
  end; the ratio says how that compares with the judgement itself.
- second row, a large job (1,000 node dirs): the page in-process (`write_job_page`) against
  collect() in-process (picture=False) over the same dir: what the page costs where the nodes are
  many (a 1,000-row table, the timeline's critical path only).

Both sides run against a warm page cache (one uncounted run of each first), interleaved.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from benchlib import format_seconds, helper_env, make_row, median, talk, timed, write_rows  # noqa: E402
from collect_bench import make_jobdir  # noqa: E402

SMALL, LARGE = 2, 1000


def cli(*args: str) -> Callable[[], int]:
    """One `python -m slurm_multi ARGS` run, as bash's util::sm starts it; a failure is an error."""
    command = [sys.executable, "-m", "slurm_multi", *args]

    def run() -> int:
        done = subprocess.run(command, env=helper_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"`{' '.join(args[:2])}` exited {done.returncode}: {tail[0]}")
        return done.returncode

    return run


def interleaved(
    measured: Callable[[], Any], baseline: Callable[[], Any], repeats: int
) -> tuple[list[float], list[float]]:
    """Both sides `repeats` times after one uncounted run of each, the first of a pair alternating."""
    measured()
    baseline()
    samples: list[float] = []
    base: list[float] = []
    for round_number in range(repeats):
        pair = [(samples, measured), (base, baseline)]
        for out, func in pair if round_number % 2 == 0 else reversed(pair):
            out.append(timed(func)[0])
    return samples, base


def collected(root: Path, nodes: int) -> Path:
    """collect_bench's job dir as a job leaves it, collected once (what the page reads)."""
    from slurm_multi.results import collect

    jobdir = make_jobdir(root, nodes, as_left=True)
    if collect(jobdir, picture=False).verdict != "SUCCESS":
        raise RuntimeError(
            "collect judged the synthetic job FAILURE; collect_bench's generator is out of date"
        )
    return jobdir


def run(repeats: int = 5, large: int = LARGE) -> list[dict[str, Any]]:
    from slurm_multi.report.jobpage import write_job_page
    from slurm_multi.results import collect

    rows = []
    with tempfile.TemporaryDirectory(prefix="sm-bench-report-") as tmp:
        jobdir = collected(Path(tmp) / "small", SMALL)
        talk("report", f"{repeats} runs each of `report` and `results collect` over a {SMALL}-node job dir")
        judge_cli = cli("results", "collect", str(jobdir), "--no-picture")
        page, judge = interleaved(cli("report", str(jobdir)), judge_cli, repeats)
        inside = [timed(lambda: write_job_page(jobdir))[0] for _ in range(max(repeats, 3))]
        size = (jobdir / "report.html").stat().st_size
        rows.append(make_row(
            f"job page (report), {SMALL}-node job dir",
            "`slurm-multi report JOBDIR` as the batch step runs it after the verdict (cold start included)",
            "`slurm-multi results collect JOBDIR --no-picture` on the same dir, as the batch step runs it",
            page, judge,
            notes=f"the seconds the page adds to a job's end; in-process the page takes "
            f"{format_seconds(median(inside))} (the rest is the interpreter, click and the imports); "
            f"report.html {size / 1000:.0f} kB",
            extra={"nodes": SMALL, "in_process_median_s": median(inside), "page_bytes": size},
        ))  # fmt: skip
        big = collected(Path(tmp) / "large", large)
        talk("report", f"{repeats} runs each of the page and collect() in-process over {large} node dirs")
        page, judge = interleaved(lambda: write_job_page(big), lambda: collect(big, picture=False), repeats)
        size = (big / "report.html").stat().st_size
        rows.append(make_row(
            f"job page (report), {large} node dirs",
            f"write_job_page in-process over a collected {large}-node job dir",
            "collect() in-process over the same dir (picture=False)",
            page, judge,
            notes=f"report.html {size / 1e6:.1f} MB: a {large}-row stage table"
            + (", the timeline's critical path only" if large > 256 else ", a lane per node"),
            extra={"nodes": large, "page_bytes": size},
        ))  # fmt: skip
    for row in rows:
        talk("report", f"{row['row']}: page {format_seconds(row['median_s'])}, collect "
                       f"{format_seconds(row['baseline_median_s'])}, ratio {row['ratio']:.2f}x")  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each side")
    parser.add_argument("--nodes", type=int, default=LARGE, help="node dirs of the second row's job")
    parser.add_argument("--out", default="-", help="write the rows (JSON list) here; '-' = stdout")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.nodes < 1:
        parser.error("--repeats and --nodes must be positive")
    write_rows(run(args.repeats, args.nodes), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
