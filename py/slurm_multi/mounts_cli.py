"""`slurm-multi mounts dedup`: the click command over slurm_multi.mounts (which has no click: every
node's prepare de-duplicates its mounts through it)."""

from __future__ import annotations

import click

from slurm_multi.common import talk, usage_error
from slurm_multi.mounts import AREA, dedup_mounts


@click.group("mounts", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """De-duplicate docker mount arguments."""


@cli.command("dedup")
@click.option(
    "--mount", "mounts", multiple=True, metavar="HOST:CONTAINER[:ro]", help="A mount to add (repeatable)."
)
@click.option("-0", "null_terminated", is_flag=True, help="End each argument with NUL instead of a newline.")
@click.argument("docker_opts", nargs=-1, type=click.UNPROCESSED, metavar="-- [DOCKER_OPTS...]")
def dedup_command(mounts: tuple[str, ...], null_terminated: bool, docker_opts: tuple[str, ...]) -> None:
    """Print DOCKER_OPTS, then `-v MOUNT` for each --mount whose container path is free, one per line.

    Example:
      mapfile -d '' -t opts < <(slurm-multi mounts dedup -0 --mount /s:/data -- "${SM_DOCKER_OPTS[@]}")
    """
    args, dropped = dedup_mounts(list(docker_opts), list(mounts))
    for message in dropped:
        talk(AREA, message)
    if not null_terminated and any("\n" in arg for arg in args):
        raise usage_error(f"{AREA}: an argument contains a newline; use -0 for NUL-terminated output")
    terminator = "\0" if null_terminated else "\n"
    click.echo("".join(arg + terminator for arg in args), nl=False)
