"""The fitness stage's verdict (slurm_multi.fitness.verdict): one node's view (judge), the batch
step's over every report (judge_reports), one attempt of a job from its node dirs (judge_job).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitness_nodes import cli, reasons, view
from slurm_multi.fitness import verdict
from slurm_multi.fitness.verdict import judge, judge_reports

HINT = "(is the job token the same on every node?)"


def test_judge_names_this_node_and_peers_whose_local_checks_failed() -> None:
    found = judge(
        view(
            0,
            3,
            local="GPU 1 held by pid 4242 (2048 MiB) of another job",
            verdicts={2: "docker engine did not answer /_ping within 3 s"},
        )
    )
    assert reasons(found) == {
        0: "GPU 1 held by pid 4242 (2048 MiB) of another job",
        2: "docker engine did not answer /_ping within 3 s",
    }
    assert found[0]["host"] == "node0"
    assert judge(view(1, 3)) == []


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        # heard nobody although peers took our HELLO: our port is unreachable
        (view(0, 3, heard=[]), {0: "unreachable on port 20000 from every peer"}),
        # nothing at all, every peer said our token is wrong
        (
            view(0, 3, reached=[], heard=[], token_rejected_by=[1, 2], errors={1: "rejected: bad token"}),
            {0: f"every peer rejects this node's job token on port 20000 {HINT}"},
        ),
        (
            view(0, 3, reached=[], heard=[], errors={1: "timed out", 2: "timed out"}),
            {0: "unreachable on port 20000 from every peer and reached none (timed out)"},
        ),
        (view(0, 3, reached=[], errors={1: "no route to host"}), {0: "reached no peer (no route to host)"}),
        # one peer silent: what we saw of it says why
        (
            view(0, 3, heard=[1]),
            {2: "accepted node0's connection on port 20002 but sent no HELLO within 10 s"},
        ),
        (
            view(0, 3, reached=[1], heard=[1], errors={2: "connection refused"}),
            {2: "no answer on port 20002 within 10 s (connection refused): did its fitness stage start?"},
        ),
        (
            view(0, 3, reached=[1], heard=[1], rejected=[2]),
            {2: f"wrong job token: its connections on port 20002 do not verify {HINT}"},
        ),
        (
            view(0, 3, reached=[1], errors={2: "timed out"}),
            {2: "does not accept connections on port 20002 from node0 (timed out)"},
        ),
        # we could not listen: peers we reached are fine, the others are named
        (
            view(0, 3, reached=[1], heard=[], listening=False, errors={2: "connection refused"}),
            {2: "does not accept connections on port 20002 from node0 (connection refused)"},
        ),
        # two nodes: whoever is silent is named, never ourselves
        (
            view(0, 2, reached=[], heard=[], errors={1: "connection refused"}),
            {1: "no answer on port 20001 within 10 s (connection refused): did its fitness stage start?"},
        ),
    ],
)
def test_judge_reachability_rules(report: dict, expected: dict[int, str]) -> None:
    assert reasons(judge(report)) == expected


def test_judge_finds_a_slow_link_and_a_skewed_clock_in_its_view() -> None:
    mb = 1e6
    found = judge(view(3, 4, rates={0: 900 * mb, 1: 40 * mb, 2: 1000 * mb, 3: 950 * mb}, offsets={1: 5.2}))
    assert reasons(found) == {
        1: "link node1->node2: 40.0 MB/s, median 925.0 MB/s; clock 5.2 s ahead of the job's median",
        2: "link node1->node2: 40.0 MB/s, median 925.0 MB/s",
    }


# --------------------------------------------------------------------------------------------------
# judge_reports(): the batch step's verdict over every report


def test_judge_reports_names_missing_reports_with_what_their_hello_said() -> None:
    reports = [
        view(0, 3, verdicts={2: "/var/lib/docker: 0.4 GiB free, 2.1 GiB needed + 1 GiB reserve"}),
        None,
        None,
    ]
    assert reasons(judge_reports(reports, 3)) == {
        1: "no fitness report (the stage did not finish on that node)",
        2: "no fitness report (the stage did not finish on that node); its HELLO said: /var/lib/docker: "
        "0.4 GiB free, 2.1 GiB needed + 1 GiB reserve",
    }
    assert reasons(
        judge_reports(
            [view(0, 2, local="enroot not found on PATH (--runtime pyxis needs it)"), view(1, 2)], 2
        )
    ) == {0: "enroot not found on PATH (--runtime pyxis needs it)"}
    assert judge_reports([view(r, 4) for r in range(4)], 4) == []


def test_judge_reports_names_a_node_unreachable_from_a_majority() -> None:
    # node3's port is blocked for node0 and node1, open for node2; node2 also misses node1 (a minority)
    reports = [
        view(0, 4, reached=[1, 2], heard=[1, 2]),
        view(1, 4, reached=[0], heard=[0, 2, 3]),
        view(2, 4, reached=[0, 3], heard=[0, 3]),
        view(3, 4, reached=[1, 2], heard=[2]),
    ]
    assert reasons(judge_reports(reports, 4)) == {
        3: "unreachable on port 20003 from 2 of 3 peers (node0, node1)",
    }
    isolated = [
        view(0, 3, reached=[1], heard=[1]),
        view(1, 3, reached=[0], heard=[0]),
        view(2, 3, reached=[], heard=[]),
    ]
    assert reasons(judge_reports(isolated, 3)) == {2: "unreachable on port 20002 from every peer"}


def test_judge_reports_cannot_tell_which_of_two_nodes_is_cut_off() -> None:
    cut = [view(0, 2, reached=[], heard=[]), view(1, 2, reached=[], heard=[])]
    assert reasons(judge_reports(cut, 2)) == {
        0: "node0 and node1 cannot reach each other on port 20000/20001",
        1: "node0 and node1 cannot reach each other on port 20000/20001",
    }
    tokens = [
        view(0, 2, reached=[], heard=[], token_rejected_by=[1]),
        view(1, 2, reached=[], heard=[], rejected=[0]),
    ]
    assert set(reasons(judge_reports(tokens, 2)).values()) == {
        "node0 and node1 do not share the job token on port 20000/20001"
    }
    one_way = [view(0, 2, reached=[], heard=[1]), view(1, 2, reached=[0], heard=[])]  # 0 cannot reach 1
    assert reasons(judge_reports(one_way, 2)) == {1: "unreachable on port 20001 from every peer"}


def test_judge_reports_names_a_wrong_token_node() -> None:
    reports = [
        view(0, 3, reached=[1], heard=[1], rejected=[2], token_rejected_by=[2]),
        view(1, 3, reached=[0], heard=[0], rejected=[2], token_rejected_by=[2]),
        view(2, 3, reached=[], heard=[], token_rejected_by=[0, 1]),
    ]
    assert reasons(judge_reports(reports, 3)) == {
        2: "wrong job token: 2 of 2 peers reject its connections on port 20002"
    }


MB = 1e6


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        # one slow link in a 4-node ring: both of its ends
        (
            {0: 1000 * MB, 1: 950 * MB, 2: 30 * MB, 3: 900 * MB},
            {
                2: "link node2->node3: 30.0 MB/s, median 925.0 MB/s",
                3: "link node2->node3: 30.0 MB/s, median 925.0 MB/s",
            },
        ),
        # node2 slow both ways (links 1->2 and 2->3): node2 alone
        (
            {0: 1000 * MB, 1: 10 * MB, 2: 12 * MB, 3: 950 * MB},
            {
                2: "both ring links slow: node1->node2 10.0 MB/s and node2->node3 12.0 MB/s, "
                "the other links' median 975.0 MB/s"
            },
        ),
        # just above the factor (0.1 x the median): fine
        ({0: 1000 * MB, 1: 950 * MB, 2: 95 * MB, 3: 900 * MB}, {}),
        # three measured links are enough, two are not
        (
            {0: 1000 * MB, 1: None, 2: 10 * MB, 3: 900 * MB},
            {
                2: "link node2->node3: 10.0 MB/s, median 900.0 MB/s",
                3: "link node2->node3: 10.0 MB/s, median 900.0 MB/s",
            },
        ),
        ({0: 1000 * MB, 1: None, 2: 10 * MB, 3: None}, {}),
    ],
)
def test_judge_reports_slow_links_in_a_four_node_ring(rates: dict, expected: dict[int, str]) -> None:
    reports = [view(r, 4, rates={r: rates[r]}) for r in range(4)]
    assert reasons(judge_reports(reports, 4)) == expected


def ring(rates: dict[int, float | None], **options: Any) -> dict[int, str]:
    """What the batch step names for these ring rates (rank r's link r -> r+1), every report in."""
    n = len(rates)
    return reasons(judge_reports([view(r, n, rates={r: rates[r]}) for r in range(n)], n, **options))


SLOW_BOTH = "both ring links slow: node{0}->node{1} {3} MB/s and node{1}->node{2} {4} MB/s"


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        # 3 nodes, node1 throttled both ways: it sits on 2 of the 3 links (the median is its own
        # slow link), and is judged against the link that does not touch it
        (
            {0: 2.5 * MB, 1: 2.4 * MB, 2: 900 * MB},
            {1: SLOW_BOTH.format(0, 1, 2, "2.5", "2.4") + ", the other links' median 900.0 MB/s"},
        ),
        # 5 nodes, node3 slow both ways
        (
            {0: 900 * MB, 1: 950 * MB, 2: 3 * MB, 3: 4 * MB, 4: 1000 * MB},
            {3: SLOW_BOTH.format(2, 3, 4, "3.0", "4.0") + ", the other links' median 950.0 MB/s"},
        ),
        # one link slow one way (3 nodes): both of its ends, as a link
        (
            {0: 900 * MB, 1: 8 * MB, 2: 1000 * MB},
            {r: "link node1->node2: 8.0 MB/s, median 900.0 MB/s" for r in (1, 2)},
        ),
        # a healthy node on a busy host, measured 5x below the others both ways: not named
        ({0: 180 * MB, 1: 200 * MB, 2: 900 * MB}, {}),
        ({0: 950 * MB, 1: 190 * MB, 2: 180 * MB, 3: 900 * MB}, {}),
        ({0: 950 * MB, 1: 190 * MB, 2: 180 * MB, 3: 900 * MB, 4: 1000 * MB, 5: 980 * MB}, {}),
        # every link equally slow: nothing to compare with, nobody named
        ({0: 2.5 * MB, 1: 2.4 * MB, 2: 2.6 * MB}, {}),
        # two nodes: which one is slow cannot be told, without a floor nothing is judged
        ({0: 1000 * MB, 1: 1 * MB}, {}),
    ],
)
def test_the_slow_link_rule_judges_a_node_against_the_links_it_does_not_touch(
    rates: dict, expected: dict[int, str]
) -> None:
    assert ring(rates) == expected


