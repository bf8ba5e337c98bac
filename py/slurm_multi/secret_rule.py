"""The one secret rule, and the log filter that applies it.

Every log filter of a job (the batch step's and each node's) is `slurm-multi redact [--secrets-file
F]` (slurm_multi.redact, util::redact). Bash never decides what is secret: the helpers do, with
is_secret_name below.
"""

from __future__ import annotations

import fnmatch
import io
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import BinaryIO

# Shell-style patterns (fnmatch), matched against the upper-cased name. *PASS* covers PASSWORD,
# PASSWD and PASSPHRASE (and masks a harmless PASSTHROUGH too: a value masked for nothing is cheap,
# a token in a log is not); *_PAT: GitHub's and GitLab's personal access tokens (GH_PAT).
SECRET_NAME_PATTERNS = (
    "*TOKEN*",
    "*SECRET*",
    "*PASS*",
    "*CREDENTIAL*",
    "*PRIVATE_KEY*",
    "*API_KEY*",
    "*_PAT",
    "*CONNECTION_STRING",
    "MAD_SECRETS*",
    "DOCKER_AUTH_CONFIG",
    "MYSQL_PWD",
)
MASK = "***"
MIN_SECRET_LEN = 4  # shorter values would redact ordinary words


def is_secret_name(name: str) -> bool:
    known = _SECRET_NAMES.get(name)
    if known is None:
        upper = name.upper()
        known = any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_NAME_PATTERNS)
        if len(_SECRET_NAMES) < MAX_KNOWN_NAMES:
            _SECRET_NAMES[name] = known
    return known


