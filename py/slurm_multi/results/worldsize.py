"""Did every process join the one world the launcher was asked for? A model script that falls back
to a single-node run (madengine's fixtures do when MAD_MULTI_NODE_RUNNER is unset; a hand-written
`bash -c 'torchrun --standalone …'` always does) trains once per node, each node succeeds, and the
job would report a multi-node number that is not one. Only the workload's own output can tell:

- torchrun's agent (with LOGLEVEL=INFO): `group_world_size=1`, `global_world_sizes=[2, 2]`;
- the processes: `world_size: 4`, `World Size: 4`, `world_size ..... 4` (Megatron's argument dump),
  `Rank: 1/4`, `rank 3 of 4`; madengine's fixture: `Running in Standalone Mode`. Never an
  environment dump (`WORLD_SIZE=2`): madengine gives the container WORLD_SIZE = the node count.

A node whose largest world is smaller than the job's (nodes x nproc_per_node) fails the job, naming
the node and the line. A node that printed no world size at all is said in the summary: that case
cannot be told from a correct run.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.shared import short

CHUNK = 1 << 20
# Lines our own tools write into node.log (time, host, rank, area): never the workload's evidence.
OUR_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \S+ r\S* [\w-]+: ")
# A cheap test first (most lines mention none of these), then the exact patterns.
HINT = re.compile(r"world|rank|standalone", re.IGNORECASE)
# Not `WORLD_SIZE=N`: in a madengine container WORLD_SIZE is the node count until the launcher
# sets each process's own, and scripts print their environment before they launch.
PATTERNS = (
    re.compile(r"global_world_sizes=\[(\d+)"),
    re.compile(r"\b(?!WORLD_SIZE)(?i:world[_ ]size)\b\s*(?::|\.{2,})\s*(\d+)"),
    re.compile(r"\brank\b[\s:=]*\d+\s*(?:/|of)\s*(\d+)\b", re.IGNORECASE),
)
STANDALONE = re.compile(r"Running in Standalone Mode")


@dataclass
class WorldCheck:
    """What each node showed of its world: the largest world size seen and the line that said so."""

    expected: int
    seen: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # rank -> (size, line no, text)
    silent: list[str] = field(default_factory=list)  # labels of nodes that printed no world size
    short: list[str] = field(default_factory=list)  # the reasons: nodes in a smaller world

    def to_dict(self) -> dict[str, Any]:
        return {
            "expected": self.expected,
            "seen": {str(rank): size for rank, (size, _, _) in sorted(self.seen.items())},
            "silent": list(self.silent),
        }

    def describe(self) -> str:
        if self.short:
            return (
                f"world size: {len(self.short)} node(s) ran in a smaller world than the job's {self.expected}"
            )
        if self.silent:
            return (
                f"world size: not shown by {', '.join(self.silent)}: the workload printed no world size, "
                f"so a single-node fallback cannot be ruled out there (expected {self.expected})"
            )
        return f"world size: {self.expected} on every node, as the job asked"


def largest_world(path: Path) -> tuple[int, int, str] | None:
    """(largest world size, its line number, the line) a node log shows; None when it shows none."""
    return scan_world(path)[0]


def scan_world(path: Path) -> tuple[tuple[int, int, str] | None, tuple[int, str] | None]:
    """The largest world a node log shows (as largest_world) and madengine's first `Running in
    Standalone Mode` line (line number, line), if any: that node ran alone at least once."""
    best: tuple[int, int, str] | None = None
    standalone: tuple[int, str] | None = None
    number = 0
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        rest = ""
        while True:
            chunk = handle.read(CHUNK)
            text = rest + chunk
            lines = text.split("\n")
            rest = lines.pop() if chunk else ""
            for line in lines:
                number += 1
                if not HINT.search(line) or OUR_LINE.match(line):
                    continue
                sizes = [int(m.group(1)) for p in PATTERNS for m in p.finditer(line)]
                if STANDALONE.search(line):
                    sizes.append(1)
                    standalone = standalone or (number, line)
                for size in sizes:
                    if size > 0 and (best is None or size > best[0]):
                        best = (size, number, line)
            if not chunk:
                return best, standalone


def check_world(root: Path, nodes: Sequence[NodeReport], expected: int, nproc: int | None) -> WorldCheck:
    check = WorldCheck(expected)
    for node in nodes:
        log = root / node.dirname / "node.log" if node.dirname else None
        try:
            found, standalone = scan_world(log) if log is not None and log.is_file() else (None, None)
        except OSError:
            found, standalone = None, None
        if found is None:
            check.silent.append(node.label)
            continue
        check.seen[node.rank] = found
        size, line, text = found
        if size < expected:
            alone = f" ({nproc} processes: this node alone)" if nproc is not None and size <= nproc else ""
            check.short.append(
                f"{node.label}: the workload ran in a world of {size}{alone}, not the job's {expected}; "
                f"it did not join the other nodes (a single-node fallback?): node.log:{line}: {short(text)}"
            )
        elif standalone is not None:
            check.short.append(
                f"{node.label}: the workload ran in standalone mode, not in the job's world of {expected}; "
                f"it did not join the other nodes (a single-node fallback): node.log:{standalone[0]}: "
                f"{short(standalone[1])}"
            )
    return check
