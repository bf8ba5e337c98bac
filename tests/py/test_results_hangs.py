"""results collect: what the hang watch left in the node dirs (progress.json, hang.json).

A hang leads the reasons: the cause(s) by last progress, then one line for the waiters; a hung rank's
own `container exited 137` is not repeated. Bad files are warnings, never a traceback.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.results import collect
from slurm_multi.results.hangs import HangEntry, cause_reason, waiters_reason

T = 1764504187.0  # 2025-11-30T12:03:07Z
FULL_CSV = "model,performance,metric\ntoy,100.5,samples_per_second\n"


def at(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch))


def status(rank: int, exit_code: int = 137) -> dict[str, Any]:
    """status.json of a rank the time limit killed (exit 137), or an ok one with exit_code=0."""
    ok = exit_code == 0
    return {
        "rank": rank,
        "node": f"node{rank + 1}",
        "exit_code": exit_code,
        "status": "ok" if ok else "failed",
        "reason": "" if ok else "killed at the time limit",
        "stages": {"run": {"seconds": 300.0, "status": "ok" if ok else "failed", "exit_code": exit_code}},
    }


def hang(rank: int, role: str, state: str, detail: str | None, last: float, **extra: Any) -> dict[str, Any]:
    """hang.json as the watch writes it; `last` is the rank's last progress."""
    data = {
        "rank": rank, "node": f"node{rank + 1}", "role": role, "state": state, "detail": detail,
        "quiet_seconds": 120.4, "last_output_epoch": last - 0.5, "last_cpu_epoch": last,
        "last_progress_epoch": last, "detected_epoch": last + 120.4, "hang_timeout": 120,
        "processes": [{"pid": 4242, "tid": 4242, "state": "T", "wchan": "do_signal_stop", "comm": "python3"}],
    }  # fmt: skip
    if detail is None:
        del data["detail"]
    return dict(data, **extra)


def progress(rank: int, last_output: float, last_cpu: float) -> dict[str, Any]:
    return {
        "rank": rank, "node": f"node{rank + 1}", "last_output_epoch": last_output,
        "last_cpu_epoch": last_cpu, "cpu_seconds": 12.3, "updated_epoch": max(last_output, last_cpu) + 5,
    }  # fmt: skip


def make_job(
    root: Path,
    nnodes: int,
    hangs: dict[int, Any] | None = None,
    progresses: dict[int, Any] | None = None,
    statuses: dict[int, Any] | None = None,
    csv: bool = False,
) -> Path:
    """A job dir; hangs/progresses values are objects (written as JSON) or raw text/bytes."""
    root.mkdir(parents=True)
    meta = {"job_id": "88", "model": "toy_model", "nnodes": nnodes, "results_csv": "perf_toy.csv"}
    (root / "job.json").write_text(json.dumps(dict(meta, nodes=[f"node{r + 1}" for r in range(nnodes)])))
    for rank in range(nnodes):
        node_dir = root / f"node_{rank}"
        node_dir.mkdir()
        (node_dir / "status.json").write_text(json.dumps((statuses or {}).get(rank, status(rank))))
        (node_dir / "node.log").write_text("step 1\n")
        for name, files in (("hang.json", hangs), ("progress.json", progresses)):
            content = (files or {}).get(rank)
            if isinstance(content, bytes):
                (node_dir / name).write_bytes(content)
            elif isinstance(content, str):
                (node_dir / name).write_text(content)
            elif content is not None:
                (node_dir / name).write_text(json.dumps(content))
    if csv:
        (root / f"node_{nnodes - 1}" / "perf_toy.csv").write_text(FULL_CSV)
    return root


def cause_and_waiters_job(root: Path, **kwargs: Any) -> Path:
    """3 ranks: node2 (rank 1) frozen by docker pause at 12:03:07, the others in a socket wait."""
    hangs = {
        0: hang(0, "waiter", "socket-wait", "python3[4242] in do_epoll_wait", T + 1),
        1: hang(1, "cause", "frozen", "docker pause (cgroup frozen)", T),
        2: hang(2, "waiter", "socket-wait", "python3[4250] in sk_wait_data", T + 1.5),
    }
    progresses = {r: progress(r, h["last_output_epoch"], h["last_cpu_epoch"]) for r, h in hangs.items()}
    return make_job(root, 3, hangs=hangs, progresses=progresses, **kwargs)


