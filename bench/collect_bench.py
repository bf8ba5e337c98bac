"""`results collect` over many synthetic node directories, against merely reading the same files.

The job directory is generated once per invocation in a temporary directory:

    JOBDIR/job.json
    JOBDIR/node_<rank>/status.json   every stage ok, exit 0
    JOBDIR/node_<rank>/node.log      a few KB of ordinary training output (no error pattern)
    JOBDIR/node_<rank>/perf_bench.csv  header + rows with an empty performance value, except on
                                       the last rank (the Primus pattern the picker exists for)

- measured: slurm_multi.results.collect(JOBDIR) in-process, writing perf.csv and summary.json as the
  command does. The same through the CLI (`python -m slurm_multi results collect JOBDIR`, interpreter
  start-up included) is reported in the notes.
- baseline: list JOBDIR and read every one of those files (open + read all bytes) in Python.

Both run against a warm page cache (one uncounted run of each first), interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "py"))

from benchlib import format_seconds, helper_env, make_row, median, talk, timed, write_rows  # noqa: E402

NODES = 1000
TARGET = "<= 3.0x"
RESULTS_CSV = "perf_bench.csv"
CSV_HEADER = "model,performance,metric,precision,batch_size,num_gpus\n"
METRICS = ("tok_per_s_per_gpu", "TFLOPS_per_gpu", "step_time_ms")


def _status(rank: int) -> str:
    stages = {
        "prepare": {"seconds": 0.21, "status": "ok"},
        "image": {"seconds": 1.7 + rank % 7 / 10, "status": "ok"},
        "barrier": {"seconds": 0.35, "status": "ok"},
        "run": {"seconds": 612.4, "status": "ok", "exit_code": 0},
        "stage": {"seconds": 0.08, "status": "ok"},
    }
    doc = {
        "rank": rank,
        "node": f"node{rank:04d}",
        "exit_code": 0,
        "status": "ok",
        "reason": "",
        "stages": stages,
    }
    return json.dumps(doc, indent=1) + "\n"


def _node_log(rank: int, log_lines: int) -> str:
    lines = [f"[rank{rank * 8}]: starting training with 8 local GPUs, world size 8000"]
    for step in range(1, log_lines + 1):
        lines.append(
            f"[rank{rank * 8}]: iteration {step:4d}/{log_lines} | consumed samples: {step * 512:8d} | "
            f"elapsed time per iteration (ms): {812.3 + step % 5:.1f} | lm loss: {2.31 - step / 1000:.4f} | "
            f"throughput per GPU (TFLOP/s/GPU): {521.0 + step % 3:.1f}"
        )
    lines.append(f"[rank{rank * 8}]: training done")
    return "\n".join(lines) + "\n"


def _csv(rank: int, last: bool) -> str:
    values = ("10132.5", "522.3", "812.3") if last else ("", "", "")
    rows = [f"Llama-3.1-8B,{value},{metric},BF16,4,8" for value, metric in zip(values, METRICS)]
    return CSV_HEADER + "\n".join(rows) + "\n"


def make_jobdir(root: Path, nodes: int, log_lines: int = 30) -> Path:
    """A finished job directory of `nodes` nodes that collect judges SUCCESS; returns its path."""
    jobdir = root / "slurm-multi-90001"
    jobdir.mkdir(parents=True)
    job = {
        "job_id": "90001",
        "model": "bench_model",
        "nnodes": nodes,
        "results_csv": RESULTS_CSV,
        "image": "toy/model:local",
        "image_id": "sha256:" + "c" * 64,
        "nodes": [f"node{rank:04d}" for rank in range(nodes)],
    }
    (jobdir / "job.json").write_text(json.dumps(job, indent=2) + "\n")
    for rank in range(nodes):
        node = jobdir / f"node_{rank}"
        node.mkdir()
        (node / "status.json").write_text(_status(rank))
        (node / "node.log").write_text(_node_log(rank, log_lines))
        (node / RESULTS_CSV).write_text(_csv(rank, rank == nodes - 1))
    return jobdir


def read_all(jobdir: Path) -> int:
    """The baseline: list the job dir, then open and read every file collect reads; returns bytes."""
    total = 0
    names = sorted(os.listdir(jobdir))
    with open(jobdir / "job.json", "rb") as handle:
        total += len(handle.read())
    for name in names:
        if not name.startswith("node_"):
            continue
        for leaf in ("status.json", "node.log", RESULTS_CSV):
            with open(jobdir / name / leaf, "rb") as handle:
                total += len(handle.read())
    return total


def collect_in_process(jobdir: Path) -> str:
    from slurm_multi.results import collect

    summary = collect(jobdir)
    return summary.verdict


def collect_cli(jobdir: Path) -> int:
    command = [sys.executable, "-m", "slurm_multi", "results", "collect", str(jobdir)]
    done = subprocess.run(
        command, env=helper_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"`results collect` exited {done.returncode}: {tail[0]}")
    return done.returncode


def run(nodes: int = NODES, repeats: int = 5, cli_repeats: int | None = None) -> list[dict[str, Any]]:
    cli_repeats = repeats if cli_repeats is None else cli_repeats
    with tempfile.TemporaryDirectory(prefix="sm-bench-collect-") as tmp:
        talk("collect", f"generating {nodes} node directories in {tmp}")
        jobdir = make_jobdir(Path(tmp), nodes)
        size = read_all(jobdir)
        verdict = collect_in_process(jobdir)  # warm-up: page cache, imports, regex compilation
        if verdict != "SUCCESS":
            raise RuntimeError(f"collect judged the synthetic job {verdict}; the generator is out of date")
        talk("collect", f"{repeats} runs each of collect() and reading {size / 1e6:.1f} MB")
        measured: list[float] = []
        baseline: list[float] = []
        for round_number in range(repeats):
            pair = [(measured, lambda: collect_in_process(jobdir)), (baseline, lambda: read_all(jobdir))]
            for samples, func in pair if round_number % 2 == 0 else reversed(pair):
                samples.append(timed(func)[0])
        cli = [timed(lambda: collect_cli(jobdir))[0] for _ in range(cli_repeats)] if cli_repeats else []
    files = 1 + 3 * nodes
    cli_note = f"; via the CLI (start-up included) median {format_seconds(median(cli))}" if cli else ""
    notes = (
        f"{nodes} node dirs, {files} files, {size / 1e6:.1f} MB; collect writes perf.csv and "
        f"summary.json each run{cli_note}"
    )
    row = make_row(
        f"results collect, {nodes} node dirs",
        f"collect() in-process over {nodes} node dirs (judge + pick + write)",
        f"list the job dir and read the same {files} files",
        measured,
        baseline,
        target=TARGET if nodes == NODES else None,
        notes=notes,
        extra={
            "nodes": nodes,
            "bytes": size,
            "cli_samples_s": cli,
            "cli_median_s": median(cli) if cli else None,
        },
    )
    talk(
        "collect",
        f"collect {format_seconds(row['median_s'])}, read {format_seconds(row['baseline_median_s'])}, "
        f"ratio {row['ratio']:.2f}x{cli_note}",
    )
    return [row]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=NODES, help="synthetic node directories")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each side")
    parser.add_argument("--cli-repeats", type=int, help="runs through the CLI (default: --repeats; 0 = none)")
    parser.add_argument("--out", default="-", help="write the rows (JSON list) here; '-' = stdout")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.repeats < 1 or (args.cli_repeats is not None and args.cli_repeats < 0):
        parser.error("--nodes and --repeats must be positive, --cli-repeats not negative")
    write_rows(run(args.nodes, args.repeats, args.cli_repeats), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
