"""results collect: stragglers, the one rank per stage that took much longer than the others.

Information only: a straggler is one line in the printed summary and an entry in summary.json's
`stragglers`, never a reason for FAILURE.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.results import collect
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.results.stragglers import FLOOR_SECONDS, RATIO, Straggler, find_stragglers, stage_straggler

DATA = Path(__file__).parent / "data" / "results"
FULL_CSV = "model,performance,metric\ntoy,100.5,samples_per_second\n"


def nodes_with(stage: str, times: list[Any], names: list[str] | None = None) -> list[NodeReport]:
    """One NodeReport per time (None: the rank has no such stage), rank i on node i+1 by default."""
    nodes = []
    for rank, seconds in enumerate(times):
        node = NodeReport(rank, names[rank] if names else f"node{rank + 1}", status="ok")
        if seconds is not None:
            node.stages[stage] = seconds
        nodes.append(node)
    return nodes


def status(rank: int, node: str, **seconds: Any) -> dict[str, Any]:
    """An ok status.json with the given stage seconds (`save_outputs` for `save-outputs`)."""
    stages = {name.replace("_", "-"): {"seconds": value, "status": "ok"} for name, value in seconds.items()}
    return {"rank": rank, "node": node, "exit_code": 0, "status": "ok", "reason": "", "stages": stages}


def make_job(root: Path, statuses: list[dict[str, Any]], job: dict[str, Any] | None = None) -> Path:
    """A successful job directory: every rank's status.json, the last rank's CSV."""
    root.mkdir(parents=True)
    nodes = sorted({s["node"] for s in statuses}, key=[s["node"] for s in statuses].index)
    meta = {"job_id": "77", "model": "toy_model", "nnodes": len(nodes), "results_csv": "perf_toy.csv"}
    (root / "job.json").write_text(json.dumps(dict(meta, nodes=nodes, **(job or {}))))
    for rank, data in enumerate(statuses):
        node_dir = root / f"node_{rank}"
        node_dir.mkdir()
        (node_dir / "status.json").write_text(json.dumps(data))
        (node_dir / "node.log").write_text("done\n")
    (root / f"node_{len(statuses) - 1}" / "perf_toy.csv").write_text(FULL_CSV)
    return root


# ----------------------------------------------------------------------------- the rule


def test_the_example_straggler_and_its_line():
    found = find_stragglers(nodes_with("image", [3.9, 4.0, 12.4, 4.1]))
    assert found == [Straggler("image", 2, "node3", 12.4, 4.0, 3.1)]
    assert found[0].to_dict() == {
        "stage": "image", "rank": 2, "node": "node3", "seconds": 12.4, "median_others": 4.0, "ratio": 3.1
    }  # fmt: skip
    assert found[0].describe() == "node3 (rank 2) image 12.4 s, 3.1x the median of the others (4.0 s)"


def test_the_constants_are_the_documented_ones():
    assert (RATIO, FLOOR_SECONDS) == (1.5, 0.5)


@pytest.mark.parametrize(
    "times, flagged",
    [
        ([4.0, 4.0, 6.0], False),  # exactly 1.5x: not more than
        ([4.0, 4.0, 6.01], True),
        ([0.01, 0.01, 0.02], False),  # 2x, but 0.01 s above: the floor
        ([0.5, 0.5, 1.0], False),  # 2x, exactly 0.5 s above: not more than
        ([0.5, 0.5, 1.01], True),
        ([10.0, 10.0, 14.0], False),  # 4 s above, but only 1.4x
    ],
)
def test_ratio_and_floor_must_both_be_exceeded(times: list[float], flagged: bool):
    assert bool(find_stragglers(nodes_with("run", times))) is flagged


def test_two_ranks_compare_against_the_other_rank_alone():
    found = find_stragglers(nodes_with("image", [4.0, 10.0]))
    assert found == [Straggler("image", 1, "node2", 10.0, 4.0, 2.5)]
    assert find_stragglers(nodes_with("image", [10.0, 10.0])) == []


def test_the_median_is_of_the_others_so_the_straggler_does_not_pull_it():
    # median of all four would be 4.5 (3.1x would still hold), of the others it is 4.0
    found = find_stragglers(nodes_with("run", [4.0, 4.0, 5.0, 40.0]))
    assert [(s.rank, s.median_others, s.ratio) for s in found] == [(3, 4.0, 10.0)]


def test_when_most_ranks_are_slow_the_slowest_is_not_singled_out():
    assert find_stragglers(nodes_with("run", [4.0, 12.0, 12.0, 12.5])) == []


def test_a_tie_for_slowest_goes_to_the_lower_rank():
    found = find_stragglers(nodes_with("run", [4.0, 12.0, 4.0, 12.0, 4.0]))
    assert [(s.rank, s.median_others) for s in found] == [(1, 4.0)]


def test_a_stage_on_one_rank_is_skipped_and_missing_stages_are_left_out():
    nodes = nodes_with("image", [4.0, None, 12.4])  # rank 1 has no image stage: 2 ranks compared
    nodes[0].stages["save-outputs"] = 30.0  # only rank 0 has it
    assert find_stragglers(nodes) == [Straggler("image", 2, "node3", 12.4, 4.0, 3.1)]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -50.0, "12", None, True, 10**400])
def test_seconds_that_are_not_a_time_are_ignored(bad: Any):
    nodes = nodes_with("image", [4.0, 12.4, 4.0])
    nodes.append(NodeReport(3, "node4"))
    nodes[3].stages["image"] = bad
    assert find_stragglers(nodes) == [Straggler("image", 1, "node2", 12.4, 4.0, 3.1)]
    assert stage_straggler("image", [(0, "node1", bad), (1, "node2", 12.4)]) is None  # one valid time


def test_the_barrier_is_a_wait_and_never_names_a_straggler():
    # the rank that arrives first waits longest in the barrier: the slow one is someone else's image
    nodes = nodes_with("image", [41.7, 12.9])
    nodes[0].stages["barrier"], nodes[1].stages["barrier"] = 3.05, 31.6
    assert [(s.stage, s.rank) for s in find_stragglers(nodes)] == [("image", 0)]


def test_others_at_zero_seconds_give_no_ratio():
    (found,) = find_stragglers(nodes_with("prepare", [0.0, 0.0, 2.0]))
    assert (found.median_others, found.ratio) == (0.0, None)
    assert found.describe() == "node3 (rank 2) prepare 2.0 s, where the median of the others is 0 s"


def test_stragglers_come_in_stage_order():
    nodes = nodes_with("run", [10.0, 10.0, 30.0])
    for node, seconds in zip(nodes, (1.0, 9.0, 1.0)):
        node.stages["image"] = seconds
    for node, seconds in zip(nodes, (0.1, 0.1, 0.1)):
        node.stages["prepare"] = seconds
    assert [(s.stage, s.rank) for s in find_stragglers(nodes)] == [("image", 1), ("run", 2)]


# ----------------------------------------------------------------------------- in collect


def test_collect_writes_the_stragglers_and_prints_one_line_each_verdict_unchanged(tmp_path: Path):
    statuses = [
        status(0, "node1", prepare=0.1, image=3.9, run=60.0),
        status(1, "node2", prepare=0.1, image=4.0, run=61.0),
        status(2, "node3", prepare=0.1, image=12.4, run=60.5),
        status(3, "node4", prepare=0.1, image=4.1, run=60.2),
    ]
    jobdir = make_job(tmp_path / "77", statuses)
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir)])
    assert result.exit_code == 0, result.output
    summary = json.loads((jobdir / "summary.json").read_text())
    assert summary["verdict"] == "SUCCESS" and summary["reasons"] == []
    assert summary["stragglers"] == [
        {"stage": "image", "rank": 2, "node": "node3", "seconds": 12.4, "median_others": 4.0, "ratio": 3.1}
    ]
    line = "  straggler: node3 (rank 2) image 12.4 s, 3.1x the median of the others (4.0 s)\n"
    assert line in result.stderr
    assert result.stderr.count("straggler:") == 1


def test_without_a_straggler_the_list_is_empty_and_nothing_is_printed(tmp_path: Path):
    jobdir = make_job(tmp_path / "77", [status(r, f"node{r + 1}", image=4.0, run=60.0) for r in range(3)])
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir)])
    assert json.loads((jobdir / "summary.json").read_text())["stragglers"] == []
    assert "straggler:" not in result.stderr


def test_several_tasks_per_node_name_the_rank_and_its_node(tmp_path: Path):
    statuses = [status(rank, f"node{rank // 2 + 1}", run=100.0) for rank in range(4)]
    statuses[3]["stages"]["run"]["seconds"] = 250.0  # the second task on node2
    jobdir = make_job(tmp_path / "77", statuses, job={"tasks_per_node": 2})
    summary = collect(jobdir)
    assert [(s.stage, s.rank, s.node, s.ratio) for s in summary.stragglers] == [("run", 3, "node2", 2.5)]


def test_bad_stage_seconds_in_status_json_are_left_out(tmp_path: Path):
    statuses = [status(r, f"node{r + 1}", image=4.0) for r in range(6)]
    statuses[0]["stages"]["image"]["seconds"] = math.nan  # json.dumps writes NaN, json reads it back
    statuses[1]["stages"]["image"]["seconds"] = -50.0  # a clock step backwards
    statuses[2]["stages"]["image"]["seconds"] = "twelve"
    statuses[3]["stages"]["image"]["seconds"] = 12.4
    del statuses[4]["stages"]["image"]["seconds"]
    jobdir = make_job(tmp_path / "77", statuses)
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS"
    assert [(s.rank, s.seconds, s.median_others) for s in summary.stragglers] == [(3, 12.4, 4.0)]


def test_the_primus_fixture_names_the_slow_image_pull_not_the_barrier_wait(tmp_path: Path):
    jobdir = Path(shutil.copytree(DATA / "jobs" / "primus_2node", tmp_path / "4711"))
    summary = collect(jobdir)
    assert summary.verdict == "SUCCESS"
    assert [s.describe() for s in summary.stragglers] == [
        "gpu-a01 (rank 0) image 41.7 s, 3.2x the median of the others (12.9 s)"
    ]
