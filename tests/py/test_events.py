"""slurm_multi.events: a node's events read in one place; the watch and sm-demo learn each node's
stage from its last stage_start, never from node.log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from slurm_multi import events, watch

T0 = 1_764_500_000.0


def event(name: str, **extra: object) -> str:
    return json.dumps({"t": T0, "event": name, "rank": 0, "host": "node1", **extra}) + "\n"


def test_the_stage_is_the_last_stage_start_whatever_follows_it(tmp_path: Path):
    node = tmp_path / "node_0"
    node.mkdir()
    assert events.node_stage(str(tmp_path), 0) == "starting"  # no events yet
    lines = [event("stage_start", stage="prepare"), event("stage_end", stage="prepare", status="ok"),
             event("stage_start", stage="image"), event("image_load_start")]  # fmt: skip
    (node / "events.jsonl").write_text("".join(lines) + '{"t": 17645')  # a torn last line
    assert events.current_stage(str(node)) == "image"
    assert events.node_stage(str(tmp_path), 0) == "image"
    # The log says something else: it is not read.
    (node / "node.log").write_text("node1 r0 run: stage run (alone)\n")
    assert events.node_stage(str(tmp_path), 0) == "image"
    (node / "status.json").write_text("{}")
    assert events.node_stage(str(tmp_path), 0) == "finished"


def test_a_long_events_file_is_read_from_its_tail(tmp_path: Path):
    node = tmp_path / "node_0"
    node.mkdir()
    noise = event("first_output") * (2 * events.TAIL_BYTES // len(event("first_output")))
    (node / "events.jsonl").write_text(
        event("stage_start", stage="prepare") + noise + event("stage_start", stage="run")
    )
    assert os.path.getsize(node / "events.jsonl") > events.TAIL_BYTES
    assert events.current_stage(str(node)) == "run"


def test_the_watch_and_the_demo_read_the_same_stages(tmp_path: Path):
    for rank, stage in ((0, "barrier"), (1, "image")):
        (tmp_path / f"node_{rank}").mkdir()
        (tmp_path / f"node_{rank}" / "events.jsonl").write_text(event("stage_start", stage=stage))
    assert watch.node_stage is events.node_stage
    env = dict(os.environ, PYTHONPATH=str(Path(events.__file__).parents[1]))
    done = subprocess.run([sys.executable, "-S", "-m", "slurm_multi.events", "stages", str(tmp_path), "3"],
                          capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "node_0=barrier node_1=image node_2=starting\n")
    bad = subprocess.run([sys.executable, "-S", "-m", "slurm_multi.events", "stages", str(tmp_path)],
                         capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("usage:")
