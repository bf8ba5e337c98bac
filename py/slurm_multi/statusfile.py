"""A node's status.json, the verdict's input: written and read here, nowhere else.

The one helper at the end of every node task writes it (`slurm-multi node status`, slurm_multi.node_cli:
STAGE is NAME:SECONDS:STATUS[:EXIT]; exit 0 written, 2 bad arguments, 1 I/O); the batch step's watch
writes a "lost" status for the ranks of a dead node with it; collect, the watch, the hang watch, the
events' progress line and `node from-job` read it with `read_status` / `has_status`.

The document (the keys below are the contract: old job directories are judged by them):

    {"rank": 1, "node": "node2", "exit_code": 0, "status": "ok", "reason": "", "image_id": "sha256:…",
     "stages": {"prepare": {"seconds": 0.12, "status": "ok"}, "run": {"seconds": 30.1, "status": "ok",
                "exit_code": 0}, …}}

`status` is ok, failed, timeout (exit 124) or terminated (stopped by a signal with exit 0); the
readers also meet the other words older versions or other writers used (lost, aborted). A rank
whose failure is its node's own fault (a docker engine that died under it, a failed local disk or
clock: slurm_multi.nodefault) also has `"node_fault": "<one line>"`; collect names that node bad.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_multi.readfile import read_json
from slurm_multi.secret_rule import reason_line

STATUS_FILE = "status.json"  # in the node dir, JOBDIR/node_<rank>/

# The document's keys.
RANK = "rank"
NODE = "node"
EXIT_CODE = "exit_code"
STATUS = "status"
REASON = "reason"  # one line: secrets masked, control characters escaped, at most MAX_REASON
MAX_REASON = 2000
IMAGE_ID = "image_id"  # the image the rank ran (rank 0's is the job's: node from-job, collect)
STAGES = "stages"  # name -> {SECONDS, STAGE_STATUS[, EXIT_CODE]}
NODE_FAULT = "node_fault"  # only when the rank named its own node's fault (slurm_multi.nodefault)
SECONDS = "seconds"
STAGE_STATUS = "status"


class StatusError(ValueError):
    """An argument that cannot go into status.json."""


@dataclass
class Status:
    """A status.json as read: its values as they are (a reader judges their types: a file another
    version or a person wrote may hold anything), or `error`, why a file that is there cannot be
    read as a JSON object (the reader reports it unreadable)."""

    document: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def readable(self) -> bool:
        return not self.error

    def get(self, key: str) -> Any:
        return self.document.get(key)

    @property
    def node(self) -> Any:
        return self.document.get(NODE)

    @property
    def exit_code(self) -> Any:
        return self.document.get(EXIT_CODE)

    @property
    def status(self) -> Any:
        return self.document.get(STATUS)

    @property
    def reason(self) -> Any:
        return self.document.get(REASON)

    @property
    def image_id(self) -> Any:
        return self.document.get(IMAGE_ID)

    @property
    def stages(self) -> dict[str, Any]:
        """The stage table; {} when it is missing or not an object (an entry may still be anything)."""
        stages = self.document.get(STAGES)
        return stages if isinstance(stages, dict) else {}


def status_path(node_dir: str) -> str:
    return os.path.join(node_dir, STATUS_FILE)


def has_status(node_dir: str) -> bool:
    """The rank has staged: its status.json is there (readable or not)."""
    return os.path.exists(status_path(node_dir))


def read_status(path: str) -> Status | None:
    """The status.json at `path`; None when there is none (the task never staged); never raises.

    A file that is there but cannot be read, is not JSON or is not a JSON object is a Status with
    `error` (its first line: `Is a directory`, `Expecting value: line 1 column 1 (char 0)`,
    `not a JSON object`). The file is read first and stat'ed only when that fails: the common case
    costs one open.
    """
    try:
        document = read_json(path)
    except OSError as exc:
        error = exc.strerror or str(exc)
    except (ValueError, RecursionError) as exc:  # a NUL in the path is a ValueError too: no file
        error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        if isinstance(document, dict):
            return Status(document)
        error = "not a JSON object"
    try:
        os.stat(path)
    except (OSError, ValueError):
        return None
    return Status({}, error)


def status_document(
    rank: int, node: str, exit_code: int, reason: str, image_id: str, stages: Sequence[str], terminated: bool,
    node_fault: str = "",
) -> dict[str, Any]:  # fmt: skip
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
            entry: dict[str, Any] = {SECONDS: float(seconds), STAGE_STATUS: state}
            if len(parts) > 3 and parts[3] != "":
                entry[EXIT_CODE] = int(parts[3])
        except ValueError:
            raise StatusError(
                f"node status: --stage {spec!r}: seconds and exit code must be numbers"
            ) from None
        # nan and inf are no JSON (json.dump writes NaN, which no reader takes), nor is a negative
        # time a stage's: refused, as a cell that is not a number is
        if not (math.isfinite(entry[SECONDS]) and entry[SECONDS] >= 0):
            raise StatusError(f"node status: --stage {spec!r}: seconds must be a finite number 0 or more")
        table[name] = entry
    document = {
        RANK: rank,
        NODE: node,
        EXIT_CODE: exit_code,
        STATUS: status,
        REASON: reason_line(reason, MAX_REASON) if reason else "",
        IMAGE_ID: image_id,
        STAGES: table,
    }
    if node_fault:
        document[NODE_FAULT] = reason_line(node_fault, MAX_REASON)  # as the reason: text we did not write
    return document


def write_status(path: str, document: dict[str, Any]) -> None:
    """Atomically (sibling temp file, then rename), creating the node dir if needed."""
    from slurm_multi.shell import write_json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(path, document)
