"""Every node's stage times across runs: `perf_stages.jsonl` beside a shared perf.csv, written and
read here only.

perf.csv holds one row per metric of a run and nothing about the nodes; a node that gets slower job
after job (a failing disk under its image load, a throttled GPU in its run) shows only in the
nodes' stage times. So each time `results collect --perf-csv PATH` appends a job's rows, it appends
one line here too, under the same lock (slurm_multi.results.perfcsv):

    {"machine_name": "57", "model": "toy_model", "verdict": "SUCCESS",
     "nodes": [{"rank": 0, "node": "node1", "stages": {"prepare": 0.16, "image": 0.21, ...}}, ...]}

`machine_name` is the job id, as in the job's perf.csv rows. `slurm-multi report --history PATH`
reads it (slurm_multi.report.history); a line that is not such an object is a warning there, never
a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_multi.readfile import finite, read_bytes
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.shared import encode_item, os_error

STAGES_NAME = "perf_stages.jsonl"
MAX_BYTES = 1 << 30  # as a shared perf.csv's limit
MAX_LINE_WARNINGS = 5  # then one line that counts the rest


def stage_record(job_id: str, model: str, verdict: str, nodes: Sequence[NodeReport]) -> str:
    """The line a job appends: its id, model, verdict and each node's stage seconds (one line)."""
    document = {
        "machine_name": job_id,
        "model": model,
        "verdict": verdict,
        "nodes": [{"rank": n.rank, "node": n.node, "stages": dict(n.stages)} for n in nodes],
    }
    return encode_item(document) + "\n"


def _seconds(value: Any) -> float | None:
    number = finite(value)
    return number if number is not None and number >= 0 else None


def _record(data: Any) -> dict[str, Any] | None:
    """A line's object with only what a reader may trust; None when it is not a record."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        return None
    nodes = []
    for node in data["nodes"]:
        if not isinstance(node, dict) or not isinstance(node.get("stages"), dict):
            continue
        rank = node.get("rank")
        stages = {str(k): s for k, v in node["stages"].items() if (s := _seconds(v)) is not None}
        nodes.append({
            "rank": rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
            "node": str(node.get("node") or "?"),
            "stages": stages,
        })  # fmt: skip
    return {
        "machine_name": str(data.get("machine_name") or ""),
        "model": str(data.get("model") or ""),
        "verdict": str(data.get("verdict") or ""),
        "nodes": nodes,
    }


def append_lead(path: Path) -> str:
    """What goes before a record appended to `path`: "" when the file is not there, is empty or ends
    with a newline; a newline when its last line is a whole record without one. ValueError when its
    last line is cut short (not a record): the new record glued onto it would be lost with it, as
    perf.csv's cut-short last row is refused (results.perfcsv). OSError when it cannot be read. Only
    the last line is read (backwards, a block at a time)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    try:
        end = os.fstat(fd).st_size
        tail = b""
        while end > 0 and b"\n" not in tail:
            start = max(0, end - TAIL_BLOCK)
            tail = os.pread(fd, end - start, start) + tail
            end = start
    finally:
        os.close(fd)
    last = tail.rpartition(b"\n")[2]
    if not last.strip():
        return ""
    try:
        whole = _record(json.loads(last)) is not None
    except (ValueError, RecursionError):
        whole = False
    if not whole:
        raise ValueError("its last line is cut short (not a stage-times record, no newline)")
    return "\n"


TAIL_BLOCK = 64 * 1024


def read_stage_history(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The records in file order, and a warning per line that is not one (at most
    MAX_LINE_WARNINGS, then a count). No file: no records, no warning. An unreadable file: no
    records and one warning."""
    try:
        data = read_bytes(path, MAX_BYTES + 1)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{path.name}: unreadable ({os_error(exc)}); no stage times over the runs"]
    warnings: list[str] = []
    if len(data) > MAX_BYTES:
        warnings.append(f"{path.name}: larger than {MAX_BYTES >> 30} GiB; only its first GiB is read")
        data = data[:MAX_BYTES]
    records, bad = [], []
    for number, line in enumerate(data.decode("utf-8", "replace").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = _record(json.loads(line))
        except (ValueError, RecursionError):
            record = None
        if record is None:
            bad.append(number)
        else:
            records.append(record)
    for number in bad[:MAX_LINE_WARNINGS]:
        warnings.append(f"{path.name} line {number}: not a stage-times record; skipped")
    if len(bad) > MAX_LINE_WARNINGS:
        warnings.append(f"{path.name}: +{len(bad) - MAX_LINE_WARNINGS} more lines like these skipped")
    return records, warnings
