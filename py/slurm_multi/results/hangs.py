"""Hangs: what each node's hang watch left behind (`progress.json`, `hang.json`), read and worded.

A hung collective ends the same way on every rank: the job's time limit kills all containers, and
every node reports `container exited 137`. That says nothing about which rank stopped first. The hang
watch does: on each node it records the last output and CPU progress of the run stage
(`progress.json`, every few seconds) and, once a rank has been quiet for the hang timeout, whether
it is the cause (stuck by itself: frozen, stopped, in disk sleep, spinning) or a waiter (blocked in a
socket wait on the others) in `hang.json`. collect puts the causes first among the reasons and names
the waiters as such, instead of N identical exit lines.

Both files may be absent, truncated or wrong: a bad file is a warning and is otherwise ignored; a
field of the wrong type is a warning and counts as absent.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_multi.readfile import finite
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.shared import json_error, rank_label, read_json, short, utc_iso

PROGRESS_FILE = "progress.json"
HANG_FILE = "hang.json"
# What a hung rank snapshots (processes, kernel stacks, py-spy, sockets, log tails: lib/run.sh and
# the hang watch write it, sm-node stages it); summary.json names its files, the report shows them.
DIAGNOSTICS_DIR = "diagnostics"
MAX_DIAGNOSTICS = 32  # files named per rank
# How each state reads in the waiters' line (`blocked in a socket wait since 12:03:08`).
STATE_WORDS = {
    "frozen": "frozen",
    "stopped": "stopped",
    "disk-sleep": "blocked in disk I/O",
    "spinning": "spinning without output",
    "sleeping": "sleeping",
    "socket-wait": "blocked in a socket wait",
    "lock-wait": "asleep on a lock or condition while helper threads wait on the network",
}
MAX_LISTED = 10  # ranks named in one line; a 1,000-rank job's waiters would fill a screen
MAX_EPOCH = 253_402_300_799.0  # 9999-12-31T23:59:59Z: past it time.gmtime raises


@dataclass(frozen=True)
class HangEntry:
    """One rank's hang.json, as far as it could be read."""

    rank: int
    node: str
    role: str  # "cause", "waiter" or "unclear" (as the watch said; read_hangs decides the unclear)
    state: str | None = None
    detail: str | None = None
    quiet_seconds: float | None = None
    last_progress: float | None = None  # epoch seconds
    detected: float | None = None  # epoch seconds
    diagnostics: tuple[str, ...] = ()  # its snapshot's files, `node_<rank>/diagnostics/<name>`

    @property
    def label(self) -> str:
        return rank_label(self.node, self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "state": self.state,
            "detail": self.detail,
            "quiet_seconds": self.quiet_seconds,
            "last_progress": utc_iso(self.last_progress),
            "detected": utc_iso(self.detected),
            "diagnostics": list(self.diagnostics),
        }


@dataclass(frozen=True)
class Hang:
    """The job's hang: the causes by last progress (earliest first), the waiters in rank order."""

    causes: list[HangEntry]
    waiters: list[HangEntry]

    @property
    def ranks(self) -> set[int]:
        return {entry.rank for entry in (*self.causes, *self.waiters)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "causes": [entry.to_dict() for entry in self.causes],
            "waiters": [entry.to_dict() for entry in self.waiters],
        }


# ----------------------------------------------------------------------------- reading


def _number(value: Any) -> float | None:
    """A JSON number as a finite float, not negative; None for anything else (true, "12", 1e999)."""
    number = finite(value)
    return number if number is not None and number >= 0 else None


def _epoch(value: Any) -> float | None:
    """An epoch time in seconds that time.gmtime can render; None for anything else."""
    number = _number(value)
    return number if number is not None and number <= MAX_EPOCH else None


def _seconds(value: Any) -> float | None:
    number = _number(value)
    return None if number is None else round(number, 3)


def _text(value: Any, limit: int) -> str | None:
    """A string made safe for a terminal ("" stays "": blank is not a wrong type)."""
    return short(value, limit) if isinstance(value, str) else None


