"""`slurm-multi redact`: the log filter (slurm_multi.secret_rule) behind the click CLI."""

from __future__ import annotations

import os
import sys

import click

from slurm_multi.secret_rule import (  # noqa: F401 - re-exported for the helpers that import them here
    MASK,
    MIN_SECRET_LEN,
    SECRET_NAME_PATTERNS,
    Redactor,
    filter_stdio,
    filter_stream,
    is_secret_name,
    read_secrets_file,
    redact,
    secret_values,
)

HELP = f"""Copy stdin to stdout with the values of secret-named environment variables masked.

Secret names match {", ".join(SECRET_NAME_PATTERNS)} (the one rule:
slurm_multi.secret_rule). Values learned later (a manifest's literal secrets) can be added to
--secrets-file while the filter runs.

Example: docker logs job-1-r0 2>&1 | slurm-multi redact >node.log
"""


@click.command("redact", context_settings={"help_option_names": ["-h", "--help"]}, help=HELP)
@click.option(
    "--secrets-file",
    metavar="PATH",
    help="Also mask the values listed in PATH (one per line); re-read whenever it changes.",
)
def cli(secrets_file: str | None) -> None:
    if secrets_file:  # not there yet is fine (a node writes it later); there and unreadable is not
        from slurm_multi.common import usage_error
        from slurm_multi.secret_rule import secrets_file_error

        try:
            read_secrets_file(secrets_file)
        except OSError as exc:
            raise usage_error(
                f"redact: --secrets-file {secrets_file}: cannot read it ({secrets_file_error(exc)})"
            ) from None
    sys.stdout.flush()
    try:
        filter_stdio(os.environ, secrets_file, sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:
        # The reader went away (the task ends): nothing more to filter, and nothing to say. Python's
        # own flush at exit must not find the broken pipe either (the docs' recipe for SIGPIPE).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
