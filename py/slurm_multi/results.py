"""Turn what the nodes left in a job directory into one trustworthy result.

`results pick` chooses the per-node multiple-results CSV with the most non-empty `performance`
values; `results collect` judges the whole job (node exits, error patterns in the logs, the chosen
CSV or the `performance: <value> <metric>` log lines) and writes JOBDIR/perf.csv (madengine's header
order) and JOBDIR/summary.json, both deterministic so a re-run on a finished job dir is byte-identical.

Why the picker exists: a Primus/Megatron run prints throughput only on the last global rank, so
node 0's CSV is present but empty; taking it made madengine mark good runs FAILURE.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Union

import click

from slurm_multi import EXIT_FAILURE, EXIT_OK
from slurm_multi.common import HelperError, usage_error
from slurm_multi.redact import MASK, is_secret_name, redact, secret_values

AREA = "results"

# madengine's perf.csv header, in its order (FORMATS.md).
PERF_COLUMNS: tuple[str, ...] = (
    "model", "n_gpus", "nnodes", "gpus_per_node", "training_precision", "pipeline", "args", "tags",
    "docker_file", "base_docker", "docker_sha", "docker_image", "git_commit", "machine_name",
    "deployment_type", "launcher", "gpu_architecture", "performance", "metric", "relative_change",
    "status", "build_duration", "test_duration", "dataname", "data_provider_type", "data_size",
    "data_download_duration", "build_number", "additional_docker_run_options",
)  # fmt: skip
# Columns the aggregator owns; a CSV column of the same name never overrides them.
OWNED_COLUMNS = frozenset({"model", "performance", "metric", "status", "machine_name", "deployment_type"})
# job.json keys that feed a perf.csv column under another name.
JOB_KEY_ALIASES = {"docker_file": "dockerfile", "docker_sha": "image_id", "docker_image": "image"}

# Values that count as "no performance value" (compared stripped and lower-cased).
EMPTY_VALUES = frozenset({"", "n/a", "na", "nan", "-nan", "none", "null", "<na>", "#n/a"})
MAX_CSV_BYTES = 64 * 1024 * 1024
READ_BLOCK = 64 * 1024  # a read(n) allocates n bytes first: past ~128 KiB that is an mmap, ~15 us
STAGE_ORDER = ("prepare", "image", "barrier", "run", "stage")
MAX_ERRORS_KEPT = 20  # per node, in summary.json
MAX_TRACEBACK_LINES = 400  # a "Traceback" header with no exception line within this is not a traceback
MAX_LISTED = 5  # candidates named in a one-line error
MAX_NODES = 100_000  # a larger nnodes is a typo, not a job: derive it from the node dirs
MAX_TABLE_REASONS = 20  # reasons printed on stderr; summary.json keeps them all

PathLike = Union[str, "os.PathLike[str]"]


# ----------------------------------------------------------------------------- CSV candidates


class CsvProblem(Exception):
    """A candidate CSV that cannot be used; the message says why, in a few words."""


@dataclass(frozen=True)
class Candidate:
    """One per-node results CSV and its score (rows with a non-empty performance value)."""

    path: str
    rows: int = 0
    non_empty: int = 0
    error: str | None = None
    header: tuple[str, ...] = field(default=(), repr=False, compare=False)
    records: tuple[tuple[str, ...], ...] = field(default=(), repr=False, compare=False)

    @property
    def usable(self) -> bool:
        return self.error is None and self.non_empty > 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rows": self.rows, "non_empty": self.non_empty, "error": self.error}

    def describe(self) -> str:
        if self.error:
            return f"{self.path}: {self.error}"
        return f"{self.path}: {self.non_empty} of {self.rows} rows with performance"


def is_empty_value(value: str) -> bool:
    return value.strip().lower() in EMPTY_VALUES


def clean_header_name(name: str) -> str:
    # Some configs write `model, performance, metric`; a BOM can survive an editor's round trip.
    return name.strip().strip("\ufeff").strip()


def _read_at_most(handle: BinaryIO, size: int) -> bytes:
    """handle.read(size) without allocating `size` bytes up front (64 MiB per small CSV costs more
    than reading it): the same bytes, read in blocks."""
    blocks: list[bytes] = []
    left = size
    while left > 0:
        block = handle.read(min(left, READ_BLOCK))
        if not block:
            break
        blocks.append(block)
        left -= len(block)
    return blocks[0] if len(blocks) == 1 else b"".join(blocks)


def _read_text(path: PathLike) -> str:
    try:
        with open(path, "rb") as handle:
            data = _read_at_most(handle, MAX_CSV_BYTES + 1)
    except OSError as exc:
        raise CsvProblem(f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_CSV_BYTES:
        raise CsvProblem(f"larger than {MAX_CSV_BYTES // (1024 * 1024)} MiB; not a results CSV")
    if b"\x00" in data:
        raise CsvProblem("binary file (contains NUL bytes)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CsvProblem(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    if not text.strip():
        raise CsvProblem("empty file")
    return text


def _parse_rows(text: str) -> tuple[list[str], list[list[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header: list[str] = []
        for header in reader:
            if header:
                break
        rows = [row for row in reader if row]
    except csv.Error as exc:
        raise CsvProblem(f"malformed CSV at line {reader.line_num}: {exc} (truncated file?)") from None
    return header, rows


def read_table(path: PathLike) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """Header (names stripped) and rows (values stripped) of a results CSV, or CsvProblem."""
    return _table(_read_text(Path(path)))


def _table(text: str) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    header_raw, rows_raw = _parse_rows(text)
    header = tuple([clean_header_name(name) for name in header_raw])
    if "performance" not in [name.lower() for name in header]:
        shown = ", ".join(name for name in header if name)[:200]
        raise CsvProblem(f"no 'performance' column (columns: {shown or 'none'})")
    records = []
    for number, row in enumerate(rows_raw, start=2):
        if len(row) != len(header):
            raise CsvProblem(
                f"row {number} has {len(row)} fields, the header has {len(header)} (truncated or ragged)"
            )
        records.append(tuple([value.strip() for value in row]))
    return header, tuple(records)


def column_index(header: Sequence[str], name: str) -> int | None:
    lowered = [column.lower() for column in header]
    return lowered.index(name) if name in lowered else None


def score_csv(path: PathLike, label: str | None = None) -> Candidate:
    """Score one candidate; a broken file becomes a Candidate with its error, never an exception."""
    return _score(Path(path), label if label is not None else str(path))


def _score(path: PathLike, shown: str) -> Candidate:
    """score_csv for a path that needs no Path() normalising (collect's own joins)."""
    try:
        header, records = _table(_read_text(path))
    except CsvProblem as exc:
        return Candidate(shown, error=str(exc))
    perf = column_index(header, "performance")
    non_empty = sum(1 for row in records if perf is not None and not is_empty_value(row[perf]))
    return Candidate(shown, len(records), non_empty, None, header, records)


def choose(candidates: Sequence[Candidate]) -> Candidate | None:
    """Most non-empty performance values, then most rows; a tie goes to the LATER candidate
    (higher rank / later argument), because the last global rank is the one that prints throughput."""
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


# ----------------------------------------------------------------------------- log error scan


@dataclass(frozen=True)
class ErrorPattern:
    """A named error pattern; regex None is the structural rule "traceback + exception line"."""

    name: str
    regex: re.Pattern[str] | None


@dataclass(frozen=True)
class ErrorHit:
    line: int
    pattern: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "pattern": self.pattern, "text": self.text}


