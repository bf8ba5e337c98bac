"""Wait for profiler reports to appear and settle on BYTES before anyone kills their writers.

nsys writes `<name>.nsys-rep` only when its session ends, and the file then grows for a while (tens
of MB of metadata is normal). srtctl's teardown once judged the *count* of reports settled after 20 s
while nsys was still writing them and killed it mid-write (11 reports, all 0 bytes). So a report
counts only when it is non-empty and its size has not changed for the settle window, no `.qdstrm`
(nsys' raw stream, present until the conversion ends) is left, and nothing else is still changing.

A reused report directory holds reports of earlier jobs (and a requeued job keeps its job id, so
its reports even keep their names). They must never count: `snapshot` records every report that
exists before the job starts (name, size, mtime_ns, inode), and `wait --since-file` counts only
reports that are new or changed since then; an unchanged leftover `.qdstrm` no longer holds the
wait either.

`Settler` holds that logic and is fed (path -> size) snapshots and a clock, so it is tested without
sleeping; `Baseline` is the snapshot taken before the job; `wait_for_reports` is the polling loop
around both. No click here (collect reads a profiled job's report states): the
click group (`wait`, `snapshot`, `count`) is slurm_multi.reports_cli.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from slurm_multi.common import HelperError, talk, usage_error
from slurm_multi.readfile import read_json
from slurm_multi.shell import write_atomic

QDSTRM_SUFFIX = ".qdstrm"
PROGRESS_EVERY_SECONDS = 5.0
SNAPSHOT_KIND = "slurm-multi reports snapshot"
SNAPSHOT_VERSION = 1

# What a tracked file is doing right now (see Settler.kind).
EMPTY = "empty"  # 0 bytes: never counts (nsys creates the file before it writes into it)
GROWING = "growing"  # non-empty, size changed less than the settle window ago
SETTLING = "settling"  # non-empty, unchanged since first seen, but not yet for the whole window
SETTLED = "settled"  # non-empty, unchanged for the settle window
MAX_FLOAT_INT = int(sys.float_info.max)  # float() of a larger int raises OverflowError


def human_bytes(size: int) -> str:
    """12_000_000 -> '12.0 MB' (decimal units, like `ls -h --si`); a count too large for a float (no
    file's: a number in a file some process left) in TB all the same."""
    if size < 1000:
        return f"{size} bytes"
    if size >= MAX_FLOAT_INT:
        return f"{Decimal(size) / 10**12:.1e} TB"
    value = float(size)
    for unit in ("kB", "MB", "GB", "TB"):
        value /= 1000.0
        if value < 1000.0 or unit == "TB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


@dataclass
class Tracked:
    """One report file: its last seen size and when that size last changed (or was first seen)."""

    size: int
    changed_at: float
    changes: int = 0


@dataclass
class Settler:
    """Decides when reports are done, from successive snapshots; knows nothing about the filesystem.

    Done = at least `baseline + expect` settled reports, no `.qdstrm` left, and no report (empty or
    not) that changed within the settle window: a file that grows resets its settle clock, and a
    freshly created empty file is about to be written, so it holds the wait too.
    """

    expect: int = 1
    baseline: int = 0
    settle_seconds: float = 60.0
    files: dict[str, Tracked] = field(default_factory=dict)
    qdstrm: list[str] = field(default_factory=list)
    observed: bool = False

    @property
    def target(self) -> int:
        return self.baseline + self.expect

    def observe(self, sizes: Mapping[str, int], qdstrm: Iterable[str], now: float) -> None:
        """Feed one snapshot: every matching report path with its size, and every .qdstrm path."""
        for path in list(self.files):
            if path not in sizes:  # deleted or renamed away: forget it
                del self.files[path]
        for path, size in sizes.items():
            tracked = self.files.get(path)
            if tracked is None:
                self.files[path] = Tracked(size=size, changed_at=now)
            elif tracked.size != size:
                tracked.size, tracked.changed_at, tracked.changes = size, now, tracked.changes + 1
        self.qdstrm = sorted(qdstrm)
        self.observed = True

    def kind(self, path: str, now: float) -> str:
        tracked = self.files[path]
        if tracked.size == 0:
            return EMPTY
        if now - tracked.changed_at >= self.settle_seconds:
            return SETTLED
        return GROWING if tracked.changes else SETTLING

    def recent(self, path: str, now: float) -> bool:
        return now - self.files[path].changed_at < self.settle_seconds

    def settled(self, now: float) -> list[str]:
        return sorted(p for p in self.files if self.kind(p, now) == SETTLED)

    def done(self, now: float) -> bool:
        if not self.observed or self.qdstrm:
            return False
        if any(self.recent(p, now) for p in self.files):
            return False
        return len(self.settled(now)) >= self.target

    def final_without(self, now: float) -> bool:
        """Nothing more will come: every expected report is there, nsys has finished with all of
        them (no .qdstrm, nothing changed within the settle window), and some stayed empty (a
        conversion that failed). Waiting for the timeout would change nothing."""
        if not self.observed or self.qdstrm or any(self.recent(p, now) for p in self.files):
            return False
        counts = self.counts(now)
        return counts[EMPTY] > 0 and counts[SETTLED] + counts[EMPTY] >= self.target

    def counts(self, now: float) -> dict[str, int]:
        counts = {EMPTY: 0, GROWING: 0, SETTLING: 0, SETTLED: 0}
        for path in self.files:
            counts[self.kind(path, now)] += 1
        return counts

    def progress(self, now: float, waited: float) -> str:
        """'2/4 settled, 1 growing (12.0 MB), 1 .qdstrm, waited 14 s'."""
        counts = self.counts(now)
        parts = [f"{counts[SETTLED]}/{self.target} settled"]
        unsettled_bytes = sum(
            t.size for p, t in self.files.items() if self.kind(p, now) in (GROWING, SETTLING)
        )
        busy = counts[GROWING] + counts[SETTLING]
        if busy:
            parts.append(f"{busy} growing ({human_bytes(unsettled_bytes)})")
        if counts[EMPTY]:
            parts.append(f"{counts[EMPTY]} empty")
        if self.qdstrm:
            parts.append(f"{len(self.qdstrm)} .qdstrm")
        parts.append(f"waited {waited:.0f} s")
        return ", ".join(parts)

    def describe(self, path: str, now: float) -> str:
        """One file's state: '0 bytes', 'growing: 12.0 MB, changed 0.5 s ago', 'settled (12.0 MB)'."""
        tracked = self.files[path]
        age = now - tracked.changed_at
        kind = self.kind(path, now)
        if kind == EMPTY:
            return f"0 bytes (unchanged for {age:.1f} s)"
        if kind == SETTLED:
            return f"settled ({human_bytes(tracked.size)})"
        if kind == GROWING:
            return f"growing: {human_bytes(tracked.size)}, changed {age:.1f} s ago"
        return (
            f"settling: {human_bytes(tracked.size)}, unchanged for {age:.1f} s of {self.settle_seconds:g} s"
        )

    def state_lines(self, now: float, relative_to: str | None = None) -> list[str]:
        """One line per report and per .qdstrm, for the timeout message."""

        def name(path: str) -> str:
            return os.path.relpath(path, relative_to) if relative_to else path

        lines = [f"{name(p)}: {self.describe(p, now)}" for p in sorted(self.files)]
        lines += [f"{name(q)} still present" for q in self.qdstrm]
        return lines

    def shortfall(self, now: float) -> str:
        """Why the wait is not over, as a clause for the summary line."""
        counts = self.counts(now)
        reasons = []
        settled = counts[SETTLED]
        if settled < self.target:
            reasons.append(
                f"{settled}/{self.target} settled (baseline {self.baseline} + expect {self.expect})"
            )
        busy = counts[GROWING] + counts[SETTLING]
        if busy:
            reasons.append(f"{busy} still changing")
        if counts[EMPTY]:
            reasons.append(f"{counts[EMPTY]} empty")
        if self.qdstrm:
            reasons.append(
                f"{len(self.qdstrm)} .qdstrm left (nsys never finished writing: was it killed, "
                "not stopped with SIGTERM?)"
            )
        return "; ".join(reasons) or "nothing pending"


@dataclass(frozen=True)
class Stamp:
    """What identifies one version of a file: a rewrite changes at least one of these."""

    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, stat: os.stat_result) -> Stamp:
        return cls(size=stat.st_size, mtime_ns=stat.st_mtime_ns, inode=stat.st_ino)


