"""`slurm-multi barrier port|serve|join|release|abort` without click: `python -m slurm_multi.barrier_main`.

Rank 0's `serve` and every worker's `join` start beside prepare on every node of every job: click's
import alone was a tenth of a second of CPU each, on cores the job's own start-up shares. The click
group (slurm_multi.barrier_cli) passes each command through to the `*_main(argv)` here, so each
command has one parser (slurm_multi.argv) whichever way it is started, and the same one-line errors.
The server and its clients are slurm_multi.barrier; this module is their command line only.

Exit codes: 0 released/OK, 1 aborted or failed, 2 usage or rejected by rank 0, 3 timeout.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Sequence

from slurm_multi import EXIT_OK
from slurm_multi import argv as options
from slurm_multi.barrier import (
    BarrierServer,
    _talk,
    control,
    format_ranks,
    join,
    raise_nofile_limit,
)
from slurm_multi.common import HelperError, run_main, timeout_error, usage_error
from slurm_multi.net import MAX_CANDIDATES, candidate_ports, choose_bind_address, secs
from slurm_multi.wire import DEFAULT_TOKEN_ENV, PHASES, RELEASE_ID_MAX, read_token
from slurm_multi.words import is_image_id

PROTOCOL = """Protocol (a challenge, then one line each way, <= 256 bytes; the token never crosses the wire):
      rank 0 -> CHALLENGE <S>
      worker -> READY <mac> <C> <rank> [image|start]
      rank 0 -> GO <mac> <rank> <image-id> | ABORT <mac> <reason> | ERR <reason>
    mac: HMAC-SHA256 keyed by the token over both nonces and the fields (docs/barrier.md).
    Exit codes: 0 ok, 1 aborted/failed, 2 usage or rejected, 3 timeout."""

PORT = options.whole_number_in(1, 65535)
SECONDS = options.number_at_least(0)
COUNT = options.whole_number_in(1, MAX_CANDIDATES)


def _derivation() -> list[options.Option]:
    return [
        options.Option("--master-port", metavar="INTEGER", convert=PORT, envvar="MASTER_PORT",
                       help="The job's MASTER_PORT (the derivation input; never used itself)."),
        options.Option("--job-id", metavar="INTEGER", convert=options.whole_number(0), envvar="SLURM_JOB_ID",
                       help="SLURM job id."),
        options.Option("--override", metavar="INTEGER", convert=options.whole_number_in(1024, 65535),
                       envvar="SM_BARRIER_PORT",
                       help="Use this port first, then its successors, instead of the derived ports."),
        options.Option("--count", metavar="INTEGER", convert=COUNT, default=4,
                       help="How many candidate ports (rank 0 takes the first free one; clients try all) "
                       "[default: 4]."),
    ]  # fmt: skip


def _ports() -> list[options.Option]:
    return [
        options.Option("--port", options.MULTIPLE, metavar="INTEGER", convert=PORT, dest="ports",
                       help="Explicit candidate port (repeatable); wins over the derivation."),
        *_derivation(),
    ]  # fmt: skip


def _token() -> options.Option:
    return options.Option("--token-env", metavar="NAME", default=DEFAULT_TOKEN_ENV,
                          help="Environment variable holding the job's barrier token (never pass the token "
                          f"itself) [default: {DEFAULT_TOKEN_ENV}].")  # fmt: skip


def _controller() -> list[options.Option]:
    return [
        options.Option("--master-addr", envvar="MASTER_ADDR", help="Rank 0's host [default: this host]."),
        *_ports(),
        options.Option("--ready-file", metavar="FILE", convert=options.not_a_directory,
                       help="Read the server's 'ADDR PORT' from the file `serve --ready-file` wrote."),
        options.Option("--connect-timeout", metavar="FLOAT", convert=SECONDS, default=10.0,
                       help="Seconds [default: 10]."),
        _token(),
    ]  # fmt: skip


PORT_PARSER = options.Parser(
    "slurm-multi barrier port",
    "",
    """Print the candidate barrier ports, one per line (the same on every node).

    Example: slurm-multi barrier port --master-port 29500 --job-id 4242""",
    _derivation(),
)

SERVE_PARSER = options.Parser(
    "slurm-multi barrier serve",
    "",
    f"""Rank 0: serve the barrier until every worker is ready and the image is released.

    Two budgets: --image-timeout runs until rank 0 releases its image, --timeout from the release
    until every worker has arrived. The error names the one that ran out.

    {PROTOCOL}

    Example (rank 0's task, releasing on the pipe):
      exec {{ctl}}> >(slurm-multi barrier serve --nnodes 4 --control-stdin)
      echo "RELEASE $image_id" >&"$ctl\"""",
    [
        options.Option("--nnodes", metavar="INTEGER", convert=options.whole_number(1), required=True,
                       help="Nodes in the job (ranks 0..N-1)."),
        options.Option("--master-addr", envvar="MASTER_ADDR", help="Name to listen on [default: this host]."),
        *_ports(),
        options.Option("--bind", metavar="ADDR", dest="bind_address",
                       help="Listen on exactly this address (may be loopback)."),
        options.Option("--image-id", help="The image is already released (skips `barrier release`)."),
        options.Option("--timeout", metavar="FLOAT", convert=SECONDS, default=600.0,
                       help="Barrier budget (seconds): every worker must arrive within this long of the "
                       "image's release [default: 600]."),
        options.Option("--image-timeout", metavar="FLOAT", convert=SECONDS,
                       help="Image budget (seconds): rank 0 must release its image within this long "
                       "[default: no limit]."),
        options.Option("--control-stdin", options.FLAG,
                       help="Read RELEASE <image-id> / ABORT <reason> lines from stdin (rank 0's own task); "
                       "EOF before a release aborts the workers."),
        _token(),
        options.Option("--linger", metavar="FLOAT", convert=SECONDS, default=15.0,
                       help="After an abort or timeout, answer late READYs with ABORT for this many seconds "
                       "[default: 15]."),
        options.Option("--line-timeout", metavar="FLOAT", convert=options.number_at_least(0.01), default=10.0,
                       help="Seconds a connection may take to send its line [default: 10]."),
        options.Option("--ready-file", metavar="FILE", convert=options.not_a_directory,
                       help="Write 'ADDR PORT' here."),
        options.Option("--holds-file", metavar="FILE", convert=options.not_a_directory,
                       help="Append '<rank> <image-id>' (or '<rank> -') here for each worker's image READY "
                       "before the release: what it already holds (join --holds-image), so rank 0 can skip "
                       "moving the image."),
    ],
)  # fmt: skip

