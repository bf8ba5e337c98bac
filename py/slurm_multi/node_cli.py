"""`slurm-multi node`: a node's click commands (the library is slurm_multi.node).

`node prepare` is a passthrough to slurm_multi.node's click-free `prepare_main` (every task runs it as
`python -m slurm_multi.node prepare`: one parser, one behaviour); `node status` writes status.json
through slurm_multi.statusfile (whose click-free entry the tasks run); `node from-job` restores a
finished job's settings for one rank.
"""

from __future__ import annotations

import os
import sys

import click

from slurm_multi.cli import passthrough
from slurm_multi.common import HelperError, usage_error


@click.group("node", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """A node's helpers: prepare the context, write status.json, re-run a stage of a finished job."""


cli.add_command(
    passthrough("prepare", "slurm_multi.node:prepare_main", "Resolve and check this node's run context.")
)


@cli.command("status")
@click.option("--file", "path", required=True, help="Where to write status.json (atomically).")
@click.option("--rank", type=int, required=True)
@click.option("--node", "node_name", required=True)
@click.option("--exit-code", type=int, required=True)
@click.option("--reason", default="")
@click.option("--image-id", default="")
@click.option("--terminated", is_flag=True, help="The task was stopped by a signal.")
@click.option("--stage", "stages", multiple=True, metavar="NAME:SECONDS:STATUS[:EXIT]")
def status_command(
    path: str, rank: int, node_name: str, exit_code: int, reason: str, image_id: str, terminated: bool,
    stages: tuple[str, ...],
) -> None:  # fmt: skip
    """Write a node's status.json (the verdict's input).

    \b
    Example: slurm-multi node status --file node_1/status.json --rank 1 --node node2 --exit-code 0 \\
               --stage prepare:0.12:ok --stage run:1.30:ok:0
    """
    from slurm_multi.statusfile import StatusError, status_document, write_status

    try:
        document = status_document(rank, node_name, exit_code, reason, image_id, stages, terminated)
    except StatusError as exc:
        raise usage_error(str(exc)) from None
    try:
        write_status(path, document)
    except OSError as exc:
        raise HelperError(f"node status: cannot write {path}: {exc.strerror}") from None


@cli.command("from-job", short_help="Restore a finished job's settings for a rank.")
@click.argument("jobdir", type=click.Path(exists=True, file_okay=False))
@click.option("--rank", type=int, required=True, help="The rank whose stage to re-run.")
def from_job_command(jobdir: str, rank: int) -> None:
    """Print bash that restores a finished job's settings for one rank (sm-node --from-job uses it).

    \b
    Example: slurm-multi node from-job /shared/out/toy_model/57 --rank 1
    """
    from slurm_multi.node import from_job

    text = from_job(os.path.abspath(jobdir), rank, os.environ)
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
