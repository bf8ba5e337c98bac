"""A node's own fault during the run: what makes a rank's failure or hang its node's, not its workload's.

A rank whose workload ended badly or hung is judged here, on its node, at that moment:

- the runtime: docker's engine does not answer `GET /_ping` within dockerapi.PING_TIMEOUT (it died
  or hung under the workload: `docker run` lost its engine, the output stopped flowing);
- the local disk: a small file cannot be written and synced in the rank's scratch dir within
  DISK_TIMEOUT (a disk that hangs), or the write fails with EIO or EROFS (a disk that failed, or
  was remounted read-only). A full disk (ENOSPC) is not the node's fault: the workload may have
  filled it itself, and a requeue would carry that to every node in turn;
- the clock (the hang watch only, which watches it from the run's start): the wall clock moved
  against the boot-time clock by more than CLOCK_BOUND (a step: a broken RTC, a time daemon gone
  wrong). The hang watch counts quiet seconds on the wall clock, so a forward step also looks
  like a hang.

A hang inside the workload with a healthy node is not a node fault (its rank fails the job; the
job is not requeued). The verdict is one line, `node_fault` in the rank's status.json (written by
`slurm-multi node status --node-fault`), which collect turns into a bad node
(slurm_multi.results.midrun); `slurm-multi node fault` prints it for the run stage (lib/node.sh).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

DISK_TIMEOUT = 3.0  # a healthy local disk writes and syncs a few bytes in well under this
CLOCK_BOUND = 2.0  # seconds: the fitness stage's bound between the nodes' clocks, here within one
DISK_FAULTS = (errno.EIO, errno.EROFS)
PROBE_NAME = ".sm-disk-probe"


def _boot_seconds() -> float:
    """Seconds since boot on a clock no time daemon steps (CLOCK_BOOTTIME; monotonic elsewhere)."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class ClockWatch:
    """The wall clock's offset against the boot-time clock, taken at the start: a step between then
    and a look is the node's clock failing during the run."""

    def __init__(self, wall: Any = time.time, boot: Any = _boot_seconds) -> None:
        self.wall, self.boot = wall, boot
        self.offset = wall() - boot()

    def fault(self, bound: float = CLOCK_BOUND) -> str:
        moved = (self.wall() - self.boot()) - self.offset
        if abs(moved) <= bound:
            return ""
        way = "forward" if moved > 0 else "back"
        return f"its clock jumped {abs(moved):.0f} s {way} during the run (more than {bound:g} s)"


def engine_fault(env: Mapping[str, str], node: str, timeout: float | None = None) -> str:
    """The docker engine's fault in one line, "" when it answers /_ping (or is not ours to ask: a
    tcp:// DOCKER_HOST)."""
    from slurm_multi import dockerapi

    path = dockerapi.socket_path(env)
    if path is None:
        return ""
    bound = dockerapi.PING_TIMEOUT if timeout is None else timeout
    try:
        reply = dockerapi.get(path, "/_ping", bound, limit=256)
    except dockerapi.EngineError as exc:
        what = exc.strerror or "no answer"
        if "timed out" in what or what == "TimeoutError":
            what = f"no answer within {bound:g} s"
        return f"the docker engine on {node} stopped answering during the run ({path}: {what})"
    if reply.status != 200:
        return f"the docker engine on {node} stopped answering during the run ({path}: {reply.line!r})"
    return ""


def disk_fault(directory: str, timeout: float = DISK_TIMEOUT) -> str:
    """The local disk's fault in one line, "" when a few bytes are written and synced in `directory`
    within `timeout` (or the directory is gone: a rank's scratch removed is no disk fault). The
    write runs in a thread: a disk that hangs holds that thread, never the caller."""
    if not directory or not os.path.isdir(directory):
        return ""
    path = os.path.join(directory, PROBE_NAME)
    outcome: dict[str, OSError | None] = {}

    def probe() -> None:
        try:
            with open(path, "wb") as handle:
                handle.write(b"slurm-multi\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.unlink(path)
            outcome["error"] = None
        except OSError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=probe, name="disk-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if "error" not in outcome:
        return f"its local disk hung during the run (a write in {directory} took over {timeout:g} s)"
    error = outcome["error"]
    if error is not None and error.errno in DISK_FAULTS:
        return f"its local disk failed during the run (writing in {directory}: {error.strerror})"
    return ""


def node_fault(
    env: Mapping[str, str], node: str, runtime: str, local_dir: str, clock: ClockWatch | None = None
) -> str:
    """This node's first fault (clock, runtime, local disk), "" when the node looks healthy."""
    if clock is not None:
        found = clock.fault()
        if found:
            return found
    if runtime == "docker":
        found = engine_fault(env, node)
        if found:
            return found
    return disk_fault(local_dir)


class NodeCheck:
    """The hang watch's check (`node hang-watch --local-dir`): made as the watch starts (the clock's
    reference), asked when the rank is found hung."""

    def __init__(self, node: str, runtime: str, local_dir: str, env: Mapping[str, str] | None = None) -> None:
        self.node, self.runtime, self.local_dir = node, runtime, local_dir
        self.env = os.environ if env is None else env
        self.clock = ClockWatch()

    def __call__(self) -> str:
        return node_fault(self.env, self.node, self.runtime, self.local_dir, self.clock)


def read_hang_fault(hang_json: str) -> str:
    """The node fault the hang watch named in its hang.json, "" when none (or no hang.json)."""
    from slurm_multi.readfile import read_json

    try:
        document = read_json(hang_json)
    except (OSError, ValueError, RecursionError):
        return ""
    found = document.get("node_fault") if isinstance(document, dict) else None
    return " ".join(found.split()) if isinstance(found, str) else ""
