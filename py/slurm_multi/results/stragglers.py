"""Stragglers: per stage, the one rank that took much longer than the others (pure, no I/O).

A multi-node job moves at the pace of its slowest rank, so a rank whose image pull or run took three
times as long as everyone else's is worth one line in the summary even when the job succeeded. It is
information only: a straggler never changes the verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slurm_multi.results.jobdir import NodeReport, stage_order
from slurm_multi.results.shared import rank_label

# The slowest rank is a straggler when its time is more than RATIO times the median of the OTHER
# ranks' times (the others, so that the straggler does not pull the median towards itself, which
# matters most with 2 or 3 ranks) ...
RATIO = 1.5
# ... and more than FLOOR_SECONDS above that median: sub-second stages jitter by 2x from scheduling
# alone (0.02 s against 0.01 s is not news), and a difference under half a second never matters in a
# job that takes minutes.
FLOOR_SECONDS = 0.5
# ... and took at least MIN_SECONDS itself: a stage that takes under a second is never what a job
# waits for, and such times are mostly scheduling noise.
MIN_SECONDS = 1.0
# Stages whose time is spent waiting for the other ranks: in `barrier` the FIRST rank to arrive waits
# longest, so its long time points at someone else's slow `image` and would name the wrong rank.
WAITING_STAGES = frozenset({"barrier"})


@dataclass(frozen=True)
class Straggler:
    stage: str
    rank: int
    node: str
    seconds: float
    median_others: float
    ratio: float | None  # None when the others' median is 0 (any time is infinitely slower)

    @property
    def label(self) -> str:
        return rank_label(self.node, self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "rank": self.rank,
            "node": self.node,
            "seconds": self.seconds,
            "median_others": self.median_others,
            "ratio": self.ratio,
        }

    def describe(self) -> str:
        """`node3 (rank 2) image 12.4 s, 3.1x the median of the others (4.0 s)`."""
        head = f"{self.label} {self.stage} {self.seconds:.1f} s"
        if self.ratio is None:
            return f"{head}, where the median of the others is 0 s"
        return f"{head}, {self.ratio:.1f}x the median of the others ({self.median_others:.1f} s)"


def valid_seconds(value: Any) -> bool:
    """A stage time that can be compared: a finite number, not negative (a clock step backwards
    during the stage writes a negative one), not a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an integer too large for a float
        return False


def stage_straggler(stage: str, times: Sequence[tuple[int, str, float]]) -> Straggler | None:
    """The straggler among (rank, node, seconds) for one stage, or None.

    Needs at least 2 valid times (with 2 ranks the median of the others is the other rank's time).
    The slowest is looked at only: a second slow rank raises the others' median, which is right,
    since then no single rank holds the job back. A tie for slowest goes to the lower rank.
    """
    valid = [(rank, node, float(seconds)) for rank, node, seconds in times if valid_seconds(seconds)]
    if len(valid) < 2:
        return None
    slowest = max(valid, key=lambda t: (t[2], -t[0]))
    median = statistics.median([t[2] for t in valid if t is not slowest])
    seconds = slowest[2]
    if seconds < MIN_SECONDS or seconds <= RATIO * median or seconds - median <= FLOOR_SECONDS:
        return None
    ratio = round(seconds / median, 2) if median > 0 else None
    return Straggler(stage, slowest[0], slowest[1], seconds, round(median, 3), ratio)


def find_stragglers(nodes: Sequence[NodeReport]) -> list[Straggler]:
    """At most one straggler per stage, in stage order; stages run on one rank only are skipped."""
    per_stage: dict[str, list[tuple[int, str, float]]] = {}
    for node in nodes:
        for stage, seconds in node.stages.items():
            per_stage.setdefault(stage, []).append((node.rank, node.node, seconds))
    found = []
    for stage in stage_order(per_stage):
        if stage in WAITING_STAGES:
            continue
        straggler = stage_straggler(stage, per_stage[stage])
        if straggler is not None:
            found.append(straggler)
    return found