def read_summary(jobdir: Path) -> dict[str, Any]:
    return json.loads((jobdir / "summary.json").read_text())


CAUSE_LINE = (
    "hung: node2 (rank 1), no output and no CPU for 120 s since 12:03:07 "
    "(frozen: docker pause (cgroup frozen))"
)
WAITERS_LINE = (
    "waiting (not the cause): node1 (rank 0), node3 (rank 2): blocked in a socket wait since 12:03:08"
)


# ----------------------------------------------------------------------------- cause and waiters


def test_the_cause_leads_the_reasons_then_the_waiters_and_no_exit_137_lines(tmp_path: Path):
    jobdir = cause_and_waiters_job(tmp_path / "88", csv=True)
    result = CliRunner().invoke(group, ["results", "collect", str(jobdir)])
    assert result.exit_code == 1
    summary = read_summary(jobdir)
    assert summary["verdict"] == "FAILURE"
    assert summary["reasons"] == [CAUSE_LINE, WAITERS_LINE]
    assert f"  reason: {CAUSE_LINE}\n  reason: {WAITERS_LINE}\n" in result.stderr
    assert "exited 137" not in result.stderr
    assert [n["reasons"] for n in summary["nodes"]] == [  # kept in the per-node data
        [f"node{r + 1} (rank {r}): container exited 137: killed at the time limit"] for r in range(3)
    ]


def test_summary_json_has_the_hang_and_each_nodes_last_progress(tmp_path: Path):
    jobdir = cause_and_waiters_job(tmp_path / "88")
    collect(jobdir)
    summary = read_summary(jobdir)
    assert summary["hang"] == {
        "causes": [
            {
                "rank": 1, "node": "node2", "state": "frozen", "detail": "docker pause (cgroup frozen)",
                "quiet_seconds": 120.4, "last_progress": "2025-11-30T12:03:07Z",
                "detected": "2025-11-30T12:05:07Z", "diagnostics": [],
            },
        ],
        "waiters": [
            {
                "rank": 0, "node": "node1", "state": "socket-wait",
                "detail": "python3[4242] in do_epoll_wait", "quiet_seconds": 120.4,
                "last_progress": "2025-11-30T12:03:08Z", "detected": "2025-11-30T12:05:08Z",
                "diagnostics": [],
            },
            {
                "rank": 2, "node": "node3", "state": "socket-wait",
                "detail": "python3[4250] in sk_wait_data", "quiet_seconds": 120.4,
                "last_progress": "2025-11-30T12:03:08Z", "detected": "2025-11-30T12:05:08Z",
                "diagnostics": [],
            },
        ],
    }  # fmt: skip
    assert [n["last_progress"] for n in summary["nodes"]] == [
        "2025-11-30T12:03:08Z", "2025-11-30T12:03:07Z", "2025-11-30T12:03:08Z"
    ]  # fmt: skip
    assert list(summary["nodes"][0]) == [
        "rank", "node", "exit_code", "status", "stages", "last_progress", "image", "reasons", "log_errors"
    ]  # fmt: skip


def test_a_hung_ranks_diagnostics_files_are_named_in_its_hang_entry(tmp_path: Path):
    jobdir = cause_and_waiters_job(tmp_path / "88")
    snapshot = jobdir / "node_1" / "diagnostics"
    snapshot.mkdir()
    for name in ("kernel-stacks.txt", "hang-processes.txt", "py-spy.txt"):
        (snapshot / name).write_text(f"{name}\n")
    (snapshot / "a-directory").mkdir()  # only files are named
    collect(jobdir)
    hang = read_summary(jobdir)["hang"]
    assert hang["causes"][0]["diagnostics"] == [
        "node_1/diagnostics/hang-processes.txt", "node_1/diagnostics/kernel-stacks.txt",
        "node_1/diagnostics/py-spy.txt",
    ]  # fmt: skip
    assert [w["diagnostics"] for w in hang["waiters"]] == [[], []]  # no snapshot there


