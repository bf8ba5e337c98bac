"""`slurm-multi job`: the batch step's click commands.

`job plan` and `job watch` are passthroughs to slurm_multi.plan's and slurm_multi.watch's
click-free `main` (the batch step runs them as `python -m slurm_multi.plan` and `.watch`: one
parser, one behaviour); `job mark-lost` is slurm_multi.watch's function behind click options.
"""

from __future__ import annotations

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


cli.add_command(passthrough("watch", "slurm_multi.watch:main", "Watch the node tasks until the step ends."))