DEFAULT_ERROR_PATTERNS: tuple[ErrorPattern, ...] = (
    ErrorPattern("RuntimeError", re.compile(r"\bRuntimeError\b")),
    ErrorPattern("CUDA error", re.compile(r"CUDA error")),
    ErrorPattern("HIP error", re.compile(r"HIP error|\bhipError[A-Z]\w*")),
    ErrorPattern("NCCL error", re.compile(r"[NR]CCL error|\bncclSystemError\b|\bncclInternalError\b")),
    ErrorPattern("Segmentation fault", re.compile(r"Segmentation fault|\bSIGSEGV\b")),
    ErrorPattern("out of memory", re.compile(r"\bOOM\b|(?i:out of memory)|\bOutOfMemoryError\b")),
    ErrorPattern("ModuleNotFoundError", re.compile(r"\bModuleNotFoundError\b")),
    ErrorPattern("core dumped", re.compile(r"core dumped")),
    ErrorPattern("Traceback", None),
)

TRACEBACK_HEADER = "Traceback (most recent call last):"
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::|$)")
# torchrun's own cleanup when it gets SIGTERM (scancel, the end of a step, our teardown): the agent
# logs "Received 15 death signal, shutting down workers", "Sending process N closing signal SIGTERM"
# and exits through a traceback ending in `...api.SignalException: Process N got signal: 15`.
# That is the launcher being stopped, not the workload failing; exit codes judge that case.
BENIGN_LINE = re.compile(
    r"SignalException"
    r"|death signal, shutting down workers"
    r"|Sending process \d+ closing signal SIG\w+"
    r"|Unable to shutdown process \d+ via \S+, forcefully exiting via"
)


def compile_patterns(extra: Sequence[str] = (), defaults: bool = True) -> list[ErrorPattern]:
    """Default patterns plus user regexes (named by their text); a bad regex is a usage error."""
    patterns = list(DEFAULT_ERROR_PATTERNS) if defaults else []
    for text in extra:
        try:
            patterns.append(ErrorPattern(text, re.compile(text)))
        except re.error as exc:
            raise usage_error(f"{AREA}: bad --error-pattern {text!r}: {exc}; fix the regex") from None
    return patterns


def _as_patterns(patterns: Sequence[ErrorPattern | str] | None) -> list[ErrorPattern]:
    if patterns is None:
        return list(DEFAULT_ERROR_PATTERNS)
    return [
        item if isinstance(item, ErrorPattern) else ErrorPattern(item, re.compile(item)) for item in patterns
    ]


CONTROL_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _short(text: str, limit: int = 240) -> str:
    """A log excerpt safe for a terminal: control characters (ANSI colours too) shown as \\xNN."""
    text = CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Traceback:
    """A traceback being read: its header's prefix (e.g. `[rank0]: `) and the lines so far."""

    prefix: str
    lines: list[tuple[int, str]]

    def body(self, line: str) -> str | None:
        """The line without this traceback's prefix, or None when it belongs to someone else."""
        if not self.prefix:
            return line
        return line[len(self.prefix) :] if line.startswith(self.prefix) else None


def _first_match(line: str, regexes: Sequence[ErrorPattern]) -> str | None:
    for pattern in regexes:
        if pattern.regex is not None and pattern.regex.search(line):
            return pattern.name
    return None


def _plain_line_hit(number: int, line: str, patterns: Sequence[ErrorPattern]) -> ErrorHit | None:
    if BENIGN_LINE.search(line):
        return None
    name = _first_match(line, patterns)
    return ErrorHit(number, name, _short(line)) if name else None


def _traceback_hit(
    block: _Traceback, number: int, line: str, patterns: Sequence[ErrorPattern]
) -> ErrorHit | None:
    """One hit per finished traceback: at its exception line, named by the pattern it matches."""
    if "SignalException" in line:
        return None
    name = _first_match(line, patterns)
    if name:
        return ErrorHit(number, name, _short(line))
    if any(p.regex is None for p in patterns):
        return ErrorHit(number, "Traceback", _short(line))
    for frame_number, frame in block.lines:
        hit = _plain_line_hit(frame_number, frame, patterns)
        if hit:
            return hit
    return None


class _LogScanner:
    """The line-by-line judgement behind scan_log_errors, fed in pieces so that a file can be read
    in large chunks and a chunk that cannot hold a hit skips the per-line work (see feed_text)."""

    def __init__(self, patterns: Sequence[ErrorPattern], limit: int) -> None:
        self.patterns = patterns
        self.limit = limit
        self.hits: list[ErrorHit] = []
        self.block: _Traceback | None = None
        self.number = 0  # lines consumed so far
        self.prefilter = _prefilter(tuple([pattern.regex for pattern in patterns]))

    def add(self, hit: ErrorHit | None) -> None:
        if hit is not None and len(self.hits) < self.limit:
            self.hits.append(hit)

    def feed(self, lines: Iterable[str]) -> None:
        """Judge these lines (with or without their line endings), continuing the line count."""
        patterns, add = self.patterns, self.add
        block = self.block
        number = self.number
        for raw in lines:
            number += 1
            line = raw.rstrip("\r\n")
            if block is None:
                at = line.find(TRACEBACK_HEADER)
                if at >= 0:
                    block = _Traceback(line[:at], [])
                else:
                    add(_plain_line_hit(number, line, patterns))
                continue
            body = block.body(line)
            if body is not None and (not body.strip() or body[0].isspace()):
                block.lines.append((number, line))  # a frame, a source line or a ^^^^ marker
            elif body is not None and EXCEPTION_LINE.match(body):
                add(_traceback_hit(block, number, body, patterns))
                block = None
            else:
                add(_plain_line_hit(number, line, patterns))  # interleaved output from another process
            if block is not None and len(block.lines) > MAX_TRACEBACK_LINES:
                for stale in block.lines:  # no exception line came: judge its lines one by one
                    add(_plain_line_hit(*stale, patterns))
                block = None
        self.block = block
        self.number = number

    def feed_text(self, text: str, last: bool = False) -> None:
        """Judge a piece of a file read with newline="" that ends at a line boundary (or the end of
        the file): lines end at \\n, \\r\\n or \\r, exactly as iterating over the file splits them.
        `last`: nothing follows, so the line count need not be kept."""
        if self.block is None and not self.prefilter.may_hit(text):
            if not last:  # no line of it can be a hit or open a traceback: only count them
                self.number += _count_lines(text)
            return
        self.feed(io.StringIO(text, newline=""))

    def finish(self) -> list[ErrorHit]:
        for stale in self.block.lines if self.block is not None else ():  # the log ends inside a traceback
            self.add(_plain_line_hit(*stale, self.patterns))
        self.block = None
        return self.hits


