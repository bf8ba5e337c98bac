"""A node's events (node_<rank>/events.jsonl, written by lib/timeline.sh): read in one place.

Collect's timeline (results/timeline.py) and the batch step's watch (watch.py, no click) both read
them here: `parse_event` for one line, `current_stage` for the stage a node is in now (its last
`stage_start`), so nobody learns a node's stage by scraping node.log.

    python -S -m slurm_multi.events stages JOBDIR NRANKS   ->   node_0=image node_1=barrier ...
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from slurm_multi.logline import short

EVENTS_FILE = "events.jsonl"
MAX_EPOCH = 253_402_300_799.0  # 9999-12-31T23:59:59Z
RESERVED_KEYS = ("t", "event", "rank", "host")
MAX_VALUE_CHARS = 200
TAIL_BYTES = 16384  # a node writes a few dozen events; its last stage_start is near the end


def finite(value: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (bools, strings, inf, nan)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def parse_event(raw: bytes) -> dict[str, Any] | None:
    """One line of events.jsonl as {"t", "event", extra keys...}; None when it is not an event.

    Bytes that are not UTF-8 become U+FFFD (a host name in another encoding costs nothing); extra
    values that are not a string, a finite number, a bool or null are left out.
    """
    try:
        data = json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    t = finite(data.get("t"))
    name = data.get("event")
    if t is None or not 0 < t <= MAX_EPOCH or not isinstance(name, str) or not name.strip():
        return None
    event: dict[str, Any] = {"t": t, "event": short(name, 80)}
    for key, value in data.items():
        if key in RESERVED_KEYS:
            continue
        if isinstance(value, str):
            event[key] = short(value, MAX_VALUE_CHARS)
        elif value is None or isinstance(value, bool) or finite(value) is not None:
            event[key] = value
    return event


def current_stage(node_dir: str) -> str | None:
    """The stage of the node's last `stage_start` event; None before its first (or unreadable)."""
    try:
        with open(os.path.join(node_dir, EVENTS_FILE), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            lines = handle.read().splitlines()
    except OSError:
        return None
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first line of the tail may be cut
    for raw in reversed(lines):
        event = parse_event(raw)
        if event is not None and event["event"] == "stage_start" and isinstance(event.get("stage"), str):
            return event["stage"]
    return None


def node_stage(jobdir: str, rank: int) -> str:
    """What a progress line shows for a rank: `finished` once it staged, else its current stage,
    else `starting`."""
    node_dir = os.path.join(jobdir, f"node_{rank}")
    if os.path.exists(os.path.join(node_dir, "status.json")):
        return "finished"
    return current_stage(node_dir) or "starting"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "stages" or not argv[2].isdigit():
        print("usage: python -S -m slurm_multi.events stages JOBDIR NRANKS", file=sys.stderr)
        return 2
    print(" ".join(f"node_{r}={node_stage(argv[1], r)}" for r in range(int(argv[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
