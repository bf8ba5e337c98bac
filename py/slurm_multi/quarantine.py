"""The shared node quarantine: nodes that later jobs avoid, listed in `<state-dir>/quarantine.json`.

The state dir is one path that every node and the submit host see (shared storage). A node that
fails its fitness check is added by the batch step; a person lists, adds and removes by hand; every
job's batch step asks, before anything else runs, which nodes of its allocation are quarantined.

The file (version 1; this module is its one writer and its one reader):

    {"version": 1,
     "nodes": [
       {"node": "node3", "reason": "fitness: docker engine did not answer within 5 s", "job": "1234",
        "since": "2026-11-30T10:00:00Z", "since_epoch": 1796032800.0,
        "expires": "2026-12-01T10:00:00Z", "expires_epoch": 1796119200.0, "who": "alice"}
     ]}

- `node`: a Slurm host name (letters, digits, `-`, `_`, `.`, starting with a letter or digit).
- `reason`: one line (the log filter's secrets masked first; whitespace runs, newlines and tabs
  included, become one space; other control characters shown as \\xNN; at most 240 characters).
  `job`: the Slurm job that quarantined it, or `manual`. `who`: the user who wrote the entry.
- `since_epoch` / `expires_epoch` (UTC seconds) are what counts; `since` / `expires` are the same
  instants for people (ISO-8601 UTC), rewritten from the epochs on every write.
- An entry is active while `expires_epoch` > now; expired entries are never reported as active and
  are dropped by the next write. A node appears at most once; entries are sorted by node name.
- Adding a node that is already quarantined refreshes it: the new reason, job and user, the
  earliest `since`, and the later of the two expiries (an add never shortens a quarantine; remove
  the node and add it again to shorten one).
- No file means an empty quarantine. A file that cannot be parsed, or whose version this module
  does not know (a newer slurm-multi wrote it), is never overwritten: reading it is a one-line error
  naming it. `remove --all` starts it afresh, keeping the old bytes as
  `quarantine.json.broken-<UTC time>` beside it.

Writes (add, remove) take an exclusive `flock` on `<state-dir>/quarantine.lock` (created if absent,
never removed: removing a lock file lets two writers lock two different files; opened for writing:
NFS emulates flock with POSIX locks, which need that), read, change, write through the project's
one atomic writer (`shell.write_atomic(..., durable=True)`: a temp file in the same dir, fsynced,
renamed over quarantine.json, the dir fsynced), then unlock. Concurrent writers on any node
therefore lose nothing, provided flock works across nodes on that filesystem (NFSv4 and GPFS do;
Lustre only with `-o flock`, not `localflock`: see docs/image-cache.md for a two-node check). The
lock wait is bounded (10 s by default), and so is every read (READ_TIMEOUT_S: a hung filesystem is
one line, not a job that never starts). Readers take no lock: a rename is atomic, so they see the
old file or the new one.

Whom it trusts (docs/bad-nodes.md): the quarantine keeps nodes away from every job that shares the
state dir, so only who may write the dir may write it. A state dir that does not exist is created by
the first add with the user's umask: private, unless the umask or the user makes it group-writable
(create it yourself, `mkdir -m 2770` and `chgrp`, for a quarantine a group shares). Every file in
it is opened with O_NOFOLLOW|O_NONBLOCK (a link or a FIFO planted there is refused in one line,
never followed or waited on) and must be a regular file owned as the dir says: by the dir's owner,
or, in a group-writable dir, by its group; writable by nobody else. A world-writable dir without
the sticky bit is refused. The lock file is made 0600 in a private dir (nobody else can hold it)
and 0660 in a group-writable one. Each entry records who wrote it (`who`: the user the writer runs
as, not a variable anybody can set), and `list` shows it.

The command line over these functions, for the batch step and for people alike, is
slurm_multi.quarantine_cli (`slurm-multi quarantine check|add|list|remove`). The job plan reads the
quarantine in its own process (`in_allocation`). Errors are QuarantineError: one line
(`quarantine: <what failed>; <what to do>`) and its exit status (2: a value that cannot be used;
1: the file cannot be read or written, or the lock stays held).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from slurm_multi import EXIT_FAILURE, EXIT_USAGE, shell
from slurm_multi.logline import escaped
from slurm_multi.secret_rule import reason_line

AREA = "quarantine"
FILE_NAME = "quarantine.json"
LOCK_NAME = "quarantine.lock"
BROKEN_SUFFIX = ".broken-"  # quarantine.json.broken-<UTC time>: a file remove --all set aside
VERSION = 1
STATE_DIR_ENV = "SM_STATE_DIR"
DEFAULT_HOURS = 24.0
MAX_HOURS = 24.0 * 366 * 10  # ten years: longer is a typo, and far dates overflow the ISO form
LOCK_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 10.0  # one read of quarantine.json (a hung network filesystem)
MANUAL_JOB = "manual"  # the job of an entry a person added outside a Slurm job
PRIVATE_LOCK_MODE, SHARED_LOCK_MODE = 0o600, 0o660
MAX_FILE_BYTES = 16 * 1024 * 1024
REASON_LIMIT = 240

NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_NODE_NAME = 255
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:-]*")  # 1234, 1234_5 (array), 1234+0 (het), manual
MAX_JOB_ID = 64


class QuarantineError(Exception):
    """One line (`quarantine: <what failed>; <what to do>`) and the exit status it means."""

    exit_code = EXIT_FAILURE


class QuarantineUsageError(QuarantineError, ValueError):
    """A node name, hours, reason, job or state dir that cannot be used (exit 2)."""

    exit_code = EXIT_USAGE


class BrokenFile(QuarantineError):
    """quarantine.json is there but is not a quarantine this module can read: never overwritten."""


class LockTimeout(QuarantineError):
    """Another writer held quarantine.lock for longer than the lock timeout."""


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass
class Entry:
    """One quarantined node; `since` and `expires` are UTC epoch seconds."""

    node: str
    reason: str
    job: str
    since: float
    expires: float
    who: str

    def is_active(self, now: float) -> bool:
        return self.expires > now

    @property
    def since_iso(self) -> str:
        return iso(self.since)

    @property
    def expires_iso(self) -> str:
        return iso(self.expires)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "reason": self.reason,
            "job": self.job,
            "since": self.since_iso,
            "since_epoch": round(self.since, 3),
            "expires": self.expires_iso,
            "expires_epoch": round(self.expires, 3),
            "who": self.who,
        }

    def check_line(self) -> str:
        """`node TAB reason TAB job TAB expires` (what `check` prints and the plan hands bash): each
        field one line without a tab, control characters escaped, whatever the file held."""
        fields = (self.node, self.reason, self.job, self.expires_iso)
        return "\t".join(escaped(" ".join(field.split())) for field in fields)

    def __repr__(self) -> str:
        return (
            f"Entry({self.node!r}, {self.reason!r}, job={self.job!r}, since={self.since_iso}, "
            f"expires={self.expires_iso}, who={self.who!r})"
        )


# ---- values ----------------------------------------------------------------------------------


def check_node(name: str, flag: str = "NODE") -> str:
    if not (isinstance(name, str) and len(name) <= MAX_NODE_NAME and NODE_NAME.fullmatch(name)):
        hint = "; expand a host list with `scontrol show hostnames`" if "[" in str(name) else ""
        raise QuarantineUsageError(
            f"{AREA}: {flag} {name!r} is not a node name (letters, digits, '-', '_', '.', starting "
            f"with a letter or digit; one name per word, no commas){hint}"
        )
    return name


def check_nodes(names: Iterable[str], flag: str = "NODE") -> list[str]:
    """The names, each checked, duplicates dropped, in the order given; at least one."""
    checked: list[str] = []
    for name in names:
        if check_node(name, flag) not in checked:
            checked.append(name)
    if not checked:
        raise QuarantineUsageError(f"{AREA}: no {flag} given; name at least one node")
    return checked


def split_nodes(text: str) -> list[str]:
    """`--nodes "n1 n2 n3"` (spaces or newlines, as `scontrol show hostnames` prints them)."""
    return check_nodes(text.split(), "--nodes")


def check_hours(value: float | str, flag: str = "--hours") -> float:
    try:
        hours = float(value)
    except (TypeError, ValueError):
        hours = math.nan
    if not (math.isfinite(hours) and 0 < hours <= MAX_HOURS):
        raise QuarantineUsageError(
            f"{AREA}: {flag} {value!r}: expected a positive number of hours (fractions allowed, "
            f"at most {MAX_HOURS:g}), e.g. {flag} {DEFAULT_HOURS:g}"
        )
    return hours


def check_reason(reason: str, flag: str = "--reason") -> str:
    line = reason_line(reason, REASON_LIMIT)
    if not line:
        raise QuarantineUsageError(f"{AREA}: {flag} is empty; say in one line why the node is quarantined")
    return line


def check_job(job: str, flag: str = "--job") -> str:
    if not (isinstance(job, str) and len(job) <= MAX_JOB_ID and JOB_ID.fullmatch(job)):
        raise QuarantineUsageError(
            f"{AREA}: {flag} {job!r} is not a job id (a Slurm job id such as 1234 or 1234_5, or "
            f"{MANUAL_JOB!r}; letters, digits, '.', '_', '+', ':', '-')"
        )
    return job


def check_lock_timeout(value: float | str, flag: str = "--lock-timeout") -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise QuarantineUsageError(f"{AREA}: {flag} {value!r}: expected seconds (a number, 0 or more)")
    return seconds


def default_job(environ: dict[str, str] | None = None) -> str:
    return (os.environ if environ is None else environ).get("SLURM_JOB_ID") or MANUAL_JOB


def current_user() -> str:
    """The user this process runs as (its uid's name; never $USER, which anybody sets as they like)."""
    return _user_name(os.getuid())


def _user_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _group_name(gid: int) -> str:
    try:
        import grp

        return grp.getgrgid(gid).gr_name
    except (ImportError, KeyError):
        return str(gid)


def resolve_state_dir(given: str | None, environ: dict[str, str] | None = None) -> str:
    """--state-dir, else $SM_STATE_DIR, else a usage error."""
    state_dir = given or (os.environ if environ is None else environ).get(STATE_DIR_ENV, "")
    if not state_dir:
        raise QuarantineUsageError(
            f"{AREA}: no state dir: pass --state-dir DIR or set {STATE_DIR_ENV} (the shared directory "
            f"that holds {FILE_NAME}, the same path on every node)"
        )
    return state_dir


def file_path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE_NAME)


