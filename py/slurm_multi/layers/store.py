"""The shared cache's layered entries: each layer blob stored once, by its digest, plus a small index
per image; a worker reads only the blobs it lacks.

    <cache>/blobs/sha256/<hex>     a layer's blob (its uncompressed tar), named by the sha256 of its
                                   bytes: its diff ID. Written as a sibling temp file, checked against
                                   its name, renamed; a blob already there is not written again.
    <cache>/<key>.layers           the image's index (JSON): `docker save`'s tar without its layers'
                                   bytes, in order (other members as they were, each blob's header and
                                   digest). One writer, one reader: this module.
    <cache>/<key>.layers.id        its sidecar; the entry protocol (temp file, rename, sidecar, the
                                   key's lock) is lib/cache.sh's, as for the whole-image `<key>.tar`
    <cache>/.blobs.lock            flock: whoever writes or reads blobs holds it shared, pruning
                                   exclusive (a blob no index names goes only then)

A tar rebuilt from the index and every blob is byte for byte the tar docker saved; a reader that
holds the first k layers leaves out their blobs, as the relay does (slurm_multi.layers.chain).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from slurm_multi.common import HelperError, timeout_error
from slurm_multi.layers.chain import is_diff_ids, labels
from slurm_multi.layers.tarstream import DATA, HEAD, Member, padding

FORMAT = "slurm-multi layer index 1"
MAX_INDEX = 64 << 20  # the members that are not blobs (config, manifest, v1 json): kept in the index
LOCK_WAIT = 900.0  # as SM_CACHE_LOCK_TIMEOUT's default
Log = Callable[[str], None]


def blob_dir(cache: str) -> str:
    return os.path.join(cache, "blobs", "sha256")


def blob_path(cache: str, diff_id: str) -> str:
    return os.path.join(blob_dir(cache), diff_id.removeprefix("sha256:"))


class BlobsLock:
    """`<cache>/.blobs.lock`, shared (writers, readers) or exclusive (pruning), waited for at most
    `wait` seconds."""

    def __init__(self, cache: str, exclusive: bool = False, wait: float = LOCK_WAIT) -> None:
        self.path = os.path.join(cache, ".blobs.lock")
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(self.fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise timeout_error(f"layers: timed out waiting for the cache lock {self.path}") from None
                time.sleep(0.1)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# --------------------------------------------------------------------------------------------------
# Writing: fed the pieces of rank 0's tar as they stream (a relay.sections Sink)


@dataclass
class _Blob:
    member: Member
    path: str
    tmp: str = ""  # "" when the cache has the blob already
    fd: int = -1
    hasher: Any = None


@dataclass
class Writer:
    """Stores the tar's blobs in the cache (new ones only) and its index in `index_path` (the
    entry's temp file, renamed by lib/cache.sh). A failure (a full disk) stops the writing, never
    the stream: `failed` says why, and nothing half-written stays."""

    cache: str
    index_path: str
    image_id: str
    diff_ids: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    raw: bytearray = field(default_factory=bytearray)
    failed: str = ""
    new: dict[str, int] = field(default_factory=dict)  # blobs written now: digest -> bytes
    kept: dict[str, int] = field(default_factory=dict)  # blobs the cache had already
    _member: Member | None = None
    _blob: _Blob | None = None
    _index_bytes: int = 0

    def __post_init__(self) -> None:
        os.makedirs(blob_dir(self.cache), exist_ok=True)
        self.lock = BlobsLock(self.cache)

    def feed(self, member: Member, part: str, piece: memoryview) -> None:
        if self.failed:
            return
        try:
            if member is not self._member:
                self._close_member()
                self._open_member(member)
            if self._blob is not None:
                if part == DATA and self._blob.fd >= 0:
                    self._blob.hasher.update(piece)
                    view = piece
                    while view:
                        view = view[os.write(self._blob.fd, view) :]
            elif part != HEAD or not member.diff_id:
                self._keep(piece)
        except OSError as exc:
            self._fail(f"cannot write the cache's blobs in {blob_dir(self.cache)}: {exc.strerror}")
        except ValueError as exc:
            self._fail(str(exc))

    def _keep(self, piece: memoryview | bytes) -> None:
        self._index_bytes += len(piece)
        if self._index_bytes > MAX_INDEX:
            raise ValueError(f"the tar's members other than layers pass {MAX_INDEX >> 20} MiB: not an index")
        self.raw += piece

    def _flush_raw(self, diff_id: str = "") -> None:
        if self.raw:
            record = {"raw": base64.b64encode(self.raw).decode("ascii")}
            if diff_id:
                record["diff_id"] = diff_id
            self.records.append(record)
            self.raw = bytearray()

    def _open_member(self, member: Member) -> None:
        self._member = member
        if not member.diff_id:
            return
        self._flush_raw()
        if member.link:  # a link to another copy of the blob: kept as it is, with that blob only
            self._keep(member.head)
            return
        self.records.append({"head": base64.b64encode(member.head).decode("ascii"), "blob": member.diff_id,
                             "size": member.size})  # fmt: skip
        path = blob_path(self.cache, member.diff_id)
        blob = _Blob(member, path)
        try:
            if os.stat(path).st_size == member.size:
                self.kept[member.diff_id] = member.size
                self._blob = blob
                return
        except FileNotFoundError:
            pass
        blob.tmp = os.path.join(
            blob_dir(self.cache), f".{os.path.basename(path)}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
        )
        blob.fd = os.open(blob.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        blob.hasher = hashlib.sha256()
        self._blob = blob

    def _close_member(self) -> None:
        member, blob = self._member, self._blob
        self._member, self._blob = None, None
        if member is not None and member.link:
            self._flush_raw(member.diff_id)
        if blob is None or blob.fd < 0:
            return
        os.close(blob.fd)
        blob.fd = -1
        if "sha256:" + blob.hasher.hexdigest() != blob.member.diff_id:
            os.unlink(blob.tmp)
            raise ValueError(
                f"{blob.member.name} does not hash to its layer's diff ID {blob.member.diff_id[:19]}"
            )
        os.replace(blob.tmp, blob.path)
        self.new[blob.member.diff_id] = blob.member.size

    def _fail(self, why: str) -> None:
        self.failed = why
        blob, self._blob = self._blob, None
        if blob is not None and blob.fd >= 0:
            os.close(blob.fd)
            try:
                os.unlink(blob.tmp)
            except OSError:
                pass

    def finish(self) -> str:
        """Write the index (unless writing failed); the failure's reason, or ""."""
        try:
            if not self.failed:
                self._close_member()
                self._flush_raw()
                document = {"format": FORMAT, "image_id": self.image_id, "diff_ids": self.diff_ids,
                            "members": self.records}  # fmt: skip
                with open(self.index_path, "w", encoding="ascii") as out:
                    json.dump(document, out, separators=(",", ":"))
                with open(f"{self.index_path}.facts", "w", encoding="ascii") as out:
                    out.write(f"layers={len(self.diff_ids)}\nblob_bytes={self.blob_bytes}\n")
        except OSError as exc:
            self.failed = f"cannot write the index {self.index_path}: {exc.strerror}"
        except ValueError as exc:
            self.failed = str(exc)
        finally:
            self.lock.release()
        return self.failed

    def abort(self, why: str) -> None:
        self._fail(why)
        self.lock.release()

    @property
    def blob_bytes(self) -> int:
        return sum(self.new.values()) + sum(self.kept.values())