# the 16-node job on the 2-core test cluster (e2e 97): healthy links measured 11x apart while every
# sender waited for a CPU; node4's links both ~10x below the others' median
BUSY_16 = {r: (860 if r % 2 else 1150) * MB for r in range(16)} | {2: 75.8 * MB, 3: 78.5 * MB}


@pytest.mark.parametrize("bound", [set(range(16)), {2, 3}])
def test_a_rate_measured_while_its_sender_waited_for_a_cpu_is_never_slow(bound: set[int]) -> None:
    assert ring(BUSY_16) == {
        3: SLOW_BOTH.format(2, 3, 4, "75.8", "78.5") + ", the other links' median 1005.0 MB/s"
    }
    reports = [view(r, 16, rates={r: BUSY_16[r]}, cpu_bound=bound) for r in range(16)]
    assert judge_reports(reports, 16) == []
    for me in (2, 3, 4, 15):  # each view, with the partners' HELLOs (their "N+" rates)
        assert judge(view(me, 16, rates=BUSY_16, cpu_bound=bound)) == []
    assert ring(BUSY_16 | {3: 10 * MB}, min_rate=50 * MB) != {}
    floor = [view(r, 16, rates={r: (BUSY_16 | {3: 10 * MB})[r]}, cpu_bound=bound) for r in range(16)]
    assert judge_reports(floor, 16, min_rate=50 * MB) == []  # (the floor judges links, not cores)


