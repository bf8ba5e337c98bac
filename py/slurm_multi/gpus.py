"""GPU detection: tolerant amd-smi JSON parsing, nvidia-smi parsing, and the docker run GPU arguments.

amd-smi prints noise on stdout around its JSON: a `WARNING: User is missing the following required
groups` line before it, deprecation banners after it, a second copy of the block when concurrent SLURM
tasks share stdout, watch-mode preambles, or nothing at all. A preamble line may itself start with `[`.
So the JSON is found by trying `json.JSONDecoder.raw_decode` at every `[`/`{` until a block decodes
to a GPU list, never by counting lines; only the first such block counts (no double counting).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import click

from slurm_multi.common import HelperError, timeout_error, usage_error

AREA = "gpus"
VENDORS = {"amd": "AMD", "nvidia": "NVIDIA", "none": "none"}
AMDSMI_LIST = ("amd-smi", "list", "-e", "--json")
NVIDIA_QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader")
DETECT_TIMEOUT_S = 20.0
_RENDER = re.compile(r"renderD[0-9]+")
_MISSING = ("N/A", "n/a", "NA", "")


# ---------------------------------------------------------------------------------------------
# amd-smi output


def _unwrap(value: Any) -> Any:
    """`{"value": 5, "unit": "W"}` -> 5; "N/A" -> None."""
    if isinstance(value, dict) and "value" in value:
        value = value["value"]
    if isinstance(value, str) and value.strip() in _MISSING:
        return None
    return value


def _gpu_index(entry: Any) -> int | None:
    if not isinstance(entry, dict) or "gpu" not in entry:
        return None
    index = _unwrap(entry["gpu"])
    if isinstance(index, bool):
        return None
    if isinstance(index, int):
        return index if index >= 0 else None
    if isinstance(index, str) and index.strip().isdigit() and index.strip().isascii():
        return int(index.strip())
    return None


def _text_field(entry: dict[str, Any], *paths: tuple[str, ...]) -> str | None:
    """The first non-missing string at one of the key paths (e.g. ("bdf",), ("bus", "bdf"))."""
    for path in paths:
        value: Any = entry
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        value = _unwrap(value)
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    return None


def normalise_gpu(entry: dict[str, Any]) -> dict[str, Any]:
    """One amd-smi GPU object -> {"index", "bdf", "render", "uuid"} (unknown values -> None)."""
    render = _text_field(entry, ("render",))
    return {
        "index": _gpu_index(entry),
        "bdf": _text_field(entry, ("bdf",), ("bus", "bdf"), ("asic", "bdf")),
        "render": render if render is not None and _RENDER.fullmatch(render) else None,
        "uuid": _text_field(entry, ("uuid",), ("asic", "uuid"), ("hip_uuid",)),
    }


def gpu_list_of(block: Any) -> list[dict[str, Any]] | None:
    """The GPUs in a decoded JSON block, or None when the block is not a GPU list.

    A list of objects that all carry a `gpu` index, or such a list under `gpu_data` (newer amd-smi).
    An empty list is a GPU list with no GPUs.
    """
    if isinstance(block, dict) and "gpu_data" in block:
        block = block["gpu_data"]
    if not isinstance(block, list):
        return None
    if any(_gpu_index(entry) is None for entry in block):
        return None
    gpus: dict[int, dict[str, Any]] = {}
    for entry in block:
        gpu = normalise_gpu(entry)
        gpus.setdefault(gpu["index"], gpu)  # a repeated index inside one block: the first wins
    return [gpus[index] for index in sorted(gpus)]


def find_gpu_list(text: str) -> list[dict[str, Any]] | None:
    """The first non-empty GPU list in noisy amd-smi output; else [] if an empty one was seen; else None.

    A block that decodes but is not a GPU list is searched inside too, so noise that happens to wrap
    the real block into larger valid JSON (`[` before it, `]` after it) cannot hide it. An empty list
    counts only at top level, so an inner `"cpu_data": []` of some other document is not "no GPUs".
    """
    decoder = json.JSONDecoder()
    empty_seen = False
    top_level_from = 0  # positions before this lie inside a block that already decoded
    pos = 0
    while True:
        starts = [i for i in (text.find("[", pos), text.find("{", pos)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        pos = start + 1
        try:
            block, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        gpus = gpu_list_of(block)
        if gpus:
            return gpus
        if gpus is not None and start >= top_level_from:
            empty_seen = True
        top_level_from = max(top_level_from, end)
    return [] if empty_seen else None


def describe_input(text: str) -> str:
    """The first 60 characters of the input for an error message, control characters escaped."""
    if not text.strip():
        return "empty input"
    head = text.strip()[:60]
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in head)


def parse_amdsmi(text: str) -> dict[str, Any]:
    """Noisy `amd-smi list -e --json` (or static/metric --json) output -> the detected GPUs document."""
    gpus = find_gpu_list(text)
    if gpus is None:
        raise HelperError(f"{AREA}: no GPU list in amd-smi output ({describe_input(text)})")
    return {"vendor": "AMD", "count": len(gpus), "gpus": gpus}


# ---------------------------------------------------------------------------------------------
# nvidia-smi output


def parse_nvidia_smi(text: str) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader` -> the GPUs document."""
    gpus: list[dict[str, Any]] = []
    seen: set[int] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3 or not (fields[0].isascii() and fields[0].isdigit()):
            raise HelperError(
                f"{AREA}: unexpected nvidia-smi line ({describe_input(line)}); expected 'index, bus id, uuid'"
            )
        index = int(fields[0])
        if index in seen:
            continue
        seen.add(index)
        bdf, uuid = (None if value in _MISSING or value == "[N/A]" else value for value in fields[1:])
        gpus.append({"index": index, "bdf": bdf, "render": None, "uuid": uuid})
    gpus.sort(key=lambda gpu: gpu["index"])
    return {"vendor": "NVIDIA", "count": len(gpus), "gpus": gpus}


