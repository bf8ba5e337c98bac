"""`slurm-multi node`: a node's click commands (the library is slurm_multi.node).

`node prepare` resolves and checks a task's run context (slurm_multi.node.prepare, every task runs
it first); `node status` writes status.json through slurm_multi.statusfile (every task, last);
`node from-job` restores a finished job's settings for one rank.
"""

from __future__ import annotations

import os
import sys

import click

from slurm_multi.common import FiniteFloat, HelperError, usage_error


@click.group("node", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """A node's helpers: prepare the context, write status.json, re-run a stage of a finished job."""


@cli.command("prepare", short_help="Resolve and check this node's run context.")
@click.option(
    "--scratch",
    metavar="DIR",
    required=True,
    type=click.Path(file_okay=False),
    help="The task's scratch dir.",
)
@click.option("--no-detect", is_flag=True, help="Skip GPU detection and GPU arguments (dry run).")
@click.option("--node-scratch", metavar="DIR", help="The scratch path the docker arguments name (dry run).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def prepare_command(
    scratch: str, no_detect: bool, node_scratch: str | None, command: tuple[str, ...]
) -> None:
    """Detect GPUs, resolve the run context, check it; write context.sh and friends into SCRATCH.

    \b
    Example: slurm-multi node prepare --scratch /tmp/sm.57.r0 && source /tmp/sm.57.r0/context.sh
    """
    from slurm_multi.node import prepare

    prepare(os.environ, scratch, list(command), detect=not no_detect, shown_scratch=node_scratch)


@cli.command("status")
@click.option("--file", "path", required=True, help="Where to write status.json (atomically).")
@click.option("--rank", type=int, required=True)
@click.option("--node", "node_name", required=True)
@click.option("--exit-code", type=int, required=True)
@click.option("--reason", default="")
@click.option("--image-id", default="")
@click.option("--terminated", is_flag=True, help="The task was stopped by a signal.")
@click.option("--stage", "stages", multiple=True, metavar="NAME:SECONDS:STATUS[:EXIT]")
@click.option("--node-fault", default="", metavar="TEXT",
              help="The rank's failure is its node's own fault (`node fault` said which).")  # fmt: skip
def status_command(
    path: str, rank: int, node_name: str, exit_code: int, reason: str, image_id: str, terminated: bool,
    stages: tuple[str, ...], node_fault: str,
) -> None:  # fmt: skip
    """Write a node's status.json (the verdict's input).

    \b
    Example: slurm-multi node status --file node_1/status.json --rank 1 --node node2 --exit-code 0 \\
               --stage prepare:0.12:ok --stage run:1.30:ok:0
    """
    from slurm_multi.statusfile import StatusError, status_document, write_status

    try:
        document = status_document(
            rank, node_name, exit_code, reason, image_id, stages, terminated, node_fault
        )
    except StatusError as exc:
        raise usage_error(str(exc)) from None
    try:
        write_status(path, document)
    except OSError as exc:
        raise HelperError(f"node status: cannot write {path}: {exc.strerror}") from None


@cli.command("fault", short_help="Print this node's own fault after a failed run (or nothing).")
@click.option("--runtime", type=click.Choice(["docker", "pyxis", "none"]), required=True)
@click.option("--scratch", metavar="DIR", default="", help="The rank's scratch dir (the local disk).")
@click.option("--hang-json", metavar="FILE", default="",
              help="The rank's hang.json: a node fault its hang watch named there wins.")  # fmt: skip
@click.option("--node", "node_name", default="", help="[default: this host]")
def fault_command(runtime: str, scratch: str, hang_json: str, node_name: str) -> None:
    """Print, in one line, this node's own fault that explains a rank's failed or hung run: the one
    its hang watch named, else the docker engine not answering, else the local disk failing (the
    checks of slurm_multi.nodefault, each bounded). Nothing when the node looks healthy; exit 0.

    \b
    Example: slurm-multi node fault --runtime docker --scratch /tmp/slurm-multi.57.r1 \
               --hang-json node_1/hang.json
    """
    from slurm_multi.nodefault import node_fault, read_hang_fault
    from slurm_multi.secret_rule import reason_line
    from slurm_multi.statusfile import MAX_REASON

    found = read_hang_fault(hang_json) if hang_json else ""
    if not found:
        found = node_fault(os.environ, node_name or os.uname().nodename, runtime, scratch)
    if found:  # (a hang.json is a file on the shared disk: its text is masked like any reason)
        click.echo(reason_line(found, MAX_REASON))


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


@cli.command("hang-watch", short_help="Watch one rank's workload for a hang.")
@click.option("--container", help="The docker container's name (the docker runtime).")
@click.option("--pid", type=int, help="The workload's process (bare metal).")
@click.option("--step", metavar="JOB.STEP", help="The Slurm step whose tasks here are the workload (pyxis).")
@click.option(
    "--timeout",
    type=FiniteFloat(min=0),
    required=True,
    metavar="SECONDS",
    help="Seconds without output and CPU.",
)
@click.option("--output", metavar="FILE", required=True, help="The file the workload's output lands in.")
@click.option("--node-dir", metavar="DIR", required=True, help="Where progress.json and hang.json go.")
@click.option("--diagnostics", metavar="DIR", default="", help="Where the hang's diagnostics go.")
@click.option("--rank", type=int, default=0, show_default=True)
@click.option("--node", "node_name", envvar="SLURMD_NODENAME", default="", help="[default: this host]")
@click.option("--poll", type=FiniteFloat(min=0), default=1.0, show_default=True, metavar="SECONDS")
@click.option("--progress-every", type=FiniteFloat(min=0), default=5.0, show_default=True, metavar="SECONDS")
@click.option("--docker", default="docker", show_default=True)
@click.option("--job-dir", metavar="DIR", default="", help="The job dir holding every rank's node_<r>/.")
@click.option(
    "--ranks", type=int, default=1, show_default=True, help="Ranks in the job (node_0 … node_<n-1>)."
)
@click.option(
    "--hold",
    type=FiniteFloat(min=0),
    default=0.0,
    show_default=True,
    metavar="SECONDS",
    help="A rank found hung or waiting holds its stop up to this long for the other ranks' watches.",
)
@click.option(
    "--local-dir",
    metavar="DIR",
    default="",
    help="A dir on the node's local disk (the rank's scratch): when the rank is found hung, the "
    "node's own faults are checked (docker engine, this disk, the clock) and named in hang.json.",
)
def hang_watch_command(
    container: str | None,
    pid: int | None,
    step: str | None,
    timeout: float,
    output: str,
    node_dir: str,
    diagnostics: str,
    rank: int,
    node_name: str,
    poll: float,
    progress_every: float,
    docker: str,
    job_dir: str,
    ranks: int,
    hold: float,
    local_dir: str,
) -> None:
    """Watch one rank's workload for a hang (no output and no CPU for --timeout seconds): exit 3 and
    hang.json when it hangs, 0 when the workload ends (or the run stage's SIGTERM comes).

    Give exactly one of --container, --pid, --step. The run stage starts it (lib/run.sh).

    \b
    Example: slurm-multi node hang-watch --container sm-57-r1 --timeout 900 \\
               --output node.log --node-dir node_1
    """
    from slurm_multi import hangwatch

    hangwatch.check_arguments(container, pid, step, timeout, poll, ranks)
    target = hangwatch.Target(container=container or "", pid=pid or 0, step=step or "", docker=docker)
    peers = hangwatch.Peers(job_dir, ranks, hold) if job_dir else None
    node = node_name or os.uname().nodename
    check = None
    if local_dir:
        from slurm_multi.nodefault import NodeCheck

        check = NodeCheck(node, "docker" if container else "pyxis" if step else "none", local_dir)
    try:
        rc = hangwatch.run_until_stopped(target, output, timeout, node_dir, rank, node, poll, progress_every,
                                         diagnostics, peers, check)  # fmt: skip
    except hangwatch.Stopped:  # the run stage's SIGTERM as the watch returned
        rc = 0
    click.get_current_context().exit(rc)


@cli.command("fingerprint", short_help="Print an image's build fingerprint.")
@click.argument("dockerfile")
@click.argument("context")
@click.argument("build_args", nargs=-1, metavar="[BUILD_ARG...]")
def fingerprint_command(dockerfile: str, context: str, build_args: tuple[str, ...]) -> None:
    """Print the build fingerprint of DOCKERFILE, the files of CONTEXT and the BUILD_ARGs (32 hex
    digits; nothing when there is no DOCKERFILE).

    \b
    Example: slurm-multi node fingerprint docker/toy.Dockerfile docker
    """
    from slurm_multi.fingerprint import fingerprint

    sys.stdout.write(fingerprint(dockerfile, context, list(build_args)))