def test_without_hang_files_hang_is_null_and_last_progress_comes_from_progress_json(tmp_path: Path):
    jobdir = make_job(tmp_path / "88", 2, progresses={1: progress(1, T - 4, T)}, statuses={0: status(0, 0)})
    collect(jobdir)
    summary = read_summary(jobdir)
    assert summary["hang"] is None
    assert [n["last_progress"] for n in summary["nodes"]] == [None, "2025-11-30T12:03:07Z"]
    assert summary["reasons"][0] == "node2 (rank 1): container exited 137: killed at the time limit"


def test_a_hang_fails_the_job_even_when_every_status_said_exit_0(tmp_path: Path):
    jobdir = cause_and_waiters_job(tmp_path / "88", statuses={r: status(r, 0) for r in range(3)}, csv=True)
    summary = collect(jobdir)
    assert summary.verdict == "FAILURE"
    assert summary.reasons == [CAUSE_LINE, WAITERS_LINE]
    status_column = summary.perf_header.index("status")
    assert [row[status_column] for row in summary.perf_rows] == ["FAILURE"]  # the CSV's row, failed


def test_a_rank_without_hang_json_keeps_its_own_reason_after_the_hang_lines(tmp_path: Path):
    hangs = {1: hang(1, "cause", "stopped", "SIGSTOP", T)}
    failed = dict(status(2, 1), reason="CUDA error")
    jobdir = make_job(tmp_path / "88", 3, hangs=hangs, statuses={0: status(0, 0), 2: failed})
    summary = collect(jobdir)
    assert summary.reasons[:2] == [
        "hung: node2 (rank 1), no output and no CPU for 120 s since 12:03:07 (stopped: SIGSTOP)",
        "node3 (rank 2): container exited 1: CUDA error",
    ]
    assert not any(r.startswith("node2 (rank 1):") for r in summary.reasons)
    assert summary.nodes[1].reasons == ["node2 (rank 1): container exited 137: killed at the time limit"]


def test_several_causes_are_ordered_by_last_progress_unknown_last(tmp_path: Path):
    hangs = {
        0: hang(0, "cause", "spinning", "python3[7] running", T + 4),
        1: hang(1, "cause", "disk-sleep", "python3[8] in io_schedule", T + 60, last_progress_epoch=None,
                last_output_epoch=None, last_cpu_epoch=None),
        2: hang(2, "cause", "stopped", None, T - 6),
        3: hang(3, "waiter", "socket-wait", "", T + 5),
    }  # fmt: skip
    jobdir = make_job(tmp_path / "88", 4, hangs=hangs)
    assert collect(jobdir).reasons == [
        "hung: node3 (rank 2), no output and no CPU for 120 s since 12:03:01 (stopped)",
        "hung: node1 (rank 0), no output and no CPU for 120 s since 12:03:11 (spinning: python3[7] running)",
        "hung: node2 (rank 1), no output and no CPU for 120 s (disk-sleep: python3[8] in io_schedule)",
        "waiting (not the cause): node4 (rank 3): blocked in a socket wait since 12:03:12",
        "no result CSV (perf_toy.csv) in any node and no 'performance: <value> <metric>' line in any "
        "node.log",
    ]
    assert [c["rank"] for c in read_summary(jobdir)["hang"]["causes"]] == [2, 0, 1]


def test_last_progress_falls_back_to_the_later_of_output_and_cpu(tmp_path: Path):
    entry = hang(0, "cause", "frozen", "docker pause", T, last_progress_epoch=None)
    entry.update(last_output_epoch=T + 10, last_cpu_epoch=T + 3)
    jobdir = make_job(tmp_path / "88", 1, hangs={0: entry})
    summary = collect(jobdir)
    assert summary.reasons[0] == (
        "hung: node1 (rank 0), no output and no CPU for 120 s since 12:03:17 (frozen: docker pause)"
    )
    assert read_summary(jobdir)["nodes"][0]["last_progress"] == "2025-11-30T12:03:17Z"


# ----------------------------------------------------------------------------- waiters only


