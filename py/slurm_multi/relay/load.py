"""Loading: where a receiver's verified stream goes (LOADER's stdin, or stdout) and the stats file.

A loader (`docker load`) must never read a clean end of a stream that failed, or it would load a cut
image as if it were whole: its pipe is closed only once our copy is verified, and on any failure
before that the loader is killed first.
"""

from __future__ import annotations

import os

from slurm_multi import EXIT_FAILURE, net
from slurm_multi.common import HelperError, usage_error
from slurm_multi.relay.forward import run_node
from slurm_multi.relay.tree import Plan, Result

STATS_LAYERS = ("layers", "received_layers", "loaded_layers", "loaded_bytes", "held_layers", "held_bytes")


def write_stats(path: str | None, result: Result) -> None:
    """--stats-file: `<bytes> <seconds>` of the verified stream, for the caller's timeline; a layered
    stream's receiver adds what it did with the layers, in STATS_LAYERS' order."""
    if path:
        layered = "".join(f" {result.layers[key]}" for key in STATS_LAYERS) if result.layers else ""
        with open(path, "w", encoding="ascii") as out:
            out.write(f"{result.total} {result.seconds:.3f}{layered}\n")


def release_stdout() -> None:
    """Our copy is verified: close the pipe to `docker load` so it finishes while we wait for DONE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def recv_into(plan: Plan, argv: list[str]) -> Result:
    """Receive into `argv`'s stdin. Its pipe closes once our copy is verified (it finishes while the
    subtree does); on any failure before that, it is killed first, so it never reads a clean EOF."""
    import subprocess

    try:
        loader = subprocess.Popen(argv, stdin=subprocess.PIPE)
    except OSError as exc:
        raise usage_error(f"relay: cannot start the loader {argv[0]!r}: {net.describe(exc)}") from None
    assert loader.stdin is not None
    verified = False

    def release() -> None:
        nonlocal verified
        verified = True
        loader.stdin.close()  # type: ignore[union-attr]

    try:
        result = run_node(plan, out_fd=loader.stdin.fileno(), on_verified=release)
    except BaseException as exc:
        if not verified:
            loader.kill()
            loader.wait()
            loader.stdin.close()
            if isinstance(exc, HelperError):
                raise HelperError(
                    f"{exc.format_message()} ({argv[0]} stopped before the end)", exc.exit_code
                ) from None
        else:
            loader.wait()
        raise
    code = loader.wait()
    if code != 0:
        raise HelperError(
            f"relay: {plan.me}: the stream arrived and was verified, but {' '.join(argv)} exited {code}",
            EXIT_FAILURE,
        )
    return result
