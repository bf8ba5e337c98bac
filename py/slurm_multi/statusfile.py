"""Write a node's status.json: the one helper at the end of every node task, so it starts without
click (`python -S -m slurm_multi.statusfile …`, ~10 ms instead of ~50 ms on a node's hot path).
`slurm-multi node status` is the same function behind the click CLI.

    python -S -m slurm_multi.statusfile FILE RANK NODE EXIT_CODE REASON IMAGE_ID TERMINATED STAGE…

STAGE is NAME:SECONDS:STATUS[:EXIT]; TERMINATED is 0 or 1. Exit 0 written, 2 bad arguments, 1 I/O.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any


class StatusError(ValueError):
    """An argument that cannot go into status.json."""


def status_document(
    rank: int, node: str, exit_code: int, reason: str, image_id: str, stages: Sequence[str], terminated: bool
) -> dict[str, Any]:
    status = "ok" if exit_code == 0 else "timeout" if exit_code == 124 else "failed"
    if terminated and status == "ok":
        status = "terminated"
    table: dict[str, Any] = {}
    for spec in stages:
        parts = spec.split(":")
        if len(parts) < 3:
            raise StatusError(f"node status: --stage {spec!r}: expected NAME:SECONDS:STATUS[:EXIT]")
        name, seconds, state = parts[0], parts[1], parts[2]
        try:
            entry: dict[str, Any] = {"seconds": float(seconds), "status": state}
            if len(parts) > 3 and parts[3] != "":
                entry["exit_code"] = int(parts[3])
        except ValueError:
            raise StatusError(
                f"node status: --stage {spec!r}: seconds and exit code must be numbers"
            ) from None
        table[name] = entry
    return {
        "rank": rank,
        "node": node,
        "exit_code": exit_code,
        "status": status,
        "reason": reason,
        "image_id": image_id,
        "stages": table,
    }


def write_status(path: str, document: dict[str, Any]) -> None:
    """Atomically (sibling temp file, then rename), creating the node dir if needed."""
    from slurm_multi.shell import write_json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(path, document)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 7:
        print(f"slurm-multi: node status: usage: {__doc__.splitlines()[4].strip()}", file=sys.stderr)
        return 2
    path, rank, node, exit_code, reason, image_id, terminated, *stages = argv
    try:
        document = status_document(
            int(rank), node, int(exit_code), reason, image_id, stages, terminated == "1"
        )
    except (StatusError, ValueError) as exc:
        print(f"slurm-multi: {exc}", file=sys.stderr)
        return 2
    try:
        write_status(path, document)
    except OSError as exc:
        print(f"slurm-multi: node status: cannot write {path}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
