"""The fitness stage: a fast check on every node of a job, before any image moves.

One bad node (a hung docker engine, a full disk, GPUs held by a stale job, a port nobody can reach,
a slow link, a clock far off) is the most common reason a multi-node job fails. This stage finds it
in seconds and names it with a one-line reason. Click-free, started on every node at once:

    python -m slurm_multi.fitness run --rank R --nnodes N --hosts "h0 h1 ..." --master-port M \\
        --job-id J [--runtime docker|pyxis|none] [--disk PATH=BYTES]... [--gpus-needed K] \\
        [--out FILE] [options below]
    python -m slurm_multi.fitness judge --jobdir DIR --nodes "h0 h1 ..." [--json]

`run` options (defaults):
    --rank R               this node's rank, 0 <= R < N (required)
    --nnodes N             nodes in the job, >= 1 (required)
    --hosts "h0 h1 ..."    host names by rank, space-separated, N of them (required). A test aid: an
                           entry may be `host:port` (that node listens and is dialled on that port),
                           so several "nodes" can share one host in tests.
    --port P               the job's fitness port, the same on every node (1-65535)
    --master-port M        without --port: derive it from MASTER_PORT and --job-id, as the barrier's
                           and the relay's are, at an offset of its own (PORT_OFFSET)
    --job-id J             the job ID, signed into every line (default $SLURM_JOB_ID; required when
                           N > 1): two jobs that share a port never mix
    --token-env NAME       the environment variable holding the job token (SM_BARRIER_TOKEN); the
                           token is never printed and never sent
    --timeout S            the whole stage's bound (10)
    --runtime KIND         docker | pyxis | none (docker)
    --runtime-timeout S    the runtime's bound (3)
    --disk PATH=BYTES      free bytes needed at PATH (repeatable; BYTES may be 0)
    --disk-reserve BYTES   free space kept on top of what is needed, per filesystem (1073741824 =
                           1 GiB: room for docker's temporary files and the node's logs)
    --min-inodes N         free inodes needed on each checked filesystem (10000)
    --disk-timeout S       the disk check's bound (a hung network filesystem) (3)
    --gpus-needed K        GPUs the job needs (0 = no count check) (0)
    --gpu-mem-fraction F   a GPU with more than F of its memory in use is taken (0.1)
    --gpu-timeout S        the GPU tools' bound (5)
    --probe-bytes B        bytes of the ring bandwidth probe (16777216 = 16 MiB; 0 = no probe)
    --probe-seconds S      the probe's bound (2)
    --slow-factor F        a ring link slower than F x the median link is slow (0.1)
    --clock-bound S        a clock further than S from the job's median is bad (2)
    --out FILE             where the report goes (atomically); without it, on stdout
    --docker-image REF     docker: also check docker's data root (from the engine's /info) for
                           the image: nothing needed when the node holds REF, else --image-bytes
    --image-bytes B        the image's size where known (the cache's tar) (0)

`record-cmd FILE HOST EXIT_CODE REASON` writes node_<rank>/fitness-cmd.json, how --fitness-cmd (the
user's own check, run by lib/node.sh in the image once it is there) ended on that node.

`judge --nodes "h0 h1 ..."` (the job's hosts in node order) judges one attempt of a job as the batch
step and collect do (`judge_job`): every node_*/fitness.json, placed by the node index it holds,
and a node whose prepare or --fitness-cmd failed for a reason of its own (another node passed it)
is bad with that reason. `judge --nnodes N` reads DIR/node_<r>/fitness.json for r in 0..N-1 only.
Either prints the bad nodes, one line each, `<rank>\\t<host>\\t<reason>` (nothing when all fit), or
a JSON list with --json; it takes --slow-factor and --clock-bound too (the same defaults).

Exit codes: `run` 0 = this node's view finds nothing bad; 3 = it finds a bad node (stderr: one line
per bad node, `fitness: <host> (rank R): <reason>`; the first also goes to $SM_ERROR_FILE when that
is set); 2 = usage error (one line naming the flag, the value and what is allowed); 1 = the report
could not be written. `judge` 0 whether or not a node is bad; 2 usage error.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_multi import dockerapi
from slurm_multi.fitness.protocol import DEFAULT_TIMEOUT, GIB, MAX_PROBE_BYTES, MIB
from slurm_multi.fitness.stage import AREA, Options, run_stage
from slurm_multi.fitness.verdict import (
    DEFAULT_CLOCK_BOUND,
    DEFAULT_SLOW_FACTOR,
    judge_job,
    judge_reports,
    mbps,
    read_reports,
    write_cmd_record,
)
from slurm_multi.logline import short, talk
from slurm_multi.net import derive_ports, describe, read_local_port_range
from slurm_multi.shell import write_json
from slurm_multi.words import is_count, is_host, is_job_id, is_token

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_BAD = 0, 1, 2, 3
EXIT_STOPPED = 143  # SIGTERM's, as a shell reports a process it ended
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
# The job's fitness port: derive_ports(MASTER_PORT, job id + this) (the barrier's are at + 0, the
# relay's from + 64: slurm_multi.relay).
PORT_OFFSET = 32
RUNTIMES = ("docker", "pyxis", "none")


class UsageError(Exception):
    """A bad command line; str() is the one line shown, exit 2."""


def _usage(flag: str, value: str, allowed: str) -> UsageError:
    return UsageError(f"{flag} {short(value, 80)!r} is not allowed; {allowed}")


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


def _parse_hosts(value: str, nnodes: int, port: int) -> tuple[list[str], list[int]]:
    entries = value.split()
    if len(entries) != nnodes:
        raise _usage("--hosts", value, f"give {nnodes} host names (one per rank, space-separated)")
    hosts, ports = [], []
    for entry in entries:
        host, colon, port_text = entry.rpartition(":") if ":" in entry else (entry, "", "")
        if not is_host(host):
            raise _usage("--hosts", entry, "use host names or IPv4 addresses (host:port as a test aid)")
        hosts.append(host)
        ports.append(_parse_int("--hosts", port_text, 1, 65535) if colon else port)
    return hosts, ports


def _parse_disk(value: str) -> tuple[str, int]:
    path, equals, nbytes = value.rpartition("=")
    if not equals or not path:
        raise _usage("--disk", value, "use PATH=BYTES (BYTES a non-negative integer, 0 allowed)")
    return path, _parse_int("--disk", nbytes, 0)


def _run_options() -> list[Any]:
    """`run`'s options, every value a string (parse_run checks each and words its own error)."""
    from slurm_multi.argv import MULTIPLE, Option

    defaults = {
        "--port": "", "--master-port": "", "--job-id": os.environ.get("SLURM_JOB_ID", ""),
        "--token-env": DEFAULT_TOKEN_ENV, "--timeout": str(DEFAULT_TIMEOUT), "--runtime": "docker",
        "--runtime-timeout": str(DEFAULT_RUNTIME_TIMEOUT), "--disk-reserve": str(DEFAULT_DISK_RESERVE),
        "--min-inodes": str(DEFAULT_MIN_INODES), "--disk-timeout": str(DEFAULT_DISK_TIMEOUT),
        "--gpus-needed": "0", "--gpu-mem-fraction": str(DEFAULT_GPU_MEM_FRACTION),
        "--gpu-timeout": str(DEFAULT_GPU_TIMEOUT), "--probe-bytes": str(DEFAULT_PROBE_BYTES),
        "--probe-seconds": str(DEFAULT_PROBE_SECONDS), "--slow-factor": str(DEFAULT_SLOW_FACTOR),
        "--clock-bound": str(DEFAULT_CLOCK_BOUND), "--out": "", "--docker-image": "", "--image-bytes": "0",
    }  # fmt: skip
    required = [Option(name, required=True) for name in ("--rank", "--nnodes", "--hosts")]
    return [*required, Option("--disk", MULTIPLE), *(Option(n, default=v) for n, v in defaults.items())]


