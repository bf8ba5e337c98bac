"""`slurm-multi report JOBDIR` and `slurm-multi report --history PERF_CSV`: the click command.

Exit codes: 0 the page is written, 1 it could not be written, 2 usage or an input that is not what
collect writes (no summary.json, a file that is not a perf.csv)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from slurm_multi.common import FiniteFloat, run_or_warn, talk, usage_error
from slurm_multi.report.page import AREA

MAX_TALKED = 20  # warnings on stderr; the page lists them all


def talk_warnings(warnings: Sequence[str]) -> None:
    for warning in warnings[:MAX_TALKED]:
        talk(AREA, f"warning: {warning}")
    if len(warnings) > MAX_TALKED:
        talk(AREA, f"warning: +{len(warnings) - MAX_TALKED} more (the page lists them)")


def write_job(jobdir: Path, out: Path | None = None) -> Path:
    """The job's page, what it could not read and where it is said on stderr; its path."""
    from slurm_multi.report.jobpage import write_job_page

    path, data = write_job_page(jobdir, out)
    talk_warnings(data.problems)
    talk(AREA, f"page: {path} ({_size(path)}); open it in a browser")
    return path


def job_page_or_warn(jobdir: Path) -> None:
    """The job's page for `results collect --page` (bin/sm-collect): its failure is its own one
    line, then a warning, never the caller's exit status."""
    run_or_warn(AREA, "the job's page (report.html)", lambda: write_job(jobdir))


def _size(path: Path) -> str:
    try:
        return f"{path.stat().st_size / 1000:.0f} kB"
    except OSError:
        return "?"


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("jobdir", required=False, type=click.Path(file_okay=False))
@click.option(
    "--history",
    "perf_csv",
    metavar="PERF_CSV",
    type=click.Path(dir_okay=False),
    help="Write the page across runs of this shared perf.csv (the one `results collect --perf-csv` "
    "appends to) instead of a job's page.",
)
@click.option(
    "--regression-pct",
    type=FiniteFloat(min=0, min_open=True),
    metavar="PCT",
    help="With --history: a run worse than the median of the earlier runs by more than PCT percent is "
    "a regression [default: 5].",
)
@click.option(
    "--out",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Where the page goes [default: JOBDIR/report.html; with --history perf_history.html beside "
    "PERF_CSV].",
)
def cli(jobdir: str | None, perf_csv: str | None, regression_pct: float | None, out: str | None) -> None:
    """Write a self-contained HTML page: a job's (JOBDIR/report.html) or, with --history, the runs
    of a shared perf.csv (perf_history.html beside it). No network, no script: open it anywhere.

    The job page shows the verdict and every reason, each rank's stages, the timeline, stragglers,
    the hang and its diagnostics, bad nodes and earlier attempts, the profile, the world size, the
    chosen CSV and the performance rows, from the files `results collect` wrote (the batch step and
    bin/sm-collect write it after the verdict). The history page shows each model and configuration
    over the runs, the last run against the median of the earlier ones, the regressions and each
    node's stage times over the runs (needs pandas; plots with matplotlib).

    \b
    Example: slurm-multi report slurm_output/toy_model/57
             slurm-multi report --history /shared/perf.csv --regression-pct 3
    """
    if (jobdir is None) == (perf_csv is None):
        raise usage_error(f"{AREA}: give a JOBDIR or --history PERF_CSV (one of them)")
    if perf_csv is None and regression_pct is not None:
        raise usage_error(f"{AREA}: --regression-pct is for --history PERF_CSV")
    if jobdir is not None:
        write_job(Path(jobdir), Path(out) if out else None)
        return
    from slurm_multi.report.history import DEFAULT_REGRESSION_PCT
    from slurm_multi.report.historypage import write_history_page

    threshold = regression_pct if regression_pct is not None else DEFAULT_REGRESSION_PCT
    path, history = write_history_page(Path(perf_csv), threshold, Path(out) if out else None)
    talk_warnings(history.warnings)
    flagged = sum(1 for group in history.groups if group.regressed)
    talk(
        AREA,
        f"history: {path} ({_size(path)}): {len(history.groups)} configuration(s), {flagged} regressed "
        f"past {threshold:g}% in their last run; open it in a browser",
    )
