"""Where a node sits in the relay: its parent, its children, its ports, and what it knows (Plan).

Topology: ranks 0..N-1 in a tree of fanout K: the parent of r is (r-1)//K, its children are
r*K+1 .. r*K+K below N. K=1 (the default) is a chain: r-1 -> r -> r+1.

Ports: rank r listens on `derive_ports(MASTER_PORT, SLURM_JOB_ID + 64 + r*count, ...)`
(slurm_multi.net's derivation: the same on every node, outside the ephemeral range, never
MASTER_PORT, clear of the barrier's own candidates), on the address `choose_bind_address` picks
(never loopback). A child computes its parent's candidates the same way and dials them at
`connect_addresses(parent host)`.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurm_multi import EXIT_FAILURE, net
from slurm_multi.common import HelperError, talk, usage_error
from slurm_multi.relay.protocol import DEFAULT_PURPOSE

# Relay ports sit past anything the barrier may use (at most MAX_CANDIDATES, plus MASTER_PORT).
RELAY_PORT_OFFSET = 2 * net.MAX_CANDIDATES
DEFAULT_PORT_COUNT = 4

Log = Callable[[str], None]


def _talk(message: str) -> None:
    talk("relay", message)


# --------------------------------------------------------------------------------------------------
# Topology and names


def parent_of(rank: int, fanout: int) -> int | None:
    """The rank this rank receives from (None for rank 0)."""
    return None if rank == 0 else (rank - 1) // fanout


def children_of(rank: int, fanout: int, nnodes: int) -> list[int]:
    """The ranks this rank forwards to, in order."""
    first = rank * fanout + 1
    return list(range(first, min(first + fanout, nnodes)))


def size_text(nbytes: int) -> str:
    """812 MB, 1.07 GB, 2.5 MB, 4096 bytes: decimal units, three digits, as a person reads a transfer."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale * (10 if unit == "kB" else 1):
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"


def rate_text(nbytes: int, seconds: float) -> str:
    return f"{nbytes / 1e6 / seconds:.0f} MB/s" if seconds > 0 else "- MB/s"


# --------------------------------------------------------------------------------------------------
# Ports


def relay_ports(
    rank: int,
    master_port: int | None,
    job_id: int | None,
    override: int | None = None,
    count: int = DEFAULT_PORT_COUNT,
    local_range: tuple[int, int] | None = None,
) -> list[int]:
    """The candidate ports rank `rank` listens on: the same on every node of the job.

    The barrier's derivation with the job id moved past the barrier's own candidates and by
    `count` per rank, so ranks never share a candidate (two ranks may share a host).
    --port P (override) gives rank r the ports P + r*count, and its successors.
    """
    if override is not None:
        return net.candidate_ports((), None, None, override + rank * count, count)
    if master_port is None or job_id is None:
        raise usage_error(
            "relay: no port to use; give --master-port and --job-id (MASTER_PORT and SLURM_JOB_ID), "
            "or --port (SM_RELAY_PORT) on every node"
        )
    try:
        return net.candidate_ports(
            (), master_port, job_id + RELAY_PORT_OFFSET + rank * count, None, count, local_range
        )
    except HelperError as exc:
        raise usage_error(f"relay: {exc.format_message().removeprefix('barrier: ')}") from None


# --------------------------------------------------------------------------------------------------
# What one node knows, and what it reports


@dataclass
class Plan:
    """Everything one node needs to know; the same inputs on every node give the same tree."""

    rank: int
    nnodes: int
    token: str
    fanout: int = 1
    hosts: Sequence[str] = ()  # host names in rank order (for dialing and for messages)
    parent_host: str | None = None  # instead of hosts[parent]
    ports_of: Callable[[int], list[int]] = field(default=lambda rank: [])
    purpose: str = DEFAULT_PURPOSE
    connect_timeout: float = 120.0
    stall_timeout: float = 30.0
    loopback: bool = False  # bench and tests only: listen on and dial 127.0.0.1
    log: Log = _talk

    def name(self, rank: int) -> str:
        host = self.hosts[rank] if rank < len(self.hosts) else None
        if self.parent_host and rank == parent_of(self.rank, self.fanout):
            host = self.parent_host
        return f"rank {rank} ({host})" if host else f"rank {rank}"

    @property
    def me(self) -> str:
        host = self.hosts[self.rank] if self.rank < len(self.hosts) else socket.gethostname()
        return f"{host} (rank {self.rank})"

    @property
    def heartbeat(self) -> float:
        """How often a node says it is alive (PING down, WAIT up): well inside --stall-timeout."""
        return max(0.05, min(5.0, self.stall_timeout / 3))

    def fail(self, message: str, code: int = EXIT_FAILURE) -> HelperError:
        """This node's one-line failure: `relay: <host> (rank r): <message>`."""
        return HelperError(f"relay: {self.me}: {message}", code)


@dataclass
class Result:
    total: int  # payload bytes
    digest: str  # the stream's chain digest (hex): the same on every node that verified it
    seconds: float  # first byte -> every node below has verified
    nodes: int  # nodes that verified the stream (rank 0: all receivers; others: self + subtree)
    layers: dict[str, int] | None = None  # a layered stream: what this receiver loaded and held
    sent: dict[int, int] | None = None  # a layered stream: stream bytes sent to each child (by rank)