JOIN_PARSER = options.Parser(
    "slurm-multi barrier join",
    "",
    """Worker: wait for rank 0's GO and print its image ID on stdout.

    With --phase both (one process for a worker's whole barrier): the image phase, its ID printed at
    once; then, when this node holds the image (SIGUSR1 from its task), the start phase, and exit 0
    on GO. SIGTERM before that ends it (the task gave up).

    Example: image=$(slurm-multi barrier join --rank "$SLURM_NODEID" --nnodes "$SLURM_NNODES")""",
    [
        options.Option("--rank", metavar="INTEGER", convert=options.integer, required=True,
                       help="This node's rank (1..nnodes-1)."),
        options.Option("--nnodes", metavar="INTEGER", convert=options.whole_number(2), required=True,
                       help="Nodes in the job."),
        options.Option("--master-addr", envvar="MASTER_ADDR", required=True, help="Rank 0's host."),
        *_ports(),
        options.Option("--phase", metavar="[image|start|both]", convert=options.one_of((*PHASES, "both")),
                       default="start",
                       help="both: the image phase, print the ID, then on SIGUSR1 (this node has the image) "
                       "the start phase [default: start]."),
        options.Option("--connect-timeout", metavar="FLOAT", convert=SECONDS, default=600.0,
                       help="Seconds to wait for rank 0 to listen at all [default: 600]."),
        options.Option("--wait-timeout", metavar="FLOAT", convert=SECONDS, default=600.0,
                       help="Seconds to wait for GO once connected (a separate budget) [default: 600]."),
        options.Option("--holds-image", metavar="REF",
                       help="Image phase: tell rank 0 the ID of REF on this node's docker engine "
                       "(DOCKER_HOST), so that rank 0 moves no image to a node that already holds its own."),
        options.Option("--cache-holds", metavar="ID", default="",
                       help="Image phase: the image ID this node sees in the shared cache's tar (lib/node.sh "
                       "reads its sidecar), so that rank 0 sends the cache only to workers that see what "
                       "it sees."),
        _token(),
    ],
)  # fmt: skip

