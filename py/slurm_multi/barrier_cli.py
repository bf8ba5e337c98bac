"""`slurm-multi barrier …`: the click group of the barrier's commands, each a passthrough to its
click-free main in slurm_multi.barrier_main (one parser; the nodes start them without click)."""

from __future__ import annotations

import click

from slurm_multi.barrier_main import COMMANDS
from slurm_multi.cli import passthrough


@click.group("barrier", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """TCP barrier: rank 0 serves, workers join, rank 0 releases or aborts.

    \b
    Protocol (a challenge, then one line each way, <= 256 bytes; the token never crosses the wire):
      rank 0 -> CHALLENGE <S>
      worker -> READY <mac> <C> <rank> [image|start]
      rank 0 -> GO <mac> <rank> <image-id> | ABORT <mac> <reason> | ERR <reason>
    mac: HMAC-SHA256 keyed by the token over both nonces and the fields (docs/barrier.md).
    Exit codes: 0 ok, 1 aborted/failed, 2 usage or rejected, 3 timeout.

    \b
    Example: slurm-multi barrier serve --nnodes 2 --control-stdin
    """


for _name, (_main, _help) in COMMANDS.items():
    cli.add_command(passthrough(_name, f"slurm_multi.barrier_main:{_main.__name__}", _help))
