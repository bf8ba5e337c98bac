"""Pruning the shared image cache by age and size: old entries go, then every blob no index names.

An entry is a layered one (`<key>.layers` and its sidecar) or a whole-image tar (`<key>.tar` and
`<key>.id`); its age is its file's modification time (a reader touches a layered index on use).
Pruning holds `.blobs.lock` exclusively, so no writer or reader of blobs is at work, and takes each
entry's own key lock without waiting: an entry in use is kept. A blob goes only when no remaining
index names it; a temp file left by a dead writer goes too (no writer can be alive meanwhile).
Squashfs entries (pyxis) are not touched.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from slurm_multi.layers.store import BlobsLock, HelperError, blob_dir, read_index

Log = Callable[[str], None]


@dataclass
class Entry:
    key: str
    files: list[str]  # the entry, then its sidecar
    mtime: float
    bytes: int  # its own files' bytes (a layered entry's blobs are counted apart)
    blobs: set[str]  # the blobs its index names (hex)


def _entries(cache: str) -> list[Entry]:
    found: list[Entry] = []
    for name in sorted(os.listdir(cache)):
        path = os.path.join(cache, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        if name.endswith(".layers"):
            key, sidecar = name[: -len(".layers")], path + ".id"
            try:
                names = {d.removeprefix("sha256:") for d in read_index(path).diff_ids}
            except HelperError:
                names = set()
        elif name.endswith(".tar"):
            key, sidecar, names = (
                name[: -len(".tar")],
                os.path.join(cache, name[: -len(".tar")] + ".id"),
                set(),
            )
        else:
            continue
        stat = os.stat(path)
        size = stat.st_size + (os.path.getsize(sidecar) if os.path.exists(sidecar) else 0)
        found.append(Entry(key, [path, sidecar], stat.st_mtime, size, names))
    return found


def _blobs(cache: str) -> dict[str, int]:
    try:
        names = os.listdir(blob_dir(cache))
    except FileNotFoundError:
        return {}
    return {n: os.path.getsize(os.path.join(blob_dir(cache), n)) for n in names}


def _remove_entry(cache: str, entry: Entry, dry_run: bool) -> bool:
    """The entry's files, under its key's lock taken without waiting; False when it is in use."""
    fd = os.open(os.path.join(cache, f".{entry.key}.lock"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if not dry_run:
            for path in reversed(entry.files):  # the sidecar first: it never describes a missing entry
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        return True
    finally:
        os.close(fd)


def prune(
    cache: str,
    older_than: float | None,
    max_bytes: int | None,
    dry_run: bool,
    log: Log,
    now: float | None = None,
) -> dict[str, int]:
    """Remove entries older than `older_than` seconds, then the oldest until the cache holds at most
    `max_bytes`, then every blob no remaining index names. What went, counted."""
    now = time.time() if now is None else now
    lock = BlobsLock(cache, exclusive=True)
    gone = {"entries": 0, "blobs": 0, "bytes": 0}
    verb = "would remove" if dry_run else "removed"
    try:
        entries = sorted(_entries(cache), key=lambda e: e.mtime)
        blobs = _blobs(cache)
        temp = [n for n in blobs if n.startswith(".")]
        blobs = {n: size for n, size in blobs.items() if not n.startswith(".")}

        def total(kept: list[Entry]) -> int:
            named = set().union(*(e.blobs for e in kept)) if kept else set()
            return sum(e.bytes for e in kept) + sum(size for n, size in blobs.items() if n in named)

        kept: list[Entry] = []
        for entry in entries:
            if (
                older_than is not None
                and now - entry.mtime > older_than
                and _remove_entry(cache, entry, dry_run)
            ):
                log(f"{verb} {entry.key} (unused for {(now - entry.mtime) / 86400:.1f} days)")
                gone["entries"] += 1
                gone["bytes"] += entry.bytes
            else:
                kept.append(entry)
        for entry in list(kept):
            if max_bytes is None or total(kept) <= max_bytes:
                break
            if not _remove_entry(cache, entry, dry_run):
                log(f"kept {entry.key}: in use")
                continue
            log(f"{verb} {entry.key} (the cache holds more than {max_bytes} bytes)")
            gone["entries"] += 1
            gone["bytes"] += entry.bytes
            kept.remove(entry)
        named = set().union(*(e.blobs for e in kept)) if kept else set()
        for name in sorted(set(blobs) - named) + temp:
            path = os.path.join(blob_dir(cache), name)
            if not dry_run:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
            gone["blobs"] += 1
            gone["bytes"] += blobs.get(name, 0)
        if gone["blobs"]:
            log(f"{verb} {gone['blobs']} blob(s) no index names")
    finally:
        lock.release()
    return gone
