"""`slurm-multi results pick|collect`: thin click wrappers over pick, collect and perfcsv."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import click

from slurm_multi import EXIT_FAILURE, EXIT_OK
from slurm_multi.common import HelperError, talk, usage_error
from slurm_multi.results.collect import collect
from slurm_multi.results.logscan import compile_patterns
from slurm_multi.results.perfcsv import append_perf_csv, check_target
from slurm_multi.results.pick import no_candidate_message, pick_best
from slurm_multi.results.shared import AREA
from slurm_multi.results.summary import MAX_TABLE_REASONS, summary_json_text, summary_table


def talk_warnings(warnings: Sequence[str], limit: int = MAX_TABLE_REASONS) -> None:
    """Each warning as one stderr line, the first `limit` of them (summary.json keeps them all)."""
    for warning in warnings[:limit]:
        talk(AREA, f"warning: {warning}")
    if len(warnings) > limit:
        talk(AREA, f"warning: +{len(warnings) - limit} more (see summary.json)")


@click.group("results", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Pick the best per-node results CSV and aggregate a job into perf.csv + summary.json.

    Exit codes: 0 success, 1 failure (FAILURE verdict, no usable CSV), 2 usage / bad input file,
    3 the --perf-csv lock stayed taken.
    """


@cli.command("pick")
@click.argument("csv_paths", metavar="CSV...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the choice and every candidate's score as JSON.")
def pick_command(csv_paths: tuple[str, ...], as_json: bool) -> None:
    """Print the CSV with the most performance values (finite numbers).

    Ties go to more rows, then to the LATER argument (pass them in rank order: the last global rank
    usually holds the throughput). A broken candidate is scored with its error, never fatal; a
    malformed row is dropped with a warning on stderr.

    Example: slurm-multi results pick JOBDIR/node_*/perf_toy.csv
    """
    chosen, candidates = pick_best(list(csv_paths))
    warnings = [warning for candidate in candidates for warning in candidate.warnings]
    talk_warnings(warnings)
    if as_json:
        payload = {
            "chosen": chosen.path if chosen else None,
            "candidates": [c.to_dict() for c in candidates],
            "warnings": warnings,
        }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    elif chosen is not None:
        click.echo(chosen.path)
    if chosen is None:
        raise HelperError(f"{AREA}: {no_candidate_message(candidates)}", EXIT_FAILURE)


@cli.command("collect", short_help="Judge a job dir; write perf.csv and summary.json.")
@click.argument("jobdir", metavar="JOBDIR", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Fallback for old job dirs: a build_manifest.json that fills model metadata job.json lacks.",
)
@click.option("--model", metavar="NAME", help="Model name (or manifest key) when job.json lacks it.")
@click.option(
    "--error-pattern",
    "error_patterns",
    multiple=True,
    metavar="REGEX",
    help="Extra regex that marks a node log as failed (repeatable).",
)
@click.option(
    "--no-default-patterns", is_flag=True, help="Use only --error-pattern regexes, not the built-in ones."
)
@click.option(
    "--perf-csv",
    "perf_csv",
    metavar="PATH",
    help="Also append the rows to this shared madengine perf.csv (locked; created if absent) and "
    "write them to perf_entry.csv beside it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print summary.json on stdout too.")
@click.option(
    "--picture/--no-picture",
    default=True,
    show_default=True,
    help="Draw timeline.png (matplotlib). The batch step passes --no-picture: drawing costs a second "
    "of the job's time after the verdict; bin/sm-collect JOBDIR draws it later.",
)
def collect_command(
    jobdir: Path,
    manifest: Path | None,
    model: str | None,
    error_patterns: tuple[str, ...],
    no_default_patterns: bool,
    perf_csv: str | None,
    as_json: bool,
    picture: bool,
) -> None:
    """Judge JOBDIR and write JOBDIR/perf.csv and JOBDIR/summary.json; exit 0 SUCCESS, 1 FAILURE.

    The job's facts come from JOBDIR/job.json; --manifest is only for job dirs whose job.json
    predates them. Also writes where the time went: JOBDIR/timeline.json, timeline.txt, and
    timeline.png when matplotlib is installed (pip install 'slurm-multi[timeline]').

    \b
    Example: slurm-multi results collect /shared/jobs/4711
             slurm-multi results collect /shared/jobs/4711 --perf-csv /shared/perf.csv
    """
    if not jobdir.is_dir():
        raise usage_error(f"{AREA}: job directory {jobdir} does not exist; pass the directory the job wrote")
    if manifest is not None and not manifest.is_file():
        raise usage_error(f"{AREA}: manifest {manifest} does not exist")
    if perf_csv is not None:
        check_target(perf_csv)
    patterns = compile_patterns(error_patterns, defaults=not no_default_patterns)
    summary = collect(jobdir, manifest, model, patterns, picture=picture)
    talk_warnings(summary.warnings)
    if as_json:
        click.echo(summary_json_text(summary), nl=False)
    for line in summary_table(summary, jobdir):
        click.echo(line, err=True)
    if perf_csv is not None:
        done = append_perf_csv(perf_csv, summary.perf_header, summary.perf_rows)
        grown = f"; new columns: {', '.join(done.new_columns)}" if done.new_columns else ""
        verb = "created" if done.created else "appended to"
        talk(AREA, f"{done.rows} rows {verb} {done.path}{grown}; this run's rows: {done.entry}")
    click.get_current_context().exit(EXIT_OK if summary.verdict == "SUCCESS" else EXIT_FAILURE)