_SECRET_NAMES: dict[str, bool] = {}
MAX_KNOWN_NAMES = 4096


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-named variables, longest first so overlapping secrets redact fully."""
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        if value:
            text = text.replace(value, MASK)
    return text


def masked(text: str, env: Mapping[str, str] | None = None) -> str:
    """`text` with every secret the log filter knows masked: the environment's, and those in
    $SM_SECRETS_FILE (the node task's list, a manifest's literal secrets). What a helper stores or
    shows of text it did not write (a command's output, a reason) passes here before it is cut:
    a secret cut in half would pass the filter later."""
    if env is None and _HELD is not None:
        env, secrets = os.environ, _HELD
    else:
        env = os.environ if env is None else env
        secrets = secret_values(env)
    if env.get(SECRETS_FILE_ENV):
        listed = _listed_secrets(env[SECRETS_FILE_ENV])
        if listed:
            secrets = sorted(set(secrets) | set(listed), key=len, reverse=True)
    return redact(text, secrets) if secrets else text


_HELD: list[str] | None = None  # the environment's secret values, while secrets_held() holds them


@contextmanager
def secrets_held() -> Iterator[list[str]]:
    """Within: `masked` (and so every log excerpt and reason) takes this environment's secret values
    as they are on entry, instead of reading the whole environment on every call. For a helper that
    masks thousands of excerpts and sets no variable meanwhile (collect: about 5 per node)."""
    global _HELD
    outer = _HELD
    _HELD = secret_values(os.environ)
    try:
        yield _HELD
    finally:
        _HELD = outer


_LISTED: dict[str, tuple[tuple[float, int], list[str]]] = {}  # path -> ((mtime, size), its values)


def _listed_secrets(path: str) -> list[str]:
    """read_secrets_file, read again only when the file changed (a stat per call). A file that is
    there but cannot be read is said once on stderr (a helper masking a reason must not fail its
    work for it: the reason is still masked with the environment's secrets and those read before)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        _warn_unreadable(path, exc)
        return _LISTED[path][1] if path in _LISTED else []
    stamp = (info.st_mtime, info.st_size)
    known = _LISTED.get(path)
    if known is None or known[0] != stamp:
        try:
            known = _LISTED[path] = (stamp, read_secrets_file(path))
        except OSError as exc:
            _warn_unreadable(path, exc)
            return known[1] if known is not None else []
    return known[1]


_WARNED: set[str] = set()  # the secrets files already said to be unreadable (once each)


def _warn_unreadable(path: str, exc: OSError) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        from slurm_multi.logline import talk

        talk("redact", f"warning: cannot read secrets file {path} ({secrets_file_error(exc)}); "
             "its values are not masked")  # fmt: skip


SECRETS_FILE_ENV = "SM_SECRETS_FILE"  # the node task's secrets list (lib/node.sh exports it)


def reason_line(text: str, limit: int = 400, env: Mapping[str, str] | None = None) -> str:
    """A reason as it is stored and shown (status.json, fitness-cmd.json, the quarantine): secrets
    masked first, then one line (whitespace runs, newlines and tabs included, become one space),
    the other control characters shown as \\xNN (logline.escaped), then cut to `limit`."""
    from slurm_multi.logline import short

    return short(" ".join(masked(str(text), env).split()), limit)


def shown_name(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """`name` when a message may show it: an environment variable's name ([A-Za-z_][A-Za-z0-9_]*)
    holding no secret value. None for anything else: an option that wants a variable's NAME (as
    --token-env) may have been given the value itself, and saying it back would print a secret."""
    if not (name.isascii() and name.isidentifier()) or masked(name, env) != name:
        return None
    return name


def read_secrets_file(path: str) -> list[str]:
    """Extra secret values, one per line (written by a node after it restores its manifest). A file
    not there (yet) lists none; one that is there and cannot be read (a directory, no permission)
    raises its OSError: each caller decides (the redact command refuses it, a running filter warns)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n") for line in handle if len(line.rstrip("\n")) >= MIN_SECRET_LEN]
    except FileNotFoundError:
        return []


def secrets_file_error(exc: OSError) -> str:
    """An OSError of a secrets file's in a few words (its strerror: never the file's content)."""
    return exc.strerror or type(exc).__name__


class Redactor:
    """Masks the environment's secrets plus those in a secrets file, re-read whenever it changes.

    A secrets file that is there and cannot be read raises its OSError at the start (the redact
    command refuses it in one line); once running, the filter of a job's log never dies for it: it
    says so once on stderr and goes on with the values it read before."""

    def __init__(self, env: Mapping[str, str], secrets_file: str | None = None) -> None:
        self._base = secret_values(env)
        self._file = secrets_file
        self._stamp: tuple[float, int] | None = None
        self._secrets = list(self._base)
        self._refresh(strict=True)

    def _refresh(self, strict: bool = False) -> None:
        if not self._file:
            return
        try:
            st = os.stat(self._file)
        except FileNotFoundError:
            return
        except OSError as exc:
            if strict:
                raise
            _warn_unreadable(self._file, exc)
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            try:
                listed = read_secrets_file(self._file)
            except OSError as exc:
                if strict:
                    raise
                _warn_unreadable(self._file, exc)
                return
            self._stamp = stamp
            values = set(self._base) | set(listed)
            self._secrets = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        self._refresh()
        return redact(text, self._secrets)


def filter_stream(
    source: io.TextIOBase, sink: io.TextIOBase, env: Mapping[str, str], secrets_file: str | None
) -> None:
    """Copy source to sink line by line, secrets masked, flushing each line (it is a live log)."""
    redactor = Redactor(env, secrets_file)
    for line in source:
        sink.write(redactor(line))
        sink.flush()


def filter_stdio(
    env: Mapping[str, str],
    secrets_file: str | None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> None:
    """filter_stream from stdin to stdout (fds 0 and 1 unless given), byte for byte but for the
    masks: undecodable bytes pass through (a workload may print anything), and so do `\r` and
    `\r\n` (a progress bar's carriage returns stay carriage returns; only `\n` ends a line)."""
    stdin = stdin or open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115
    stdout = stdout or open(sys.stdout.fileno(), "wb", closefd=False)  # noqa: SIM115
    source = io.TextIOWrapper(stdin, "utf-8", "surrogateescape", newline="\n")
    sink = io.TextIOWrapper(stdout, "utf-8", "surrogateescape", newline="\n")
    filter_stream(source, sink, env, secrets_file)
    source.detach()  # (given streams stay open for their owner)
    sink.detach()
