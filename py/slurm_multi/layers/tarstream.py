"""`docker save`'s tar read as it streams: which member is which layer's blob.

Two layouts, both `docker load` reads through their `manifest.json`:

- classic (docker up to 24): `<v1 id>/layer.tar` per layer, beside `<v1 id>/json` and
  `<v1 id>/VERSION`, then `<config id>.json`, `manifest.json`, `repositories`. The v1 id is a hash
  of the `json` file's fields with the layer's chain ID (moby image/v1 CreateID), and the `json`
  comes first in the tar (names sorted), so the `json` read just before tells which layer the
  `layer.tar` is: we recompute that hash for each candidate chain ID. A layer repeated in the chain
  (an empty layer, say) is a symlink to its first copy's `layer.tar`.
- OCI (docker 25+): `blobs/sha256/<digest>` per blob, then `index.json`, `manifest.json`,
  `oci-layout`, `repositories`. With the classic image store a layer's blob is its uncompressed
  tar, so its digest is its diff ID.

`Scanner.pieces()` yields the stream in order as (member, part, bytes): every byte once, so a
consumer that keeps every piece writes the same tar. A member is labelled (slurm_multi.layers.chain)
when it is a layer's blob (or a link to one), ALWAYS otherwise; a consumer leaves out the members a
receiver holds, whole (extension headers, header, data, padding), and the rest is still a tar.
Whatever cannot be read as a tar (a header whose checksum fails) passes on as it is, labelled ALWAYS:
reading never changes a byte, it only tells which bytes may be left out.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

from slurm_multi.layers.chain import ALWAYS, chain_ids, labels

BLOCK = 512
CHUNK = 1 << 20  # what one read asks for
MAX_SMALL = 1 << 20  # a v1 `json` or an extension header larger than this is not read for meaning
HEX64 = "[0-9a-f]{64}"
OCI_BLOB = re.compile(rf"blobs/sha256/({HEX64})")
V1_LAYER = re.compile(rf"({HEX64})/layer\.tar")
V1_JSON = re.compile(rf"({HEX64})/json")
REGULAR, SYMLINK = (b"0", b"\0", b"7"), b"2"

HEAD, DATA, PAD = "head", "data", "pad"  # the parts of a member, in order
WAIT, QUIET = "wait", "quiet"  # not bytes: the source has nothing now / has had nothing for a while


@dataclass
class Member:
    """One member of the tar (or the tar's end, or what could not be read as a tar)."""

    name: str
    label: int = ALWAYS
    diff_id: str = ""  # the layer whose blob this is, or links to
    size: int = 0  # data bytes, without the padding
    link: bool = False  # a symlink to another copy of the same layer's blob
    head: bytes = b""  # the header blocks as read (extension headers first)


END = Member("(end of the tar)")
MARK = Member("(no bytes)")


def padding(size: int) -> int:
    return -size % BLOCK


# --------------------------------------------------------------------------------------------------
# Headers


def _number(field: bytes) -> int | None:
    """A numeric header field: octal text, or base-256 (the top bit of the first byte set)."""
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text or b"0", 8)
    except ValueError:
        return None


def parse_header(block: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, type flag) of a header block whose checksum holds; None otherwise."""
    stored = _number(block[148:156])
    if stored is None or stored != sum(block[:148]) + 8 * 32 + sum(block[156:]):
        return None
    size = _number(block[124:136])
    if size is None:
        return None
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX ustar: a prefix field extends the name
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, block[156:157]


def _pax_records(data: bytes) -> dict[str, str]:
    """`<len> key=value\\n` records of a PAX extended header."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            break
        if length <= 0:
            break
        key, _, value = data[space + 1 : pos + length].rstrip(b"\n").partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


# --------------------------------------------------------------------------------------------------
# The classic layout's v1 ids


def _raw_fields(text: str) -> list[tuple[str, str]]:
    """The top-level fields of a JSON object as (key, the value's exact text)."""
    decoder = json.JSONDecoder()
    fields: list[tuple[str, str]] = []
    text = text.strip()
    if not text.startswith("{"):
        raise ValueError("not an object")
    pos = 1
    while True:
        while text[pos] in " \t\r\n,":
            pos += 1
        if text[pos] == "}":
            return fields
        key, pos = decoder.raw_decode(text, pos)
        while text[pos] in " \t\r\n:":
            pos += 1
        _, end = decoder.raw_decode(text, pos)
        fields.append((key, text[pos:end]))
        pos = end


