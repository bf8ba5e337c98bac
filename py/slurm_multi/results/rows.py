"""perf.csv rows in madengine's columns: the per-job columns every row shares, one row per row of
the chosen CSV (model `<name>_<csv model>`, extra columns appended) or per combined log metric."""

from __future__ import annotations

import json
import re
from typing import Any

from slurm_multi.results.jobdir import as_int, present
from slurm_multi.results.pick import Candidate
from slurm_multi.results.values import format_number, is_result
from slurm_multi.secret_rule import MASK, is_secret_name

# madengine's perf.csv header, in its order (FORMATS.md).
PERF_COLUMNS: tuple[str, ...] = (
    "model", "n_gpus", "nnodes", "gpus_per_node", "training_precision", "pipeline", "args", "tags",
    "docker_file", "base_docker", "docker_sha", "docker_image", "git_commit", "machine_name",
    "deployment_type", "launcher", "gpu_architecture", "performance", "metric", "relative_change",
    "status", "build_duration", "test_duration", "dataname", "data_provider_type", "data_size",
    "data_download_duration", "build_number", "additional_docker_run_options",
)  # fmt: skip
# Columns the aggregator owns; a CSV column or job.json key of the same name never sets them
# (relative_change is filled only when rows are appended to a shared perf.csv: perfcsv.py).
OWNED_COLUMNS = frozenset(
    {"model", "performance", "metric", "relative_change", "status", "machine_name", "deployment_type"}
)
# job.json keys that feed a perf.csv column under another name.
JOB_KEY_ALIASES = {"docker_file": "dockerfile", "docker_sha": "image_id", "docker_image": "image"}


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, (list, tuple)):
        return ",".join(cell(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


SECRET_ASSIGNMENT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def _mask_one(match: re.Match[str]) -> str:
    return f"{match.group(1)}={MASK}" if is_secret_name(match.group(1)) else match.group(0)


def mask_secret_assignments(text: str) -> str:
    """`-e HF_TOKEN=hf_abc` -> `-e HF_TOKEN=***`: perf.csv is shared, secrets must not ride in it."""
    return SECRET_ASSIGNMENT.sub(_mask_one, text)


def gpu_columns(meta: dict[str, Any], nnodes: int) -> dict[str, str]:
    """n_gpus and gpus_per_node: job.json's, which the plan resolves (slurm_multi.plan.job_document:
    n_gpus = nnodes x gpus_per_node). An older job.json held the model's own n_gpus there, often -1
    ("all GPUs"), which is not a count: then nnodes x gpus_per_node, with madengine's 1 GPU per node
    when nothing says (its GPU resolver's default; its multi-node rows count 1 per node too)."""
    per_node = as_int(meta.get("gpus_per_node"))
    total = as_int(meta.get("n_gpus"))
    if total is not None and total >= 0:
        return {"n_gpus": str(total), "gpus_per_node": cell(meta.get("gpus_per_node"))}
    per_node = per_node if per_node is not None and per_node >= 0 else 1
    return {"n_gpus": str(nnodes * per_node), "gpus_per_node": str(per_node)}


def common_row(meta: dict[str, Any], job_id: str, nnodes: int, test_duration: str) -> dict[str, str]:
    """The per-job columns every perf.csv row shares."""
    row = {}
    for column in PERF_COLUMNS:
        value = meta.get(column)
        if not present(value) and column in JOB_KEY_ALIASES:
            value = meta.get(JOB_KEY_ALIASES[column])
        row[column] = cell(value)
    row.update(gpu_columns(meta, nnodes))
    row["args"] = mask_secret_assignments(row["args"])
    row["additional_docker_run_options"] = mask_secret_assignments(row["additional_docker_run_options"])
    row.update(nnodes=str(nnodes), machine_name=job_id, deployment_type="slurm", test_duration=test_duration)
    row.update(performance="", metric="", relative_change="", status="FAILURE")
    return row


def csv_perf_rows(
    chosen: Candidate, base: dict[str, str], model: str, ok: bool
) -> tuple[list[str], list[list[str]]]:
    """madengine's rows for a multiple-results CSV: model `<name>_<csv model>`, extras appended."""
    header = list(chosen.header)
    lowered = [name.lower() for name in header]
    index = {
        name: lowered.index(name) if name in lowered else None for name in ("model", "performance", "metric")
    }
    extras, fills, seen = [], [], set(PERF_COLUMNS)
    for position, name in enumerate(header):
        if name.lower() in ("model", "performance", "metric") or name in OWNED_COLUMNS:
            continue
        if name in PERF_COLUMNS:
            fills.append((name, position))  # e.g. a CSV `training_precision` fills madengine's column
            continue
        shown = name or f"column_{position + 1}"
        if shown in seen:
            continue  # a duplicate header name: the first one wins
        seen.add(shown)
        extras.append((shown, position))
    rows = []
    for record in chosen.records:
        row = dict(base)
        csv_model = record[index["model"]] if index["model"] is not None else ""
        row["model"] = f"{model}_{csv_model}" if csv_model else model
        performance = record[index["performance"]] if index["performance"] is not None else ""
        row["performance"] = performance if is_result(performance) else ""  # values.py: a finite number
        row["metric"] = record[index["metric"]] if index["metric"] is not None else ""
        row["status"] = "SUCCESS" if row["performance"] and ok else "FAILURE"
        for name, position in fills:
            if record[position]:
                row[name] = record[position]
        rows.append([row[c] for c in PERF_COLUMNS] + [record[p] for _, p in extras])
    return list(PERF_COLUMNS) + [name for name, _ in extras], rows


def log_perf_rows(metrics: dict[str, Any], base: dict[str, str], model: str, ok: bool) -> list[list[str]]:
    rows = []
    for metric, info in metrics.items():
        row = dict(base, model=model, metric=metric, performance=format_number(info["value"]))
        row["status"] = "SUCCESS" if ok else "FAILURE"
        rows.append([row[c] for c in PERF_COLUMNS])
    return rows