def stamps(directory: str, pattern: str, recursive: bool) -> tuple[dict[str, Stamp], dict[str, Stamp]] | None:
    """(report path -> stamp, .qdstrm path -> stamp) under `directory`; None while it does not exist."""
    if not os.path.exists(directory):
        return None
    if not os.path.isdir(directory):
        raise usage_error(f"reports: {directory} is not a directory; pass the report directory")
    reports: dict[str, Stamp] = {}
    qdstrm: dict[str, Stamp] = {}
    stack = [directory]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except FileNotFoundError:
            continue  # a subdirectory vanished between listing and reading
        except PermissionError as err:
            message = f"reports: cannot read {current}: {err.strerror}; fix its permissions"
            raise HelperError(message) from None
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if recursive:
                        stack.append(entry.path)
                    continue
                if not entry.is_file():
                    continue
                if entry.name.endswith(QDSTRM_SUFFIX):
                    qdstrm[entry.path] = Stamp.of(entry.stat())
                elif fnmatch.fnmatchcase(entry.name, pattern):
                    reports[entry.path] = Stamp.of(entry.stat())
            except FileNotFoundError:
                continue  # renamed or removed while we looked: the next snapshot tells
    return reports, qdstrm


def real_key(path: str, directory: str, real_directory: str) -> str:
    """`path` (found under `directory`) as the snapshot names it: under the directory's real path,
    so a relative or symlinked spelling of the same directory finds the same entries."""
    return os.path.normpath(os.path.join(real_directory, os.path.relpath(path, directory)))