def v1_position(document: bytes, v1_hex: str, chains: Sequence[str]) -> int | None:
    """Which layer (its position in the chain) the classic layout's `<v1_hex>/json` describes: the
    v1 id is sha256 of that json's fields without `id` (and, below the top layer, `os`), `parent` as
    a digest, plus `layer_id` = the layer's chain ID, keys sorted (moby image/v1 CreateID). None
    when no chain ID gives `v1_hex`."""
    try:
        fields = dict(_raw_fields(document.decode("utf-8")))
        parent = json.loads(fields["parent"]) if "parent" in fields else ""
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, RecursionError):
        return None
    fields.pop("id", None)
    if parent:
        fields["parent"] = json.dumps("sha256:" + parent)
    variants = [fields, {k: v for k, v in fields.items() if k != "os"}]
    for position, chain in enumerate(chains):
        for variant in variants:
            candidate = dict(variant, layer_id=json.dumps(chain))
            text = "{" + ",".join(f"{json.dumps(k)}:{candidate[k]}" for k in sorted(candidate)) + "}"
            if hashlib.sha256(text.encode()).hexdigest() == v1_hex:
                return position
    return None


# --------------------------------------------------------------------------------------------------
# The stream


class _Input:
    """Buffered reads from a pipe or file. The views it hands out are good until the next call."""

    def __init__(self, fd: int, quiet_every: float | None) -> None:
        self.fd = fd
        self.buf = bytearray(CHUNK)
        self.view = memoryview(self.buf)
        self.start = self.end = 0
        self.quiet_every = quiet_every  # None: block on reads, never say WAIT/QUIET
        self.eof = False

    def fill(self) -> Iterator[str]:
        """Read more into the buffer (nothing when at EOF); before blocking it yields WAIT, then
        QUIET every `quiet_every` seconds while nothing comes."""
        if self.eof:
            return
        if self.start == self.end:
            self.start = self.end = 0
        elif self.end == len(self.buf):
            kept = self.end - self.start
            self.buf[:kept] = self.buf[self.start : self.end]
            self.start, self.end = 0, kept
        if self.quiet_every is not None and not select.select([self.fd], [], [], 0)[0]:
            yield WAIT
            while not select.select([self.fd], [], [], self.quiet_every)[0]:
                yield QUIET
        got = os.readv(self.fd, [self.view[self.end :]])
        if got == 0:
            self.eof = True
        self.end += got
        # A pipe hands out what is buffered: top up while more is already waiting.
        while got and self.end < len(self.buf) and select.select([self.fd], [], [], 0)[0]:
            got = os.readv(self.fd, [self.view[self.end :]])
            self.eof = got == 0
            self.end += got

    def take(self, wanted: int) -> memoryview:
        """Up to `wanted` of the buffered bytes (empty when none are buffered)."""
        n = min(wanted, self.end - self.start)
        piece = self.view[self.start : self.start + n]
        self.start += n
        return piece


