"""`slurm-multi settings`: the one settings table (slurm_multi.settings) from the command line."""

from __future__ import annotations

import click

from slurm_multi.common import usage_error


@click.group("settings", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Resolve the settings alone, or print their table."""


@cli.command("env")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
def env_command(path: str) -> None:
    """Resolve the environment's settings alone (a node stage run by hand), validated, into FILE as
    bash to source.

    \b
    Example: slurm-multi settings env /tmp/settings.sh && source /tmp/settings.sh
    """
    from slurm_multi.net import describe
    from slurm_multi.settings import SettingsError, write_env

    if path in ("", "-"):
        raise usage_error(f"settings env: FILE '{path}': give the path of a file to write the bash into")
    try:
        write_env(path)
    except SettingsError as exc:
        raise usage_error(str(exc)) from None
    except OSError as exc:
        raise usage_error(f"settings env: cannot write {path}: {describe(exc)}") from None


@cli.command("markdown")
@click.option("--core", is_flag=True, help="Only the core options (the README's table).")
def markdown_command(core: bool) -> None:
    """Print the options table as markdown (docs/options.md, the README).

    \b
    Example: slurm-multi settings markdown --core
    """
    from slurm_multi.settings import markdown_table

    click.echo(markdown_table(core_only=core))