def _judge_options() -> list[Any]:
    from slurm_multi.argv import FLAG, Option

    return [
        Option("--jobdir", required=True), Option("--nnodes", default=""), Option("--nodes", default=""),
        Option("--json", FLAG), Option("--slow-factor", default=str(DEFAULT_SLOW_FACTOR)),
        Option("--clock-bound", default=str(DEFAULT_CLOCK_BOUND)),
    ]  # fmt: skip


def parse_command(argv: Sequence[str]) -> Any:
    """`run ...` or `judge ...` with slurm_multi.argv (no argparse on a node's critical path: ~8 ms
    of its fitness verdict). A Given with `command`; None after --help (printed on stdout: the
    docstring, whose table is what each option does); UsageError for a bad command line."""
    from slurm_multi.argv import HELP_NAMES, Parser
    from slurm_multi.common import HelperError

    command, rest = (argv[0], list(argv[1:])) if argv else ("", [])
    if command in HELP_NAMES or (command in ("run", "judge") and any(w in HELP_NAMES for w in rest)):
        sys.stdout.write(__doc__ or "")
        return None
    if command not in ("run", "judge"):
        shown = f"{short(command, 40)!r} is not a command" if command else "no command given"
        raise UsageError(f"{shown}; use run or judge (--help says what each does)")
    prog = f"python -m slurm_multi.fitness {command}"
    parser = Parser(prog, "", "", _run_options() if command == "run" else _judge_options(), max_words=0)
    try:
        given = parser.parse(rest)
    except HelperError as exc:  # `<prog>: <what>; Usage: ...`: the stage words its own area
        raise UsageError(str(exc).removeprefix(f"{parser.area}: ")) from None
    assert given is not None  # --help was answered above
    given.command = command
    return given


