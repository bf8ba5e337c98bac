"""Reading the small files a node leaves behind (status.json, node.log, the results CSV, events.log,
progress.json, hang.json), the one way every reader does it.

`read_bytes` is `open(path, "rb").read()` with a size limit, in os.open/os.read/os.close: no
buffered file object per file (collect reads three or more files per node of a 1,000-node job, and
that object costs as much as the read) and no `limit`-sized allocation up front (a read(n)
allocates n bytes first). The errors are those of open(): FileNotFoundError when the file is not
there, IsADirectoryError for a directory (os.read raises it), PermissionError, ... . Opened
O_NONBLOCK, which a regular file ignores: a FIFO left under one of those names reads as empty
instead of hanging the reader.

`finite` is a number read from such a document as a float, when it is one: never a bool, a string,
nan or inf, nor an integer of hundreds of digits (float() of it raises OverflowError).

`read_json` is json.load of the file opened as UTF-8 text, with the same outcome: a file that is
not UTF-8 is read again through the text layer so that the error is worded as before, and line ends
are translated as universal newlines translate them.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Union

PathLike = Union[str, "os.PathLike[str]"]


BLOCK = 64 * 1024  # past ~128 KiB a read's buffer is an mmap (~15 us): small reads, joined


def read_bytes(path: PathLike, limit: int = 1 << 62) -> bytes:
    """The file's first `limit` bytes (all of it when shorter)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        data = os.read(fd, min(limit, BLOCK))
        if len(data) < BLOCK or len(data) >= limit:  # short read: the end (a regular file's)
            return data
        blocks = [data]
        left = limit - len(data)
        while left > 0:
            data = os.read(fd, min(left, BLOCK))
            if not data:
                break
            blocks.append(data)
            left -= len(data)
        return b"".join(blocks)
    finally:
        os.close(fd)


def read_json(path: PathLike) -> Any:
    """The JSON document in the file; OSError, ValueError (not JSON) or RecursionError otherwise."""
    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # let the text layer raise (and word) it, as json.load of it does
        with open(path, encoding="utf-8") as handle:
            return json.loads(handle.read())
    if "\r" in text:  # what reading in text mode (universal newlines) does to line ends
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return json.loads(text)


def finite(value: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (bools, strings, inf, nan, an integer
    too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