def _count_lines(text: str) -> int:
    """How many lines iterating over `text` with newline="" yields (line ends \\n, \\r\\n, \\r)."""
    ends = text.count("\n")
    if "\r" in text:
        ends += text.count("\r") - text.count("\r\n")
    return ends + (0 if not text or text.endswith(("\n", "\r")) else 1)


# Literal strings at least one of which every match of a built-in pattern contains, keyed by the
# regex's (source, flags): (case-sensitive literals, literals to look for in the lower-cased text).
# Matching a regex over a whole chunk costs 50-150 us per 5 KB here; a substring test costs ~1 us.
_REQUIRED_LITERALS: dict[tuple[str, int], tuple[tuple[str, ...], tuple[str, ...]]] = {
    (r"\bRuntimeError\b", re.UNICODE): (("RuntimeError",), ()),
    (r"CUDA error", re.UNICODE): (("CUDA error",), ()),
    (r"HIP error|\bhipError[A-Z]\w*", re.UNICODE): (("HIP error", "hipError"), ()),
    (r"[NR]CCL error|\bncclSystemError\b|\bncclInternalError\b", re.UNICODE): (
        ("CCL error", "ncclSystemError", "ncclInternalError"),
        (),
    ),
    (r"Segmentation fault|\bSIGSEGV\b", re.UNICODE): (("Segmentation fault", "SIGSEGV"), ()),
    # (?i:out of memory): no letter of it has a non-ASCII case-insensitive twin in `re`.
    (r"\bOOM\b|(?i:out of memory)|\bOutOfMemoryError\b", re.UNICODE): (
        ("OOM", "OutOfMemoryError"),
        ("out of memory",),
    ),
    (r"\bModuleNotFoundError\b", re.UNICODE): (("ModuleNotFoundError",), ()),
    (r"core dumped", re.UNICODE): (("core dumped",), ()),
}
# Regex syntax whose meaning depends on what lies outside the matched text (anchors, lookaround) or
# that stops backtracking (atomic groups, possessive repeats): for such a regex a search over a whole
# chunk may miss a match that a search over one of its lines finds.
_CONTEXT_SENSITIVE = re.compile(r"[\^$]|\\[AZ]|\(\?<?[=!]|\(\?>|[*+?}]\+")


class _ChunkPrefilter:
    """may_hit(text) is False only when no line of `text` can match a pattern or open a traceback.

    A line is a substring of the text, so a literal every match contains must occur in the text, and
    a regex free of anchors, lookaround and atomic groups that matches a line also matches the text
    (a line's edges and the line endings around it are both non-word characters for \\b and \\B).
    Any other regex makes every text a possible hit: its lines are then judged one by one.

    The literals are looked for in two steps: first a few short needles in the lower-cased text
    (every literal, lower-cased, contains one of them), then, only if one is there, each literal.
    """

    def __init__(self, regexes: Sequence[re.Pattern[str] | None]) -> None:
        exact: list[str] = [TRACEBACK_HEADER]
        lowered: list[str] = []
        self.regexes: list[re.Pattern[str]] = []
        self.always = False
        for regex in regexes:
            if regex is None:
                continue
            known = _REQUIRED_LITERALS.get((regex.pattern, regex.flags))
            if known is not None:
                exact += [text for text in known[0] if text not in exact]
                lowered += [text for text in known[1] if text not in lowered]
            elif isinstance(regex.pattern, str) and not _CONTEXT_SENSITIVE.search(regex.pattern):
                self.regexes.append(regex)
            else:
                self.always = True
        self.exact = tuple(exact)
        self.lowered = tuple(lowered)
        # The first step's needles: each literal lower-cased (all are ASCII, so a text holding it
        # holds its lower-cased form once lower-cased), "error" standing for any that contains it.
        needles: list[str] = []
        for text in [*exact, *lowered]:
            needle = "error" if "error" in text.lower() else text.lower()
            if needle not in needles:
                needles.append(needle)
        self.needles = tuple(n for n in needles if not any(o != n and o in n for o in needles))

    def may_hit(self, text: str) -> bool:
        if self.always:
            return True
        folded = text.lower()
        if any(needle in folded for needle in self.needles):
            if any(literal in text for literal in self.exact):
                return True
            if any(literal in folded for literal in self.lowered):
                return True
        return any(regex.search(text) for regex in self.regexes)


@functools.lru_cache(maxsize=64)
def _prefilter(regexes: tuple[re.Pattern[str] | None, ...]) -> _ChunkPrefilter:
    return _ChunkPrefilter(regexes)


SCAN_CHUNK_CHARS = 1 << 20  # a log is read in pieces of about this many characters


def scan_log_errors(
    log: str | Iterable[str],
    patterns: Sequence[ErrorPattern | str] | None = None,
    limit: int = 1000,
) -> list[ErrorHit]:
    """Error-pattern hits in a node log (text or an iterable of lines), in line order.

    A Python traceback counts once, at its exception line; torchrun's SIGTERM cleanup traceback
    (ending in SignalException) and its "death signal" lines do not count.
    """
    scanner = _LogScanner(_as_patterns(patterns), limit)
    scanner.feed(log.splitlines() if isinstance(log, str) else log)
    return scanner.finish()