@dataclass
class Baseline:
    """The reports (and .qdstrm files) that existed before the job, by real path."""

    files: dict[str, Stamp] = field(default_factory=dict)
    source: str = ""

    def stale(self, key: str, stamp: Stamp) -> bool:
        """True when the file is exactly as it was before the job: same size, mtime and inode."""
        return self.files.get(key) == stamp

    def split(self, found: Mapping[str, Stamp], directory: str) -> tuple[dict[str, Stamp], int]:
        """(the files that are new or changed since the baseline, how many were left as they were)."""
        real_directory = os.path.realpath(directory)
        fresh: dict[str, Stamp] = {}
        for path, stamp in found.items():
            if not self.stale(real_key(path, directory, real_directory), stamp):
                fresh[path] = stamp
        return fresh, len(found) - len(fresh)


def take_snapshot(directories: Sequence[str], pattern: str, recursive: bool) -> Baseline:
    """Every report matching `pattern` and every .qdstrm under the directories (missing ones: none)."""
    files: dict[str, Stamp] = {}
    for directory in directories:
        found = stamps(directory, pattern, recursive)
        if found is None:
            continue
        real_directory = os.path.realpath(directory)
        for path, stamp in {**found[0], **found[1]}.items():
            files[real_key(path, directory, real_directory)] = stamp
    return Baseline(files=files)


def write_snapshot(baseline: Baseline, out: str, directories: Sequence[str], pattern: str) -> None:
    """Write the snapshot atomically (a sibling temp file, then rename): a reader never sees half."""
    document = {
        "kind": SNAPSHOT_KIND,
        "version": SNAPSHOT_VERSION,
        "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "directories": [os.path.realpath(d) for d in directories],
        "pattern": pattern,
        "files": {
            path: {"size": s.size, "mtime_ns": s.mtime_ns, "inode": s.inode}
            for path, s in sorted(baseline.files.items())
        },
    }
    try:
        write_atomic(out, json.dumps(document, indent=1) + "\n")
    except OSError as err:
        raise HelperError(
            f"reports: cannot write the snapshot {out}: {err.strerror}; check the directory"
        ) from None


