"""A layered stream: rank 0's `docker save` in labelled sections, each link carrying only the sections
some node below it needs, each loader fed only the sections its node lacks.

Rank 0 reads its tar with slurm_multi.layers.tarstream: every layer's blob is a section labelled by
slurm_multi.layers.chain (one more than the blob's last position in the chain), the rest of the tar
is ALWAYS. The stream starts with an L frame (the layer count and, by rank, how many layers each
node holds: rank 0's layer plan); an S frame opens each section, its D frames follow. A link into
rank r carries the sections labelled above the least prefix held in r's subtree (its threshold); a
node's loader gets the sections labelled above its own prefix, so `docker load` (classic store)
reads a tar without the blobs its engine holds. Every frame is still tagged per link. The chain
digest covers the S and D frames a node receives, so rank 0 keeps one chain per threshold, and the
stream ends with a T frame instead of E: per threshold its total and chain, plus every blob's size
(a node says what it held, too). A node checks its own threshold's entry, as it checks E.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from slurm_multi.layers.chain import ALWAYS, thresholds
from slurm_multi.layers.tarstream import MARK, QUIET, Member
from slurm_multi.relay.protocol import (
    CHAIN_START,
    CHUNK,
    DATA,
    EMPTY_DIGEST,
    FRAME,
    LAYOUT,
    PING,
    SECTION,
    chain,
    layered_trailer_payload,
    layout_payload,
    parse_layered_trailer,
    parse_layout,
    section_payload,
)
from slurm_multi.relay.tree import size_text
from slurm_multi.wire import ProtocolError


class Sink(Protocol):
    """What else reads rank 0's tar as it streams (slurm_multi.layers.store's cache writer)."""

    def feed(self, member: Member, part: str, piece: memoryview) -> None: ...


class Layering:
    """One node's view of a layered stream: its own and its children's thresholds, the current
    section, the chain digests it keeps (rank 0: one per threshold below it; a receiver: its own)."""

    def __init__(self, layers: int, prefixes: list[int], rank: int, fanout: int, nnodes: int) -> None:
        self.layers, self.prefixes, self.rank = layers, prefixes, rank
        self.least = thresholds(dict(enumerate(prefixes)), fanout, nnodes)
        self.own = layers if rank == 0 else prefixes[rank]
        self.threshold = -1 if rank == 0 else self.least[rank]
        self.label = ALWAYS
        kept = set(self.least.values()) if rank == 0 else {self.threshold}
        self.chains: dict[int, tuple[int, bytes]] = {m: (0, CHAIN_START) for m in kept}
        self.received: dict[int, int] = {}  # label -> bytes of it this node received
        self.loaded: dict[int, int] = {}  # label -> bytes of it this node's loader got
        self.sizes: dict[int, int] = {}  # label -> its blob's bytes (rank 0 counts; the trailer tells)

    @classmethod
    def from_layout(cls, payload: Any, rank: int, fanout: int, nnodes: int) -> Layering:
        layers, prefixes = parse_layout(payload, nnodes)
        return cls(layers, prefixes, rank, fanout, nnodes)

    def layout(self) -> bytes:
        return layout_payload(self.layers, self.prefixes)

    # -- the current section -----------------------------------------------------------------------

    def section(self, label: int) -> None:
        self.label = label

    def to_child(self, rank: int) -> bool:
        return self.least[rank] < self.label

    def to_loader(self) -> bool:
        return self.own < self.label

    def wanted_below(self) -> bool:
        """Some node below this one needs the current section."""
        return any(m < self.label for m in self.least.values()) if self.rank == 0 else True

    def frame(self, digest: bytes, length: int) -> None:
        """An S or D frame of the current section passed: every chain that covers it moves on."""
        for m, (total, stream) in self.chains.items():
            if m < self.label:
                self.chains[m] = (total + length, chain(stream, digest))

    def data(self, length: int, loaded: bool) -> None:
        """A receiver's D frame: counted for what it says at the end."""
        if self.label != ALWAYS:
            self.received[self.label] = self.received.get(self.label, 0) + length
            if loaded:
                self.loaded[self.label] = self.loaded.get(self.label, 0) + length

    # -- the end -----------------------------------------------------------------------------------

    def trailer(self) -> bytes:
        return layered_trailer_payload(self.chains, self.sizes)

    def verify(self, payload: Any, total: int, upstream: str) -> tuple[bytes, str]:
        """Our chain digest when the T frame says rank 0 sent what we received; else ("", why)."""
        totals, self.sizes = parse_layered_trailer(payload)
        ours = self.chains[self.threshold]
        if self.threshold not in totals:
            raise ProtocolError(f"a layered trailer without the stream for threshold {self.threshold}")
        their_total, their_chain = totals[self.threshold]
        if their_total != total:
            lost = f"received {total} bytes from {upstream} but the stream had {their_total}: bytes were lost"
            return b"", lost
        if their_chain != ours[1]:
            return b"", (
                f"the stream from {upstream} ({size_text(total)}) is not rank 0's: chain digest "
                f"{ours[1].hex()[:16]}..., rank 0 sent {their_chain.hex()[:16]}...; a node upstream "
                "relayed other bytes"
            )
        return ours[1], ""

    def stats(self, loading: bool) -> dict[str, int]:
        """What this node received, loaded and held of the image's layers (after the trailer)."""
        held = [label for label in self.sizes if label <= self.own]
        return {
            "layers": len(self.sizes),
            "received_layers": len(self.received),
            "received_bytes": sum(self.received.values()),
            "loaded_layers": len(self.loaded) if loading else 0,
            "loaded_bytes": sum(self.loaded.values()) if loading else 0,
            "held_layers": len(held),
            "held_bytes": sum(self.sizes[label] for label in held),
        }


