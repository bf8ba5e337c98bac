"""`slurm-multi manifest restore`: the click command over slurm_multi.manifest (which has no click:
every node's prepare reads the manifest through it)."""

from __future__ import annotations

import sys

import click

from slurm_multi.common import talk
from slurm_multi.manifest import AREA, load_manifest, render_bash, render_json, restore_context


def _write_stdout(text: str) -> None:
    # Values taken from the environment may carry undecodable bytes (surrogateescape): write them back
    # as the same bytes rather than failing on them.
    sys.stdout.flush()
    sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    sys.stdout.buffer.flush()


@click.group("manifest", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Restore a run context from a madengine build_manifest.json."""


@cli.command("restore")
@click.argument("manifest_path", metavar="MANIFEST")
@click.option(
    "--model", "model", metavar="NAME", help="built_models key or model name (default: the only one)."
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["bash", "json"]),
    default="bash",
    show_default=True,
    help="bash: lines to `source`; json: the resolved context for display (secrets masked).",
)
def restore_command(manifest_path: str, model: str | None, output_format: str) -> None:
    """Print the run context of one model of MANIFEST ('-' = stdin).

    Variables already set in the environment are left alone; ${VAR}/$VAR references are resolved from
    the environment or dropped with a warning.

    Example: source <(slurm-multi manifest restore build_manifest.json --model toy-2node)
    """
    import os

    env = dict(os.environ)
    manifest = load_manifest(manifest_path)
    resolved = restore_context(manifest, model, env)
    for warning in resolved["warnings"]:
        talk(AREA, warning)
    source = "<stdin>" if manifest_path == "-" else manifest_path
    if output_format == "json":
        _write_stdout(render_json(resolved, source, env))
    else:
        _write_stdout(render_bash(resolved, source))
