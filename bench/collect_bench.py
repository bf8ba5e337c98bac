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

A second row (no target) measures the same over node dirs as a job of today leaves them: each also
holds events.log (the stage and point events every node writes) and progress.json (the hang
watch's), which collect reads for the timeline and the hangs; its baseline reads those too. The
first row's dirs lack both, so collect tries and fails to open them (and the old events.jsonl)
on every node.

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


LEFT_FILES = ("events.log", "progress.json")  # what a node leaves besides (the second row)
START = 1_796_000_000.0


def _events(rank: int) -> str:
    """The events.log a node writes: every stage's start and end, and the run's point events."""
    host, t, lines = f"node{rank:04d}", START, []
    for stage, seconds in (("prepare", 0.21), ("fitness", 0.1), ("image", 1.7 + rank % 7 / 10),
                           ("barrier", 0.35), ("run", 612.4), ("save-outputs", 0.08)):  # fmt: skip
        lines.append(f"{t:.6f} stage_start rank={rank} host={host} stage={stage}")
        if stage == "image" and rank == 0:
            lines.append(f"{t + 0.05:.6f} release rank={rank} host={host}")
        if stage == "run":
            lines += [f"{t + 0.01:.6f} container_start rank={rank} host={host}",
                      f"{t + 1.2:.6f} first_output rank={rank} host={host}",
                      f"{t + seconds - 0.01:.6f} exit rank={rank} host={host} code=0"]  # fmt: skip
        t += seconds
        lines.append(f"{t:.6f} stage_end rank={rank} host={host} stage={stage} status=ok")
    return "\n".join(lines) + "\n"


def _progress(rank: int) -> str:
    last = START + 613.0
    doc = {"rank": rank, "node": f"node{rank:04d}", "last_output_epoch": last, "last_cpu_epoch": last - 0.3,
           "cpu_seconds": 4000.5, "updated_epoch": last}  # fmt: skip
    return json.dumps(doc, indent=2) + "\n"


def make_jobdir(root: Path, nodes: int, log_lines: int = 30, as_left: bool = False) -> Path:
    """A finished job directory of `nodes` nodes that collect judges SUCCESS; returns its path.
    as_left: each node dir also holds events.log and progress.json, as a job of today leaves them."""
    jobdir = root / ("slurm-multi-90002" if as_left else "slurm-multi-90001")
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
        if as_left:
            (node / "events.log").write_text(_events(rank))
            (node / "progress.json").write_text(_progress(rank))
    return jobdir


def read_all(jobdir: Path) -> int:
    """The baseline: list the job dir, then open and read every file collect reads; returns bytes.
    Only the files there are (one stat of node_0 says which kind of dir it is, not one per node)."""
    total = 0
    names = sorted(os.listdir(jobdir))
    leaves = ("status.json", "node.log", RESULTS_CSV)
    if (jobdir / "node_0" / LEFT_FILES[0]).exists():
        leaves += LEFT_FILES
    with open(jobdir / "job.json", "rb") as handle:
        total += len(handle.read())
    for name in names:
        if not name.startswith("node_"):
            continue
        for leaf in leaves:
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


def _measure(jobdir: Path, repeats: int) -> tuple[list[float], list[float]]:
    """collect() and the raw read, interleaved (which goes first alternates), after one of each."""
    read_all(jobdir)
    verdict = collect_in_process(jobdir)  # warm-up: page cache, imports, regex compilation
    if verdict != "SUCCESS":
        raise RuntimeError(f"collect judged the synthetic job {verdict}; the generator is out of date")
    measured: list[float] = []
    baseline: list[float] = []
    for round_number in range(repeats):
        pair = [(measured, lambda: collect_in_process(jobdir)), (baseline, lambda: read_all(jobdir))]
        for samples, func in pair if round_number % 2 == 0 else reversed(pair):
            samples.append(timed(func)[0])
    return measured, baseline


def run(nodes: int = NODES, repeats: int = 5, cli_repeats: int | None = None) -> list[dict[str, Any]]:
    cli_repeats = repeats if cli_repeats is None else cli_repeats
    with tempfile.TemporaryDirectory(prefix="sm-bench-collect-") as tmp:
        talk("collect", f"generating {nodes} node directories in {tmp}")
        jobdir = make_jobdir(Path(tmp), nodes)
        left = make_jobdir(Path(tmp), nodes, as_left=True)
        size, left_size = read_all(jobdir), read_all(left)
        talk("collect", f"{repeats} runs each of collect() and reading {size / 1e6:.1f} MB")
        measured, baseline = _measure(jobdir, repeats)
        cli = [timed(lambda: collect_cli(jobdir))[0] for _ in range(cli_repeats)] if cli_repeats else []
        talk("collect", f"the same over node dirs as a job leaves them ({left_size / 1e6:.1f} MB)")
        left_measured, left_baseline = _measure(left, repeats)
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
    left_files = 1 + (3 + len(LEFT_FILES)) * nodes
    left_row = make_row(
        f"results collect, {nodes} node dirs as a job leaves them",
        f"the row above over node dirs that also hold {' and '.join(LEFT_FILES)}, as every node writes them",
        f"list the job dir and read the same {left_files} files",
        left_measured,
        left_baseline,
        notes=f"{nodes} node dirs, {left_files} files, {left_size / 1e6:.1f} MB; lanes from the events",
        extra={"nodes": nodes, "bytes": left_size},
    )
    for shown in (row, left_row):
        talk(
            "collect",
            f"{shown['row']}: collect {format_seconds(shown['median_s'])}, read "
            f"{format_seconds(shown['baseline_median_s'])}, ratio {shown['ratio']:.2f}x",
        )
    return [row, left_row]


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
