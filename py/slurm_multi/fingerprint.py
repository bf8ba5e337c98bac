"""An image's build fingerprint: what it would be built from (its dockerfile, the context's files, the
build args), 32 hex digits. rank 0 builds with it as a label (org.slurm-multi.fingerprint) and the
cache's sidecar records it, so a local image or a cached tar whose fingerprint differs was built from
something else under a reused tag, and is rebuilt.

The one owner of the rule: `node prepare` computes it into context.sh (IMAGE_FINGERPRINT), and
`slurm-multi node fingerprint` prints it where prepare did not (lib/image.sh
image::fingerprint). The digest is the one earlier versions took with coreutils, so the labels and
sidecars they wrote still match:

    sha256sum <DOCKERFILE
    cd CONTEXT && find . -type f ! -name '.*' -size -1048576c -print0 | LC_ALL=C sort -z |
      xargs -0 -r sha256sum
    cd CONTEXT && find . -type f ! -name '.*' -size +1048575c -printf '%p %s %T@\\n' | LC_ALL=C sort
    printf '%s\\n' BUILD_ARGS... | LC_ALL=C sort
    ... all of it | sha256sum | cut -c1-32

Small files count by content; big ones (model blobs, padding) by size and modification time, so a
warm start does not hash gigabytes. Hidden files (a name starting with '.') do not count; files in
hidden directories do, as find saw them. Symbolic links are not followed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence

BIG = 1 << 20  # bytes: from this size on a file counts by size and time, not content


def _sum_line(digest: str, name: bytes) -> bytes:
    """`sha256sum`'s line for a file: a name with a backslash, a newline or a CR is escaped, and the
    line then starts with a backslash (GNU coreutils 9)."""
    escaped = name.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    return (b"\\" if escaped != name else b"") + digest.encode() + b"  " + escaped + b"\n"


def _file_digest(path: bytes) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None  # sha256sum says so on stderr and leaves the file out
    return digest.hexdigest()


def _files(context: bytes) -> list[tuple[bytes, os.stat_result]]:
    """Every regular file under `context` as find prints it (`./a/b`), not following links."""
    found = []
    for top, dirs, names in os.walk(context, onerror=lambda _: None):
        rel = b"." + top[len(context) :]  # find's ./sub/dir
        for name in names:
            if name.startswith(b"."):
                continue
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found.append((rel + b"/" + name, info))
        dirs.sort()
    return found


def _mtime(info: os.stat_result) -> bytes:
    """find's %T@: seconds, a point, nine digits of nanoseconds and a trailing zero."""
    seconds, nanos = divmod(info.st_mtime_ns, 1_000_000_000)
    return f"{seconds}.{nanos:09d}0".encode()


def fingerprint(dockerfile: str, context: str, build_args: Sequence[str]) -> str:
    """The fingerprint; "" when there is no dockerfile (nothing to build from)."""
    if not dockerfile or not os.path.isfile(dockerfile):
        return ""
    own = _file_digest(os.fsencode(dockerfile))
    text = [_sum_line(own, b"-")] if own is not None else []
    where = os.fsencode(context or os.path.dirname(dockerfile) or ".")
    if os.path.isdir(where):
        files = _files(where.rstrip(b"/") or b"/")
        small = sorted(name for name, info in files if info.st_size < BIG)
        for name in small:
            digest = _file_digest(os.path.join(where, name[2:]))
            if digest is not None:
                text.append(_sum_line(digest, name))
        big = [name + b" " + str(info.st_size).encode() + b" " + _mtime(info) for name, info in files
               if info.st_size >= BIG]  # fmt: skip
        text += [line + b"\n" for line in sorted(b"\n".join(big).split(b"\n")) if big]
    args = b"\n".join(os.fsencode(arg) for arg in build_args).split(b"\n")
    text += [line + b"\n" for line in sorted(args)]
    return hashlib.sha256(b"".join(text)).hexdigest()[:32]