def test_waiters_without_a_cause_name_the_ranks_that_were_not_waiting(tmp_path: Path):
    hangs = {
        0: hang(0, "waiter", "socket-wait", "python3[1] in sk_wait_data", T + 2),
        2: hang(2, "waiter", "socket-wait", "python3[3] in sk_wait_data", T + 1),
    }
    progresses = {1: progress(1, T - 2, T - 3), 0: progress(0, T + 2, T + 2)}
    jobdir = make_job(tmp_path / "88", 4, hangs=hangs, progresses=progresses)
    summary = collect(jobdir)
    assert summary.reasons[:3] == [
        "hung: no rank was seen stuck by itself; ranks not waiting: node2 (rank 1) (last progress 12:03:05), "
        "node4 (rank 3) (no progress record)",
        "waiting (not the cause): node1 (rank 0), node3 (rank 2): blocked in a socket wait since 12:03:08",
        "node2 (rank 1): container exited 137: killed at the time limit",
    ]
    assert summary.reasons[3].startswith("node4 (rank 3): container exited 137")
    assert read_summary(jobdir)["hang"]["causes"] == []


def test_waiters_in_different_states_and_many_waiters_are_one_line():
    waiters = [HangEntry(r, f"node{r + 1}", "waiter", "socket-wait", None, 120.0, T + r) for r in range(12)]
    waiters[3] = HangEntry(3, "node4", "waiter", "sleeping", None, 120.0, T - 30)
    line = waiters_reason(waiters)
    assert line == (
        "waiting (not the cause): node1 (rank 0), node2 (rank 1), node3 (rank 2), node4 (rank 3), "
        "node5 (rank 4), node6 (rank 5), node7 (rank 6), node8 (rank 7), node9 (rank 8), node10 (rank 9), "
        f"+2 more: blocked in a socket wait or sleeping since {at(T - 30)}"
    )


def test_a_cause_line_without_times_or_state_still_reads():
    assert cause_reason(HangEntry(4, "gpu-b07", "cause")) == "hung: gpu-b07 (rank 4), no output and no CPU"
    entry = HangEntry(4, "gpu-b07", "cause", None, "pid 9 stopped", 59.5, T)
    assert cause_reason(entry) == (
        "hung: gpu-b07 (rank 4), no output and no CPU for 60 s since 12:03:07 (pid 9 stopped)"
    )


# ----------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    "content, warning",
    [
        ("", "node_1/hang.json: not valid JSON (Expecting value: line 1 column 1 (char 0)); ignored"),
        ('{"rank": 1, "role": "cause", "sta', "node_1/hang.json: not valid JSON ("),
        ("not json", "node_1/hang.json: not valid JSON ("),
        (b"\xff\xfe{}", "node_1/hang.json: not valid JSON ("),
        ("[1, 2]", "node_1/hang.json: not a JSON object; ignored"),
        ('{"role": "boss"}', "node_1/hang.json: role 'boss' is not cause, waiter or unclear; ignored"),
        ('{"role": ["cause"]}', "node_1/hang.json: role ['cause'] is not cause, waiter or unclear; ignored"),
        ('{"state": "frozen"}', "node_1/hang.json: role None is not cause, waiter or unclear; ignored"),
        ("[" * 100_000, "node_1/hang.json: not valid JSON ("),
    ],
)
def test_a_bad_hang_json_is_a_warning_and_otherwise_ignored(tmp_path: Path, content: Any, warning: str):
    jobdir = make_job(tmp_path / "88", 2, hangs={1: content}, statuses={0: status(0, 0)})
    summary = collect(jobdir)
    assert len(summary.warnings) == 1 and summary.warnings[0].startswith(warning)
    assert summary.hang is None and read_summary(jobdir)["hang"] is None
    assert summary.reasons[0] == "node2 (rank 1): container exited 137: killed at the time limit"


@pytest.mark.parametrize(
    "content, warning",
    [
        ('{"last_output_epoch": 17645', "node_0/progress.json: not valid JSON ("),
        ("null", "node_0/progress.json: not a JSON object; ignored"),
        (
            '{"last_output_epoch": "yesterday", "last_cpu_epoch": -5}',
            "node_0/progress.json: last_output_epoch, last_cpu_epoch: wrong type or value; ignored",
        ),
        ('{"last_output_epoch": 1e400}', "node_0/progress.json: last_output_epoch: wrong type or value"),
        ('{"last_cpu_epoch": 1' + "0" * 400 + "}", "node_0/progress.json: last_cpu_epoch: wrong type"),
        ('{"last_cpu_epoch": 1e15}', "node_0/progress.json: last_cpu_epoch: wrong type or value; ignored"),
    ],
)
def test_a_bad_progress_json_is_a_warning_and_no_last_progress(tmp_path: Path, content: str, warning: str):
    jobdir = make_job(tmp_path / "88", 1, progresses={0: content}, statuses={0: status(0, 0)}, csv=True)
    summary = collect(jobdir)
    assert len(summary.warnings) == 1 and summary.warnings[0].startswith(warning)
    assert summary.verdict == "SUCCESS"
    assert read_summary(jobdir)["nodes"][0]["last_progress"] is None


