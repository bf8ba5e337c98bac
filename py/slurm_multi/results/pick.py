"""Choose the per-node multiple-results CSV with the most performance values.

Why the picker exists: a Primus/Megatron run prints throughput only on the last global rank, so
node 0's CSV is present but empty; taking it made madengine mark good runs FAILURE.

A file that cannot be read as a CSV with a `performance` column is a candidate with its error, never
an exception. Inside a readable file, a row that cannot be trusted (another field count than the
header, a truncated last row, an unterminated quote, bytes that are not UTF-8) is dropped with a
warning naming the file and line, and the file's other rows still count.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi.readfile import PathLike
from slurm_multi.results.shared import os_error, read_bytes
from slurm_multi.results.values import as_number, is_empty_marker

MAX_CSV_BYTES = 64 * 1024 * 1024
MAX_LISTED = 5  # candidates named in a one-line error
MAX_ROW_WARNINGS = 5  # per file; the rest are counted in one more warning
UNDECODED = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, as surrogateescape keeps them


class CsvProblem(Exception):
    """A candidate CSV that cannot be used; the message says why, in a few words."""


class CsvMissing(CsvProblem):
    """The candidate CSV is not there (collect's per-node candidates: then it is none)."""


@dataclass(frozen=True)
class Table:
    """A results CSV as read: header names and row values stripped, rows that could not be trusted
    left out (each named in `warnings`), and how many rows hold a performance value."""

    header: tuple[str, ...]
    records: tuple[tuple[str, ...], ...]
    non_empty: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """One per-node results CSV and its score (rows with a performance value)."""

    path: str
    rows: int = 0
    non_empty: int = 0
    error: str | None = None
    header: tuple[str, ...] = field(default=(), repr=False, compare=False)
    records: tuple[tuple[str, ...], ...] = field(default=(), repr=False, compare=False)
    warnings: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @property
    def usable(self) -> bool:
        return self.error is None and self.non_empty > 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "non_empty": self.non_empty, "error": self.error}

    def describe(self) -> str:
        if self.error:
            return f"{self.path}: {self.error}"
        return f"{self.path}: {self.non_empty} of {self.rows} rows with performance"


def clean_header_name(name: str) -> str:
    # Some configs write `model, performance, metric`; a BOM can survive an editor's round trip.
    return name.strip().strip("\ufeff").strip()


def column_index(header: Sequence[str], name: str) -> int | None:
    lowered = [column.lower() for column in header]
    return lowered.index(name) if name in lowered else None


# ----------------------------------------------------------------------------- reading


def _read_bytes(path: PathLike, limit: int = MAX_CSV_BYTES) -> bytes:
    try:
        data = read_bytes(path, limit + 1)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise CsvMissing(f"cannot read: {os_error(exc)}") from None
    except OSError as exc:
        raise CsvProblem(f"cannot read: {os_error(exc)}") from None
    except ValueError as exc:  # a NUL in the name
        raise CsvProblem(f"cannot read: {exc}") from None
    if len(data) > limit:
        raise CsvProblem(f"larger than {limit // (1024 * 1024)} MiB; not a results CSV")
    if b"\x00" in data:
        raise CsvProblem("binary file (contains NUL bytes)")
    return data


