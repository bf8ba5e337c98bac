"""Small pieces more than one results module uses: the area name, path and JSON reading that never
raise on what a node left behind, log excerpts safe for a terminal, and atomic writes."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO, Union

from slurm_multi.common import HelperError
from slurm_multi.logline import short  # noqa: F401 (results import it from here)

AREA = "results"
READ_BLOCK = 64 * 1024  # a read(n) allocates n bytes first: past ~128 KiB that is an mmap, ~15 us

PathLike = Union[str, "os.PathLike[str]"]


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


def read_json(path: PathLike) -> Any:
    """json.load of the file opened as UTF-8 text, without the text layer when it decodes cleanly."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # let the text layer raise (and word) it as it always did
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if "\r" in text:  # what reading in text mode (universal newlines) does to line ends
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return json.loads(text)


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
    """Write via a sibling temp file + fsync + os.replace, so a reader never sees half a file.

    text: written as UTF-8 (line ends as they are); bytes (a picture) as they are.
    mode: the permission bits to give the new file (e.g. those of the file it replaces); default
    0666 less the umask.
    durable: fsync before the rename; False for derived files any collect re-makes (the timeline),
    which still never appear half written.
    """
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")  # = secrets.token_hex
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise HelperError(f"{AREA}: cannot write {path}: {os_error(exc)}; {hint}") from None


def rank_label(node: str, rank: int) -> str:
    """How every summary line names a rank: `node2 (rank 1)`."""
    return f"{node} (rank {rank})"
