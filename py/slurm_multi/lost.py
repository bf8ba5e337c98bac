"""The nodes the batch step lost during the run: `<jobdir>/batch/lost.json`, written and read here only.

The batch step's watch (slurm_multi.watch: `job watch`, and `job mark-lost` in the teardown)
records a node the moment it knows the node is gone, the way it knows it:

    {"node2": {"how": "slurm",          # Slurm reports it DOWN, failed or not responding
               "reason": "Slurm reports node2 DOWN+NOT_RESPONDING: ...",
               "at": 1764990000.12,      # when the batch step knew (epoch seconds)
               "ranks": [1]},
     "node3": {"how": "network", ...},  # the batch host has had no answer from it on the network
     "node4": {"how": "vanished", ...}} # a rank's task ended without a status, and the reaper (a
                                        # step on every node, after the tasks) could not stage it

This is the batch step's own observation, kept apart from the node's status.json (which the watch
also writes for the lost node's ranks, so nobody waits for them): a node that was only cut off
may still write its own status.json later, and the job must still know it lost the node. Collect
reads it (slurm_multi.results.midrun) and names each node a bad node; the first record of a node
stays (its time is when it was lost).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

LOST_FILE = os.path.join("batch", "lost.json")
HOWS = ("slurm", "network", "vanished")


def path_of(jobdir: str) -> str:
    return os.path.join(jobdir, LOST_FILE)


def read(jobdir: str) -> dict[str, dict[str, Any]]:
    """Every lost node's record; {} when none was lost (or the file cannot be read: said by collect)."""
    from slurm_multi.readfile import read_json

    try:
        document = read_json(path_of(jobdir))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(document, dict):
        return {}
    return {str(node): entry for node, entry in document.items() if isinstance(entry, dict)}


def record(
    jobdir: str, node: str, how: str, reason: str, ranks: Sequence[int], now: float | None = None
) -> bool:
    """Add `node`'s record unless it has one; True when it is new. Only the batch step writes it,
    one process at a time (the watch has ended when the teardown's mark-lost runs)."""
    from slurm_multi.shell import write_json

    if how not in HOWS:
        raise ValueError(f"how {how!r} is not one of {', '.join(HOWS)}")
    known = read(jobdir)
    if node in known:
        return False
    known[node] = {
        "how": how,
        "reason": " ".join(reason.split()),
        "at": round(time.time() if now is None else now, 3),
        "ranks": list(ranks),
    }
    os.makedirs(os.path.dirname(path_of(jobdir)), exist_ok=True)
    write_json(path_of(jobdir), known)
    return True