def put(cache: str, index_path: str, image_id: str, diff_ids: list[str], pieces: Iterable) -> Writer:
    """Store a whole tar's pieces (slurm_multi.layers.tarstream) as a layered entry."""
    writer = Writer(cache, index_path, image_id, diff_ids)
    try:
        for member, part, piece in pieces:
            writer.feed(member, part, piece)
    except BaseException:
        writer.abort("interrupted")
        raise
    writer.finish()
    return writer


# --------------------------------------------------------------------------------------------------
# Reading: a tar for `docker load` from the index and the blobs this node lacks


@dataclass
class Index:
    image_id: str
    diff_ids: list[str]
    members: list[dict[str, Any]]


def read_index(path: str) -> Index:
    try:
        with open(path, encoding="ascii") as handle:
            doc = json.load(handle)
        if (
            doc["format"] != FORMAT
            or not is_diff_ids(doc["diff_ids"])
            or not isinstance(doc["members"], list)
        ):
            raise ValueError("not a layer index")
        return Index(str(doc["image_id"]), list(doc["diff_ids"]), doc["members"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise HelperError(f"layers: {path} is not a layer index ({exc})") from None


def write_tar(cache: str, index: Index, held: int, out_fd: int) -> dict[str, int]:
    """The index's tar on `out_fd`, without the blobs of the first `held` layers. What was read."""
    label = labels(index.diff_ids)
    counts = {"layers": len(set(index.diff_ids)), "read_layers": 0, "read_bytes": 0, "held_layers": 0,
              "held_bytes": 0, "bytes": 0}  # fmt: skip

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(out_fd, view) :]
        counts["bytes"] += len(data)

    lock = BlobsLock(cache)
    try:
        for record in index.members:
            if "raw" in record:
                if label.get(record.get("diff_id", ""), 1 << 32) > held:
                    write(base64.b64decode(record["raw"]))
                continue
            diff, size = record["blob"], int(record["size"])
            if label.get(diff, 1 << 32) <= held:
                counts["held_layers"] += 1
                counts["held_bytes"] += size
                continue
            write(base64.b64decode(record["head"]))
            _copy_blob(blob_path(cache, diff), size, out_fd)
            counts["bytes"] += size
            write(bytes(padding(size)))
            counts["read_layers"] += 1
            counts["read_bytes"] += size
    finally:
        lock.release()
    return counts


def _copy_blob(path: str, size: int, out_fd: int) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise HelperError(
            f"layers: the cache has no blob {path} ({exc.strerror}); the entry is damaged"
        ) from None
    try:
        if os.fstat(fd).st_size != size:
            raise HelperError(f"layers: the cache's blob {path} is not {size} bytes; the entry is damaged")
        sent = 0
        while sent < size:
            n = os.sendfile(out_fd, fd, sent, min(size - sent, 1 << 30))
            if n == 0:
                raise HelperError(f"layers: the cache's blob {path} ended early; the entry is damaged")
            sent += n
    finally:
        os.close(fd)
