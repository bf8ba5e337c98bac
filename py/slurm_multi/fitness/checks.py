"""The fitness stage's local checks: the container runtime, free disk, and each check within its bound.

What each measures (they run at once, in threads, each within its own bound; the GPU check is
slurm_multi.fitness.gpucheck's):
- runtime: docker: GET /_ping on the engine's unix socket (DOCKER_HOST or /var/run/docker.sock;
  a tcp:// DOCKER_HOST is `skipped`) answers 200 within --runtime-timeout; an engine that accepts
  and never answers fails at the bound. pyxis: `enroot version` exits 0 within the bound. none:
  `skipped`.
- disk: statvfs of PATH (or, when PATH does not exist yet, its nearest existing parent): free bytes
  (f_bavail * f_frsize) >= the BYTES of every PATH on that filesystem + --disk-reserve, and free
  inodes (f_favail) >= --min-inodes; a filesystem reporting 0 inodes in all (some network
  filesystems) passes the inode check. With --docker-image, docker's data root (from the engine's
  /info) too: nothing needed there when the node holds the image, else --image-bytes.

A tool (enroot, nvidia-smi, amd-smi) runs in its own session with stdin closed, and is killed with
everything it started when its bound passes. The figures of each check are its part of the report
(slurm_multi.fitness.stage); `local_verdict` is the one-line reason a node's HELLO carries.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from slurm_multi import dockerapi
from slurm_multi.fitness.protocol import GIB, MIB, one_line
from slurm_multi.logline import short
from slurm_multi.net import describe, secs
from slurm_multi.secret_rule import reason_line

TOOL_GRACE = 0.2  # a check's thread gets this long past its own timeout to report it itself


def size(n: float) -> str:
    """Bytes in a message: `0.4 GiB`, `1 GiB`, `12.5 MiB`."""
    if n >= 0.1 * GIB or n == 0:
        gib = n / GIB
        return f"{gib:.0f} GiB" if abs(gib - round(gib)) < 0.005 else f"{gib:.1f} GiB"
    return f"{n / MIB:.1f} MiB"


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


def kill_tool(proc: Any) -> None:
    """Kill a tool and whatever it started (its session), and reap it."""
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
                kill_tool(proc)
        raise ToolTimeout from None
    return results


def last_line(result: ToolResult) -> str:
    """A tool's last line of output for a reason: masked before it is cut (secret_rule.reason_line)."""
    lines = result.stderr.strip().splitlines() or result.stdout.strip().splitlines() or ["no output"]
    return reason_line(lines[-1], 120)


# --------------------------------------------------------------------------------------------------
# Local check: the container runtime


def runtime_figures(kind: str, status: str, reason: str = "", detail: str = "", seconds: float = 0.0) -> dict:
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
        return runtime_figures("none", "skipped", detail="--runtime none: no container runtime")
    if kind == "docker":
        status, reason, detail = _docker_ping(env, timeout)
    else:
        status, reason, detail = _enroot_version(env, timeout, children)
    return runtime_figures(kind, status, reason, detail, time.monotonic() - started)


def runtime_timeout_figures(kind: str, timeout: float) -> dict:
    """What the runtime check says when its thread did not report within the bound."""
    reason = (
        _ping_timeout_reason(timeout)
        if kind == "docker"
        else f"enroot version did not finish within {secs(timeout)} s"
    )
    return runtime_figures(kind, "failed", reason, seconds=timeout)


def _docker_ping(env: Mapping[str, str], timeout: float) -> tuple[str, str, str]:
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
        return "failed", f"enroot version failed (exit {result.code}: {last_line(result)})", ""
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


def disk_entry(path: str, need: int, reserve: int, min_inodes: int) -> dict:
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
        entry = disk_entry(path, need, reserve, min_inodes)
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
        entry = disk_entry(path, need, reserve, min_inodes)
        entry["reason"] = (
            f"{path}: its filesystem did not answer within {secs(timeout)} s (a hung network filesystem?)"
        )
        entries.append(entry)
    return entries


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
