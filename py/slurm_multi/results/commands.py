"""`slurm-multi results pick|collect|mad-outputs`: thin click wrappers over pick and madoutputs, and
`collect` a passthrough to slurm_multi.results.collect_main (the batch step's click-free entry: one
parser, one output)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from slurm_multi import EXIT_FAILURE
from slurm_multi.cli import passthrough
from slurm_multi.common import HelperError
from slurm_multi.results.collect_main import talk_warnings
from slurm_multi.results.pick import no_candidate_message, pick_best
from slurm_multi.results.shared import AREA


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


cli.add_command(
    passthrough(
        "collect",
        "slurm_multi.results.collect_main:main",
        "Judge a job dir; write perf.csv and summary.json.",
    )
)


@cli.command("mad-outputs")
@click.argument("jobdir", metavar="JOBDIR")
@click.option("--perf-csv", metavar="PATH",
              help="The shared perf.csv collect appended the job's rows to: also write perf_super.json "
              "(cumulative), perf_super.csv, perf_entry_super.json/.csv and perf_entry.json beside it, "
              "under its lock.")  # fmt: skip
@click.option("--no-perf-csv-on-bad-nodes", "hold", is_flag=True,
              help="With --perf-csv: write nothing beside it when summary.json names bad nodes (as "
              "collect's option of the same name, which then appended nothing).")  # fmt: skip
def mad_outputs_command(jobdir: str, perf_csv: str | None, hold: bool) -> None:
    """Write madengine's perf_entry.json/.csv, perf_super.json/.csv and perf_entry_super.json/.csv into
    a collected JOBDIR, from its perf.csv, summary.json and job.json.

    Each result row carries the row of the `--config` file (named in the model's args) that matches
    its model, and the chosen CSV's other columns as `multi_results`. A job without a manifest model
    is said in one line and exits 0. Needs pandas. Run after `results collect` (the batch step does,
    after the verdict).

    Example: slurm-multi results mad-outputs /shared/jobs/4711 --perf-csv /shared/perf.csv
    """
    from slurm_multi.results.madoutputs import mad_outputs

    mad_outputs(Path(jobdir), perf_csv, hold)
