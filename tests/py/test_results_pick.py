"""results.pick and results.values: which per-node CSV is chosen, what counts as a performance
value (a finite number), and which rows are dropped (with a warning naming file and line)."""

from __future__ import annotations

import csv
import io
import json
import math
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi.cli import group
from slurm_multi.results import pick
from slurm_multi.results.pick import pick_best, score_csv
from slurm_multi.results.values import as_number, relative_change

CSVS = Path(__file__).parent / "data" / "results" / "csv"
EMPTY_CSV = "model,performance,metric\ntoy,,samples_per_second\ntoy,,ms_per_step\n"
FULL_CSV = "model,performance,metric\ntoy,100.5,samples_per_second\ntoy,9.8,ms_per_step\n"


def run_cli(*args: str):
    return CliRunner().invoke(group, ["results", *args])


# ----------------------------------------------------------------------------- score_csv


def test_a_header_with_spaces_after_commas_still_finds_performance():
    candidate = score_csv(CSVS / "leading_space_header.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error) == (2, 1, None)
    assert candidate.header == ("model", "performance", "metric", "batch_size")


def test_a_utf8_bom_before_the_header_is_tolerated():
    candidate = score_csv(CSVS / "bom_header.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error) == (1, 1, None)
    assert candidate.header[0] == "model"


def test_na_nan_none_null_and_blank_count_as_empty():
    candidate = score_csv(CSVS / "na_values.csv")
    assert (candidate.rows, candidate.non_empty) == (9, 1)


@pytest.mark.parametrize(
    ("name", "error_part"),
    [
        ("no_performance_column.csv", "no 'performance' column (columns: model, throughput, metric)"),
        ("binary.csv", "binary file"),
        ("empty.csv", "empty file"),
        ("does_not_exist.csv", "cannot read: No such file or directory"),
    ],
)
def test_a_broken_file_is_a_candidate_with_its_error_not_a_crash(name: str, error_part: str):
    candidate = score_csv(CSVS / name)
    assert candidate.error is not None and error_part in candidate.error
    assert (candidate.rows, candidate.non_empty, candidate.usable) == (0, 0, False)


def test_a_header_that_is_not_utf8_makes_the_file_unusable(tmp_path: Path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"model,perf\xf6rmance,performance,metric\nm,1.0,2.0,x\n")
    assert score_csv(path).error == "not UTF-8 text (byte 0xf6 at offset 10)"


def test_a_header_only_file_has_no_error_and_no_rows():
    candidate = score_csv(CSVS / "header_only.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error, candidate.usable) == (0, 0, None, False)


# ----------------------------------------------------------------------------- pick_best


def test_primus_present_but_empty_rank0_csv_loses_to_the_last_rank():
    chosen, candidates = pick_best([CSVS / "primus_rank0_empty.csv", CSVS / "primus_last_rank.csv"])
    assert chosen is not None and chosen.path.endswith("primus_last_rank.csv")
    assert [(c.rows, c.non_empty) for c in candidates] == [(2, 0), (2, 2)]


def test_of_64_nodes_only_the_last_rank_has_numbers(tmp_path: Path):
    paths = []
    for rank in range(64):
        path = tmp_path / f"node_{rank}" / "perf.csv"
        path.parent.mkdir()
        path.write_text(FULL_CSV if rank == 63 else EMPTY_CSV)
        paths.append(path)
    chosen, candidates = pick_best(paths)
    assert chosen is not None and chosen.path == str(paths[63])
    assert len(candidates) == 64 and sum(c.non_empty for c in candidates) == 2


def test_a_tie_on_values_goes_to_more_rows_then_to_the_later_candidate(tmp_path: Path):
    one_row = tmp_path / "a.csv"
    one_row.write_text("model,performance,metric\nm,1,x\n")
    two_rows = tmp_path / "b.csv"
    two_rows.write_text("model,performance,metric\nm,1,x\nm,,y\n")
    same = tmp_path / "c.csv"
    same.write_text("model,performance,metric\nm,2,x\nm,,y\n")
    assert pick_best([two_rows, one_row])[0].path == str(two_rows)
    assert pick_best([two_rows, same])[0].path == str(same)
    assert pick_best([same, two_rows])[0].path == str(two_rows)


def test_broken_and_empty_candidates_never_win():
    names = ["empty.csv", "binary.csv", "header_only.csv", "ragged.csv", "primus_rank0_empty.csv"]
    chosen, candidates = pick_best([CSVS / n for n in names])
    assert chosen is None and len(candidates) == 5


# ----------------------------------------------------------------------------- results pick (CLI)


def test_pick_prints_the_chosen_path_on_stdout():
    result = run_cli("pick", str(CSVS / "primus_rank0_empty.csv"), str(CSVS / "primus_last_rank.csv"))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{CSVS / 'primus_last_rank.csv'}\n"


def test_pick_json_lists_every_candidate_with_its_score_and_error():
    paths = [str(CSVS / "empty.csv"), str(CSVS / "leading_space_header.csv")]
    result = run_cli("pick", "--json", *paths)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["chosen"] == paths[1]
    assert payload["candidates"] == [
        {"path": paths[0], "rows": 0, "non_empty": 0, "error": "empty file"},
        {"path": paths[1], "rows": 2, "non_empty": 1, "error": None},
    ]


def test_pick_without_any_value_exits_1_with_one_line_naming_the_candidates():
    paths = [str(CSVS / n) for n in ("empty.csv", "header_only.csv", "primus_rank0_empty.csv")]
    result = run_cli("pick", *paths)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        "slurm-multi: results: no candidate CSV has a performance value (3 candidates: "
    )
    assert "empty.csv: empty file" in lines[0] and "0 of 2 rows with performance" in lines[0]
    assert "Traceback" not in result.output


def test_pick_json_without_any_value_still_prints_json_with_chosen_null_and_exits_1():
    result = run_cli("pick", "--json", str(CSVS / "binary.csv"))
    assert result.exit_code == 1
    payload = json.loads(result.stdout)
    assert payload["chosen"] is None and "binary file" in payload["candidates"][0]["error"]


def test_pick_of_a_directory_or_an_impossible_name_is_a_one_line_failure(tmp_path: Path):
    result = run_cli("pick", str(tmp_path), "bad\x00name.csv")
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = result.stderr.splitlines()
    assert "Is a directory" in line and "cannot read: embedded null byte" in line


def test_pick_with_no_arguments_is_a_usage_error():
    assert run_cli("pick").exit_code == 2


# ----------------------------------------------------------------------------- hypothesis


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400))
def test_any_text_as_a_candidate_never_crashes_pick(text: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.csv"
        path.write_text(text, encoding="utf-8", newline="")
        chosen, (candidate,) = pick_best([path])
        assert candidate.non_empty <= candidate.rows
        assert chosen is None or chosen.non_empty > 0


CELL = st.one_of(
    st.sampled_from(["", " ", "N/A", "n/a", "nan", "NaN", "none", "null", "NULL", " nan ", "-", "error"]),
    st.sampled_from(["inf", "-Infinity", "1e999", "1.2.3", "12 samples/s", "1,234.5", "0x10", "1_000"]),
    st.sampled_from([" 7 ", "+.5", "5.", "-0", "1E-3", "\u0661\u0662", "\uff11"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)
COLUMN = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).filter(
    lambda name: name != "performance"
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(COLUMN, min_size=0, max_size=4, unique=True),
    st.integers(min_value=0, max_value=4),
    st.sampled_from(["performance", " performance", "performance ", "Performance"]),
    st.lists(st.lists(CELL, min_size=5, max_size=5), max_size=20),
)
def test_the_score_equals_an_independent_count_for_well_formed_csvs(
    others: list[str], position: int, perf_name: str, rows: list[list[str]]
):
    header = list(others)
    position = min(position, len(header))
    header.insert(position, perf_name)
    body = [row[: len(header)] for row in rows]
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerows([header, *body])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gen.csv"
        path.write_text(buffer.getvalue(), encoding="utf-8", newline="")
        candidate = score_csv(path)
    assert candidate.error is None
    assert candidate.rows == len(body)
    assert candidate.non_empty == sum(1 for row in body if is_finite_ascii_number(row[position]))


def is_finite_ascii_number(text: str) -> bool:
    """The documented rule, written independently of values.py: what float() reads from plain
    ASCII digits, sign, point and exponent, when finite."""
    text = text.strip()
    if not text or any(c not in "0123456789+-.eE" for c in text):
        return False
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


# ----------------------------------------------------------------------------- what counts as a value


@pytest.mark.parametrize(
    "text",
    ["error", "-", "inf", "-inf", "Infinity", "nan", "N/A", "", "  ", "1.2.3", "12 samples/s", "1,234.5",
     "1,234", "0x10", "1_000", "1e999", "\u0661\u0662\u0663", "\uff11", "1e", ".", "+-1", "--1"],
)  # fmt: skip
def test_a_performance_value_that_is_not_a_finite_number_is_not_a_result(text: str):
    assert as_number(text) is None


@pytest.mark.parametrize(
    ("text", "value"),
    [("42", 42.0), (" 10132.5 ", 10132.5), ("+.5", 0.5), ("5.", 5.0), ("-3", -3.0), ("1.5E3", 1500.0),
     ("0", 0.0)],
)  # fmt: skip
def test_plain_decimal_numbers_are_results(text: str, value: float):
    assert as_number(text) == value


def test_a_csv_of_non_numbers_scores_only_its_number_and_warns_about_the_surprising_ones():
    """Regression: `error`, `-` and `inf` used to count as results (and make a job SUCCESS)."""
    candidate = score_csv(CSVS / "not_numbers.csv", "node_1/perf.csv")
    assert (candidate.rows, candidate.non_empty, candidate.error) == (13, 1, None)
    assert candidate.warnings == (
        "node_1/perf.csv line 2: performance 'error' is not a finite number; counted as empty",
        "node_1/perf.csv line 4: performance 'inf' is not a finite number; counted as empty",
        "node_1/perf.csv line 5: performance '-inf' is not a finite number; counted as empty",
        "node_1/perf.csv line 8: performance '1.2.3' is not a finite number; counted as empty",
        "node_1/perf.csv line 9: performance '12 samples/s' is not a finite number; counted as empty",
        "node_1/perf.csv: +3 more row problems like these",  # 1,234.5 0x10 1e999; `-` N/A nan blank: silent
    )


@pytest.mark.parametrize("value", ["error", "-", "inf"])
def test_a_csv_whose_only_values_are_error_dash_or_inf_is_never_chosen(tmp_path: Path, value: str):
    """Regression: the old picker chose such a CSV over an honest empty one."""
    path = tmp_path / "perf.csv"
    path.write_text(f"model,performance,metric\nm,{value},tok_per_s\n")
    chosen, (candidate,) = pick_best([path])
    assert chosen is None and candidate.non_empty == 0


# ----------------------------------------------------------------------------- malformed rows


@pytest.mark.parametrize(
    ("name", "rows", "warnings"),
    [
        ("truncated_row.csv", 1, ["line 3: 2 fields, the header has 3 (truncated or ragged); row dropped"]),
        ("truncated_quote.csv", 1, [
            "line 3: malformed CSV (unexpected end of data; truncated file?); row dropped",
        ]),
        ("ragged.csv", 0, ["line 2: 5 fields, the header has 3 (truncated or ragged); row dropped"]),
        ("undecodable_row.csv", 2, ["line 3: not UTF-8 text (byte 0xfc); row dropped"]),
        ("malformed_middle_rows.csv", 2, [
            "line 3: malformed CSV (',' expected after '\"'); row dropped",
            "lines 4-6: 4 fields, the header has 3 (truncated or ragged); row dropped",
        ]),
    ],
)  # fmt: skip
def test_a_malformed_row_is_dropped_with_a_warning_and_the_other_rows_still_count(
    name: str, rows: int, warnings: list[str]
):
    """Regression: one truncated last row used to throw the whole CSV away."""
    candidate = score_csv(CSVS / name, f"node_1/{name}")
    assert (candidate.error, candidate.rows, candidate.non_empty) == (None, rows, rows)
    assert list(candidate.warnings) == [f"node_1/{name} {warning}" for warning in warnings]


def test_a_file_whose_rows_are_all_malformed_is_readable_but_never_chosen():
    chosen, (candidate,) = pick_best([CSVS / "ragged.csv"])
    assert chosen is None and candidate.error is None and candidate.warnings


def test_at_most_five_row_warnings_per_file_then_a_count(tmp_path: Path):
    path = tmp_path / "perf.csv"
    path.write_text("model,performance,metric\n" + "m,1\n" * 40 + "m,2,x\n")
    candidate = score_csv(path, "perf.csv")
    assert (candidate.rows, candidate.non_empty) == (1, 1)
    assert len(candidate.warnings) == pick.MAX_ROW_WARNINGS + 1
    assert candidate.warnings[-1] == "perf.csv: +35 more row problems like these"


def test_pick_says_each_dropped_row_on_stderr_and_in_its_json(tmp_path: Path):
    path = str(CSVS / "truncated_row.csv")
    result = run_cli("pick", "--json", path)
    assert result.exit_code == 0, result.output
    warning = f"{path} line 3: 2 fields, the header has 3 (truncated or ragged); row dropped"
    assert json.loads(result.stdout)["warnings"] == [warning]
    (line,) = result.stderr.splitlines()
    assert line.endswith(f" results: warning: {warning}")


def test_relative_change_is_a_percentage_with_two_decimals():
    assert relative_change("110", "100") == "10.00"
    assert relative_change("97.5", "100") == "-2.50"
    assert relative_change("100", "100") == "0.00"
    assert relative_change("100", "0") == ""
    assert relative_change("error", "100") == relative_change("100", "inf") == ""


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('ab1.,"\r\n \t')), max_size=40))
def test_the_split_fast_path_reads_rows_as_the_csv_module_does(text: str):
    try:
        expected = [row for row in csv.reader(io.StringIO(text, newline=""), strict=True) if row]
    except csv.Error:
        expected = None
    assert pick._split_rows(text) == expected