class Scanner:
    """The tar on `fd`, member by member, each labelled against the image's `diff_ids`."""

    def __init__(self, fd: int, diff_ids: Sequence[str], quiet_every: float | None = None) -> None:
        self.input = _Input(fd, quiet_every)
        self.labels = labels(diff_ids)
        self.diff_ids = list(diff_ids)
        self.chains = chain_ids(diff_ids)
        self.v1: dict[str, str] = {}  # v1 id (hex) -> diff ID, from the `json` files read so far
        self.unreadable = ""  # why the rest passed on unread (a header that is not a tar header)
        self.total = 0  # bytes read

    # -- reading -----------------------------------------------------------------------------------

    def _exact(self, n: int) -> Iterator[str | bytes]:
        """Yields WAIT/QUIET while it waits, then the n bytes (fewer at EOF) as one bytes object."""
        out = bytearray()
        while len(out) < n:
            piece = self.input.take(n - len(out))
            if piece:
                out += piece
                continue
            if self.input.eof:
                break
            yield from self.input.fill()
        self.total += len(out)
        yield bytes(out)

    def _stream(self, member: Member, part: str, n: int) -> Iterator[tuple[Member, str, memoryview]]:
        """n bytes of `member` as views (fewer at EOF)."""
        while n:
            piece = self.input.take(n)
            if not piece:
                if self.input.eof:
                    return
                for mark in self.input.fill():
                    yield MARK, mark, memoryview(b"")
                continue
            n -= len(piece)
            self.total += len(piece)
            yield member, part, piece

    def _small(self, n: int) -> Generator[tuple[Member, str, memoryview], None, bytes]:
        """The next `n` bytes (fewer at the stream's end), returned; the quiet marks on the way yielded."""
        data = b""
        for got in self._exact(n):
            if isinstance(got, str):
                yield MARK, got, memoryview(b"")
            else:
                data = got
        return data

    # -- the members -------------------------------------------------------------------------------

    def pieces(self) -> Iterator[tuple[Member, str, memoryview]]:
        """Every byte of the stream, in order, as (member, part, bytes); (MARK, WAIT|QUIET, b"")
        while the source is quiet (only with `quiet_every`)."""
        extensions = b""
        long_name = ""
        while True:
            header = yield from self._small(BLOCK)
            if len(header) < BLOCK or header.count(0) == BLOCK:
                # The end of the archive (two zero blocks, maybe padding) or a cut stream: as it is.
                yield END, DATA, memoryview(extensions + header)
                yield from self._stream(END, DATA, 1 << 62)
                return
            parsed = parse_header(header)
            if parsed is None:
                self.unreadable = f"a header at byte {self.total - BLOCK} is not a tar header"
                yield END, DATA, memoryview(extensions + header)
                yield from self._stream(END, DATA, 1 << 62)
                return
            name, size, flag = parsed
            if flag in (b"x", b"g", b"L", b"K") and size <= MAX_SMALL:
                data = yield from self._small(size + padding(size))
                extensions += header + data
                if flag == b"x":
                    long_name = _pax_records(data[:size]).get("path", long_name)
                elif flag == b"L":
                    long_name = data[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                continue
            member = self._member(long_name or name, size, flag, extensions + header)
            extensions, long_name = b"", ""
            if member.name.endswith("/json") and V1_JSON.fullmatch(member.name) and size <= MAX_SMALL:
                data = yield from self._small(size + padding(size))
                self._learn_v1(member.name[:64], data[:size])
                yield member, HEAD, memoryview(member.head)
                yield member, DATA, memoryview(data[:size])
                yield member, PAD, memoryview(data[size:])
                continue
            yield member, HEAD, memoryview(member.head)
            yield from self._stream(member, DATA, size)
            yield from self._stream(member, PAD, padding(size))

    def _member(self, name: str, size: int, flag: bytes, head: bytes) -> Member:
        name = name.removeprefix("./")
        member = Member(name, size=size, head=head)
        diff = ""
        if flag in REGULAR and (match := OCI_BLOB.fullmatch(name)):
            diff = "sha256:" + match.group(1)
        elif flag in (*REGULAR, SYMLINK) and (match := V1_LAYER.fullmatch(name)):
            diff = self.v1.get(match.group(1), "")
            member.link = flag == SYMLINK
        if diff in self.labels:
            member.diff_id, member.label = diff, self.labels[diff]
        return member

    def _learn_v1(self, v1_hex: str, document: bytes) -> None:
        position = v1_position(document, v1_hex, self.chains)
        if position is not None:
            self.v1[v1_hex] = self.diff_ids[position]


def filter_stream(in_fd: int, out_fd: int, diff_ids: Sequence[str], held: int) -> dict[str, int]:
    """Copy the tar on `in_fd` to `out_fd` without the blobs of the first `held` layers (those a
    receiver holding that prefix does not need). What was left out and kept, counted."""
    counts = {"kept_bytes": 0, "left_out_bytes": 0, "left_out_layers": 0, "kept_layers": 0}
    scanner = Scanner(in_fd, diff_ids)
    for member, part, piece in scanner.pieces():
        keep = member.label > held
        if part == HEAD and member.diff_id and not member.link:
            counts["kept_layers" if keep else "left_out_layers"] += 1
        counts["kept_bytes" if keep else "left_out_bytes"] += len(piece)
        while keep and piece:
            piece = piece[os.write(out_fd, piece) :]
    return counts