def describe(stats: dict[str, int]) -> str:
    """`1 of 4 layers (1.05 MB) loaded, 3 held (1.29 GB)` for a node's log line."""
    text = f"{stats['loaded_layers']} of {stats['layers']} layers ({size_text(stats['loaded_bytes'])}) loaded"
    extra = stats["received_layers"] - stats["loaded_layers"]
    if extra > 0:
        text += f", {extra} more received for the nodes below"
    return text + f", {stats['held_layers']} held ({size_text(stats['held_bytes'])})"


# --------------------------------------------------------------------------------------------------
# Rank 0: the tar, in sections, to the children


class LayeredSource:
    """Rank 0's side: frames cut from the scanner's pieces, one section after another; a section no
    node below needs is read (and fed to the sink) but never sent."""

    def __init__(self, node: Any, layering: Layering, pieces: Iterator, sink: Sink | None = None) -> None:
        self.node, self.layering, self.pieces, self.sink = node, layering, pieces, sink
        self.payload = node.view[FRAME.size :]
        self.fill = 0
        self.total = 0  # bytes sent in D frames

    def _send(self, kind: bytes, frame: Any, length: int, digest: bytes, everyone: bool = False) -> None:
        wants: Callable[[int], bool] | None = None if everyone else self.layering.to_child
        self.node.down.forward(frame, kind, length, digest, self.total, wants=wants)
        self.node.down.check()

    def flush(self) -> None:
        if not self.fill:
            return
        body = self.payload[: self.fill]
        digest = hashlib.sha256(body).digest()
        self.layering.frame(digest, self.fill)
        self.total += self.fill
        self._send(DATA, self.node.view[: FRAME.size + self.fill], self.fill, digest)
        self.fill = 0

    def start(self, label: int) -> None:
        self.flush()
        self.layering.section(label)
        if not self.layering.wanted_below():
            return
        payload = section_payload(label)
        digest = hashlib.sha256(payload).digest()
        self.layering.frame(digest, 0)
        self._send(SECTION, bytearray(FRAME.size) + payload, len(payload), digest)

    def run(self) -> int:
        """Send the whole tar; the D bytes sent."""
        layout = self.layering.layout()
        self._send(LAYOUT, bytearray(FRAME.size) + layout, len(layout), hashlib.sha256(layout).digest(), True)
        sizes = self.layering.sizes
        for member, part, piece in self.pieces:
            if member is MARK:
                self.flush()
                if part == QUIET:
                    self._send(PING, bytearray(FRAME.size), 0, EMPTY_DIGEST, True)
                continue
            if self.sink is not None:
                self.sink.feed(member, part, piece)
            if member.label != self.layering.label:
                self.start(member.label)
            if member.label != ALWAYS:
                sizes[member.label] = sizes.get(member.label, 0) + len(piece)
            if not self.layering.wanted_below():
                self.node.down.idle(self.total)  # nothing to send for a while: say we are alive
                self.node.down.check()
                continue
            while piece:
                n = min(len(piece), CHUNK - self.fill)
                self.payload[self.fill : self.fill + n] = piece[:n]
                self.fill += n
                piece = piece[n:]
                if self.fill == CHUNK:
                    self.flush()
        self.flush()
        return self.total