def _decode(data: bytes) -> tuple[str, str | None]:
    """The text, and None, or (when some bytes are not UTF-8) the text with those bytes kept as
    surrogates and the first one described, so that only the rows holding them are dropped."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8-sig", "surrogateescape")
        return text, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
    return text, None


def read_table(path: PathLike, label: str | None = None, limit: int = MAX_CSV_BYTES) -> Table:
    """The table of a results CSV, or CsvProblem when the file as a whole is unusable (`limit`: the
    most bytes it may have; a shared perf.csv read by the history page may have more)."""
    text, undecoded = _decode(_read_bytes(path, limit))
    if not text.strip():
        raise CsvProblem("empty file")
    return parse_table(text, label if label is not None else str(path), undecoded)


def parse_table(text: str, label: str, undecoded: str | None = None) -> Table:
    """Header and rows of a CSV text; `undecoded` says that some bytes were not UTF-8."""
    if undecoded is None:
        table = _parse_clean(text)
        if table is not None:
            return table
    return _parse_careful(text, label, undecoded)


def _performance_column(header: tuple[str, ...]) -> int:
    perf = column_index(header, "performance")
    if perf is None:
        shown = ", ".join(name for name in header if name)[:200]
        raise CsvProblem(f"no 'performance' column (columns: {shown or 'none'})")
    return perf


def _split_rows(text: str) -> list[list[str]] | None:
    """The non-blank rows as csv.reader(strict=True) reads them; None where it raises. Without a
    quote or a carriage return a row is its line split at commas (a madengine CSV, ~5 us a file
    less than the csv module's reader)."""
    if '"' not in text and "\r" not in text:
        return [line.split(",") for line in text.split("\n") if line]
    try:
        return [row for row in csv.reader(io.StringIO(text, newline=""), strict=True) if row]
    except csv.Error:
        return None


def _parse_clean(text: str) -> Table | None:
    """The common case in one pass: every row well formed and every performance cell a number or
    an empty marker. None when anything needs a closer look (with line numbers)."""
    rows = _split_rows(text)
    if rows is None:
        return None
    header_raw = rows.pop(0) if rows else []
    header = tuple([clean_header_name(name) for name in header_raw])
    perf = _performance_column(header)
    width, non_empty, records = len(header), 0, []
    for row in rows:
        if len(row) != width:
            return None
        record = tuple([value.strip() for value in row])
        if as_number(record[perf]) is not None:
            non_empty += 1
        elif not is_empty_marker(record[perf]):
            return None  # worth a warning, which needs the line number
        records.append(record)
    return Table(header, tuple(records), non_empty)


def _numbered_rows(text: str) -> Iterator[tuple[str, list[str] | None, str | None]]:
    """(where, row, None) per non-blank row, or (where, None, csv error) for a row the csv module
    rejects; `where` is "line N" or "lines N-M" (a quoted field can span lines)."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    end = 0
    while True:
        start = end + 1
        try:
            row = next(reader)
            error = None
        except StopIteration:
            return
        except csv.Error as exc:
            row, error = None, str(exc)
        if reader.line_num <= end and error is not None:
            return  # the reader could not move on: nothing more to read
        end = reader.line_num
        if row == []:
            continue
        yield (f"line {start}" if end <= start else f"lines {start}-{end}"), row, error


class _Warnings:
    """At most MAX_ROW_WARNINGS lines per file, then one line that counts the rest."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.lines: list[str] = []
        self.more = 0

    def add(self, where: str, problem: str) -> None:
        if len(self.lines) < MAX_ROW_WARNINGS:
            self.lines.append(f"{self.label} {where}: {problem}")
        else:
            self.more += 1

    def done(self) -> tuple[str, ...]:
        more = [f"{self.label}: +{self.more} more row problems like these"] if self.more else []
        return tuple(self.lines + more)


def _undecoded_byte(row: Sequence[str]) -> int | None:
    for value in row:
        match = UNDECODED.search(value)
        if match:
            return ord(match.group()) - 0xDC00
    return None


def _parse_careful(text: str, label: str, undecoded: str | None) -> Table:
    rows = _numbered_rows(text)
    warnings = _Warnings(label)
    where, header_row, error = next(rows, ("", None, None))
    if error is not None:
        raise CsvProblem(f"malformed CSV header at {where}: {error}")
    if header_row is None:
        raise CsvProblem("no header row")
    if undecoded is not None and _undecoded_byte(header_row) is not None:
        raise CsvProblem(undecoded)
    header = tuple([clean_header_name(name) for name in header_row])
    perf = _performance_column(header)
    records, non_empty = [], 0
    for where, row, error in rows:
        problem = _row_problem(row, error, len(header))
        if problem is not None or row is None:
            warnings.add(where, f"{problem}; row dropped")
            continue
        record = tuple([value.strip() for value in row])
        if as_number(record[perf]) is not None:
            non_empty += 1
        elif not is_empty_marker(record[perf]):
            warnings.add(where, f"performance {record[perf][:60]!r} is not a finite number; counted as empty")
        records.append(record)
    return Table(header, tuple(records), non_empty, warnings.done())


def _row_problem(row: list[str] | None, error: str | None, width: int) -> str | None:
    if error is not None or row is None:
        hint = "; truncated file?" if error and "end of data" in error else ""
        return f"malformed CSV ({error}{hint})"
    if len(row) != width:
        return f"{len(row)} fields, the header has {width} (truncated or ragged)"
    byte = _undecoded_byte(row)
    if byte is not None:
        return f"not UTF-8 text (byte 0x{byte:02x})"
    return None


# ----------------------------------------------------------------------------- scoring and choosing


def score_csv(path: PathLike, label: str | None = None) -> Candidate:
    """Score one candidate; a broken file becomes a Candidate with its error, never an exception."""
    return score(Path(path), label if label is not None else str(path))


def score(path: PathLike, shown: str) -> Candidate:
    """score_csv for a path that needs no Path() normalising."""
    try:
        table = read_table(path, shown)
    except CsvProblem as exc:
        return Candidate(shown, error=str(exc))
    return _scored(shown, table)


def score_present(path: PathLike, shown: str) -> Candidate | None:
    """score for a file that may not be there (collect's per-node CSVs): None when it is not, with
    no stat first (the read says so)."""
    try:
        table = read_table(path, shown)
    except CsvMissing:
        return None
    except CsvProblem as exc:
        return Candidate(shown, error=str(exc))
    return _scored(shown, table)


def _scored(shown: str, table: Table) -> Candidate:
    return Candidate(
        shown, len(table.records), table.non_empty, None, table.header, table.records, table.warnings
    )


def choose(candidates: Sequence[Candidate]) -> Candidate | None:
    """Most performance values, then most rows; a tie goes to the LATER candidate (higher rank /
    later argument), because the last global rank is the one that prints throughput."""
    best: Candidate | None = None
    for candidate in candidates:
        if not candidate.usable:
            continue
        if best is None or (candidate.non_empty, candidate.rows) >= (best.non_empty, best.rows):
            best = candidate
    return best


def pick_best(
    paths: Sequence[PathLike], labels: Sequence[str] | None = None
) -> tuple[Candidate | None, list[Candidate]]:
    """Score every path (in the given order) and choose the best one; None when none has a value."""
    names = list(labels) if labels is not None else [str(p) for p in paths]
    candidates = [score_csv(path, name) for path, name in zip(paths, names)]
    return choose(candidates), candidates


def no_candidate_message(candidates: Sequence[Candidate]) -> str:
    listed = "; ".join(c.describe() for c in candidates[:MAX_LISTED])
    more = f"; +{len(candidates) - MAX_LISTED} more" if len(candidates) > MAX_LISTED else ""
    count = len(candidates)
    noun = "candidate" if count == 1 else "candidates"
    return f"no candidate CSV has a performance value ({count} {noun}: {listed}{more})"
