"""One log line on stderr, as every slurm-multi helper writes it (no click: click-free helpers use it)."""

from __future__ import annotations

import os
import socket
import sys
import time


def talk(area: str, message: str) -> None:
    """Log one line to stderr as `<UTC time> <host> r<rank> <area>: <message>` (stdout is data)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    rank = os.environ.get("SM_RANK", os.environ.get("SLURM_NODEID", "-"))
    print(f"{stamp} {host} r{rank} {area}: {message}", file=sys.stderr, flush=True)
