"""The fitness stage's GPU check: enough GPUs, and none held by another job.

amd-smi if on PATH, else nvidia-smi (as slurm_multi.gpus detects). NVIDIA:
`--query-gpu=index,uuid,memory.used,memory.total` and `--query-compute-apps=gpu_uuid,pid,used_memory`,
both `--format=csv,noheader,nounits`; AMD: `amd-smi metric --mem-usage --json` and
`amd-smi process --json`. The count >= --gpus-needed; no compute process on any GPU (the job has
started nothing yet: any process is another job's), and no GPU with more than --gpu-mem-fraction of
its memory in use. Each offender is listed (GPU, pid, MiB). No tool at all: `skipped` when K == 0, a
failure when K > 0; a tool that fails or hangs is a failure.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_multi.fitness.checks import ToolError, ToolTimeout, last_line, run_tools
from slurm_multi.fitness.protocol import MIB
from slurm_multi.logline import short
from slurm_multi.net import describe, secs

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


def gpu_figures(
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
            raise ToolError(f"nvidia-smi {query[0]} failed (exit {run.code}: {last_line(run)})")
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
            raise ToolError(f"amd-smi {' '.join(argv)} failed (exit {run.code}: {last_line(run)})")
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
            return gpu_figures("skipped", "", None, needed, fraction, count=0)
        return gpu_figures(
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
        return gpu_figures(
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
    return gpu_figures(
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
    return gpu_figures(
        "failed",
        f"{tool or 'the GPU tool'} did not answer within {secs(timeout)} s (is the GPU driver hung?)",
        tool,
        needed,
        fraction,
        seconds=timeout,
    )
