"""`slurm-multi relay send|recv|port`: the relay's command line (one click group).

Rank 0 pipes the stream into `relay send`; every other rank runs `relay recv -- LOADER` (or writes
stdout). The node itself is slurm_multi.relay.forward; this module turns options into its Plan.

Exit codes: 0 stream delivered and verified (rank 0: by every node), 1 runtime failure, 2 usage
or rejected (wrong token, wrong purpose), 3 timeout (a peer never came, or stalled).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import click

from slurm_multi import net
from slurm_multi.common import FiniteFloat, HelperError, HostName, usage_error
from slurm_multi.layers import store, tarstream
from slurm_multi.layers.plan import LayerPlan, read_plan
from slurm_multi.relay.forward import run_node
from slurm_multi.relay.load import recv_into, release_stdout, write_stats
from slurm_multi.relay.protocol import DEFAULT_PURPOSE, PURPOSE_RE
from slurm_multi.relay.sections import describe as describe_layers
from slurm_multi.relay.tree import (
    DEFAULT_PORT_COUNT,
    Plan,
    Result,
    children_of,
    rate_text,
    relay_ports,
    size_text,
)
from slurm_multi.wire import DEFAULT_TOKEN_ENV, read_token
from slurm_multi.words import is_address

CONTEXT = {"help_option_names": ["-h", "--help"]}


def parse_nodes(text: str | None) -> list[str]:
    """`node1,node2,node3` -> names in rank order (as `scontrol show hostnames | paste -sd,`)."""
    if text is None:
        return []
    names = [part.strip() for part in text.split(",")]
    if not names or not all(is_address(name) for name in names):
        raise usage_error(f"relay: --nodes {text!r} must be host names separated by commas, in rank order")
    return names


def _plan_from_options(
    rank: int,
    nnodes: int | None,
    nodes: str | None,
    parent_host: str | None,
    fanout: int,
    master_port: int | None,
    job_id: int | None,
    port: int | None,
    count: int,
    connect_timeout: float,
    stall_timeout: float,
    token_env: str,
    purpose: str,
) -> Plan:
    hosts = parse_nodes(nodes)
    if hosts and nnodes is not None and nnodes != len(hosts):
        raise usage_error(f"relay: --nnodes {nnodes} but --nodes names {len(hosts)} hosts")
    total = nnodes if nnodes is not None else len(hosts)
    if total < 2:
        raise usage_error("relay: give --nodes (host names in rank order) or --nnodes >= 2")
    if not 0 <= rank < total:
        raise usage_error(f"relay: --rank {rank} is not in 0..{total - 1}")
    if not PURPOSE_RE.fullmatch(purpose):
        raise usage_error(f"relay: --purpose {purpose!r} must match {PURPOSE_RE.pattern}")
    relay_ports(rank, master_port, job_id, port, count)  # a usage error now, not on the first dial

    def ports_of(r: int) -> list[int]:
        return relay_ports(r, master_port, job_id, port, count)

    try:
        token = read_token(token_env)  # the barrier's token rule: one rule, one place
    except HelperError as exc:
        raise usage_error(f"relay: {exc.format_message().removeprefix('barrier: ')}") from None
    os.environ.setdefault("SM_RANK", str(rank))
    return Plan(
        rank,
        total,
        token,
        fanout=fanout,
        hosts=hosts,
        parent_host=parent_host,
        ports_of=ports_of,
        purpose=purpose,
        connect_timeout=connect_timeout,
        stall_timeout=stall_timeout,
    )


def _node_options(func: Callable) -> Callable:
    options = [
        click.option("--nnodes", type=click.IntRange(min=2), help="Nodes in the job [default: --nodes]"),
        click.option("--nodes", metavar="HOSTS",
                     help="Host names in rank order, comma-separated (scontrol show hostnames)."),
        click.option("--fanout", type=click.IntRange(min=1), default=1, show_default=True,
                     help="Children per node: 1 is a chain, K a tree (parent of r is (r-1)//K)."),
        click.option("--master-port", type=click.IntRange(1, 65535), envvar="MASTER_PORT", show_envvar=True,
                     help="The job's MASTER_PORT (an input of the port derivation; never used itself)."),
        click.option("--job-id", type=click.IntRange(min=0), envvar="SLURM_JOB_ID", show_envvar=True,
                     help="SLURM job id (an input of the port derivation)."),
        click.option("--port", type=click.IntRange(1024, 65535), envvar="SM_RELAY_PORT", show_envvar=True,
                     help="Instead of the derivation: rank r listens on PORT + r*count and successors."),
        click.option("--count", type=click.IntRange(1, net.MAX_CANDIDATES), default=DEFAULT_PORT_COUNT,
                     show_default=True, help="Candidate ports per rank."),
        click.option("--connect-timeout", type=FiniteFloat(min=0), default=120, show_default=True,
                     help="Seconds for the parent to answer and every child to connect."),
        click.option("--stall-timeout", type=FiniteFloat(min=0.1), default=30, show_default=True,
                     help="Seconds without bytes from the parent (or taken by a child) before giving up."),
        click.option("--stats-file", metavar="FILE", help="Write `<bytes> <seconds>` here once verified."),
        click.option("--token-env", default=DEFAULT_TOKEN_ENV, show_default=True, metavar="NAME",
                     help="Environment variable holding the job token (never pass the token itself)."),
        click.option("--purpose", default=DEFAULT_PURPOSE, show_default=True,
                     help="What the stream is (both ends must agree; it is inside the MAC)."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


@click.group("relay", context_settings=CONTEXT)
def cli() -> None:
    """Relay a byte stream (docker save) node to node: no shared storage, forwarded as received.

    \b
    Topology: chain (--fanout 1) or tree; rank 0 reads stdin, every other rank writes stdout.
    Exit codes: 0 delivered and verified, 1 failed, 2 usage or rejected, 3 timeout.
    """


@cli.command("send", context_settings=CONTEXT)
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="Always 0.")
@_node_options
@click.option("--layer-plan", type=click.Path(dir_okay=False),
              help="`layers plan`'s file: stdin is that image's docker save; each link carries only the "
              "layers the nodes below it lack, each loader only its node's.")  # fmt: skip
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="With --layer-plan: also store the image in this cache, its new layer blobs and its index.",
)
@click.option(
    "--cache-index", type=click.Path(dir_okay=False), help="With --cache-dir: write the index here."
)
def send_cmd(
    rank: int, stats_file: str | None, layer_plan: str | None, cache_dir: str | None, cache_index: str | None,
    **options: object,
) -> None:  # fmt: skip
    """Rank 0: send stdin to the children; exit 0 once every node has verified it.

    \b
    Example (rank 0):
      docker save toy/model:local | slurm-multi relay send --nodes "$NODES"
    """
    if rank != 0:
        raise usage_error(f"relay: send runs on rank 0 only (got --rank {rank}); use `relay recv`")
    if os.isatty(0):
        raise usage_error("relay: stdin is a terminal; pipe the stream in: docker save IMAGE | relay send")
    if (cache_dir is None) != (cache_index is None) or (cache_dir and not layer_plan):
        raise usage_error("relay: --cache-dir and --cache-index go together, with --layer-plan")
    plan = _plan_from_options(0, parent_host=None, **options)  # type: ignore[arg-type]
    plan.log(f"rank 0 of {plan.nnodes}, fanout {plan.fanout}; waiting for {plan.nnodes - 1} nodes")
    layered = read_plan(layer_plan) if layer_plan else None
    if layered is not None and not layered.whole:
        result = send_layered(plan, layered, cache_dir, cache_index)
    else:
        result = run_node(plan, source_fd=0)
    write_stats(stats_file, result)
    plan.log(
        f"done: {size_text(result.total)} verified by all {result.nodes} receivers in {result.seconds:.1f} s "
        f"({rate_text(result.total, result.seconds)}, chain digest {result.digest[:16]}...)"
    )


def send_layered(plan: Plan, layered: LayerPlan, cache_dir: str | None, cache_index: str | None) -> Result:
    """Rank 0's layered stream (stdin: the plan's image's docker save), writing the cache's layered
    entry as it goes: when the relay fails, the rest of the tar still goes into the cache (the
    workers it missed fall back to it)."""
    from slurm_multi.relay.forward import run_layered, widen_pipe

    widen_pipe(0)
    scanner = tarstream.Scanner(0, layered.diff_ids, quiet_every=plan.heartbeat)
    pieces = scanner.pieces()
    sink = store.Writer(cache_dir, cache_index, layered.image_id, layered.diff_ids) if cache_dir else None
    try:
        result = run_layered(plan, pieces, layered.diff_ids, layered.prefixes, sink)
    except HelperError:
        if sink is not None:
            for member, part, piece in pieces:
                if member is not tarstream.MARK:
                    sink.feed(member, part, piece)
            _finish_cache(plan, sink)
        raise
    except BaseException:
        if sink is not None:
            sink.abort("the relay stopped")
        raise
    if scanner.unreadable:
        plan.log(
            f"the tar could not be read past a point ({scanner.unreadable}): the rest went to every node"
        )
    if sink is not None:
        _finish_cache(plan, sink)
    for rank, sent in sorted((result.sent or {}).items()):
        plan.log(f"sent {size_text(sent)} of {size_text(scanner.total)} to {plan.name(rank)}")
    return result


def _finish_cache(plan: Plan, sink: store.Writer) -> None:
    why = sink.finish()
    if why:
        plan.log(f"the cache entry was not written: {why}")
        return
    new, kept = sink.new, sink.kept
    plan.log(
        f"cache: {len(new)} new layer blob(s) ({size_text(sum(new.values()))}), {len(kept)} there already"
    )


@cli.command("recv", context_settings=CONTEXT)
@click.option("--rank", type=click.IntRange(min=1), required=True, help="This node's rank (1..N-1).")
@click.option("--parent-host", type=HostName(), help="The parent's host name (wins over --nodes).")
@_node_options
@click.argument("loader", nargs=-1, type=click.UNPROCESSED, metavar="[-- LOADER...]")
def recv_cmd(
    rank: int, parent_host: str | None, stats_file: str | None, loader: tuple[str, ...], **options: object
) -> None:
    """A receiver: forward the stream to this node's children and hand it to LOADER's stdin (or
    write it to stdout). Every frame is checked before LOADER sees it; a stream that fails stops
    LOADER before it sees the end, so a cut stream is never loaded as if it were whole.

    \b
    Example (rank R):
      slurm-multi relay recv --rank "$SLURM_NODEID" --nodes "$NODES" -- docker load -q
    """
    if not loader and os.isatty(1):
        raise usage_error("relay: stdout is a terminal; give a loader: relay recv ... -- docker load")
    plan = _plan_from_options(rank, parent_host=parent_host, **options)  # type: ignore[arg-type]
    kids = children_of(rank, plan.fanout, plan.nnodes)
    plan.log(
        f"rank {rank} of {plan.nnodes}: from {plan.name((rank - 1) // plan.fanout)}"
        + (f", forwarding to {', '.join(plan.name(r) for r in kids)}" if kids else "")
    )
    if loader:
        result = recv_into(plan, list(loader))
    else:
        result = run_node(plan, out_fd=1, on_verified=release_stdout)
    write_stats(stats_file, result)
    plan.log(
        f"done: {size_text(result.total)} received and verified in {result.seconds:.1f} s "
        f"({rate_text(result.total, result.seconds)}, chain digest {result.digest[:16]}...)"
        + (f"; {result.nodes - 1} node(s) below verified it too" if kids else "")
    )
    if result.layers is not None:
        plan.log(f"layers: {describe_layers(result.layers)}")


@cli.command("port", context_settings=CONTEXT)
@click.option("--rank", type=click.IntRange(min=0), required=True, help="The rank whose ports to print.")
@click.option("--master-port", type=click.IntRange(1, 65535), envvar="MASTER_PORT", show_envvar=True)
@click.option("--job-id", type=click.IntRange(min=0), envvar="SLURM_JOB_ID", show_envvar=True)
@click.option("--port", type=click.IntRange(1024, 65535), envvar="SM_RELAY_PORT", show_envvar=True)
@click.option(
    "--count", type=click.IntRange(1, net.MAX_CANDIDATES), default=DEFAULT_PORT_COUNT, show_default=True
)
def port_cmd(rank: int, master_port: int | None, job_id: int | None, port: int | None, count: int) -> None:
    """Print the candidate ports RANK listens on, one per line (the same on every node).

    \b
    Example: slurm-multi relay port --rank 3 --master-port 29500 --job-id 4242
    """
    for candidate in relay_ports(rank, master_port, job_id, port, count):
        click.echo(candidate)