def _read_object(path: str, name: str, warnings: list[str]) -> dict[str, Any] | None:
    """The file's JSON object; None when absent (no warning) or bad (a warning)."""
    try:
        data = read_json(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        warnings.append(f"{name}: unreadable ({json_error(exc)}); ignored")
        return None
    except (ValueError, RecursionError) as exc:
        warnings.append(f"{name}: not valid JSON ({json_error(exc)}); ignored")
        return None
    if not isinstance(data, dict):
        warnings.append(f"{name}: not a JSON object; ignored")
        return None
    return data


def _fields(data: dict[str, Any], parsers: dict[str, Any], name: str, warnings: list[str]) -> dict[str, Any]:
    """Each known field parsed; a present one that does not parse is named in one warning."""
    values = {key: parse(data[key]) if key in data else None for key, parse in parsers.items()}
    wrong = [key for key in parsers if key in data and data[key] is not None and values[key] is None]
    if wrong:
        warnings.append(f"{name}: {', '.join(wrong)}: wrong type or value; ignored")
    return values


def _latest(*epochs: float | None) -> float | None:
    known = [epoch for epoch in epochs if epoch is not None]
    return max(known) if known else None


def read_progress(path: str, name: str, warnings: list[str]) -> float | None:
    """The last progress progress.json records: the later of the last output and the last CPU use."""
    data = _read_object(path, name, warnings)
    if data is None:
        return None
    fields = _fields(data, {"last_output_epoch": _epoch, "last_cpu_epoch": _epoch}, name, warnings)
    return _latest(fields["last_output_epoch"], fields["last_cpu_epoch"])


HANG_FIELDS = {
    "state": lambda v: _text(v, 40),
    "detail": lambda v: _text(v, 200),
    "quiet_seconds": _seconds,
    "last_output_epoch": _epoch,
    "last_cpu_epoch": _epoch,
    "last_progress_epoch": _epoch,
    "detected_epoch": _epoch,
}


def read_hang_entry(path: str, name: str, node: NodeReport, warnings: list[str]) -> HangEntry | None:
    """The rank's hang.json; None when absent, or when it says neither cause nor waiter (a warning).

    The rank and node come from the node directory and status.json, like every other reason's.
    """
    # Only a rank the watch judged hung has one: asked first (a failed open costs collect twice
    # what access() does, once per node).
    if not os.access(path, os.F_OK):
        return None
    data = _read_object(path, name, warnings)
    if data is None:
        return None
    # The writer's roles, imported only for a hang.json (the watch's module costs collect ~20 ms).
    from slurm_multi.hangwatch import ROLES

    role = data.get("role")
    if role not in ROLES:
        warnings.append(f"{name}: role {short(repr(role), 40)} is not cause, waiter or unclear; ignored")
        return None
    fields = _fields(data, HANG_FIELDS, name, warnings)
    last_progress = fields["last_progress_epoch"]
    if last_progress is None:  # an older watch: the later of its last output and last CPU use
        last_progress = _latest(fields["last_output_epoch"], fields["last_cpu_epoch"])
    return HangEntry(
        node.rank, node.node, role, fields["state"] or None, fields["detail"] or None,
        fields["quiet_seconds"], last_progress, fields["detected_epoch"],
        diagnostics_files(node),
    )  # fmt: skip


def diagnostics_files(node: NodeReport) -> tuple[str, ...]:
    """The files of the rank's diagnostics snapshot, as `node_<rank>/diagnostics/<name>` (sorted; at
    most MAX_DIAGNOSTICS); none when it left no snapshot or it cannot be listed."""
    if node.path is None:
        return ()
    directory = os.path.join(node.path, DIAGNOSTICS_DIR)
    try:
        names = sorted(entry.name for entry in os.scandir(directory) if entry.is_file())
    except OSError:
        return ()
    return tuple(f"{node.dirname}/{DIAGNOSTICS_DIR}/{name}" for name in names[:MAX_DIAGNOSTICS])


def read_hangs(root: Path, nodes: Sequence[NodeReport], warnings: list[str]) -> Hang | None:
    """Every node's progress.json and hang.json. Fills each node's last_progress (hang.json's, else
    progress.json's); returns the hang, or None when no rank has a usable hang.json."""
    entries = []
    for node in nodes:
        if node.path is None:
            continue
        progress_name, hang_name = f"{node.dirname}/{PROGRESS_FILE}", f"{node.dirname}/{HANG_FILE}"
        progress = read_progress(f"{node.path}/{PROGRESS_FILE}", progress_name, warnings)
        entry = read_hang_entry(f"{node.path}/{HANG_FILE}", hang_name, node, warnings)
        node.last_progress = progress
        if entry is not None:
            entries.append(entry)
            if entry.last_progress is not None:  # the time the watch judged by, as its reason says
                node.last_progress = entry.last_progress
    if not entries:
        return None
    # An unclear rank (only helper threads on the network) waits on another when some rank is
    # clearly stuck by itself; with none, it is a suspect: a deadlocked rank looks just like it.
    definite = any(e.role == "cause" for e in entries)
    as_cause = {"cause"} if definite else {"cause", "unclear"}
    causes = sorted((e for e in entries if e.role in as_cause), key=_by_progress)
    waiters = sorted((e for e in entries if e.role not in as_cause), key=lambda e: e.rank)
    return Hang(causes, waiters)


def _by_progress(entry: HangEntry) -> tuple[bool, float, int]:
    """Earliest last progress first (the rank that stopped first); unknown times last."""
    return (entry.last_progress is None, entry.last_progress or 0.0, entry.rank)


# ----------------------------------------------------------------------------- wording


def clock(epoch: float) -> str:
    """`12:03:07`: the UTC time of day; a hang is read against the same day's log lines."""
    return time.strftime("%H:%M:%S", time.gmtime(epoch))


def _listed(labels: Sequence[str]) -> str:
    shown = ", ".join(labels[:MAX_LISTED])
    return f"{shown}, +{len(labels) - MAX_LISTED} more" if len(labels) > MAX_LISTED else shown


def cause_reason(entry: HangEntry) -> str:
    """`hung: node2 (rank 1), no output and no CPU for 120 s since 12:03:07 (frozen: docker pause …)`."""
    text = f"hung: {entry.label}, no output and no CPU"
    if entry.quiet_seconds is not None:
        text += f" for {math.floor(entry.quiet_seconds + 0.5)} s"
    if entry.last_progress is not None:
        text += f" since {clock(entry.last_progress)}"
    what = ": ".join(part for part in (entry.state, entry.detail) if part)
    return f"{text} ({what})" if what else text


def waiters_reason(waiters: Sequence[HangEntry]) -> str:
    """`waiting (not the cause): node1 (rank 0), node3 (rank 2): blocked in a socket wait since …`."""
    states: list[str] = []
    for entry in waiters:
        words = STATE_WORDS.get(entry.state or "", f"in state {entry.state!r}" if entry.state else "")
        if words and words not in states:
            states.append(words)
    how = " or ".join(states) or "waiting"
    times = [entry.last_progress for entry in waiters if entry.last_progress is not None]
    when = f" since {clock(min(times))}" if times else ""
    return f"waiting (not the cause): {_listed([e.label for e in waiters])}: {how}{when}"


def no_cause_reason(nodes: Sequence[NodeReport], hung: set[int]) -> str:
    """`hung: no rank was seen stuck by itself; ranks not waiting: node2 (rank 1) (last progress …)`."""
    others = []
    for node in nodes:
        if node.rank not in hung:
            seen = f"last progress {clock(node.last_progress)}" if node.last_progress is not None else ""
            others.append(f"{node.label} ({seen or 'no progress record'})")
    return f"hung: no rank was seen stuck by itself; ranks not waiting: {_listed(others) or 'none'}"


def hang_reasons(hang: Hang, nodes: Sequence[NodeReport]) -> list[str]:
    """The causes, one line each, then one line for the waiters; without a cause, a line that says so
    and names the ranks that were not waiting (the likely suspects, e.g. a node that died)."""
    lines = [cause_reason(entry) for entry in hang.causes]
    if not hang.causes:
        lines.append(no_cause_reason(nodes, hang.ranks))
    if hang.waiters:
        lines.append(waiters_reason(hang.waiters))
    return lines
