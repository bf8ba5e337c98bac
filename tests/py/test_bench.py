"""The benchmark harness: statistics, the report, the cluster hook, and each benchmark at tiny sizes
(so a change to a helper cannot silently break `make bench`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))

import barrier_bench  # noqa: E402
import benchlib  # noqa: E402
import collect_bench  # noqa: E402
import fitness_bench  # noqa: E402
import relay_bench  # noqa: E402
import report  # noqa: E402
import report_bench  # noqa: E402

ROW_FIELDS = {
    "row", "what", "baseline", "median_s", "spread_s", "baseline_median_s", "baseline_spread_s",
    "ratio", "target", "met", "runs", "notes",
}  # fmt: skip


def bench_env() -> dict[str, str]:
    return benchlib.helper_env({"SM_PYTHON": sys.executable})


# --------------------------------------------------------------------------------------------------
# statistics and rows


def test_median_of_odd_and_even_sample_counts() -> None:
    assert benchlib.median([3.0, 1.0, 2.0]) == 2.0
    assert benchlib.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    with pytest.raises(ValueError):
        benchlib.median([])


def test_spread_is_min_and_max() -> None:
    assert benchlib.spread([0.3, 0.1, 0.2]) == [0.1, 0.3]
    assert benchlib.spread([5.0]) == [5.0, 5.0]


def test_ratio_is_measured_over_baseline_and_none_for_a_zero_baseline() -> None:
    assert benchlib.ratio(3.0, 2.0) == pytest.approx(1.5)
    assert benchlib.ratio(1.0, 0.0) is None
    assert benchlib.ratio(float("nan"), 1.0) is None


def test_targets_parse_and_judge_the_ratio() -> None:
    assert benchlib.target_limit("<= 2.0x") == 2.0
    assert benchlib.target_limit("<=3x") == 3.0
    assert benchlib.target_limit(None) is None
    assert benchlib.target_met(1.99, "<= 2.0x") is True
    assert benchlib.target_met(2.0, "<= 2.0x") is True
    assert benchlib.target_met(2.01, "<= 2.0x") is False
    assert benchlib.target_met(None, "<= 2.0x") is None
    assert benchlib.target_met(5.0, None) is None
    with pytest.raises(ValueError):
        benchlib.target_limit("under 2")


def test_a_target_in_seconds_added_judges_the_pairs_differences() -> None:
    assert benchlib.target_limit("<= 0.8 s added") == 0.8 and benchlib.target_on_added("<= 0.8 s added")
    assert benchlib.target_limit("<= 1.5 CPU-s added") == 1.5 and not benchlib.target_on_added("<= 2.0x")
    # Pairs: (3.0, 1.0), (2.5, 2.0), (2.2, 1.9), (9.0, 1.2): added 2.0, 0.5, 0.3, 7.8 -> median 1.25.
    row = benchlib.make_row(
        "r", "w", "b", [3.0, 2.5, 2.2, 9.0], [1.0, 2.0, 1.9, 1.2], target="<= 0.8 s added", paired=True
    )
    assert row["added_s"] == pytest.approx(1.25) and row["added_spread_s"] == pytest.approx([0.3, 7.8])
    assert row["added_iqr_s"] == pytest.approx([0.45, 3.45])
    assert row["ratio"] == pytest.approx(2.75 / 1.55) and row["met"] is False  # judged on added, not ratio
    met = benchlib.make_row("r", "w", "b", [2.0, 2.1], [1.5, 1.4], target="<= 0.8 s added", paired=True)
    assert met["met"] is True and met["added_samples_s"] == pytest.approx([0.5, 0.7])
    with pytest.raises(ValueError, match="paired"):
        benchlib.make_row("r", "w", "b", [2.0], [1.0], target="<= 0.8 s added")  # no pairs, no added
    with pytest.raises(ValueError, match="1 samples vs 2"):
        benchlib.make_row("r", "w", "b", [2.0], [1.0, 1.1], paired=True)


def test_make_row_uses_the_medians_of_both_sides() -> None:
    row = benchlib.make_row("r", "what", "base", [3.0, 1.0, 2.0, 9.0, 2.5], [1.0, 1.0, 2.0], target="<= 2.0x")
    assert ROW_FIELDS <= set(row)
    assert row["median_s"] == 2.5 and row["spread_s"] == [1.0, 9.0]
    assert row["baseline_median_s"] == 1.0 and row["baseline_spread_s"] == [1.0, 2.0]
    assert row["ratio"] == pytest.approx(2.5)
    assert row["met"] is False
    assert row["runs"] == 5 and row["baseline_runs"] == 3


def test_skipped_row_has_no_numbers_and_says_why() -> None:
    row = benchlib.skipped_row("cluster", "", "", "test cluster not up")
    assert ROW_FIELDS <= set(row)
    assert row["skipped"] == "test cluster not up"
    assert row["median_s"] is None and row["ratio"] is None and row["met"] is None


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.00042, "420 µs"), (0.0123, "12.3 ms"), (0.213, "213 ms"), (1.4234, "1.42 s"), (None, "-")],
)
def test_durations_print_in_a_readable_unit(seconds: float | None, text: str) -> None:
    assert benchlib.format_seconds(seconds) == text


# --------------------------------------------------------------------------------------------------
# the report


def _rows() -> list[dict]:
    return [
        benchlib.make_row(
            "barrier release, 4096 ranks", "w", "b", [0.2, 0.21, 0.22], [0.1] * 3, target="<= 2.0x"
        ),
        benchlib.make_row(
            "results collect, 1000 node dirs", "w", "b", [0.9] * 3, [0.1] * 3, target="<= 3.0x"
        ),
        benchlib.make_row("start-up: redact", "a | b", "b", [0.04] * 3, [0.01] * 3),
        benchlib.make_row(
            "toolkit overhead, warm 2-node toy job",
            "w",
            "b",
            [2.2, 2.0, 2.4],
            [1.5, 1.5, 1.5],
            target="<= 0.8 s added",
            paired=True,
        ),  # fmt: skip
        benchlib.skipped_row("toolkit overhead / image distribution", "", "", "test cluster not up"),
    ]


def test_table_has_the_documented_columns_and_one_line_per_row() -> None:
    text = report.render_markdown(_rows(), report.run_meta(0))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| Row"))
    assert header == (
        "| Row | Measured (median, spread) | Baseline (median, spread) | Added (median, spread) | Ratio "
        "| Target | Met |"
    )
    table = [line for line in lines if line.startswith("| ") and line != header]
    assert len(table) == 5
    assert "| barrier release, 4096 ranks | 210 ms (200 ms – 220 ms, n=3) | 100 ms" in table[0]
    assert table[0].endswith("| - | 2.10x | <= 2.0x | **no** |")
    assert table[1].endswith("| - | 9.00x | <= 3.0x | **no** |")
    assert table[2].endswith("| - | 4.00x | - | - |")
    assert table[3].endswith("| +700 ms (+500 ms – +900 ms) | 1.47x | <= 0.8 s added | yes |")
    assert table[4] == (
        "| toolkit overhead / image distribution | skipped (test cluster not up) | - | - | - | - | - |"
    )
    assert "a \\| b" in text  # a pipe in a description cannot break the table
    assert "Targets missed: barrier release, 4096 ranks, results collect, 1000 node dirs." in text


def test_a_met_target_reads_yes() -> None:
    row = benchlib.make_row("x", "w", "b", [1.0], [1.0], target="<= 2.0x")
    assert report.table_row(row)[-1] == "yes"
    assert report.targets_met([row]) is True
    assert report.targets_met([benchlib.skipped_row("y", "", "", "why")]) is None


def test_rows_load_from_lists_and_single_objects(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(_rows()[:2]))
    (tmp_path / "b.json").write_text(json.dumps(_rows()[4]))
    rows = report.load_rows([tmp_path / "a.json", tmp_path / "b.json"])
    assert [r["row"] for r in rows] == [
        "barrier release, 4096 ranks",
        "results collect, 1000 node dirs",
        "toolkit overhead / image distribution",
    ]


@pytest.mark.parametrize("content", ["not json", '[{"what": "no name"}]', "[1]"])
def test_a_malformed_row_file_is_a_clear_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "rows.json"
    path.write_text(content)
    with pytest.raises(report.ReportError, match="rows.json"):
        report.load_rows([path])


def test_results_json_is_timestamped_and_copied_to_latest(tmp_path: Path) -> None:
    meta = report.run_meta(0)
    first = report.write_results(tmp_path, _rows(), meta)
    second = report.write_results(tmp_path, _rows(), meta)  # same second: a new file, not overwritten
    assert first.name == "19700101T000000Z.json" and second.name == "19700101T000000Z-2.json"
    document = json.loads((tmp_path / "latest.json").read_text())
    assert document == json.loads(second.read_text())
    assert document["schema"] == 1 and document["targets_met"] is False
    assert [r["row"] for r in document["rows"]] == [r["row"] for r in _rows()]


def test_report_exits_1_with_strict_only_when_a_target_is_missed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps(_rows()))
    assert report.main([str(rows), "--results-dir", str(tmp_path / "r")]) == 0
    assert "| Row |" in capsys.readouterr().out
    assert report.main([str(rows), "--results-dir", str(tmp_path / "r"), "--strict"]) == 1
    (tmp_path / "bad.json").write_text("{")
    assert report.main([str(tmp_path / "bad.json"), "--results-dir", str(tmp_path / "r")]) == 2


# --------------------------------------------------------------------------------------------------
# the client driver and each benchmark at tiny sizes


def _one_shot_server(reply: bytes) -> tuple[socket.socket, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(256)
            conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_the_client_driver_reports_a_wrong_reply_instead_of_timing_it() -> None:
    listener, thread = _one_shot_server(b"ERR bad token\n")
    with listener:
        result = barrier_bench.drive_clients(
            listener.getsockname(), [b"READY t 1\n"], [b"GO t 1 img"], timeout=5
        )
    thread.join(5)
    assert result.errors and "unexpected reply" in result.errors[0]


def test_the_client_driver_reports_a_refused_connection() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # bound, not listening: connecting is refused
        result = barrier_bench.drive_clients(("127.0.0.1", port), [b"x\n"], [b"x"], timeout=5)
    assert result.errors and "connect" in result.errors[0]


def test_barrier_bench_measures_both_sides_and_the_barrier_waits_for_everyone() -> None:
    (row,) = barrier_bench.run(sizes=[8], repeats=2, warmup=False)
    assert row["row"] == "barrier release, 8 ranks"
    assert row["runs"] == 2 and row["baseline_runs"] == 2
    assert row["median_s"] > 0 and row["baseline_median_s"] > 0 and row["ratio"] > 0
    assert row["target"] is None  # the target applies at 4096 ranks
    # No GO may leave before the last READY was sent: the barrier really waited.
    assert row["barrier_first_go_s"] >= row["barrier_last_ready_sent_s"]


def test_fitness_bench_simulates_every_node_with_its_partners_and_the_old_full_mesh() -> None:
    rows = fitness_bench.run(sizes=[8, 12], repeats=1)
    assert [row["row"] for row in rows] == [
        "fitness mesh, 8 simulated nodes",
        "fitness mesh, 12 simulated nodes",
        "fitness mesh CPU per node, 12 vs 8 nodes",
        "fitness mesh, 8 simulated nodes, full mesh (before)",
    ]
    small, large, scaling, full = rows
    assert all(
        ROW_FIELDS <= set(row) and row["median_s"] > 0 and row["baseline_median_s"] > 0 for row in rows
    )
    # 6 partners each way and the probe's two ends: 14 connections a node, however many nodes
    assert (large["connections_per_node_max"], large["connections_per_node_mean"]) == (14, 14.0)
    assert large["connections_total"] == 12 * 7 and small["nodes"] == 8
    assert full["connections_per_node_max"] == 2 * 7 + 2  # every other node, each way, and the probe
    assert scaling["target"] == "<= 2.0x" and scaling["baseline_median_s"] == small["cpu_per_node_s"]
    assert "one process simulates every node" in small["notes"]


def test_collect_bench_job_dir_is_judged_success_from_the_last_rank(tmp_path: Path) -> None:
    from slurm_multi.results import collect

    jobdir = collect_bench.make_jobdir(tmp_path, 4)
    summary = collect(jobdir, write=False)
    assert summary.verdict == "SUCCESS"
    assert summary.chosen_csv == f"node_3/{collect_bench.RESULTS_CSV}"
    assert collect_bench.read_all(jobdir) > 4 * 1000  # a few KB per node


def test_collect_bench_runs_in_process_and_through_the_cli() -> None:
    row, left = collect_bench.run(nodes=5, repeats=1, cli_repeats=1)
    assert row["row"] == "results collect, 5 node dirs"
    assert row["median_s"] > 0 and row["baseline_median_s"] > 0
    assert row["cli_median_s"] > 0 and "via the CLI" in row["notes"]
    assert row["target"] is None  # the target applies at 1,000 node dirs
    assert left["row"] == "results collect, 5 node dirs as a job leaves them" and left["target"] is None
    assert "26 files" in left["notes"]  # job.json + 5 per node


def test_report_bench_times_the_page_against_collect_as_the_batch_step_runs_them() -> None:
    small, large = report_bench.run(repeats=1, large=5)
    assert (
        small["row"] == "job page (report), 2-node job dir"
        and large["row"] == "job page (report), 5 node dirs"
    )
    for row in (small, large):
        assert ROW_FIELDS <= set(row) and row["median_s"] > 0 and row["baseline_median_s"] > 0
        assert row["target"] is None
    assert small["in_process_median_s"] < small["median_s"]  # the cold start is most of it
    assert "the seconds the page adds to a job's end" in small["notes"] and small["page_bytes"] > 1000


def test_the_collect_bench_dirs_as_a_job_leaves_them_have_an_events_timeline(tmp_path: Path) -> None:
    from slurm_multi.results import collect

    jobdir = collect_bench.make_jobdir(tmp_path, 3, as_left=True)
    summary = collect(jobdir, write=False)
    assert summary.verdict == "SUCCESS" and summary.warnings == []
    assert [lane.source for lane in summary.timeline.lanes] == ["events"] * 3
    assert [n.last_progress for n in summary.nodes] == [collect_bench.START + 613.0] * 3
    assert collect_bench.read_all(jobdir) > collect_bench.read_all(collect_bench.make_jobdir(tmp_path, 3))


def test_the_loopback_chain_moves_the_bytes_through_every_hop() -> None:
    result = relay_bench.loopback_chain(3, 2_000_000)
    assert result.hops == 3 and result.nbytes == 2_000_000 and result.seconds > 0 and result.mb_per_s > 0


def test_relay_bench_measures_each_chain_against_one_hop_and_one_hop_against_tcp() -> None:
    rows = relay_bench.run(hops=[1, 3], nbytes=3_000_000, repeats=1, warmup=False)
    assert [row["row"] for row in rows] == [
        "relay chain, 1 hop, 3 MB", "relay CPU per GB per hop", "relay chain, 3 hops, 3 MB"
    ]  # fmt: skip
    assert all(row["median_s"] > 0 and row["baseline_median_s"] > 0 for row in rows)
    one, cpu, three = rows
    # CPU per GB per relay process of the longest chain against one end of the plain TCP copy.
    assert cpu["hops"] == 3 and "plain TCP copy" in cpu["baseline"] and "CPU s/GB" in cpu["notes"]
    assert "plain TCP copy" in one["baseline"] and one["hops"] == 1 and one["bytes"] == 3_000_000
    assert three["baseline_median_s"] == one["median_s"]  # 3 hops are judged against 1 hop
    assert three["throughput_ratio"] == pytest.approx(one["median_s"] / three["median_s"])
    assert "throughput ratio 3/1" in three["notes"] and "CPU s per GB" in three["notes"]


def test_relay_bench_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--hops", "0"], ["--hops", "x"], ["--bytes", "0"]):
        with pytest.raises(SystemExit) as info:
            relay_bench.main(argv)
        assert info.value.code == 2


# --------------------------------------------------------------------------------------------------
# bench/run and its cluster hook


def test_bench_run_help_and_usage_errors() -> None:
    done = subprocess.run([BENCH / "run", "--help"], capture_output=True, text=True, env=bench_env())
    assert done.returncode == 0
    for option in ("--only", "--repeats", "--quick", "--smoke", "--results-dir", "--strict"):
        assert option in done.stdout
    for argv in (["--only", "nope"], ["--repeats", "0"], ["--bogus"]):
        done = subprocess.run([BENCH / "run", *argv], capture_output=True, text=True, env=bench_env())
        assert done.returncode == 2, argv
        assert done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1


def test_bench_run_smoke_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    done = subprocess.run(
        [BENCH / "run", "--smoke", "--only", "barrier,collect", "--results-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=bench_env(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "| Row | Measured (median, spread)" in done.stdout
    for name in ("barrier release, 16 ranks", "results collect, 20 node dirs"):
        assert f"| {name} |" in done.stdout
    assert "toolkit overhead" not in done.stdout  # not selected: the cluster hook did not run
    document = json.loads((tmp_path / "latest.json").read_text())
    assert len(document["rows"]) == done.stdout.count("\n| ") - 1


def _fake_root(tmp_path: Path, cluster_up: bool, script: str | None) -> Path:
    root = tmp_path / "root"
    (root / "tests" / "cluster").mkdir(parents=True)
    (root / "bench").mkdir()
    status = root / "tests" / "cluster" / "status"
    status.write_text(f"#!/usr/bin/env bash\nexit {0 if cluster_up else 1}\n")
    status.chmod(0o755)
    if script is not None:
        (root / "bench" / "cluster_bench.sh").write_text(script)
    return root


def _hook(root: Path, out: Path, *args: str, can_bring_up: bool = True) -> subprocess.CompletedProcess[str]:
    code = (
        f"source {REPO}/lib/log.sh; source {BENCH}/lib.sh; BENCH_ROOT={root}; BENCH_PY={sys.executable}; "
        f'bench::cluster_hook {out} "$@"'
    )
    env = {**os.environ, "BENCH_CAN_BRING_UP": "1" if can_bring_up else "0"}
    return subprocess.run(
        ["bash", "-c", code, "hook", *args], capture_output=True, text=True, timeout=60, env=env
    )


ROW_WRITER = """#!/usr/bin/env bash
out=
while (($#)); do
  case $1 in
    --out-dir) out=$2; shift 2 ;;
    *) echo "$1" >>"$(dirname "$0")/args"; shift ;;
  esac
