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

What each local check measures (they run at once, in threads, each within its own bound):
- runtime: docker: GET /_ping on the engine's unix socket (DOCKER_HOST or /var/run/docker.sock;
  a tcp:// DOCKER_HOST is `skipped`) answers 200 within --runtime-timeout; an engine that accepts
  and never answers fails at the bound. pyxis: `enroot version` exits 0 within the bound. none:
  `skipped`.
- disk: statvfs of PATH (or, when PATH does not exist yet, its nearest existing parent): free bytes
  (f_bavail * f_frsize) >= the BYTES of every PATH on that filesystem + --disk-reserve, and free
  inodes (f_favail) >= --min-inodes; a filesystem reporting 0 inodes in all (some network
  filesystems) passes the inode check.
- GPUs: amd-smi if on PATH, else nvidia-smi (as slurm_multi.gpus detects). NVIDIA:
  `--query-gpu=index,uuid,memory.used,memory.total` and
  `--query-compute-apps=gpu_uuid,pid,used_memory`, both `--format=csv,noheader,nounits`; AMD:
  `amd-smi metric --mem-usage --json` and `amd-smi process --json`. The count >= --gpus-needed; no
  compute process on any GPU (the job has started nothing yet: any process is another job's), and
  no GPU with more than --gpu-mem-fraction of its memory in use. Each offender is listed (GPU, pid,
  MiB). No tool at all: `skipped` when K == 0, a failure when K > 0; a tool that fails or hangs is
  a failure.

The network ("mesh"): every node listens on its port on all IPv4 addresses (SO_REUSEADDR; a port
already taken is a local failure naming it), dials every other node's port (every IPv4 address of
its name in turn), retrying until the deadline. Lines are UTF-8, `\\n`-terminated, at most 1024
bytes; MACs are slurm_multi.auth's (HMAC-SHA256 keyed by the job token over `|`-joined fields),
their first field the direction, so nothing signed one way passes the other way:

    listener -> FITNESS <S>                                  on accept; S = auth.new_nonce()
    dialer   -> JOIN <mac> <C> <rank> <to-rank> mesh|probe <bytes>
                mac = mac(token, "fitness-to-listener", "JOIN", S, C, job, rank, to-rank, purpose, bytes)
    listener -> WELCOME <mac> <rank> <purpose>    mac = mac(token, "fitness-from-listener", "WELCOME",
                                                  S, C, job, rank, purpose)
             |  ERR <reason>                      (unsigned: `bad token`, `wrong rank`, ...; dropped)
    mesh:  dialer -> HELLO <mac> <rank> <host> <time> <ring-to> <ring-bytes/s> <verdict...>
                     mac = mac(token, "fitness-to-listener", "HELLO", S, C, job, rank, host, time,
                     ring-to, ring-bytes/s, verdict)      (`-` for an unknown ring figure)
           listener -> GOT <mac> <rank>
                     mac = mac(token, "fitness-from-listener", "GOT", S, C, job, rank)
    probe: dialer -> <bytes> raw bytes;  listener -> ACK <mac> <n> (at least every 256 KiB or 0.1 s,
                     and at the end) mac = mac(token, "fitness-from-listener", "ACK", S, C, job, n)

