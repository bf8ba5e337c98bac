"""What the nodes and the batch step left in a job directory: job.json (the job's facts), each
`node_<rank>/status.json` and `node.log`, judged per node; and, for job directories older than
job.json's full key set, model metadata from a madengine build_manifest.json."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurm_multi import statusfile
from slurm_multi.common import usage_error
from slurm_multi.events import STAGE_ORDER
from slurm_multi.readfile import PathLike, finite
from slurm_multi.results.logscan import ErrorHit, ErrorPattern, scan_log_file
from slurm_multi.results.shared import (
    AREA,
    is_path,
    json_error,
    rank_label,
    read_json,
    short,
    utc_iso,
)
from slurm_multi.secret_rule import redact, secret_values

# The job.json keys collect reads (the job plan writes them: slurm_multi.plan.job_document).
# `settings` and `manifest_values` (objects) and any key not listed are ignored, except one named like
# a perf.csv column (e.g. `git_commit`, `gpu_architecture`), which fills that column.
JOB_JSON_KEYS = (
    "job_id", "model_key", "model", "nnodes", "nodes", "results_csv", "image", "image_id", "args", "tags",
    "dockerfile", "base_docker", "n_gpus", "gpus_per_node", "launcher", "build_duration",
    "additional_docker_run_options", "tasks_per_node", "nproc_per_node", "world_size",
    "training_precision", "pipeline", "build_number", "gpu_architecture",
)  # fmt: skip
MAX_ERRORS_KEPT = 20  # per node, in summary.json


@dataclass
class NodeReport:
    rank: int
    node: str
    exit_code: int | None = None
    status: str = "missing"
    stages: dict[str, float] = field(default_factory=dict)
    stage_status: dict[str, str] = field(default_factory=dict)  # status.json's per stage (the timeline)
    reasons: list[str] = field(default_factory=list)
    log_errors: list[ErrorHit] = field(default_factory=list)
    dirname: str | None = None
    path: str | None = None  # JOBDIR/<dirname>, joined once: every reader of the node's files uses it
    last_progress: float | None = None  # epoch seconds, from the hang watch (results.hangs)
    node_fault: str = ""  # the rank named its own node's fault (status.json; results.midrun)
    image: dict[str, Any] | None = None  # what its image stage moved (results.imagemoves)

    @property
    def label(self) -> str:
        return rank_label(self.node, self.rank)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "exit_code": self.exit_code,
            "status": self.status,
            "stages": dict(self.stages),
            "last_progress": utc_iso(self.last_progress),
            "image": self.image,
            "reasons": list(self.reasons),
            "log_errors": [hit.to_dict() for hit in self.log_errors[:MAX_ERRORS_KEPT]],
        }


def load_job_json(jobdir: Path, warnings: list[str]) -> dict[str, Any]:
    """The job's facts as the batch step wrote them (JOB_JSON_KEYS; any other key is kept but only
    a key named like a perf.csv column is ever used). Missing or broken: {} and a warning."""
    path = jobdir / "job.json"
    if not is_path(path, "any"):
        warnings.append("job.json missing: job id, model and nnodes derived from the job directory")
        return {}
    try:
        data = read_json(path)
    except (OSError, ValueError, RecursionError) as exc:
        warnings.append(f"job.json unreadable ({json_error(exc)}); derived what could be derived")
        return {}
    if not isinstance(data, dict):
        warnings.append("job.json is not a JSON object; ignored")
        return {}
    return data


def log_scan_fields(job: dict[str, Any], warnings: list[str]) -> tuple[bool, list[str], list[str]]:
    """job.json's log_error_pattern_scan (default true), log_error_patterns and
    log_error_benign_patterns (lists of literal substrings; the plan checked them). A value of
    another shape (a job.json edited by hand) is left out with a warning."""
    scan = job.get("log_error_pattern_scan")
    if scan is None:
        scan = True
    elif not isinstance(scan, bool):
        warnings.append(f"job.json log_error_pattern_scan {scan!r} is not true or false; the scan stays on")
        scan = True
    patterns = _text_list(job, "log_error_patterns", warnings)
    return scan, patterns, _text_list(job, "log_error_benign_patterns", warnings)


def _text_list(job: dict[str, Any], key: str, warnings: list[str]) -> list[str]:
    value = job.get(key)
    if value is None:
        return []
    if not (isinstance(value, list) and all(isinstance(item, str) and item for item in value)):
        warnings.append(f"job.json {key} is not a list of non-empty strings; ignored")
        return []
    return value


def present(value: Any) -> bool:
    return value is not None and value != "" and value != []


def _manifest_key(models: dict[str, Any], key_hint: Any, model_hint: str | None) -> str | None:
    for hint in (key_hint, model_hint):
        if isinstance(hint, str) and hint in models:
            return hint
    if model_hint:
        named = [k for k, v in models.items() if isinstance(v, dict) and v.get("name") == model_hint]
        if len(named) == 1:
            return named[0]
    return next(iter(models)) if len(models) == 1 else None


def load_manifest_meta(
    path: PathLike, key_hint: Any, model_hint: str | None, warnings: list[str]
) -> dict[str, Any]:
    """Model metadata from a madengine build_manifest.json, in job.json's vocabulary: the --manifest
    fallback for job directories whose job.json predates these keys (job.json wins)."""
    try:
        data = read_json(Path(path))
    except (OSError, ValueError, RecursionError) as exc:
        raise usage_error(f"{AREA}: cannot read manifest {path}: {json_error(exc)}") from None
    models = data.get("built_models") if isinstance(data, dict) else None
    if not isinstance(models, dict):
        raise usage_error(f"{AREA}: manifest {path} has no built_models object; is it a build_manifest.json?")
    key = _manifest_key(models, key_hint, model_hint)
    if key is None:
        warnings.append(f"manifest has {len(models)} models and none matches; pass --model or set model_key")
        return {}
    model = models.get(key) if isinstance(models.get(key), dict) else {}
    images = data.get("built_images") if isinstance(data.get("built_images"), dict) else {}
    image = images.get(key) if isinstance(images.get(key), dict) else {}
    deploy = data.get("deployment_config") if isinstance(data.get("deployment_config"), dict) else {}
    slurm = deploy.get("slurm") if isinstance(deploy.get("slurm"), dict) else {}
    dist = deploy.get("distributed") if isinstance(deploy.get("distributed"), dict) else {}
    meta = {
        "model_key": key,
        "model": model.get("name"),
        "args": model.get("args"),
        "tags": model.get("tags"),
        "dockerfile": model.get("dockerfile") or image.get("dockerfile"),
        "n_gpus": model.get("n_gpus"),
        "additional_docker_run_options": model.get("additional_docker_run_options"),
        "results_csv": model.get("multiple_results"),
        "image": image.get("docker_image"),
        "base_docker": image.get("base_docker"),
        "build_duration": image.get("build_duration"),
        "gpus_per_node": slurm.get("gpus_per_node"),
        "launcher": dist.get("launcher"),
        "nnodes": dist.get("nnodes") or slurm.get("nodes"),
    }
    return {k: v for k, v in meta.items() if present(v)}


def merge_meta(job: dict[str, Any], model: str | None, manifest: dict[str, Any]) -> dict[str, Any]:
    """job.json wins, then --model, then the manifest (they only fill what job.json lacks).

    --model may name the manifest entry (its key) rather than the model: then the entry's name counts.
    """
    merged = dict(manifest)
    if model and manifest.get("model_key") != model:
        merged["model"] = model
    merged.update({k: v for k, v in job.items() if present(v)})
    return merged


def job_id_from_dir(jobdir: Path) -> str:
    """`slurm-multi-4711` -> `4711`; a name without trailing digits is used as it is."""
    name = jobdir.resolve().name
    match = re.search(r"(\d+)$", name)
    return match.group(1) if match else name


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,18}\s*", value):
        return int(value)
    return None


def _as_seconds(value: Any) -> float | None:
    """A stage's seconds (a JSON number, or a number in a string), rounded; None for anything else."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    seconds = finite(value)
    return round(seconds, 3) if seconds is not None else None


