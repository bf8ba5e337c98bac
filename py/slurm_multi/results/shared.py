"""Small pieces more than one results module uses: the area name, path and JSON reading that never
raise on what a node left behind, log excerpts safe for a terminal, and atomic writes."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from slurm_multi import shell
from slurm_multi.common import HelperError
from slurm_multi.logline import short  # noqa: F401 (results import it from here)
from slurm_multi.readfile import PathLike, read_bytes, read_json  # noqa: F401 (results import them from here)

AREA = "results"
READ_BLOCK = 64 * 1024  # a read(n) allocates n bytes first: past ~128 KiB that is an mmap, ~15 us


def read_at_most(handle: BinaryIO, size: int, block: int = READ_BLOCK) -> bytes:
    """handle.read(size) without allocating `size` bytes up front (64 MiB per small CSV costs more
    than reading it): the same bytes, read in blocks."""
    blocks: list[bytes] = []
    left = size
    while left > 0:
        data = handle.read(min(left, block))
        if not data:
            break
        blocks.append(data)
        left -= len(data)
    return blocks[0] if len(blocks) == 1 else b"".join(blocks)


def is_path(path: PathLike, kind: str) -> bool:
    """Path.is_dir/is_file/exists ("dir", "file", "any") that answer False instead of raising
    (e.g. on EACCES).

    One os.stat (following links, as those do), without building Path objects: collect calls this
    a few times per node.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL in the name, which Path answers False for too
        return False
    return stat.S_ISDIR(mode) if kind == "dir" else stat.S_ISREG(mode) if kind == "file" else True


def _item_encoder() -> Callable[[Any], str]:
    """json.dumps(value, separators=(",", ":"), ensure_ascii=False) as one reusable C encoder:
    json.dumps makes a new one per call (~5 us: a 1,000-node document is 1,000 calls)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    fallback = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    if make is None:  # an interpreter without the _json accelerator
        return fallback
    try:
        # The arguments JSONEncoder.iterencode passes (3.8-3.13); no markers: our documents are trees.
        chunks = make(None, fallback.__self__.default, json.encoder.encode_basestring, None,
                      ":", ",", False, False, True)  # fmt: skip
        if "".join(chunks({"a": [1.5, None]}, 0)) != '{"a":[1.5,null]}':
            return fallback
    except TypeError:  # another signature
        return fallback
    return lambda value: "".join(chunks(value, 0))


encode_item = _item_encoder()


def document_text(document: dict[str, Any]) -> str:
    """How summary.json and timeline.json are laid out: one top-level key per line, and a list
    (nodes, candidates, reasons, ...) one item per line, each item compact. Readable with `grep`
    and a pager, and C-speed json throughout (an indented dump is pure Python before 3.14, ~10 ms
    for a 1,000-node summary)."""
    quote = json.encoder.encode_basestring
    fields = []
    for key, value in document.items():
        if isinstance(value, (list, tuple)) and value:
            rows = ",\n".join(["    " + encode_item(item) for item in value])
            fields.append(f"  {quote(key)}: [\n{rows}\n  ]")
        else:
            fields.append(f"  {quote(key)}: {encode_item(value)}")
    return "{\n" + ",\n".join(fields) + "\n}\n" if fields else "{}\n"


def utc_iso(epoch: float | None) -> str | None:
    """`2025-11-30T11:43:20Z` (as job.json's `started`), or None without a time."""
    return None if epoch is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def json_error(exc: Exception) -> str:
    """The first line of what went wrong reading a JSON file, for a one-line message."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def os_error(exc: OSError) -> str:
    return exc.strerror or str(exc)


def write_atomic(
    path: Path,
    text: str | bytes,
    hint: str = "is the job directory writable?",
    mode: int | None = None,
    durable: bool = True,
) -> None:
    """slurm_multi.shell.write_atomic (the one atomic writer), its failure one HelperError naming the
    file and `hint`. mode: default 0666 less the umask (a results file is the user's); durable:
    False for derived files any collect re-makes (the timeline), which still never appear half
    written."""
    try:
        shell.write_atomic(path, text, mode, durable)
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot write {path}: {os_error(exc)}; {hint}") from None


def rank_label(node: str, rank: int) -> str:
    """How every summary line names a rank: `node2 (rank 1)`."""
    return f"{node} (rank {rank})"