def test_a_cpu_bound_rate_still_counts_as_the_others_reference() -> None:
    """A lower bound of a fast link is evidence enough against a node slow both ways."""
    rates = {0: 2.5 * MB, 1: 2.4 * MB, 2: 900 * MB}
    reports = [view(r, 3, rates={r: rates[r]}, cpu_bound={2}) for r in range(3)]
    assert set(reasons(judge_reports(reports, 3))) == {1}


def test_a_slow_node_is_named_in_its_own_view_and_in_a_peers() -> None:
    rates = {0: 2.5 * MB, 1: 2.4 * MB, 2: 900 * MB}
    for me in range(3):
        assert set(reasons(judge(view(me, 3, rates=rates)))) == {1}


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        # every link equally slow, all below the floor: each node is named
        (
            {0: 2.5 * MB, 1: 2.4 * MB, 2: 2.6 * MB},
            {
                0: SLOW_BOTH.format(2, 0, 1, "2.6", "2.5"),
                1: SLOW_BOTH.format(0, 1, 2, "2.5", "2.4"),
                2: SLOW_BOTH.format(1, 2, 0, "2.4", "2.6"),
            },
        ),
        # one link below the floor: both of its ends
        (
            {0: 400 * MB, 1: 45 * MB, 2: 450 * MB},  # (45 is above 0.1 x the median)
            {1: "link node1->node2: 45.0 MB/s", 2: "link node1->node2: 45.0 MB/s"},
        ),
        # two nodes, both links below it: both named (which one is slow cannot be told)
        (
            {0: 40 * MB, 1: 45 * MB},
            {0: SLOW_BOTH.format(1, 0, 1, "45.0", "40.0"), 1: SLOW_BOTH.format(1, 0, 1, "45.0", "40.0")},
        ),
        # two nodes, one link below it: both ends of that link
        ({0: 40 * MB, 1: 900 * MB}, {0: "link node0->node1: 40.0 MB/s", 1: "link node0->node1: 40.0 MB/s"}),
        # above the floor: fine
        ({0: 60 * MB, 1: 55 * MB, 2: 70 * MB}, {}),
    ],
)
def test_a_link_below_the_min_rate_floor_names_its_node_or_both_ends(
    rates: dict, expected: dict[int, str]
) -> None:
    floor = ", below the --fitness-min-rate floor of 50.0 MB/s"
    assert ring(rates, min_rate=50 * MB) == {r: reason + floor for r, reason in expected.items()}


