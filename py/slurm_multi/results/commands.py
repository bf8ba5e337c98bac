"""`slurm-multi results pick|collect`: thin click wrappers over pick, and `collect` a passthrough to
slurm_multi.results.collect_main (the batch step's click-free entry: one parser, one output)."""

from __future__ import annotations

import json

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
