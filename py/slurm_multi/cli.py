"""One click group; each subcommand group lives in its own module and is imported only when used.

`slurm-multi --help` and `--version` import nothing but click, so a node-side helper starts fast.
"""

from __future__ import annotations

import importlib

import click

from slurm_multi import __version__

# name -> (module:attribute, one-line help). The help is kept here so that listing the commands
# does not import every module (pyzmq is imported lazily inside the commands that talk ZeroMQ).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "job": ("slurm_multi.job:cli", "The batch step: check the job, write job.json, watch."),
    "node": ("slurm_multi.node_cli:cli", "A node: prepare its context, write status.json, re-run a stage."),
    "manifest": (
        "slurm_multi.manifest_cli:cli",
        "Restore a run context from a madengine build_manifest.json.",
    ),
    "gpus": ("slurm_multi.gpus_cli:cli", "Detect GPUs and parse amd-smi / nvidia-smi output."),
    "mounts": ("slurm_multi.mounts_cli:cli", "De-duplicate docker mount arguments."),
    "barrier": ("slurm_multi.barrier_cli:cli", "TCP barrier: rank 0 serves, workers join, anyone can abort."),
    "fitness": ("slurm_multi.fitness.cli:cli", "Check every node and the network between them, in seconds."),
    "relay": ("slurm_multi.relay.cli:cli", "Relay a docker save stream node to node, verified."),
    "layers": (
        "slurm_multi.layers.cli:cli",
        "Move only the image layers a node lacks (plan, filter, cache).",
    ),
    "results": (
        "slurm_multi.results.commands:cli",
        "Pick the best per-node CSV and aggregate perf.csv/summary.json.",
    ),
    "report": (
        "slurm_multi.report.commands:cli",
        "Write a job's page (report.html) or the page across runs.",
    ),
    "reports": (
        "slurm_multi.reports_cli:cli",
        "Snapshot, count and wait for new profiler reports.",
    ),
    "coordinator": ("slurm_multi.coordinator:cli", "Probe a ZeroMQ endpoint as nsight-slurm dials it."),
    "redact": ("slurm_multi.redact:cli", "Redact secret values from text on stdin."),
    "settings": ("slurm_multi.settings_cli:cli", "Resolve the settings alone, or print their table."),
    "quarantine": (
        "slurm_multi.quarantine_cli:cli",
        "Show and edit the shared list of nodes later jobs avoid.",
    ),
    "warm": ("slurm_multi.warm:cli", "Start a command before its moment; its arguments come on stdin."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in SUBCOMMANDS:
            return None
        target, _ = SUBCOMMANDS[cmd_name]
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SUBCOMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Example: slurm-multi results pick node_*/perf_toy.csv",
)
@click.version_option(__version__, prog_name="slurm-multi")
def group() -> None:
    """slurm-multi node-side helpers (one per stage of a multi-node job)."""


def run(args: list[str] | None = None) -> int:
    """`slurm-multi ARGS…` (sys.argv when None) in this process: its exit code. Every error is one
    line on stderr (and in SM_ERROR_FILE): a usage error names the option and the command, worded
    `<area> <command>: <what>; Usage: …`; a HelperError is its own line; a bug of ours is one line
    too (SM_DEBUG=1 shows the traceback)."""
    import os
    import sys

    try:
        rc = group.main(args=args, prog_name="slurm-multi", standalone_mode=False)
    except click.UsageError as exc:
        from slurm_multi.common import usage_error

        ctx = exc.ctx or _context_of(sys.argv[1:] if args is None else args)
        area = ctx.command_path.removeprefix("slurm-multi").strip()
        usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)])
        message = " ".join(exc.format_message().split()).rstrip(".")
        where = f"{area}: " if area else ""
        error = usage_error(f"{where}{message}; Usage: {usage} (--help lists the options)")
        error.show()
        return error.exit_code
    except click.ClickException as exc:  # HelperError: its one line (and SM_ERROR_FILE)
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 130
    except Exception as exc:  # a bug of ours: one line, not a traceback (SM_DEBUG=1 shows it)
        if os.environ.get("SM_DEBUG") == "1":
            raise
        from slurm_multi.common import internal_error

        return internal_error(exc)
    return rc if isinstance(rc, int) else 0


def _context_of(args: list[str]) -> click.Context:
    """The context of the command `args` name (a usage error click raised without one: an option
    given without its value): its words down the groups, as click would have resolved them."""
    ctx = click.Context(group, info_name="slurm-multi")
    for word in args:
        command = ctx.command
        found = command.get_command(ctx, word) if isinstance(command, click.Group) else None
        if found is None:
            break
        ctx = click.Context(found, info_name=word, parent=ctx)
    return ctx


def main() -> None:
    import sys

    sys.exit(run())
