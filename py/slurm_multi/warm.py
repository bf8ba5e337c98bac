"""A helper started before its moment: its interpreter and imports are paid while the job runs, its
work when bash hands it its arguments.

    python -m slurm_multi.warm MODULE
    stdin: an empty line (wake: import MODULE now), then "<N>\n" and MODULE's N words, each
           NUL-terminated (run it)

bash starts it on a pipe (`util::warm_start`); the wake comes at once, or from whoever knows that
the busy moment is over (the batch step's watch, once every rank runs its workload: the imports
then do not compete with the nodes' start). When its moment comes, bash writes the argv
(`util::warm_run`); the exit status is then `MODULE.main(argv)`'s, exactly as
`python -m slurm_multi.MODULE ARGV...` would have ended. The words a helper logs and pastes back
are that command's: this module only moves its start. An argv without a wake before it imports
first, as a cold start would. The count says where the argv ends, so the helper never waits for an
end of file that a background process which inherited the pipe could hold back.

The pipe closing before a whole argv came (the task ended, or took another way, before it needed
the helper): exit 0 having done nothing when nothing came, a one-line error when part of it did.
MODULE is one of WARM_MODULES: the helpers that run on a job's critical path after the workload (a
node's status.json, the batch step's collect).
"""

from __future__ import annotations

import os
import sys

from slurm_multi import EXIT_USAGE

# Which helpers may be started warm: their `main(argv)` is the click-free entry bash runs cold.
WARM_MODULES = ("statusfile", "results.collect_main", "results.madoutputs")
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


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in WARM_MODULES:
        usage = f"python -m slurm_multi.warm {{{','.join(WARM_MODULES)}}}"
        print(f"slurm-multi: warm: usage: {usage}", file=sys.stderr)
        return EXIT_USAGE
    try:
        data = wait_for_wake(0)
        if data is None:
            return EXIT_NOT_GIVEN
        name = f"slurm_multi.{argv[0]}"
        __import__(name)
        helper = sys.modules[name]
        # A helper whose work needs a dear import pays it now, while the job runs (madoutputs: pandas).
        warm_up = getattr(helper, "warm_up", None)
        if warm_up is not None:
            warm_up()
        words = read_argv(0, data)
    except (OSError, ValueError) as exc:
        print(f"slurm-multi: warm {argv[0]}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if words is None:
        return EXIT_NOT_GIVEN
    # What the cold command's sys.argv[0] would be, for a helper that names itself.
    sys.argv = [f"{helper.__file__}", *words]
    return int(helper.main(words) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
