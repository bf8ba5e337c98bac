"""Small shared pieces: one-line errors with documented exit codes, and stderr talk."""

from __future__ import annotations

import os

import click

from slurm_multi import EXIT_FAILURE, EXIT_TIMEOUT, EXIT_USAGE


class HelperError(click.ClickException):
    """A one-line error (`slurm-multi <area>: <what failed>; <what to do>`) with an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file=None) -> None:  # noqa: ANN001 - click's signature
        line = f"slurm-multi: {self.format_message()}"
        click.echo(line, err=True)
        record_error(line)


def record_error(line: str) -> None:
    """The caller (bash) asked for our one-line reason in a file: it becomes the stage's reason."""
    path = os.environ.get("SM_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write((line.splitlines() or [""])[0] + "\n")
    except OSError:
        pass


def usage_error(message: str) -> HelperError:
    return HelperError(message, EXIT_USAGE)


def timeout_error(message: str) -> HelperError:
    return HelperError(message, EXIT_TIMEOUT)


from slurm_multi.logline import talk  # noqa: E402,F401 - one logger; re-exported for the helpers
