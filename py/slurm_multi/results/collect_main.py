"""`results collect` without click: `python -m slurm_multi.results.collect_main JOBDIR [OPTIONS]`.

The batch step runs it once the last rank is done, before the job's verdict is known: every
millisecond it starts in is the job's. `slurm-multi results collect` is a passthrough to this
`main` (one parser, one output). Exit 0 SUCCESS, 1 FAILURE, 2 usage / bad input file, 3 the
--perf-csv lock stayed taken.

Under -S the site packages are not on the path, matplotlib neither: the batch step passes
--no-picture, and timeline.png is drawn by `slurm-multi results collect` (bin/sm-collect).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slurm_multi import EXIT_FAILURE, EXIT_OK
from slurm_multi import argv as options
from slurm_multi.common import HelperError, internal_error, run_main, talk, usage_error
from slurm_multi.results.collect import collect
from slurm_multi.results.logscan import compile_patterns
from slurm_multi.results.shared import AREA, write_atomic
from slurm_multi.results.summary import MAX_TABLE_REASONS, summary_json_text, summary_table

PARSER = options.Parser(
    "slurm-multi results collect",
    "JOBDIR",
    """Judge JOBDIR and write JOBDIR/perf.csv and JOBDIR/summary.json; exit 0 SUCCESS, 1 FAILURE.

    The job's facts come from JOBDIR/job.json; --manifest is only for job dirs whose job.json
    predates them. Also writes where the time went: JOBDIR/timeline.json, timeline.txt, and
    timeline.png when matplotlib is installed (pip install 'slurm-multi[timeline]').

    Example: slurm-multi results collect /shared/jobs/4711
             slurm-multi results collect /shared/jobs/4711 --perf-csv /shared/perf.csv""",
    [
        options.Option("--manifest", metavar="FILE", convert=options.not_a_directory,
                       help="Fallback for old job dirs: a build_manifest.json that fills model metadata "
                       "job.json lacks."),
        options.Option("--model", metavar="NAME",
                       help="Model name (or manifest key) when job.json lacks it."),
        options.Option("--error-pattern", options.MULTIPLE, metavar="REGEX", dest="error_patterns",
                       help="Extra regex that marks a node log as failed (repeatable)."),
        options.Option("--no-default-patterns", options.FLAG,
                       help="Use only --error-pattern regexes, not the built-in ones."),
        options.Option("--perf-csv", metavar="PATH",
                       help="Also append the rows to this shared madengine perf.csv (locked; created if "
                       "absent) and write them to perf_entry.csv beside it."),
        options.Option("--json", options.FLAG, dest="as_json", help="Print summary.json on stdout too."),
        options.Option("--picture", options.SWITCH, off="--no-picture", default=True,
                       help="Draw timeline.png (matplotlib) [default: --picture]. The batch step passes "
                       "--no-picture: drawing costs a second of the job's time after the verdict; "
                       "bin/sm-collect JOBDIR draws it later."),
        options.Option("--bad-nodes", metavar="FILE", convert=options.not_a_directory,
                       help="Also write the fitness stage's bad nodes to FILE, one '<rank> TAB <node> TAB "
                       "<reason>' line each (empty when there are none): the batch step quarantines and "
                       "requeues from it, so the fitness reports are judged once, here."),
        options.Option("--no-perf-csv-on-bad-nodes", options.FLAG, dest="hold_perf_csv",
                       help="With --perf-csv: append nothing when there are bad nodes (the batch step "
                       "requeues the job without them; the attempt that counts appends)."),
        options.Option("--mad-outputs", options.FLAG,
                       help="Then write madengine's perf_entry/perf_super files of a manifest model, as "
                       "`slurm-multi results mad-outputs` does with this JOBDIR, --perf-csv and "
                       "--no-perf-csv-on-bad-nodes (needs pandas); its failure is a warning, never the "
                       "exit status (bin/sm-collect)."),
    ],
    min_words=1,
    max_words=1,
)  # fmt: skip


def talk_warnings(warnings: Sequence[str], limit: int = MAX_TABLE_REASONS) -> None:
    """Each warning as one stderr line, the first `limit` of them (summary.json keeps them all)."""
    for warning in warnings[:limit]:
        talk(AREA, f"warning: {warning}")
    if len(warnings) > limit:
        talk(AREA, f"warning: +{len(warnings) - limit} more (see summary.json)")


def write_bad_nodes(path: str, bad: Sequence[Mapping[str, Any]]) -> None:
    """--bad-nodes: `<rank>\t<node>\t<reason>` lines (what `fitness judge` prints), atomically.
    A reason is one line: a tab or a line break in it would split the batch step's read."""
    lines = [
        "\t".join(" ".join(str(b[key]).split()) for key in ("rank", "node", "reason")) + "\n" for b in bad
    ]
    write_atomic(Path(path), "".join(lines), "is its directory writable?", durable=False)


def main(argv: Sequence[str]) -> int:
    """`python -m slurm_multi.results.collect_main JOBDIR [OPTIONS]` (= `slurm-multi results collect`)."""
    return run_main(_main, argv)


def _main(argv: Sequence[str]) -> int:
    given = PARSER.parse(argv)
    if given is None:
        return EXIT_OK
    try:
        jobdir = Path(options.not_a_file(given.args[0]))
    except ValueError:
        raise PARSER.fail(f"Invalid value for 'JOBDIR': {given.args[0]!r} is a file") from None
    return run_collect(
        jobdir,
        Path(given.manifest) if given.manifest is not None else None,
        given.model,
        given.error_patterns,
        given.no_default_patterns,
        given.perf_csv,
        given.as_json,
        given.picture,
        given.bad_nodes,
        given.hold_perf_csv,
        given.mad_outputs,
    )


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
) -> int:
    """Collect JOBDIR: summary.json, perf.csv, the timeline, the table on stderr, --perf-csv,
    --bad-nodes, --mad-outputs; the exit."""
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

        done = append_perf_csv(perf_csv, summary.perf_header, summary.perf_rows)
        grown = f"; new columns: {', '.join(done.new_columns)}" if done.new_columns else ""
        verb = "created" if done.created else "appended to"
        talk(AREA, f"{done.rows} rows {verb} {done.path}{grown}; this run's rows: {done.entry}")
    if mad_outputs:
        mad_outputs_or_warn(jobdir, perf_csv, hold_perf_csv)
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
            traceback.print_exc()
        else:
            internal_error(exc)
    else:
        return
    talk("collect", "warning: madengine's perf_entry/perf_super files not written (see above)")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
