"""The log-line fallback: `performance: <value> <metric> [node_id: N]` lines (else HuggingFace's
`train_samples_per_second`), and how one metric's per-node values combine (sum, mean or max) by what
its name says it measures."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from slurm_multi.results.values import NUMBER, as_number

# madengine's performance line (deployment/base.py PERFORMANCE_LOG_PATTERN), judged line by line:
# `performance:` as written (lower case, right after the colon at least one blank), the value, then
# optionally a unit and/or a comma in either order (`14164/s, sps`, `14164, sps`, `14164 /s sps`,
# `14164,/s sps`), at least one blank, and the metric: everything up to a blank or a comma.
# Anything before `performance:` is allowed (`[rank0] performance: ...`, `my_performance: ...`).
PERF_LINE = re.compile(
    r"performance:\s+"
    rf"(?P<value>{NUMBER.pattern})"
    r"(?:,?\s*/[a-zA-Z]+\s*,?|,)?"
    r"\s+(?P<metric>[^\s,]+)"
    r"(?:.*?\bnode_id\s*:\s*(?P<node>\d+))?"
)
PERF_MARK = "performance:"  # in every line PERF_LINE matches: the lines without it skip the regex
# madengine's fallback when a log has no performance line (container_runner.py): the first
# `train_samples_per_second` a HuggingFace Trainer prints (`'train_samples_per_second': 4.23` in its
# metrics dict, `train_samples_per_second = 4.23` in its summary), reported as samples_per_second.
HF_LINE = re.compile(r"train_samples_per_second['\"\s:=]+(?P<value>[0-9][0-9.eE+-]*)")
HF_MARK = "train_samples_per_second"
HF_METRIC = "samples_per_second"


@dataclass(frozen=True)
class PerfLine:
    line: int
    value: float
    metric: str
    node_id: int | None = None


def parse_perf_lines(log: str | Iterable[str]) -> list[PerfLine]:
    """Every `performance: <value> <metric> [node_id: N]` line, in order (non-finite values skipped)."""
    return read_perf_log(log)[0]


def read_perf_log(log: str | Iterable[str]) -> tuple[list[PerfLine], float | None]:
    """The log's performance lines (as parse_perf_lines), and the value of its first HuggingFace
    `train_samples_per_second` (None when there is none, or when that first one is not a finite
    number: madengine reads only the first)."""
    lines = log.splitlines() if isinstance(log, str) else log
    found = []
    hf_value: float | None = None
    hf_seen = False
    for number, line in enumerate(lines, start=1):
        if not hf_seen and HF_MARK in line:
            hf = HF_LINE.search(line)
            if hf:
                hf_seen = True
                hf_value = as_number(hf.group("value"))
        if PERF_MARK not in line:
            continue
        match = PERF_LINE.search(line)
        if not match:
            continue
        value = float(match.group("value"))
        if not math.isfinite(value):
            continue  # 1e999: madengine writes inf; a perf.csv value is a finite number (values.py)
        node = match.group("node")
        found.append(PerfLine(number, value, match.group("metric"), int(node) if node else None))
    return found, hf_value


RATE = re.compile(r"/s(?:ec)?(?![a-z])|per[_\-\s]?(?:s|sec|second)(?![a-z])|(?<![a-z])(?:qps|rps|fps|iops)")
RATE_WORDS = frozenset({"throughput", "bandwidth", "tflops", "gflops", "pflops", "flops", "gbps", "mbps"})
PER_DEVICE = re.compile(r"per[_\-\s]?(?:gpu|device|rank|node|card|accelerator|gcd)(?![a-z])")
LATENCY_WORDS = frozenset(
    {"latency", "time", "ms", "us", "ns", "sec", "secs", "seconds", "second", "duration", "elapsed",
     "ttft", "itl", "tpot", "e2e", "p50", "p90", "p95", "p99", "p999"}
)  # fmt: skip
MEMORY_WORDS = frozenset(
    {"mem", "memory", "gb", "gib", "mb", "mib", "kb", "kib", "bytes", "byte", "vram", "rss"}
)
COUNT_WORDS = frozenset(
    {"tok", "toks", "token", "tokens", "sample", "samples", "image", "images", "img", "imgs",
     "sequences", "seqs", "items", "queries", "requests"}
)  # fmt: skip


def metric_kind(metric: str) -> str:
    """throughput | per-device | latency | memory | unknown, from the metric's name.

    A rate that is already normalised per GPU/device (tok_per_s_per_gpu, TFLOPS_per_gpu) is averaged:
    summing per-GPU numbers over nodes would multiply them by the node count.
    """
    lowered = metric.lower()
    words = set(re.split(r"[^a-z0-9]+", lowered)) - {""}
    rate = bool(RATE.search(lowered)) or bool(words & RATE_WORDS) or any(w.endswith("flops") for w in words)
    if rate:
        return "per-device" if PER_DEVICE.search(lowered) else "throughput"
    if words & LATENCY_WORDS or any(w.startswith(("latency", "time")) for w in words):
        return "latency"
    if words & MEMORY_WORDS or any(w.startswith("mem") for w in words):
        return "memory"
    if words & COUNT_WORDS:
        return "per-device" if PER_DEVICE.search(lowered) else "throughput"
    return "unknown"


RULES = {
    "throughput": "sum (throughput)",
    "per-device": "mean (per-device throughput)",
    "latency": "mean (latency)",
    "memory": "max (memory)",
    "unknown": "mean (unknown metric kind)",
}


def combine_metric(metric: str, values: Sequence[float]) -> tuple[float, str]:
    """Combine one metric's per-node values by what it means: sum, mean or max, with the rule used."""
    if not values:
        raise ValueError(f"no values for metric {metric!r}")
    kind = metric_kind(metric)
    if kind == "throughput":
        return math.fsum(values), RULES[kind]
    if kind == "memory":
        return max(values), RULES[kind]
    return math.fsum(values) / len(values), RULES[kind]