def test_judge_reports_takes_a_missing_nodes_ring_rate_from_its_hello() -> None:
    rates = {0: 1000 * MB, 1: 950 * MB, 2: 900 * MB, 3: 20 * MB}
    reports: list[dict | None] = [view(r, 4, rates=rates) for r in range(3)] + [None]
    found = judge_reports(reports, 4, hosts=[f"node{r}" for r in range(4)])
    assert reasons(found)[0] == "link node3->node0: 20.0 MB/s, median 925.0 MB/s"


def test_two_nodes_report_rates_but_nothing_is_slow() -> None:
    reports = [view(r, 2, rates={0: 1000 * MB, 1: 1 * MB}) for r in range(2)]
    assert judge_reports(reports, 2) == [] and judge(reports[0]) == []


@pytest.mark.parametrize(
    ("skew", "expected"),
    [
        ({3: 5.2}, {3: "clock 5.2 s ahead of the job's median"}),
        ({1: -3.0}, {1: "clock 3.0 s behind the job's median"}),
        ({3: 1.9}, {}),
    ],
)
def test_judge_reports_names_a_skewed_clock(skew: dict[int, float], expected: dict[int, str]) -> None:
    reports = [view(r, 4, offsets=skew) for r in range(4)]
    assert reasons(judge_reports(reports, 4)) == expected
    assert reasons(judge(reports[0])) == expected  # one node's view agrees


def test_two_clocks_apart_name_both_nodes() -> None:
    reports = [view(r, 2, offsets={1: 2.5}) for r in range(2)]
    reason = (
        "clocks of node0 and node1 differ by 2.5 s (more than 2 s; with two clocks, which one is off "
        "cannot be told)"
    )
    assert reasons(judge_reports(reports, 2)) == {0: reason, 1: reason}
    assert judge_reports([view(r, 2, offsets={1: 1.5}) for r in range(2)], 2) == []


