"""results collect --perf-csv: append a job's rows to a shared madengine perf.csv under a lock, fill
relative_change, write perf_entry.csv beside it, and never lose or half-write the shared file."""

from __future__ import annotations

import csv
import fcntl
import io
import multiprocessing
import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_multi import EXIT_TIMEOUT, EXIT_USAGE
from slurm_multi.cli import group
from slurm_multi.common import HelperError
from slurm_multi.results import PERF_COLUMNS
from slurm_multi.results.perfcsv import append_perf_csv

DATA = Path(__file__).parent / "data" / "results"
PRIMUS_JOB = DATA / "jobs" / "primus_2node"
PRIMUS_EXTRAS = ["mode", "precision", "batch_size", "global_batch_size", "seq_len", "device", "num_gpus"]
PRIMUS_MODEL = "primus_llama3_8b_Llama-3.1-8B"
# The configuration of the primus fixture's rows, as the columns relative_change compares.
PRIMUS_CONFIG = {
    "n_gpus": "16",
    "nnodes": "2",
    "gpus_per_node": "8",
    "args": "--config llama3.1_8B-pretrain.yaml",
    "tags": "primus,pretrain",
}


def copy_primus(tmp_path: Path) -> Path:
    return Path(shutil.copytree(PRIMUS_JOB, tmp_path / "4711"))


def run_cli(*args: str):
    return CliRunner().invoke(group, ["results", *args])


def csv_text(rows: list[list[str]], newline: str = "\n") -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator=newline).writerows(rows)
    return buffer.getvalue()


def earlier_row(header: list[str], **values: str) -> list[str]:
    return [values.get(name, "") for name in header]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as handle:
        return list(csv.DictReader(handle))


# ----------------------------------------------------------------------------- create and append


def test_an_absent_perf_csv_is_created_with_madengines_header_and_perf_entry_beside_it(tmp_path: Path):
    jobdir = copy_primus(tmp_path)
    shared = tmp_path / "shared" / "perf.csv"
    shared.parent.mkdir()
    result = run_cli("collect", str(jobdir), "--perf-csv", str(shared))
    assert result.exit_code == 0, result.output
    with open(shared, newline="") as handle:
        assert next(csv.reader(handle)) == list(PERF_COLUMNS) + PRIMUS_EXTRAS
    rows = read_rows(shared)
    assert [(r["model"], r["performance"], r["relative_change"], r["machine_name"]) for r in rows] == [
        (PRIMUS_MODEL, "10132.5", "", "4711"),
        (PRIMUS_MODEL, "522.3", "", "4711"),
    ]
    assert (shared.parent / "perf_entry.csv").read_bytes() == shared.read_bytes()
    assert (shared.parent / "perf.csv.lock").exists()
    assert f"2 rows created {shared}; this run's rows: {shared.parent / 'perf_entry.csv'}" in result.stderr
    assert (jobdir / "perf.csv").exists() and "relative_change" in (jobdir / "perf.csv").read_text()


def test_relative_change_compares_with_the_latest_earlier_row_of_the_same_model_and_config(tmp_path: Path):
    header = list(PERF_COLUMNS) + PRIMUS_EXTRAS
    tok, tflops = "tok_per_s_per_gpu", "TFLOPS_per_gpu"
    shared = tmp_path / "perf.csv"
    same, pandas_style, one_node = (
        PRIMUS_CONFIG,
        dict(PRIMUS_CONFIG, n_gpus="16.0"),
        dict(PRIMUS_CONFIG, nnodes="1"),
    )
    before = csv_text([
        header,
        earlier_row(header, model=PRIMUS_MODEL, metric=tok, performance="9000", **same),
        earlier_row(header, model=PRIMUS_MODEL, metric=tok, performance="9750", **pandas_style),
        earlier_row(header, model=PRIMUS_MODEL, metric=tflops, performance="500", **one_node),
        earlier_row(header, model="other_model_Llama-3.1-8B", metric=tflops, performance="400", **same),
    ])  # fmt: skip
    shared.write_text(before)
    result = run_cli("collect", str(copy_primus(tmp_path)), "--perf-csv", str(shared))
    assert result.exit_code == 0, result.output
    after = shared.read_text()
    assert after.startswith(before)  # appended: the earlier rows are untouched, byte for byte
    new = read_rows(shared)[4:]
    assert [(r["metric"], r["performance"], r["relative_change"]) for r in new] == [
        (tok, "10132.5", "3.92"),  # (10132.5 - 9750) / 9750 * 100: the latest row; 16.0 = 16
        (tflops, "522.3", ""),  # one earlier TFLOPS row ran on 1 node, the other is another model
    ]
    assert read_rows(tmp_path / "perf_entry.csv") == new