def parse_run(args: Any, env: Mapping[str, str]) -> Options:
    nnodes = _parse_int("--nnodes", args.nnodes, 1)
    rank = _parse_int("--rank", args.rank, 0, nnodes - 1)
    # A single node listens on nothing: it needs no port (a stage run alone may not know MASTER_PORT).
    port = _job_port(args) if nnodes > 1 or args.port or args.master_port else 0
    hosts, ports = _parse_hosts(args.hosts, nnodes, port)
    if len(set(zip(hosts, ports))) != nnodes:
        raise _usage("--hosts", args.hosts, "give each rank its own host (or host:port)")
    job_id = args.job_id or ("-" if nnodes == 1 else "")
    if not is_job_id(job_id):
        raise _usage(
            "--job-id", job_id, "give the job ID (default $SLURM_JOB_ID): 1-64 of A-Z a-z 0-9 _ . : + -"
        )
    token = ""
    if nnodes > 1:
        token = env.get(args.token_env, "")
        if not is_token(token):
            # the value is never shown: only the variable's name
            raise UsageError(
                f"--token-env {args.token_env}: ${args.token_env} is not set or not 1-64 printable "
                "ASCII characters without spaces; export the job token (the batch step makes one)"
            )
    if args.runtime not in RUNTIMES:
        raise _usage("--runtime", args.runtime, "use docker, pyxis or none")
    fraction = _parse_float("--gpu-mem-fraction", args.gpu_mem_fraction, 0.0, 1.0)
    return Options(
        rank=rank,
        nnodes=nnodes,
        hosts=hosts,
        ports=ports,
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
        out=args.out,
        docker_image=args.docker_image,
        image_bytes=_parse_int("--image-bytes", args.image_bytes, 0),
    )


