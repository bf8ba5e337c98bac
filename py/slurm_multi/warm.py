"""A helper started before its moment: its interpreter and imports are paid while the job runs, its
work when bash hands it its arguments.

    slurm-multi warm AREA COMMAND
    stdin: an empty line (wake: import the command now), then "<N>\n" and the command's N words,
           each NUL-terminated (run it)

bash starts it on a pipe (`util::warm_start`); the wake comes at once, or from whoever knows that
the busy moment is over (the batch step's watch, once every rank runs its workload: the imports
then do not compete with the nodes' start). When its moment comes, bash writes the argv
(`util::warm_run`); the exit status is then that of `slurm-multi AREA COMMAND ARGV...`, run by the
same click group in this process: the words a helper logs and pastes back are that command's, and
this module only moves its start. An argv without a wake before it imports first, as a cold start
would. The count says where the argv ends, so the helper never waits for an end of file that a
background process which inherited the pipe could hold back.

The pipe closing before a whole argv came (the task ended, or took another way, before it needed
the helper): exit 0 having done nothing when nothing came, a one-line error when part of it did.

Only a command whose start costs a job at least 0.1 s is worth starting warm (STYLE.md): a manifest
job's `results collect --mad-outputs` imports pandas for madengine's files (~0.4 s of the job's end
on the test machine: `time python -c 'import pandas'` against `time python -c pass`). Its WARM_UP
module's `warm_up()` is what the wait pays for besides the command's own imports. Collect without a
manifest model (~0.07 s) and `node status` (~0.06 s) start cold.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from slurm_multi import EXIT_USAGE

# A command whose work needs a dear import besides its module's: the module whose warm_up() pays it.
WARM_UP = {
    ("results", "collect"): "slurm_multi.results.madoutputs",  # --mad-outputs: a manifest job's
    ("results", "mad-outputs"): "slurm_multi.results.madoutputs",
}
EXIT_NOT_GIVEN = 0  # the pipe closed empty: nothing asked of us
MAX_ARGV_BYTES = 1 << 20  # a status line or a collect command line; never more


def wait_for_wake(fd: int) -> bytes | None:
    """Block until the first line on `fd` is whole; what came, less the wake's empty lines. None
    when the pipe closed with nothing on it."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data or None
        data += chunk
        if len(data) > MAX_ARGV_BYTES:
            break
    return data.lstrip(b"\n")


def read_argv(fd: int, data: bytes = b"") -> list[str] | None:
    """The argv on `fd` (after `data`, already read): a count line, then that many NUL-terminated
    words; None when the pipe closed before anything came. Words are decoded as the interpreter
    decodes its command line (surrogateescape), so any byte a bash variable holds arrives as it
    would in argv."""
    want = -1
    while True:
        if want < 0 and b"\n" in data:
            head, _, data = data.partition(b"\n")
            if not head.isdigit() or len(head) > 6:
                raise ValueError(f"its argv did not start with a word count (got {head[:20]!r})")
            want = int(head)
        if want >= 0 and data.count(b"\0") >= want:
            break
        if len(data) > MAX_ARGV_BYTES:
            raise ValueError(f"its argv is over {MAX_ARGV_BYTES} bytes")
        chunk = os.read(fd, 65536)
        if not chunk:
            if not data and want < 0:
                return None
            raise ValueError("the pipe closed before its whole argv came")
        data += chunk
    words = data.split(b"\0")
    if len(words) != want + 1 or words[-1]:
        raise ValueError(f"{len(words) - 1} words came, not {want}")
    return [word.decode(sys.getfilesystemencoding(), "surrogateescape") for word in words[:-1]]


def warm(words: tuple[str, ...]) -> int:
    """`slurm-multi warm AREA COMMAND`: wait for the wake, import the command (and its WARM_UP
    module), read its argv, run it through the group and end the process with the command's exit
    code (without the interpreter's teardown); returned instead: the exit code of what failed
    before the command ran. An AREA that is none is said at once (the command's name is checked
    when its module is imported, after the wake)."""
    from slurm_multi import cli

    name = " ".join(words)
    if words[0] not in cli.SUBCOMMANDS:
        print(
            f"slurm-multi: warm {name}: no command {words[0]!r} (slurm-multi --help lists them)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        data = wait_for_wake(0)
        if data is None:
            return EXIT_NOT_GIVEN
        _resolve(cli.group, list(words))
        if words in WARM_UP:  # what the command needs besides its module, paid now too
            importlib.import_module(WARM_UP[words]).warm_up()
        argv = read_argv(0, data)
    except (OSError, ValueError) as exc:
        print(f"slurm-multi: warm {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if argv is None:
        return EXIT_NOT_GIVEN
    rc = cli.run([*words, *argv])
    # The command has written and closed its files: the interpreter's teardown (freeing pandas'
    # modules, ~0.04 s after a manifest job's collect, the batch step's last) is skipped. Measured:
    # `python -c 'import pandas'` exits 0.04-0.05 s later than with os._exit(0) at its end.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _resolve(group: Any, words: list[str]) -> Any:
    """The click command `words` names under `group` (importing its module), or a ValueError."""
    command = group
    with click.Context(group, info_name="slurm-multi") as ctx:
        for word in words:
            found = command.get_command(ctx, word) if isinstance(command, click.Group) else None
            if found is None:
                raise ValueError(f"no command {' '.join(words)!r} (slurm-multi --help lists them)")
            command = found
    if isinstance(command, click.Group):
        raise ValueError(f"{' '.join(words)!r} is a group of commands, not a command")
    return command


@click.command("warm", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("area")
@click.argument("command")
def cli(area: str, command: str) -> None:
    """Start `slurm-multi AREA COMMAND` before its moment: its arguments come on stdin (bash's
    util::warm_start and util::warm_run).

    \b
    Example: slurm-multi warm results collect
    """
    click.get_current_context().exit(warm((area, command)))
