"""The profile is part of the verdict: every rank of a profiled job must leave one complete report.

The batch step's flush (lib/profile.sh) ends every profiler session and waits for the reports with
`slurm-multi reports wait --state-file JOBDIR/profile-flush.json`, which records each new report's
bytes and state (settled, growing, settling, empty) and the `.qdstrm` left. Collect maps those
reports to ranks by their name (`<job>_<node>_rank<R>.nsys-rep`, lib/profile.sh's
PROFILE_REPORT_NAME) and judges each rank: one settled, non-empty report, no `.qdstrm` left.

A profiled job with a rank whose report is missing, empty or unsettled is a FAILURE (its
performance rows are still written) unless the job ran with `--profile-optional true`; then the
summary says INCOMPLETE and the verdict stands. srtctl's users lost whole profiling campaigns to
teardowns that killed nsys mid-write: the point of `--profile` is the reports.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.readfile import finite, read_json
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.shared import rank_label

FLUSH_FILE = "profile-flush.json"  # lib/profile.sh's PROFILE_FLUSH_FILE (a test keeps them equal)
RANK_RE = re.compile(r"_rank(\d{1,9})\.nsys-rep$")
MAX_REPORT_BYTES = 2**63  # no file is larger (off_t): a bigger count is no size
TRUE_WORDS = ("true", "1", "yes")


@dataclass
class RankProfile:
    rank: int
    node: str
    reports: list[str] = field(default_factory=list)
    bytes: int = 0
    settled: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "report": self.reports[0] if len(self.reports) == 1 else (self.reports or None),
            "bytes": self.bytes,
            "settled": self.settled,
            "reason": self.reason or None,
        }


@dataclass
class ProfileCheck:
    kind: str  # nsys | nsight-slurm
    optional: bool
    ranks: list[RankProfile]
    flush: str  # what the flush said (its summary), or why there is no record of it

    @property
    def complete(self) -> bool:
        return all(r.settled for r in self.ranks)

    @property
    def missing(self) -> list[RankProfile]:
        return [r for r in self.ranks if not r.settled]

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self.ranks)

    def describe(self) -> str:
        """`profile: 4 of 4 reports (1.2 GB)` or `profile: INCOMPLETE, 3 of 4: rank 2 (node3): …`."""
        good = len(self.ranks) - len(self.missing)
        if self.complete:
            from slurm_multi.reports import human_bytes

            return f"profile: {good} of {len(self.ranks)} reports ({human_bytes(self.total_bytes)})"
        what = "; ".join(f"{rank_label(r.node, r.rank)}: {r.reason}" for r in self.missing[:4])
        more = f"; and {len(self.missing) - 4} more" if len(self.missing) > 4 else ""
        tail = " (--profile-optional: the verdict stands)" if self.optional else ""
        return f"profile: INCOMPLETE, {good} of {len(self.ranks)}: {what}{more}{tail}"

    def reasons(self) -> list[str]:
        """The verdict's reason, unless the profile is complete or optional."""
        if self.complete or self.optional:
            return []
        good = len(self.ranks) - len(self.missing)
        return [
            f"profile incomplete: {good} of {len(self.ranks)} reports (the profile line names the ranks); "
            "--profile-optional true accepts a job without every report"
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "optional": self.optional,
            "complete": self.complete,
            "reports": len(self.ranks) - len(self.missing),
            "expected": len(self.ranks),
            "bytes": self.total_bytes,
            "flush": self.flush,
            "ranks": [r.to_dict() for r in self.ranks],
        }


