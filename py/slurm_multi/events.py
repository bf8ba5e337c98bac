"""A node's events (node_<rank>/events.log): the one module that writes and reads their lines.

lib/timeline.sh appends them from bash (`timeline::event NAME [KEY=VALUE ...]`), the hang watch
through `write_event`; collect's timeline (results/timeline.py, via `parse_events`) and the batch
step's watch and sm-demo (`current_stage`: a node's last `stage_start`) read them here, so nobody
learns a node's stage by scraping node.log.

One event per line, fields separated by one space:

    1764500000.123456 stage_end rank=0 host=node1 stage=image status=ok

- the time (epoch seconds, `$EPOCHREALTIME`), the event's name, then KEY=VALUE fields (`rank` and
  `host` first, the node's); the first `=` of a field ends its key (a key's own `=` is `%3D`).
- Every token (name, key, value) is percent-encoded: `%`, space and the ASCII control characters
  (newline, tab, ...; DEL) are `%XX` (upper-case hex), everything else is itself. So a value cannot
  break its line or its field, and nothing needs quoting.
- A value that reads as a plain JSON number (`12`, `-3`, `0.25`, `1e9`; not `007`, `+1`, `nan`) is
  a number, anything else a string (the name and `host` are always strings).
- A line is written in one write() with its line end, so a few processes of one node may append at
  once; a line without its line end (the file's last, torn by a kill mid-write) is not an event.

Job directories of earlier versions have `events.jsonl` instead, one JSON object per line
(`{"t":…,"event":…,"rank":…,"host":…,KEY:VALUE…}`): it is read too (`events_path`), and a line that
starts with `{` is read as JSON in either file. What a reader gets is the same for both forms.

    python -m slurm_multi.events stages JOBDIR NRANKS   ->   node_0=image node_1=barrier ...
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from typing import Any

from slurm_multi import statusfile
from slurm_multi.logline import short
from slurm_multi.readfile import finite, read_bytes

EVENTS_FILE = "events.log"
# A node task's stages in the order it runs them: one owner, stages.txt beside this module, which
# lib/node.sh reads too (NODE_STAGES).
with open(os.path.join(os.path.dirname(__file__), "stages.txt"), encoding="utf-8") as _handle:
    STAGE_ORDER = tuple(_handle.read().split())
OLD_EVENTS_FILE = "events.jsonl"  # earlier versions: one JSON object per line (still read)
MAX_EPOCH = 253_402_300_799.0  # 9999-12-31T23:59:59Z
RESERVED_KEYS = ("t", "event", "rank", "host")
MAX_VALUE_CHARS = 200
TAIL_BYTES = 16384  # a node writes a few dozen events; its last stage_start is near the end

# What a token writes as %XX: `%`, space, the C0 controls and DEL (a str.translate table).
_TO_ENCODE = {code: f"%{code:02X}" for code in (0x25, *range(0x21), 0x7F)}


# The readers' two patterns: a plain JSON number (the whole token) and a %XX escape.
_number = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?").fullmatch
_PERCENT = re.compile(rb"%([0-9A-Fa-f]{2})")


def _percent_decoded(token: bytes) -> bytes:
    """Every %XX of the token as the byte it stands for."""
    return _PERCENT.sub(lambda m: bytes((int(m.group(1), 16),)), token)


# ---- writing -------------------------------------------------------------------------------------


def encode(text: str) -> str:
    """A token as it goes on the line: `%`, space and the control characters as %XX."""
    return text.translate(_TO_ENCODE)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # a string on the way back, as in the shell
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)  # 'inf' reads back as a string
    return str(value)


def format_event(name: str, when: float, **fields: Any) -> str:
    """One event's line, without its line end."""
    words = [f"{when:.6f}", encode(name)]
    words += [
        f"{encode(str(key)).replace('=', '%3D')}={encode(_value(value))}" for key, value in fields.items()
    ]
    return " ".join(words)


