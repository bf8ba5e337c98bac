"""The batch step's one look at the settings and the manifest: validate, place the job dir, write job.json.

`slurm-multi job plan` runs once per job, before any srun (and once for `--dry-run`). A manifest
that is not JSON, lacks a section, names no such model (or an ambiguous one) or has a value of the
wrong type fails here with one line naming the file, the key and what was expected, exit 2, so no
node ever starts on it. On success it prints bash (`declare -g …`) for the batch step to source
AFTER checking the exit status, and writes job.json: every resolved setting and the manifest's
resolved values, secrets masked. Results, the nodes' re-runs (`sm-node --from-job`) and people read
job.json; nobody else re-derives what it holds.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_multi import shell
from slurm_multi.common import HelperError, talk, usage_error
from slurm_multi.context import (
    RunContext,
    manifest_values,
    masked_settings,
    model_dir_name,
    resolve,
    safe_component,
)
from slurm_multi.secret_rule import MASK, is_secret_name, redact, secret_values
from slurm_multi.settings import DIGITS, tasks_per_node

AREA = "job"
# The largest node count a plan takes: the biggest machines have ~10,000 nodes; a larger -N is a
# typo, and a plan of 10**20 nodes filled memory for as long as it was let run.
MAX_NODES = 100_000


def job_dir(out: str, submit_dir: str, model: str, job_id: str) -> str:
    """<out>/<model>/<job id>, always inside <out> (checked after resolving symlinks and '..')."""
    base = out if os.path.isabs(out) else os.path.join(submit_dir, out)
    base = os.path.normpath(base)
    path = os.path.join(base, model, safe_component(job_id, "job"))
    real_base = os.path.realpath(base)
    real = os.path.realpath(path)
    if os.path.commonpath([real_base, real]) != real_base or real == real_base:
        raise usage_error(f"{AREA}: the job dir {path} would not be inside --out {base}; rename the model")
    return path


def make_job_dir(directory: str) -> None:
    """The job dir, ours alone: made writable by nobody else whatever the umask (0755 at most), and
    refused when it is there already and another user owns it, can write it, or it is a link: the
    verdict believes the files in it (fitness.json, status.json, hang-cause.json), and its name is
    as predictable as the next job ID."""
    try:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass
        info = os.lstat(directory)
    except OSError as exc:
        raise HelperError(f"{AREA}: cannot create the job dir {directory}: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        why = "is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a directory"
    elif info.st_uid != os.geteuid():
        why = f"belongs to {_owner(info.st_uid)}, not to {_owner(os.geteuid())}"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"is writable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    else:
        return
    raise HelperError(
        f"{AREA}: the job dir {directory} {why}: another user could put files there that the verdict "
        "believes; remove it (or chmod go-w it, if it is yours) and submit again"
    )


def _owner(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


EARLIER_RUN = "run_"  # <jobdir>/run_<k>/: an earlier run of the batch script in the same allocation
KEPT_AT_TOP = ("attempt_", EARLIER_RUN)  # a requeue's attempts (job.sh) and the earlier runs stay


def set_aside_earlier_run(directory: str) -> str:
    """A job dir that holds a job.json already was left by an earlier run of the batch script in the
    same allocation (`salloc`, then `bash sbatch/multi.sbatch` twice): its files move to
    <jobdir>/run_<k>/ (k = 1, 2, ... in run order), so this run starts clean (events.log is appended
    to; a second run's timeline would hold both) and nothing of the earlier one is lost. A requeued
    attempt finds no job.json: the batch step moved it to attempt_<N>/ when it requeued. Returns
    `run_<k>`, or "" when there was nothing to move."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return ""
    if "job.json" not in entries:
        return ""
    suffixes = [e[len(EARLIER_RUN) :] for e in entries if e.startswith(EARLIER_RUN)]
    taken = [int(s) for s in suffixes if s.isdigit()]
    name = f"{EARLIER_RUN}{max(taken, default=0) + 1}"
    target = os.path.join(directory, name)
    try:
        os.mkdir(target)
        for entry in entries:
            if not entry.startswith(KEPT_AT_TOP):
                os.rename(os.path.join(directory, entry), os.path.join(target, entry))
    except OSError as exc:
        raise HelperError(
            f"{AREA}: the job dir {directory} holds an earlier run's files and they cannot be moved "
            f"to {name}/: {exc.strerror}"
        ) from None
    return name


def job_document(
    ctx: RunContext,
    env: Mapping[str, str],
    job_id: str,
    nodes: Sequence[str],
    nnodes: int,
    command: Sequence[str],
) -> dict[str, Any]:
    """job.json: the old top-level keys (results and people read them) plus every resolved setting.

    The perf.csv columns madengine fills from its run: n_gpus = nnodes x gpus_per_node, the GPUs per
    node as the launcher's process count follows them (the manifest's slurm.gpus_per_node, its
    docker_gpus, Slurm's GPUs on this node: madengine.planned_gpus), else the model's n_gpus when it
    is a count (0: a CPU run; -1, all of them, is MAD_SYSTEM_NGPUS when given), else madengine's
    default of 1 (a node's detected GPUs do not reach the job dir); training_precision (the model's),
    pipeline and build_number (this environment's `pipeline` and BUILD_NUMBER, else "0", as madengine
    reads them), gpu_architecture (MAD_SYSTEM_GPU_ARCHITECTURE from this environment, else the
    manifest's docker_env_vars; collect reads this key, so a node's detected one can be written here).
    And the model's log error scan (manifest.log_scan_values), which collect applies."""
    from slurm_multi.madengine import planned_gpus
    from slurm_multi.manifest import log_scan_values

    secrets = secret_values(env) + ctx.secret_values(env)
    v = ctx.values

    def shown(name: str) -> str:
        return MASK if is_secret_name(name) else redact(v.get(name, ""), secrets)

    def given(name: str) -> str:  # a MAD_* value the job's environment, else the manifest, gives
        return redact(env.get(name) or ctx.docker_env.get(name) or "", secrets)

    gpus_per_node = planned_gpus(v, env)
    if gpus_per_node <= 0:
        asked = v.get("SM_N_GPUS", "").strip()
        asked = given("MAD_SYSTEM_NGPUS").strip() if asked == "-1" else asked
        gpus_per_node = as_number(asked) if as_number(asked) is not None else 1
    scan = log_scan_values(v)
    return {
        "job_id": job_id,
        "model_key": ctx.model_key,
        "model": model_dir_name(ctx),
        "nnodes": nnodes,
        "nodes": list(nodes),
        "tasks_per_node": tasks_per_node(v),
        "results_csv": shown("SM_RESULTS_CSV"),
        "image": shown("SM_IMAGE"),
        "args": shown("SM_MODEL_ARGS"),
        "tags": shown("SM_MODEL_TAGS"),
        "dockerfile": shown("SM_DOCKERFILE"),
        "base_docker": shown("SM_BASE_DOCKER"),
        "n_gpus": nnodes * gpus_per_node,
        "gpus_per_node": gpus_per_node,
        "launcher": shown("SM_LAUNCHER"),
        "nproc_per_node": as_number(v.get("SM_NPROC_PER_NODE")),
        "world_size": world_size(ctx, nnodes),
        "build_duration": shown("SM_BUILD_DURATION"),
        "additional_docker_run_options": redact(" ".join(ctx.docker_opts), secrets),
        "training_precision": shown("SM_TRAINING_PRECISION"),
        "pipeline": redact(env.get("pipeline", ""), secrets),
        "build_number": redact(env.get("BUILD_NUMBER") or "0", secrets),
        "gpu_architecture": given("MAD_SYSTEM_GPU_ARCHITECTURE"),
        "log_error_pattern_scan": scan["log_error_pattern_scan"],
        "log_error_patterns": [redact(text, secrets) for text in scan["log_error_patterns"]],
        "log_error_benign_patterns": [redact(text, secrets) for text in scan["log_error_benign_patterns"]],
        "manifest": ctx.manifest or "",
        "profile": v.get("SM_PROFILE", ""),
        "runtime": v.get("SM_RUNTIME", ""),
        "command": [redact(word, secrets) for word in command],
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {k: redact(s, secrets) for k, s in masked_settings(ctx).items()},
        "manifest_values": _redact_tree(manifest_values(ctx), secrets),
        **(ctx.mad_run.job_facts() if ctx.mad_run else {}),
    }


def resolve_job_numbers(ctx: RunContext, env: Mapping[str, str], nnodes: int) -> dict[str, str]:
    """The settings the plan resolves with the manifest, for the batch step to export to every node
    (one resolution: the nodes read these, they do not re-derive them): --timeout, --master-port and,
    with a manifest, --launcher and --nproc-per-node. Says what the manifest asks that the job
    cannot honour, and which of its fields do nothing here."""
    from slurm_multi import madengine as mad

    resolved = {name: ctx.values[name] for name in ("SM_TIMEOUT", "SM_MASTER_PORT")}
    if not ctx.manifest:
        return resolved
    dist = mad.job_distributed(ctx.values, ctx.settings, env, nnodes)
    if dist.launcher in mad.ONE_WORLD and tasks_per_node(ctx.values) > 1:
        raise usage_error(
            f"{AREA}: launcher {dist.launcher} starts {dist.nproc} processes per node itself; "
            "run one task per "
            f"node (--ntasks-per-node 1), not {ctx.get('SM_NTASKS_PER_NODE')}"
        )
    warning = mad.node_count_warning(ctx.values, nnodes)
    if warning:
        talk("manifest", warning)
    if ctx.ignored:
        talk("manifest", f"not used by slurm-multi (ignored): {', '.join(ctx.ignored)}")
    plan_mad_run(ctx, nnodes)
    resolved.update(SM_LAUNCHER=dist.launcher, SM_NPROC_PER_NODE=str(dist.nproc))
    ctx.values.update(resolved)
    if not dist.source["launcher"].startswith(("option", "manifest")):
        # Said where the settings are shown (the dry run): madengine's default, not the manifest's.
        ctx.sources["SM_LAUNCHER"] = dist.source["launcher"]
    return resolved


def plan_mad_run(ctx: RunContext, nnodes: int) -> None:
    """What the manifest asks around its script, checked before any node starts: the tools (in
    tools.json), the pre/post scripts (in the checkout), the data (a provider we can serve), and
    a script that is not in the model dir (then it must be in the image: said now, failed clearly
    on the node)."""
    from slurm_multi import madrun

    if ctx.script is None:
        return
    ctx.mad_run = madrun.plan_run(ctx.mad_parts, ctx.checkout, ctx.values, nnodes)
    for note in ctx.mad_run.notes:
        talk("manifest", note)
    if ctx.script.host_dir is None:
        talk("manifest", f"warning: model script {ctx.script.shown} is not in the model dir "
                         f"{ctx.checkout}: it must be in the image's working directory, else every node "
                         "fails; give --model-dir DIR, the checkout that holds it")  # fmt: skip


def as_number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def world_size(ctx: RunContext, nnodes: int) -> int | None:
    """The world every process of a multi-node job should be in, for collect's check that no node
    ran alone, whatever the launcher: a manifest's nodes x nproc_per_node (`none` too: its runner
    starts nproc_per_node processes per node, and a multi-node job of them must still be one world),
    the serving launchers' and a plain command's ranks (nodes x tasks per node); None on one node."""
    from slurm_multi.madengine import SERVING

    if nnodes < 2:
        return None
    nproc = as_number(ctx.get("SM_NPROC_PER_NODE"))
    if ctx.manifest and ctx.get("SM_LAUNCHER") not in SERVING and nproc is not None:
        return nnodes * nproc
    return nnodes * tasks_per_node(ctx.values)


def _redact_tree(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [_redact_tree(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: _redact_tree(item, secrets) for key, item in value.items()}
    return value


# ---- the plan (`slurm-multi job plan`, slurm_multi.job) ----------------------------------------


def plan(
    batch_args: bool,
    emit: str | None,
    job_id: str | None,
    nnodes: int | None,
    node_list: str,
    submit_dir: str | None,
    write: bool | None,
    args: Sequence[str],
) -> None:
    """The plan: parse, resolve, validate, write job.json (when the job runs), emit the bash."""
    from slurm_multi import settings as table

    env = dict(os.environ)
    try:
        parsed = table.parse_argv(args) if batch_args else table.Parsed(command=list(args))
    except table.SettingsError as exc:
        raise usage_error(f"{exc}; --help lists every option") from None
    if parsed.help:
        sys.stdout.write(table.usage())
        sys.stdout.flush()
        _emit(emit, shell.render("slurm-multi job plan", scalars={"PLAN_ACTION": "help"}))
        return
    dry = parsed.dry_run or env.get("SM_DRY_RUN") == "1"
    given_nnodes = nnodes
    nnodes = _node_count(parsed, env, dry, nnodes)
    _check_node_names(node_list, nnodes, given_nnodes is not None, parsed, env, dry)
    resolved = table.resolve(env, parsed.given, parsed.typed)
    try:
        table.validate(resolved, has_command=bool(parsed.command))
    except table.SettingsError as exc:
        raise usage_error(str(exc)) from None
    for warning in table.unused(resolved, has_command=bool(parsed.command)):
        talk("settings", warning)
    job_id = job_id or env.get("SLURM_JOB_ID") or ("DRYRUN" if dry else "")
    if not job_id:
        raise usage_error(
            "not inside a Slurm job: submit with 'sbatch -N 2 sbatch/multi.sbatch ...' "
            "(or add --dry-run to see the plan)"
        )
    if resolved.values["SM_MANIFEST"] and not dry:
        resolved.values["SM_MANIFEST"] = os.path.realpath(resolved.values["SM_MANIFEST"])
    env.update({name: value for name, value in resolved.values.items() if value})
    command = parsed.command
    ctx = resolve(env, command)
    for warning in ctx.warnings:
        talk("manifest", warning)
    runtime = ctx.get("SM_RUNTIME")
    if not ctx.get("SM_IMAGE") and runtime != "none":
        where = f" (manifest {ctx.manifest}, model {ctx.model_key}, has no built_images docker_image)"
        raise usage_error(f"{AREA}: no image to run: give --image IMAGE{where if ctx.manifest else ''}")
    if runtime == "none" and not ctx.workload:
        raise usage_error(f"{AREA}: --runtime none needs a command: give -- CMD or a manifest with scripts")
    numbers = resolve_job_numbers(ctx, env, nnodes)
    model = model_dir_name(ctx)
    directory = job_dir(ctx.get("SM_OUT"), submit_dir or os.getcwd(), model, job_id)
    nodes = node_list.split() or [f"node_{r}" for r in range(nnodes)]
    earlier = ""
    if write if write is not None else (batch_args and not dry):
        make_job_dir(directory)
        earlier = set_aside_earlier_run(directory)
        shell.write_json(
            os.path.join(directory, "job.json"), job_document(ctx, env, job_id, nodes, nnodes, command)
        )
    quarantined, quarantine_error = _quarantine(
        resolved.values.get("SM_STATE_DIR", ""), node_list, batch_args, dry
    )
    exports = {name: value for name, value in resolved.values.items() if value}
    exports.update(numbers)
    exports["SM_SETTINGS_RESOLVED"] = "1"
    if dry:
        exports["SM_DRY_RUN"] = "1"
    text = shell.render(
        "slurm-multi job plan",
        exports=exports,
        scalars={
            "PLAN_ACTION": "dry-run" if dry else "run",
            "PLAN_NNODES": str(nnodes),
            "PLAN_NNODES_FROM": _node_count_source(parsed, env, dry, given_nnodes),
            "SM_JOBDIR": directory,
            "JOB_MODEL": model,
            "JOB_MODEL_KEY": ctx.model_key,
            "JOB_IMAGE": ctx.get("SM_IMAGE"),
            "JOB_IMAGE_LAYERS": " ".join(_image_layers(ctx, env, nnodes, dry)),
            "JOB_RESULTS_CSV": ctx.get("SM_RESULTS_CSV"),
            "PLAN_QUARANTINE_ERROR": quarantine_error,
            "PLAN_EARLIER_RUN": earlier,
        },
        arrays={
            "SM_CMD": command,
            "PLAN_SETTINGS_SHOWN": settings_shown(resolved, numbers, ctx.sources),
            "PLAN_QUARANTINED": quarantined,
        },
    )
    _emit(emit, text)


def _image_layers(ctx: RunContext, env: Mapping[str, str], nnodes: int, dry: bool) -> list[str]:
    """The job's image's layers (diff IDs) as this node's docker engine holds it now: the batch step
    runs on rank 0's node, so this is rank 0's chain unless rank 0 rebuilds it. Workers tell rank 0
    how much of it they hold (slurm_multi.layers); [] when there is nothing to tell (a dry run, one
    node, another runtime, --image-layers off, no such image here yet)."""
    if dry or nnodes < 2 or ctx.get("SM_RUNTIME") != "docker" or env.get("SM_IMAGE_LAYERS") == "off":
        return []
    from slurm_multi.layers.engine import image_layers

    return image_layers(env, ctx.get("SM_IMAGE")).diff_ids


def _quarantine(state_dir: str, node_list: str, batch_args: bool, dry: bool) -> tuple[list[str], str]:
    """The allocation's nodes in the shared quarantine (`node TAB reason TAB job TAB until` each,
    what `quarantine check` prints), read here rather than by one more helper before srun; or why
    the quarantine cannot be read. Only for a job that runs (the batch step acts on it, job.sh)."""
    if not (state_dir and node_list.split() and batch_args and not dry):
        return [], ""
    from slurm_multi import quarantine

    try:
        found = quarantine.in_allocation(state_dir, node_list.split())
    except quarantine.QuarantineError as exc:
        return [], str(exc)
    return [entry.check_line() for entry in found], ""


def _emit(path: str | None, text: str) -> None:
    if path is None:
        sys.stdout.buffer.write(text.encode("utf-8", "surrogateescape"))
    else:
        shell.write_private(path, text)


def _node_count(parsed: Any, env: Mapping[str, str], dry: bool, given: int | None) -> int:
    """The job's node count: Slurm's inside a real job (a -N after the script is refused there: a job
    that silently ran on another number of nodes is worse than one that did not start); the dry run's
    -N, else the allocation's, else 2."""
    if given is not None:
        return given
    if parsed.nodes and not (DIGITS.fullmatch(parsed.nodes) and 1 <= int(parsed.nodes) <= MAX_NODES):
        raise usage_error(
            f"{parsed.nodes_flag} '{parsed.nodes}' is not a node count (a whole number >= 1); a plan "
            f"takes at most {MAX_NODES}; --help lists every option"
        )
    in_job = env.get("SLURM_JOB_NUM_NODES", "")
    if parsed.nodes and env.get("SLURM_JOB_ID") and not dry:
        raise usage_error(
            f"{parsed.nodes_flag} {parsed.nodes} after the script is the dry run's node count, not sbatch's: "
            "put it before "
            f"the script (sbatch -N {parsed.nodes} sbatch/multi.sbatch ...); this job has {in_job or '?'} "
            "node(s); --help lists every option"
        )
    text = parsed.nodes or in_job or ("2" if dry else "1")
    return int(text) if DIGITS.fullmatch(text) and int(text) >= 1 else 1


def _check_node_names(
    node_list: str, nnodes: int, given: bool, parsed: Any, env: Mapping[str, str], dry: bool
) -> None:
    """--nodes names one node per rank of the job's count (--nnodes, or the allocation's outside a
    dry run): job.json and PLAN_NNODES told two different jobs otherwise. A count that is only a
    default (none given, none in the environment) is not checked against it."""
    names = node_list.split()
    if not names:
        return
    if given:
        source = "--nnodes"
    elif env.get("SLURM_JOB_NUM_NODES") and not dry and not parsed.nodes:
        source = "SLURM_JOB_NUM_NODES"
    else:
        return
    if len(names) != nnodes:
        raise usage_error(
            f"{AREA}: --nodes names {len(names)} node(s) but the job has {nnodes} ({source}); "
            "give one name per node, in rank order"
        )


def _node_count_source(parsed: Any, env: Mapping[str, str], dry: bool, given: int | None) -> str:
    """Where the node count came from, for the dry run's header."""
    if given is not None or not dry:
        return "the job"
    if parsed.nodes:
        return "-N"
    if env.get("SLURM_JOB_NUM_NODES"):
        return "the allocation"
    return "no -N given: 2 assumed; the job's is sbatch's -N"


def settings_shown(resolved: Any, numbers: Mapping[str, str], sources: Mapping[str, str]) -> list[str]:
    """The dry run's settings: only those set, or different from the default, each with where its value
    came from (`--timeout`, `SM_TIMEOUT`, `MAD_DOCKER_BUILDS`, `sbatch (SLURM_NTASKS_PER_NODE)`,
    `the manifest`); secrets masked."""
    from slurm_multi import settings as table
    from slurm_multi.context import DEFAULT_MASTER_PORT, DEFAULT_TIMEOUT

    built_in = {"SM_TIMEOUT": DEFAULT_TIMEOUT, "SM_MASTER_PORT": DEFAULT_MASTER_PORT, "SM_LAUNCHER": "none",
                "SM_NPROC_PER_NODE": "1"}  # fmt: skip
    lines = []
    for s in table.TABLE:
        value = numbers.get(s.name) or resolved.values.get(s.name, "")
        source = resolved.label(s.name)
        if s.name in numbers and not source:
            # Resolved with the manifest: shown when the manifest changed it from the built-in value.
            source = "default" if value == built_in.get(s.name) else "the manifest"
            source = sources.get(s.name, source)
        if not value or source == "default":
            continue
        shown = MASK if is_secret_name(s.name) else value
        lines.append(f"{(s.option or s.name):<26} {shown}   (from {source})")
    return lines