def check_profile(root: Path, job: dict[str, Any], nodes: Sequence[NodeReport]) -> ProfileCheck | None:
    """The profile section for a profiled job (None when the job was not profiled)."""
    settings = job.get("settings") if isinstance(job.get("settings"), dict) else {}
    kind = job.get("profile") or settings.get("SM_PROFILE") or "none"
    if kind not in ("nsys", "nsight-slurm"):
        return None
    # The report states' writer, imported only for a profiled job (it costs collect ~10 ms).
    from slurm_multi.reports import EMPTY, SETTLED, human_bytes

    optional = str(settings.get("SM_PROFILE_OPTIONAL", "")).lower() in TRUE_WORDS
    ranks = {n.rank: RankProfile(n.rank, n.node) for n in nodes}
    state, flush = _read_state(root / FLUSH_FILE)
    if state is None:
        for entry in ranks.values():
            entry.reason = f"no report: {flush}"
        return ProfileCheck(kind, optional, sorted(ranks.values(), key=lambda r: r.rank), flush)
    settle = finite(state.get("settle_seconds"))
    settle_text = f"{settle:g} s " if settle is not None else ""
    states: dict[int, list[str]] = {}
    for item in _list(state, "reports"):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str):
            continue
        match = RANK_RE.search(os.path.basename(item["path"]))
        if match is None or int(match.group(1)) not in ranks:
            continue
        entry = ranks[int(match.group(1))]
        entry.reports.append(item["path"])
        size = item.get("bytes")
        entry.bytes += size if isinstance(size, int) and 0 < size < MAX_REPORT_BYTES else 0
        states.setdefault(entry.rank, []).append(str(item.get("state")))
    left = {
        int(m.group(1))
        for q in _list(state, "qdstrm")
        if isinstance(q, str) and (m := re.search(r"_rank(\d{1,9})\.qdstrm$", q))
    }
    for entry in ranks.values():
        seen = states.get(entry.rank, [])
        if entry.rank in left:
            entry.reason = (
                "a .qdstrm is left: nsys never finished writing (killed, not stopped with SIGTERM?)"
            )
        elif not seen:
            entry.reason = f"no report after the {settle_text}settle"
        elif all(s == EMPTY for s in seen):
            entry.reason = "empty report (0 bytes)"
        elif any(s != SETTLED for s in seen):
            entry.reason = f"report still changing when the flush ended ({human_bytes(entry.bytes)})"
        else:
            entry.settled = True
    return ProfileCheck(kind, optional, sorted(ranks.values(), key=lambda r: r.rank), flush)


# Where each profiler tool of a madengine manifest leaves its output in node_<rank>/tools/ (its
# post-script collects it there: madengine's trace.sh, rtl_trace_wrapper.sh; slurm_multi.madrun
# stages it).
TOOL_OUTPUT_DIRS = {"rpd": "rpd_output", "rocm_trace_lite": "rocm_trace_lite_output",
                    "rocm_trace_lite_default": "rocm_trace_lite_output"}  # fmt: skip


def tool_output_dir(tool: str) -> str:
    return TOOL_OUTPUT_DIRS.get(tool, "rocprof_output")  # the rocprof family


def check_tool_profile(root: Path, job: dict[str, Any], nodes: Sequence[NodeReport]) -> ProfileCheck | None:
    """The profile section of a job whose manifest ran profiler tools (rocprof, rocprofv3, rpd, ...):
    every rank must leave each tool's output, non-empty, in node_<rank>/tools/ (None: no such tool)."""
    tools = job.get("profiler_tools")
    if not isinstance(tools, list) or not tools:
        return None
    settings = job.get("settings") if isinstance(job.get("settings"), dict) else {}
    optional = str(settings.get("SM_PROFILE_OPTIONAL", "")).lower() in TRUE_WORDS
    ranks = []
    for node in nodes:
        entry = RankProfile(node.rank, node.node)
        missing = []
        for tool in (str(t) for t in tools):
            where = root / (node.dirname or f"node_{node.rank}") / "tools" / tool_output_dir(tool)
            files = [p for p in where.rglob("*") if p.is_file()] if where.is_dir() else []
            size = sum(p.stat().st_size for p in files)
            if size:
                entry.reports.append(str(where.relative_to(root)))
                entry.bytes += size
            else:
                missing.append(
                    f"{tool}: {'empty' if files else 'no'} {where.name}/ in {where.parent.relative_to(root)}"
                )
        entry.settled = not missing
        entry.reason = "; ".join(missing)
        ranks.append(entry)
    return ProfileCheck(",".join(str(t) for t in tools), optional, ranks, "the tools' post-scripts")


def _read_state(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(the flush's state document, its summary), or (None, why there is none)."""
    from slurm_multi.reports import STATE_KIND

    try:
        data = read_json(path)  # a FIFO under the name reads as empty (O_NONBLOCK), never hangs collect
    except FileNotFoundError:
        return None, f"the flush recorded nothing ({path.name} is missing: it never waited for reports)"
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"the flush's record {path.name} is unreadable ({type(exc).__name__})"
    if not isinstance(data, dict) or data.get("kind") != STATE_KIND:
        return None, f"{path.name} is not a flush record"
    return data, str(data.get("summary") or ("every report settled" if data.get("ok") else ""))


def _list(state: dict[str, Any], key: str) -> list[Any]:
    """A list of the flush record; anything else there (a number, a string) is no entry."""
    value = state.get(key)
    return value if isinstance(value, list) else []