RELEASE_PARSER = options.Parser(
    "slurm-multi barrier release",
    "",
    """Rank 0: tell the running `serve` that the image is ready.

    Example: slurm-multi barrier release --image-id sha256:0b1c… --ready-file /tmp/barrier.addr""",
    [
        options.Option("--image-id", required=True, help="Rank 0's image ID, sent to every worker with GO."),
        *_controller(),
    ],
)

ABORT_PARSER = options.Parser(
    "slurm-multi barrier abort",
    "",
    """Rank 0: make every waiting (and, for --linger seconds, every late) worker abort.

    Example: slurm-multi barrier abort --reason "image build failed" --ready-file /tmp/barrier.addr""",
    [
        options.Option(
            "--reason", required=True, help="One line telling the workers why (shown in their logs)."
        ),
        *_controller(),
    ],
)


def _ports_of(given: options.Given) -> list[int]:
    return candidate_ports(tuple(given.ports), given.master_port, given.job_id, given.override, given.count)


# --------------------------------------------------------------------------------------------------
# the commands


def _port(argv: Sequence[str]) -> int:
    given = PORT_PARSER.parse(argv)
    if given is None:
        return EXIT_OK
    for port in candidate_ports((), given.master_port, given.job_id, given.override, given.count):
        print(port)
    return EXIT_OK


