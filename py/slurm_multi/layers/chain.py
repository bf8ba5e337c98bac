"""An image's layer chain: chain IDs, the prefix of it a node holds, and which blob each node needs.

An image's layers are its diff IDs in order (`RootFS.Layers`: the sha256 of each layer's
uncompressed tar). The engine keys a layer by its chain ID, which names the layer *and everything
below it*:

    chainID(L0) = diffID(L0)
    chainID(Ln) = sha256(chainID(Ln-1) + " " + diffID(Ln))

So a node "holds the first k layers" of rank 0's image exactly when one of its images has those k
diff IDs first: then the chain is in its layer store and `docker load` (classic store) skips those
layers' blobs (moby#18727: a missing blob of a layer whose chain is present is no error).

A blob is labelled with the number of layers a node must hold so that it needs it no longer: one
more than the last position its diff ID has in the chain (the same empty layer may sit at several
positions; its blob is needed while any of them is missing). A node that holds a prefix of `p`
layers needs the blobs whose label is above `p`; a link in the relay carries the blobs that some
node below it needs: label above the least prefix of that subtree. ALWAYS labels the rest of the
tar (the config, the manifest, the tar's end): every node needs it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence

ALWAYS = 0xFFFFFFFF  # the label of what every receiver needs (a u32 on the relay's wire)
DIFF_ID = re.compile(r"sha256:[0-9a-f]{64}")
CLAIM_HEX = 12  # a prefix claim names the chain ID it ends at by its first 12 hex digits
MAX_LAYERS = 4096  # no image has more (the overlay driver stops at 128); more is not an image's chain
CLAIM = re.compile(rf"layers:(0|[1-9][0-9]{{0,3}})(?::([0-9a-f]{{{CLAIM_HEX}}}))?")


def is_diff_ids(values: object) -> bool:
    """A list of diff IDs as an engine gives them (`sha256:<64 hex>` each, at most MAX_LAYERS)."""
    return (
        isinstance(values, (list, tuple))
        and len(values) <= MAX_LAYERS
        and all(isinstance(v, str) and DIFF_ID.fullmatch(v) for v in values)
    )


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The chain ID of every prefix: [chainID(L0), chainID(L1), ...]."""
    chains: list[str] = []
    for diff in diff_ids:
        below = chains[-1] if chains else ""
        chains.append(
            diff if not below else "sha256:" + hashlib.sha256(f"{below} {diff}".encode()).hexdigest()
        )
    return chains


def common_prefix(a: Sequence[str], b: Sequence[str]) -> int:
    """How many layers two chains share from the bottom."""
    n = 0
    for left, right in zip(a, b):
        if left != right:
            break
        n += 1
    return n


def held_prefix(wanted: Sequence[str], held: Iterable[Sequence[str]]) -> int:
    """The longest prefix of `wanted` (diff IDs) that one of the `held` images' chains starts with:
    the layers a node's engine already has of it."""
    best = 0
    for layers in held:
        best = max(best, common_prefix(wanted, layers))
        if best == len(wanted):
            break
    return best


def labels(diff_ids: Sequence[str]) -> dict[str, int]:
    """diff ID -> its label: one more than its last position in the chain."""
    return {diff: index + 1 for index, diff in enumerate(diff_ids)}


def claim_text(diff_ids: Sequence[str], held: int) -> str:
    """What a worker says in its image READY: `layers:<k>:<first 12 hex of chainID(L(k-1))>`, or
    `layers:0` (the chain ID pins the claim to the chain it was computed against)."""
    if held <= 0:
        return "layers:0"
    return f"layers:{held}:{chain_ids(diff_ids[:held])[-1][7 : 7 + CLAIM_HEX]}"


def parse_claim(text: str) -> tuple[int, str] | None:
    """(k, chain hex) from a claim's text; None when it is malformed (k > 0 needs its chain hex,
    k = 0 has none)."""
    match = CLAIM.fullmatch(text)
    if match is None:
        return None
    count, hexes = int(match.group(1)), match.group(2) or ""
    if (count == 0) != (hexes == ""):
        return None
    return count, hexes


def claim_fits(diff_ids: Sequence[str], count: int, hexes: str) -> bool:
    """A claim of `count` layers ending at chain ID `hexes…` is a prefix of this chain."""
    if count == 0:
        return True
    if count > len(diff_ids):
        return False
    return chain_ids(diff_ids[:count])[-1][7 : 7 + CLAIM_HEX] == hexes


def thresholds(prefixes: Mapping[int, int], fanout: int, nnodes: int) -> dict[int, int]:
    """rank -> the least prefix held in its subtree (the relay's tree: the parent of r is
    (r-1)//fanout): what the link into that rank must carry, the blobs labelled above it. Rank 0
    holds everything and is nobody's child. Linear in the ranks: children come after their parent."""
    least = {rank: prefixes.get(rank, 0) for rank in range(1, nnodes)}
    for rank in range(nnodes - 1, 1, -1):
        parent = (rank - 1) // fanout
        if parent >= 1:
            least[parent] = min(least[parent], least[rank])
    return least