def node_dirs(jobdir: Path) -> dict[int, str]:
    """rank -> directory name for every `node_<rank>` entry in the job directory."""
    found: dict[int, str] = {}
    for entry in sorted(os.listdir(jobdir)):
        match = re.fullmatch(r"node_(\d{1,9})", entry)
        if match:
            found.setdefault(int(match.group(1)), entry)
    return found


def stage_order(stages: dict[str, Any]) -> list[str]:
    known = [name for name in STAGE_ORDER if name in stages]
    return known + sorted(name for name in stages if name not in STAGE_ORDER)


def _failed_stage(stages: dict[str, Any]) -> str | None:
    for name in stage_order(stages):
        info = stages[name]
        if isinstance(info, dict) and info.get(statusfile.STAGE_STATUS) not in (None, "ok", "skipped"):
            return name
    return None


def _status_reason(status: str, exit_code: int | None, stages: dict[str, Any], note: str) -> str:
    stage = _failed_stage(stages)
    where = f" in stage {stage}" if stage else ""
    if status == "timeout":
        text = f"timed out{where}"
    elif status == "aborted":
        text = f"aborted{where}"
    elif exit_code not in (None, 0):
        text = (
            f"container exited {exit_code}"
            if stage in (None, "run")
            else f"stage {stage} failed (exit {exit_code})"
        )
    elif status != "ok":
        text = f"status {status!r}{where}"
    else:
        text = f"exit code {exit_code} although status is ok"
    return f"{text}: {short(note, 200)}" if note else text