def _serve(argv: Sequence[str]) -> int:
    import signal

    given = SERVE_PARSER.parse(argv)
    if given is None:
        return EXIT_OK
    token = read_token(given.token_env)
    image_id = given.image_id
    if image_id is not None and not is_image_id(image_id):
        raise usage_error(f"barrier: --image-id {image_id!r} is not an image ID or reference")
    candidates = _ports_of(given)
    if given.bind_address:
        address = given.bind_address
    else:
        choice = choose_bind_address(given.master_addr or socket.gethostname())
        address = choice.address
        if choice.why:
            _talk(choice.why)
    raise_nofile_limit()
    holds_fd = None
    if given.holds_file is not None:
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW
            holds_fd = os.open(given.holds_file, flags, 0o600)
        except OSError as exc:
            raise usage_error(f"barrier: --holds-file {given.holds_file}: {exc.strerror}") from None
    server = BarrierServer(
        token,
        given.nnodes,
        address,
        candidates,
        image_id=image_id,
        linger=given.linger,
        line_timeout=given.line_timeout,
        control_fd=0 if given.control_stdin else None,
        image_timeout=given.image_timeout,
        barrier_timeout=given.timeout,
        holds_fd=holds_fd,
    )
    budgets = f"barrier timeout {secs(given.timeout)} s" + (
        f", image timeout {secs(given.image_timeout)} s" if given.image_timeout is not None else ""
    )
    _talk(
        f"listening on {server.address}:{server.port} (candidates {','.join(map(str, candidates))}); "
        f"waiting for ranks {format_ranks(range(1, given.nnodes))}, {budgets}"
    )
    handlers = {
        sig: signal.signal(sig, lambda *_: server.request_stop()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    ready_file = given.ready_file
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
    return EXIT_OK


def _join(argv: Sequence[str]) -> int:
    import signal

    given = JOIN_PARSER.parse(argv)
    if given is None:
        return EXIT_OK
    rank, nnodes, phase = given.rank, given.nnodes, given.phase
    if not 1 <= rank < nnodes:
        raise usage_error(
            f"barrier: --rank {rank} is not a worker rank (1..{nnodes - 1}); rank 0 runs `serve`"
        )
    if phase == "both":
        # Blocked from the start, so a SIGUSR1 that comes early waits for sigwait below.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    token = read_token(given.token_env)
    candidates = _ports_of(given)
    holds = ""
    if given.holds_image and phase != "start":
        from slurm_multi import dockerapi

        holds = dockerapi.image_id(os.environ, given.holds_image)
        _talk(f"rank {rank} holds {given.holds_image} {holds[7:19] or '(none)'}; telling rank 0")
    waits = {"connect_timeout": given.connect_timeout, "wait_timeout": given.wait_timeout}
    image_id = join(
        given.master_addr,
        candidates,
        token,
        rank,
        phase="image" if phase == "both" else phase,
        holds=holds,
        cache=given.cache_holds if phase != "start" else "",
        **waits,
    )
    sys.stdout.write(image_id + "\n")
    sys.stdout.flush()
    if phase == "both":
        signal.sigwait({signal.SIGUSR1})
        join(given.master_addr, candidates, token, rank, phase="start", **waits)
        _talk(f"rank {rank}: GO (start)")
    return EXIT_OK


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


def _control(given: options.Given, verb: str, value: str) -> str:
    """RELEASE or ABORT to the running server; the host it reached."""
    wanted = None if given.ready_file is not None else _ports_of(given)
    host, targets = _controller_target(given.master_addr, wanted, given.ready_file, given.connect_timeout)
    control(host, targets, read_token(given.token_env), verb, value, connect_timeout=given.connect_timeout)
    return host


def _release(argv: Sequence[str]) -> int:
    given = RELEASE_PARSER.parse(argv)
    if given is None:
        return EXIT_OK
    read_token(given.token_env)  # a missing token is said before the image ID's checks
    image_id = given.image_id
    if not is_image_id(image_id):
        raise usage_error(f"barrier: --image-id {image_id!r} is not an image ID or reference")
    if len(image_id) > RELEASE_ID_MAX:
        raise usage_error(
            f"barrier: --image-id is {len(image_id)} characters; a signed RELEASE line holds at most "
            f"{RELEASE_ID_MAX}: release it on serve's --control-stdin pipe, or start serve with --image-id"
        )
    host = _control(given, "RELEASE", image_id)
    _talk(f"released image {image_id} to the workers via {host}")
    return EXIT_OK


def _abort(argv: Sequence[str]) -> int:
    given = ABORT_PARSER.parse(argv)
    if given is None:
        return EXIT_OK
    read_token(given.token_env)
    reason = " ".join(given.reason.split()) or "no reason given"
    if not reason.isprintable():
        raise usage_error("barrier: --reason must be printable text")
    host = _control(given, "ABORT", reason)
    _talk(f"told rank 0's barrier on {host} to abort: {reason}")
    return EXIT_OK


def port_main(argv: Sequence[str]) -> int:
    return run_main(_port, argv)


def serve_main(argv: Sequence[str]) -> int:
    return run_main(_serve, argv)


def join_main(argv: Sequence[str]) -> int:
    return run_main(_join, argv)


def release_main(argv: Sequence[str]) -> int:
    return run_main(_release, argv)


def abort_main(argv: Sequence[str]) -> int:
    return run_main(_abort, argv)


COMMANDS = {
    "port": (port_main, "Print the candidate barrier ports, one per line."),
    "serve": (serve_main, "Rank 0: serve until every worker is ready and the image released."),
    "join": (join_main, "Worker: wait for rank 0's GO and print its image ID on stdout."),
    "release": (release_main, "Rank 0: tell the running `serve` that the image is ready."),
    "abort": (abort_main, "Rank 0: make every waiting (and late) worker abort."),
}


def main(argv: Sequence[str]) -> int:
    """`python -m slurm_multi.barrier_main COMMAND ARGS…` (= `slurm-multi barrier COMMAND ARGS…`)."""
    if not argv or argv[0] not in COMMANDS:
        got = f"'{argv[0]}'" if argv else "none"
        usage_error(
            f"barrier: no such command {got}; use one of {', '.join(COMMANDS)} "
            "(slurm-multi barrier --help lists them)"
        ).show()
        return 2
    return COMMANDS[argv[0]][0](argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