def _job_port(args: Any) -> int:
    """--port, else the job's fitness port derived from --master-port and --job-id the way the
    barrier's and the relay's are (slurm_multi.net), at an offset of its own: the same on every node,
    outside the ephemeral range, never the barrier's candidates, the relay's or MASTER_PORT."""
    if args.port:
        return _parse_int("--port", args.port, 1, 65535)
    if not args.master_port:
        raise _usage("--port", "", "give --port P, or --master-port and --job-id to derive the job's port")
    master = _parse_int("--master-port", args.master_port, 1, 65535)
    digits = "".join(c for c in (args.job_id or "0") if c.isdigit())[:12] or "0"
    try:
        return derive_ports(master, int(digits) + PORT_OFFSET, read_local_port_range(), 1)[0]
    except ValueError as exc:
        raise _usage(
            "--master-port", args.master_port, f"no port left for the fitness check ({exc})"
        ) from None


def _record_error(line: str) -> None:
    """The caller asked for our one-line reason in $SM_ERROR_FILE (as slurm_multi.common does)."""
    path = os.environ.get("SM_ERROR_FILE")
    if path:
        try:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(line + "\n")
        except OSError:
            pass


def _fail(message: str, code: int) -> int:
    line = f"slurm-multi: {AREA}: {message}"
    print(line, file=sys.stderr)
    _record_error(line)
    return code


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    argv = list(argv)
    if argv[:1] == ["record-cmd"]:
        if len(argv) != 5 or not is_count(argv[3]):
            return _fail("usage: record-cmd FILE HOST EXIT_CODE REASON", EXIT_USAGE)
        try:
            write_cmd_record(argv[1], argv[2], int(argv[3]), argv[4])
        except OSError as exc:
            return _fail(f"cannot write {argv[1]} ({describe(exc)})", EXIT_FAILURE)
        return EXIT_OK
    try:
        args = parse_command(argv)
        if args is None:
            return EXIT_OK
        if args.command == "judge":
            slow = _parse_float("--slow-factor", args.slow_factor, 0.0, 1.0, low_open=True)
            bound = _parse_float("--clock-bound", args.clock_bound, 0.0, low_open=True)
            if not os.path.isdir(args.jobdir):
                raise _usage(
                    "--jobdir", args.jobdir, "give the job directory (it holds node_<rank>/fitness.json)"
                )
            if args.nodes:
                found = judge_job(args.jobdir, args.nodes.split(), slow, bound)
            else:
                if not args.nnodes:
                    raise _usage("--nnodes", "", 'give --nodes "h0 h1 ..." (the job\'s) or --nnodes N')
                nnodes = _parse_int("--nnodes", args.nnodes, 1)
                found = judge_reports(read_reports(args.jobdir, nnodes), nnodes, slow, bound)
            if args.json:
                print(json.dumps(found))
            else:
                for entry in found:
                    print(f"{entry['rank']}\t{entry['host']}\t{entry['reason']}")
            return EXIT_OK
        opts = parse_run(args, env)
    except UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    try:
        report = run_stage(opts, env)
    except Exception as exc:  # noqa: BLE001 - one line for the node log, never a traceback
        return _fail(f"the stage broke ({type(exc).__name__}: {short(str(exc), 160)})", EXIT_FAILURE)
    if opts.out:
        try:
            write_json(opts.out, report)
        except OSError as exc:
            return _fail(f"cannot write {opts.out} ({describe(exc)}); check --out's directory", EXIT_FAILURE)
    else:
        print(json.dumps(report, indent=2))
    lines = [f"{AREA}: {b['host']} (rank {b['rank']}): {b['reason']}" for b in report["bad"]]
    for line in lines:
        print(line, file=sys.stderr)
    if report["stopped"]:
        where = f" (report in {opts.out}, marked stopped)" if opts.out else ""
        return _fail(f"stopped by {report['stopped']}{where}", EXIT_STOPPED)
    if lines:
        _record_error(lines[0])
        return EXIT_BAD
    ring = report["checks"]["network"].get("ring") or {}
    rate = f"; ring to rank {ring.get('to')}: {mbps(ring['bytes_per_s'])}" if ring.get("bytes_per_s") else ""
    talk(AREA, f"all {opts.nnodes} node(s) fit in this node's view ({report['seconds']:.2f} s{rate})")
    return EXIT_OK


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit(130)
