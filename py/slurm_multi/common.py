"""Small shared pieces: one-line errors with documented exit codes, and stderr talk.

No click here: the hot helpers import this without click. Where click
is importable (and site is on), HelperError is a click.ClickException, so click's standalone mode
and CliRunner show it and exit with its code; otherwise it is a plain Exception with the same
`message`, `exit_code`, `format_message()` and `show()`, and a click-free `main(argv)` shows it
through `run_main`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from slurm_multi import EXIT_FAILURE, EXIT_TIMEOUT, EXIT_USAGE

_click: Any = None
if not sys.flags.no_site:  # under -S (the hot helpers) click is not wanted, nor on the path
    try:
        import click as _click
    except ImportError:  # a Python without click: the click-free helpers still run
        _click = None

_Base: Any = _click.ClickException if _click is not None else Exception


class HelperError(_Base):
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


def internal_error(exc: BaseException) -> int:
    """A bug of ours, as every helper reports it: one line (on stderr and into SM_ERROR_FILE), exit 1.
    The caller re-raises instead when SM_DEBUG=1 (see `run_main`)."""
    line = f"slurm-multi: internal error ({type(exc).__name__}: {exc}); SM_DEBUG=1 shows the traceback"
    print(line, file=sys.stderr, flush=True)
    record_error(line)
    return EXIT_FAILURE


def run_main(body: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
    """A click-free helper's `main(argv)`: body's exit code; a HelperError shown once (its one line)
    and its exit code; any other exception `internal_error`'s line (SM_DEBUG=1: the traceback)."""
    try:
        return body(argv)
    except HelperError as exc:
        exc.show()
        return exc.exit_code
    except Exception as exc:
        if os.environ.get("SM_DEBUG") == "1":
            raise
        return internal_error(exc)


from slurm_multi.logline import talk  # noqa: E402,F401 - one logger; re-exported for the helpers
