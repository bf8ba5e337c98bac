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


@click.command("redact", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Copy stdin to stdout with the values of secret-named environment variables masked.

    Secret names match *TOKEN*, *SECRET*, *PASSWORD*, *API_KEY*, MAD_SECRETS*.

    Example: docker logs job-1-r0 2>&1 | slurm-multi redact >node.log
    """
    secrets = secret_values(os.environ)
    for line in sys.stdin:
        sys.stdout.write(redact(line, secrets))