def read_node(
    jobdir: Path,
    rank: int,
    dirname: str | None,
    names: Sequence[Any],
    patterns: Sequence[ErrorPattern],
    known_secrets: Sequence[str] | None = None,
    benign: Sequence[str] = (),
) -> NodeReport:
    """One node's status.json and node.log, judged; never raises on what the node left behind.

    known_secrets: the values to mask in log excerpts (default: secret_values(os.environ)).
    benign: literal texts that keep a node.log line from counting (log_error_benign_patterns).
    """
    fallback = names[rank] if rank < len(names) and isinstance(names[rank], str) and names[rank] else None
    report = NodeReport(rank, fallback or f"node_{rank}", dirname=dirname)
    if dirname is None:
        report.reasons.append(f"{report.label}: no status.json (task never staged)")
        return report
    node_dir = report.path = os.path.join(jobdir, dirname)
    status = statusfile.read_status(f"{node_dir}/{statusfile.STATUS_FILE}")  # never raises
    if status is None:
        report.reasons.append(f"{report.label}: no status.json (task never staged)")
        if not is_path(node_dir, "dir"):
            return report
    elif not status.readable:
        report.status = "unreadable"
        report.reasons.append(f"{report.label}: status.json unreadable: {status.error}")
    else:
        _judge_status(status, report)
    try:  # read, not stat'ed first: the read says whether it is there
        hits = scan_log_file(f"{node_dir}/node.log", patterns, benign=benign)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass  # no node.log: nothing to scan (the status says how the node ended)
    except OSError as exc:
        report.reasons.append(f"{report.label}: node.log unreadable: {exc.strerror or exc}")
    else:
        report.log_errors = _redacted(hits, known_secrets)
        if report.log_errors:
            first, count = report.log_errors[0], len(report.log_errors)
            more = f"; +{count - 1} more" if count > 1 else ""
            where = f"error pattern {first.pattern!r} at node.log:{first.line}"
            report.reasons.append(f"{report.label}: {where} ({first.text}{more})")
    return report


def _redacted(hits: list[ErrorHit], known: Sequence[str] | None = None) -> list[ErrorHit]:
    """Log excerpts go to summary.json and stderr: mask secret values from this environment."""
    if not hits:
        return hits
    if known is None:
        known = secret_values(os.environ)
    return [ErrorHit(h.line, h.pattern, redact(h.text, known)) for h in hits] if known else hits


def _judge_status(status: statusfile.Status, report: NodeReport) -> None:
    if isinstance(status.node, str) and status.node:
        report.node = status.node
    stages = status.stages
    for name in stage_order(stages):
        info = stages[name]
        seconds = _as_seconds(info.get(statusfile.SECONDS)) if isinstance(info, dict) else None
        if seconds is not None:
            report.stages[str(name)] = seconds
            if isinstance(info.get(statusfile.STAGE_STATUS), str):
                report.stage_status[str(name)] = short(info[statusfile.STAGE_STATUS], 40)
    report.exit_code = as_int(status.exit_code)
    report.status = str(status.status or "unknown")
    fault = status.get(statusfile.NODE_FAULT)
    report.node_fault = short(fault, 300) if isinstance(fault, str) else ""
    if report.status != "ok" or report.exit_code not in (None, 0):
        note = status.reason if isinstance(status.reason, str) else ""
        reason = _status_reason(report.status, report.exit_code, stages, note)
        report.reasons.append(f"{report.label}: {reason}")
