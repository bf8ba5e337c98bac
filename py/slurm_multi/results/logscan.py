"""The error scan of a node log: named error patterns, Python tracebacks read as blocks, and
torchrun's own SIGTERM cleanup left to the exit codes.

A log is read in large chunks; a chunk that cannot hold a hit (no literal any pattern needs, no
traceback header) skips the per-line work, which keeps collect over 1,000 clean logs fast.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, AnyStr

from slurm_multi.common import usage_error
from slurm_multi.readfile import PathLike
from slurm_multi.results.shared import AREA, READ_BLOCK, read_bytes, short

MAX_TRACEBACK_LINES = 400  # a "Traceback" header with no exception line within this is not a traceback
SCAN_CHUNK_CHARS = 1 << 20  # a log is read in pieces of about this many characters


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
# madengine's own benign lines (its log error scan, container_runner.py): the metrics agent's
# connection noise, FutureWarning, and ROCProf / rocpd / rpd tracer output (glog E/W lines are log
# levels, not errors). A line that holds one never counts, whatever pattern it matches.
MADENGINE_BENIGN_TEXT = (
    "Failed to establish connection to the metrics exporter agent",
    "RpcError: Running out of retries to initialize the metrics agent",
    "Metrics will not be exported",
    "FutureWarning",
    "Opened result file:",
    "SQLite3 generation ::",
    "rocpd_op:",
    "rpd_tracer:",
)
MADENGINE_BENIGN_REGEX = (
    r"^[EW][0-9]{8}.*generateRocpd\.cpp",
    r"^W[0-9]{8}.*simple_timer\.cpp",
    r"^E[0-9]{8}.*tool\.cpp",
    r"\[rocprofv3\]",
)
# torchrun's own cleanup when it gets SIGTERM (scancel, the end of a step, our teardown): the agent
# logs "Received 15 death signal, shutting down workers", "Sending process N closing signal SIGTERM"
# and exits through a traceback ending in `...api.SignalException: Process N got signal: 15`.
# That is the launcher being stopped, not the workload failing; exit codes judge that case.
# BENIGN_LINE: those lines and madengine's.
BENIGN_LINE = re.compile(
    "|".join(
        [
            r"SignalException",
            r"death signal, shutting down workers",
            r"Sending process \d+ closing signal SIG\w+",
            r"Unable to shutdown process \d+ via \S+, forcefully exiting via",
            *map(re.escape, MADENGINE_BENIGN_TEXT),
            *MADENGINE_BENIGN_REGEX,
        ]
    )
)


def compile_patterns(extra: Sequence[str] = (), defaults: bool = True) -> list[ErrorPattern]:
    """Default patterns plus user regexes (named by their text); a bad regex is a usage error.
    (A model's log_error_patterns take the default patterns' place later: model_patterns.)"""
    patterns = list(DEFAULT_ERROR_PATTERNS) if defaults else []
    for text in extra:
        try:
            patterns.append(ErrorPattern(text, re.compile(text)))
        except re.error as exc:
            raise usage_error(f"{AREA}: bad --error-pattern {text!r}: {exc}; fix the regex") from None
    return patterns


def literal_patterns(texts: Sequence[str]) -> list[ErrorPattern]:
    """madengine's patterns: literal, case-sensitive substrings, each named by its text."""
    return [ErrorPattern(text, re.compile(re.escape(text))) for text in texts]


def model_patterns(
    given: Sequence[ErrorPattern], scan: bool = True, literals: Sequence[str] = ()
) -> list[ErrorPattern]:
    """The patterns a job's logs are scanned with: `given` (compile_patterns: the default patterns
    unless --no-default-patterns, then the --error-pattern regexes) with the model's manifest fields
    applied as madengine applies them. A non-empty log_error_patterns (`literals`) replaces the default
    patterns where they are; log_error_pattern_scan false (`scan`) drops them. The --error-pattern
    regexes stay either way: a person asked collect for them."""
    extra = [pattern for pattern in given if pattern not in DEFAULT_ERROR_PATTERNS]
    if not scan:
        return extra
    if not literals or len(extra) == len(given):  # no model patterns, or --no-default-patterns
        return list(given)
    return literal_patterns(literals) + extra


def _as_patterns(patterns: Sequence[ErrorPattern | str] | None) -> list[ErrorPattern]:
    if patterns is None:
        return list(DEFAULT_ERROR_PATTERNS)
    return [
        item if isinstance(item, ErrorPattern) else ErrorPattern(item, re.compile(item)) for item in patterns
    ]


@dataclass
class _Traceback:
    """A traceback being read: its header's prefix (e.g. `[rank0]: `) and its lines so far (the header
    line first)."""

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


def _plain_line_hit(
    number: int, line: str, patterns: Sequence[ErrorPattern], benign: Sequence[str] = ()
) -> ErrorHit | None:
    """A hit when the line matches a pattern and holds no benign text (ours, madengine's, the
    model's log_error_benign_patterns: literal substrings)."""
    name = _first_match(line, patterns)
    if not name or BENIGN_LINE.search(line) or any(text in line for text in benign):
        return None
    return ErrorHit(number, name, short(line))


def _traceback_hit(
    block: _Traceback, number: int, line: str, patterns: Sequence[ErrorPattern], benign: Sequence[str] = ()
) -> ErrorHit | None:
    """One hit per finished traceback: at its exception line, named by the pattern it matches. A
    traceback whose exception line is benign (torchrun's SignalException, the model's benign text)
    counts nothing."""
    if "SignalException" in line or any(text in line for text in benign):
        return None
    name = _first_match(line, patterns)
    if name:
        return ErrorHit(number, name, short(line))
    if any(p.regex is None for p in patterns):
        return ErrorHit(number, "Traceback", short(line))
    for frame_number, frame in block.lines:  # the header first: a literal pattern may name it
        hit = _plain_line_hit(frame_number, frame, patterns, benign)
        if hit:
            return hit
    return None


