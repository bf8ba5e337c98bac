"""What each node's image stage moved, for summary.json (a node's `image`): from the events its
image stage recorded (lib/image.sh). A worker's `image_stream_end` (the relay) or `image_load_end`
(the cache) carries the bytes that reached it and, for an image moved by layers, how many layers it
loaded and how many (and how many bytes) it already held; rank 0's `image_stream_end` carries the
bytes it sent. A node that moved nothing (it held the image) has none."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

COUNTS = (
    "bytes", "layers", "received_layers", "loaded_layers", "loaded_bytes", "read_layers", "read_bytes",
    "held_layers", "held_bytes",
)  # fmt: skip


def image_moved(rank: int, events: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The last image move the events record: {"via": "relay"|"cache", "bytes": N, …} (rank 0:
    "via": "relay (sent)"); None when the node moved no image."""
    found: dict[str, Any] | None = None
    for event in events:
        name = event.get("event")
        if name not in ("image_stream_end", "image_load_end") or event.get("status") == "failed":
            continue
        counts = {
            k: event[k]
            for k in COUNTS
            if isinstance(event.get(k), int) and not isinstance(event.get(k), bool)
        }
        if "bytes" not in counts:
            continue
        via = "relay" if name == "image_stream_end" else "cache"
        found = {"via": f"{via} (sent)" if rank == 0 and via == "relay" else via, **counts}
    return found
