"""`slurm-multi job`: the batch step's click commands.

`job plan` is a passthrough to slurm_multi.plan's click-free `main` (the batch step runs it as
`python -S -m slurm_multi.plan`: one parser, one behaviour); `job watch` and `job mark-lost` are
slurm_multi.watch's functions behind click options (the batch step runs `python -S -m
slurm_multi.watch`).
"""

from __future__ import annotations

import sys

import click

from slurm_multi.cli import passthrough
from slurm_multi.common import talk


@click.group("job", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """The batch step's helpers: resolve and validate the job, write job.json."""


cli.add_command(passthrough("plan", "slurm_multi.plan:main", "Parse and check the settings; write job.json."))


@cli.command("mark-lost", short_help="Record the ranks of dead nodes as lost.")
@click.option("--jobdir", required=True, type=click.Path(file_okay=False))
@click.option("--nodes", "node_list", required=True, help="The job's nodes, space-separated, in rank order.")
@click.option("--tasks-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--not-responding", is_flag=True,
              help="Also a node Slurm cannot reach yet (the teardown: the job is ending).")  # fmt: skip
def mark_lost_command(jobdir: str, node_list: str, tasks_per_node: int, not_responding: bool) -> None:
    """Write status.json for the ranks of every node Slurm reports DOWN or failed (they never will).

    \b
    Example: slurm-multi job mark-lost --jobdir "$SM_JOBDIR" --nodes "node1 node2"
    """
    from slurm_multi.watch import mark_lost

    for node, state in mark_lost(jobdir, node_list.split(), tasks_per_node, not_responding):
        talk("multi", f"Slurm reports {node} {state}: its ranks are recorded as lost; not waiting for them")


@cli.command("watch", short_help="Watch the node tasks until the step ends.")
@click.option("--jobdir", required=True, type=click.Path(file_okay=False))
@click.option("--nodes", "node_list", required=True, help="The job's nodes, space-separated, in rank order.")
@click.option("--tasks-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--srun-pid", type=int, required=True, help="The worker step's srun: the watch ends with it.")
@click.option("--peer-grace", type=click.FloatRange(min=0), default=30, show_default=True)
@click.option("--progress-seconds", type=click.FloatRange(min=1), default=15, show_default=True)
def watch_command(
    jobdir: str,
    node_list: str,
    tasks_per_node: int,
    srun_pid: int,
    peer_grace: float,
    progress_seconds: float,
) -> None:
    """Watch the node tasks: progress, a rank's failure, a node Slurm declares DOWN or failed.

    Exits 0 when the step ended, 10 when a rank failed (or its node died) PEER_GRACE seconds ago and
    the batch step should stop the others.

    \b
    Example: slurm-multi job watch --jobdir "$SM_JOBDIR" --nodes "node1 node2" --srun-pid "$pid"
    """
    import signal

    from slurm_multi.watch import watch

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(watch(jobdir, node_list.split(), tasks_per_node, srun_pid, peer_grace, progress_seconds))
