"""Judge a whole job directory into one Summary: node exits and statuses, error patterns in the
logs, a hang (which rank stopped first), the chosen per-node CSV (else the `performance: <value>
<metric>` log lines), the verdict, the stragglers and the timeline (both information only).

The facts about the job come from JOBDIR/job.json, which the batch step writes; a madengine
build_manifest.json (`--manifest`) only fills what an old job.json lacks.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_multi.common import HelperError, usage_error
from slurm_multi.plan import MAX_NODES  # a larger nnodes is a typo: derived from the node dirs
from slurm_multi.readfile import PathLike
from slurm_multi.results.hangs import Hang, hang_reasons, read_hangs
from slurm_multi.results.jobdir import (
    JOB_JSON_KEYS,
    NodeReport,
    as_int,
    job_id_from_dir,
    load_job_json,
    load_manifest_meta,
    log_scan_fields,
    merge_meta,
    node_dirs,
    present,
    read_node,
)
from slurm_multi.results.logmetrics import HF_MARK, HF_METRIC, combine_metric, read_perf_log
from slurm_multi.results.logscan import DEFAULT_ERROR_PATTERNS, ErrorPattern, model_patterns
from slurm_multi.results.pick import Candidate, choose, no_candidate_message, score_present
from slurm_multi.results.profile import check_profile, check_tool_profile
from slurm_multi.results.rows import PERF_COLUMNS, cell, common_row, csv_perf_rows, log_perf_rows
from slurm_multi.results.shared import AREA, is_path, os_error
from slurm_multi.results.stragglers import find_stragglers
from slurm_multi.results.summary import Summary, write_outputs
from slurm_multi.results.timeline import build_timeline
from slurm_multi.results.timelinedraw import write_timeline
from slurm_multi.results.values import format_number
from slurm_multi.results.worldsize import check_world
from slurm_multi.secret_rule import reason_line, secret_values, secrets_held
from slurm_multi.statusfile import read_status, status_path


def collect(
    jobdir: PathLike,
    manifest: PathLike | None = None,
    model: str | None = None,
    error_patterns: Sequence[ErrorPattern] | None = None,
    write: bool = True,
    picture: bool = True,
) -> Summary:
    """Judge a job directory and (by default) write JOBDIR/perf.csv, JOBDIR/summary.json and the
    timeline (timeline.json, timeline.txt, and timeline.png with matplotlib unless not `picture`).

    manifest: a build_manifest.json for job directories whose job.json lacks the model's metadata
    (written before job.json had it); job.json wins wherever it has a value.

    error_patterns: compile_patterns' list (default: the built-in patterns); the model's
    log_error_pattern_scan, log_error_patterns and log_error_benign_patterns in job.json apply on top
    (logscan.model_patterns).

    The cyclic garbage collector is paused meanwhile: a 1,000-node job makes ~200,000 objects that
    form no cycle (reference counting frees them), and every young-generation pass of it would walk
    them again (~10% of collect's time). Re-enabled on the way out, as the caller had it.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        with secrets_held():  # every excerpt and reason masked with the values read once
            return _collect(jobdir, manifest, model, error_patterns, write, picture)
    finally:
        if paused:
            gc.enable()


def _collect(
    jobdir: PathLike,
    manifest: PathLike | None,
    model: str | None,
    error_patterns: Sequence[ErrorPattern] | None,
    write: bool,
    picture: bool,
) -> Summary:
    root = Path(jobdir)
    if not root.is_dir():
        raise usage_error(f"{AREA}: job directory {jobdir} does not exist; pass the directory the job wrote")
    warnings: list[str] = []
    job_json = load_job_json(root, warnings)
    # The model's manifest fields (job.json) take the default patterns' place; --error-pattern stays.
    scan, literals, benign = log_scan_fields(job_json, warnings)
    given = list(error_patterns) if error_patterns is not None else list(DEFAULT_ERROR_PATTERNS)
    patterns = model_patterns(given, scan, literals)
    job = known_job_facts(job_json)
    manifest_meta = load_manifest_meta(manifest, job.get("model_key"), model, warnings) if manifest else {}
    meta = merge_meta(job, model, manifest_meta)
    job_id = cell(meta.get("job_id")) or job_id_from_dir(root)
    model_name = cell(meta.get("model")) or cell(meta.get("model_key")) or "unknown_model"
    try:
        found = node_dirs(root)
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot list {jobdir}: {os_error(exc)}") from None
    nnodes = _job_nnodes(meta, found)
    # Several tasks per node (bare metal, pyxis): every task is a rank with its own node_<rank>/.
    per_node = tasks_per_node(meta.get("tasks_per_node"), nnodes, warnings)
    expected = nnodes * per_node
    names = meta.get("nodes") if isinstance(meta.get("nodes"), list) else []
    if per_node > 1 and names:
        names = [name for name in names for _ in range(per_node)]
    ranks = sorted(set(range(expected)) | set(found))
    extra = [found[rank] for rank in ranks if rank >= expected and rank in found]
    if extra and present(meta.get("nnodes")):
        warnings.append(f"{', '.join(extra)} beyond {expected} ranks: judged like the others")
    known = secret_values(os.environ)  # once per job, not once per node
    nodes = [read_node(root, rank, found.get(rank), names, patterns, known, benign) for rank in ranks]
    hang = read_hangs(root, nodes, warnings)
    if not present(meta.get("image_id")):
        meta["image_id"] = rank0_image_id(root, found.get(0))
    results_csv = Path(cell(meta.get("results_csv"))).name or None
    summary = judge(root, meta, job_id, model_name, nnodes, results_csv, nodes, warnings, hang)
    # The profile is part of the verdict: the rows stay (the performance was measured), the job fails.
    summary.profile = check_profile(root, job_json, nodes) or check_tool_profile(root, job_json, nodes)
    if summary.profile is not None and summary.profile.reasons():
        summary.reasons.extend(summary.profile.reasons())
        summary.verdict = "FAILURE"
    summary.bad_nodes, summary.attempts = bad_nodes_and_attempts(
        root, job_json, warnings, bool(summary.reasons), nodes
    )
    summary.reasons[:0] = [
        f"bad node {b['node']} (node {b['rank']}): {b['reason']}" for b in summary.bad_nodes
    ]
    if summary.bad_nodes:
        summary.verdict = "FAILURE"
    summary.timeline = build_timeline(root, nodes, summary.stragglers, warnings, job_json.get("started"))
    if write:
        write_outputs(root, summary)
        title = f"job {job_id} ({model_name}, {nnodes} node{'s' if nnodes != 1 else ''})"
        summary.timeline.picture = write_timeline(root, summary.timeline, title, picture)
    return summary


def bad_nodes_and_attempts(
    root: Path,
    job_json: dict[str, Any],
    warnings: list[str],
    failed: bool,
    nodes: Sequence[NodeReport] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The bad nodes (the fitness stage's, judged as the batch step judges them: slurm_multi.fitness;
    then the nodes lost or failed during the run: results.midrun), each once, and a requeued job's
    earlier attempts (slurm_multi.attempts). A job that did not fail has no bad node (a node that
    finds one fails its stage): its verdict does not pay for importing the judges."""
    from slurm_multi import attempts

    earlier, unreadable = attempts.earlier(str(root))
    warnings.extend(unreadable)
    if not failed:
        return [], earlier
    settings = job_json.get("settings") if isinstance(job_json.get("settings"), dict) else {}
    listed = job_json.get("nodes")
    hosts = [str(h) for h in listed] if isinstance(listed, list) else []
    bad: list[dict[str, Any]] = []
    if settings.get("SM_FITNESS") != "off" and hosts:
        from slurm_multi import fitness

        floor = str(settings.get("SM_FITNESS_MIN_RATE") or "0")
        found = fitness.judge_job(str(root), hosts, min_rate=int(floor) * 1e6 if floor.isdigit() else 0.0)
        # (each reason masked before it is stored: the files it came from may be older than the rule)
        bad = [
            {
                "rank": b["rank"],
                "node": b["host"],
                "cause": "fitness",
                "reason": reason_line(b["reason"], 800),
                "evidence": b["evidence"],
            }
            for b in found
        ]
    from slurm_multi.results.midrun import judge_run

    named = {b["node"] for b in bad}
    per_node = tasks_per_node(job_json.get("tasks_per_node"), max(len(hosts), 1))
    bad += [b for b in judge_run(root, nodes, hosts, per_node) if b["node"] not in named]
    return bad, earlier


def known_job_facts(job: dict[str, Any]) -> dict[str, Any]:
    """job.json without the keys collect does not read (`settings`, `manifest_values`, whatever a
    later version adds): only JOB_JSON_KEYS and keys named like a perf.csv column count."""
    return {key: value for key, value in job.items() if key in JOB_JSON_KEYS or key in PERF_COLUMNS}


def tasks_per_node(value: Any, nnodes: int, warnings: list[str] | None = None) -> int:
    """job.json's tasks_per_node when it is a count of ranks per node: at least 1, and at most
    MAX_NODES ranks in all with `nnodes` nodes (a larger one is a typo, not a job: 1e9 would be a
    node name per rank, gigabytes); 1 otherwise, with a warning for a number out of that range."""
    number = as_int(value)
    if number is None:
        return 1
    if 0 < number and nnodes * number <= MAX_NODES:
        return number
    if warnings is not None:
        warnings.append(
            f"job.json tasks_per_node {str(value)[:40]} is not a count of tasks per node "
            f"(at most {MAX_NODES} ranks in all); taken as 1"
        )
    return 1


def _job_nnodes(meta: dict[str, Any], found: dict[int, str]) -> int:
    for value in (meta.get("nnodes"), len(meta["nodes"]) if isinstance(meta.get("nodes"), list) else None):
        number = as_int(value)
        if number is not None and 0 < number <= MAX_NODES:
            return number
    return max(found) + 1 if found else 0


def rank0_image_id(root: Path, node_dir: str | None) -> str:
    """The image every node ran (rank 0's, sent in GO), from node_0/status.json if it says."""
    if node_dir is None:
        return ""
    status = read_status(status_path(os.path.join(root, node_dir)))
    return cell(status.image_id) if status is not None and status.readable else ""


def _candidates(nodes: Sequence[NodeReport], results_csv: str | None) -> list[Candidate]:
    if not results_csv:
        return []
    candidates = []
    for node in nodes:  # rank order: a tie goes to the higher rank
        if node.path:
            path = f"{node.path}/{results_csv}"
            found = score_present(path, f"{node.dirname}/{results_csv}")  # = pick_best's scores
            if found is not None:
                candidates.append(found)
    return candidates


def judge(
    root: Path,
    meta: dict[str, Any],
    job_id: str,
    model_name: str,
    nnodes: int,
    results_csv: str | None,
    nodes: list[NodeReport],
    warnings: list[str],
    hang: Hang | None = None,
) -> Summary:
    """Failures first (a hang, exits, missing nodes, error patterns), then the aggregate (CSV, else
    log lines).

    A hung rank's own reasons (`container exited 137` when the time limit killed it) are not repeated:
    the hang lines name it, and say more. They stay in its node entry.
    """
    hung = hang.ranks if hang else set()
    reasons = hang_reasons(hang, nodes) if hang else []
    reasons += [reason for node in nodes if node.rank not in hung for reason in node.reasons]
    # A multi-node launcher's one world: a node that ran alone fails the job (results/worldsize.py).
    expected_world = as_int(meta.get("world_size"))
    world = (
        check_world(root, nodes, expected_world, as_int(meta.get("nproc_per_node")))
        if expected_world is not None and expected_world > 1
        else None
    )
    if world is not None:
        reasons += world.short
    if not nodes:
        reasons.append("no node_<rank> directories in the job directory; did any task stage?")
    nodes_ok = not reasons
    candidates = _candidates(nodes, results_csv)
    warnings.extend(warning for candidate in candidates for warning in candidate.warnings)
    chosen = choose(candidates)
    run_seconds = [n.stages["run"] for n in nodes if "run" in n.stages]
    base = common_row(meta, job_id, nnodes, format_number(max(run_seconds)) if run_seconds else "")
    header, rows, log_metrics, source = list(PERF_COLUMNS), [], {}, "none"
    if chosen is not None:
        source = "csv"
        header, rows = csv_perf_rows(chosen, base, model_name, nodes_ok)
    elif candidates:
        reasons.append(no_candidate_message(candidates))
    else:
        log_metrics = collect_log_metrics(root, nodes)
        if log_metrics:
            source = "log"
            rows = log_perf_rows(log_metrics, base, model_name, nodes_ok)
        else:
            wanted = (
                f"no result CSV ({results_csv}) in any node" if results_csv else "no result CSV name known"
            )
            reasons.append(f"{wanted} and no 'performance: <value> <metric>' line in any node.log")
    if not rows:
        rows = [[dict(base, model=model_name)[c] for c in PERF_COLUMNS]]
    status = PERF_COLUMNS.index("status")
    verdict = "SUCCESS" if not reasons and any(r[status] == "SUCCESS" for r in rows) else "FAILURE"
    return Summary(
        verdict, job_id, model_name, nnodes, results_csv, chosen.path if chosen else None, candidates,
        source, log_metrics, nodes, reasons, warnings, header, rows, hang, find_stragglers(nodes),
        world=world,
    )  # fmt: skip


def collect_log_metrics(jobdir: Path, nodes: Sequence[NodeReport]) -> dict[str, Any]:
    """Per metric: the combined value, the rule and each node's last value (nodes in rank order).

    No node printed a performance line: madengine's HuggingFace fallback, each node's first
    `train_samples_per_second`, as the metric samples_per_second (results/logmetrics.py)."""
    per_metric: dict[str, list[dict[str, Any]]] = {}
    hf_values: list[dict[str, Any]] = []
    for node in nodes:
        log = jobdir / node.dirname / "node.log" if node.dirname else None
        if log is None or not is_path(log, "file"):
            continue
        try:
            with open(log, encoding="utf-8", errors="replace", newline="") as handle:
                lines, hf_value = read_perf_log(handle)
        except OSError:
            continue
        if hf_value is not None:
            hf_values.append({"rank": node.rank, "node": node.node, "value": hf_value})
        last: dict[str, float] = {}  # in order of first appearance
        for line in lines:
            last[line.metric] = line.value  # a node that prints a metric again: its last value counts
        for metric in last:
            per_metric.setdefault(metric, []).append(
                {"rank": node.rank, "node": node.node, "value": last[metric]}
            )
    source = ""
    if not per_metric and hf_values:
        per_metric[HF_METRIC] = hf_values
        source = f"; from {HF_MARK}"
    combined = {}
    for metric, values in per_metric.items():
        value, rule = combine_metric(metric, [v["value"] for v in values])
        combined[metric] = {"rule": rule + source, "value": round(value, 6), "values": values}
    return combined