@pytest.mark.parametrize("previous", ["", "error", "inf", "0"])
def test_relative_change_is_empty_when_the_latest_earlier_value_is_not_a_usable_number(
    tmp_path: Path, previous: str
):
    shared = tmp_path / "perf.csv"
    header = ["model", "metric", "performance", "relative_change"]
    shared.write_text(csv_text([header, ["m", "x", "100", ""], ["m", "x", previous, ""]]))
    append_perf_csv(shared, header, [["m", "x", "110", ""]])
    assert read_rows(shared)[-1]["relative_change"] == ""


def test_a_new_row_without_a_number_has_an_empty_relative_change(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    header = ["model", "metric", "performance", "relative_change"]
    shared.write_text(csv_text([header, ["m", "x", "100", ""]]))
    append_perf_csv(shared, header, [["m", "x", "", ""], ["m", "x", "150", ""]])
    assert [r["relative_change"] for r in read_rows(shared)] == ["", "", "50.00"]  # earlier rows only


def test_a_header_that_must_grow_keeps_the_files_order_and_adds_new_columns_at_the_end(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    old_header = ["model", "performance", "metric", "status", "notes", "nnodes"]
    shared.write_text(csv_text([old_header, ["old_model", "1.5", "x", "SUCCESS", "kept, with a comma", "2"]]))
    shared.chmod(0o640)
    result = run_cli("collect", str(copy_primus(tmp_path)), "--perf-csv", str(shared))
    assert result.exit_code == 0, result.output
    with open(shared, newline="") as handle:
        header = next(csv.reader(handle))
    added = [c for c in PERF_COLUMNS if c not in old_header] + PRIMUS_EXTRAS
    assert header == old_header + added
    rows = read_rows(shared)
    old_values = ["old_model", "1.5", "x", "SUCCESS", "kept, with a comma", "2"]
    assert rows[0] == dict.fromkeys(header, "") | dict(zip(old_header, old_values))
    assert [(r["model"], r["notes"], r["mode"], r["docker_image"]) for r in rows[1:]] == [
        (PRIMUS_MODEL, "", "pretrain", "rocm/primus:v25.9"),
        (PRIMUS_MODEL, "", "pretrain", "rocm/primus:v25.9"),
    ]
    assert (shared.stat().st_mode & 0o777) == 0o640  # the rewrite kept the file's permissions
    assert "new columns: n_gpus, gpus_per_node" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left


def test_line_ends_a_missing_final_newline_and_a_bom_are_respected(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    shared.write_bytes(b"\xef\xbb\xbfmodel,performance,metric\r\nm,1,x")  # CRLF, no final line end
    append_perf_csv(shared, ["model", "performance", "metric"], [["m", "2", "x"]])
    assert shared.read_bytes() == b"\xef\xbb\xbfmodel,performance,metric\r\nm,1,x\r\nm,2,x\r\n"
    append_perf_csv(shared, ["model", "performance", "metric", "extra"], [["m", "3", "x", "e"]])
    assert shared.read_bytes() == (
        b"\xef\xbb\xbfmodel,performance,metric,extra\r\nm,1,x,\r\nm,2,x,\r\nm,3,x,e\r\n"
    )


def test_an_empty_perf_csv_is_started_with_the_header(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    shared.write_text("")
    done = append_perf_csv(shared, list(PERF_COLUMNS), [["m"] + [""] * (len(PERF_COLUMNS) - 1)])
    assert done.created and read_rows(shared)[0]["model"] == "m"


def test_a_symlinked_perf_csv_is_appended_to_where_it_points(tmp_path: Path):
    real = tmp_path / "real" / "perf.csv"
    real.parent.mkdir()
    real.write_text("model,performance\nm,1\n")
    link = tmp_path / "perf.csv"
    link.symlink_to(real)
    append_perf_csv(link, ["model", "performance", "new"], [["m", "2", "n"]])
    assert link.is_symlink() and real.read_text() == "model,performance,new\nm,1,\nm,2,n\n"


# ----------------------------------------------------------------------------- concurrency

WRITERS = 8
APPENDS = 5
ROWS_PER_APPEND = 3


def _append_as_writer(path: str, writer: int, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    for round_number in range(APPENDS):
        header = ["model", "performance", "metric", "machine_name", "row"]
        if writer % 2:  # every other writer brings a new column each time: the header grows under load
            header.append(f"extra_{writer}_{round_number}")
        rows = [
            [f"m{writer}", str(100 + i), "x", f"job{writer}", f"{writer}.{round_number}.{i}", "e"][
                : len(header)
            ]
            for i in range(ROWS_PER_APPEND)
        ]
        append_perf_csv(path, header, rows)


def test_eight_processes_appending_at_once_lose_and_duplicate_no_row(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    context = multiprocessing.get_context("fork")
    start = context.Barrier(WRITERS)
    writers = [
        context.Process(target=_append_as_writer, args=(str(shared), w, start)) for w in range(WRITERS)
    ]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
    assert [process.exitcode for process in writers] == [0] * WRITERS
    with open(shared, newline="") as handle:
        header, *rows = list(csv.reader(handle, strict=True))
    assert all(len(row) == len(header) for row in rows)
    grown = {f"extra_{w}_{r}" for w in range(1, WRITERS, 2) for r in range(APPENDS)}
    assert grown <= set(header) and len(header) == len(set(header))
    written = sorted(row[header.index("row")] for row in rows)
    expected = sorted(
        f"{w}.{r}.{i}" for w in range(WRITERS) for r in range(APPENDS) for i in range(ROWS_PER_APPEND)
    )
    assert written == expected  # every row once: none lost, none twice


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"model,performance,metric\nm,1,x\nm,2", "line 3 has 2 fields, the header has 3"),
        (b'model,performance,metric\nm,1,x\nm,"2,x\n', "line 3: malformed CSV (unexpected end of data)"),
        (b"model,performance,metric\nm\xfc,1,x\n", "not UTF-8 text (byte 0xfc at offset 26)"),
        (b"model,performance,metric\nm,1,x\n\x00\x00\x00", "binary file (contains NUL bytes)"),
        (b"model,performance,model\nm,1,x\n", "column 'model' appears twice in its header"),
        (b"name,value\nm,1\n", "no model, performance column in its header (name, value)"),
    ],
)
def test_a_malformed_perf_csv_is_a_one_line_error_and_is_left_untouched(
    tmp_path: Path, content: bytes, problem: str
):
    shared = tmp_path / "perf.csv"
    shared.write_bytes(content)
    jobdir = copy_primus(tmp_path)
    result = run_cli("collect", str(jobdir), "--perf-csv", str(shared))
    assert result.exit_code == EXIT_USAGE, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("slurm-multi:")]
    fix = "fix or move the file aside (nothing was written)"
    assert errors == [f"slurm-multi: results: --perf-csv {shared}: {problem}; {fix}"]
    assert shared.read_bytes() == content
    assert not (tmp_path / "perf_entry.csv").exists()
    assert "SUCCESS" in result.stderr and (jobdir / "summary.json").exists()  # the job itself was judged


def test_a_perf_csv_locked_too_long_is_a_timeout_and_is_left_untouched(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    shared.write_text("model,performance\nm,1\n")
    holder = os.open(tmp_path / "perf.csv.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(HelperError) as caught:
            append_perf_csv(shared, ["model", "performance"], [["m", "2"]], lock_timeout=0.2)
    finally:
        os.close(holder)
    assert caught.value.exit_code == EXIT_TIMEOUT
    assert "perf.csv.lock stayed locked for 0.2 s" in caught.value.format_message()
    assert shared.read_text() == "model,performance\nm,1\n"


def as_ordinary_user(folder: Path, action: Callable[[Path], str]) -> str:
    """`action(relative path of folder)`'s result, run as the ordinary user `nobody` when the tests
    run as root (as CI runs them: root writes anywhere, so a read-only directory would read as
    writable). The child changes into `folder` before it drops root, so pytest's private parents
    need not be searchable; its result comes back through a pipe."""
    if os.geteuid() != 0:
        return action(folder)
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(reader)
            os.chdir(folder)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(writer, action(Path(".")).encode())
            code = 0
        except BaseException:  # what went wrong reaches the test's failure message
            os.write(writer, traceback.format_exc().encode())
        finally:
            os._exit(code)
    os.close(writer)
    with os.fdopen(reader, encoding="utf-8") as pipe:
        result = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the unprivileged child failed: {result}"
    return result


def test_a_read_only_directory_is_a_one_line_error(tmp_path: Path):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "perf.csv").write_text("model,performance\nm,1\n")
    folder.chmod(0o555)

    def append(where: Path) -> str:
        try:
            append_perf_csv(where / "perf.csv", ["model", "performance", "new"], [["m", "2", "n"]])
        except HelperError as err:
            return err.format_message()
        return "no error"

    try:
        message = as_ordinary_user(folder, append)
    finally:
        folder.chmod(0o755)
    assert message != "no error"
    assert "\n" not in message and "perf.csv" in message
    assert (folder / "perf.csv").read_text() == "model,performance\nm,1\n"


def test_a_lock_that_cannot_be_opened_is_a_one_line_error_through_the_cli(tmp_path: Path):
    shared = tmp_path / "perf.csv"
    shared.write_text("model,performance\nm,1\n")
    (tmp_path / "perf.csv.lock").mkdir()
    result = run_cli("collect", str(copy_primus(tmp_path)), "--perf-csv", str(shared))
    assert result.exit_code == 1 and "Traceback" not in result.output
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("slurm-multi:")]
    assert error.startswith(f"slurm-multi: results: cannot open the lock {shared}.lock: Is a directory")
    assert shared.read_text() == "model,performance\nm,1\n"