class _LogScanner:
    """The line-by-line judgement behind scan_log_errors, fed in pieces so that a file can be read
    in large chunks and a chunk that cannot hold a hit skips the per-line work (see feed_text)."""

    def __init__(self, patterns: Sequence[ErrorPattern], limit: int, benign: Sequence[str] = ()) -> None:
        self.patterns = patterns
        self.benign = tuple(benign)
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
        patterns, benign, add = self.patterns, self.benign, self.add
        block = self.block
        number = self.number
        for raw in lines:
            number += 1
            line = raw.rstrip("\r\n")
            if block is None:
                at = line.find(TRACEBACK_HEADER)
                if at >= 0:
                    block = _Traceback(line[:at], [(number, line)])
                else:
                    add(_plain_line_hit(number, line, patterns, benign))
                continue
            body = block.body(line)
            if body is not None and (not body.strip() or body[0].isspace()):
                block.lines.append((number, line))  # a frame, a source line or a ^^^^ marker
            elif body is not None and EXCEPTION_LINE.match(body):
                add(_traceback_hit(block, number, body, patterns, benign))
                block = None
            else:
                add(_plain_line_hit(number, line, patterns, benign))  # output of another process
            if block is not None and len(block.lines) > MAX_TRACEBACK_LINES + 1:  # + its header
                for stale in block.lines:  # no exception line came: judge its lines one by one
                    add(_plain_line_hit(*stale, patterns, benign))
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
            self.add(_plain_line_hit(*stale, self.patterns, self.benign))
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
            literal = _plain_literal(regex)
            if known is not None:
                exact += [text for text in known[0] if text not in exact]
                lowered += [text for text in known[1] if text not in lowered]
            elif literal is not None:
                exact += [literal] if literal not in exact else []
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
        # The same, as bytes, for a text that is all ASCII: bytes.lower() is str.lower() there, and a
        # literal with a non-ASCII character is in neither form of it.
        self.needles_ascii = tuple(n.encode() for n in self.needles)
        self.exact_ascii = tuple(t.encode() for t in self.exact)
        self.lowered_ascii = tuple(t.encode() for t in self.lowered)

    def may_hit(self, text: str) -> bool:
        if self.always:
            return True
        return _holds_literal(text, text.lower(), self.needles, self.exact, self.lowered) or any(
            regex.search(text) for regex in self.regexes
        )

    def may_hit_ascii(self, data: bytes) -> bool:
        """may_hit(data.decode()) for bytes that are all ASCII, without decoding them: most of every
        log holds no needle (and lower-casing bytes is several times cheaper than a str)."""
        if self.always:
            return True
        ascii_literals = (self.needles_ascii, self.exact_ascii, self.lowered_ascii)
        if _holds_literal(data, data.lower(), *ascii_literals):
            return True
        return bool(self.regexes) and any(regex.search(data.decode("ascii")) for regex in self.regexes)


def _plain_literal(regex: re.Pattern[str]) -> str | None:
    """The ASCII text a regex matches exactly (`FATAL`, re.escape of a manifest's literal pattern),
    else None. Only then does "the text holds it" (as given, or lower-cased in the lower-cased text)
    decide whether a line can match it."""
    if not isinstance(regex.pattern, str) or regex.flags != re.UNICODE:
        return None
    text = re.sub(r"\\(.)", r"\1", regex.pattern, flags=re.DOTALL)
    return text if text and text.isascii() and re.escape(text) == regex.pattern else None


def _holds_literal(text: AnyStr, folded: AnyStr, needles: Sequence[AnyStr], exact: Sequence[AnyStr],
                   lowered: Sequence[AnyStr]) -> bool:  # fmt: skip
    """A needle in the lower-cased text, then a literal: as given in the text, or lower-cased."""
    if not any(needle in folded for needle in needles):
        return False
    return any(literal in text for literal in exact) or any(literal in folded for literal in lowered)


@functools.lru_cache(maxsize=64)
def _prefilter(regexes: tuple[re.Pattern[str] | None, ...]) -> _ChunkPrefilter:
    return _ChunkPrefilter(regexes)


def scan_log_errors(
    log: str | Iterable[str],
    patterns: Sequence[ErrorPattern | str] | None = None,
    limit: int = 1000,
    benign: Sequence[str] = (),
) -> list[ErrorHit]:
    """Error-pattern hits in a node log (text or an iterable of lines), in line order.

    A Python traceback counts once, at its exception line; torchrun's SIGTERM cleanup traceback
    (ending in SignalException) and its "death signal" lines do not count, nor does a line holding
    one of the `benign` texts (literal substrings) or one of madengine's own benign texts.
    """
    scanner = _LogScanner(_as_patterns(patterns), limit, benign)
    scanner.feed(log.splitlines() if isinstance(log, str) else log)
    return scanner.finish()


def scan_log_file(
    path: PathLike, patterns: Sequence[ErrorPattern], limit: int = 1000, benign: Sequence[str] = ()
) -> list[ErrorHit]:
    """scan_log_errors over a file's lines, read in chunks: only a chunk that may hold a hit (or
    continues a traceback) is judged line by line."""
    scanner = _LogScanner(_as_patterns(patterns), limit, benign)
    data = read_bytes(path, READ_BLOCK)
    if len(data) < READ_BLOCK:  # the whole file (read(n) is short only at its end)
        if data.isascii():
            if not scanner.prefilter.may_hit_ascii(data):
                return []
            text = data.decode("ascii")
        else:
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
