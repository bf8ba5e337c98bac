"""Rank 0's layer plan: how many layers of its image each worker holds, and whether any may be left out.

Each worker said, signed inside its image READY, the longest prefix of the job plan's layer chain
its engine holds (`layers:<k>:<chain id…>`; the barrier server refuses a claim that is not a prefix
of that chain) and the image ID it holds of the job's image; the server appended both to its holds
file. Rank 0's image may differ from the plan's (rebuilt since): a worker holds of it what its
claim and rank 0's chain share. A worker that holds an image rank 0's engine also has (the tag's
earlier build, say) holds the prefix the two share. A worker that holds rank 0's image ID holds it
all. A worker that said nothing holds nothing.

The plan (JSON, one writer and one reader: this module) goes to `relay send` and `layers cache-put`.
`whole` names why nothing may be left out: rank 0's engine cannot say its image's layers or cannot
load partial images (the containerd store), or --image-layers off. Then the stream is the whole
`docker save`, as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_multi import dockerapi
from slurm_multi.common import HelperError
from slurm_multi.layers import engine
from slurm_multi.layers.chain import claim_fits, common_prefix, is_diff_ids, parse_claim
from slurm_multi.words import is_held_id

FORMAT = "slurm-multi layer plan 1"


@dataclass
class LayerPlan:
    image_id: str
    diff_ids: list[str] = field(default_factory=list)  # rank 0's image's layers ([] when whole)
    prefixes: dict[int, int] = field(default_factory=dict)  # worker rank -> layers it holds
    whole: str = ""  # why the whole image moves (nothing left out)

    def prefix(self, rank: int) -> int:
        return len(self.diff_ids) if rank == 0 else self.prefixes.get(rank, 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "image_id": self.image_id,
            "diff_ids": list(self.diff_ids),
            "prefixes": {str(rank): count for rank, count in sorted(self.prefixes.items())},
            "whole": self.whole,
        }


def read_plan(path: str) -> LayerPlan:
    """The plan `layers plan` wrote; HelperError (usage) when it is not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
        diff_ids, prefixes = doc["diff_ids"], doc["prefixes"]
        if doc["format"] != FORMAT or not is_diff_ids(diff_ids) or not isinstance(prefixes, dict):
            raise ValueError("not a layer plan")
        counts = {int(rank): int(count) for rank, count in prefixes.items()}
        if any(rank < 1 or not 0 <= count <= len(diff_ids) for rank, count in counts.items()):
            raise ValueError("a prefix out of range")
        return LayerPlan(str(doc["image_id"]), list(diff_ids), counts, str(doc.get("whole") or ""))
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise HelperError(
            f"layers: {path} is not a layer plan ({exc}); run `slurm-multi layers plan`", 2
        ) from None


def write_plan(path: str, plan: LayerPlan) -> None:
    from slurm_multi.shell import write_atomic

    write_atomic(path, json.dumps(plan.to_dict(), indent=1) + "\n")


def read_holds(lines: Iterable[str], nnodes: int) -> dict[int, tuple[str, str]]:
    """barrier.holds (`<rank> <held id|-> <cache|-> [<layers claim>|-]`, appended as each image READY
    came): rank -> (held image ID, claim), as each worker last said it."""
    said: dict[int, tuple[str, str]] = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or not fields[0].isdigit() or not 1 <= int(fields[0]) < nnodes:
            continue
        held = fields[1] if is_held_id(fields[1]) else ""
        claim = fields[3] if len(fields) > 3 and fields[3] != "-" else ""
        said[int(fields[0])] = (held, claim)
    return said


def worker_prefix(
    held: str, claim: str, image_id: str, diff_ids: Sequence[str], planned: Sequence[str],
    layers_of: Mapping[str, Sequence[str]],
) -> int:  # fmt: skip
    """How many of rank 0's layers a worker holds, from what it said (see the module's docstring)."""
    if held and held == image_id:
        return len(diff_ids)
    best = 0
    parsed = parse_claim(claim) if claim else None
    if parsed is not None and claim_fits(planned, *parsed):
        best = min(parsed[0], common_prefix(planned, diff_ids))
    if held in layers_of:
        best = max(best, common_prefix(layers_of[held], diff_ids))
    return best


def make_plan(
    env: Mapping[str, str], image: str, image_id: str, nnodes: int, holds: Iterable[str], off: bool = False
) -> LayerPlan:
    """Rank 0's plan for `image` (whose ID is `image_id`) and the workers' holds lines."""
    if off:
        return LayerPlan(image_id, whole="--image-layers off")
    mine = engine.image_layers(env, image)
    if mine.why:
        return LayerPlan(image_id, whole=mine.why)
    if mine.image_id != image_id:
        now = mine.image_id[7:19]
        return LayerPlan(image_id, whole=f"{image} on this engine is now {now}, not {image_id[7:19]}")
    planned = engine.planned_layers(env)
    said = read_holds(holds, nnodes)
    layers_of: dict[str, list[str]] = {}
    for held, _ in said.values():  # an image a worker holds that this engine holds too
        if held and held not in layers_of and held != image_id:
            got = dockerapi.image_rootfs(env, held)
            if got is not None and got[0] == held and is_diff_ids(got[1]):
                layers_of[held] = list(got[1])
    prefixes = {
        rank: worker_prefix(held, claim, image_id, mine.diff_ids, planned, layers_of)
        for rank, (held, claim) in said.items()
    }
    return LayerPlan(image_id, mine.diff_ids, {r: p for r, p in prefixes.items() if p})


def describe(plan: LayerPlan, nnodes: int, hosts: Sequence[str] = ()) -> str:
    """One log line: what each worker holds of rank 0's image."""
    if plan.whole:
        return f"the whole image moves: {plan.whole}"
    n = len(plan.diff_ids)

    def name(rank: int) -> str:
        return f"rank {rank} ({hosts[rank]})" if rank < len(hosts) else f"rank {rank}"

    held = [f"{name(r)} {plan.prefix(r)}" for r in range(1, nnodes) if plan.prefix(r)]
    if not held:
        return f"no worker holds any of the image's {n} layers: every layer moves"
    return (
        f"of the image's {n} layers the workers hold: "
        + ", ".join(held)
        + ("; the others none" if len(held) < nnodes - 1 else "")
    )


def hosts_from(nodes: str | None) -> list[str]:
    return [h for h in (nodes or "").split(",") if h]
