"""The call record of the Python fakes (tests/fakes/README.md): with FAKE_RECORD_DIR set, every call
appends one JSON line {"tool", "argv" (argv[0] first), "cwd", "env", "pid", "time"} to
$FAKE_RECORD_DIR/<tool>.jsonl.
"""

from __future__ import annotations

import json
import os
import time


def record_call(tool: str, argv: list[str]) -> None:
    record_dir = os.environ.get("FAKE_RECORD_DIR")
    if not record_dir:
        return
    os.makedirs(record_dir, exist_ok=True)
    line = {"tool": tool, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid()}
    line["time"] = time.time()
    with open(os.path.join(record_dir, f"{tool}.jsonl"), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(line) + "\n")
