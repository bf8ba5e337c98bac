"""`slurm-multi reports wait|snapshot|count`: the click commands over slurm_multi.reports (which has no
click: collect reads a profiled job's report states through it)."""

from __future__ import annotations

import json

import click

from slurm_multi.common import FiniteFloat, HelperError, talk, timeout_error
from slurm_multi.reports import (
    count_new,
    read_snapshot,
    state_document,
    take_snapshot,
    wait_for_reports,
    write_snapshot,
)
from slurm_multi.shell import write_atomic


@click.group("reports", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Wait for profiler reports (nsys .nsys-rep) to appear and settle; snapshot and count them."""


@cli.command("wait")
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--pattern", default="*.nsys-rep", show_default=True, help="Glob matched on file names.")
@click.option(
    "--expect",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="How many new reports to wait for.",
)
@click.option(
    "--baseline",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="How many settled reports to disregard by count (--since-file disregards them by identity).",
)
@click.option(
    "--since-file",
    metavar="FILE",
    default=None,
    help="A `reports snapshot` taken before the job: count only reports new or changed since it.",
)
@click.option(
    "--settle-seconds",
    type=FiniteFloat(min=0),
    default=60.0,
    show_default=True,
    help="How long a report's byte size must stay unchanged.",
)
@click.option(
    "--timeout-seconds",
    type=FiniteFloat(min=0),
    default=600.0,
    show_default=True,
    help="Give up (exit 3) after this long.",
)
@click.option(
    "--poll-seconds",
    type=FiniteFloat(min=0.01),
    default=1.0,
    show_default=True,
    help="How often to look at the directory.",
)
@click.option(
    "--recursive/--no-recursive", default=False, show_default=True, help="Also look in subdirectories."
)
@click.option(
    "--state-file",
    metavar="FILE",
    type=click.Path(dir_okay=False),  # a directory there is refused before the wait, not after it
    default=None,
    help="Also write the outcome as JSON: every new report's bytes and state (settled, growing, "
    "settling, empty) and the .qdstrm left; the job's verdict reads it.",
)
def wait_command(
    directory: str,
    pattern: str,
    expect: int,
    baseline: int,
    settle_seconds: float,
    timeout_seconds: float,
    poll_seconds: float,
    recursive: bool,
    since_file: str | None,
    state_file: str | None,
) -> None:
    """Exit 0 once baseline+expect non-empty reports in DIR have kept their byte size for the settle
    window and no *.qdstrm is left; print the settled report paths on stdout.

    Zero-byte reports never count; a report that grows restarts its settle clock. A missing DIR is
    waited for. With --since-file, a report (or .qdstrm) whose size, mtime and inode are as the
    snapshot recorded them is left out entirely: an earlier job's report never counts, and one
    rewritten during this job does. On timeout (exit 3) every report's state is listed on stderr,
    and the reports that did settle are still printed on stdout.

    Example: slurm-multi reports wait logs/profile --expect 4 --since-file logs/.profile-baseline.json
    """
    since = read_snapshot(since_file) if since_file is not None else None
    result = wait_for_reports(
        directory,
        pattern=pattern,
        expect=expect,
        baseline=baseline,
        settle_seconds=settle_seconds,
        timeout_seconds=timeout_seconds,
        poll_seconds=poll_seconds,
        recursive=recursive,
        since=since,
    )
    if state_file is not None:
        document = state_document(result, directory, pattern, expect, settle_seconds)
        try:
            write_atomic(state_file, json.dumps(document, indent=1) + "\n")
        except OSError as err:  # as `snapshot --out` words it
            raise HelperError(
                f"reports: cannot write the --state-file {state_file}: {err.strerror}; check the directory"
            ) from None
    for path in result.settled:
        click.echo(path)
    if not result.ok:
        for line in result.lines:
            talk("reports", line)
        raise timeout_error(result.summary)


@cli.command("snapshot", short_help="Record the reports present before a job.")
@click.argument("directories", metavar="DIR...", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--out", "out", required=True, metavar="FILE", help="Where to write the snapshot (JSON).")
@click.option("--pattern", default="*.nsys-rep", show_default=True, help="Glob matched on file names.")
@click.option(
    "--recursive/--no-recursive", default=False, show_default=True, help="Also look in subdirectories."
)
def snapshot_command(directories: tuple[str, ...], out: str, pattern: str, recursive: bool) -> None:
    """Record every report (and .qdstrm) in the DIRs -- path, size, mtime_ns, inode -- into FILE, so
    that `wait --since-file FILE` and `count --since-file FILE` leave them out. A DIR that does not
    exist yet is fine (nothing in it is old). Take it once per job, before the first worker step.

    Example: slurm-multi reports snapshot logs/profile --out logs/.profile-baseline.json
    """
    baseline = take_snapshot(directories, pattern, recursive)
    write_snapshot(baseline, out, directories, pattern)
    talk(
        "reports",
        f"snapshot: {len(baseline.files)} file(s) in {' '.join(directories)} -> {out}",
    )


@cli.command("count", short_help="Count the reports new since a snapshot.")
@click.argument("directories", metavar="DIR...", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--pattern", default="*.nsys-rep", show_default=True, help="Glob matched on file names.")
@click.option(
    "--recursive/--no-recursive", default=False, show_default=True, help="Also look in subdirectories."
)
@click.option(
    "--since-file",
    metavar="FILE",
    default=None,
    help="A `reports snapshot`: count only reports new or changed since it.",
)
def count_command(
    directories: tuple[str, ...], pattern: str, recursive: bool, since_file: str | None
) -> None:
    """Print how many reports the DIRs hold (empty ones too: nsys creates the file before writing
    it), or with --since-file how many are new or changed since that snapshot. No waiting.

    Example: slurm-multi reports count logs/nsight-slurm-direct --since-file logs/.profile-prestop.json
    """
    since = read_snapshot(since_file) if since_file is not None else None
    click.echo(count_new(directories, pattern, recursive, since))
