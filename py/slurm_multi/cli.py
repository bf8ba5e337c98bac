"""One click group; each subcommand group lives in its own module and is imported only when used.

`slurm-multi --help` and `--version` import nothing but click, so a node-side helper starts fast.
"""

from __future__ import annotations

import importlib

import click

from slurm_multi import __version__

# name -> (module:attribute, one-line help). The help is kept here so that listing the commands
# does not import every module (pandas and pyzmq are imported lazily inside the commands).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "manifest": ("slurm_multi.manifest:cli", "Restore a run context from a madengine build_manifest.json."),
    "gpus": ("slurm_multi.gpus:cli", "Detect GPUs and parse amd-smi / nvidia-smi output."),
    "mounts": ("slurm_multi.mounts:cli", "De-duplicate docker mount arguments."),
    "barrier": ("slurm_multi.barrier:cli", "TCP barrier: rank 0 serves, workers join, anyone can abort."),
    "results": ("slurm_multi.results:cli", "Pick the best per-node CSV and aggregate perf.csv/summary.json."),
    "reports": ("slurm_multi.reports:cli", "Wait for profiler reports to appear and settle."),
    "coordinator": ("slurm_multi.coordinator:cli", "Probe a ZeroMQ endpoint as nsight-slurm dials it."),
    "redact": ("slurm_multi.redact:cli", "Redact secret values from text on stdin."),
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


def main() -> None:
    group(prog_name="slurm-multi")
