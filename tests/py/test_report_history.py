"""slurm-multi report --history PERF_CSV: one page across the runs of a shared perf.csv (one run, a
thousand runs, a planted regression, a latency that rose, a node that slows down, broken rows and
files that are not a perf.csv: a clear line, never a traceback)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_multi.cli import group
from slurm_multi.report import historypage
from slurm_multi.report.history import read_history
from slurm_multi.results.rows import PERF_COLUMNS
from slurm_multi.results.stagehistory import STAGES_NAME
from test_report import Dom, assert_self_contained

TOK, STEP = "tok_per_s_per_gpu", "step_time_ms"


def row(
    model: str, metric: str, value: str, job: int, status: str = "SUCCESS", **more: str
) -> dict[str, str]:
    values = {c: "" for c in PERF_COLUMNS}
    values.update(
        model=model, metric=metric, performance=value, status=status, machine_name=str(job), nnodes="2"
    )
    values.update(more)
    return values


def write_perf(path: Path, rows: list[dict[str, str]], tail: str = "") -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(PERF_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        handle.write(tail)
    return path


def runs(values: list[float], metric: str = TOK, model: str = "toy_model_toy-llm") -> list[dict[str, str]]:
    return [row(model, metric, f"{v:g}", 1000 + i) for i, v in enumerate(values)]


def history_page(path: Path, *args: str) -> tuple[Dom, str, str]:
    result = CliRunner().invoke(group, ["report", "--history", str(path), *args])
    assert result.exit_code == 0, result.output
    page = path.with_name("perf_history.html")
    text = page.read_text()
    return Dom(text), text, result.stderr


# ----------------------------------------------------------------------------- the rule


def test_a_planted_regression_in_the_last_run_is_flagged_against_the_median_of_the_earlier_ones(
    tmp_path: Path,
):
    values = [10000, 10100, 9900, 10050, 8500]  # median of the first four: 10025; -15.2%
    path = write_perf(tmp_path / "perf.csv", runs(values) + runs([500, 505, 498, 502, 501], "TFLOPS_per_gpu"))
    dom, text, stderr = history_page(path)
    assert_self_contained(text, dom)
    assert dom.by_id["regression-summary"].startswith(
        "1 configuration(s) regressed in their last run past 5%"
    )
    assert "-15.2%" in dom.by_id["regression-summary"]
    last = dom.by_id["last-runs"]
    assert "REGRESSION" in last and "10025.00" in last and "8500.00" in last
    assert dom.by_class["regression"].count("REGRESSION") == 1  # the other configuration is ok
    assert "1004" in dom.by_id["regressions"]  # the run's machine_name (job id)
    assert text.count('src="data:image/png;base64,') == 2  # a plot per configuration, inline
    assert 'href="perf.csv"' in text
    assert "history: " in stderr and "1 regressed past 5%" in stderr


def test_a_latency_regresses_when_it_rises_and_a_throughput_when_it_falls(tmp_path: Path):
    path = write_perf(
        tmp_path / "perf.csv", runs([80, 81, 79, 92], STEP) + runs([100, 101, 99, 120], "samples/s")
    )
    history = read_history(path, 5.0)
    verdicts = {g.metric: g.verdict() for g in history.groups}
    assert verdicts == {STEP: "REGRESSION", "samples/s": "better"}


def test_the_threshold_is_regression_pct(tmp_path: Path):
    path = write_perf(tmp_path / "perf.csv", runs([100, 100, 100, 96]))  # -4%
    dom, _, _ = history_page(path)
    assert dom.by_id["regression-summary"] == "No configuration's last run regressed past 5%."
    dom, _, _ = history_page(path, "--regression-pct", "3")
    assert "regressed in their last run past 3%" in dom.by_id["regression-summary"]


def test_configurations_are_what_relative_change_compares_on(tmp_path: Path):
    rows = runs([100, 100, 100]) + [row("toy_model_toy-llm", TOK, "50", 2000, nnodes="4")]  # another nnodes
    history = read_history(write_perf(tmp_path / "perf.csv", rows), 5.0)
    assert [(g.config.get("nnodes"), len(g.runs), g.verdict()) for g in history.groups] == [
        ("2", 3, "ok"), ("4", 1, "first run")
    ]  # fmt: skip


def test_one_run_only_is_its_first_run_and_no_regression(tmp_path: Path):
    dom, _, _ = history_page(write_perf(tmp_path / "perf.csv", runs([10142.5])))
    assert "first run" in dom.by_id["last-runs"]
    assert dom.by_id["regression-summary"].startswith("No configuration")


def test_failed_runs_have_no_value_and_do_not_move_the_median(tmp_path: Path):
    rows = runs([100, 100, 100]) + [row("toy_model_toy-llm", TOK, "", 1003, "FAILURE")]
    history = read_history(write_perf(tmp_path / "perf.csv", rows), 5.0)
    group = history.groups[0]
    assert group.verdict() == "no value" and not group.regressed
    assert group.last["median_before"] == 100


def test_a_thousand_runs_with_a_regression_in_the_middle(tmp_path: Path):
    values = [1000 + (i % 7) for i in range(1000)]
    values[500] = 800
    path = write_perf(
        tmp_path / "perf.csv", runs(values) + runs([9.5 + (i % 3) / 10 for i in range(1000)], STEP)
    )
    started = time.monotonic()
    dom, _, _ = history_page(path)
    assert time.monotonic() - started < 60  # seconds on a loaded 2-core machine; ~1 s alone
    assert "1500" in dom.by_id["regressions"] and "-20.2%" in dom.by_id["regressions"]  # 800 against 1003
    assert dom.by_id["regression-summary"].startswith("No configuration")  # the last run is fine


# ----------------------------------------------------------------------------- beside the perf.csv


def test_a_node_that_slows_down_run_after_run_stands_out(tmp_path: Path):
    path = write_perf(tmp_path / "perf.csv", runs([100] * 6))
    lines = []
    for run in range(6):
        nodes = [{"rank": r, "node": f"node{r + 1}", "stages": {"image": 2.0 + (run if r == 2 else 0.01 * r),
                                                                "run": 60.0}} for r in range(3)]  # fmt: skip
        lines.append(json.dumps({"machine_name": str(1000 + run), "model": "toy_model", "nodes": nodes}))
    (tmp_path / STAGES_NAME).write_text("\n".join(lines) + "\n")
    dom, text, _ = history_page(path)
    stages = dom.by_id["node-stages"]
    assert "slower in its last run: node3" in stages
    assert "SLOWER" in stages and "+75.0%" in stages  # 7 s against the median of its 2..6 s (4 s)
    history = read_history(path, 5.0)
    table = history.stages[0].table
    top = table.iloc[0]
    assert (top["node"], top["stage"], top["last"], top["median_before"], top["rising"], top["slower"]) == (
        "node3", "image", 7.0, 4.0, 5, True
    )  # fmt: skip
    assert not table[table["node"] != "node3"]["slower"].any()
    assert f'href="{STAGES_NAME}"' in text


def test_without_perf_stages_jsonl_the_page_says_where_it_comes_from(tmp_path: Path):
    dom, _, _ = history_page(write_perf(tmp_path / "perf.csv", runs([1, 2])))
    assert "No perf_stages.jsonl beside the perf.csv" in dom.by_id["node-stages"]


def test_perf_super_json_gives_each_configuration_its_config(tmp_path: Path):
    path = write_perf(tmp_path / "perf.csv", runs([100, 101]))
    supers = [
        dict(r, configs={"batch_size": 4, "seq_len": 8192}, multi_results=None) for r in runs([100, 101])
    ]
    (tmp_path / "perf_super.json").write_text(json.dumps(supers))
    dom, text, _ = history_page(path)
    assert 'config (perf_super.json): {"batch_size": 4, "seq_len": 8192}' in dom.by_id["plots"]
    (tmp_path / "perf_super.json").write_text("{broken")
    dom, _, stderr = history_page(path)
    assert "perf_super.json" in dom.by_id["warnings"] and "warning: perf_super.json" in stderr


# ----------------------------------------------------------------------------- broken input: one line


def test_broken_rows_are_dropped_with_one_warning_each_and_the_rest_still_counts(tmp_path: Path):
    path = write_perf(tmp_path / "perf.csv", runs([100, 101, 102]), tail='x,y\n"unterminated,1\n')
    dom, _, stderr = history_page(path)
    assert "perf.csv line 5: 2 fields, the header has" in stderr
    assert "perf.csv line 5" in dom.by_id["warnings"]
    assert "3" in dom.by_id["last-runs"] and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("content", "said"),
    [(None, "is not a file"), (b"", "empty file"), (b"\x00\x01binary", "binary file"),
     (b"name,performance\nx,1\n", "no 'model' column"), (b"model,metric\nx,y\n", "no 'performance' column")],
)  # fmt: skip
def test_a_file_that_is_not_a_perf_csv_is_one_line_and_exit_2(
    tmp_path: Path, content: bytes | None, said: str
):
    path = tmp_path / "perf.csv"
    if content is not None:
        path.write_bytes(content)
    command = [sys.executable, "-m", "slurm_multi", "report", "--history", str(path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("slurm-multi: report: --history ")
    assert said in done.stderr and "Traceback" not in done.stderr


def test_without_matplotlib_the_page_says_so_where_the_plots_would_be(tmp_path: Path, monkeypatch):
    def no_matplotlib(*_args: object) -> None:
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(historypage, "_figure", no_matplotlib)
    dom, text, _ = history_page(write_perf(tmp_path / "perf.csv", runs([1, 2, 3])))
    assert "Plots need matplotlib" in dom.by_id["plots"] and "data:image/png" not in text


def test_without_pandas_the_history_is_one_line(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ImportError
    result = CliRunner().invoke(
        group, ["report", "--history", str(write_perf(tmp_path / "perf.csv", runs([1])))]
    )
    assert result.exit_code == 1 and "--history needs pandas" in result.output


def test_the_page_can_go_elsewhere_and_links_back(tmp_path: Path):
    (tmp_path / "shared").mkdir()
    path = write_perf(tmp_path / "shared" / "perf.csv", runs([1, 2]))
    out = tmp_path / "pages" / "history.html"
    out.parent.mkdir()
    result = CliRunner().invoke(group, ["report", "--history", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert 'href="../shared/perf.csv"' in out.read_text()
