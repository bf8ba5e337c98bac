"""`slurm-multi barrier port|serve|join|release|abort`: the barrier's command line, one click group.

The server and its clients are slurm_multi.barrier; this module is their command line only. Rank 0's
task runs `serve`, every worker `join` (lib/node.sh), both as `python -m slurm_multi barrier …`.

Exit codes: 0 released/OK, 1 aborted or failed, 2 usage or rejected by rank 0, 3 timeout.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from typing import Any

import click

from slurm_multi import EXIT_OK
from slurm_multi.barrier import BarrierServer, control, format_ranks, join, raise_nofile_limit
from slurm_multi.common import FiniteFloat, HelperError, HostName, talk, timeout_error, usage_error
from slurm_multi.layers.engine import planned_layers
from slurm_multi.net import MAX_CANDIDATES, candidate_ports, choose_bind_address, secs
from slurm_multi.wire import DEFAULT_TOKEN_ENV, PHASES, RELEASE_ID_MAX, read_token
from slurm_multi.words import is_image_id

CONTEXT = {"help_option_names": ["-h", "--help"]}


def _talk(message: str) -> None:
    talk("barrier", message)


class Seconds(FiniteFloat):
    """A finite number of seconds (common.FiniteFloat): every budget of the barrier ends."""

    name = "seconds"


def _derivation_options(func: Callable) -> Callable:
    options = [
        click.option("--master-port", type=click.IntRange(1, 65535), envvar="MASTER_PORT", show_envvar=True,
                     help="The job's MASTER_PORT (the derivation input; never used itself)."),
        click.option("--job-id", type=click.IntRange(min=0), envvar="SLURM_JOB_ID", show_envvar=True,
                     help="SLURM job id."),
        click.option("--override", type=click.IntRange(1024, 65535), envvar="SM_BARRIER_PORT",
                     show_envvar=True,
                     help="Use this port first, then its successors, instead of the derived ports."),
        click.option("--count", type=click.IntRange(1, MAX_CANDIDATES), default=4, show_default=True,
                     help="How many candidate ports (rank 0 takes the first free one; clients try all)."),
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


def _port_options(func: Callable) -> Callable:
    func = _derivation_options(func)
    explicit = click.option(
        "--port",
        "ports",
        type=click.IntRange(1, 65535),
        multiple=True,
        help="Explicit candidate port (repeatable); wins over the derivation.",
    )
    return explicit(func)


def _token_option(func: Callable) -> Callable:
    token_env = click.option(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        show_default=True,
        metavar="NAME",
        help="Environment variable holding the job's barrier token (never pass the token itself).",
    )
    return token_env(func)


def _controller_options(func: Callable) -> Callable:
    options = [
        click.option("--master-addr", type=HostName(), envvar="MASTER_ADDR", show_envvar=True,
                     help="Rank 0's host [default: this host]."),
        _port_options,
        click.option("--ready-file", type=click.Path(dir_okay=False),
                     help="Read the server's 'ADDR PORT' from the file `serve --ready-file` wrote."),
        click.option("--connect-timeout", type=Seconds(min=0), default=10, show_default=True,
                     help="Seconds."),
        _token_option,
    ]  # fmt: skip
    for option in reversed(options):
        func = option(func)
    return func


@click.group("barrier", context_settings=CONTEXT)
def cli() -> None:
    """TCP barrier: rank 0 serves, workers join, rank 0 releases or aborts.

    \b
    Protocol (a challenge, then one line each way, <= 256 bytes; the token never crosses the wire):
      rank 0 -> CHALLENGE <S>
      worker -> READY <mac> <C> <rank> [image|start]
      rank 0 -> GO <mac> <rank> <image-id> | ABORT <mac> <reason> | ERR <reason>
    mac: HMAC-SHA256 keyed by the token over both nonces and the fields (docs/barrier.md).
    Exit codes: 0 ok, 1 aborted/failed, 2 usage or rejected, 3 timeout.

    \b
    Example: slurm-multi barrier serve --nnodes 2 --control-stdin
    """


@cli.command("port", context_settings=CONTEXT)
@_derivation_options
def port_cmd(master_port: int | None, job_id: int | None, override: int | None, count: int) -> None:
    """Print the candidate barrier ports, one per line (the same on every node).

    \b
    Example: slurm-multi barrier port --master-port 29500 --job-id 4242
    """
    for port in candidate_ports((), master_port, job_id, override, count):
        click.echo(port)


@cli.command("serve", context_settings=CONTEXT)
@click.option("--nnodes", type=click.IntRange(min=1), required=True, help="Nodes in the job (ranks 0..N-1).")
@click.option(
    "--master-addr",
    type=HostName(),
    envvar="MASTER_ADDR",
    show_envvar=True,
    help="Name to listen on [default: this host].",
)
@_port_options
@click.option(
    "--bind",
    "bind_address",
    type=HostName(),
    metavar="ADDR",
    help="Listen on exactly this address (may be loopback).",
)
@click.option("--image-id", help="The image is already released (skips `barrier release`).")
@click.option(
    "--timeout",
    type=Seconds(min=0),
    default=600,
    show_default=True,
    help="Barrier budget (seconds): every worker must arrive within this long of the image's release.",
)
@click.option(
    "--image-timeout",
    type=Seconds(min=0),
    help="Image budget (seconds): rank 0 must release its image within this long [default: no limit].",
)
@click.option(
    "--control-stdin",
    is_flag=True,
    help="Read RELEASE <image-id> / ABORT <reason> lines from stdin (rank 0's own task); EOF before a "
    "release aborts the workers.",
)
@_token_option
@click.option(
    "--linger",
    type=Seconds(min=0),
    default=15,
    show_default=True,
    help="After an abort or timeout, answer late READYs with ABORT for this many seconds.",
)
@click.option(
    "--line-timeout",
    type=Seconds(min=0.01),
    default=10,
    show_default=True,
    help="Seconds a connection may take to send its line.",
)
@click.option("--ready-file", type=click.Path(dir_okay=False), help="Write 'ADDR PORT' here.")
@click.option(
    "--holds-file",
    type=click.Path(dir_okay=False),
    help="Append '<rank> <image-id|-> <cache|-> <layers|->' here for each worker's image READY before "
    "the release: what it already holds (join --holds-image, --layers-from), so rank 0 can skip moving it.",
)
@click.option(
    "--layers-from",
    metavar="VAR",
    help="The environment variable holding the job plan's layer chain (diff IDs): a worker's layers "
    "claim that is not a prefix of it is refused.",
)
def serve_cmd(
    nnodes: int,
    master_addr: str | None,
    ports: tuple[int, ...],
    master_port: int | None,
    job_id: int | None,
    override: int | None,
    count: int,
    bind_address: str | None,
    image_id: str | None,
    timeout: float,
    image_timeout: float | None,
    control_stdin: bool,
    token_env: str,
    linger: float,
    line_timeout: float,
    ready_file: str | None,
    holds_file: str | None,
    layers_from: str | None,
) -> None:
    """Rank 0: serve the barrier until every worker is ready and the image is released.

    Two budgets: --image-timeout runs until rank 0 releases its image, --timeout from the release
    until every worker has arrived. The error names the one that ran out.

    \b
    Example (rank 0's task, releasing on the pipe):
      exec {ctl}> >(slurm-multi barrier serve --nnodes 4 --control-stdin)
      echo "RELEASE $image_id" >&"$ctl"
    """
    import signal

    token = read_token(token_env)
    if image_id is not None and not is_image_id(image_id):
        raise usage_error(f"barrier: --image-id {image_id!r} is not an image ID or reference")
    candidates = candidate_ports(ports, master_port, job_id, override, count)
    if bind_address:
        address = bind_address
    else:
        choice = choose_bind_address(master_addr or socket.gethostname())
        address = choice.address
        if choice.why:
            _talk(choice.why)
    raise_nofile_limit()
    holds_fd = None
    if holds_file is not None:
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW
            holds_fd = os.open(holds_file, flags, 0o600)
        except OSError as exc:
            raise usage_error(f"barrier: --holds-file {holds_file}: {exc.strerror}") from None
    server = BarrierServer(
        token,
        nnodes,
        address,
        candidates,
        image_id=image_id,
        linger=linger,
        line_timeout=line_timeout,
        control_fd=0 if control_stdin else None,
        image_timeout=image_timeout,
        barrier_timeout=timeout,
        holds_fd=holds_fd,
        planned=planned_layers(os.environ, layers_from) if layers_from else (),
    )
    budgets = f"barrier timeout {secs(timeout)} s" + (
        f", image timeout {secs(image_timeout)} s" if image_timeout is not None else ""
    )
    _talk(
        f"listening on {server.address}:{server.port} (candidates {','.join(map(str, candidates))}); "
        f"waiting for ranks {format_ranks(range(1, nnodes))}, {budgets}"
    )
    handlers = {
        sig: signal.signal(sig, lambda *_: server.request_stop()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        if ready_file is not None:
            from slurm_multi.shell import write_atomic

            write_atomic(ready_file, f"{server.address} {server.port}\n")
        outcome = server.serve()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if ready_file is not None:
            try:
                os.unlink(ready_file)
            except FileNotFoundError:
                pass
    if outcome.exit_code != EXIT_OK:
        raise HelperError(outcome.message, outcome.exit_code)
    _talk(outcome.message.removeprefix("barrier: "))


@cli.command("join", context_settings=CONTEXT)
@click.option("--rank", type=int, required=True, help="This node's rank (1..nnodes-1).")
@click.option("--nnodes", type=click.IntRange(min=2), required=True, help="Nodes in the job.")
@click.option(
    "--master-addr",
    type=HostName(),
    envvar="MASTER_ADDR",
    show_envvar=True,
    required=True,
    help="Rank 0's host.",
)
@_port_options
@click.option(
    "--phase",
    type=click.Choice((*PHASES, "both")),
    default="start",
    show_default=True,
    help="both: the image phase, print the ID, then on SIGUSR1 (this node has the image) the start phase.",
)
@click.option(
    "--connect-timeout",
    type=Seconds(min=0),
    default=600,
    show_default=True,
    help="Seconds to wait for rank 0 to listen at all.",
)
@click.option(
    "--wait-timeout",
    type=Seconds(min=0),
    default=600,
    show_default=True,
    help="Seconds to wait for GO once connected (a separate budget).",
)
@click.option(
    "--holds-image",
    metavar="REF",
    help="Image phase: tell rank 0 the ID of REF on this node's docker engine (DOCKER_HOST), so that "
    "rank 0 moves no image to a node that already holds its own.",
)
@click.option(
    "--cache-holds",
    metavar="ID",
    default="",
    help="Image phase: the image ID this node sees in the shared cache's tar (lib/node.sh reads its "
    "sidecar), so that rank 0 sends the cache only to workers that see what it sees.",
)
@click.option(
    "--layers-from",
    metavar="VAR",
    help="Image phase: the environment variable holding the job plan's layer chain (diff IDs); tell "
    "rank 0 how many of those layers this node's engine holds, so that only the others move.",
)
@_token_option
def join_cmd(
    rank: int,
    nnodes: int,
    master_addr: str,
    ports: tuple[int, ...],
    master_port: int | None,
    job_id: int | None,
    override: int | None,
    count: int,
    phase: str,
    connect_timeout: float,
    wait_timeout: float,
    holds_image: str | None,
    cache_holds: str,
    layers_from: str | None,
    token_env: str,
) -> None:
    """Worker: wait for rank 0's GO and print its image ID on stdout.

    With --phase both (one process for a worker's whole barrier): the image phase, its ID printed at
    once; then, when this node holds the image (SIGUSR1 from its task), the start phase, and exit 0
    on GO. SIGTERM before that ends it (the task gave up).

    \b
    Example: image=$(slurm-multi barrier join --rank "$SLURM_NODEID" --nnodes "$SLURM_NNODES")
    """
    import signal

    if not 1 <= rank < nnodes:
        raise usage_error(
            f"barrier: --rank {rank} is not a worker rank (1..{nnodes - 1}); rank 0 runs `serve`"
        )
    if phase == "both":
        # Blocked from the start, so a SIGUSR1 that comes early waits for sigwait below.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    token = read_token(token_env)
    candidates = candidate_ports(ports, master_port, job_id, override, count)
    holds = ""
    if holds_image and phase != "start":
        from slurm_multi import dockerapi

        holds = dockerapi.image_id(os.environ, holds_image)
        _talk(f"rank {rank} holds {holds_image} {holds[7:19] or '(none)'}; telling rank 0")
    layers = _layers_claim(rank, layers_from) if layers_from and phase != "start" else ""
    waits = {"connect_timeout": connect_timeout, "wait_timeout": wait_timeout}
    image_id = join(
        master_addr,
        candidates,
        token,
        rank,
        phase="image" if phase == "both" else phase,
        holds=holds,
        cache=cache_holds if phase != "start" else "",
        layers=layers,
        **waits,
    )
    click.echo(image_id)  # (flushed: the task reads it while this process waits below)
    if phase == "both":
        signal.sigwait({signal.SIGUSR1})
        join(master_addr, candidates, token, rank, phase="start", **waits)
        _talk(f"rank {rank}: GO (start)")


def _layers_claim(rank: int, variable: str) -> str:
    """What this node's engine holds of the plan's chain, as the image READY says it ("" when the
    plan has no chain: nothing to claim)."""
    from slurm_multi.layers import engine
    from slurm_multi.layers.chain import claim_text

    planned = planned_layers(os.environ, variable)
    if not planned:
        return ""
    held = engine.held(os.environ, planned)
    if held.why:
        _talk(f"rank {rank} holds none of the plan's {len(planned)} layers it could use: {held.why}")
    else:
        _talk(f"rank {rank} holds {held.count} of the plan's {len(planned)} layers; telling rank 0")
    return claim_text(planned, held.count)


def _controller_target(
    master_addr: str | None, ports: list[int] | None, ready_file: str | None, wait: float
) -> tuple[str, list[int]]:
    """Where the controller dials: the ready file's `ADDR PORT`, else the usual host and ports."""
    if ready_file is None:
        return master_addr or socket.gethostname(), ports or []
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(ready_file, encoding="utf-8") as handle:
                address, port = handle.read().split()
            return address, [int(port)]
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise timeout_error(
                    f"barrier: {ready_file} did not appear within {secs(wait)} s; is `barrier serve` running?"
                ) from None
            time.sleep(0.1)
        except (OSError, ValueError):
            raise usage_error(f"barrier: {ready_file} does not hold 'ADDR PORT'") from None


def _control(
    verb: str,
    value: str,
    master_addr: str | None,
    ports: tuple[int, ...],
    master_port: int | None,
    job_id: int | None,
    override: int | None,
    count: int,
    ready_file: str | None,
    connect_timeout: float,
    token_env: str,
) -> str:
    """RELEASE or ABORT to the running server; the host it reached."""
    wanted = None if ready_file is not None else candidate_ports(ports, master_port, job_id, override, count)
    host, targets = _controller_target(master_addr, wanted, ready_file, connect_timeout)
    control(host, targets, read_token(token_env), verb, value, connect_timeout=connect_timeout)
    return host


@cli.command("release", context_settings=CONTEXT)
@click.option("--image-id", required=True, help="Rank 0's image ID, sent to every worker with GO.")
@_controller_options
def release_cmd(image_id: str, token_env: str, **where: Any) -> None:
    """Rank 0: tell the running `serve` that the image is ready.

    \b
    Example: slurm-multi barrier release --image-id sha256:0b1c… --ready-file /tmp/barrier.addr
    """
    read_token(token_env)  # a missing token is said before the image ID's checks
    if not is_image_id(image_id):
        raise usage_error(f"barrier: --image-id {image_id!r} is not an image ID or reference")
    if len(image_id) > RELEASE_ID_MAX:
        raise usage_error(
            f"barrier: --image-id is {len(image_id)} characters; a signed RELEASE line holds at most "
            f"{RELEASE_ID_MAX}: release it on serve's --control-stdin pipe, or start serve with --image-id"
        )
    host = _control("RELEASE", image_id, token_env=token_env, **where)
    _talk(f"released image {image_id} to the workers via {host}")


@cli.command("abort", context_settings=CONTEXT)
@click.option("--reason", required=True, help="One line telling the workers why (shown in their logs).")
@_controller_options
def abort_cmd(reason: str, token_env: str, **where: Any) -> None:
    """Rank 0: make every waiting (and, for --linger seconds, every late) worker abort.

    \b
    Example: slurm-multi barrier abort --reason "image build failed" --ready-file /tmp/barrier.addr
    """
    read_token(token_env)
    reason = " ".join(reason.split()) or "no reason given"
    if not reason.isprintable():
        raise usage_error("barrier: --reason must be printable text")
    host = _control("ABORT", reason, token_env=token_env, **where)
    _talk(f"told rank 0's barrier on {host} to abort: {reason}")