def scan_log_file(path: PathLike, patterns: Sequence[ErrorPattern], limit: int = 1000) -> list[ErrorHit]:
    """scan_log_errors over a file's lines, read in chunks: only a chunk that may hold a hit (or
    continues a traceback) is judged line by line."""
    scanner = _LogScanner(_as_patterns(patterns), limit)
    with open(path, "rb") as raw:
        data = raw.read(READ_BLOCK)
    if len(data) < READ_BLOCK:  # the whole file (read(n) is short only at its end)
        text = data.decode("utf-8", "replace")  # what the text layer below decodes, in one go
        if not scanner.prefilter.may_hit(text):
            return []
        scanner.feed_text(text, last=True)
        return scanner.finish()
    with open(path, encoding="utf-8", errors="replace", newline="") as handle:
        text = handle.read(SCAN_CHUNK_CHARS)
        while text:
            text += handle.readline()  # end the chunk at a line boundary
            following = handle.read(SCAN_CHUNK_CHARS)
            scanner.feed_text(text, last=not following)
            text = following
    return scanner.finish()


# ----------------------------------------------------------------------------- log metrics

PERF_LINE = re.compile(
    r"(?<![\w.-])performance\s*:\s*"
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s+"
    r"(?P<metric>[^\s,;]+)"
    r"(?:.*?\bnode_id\s*:\s*(?P<node>\d+))?",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class PerfLine:
    line: int
    value: float
    metric: str
    node_id: int | None = None


def parse_perf_lines(log: str | Iterable[str]) -> list[PerfLine]:
    """Every `performance: <value> <metric> [node_id: N]` line, in order (non-finite values skipped)."""
    lines = log.splitlines() if isinstance(log, str) else log
    found = []
    for number, line in enumerate(lines, start=1):
        match = PERF_LINE.search(line)
        if not match:
            continue
        value = float(match.group("value"))
        metric = match.group("metric").rstrip(".:")
        if not math.isfinite(value) or not metric:
            continue
        node = match.group("node")
        found.append(PerfLine(number, value, metric, int(node) if node else None))
    return found


RATE = re.compile(r"/s(?:ec)?(?![a-z])|per[_\-\s]?(?:s|sec|second)(?![a-z])|(?<![a-z])(?:qps|rps|fps|iops)")
RATE_WORDS = frozenset({"throughput", "bandwidth", "tflops", "gflops", "pflops", "flops", "gbps", "mbps"})
PER_DEVICE = re.compile(r"per[_\-\s]?(?:gpu|device|rank|node|card|accelerator|gcd)(?![a-z])")
LATENCY_WORDS = frozenset(
    {"latency", "time", "ms", "us", "ns", "sec", "secs", "seconds", "second", "duration", "elapsed",
     "ttft", "itl", "tpot", "e2e", "p50", "p90", "p95", "p99", "p999"}
)  # fmt: skip
MEMORY_WORDS = frozenset(
    {"mem", "memory", "gb", "gib", "mb", "mib", "kb", "kib", "bytes", "byte", "vram", "rss"}
)
COUNT_WORDS = frozenset(
    {"tok", "toks", "token", "tokens", "sample", "samples", "image", "images", "img", "imgs",
     "sequences", "seqs", "items", "queries", "requests"}
)  # fmt: skip


def metric_kind(metric: str) -> str:
    """throughput | per-device | latency | memory | unknown, from the metric's name.

    A rate that is already normalised per GPU/device (tok_per_s_per_gpu, TFLOPS_per_gpu) is averaged:
    summing per-GPU numbers over nodes would multiply them by the node count.
    """
    lowered = metric.lower()
    words = set(re.split(r"[^a-z0-9]+", lowered)) - {""}
    rate = bool(RATE.search(lowered)) or bool(words & RATE_WORDS) or any(w.endswith("flops") for w in words)
    if rate:
        return "per-device" if PER_DEVICE.search(lowered) else "throughput"
    if words & LATENCY_WORDS or any(w.startswith(("latency", "time")) for w in words):
        return "latency"
    if words & MEMORY_WORDS or any(w.startswith("mem") for w in words):
        return "memory"
    if words & COUNT_WORDS:
        return "per-device" if PER_DEVICE.search(lowered) else "throughput"
    return "unknown"


RULES = {
    "throughput": "sum (throughput)",
    "per-device": "mean (per-device throughput)",
    "latency": "mean (latency)",
    "memory": "max (memory)",
    "unknown": "mean (unknown metric kind)",
}


def combine_metric(metric: str, values: Sequence[float]) -> tuple[float, str]:
    """Combine one metric's per-node values by what it means: sum, mean or max, with the rule used."""
    if not values:
        raise ValueError(f"no values for metric {metric!r}")
    kind = metric_kind(metric)
    if kind == "throughput":
        return math.fsum(values), RULES[kind]
    if kind == "memory":
        return max(values), RULES[kind]
    return math.fsum(values) / len(values), RULES[kind]


def format_number(value: float) -> str:
    """A stable, short text form: 3 -> "3", 0.1+0.2 -> "0.3", 14164.25 -> "14164.25"."""
    if not math.isfinite(value):
        return ""
    rounded = round(value, 6)
    if rounded == int(rounded) and abs(rounded) < 1e15:
        return str(int(rounded))
    return repr(rounded)


# ----------------------------------------------------------------------------- the job directory


@dataclass
class NodeReport:
    rank: int
    node: str
    exit_code: int | None = None
    status: str = "missing"
    stages: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    log_errors: list[ErrorHit] = field(default_factory=list)
    dirname: str | None = None

    @property
    def label(self) -> str:
        return f"{self.node} (rank {self.rank})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "exit_code": self.exit_code,
            "status": self.status,
            "stages": dict(self.stages),
            "reasons": list(self.reasons),
            "log_errors": [hit.to_dict() for hit in self.log_errors[:MAX_ERRORS_KEPT]],
        }


@dataclass
class Summary:
    verdict: str
    job_id: str
    model: str
    nnodes: int
    results_csv: str | None
    chosen_csv: str | None
    candidates: list[Candidate]
    source: str
    log_metrics: dict[str, Any]
    nodes: list[NodeReport]
    reasons: list[str]
    warnings: list[str]
    perf_header: list[str]
    perf_rows: list[list[str]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "job_id": self.job_id,
            "model": self.model,
            "nnodes": self.nnodes,
            "results_csv": self.results_csv,
            "chosen_csv": self.chosen_csv,
            "candidates": [c.to_dict() for c in self.candidates],
            "source": self.source,
            "log_metrics": self.log_metrics,
            "nodes": [n.to_dict() for n in self.nodes],
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "perf_rows": len(self.perf_rows),
        }


