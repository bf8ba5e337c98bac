"""summary.json says per node what its image stage moved (slurm_multi.results.imagemoves): the bytes
that reached each worker over the relay or from the cache, the layers it loaded and those it held;
the bytes rank 0 sent. Job directories are built as tests/py/test_results_timeline.py builds them."""

from __future__ import annotations

import json
from pathlib import Path

import test_results_timeline as base
from slurm_multi.results import collect
from slurm_multi.results.imagemoves import image_moved


def test_a_layered_relay_and_a_cache_load_are_summed_up_per_node(tmp_path: Path):
    events = {rank: base.plan_events(rank, plan) for rank, plan in base.PLANS.items()}
    events[0].append(base.event(60.6, "image_stream_end", 0, bytes=1_049_600, status="ok"))
    events[1].append(base.event(62.5, "image_stream_end", 1, bytes=1_049_600, layers=4, received_layers=1,
                                loaded_layers=1, loaded_bytes=1_048_576, held_layers=3,
                                held_bytes=1_300_000_000, status="ok"))  # fmt: skip
    events[2].append(base.event(61.9, "image_load_end", 2, bytes=2_000_000, layers=4, read_layers=2,
                                read_bytes=1_990_000, held_layers=2, held_bytes=1_290_000_000))  # fmt: skip
    jobdir = base.make_job(tmp_path / "57", base.PLANS, events)
    collect(jobdir)
    nodes = {n["rank"]: n["image"] for n in json.loads((jobdir / "summary.json").read_text())["nodes"]}
    assert nodes[0] == {"via": "relay (sent)", "bytes": 1_049_600}
    assert nodes[1]["via"] == "relay" and nodes[1]["bytes"] == 1_049_600 and nodes[1]["held_layers"] == 3
    assert nodes[2] == {"via": "cache", "bytes": 2_000_000, "layers": 4, "read_layers": 2,
                        "read_bytes": 1_990_000, "held_layers": 2, "held_bytes": 1_290_000_000}  # fmt: skip


def test_a_node_that_moved_nothing_or_failed_to_has_no_image_move():
    assert image_moved(1, [{"event": "stage_end", "t": 1.0}]) is None
    assert image_moved(1, [{"event": "image_stream_end", "t": 1.0, "bytes": 5, "status": "failed"}]) is None
    assert image_moved(1, [{"event": "image_load_end", "t": 1.0, "status": "ok"}]) is None  # no bytes said
    assert image_moved(1, [{"event": "image_load_end", "t": 1.0, "bytes": True}]) is None
