"""One log line on stderr, as every slurm-multi helper writes it."""

from __future__ import annotations

import os
import sys
import time

from slurm_multi.secret_rule import masked


def escaped(text: str) -> str:
    """`text` safe for a terminal and for a line of fields: every character str.isprintable() refuses
    but a tab (the C0 and C1 controls: a newline, ANSI colours and cursor moves; bidi overrides)
    shown as \\xNN or \\uNNNN."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c == "\t" else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in text
    )


def short(text: str, limit: int = 240) -> str:
    """A log excerpt safe for a terminal (`escaped`) and for a log: the log filter's secrets masked
    before it is cut (secret_rule.masked: a secret cut in half would pass the filter later), at most
    `limit` characters."""
    text = escaped(masked(text.strip()))
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