def _read_json(path: PathLike) -> Any:
    """json.load of the file opened as UTF-8 text, without the text layer when it decodes cleanly."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # let the text layer raise (and word) it as it always did
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    if "\r" in text:  # what reading in text mode (universal newlines) does to line ends
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return json.loads(text)


def _json_error(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def load_job_json(jobdir: Path, warnings: list[str]) -> dict[str, Any]:
    path = jobdir / "job.json"
    if not _is(path, "any"):
        warnings.append("job.json missing: job id, model and nnodes derived from the job directory")
        return {}
    try:
        data = _read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        warnings.append(f"job.json unreadable ({_json_error(exc)}); derived what could be derived")
        return {}
    if not isinstance(data, dict):
        warnings.append("job.json is not a JSON object; ignored")
        return {}
    return data


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != []


def _manifest_key(models: dict[str, Any], key_hint: Any, model_hint: str | None) -> str | None:
    for hint in (key_hint, model_hint):
        if isinstance(hint, str) and hint in models:
            return hint
    if model_hint:
        named = [k for k, v in models.items() if isinstance(v, dict) and v.get("name") == model_hint]
        if len(named) == 1:
            return named[0]
    return next(iter(models)) if len(models) == 1 else None


def load_manifest_meta(
    path: PathLike, key_hint: Any, model_hint: str | None, warnings: list[str]
) -> dict[str, Any]:
    """Model metadata from a madengine build_manifest.json, in job.json's vocabulary."""
    try:
        data = _read_json(Path(path))
    except (OSError, ValueError, RecursionError) as exc:
        raise usage_error(f"{AREA}: cannot read manifest {path}: {_json_error(exc)}") from None
    models = data.get("built_models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise usage_error(f"{AREA}: manifest {path} has no built_models object; is it a build_manifest.json?")
    key = _manifest_key(models, key_hint, model_hint)
    if key is None:
        warnings.append(f"manifest has {len(models)} models and none matches; pass --model or set model_key")
        return {}
    model = models.get(key) if isinstance(models.get(key), dict) else {}
    images = data.get("built_images") if isinstance(data.get("built_images"), dict) else {}
    image = images.get(key) if isinstance(images.get(key), dict) else {}
    deploy = data.get("deployment_config") if isinstance(data.get("deployment_config"), dict) else {}
    slurm = deploy.get("slurm") if isinstance(deploy.get("slurm"), dict) else {}
    dist = deploy.get("distributed") if isinstance(deploy.get("distributed"), dict) else {}
    meta = {
        "model_key": key,
        "model": model.get("name"),
        "args": model.get("args"),
        "tags": model.get("tags"),
        "dockerfile": model.get("dockerfile") or image.get("dockerfile"),
        "n_gpus": model.get("n_gpus"),
        "additional_docker_run_options": model.get("additional_docker_run_options"),
        "results_csv": model.get("multiple_results"),
        "image": image.get("docker_image"),
        "base_docker": image.get("base_docker"),
        "build_duration": image.get("build_duration"),
        "gpus_per_node": slurm.get("gpus_per_node"),
        "launcher": dist.get("launcher"),
        "nnodes": dist.get("nnodes") or slurm.get("nodes"),
    }
    return {k: v for k, v in meta.items() if _present(v)}


def merge_meta(job: dict[str, Any], model: str | None, manifest: dict[str, Any]) -> dict[str, Any]:
    """job.json wins, then --model, then the manifest (they only fill what job.json lacks).

    --model may name the manifest entry (its key) rather than the model: then the entry's name counts.
    """
    merged = dict(manifest)
    if model and manifest.get("model_key") != model:
        merged["model"] = model
    merged.update({k: v for k, v in job.items() if _present(v)})
    return merged


def job_id_from_dir(jobdir: Path) -> str:
    """`slurm-multi-4711` -> `4711`; a name without trailing digits is used as it is."""
    name = jobdir.resolve().name
    match = re.search(r"(\d+)$", name)
    return match.group(1) if match else name


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,18}\s*", value):
        return int(value)
    return None


def _as_seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return round(seconds, 3) if math.isfinite(seconds) else None


