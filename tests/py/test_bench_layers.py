"""The bench's layers rows (bench/layers_bench.sh): a row may count bytes (the bytes each worker's
link carried against the changed layer's), and the table prints it in bytes, not seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402
import report  # noqa: E402


def test_a_row_in_bytes_prints_in_bytes(tmp_path: Path) -> None:
    out = tmp_path / "row.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / "cluster_rows.py"), "--row", "layers: bytes", "--what", "w",
         "--baseline", "b", "--samples", "45727,44320", "--baseline-samples", "1048576,1048576", "--paired",
         "--unit", "bytes", "--target", "<= 1.1x", "--out", str(out)],
        capture_output=True, text=True, env={"PYTHONPATH": str(BENCH)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(out.read_text())
    assert row["unit"] == "bytes" and row["met"] is True
    cells = report.table_row(row)
    assert cells[1].startswith("45 kB (44.3 kB – 45.7 kB, n=2)") and cells[2].startswith("1.05 MB")
    assert cells[3].startswith("-1 MB (")  # the pairs' differences, in bytes too
    seconds = benchlib.make_row("t", "w", "b", [1.0], [2.0])
    assert report.table_row(seconds)[1] == "1 s (1 s – 1 s, n=1)"  # other rows as before


def test_the_layers_script_is_a_group_of_the_cluster_bench() -> None:
    done = subprocess.run(["bash", str(BENCH / "layers_bench.sh"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--out-dir DIR" in done.stdout
    groups = subprocess.run(
        ["bash", "-c", f"source {BENCH}/cluster_bench.sh; BENCH_CLUSTER_GROUPS=layers want_group layers"]
    )  # fmt: skip
    assert groups.returncode == 0