def write_event(node_dir: str, name: str, when: float | None = None, **fields: Any) -> bool:
    """Append one event (at `when`, default now) to the node's events.log; False when it could not
    be written. Never raises: an event is never worth failing its caller. Pass `rank` and `host`
    first, as lib/timeline.sh writes them."""
    line = format_event(name, time.time() if when is None else when, **fields) + "\n"
    try:
        # One write() of the whole line to an O_APPEND file: concurrent writers never interleave.
        fd = os.open(os.path.join(node_dir, EVENTS_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return False
    return True


# ---- reading -------------------------------------------------------------------------------------


def events_path(node_dir: str) -> str:
    """The node's events file: events.log, or an older job directory's events.jsonl when only that
    one is there."""
    path = os.path.join(node_dir, EVENTS_FILE)
    old = os.path.join(node_dir, OLD_EVENTS_FILE)
    return old if not os.path.exists(path) and os.path.exists(old) else path


def read_events_file(node_dir: str, limit: int) -> tuple[str, bytes]:
    """(name, first `limit` bytes) of the node's events file, the one events_path names: events.log,
    else an older job directory's events.jsonl. One open when events.log is there (no stat first);
    FileNotFoundError when neither is."""
    try:
        return EVENTS_FILE, read_bytes(f"{node_dir}/{EVENTS_FILE}", limit)
    except FileNotFoundError:
        old = f"{node_dir}/{OLD_EVENTS_FILE}"
        # Rarely there: asked first (a failed open costs collect twice what access() does per node).
        if not os.access(old, os.F_OK):
            raise
        return OLD_EVENTS_FILE, read_bytes(old, limit)


_NUMBER_STARTS = tuple(bytes((c,)) for c in b"-0123456789")
_DECODED: dict[bytes, str] = {}  # token -> text: a job's lines repeat a few dozen keys, names, hosts
MAX_DECODED = 4096  # (bounded: a value unique to each line is decoded each time)


def _decode(token: bytes) -> str:
    text = _DECODED.get(token)
    if text is None:
        raw = token
        if b"%" in token:
            token = _percent_decoded(token)
        text = token.decode("utf-8", errors="replace")
        if len(_DECODED) < MAX_DECODED:
            _DECODED[raw] = text
    return text


def _typed(token: bytes) -> Any:
    """A value token as the reader sees it: a plain JSON number is a number, else a string (also
    an integer too long for Python to read: over 4300 digits)."""
    if token.isdigit() and (len(token) == 1 or token[0] != 0x30) and len(token) < 4300:
        return int(token)  # the common case (a rank, an exit code), without the regex
    if token[:1] not in _NUMBER_STARTS:  # a name or a word: no number starts so
        return _decode(token)
    if _number(token):
        try:
            return float(token) if b"." in token or b"e" in token or b"E" in token else int(token)
        except ValueError:
            pass
    return _decode(token)


def parse_line(raw: bytes) -> dict[str, Any] | None:
    """Every field of one line (either form) as {"t", "event", "rank", "host", KEY: VALUE...};
    None when it is not an event line. No checks past the form: `parse_event` judges the values."""
    raw = raw.strip()
    if raw.startswith(b"{"):  # an events.jsonl line (earlier versions)
        try:
            data = json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            return None
        return data if isinstance(data, dict) else None
    words = raw.split(b" ")
    if len(words) < 2 or not _number(words[0]):
        return None
    fields: dict[str, Any] = {"t": _typed(words[0]), "event": _decode(words[1])}
    for word in words[2:]:
        key, equals, value = word.partition(b"=")
        if not equals or not key:
            return None  # not something a writer here writes: garbage
        name = _decode(key)
        if name not in ("t", "event"):  # the line's own, never a field's (no writer writes them)
            fields[name] = _decode(value) if name == "host" else _typed(value)
    return fields


_SHORTENED: dict[tuple[str, int], str] = {}  # (text, limit) -> short(text, limit); as _DECODED
_TEXT_VALUES: dict[bytes, str] = {}  # a value token that reads as text -> its event value; as _DECODED


def _short(text: str, limit: int) -> str:
    found = _SHORTENED.get((text, limit))
    if found is None:
        found = short(text, limit)
        if len(_SHORTENED) < MAX_DECODED:
            _SHORTENED[(text, limit)] = found
    return found


def parse_event(raw: bytes) -> dict[str, Any] | None:
    """One line as {"t", "event", extra keys...}; None when it is not an event.

    Bytes that are not UTF-8 become U+FFFD (a host name in another encoding costs nothing); extra
    values that are not a string, a finite number, a bool or null are left out (an old JSON line
    may hold anything); `rank` and `host` are the node's, not the event's, and are left out too.
    """
    raw = raw.strip()
    if not raw.startswith(b"{"):
        return _event_of_words(raw.split(b" "))
    return event_of_fields(parse_line(raw))


def _event_of_words(words: list[bytes]) -> dict[str, Any] | None:
    """event_of_fields(parse_line(line)) for a plain line, in one pass (~15,000 lines for a
    1,000-node job: no fields dict in between). A key given twice counts once, its last value."""
    if len(words) < 2 or not _number(words[0]):
        return None
    # A plain JSON number (matched above): float() reads it as _typed and finite would, and one too
    # large for a float is inf, past MAX_EPOCH like any time after the year 9999.
    t, name = float(words[0]), _decode(words[1])
    if not 0 < t <= MAX_EPOCH or not name.strip():
        return None
    event: dict[str, Any] = {"t": t, "event": _short(name, 80)}
    for word in words[2:]:
        key, equals, token = word.partition(b"=")
        if not equals or not key:
            return None  # not something a writer here writes: garbage
        name = _decode(key)
        if name in RESERVED_KEYS:
            continue
        value = _TEXT_VALUES.get(token)  # a host, a stage, a status: the same few in every file
        if value is None:
            value = _typed(token)
            if isinstance(value, str):
                value = _short(value, MAX_VALUE_CHARS)
                if len(_TEXT_VALUES) < MAX_DECODED:
                    _TEXT_VALUES[token] = value
            elif finite(value) is None:
                event.pop(name, None)  # as the fields dict would hold it: this last value, left out
                continue
        event[name] = value
    return event


def event_of_fields(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """parse_line's fields judged as an event (parse_event's rules)."""
    if data is None:
        return None
    t = finite(data.get("t"))
    name = data.get("event")
    if t is None or not 0 < t <= MAX_EPOCH or not isinstance(name, str) or not name.strip():
        return None
    event: dict[str, Any] = {"t": t, "event": _short(name, 80)}
    for key, value in data.items():
        if key in RESERVED_KEYS:
            continue
        if isinstance(value, str):
            event[key] = _short(value, MAX_VALUE_CHARS)
        elif value is None or isinstance(value, bool) or finite(value) is not None:
            event[key] = value
    return event


def parse_events(data: bytes) -> tuple[list[dict[str, Any]], int, bool]:
    """A file's bytes as (its events in file order, how many lines were skipped, whether the last
    skipped line is the torn last one). Blank lines are no lines; a last line without its line end
    is torn unless it is a whole JSON object (an old events.jsonl line)."""
    events: list[dict[str, Any]] = []
    skipped, torn = 0, False
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last = number == len(lines)  # no line end after it
        event = parse_event(raw) if not last or raw.lstrip().startswith(b"{") else None
        if event is None:
            skipped += 1
            torn = torn or last
        else:
            events.append(event)
    return events, skipped, torn


def _tail_events(node_dir: str) -> list[dict[str, Any]]:
    """The events of the last TAIL_BYTES of the node's events file; none when it is unreadable."""
    try:
        with open(events_path(node_dir), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - TAIL_BYTES))
            data = handle.read()
    except OSError:
        return []
    if size > TAIL_BYTES:
        data = data[data.find(b"\n") + 1 :]  # the first line of the tail may be cut
    return parse_events(data)[0]


def _stage_of(events: list[dict[str, Any]]) -> tuple[str | None, int]:
    """The stage of the last `stage_start` of `events`, and where it is (-1: none)."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event["event"] == "stage_start" and isinstance(event.get("stage"), str):
            return event["stage"], index
    return None, -1


def has_event(node_dir: str, name: str) -> bool:
    """The node's events (their last TAIL_BYTES) hold one named `name` (e.g. `reap`: the teardown's
    reaper reached the node)."""
    return any(event["event"] == name for event in _tail_events(node_dir))


def current_stage(node_dir: str) -> str | None:
    """The stage of the node's last `stage_start` event; None before its first (or unreadable)."""
    return _stage_of(_tail_events(node_dir))[0]


def workload_started(jobdir: str, rank: int) -> bool:
    """The rank's workload has printed its first line (the hang watch's `first_output` in its run
    stage), or the rank is past its run stage: the node's busy start is over."""
    node_dir = os.path.join(jobdir, f"node_{rank}")
    if statusfile.has_status(node_dir):
        return True
    events = _tail_events(node_dir)
    stage, at = _stage_of(events)
    if stage is None or stage not in STAGE_ORDER:
        return False
    if STAGE_ORDER.index(stage) > STAGE_ORDER.index("run"):
        return True
    return stage == "run" and any(event["event"] == "first_output" for event in events[at + 1 :])


def node_stage(jobdir: str, rank: int) -> str:
    """What a progress line shows for a rank: `finished` once it staged, else its current stage,
    else `starting`."""
    node_dir = os.path.join(jobdir, f"node_{rank}")
    if statusfile.has_status(node_dir):
        return "finished"
    return current_stage(node_dir) or "starting"