def _is(path: PathLike, kind: str) -> bool:
    """Path.is_dir/is_file/exists that answer False instead of raising (e.g. on EACCES).

    One os.stat (following links, as those do), without building Path objects: collect calls this
    a few times per node.
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # ValueError: a NUL in the name, which Path answers False for too
        return False
    return stat.S_ISDIR(mode) if kind == "dir" else stat.S_ISREG(mode) if kind == "file" else True


def node_dirs(jobdir: Path) -> dict[int, str]:
    """rank -> directory name for every `node_<rank>` entry in the job directory."""
    found: dict[int, str] = {}
    for entry in sorted(os.listdir(jobdir)):
        match = re.fullmatch(r"node_(\d{1,9})", entry)
        if match:
            found.setdefault(int(match.group(1)), entry)
    return found


def _stage_order(stages: dict[str, Any]) -> list[str]:
    known = [name for name in STAGE_ORDER if name in stages]
    return known + sorted(name for name in stages if name not in STAGE_ORDER)


def _failed_stage(stages: dict[str, Any]) -> str | None:
    for name in _stage_order(stages):
        info = stages[name]
        if isinstance(info, dict) and info.get("status") not in (None, "ok", "skipped"):
            return name
    return None


def _status_reason(status: str, exit_code: int | None, stages: dict[str, Any], note: str) -> str:
    stage = _failed_stage(stages)
    where = f" in stage {stage}" if stage else ""
    if status == "timeout":
        text = f"timed out{where}"
    elif status == "aborted":
        text = f"aborted{where}"
    elif exit_code not in (None, 0):
        text = (
            f"container exited {exit_code}"
            if stage in (None, "run")
            else f"stage {stage} failed (exit {exit_code})"
        )
    elif status != "ok":
        text = f"status {status!r}{where}"
    else:
        text = f"exit code {exit_code} although status is ok"
    return f"{text}: {_short(note, 200)}" if note else text


def read_node(
    jobdir: Path,
    rank: int,
    dirname: str | None,
    names: Sequence[Any],
    patterns: Sequence[ErrorPattern],
    known_secrets: Sequence[str] | None = None,
) -> NodeReport:
    """One node's status.json and node.log, judged; never raises on what the node left behind.

    known_secrets: the values to mask in log excerpts (default: secret_values(os.environ)).
    """
    fallback = names[rank] if rank < len(names) and isinstance(names[rank], str) and names[rank] else None
    report = NodeReport(rank, fallback or f"node_{rank}", dirname=dirname)
    if dirname is None:
        report.reasons.append(f"{report.label}: no status.json (task never staged)")
        return report
    node_dir = os.path.join(jobdir, dirname)
    status_path = os.path.join(node_dir, "status.json")
    try:  # the common case first, without a stat: a status.json that reads as a JSON object
        data = _read_json(status_path)
    except (OSError, ValueError, RecursionError):
        data = None
    if isinstance(data, dict):
        _judge_status(data, report)  # it was read, so the node dir is a directory and it exists
    elif not _is(node_dir, "dir"):  # otherwise the checks in their usual order say what is wrong
        report.reasons.append(f"{report.label}: no status.json (task never staged)")
        return report
    else:
        _read_status(status_path, report)
    log = os.path.join(node_dir, "node.log")
    if _is(log, "file"):
        try:
            report.log_errors = _redacted(scan_log_file(log, patterns), known_secrets)
        except OSError as exc:
            report.reasons.append(f"{report.label}: node.log unreadable: {exc.strerror or exc}")
        if report.log_errors:
            first, count = report.log_errors[0], len(report.log_errors)
            more = f"; +{count - 1} more" if count > 1 else ""
            where = f"error pattern {first.pattern!r} at node.log:{first.line}"
            report.reasons.append(f"{report.label}: {where} ({first.text}{more})")
    return report


def _redacted(hits: list[ErrorHit], known: Sequence[str] | None = None) -> list[ErrorHit]:
    """Log excerpts go to summary.json and stderr: mask secret values from this environment."""
    if not hits:
        return hits
    if known is None:
        known = secret_values(os.environ)
    return [ErrorHit(h.line, h.pattern, redact(h.text, known)) for h in hits] if known else hits


def _read_status(path: PathLike, report: NodeReport) -> None:
    if not _is(path, "any"):
        report.reasons.append(f"{report.label}: no status.json (task never staged)")
        return
    try:
        data = _read_json(path)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError, RecursionError) as exc:
        report.status = "unreadable"
        report.reasons.append(f"{report.label}: status.json unreadable: {_json_error(exc)}")
        return
    _judge_status(data, report)


def _judge_status(data: dict[str, Any], report: NodeReport) -> None:
    if isinstance(data.get("node"), str) and data["node"]:
        report.node = data["node"]
    stages = data.get("stages") if isinstance(data.get("stages"), dict) else {}
    for name in _stage_order(stages):
        info = stages[name]
        seconds = _as_seconds(info.get("seconds")) if isinstance(info, dict) else None
        if seconds is not None:
            report.stages[str(name)] = seconds
    report.exit_code = _as_int(data.get("exit_code"))
    report.status = str(data.get("status") or "unknown")
    if report.status != "ok" or report.exit_code not in (None, 0):
        note = data.get("reason") if isinstance(data.get("reason"), str) else ""
        reason = _status_reason(report.status, report.exit_code, stages, note)
        report.reasons.append(f"{report.label}: {reason}")


# ----------------------------------------------------------------------------- perf.csv rows


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, (list, tuple)):
        return ",".join(cell(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


SECRET_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def _mask_one(match: re.Match[str]) -> str:
    return f"{match.group(1)}={MASK}" if is_secret_name(match.group(1)) else match.group(0)


def mask_secret_assignments(text: str) -> str:
    """`-e HF_TOKEN=hf_abc` -> `-e HF_TOKEN=***`: perf.csv is shared, secrets must not ride in it."""
    return SECRET_ASSIGNMENT.sub(_mask_one, text)


def common_row(meta: dict[str, Any], job_id: str, nnodes: int, test_duration: str) -> dict[str, str]:
    """The per-job columns every perf.csv row shares."""
    row = {}
    for column in PERF_COLUMNS:
        value = meta.get(column)
        if not _present(value) and column in JOB_KEY_ALIASES:
            value = meta.get(JOB_KEY_ALIASES[column])
        row[column] = cell(value)
    row["args"] = mask_secret_assignments(row["args"])
    row["additional_docker_run_options"] = mask_secret_assignments(row["additional_docker_run_options"])
    row.update(nnodes=str(nnodes), machine_name=job_id, deployment_type="slurm", test_duration=test_duration)
    row.update(performance="", metric="", status="FAILURE")
    return row


def csv_perf_rows(
    chosen: Candidate, base: dict[str, str], model: str, ok: bool
) -> tuple[list[str], list[list[str]]]:
    """madengine's rows for a multiple-results CSV: model `<name>_<csv model>`, extras appended."""
    header = list(chosen.header)
    lowered = [name.lower() for name in header]
    index = {
        name: lowered.index(name) if name in lowered else None for name in ("model", "performance", "metric")
    }
    extras, fills, seen = [], [], set(PERF_COLUMNS)
    for position, name in enumerate(header):
        if name.lower() in ("model", "performance", "metric") or name in OWNED_COLUMNS:
            continue
        if name in PERF_COLUMNS:
            fills.append((name, position))  # e.g. a CSV `training_precision` fills madengine's column
            continue
        shown = name or f"column_{position + 1}"
        if shown in seen:
            continue  # a duplicate header name: the first one wins
        seen.add(shown)
        extras.append((shown, position))
    rows = []
    for record in chosen.records:
        row = dict(base)
        csv_model = record[index["model"]] if index["model"] is not None else ""
        row["model"] = f"{model}_{csv_model}" if csv_model else model
        performance = record[index["performance"]] if index["performance"] is not None else ""
        row["performance"] = "" if is_empty_value(performance) else performance
        row["metric"] = record[index["metric"]] if index["metric"] is not None else ""
        row["status"] = "SUCCESS" if row["performance"] and ok else "FAILURE"
        for name, position in fills:
            if record[position]:
                row[name] = record[position]
        rows.append([row[c] for c in PERF_COLUMNS] + [record[p] for _, p in extras])
    return list(PERF_COLUMNS) + [name for name, _ in extras], rows


def log_perf_rows(metrics: dict[str, Any], base: dict[str, str], model: str, ok: bool) -> list[list[str]]:
    rows = []
    for metric, info in metrics.items():
        row = dict(base, model=model, metric=metric, performance=format_number(info["value"]))
        row["status"] = "SUCCESS" if ok else "FAILURE"
        rows.append([row[c] for c in PERF_COLUMNS])
    return rows


def collect_log_metrics(jobdir: Path, nodes: Sequence[NodeReport]) -> dict[str, Any]:
    """Per metric: the combined value, the rule and each node's last value (nodes in rank order)."""
    per_metric: dict[str, list[dict[str, Any]]] = {}
    for node in nodes:
        log = jobdir / node.dirname / "node.log" if node.dirname else None
        if log is None or not _is(log, "file"):
            continue
        try:
            with open(log, encoding="utf-8", errors="replace", newline="") as handle:
                lines = parse_perf_lines(handle)
        except OSError:
            continue
        last: dict[str, float] = {}  # in order of first appearance
        for line in lines:
            last[line.metric] = line.value  # a node that prints a metric again: its last value counts
        for metric in last:
            per_metric.setdefault(metric, []).append(
                {"rank": node.rank, "node": node.node, "value": last[metric]}
            )
    combined = {}
    for metric, values in per_metric.items():
        value, rule = combine_metric(metric, [v["value"] for v in values])
        combined[metric] = {"rule": rule, "value": round(value, 6), "values": values}
    return combined