def read_snapshot(path: str) -> Baseline:
    """The snapshot `write_snapshot` wrote; a missing or foreign file is a one-line usage error."""
    retake = f"take it with `slurm-multi reports snapshot DIR --out {path}` before the job starts"
    try:
        document = read_json(path)  # (a FIFO reads as empty: not JSON, never a hang)
    except FileNotFoundError:
        raise usage_error(f"reports: --since-file {path} does not exist; {retake}") from None
    except OSError as err:
        raise usage_error(f"reports: cannot read --since-file {path}: {err.strerror}") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError; deep nesting
        raise usage_error(f"reports: --since-file {path} is not JSON ({err}); {retake}") from None
    if not isinstance(document, dict) or document.get("kind") != SNAPSHOT_KIND:
        raise usage_error(f"reports: --since-file {path} is not a report snapshot; {retake}")
    if document.get("version") != SNAPSHOT_VERSION:
        raise usage_error(
            f"reports: --since-file {path} has snapshot version {document.get('version')!r}, "
            f"this slurm-multi reads {SNAPSHOT_VERSION}; {retake}"
        )
    files: dict[str, Stamp] = {}
    entries = document.get("files")
    if not isinstance(entries, dict):
        raise usage_error(f"reports: --since-file {path} has no 'files' table; {retake}")
    for name, entry in entries.items():
        try:
            files[name] = Stamp(
                size=int(entry["size"]), mtime_ns=int(entry["mtime_ns"]), inode=int(entry["inode"])
            )
        except (TypeError, KeyError, ValueError, OverflowError):  # (int() of Infinity)
            raise usage_error(
                f"reports: --since-file {path}: entry {name!r} is malformed; {retake}"
            ) from None
    return Baseline(files=files, source=path)


def scan_since(
    directory: str, pattern: str, recursive: bool, baseline: Baseline | None
) -> tuple[dict[str, int], list[str], int] | None:
    """(report path -> size, .qdstrm paths, how many files were left out as unchanged since
    `baseline`) under `directory`; None while the directory does not exist."""
    found = stamps(directory, pattern, recursive)
    if found is None:
        return None
    reports, qdstrm = found
    unchanged = 0
    if baseline is not None:
        reports, old_reports = baseline.split(reports, directory)
        qdstrm, old_qdstrm = baseline.split(qdstrm, directory)
        unchanged = old_reports + old_qdstrm
    return {path: stamp.size for path, stamp in reports.items()}, sorted(qdstrm), unchanged


def scan(
    directory: str, pattern: str, recursive: bool, baseline: Baseline | None = None
) -> tuple[dict[str, int], list[str]] | None:
    """(report path -> size, .qdstrm paths) under `directory`, leaving out what is unchanged since
    `baseline`; None while the directory does not exist."""
    found = scan_since(directory, pattern, recursive, baseline)
    return None if found is None else (found[0], found[1])


def count_new(directories: Iterable[str], pattern: str, recursive: bool, baseline: Baseline | None) -> int:
    """How many reports (empty ones too: nsys creates the file first) are new or changed."""
    total = 0
    for directory in directories:
        found = scan(directory, pattern, recursive, baseline)
        total += 0 if found is None else len(found[0])
    return total


@dataclass
class WaitResult:
    ok: bool
    settled: list[str]
    waited: float
    lines: list[str]
    summary: str
    # What every new report was doing when the wait ended: path -> (bytes, EMPTY|GROWING|...), and
    # the .qdstrm left: what `--state-file` records for the verdict (results.profile).
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    qdstrm: list[str] = field(default_factory=list)


STATE_KIND = "slurm-multi reports state"
STATE_VERSION = 1


