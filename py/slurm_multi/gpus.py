"""GPU detection: tolerant amd-smi JSON parsing, nvidia-smi parsing, and the docker run GPU arguments.

amd-smi prints noise on stdout around its JSON: a `WARNING: User is missing the following required
groups` line before it, deprecation banners after it, a second copy of the block when concurrent SLURM
tasks share stdout, watch-mode preambles, or nothing at all. A preamble line may itself start with `[`.
So the JSON is found as if by trying `json.JSONDecoder.raw_decode` at every `[`/`{` until a block
decodes to a GPU list, never by counting lines; only the first such block counts (no double counting).
One linear pass finds where raw_decode would succeed first, so hostile output (a megabyte of `[`)
costs well under a second, not minutes; JSON nested deeper than MAX_NESTING counts as not decoding.

The docker arguments follow one rule: what the node detects wins. For a node's one-shot prepare
helper (no subprocess):

    docker_gpu_args(detected: dict[str, Any], vendor: str | None, docker_gpus: str | None,
                    node: str) -> list[str]

`detected` is a `detect_gpus()` document (`gpus detect --json`), `vendor` the manifest's gpu_vendor
(None: the detected vendor), `docker_gpus` the manifest's list ("0-7", "0,1,2", "0-3,6"; None or
"all": every detected GPU), `node` the name errors use. It returns the complete GPU part of the docker
argv (AMD: --device /dev/kfd, --device /dev/dri/renderD<N> per GPU, --group-add video; NVIDIA:
--gpus "device=0,1"; no GPUs detected and none asked for: []) or raises HelperError with exit code 2
and one line naming what was asked and what was detected: a listed GPU not detected, a vendor that is
not the detected one (also "none" on a node with GPUs), an AMD GPU whose render node is unknown. It
never returns fewer GPUs than were asked for.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from typing import Any

from slurm_multi.common import HelperError, talk, timeout_error, usage_error

AREA = "gpus"
VENDORS = {"amd": "AMD", "nvidia": "NVIDIA", "none": "none"}
TOOLS = {"AMD": "amd-smi", "NVIDIA": "nvidia-smi"}  # which tool detected each vendor
AMDSMI_LIST = ("amd-smi", "list", "-e", "--json")
NVIDIA_QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader")
AMDSMI_STATIC = ("amd-smi", "static", "--json")
AMDSMI_VERSION = ("amd-smi", "version", "--json")
NVIDIA_NAME = ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")
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


# Where raw_decode would succeed, found in one pass. Trying raw_decode at every `[`/`{` costs, per
# try, up to the distance to the first error (or the recursion limit): quadratic on hostile output
# (1 MB of `[` took 78 s). The pass below walks JSON structure itself, remembers every container it
# sees close (start -> end) or fail, and jumps over remembered ones, so each character is walked about
# once; raw_decode then runs only where it will succeed.
_START = re.compile(
    r"""\{(?=[ \t\n\r]*["}])                                    # an object opens with a key or closes
      | \[(?=[ \t\n\r]*(?:[\[\]"0-9tfnNI-]|\{[ \t\n\r]*["}]))   # an array opens with a value or closes
    """,
    re.VERBOSE,
)
_WHITESPACE = re.compile(r"[ \t\n\r]*")  # what the json module skips between tokens
_WHITESPACE_CHARS = (" ", "\t", "\n", "\r")
_BRACKET_RUN = re.compile(r"\[*")
MAX_NESTING = 32  # amd-smi nests ~5 deep; deeper JSON is noise (and raw_decode's recursion would fail)
# What the walk expects next; the order matters (`state <= _VALUE_OR_CLOSE`: a value may come).
_VALUE, _VALUE_OR_CLOSE, _KEY, _KEY_OR_CLOSE, _COLON, _NEXT_OR_CLOSE = range(6)
_MAY_CLOSE = (_VALUE_OR_CLOSE, _KEY_OR_CLOSE, _NEXT_OR_CLOSE)
_CLOSER = {"[": "]", "{": "}"}


def _walk_json(
    text: str, start: int, scan_once: Any, closed: dict[int, tuple[int, int]], failed: set[int]
) -> None:
    """Walk the JSON value at `start` as raw_decode would, without building it.

    Records each container that closes as closed[its start] = (end, height) and each one that cannot
    (syntax error, end of text, nested deeper than MAX_NESTING) in `failed`. Scalars and keys are
    read by the json module's own scanner, so "decodes" means exactly what raw_decode means.
    """
    stack: list[list[int]] = []  # open containers, outermost first: [start, height so far]
    pos, state = start, _VALUE
    while True:
        if text[pos : pos + 1] in _WHITESPACE_CHARS:
            pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr] - `*` always matches
        char = text[pos : pos + 1]  # "" at the end of the text
        if char in ("[", "{") and state <= _VALUE_OR_CLOSE:
            if pos in failed:
                break
            if pos in closed:  # walked before: jump over it
                pos, height = closed[pos]
                if not _give_up_too_deep(stack, height, failed):
                    return
                stack[-1][1] = max(stack[-1][1], height + 1)
                state = _NEXT_OR_CLOSE
                continue
            go_on = _fail_deep_bracket_run(text, pos, stack, failed) if char == "[" else pos
            if go_on != pos:
                pos = go_on
                continue
            stack.append([pos, 1])
            _give_up_too_deep(stack, 0, failed)
            pos, state = pos + 1, (_VALUE_OR_CLOSE if char == "[" else _KEY_OR_CLOSE)
        elif state == _NEXT_OR_CLOSE and char == ",":
            pos, state = pos + 1, (_VALUE if text[stack[-1][0]] == "[" else _KEY)
        elif char and char == _CLOSER[text[stack[-1][0]]] and state in _MAY_CLOSE:
            opened, height = stack.pop()
            closed[opened] = (pos + 1, height)
            if not stack:
                return
            stack[-1][1] = max(stack[-1][1], height + 1)
            pos, state = pos + 1, _NEXT_OR_CLOSE
        elif state == _COLON and char == ":":
            pos, state = pos + 1, _VALUE
        elif (state <= _VALUE_OR_CLOSE and char) or (state <= _KEY_OR_CLOSE and char == '"'):
            try:
                pos = scan_once(text, pos)[1]  # a string, number or literal, exactly as json reads it
            except (StopIteration, ValueError, RecursionError):
                break
            state = _COLON if state >= _KEY else _NEXT_OR_CLOSE
        else:
            break
    failed.update(opened for opened, _ in stack)


def _give_up_too_deep(stack: list[list[int]], inner_height: int, failed: set[int]) -> bool:
    """Fail the outermost open containers while they would nest deeper than MAX_NESTING.

    Returns whether any open container is left to walk on.
    """
    while stack and len(stack) + inner_height > MAX_NESTING:
        failed.add(stack.pop(0)[0])
    return bool(stack)


def _fail_deep_bracket_run(text: str, pos: int, stack: list[list[int]], failed: set[int]) -> int:
    """A run of more than MAX_NESTING `[` at `pos` (hostile or broken output): all that is open and
    all but the last MAX_NESTING of the run nest too deep. Fail them at once, not one by one, and
    return where the walk goes on (`pos` itself when there is no such run)."""
    if text[pos + MAX_NESTING : pos + MAX_NESTING + 1] != "[":
        return pos
    go_on = _BRACKET_RUN.match(text, pos).end() - MAX_NESTING  # type: ignore[union-attr]
    if go_on <= pos:
        return pos
    failed.update(opened for opened, _ in stack)
    failed.update(range(pos, go_on))
    stack.clear()
    return go_on


def decodable_blocks(text: str, scan_once: Any) -> list[tuple[int, int]]:
    """(start, end) of every `[`/`{` at which raw_decode succeeds, in text order (linear time)."""
    closed: dict[int, tuple[int, int]] = {}
    failed: set[int] = set()
    for match in _START.finditer(text):
        start = match.start()
        if start not in closed and start not in failed:
            _walk_json(text, start, scan_once, closed, failed)
    return sorted((start, end) for start, (end, _) in closed.items())


def find_gpu_list(text: str) -> list[dict[str, Any]] | None:
    """The first non-empty GPU list in noisy amd-smi output; else [] if an empty one was seen; else None.

    Same answer as trying raw_decode at every `[`/`{` in turn, but raw_decode runs only at the starts
    where it succeeds. A block that decodes but is not a GPU list is searched inside too, so noise that
    happens to wrap the real block into larger valid JSON (`[` before it, `]` after it) cannot hide it.
    An empty list counts only at top level, so an inner `"cpu_data": []` of some other document is not
    "no GPUs".
    """

    decoder = json.JSONDecoder()
    empty_seen = False
    top_level_from = 0  # positions before this lie inside a block that already decoded
    for start, end in decodable_blocks(text, decoder.scan_once):
        try:
            block, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):  # not expected: the walk reads JSON as raw_decode does
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
    import subprocess  # only where a GPU tool is there to run (the job plan and a CPU node: never)

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


def first_gpu_list(text: str, accept: Callable[[list[Any]], bool]) -> list[Any] | None:
    """The first decodable JSON list in noisy amd-smi output (a wrapped {"gpu_data": [...]} included)
    that `accept` takes, found in linear time; None when there is none."""

    decoder = json.JSONDecoder()
    for start, _ in decodable_blocks(text, decoder.scan_once):
        try:
            block, _ = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue
        if isinstance(block, dict):
            block = block.get("gpu_data")
        if isinstance(block, list) and accept(block):
            return block
    return None


def _first_entry_with(text: str, key: str) -> dict[str, Any] | None:
    """The first object with `key` in the first decodable JSON list of noisy amd-smi output."""
    found = first_gpu_list(text, lambda block: bool(block) and isinstance(block[0], dict) and key in block[0])
    return found[0] if found else None


def _known(value: Any) -> str | None:
    value = _unwrap(value)
    return (
        str(value).strip()
        if isinstance(value, (str, int, float)) and str(value).strip() not in _MISSING
        else None
    )


def detect_details(
    vendor: str, timeout_s: float = DETECT_TIMEOUT_S, path: str | None = None
) -> dict[str, str]:
    """What madengine's context calls MAD_SYSTEM_GPU_PRODUCT_NAME, _ARCHITECTURE and _HIP_VERSION, from
    the vendor's tool (GPU 0). A tool that fails or says nothing leaves its values out: these are
    information for the workload, never a reason to stop a job that has its GPUs."""
    details: dict[str, str] = {}
    tool = shutil.which(TOOLS.get(vendor, ""), path=path) if vendor in TOOLS else None
    if not tool:
        return details
    try:
        if vendor == "AMD":
            asic = (_first_entry_with(_run_tool(tool, AMDSMI_STATIC, timeout_s), "asic") or {}).get("asic")
            if isinstance(asic, dict):
                for name, field in (("MAD_SYSTEM_GPU_PRODUCT_NAME", "market_name"),
                                    ("MAD_SYSTEM_GPU_ARCHITECTURE", "target_graphics_version")):  # fmt: skip
                    if _known(asic.get(field)):
                        details[name] = _known(asic.get(field)) or ""
            entry = _first_entry_with(_run_tool(tool, AMDSMI_VERSION, timeout_s), "rocm_version") or {}
            version = _known(entry.get("rocm_version"))
            if version:
                details["MAD_SYSTEM_HIP_VERSION"] = ".".join(version.split(".")[:2])
        else:
            first = next(
                (
                    line.strip()
                    for line in _run_tool(tool, NVIDIA_NAME, timeout_s).splitlines()
                    if line.strip()
                ),
                "",
            )
            if first and first not in _MISSING and first != "[N/A]":
                # madengine's context names an NVIDIA GPU's architecture by its product name too.
                details["MAD_SYSTEM_GPU_PRODUCT_NAME"] = details["MAD_SYSTEM_GPU_ARCHITECTURE"] = first
    except HelperError as exc:
        talk(AREA, f"GPU details for MAD_SYSTEM_*: {exc}; going on without them")
    return details


# ---------------------------------------------------------------------------------------------
# docker run arguments


def normalise_vendor(vendor: str) -> str:
    key = vendor.strip().lower()
    if key not in VENDORS:
        raise usage_error(f"{AREA}: unknown GPU vendor {describe_input(vendor)!s}; use AMD, NVIDIA or none")
    return VENDORS[key]


def parse_docker_gpus(docker_gpus: str | None) -> list[int] | None:
    """madengine docker_gpus ("0-7", "0,1,2", "0-3,6", spaces allowed) -> indexes in the order given,
    repeats dropped; None (every detected GPU) for unset, "", "all" or "-1"."""
    text = (docker_gpus or "").strip()
    if text.lower() in ("", "all", "-1"):
        return None
    chosen: dict[int, None] = {}  # ordered set
    for token in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", token)
        if not match:
            raise usage_error(f"{AREA}: bad GPU list {describe_input(text)!s}; use e.g. 0,1,2 or 0-3 or all")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high - low > 4096:
            raise usage_error(f"{AREA}: bad GPU range {token.strip()} in {describe_input(text)!s}")
        chosen.update(dict.fromkeys(range(low, high + 1)))
    return list(chosen)


def format_indexes(indexes: list[int]) -> str:
    """[0, 1, 2, 3, 6, 7] -> "0-3,6,7" (sorted, repeats dropped)."""
    ranges: list[list[int]] = []
    for index in sorted(set(indexes)):
        if ranges and index == ranges[-1][1] + 1:
            ranges[-1][1] = index
        else:
            ranges.append([index, index])
    return ",".join(
        f"{low}-{high}" if high - low >= 2 else ",".join(str(i) for i in range(low, high + 1))
        for low, high in ranges
    )


def _gpus_word(indexes: list[int]) -> str:
    return f"GPU {indexes[0]}" if len(indexes) == 1 else f"GPUs {format_indexes(indexes)}"


def _node_has(vendor: str, indexes: list[int]) -> str:
    """What detection found, for an error: "AMD GPUs 0-3 (amd-smi)", "no GPUs (neither ... found)"."""
    if vendor == "none":
        return "no GPUs (neither amd-smi nor nvidia-smi found)"
    if not indexes:
        return f"no {vendor} GPUs ({TOOLS[vendor]} lists none)"
    return f"{vendor} GPUs {format_indexes(indexes)} ({TOOLS[vendor]})"


def _check_vendor(asked: str | None, found: str, indexes: list[int], node: str) -> None:
    """The manifest's gpu_vendor must be what the node detects: detection wins, a mismatch is an error."""
    if asked is not None and asked != found:
        fix = "run on nodes without GPUs" if asked == "none" else f"run on nodes with {asked} GPUs"
        raise usage_error(
            f"{AREA}: gpu_vendor {asked} was asked for but {node} has {_node_has(found, indexes)}; "
            f"what the node detects wins: fix gpu_vendor or {fix}"
        )
    if found != "none" and not indexes:
        raise usage_error(
            f"{AREA}: {node} has {_node_has(found, indexes)} to give the container; "
            f"check `{TOOLS[found]}` on {node} or run on nodes with {found} GPUs"
        )


def _check_asked_indexes(
    asked: list[int], docker_gpus: str, found: str, indexes: list[int], node: str
) -> None:
    """Every GPU docker_gpus names must be detected: never start the container with fewer."""
    missing = [index for index in asked if index not in indexes]
    if not missing:
        return
    verb = "was" if len(missing) == 1 else "were"
    has = f"only {format_indexes(indexes)} ({TOOLS[found]})" if indexes else _node_has(found, indexes)
    shown = " ".join(docker_gpus.split())
    raise usage_error(
        f"{AREA}: {_gpus_word(missing)} {verb} asked for (docker_gpus {shown}) but {node} has {has}; "
        "fix docker_gpus or run on nodes with those GPUs"
    )


def _amd_device_args(gpus: dict[int, dict[str, Any]], indexes: list[int], node: str) -> list[str]:
    renders = {index: gpus[index].get("render") for index in indexes}
    unknown = [
        i for i, render in renders.items() if not (isinstance(render, str) and _RENDER.fullmatch(render))
    ]
    if unknown:
        verb, them = (
            ("has an unknown render node", "it")
            if len(unknown) == 1
            else ("have unknown render nodes", "them")
        )
        raise usage_error(
            f"{AREA}: {_gpus_word(unknown)} on {node} {verb} (N/A or missing in amd-smi list -e) and docker "
            f"needs /dev/dri/renderD<N> for each GPU; check `amd-smi list -e` and the user's render/video "
            f"groups on {node}, or leave {them} out of docker_gpus"
        )
    args = ["--device", "/dev/kfd"]
    for index in indexes:
        args += ["--device", f"/dev/dri/{renders[index]}"]
    return args + ["--group-add", "video"]


def docker_gpu_args(
    detected: dict[str, Any],
    vendor: str | None,
    docker_gpus: str | None,
    node: str,
    n_gpus: int | None = None,
) -> list[str]:
    """The complete `docker run` GPU arguments for this node; see the module docstring. `n_gpus`
    (the manifest model's, above 0): the container gets the first n of them, as madengine gives
    (execution/container_runner.py get_gpu_arg); more than there are is an error naming both."""
    found = normalise_vendor(str(detected.get("vendor", "none")))
    gpus = {gpu["index"]: gpu for gpu in detected.get("gpus") or []}
    indexes = sorted(gpus)
    asked_vendor = normalise_vendor(vendor) if vendor and vendor.strip() else None
    _check_vendor(asked_vendor, found, indexes, node)
    asked = parse_docker_gpus(docker_gpus)
    if asked is not None:
        _check_asked_indexes(asked, docker_gpus or "", found, indexes, node)
        indexes = asked
    if found == "none":
        return []
    if n_gpus is not None and n_gpus > 0:
        if n_gpus > len(indexes):
            given = ", ".join(str(i) for i in indexes) or "none"
            raise usage_error(
                f"{AREA}: the model's n_gpus is {n_gpus} but {node} has {len(indexes)} GPU(s) for its "
                f"container ({given}); run it on nodes with {n_gpus} GPUs, or lower n_gpus"
            )
        indexes = indexes[:n_gpus]
    if found == "NVIDIA":
        # One argv element, double quotes included: docker's --gpus value is CSV, so the quotes keep
        # the commas inside a single `device=` field.
        return ["--gpus", '"device=' + ",".join(str(i) for i in indexes) + '"']
    return _amd_device_args(gpus, indexes, node)


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


def read_input(source: str) -> str:
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as handle:
                data = handle.read()
    except OSError as exc:
        raise usage_error(f"{AREA}: {source}: cannot read ({exc.strerror or exc})") from None
    return data.decode("utf-8", "replace")
