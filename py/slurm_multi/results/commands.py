"""`slurm-multi results pick|collect|mad-outputs`: click commands over pick, collect and madoutputs.

`results collect` is what the batch step runs once the last rank is done (exit 0 SUCCESS, 1
FAILURE, 2 usage / bad input file, 3 the --perf-csv lock stayed taken); `run_collect` is its body."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from slurm_multi import EXIT_FAILURE, EXIT_OK
from slurm_multi.common import HelperError, internal_error, talk, usage_error
from slurm_multi.results.collect import collect
from slurm_multi.results.logscan import compile_patterns
from slurm_multi.results.pick import no_candidate_message, pick_best
from slurm_multi.results.shared import AREA, write_atomic
from slurm_multi.results.summary import MAX_TABLE_REASONS, summary_json_text, summary_table


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


NOT_A_DIRECTORY = click.Path(dir_okay=False)


@cli.command("collect", short_help="Judge a job dir; write perf.csv and summary.json.")
@click.argument("jobdir", type=click.Path(file_okay=False))
@click.option(
    "--manifest",
    metavar="FILE",
    type=NOT_A_DIRECTORY,
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
    metavar="PATH",
    help="Also append the rows to this shared madengine perf.csv (locked; created if absent) and "
    "write them to perf_entry.csv beside it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print summary.json on stdout too.")
@click.option(
    "--picture/--no-picture",
    default=True,
    help="Draw timeline.png (matplotlib) [default: --picture]. The batch step passes --no-picture: "
    "drawing costs a second of the job's time after the verdict; bin/sm-collect JOBDIR draws it later.",
)
@click.option(
    "--bad-nodes",
    metavar="FILE",
    type=NOT_A_DIRECTORY,
    help="Also write the fitness stage's bad nodes to FILE, one '<rank> TAB <node> TAB <reason>' line "
    "each (empty when there are none): the batch step quarantines and requeues from it, so the "
    "fitness reports are judged once, here.",
)
@click.option(
    "--no-perf-csv-on-bad-nodes",
    "hold_perf_csv",
    is_flag=True,
    help="With --perf-csv: append nothing when there are bad nodes (the batch step requeues the job "
    "without them; the attempt that counts appends).",
)
@click.option(
    "--mad-outputs",
    is_flag=True,
    help="Then write madengine's perf_entry/perf_super files of a manifest model, as `slurm-multi results "
    "mad-outputs` does with this JOBDIR, --perf-csv and --no-perf-csv-on-bad-nodes (needs pandas); its "
    "failure is a warning, never the exit status (bin/sm-collect).",
)
@click.option(
    "--page",
    is_flag=True,
    help="Last, write the job's page JOBDIR/report.html, as `slurm-multi report JOBDIR` does; its failure "
    "is a warning, never the exit status (bin/sm-collect).",
)
def collect_command(
    jobdir: str,
    manifest: str | None,
    model: str | None,
    error_patterns: tuple[str, ...],
    no_default_patterns: bool,
    perf_csv: str | None,
    as_json: bool,
    picture: bool,
    bad_nodes: str | None,
    hold_perf_csv: bool,
    mad_outputs: bool,
    page: bool,
) -> None:
    """Judge JOBDIR and write JOBDIR/perf.csv and JOBDIR/summary.json; exit 0 SUCCESS, 1 FAILURE.

    The job's facts come from JOBDIR/job.json; --manifest is only for job dirs whose job.json
    predates them. Also writes where the time went: JOBDIR/timeline.json, timeline.txt, and
    timeline.png when matplotlib is installed (pip install 'slurm-multi[timeline]').

    \b
    Example: slurm-multi results collect /shared/jobs/4711
             slurm-multi results collect /shared/jobs/4711 --perf-csv /shared/perf.csv
    """
    rc = run_collect(
        Path(jobdir),
        Path(manifest) if manifest is not None else None,
        model,
        error_patterns,
        no_default_patterns,
        perf_csv,
        as_json,
        picture,
        bad_nodes,
        hold_perf_csv,
        mad_outputs,
        page,
    )
    click.get_current_context().exit(rc)


def talk_warnings(warnings: Sequence[str], limit: int = MAX_TABLE_REASONS) -> None:
    """Each warning as one stderr line, the first `limit` of them (summary.json keeps them all)."""
    for warning in warnings[:limit]:
        talk(AREA, f"warning: {warning}")
    if len(warnings) > limit:
        talk(AREA, f"warning: +{len(warnings) - limit} more (see summary.json)")


def write_bad_nodes(path: str, bad: Sequence[Mapping[str, Any]]) -> None:
    """--bad-nodes: `<rank>\t<node>\t<reason>\t<evidence>` lines (what `fitness judge` prints),
    atomically. A reason is one line: a tab or a line break in it would split the batch step's read."""
    lines = [
        "\t".join(" ".join(str(b.get(key, "none")).split()) for key in ("rank", "node", "reason", "evidence"))
        + "\n"
        for b in bad
    ]
    write_atomic(Path(path), "".join(lines), "is its directory writable?", durable=False)


