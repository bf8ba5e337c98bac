"""Small shared pieces: one-line errors with documented exit codes, and stderr talk.

HelperError is a click.ClickException: the `slurm-multi` group (slurm_multi.cli) shows it as its one
line and exits with its code; so do click's standalone mode and CliRunner.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
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


class FiniteFloat(click.FloatRange):
    """click.FloatRange that refuses nan and inf too (FloatRange lets both through: a timeout of nan
    never ends, a threshold of nan compares false with everything). The type of every float option
    of every command; with no bounds, any finite number."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class HostName(click.ParamType):
    """A host to listen on or dial (MASTER_ADDR, a parent's name): a host name or an IP address
    (words.is_address). Anything else, a newline or an ANSI colour in it above all, is one usage
    line at once, not a resolver's error (spread over lines) after every retry."""

    name = "host"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from slurm_multi.words import is_address

        if not (isinstance(value, str) and is_address(value)):
            self.fail(f"{value!r} is not a host name or an IP address", param, ctx)
        return value


def internal_error(exc: BaseException) -> int:
    """A bug of ours, as every helper reports it: one line (on stderr and into SM_ERROR_FILE), exit 1.
    The caller re-raises instead when SM_DEBUG=1 (slurm_multi.cli.run)."""
    line = f"slurm-multi: internal error ({type(exc).__name__}: {exc}); SM_DEBUG=1 shows the traceback"
    print(line, file=sys.stderr, flush=True)
    record_error(line)
    return EXIT_FAILURE


from slurm_multi.logline import talk  # noqa: E402 - one logger; re-exported for the helpers


def run_or_warn(area: str, what: str, step: Callable[[], object]) -> bool:
    """A step after the caller's own work (collect's madengine files, the job's page): its failure is
    its own one line, then `AREA: warning: WHAT not written (see above)`, never the caller's exit
    status. SM_DEBUG=1 lets a bug of ours raise with its traceback. True when the step ran."""
    try:
        step()
    except HelperError as exc:
        exc.show()
    except Exception as exc:  # a bug of ours: one line, as every helper says one
        if os.environ.get("SM_DEBUG") == "1":
            raise
        internal_error(exc)
    else:
        return True
    talk(area, f"warning: {what} not written (see above)")
    return False
