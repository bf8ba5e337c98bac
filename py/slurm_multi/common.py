"""Small shared pieces: one-line errors with documented exit codes, and stderr talk.

HelperError is a click.ClickException: the `slurm-multi` group (slurm_multi.cli) shows it as its one
line and exits with its code; so do click's standalone mode and CliRunner.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from slurm_multi import EXIT_FAILURE, EXIT_TIMEOUT, EXIT_USAGE


class HelperError(click.ClickException):
    """A one-line error (`slurm-multi <area>: <what failed>; <what to do>`) with an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def format_message(self) -> str:
        return self.message

    def __str__(self) -> str:
        return self.message

    def show(self, file: Any = None) -> None:  # click's signature; the line always goes to stderr
        line = f"slurm-multi: {self.format_message()}"
        print(line, file=sys.stderr, flush=True)
        record_error(line)


def record_error(line: str) -> None:
    """The caller (bash) asked for our one-line reason in a file: it becomes the stage's reason, so
    the log filter's secrets are masked in it first (shell.write_error_file: never through a link)."""
    path = os.environ.get("SM_ERROR_FILE")
    if not path:
        return
    from slurm_multi.secret_rule import masked
    from slurm_multi.shell import write_error_file

    write_error_file(path, masked(line))


def usage_error(message: str) -> HelperError:
    return HelperError(message, EXIT_USAGE)


def timeout_error(message: str) -> HelperError:
    return HelperError(message, EXIT_TIMEOUT)


def internal_error(exc: BaseException) -> int:
    """A bug of ours, as every helper reports it: one line (on stderr and into SM_ERROR_FILE), exit 1.
    The caller re-raises instead when SM_DEBUG=1 (slurm_multi.cli.run)."""
    line = f"slurm-multi: internal error ({type(exc).__name__}: {exc}); SM_DEBUG=1 shows the traceback"
    print(line, file=sys.stderr, flush=True)
    record_error(line)
    return EXIT_FAILURE


from slurm_multi.logline import talk  # noqa: E402,F401 - one logger; re-exported for the helpers