# ---------------------------------------------------------------------------------------------
# Detection


def _run_tool(executable: str, argv: tuple[str, ...], timeout_s: float) -> str:
    shown = " ".join(argv)
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [executable, *argv[1:]],
            capture_output=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise timeout_error(
            f"{AREA}: {shown} did not finish within {timeout_s:g} s; is the GPU driver hung?"
        ) from None
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot run {shown} ({exc.strerror or exc})") from None
    stdout = done.stdout.decode("utf-8", "replace")
    if done.returncode != 0:
        stderr_lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
        last = (stderr_lines or stdout.strip().splitlines() or ["no output"])[-1]
        raise HelperError(f"{AREA}: {shown} failed (exit {done.returncode}: {describe_input(last)})")
    return stdout


def detect_gpus(timeout_s: float = DETECT_TIMEOUT_S, path: str | None = None) -> dict[str, Any]:
    """amd-smi if on PATH, else nvidia-smi, else vendor "none" with no GPUs."""
    amdsmi = shutil.which("amd-smi", path=path)
    if amdsmi:
        return parse_amdsmi(_run_tool(amdsmi, AMDSMI_LIST, timeout_s))
    nvidia_smi = shutil.which("nvidia-smi", path=path)
    if nvidia_smi:
        return parse_nvidia_smi(_run_tool(nvidia_smi, NVIDIA_QUERY, timeout_s))
    return {"vendor": "none", "count": 0, "gpus": []}


# ---------------------------------------------------------------------------------------------
# docker run arguments


def normalise_vendor(vendor: str) -> str:
    key = vendor.strip().lower()
    if key not in VENDORS:
        raise usage_error(f"{AREA}: unknown GPU vendor {describe_input(vendor)!s}; use AMD, NVIDIA or none")
    return VENDORS[key]


def select_indexes(docker_gpus: str | None, available: list[int]) -> list[int]:
    """madengine docker_gpus ("0,1,2", "0-3", "all", "-1", empty = all) -> GPU indexes, in order given."""
    text = (docker_gpus or "").strip()
    if text.lower() in ("", "all", "-1"):
        return list(available)
    chosen: list[int] = []
    for token in (part.strip() for part in text.split(",")):
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", token)
        if not match:
            raise usage_error(f"{AREA}: bad GPU list {describe_input(text)!s}; use e.g. 0,1,2 or 0-3 or all")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high - low > 4096:
            raise usage_error(f"{AREA}: bad GPU range {token} in {describe_input(text)!s}")
        for index in range(low, high + 1):
            if index not in available:
                shown = ",".join(str(i) for i in available) or "none"
                raise HelperError(f"{AREA}: GPU {index} was asked for but not detected (detected: {shown})")
            if index not in chosen:
                chosen.append(index)
    return chosen


