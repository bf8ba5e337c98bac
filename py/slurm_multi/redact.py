"""Secret handling: which variable names are secret, and redaction of their values from text."""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Iterable, Mapping

import click

SECRET_NAME_PATTERNS = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*PASSWD*", "MAD_SECRETS*", "*API_KEY*")
MASK = "***"
MIN_SECRET_LEN = 4  # shorter values would redact ordinary words


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pattern) for pattern in SECRET_NAME_PATTERNS)


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of secret-named variables, longest first so overlapping secrets redact fully."""
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        if value:
            text = text.replace(value, MASK)
    return text


def read_secrets_file(path: str) -> list[str]:
    """Extra secret values, one per line (written by a node after it restores its manifest)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n") for line in handle if len(line.rstrip("\n")) >= MIN_SECRET_LEN]
    except OSError:
        return []


class Redactor:
    """Masks the environment's secrets plus those in a secrets file, re-read whenever it changes."""

    def __init__(self, env: Mapping[str, str], secrets_file: str | None = None) -> None:
        self._base = secret_values(env)
        self._file = secrets_file
        self._stamp: tuple[float, int] | None = None
        self._secrets = list(self._base)

    def _refresh(self) -> None:
        if not self._file:
            return
        try:
            st = os.stat(self._file)
        except OSError:
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            values = set(self._base) | set(read_secrets_file(self._file))
            self._secrets = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        self._refresh()
        return redact(text, self._secrets)


@click.command("redact", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--secrets-file",
    metavar="PATH",
    help="Also mask the values listed in PATH (one per line); re-read whenever it changes.",
)
def cli(secrets_file: str | None) -> None:
    """Copy stdin to stdout with the values of secret-named environment variables masked.

    Secret names match *TOKEN*, *SECRET*, *PASSWORD*, *API_KEY*, MAD_SECRETS*. Values learned
    later (a manifest's literal secrets) can be added to --secrets-file while the filter runs.

    Example: docker logs job-1-r0 2>&1 | slurm-multi redact >node.log
    """
    redactor = Redactor(os.environ, secrets_file)
    for line in sys.stdin:
        sys.stdout.write(redactor(line))
        sys.stdout.flush()
