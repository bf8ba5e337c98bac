"""`slurm-multi job`: the batch step's click commands, over slurm_multi.plan (`job plan`),
slurm_multi.watch (`job watch`, `job mark-lost`), slurm_multi.attempts (`job record-attempt`) and
slurm_multi.events (`job stages`)."""

from __future__ import annotations

import click

from slurm_multi.common import FiniteFloat, talk


@click.group("job", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """The batch step's helpers: resolve and validate the job, write job.json."""


NOT_A_DIRECTORY = click.Path(dir_okay=False)


@cli.command("plan", short_help="Parse and check the settings; write job.json.")
@click.option(
    "--batch-args",
    is_flag=True,
    help="The arguments are the batch step's argv (options, -N, --dry-run, -- CMD).",
)
@click.option(
    "--emit",
    metavar="FILE",
    type=NOT_A_DIRECTORY,
    help="Write the bash to source here (stdout stays free for --help) [stdout].",
)
@click.option("--job-id", help="SLURM_JOB_ID [default: the environment's; DRYRUN for a dry run].")
@click.option(
    "--nnodes",
    metavar="N",
    type=click.IntRange(min=1),
    help="Nodes in the job [default: SLURM_JOB_NUM_NODES; a dry run: -N, else 2].",
)
@click.option("--nodes", "node_list", default="", help="The nodes' names, space-separated.")
@click.option("--submit-dir", help="Where a relative --out is relative to [default: cwd].")
@click.option(
    "--write/--no-write",
    default=None,
    help="Create the job dir and write job.json into it "
    "[default: with --batch-args, when the job really runs].",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS...]")
def plan_command(
    batch_args: bool,
    emit: str | None,
    job_id: str | None,
    nnodes: int | None,
    node_list: str,
    submit_dir: str | None,
    write: bool | None,
    args: tuple[str, ...],
) -> None:
    """Parse the settings (the batch step's argv with --batch-args, and the environment) against the
    one settings table, validate them with the manifest, and print the plan as bash to source after
    checking the exit status; write job.json (secrets masked) when the job runs.

    \b
    Example: slurm-multi job plan --batch-args --emit plan.sh -- --manifest m.json --dry-run -N 2
    """
    from slurm_multi.plan import plan

    plan(batch_args, emit, job_id, nnodes, node_list, submit_dir, write, args)


@cli.command("mark-lost", short_help="Record the ranks of dead nodes as lost.")
@click.option("--jobdir", required=True, type=click.Path(exists=True, file_okay=False),
              help="The job's dir (it must exist: a mistyped one is refused, never made).")  # fmt: skip
@click.option("--nodes", "node_list", required=True, help="The job's nodes, space-separated, in rank order.")
@click.option("--tasks-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--not-responding", is_flag=True,
              help="Also a node Slurm cannot reach yet (the teardown: the job is ending).")  # fmt: skip
@click.option("--vanished", is_flag=True,
              help="Also the node of every rank without a status.json (the teardown, after the reaper "
              "ran on every node: what it could not stage, it could not reach).")  # fmt: skip
def mark_lost_command(
    jobdir: str, node_list: str, tasks_per_node: int, not_responding: bool, vanished: bool
) -> None:
    """Record as lost (lost.json) every node Slurm reports DOWN or failed, and write status.json for
    its ranks (they never will); also those the watch found lost on the network.

    \b
    Example: slurm-multi job mark-lost --jobdir "$SM_JOBDIR" --nodes "node1 node2"
    """
    from slurm_multi.watch import mark_lost, mark_vanished

    nodes = node_list.split()
    found = mark_lost(jobdir, nodes, tasks_per_node, not_responding)
    if vanished:
        found += mark_vanished(jobdir, nodes, tasks_per_node)
    for _, reason in found:
        talk("multi", f"{reason}: its ranks are recorded as lost; not waiting for them")


@cli.command("watch", short_help="Watch the node tasks until the step ends.")
@click.option("--jobdir", required=True, type=click.Path(file_okay=False))
@click.option("--nodes", "node_list", required=True, help="The job's nodes, space-separated, in rank order.")
@click.option("--tasks-per-node", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--srun-pid", type=int, required=True, help="The worker step's srun: the watch ends with it.")
@click.option("--peer-grace", type=FiniteFloat(min=0), default=30.0, show_default=True)
@click.option("--progress-seconds", type=FiniteFloat(min=1), default=15.0, show_default=True)
@click.option(
    "--wake-fd",
    "wake_fds",
    multiple=True,
    type=click.IntRange(min=0),
    metavar="FD",
    help="An open pipe: one empty line is written to it once every rank's workload has printed "
    "its first line (the batch step's warm helpers; repeatable).",
)
@click.option(
    "--master-port",
    type=click.IntRange(0, 65535),
    default=0,
    help="The job's MASTER_PORT: the watch dials the other nodes on a port of the job's window picked "
    "by its token (SM_BARRIER_TOKEN), never this one, to tell a node whose network is gone "
    "[0: no dialing].",
)
@click.option("--job-id", envvar="SLURM_JOB_ID", default="", help="[default: SLURM_JOB_ID]")
def watch_command(
    jobdir: str,
    node_list: str,
    tasks_per_node: int,
    srun_pid: int,
    peer_grace: float,
    progress_seconds: float,
    wake_fds: tuple[int, ...],
    master_port: int,
    job_id: str,
) -> None:
    """Watch the node tasks: progress, a rank's failure, a node Slurm declares DOWN or failed, a node
    silent on the network (with --master-port).

    Exits 0 when the step ended, 10 when a rank failed (or its node was lost) PEER_GRACE seconds
    ago and the batch step should stop the others.

    \b
    Example: slurm-multi job watch --jobdir "$SM_JOBDIR" --nodes "node1 node2" --srun-pid "$pid"
    """
    import signal
    import sys

    from slurm_multi.watch import watch

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    rc = watch(
        jobdir,
        node_list.split(),
        tasks_per_node,
        srun_pid,
        peer_grace,
        progress_seconds,
        wake_fd=list(wake_fds),
        reach_port=reach_port(master_port, job_id),
    )
    click.get_current_context().exit(rc)


def reach_port(master_port: int, job_id: str) -> int:
    """The port the watch dials the nodes on (slurm_multi.reach.secret_port: in the job's window,
    picked by its secret token); 0 without a MASTER_PORT or a token, or when the window cannot be
    worked out (said once: Slurm's word on the nodes still counts)."""
    import os

    from slurm_multi.net import read_local_port_range
    from slurm_multi.reach import secret_port

    token = os.environ.get("SM_BARRIER_TOKEN", "")
    if not master_port or not token:
        return 0
    try:
        return secret_port(token, job_id, master_port, read_local_port_range())
    except ValueError as exc:
        talk(
            "multi", f"warning: the watch does not dial the nodes ({exc}); Slurm's word on them still counts"
        )
        return 0


@cli.command("record-attempt", short_help="Write a requeued attempt's requeue.json.")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.argument("attempt", type=click.IntRange(min=0))
@click.argument("cause")
@click.argument("after_s", metavar="AFTER_S", type=click.IntRange(min=0))
@click.argument("excluded")
@click.argument("bad", nargs=-1, metavar="[NODE<TAB>REASON...]")
def record_attempt_command(
    path: str, attempt: int, cause: str, after_s: int, excluded: str, bad: tuple[str, ...]
) -> None:
    """Write FILE, the record of attempt ATTEMPT (0-based, SLURM_RESTART_COUNT) requeued for CAUSE
    (fitness, run or quarantine) AFTER_S seconds after its start, with the job's EXCLUDED nodes after
    the requeue and each bad node with its reason.

    \b
    Example: slurm-multi job record-attempt attempt_0/requeue.json 0 fitness 7 node2 $'node2\tdisk full'
    """
    from slurm_multi.attempts import AttemptError, record, write
    from slurm_multi.common import HelperError, usage_error

    try:
        document = record(attempt, cause, after_s, excluded, list(bad))
    except AttemptError as exc:
        raise usage_error(f"job record-attempt: {exc}") from None
    try:
        write(path, document)
    except OSError as exc:
        raise HelperError(f"job record-attempt: cannot write {path}: {exc.strerror}") from None


@cli.command("stages", short_help="Print each rank's stage now.")
@click.argument("jobdir", type=click.Path(exists=True, file_okay=False))
@click.argument("ranks", metavar="NRANKS", type=click.IntRange(min=0))
def stages_command(jobdir: str, ranks: int) -> None:
    """Print `node_<r>=<stage>` for each of the job's NRANKS ranks, from their stage events. JOBDIR
    must exist (a mistyped one showed every rank `starting`); NRANKS is at most a plan's node limit.

    \b
    Example: slurm-multi job stages /shared/out/toy_model/57 2
    """
    from slurm_multi.common import usage_error
    from slurm_multi.events import node_stage
    from slurm_multi.plan import MAX_NODES

    if ranks > MAX_NODES:  # a typo, not a job: 10**7 ranks took minutes and a GiB to print
        raise usage_error(f"job stages: NRANKS {ranks} is more than a job has (at most {MAX_NODES})")

    click.echo(" ".join(f"node_{r}={node_stage(jobdir, r)}" for r in range(ranks)))