def docker_gpu_args(detected: dict[str, Any], vendor: str | None, docker_gpus: str | None) -> list[str]:
    """The `docker run` arguments that give the container the selected GPUs."""
    found = normalise_vendor(str(detected.get("vendor", "none")))
    wanted = normalise_vendor(vendor) if vendor else found
    if wanted == "none":
        return []
    if found != wanted:
        raise HelperError(f"{AREA}: {wanted} GPUs were asked for but {found} was detected on this node")
    gpus = {gpu["index"]: gpu for gpu in detected["gpus"]}
    indexes = select_indexes(docker_gpus, sorted(gpus))
    if not indexes:
        raise HelperError(f"{AREA}: no {wanted} GPUs detected on this node")
    if wanted == "NVIDIA":
        # One argv element, double quotes included: docker's --gpus value is CSV, so the quotes keep
        # the commas inside a single `device=` field.
        return ["--gpus", '"device=' + ",".join(str(i) for i in indexes) + '"']
    args = ["--device", "/dev/kfd"]
    for index in indexes:
        render = gpus[index].get("render")
        if not isinstance(render, str) or not _RENDER.fullmatch(render):
            raise HelperError(
                f"{AREA}: GPU {index} has no render node in the amd-smi output; "
                "check `amd-smi list -e` and the user's render/video groups"
            )
        args += ["--device", f"/dev/dri/{render}"]
    return args + ["--group-add", "video"]


def load_detected(text: str, source: str) -> dict[str, Any]:
    """A `gpus detect --json` / `gpus parse` document, or raw amd-smi output, from --detected."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict) and "vendor" in document and "gpus" in document:
        gpus = document["gpus"]
        if not isinstance(gpus, list) or not all(
            isinstance(gpu, dict)
            and isinstance(gpu.get("index"), int)
            and not isinstance(gpu.get("index"), bool)
            for gpu in gpus
        ):
            raise usage_error(f"{AREA}: {source}: 'gpus' must be a list of objects with an integer 'index'")
        if not isinstance(document["vendor"], str):
            raise usage_error(f"{AREA}: {source}: 'vendor' must be a string")
        return {"vendor": normalise_vendor(document["vendor"]), "count": len(gpus), "gpus": gpus}
    return parse_amdsmi(text)


def _read_input(source: str) -> str:
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as handle:
                data = handle.read()
    except OSError as exc:
        raise usage_error(f"{AREA}: {source}: cannot read ({exc.strerror or exc})") from None
    return data.decode("utf-8", "replace")


def _print_json(document: dict[str, Any]) -> None:
    click.echo(json.dumps(document))


@click.group("gpus", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Detect GPUs and parse amd-smi / nvidia-smi output."""


@cli.command("parse")
@click.argument("source", metavar="[FILE|-]", default="-")
def parse_command(source: str) -> None:
    """Parse `amd-smi list -e --json` output (noise tolerated) from FILE or stdin; print JSON.

    Example: amd-smi list -e --json 2>&1 | slurm-multi gpus parse
    """
    _print_json(parse_amdsmi(_read_input(source)))


@cli.command("detect")
@click.option("--json", "as_json", is_flag=True, help="Print the full JSON document.")
def detect_command(as_json: bool) -> None:
    """Detect this node's GPUs with amd-smi, else nvidia-smi, else report none.

    Without --json prints SM_GPU_VENDOR=…, SM_GPU_COUNT=…, SM_GPU_INDEXES=… (one per line).

    Example: slurm-multi gpus detect --json > gpus.json
    """
    detected = detect_gpus(path=os.environ.get("PATH"))
    if as_json:
        _print_json(detected)
        return
    indexes = ",".join(str(gpu["index"]) for gpu in detected["gpus"])
    click.echo(
        f"SM_GPU_VENDOR={detected['vendor']}\nSM_GPU_COUNT={detected['count']}\nSM_GPU_INDEXES={indexes}"
    )


@cli.command("docker-args")
@click.option(
    "--detected",
    "detected_source",
    metavar="FILE|-",
    help="`gpus detect --json` output (default: detect now).",
)
@click.option("--vendor", metavar="V", help="AMD, NVIDIA or none (default: the detected vendor).")
@click.option(
    "--docker-gpus", "docker_gpus", metavar="LIST", help="GPU indexes: 0,1,2 / 0-3 / all / -1 (default all)."
)
@click.option("-0", "null_terminated", is_flag=True, help="End each argument with NUL instead of a newline.")
def docker_args_command(
    detected_source: str | None, vendor: str | None, docker_gpus: str | None, null_terminated: bool
) -> None:
    """Print the docker run GPU arguments, one per line.

    AMD: --device /dev/kfd, --device /dev/dri/renderD<N> per GPU, --group-add video.
    NVIDIA: --gpus "device=0,1". none: nothing.

    Example: mapfile -t gpu_args < <(slurm-multi gpus docker-args --docker-gpus "$SM_DOCKER_GPUS")
    """
    if vendor is not None and normalise_vendor(vendor) == "none":
        return
    if detected_source is not None:
        detected = load_detected(_read_input(detected_source), detected_source)
    else:
        detected = detect_gpus(path=os.environ.get("PATH"))
    args = docker_gpu_args(detected, vendor, docker_gpus)
    terminator = "\0" if null_terminated else "\n"
    click.echo("".join(arg + terminator for arg in args), nl=False)
