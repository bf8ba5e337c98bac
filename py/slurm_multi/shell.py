"""Bash that a helper writes for a caller to `source`: every value one quoted shell word.

The seam rule (STYLE.md): a helper writes this into a FILE, exits 0, and only then does bash source
the file. A helper that failed leaves no file behind to source, so a failure can never look like an
empty, successful context.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Iterable, Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
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


def write_private(path: str, text: str) -> None:
    """Write `text` to `path` atomically, mode 0600 (it may hold secrets)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str, document: object) -> None:
    """Write a JSON document atomically (sibling temp file, then rename), mode 0644."""
    import json

    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