def state_document(result: WaitResult, directory: str, pattern: str, expect: int, settle: float) -> dict:
    """The `--state-file` JSON: the wait's outcome and each report's bytes and state."""
    return {
        "kind": STATE_KIND,
        "version": STATE_VERSION,
        "directory": os.path.abspath(directory),
        "pattern": pattern,
        "expect": expect,
        "settle_seconds": settle,
        "waited_seconds": round(result.waited, 1),
        "ok": result.ok,
        "summary": result.summary,
        "reports": [
            {"path": os.path.abspath(path), "bytes": size, "state": state}
            for path, (size, state) in sorted(result.files.items())
        ],
        "qdstrm": [os.path.abspath(path) for path in result.qdstrm],
    }


def _files(settler: Settler, now: float) -> dict[str, tuple[int, str]]:
    return {path: (tracked.size, settler.kind(path, now)) for path, tracked in settler.files.items()}


def wait_for_reports(
    directory: str,
    pattern: str = "*.nsys-rep",
    expect: int = 1,
    baseline: int = 0,
    settle_seconds: float = 60.0,
    timeout_seconds: float = 600.0,
    poll_seconds: float = 1.0,
    recursive: bool = False,
    since: Baseline | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda message: talk("reports", message),
    progress_every: float = PROGRESS_EVERY_SECONDS,
) -> WaitResult:
    settler = Settler(expect=expect, baseline=baseline, settle_seconds=settle_seconds)
    start = clock()
    last_progress = start
    unchanged = 0
    told_unchanged = False
    since_clause = f"; new or changed since {since.source or 'the snapshot'} only" if since else ""
    say(
        f"waiting for {settler.target} non-empty {pattern} in {directory} (baseline {baseline} + "
        f"expect {expect}) to settle for {settle_seconds:g} s on bytes, timeout {timeout_seconds:g} s"
        f"{since_clause}"
    )
    while True:
        now = clock()
        waited = now - start
        snapshot = scan_since(directory, pattern, recursive, since)
        if snapshot is not None:
            unchanged = snapshot[2]
            if unchanged and not told_unchanged:
                told_unchanged = True
                say(f"{unchanged} file(s) unchanged since before the job: not counted")
            settler.observe(snapshot[0], snapshot[1], now)
            if settler.done(now):
                settled = settler.settled(now)
                say(f"{len(settled)}/{settler.target} settled after {waited:.0f} s")
                return WaitResult(True, settled, waited, [], "", _files(settler, now), settler.qdstrm)
            if settler.final_without(now):
                empty = [p for p in settler.files if settler.kind(p, now) == EMPTY]
                summary = (
                    f"reports: {len(empty)} of {settler.target} stayed empty after nsys finished writing "
                    f"({', '.join(os.path.relpath(p, directory) for p in sorted(empty))}); not waiting "
                    "for the timeout"
                )
                lines = settler.state_lines(now, directory)
                return WaitResult(
                    False, settler.settled(now), waited, lines, summary, _files(settler, now), []
                )
        if waited >= timeout_seconds:
            break
        if now - last_progress >= progress_every:
            last_progress = now
            if snapshot is None:
                say(f"{directory} does not exist yet, waited {waited:.0f} s")
            else:
                say(settler.progress(now, waited))
        sleep(max(0.0, min(poll_seconds, timeout_seconds - waited)))
    if snapshot is None:
        summary = (
            f"reports: {directory} did not appear within {timeout_seconds:g} s; "
            "is the report directory right, and did any rank start nsys?"
        )
        return WaitResult(False, [], waited, [], summary)
    old_clause = f"; {unchanged} unchanged since before the job, not counted" if unchanged else ""
    summary = (
        f"reports: timed out after {timeout_seconds:g} s waiting for {pattern} in {directory}: "
        f"{settler.shortfall(now)}{old_clause}"
    )
    return WaitResult(
        False,
        settler.settled(now),
        waited,
        settler.state_lines(now, directory),
        summary,
        _files(settler, now),
        settler.qdstrm,
    )