def lock_path(state_dir: str) -> str:
    return os.path.join(state_dir, LOCK_NAME)


def _node_order(entry: Entry) -> list[Any]:
    """node2 before node10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", entry.node)]


# ---- reading ---------------------------------------------------------------------------------


def _broken(path: str, what: str) -> BrokenFile:
    state_dir = os.path.dirname(path) or "."
    return BrokenFile(
        f"{AREA}: {path} is not a quarantine this slurm-multi can read ({what}); nothing was changed; "
        f"fix it, or `slurm-multi quarantine remove --all --state-dir {state_dir}` starts it afresh "
        f"and keeps the old file as {FILE_NAME}{BROKEN_SUFFIX}<time>"
    )


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _entry(item: Any, index: int, path: str) -> Entry:
    if not isinstance(item, dict):
        raise _broken(path, f"nodes[{index}] is not an object")
    node = item.get("node")
    if not (isinstance(node, str) and NODE_NAME.fullmatch(node)):
        raise _broken(path, f"nodes[{index}].node {node!r} is not a node name")
    for key in ("since_epoch", "expires_epoch"):
        if not _number(item.get(key)):
            raise _broken(path, f"nodes[{index}].{key} is {item.get(key)!r}, not a number")
    texts = []
    for key in ("reason", "job", "who"):
        value = item.get(key, "")
        if not isinstance(value, str):
            raise _broken(path, f"nodes[{index}].{key} is not a string")
        texts.append(value)
    reason, job, who = texts
    return Entry(node, reason, job, float(item["since_epoch"]), float(item["expires_epoch"]), who)


def _parse(data: bytes, path: str) -> list[Entry]:
    if len(data) > MAX_FILE_BYTES:
        raise _broken(path, f"larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _broken(path, f"not UTF-8 at byte {exc.start}") from None
    except (ValueError, RecursionError) as exc:
        raise _broken(
            path, f"not JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if not isinstance(document, dict):
        raise _broken(path, "not a JSON object")
    version = document.get("version")
    if version != VERSION or isinstance(version, bool):
        raise _broken(path, f"version {version!r}; this slurm-multi reads version {VERSION}")
    items = document.get("nodes")
    if not isinstance(items, list):
        raise _broken(path, "'nodes' is not a list")
    merged: dict[str, Entry] = {}
    for index, item in enumerate(items):
        entry = _entry(item, index, path)
        merged[entry.node] = _merge(merged[entry.node], entry) if entry.node in merged else entry
    return list(merged.values())


@dataclass(frozen=True)
class Trust:
    """Who may write the state dir, so whose files are believed there (the module docstring)."""

    uid: int  # the dir's owner
    gid: int  # the dir's group
    shared: bool  # group-writable: the group's members write here too

    def check(self, path: str, info: os.stat_result, content: bool = True) -> None:
        """QuarantineError unless `info` (an fstat of `path`) is a regular file owned as the dir says
        and (a file whose `content` counts) writable by nobody else."""
        if not stat.S_ISREG(info.st_mode):
            raise QuarantineError(
                f"{AREA}: cannot read {path}: not a regular file (a directory, a FIFO or a device); "
                "nothing was changed; remove it"
            )
        owned = info.st_uid in (self.uid, 0) or (self.shared and info.st_gid == self.gid)
        others = stat.S_IWOTH | (0 if self.shared else stat.S_IWGRP)
        if owned and not (content and info.st_mode & others):
            return
        expected = _user_name(self.uid) + (f" or group {_group_name(self.gid)}" if self.shared else "")
        why = "writable by others" if owned else f"owned by {_user_name(info.st_uid)}, not {expected}"
        raise QuarantineError(
            f"{AREA}: {path} is {why}: the quarantine believes only who may write its dir; nothing was "
            f"changed; remove it (the owner of {os.path.dirname(path) or '.'} may)"
        )


def trust(state_dir: str) -> Trust:
    """The state dir's owner, group and whether its group writes there; QuarantineError for a dir
    anybody may replace files in (world-writable without the sticky bit) or a path that is no dir."""
    try:
        info = os.stat(state_dir)
    except OSError as exc:
        raise QuarantineError(
            f"{AREA}: cannot read the state dir {state_dir}: {exc.strerror or exc}"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise QuarantineError(f"{AREA}: --state-dir {state_dir} exists and is not a directory")
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise QuarantineError(
            f"{AREA}: the state dir {state_dir} is writable by everybody: anybody could replace the "
            f"quarantine; use a dir of your own (or of your group: chmod o-w {state_dir})"
        )
    return Trust(info.st_uid, info.st_gid, bool(info.st_mode & stat.S_IWGRP))


NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def _read_bytes(path: str, trusted: Trust) -> bytes | None:
    """quarantine.json's bytes (at most MAX_FILE_BYTES + 1), None when there is none; opened
    O_NOFOLLOW|O_NONBLOCK and checked (Trust.check); given READ_TIMEOUT_S at most (a thread of its
    own: a read on a hung filesystem cannot be interrupted)."""
    import threading

    box: dict[str, Any] = {}

    def read() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | NOFOLLOW)
        except FileNotFoundError:
            box["data"] = None
            return
        except OSError as exc:
            box["error"] = exc
            return
        try:
            trusted.check(path, os.fstat(fd))
            os.set_blocking(fd, True)
            chunks, left = [], MAX_FILE_BYTES + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            box["data"] = b"".join(chunks)
        except (OSError, QuarantineError) as exc:
            box["error"] = exc
        finally:
            os.close(fd)

    reader = threading.Thread(target=read, name="quarantine-read", daemon=True)
    reader.start()
    reader.join(READ_TIMEOUT_S)
    if reader.is_alive():
        raise QuarantineError(
            f"{AREA}: reading {path} took more than {READ_TIMEOUT_S:g} s (a hung filesystem?); not used"
        )
    error = box.get("error")
    if isinstance(error, QuarantineError):
        raise error
    if isinstance(error, OSError):
        if error.errno == errno.ELOOP:
            raise QuarantineError(
                f"{AREA}: cannot read {path}: a symbolic link; nothing was changed; remove it"
            ) from None
        raise QuarantineError(f"{AREA}: cannot read {path}: {error.strerror or error}") from None
    return box["data"]


def entries(state_dir: str) -> list[Entry]:
    """Every entry in the file, expired ones included (`list --all`); [] when there is no file."""
    if not os.path.lexists(state_dir):
        return []
    path = file_path(state_dir)
    data = _read_bytes(path, trust(state_dir))
    return [] if data is None else _parse(data, path)


def active(state_dir: str, now: float | None = None) -> list[Entry]:
    """The entries in force at `now` (default: the current time), sorted by node."""
    now = time.time() if now is None else now
    return [entry for entry in entries(state_dir) if entry.is_active(now)]


def in_allocation(state_dir: str, nodes: Iterable[str], now: float | None = None) -> list[Entry]:
    """The active entries among `nodes`, in the order given (what the batch step must avoid)."""
    wanted = check_nodes(nodes, "--nodes")
    found = {entry.node: entry for entry in active(state_dir, now)}
    return [found[name] for name in wanted if name in found]


# ---- writing ---------------------------------------------------------------------------------


def _ensure_dir(state_dir: str) -> None:
    """The state dir, made with the user's umask when it is not there (private unless the umask
    shares it: the module docstring)."""
    if os.path.isdir(state_dir):
        return
    try:
        parent = os.path.dirname(os.path.abspath(state_dir))
        os.makedirs(parent, exist_ok=True)
        os.mkdir(state_dir)
    except FileExistsError:
        if os.path.isdir(state_dir):
            return  # another writer made it first
        raise QuarantineError(f"{AREA}: --state-dir {state_dir} exists and is not a directory") from None
    except OSError as exc:
        raise QuarantineError(
            f"{AREA}: cannot create the state dir {state_dir}: {exc.strerror or exc}"
        ) from None


def _open_lock(path: str, trusted: Trust) -> int:
    flags = os.O_RDWR | NOFOLLOW
    mode = SHARED_LOCK_MODE if trusted.shared else PRIVATE_LOCK_MODE
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode)
            made = True
        except FileExistsError:
            fd, made = os.open(path, flags), False
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise QuarantineError(
                f"{AREA}: the lock {path} is a symbolic link: not used; remove it"
            ) from None
        raise QuarantineError(
            f"{AREA}: cannot open the lock {path}: {exc.strerror or exc}; every user who edits the "
            f"quarantine needs write access to {os.path.dirname(path) or '.'} and {LOCK_NAME}"
        ) from None
    try:
        info = os.fstat(fd)
        trusted.check(path, info, content=False)  # (what is in it does not count: who can hold it)
    except QuarantineError:
        os.close(fd)
        raise
    if (made and trusted.shared) or (info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != mode):
        try:
            os.fchmod(fd, mode)  # the group's writers lock it too, whatever our umask; nobody else
        except OSError:
            pass
    return fd


def _lock(state_dir: str, timeout: float) -> int:
    """An exclusive flock on quarantine.lock, waiting at most `timeout` seconds; the descriptor
    (closing it releases the lock)."""
    path = lock_path(state_dir)
    fd = _open_lock(path, trust(state_dir))
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise LockTimeout(
                    f"{AREA}: the lock {path} stayed held for {timeout:g} s; is another slurm-multi "
                    f"quarantine writer stuck? nothing was changed"
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        except OSError as exc:
            os.close(fd)
            hint = (
                "; this filesystem does not lock across nodes (Lustre: mount with -o flock)"
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)
                else ""
            )
            raise QuarantineError(f"{AREA}: cannot lock {path}: {exc.strerror or exc}{hint}") from None


def _write(state_dir: str, current: Sequence[Entry]) -> None:
    """quarantine.json replaced through the project's one atomic writer, durably: a temp file in the
    same dir, fsynced, renamed over the old one, the dir fsynced (shell.write_atomic)."""
    path = file_path(state_dir)
    document = {"version": VERSION, "nodes": [entry.to_json() for entry in current]}
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    try:
        # the user's umask; never written through a FIFO or a device someone put in its place
        shell.write_atomic(path, text, None, durable=True, through=False)
    except OSError as exc:
        raise QuarantineError(f"{AREA}: cannot write {path}: {exc.strerror or exc}") from None


def _set_aside(state_dir: str, now: float) -> str:
    """Rename a broken quarantine.json to quarantine.json.broken-<UTC time>[-N]; the new name."""
    path = file_path(state_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    for attempt in range(1, 1000):
        target = f"{path}{BROKEN_SUFFIX}{stamp}" + (f"-{attempt}" if attempt > 1 else "")
        if not os.path.lexists(target):
            break
    try:
        os.rename(path, target)
    except OSError as exc:
        raise QuarantineError(
            f"{AREA}: cannot move {path} aside to {target}: {exc.strerror or exc}"
        ) from None
    return target


def _update(
    state_dir: str,
    change: Callable[[list[Entry]], list[Entry]],
    lock_timeout: float,
    set_aside_broken: bool = False,
    now: float = 0.0,
) -> str:
    """Under the lock: read, change, write when something changed. The broken file's new name when
    one was set aside (only with `set_aside_broken`), else ""."""
    fd = _lock(state_dir, lock_timeout)
    try:
        path = file_path(state_dir)
        data = _read_bytes(path, trust(state_dir))
        moved = ""
        try:
            current = [] if data is None else _parse(data, path)
        except BrokenFile:
            if not set_aside_broken:
                raise
            moved, current = _set_aside(state_dir, now), []
        updated = sorted(change(list(current)), key=_node_order)
        if moved or updated != current:
            _write(state_dir, updated)
        return moved
    finally:
        os.close(fd)  # releases the lock


def _merge(old: Entry, new: Entry) -> Entry:
    """A node quarantined again: the newest reason, job and user, the earliest since, the later expiry."""
    return Entry(
        new.node, new.reason, new.job, min(old.since, new.since), max(old.expires, new.expires), new.who
    )


def add(
    state_dir: str,
    nodes: Iterable[str],
    reason: str,
    job: str,
    hours: float | str = DEFAULT_HOURS,
    now: float | None = None,
    who: str | None = None,
    lock_timeout: float | str = LOCK_TIMEOUT_S,
) -> list[Entry]:
    """Quarantine `nodes` for `hours` from `now`; their entries as written, in the order given."""
    names = check_nodes(nodes)
    reason, job, span = check_reason(reason), check_job(job), check_hours(hours)
    wait = check_lock_timeout(lock_timeout)
    # to the millisecond, as the file keeps it: what add returns is what is read back
    now = round(time.time() if now is None else now, 3)
    user = who or current_user()
    written: dict[str, Entry] = {}

    def change(current: list[Entry]) -> list[Entry]:
        kept = {entry.node: entry for entry in current if entry.is_active(now)}
        for name in names:
            entry = Entry(name, reason, job, now, round(now + span * 3600.0, 3), user)
            kept[name] = _merge(kept[name], entry) if name in kept else entry
            written[name] = kept[name]
        return list(kept.values())

    _ensure_dir(state_dir)
    _update(state_dir, change, wait)
    return [written[name] for name in names]


def remove(
    state_dir: str,
    nodes: Iterable[str] = (),
    all_nodes: bool = False,
    now: float | None = None,
    lock_timeout: float | str = LOCK_TIMEOUT_S,
) -> list[str]:
    """Lift the quarantine of `nodes` (or of every node with `all_nodes`, which also starts a broken
    file afresh, see `remove_all`); the names of the active entries removed."""
    if all_nodes:
        if list(nodes):
            raise QuarantineUsageError(f"{AREA}: remove: give NODE... or --all, not both")
        return remove_all(state_dir, now, lock_timeout)[0]
    names = check_nodes(nodes)
    wait = check_lock_timeout(lock_timeout)
    now = time.time() if now is None else now
    removed: list[str] = []

    def change(current: list[Entry]) -> list[Entry]:
        removed.extend(e.node for e in current if e.node in names and e.is_active(now))
        return [e for e in current if e.node not in names and e.is_active(now)]

    # No state dir: nothing is quarantined, nothing to create. Anything else there (a file, a
    # dangling link) is refused as add and list refuse it (trust), never taken as "no quarantine".
    if os.path.lexists(state_dir):
        _update(state_dir, change, wait)
    return [name for name in names if name in removed]


def remove_all(
    state_dir: str, now: float | None = None, lock_timeout: float | str = LOCK_TIMEOUT_S
) -> tuple[list[str], str]:
    """Empty the quarantine: (the active nodes removed, the name a broken file was moved to or "")."""
    wait = check_lock_timeout(lock_timeout)
    now = time.time() if now is None else now
    removed: list[str] = []

    def change(current: list[Entry]) -> list[Entry]:
        removed.extend(e.node for e in current if e.is_active(now))
        return []

    if not os.path.lexists(state_dir):  # (as remove: only a state dir not there is an empty one)
        return [], ""
    moved = _update(state_dir, change, wait, set_aside_broken=True, now=now)
    return removed, moved
