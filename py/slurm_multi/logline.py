"""One log line on stderr, as every slurm-multi helper writes it."""

from __future__ import annotations

import os
import sys
import time

# The control characters a log excerpt shows as \xNN (tab stays), as a str.translate table.
CONTROL_CHARS = {code: f"\\x{code:02x}" for code in (*range(0x09), *range(0x0A, 0x20), 0x7F)}


def short(text: str, limit: int = 240) -> str:
    """A log excerpt safe for a terminal: control characters (ANSI colours too) shown as \\xNN."""
    text = text.strip()
    if not text.isprintable():  # every character CONTROL_CHARS names is one isprintable() refuses
        text = text.translate(CONTROL_CHARS)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def this_host() -> str:
    """The node a line or a check names: Slurm's name for it, else the host name. (os.uname's
    nodename is what socket.gethostname() returns, without importing socket: the watch, the plan and
    the warm helpers need nothing else of it.)"""
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def talk(area: str, message: str) -> None:
    """Log one line to stderr as `<UTC time> <host> r<rank> <area>: <message>` (stdout is data)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    host = this_host()
    rank = os.environ.get("SM_RANK", os.environ.get("SLURM_NODEID", "-"))
    print(f"{stamp} {host} r{rank} {area}: {message}", file=sys.stderr, flush=True)
