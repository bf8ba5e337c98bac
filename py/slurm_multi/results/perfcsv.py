"""Append a job's perf.csv rows to a shared madengine perf.csv, as madengine's update_perf_csv does:
the rows are added to the file (created with madengine's header when absent) and this run's rows
are written to perf_entry.csv beside it.

Many jobs may finish at once, so every step happens under an exclusive flock on PATH.lock, a file
that is never replaced: a lock on perf.csv itself would be lost whenever the file is rewritten (a
writer waiting on the old inode would then append to a file nobody sees). madengine itself takes no
lock; do not run its update on the same file concurrently.

The existing file is read and checked first; when anything in it is malformed nothing is written
(one-line error). Rows are appended with one write; the file is rewritten (temp file + rename, same
permission bits) only when its header must grow, keeping its column order and every row's values.
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from slurm_multi.common import HelperError, timeout_error, usage_error
from slurm_multi.readfile import PathLike
from slurm_multi.results.rows import PERF_COLUMNS
from slurm_multi.results.shared import AREA, os_error, read_at_most, write_atomic
from slurm_multi.results.stagehistory import STAGES_NAME, append_lead
from slurm_multi.results.values import as_number, format_number, relative_change

ENTRY_NAME = "perf_entry.csv"
LOCK_SUFFIX = ".lock"
LOCK_TIMEOUT_S = 120.0
MAX_PERF_CSV_BYTES = 1024 * 1024 * 1024
# A previous row is "the same model and configuration" when all of these match (numbers compared
# as numbers, so `2` = `2.0`). metric: a model's rows carry several metrics, never compared across.
CONFIG_COLUMNS = (
    "model", "metric", "n_gpus", "nnodes", "gpus_per_node", "training_precision", "args", "tags",
    "gpu_architecture",
)  # fmt: skip
REQUIRED_COLUMNS = ("model", "performance")


@dataclass(frozen=True)
class Appended:
    """What append_perf_csv did: to which file, how many rows, which columns it added."""

    path: Path
    entry: Path
    rows: int
    created: bool
    new_columns: tuple[str, ...]


@dataclass(frozen=True)
class _PerfFile:
    """An existing perf.csv as read: its header as written, the names stripped, its rows."""

    header: list[str]
    names: list[str]
    rows: list[list[str]]
    newline: str
    ends_with_newline: bool
    bom: bool
    mode: int


def append_perf_csv(
    path: PathLike,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    lock_timeout: float = LOCK_TIMEOUT_S,
    stages: str | None = None,
) -> Appended:
    """Append rows (columns named by `header`) to the madengine perf.csv at `path`, filling
    relative_change; write them to perf_entry.csv beside it, and `stages` (the job's line of node
    stage times, results.stagehistory) to perf_stages.jsonl beside it. HelperError on any bad
    input."""
    target = check_target(path)
    new = [dict(zip(header, row)) for row in rows]
    with locked(target.with_name(target.name + LOCK_SUFFIX), lock_timeout):
        lead = _stages_lead(target) if stages is not None else ""  # checked before anything is written
        existing = _read_existing(target)
        if existing is None:
            names = list(PERF_COLUMNS) + [name for name in header if name not in PERF_COLUMNS]
            _fill_relative_change(new, [], [])
            write_atomic(target, _csv_text([names, *_ordered(new, names)], "\n"), _hint(target))
            created, added = True, ()
        else:
            names = existing.names + [name for name in header if name not in existing.names]
            added = tuple(names[len(existing.names) :])
            _fill_relative_change(new, existing.names, existing.rows)
            _write_rows(target, existing, names, _ordered(new, names))
            created = False
        entry = target.with_name(ENTRY_NAME)
        write_atomic(entry, _csv_text([names, *_ordered(new, names)], "\n"), _hint(target))
        if stages is not None:
            _append(target.with_name(STAGES_NAME), lead + stages, create=True)
    return Appended(target, entry, len(new), created, added)


def _hint(target: Path) -> str:
    return f"is {os.path.abspath(target.parent)} writable?"


def check_target(path: PathLike) -> Path:
    """The real file to append to (a symlink's target), after the checks that need no lock."""
    # Only a symlink is resolved: a relative path stays relative, so a directory whose parents the
    # user may not search (a job dir under another user's tree) still works from inside it.
    if not os.fspath(path):
        raise usage_error(f"{AREA}: --perf-csv '': an empty path; pass the perf.csv file")
    if "\0" in os.fsdecode(path):
        raise usage_error(f"{AREA}: --perf-csv {path!r}: a path holds no NUL byte")
    try:
        target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
        if target.name == ENTRY_NAME:
            raise usage_error(
                f"{AREA}: --perf-csv {path}: {ENTRY_NAME} is the per-run copy; name the shared file"
            )
        if target.is_dir():
            raise usage_error(f"{AREA}: --perf-csv {path} is a directory; pass the perf.csv file")
        if not target.parent.is_dir():
            raise usage_error(f"{AREA}: --perf-csv {path}: directory {target.parent} does not exist")
    except (OSError, ValueError) as exc:
        raise usage_error(f"{AREA}: --perf-csv {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return target


@contextmanager
def locked(lock_path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive flock on lock_path (created if absent, never removed: removing a lock file
    lets two writers lock two different files)."""
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise HelperError(
            f"{AREA}: cannot open the lock {lock_path}: {os_error(exc)}; {_hint(lock_path)}"
        ) from None
    try:
        deadline = time.monotonic() + timeout
        pause = 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise timeout_error(
                        f"{AREA}: {lock_path} stayed locked for {timeout:g} s; is another collect "
                        f"stuck? (`fuser {lock_path}` names it)"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
            except OSError as exc:
                raise HelperError(f"{AREA}: cannot lock {lock_path}: {os_error(exc)}") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


# ----------------------------------------------------------------------------- the existing file


def _bad(target: Path, what: str) -> HelperError:
    return usage_error(
        f"{AREA}: --perf-csv {target}: {what}; fix or move the file aside (nothing was written)"
    )


def _read_existing(target: Path) -> _PerfFile | None:
    """The file's header and rows; None when there is no file (or no header) yet."""
    try:
        with open(target, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode & 0o7777
            data = read_at_most(handle, MAX_PERF_CSV_BYTES + 1, 1024 * 1024)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot read --perf-csv {target}: {os_error(exc)}") from None
    if len(data) > MAX_PERF_CSV_BYTES:
        raise _bad(target, f"larger than {MAX_PERF_CSV_BYTES >> 30} GiB")
    if b"\x00" in data:
        raise _bad(target, "binary file (contains NUL bytes)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _bad(target, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    records = list(_records(text, target))
    if not records:
        return None  # empty: nothing to keep, start it with our header
    (_, header), body = records[0], records[1:]
    names = [name.strip() for name in header]
    _check_header(target, names)
    for line, row in body:
        if len(row) != len(header):
            raise _bad(target, f"line {line} has {len(row)} fields, the header has {len(header)}")
    first_end = text.find("\n")
    newline = "\r\n" if first_end > 0 and text[first_end - 1] == "\r" else "\n"
    return _PerfFile(
        header, names, [row for _, row in body], newline, text.endswith(("\n", "\r")),
        data.startswith(b"\xef\xbb\xbf"), mode,
    )  # fmt: skip


def _stages_lead(target: Path) -> str:
    """perf_stages.jsonl beside `target` checked as perf.csv is (stagehistory.append_lead): what
    the new record needs before it, or the one-line refusal."""
    path = target.with_name(STAGES_NAME)
    try:
        return append_lead(path)
    except ValueError as exc:
        raise usage_error(
            f"{AREA}: --perf-csv {target}: {path.name} beside it: {exc}; fix or move it aside "
            "(nothing was written)"
        ) from None
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot read {path}: {os_error(exc)}") from None


def _records(text: str, target: Path) -> Iterator[tuple[int, list[str]]]:
    """(first line, fields) of every non-blank record; a malformed one is an error."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    end = 0
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise _bad(target, f"line {start}: malformed CSV ({exc})") from None
        end = reader.line_num
        if row:
            yield start, row


def _check_header(target: Path, names: list[str]) -> None:
    missing = [name for name in REQUIRED_COLUMNS if name not in names]
    if missing:
        shown = ", ".join(names)[:200]
        raise _bad(target, f"no {', '.join(missing)} column in its header ({shown})")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _bad(target, f"column {name!r} appears twice in its header")
        seen.add(name)


# ----------------------------------------------------------------------------- relative_change


def _config_value(text: str) -> str:
    number = as_number(text)
    return format_number(number) if number is not None else text.strip()


def config_key(values: dict[str, str]) -> tuple[str, ...]:
    """A row's model and configuration (CONFIG_COLUMNS): rows with the same key are runs of the same
    thing, compared by relative_change here and by the history page (slurm_multi.report)."""
    return tuple(_config_value(values.get(column, "")) for column in CONFIG_COLUMNS)


def _fill_relative_change(new: list[dict[str, str]], names: list[str], old_rows: list[list[str]]) -> None:
    """relative_change of each new row against the LAST earlier row in the file with the same
    CONFIG_COLUMNS ("" without one, or when either performance is not a number)."""
    wanted = {config_key(row) for row in new}
    last: dict[tuple[str, ...], str] = {}
    for row in old_rows:  # file order: the later row is the more recent one
        values = dict(zip(names, row))
        key = config_key(values)
        if key in wanted:
            last[key] = values.get("performance", "")
    for row in new:
        previous = last.get(config_key(row))
        row["relative_change"] = relative_change(row.get("performance", ""), previous or "")


# ----------------------------------------------------------------------------- writing


def _ordered(rows: list[dict[str, str]], names: Sequence[str]) -> list[list[str]]:
    return [[row.get(name, "") for name in names] for row in rows]


def _csv_text(rows: Sequence[Sequence[str]], newline: str) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator=newline).writerows(rows)
    return buffer.getvalue()


def _write_rows(target: Path, existing: _PerfFile, names: list[str], rows: list[list[str]]) -> None:
    """Append when the header stays; otherwise rewrite the whole file with the wider header."""
    if len(names) == len(existing.names):
        text = _csv_text(rows, existing.newline)
        _append(target, ("" if existing.ends_with_newline else existing.newline) + text)
        return
    header = existing.header + names[len(existing.names) :]
    padding = [""] * (len(names) - len(existing.names))
    body = [row + padding for row in existing.rows]
    text = ("\ufeff" if existing.bom else "") + _csv_text([header, *body, *rows], existing.newline)
    write_atomic(target, text, _hint(target), mode=existing.mode)


def _append(target: Path, text: str, create: bool = False) -> None:
    """One O_APPEND write (looped only if the kernel writes less), then fsync; `create`: the file is
    made (0666 less the umask) when it is not there."""
    data = text.encode("utf-8")
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0), 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot append to {target}: {os_error(exc)}; {_hint(target)}") from None
