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
    "relay": ("slurm_multi.relay:cli", "Relay a docker save stream node to node, verified."),
    "results": (
        "slurm_multi.results.commands:cli",
        "Pick the best per-node CSV and aggregate perf.csv/summary.json.",
    ),
    "reports": (
        "slurm_multi.reports_cli:cli",
        "Snapshot, count and wait for new profiler reports.",
    ),
    "coordinator": ("slurm_multi.coordinator:cli", "Probe a ZeroMQ endpoint as nsight-slurm dials it."),
    "redact": ("slurm_multi.redact:cli", "Redact secret values from text on stdin."),
    "quarantine": (
        "slurm_multi.quarantine_cli:cli",
        "Show and edit the shared list of nodes later jobs avoid.",
    ),
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


class _Passthrough(click.Command):
    """A command whose arguments go, exactly as given (`--` included), to a click-free main(argv)."""

    def __init__(self, name: str, target: str, short_help: str) -> None:
        super().__init__(name, short_help=short_help, add_help_option=False)
        self.target = target

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.args = []
        ctx.params["argv"] = list(args)
        return []

    def invoke(self, ctx: click.Context) -> None:
        module_name, attr = self.target.split(":")
        entry = getattr(importlib.import_module(module_name), attr)
        ctx.exit(entry(ctx.params["argv"]))


def passthrough(name: str, target: str, short_help: str) -> click.Command:
    """`slurm-multi <group> NAME ARGS...` = `python -m <module> ARGS...`: target (`module:main`) is
    the command's one parser and behaviour; its `--help` is the target's."""
    return _Passthrough(name, target, short_help)


def main() -> None:
    import os
    import sys

    try:
        rc = group.main(prog_name="slurm-multi", standalone_mode=False)
    except click.UsageError as exc:
        # One line, never click's usage block, worded as the click-free parsers word it (argv.py).
        from slurm_multi.common import usage_error

        ctx = exc.ctx
        area = ctx.command_path.removeprefix("slurm-multi").strip() if ctx else ""
        usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)]) if ctx else "slurm-multi"
        message = " ".join(exc.format_message().split()).rstrip(".")
        where = f"{area}: " if area else ""
        usage_error(f"{where}{message}; Usage: {usage} (--help lists the options)").show()
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # HelperError: its one line (and SM_ERROR_FILE)
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(130)
    except Exception as exc:  # a bug of ours: one line, not a traceback (SM_DEBUG=1 shows it)
        if os.environ.get("SM_DEBUG") == "1":
            raise
        from slurm_multi.common import internal_error

        sys.exit(internal_error(exc))
    sys.exit(rc if isinstance(rc, int) else 0)
