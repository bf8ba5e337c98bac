"""Bash that a helper writes for a caller to `source`: every value one quoted shell word.

The seam rule (STYLE.md): a helper writes this into a FILE, exits 0, and only then does bash source
the file. A helper that failed leaves no file behind to source, so a failure can never look like an
empty, successful context.
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import stat
import tempfile
from collections.abc import Iterable, Mapping


def _check_name(name: str) -> str:
    if not (name.isascii() and name.isidentifier()):  # [A-Za-z_][A-Za-z0-9_]*
        raise ValueError(f"not a shell variable name: {name!r}")
    return name


def scalar(name: str, value: str, export: bool = False) -> str:
    """`declare -g[x] NAME=VALUE` (global, so sourcing inside a function still sets it)."""
    return f"declare -g{'x' if export else ''} {_check_name(name)}={shlex.quote(value)}"


def array(name: str, values: Iterable[str]) -> str:
    """`declare -ga NAME=(…)`."""
    words = " ".join(shlex.quote(value) for value in values)
    return f"declare -ga {_check_name(name)}=({words})"


def render(
    header: str,
    scalars: Mapping[str, str] = {},  # noqa: B006 - read only
    arrays: Mapping[str, Iterable[str]] = {},  # noqa: B006 - read only
    exports: Mapping[str, str] = {},  # noqa: B006 - read only
) -> str:
    lines = [f"# {header}"]
    lines += [scalar(name, value, export=True) for name, value in exports.items()]
    lines += [scalar(name, value) for name, value in scalars.items()]
    lines += [array(name, values) for name, values in arrays.items()]
    return "\n".join(lines) + "\n"


def write_atomic(
    path: str | os.PathLike[str],
    text: str | bytes,
    mode: int | None = 0o644,
    durable: bool = False,
    through: bool = True,
) -> None:
    """Write `text` to `path` atomically: a sibling temp file, then a rename. A reader sees the old
    file or the new one. The temp file is tempfile.mkstemp's (O_CREAT|O_EXCL|O_NOFOLLOW, a random
    name, 0600 while written): a name another user planted, or a symlink, can never redirect the
    write. The one atomic writer of the
    project (results.shared.write_atomic words its errors for collect).

    text: UTF-8 (surrogates written back as the bytes they stand for); bytes as they are.
    mode: the new file's permission bits, whatever the umask; None: 0666 less the umask.
    durable: fsync the file before the rename and its directory after it (a verdict, the node
    quarantine: a crash leaves the old whole file or the new one, and a rename that returned stays
    done; a derived file need not pay for it). A directory that refuses fsync is let be.

    A path that is there and is neither a regular file nor a directory (`/dev/null`, `/dev/stdout`,
    a FIFO) is written through, as a shell's `>` writes it: a rename would replace the device or
    the pipe with a regular file (and `/dev/null` with one only root can open). Not with `through`
    False (a file of secrets, whose mode is the point): such a path is then an error (OSError).
    Another user's symlink is never followed there: it is replaced, as any file is.
    """
    path = os.fspath(path)
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    if _is_stream(path):
        if not through:
            raise OSError(errno.EINVAL, "a pipe or a device, not a file: not written there", path)
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        return
    directory = os.path.dirname(path) or "."
    # mkstemp: O_CREAT|O_EXCL|O_NOFOLLOW, a random name, 0600 while written.
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    if mode is None:
        mode = 0o666 & ~_umask()
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)  # whatever the umask
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    """The rename itself on disk: fsync the directory that holds the new name."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename is done either way
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask sets it: not safe beside threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _is_stream(path: str) -> bool:
    """There, and neither a regular file nor a directory (what it names, through a symlink of root's
    or the caller's own: /dev/stdout is one; another user's could be planted)."""
    try:
        link = os.lstat(path)
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, os.getuid()):
            return False
        kind = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not stat.S_ISREG(kind) and not stat.S_ISDIR(kind)


def write_error_file(path: str, line: str) -> None:
    """A helper's one-line reason into the file its caller named (SM_ERROR_FILE), which lives in the
    caller's private scratch dir: created O_CREAT|O_EXCL|O_NOFOLLOW, 0600; a file already there is
    written only when it is a regular file of ours (this run's own earlier line), never through a
    symlink, a FIFO or another user's file. Nothing is raised: the reason is a courtesy."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(path, flags)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                os.close(fd)
                return
            os.ftruncate(fd, 0)
        try:
            os.write(fd, ((line.splitlines() or [""])[0] + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except OSError:
        pass


def write_private(path: str, text: str) -> None:
    """Write `text` to `path` atomically, mode 0600 (it may hold secrets)."""
    write_atomic(path, text, 0o600, through=False)


def write_json(path: str, document: object) -> None:
    """Write a JSON document atomically, mode 0644."""

    write_atomic(path, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
