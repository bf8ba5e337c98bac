"""A fitness check that scales (slurm_multi.fitness.mesh.partners): each node dials and hears from
a bounded set of partners, and the judges work from those partial views: a node unreachable from its
checkers is named, a node that never dialled another does not vote on it.
"""

from __future__ import annotations

import pytest

from fitness_nodes import JOB, TOKEN, reasons, run_meshes, view
from slurm_multi.fitness.mesh import EXTRA_OFFSETS, partners
from slurm_multi.fitness.verdict import judge, judge_reports


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_a_small_job_is_still_every_node_with_every_other(n: int) -> None:
    for me in range(n):
        assert partners(me, n, JOB) == [q for q in range(n) if q != me]


@pytest.mark.parametrize("n", [8, 9, 64, 1000, 1024, 4096])
def test_partners_are_bounded_symmetric_the_same_on_every_node_and_include_the_ring(n: int) -> None:
    chosen = {me: partners(me, n, JOB) for me in range(n)}
    assert chosen == {me: partners(me, n, JOB) for me in range(n)}  # a function of (rank, N, job) only
    for me, mine in chosen.items():
        assert me not in mine and 2 <= len(mine) <= 2 * (1 + EXTRA_OFFSETS)
        assert {(me - 1) % n, (me + 1) % n} <= set(mine)
        assert all(me in chosen[q] for q in mine)  # a node's partners check it: each dials the other
    # O(N) connections for the job: at most 2 (one each way) per pair of partners
    assert sum(len(mine) for mine in chosen.values()) <= 2 * (1 + EXTRA_OFFSETS) * n


def test_another_job_draws_other_offsets() -> None:
    drawn = {tuple(partners(0, 1024, str(job))) for job in range(20)}
    assert len(drawn) > 1


# --------------------------------------------------------------------------------------------------
# The judges over partial views


def partial(rank: int, n: int, cut: set[int] = frozenset(), **more: object) -> dict:
    """Rank's report in an n-node job where each node talks with its partners only; nodes in `cut`
    reach nobody and are heard by nobody (their partners' dials fail)."""
    mine = partners(rank, n, JOB)
    if rank in cut:
        ok: list[int] = []
    else:
        ok = [q for q in mine if q not in cut]
    report = view(rank, n, reached=ok, heard=ok, **more)
    report["checks"]["network"]["partners"] = mine
    return report


def test_partial_views_of_a_healthy_large_job_name_nobody() -> None:
    n = 40
    reports = [partial(r, n) for r in range(n)]
    assert judge_reports(reports, n) == []
    assert all(judge(report) == [] for report in reports)


def test_a_node_unreachable_from_its_checkers_is_named_by_them_alone() -> None:
    n, bad = 40, 17
    reports = [partial(r, n, cut={bad}) for r in range(n)]
    checkers = partners(bad, n, JOB)
    assert reasons(judge_reports(reports, n)) == {bad: "unreachable on port 20017 from every peer"}
    # each checker names it in its own view; a node that never dialled it says nothing about it
    for r in range(n):
        named = set(reasons(judge(reports[r])))
        assert named == ({bad} if r in checkers or r == bad else set()), r
    # its checkers' reports and its own are all it takes: without the others' the verdict is the same
    only = [reports[r] if r in checkers or r == bad else None for r in range(n)]
    found = {e["rank"]: e["reason"] for e in judge_reports(only, n) if e["rank"] == bad}
    assert found == {bad: "unreachable on port 20017 from every peer"}


def test_a_slow_node_is_named_from_its_partners_hellos() -> None:
    n, slow, mb = 40, 9, 1e6
    rates = {r: 900 * mb for r in range(n)} | {slow - 1: 2.5 * mb, slow: 2.4 * mb}
    reports = [partial(r, n, rates=rates) for r in range(n)]
    # each report holds its own rate and its partners' (their HELLOs); the batch step sees every link
    for report in reports:
        net = report["checks"]["network"]
        net["peers"] = {q: p for q, p in net["peers"].items() if int(q) in net["partners"]}
    found = reasons(judge_reports(reports, n))
    assert set(found) == {slow} and found[slow].startswith("both ring links slow: node8->node9 2.5 MB/s")


# --------------------------------------------------------------------------------------------------
# In process: meshes of partners over real sockets on loopback


def test_twenty_meshes_talk_with_their_partners_only() -> None:
    n = 20
    meshes = run_meshes([TOKEN] * n, probe_bytes=0, seconds=20.0)
    for rank, mesh in enumerate(meshes):
        figures = mesh.figures()
        mine = partners(rank, n, JOB)
        assert mesh.done() and len(mine) == 2 * (1 + EXTRA_OFFSETS)
        assert (figures["partners"], figures["reached"], figures["heard"]) == (mine, mine, mine)
        assert set(figures["offsets"]) == {str(q) for q in [rank, *mine]}
        assert figures["connections"]["accepted"] >= len(mine)
        assert figures["connections"]["dialled"] >= len(mine)