A connection whose JOIN does not verify (another job, a wrong token, a replay: S is fresh every
time) gets `ERR bad token` and is dropped; it counts for nothing. The ring probe: rank r sends
--probe-bytes to rank (r+1) % N on a connection of its own and measures the rate until the
receiver acknowledges them all (bytes / seconds from the first byte sent to the last ACK). At
--probe-seconds (or when the HELLOs are due) the probe stops, resets its connection, and the rate
is the bytes acknowledged / the seconds until the last acknowledgement (0 when none came): a slow
link never makes the stage time out. A node sends its HELLO (rank, host, time.time() at send, its
local verdict: `ok` or the one-line reason, its ring link's rate) once its local checks and its
probe are done, at the latest when 2 s (a quarter of --timeout if less) are left, so a late probe
or check still leaves time to deliver. The receiver
records the clock offset (the sender's time - its own at receipt). A node is done once it has
delivered its HELLO to every peer (GOT) and received every peer's HELLO, or at the deadline; it
keeps listening until every peer has delivered to it. After ~2 s of waiting it logs once which
peers it has not heard from.

Verdict rules (`judge`: one node's view, from its own report; `judge_reports`: the batch step's,
over every node's report, None for a node that wrote none). A node named twice gets its reasons
joined with `; `. Host names are shown as given (host:port when several ranks share one host).
- local checks: a node whose own check failed is bad, with that check's reason (both judges; a
  node's view also names a peer whose HELLO carries a failed verdict).
- no report (judge_reports): "no fitness report (the stage did not finish on that node)", plus the
  verdict of its HELLO if a peer heard one that was not ok.
- stopped (SIGTERM before the verdict: scancel, a time limit, or its task ending because a peer
  failed first): the report is written with "stopped" set and "ok" null. It is no verdict and no
  evidence: it never votes on reachability, rates or clocks, and its node is never named for the
  missing verdict (a scancelled healthy job must not quarantine its nodes). Only facts it holds
  count: a local check that finished and failed, a failed verdict a peer heard in its HELLO.
- reachability, node view: with N >= 3, no peer's HELLO heard while some peer took ours: this node
  is "unreachable on port P from every peer"; nothing reached and nothing heard: this node, "...
  and reached none" (or, when every peer answered `bad token`, "every peer rejects this node's job
  token"); nothing reached but something heard: this node "reached no peer". Otherwise each peer
  not heard by the deadline is named (wrong job token / accepted our connection but sent no HELLO
  / no answer on its port: did its stage start?) and each peer heard but not reached ("does not
  accept connections on port P from <me>"). A node that could not listen names only peers it
  could not reach.
- reachability, global: x is unreachable from y when y did not reach x and x did not hear y. A node
  unreachable from a strict majority of the other nodes that wrote a report is bad ("unreachable on
  port P from every peer" / "from k of m peers (...)"; "wrong job token" when every failing peer's
  connection failed on the token). With N == 2 and neither reaching the other, both are named: "A
  and B cannot reach each other on port P" (or "do not share the job token"): which one is at fault
  cannot be told; with one direction failing, the node that could not be reached is named. A node
  without a report is named for that alone.
- slow link: ring rates r -> r+1 (each node's own, else from a peer's HELLO); with at least 3
  measured links (N >= 3), a link slower than --slow-factor x the median of the measured ones is
  slow. A node whose links in and out are both slow is bad ("both ring links slow: ..."); any other
  slow link names both ends: "link A->B: X MB/s, median Y MB/s" (MB = 10^6 bytes). With fewer
  links the rates are reported and nothing is judged slow.
- clock: offsets relative to the judging node (itself 0). With 3 or more clocks known, a node
  further than --clock-bound from their median is bad ("clock 5.2 s ahead of the job's median" /
  "behind"); the global judge takes, for each node, the median over the reports of its distance
  from that report's median. With only 2 clocks known (N == 2), a difference beyond the bound names
  both: "clocks of A and B differ by X s (...)".

The report (--out, written atomically: a temp file in the same dir, then a rename; keys stable):
    {"version": 1, "rank", "host", "nnodes", "job_id", "hosts": [...], "ports": [...],
     "started_at": epoch s, "seconds": the stage's wall time, "timeout",
     "ok": this node's view found nothing bad (null when stopped, unless a local check failed),
     "reason": this node's own reason in that view or "",
     "stopped": "" or why the stage ended before its verdict (see the rules; a check that had not
                finished by then is null under "checks"),
     "local": {"ok", "reason"}  (the verdict its HELLO carried),
     "thresholds": {"slow_factor", "clock_bound"},
     "checks": {
       "runtime": {"kind", "status": ok|failed|skipped, "ok", "reason", "detail", "seconds"},
       "disk": [{"path", "checked", "need_bytes", "reserve_bytes", "free_bytes", "free_inodes",
                 "total_inodes", "min_inodes", "ok", "reason"}],
       "gpus": {"status", "ok", "reason", "tool", "needed", "count", "mem_fraction",
                "gpus": [{"index", "uuid", "used_mib", "total_mib"}],
                "processes": [{"gpu", "pid", "mib"}],
                "offenders": [{"gpu", "pid", "mib", "total_mib", "why": process|memory}], "seconds"},
       "network": {"port", "listening", "listen_error", "reached": [ranks], "heard": [ranks],
                   "errors": {rank: last dial error}, "token_rejected_by": [ranks that answered
                   ERR bad token], "rejected": [{"from", "rank", "reason"}],
                   "ring": {"to", "bytes", "seconds", "bytes_per_s", "complete", "error"} | null
                           (null with N == 1),
                   "offsets": {rank: seconds, this node 0.0},
                   "peers": {rank: {"host", "verdict", "ring_to", "ring_bytes_per_s"}}}},
     "bad": [{"rank", "host", "reason"}]}
(JSON object keys are strings: ranks as "0", "1", ...; a figure not known is null.)
"""

from __future__ import annotations

import errno
import json
import os
import selectors
import shutil
import signal
import socket
import statistics
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from slurm_multi import auth, dockerapi
from slurm_multi.logline import short, talk
from slurm_multi.net import connect_addresses, derive_ports, describe, read_local_port_range, secs
from slurm_multi.shell import write_json
from slurm_multi.words import is_count, is_decimal, is_host, is_job_id, is_rank, is_token

AREA = "fitness"
VERSION = 1
EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_BAD = 0, 1, 2, 3
EXIT_STOPPED = 143  # SIGTERM's, as a shell reports a process it ended

MIB, GIB = 1 << 20, 1 << 30
DEFAULT_TIMEOUT = 10.0
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
DEFAULT_SLOW_FACTOR = 0.1
DEFAULT_CLOCK_BOUND = 2.0
DEFAULT_TOKEN_ENV = "SM_BARRIER_TOKEN"
# The job's fitness port: derive_ports(MASTER_PORT, job id + this) (the barrier's are at + 0, the
# relay's from + 64: slurm_multi.relay).
PORT_OFFSET = 32
RUNTIMES = ("docker", "pyxis", "none")
MAX_PROBE_BYTES = GIB

MAX_LINE = 1024  # bytes per protocol line, newline included
HELLO_MARGIN = 2.0  # the HELLOs go out at the latest this long before the deadline ...
HELLO_MARGIN_SHARE = 0.25  # ... or this share of --timeout, when that is less
PROGRESS_AFTER = 2.0  # one line naming the peers not heard from yet
ATTEMPT_TIMEOUT = 1.0  # one connect attempt: a dropped SYN never answers
HANDSHAKE_TIMEOUT = 2.0  # greeting, JOIN/WELCOME, HELLO/GOT: our peers answer at once
BACKOFF_START, BACKOFF_MAX = 0.02, 0.25  # a peer usually starts a moment late: retry soon
ACK_EVERY, ACK_SECONDS = 256 << 10, 0.1
PROBE_CHUNK = 1 << 20  # one send() of probe bytes (zeros: nothing on a cluster's path compresses)
MAX_REJECTED = 20  # rejected connections kept in the report
MAX_REASON = 400  # characters of a one-line reason
TOOL_GRACE = 0.2  # a check's thread gets this long past its own timeout to report it itself

TO_LISTENER, FROM_LISTENER = "fitness-to-listener", "fitness-from-listener"
PURPOSES = ("mesh", "probe")
BAD_TOKEN = "bad token"
# Ranks, counts, the token (as the barrier's), job IDs, hosts and decimals: slurm_multi.words.


class UsageError(Exception):
    """A bad command line; str() is the one line shown, exit 2."""


class ProtocolError(ValueError):
    """A line that breaks the protocol; str() is the short reason."""


class Rejected(ProtocolError):
    """The peer answered `ERR <reason>`."""


# --------------------------------------------------------------------------------------------------
# Small words


def size(n: float) -> str:
    """Bytes in a message: `0.4 GiB`, `1 GiB`, `12.5 MiB`."""
    if n >= 0.1 * GIB or n == 0:
        gib = n / GIB
        return f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.005 else f"{gib:.1f} GiB"
    return f"{n / MIB:.1f} MiB"


def mbps(rate: float) -> str:
    return f"{rate / 1e6:.1f} MB/s"


def _errno_text(code: int) -> str:
    return describe(OSError(code, os.strerror(code)))


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """Free text as one bounded line (a reason, a verdict)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------------
# Running a tool within a bound (nvidia-smi, amd-smi, enroot)


class ToolResult(NamedTuple):
    code: int
    stdout: str
    stderr: str


class ToolTimeout(Exception):
    pass


class ToolError(Exception):
    """A tool that failed; str() is the one-line reason."""


def _kill(proc: Any) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: a child it started goes too
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=1)
    except Exception:  # noqa: BLE001 - a zombie we cannot reap is the kernel's now
        pass


def run_tools(argvs: Sequence[Sequence[str]], timeout: float, children: list[Any]) -> list[ToolResult]:
    """Run every argv at once (stdin closed, own session) and wait for all within `timeout`;
    ToolTimeout (each killed) when one has not finished by then. OSError when one cannot start."""
    import subprocess

    started = time.monotonic()
    procs = []
    for argv in argvs:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        children.append(proc)
        procs.append(proc)
    results = []
    try:
        for proc in procs:
            left = max(0.0, timeout - (time.monotonic() - started))
            out, err = proc.communicate(timeout=left)
            results.append(
                ToolResult(proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
            )
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                _kill(proc)
        raise ToolTimeout from None
    return results


def _last_line(result: ToolResult) -> str:
    lines = result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"]
    return short(lines[-1], 120)


# --------------------------------------------------------------------------------------------------
# Local check: the container runtime


def _figures(kind: str, status: str, reason: str = "", detail: str = "", seconds: float = 0.0) -> dict:
    return {
        "kind": kind,
        "status": status,
        "ok": status != "failed",
        "reason": reason,
        "detail": detail,
        "seconds": round(seconds, 3),
    }


def _ping_timeout_reason(timeout: float) -> str:
    return f"docker engine did not answer /_ping within {secs(timeout)} s"


def check_runtime(kind: str, timeout: float, env: Mapping[str, str], children: list[Any]) -> dict:
    """Whether the container runtime answers within `timeout` (see the module docstring)."""
    started = time.monotonic()
    if kind == "none":
        return _figures("none", "skipped", detail="--runtime none: no container runtime")
    if kind == "docker":
        status, reason, detail = _docker_ping(env, timeout)
    else:
        status, reason, detail = _enroot_version(env, timeout, children)
    return _figures(kind, status, reason, detail, time.monotonic() - started)


def runtime_timeout_figures(kind: str, timeout: float) -> dict:
    """What the runtime check says when its thread did not report within the bound."""
    reason = (
        _ping_timeout_reason(timeout)
        if kind == "docker"
        else f"enroot version did not finish within {secs(timeout)} s"
    )
    return _figures(kind, "failed", reason, seconds=timeout)


def _docker_ping(env: Mapping[str, str], timeout: float) -> tuple[str, str, str]:
    from slurm_multi import dockerapi

    path = dockerapi.socket_path(env)
    if path is None:
        return "skipped", "", f"DOCKER_HOST={env.get('DOCKER_HOST', '')} is not a unix:// socket; not checked"
    try:
        reply = dockerapi.get(path, "/_ping", timeout, limit=4096)
    except dockerapi.EngineError as exc:
        what = exc.strerror or ""
        if "timed out" in what or what == "TimeoutError":
            return "failed", _ping_timeout_reason(timeout), f"socket {path}"
        return (
            "failed",
            f"docker engine at {path} did not answer /_ping ({describe(exc)}); is dockerd running?",
            "",
        )
    if reply.status != 200:
        return "failed", f"docker engine at {path} answered /_ping with {short(reply.line, 80)}", ""
    return (
        "ok",
        "",
        f"docker engine at {path} answered /_ping ({short(reply.body.decode('ascii', 'replace'), 20)})",
    )


def _enroot_version(env: Mapping[str, str], timeout: float, children: list[Any]) -> tuple[str, str, str]:
    exe = shutil.which("enroot", path=env.get("PATH", os.defpath))
    if exe is None:
        return "failed", "enroot not found on PATH (--runtime pyxis needs it)", ""
    try:
        (result,) = run_tools([[exe, "version"]], timeout, children)
    except ToolTimeout:
        return "failed", f"enroot version did not finish within {secs(timeout)} s", ""
    except OSError as exc:
        return "failed", f"cannot run {exe} version ({describe(exc)})", ""
    if result.code != 0:
        return "failed", f"enroot version failed (exit {result.code}: {_last_line(result)})", ""
    return "ok", "", f"enroot {short(result.stdout.strip(), 60)}"


# --------------------------------------------------------------------------------------------------
# Local check: free space and inodes


def nearest_existing(path: str) -> str:
    """`path`, or its nearest parent that exists (where it will be created)."""
    current = os.path.abspath(path)
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return current


def _disk_entry(path: str, need: int, reserve: int, min_inodes: int) -> dict:
    return {
        "path": path,
        "checked": nearest_existing(path),
        "need_bytes": need,
        "reserve_bytes": reserve,
        "free_bytes": None,
        "free_inodes": None,
        "total_inodes": None,
        "min_inodes": min_inodes,
        "ok": False,
        "reason": "",
    }


def check_disks(wants: Sequence[tuple[str, int]], reserve: int, min_inodes: int) -> list[dict]:
    """One entry per --disk PATH=BYTES (see the module docstring). Paths on one filesystem share
    it: their BYTES add up, and the reserve counts once."""
    entries: list[dict] = []
    by_device: dict[int, list[dict]] = {}
    for path, need in wants:
        entry = _disk_entry(path, need, reserve, min_inodes)
        entries.append(entry)
        try:
            stats = os.statvfs(entry["checked"])
            device = os.stat(entry["checked"]).st_dev
        except OSError as exc:
            entry["reason"] = f"{path}: cannot read its filesystem's free space ({describe(exc)})"
            continue
        entry.update(
            free_bytes=stats.f_bavail * stats.f_frsize, free_inodes=stats.f_favail, total_inodes=stats.f_files
        )
        by_device.setdefault(device, []).append(entry)
    for group in by_device.values():
        needed = sum(entry["need_bytes"] for entry in group)
        first = group[0]
        label = (
            first["path"] if len(group) == 1 else " and ".join(e["path"] for e in group) + " (one filesystem)"
        )
        reasons = []
        if first["free_bytes"] < needed + reserve:
            reasons.append(
                f"{label}: {size(first['free_bytes'])} free, {size(needed)} needed + {size(reserve)} reserve"
            )
        if first["total_inodes"] > 0 and first["free_inodes"] < min_inodes:
            reasons.append(f"{label}: {first['free_inodes']} free inodes, {min_inodes} needed")
        for entry in group:
            entry["ok"], entry["reason"] = not reasons, "; ".join(reasons)
    return entries


def docker_disk(
    env: Mapping[str, str], image: str, image_bytes: int, timeout: float
) -> list[tuple[str, int]]:
    """docker's data root and what the image needs there: nothing when the node holds the image (a
    warm node), else `image_bytes` (the cache's tar size, when known). Nothing to check when the
    engine does not say (the runtime check names a dead engine)."""
    from slurm_multi import dockerapi

    path = dockerapi.socket_path(env)
    if not image or path is None:
        return []
    try:
        reply = dockerapi.get(path, "/info", timeout)
        root = json.loads(reply.body).get("DockerRootDir") if reply.status == 200 else None
    except (dockerapi.EngineError, ValueError, AttributeError, RecursionError):
        return []
    if not isinstance(root, str) or not root.startswith("/"):
        return []
    return [(root, 0 if dockerapi.image_id(env, image, timeout) else image_bytes)]


def disk_timeout_figures(
    wants: Sequence[tuple[str, int]], reserve: int, min_inodes: int, timeout: float
) -> list[dict]:
    entries = []
    for path, need in wants:
        entry = _disk_entry(path, need, reserve, min_inodes)
        entry["reason"] = (
            f"{path}: its filesystem did not answer within {secs(timeout)} s (a hung network filesystem?)"
        )
        entries.append(entry)
    return entries


# --------------------------------------------------------------------------------------------------
# Local check: GPUs

NVIDIA_GPU_QUERY = ("--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits")
NVIDIA_APPS_QUERY = ("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
AMDSMI_MEMORY = ("metric", "--mem-usage", "--json")
AMDSMI_PROCESS = ("process", "--json")
_MISSING = ("", "N/A", "[N/A]", "n/a", "NA", "[Not Supported]")


def _number(text: str) -> float | None:
    text = text.strip()
    if text in _MISSING:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def _gpu_figures(
    status: str, reason: str, tool: str | None, needed: int, fraction: float, **more: Any
) -> dict:
    figures = {
        "status": status,
        "ok": status != "failed",
        "reason": reason,
        "tool": tool,
        "needed": needed,
        "count": None,
        "mem_fraction": fraction,
        "gpus": [],
        "processes": [],
        "offenders": [],
        "seconds": 0.0,
    }
    figures.update(more)
    return figures


def parse_nvidia_gpus(text: str) -> list[dict]:
    """`--query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits` lines."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4 or not (fields[0].isascii() and fields[0].isdigit()):
            raise ToolError(
                f"unexpected nvidia-smi line ({short(line, 60)}); expected 'index, uuid, used, total'"
            )
        used, total = _number(fields[2]), _number(fields[3])
        gpus.append(
            {
                "index": int(fields[0]),
                "uuid": fields[1],
                "used_mib": None if used is None else int(used),
                "total_mib": None if total is None else int(total),
            }
        )
    return sorted(gpus, key=lambda gpu: gpu["index"])


def parse_nvidia_apps(text: str, uuids: Mapping[str, int]) -> list[dict]:
    """`--query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits` lines."""
    procs = []
    for line in text.splitlines():
        if not line.strip() or "no running processes" in line.lower():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3 or not (fields[1].isascii() and fields[1].isdigit()):
            raise ToolError(
                f"unexpected nvidia-smi line ({short(line, 60)}); expected 'gpu uuid, pid, used memory'"
            )
        mib = _number(fields[2])
        procs.append(
            {"gpu": uuids.get(fields[0]), "pid": int(fields[1]), "mib": None if mib is None else int(mib)}
        )
    return procs


def _nvidia(exe: str, timeout: float, children: list[Any]) -> tuple[list[dict], list[dict]]:
    gpu_run, apps_run = run_tools([[exe, *NVIDIA_GPU_QUERY], [exe, *NVIDIA_APPS_QUERY]], timeout, children)
    if gpu_run.code == 6 and "No devices were found" in gpu_run.stdout + gpu_run.stderr:
        return [], []
    for run, query in ((gpu_run, NVIDIA_GPU_QUERY), (apps_run, NVIDIA_APPS_QUERY)):
        if run.code != 0:
            raise ToolError(f"nvidia-smi {query[0]} failed (exit {run.code}: {_last_line(run)})")
    gpus = parse_nvidia_gpus(gpu_run.stdout)
    return gpus, parse_nvidia_apps(apps_run.stdout, {gpu["uuid"]: gpu["index"] for gpu in gpus})


def _amd_entries(text: str, key: str) -> list[dict] | None:
    """The per-GPU objects carrying `key` in noisy amd-smi JSON (a list, or {"gpu_data": [...]}),
    found as slurm_multi.gpus finds them (the first block that decodes, in linear time)."""
    from slurm_multi.gpus import first_gpu_list

    return first_gpu_list(
        text, lambda block: all(isinstance(e, dict) and "gpu" in e and key in e for e in block)
    )


def _amd_index(entry: Mapping[str, Any]) -> int | None:
    value = entry.get("gpu")
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return None


_TO_MIB = {"B": 1 / MIB, "KB": 1 / 1024, "KIB": 1 / 1024, "MB": 1.0, "MIB": 1.0, "GB": 1024.0, "GIB": 1024.0}


def _amd_mib(value: Any, default_unit: str) -> int | None:
    """`{"value": 2147483648, "unit": "B"}` -> 2048; "N/A" -> None (amd-smi's MB are MiB)."""
    unit = default_unit
    if isinstance(value, dict):
        unit = str(value.get("unit") or default_unit)
        value = value.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value * _TO_MIB.get(unit.strip().upper(), 1 / MIB if default_unit == "B" else 1.0))


def parse_amd_memory(text: str) -> list[dict]:
    """`amd-smi metric --mem-usage --json` -> [{"index", "uuid", "used_mib", "total_mib"}]."""
    entries = _amd_entries(text, "mem_usage")
    if entries is None:
        raise ToolError(
            f"no GPU memory list in amd-smi metric --mem-usage output ({short(text, 60) or 'empty'})"
        )
    gpus: dict[int, dict] = {}
    for entry in entries:
        index = _amd_index(entry)
        usage = entry.get("mem_usage") if isinstance(entry.get("mem_usage"), dict) else {}
        if index is not None and index not in gpus:
            gpus[index] = {
                "index": index,
                "uuid": None,
                "used_mib": _amd_mib(usage.get("used_vram"), "MB"),
                "total_mib": _amd_mib(usage.get("total_vram"), "MB"),
            }
    return [gpus[index] for index in sorted(gpus)]


def parse_amd_processes(text: str) -> list[dict]:
    """`amd-smi process --json` -> [{"gpu", "pid", "mib"}] (VRAM of each process)."""
    entries = _amd_entries(text, "process_list")
    if entries is None:
        raise ToolError(f"no process list in amd-smi process output ({short(text, 60) or 'empty'})")
    procs = []
    for entry in entries:
        index = _amd_index(entry)
        listed = entry.get("process_list")
        for item in listed if isinstance(listed, list) else []:
            info = item.get("process_info") if isinstance(item, dict) else None
            if not isinstance(info, dict):  # "No running processes detected"
                continue
            pid = info.get("pid")
            if isinstance(pid, bool) or not isinstance(pid, int):
                continue
            usage = info.get("memory_usage") if isinstance(info.get("memory_usage"), dict) else {}
            mib = _amd_mib(usage.get("vram_mem"), "B")
            procs.append(
                {
                    "gpu": index,
                    "pid": pid,
                    "mib": _amd_mib(info.get("mem_usage"), "B") if mib is None else mib,
                }
            )
    return procs


def _amd(exe: str, timeout: float, children: list[Any]) -> tuple[list[dict], list[dict]]:
    memory, process = run_tools([[exe, *AMDSMI_MEMORY], [exe, *AMDSMI_PROCESS]], timeout, children)
    for run, argv in ((memory, AMDSMI_MEMORY), (process, AMDSMI_PROCESS)):
        if run.code != 0:
            raise ToolError(f"amd-smi {' '.join(argv)} failed (exit {run.code}: {_last_line(run)})")
    return parse_amd_memory(memory.stdout), parse_amd_processes(process.stdout)


def gpu_offenders(
    gpus: Sequence[Mapping[str, Any]], procs: Sequence[Mapping[str, Any]], fraction: float
) -> list[dict]:
    """Every compute process, and every GPU using more than `fraction` of its memory."""
    offenders = [
        {"gpu": p["gpu"], "pid": p["pid"], "mib": p["mib"], "total_mib": None, "why": "process"}
        for p in procs
    ]
    for gpu in gpus:
        used, total = gpu.get("used_mib"), gpu.get("total_mib")
        if used is not None and total and used > fraction * total:
            offenders.append(
                {"gpu": gpu["index"], "pid": None, "mib": used, "total_mib": total, "why": "memory"}
            )
    return offenders


def _offender_reason(offender: Mapping[str, Any], fraction: float) -> str:
    gpu = "?" if offender["gpu"] is None else offender["gpu"]
    if offender["why"] == "process":
        mib = "" if offender["mib"] is None else f" ({offender['mib']} MiB)"
        return f"GPU {gpu} held by pid {offender['pid']}{mib} of another job"
    used = f"{offender['mib']} of {offender['total_mib']} MiB in use"
    return f"GPU {gpu}: {used} (more than {fraction:.0%}) by another job"


def check_gpus(
    needed: int, fraction: float, timeout: float, env: Mapping[str, str], children: list[Any]
) -> dict:
    """The GPU check (see the module docstring)."""
    started = time.monotonic()
    path = env.get("PATH", os.defpath)
    amd = shutil.which("amd-smi", path=path)
    nvidia = None if amd else shutil.which("nvidia-smi", path=path)
    if amd is None and nvidia is None:
        if needed == 0:
            return _gpu_figures("skipped", "", None, needed, fraction, count=0)
        return _gpu_figures(
            "failed",
            f"the job needs {needed} GPU(s) but this node has neither amd-smi nor nvidia-smi on PATH",
            None,
            needed,
            fraction,
            count=0,
        )
    tool = "amd-smi" if amd else "nvidia-smi"
    try:
        gpus, procs = _amd(amd, timeout, children) if amd else _nvidia(str(nvidia), timeout, children)
    except ToolTimeout:
        return gpu_timeout_figures(tool, needed, fraction, timeout)
    except (ToolError, OSError) as exc:
        reason = str(exc) if isinstance(exc, ToolError) else f"cannot run {tool} ({describe(exc)})"
        return _gpu_figures(
            "failed", reason, tool, needed, fraction, seconds=round(time.monotonic() - started, 3)
        )
    offenders = gpu_offenders(gpus, procs, fraction)
    reasons = []
    if needed and len(gpus) < needed:
        reasons.append(f"only {len(gpus)} GPU(s) ({tool}), the job needs {needed}")
    held = {o["gpu"] for o in offenders if o["why"] == "process"}
    # A GPU held by a listed process is named by its process; its memory says nothing new.
    shown = [o for o in offenders if o["why"] == "process" or o["gpu"] not in held]
    reasons += [_offender_reason(o, fraction) for o in shown[:3]]
    if len(shown) > 3:
        reasons[-1] += f" (and {len(shown) - 3} more)"
    return _gpu_figures(
        "failed" if reasons else "ok",
        "; ".join(reasons),
        tool,
        needed,
        fraction,
        count=len(gpus),
        gpus=gpus,
        processes=procs,
        offenders=offenders,
        seconds=round(time.monotonic() - started, 3),
    )


def gpu_timeout_figures(tool: str | None, needed: int, fraction: float, timeout: float) -> dict:
    return _gpu_figures(
        "failed",
        f"{tool or 'the GPU tool'} did not answer within {secs(timeout)} s (is the GPU driver hung?)",
        tool,
        needed,
        fraction,
        seconds=timeout,
    )


# --------------------------------------------------------------------------------------------------
# Local checks at once, each within its bound


class Pending:
    """A check running in a daemon thread: its figures, or `on_timeout()`'s once `bound_at` passed."""

    def __init__(
        self,
        name: str,
        run: Callable[[], Any],
        bound_at: float,
        on_timeout: Callable[[], Any],
        on_error: Callable[[str], Any],
        wake: Callable[[], None],
    ) -> None:
        self.name, self.bound_at, self.on_timeout = name, bound_at, on_timeout
        self.done = threading.Event()
        self.result: Any = None

        def target() -> None:
            try:
                self.result = run()
            except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, not a traceback
                self.result = on_error(
                    f"{name} check failed unexpectedly ({type(exc).__name__}: {short(str(exc), 120)})"
                )
            self.done.set()
            wake()

        threading.Thread(target=target, name=f"fitness-{name}", daemon=True).start()

    def finished(self, now: float) -> bool:
        return self.done.is_set() or now >= self.bound_at

    def value(self) -> Any:
        return self.result if self.done.is_set() else self.on_timeout()


def local_verdict(
    runtime: Mapping[str, Any], disk: Sequence[Mapping[str, Any]], gpus: Mapping[str, Any], listen_error: str
) -> tuple[bool, str]:
    """(ok, the one-line reason) of this node's local checks: every failed check's reason."""
    reasons: list[str] = []
    if not runtime.get("ok", True):
        reasons.append(str(runtime.get("reason")))
    for entry in disk:
        if not entry.get("ok") and entry.get("reason") not in reasons:
            reasons.append(str(entry.get("reason")))
    if not gpus.get("ok", True):
        reasons.append(str(gpus.get("reason")))
    if listen_error:
        reasons.append(listen_error)
    return not reasons, one_line("; ".join(reasons))


# --------------------------------------------------------------------------------------------------
# The protocol's lines (pure: build one, or parse one and raise ProtocolError)


def decode(line: bytes) -> str:
    raw = line[:-1] if line.endswith(b"\n") else line
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) >= MAX_LINE:
        raise ProtocolError("line too long")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("not UTF-8") from None
    if not text or not text.isprintable():
        raise ProtocolError("empty or unprintable line")
    return text


def parse_rank(text: str, nnodes: int) -> int:
    if not is_rank(text) or int(text) >= nnodes:
        raise ProtocolError(f"bad rank (0..{nnodes - 1})")
    return int(text)


def greeting_line(challenge: str) -> bytes:
    return f"FITNESS {challenge}\n".encode()


def parse_greeting(text: str) -> str:
    verb, _, challenge = text.partition(" ")
    if verb != "FITNESS" or not auth.is_nonce(challenge):
        raise ProtocolError(f"not a fitness stage ({short(text, 60)!r})")
    return challenge


def join_line(
    token: str, job: str, challenge: str, nonce: str, rank: int, to_rank: int, purpose: str, nbytes: int
) -> bytes:
    fields = (str(rank), str(to_rank), purpose, str(nbytes))
    mac = auth.mac(token, TO_LISTENER, "JOIN", challenge, nonce, job, *fields)
    return f"JOIN {mac} {nonce} {' '.join(fields)}\n".encode()


class Join(NamedTuple):
    nonce: str
    rank: int
    purpose: str
    nbytes: int


def claimed_rank(text: str, nnodes: int) -> int | None:
    """The rank a JOIN says it comes from, before (or without) its MAC verifying: for the record."""
    parts = text.split(" ")
    if len(parts) == 7 and is_rank(parts[3]) and int(parts[3]) < nnodes:
        return int(parts[3])
    return None


def parse_join(text: str, token: str, job: str, challenge: str, me: int, nnodes: int) -> Join:
    """A dialer's JOIN on the connection greeted with `challenge`; the MAC is checked first."""
    parts = text.split(" ")
    if len(parts) != 7 or parts[0] != "JOIN":
        raise ProtocolError("malformed JOIN")
    _, given, nonce, *fields = parts
    if not auth.is_nonce(nonce) or not auth.check(
        token, given, TO_LISTENER, "JOIN", challenge, nonce, job, *fields
    ):
        raise ProtocolError(BAD_TOKEN)
    rank, to_rank = parse_rank(fields[0], nnodes), parse_rank(fields[1], nnodes)
    if to_rank != me:
        raise ProtocolError(f"wrong rank: this is rank {me}")
    if rank == me:
        raise ProtocolError("a JOIN from this very rank")
    if fields[2] not in PURPOSES or not is_count(fields[3]) or int(fields[3]) > MAX_PROBE_BYTES:
        raise ProtocolError("malformed JOIN")
    return Join(nonce, rank, fields[2], int(fields[3]))


def welcome_line(token: str, job: str, challenge: str, nonce: str, rank: int, purpose: str) -> bytes:
    mac = auth.mac(token, FROM_LISTENER, "WELCOME", challenge, nonce, job, str(rank), purpose)
    return f"WELCOME {mac} {rank} {purpose}\n".encode()


def _reply_fields(text: str, verb: str, count: int) -> list[str]:
    """The fields after `<verb> <mac>` of a listener's reply; Rejected for an `ERR` line."""
    head, _, rest = text.partition(" ")
    if head == "ERR":
        raise Rejected(short(rest, 80) or "unspecified")
    parts = text.split(" ")
    if head != verb or len(parts) != count + 2:
        raise ProtocolError(f"expected {verb}, got {short(text, 60)!r}")
    return parts[1:]


def parse_welcome(
    text: str, token: str, job: str, challenge: str, nonce: str, rank: int, purpose: str
) -> None:
    given, *fields = _reply_fields(text, "WELCOME", 2)
    if not auth.check(token, given, FROM_LISTENER, "WELCOME", challenge, nonce, job, *fields):
        raise ProtocolError("its WELCOME is not signed with this job's token")
    if fields != [str(rank), purpose]:
        raise ProtocolError(f"rank {fields[0]} answered where rank {rank} was expected")


class Hello(NamedTuple):
    rank: int
    host: str
    sent: float  # the sender's time.time() at send
    ring_to: int | None
    ring_rate: float | None  # bytes/s of the sender's ring link, None when not measured
    verdict: str  # `ok`, or the sender's local checks' one-line reason


def _hello_fields(hello: Hello) -> list[str]:
    rate = "-" if hello.ring_rate is None else str(int(hello.ring_rate))
    ring_to = "-" if hello.ring_to is None else str(hello.ring_to)
    return [str(hello.rank), hello.host, f"{hello.sent:.6f}", ring_to, rate]


def _fit_verdict(head: Sequence[str], verdict: str) -> str:
    """The verdict on one line after `head`, `|` kept out (auth's field separator), cut to fit."""
    verdict = one_line(verdict.replace("|", "/")) or "ok"
    budget = MAX_LINE - 2 - sum(len(field.encode()) + 1 for field in head)
    return verdict.encode()[:budget].decode("utf-8", "ignore").rstrip() or "?"


def hello_line(token: str, job: str, challenge: str, nonce: str, hello: Hello) -> bytes:
    fields = _hello_fields(hello)
    verdict = _fit_verdict(["HELLO", "0" * auth.MAC_HEX, *fields], hello.verdict)
    mac = auth.mac(token, TO_LISTENER, "HELLO", challenge, nonce, job, *fields, verdict)
    return f"HELLO {mac} {' '.join(fields)} {verdict}\n".encode()


def parse_hello(text: str, token: str, job: str, challenge: str, nonce: str, rank: int, nnodes: int) -> Hello:
    parts = text.split(" ", 7)
    if len(parts) != 8 or parts[0] != "HELLO":
        raise ProtocolError("malformed HELLO")
    _, given, *fields = parts
    if not auth.check(token, given, TO_LISTENER, "HELLO", challenge, nonce, job, *fields):
        raise ProtocolError(BAD_TOKEN)
    rank_text, host, sent, ring_to, rate, verdict = fields
    if parse_rank(rank_text, nnodes) != rank:
        raise ProtocolError("HELLO from another rank than its JOIN")
    if not is_host(host) or not is_decimal(sent):
        raise ProtocolError("malformed HELLO")
    if (ring_to != "-" and not is_rank(ring_to)) or (rate != "-" and not is_count(rate)):
        raise ProtocolError("malformed HELLO")
    return Hello(
        rank,
        host,
        float(sent),
        None if ring_to == "-" else parse_rank(ring_to, nnodes),
        None if rate == "-" else float(rate),
        verdict,
    )


def got_line(token: str, job: str, challenge: str, nonce: str, rank: int) -> bytes:
    return f"GOT {auth.mac(token, FROM_LISTENER, 'GOT', challenge, nonce, job, str(rank))} {rank}\n".encode()


def parse_got(text: str, token: str, job: str, challenge: str, nonce: str, rank: int) -> None:
    given, field = _reply_fields(text, "GOT", 1)
    if not auth.check(token, given, FROM_LISTENER, "GOT", challenge, nonce, job, field) or field != str(rank):
        raise ProtocolError("its GOT is not signed with this job's token")


def ack_line(token: str, job: str, challenge: str, nonce: str, count: int) -> bytes:
    return (
        f"ACK {auth.mac(token, FROM_LISTENER, 'ACK', challenge, nonce, job, str(count))} {count}\n".encode()
    )


def parse_ack(text: str, token: str, job: str, challenge: str, nonce: str, total: int) -> int:
    given, field = _reply_fields(text, "ACK", 1)
    if not auth.check(token, given, FROM_LISTENER, "ACK", challenge, nonce, job, field):
        raise ProtocolError("its ACK is not signed with this job's token")
    if not is_count(field) or int(field) > total:
        raise ProtocolError("malformed ACK")
    return int(field)


def err_line(reason: str) -> bytes:
    return f"ERR {reason}\n".encode()


# --------------------------------------------------------------------------------------------------
# The mesh: one selector loop for the listener, every dial and the ring probe


class Dial:
    """One peer this node dials: `mesh` (to deliver our HELLO) or `probe` (the ring probe)."""

    __slots__ = (
        "rank",
        "host",
        "port",
        "purpose",
        "addresses",
        "attempts",
        "next_at",
        "backoff",
        "error",
        "conn",
        "done",
    )

    def __init__(self, rank: int, host: str, port: int, purpose: str) -> None:
        self.rank, self.host, self.port, self.purpose = rank, host, port, purpose
        self.addresses: list[str] | None = None
        self.attempts = 0
        self.next_at = 0.0
        self.backoff = BACKOFF_START
        self.error = ""
        self.conn: Conn | None = None
        self.done = False


class Conn:
    """One TCP connection, dialled (`dial` set) or accepted, and where it is in the protocol."""

    __slots__ = (
        "sock",
        "dial",
        "state",
        "inbuf",
        "outbuf",
        "challenge",
        "nonce",
        "until",
        "rank",
        "total",
        "count",
        "acked",
        "last_ack",
        "started",
        "addr",
        "mask",
    )

    def __init__(self, sock: socket.socket, until: float, addr: str, dial: Dial | None = None) -> None:
        self.sock, self.until, self.addr, self.dial = sock, until, addr, dial
        self.state = "connect" if dial else "join"
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.challenge = self.nonce = ""
        self.rank = dial.rank if dial else -1
        self.total = self.count = self.acked = 0  # probe: bytes to send/receive, sent/received, acked
        self.last_ack = self.started = 0.0
        self.mask = 0


class Mesh:
    """This node's side of the mesh; the caller's loop feeds it events and timer ticks."""

    def __init__(
        self,
        sel: selectors.BaseSelector,
        me: int,
        hosts: Sequence[str],
        ports: Sequence[int],
        job: str,
        token: str,
        probe_bytes: int,
        probe_seconds: float,
        hello_by: float,
        deadline: float,
    ) -> None:
        self.sel, self.me, self.job, self.token = sel, me, job, token
        self.hosts, self.ports = list(hosts), list(ports)
        self.n = len(hosts)
        self.probe_bytes, self.probe_seconds = probe_bytes, probe_seconds
        self.hello_by, self.deadline = hello_by, deadline
        self.peers = [q for q in range(self.n) if q != me]
        self.dials = {q: Dial(q, hosts[q], ports[q], "mesh") for q in self.peers}
        successor = (me + 1) % self.n
        self.probe = Dial(successor, hosts[successor], ports[successor], "probe") if probe_bytes > 0 else None
        self.ring: dict[str, Any] = {
            "to": successor,
            "bytes": 0,
            "seconds": 0.0,
            "bytes_per_s": None,
            "complete": False,
            "error": "",
        }
        if self.probe is None:
            self.ring["error"] = "no probe (--probe-bytes 0)"
        self.listener: socket.socket | None = None
        self.listen_error = ""
        self.heard: dict[int, dict[str, Any]] = {}
        self.reached: set[int] = set()
        self.token_rejected_by: set[int] = set()
        self.rejected: list[dict[str, Any]] = []
        self.hello: Hello | None = None
        self.conns: set[Conn] = set()
        self.scratch = bytearray(PROBE_CHUNK)
        self.payload = memoryview(bytes(PROBE_CHUNK))

    # -- setup and state ---------------------------------------------------------------------------

    def listen(self) -> None:
        port = self.ports[self.me]
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))  # noqa: S104 - every IPv4 address: peers dial whichever they resolve
            sock.listen(max(128, 4 * self.n))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                self.listen_error = (
                    f"port {port} is already in use on this node (another job's, or a stale stage?)"
                )
            else:
                self.listen_error = f"cannot listen on port {port} ({describe(exc)})"
            return
        sock.setblocking(False)
        self.listener = sock
        self.sel.register(sock, selectors.EVENT_READ, self)

    def probe_done(self) -> bool:
        return self.probe is None or self.probe.done

    def done(self) -> bool:
        delivered = all(dial.done for dial in self.dials.values())
        heard_all = self.listener is None or len(self.heard) == len(self.peers)
        return delivered and heard_all and self.probe_done()

    def not_heard(self) -> list[int]:
        return [q for q in self.peers if q not in self.heard]

    def set_hello(self, hello: Hello, now: float) -> None:
        self.hello = hello
        for conn in list(self.conns):
            if conn.dial is not None and conn.state == "joined":
                self._send_hello(conn, now)

    def next_timer(self) -> float:
        times = [self.deadline]
        for dial in [*self.dials.values(), *([self.probe] if self.probe else [])]:
            if not dial.done and dial.conn is None:
                times.append(dial.next_at)
        if self.probe is not None and not self.probe.done:
            times.append(self.hello_by)
        times += [conn.until for conn in self.conns]
        return min(times)

    # -- timers --------------------------------------------------------------------------------------

    def on_timers(self, now: float) -> None:
        probe = self.probe
        if probe is not None and not probe.done and now >= self.hello_by:
            if probe.conn is not None and probe.conn.state == "send":
                self._finish_probe(
                    probe.conn, now, f"stopped at the bound after {probe.conn.acked} bytes acknowledged"
                )
            else:
                if probe.conn is not None:
                    self._close(probe.conn)
                    probe.conn = None
                probe.done = True
                self.ring["error"] = (
                    f"no probe connection to {probe.host} (rank {probe.rank}) in time: "
                    f"{probe.error or 'no answer'}"
                )
        for dial in [*self.dials.values(), *([self.probe] if self.probe else [])]:
            if not dial.done and dial.conn is None and now >= dial.next_at and now < self.deadline:
                self._start_dial(dial, now)
        for conn in [c for c in self.conns if now >= c.until]:
            self._on_timeout(conn, now)

    def _on_timeout(self, conn: Conn, now: float) -> None:
        if conn.dial is None and conn.state == "probe" and now < self.deadline:
            if conn.count > conn.acked:
                self._ack(conn, now)  # what came before the link stalled
            conn.until = self.deadline
        elif conn.dial is None:
            self._close(conn)  # a silent client, or the deadline
        elif conn.state == "send":
            self._finish_probe(conn, now, f"stopped at the bound after {conn.acked} bytes acknowledged")
        elif conn.state == "connect":
            self._fail(conn, "timed out", now)
        else:
            waited = {
                "greet": "no fitness greeting",
                "welcome": "no answer to JOIN",
                "got": "no GOT for our HELLO",
            }
            self._fail(conn, f"{waited.get(conn.state, 'no answer')} within {secs(HANDSHAKE_TIMEOUT)} s", now)

    # -- dialing -------------------------------------------------------------------------------------

    def _start_dial(self, dial: Dial, now: float) -> None:
        if dial.addresses is None:
            try:
                dial.addresses = connect_addresses(dial.host) or None
            except OSError as exc:
                dial.error = f"{dial.host} does not resolve ({describe(exc)})"
            if dial.addresses is None:
                dial.error = dial.error or f"{dial.host} has no IPv4 address"
                self._retry(dial, now)
                return
        address = dial.addresses[dial.attempts % len(dial.addresses)]
        dial.attempts += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex((address, dial.port))
        if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            dial.error = _errno_text(code)
            self._retry(dial, now)
            return
        conn = Conn(sock, now + ATTEMPT_TIMEOUT, f"{address}:{dial.port}", dial)
        dial.conn = conn
        self._add(conn, selectors.EVENT_WRITE)

    def _retry(self, dial: Dial, now: float) -> None:
        dial.next_at = now + dial.backoff
        dial.backoff = min(dial.backoff * 2, BACKOFF_MAX)

    def _fail(self, conn: Conn, error: str, now: float) -> None:
        """A dialled connection that broke: note why and dial again later."""
        dial = conn.dial
        assert dial is not None
        if dial.purpose == "probe" and conn.state == "send":
            self._finish_probe(conn, now, f"{error} after {conn.acked} bytes acknowledged")
            return
        self._close(conn)
        dial.conn = None
        dial.error = error
        self._retry(dial, now)

    def _on_dial_line(self, conn: Conn, text: str, now: float) -> None:
        dial = conn.dial
        assert dial is not None
        if conn.state == "greet":
            conn.challenge = parse_greeting(text)
            conn.nonce = auth.new_nonce()
            nbytes = self.probe_bytes if dial.purpose == "probe" else 0
            self._queue(
                conn,
                join_line(
                    self.token, self.job, conn.challenge, conn.nonce, self.me, dial.rank, dial.purpose, nbytes
                ),
            )
            conn.state = "welcome"
        elif conn.state == "welcome":
            parse_welcome(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank, dial.purpose)
            if dial.purpose == "probe":
                conn.state, conn.total, conn.started = "send", self.probe_bytes, now
                conn.until = min(now + self.probe_seconds, self.hello_by)
                self._pump_probe(conn)
            else:
                conn.state, conn.until = "joined", float("inf")
                if self.hello is not None:
                    self._send_hello(conn, now)
        elif conn.state == "got":
            parse_got(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank)
            self.reached.add(dial.rank)
            dial.done, dial.error = True, ""
            self._close(conn)
            dial.conn = None
        elif conn.state == "send":
            conn.acked, conn.last_ack = (
                parse_ack(text, self.token, self.job, conn.challenge, conn.nonce, conn.total),
                now,
            )
            if conn.acked >= conn.total:
                self._finish_probe(conn, now, "")
        else:
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def _send_hello(self, conn: Conn, now: float) -> None:
        assert self.hello is not None
        hello = self.hello._replace(sent=time.time())
        self._queue(conn, hello_line(self.token, self.job, conn.challenge, conn.nonce, hello))
        conn.state, conn.until = "got", now + HANDSHAKE_TIMEOUT

    def _pump_probe(self, conn: Conn) -> None:
        """Send probe bytes until the socket's buffer is full or all are sent."""
        while conn.count < conn.total and not conn.outbuf:
            chunk = self.payload[: min(len(self.payload), conn.total - conn.count)]
            try:
                sent = conn.sock.send(chunk)
            except (BlockingIOError, InterruptedError):
                break
            conn.count += sent
        self._want(conn)

    def _finish_probe(self, conn: Conn, now: float, error: str) -> None:
        complete = conn.acked >= conn.total > 0
        seconds = (conn.last_ack if conn.acked else now) - conn.started
        rate = conn.acked / max(seconds, 1e-6) if conn.acked else 0.0
        self.ring.update(
            bytes=conn.acked,
            seconds=round(seconds, 6),
            bytes_per_s=round(rate),
            complete=complete,
            error=error,
        )
        assert self.probe is not None
        self.probe.done, self.probe.conn = True, None
        if not complete:  # reset: what is still queued must not compete with the HELLOs
            try:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self._close(conn)

    # -- accepting -----------------------------------------------------------------------------------

    def _accept(self, now: float) -> None:
        assert self.listener is not None
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # EMFILE and the like: the peer retries
            if len(self.conns) > 4 * self.n + 64:
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock, now + HANDSHAKE_TIMEOUT, f"{addr[0]}:{addr[1]}")
            conn.challenge = auth.new_nonce()
            self._add(conn, selectors.EVENT_READ)
            self._queue(conn, greeting_line(conn.challenge))

    def _on_accepted_line(self, conn: Conn, text: str, now: float) -> None:
        if conn.state == "join":
            try:
                join = parse_join(text, self.token, self.job, conn.challenge, self.me, self.n)
            except ProtocolError as exc:
                if str(exc) == BAD_TOKEN and len(self.rejected) < MAX_REJECTED:
                    self.rejected.append(
                        {"from": conn.addr, "rank": claimed_rank(text, self.n), "reason": BAD_TOKEN}
                    )
                self._queue(conn, err_line(str(exc)))
                conn.state, conn.until = "drain", now + HANDSHAKE_TIMEOUT
                return
            conn.nonce, conn.rank = join.nonce, join.rank
            self._queue(
                conn, welcome_line(self.token, self.job, conn.challenge, conn.nonce, self.me, join.purpose)
            )
            conn.until = self.deadline
            if join.purpose == "probe":
                conn.state, conn.total, conn.last_ack = "probe", join.nbytes, now
                early, conn.inbuf = bytes(conn.inbuf), bytearray()
                self._count_probe(conn, len(early), now)
            else:
                conn.state = "hello"
        elif conn.state == "hello":
            hello = parse_hello(text, self.token, self.job, conn.challenge, conn.nonce, conn.rank, self.n)
            received = time.time()
            self.heard.setdefault(
                hello.rank,
                {
                    "host": hello.host,
                    "verdict": hello.verdict,
                    "ring_to": hello.ring_to,
                    "ring_bytes_per_s": hello.ring_rate,
                    "offset": round(hello.sent - received, 6),
                },
            )
            self._queue(conn, got_line(self.token, self.job, conn.challenge, conn.nonce, self.me))
            conn.state = "drain"
        elif conn.state != "drain":
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def _count_probe(self, conn: Conn, received: int, now: float) -> None:
        conn.count += received
        if conn.count > conn.total:
            raise ProtocolError("more probe bytes than announced")
        if (
            conn.count == conn.total
            or conn.count - conn.acked >= ACK_EVERY
            or (conn.count > conn.acked and now - conn.last_ack >= ACK_SECONDS)
        ):
            self._ack(conn, now)
        elif conn.count > conn.acked:  # acknowledged within ACK_SECONDS even if no more come (a stall)
            conn.until = min(self.deadline, conn.last_ack + ACK_SECONDS)
        if conn.count == conn.total:
            conn.state = "drain"

    def _ack(self, conn: Conn, now: float) -> None:
        conn.acked, conn.last_ack, conn.until = conn.count, now, self.deadline
        self._queue(conn, ack_line(self.token, self.job, conn.challenge, conn.nonce, conn.count))

    # -- plumbing ------------------------------------------------------------------------------------

    def _add(self, conn: Conn, mask: int) -> None:
        self.conns.add(conn)
        conn.mask = mask
        self.sel.register(conn.sock, mask, conn)

    def _want(self, conn: Conn) -> None:
        if conn not in self.conns:
            return
        mask = selectors.EVENT_READ
        if conn.outbuf or conn.state == "connect" or (conn.state == "send" and conn.count < conn.total):
            mask |= selectors.EVENT_WRITE
        if mask != conn.mask:
            conn.mask = mask
            self.sel.modify(conn.sock, mask, conn)

    def _queue(self, conn: Conn, data: bytes) -> None:
        conn.outbuf += data
        self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        while conn.outbuf:
            try:
                sent = conn.sock.send(conn.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            del conn.outbuf[:sent]
        self._want(conn)

    def _close(self, conn: Conn) -> None:
        if conn in self.conns:
            self.conns.discard(conn)
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.sock.close()

    def close(self, linger: float = 0.5) -> None:
        """Flush what is still queued (a GOT, an ACK) for up to `linger` s, then close everything."""
        until = time.monotonic() + linger
        while any(conn.outbuf for conn in self.conns) and time.monotonic() < until:
            for key, _ in self.sel.select(max(0.0, until - time.monotonic())):
                if isinstance(key.data, Conn) and key.data.outbuf:
                    try:
                        self._flush(key.data)
                    except OSError:
                        self._close(key.data)
        for conn in list(self.conns):
            self._close(conn)
        if self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()

    def on_event(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        if key.data is self:
            self._accept(now)
            return
        conn: Conn = key.data
        try:
            self._on_conn_event(conn, mask, now)
        except Rejected as exc:
            if conn.dial is not None:
                if str(exc) == BAD_TOKEN:
                    self.token_rejected_by.add(conn.dial.rank)
                self._fail(conn, f"rejected: {exc}", now)
            else:
                self._close(conn)
        except (ProtocolError, OSError) as exc:
            error = describe(exc) if isinstance(exc, OSError) else str(exc)
            if conn.dial is not None:
                self._fail(conn, error, now)
            else:  # tell the dialer why (best effort), then drop it
                if isinstance(exc, ProtocolError):
                    try:
                        conn.sock.send(err_line(str(exc)))
                    except OSError:
                        pass
                self._close(conn)

    def _on_conn_event(self, conn: Conn, mask: int, now: float) -> None:
        if mask & selectors.EVENT_WRITE:
            if conn.state == "connect":
                code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(code, os.strerror(code))
                conn.state, conn.until = "greet", now + HANDSHAKE_TIMEOUT
            self._flush(conn)
            if conn.state == "send":
                self._pump_probe(conn)
        if not mask & selectors.EVENT_READ or conn not in self.conns:
            return
        if conn.state == "probe":
            received = conn.sock.recv_into(self.scratch)
            if not received:
                self._close(conn)
                return
            self._count_probe(conn, received, now)
            return
        data = conn.sock.recv(65536)
        if not data:
            if conn.dial is not None:
                raise ProtocolError("connection closed by the peer")
            self._close(conn)
            return
        if conn.state == "drain":
            return
        conn.inbuf += data
        while conn in self.conns and conn.state not in ("probe", "drain"):
            line, found, rest = bytes(conn.inbuf).partition(b"\n")
            if not found:
                if len(conn.inbuf) >= MAX_LINE:
                    raise ProtocolError("line too long")
                return
            conn.inbuf = bytearray(rest)
            text = decode(line)
            if conn.dial is not None:
                self._on_dial_line(conn, text, now)
            else:
                self._on_accepted_line(conn, text, now)
        if conn in self.conns and conn.state == "probe" and conn.inbuf:
            early, conn.inbuf = len(conn.inbuf), bytearray()
            self._count_probe(conn, early, now)

    # -- the record ----------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        offsets = {str(self.me): 0.0, **{str(q): info["offset"] for q, info in sorted(self.heard.items())}}
        peers = {
            str(q): {key: info[key] for key in ("host", "verdict", "ring_to", "ring_bytes_per_s")}
            for q, info in sorted(self.heard.items())
        }
        return {
            "port": self.ports[self.me],
            "listening": self.listener is not None,
            "listen_error": self.listen_error,
            "reached": sorted(self.reached),
            "heard": sorted(self.heard),
            "errors": {
                str(q): d.error for q, d in sorted(self.dials.items()) if q not in self.reached and d.error
            },
            "token_rejected_by": sorted(self.token_rejected_by),
            "rejected": self.rejected,
            "ring": self.ring,
            "offsets": offsets,
            "peers": peers,
        }


# --------------------------------------------------------------------------------------------------
# The verdict


class _Report:
    """What a judge reads from one node's report, defensively (a report is another process's file)."""

    def __init__(self, report: Mapping[str, Any], nnodes: int | None = None) -> None:
        self.raw = report
        self.stopped = bool(report.get("stopped"))
        self.n = max(1, _int(report.get("nnodes"), 1)) if nnodes is None else nnodes
        self.me = _int(report.get("rank"), -1)
        self.hosts = _strings(report.get("hosts"), self.n)
        self.ports = [
            _int(p, 0) for p in (report.get("ports") if isinstance(report.get("ports"), list) else [])
        ]
        local = report.get("local") if isinstance(report.get("local"), Mapping) else {}
        self.local_ok = local.get("ok") is not False
        self.local_reason = str(local.get("reason") or "local checks failed")
        self.timeout = _float(report.get("timeout")) or DEFAULT_TIMEOUT
        checks = report.get("checks") if isinstance(report.get("checks"), Mapping) else {}
        net = checks.get("network") if isinstance(checks.get("network"), Mapping) else {}
        self.port = _int(net.get("port"), 0)
        self.listening = net.get("listening") is not False
        self.reached = _ranks(net.get("reached"), self.n)
        self.heard = _ranks(net.get("heard"), self.n)
        self.token_rejected_by = _ranks(net.get("token_rejected_by"), self.n)
        rejected = net.get("rejected") if isinstance(net.get("rejected"), list) else []
        self.rejected_ranks = _ranks([r.get("rank") for r in rejected if isinstance(r, Mapping)], self.n)
        errors = net.get("errors") if isinstance(net.get("errors"), Mapping) else {}
        self.errors = {_int(k, -1): str(v) for k, v in errors.items()}
        ring = net.get("ring") if isinstance(net.get("ring"), Mapping) else {}
        self.ring_rate = _float(ring.get("bytes_per_s"))
        offsets = net.get("offsets") if isinstance(net.get("offsets"), Mapping) else {}
        self.offsets = {_int(k, -1): _float(v) for k, v in offsets.items()}
        self.offsets = {k: v for k, v in self.offsets.items() if 0 <= k < self.n and v is not None}
        peers = net.get("peers") if isinstance(net.get("peers"), Mapping) else {}
        self.peers = {_int(k, -1): v for k, v in peers.items() if isinstance(v, Mapping)}

    def peer_verdict(self, rank: int) -> str:
        return str(self.peers.get(rank, {}).get("verdict") or "ok")

    def peer_rate(self, rank: int) -> float | None:
        return _float(self.peers.get(rank, {}).get("ring_bytes_per_s"))


def _int(value: Any, default: int) -> int:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool)
        else (int(value) if isinstance(value, str) and is_rank(value) else default)
    )


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN
        return None
    return float(value)


def _ranks(value: Any, n: int) -> set[int]:
    return {
        v
        for v in (value if isinstance(value, list) else [])
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n
    }


def _strings(value: Any, n: int) -> list[str]:
    found = [str(v) for v in value] if isinstance(value, list) else []
    return found + [f"rank{r}" for r in range(len(found), n)]


class _Names:
    """How nodes are named in reasons: their host, or host:port where ranks share a host (tests)."""

    def __init__(self, hosts: Sequence[str], ports: Sequence[int]) -> None:
        self.hosts, self.ports = list(hosts), list(ports)
        self.unique = len(set(self.hosts)) == len(self.hosts)

    def __call__(self, rank: int) -> str:
        host = self.hosts[rank] if rank < len(self.hosts) else f"rank{rank}"
        if self.unique or rank >= len(self.ports) or not self.ports[rank]:
            return host
        return f"{host}:{self.ports[rank]}"

    def port(self, rank: int, default: int = 0) -> str:
        return str(self.ports[rank]) if rank < len(self.ports) and self.ports[rank] else str(default or "?")


class _Bad:
    def __init__(self) -> None:
        self.reasons: dict[int, list[str]] = {}

    def add(self, rank: int, reason: str) -> None:
        listed = self.reasons.setdefault(rank, [])
        if reason not in listed:
            listed.append(reason)

    def listing(self, hosts: Sequence[str]) -> list[dict[str, Any]]:
        return [
            {
                "rank": r,
                "host": hosts[r] if r < len(hosts) else f"rank{r}",
                "reason": one_line("; ".join(self.reasons[r]), 2 * MAX_REASON),
            }
            for r in sorted(self.reasons)
        ]


def slow_links(
    rates: Mapping[int, float | None], n: int, name: Callable[[int], str], factor: float, bad: _Bad
) -> None:
    """The slow-link rule over ring rates `rates[r]` of link r -> (r+1) % n (see the module docstring)."""
    links = {r: rate for r, rate in rates.items() if rate is not None and rate >= 0 and 0 <= r < n}
    if n < 3 or len(links) < 3:
        return
    mid = statistics.median(links.values())
    slow = {r for r, rate in links.items() if rate < factor * mid}
    both = {node for node in range(n) if node in slow and (node - 1) % n in slow}
    for node in sorted(both):
        before, after = (node - 1) % n, (node + 1) % n
        bad.add(
            node,
            f"both ring links slow: {name(before)}->{name(node)} {mbps(links[before])} and "
            f"{name(node)}->{name(after)} {mbps(links[node])}, median {mbps(mid)}",
        )
    for r in sorted(slow):
        a, b = r, (r + 1) % n
        if a in both or b in both:
            continue
        reason = f"link {name(a)}->{name(b)}: {mbps(links[r])}, median {mbps(mid)}"
        bad.add(a, reason)
        bad.add(b, reason)


def clock_rule(offsets: Mapping[int, float], name: Callable[[int], str], bound: float, bad: _Bad) -> None:
    """The clock rule over `offsets` (seconds, relative to any one node)."""
    if len(offsets) < 2:
        return
    if len(offsets) == 2:
        (a, first), (b, second) = sorted(offsets.items())
        if abs(first - second) > bound:
            reason = (
                f"clocks of {name(a)} and {name(b)} differ by {abs(first - second):.1f} s (more than "
                f"{bound:g} s; with two clocks, which one is off cannot be told)"
            )
            bad.add(a, reason)
            bad.add(b, reason)
        return
    mid = statistics.median(offsets.values())
    for rank, offset in sorted(offsets.items()):
        distance = offset - mid
        if abs(distance) > bound:
            bad.add(
                rank,
                f"clock {abs(distance):.1f} s {'ahead of' if distance > 0 else 'behind'} the job's median",
            )


def _token_hint() -> str:
    return "is the job token the same on every node?"


def judge(
    report: Mapping[str, Any],
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    clock_bound: float = DEFAULT_CLOCK_BOUND,
) -> list[dict[str, Any]]:
    """The bad nodes in one node's view (its report, or the same figures): [{"rank", "host", "reason"}].
    Pure; the rules are the module docstring's."""
    view = _Report(report)
    name, bad = _Names(view.hosts, view.ports), _Bad()
    me, n = view.me, view.n
    if not 0 <= me < n:
        return [{"rank": me, "host": "?", "reason": "not a fitness report (no valid rank)"}]
    if not view.local_ok:
        bad.add(me, view.local_reason)
    for q in sorted(view.heard):
        if view.peer_verdict(q) != "ok":
            bad.add(q, view.peer_verdict(q))
    if view.stopped:  # cut short: what it did not see yet is no evidence
        return bad.listing(view.hosts)
    if n > 1:
        _reach_view(view, name, bad)
    rates = {q: view.peer_rate(q) for q in view.heard}
    rates[me] = view.ring_rate
    slow_links(rates, n, name, slow_factor, bad)
    clock_rule(view.offsets, name, clock_bound, bad)
    return bad.listing(view.hosts)


def _reach_view(view: _Report, name: _Names, bad: _Bad) -> None:
    me, n = view.me, view.n
    peers = [q for q in range(n) if q != me]
    mine = name.port(me, view.port)

    def first_error() -> str:
        return next((view.errors[q] for q in peers if view.errors.get(q)), "no answer")

    if not view.listening:  # nobody could deliver to us: only the peers we could not reach say anything
        for q in peers:
            if q not in view.reached:
                bad.add(
                    q,
                    f"does not accept connections on port {name.port(q)} from {name(me)} "
                    f"({view.errors.get(q) or 'no answer'})",
                )
        return
    if n >= 3 and not view.heard:
        if view.reached:
            bad.add(me, f"unreachable on port {mine} from every peer")
        elif all(q in view.token_rejected_by for q in peers):
            bad.add(me, f"every peer rejects this node's job token on port {mine} ({_token_hint()})")
        else:
            bad.add(me, f"unreachable on port {mine} from every peer and reached none ({first_error()})")
        return
    if n >= 3 and not view.reached:
        bad.add(me, f"reached no peer ({first_error()})")
        return
    for q in peers:
        if q in view.heard and q in view.reached:
            continue
        port = name.port(q)
        if q not in view.heard:
            if q in view.rejected_ranks or q in view.token_rejected_by:
                reason = f"wrong job token: its connections on port {port} do not verify ({_token_hint()})"
            elif q in view.reached:
                reason = (
                    f"accepted {name(me)}'s connection on port {port} but sent no HELLO within "
                    f"{secs(view.timeout)} s"
                )
            else:
                reason = (
                    f"no answer on port {port} within {secs(view.timeout)} s "
                    f"({view.errors.get(q) or 'no answer'}): did its fitness stage start?"
                )
        else:
            error = view.errors.get(q) or "no answer"
            reason = f"does not accept connections on port {port} from {name(me)} ({error})"
        bad.add(q, reason)


def judge_reports(
    reports: Sequence[Mapping[str, Any] | None],
    nnodes: int,
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    clock_bound: float = DEFAULT_CLOCK_BOUND,
) -> list[dict[str, Any]]:
    """The bad nodes over every node's report (None: a node that wrote none), as the batch step
    judges after the stage: [{"rank", "host", "reason"}]. Pure; the rules are the module docstring's."""
    views: list[_Report | None] = [
        _Report(r, nnodes) if isinstance(r, Mapping) else None for r in list(reports)[:nnodes]
    ]
    views += [None] * (nnodes - len(views))
    hosts, ports = [f"rank{r}" for r in range(nnodes)], [0] * nnodes
    for view in views:
        if view is not None:
            hosts = [view.hosts[r] if r < len(view.hosts) else hosts[r] for r in range(nnodes)]
            ports = [view.ports[r] if r < len(view.ports) else ports[r] for r in range(nnodes)]
            break
    name, bad = _Names(hosts, ports), _Bad()
    for r in range(nnodes):
        view = views[r]
        if view is not None and not view.local_ok:
            bad.add(r, view.local_reason)
        elif view is None or view.stopped:
            said = [v.peer_verdict(r) for v in views if v is not None and r in v.heard]
            failed = next((verdict for verdict in said if verdict != "ok"), "")
            if view is None:
                bad.add(
                    r,
                    "no fitness report (the stage did not finish on that node)"
                    + (f"; its HELLO said: {failed}" if failed else ""),
                )
            elif failed:
                bad.add(r, failed)
    # A stopped report votes on nothing below (what it had not seen yet is no evidence).
    views = [None if view is not None and view.stopped else view for view in views]
    present = [r for r in range(nnodes) if views[r] is not None]
    _reach_global(views, nnodes, present, name, bad)
    rates: dict[int, float | None] = {}
    for r in range(nnodes):
        view = views[r]
        rate = view.ring_rate if view is not None else None
        if rate is None:
            rate = next((v.peer_rate(r) for v in views if v is not None and v.peer_rate(r) is not None), None)
        rates[r] = rate
    slow_links(rates, nnodes, name, slow_factor, bad)
    _clock_global(views, nnodes, name, clock_bound, bad)
    return bad.listing(hosts)


def _reach_global(
    views: Sequence[_Report | None], n: int, present: Sequence[int], name: _Names, bad: _Bad
) -> None:
    def works(a: int, b: int) -> bool:  # a's connection to b got through (either side's record)
        va, vb = views[a], views[b]
        return (va is not None and b in va.reached) or (vb is not None and a in vb.heard)

    def token_failed(a: int, b: int) -> bool:
        va, vb = views[a], views[b]
        return (va is not None and b in va.token_rejected_by) or (vb is not None and a in vb.rejected_ranks)

    if n == 2 and len(present) == 2:
        if not works(0, 1) and not works(1, 0):
            token = token_failed(0, 1) or token_failed(1, 0)
            port = name.port(0) if name.port(0) == name.port(1) else f"{name.port(0)}/{name.port(1)}"
            what = "do not share the job token" if token else "cannot reach each other"
            for r in (0, 1):
                bad.add(r, f"{name(0)} and {name(1)} {what} on port {port}")
        elif not works(0, 1) or not works(1, 0):
            x = 1 if not works(0, 1) else 0
            bad.add(x, f"unreachable on port {name.port(x)} from every peer")
        return
    for x in present:
        voters = [y for y in present if y != x]
        failing = [y for y in voters if not works(y, x)]
        if not voters or 2 * len(failing) <= len(voters):
            continue
        if all(token_failed(y, x) for y in failing):
            reason = (
                f"wrong job token: {len(failing)} of {len(voters)} peers reject its connections "
                f"on port {name.port(x)}"
            )
        elif len(failing) == len(voters):
            reason = f"unreachable on port {name.port(x)} from every peer"
        else:
            names = ", ".join(name(y) for y in failing)
            reason = (
                f"unreachable on port {name.port(x)} from {len(failing)} of {len(voters)} peers ({names})"
            )
        bad.add(x, reason)


def _clock_global(views: Sequence[_Report | None], n: int, name: _Names, bound: float, bad: _Bad) -> None:
    if n == 2:
        for view in views:
            if view is not None and len(view.offsets) == 2:
                clock_rule(view.offsets, name, bound, bad)
                return
        return
    distances: dict[int, list[float]] = {}
    for view in views:
        if view is None or len(view.offsets) < 3:
            continue
        mid = statistics.median(view.offsets.values())
        for rank, offset in view.offsets.items():
            distances.setdefault(rank, []).append(offset - mid)
    for rank, found in sorted(distances.items()):
        distance = statistics.median(found)
        if abs(distance) > bound:
            bad.add(
                rank,
                f"clock {abs(distance):.1f} s {'ahead of' if distance > 0 else 'behind'} the job's median",
            )


# --------------------------------------------------------------------------------------------------
# The stage


class Options(NamedTuple):
    rank: int
    nnodes: int
    hosts: list[str]
    ports: list[int]
    job_id: str
    token: str
    timeout: float
    runtime: str
    runtime_timeout: float
    disks: list[tuple[str, int]]
    disk_reserve: int
    min_inodes: int
    disk_timeout: float
    gpus_needed: int
    gpu_mem_fraction: float
    gpu_timeout: float
    probe_bytes: int
    probe_seconds: float
    slow_factor: float
    clock_bound: float
    out: str
    docker_image: str = ""
    image_bytes: int = 0


def raise_nofile_limit(needed: int) -> None:
    """Raise the soft open-files limit towards the hard one when `needed` descriptors (two
    connections per peer) would not fit (as slurm_multi.barrier does for thousands of ranks)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        pass


def run_stage(opts: Options, env: Mapping[str, str]) -> dict[str, Any]:
    """Run the stage on this node; return its report (see the module docstring)."""
    started_at, t0 = time.time(), time.monotonic()
    deadline = t0 + opts.timeout
    hello_by = deadline - min(HELLO_MARGIN, HELLO_MARGIN_SHARE * opts.timeout)
    sel = selectors.DefaultSelector()
    wake_in, wake_out = socket.socketpair()
    wake_in.setblocking(False)
    wake_out.setblocking(False)
    sel.register(wake_in, selectors.EVENT_READ, None)

    def wake() -> None:
        try:
            wake_out.send(b"!")
        except OSError:
            pass

    # SIGTERM (scancel, a time limit, the task ending because a peer failed first): the report is
    # still written, marked stopped, with what was found so far.

    stopped: list[bool] = []

    def on_signal(_signum: int, _frame: Any) -> None:
        stopped.append(True)
        wake()

    previous = signal.signal(signal.SIGTERM, on_signal)
    children: list[Any] = []
    if opts.nnodes > 1:
        raise_nofile_limit(4 * opts.nnodes + 64)
    checks = _start_checks(opts, env, t0, hello_by, wake, children)
    mesh = None
    if opts.nnodes > 1:
        mesh = Mesh(
            sel,
            opts.rank,
            opts.hosts,
            opts.ports,
            opts.job_id,
            opts.token,
            opts.probe_bytes,
            opts.probe_seconds,
            hello_by,
            deadline,
        )
        mesh.listen()
    local: dict[str, Any] | None = None
    noted = False
    try:
        while True:
            now = time.monotonic()
            if stopped:
                break
            if mesh is not None:
                mesh.on_timers(now)
            if local is None and all(check.finished(now) for check in checks.values()):
                local = {name: check.value() for name, check in checks.items()}
                local["ok"], local["reason"] = local_verdict(
                    local["runtime"], local["disk"], local["gpus"], mesh.listen_error if mesh else ""
                )
            if mesh is not None and local is not None and mesh.hello is None and mesh.probe_done():
                ring_rate = mesh.ring["bytes_per_s"] if mesh.probe is not None else None
                mesh.set_hello(
                    Hello(
                        opts.rank,
                        opts.hosts[opts.rank],
                        0.0,
                        mesh.ring["to"] if mesh.probe else None,
                        ring_rate,
                        "ok" if local["ok"] else local["reason"],
                    ),
                    now,
                )
            if (local is not None and (mesh is None or mesh.done())) or now >= deadline:
                break
            if mesh is not None and not noted and now - t0 >= PROGRESS_AFTER:
                noted = True
                waiting = mesh.not_heard()
                if waiting:
                    names = ", ".join(f"{opts.hosts[q]} (rank {q})" for q in waiting[:20])
                    more = f" and {len(waiting) - 20} more" if len(waiting) > 20 else ""
                    talk(AREA, f"waiting for {names}{more}: no HELLO yet after {secs(now - t0)} s")
            wake_at = [deadline]
            if local is None:
                wake_at += [check.bound_at for check in checks.values() if not check.done.is_set()]
            if mesh is not None:
                wake_at.append(mesh.next_timer())
                if not noted:
                    wake_at.append(t0 + PROGRESS_AFTER)
            for key, mask in sel.select(max(0.0, min(wake_at) - time.monotonic())):
                if key.data is None:
                    try:
                        wake_in.recv(4096)
                    except OSError:
                        pass
                elif mesh is not None:
                    mesh.on_event(key, mask, time.monotonic())
    finally:
        signal.signal(signal.SIGTERM, previous)
        sel.unregister(wake_in)  # a check finishing late must not spin the last flush
        if mesh is not None:
            mesh.close(0.0 if stopped else 0.5)  # stopped: the task is ending, nothing is waited for
        sel.close()
        wake_in.close()
        wake_out.close()
        for proc in children:
            if proc.poll() is None:
                _kill(proc)
    if local is None:  # stopped, or the deadline came first (a --timeout shorter than a check's bound)
        local = {
            name: check.result if check.done.is_set() else None if stopped else check.value()
            for name, check in checks.items()
        }
        listen_error = mesh.listen_error if mesh else ""
        local["ok"], local["reason"] = local_verdict(
            local["runtime"] or {}, local["disk"] or [], local["gpus"] or {}, listen_error
        )
    network = (
        mesh.figures()
        if mesh is not None
        else {
            "port": opts.ports[opts.rank],
            "listening": False,
            "listen_error": "",
            "reached": [],
            "heard": [],
            "errors": {},
            "token_rejected_by": [],
            "rejected": [],
            "ring": None,
            "offsets": {str(opts.rank): 0.0},
            "peers": {},
        }
    )
    report: dict[str, Any] = {
        "version": VERSION,
        "rank": opts.rank,
        "host": opts.hosts[opts.rank],
        "nnodes": opts.nnodes,
        "job_id": opts.job_id,
        "hosts": opts.hosts,
        "ports": opts.ports,
        "started_at": round(started_at, 6),
        "seconds": 0.0,
        "timeout": opts.timeout,
        "ok": True,
        "reason": "",
        "stopped": "SIGTERM before the verdict" if stopped else "",
        "local": {"ok": local["ok"], "reason": local["reason"]},
        "thresholds": {"slow_factor": opts.slow_factor, "clock_bound": opts.clock_bound},
        "checks": {
            "runtime": local["runtime"],
            "disk": local["disk"],
            "gpus": local["gpus"],
            "network": network,
        },
        "bad": [],
    }
    report["bad"] = judge(report, opts.slow_factor, opts.clock_bound)
    report["ok"] = False if report["bad"] else None if stopped else True
    report["reason"] = next((b["reason"] for b in report["bad"] if b["rank"] == opts.rank), "")
    report["seconds"] = round(time.monotonic() - t0, 3)
    return report


def _start_checks(
    opts: Options,
    env: Mapping[str, str],
    t0: float,
    hello_by: float,
    wake: Callable[[], None],
    children: list[Any],
) -> dict[str, Pending]:
    def bound(seconds: float) -> float:
        return min(t0 + seconds + TOOL_GRACE, hello_by) if opts.nnodes > 1 else t0 + seconds + TOOL_GRACE

    def runtime_error(reason: str) -> dict:
        return _figures(opts.runtime, "failed", reason)

    def disk_error(reason: str) -> list[dict]:
        entries = [_disk_entry(path, need, opts.disk_reserve, opts.min_inodes) for path, need in opts.disks]
        for entry in entries:
            entry["reason"] = reason
        return entries

    def gpu_error(reason: str) -> dict:
        return _gpu_figures("failed", reason, None, opts.gpus_needed, opts.gpu_mem_fraction)

    return {
        "runtime": Pending(
            "runtime",
            lambda: check_runtime(opts.runtime, opts.runtime_timeout, env, children),
            bound(opts.runtime_timeout),
            lambda: runtime_timeout_figures(opts.runtime, opts.runtime_timeout),
            runtime_error,
            wake,
        ),
        "disk": Pending(
            "disk",
            lambda: check_disks(
                opts.disks + docker_disk(env, opts.docker_image, opts.image_bytes, opts.disk_timeout),
                opts.disk_reserve,
                opts.min_inodes,
            ),
            bound(opts.disk_timeout),
            lambda: disk_timeout_figures(opts.disks, opts.disk_reserve, opts.min_inodes, opts.disk_timeout),
            disk_error,
            wake,
        ),
        "gpus": Pending(
            "gpus",
            lambda: check_gpus(opts.gpus_needed, opts.gpu_mem_fraction, opts.gpu_timeout, env, children),
            bound(opts.gpu_timeout),
            lambda: gpu_timeout_figures(None, opts.gpus_needed, opts.gpu_mem_fraction, opts.gpu_timeout),
            gpu_error,
            wake,
        ),
    }


# --------------------------------------------------------------------------------------------------
# The command line


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


def read_reports(jobdir: str, nnodes: int) -> list[dict[str, Any] | None]:
    """DIR/node_<r>/fitness.json for every rank; None where it is missing or not a JSON object."""
    reports: list[dict[str, Any] | None] = []
    for rank in range(nnodes):
        try:
            with open(os.path.join(jobdir, f"node_{rank}", "fitness.json"), encoding="utf-8") as handle:
                found = json.loads(handle.read())
        except (OSError, ValueError, RecursionError):
            found = None
        reports.append(found if isinstance(found, dict) else None)
    return reports


def _node_dirs(jobdir: str) -> list[str]:
    try:
        names = os.listdir(jobdir)
    except OSError:
        return []
    return sorted((n for n in names if n.startswith("node_") and n[5:].isdecimal()), key=lambda n: int(n[5:]))


CMD_RECORD = "fitness-cmd.json"


def write_cmd_record(path: str, host: str, code: int, reason: str) -> None:
    """node_<rank>/fitness-cmd.json: how --fitness-cmd ended on that node (lib/node.sh writes it)."""
    write_json(path, {"host": host, "exit_code": code, "ok": code == 0, "reason": reason})


def read_cmd_records(jobdir: str, nodes: Sequence[str]) -> dict[int, tuple[bool, str]]:
    """Node index -> (ok, reason) of every fitness-cmd.json in the job's node dirs."""
    out: dict[int, tuple[bool, str]] = {}
    for name in _node_dirs(jobdir):
        try:
            with open(os.path.join(jobdir, name, CMD_RECORD), encoding="utf-8") as handle:
                found = json.loads(handle.read())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(found, dict) and found.get("host") in nodes:
            index = list(nodes).index(found["host"])
            ok = found.get("ok") is True
            if not ok or index not in out:
                out[index] = (ok, str(found.get("reason") or "fitness command failed"))
    return out


def judge_job(jobdir: str, nodes: Sequence[str], slow_factor: float = DEFAULT_SLOW_FACTOR,
              clock_bound: float = DEFAULT_CLOCK_BOUND) -> list[dict[str, Any]]:  # fmt: skip
    """The bad nodes of one attempt of a job, as the batch step and collect judge it: [{"rank" (the
    node's index), "host", "reason"}].

    `nodes` are the job's host names in node order. The fitness reports are found in every
    node_<rank>/ dir (with several tasks per node, the node's first task wrote one) and placed by
    the node index each holds. A node that wrote none because its prepare failed for a reason of its
    own (another node passed prepare: a dead docker engine is caught there first) is bad with that
    reason; when every node failed prepare alike (a bad manifest), no node is to blame. Without a
    single report (the stage did not run), only that prepare rule applies."""
    from slurm_multi.statusfile import read_status, status_path

    nnodes = len(nodes)
    reports: list[dict[str, Any] | None] = [None] * nnodes
    prepare: dict[int, tuple[bool, str]] = {}
    for name in _node_dirs(jobdir):
        node_dir = os.path.join(jobdir, name)
        try:
            with open(os.path.join(node_dir, "fitness.json"), encoding="utf-8") as handle:
                found = json.loads(handle.read())
        except (OSError, ValueError, RecursionError):
            found = None
        if isinstance(found, dict) and isinstance(found.get("rank"), int) and 0 <= found["rank"] < nnodes:
            reports[found["rank"]] = found
        status = read_status(status_path(node_dir))
        document = status.document if status is not None and isinstance(status.document, dict) else {}
        host, stages = document.get("node"), document.get("stages")
        stage = stages.get("prepare") if isinstance(stages, dict) else None
        if isinstance(host, str) and host in nodes and isinstance(stage, dict):
            index = list(nodes).index(host)
            ok = stage.get("status") == "ok"
            if not ok or index not in prepare:
                prepare[index] = (ok, str(document.get("reason") or "prepare failed"))
    passed = any(ok for ok, _ in prepare.values())
    own = {i: why for i, (ok, why) in prepare.items() if not ok and passed}
    # --fitness-cmd, the user's own check: the same rule (all failing alike blames the check).
    cmds = read_cmd_records(jobdir, nodes)
    if any(ok for ok, _ in cmds.values()):
        own.update({i: why for i, (ok, why) in cmds.items() if not ok and i not in own})
    if not any(reports):
        return [{"rank": i, "host": nodes[i], "reason": own[i]} for i in sorted(own)]
    found = judge_reports(reports, nnodes, slow_factor, clock_bound)
    out = []
    for entry in found:
        rank = entry.get("rank")
        if isinstance(rank, int) and rank in own and reports[rank] is None:
            entry = {**entry, "host": nodes[rank], "reason": own[rank]}
        out.append(entry)
    named = {e.get("rank") for e in out}
    out += [{"rank": i, "host": nodes[i], "reason": own[i]} for i in sorted(own) if i not in named]
    return sorted(out, key=lambda e: e.get("rank", 0))


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