done
echo '[{"row": "toolkit overhead, 2 nodes", "median_s": 1.0, "ratio": 1.1}]' >"$out/overhead.json"
echo 'this goes to stderr, not into the table'
"""


@pytest.mark.parametrize(
    ("cluster_up", "script", "why"),
    [
        (True, None, "bench/cluster_bench.sh not present yet"),
        (False, ROW_WRITER, "test cluster not up (bringing it up needs root)"),
    ],
)
def test_cluster_hook_writes_a_skipped_row_when_it_cannot_measure(
    tmp_path: Path, cluster_up: bool, script: str | None, why: str
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = _hook(_fake_root(tmp_path, cluster_up, script), out, can_bring_up=False)
    assert done.returncode == 0, done.stderr
    (row,) = report.load_rows(sorted(out.glob("*.json")))
    assert row["row"] == "toolkit overhead / image distribution" and row["skipped"] == why


@pytest.mark.parametrize("cluster_up", [True, False])
def test_cluster_hook_runs_the_cluster_script_with_the_options_when_the_cluster_is_up(
    tmp_path: Path, cluster_up: bool
) -> None:
    # Not up: as root the script itself brings the cluster to the nodes it needs.
    root = _fake_root(tmp_path, cluster_up, ROW_WRITER)
    out = tmp_path / "out"
    out.mkdir()
    done = _hook(root, out, "--repeats", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # the script's stdout must not mix into the table
    (row,) = report.load_rows(sorted(out.glob("*.json")))
    assert row["row"] == "toolkit overhead, 2 nodes"
    assert (root / "bench" / "args").read_text().split() == ["--repeats", "2"]


def test_cluster_hook_reports_a_failing_cluster_script(tmp_path: Path) -> None:
    root = _fake_root(tmp_path, True, "#!/usr/bin/env bash\nexit 3\n")
    out = tmp_path / "out"
    out.mkdir()
    done = _hook(root, out)
    assert done.returncode == 1
    (row,) = report.load_rows(sorted(out.glob("*.json")))
    assert row["skipped"].startswith("failed: exit 3")


# --------------------------------------------------------------------------------------------------
# cpu_profile.py: where a cluster row's CPU goes (acct records, roles, the row's `cpu` field)


def _acct_record(pid: int, ppid: int, comm: bytes, start: int, wall_ticks: float, cpu_ticks: int) -> bytes:
    import cpu_profile

    # struct acct_v3: flag, version 3, tty, exitcode, uid, gid, pid, ppid, btime, etime, utime,
    # stime, mem, io, rw, minflt, majflt, swaps, comm. utime is comp_t: 13-bit mantissa, base-8 exp.
    fields = (0, 3, 0, 0, 0, 0, pid, ppid, start, wall_ticks, cpu_ticks, 0, 0, 0, 0, 0, 0, 0, comm)
    return cpu_profile.ACCT_V3.pack(*fields)


def test_acct_records_parse_with_comp_t_times_and_other_versions_are_skipped() -> None:
    import cpu_profile

    assert cpu_profile.comp_t(250) == 250
    assert cpu_profile.comp_t((1 << 13) | 100) == 800  # exponent 1: mantissa * 8
    data = _acct_record(10, 1, b"docker", 1000, 150.0, (1 << 13) | 25)
    data += b"\x00\x02" + bytes(62)  # a version-2 record: skipped
    (rec,) = cpu_profile.parse_acct(data)
    assert rec == {"pid": 10, "ppid": 1, "comm": "docker", "start": 1000.0, "wall_s": 1.5, "cpu_s": 2.0}


@pytest.mark.parametrize(
    ("comm", "argv", "node", "parent", "role"),
    [
        ("dockerd", ["dockerd"], "node1", "", "save"),
        ("containerd", ["containerd"], "node3", "dockerd", "load"),
        ("exe", [], "node2", "dockerd", "load"),  # dockerd's re-executed docker-untar
        ("exe", [], "node2", "bash", "other"),
        ("docker", ["docker", "save", "toy/model:bench"], "node1", "", "save"),
        ("docker", ["docker", "load", "-q"], "node2", "", "load"),
        ("docker", ["docker", "image", "inspect", "x"], "node1", "", "other"),
        ("tee", ["tee", "-p", "/c/x.tar"], "node1", "", "tee"),
        ("python", ["/v/python", "-m", "slurm_multi", "relay", "recv", "--rank", "1"], "node2", "", "relay"),
        ("python", ["/v/bin/python", "-m", "slurm_multi", "node", "prepare"], "node2", "", "python"),
        ("bash", ["bash", "bin/sm-node"], "node1", "", "other"),
    ],
)
def test_each_process_gets_its_transport_role(
    comm: str, argv: list[str], node: str, parent: str, role: str
) -> None:
    import cpu_profile

    assert cpu_profile.role_of(comm, argv, node, "node1", parent) == role


def _recording() -> tuple[dict, list[dict]]:
    """A recorder's document and acct records: dockerd alive throughout, a save CLI and a relay
    the poll saw, a tee only acct saw (its node from its parent), and a host process."""
    doc = {
        "started": 1000.0, "ended": 1010.0, "acct": True,
        "machine_s": {"user": 12.0, "nice": 0.0, "system": 6.0, "idle": 1.5, "iowait": 0.5, "irq": 0.0,
                      "softirq": 1.0, "steal": 0.0},
        "procs": [
            {"pid": 5, "ppid": 1, "comm": "dockerd", "argv": ["dockerd"], "node": "node1", "start": 900.0,
             "cpu_at_start": 40.0, "cpu_last": 43.5, "alive_at_start": True, "alive_at_end": True},
            {"pid": 20, "ppid": 19, "comm": "docker", "argv": ["docker", "save", "img"], "node": "node1",
             "start": 1000.2, "cpu_at_start": 0.0, "cpu_last": 0.3, "alive_at_start": False},
            {"pid": 21, "ppid": 19, "comm": "python", "node": "node1", "start": 1000.3,
             "argv": ["/v/bin/python", "-m", "slurm_multi", "relay", "send"], "cpu_at_start": 0.0,
             "cpu_last": 0.5, "alive_at_start": False},
            {"pid": 30, "ppid": 1, "comm": "pytest", "argv": ["pytest"], "node": "host", "start": 990.0,
             "cpu_at_start": 5.0, "cpu_last": 7.0, "alive_at_start": True, "alive_at_end": True},
        ],
    }  # fmt: skip
    acct = [
        {"pid": 20, "ppid": 19, "comm": "docker", "start": 1000.0, "wall_s": 6.0, "cpu_s": 0.4},
        {"pid": 21, "ppid": 19, "comm": "python", "start": 1000.0, "wall_s": 6.5, "cpu_s": 0.9},
        {"pid": 22, "ppid": 21, "comm": "tee", "start": 1001.0, "wall_s": 0.1, "cpu_s": 0.2},
    ]
    return doc, acct


def test_attribution_uses_acct_for_exited_processes_deltas_for_daemons_and_parents_for_nodes() -> None:
    import cpu_profile

    doc, acct = _recording()
    procs = {p["pid"]: p for p in cpu_profile.attribute(doc, acct, "node1")}
    assert procs[5]["cpu_s"] == pytest.approx(3.5) and procs[5]["role"] == "save"  # only the window
    assert procs[20]["cpu_s"] == pytest.approx(0.4) and procs[20]["wall_s"] == 6.0  # acct, not the poll
    assert procs[21]["role"] == "relay" and procs[21]["label"] == "slurm-multi relay send"
    assert procs[22]["node"] == "node1" and procs[22]["role"] == "tee"  # acct only: its parent's node
    assert procs[30]["role"] == "host" and procs[30]["cpu_s"] == pytest.approx(2.0)
    summary = cpu_profile.summarize(list(procs.values()), doc)
    assert summary["cpu_s"]["save"] == pytest.approx(3.9) and summary["cpu_s"]["relay"] == pytest.approx(0.9)
    assert summary["total_cpu_s"] == pytest.approx(5.0) and summary["host_cpu_s"] == pytest.approx(2.0)
    assert summary["machine_busy_s"] == pytest.approx(19.0)
    assert summary["unattributed_s"] == pytest.approx(12.0)  # 19 busy - 5 cluster - 2 host
    assert summary["cpu_s_by_node"]["save@node1"] == pytest.approx(3.9)


def test_cluster_rows_carry_the_cpu_of_both_sides_and_say_it_when_a_target_is_missed(tmp_path: Path) -> None:
    import cluster_rows
    import cpu_profile

    doc, acct = _recording()
    measured = cpu_profile.summarize(cpu_profile.attribute(doc, acct, "node1"), doc)
    baseline = json.loads(json.dumps(measured))
    baseline["cpu_s"]["relay"], baseline["total_cpu_s"] = 0.0, 4.1
    paths = {}
    for name, summary in (("m", measured), ("b", baseline)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(summary))
    out = tmp_path / "row.json"
    args = ["--row", "r", "--what", "w", "--baseline", "b", "--target", "<= 1.15x", "--notes", "n."]
    args += ["--cpu", str(paths["m"]), "--baseline-cpu", str(paths["b"]), "--out", str(out)]
    assert cluster_rows.main([*args, "--samples", "2.0", "--baseline-samples", "1.0"]) == 0
    (row,) = json.loads(out.read_text())
    assert row["met"] is False
    assert row["cpu"]["delta_s"]["relay"] == pytest.approx(0.9)
    measured_cpu = row["cpu"]["measured"]
    assert measured_cpu["runs"] == 1 and measured_cpu["cpu_s"]["save"] == pytest.approx(3.9)
    note = "n; CPU s per run, measured vs baseline: save 3.90 vs 3.90, relay 0.90 vs 0.00"
    assert row["notes"].startswith(note)
    # Met: the cpu field stays in the JSON, the notes stay short.
    assert cluster_rows.main([*args, "--samples", "1.0", "--baseline-samples", "1.0"]) == 0
    (row,) = json.loads(out.read_text())
    assert row["met"] is True and row["notes"] == "n." and "cpu" in row
    # No profiles (BENCH_CPU_PROFILE=0): no cpu field at all.
    plain = ["--row", "r", "--what", "w", "--baseline", "b", "--out", str(out)]
    assert cluster_rows.main([*plain, "--samples", "1", "--baseline-samples", "1"]) == 0
    assert "cpu" not in json.loads(out.read_text())[0]


def test_the_recorder_runs_in_the_background_and_counts_a_node_process(tmp_path: Path) -> None:
    # A fake cluster state whose one "node" is this test's own network namespace.
    (tmp_path / "state" / "node1").mkdir(parents=True)
    (tmp_path / "state" / "node1" / "slurmd.pid").write_text(f"{os.getpid()}\n")
    rec, out = tmp_path / "rec", tmp_path / "cpu.json"
    script = str(BENCH / "cpu_profile.py")
    start = [sys.executable, script, "start", str(rec), "--no-acct", "--state", str(tmp_path / "state")]
    subprocess.run(start, check=True, timeout=30)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(0.7)"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=30)
    stop = [sys.executable, script, "stop", str(rec), "--out", str(out)]
    subprocess.run(stop, check=True, timeout=30)
    summary = json.loads(out.read_text())
    assert summary["acct"] is False and summary["window_s"] > 0.5
    assert summary["cpu_s"]["python"] >= 0.35  # the burner, seen by the poll on "node1"
    assert not (rec / "recorder.pid").exists()
    assert subprocess.run([sys.executable, script, "off", str(rec)], timeout=30).returncode == 0


def _job_recording(batch_cpu: float) -> tuple[dict, list[dict]]:
    """A job under the recorder: its batch step on the host (below pid 100), a step and a container
    on node1, an idle engine on node3 (not the job's) and unrelated work on the host."""
    doc = {
        "started": 1000.0, "ended": 1003.0, "acct": True,
        "machine_s": {"user": 3.0, "nice": 0.0, "system": 1.0, "idle": 2.0, "iowait": 0.0, "irq": 0.0,
                      "softirq": 0.0, "steal": 0.0},
        "procs": [
            {"pid": 100, "ppid": 50, "comm": "bash", "argv": ["bash"], "node": "host", "start": 1000.0,
             "cpu_at_start": 0.0, "cpu_last": 0.0, "alive_at_start": False},
            {"pid": 101, "ppid": 100, "comm": "python", "node": "host", "start": 1000.1,
             "argv": ["/v/bin/python", "-m", "slurm_multi", "job", "plan", "/tmp/x"], "cpu_at_start": 0.0,
             "alive_at_start": False},
            {"pid": 200, "ppid": 1, "comm": "slurmstepd", "argv": ["slurmstepd"], "node": "node1",
             "start": 1000.2, "cpu_at_start": 0.0, "alive_at_start": False},
            {"pid": 201, "ppid": 1, "comm": "containerd-shim", "argv": ["containerd-shim-runc-v2"],
             "node": "node1", "start": 1000.5, "cpu_at_start": 0.0, "alive_at_start": False},
            {"pid": 300, "ppid": 1, "comm": "dockerd", "argv": ["dockerd"], "node": "node3", "start": 900.0,
             "cpu_at_start": 10.0, "cpu_last": 10.5, "alive_at_start": True, "alive_at_end": True},
            {"pid": 400, "ppid": 1, "comm": "pytest", "argv": ["pytest"], "node": "host", "start": 990.0,
             "cpu_at_start": 5.0, "cpu_last": 6.0, "alive_at_start": True, "alive_at_end": True},
        ],
    }  # fmt: skip
    acct = [
        {"pid": 100, "ppid": 50, "comm": "bash", "start": 1000.0, "wall_s": 3.0, "cpu_s": 0.1},
        {"pid": 101, "ppid": 100, "comm": "python", "start": 1000.0, "wall_s": 0.2, "cpu_s": batch_cpu},
        {"pid": 102, "ppid": 100, "comm": "srun", "start": 1000.0, "wall_s": 2.0, "cpu_s": 0.05},
        {"pid": 200, "ppid": 1, "comm": "slurmstepd", "start": 1000.0, "wall_s": 2.0, "cpu_s": 0.2},
        {"pid": 201, "ppid": 1, "comm": "containerd-shim", "start": 1000.0, "wall_s": 2.0, "cpu_s": 0.03},
        {"pid": 202, "ppid": 201, "comm": "runc:[0:PARENT]", "start": 1000.0, "wall_s": 0.1, "cpu_s": 0.02},
        {"pid": 203, "ppid": 201, "comm": "sh", "start": 1000.0, "wall_s": 1.5, "cpu_s": 0.3},
        {"pid": 204, "ppid": 203, "comm": "sleep", "start": 1001.0, "wall_s": 0.1, "cpu_s": 0.01},
    ]
    return doc, acct


def test_a_jobs_cpu_is_split_at_the_container_and_its_batch_step_counts_with_the_nodes() -> None:
    import cpu_profile

    doc, acct = _job_recording(0.4)
    procs = {
        p["pid"]: p for p in cpu_profile.attribute(doc, acct, "node1", root=100, job_nodes=["node1", "node2"])
    }
    assert [procs[pid]["node"] for pid in (100, 101, 102)] == ["batch"] * 3  # below the root, on the host
    assert procs[101]["label"] == "slurm-multi job plan"
    assert [procs[pid]["container"] for pid in (201, 202, 203, 204)] == [False, False, True, True]
    assert (
        procs[300]["node"] == "host" and procs[400]["node"] == "host"
    )  # not the job's nodes, not below root
    summary = cpu_profile.summarize(list(procs.values()), doc)
    assert summary["container_cpu_s"] == pytest.approx(0.31)
    assert summary["job_cpu_s_by_node"] == pytest.approx({"batch": 0.55, "node1": 0.25})
    assert cpu_profile.job_cpu_per_node(summary, 2) == pytest.approx(0.4)
    assert list(summary["job_by_label"])[0] == "slurm-multi job plan"
    # Without a root the host's processes are the host's: nothing is the batch step.
    plain = cpu_profile.attribute(doc, acct, "node1")
    assert not [p for p in plain if p["node"] == "batch"]


@pytest.mark.parametrize(
    ("argv", "label"),
    [
        (["/v/python", "-m", "slurm_multi", "barrier", "serve", "--rank", "0"], "slurm-multi barrier serve"),
        (["/v/python", "-m", "slurm_multi", "job", "watch", "/out/toy/12"], "slurm-multi job watch"),
        (["/v/python", "-m", "slurm_multi.warm", "statusfile"], "python -m slurm_multi.warm statusfile"),
        (["/v/python", "-S", "-m", "slurm_multi.watch", "/out/toy/12"], "python -m slurm_multi.watch"),
        (["bash", "bin/sm-node"], "bash"),
    ],
)
def test_a_helper_is_labelled_by_its_area_and_command_not_its_arguments(argv: list[str], label: str) -> None:
    import cpu_profile

    assert cpu_profile.label_of(argv[0].rsplit("/", 1)[-1], argv) == label


def test_the_cpu_row_is_the_cpu_per_node_the_toolkit_adds_pair_by_pair(tmp_path: Path) -> None:
    import cluster_rows
    import cpu_profile

    args = [
        "--row",
        "toolkit CPU",
        "--what",
        "w",
        "--baseline",
        "b",
        "--paired",
        "--nodes",
        "2",
        "--cpu-samples",
    ]
    for pair, (toolkit_cpu, bare_cpu) in enumerate([(0.9, 0.0), (1.3, 0.2)]):
        for side, cpu in (("cpu", toolkit_cpu), ("baseline-cpu", bare_cpu)):
            doc, acct = _job_recording(cpu)
            path = tmp_path / f"{side}-{pair}.json"
            summary = cpu_profile.summarize(cpu_profile.attribute(doc, acct, "node1", 100, ["node1"]), doc)
            path.write_text(json.dumps(summary))
            args += [f"--{side}", str(path)]
    out = tmp_path / "row.json"
    assert cluster_rows.main([*args, "--target", "<= 0.6 CPU-s added", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    # Per node: (0.1 bash + X plan + 0.05 srun + 0.25 node1) / 2; the pairs differ by (X - Y) / 2.
    assert row["samples_s"] == pytest.approx([0.65, 0.85]) and row["baseline_samples_s"] == pytest.approx(
        [0.2, 0.3]
    )
    assert row["added_samples_s"] == pytest.approx([0.45, 0.55]) and row["added_s"] == pytest.approx(0.5)
    assert row["met"] is True
    assert (
        "CPU s per node per job outside the workload's containers (2 runs, mean): toolkit 0.75 vs bare 0.25"
        in (row["notes"])
    )
    assert "by node batch step 1.25, node1 0.25" in row["notes"]
    assert f"the machine's {os.cpu_count() or 1} cores" in row["notes"]
    with pytest.raises(SystemExit):
        cluster_rows.main(
            ["--row", "r", "--what", "w", "--baseline", "b", "--cpu-samples", "--out", str(out)]
        )


def test_the_scale_cpu_row_compares_cpu_per_node_of_jobs_of_different_sizes(tmp_path: Path) -> None:
    """The scale rows (bench/scale_bench.sh): a 16-node job's CPU per node against a 2-node job's,
    each divided by its own node count; the notes say how busy the shared cores were."""
    import cluster_rows
    import cpu_profile

    args = ["--row", "scale CPU", "--what", "w", "--baseline", "b", "--nodes", "16", "--baseline-nodes", "2"]
    for side, cpu in (("cpu", 7.9), ("baseline-cpu", 0.9)):
        doc, acct = _job_recording(cpu)
        path = tmp_path / f"{side}.json"
        path.write_text(
            json.dumps(cpu_profile.summarize(cpu_profile.attribute(doc, acct, "node1", 100, ["node1"]), doc))
        )
        args += [f"--{side}", str(path)]
    out = tmp_path / "row.json"
    assert cluster_rows.main([*args, "--cpu-samples", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    # (0.1 bash + X plan + 0.05 srun + 0.25 node1): 8.3 / 16 and 1.3 / 2.
    assert row["samples_s"] == pytest.approx([8.3 / 16]) and row["baseline_samples_s"] == pytest.approx(
        [0.65]
    )
    # The machine: 4 busy CPU-s over the 3 s window, on however many cores this machine has.
    cores = os.cpu_count() or 1
    busy = f"{4 / 3 / cores:.0%}"
    assert (
        f"CPU s per node 0.52 at 16 nodes vs 0.65 at 2; the machine's {cores} cores {busy} vs {busy} busy"
        in (row["notes"])
    )
    assert "bare" not in row["notes"]
    # Helper by helper, per node at each size: the plan's 7.9 / 16 against 0.9 / 2.
    assert "per node, the biggest: slurm-multi job plan 0.494 vs 0.450" in row["notes"]
