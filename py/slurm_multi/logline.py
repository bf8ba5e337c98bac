"""One log line on stderr, as every slurm-multi helper writes it (no click: click-free helpers use it)."""

from __future__ import annotations

import os
import re
import sys
import time

CONTROL_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def short(text: str, limit: int = 240) -> str:
    """A log excerpt safe for a terminal: control characters (ANSI colours too) shown as \\xNN."""
    text = text.strip()
    if not text.isprintable():  # every character CONTROL_CHARS matches is one isprintable() refuses
        text = CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
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