# ----------------------------------------------------------------------------- collect


def _job_nnodes(meta: dict[str, Any], found: dict[int, str]) -> int:
    for value in (meta.get("nnodes"), len(meta["nodes"]) if isinstance(meta.get("nodes"), list) else None):
        number = _as_int(value)
        if number is not None and 0 < number <= MAX_NODES:
            return number
    return max(found) + 1 if found else 0


def _candidates(jobdir: Path, nodes: Sequence[NodeReport], results_csv: str | None) -> list[Candidate]:
    if not results_csv:
        return []
    candidates = []
    for node in nodes:  # rank order: a tie goes to the higher rank
        path = os.path.join(jobdir, node.dirname, results_csv) if node.dirname else ""
        if node.dirname and _is(path, "any"):
            candidates.append(_score(path, f"{node.dirname}/{results_csv}"))  # = pick_best's scores
    return candidates


def collect(
    jobdir: PathLike,
    manifest: PathLike | None = None,
    model: str | None = None,
    error_patterns: Sequence[ErrorPattern] | None = None,
    write: bool = True,
) -> Summary:
    """Judge a job directory and (by default) write JOBDIR/perf.csv and JOBDIR/summary.json."""
    root = Path(jobdir)
    if not root.is_dir():
        raise usage_error(f"{AREA}: job directory {jobdir} does not exist; pass the directory the job wrote")
    patterns = list(error_patterns) if error_patterns is not None else list(DEFAULT_ERROR_PATTERNS)
    warnings: list[str] = []
    job = load_job_json(root, warnings)
    manifest_meta = load_manifest_meta(manifest, job.get("model_key"), model, warnings) if manifest else {}
    meta = merge_meta(job, model, manifest_meta)
    job_id = cell(meta.get("job_id")) or job_id_from_dir(root)
    model_name = cell(meta.get("model")) or cell(meta.get("model_key")) or "unknown_model"
    try:
        found = node_dirs(root)
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot list {jobdir}: {exc.strerror or exc}") from None
    nnodes = _job_nnodes(meta, found)
    names = meta.get("nodes") if isinstance(meta.get("nodes"), list) else []
    ranks = sorted(set(range(nnodes)) | set(found))
    extra = [found[rank] for rank in ranks if rank >= nnodes and rank in found]
    if extra and _present(meta.get("nnodes")):
        warnings.append(f"{', '.join(extra)} beyond nnodes {nnodes}: judged like the others")
    known = secret_values(os.environ)  # once per job, not once per node
    nodes = [read_node(root, rank, found.get(rank), names, patterns, known) for rank in ranks]
    if not _present(meta.get("image_id")):
        meta["image_id"] = rank0_image_id(root, found.get(0))
    results_csv = Path(cell(meta.get("results_csv"))).name or None
    summary = judge(root, meta, job_id, model_name, nnodes, results_csv, nodes, warnings)
    if write:
        write_outputs(root, summary)
    return summary