def test_wrong_types_in_a_hang_json_are_left_out_and_the_rest_still_counts(tmp_path: Path):
    entry = hang(1, "cause", "frozen", "docker pause\x1b[31m", T)
    entry.update(state=7, quiet_seconds="120", detected_epoch=True, processes="garbage", last_cpu_epoch=None)
    jobdir = make_job(tmp_path / "88", 2, hangs={1: entry}, statuses={0: status(0, 0)})
    summary = collect(jobdir)
    assert summary.warnings == [
        "node_1/hang.json: state, quiet_seconds, detected_epoch: wrong type or value; ignored"
    ]
    assert summary.reasons[0] == (
        "hung: node2 (rank 1), no output and no CPU since 12:03:07 (docker pause\\x1b[31m)"
    )
    assert read_summary(jobdir)["hang"]["causes"][0] == {
        "rank": 1, "node": "node2", "state": None, "detail": "docker pause\\x1b[31m", "quiet_seconds": None,
        "last_progress": "2025-11-30T12:03:07Z", "detected": None, "diagnostics": [],
    }  # fmt: skip


def test_hang_files_that_are_directories_or_in_a_missing_node_never_crash(tmp_path: Path):
    jobdir = make_job(tmp_path / "88", 3, statuses={0: status(0, 0)})
    (jobdir / "node_0" / "hang.json").mkdir()
    (jobdir / "node_1" / "status.json").unlink()
    (jobdir / "node_1" / "node.log").unlink()
    (jobdir / "node_1").rmdir()
    (jobdir / "node_1").write_text("not a directory")
    summary = collect(jobdir)
    assert summary.warnings == ["node_0/hang.json: unreadable (Is a directory); ignored"]
    assert summary.hang is None


# ----------------------------------------------------------------------------- unclear ranks

LOCK = "main thread asleep off the network (futex_do_wait); helpers wait on it (do_epoll_wait)"


def test_an_unclear_rank_waits_when_another_rank_is_clearly_the_cause(tmp_path: Path):
    """gloo: every waiter's main thread waits on a futex while its loop thread is in epoll."""
    hangs = {
        0: hang(0, "unclear", "lock-wait", LOCK, T + 1),
        1: hang(1, "cause", "frozen", "docker pause (cgroup frozen)", T),
        2: hang(2, "unclear", "lock-wait", LOCK, T + 1.5),
    }
    summary = collect(make_job(tmp_path / "88", 3, hangs=hangs))
    assert summary.reasons[:2] == [
        CAUSE_LINE,
        "waiting (not the cause): node1 (rank 0), node3 (rank 2): asleep on a lock or condition while helper "
        "threads wait on the network since 12:03:08",
    ]


def test_an_unclear_rank_is_the_suspect_when_the_others_wait_on_the_network(tmp_path: Path):
    """A rank deadlocked on a lock while a helper polls, its peers blocked reading from it."""
    hangs = {
        0: hang(0, "waiter", "socket-wait", "python3[4242] in sk_wait_data", T + 1),
        1: hang(1, "unclear", "lock-wait", LOCK, T),
        2: hang(2, "waiter", "socket-wait", "python3[4250] in sk_wait_data", T + 1.5),
    }
    summary = collect(make_job(tmp_path / "88", 3, hangs=hangs))
    assert summary.reasons[0] == (
        f"hung: node2 (rank 1), no output and no CPU for 120 s since 12:03:07 (lock-wait: {LOCK})"
    )
    assert summary.reasons[1] == WAITERS_LINE
    assert [e.rank for e in summary.hang.causes] == [1] and [e.rank for e in summary.hang.waiters] == [0, 2]