@pytest.mark.parametrize("bad", [10**400, float("inf"), float("nan")], ids=["huge", "inf", "nan"])
def test_a_number_no_float_holds_counts_as_absent_in_a_report(bad: float) -> None:
    """A report is another process's file: a timeout, rate or offset of 400 digits is no number."""
    reports = [view(r, 4, rates={0: 1000 * MB, 1: 950 * MB, 2: 900 * MB, 3: 980 * MB}) for r in range(4)]
    for report in reports:
        report["timeout"] = bad
        net = report["checks"]["network"]
        net["ring"]["bytes_per_s"] = bad
        net["offsets"] = {q: bad for q in net["offsets"]}
        net["peers"]["3" if report["rank"] != 3 else "0"]["ring_bytes_per_s"] = bad
    assert judge_reports(reports, 4) == []
    assert judge(reports[0]) == []


def write_node(
    jobdir: Path,
    rank: int,
    host: str,
    prepare: str,
    report: dict[str, Any] | None,
    reason: str = "",
    exit_code: int | None = None,
) -> None:
    node = jobdir / f"node_{rank}"
    node.mkdir(parents=True)
    status = {
        "rank": rank,
        "node": host,
        "exit_code": exit_code if exit_code is not None else 0 if prepare == "ok" else 2,
        "reason": reason,
        "status": "ok" if prepare == "ok" else "failed",
        "stages": {"prepare": {"seconds": 0.1, "status": prepare}},
    }
    (node / "status.json").write_text(json.dumps(status))
    if report is not None:
        (node / "fitness.json").write_text(json.dumps(report))


def fit_report(rank: int, hosts: list[str], ok: bool = True, reason: str = "") -> dict[str, Any]:
    n = len(hosts)
    peers = [r for r in range(n) if r != rank]
    return {
        "version": 1,
        "rank": rank,
        "host": hosts[rank],
        "nnodes": n,
        "hosts": hosts,
        "ports": [9] * n,
        "ok": ok,
        "reason": reason,
        "local": {"ok": ok, "reason": reason},
        "bad": [],
        "checks": {"network": {"port": 9, "reached": peers, "heard": peers, "ring": {}, "offsets": {}}},
    }


def test_one_attempts_verdict_blames_a_node_whose_own_prepare_failed_never_a_job_wide_failure(
    tmp_path: Path,
) -> None:
    hosts = ["n1", "n2", "n3"]
    # n3's docker engine is down: its prepare fails, the others pass and wait for it in the mesh.
    job = tmp_path / "job"
    write_node(job, 0, "n1", "ok", fit_report(0, hosts))
    write_node(job, 1, "n2", "ok", fit_report(1, hosts))
    write_node(job, 2, "n3", "failed", None, "prepare: docker engine not reachable on n3")
    assert verdict.judge_job(str(job), hosts) == [
        {"rank": 2, "host": "n3", "reason": "prepare: docker engine not reachable on n3", "evidence": "local"}
    ]
    # A bad manifest: every node's prepare fails alike, and nobody is to blame.
    bad_manifest = tmp_path / "manifest"
    for rank, host in enumerate(hosts):
        write_node(bad_manifest, rank, host, "failed", None, "prepare: no model 'x' in the manifest")
    assert verdict.judge_job(str(bad_manifest), hosts) == []
    # Every node fit: nothing.
    healthy = tmp_path / "healthy"
    for rank, host in enumerate(hosts):
        write_node(healthy, rank, host, "ok", fit_report(rank, hosts))
    assert verdict.judge_job(str(healthy), hosts) == []


def test_one_attempts_verdict_places_reports_by_node_index_with_several_tasks_per_node(
    tmp_path: Path,
) -> None:
    hosts = ["n1", "n2"]
    job = tmp_path / "job"
    # Two tasks per node: ranks 0, 1 on n1 and 2, 3 on n2; the first task of each node checks it.
    write_node(job, 0, "n1", "ok", fit_report(0, hosts))
    write_node(job, 1, "n1", "ok", None)
    write_node(job, 2, "n2", "ok", fit_report(1, hosts, ok=False, reason="/tmp: 1 MiB free"))
    write_node(job, 3, "n2", "ok", None)
    assert verdict.judge_job(str(job), hosts) == [
        {"rank": 1, "host": "n2", "reason": "/tmp: 1 MiB free", "evidence": "local"}
    ]
    out = cli(["judge", "--jobdir", str(job), "--nodes", "n1 n2"])
    assert (out.returncode, out.stdout) == (0, "1\tn2\t/tmp: 1 MiB free\tlocal\n"), out.stderr