def rank0_image_id(root: Path, node_dir: str | None) -> str:
    """The image every node ran (rank 0's, sent in GO), from node_0/status.json if it says."""
    if node_dir is None:
        return ""
    try:
        data = json.loads((root / node_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    return cell(data.get("image_id")) if isinstance(data, dict) else ""


def judge(
    root: Path,
    meta: dict[str, Any],
    job_id: str,
    model_name: str,
    nnodes: int,
    results_csv: str | None,
    nodes: list[NodeReport],
    warnings: list[str],
) -> Summary:
    """Failures first (exits, missing nodes, error patterns), then the aggregate (CSV, else log lines)."""
    reasons = [reason for node in nodes for reason in node.reasons]
    if not nodes:
        reasons.append("no node_<rank> directories in the job directory; did any task stage?")
    nodes_ok = not reasons
    candidates = _candidates(root, nodes, results_csv)
    chosen = choose(candidates)
    run_seconds = [n.stages["run"] for n in nodes if "run" in n.stages]
    base = common_row(meta, job_id, nnodes, format_number(max(run_seconds)) if run_seconds else "")
    header, rows, log_metrics, source = list(PERF_COLUMNS), [], {}, "none"
    if chosen is not None:
        source = "csv"
        header, rows = csv_perf_rows(chosen, base, model_name, nodes_ok)
    elif candidates:
        reasons.append(no_candidate_message(candidates))
    else:
        log_metrics = collect_log_metrics(root, nodes)
        if log_metrics:
            source = "log"
            rows = log_perf_rows(log_metrics, base, model_name, nodes_ok)
        else:
            wanted = (
                f"no result CSV ({results_csv}) in any node" if results_csv else "no result CSV name known"
            )
            reasons.append(f"{wanted} and no 'performance: <value> <metric>' line in any node.log")
    if not rows:
        rows = [[dict(base, model=model_name)[c] for c in PERF_COLUMNS]]
    verdict = (
        "SUCCESS"
        if not reasons and any(r[PERF_COLUMNS.index("status")] == "SUCCESS" for r in rows)
        else "FAILURE"
    )
    return Summary(
        verdict, job_id, model_name, nnodes, results_csv, chosen.path if chosen else None, candidates,
        source, log_metrics, nodes, reasons, warnings, header, rows,
    )  # fmt: skip


# ----------------------------------------------------------------------------- output


def perf_csv_text(summary: Summary) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(summary.perf_header)
    writer.writerows(summary.perf_rows)
    return buffer.getvalue()


def summary_json_text(summary: Summary) -> str:
    return _dumps_indent2(summary.to_dict()) + "\n"


class _NotPlainJson(Exception):
    """A value _dumps_indent2 leaves to json.dumps (a non-str key, an object json would reject)."""


_encode_json_str = json.encoder.encode_basestring  # what json.dumps(ensure_ascii=False) quotes with


def _json_float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == math.inf:
        return "Infinity"
    if value == -math.inf:
        return "-Infinity"
    return float.__repr__(value)


def _emit_json(value: Any, out: list[str], newline: str) -> None:
    """Append `value` as json.dumps(indent=2, ensure_ascii=False) writes it (same type tests, in the
    same order); `newline` is the line break plus the indentation of the line the value starts on."""
    if isinstance(value, str):
        out.append(_encode_json_str(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_json_float(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = newline + "  "
        separator = "[" + inner
        for item in value:
            out.append(separator)
            _emit_json(item, out, inner)
            separator = "," + inner
        out.append(newline + "]")
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        inner = newline + "  "
        separator = "{" + inner
        append = out.append
        for key, item in value.items():
            if not isinstance(key, str):
                raise _NotPlainJson
            kind = type(item)  # exact types: the common scalars without a recursive call
            if kind is str:
                append(f"{separator}{_encode_json_str(key)}: {_encode_json_str(item)}")
            elif kind is float and item == item and item not in (math.inf, -math.inf):
                append(f"{separator}{_encode_json_str(key)}: {float.__repr__(item)}")
            elif kind is int:
                append(f"{separator}{_encode_json_str(key)}: {int.__repr__(item)}")
            else:
                append(f"{separator}{_encode_json_str(key)}: ")
                _emit_json(item, out, inner)
            separator = "," + inner
        append(newline + "}")
    else:
        raise _NotPlainJson


def _dumps_indent2(value: Any) -> str:
    """json.dumps(value, indent=2, ensure_ascii=False), byte for byte, several times faster: before
    Python 3.14 an indented dump runs json's pure-Python encoder, ~10 ms for a 1,000-node summary."""
    out: list[str] = []
    try:
        _emit_json(value, out, "\n")
    except (_NotPlainJson, RecursionError):  # json.dumps says what is wrong, or copes (int keys)
        return json.dumps(value, indent=2, ensure_ascii=False)
    return "".join(out)


def write_atomic(path: Path, text: str) -> None:
    """Write via a sibling temp file + os.replace, so a reader never sees half a file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise HelperError(
            f"{AREA}: cannot write {path}: {exc.strerror or exc}; is the job directory writable?"
        ) from None


def write_outputs(root: Path, summary: Summary) -> None:
    write_atomic(root / "perf.csv", perf_csv_text(summary))
    write_atomic(root / "summary.json", summary_json_text(summary))


def summary_table(summary: Summary, root: Path) -> list[str]:
    """The short human report collect prints on stderr."""
    lines = [f"{AREA}: job {summary.job_id} ({summary.model}, {summary.nnodes} nodes): {summary.verdict}"]
    if summary.chosen_csv:
        chosen = next(c for c in summary.candidates if c.path == summary.chosen_csv)
        lines.append(f"  chosen CSV: {chosen.describe()} (of {len(summary.candidates)} candidates)")
    elif summary.source == "log":
        lines.append(f"  source: 'performance:' log lines ({len(summary.log_metrics)} metrics)")
    else:
        lines.append(f"  chosen CSV: none ({len(summary.candidates)} candidates)")
    lines.append(f"  perf rows: {len(summary.perf_rows)} -> {root / 'perf.csv'}")
    stages = _stage_order({name: 0 for node in summary.nodes for name in node.stages})
    rows = [["rank", "node", "status", "exit", *stages]]
    for node in summary.nodes:
        exit_code = "" if node.exit_code is None else str(node.exit_code)
        timings = [format_number(node.stages[s]) if s in node.stages else "-" for s in stages]
        rows.append([str(node.rank), node.node, node.status, exit_code or "-", *timings])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"  reason: {reason}" for reason in summary.reasons[:MAX_TABLE_REASONS]]
    if len(summary.reasons) > MAX_TABLE_REASONS:
        lines.append(f"  reason: +{len(summary.reasons) - MAX_TABLE_REASONS} more (see summary.json)")
    lines += [f"  warning: {warning}" for warning in summary.warnings]
    return lines


# ----------------------------------------------------------------------------- CLI


@click.group("results", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Pick the best per-node results CSV and aggregate a job into perf.csv + summary.json.

    Exit codes: 0 success, 1 failure (FAILURE verdict, no usable CSV), 2 usage / bad input file.
    """


@cli.command("pick")
@click.argument("csv_paths", metavar="CSV...", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the choice and every candidate's score as JSON.")
def pick_command(csv_paths: tuple[str, ...], as_json: bool) -> None:
    """Print the CSV with the most non-empty `performance` values.

    Ties go to more rows, then to the LATER argument (pass them in rank order: the last global rank
    usually holds the throughput). A broken candidate is scored with its error, never fatal.

    Example: slurm-multi results pick JOBDIR/node_*/perf_toy.csv
    """
    chosen, candidates = pick_best(list(csv_paths))
    if as_json:
        payload = {"chosen": chosen.path if chosen else None, "candidates": [c.to_dict() for c in candidates]}
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    elif chosen is not None:
        click.echo(chosen.path)
    if chosen is None:
        raise HelperError(f"{AREA}: {no_candidate_message(candidates)}", EXIT_FAILURE)


@cli.command("collect")
@click.argument("jobdir", metavar="JOBDIR", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--manifest",
    type=click.Path(dir_okay=False, path_type=Path),
    help="build_manifest.json that fills model metadata job.json lacks.",
)
@click.option("--model", metavar="NAME", help="Model name (or manifest key) when job.json lacks it.")
@click.option(
    "--error-pattern",
    "error_patterns",
    multiple=True,
    metavar="REGEX",
    help="Extra regex that marks a node log as failed (repeatable).",
)
@click.option(
    "--no-default-patterns", is_flag=True, help="Use only --error-pattern regexes, not the built-in ones."
)
@click.option("--json", "as_json", is_flag=True, help="Print summary.json on stdout too.")
def collect_command(
    jobdir: Path,
    manifest: Path | None,
    model: str | None,
    error_patterns: tuple[str, ...],
    no_default_patterns: bool,
    as_json: bool,
) -> None:
    """Judge JOBDIR and write JOBDIR/perf.csv and JOBDIR/summary.json; exit 0 SUCCESS, 1 FAILURE.

    Example: slurm-multi results collect /shared/jobs/4711 --manifest build_manifest.json
    """
    if not jobdir.is_dir():
        raise usage_error(f"{AREA}: job directory {jobdir} does not exist; pass the directory the job wrote")
    if manifest is not None and not manifest.is_file():
        raise usage_error(f"{AREA}: manifest {manifest} does not exist")
    patterns = compile_patterns(error_patterns, defaults=not no_default_patterns)
    summary = collect(jobdir, manifest, model, patterns)
    if as_json:
        click.echo(summary_json_text(summary), nl=False)
    for line in summary_table(summary, jobdir):
        click.echo(line, err=True)
    click.get_current_context().exit(EXIT_OK if summary.verdict == "SUCCESS" else EXIT_FAILURE)
