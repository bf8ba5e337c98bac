"""`slurm-multi fitness run|judge|record-cmd`: the fitness stage's command line.

`run` is started on every node at once (lib/node.sh), before any image moves:

    slurm-multi fitness run --rank R --nnodes N --hosts "h0 h1 ..." --master-port M --job-id J \\
        [--runtime docker|pyxis|none] [--disk PATH=BYTES]... [--gpus-needed K] [--out FILE] ...

`record-cmd FILE HOST EXIT_CODE REASON` writes node_<rank>/fitness-cmd.json, how --fitness-cmd (the
user's own check, run by lib/node.sh in the image once it is there) ended on that node. `judge`
judges one attempt of a job as the batch step and collect do (lib/job.sh). `--help` of each
command says what every option does and its default.

Every option of `run` is taken as a string and checked here (`parse_run`), so that a bad value is
one line naming the flag, the value and what is allowed: `slurm-multi: fitness: --port 'http' is
not allowed; use an integer 1-65535`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import click

from slurm_multi import EXIT_FAILURE, dockerapi
from slurm_multi.common import HelperError, record_error, usage_error
from slurm_multi.fitness.protocol import DEFAULT_TIMEOUT, GIB, MAX_PROBE_BYTES, MAX_REASON, MIB
from slurm_multi.fitness.stage import AREA, Options, run_stage
from slurm_multi.fitness.verdict import (
    DEFAULT_CLOCK_BOUND,
    DEFAULT_SLOW_FACTOR,
    EXIT_STOPPED,
    judge_job,
    judge_reports,
    mbps,
    read_reports,
    write_cmd_record,
)
from slurm_multi.logline import short, talk
from slurm_multi.net import derive_ports, describe, override_ports, read_local_port_range
from slurm_multi.secret_rule import reason_line, shown_name
from slurm_multi.shell import write_json
from slurm_multi.words import is_host, is_job_id, is_token

EXIT_BAD = 3  # this node's view finds a bad node
DEFAULT_RUNTIME_TIMEOUT = dockerapi.PING_TIMEOUT  # docker's; enroot's too
DEFAULT_DISK_RESERVE = GIB
DEFAULT_MIN_INODES = 10000
DEFAULT_DISK_TIMEOUT = 3.0
DEFAULT_GPU_MEM_FRACTION = 0.1
DEFAULT_GPU_TIMEOUT = 5.0
# 16 MiB and a tenth of the median: a healthy link on a busy node (2 shared cores, every node's
# helpers starting at once) measured up to ~5x below the median with 4 MiB; a link that is really
# bad (a 1 Gb/s NIC among 100 Gb/s ones, a link shaped or erroring) is 10x or more.
DEFAULT_PROBE_BYTES = 16 * MIB
DEFAULT_PROBE_SECONDS = 2.0
DEFAULT_TOKEN_ENV = "SM_BARRIER_TOKEN"
# The job's fitness ports: derive_ports(MASTER_PORT, job id + this, CANDIDATES) (the barrier's are at
# + 0, the relay's from + 64: slurm_multi.relay). Anyone can work them out, so a node listens on the
# first one free and a dialer tries them in turn: a port another process holds costs a dial, never
# the node (slurm_multi.fitness.mesh).
PORT_OFFSET = 32
CANDIDATES = 4
RUNTIMES = ("docker", "pyxis", "none")
CONTEXT = {"help_option_names": ["-h", "--help"]}
SLOW_HELP = (
    "A node whose ring links in and out are both slower than F x the median of the links that do not "
    "touch it is slow; any other link slower than F x the median link names both its ends."
)
MIN_RATE_HELP = (
    "A floor for sites that know their fabric (MB/s, 10^6 bytes; 0 = none): a ring link slower than "
    "this is slow whatever the others measured (the job's --fitness-min-rate)."
)


@click.group("fitness", context_settings=CONTEXT, no_args_is_help=False)
def cli() -> None:
    """The fitness stage: every node checks itself and the network between the nodes, in seconds.

    \b
    Exit codes: run 0 = this node's view finds nothing bad; 3 = it finds a bad node (stderr: one
    line per bad node, `fitness: <host> (rank R): <reason>`; the first also goes to $SM_ERROR_FILE
    when that is set); 143 = stopped by SIGTERM before its verdict (the report is still written);
    2 = usage error (one line naming the flag, the value and what is allowed); 1 = the report could
    not be written. judge and record-cmd: 0, 2 usage error, 1 a file that cannot be written.
    """


def _text(name: str, default: str, metavar: str, text: str, **more: Any) -> Any:
    """An option taken as text (parse_run words a bad value), its default shown."""
    return click.option(name, default=default, show_default=bool(default), metavar=metavar, help=text, **more)


@cli.command("run", context_settings=CONTEXT)
@click.option("--rank", required=True, metavar="R", help="This node's rank, 0 <= R < N.")
@click.option("--nnodes", required=True, metavar="N", help="Nodes in the job, >= 1.")
@click.option(
    "--hosts",
    required=True,
    metavar='"h0 h1 ..."',
    help="Host names by rank, space-separated, N of them. A test aid: an entry may be host:P[,P...] "
    '(that node\'s own candidate ports), so several "nodes" can share one host in tests.',
)
@_text(
    "--port",
    "",
    "P",
    f"The job's first fitness port, the same on every node (1-65535); P and the {CANDIDATES - 1} after it "
    "are the candidates.",
)
@_text(
    "--master-port",
    "",
    "M",
    f"Without --port: derive {CANDIDATES} candidate ports from MASTER_PORT and --job-id, as the "
    f"barrier's and the relay's are, at an offset of their own ({PORT_OFFSET}).",
)
@_text(
    "--job-id",
    "",
    "J",
    "The job ID, signed into every line (required when N > 1): two jobs that share a port never mix.",
    envvar="SLURM_JOB_ID",
    show_envvar=True,
)
@_text(
    "--token-env",
    DEFAULT_TOKEN_ENV,
    "NAME",
    "The environment variable holding the job token; the token is never printed and never sent.",
)
@_text("--timeout", str(DEFAULT_TIMEOUT), "S", "The whole stage's bound.")
@_text("--runtime", "docker", "KIND", "docker | pyxis | none.")
@_text("--runtime-timeout", str(DEFAULT_RUNTIME_TIMEOUT), "S", "The runtime's bound.")
@click.option(
    "--disk",
    multiple=True,
    metavar="PATH=BYTES",
    help="Free bytes needed at PATH (repeatable; BYTES may be 0).",
)
@_text(
    "--disk-reserve",
    str(DEFAULT_DISK_RESERVE),
    "BYTES",
    "Free space kept on top of what is needed, per filesystem (1 GiB: room for docker's temporary "
    "files and the node's logs).",
)
@_text("--min-inodes", str(DEFAULT_MIN_INODES), "N", "Free inodes needed on each checked filesystem.")
@_text(
    "--disk-timeout", str(DEFAULT_DISK_TIMEOUT), "S", "The disk check's bound (a hung network filesystem)."
)
@_text("--gpus-needed", "0", "K", "GPUs the job needs (0 = no count check).")
@_text(
    "--gpu-mem-fraction",
    str(DEFAULT_GPU_MEM_FRACTION),
    "F",
    "A GPU with more than F of its memory in use is taken.",
)
@_text("--gpu-timeout", str(DEFAULT_GPU_TIMEOUT), "S", "The GPU tools' bound.")
@_text(
    "--probe-bytes",
    str(DEFAULT_PROBE_BYTES),
    "B",
    "Bytes of the ring bandwidth probe (16 MiB; 0 = no probe).",
)
@_text("--probe-seconds", str(DEFAULT_PROBE_SECONDS), "S", "The probe's bound.")
@_text("--slow-factor", str(DEFAULT_SLOW_FACTOR), "F", SLOW_HELP)
@_text("--min-rate", "0", "MB/S", MIN_RATE_HELP)
@_text("--clock-bound", str(DEFAULT_CLOCK_BOUND), "S", "A clock further than S from the job's median is bad.")
@_text("--out", "", "FILE", "Where the report goes (atomically); without it, on stdout.")
@_text(
    "--docker-image",
    "",
    "REF",
    "docker: also check docker's data root (from the engine's /info) for the image: nothing needed "
    "when the node holds REF, else --image-bytes.",
)
@_text("--image-bytes", "0", "B", "The image's size where known (the cache's tar).")
@click.pass_context
def run_cmd(ctx: click.Context, **options: Any) -> None:
    """This node's local checks (runtime, disk, GPUs) and the mesh with its partners (reach,
    ring bandwidth, clocks), within --timeout; the report goes to --out.

    \b
    Example (rank 1 of 2):
      slurm-multi fitness run --rank 1 --nnodes 2 --hosts "node1 node2" --master-port 29500 \\
          --job-id "$SLURM_JOB_ID" --out node_1/fitness.json
    """
    opts = parse_run(SimpleNamespace(**options), os.environ)
    try:
        report = run_stage(opts, os.environ)
    except Exception as exc:  # noqa: BLE001 - one line for the node log, never a traceback
        raise HelperError(
            f"{AREA}: the stage broke ({type(exc).__name__}: {short(str(exc), 160)})", EXIT_FAILURE
        ) from None
    if opts.out:
        try:
            write_json(opts.out, report)
        except OSError as exc:
            raise HelperError(
                f"{AREA}: cannot write {opts.out} ({describe(exc)}); check --out's directory", EXIT_FAILURE
            ) from None
    else:
        click.echo(json.dumps(report, indent=2))
    lines = [f"{AREA}: {b['host']} (rank {b['rank']}): {b['reason']}" for b in report["bad"]]
    for line in lines:
        print(line, file=sys.stderr)
    if report["stopped"]:
        where = f" (report in {opts.out}, marked stopped)" if opts.out else ""
        raise HelperError(f"{AREA}: stopped by {report['stopped']}{where}", EXIT_STOPPED)
    if lines:
        record_error(lines[0])
        ctx.exit(EXIT_BAD)
    ring = report["checks"]["network"].get("ring") or {}
    rate = f"; ring to rank {ring.get('to')}: {mbps(ring['bytes_per_s'])}" if ring.get("bytes_per_s") else ""
    if rate and ring.get("cpu_bound"):
        rate += f" or more (waited for a CPU {ring['cpu_wait']:.0%} of the probe: not judged)"
    talk(AREA, f"all {opts.nnodes} node(s) fit in this node's view ({report['seconds']:.2f} s{rate})")


@cli.command("judge", context_settings=CONTEXT)
@click.option("--jobdir", required=True, metavar="DIR", help="The job directory (node_<rank>/fitness.json).")
@_text(
    "--nodes",
    "",
    '"h0 h1 ..."',
    "The job's hosts in node order: judge one attempt as the batch step and collect do: every "
    "node_*/fitness.json, placed by the node index it holds, and a node whose prepare or --fitness-cmd "
    "failed for a reason of its own (another node passed it) is bad with that reason.",
)
@_text(
    "--nnodes",
    "",
    "N",
    "Without --nodes: read DIR/node_<r>/fitness.json for r in 0..N-1 only; the nodes are named from "
    "DIR/job.json's, else each by its own report (rank<r> when it wrote none).",
)
@click.option("--json", "as_json", is_flag=True, help="A JSON list instead of lines.")
@_text("--slow-factor", str(DEFAULT_SLOW_FACTOR), "F", SLOW_HELP)
@_text("--min-rate", "0", "MB/S", MIN_RATE_HELP)
@_text("--clock-bound", str(DEFAULT_CLOCK_BOUND), "S", "A clock further than S from the job's median is bad.")
def judge_cmd(
    jobdir: str, nodes: str, nnodes: str, as_json: bool, slow_factor: str, min_rate: str, clock_bound: str
) -> None:
    """Print the bad nodes, one line each, `<rank> TAB <host> TAB <reason> TAB <evidence>` (nothing when
    all fit). Evidence: `local` (the node's own check failed), `peers` (a majority of its peers'
    reports), `none` (what somebody else could have caused: the job fails or requeues without the
    node, and only the other two go into the quarantine; docs/bad-nodes.md).

    \b
    Example: slurm-multi fitness judge --jobdir "$SM_JOBDIR" --nodes "node1 node2"
    """
    slow = _parse_float("--slow-factor", slow_factor, 0.0, 1.0, low_open=True)
    bound = _parse_float("--clock-bound", clock_bound, 0.0, low_open=True)
    floor = _parse_float("--min-rate", min_rate, 0.0) * 1e6
    if not os.path.isdir(jobdir):
        raise _usage("--jobdir", jobdir, "give the job directory (it holds node_<rank>/fitness.json)")
    if nodes:
        found = judge_job(jobdir, nodes.split(), slow, bound, floor)
    else:
        if not nnodes:
            raise _usage("--nnodes", "", 'give --nodes "h0 h1 ..." (the job\'s) or --nnodes N')
        count = _parse_int("--nnodes", nnodes, 1)
        hosts = job_hosts(jobdir, count)
        found = judge_reports(read_reports(jobdir, count), count, slow, bound, hosts=hosts, min_rate=floor)
    if as_json:
        click.echo(json.dumps(found))
    else:
        for entry in found:
            click.echo(f"{entry['rank']}\t{entry['host']}\t{entry['reason']}\t{entry['evidence']}")


@cli.command("record-cmd", context_settings=CONTEXT)
@click.argument("file")
@click.argument("host")
@click.argument("exit_code", type=click.IntRange(min=0))
@click.argument("reason")
def record_cmd(file: str, host: str, exit_code: int, reason: str) -> None:
    """Write FILE (node_<rank>/fitness-cmd.json): how --fitness-cmd ended on HOST (REASON: why it
    failed, or empty), and print the reason as it was stored: the log filter's secrets masked, on
    one line, control characters escaped, cut to fit. The batch step's judge reads it.

    \b
    Example: slurm-multi fitness record-cmd node_2/fitness-cmd.json node3 1 "exited 1: no IB link"
    """
    stored = reason_line(reason, MAX_REASON) if reason else ""
    try:
        write_cmd_record(file, host, exit_code, stored)
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot write {file} ({describe(exc)})", EXIT_FAILURE) from None
    if stored:
        click.echo(stored)


def job_hosts(jobdir: str, nnodes: int) -> list[str] | None:
    """The job's own host names (DIR/job.json's `nodes`, written by the plan), when it has N of them."""
    try:
        with open(os.path.join(jobdir, "job.json"), encoding="utf-8") as handle:
            nodes = json.loads(handle.read(1 << 22)).get("nodes")
    except (OSError, ValueError, RecursionError, AttributeError):
        return None
    if (
        isinstance(nodes, list)
        and len(nodes) == nnodes
        and all(isinstance(n, str) and is_host(n) for n in nodes)
    ):
        return nodes
    return None


# --------------------------------------------------------------------------------------------------
# Checking `run`'s options


def _usage(flag: str, value: str, allowed: str) -> HelperError:
    return usage_error(f"{AREA}: {flag} {short(value, 80)!r} is not allowed; {allowed}")


def _parse_int(flag: str, value: str, low: int, high: int | None = None) -> int:
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or int(text) < low or (high is not None and int(text) > high):
        span = f"{low}-{high}" if high is not None else f"{low} or more"
        raise _usage(flag, value, f"use an integer {span}")
    return int(text)


def _parse_float(
    flag: str, value: str, low: float, high: float | None = None, low_open: bool = False
) -> float:
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    ok = number == number and number not in (float("inf"), float("-inf"))
    ok = ok and (number > low if low_open else number >= low) and (high is None or number <= high)
    if not ok:
        bottom = f"more than {low:g}" if low_open else f"at least {low:g}"
        raise _usage(
            flag, value, f"use a number {bottom}" + (f" and at most {high:g}" if high is not None else "")
        )
    return number


def _parse_hosts(value: str, nnodes: int, ports: list[int]) -> tuple[list[str], list[list[int]]]:
    entries = value.split()
    if len(entries) != nnodes:
        raise _usage("--hosts", value, f"give {nnodes} host names (one per rank, space-separated)")
    hosts, each = [], []
    for entry in entries:
        host, colon, ports_given = entry.rpartition(":") if ":" in entry else (entry, "", "")
        if not is_host(host):
            raise _usage("--hosts", entry, "use host names or IPv4 addresses (host:P[,P...] as a test aid)")
        hosts.append(host)
        own = [_parse_int("--hosts", text, 1, 65535) for text in ports_given.split(",")] if colon else ports
        each.append(list(dict.fromkeys(own)))
    return hosts, each


def _parse_disk(value: str) -> tuple[str, int]:
    path, equals, nbytes = value.rpartition("=")
    if not equals or not path:
        raise _usage("--disk", value, "use PATH=BYTES (BYTES a non-negative integer, 0 allowed)")
    return path, _parse_int("--disk", nbytes, 0)


def parse_run(args: Any, env: Mapping[str, str]) -> Options:
    """`run`'s options (`args`: as click gives them, every value a string) checked one by one, each
    with its own one-line usage error."""
    nnodes = _parse_int("--nnodes", args.nnodes, 1)
    rank = _parse_int("--rank", args.rank, 0, nnodes - 1)
    # A single node listens on nothing: it needs no port (a stage run alone may not know MASTER_PORT).
    ports = (
        job_ports(args.port, args.master_port, args.job_id)
        if nnodes > 1 or args.port or args.master_port
        else []
    )
    hosts, each = _parse_hosts(args.hosts, nnodes, ports)
    if len({(host, tuple(own)) for host, own in zip(hosts, each)}) != nnodes:
        raise _usage("--hosts", args.hosts, "give each rank its own host (or host:port)")
    job_id = args.job_id or ("-" if nnodes == 1 else "")
    if not is_job_id(job_id):
        raise _usage(
            "--job-id", job_id, "give the job ID (default $SLURM_JOB_ID): 1-64 of A-Z a-z 0-9 _ . : + -"
        )
    token = ""
    if nnodes > 1:
        if shown_name(args.token_env, env) is None:  # the token itself where its name goes: never said back
            raise usage_error(
                f"{AREA}: --token-env is not an environment variable name; pass the NAME of the variable "
                "that holds the job token, not the token"
            )
        token = env.get(args.token_env, "")
        if not is_token(token):
            # the value is never shown: only the variable's name
            raise usage_error(
                f"{AREA}: --token-env {args.token_env}: ${args.token_env} is not set or not 1-64 printable "
                "ASCII characters without spaces; export the job token (the batch step makes one)"
            )
    if args.runtime not in RUNTIMES:
        raise _usage("--runtime", args.runtime, "use docker, pyxis or none")
    fraction = _parse_float("--gpu-mem-fraction", args.gpu_mem_fraction, 0.0, 1.0)
    return Options(
        rank=rank,
        nnodes=nnodes,
        hosts=hosts,
        ports=each,
        job_id=job_id,
        token=token,
        timeout=_parse_float("--timeout", args.timeout, 0.0, low_open=True),
        runtime=args.runtime,
        runtime_timeout=_parse_float("--runtime-timeout", args.runtime_timeout, 0.0, low_open=True),
        disks=[_parse_disk(value) for value in args.disk],
        disk_reserve=_parse_int("--disk-reserve", args.disk_reserve, 0),
        min_inodes=_parse_int("--min-inodes", args.min_inodes, 0),
        disk_timeout=_parse_float("--disk-timeout", args.disk_timeout, 0.0, low_open=True),
        gpus_needed=_parse_int("--gpus-needed", args.gpus_needed, 0),
        gpu_mem_fraction=fraction,
        gpu_timeout=_parse_float("--gpu-timeout", args.gpu_timeout, 0.0, low_open=True),
        probe_bytes=_parse_int("--probe-bytes", args.probe_bytes, 0, MAX_PROBE_BYTES),
        probe_seconds=_parse_float("--probe-seconds", args.probe_seconds, 0.0, low_open=True),
        slow_factor=_parse_float("--slow-factor", args.slow_factor, 0.0, 1.0, low_open=True),
        clock_bound=_parse_float("--clock-bound", args.clock_bound, 0.0, low_open=True),
        min_rate=_parse_float("--min-rate", args.min_rate, 0.0) * 1e6,
        out=args.out,
        docker_image=args.docker_image,
        image_bytes=_parse_int("--image-bytes", args.image_bytes, 0),
    )


def job_ports(port: str, master_port: str, job_id: str) -> list[int]:
    """The job's fitness candidate ports: --port and its successors, else derived from --master-port
    and --job-id the way the barrier's and the relay's are (slurm_multi.net), at an offset of their
    own: the same on every node, outside the ephemeral range, never the barrier's candidates, the
    relay's or MASTER_PORT."""
    if port:
        return override_ports(_parse_int("--port", port, 1, 65535), CANDIDATES)
    if not master_port:
        raise _usage("--port", "", "give --port P, or --master-port and --job-id to derive the job's port")
    master = _parse_int("--master-port", master_port, 1, 65535)
    digits = "".join(c for c in (job_id or "0") if c.isdigit())[:12] or "0"
    try:
        return derive_ports(master, int(digits) + PORT_OFFSET, read_local_port_range(), CANDIDATES)
    except ValueError as exc:
        raise _usage("--master-port", master_port, f"no port left for the fitness check ({exc})") from None