def run_collect(
    jobdir: Path,
    manifest: Path | None,
    model: str | None,
    error_patterns: Sequence[str],
    no_default_patterns: bool,
    perf_csv: str | None,
    as_json: bool,
    picture: bool,
    bad_nodes: str | None = None,
    hold_perf_csv: bool = False,
    mad_outputs: bool = False,
    page: bool = False,
) -> int:
    """Collect JOBDIR: summary.json, perf.csv, the timeline, the table on stderr, --perf-csv,
    --bad-nodes, --mad-outputs, --page; the exit."""
    if not jobdir.is_dir():
        raise usage_error(f"{AREA}: job directory {jobdir} does not exist; pass the directory the job wrote")
    if manifest is not None and not manifest.is_file():
        raise usage_error(f"{AREA}: manifest {manifest} does not exist")
    if perf_csv is not None:
        from slurm_multi.results.perfcsv import check_target

        check_target(perf_csv)
    patterns = compile_patterns(error_patterns, defaults=not no_default_patterns)
    summary = collect(jobdir, manifest, model, patterns, picture=picture)
    if bad_nodes is not None:
        write_bad_nodes(bad_nodes, summary.bad_nodes)
    talk_warnings(summary.warnings)
    if as_json:
        sys.stdout.write(summary_json_text(summary))
        sys.stdout.flush()
    for line in summary_table(summary, jobdir):
        print(line, file=sys.stderr, flush=True)
    if perf_csv is not None and hold_perf_csv and summary.bad_nodes:
        talk(AREA, f"bad nodes: no rows appended to {perf_csv} (the job is to be requeued without them)")
    elif perf_csv is not None:
        from slurm_multi.results.perfcsv import append_perf_csv
        from slurm_multi.results.stagehistory import stage_record

        stages = stage_record(summary.job_id, summary.model, summary.verdict, summary.nodes)
        done = append_perf_csv(perf_csv, summary.perf_header, summary.perf_rows, stages=stages)
        grown = f"; new columns: {', '.join(done.new_columns)}" if done.new_columns else ""
        verb = "created" if done.created else "appended to"
        talk(AREA, f"{done.rows} rows {verb} {done.path}{grown}; this run's rows: {done.entry}")
    if mad_outputs:
        mad_outputs_or_warn(jobdir, perf_csv, hold_perf_csv)
    if page:
        page_or_warn(jobdir)
    return EXIT_OK if summary.verdict == "SUCCESS" else EXIT_FAILURE


def mad_outputs_or_warn(jobdir: Path, perf_csv: str | None, hold_perf_csv: bool) -> None:
    """--mad-outputs: `results mad-outputs` for what collect was given, once the job is judged. Its
    failure is its own one line, then a warning: never collect's exit status."""
    from slurm_multi.results.madoutputs import mad_outputs

    try:
        mad_outputs(jobdir, perf_csv, hold_perf_csv)
    except HelperError as exc:
        exc.show()
    except Exception as exc:  # a bug of ours: one line, as every helper says one (SM_DEBUG=1: the traceback)
        if os.environ.get("SM_DEBUG") == "1":
            raise
        internal_error(exc)
    else:
        return
    talk("collect", "warning: madengine's perf_entry/perf_super files not written (see above)")


def page_or_warn(jobdir: Path) -> None:
    """--page: `slurm-multi report JOBDIR` once the job is judged (and madengine's files are
    written). Its failure is its own one line, then a warning: never collect's exit status."""
    from slurm_multi.report.commands import job_page_or_warn

    job_page_or_warn(jobdir)


@cli.command("mad-outputs")
@click.argument("jobdir", metavar="JOBDIR")
@click.option("--perf-csv", metavar="PATH",
              help="The shared perf.csv collect appended the job's rows to: also write perf_super.json "
              "(cumulative), perf_super.csv, perf_entry_super.json/.csv and perf_entry.json beside it, "
              "under its lock.")  # fmt: skip
@click.option("--no-perf-csv-on-bad-nodes", "hold", is_flag=True,
              help="With --perf-csv: write nothing beside it when summary.json names bad nodes (as "
              "collect's option of the same name, which then appended nothing).")  # fmt: skip
@click.option("--page", is_flag=True,
              help="Then write the job's page JOBDIR/report.html, as `slurm-multi report JOBDIR` does; "
              "its failure is a warning (a manifest job's batch step: the page after madengine's "
              "files).")  # fmt: skip
def mad_outputs_command(jobdir: str, perf_csv: str | None, hold: bool, page: bool) -> None:
    """Write madengine's perf_entry.json/.csv, perf_super.json/.csv and perf_entry_super.json/.csv into
    a collected JOBDIR, from its perf.csv, summary.json and job.json.

    Each result row carries the row of the `--config` file (named in the model's args) that matches
    its model, and the chosen CSV's other columns as `multi_results`. A job without a manifest model
    is said in one line and exits 0. Needs pandas. Run after `results collect` (the batch step does,
    after the verdict).

    Example: slurm-multi results mad-outputs /shared/jobs/4711 --perf-csv /shared/perf.csv
    """
    from slurm_multi.results.madoutputs import mad_outputs

    try:
        mad_outputs(Path(jobdir), perf_csv, hold)
    finally:
        if page:
            page_or_warn(Path(jobdir))
