"""A requeued job's earlier attempts: `<jobdir>/attempt_<N>/requeue.json`, written and read here only.

When the batch step requeues a job without its bad nodes (`--on-bad-node requeue`, or a quarantined
node in the allocation), that attempt's files move to `<jobdir>/attempt_<N>/` (N = the attempt's
SLURM_RESTART_COUNT, 0 for the first) and this record goes beside them:

    {"attempt": 1,                      # 1-based: the first attempt is 1
     "cause": "fitness",                # fitness (the check found them), run (lost or failed during
                                        # the run: slurm_multi.results.midrun) or quarantine (known bad)
     "requeued_after_s": 7,             # from that attempt's batch step start to its requeue
     "at": "2026-12-03T09:10:00Z",
     "excluded": ["node2"],             # the job's excluded nodes after the requeue (all of them)
     "bad_nodes": [{"node": "node2", "reason": "..."}]}

The final attempt's summary.json lists them (`attempts`), oldest first.

The batch step writes it with `slurm-multi job record-attempt ...` (slurm_multi.job).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

RECORD = "requeue.json"
REASON_LIMIT = 800  # a bad node's reason as stored, after masking (collect stores its own at 800 too)
CAUSES = ("fitness", "quarantine", "run")
_ATTEMPT_DIR = re.compile(r"attempt_(\d+)")


class AttemptError(ValueError):
    """A bad argument to the writer: one line, exit 2."""


def record(attempt: int, cause: str, after_s: int, excluded: str, bad: Sequence[str], now: float | None = None
           ) -> dict[str, Any]:  # fmt: skip
    """The record of attempt index `attempt` (0-based); `bad` holds `<node>\\t<reason>` entries.
    Each reason is stored as every reason is (secret_rule.reason_line: secrets masked, one line)."""
    from slurm_multi.secret_rule import reason_line

    if cause not in CAUSES:
        raise AttemptError(f"cause '{cause}' is not one of {', '.join(CAUSES)}")
    nodes = []
    for entry in bad:
        node, _, reason = entry.partition("\t")
        if node:
            nodes.append({"node": node, "reason": reason_line(reason, REASON_LIMIT) or "(no reason given)"})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))
    return {
        "attempt": attempt + 1,
        "cause": cause,
        "requeued_after_s": after_s,
        "at": stamp,
        "excluded": [n for n in excluded.split(",") if n],
        "bad_nodes": nodes,
    }


def write(path: str, document: dict[str, Any]) -> None:
    """Atomically, as every JSON file of a job (slurm_multi.shell.write_json)."""
    from slurm_multi.shell import write_json

    write_json(path, document)


def earlier(jobdir: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every earlier attempt's record, oldest first, and a warning per unreadable one. Each bad node's
    reason is masked again as it is read (the record may be older than the rule, or the secret
    newer than the record): what collect copies into summary.json shows no secret."""
    found: list[tuple[int, str]] = []
    try:
        names = os.listdir(jobdir)
    except OSError:
        return [], []
    for name in names:
        match = _ATTEMPT_DIR.fullmatch(name)
        if match:
            found.append((int(match.group(1)), name))
    out: list[dict[str, Any]] = []
    warnings: list[str] = []
    for _, name in sorted(found):
        path = os.path.join(jobdir, name, RECORD)
        try:
            with open(path, encoding="utf-8") as handle:
                document = json.load(handle)
        except (OSError, ValueError) as exc:
            warnings.append(f"{name}/{RECORD} unreadable ({type(exc).__name__}); that attempt is not listed")
            continue
        if isinstance(document, dict):
            document["dir"] = name
            _mask_reasons(document)
            out.append(document)
    return out, warnings


def _mask_reasons(document: dict[str, Any]) -> None:
    from slurm_multi.secret_rule import reason_line

    bad = document.get("bad_nodes")
    for entry in bad if isinstance(bad, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("reason"), str):
            entry["reason"] = reason_line(entry["reason"], REASON_LIMIT)