def test_one_attempts_verdict_reads_a_signal_ended_task_from_its_status_and_does_not_name_it(
    tmp_path: Path,
) -> None:
    # The CI case through the files the job leaves: n3's engine is down (its prepare failed), the
    # batch step stopped the step, and n2's task ended on the signal (exit 143) before its report.
    hosts = ["n1", "n2", "n3"]
    down = "prepare: docker engine not reachable on n3"
    job = tmp_path / "job"
    write_node(job, 0, "n1", "ok", fit_report(0, hosts))
    write_node(job, 1, "n2", "ok", None, "stopped by a signal", exit_code=verdict.EXIT_STOPPED)
    write_node(job, 2, "n3", "failed", None, down)
    named = verdict.judge_job(str(job), hosts)
    assert named == [{"rank": 2, "host": "n3", "reason": down, "evidence": "local"}]
    # The same node ended another way (its own crash): named, as before.
    crashed = tmp_path / "crashed"
    write_node(crashed, 0, "n1", "ok", fit_report(0, hosts))
    write_node(crashed, 1, "n2", "ok", None, "fitness helper crashed", exit_code=1)
    write_node(crashed, 2, "n3", "failed", None, down)
    assert [e["rank"] for e in verdict.judge_job(str(crashed), hosts)] == [1, 2]


def test_a_node_whose_own_fitness_command_failed_is_bad_unless_every_node_failed_it(tmp_path: Path) -> None:
    hosts = ["n1", "n2", "n3"]
    job = tmp_path / "job"
    for rank, host in enumerate(hosts):
        write_node(job, rank, host, "ok", fit_report(rank, hosts))
    for rank, (code, why) in enumerate(
        [(0, ""), (0, ""), (3, "fitness command on n3: exited 3: no IB link")]
    ):
        out = cli(["record-cmd", str(job / f"node_{rank}" / "fitness-cmd.json"), hosts[rank], str(code), why])
        assert out.returncode == 0, out.stderr
    assert verdict.judge_job(str(job), hosts) == [
        {
            "rank": 2,
            "host": "n3",
            "reason": "fitness command on n3: exited 3: no IB link",
            "evidence": "local",
        }
    ]
    # The check fails everywhere: the check is wrong, not the nodes.
    for rank in (0, 1):
        verdict.write_cmd_record(str(job / f"node_{rank}" / "fitness-cmd.json"), hosts[rank], 1, "exited 1")
    assert verdict.judge_job(str(job), hosts) == []
    bad = cli(["record-cmd", "x"])
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("ordered", "removed", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], [2.0, 3.0], 2.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], [1.0], 3.5),
        ([2.0, 2.0, 2.0, 9.0], [2.0, 2.0], 5.5),  # equal values: one copy each
        ([5.0, 7.0], [5.0, 7.0], None),
        ([5.0], [], 5.0),
    ],
)
def test_the_median_without_a_nodes_own_links(ordered: list, removed: list, expected: float | None) -> None:
    assert verdict._median_without(ordered, removed) == expected


def test_a_node_a_signal_stopped_before_its_report_is_not_named_unless_its_hello_said_so() -> None:
    # CI: node3 failed its prepare, the batch step stopped the step at once, and node2's fitness
    # helper died in its start, before it could write a report: "no fitness report" named node2
    # (evidence none), the requeue excluded node2 and node3 and the 3-node job never ran on 4 nodes.
    reports = [view(0, 3, verdicts={2: "docker engine down"}), None, None]
    found = reasons(judge_reports(reports, 3, terminated=frozenset({1, 2})))
    assert set(found) == {2} and found[2].endswith("its HELLO said: docker engine down")
    assert 1 in reasons(judge_reports(reports, 3))  # without the signal: named, as before
