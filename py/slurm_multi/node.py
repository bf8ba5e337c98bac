"""A node's helpers: one `prepare` per task, `from-job` to re-run a stage by hand (the click commands:
slurm_multi.node_cli; status.json: slurm_multi.statusfile).

`slurm-multi node prepare` is the node's one look at its settings, its GPUs and the manifest, in one
Python start (every task runs it first): it detects the GPUs, resolves the run
context, checks that the GPUs asked for are here (what the node detects wins; asking for more is an
error naming both lists), de-duplicates the mounts (our /sm-out first: results are never displaced),
splits the workload's arguments, and writes into the task's scratch dir (mode 0700):

    context.sh     bash for sm-node to source AFTER this helper exited 0 (no process substitution)
    container.env  the manifest's docker_env_vars, for `docker run --env-file` (the container only:
                   the toolkit's shell and helpers never have them in their environment)
    workload.env   the same as bash `export` lines, for the bare-metal runtime's workload subshell
    secrets        every secret value the context can print, for the node's log filter
    gpus.json      what detection found

Any failure is one line on stderr and a non-zero exit, and then nothing is sourced.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_multi import shell
from slurm_multi.common import HelperError, talk, usage_error
from slurm_multi.context import RunContext, resolve
from slurm_multi.logline import short
from slurm_multi.secret_rule import MASK, is_secret_name

AREA = "prepare"
SM_OUT_MOUNT = "/sm-out"


def resolve_build_paths(ctx: RunContext, env: Mapping[str, str]) -> None:
    """Relative dockerfile/context paths in a manifest are relative to where madengine ran: try the
    submit dir, then the manifest's dir and its parents."""
    manifest_dir = os.path.dirname(os.path.abspath(ctx.manifest)) if ctx.manifest else None
    bases = [env.get("SLURM_SUBMIT_DIR") or os.getcwd()]
    if manifest_dir:
        bases += [manifest_dir, os.path.dirname(manifest_dir), os.path.dirname(os.path.dirname(manifest_dir))]
    for name in ("SM_DOCKERFILE", "SM_DOCKER_CONTEXT"):
        value = ctx.values.get(name, "")
        if not value or os.path.isabs(value) or name in env:
            continue
        for base in bases:
            candidate = os.path.join(base, value)
            if os.path.exists(candidate):
                ctx.values[name] = os.path.abspath(candidate)
                break


def env_file_text(docker_env: Mapping[str, str]) -> str:
    """docker's --env-file format: NAME=VALUE per line, the value taken literally to the line's end.
    A value with a line break cannot be carried: an error, never a silently cut value."""
    lines = []
    for name, value in docker_env.items():
        if "\n" in value or "\r" in value:
            raise usage_error(
                f"{AREA}: docker_env_vars {name} has a line break; docker --env-file cannot pass it on. "
                "Export it in the job's environment instead (the environment wins over the manifest)"
            )
        lines.append(f"{name}={value}")
    return "".join(line + "\n" for line in lines)


def gpu_arguments(ctx: RunContext, detected: dict[str, Any], node: str) -> list[str]:
    from slurm_multi.gpus import docker_gpu_args

    vendor = ctx.get("SM_GPU_VENDOR") or None
    return docker_gpu_args(detected, vendor, ctx.get("SM_DOCKER_GPUS") or None, node, model_n_gpus(ctx))


def model_n_gpus(ctx: RunContext) -> int | None:
    """The manifest model's n_gpus as a count (None: all of them, madengine's -1, or no manifest)."""
    text = ctx.get("SM_N_GPUS").strip() if ctx.manifest else ""
    if not text:
        return None
    try:
        number = int(float(text))
    except ValueError:
        raise usage_error(
            f"{AREA}: the model's n_gpus {text!r} is not a whole number (-1: all GPUs)"
        ) from None
    return number if number > 0 else None


def check_skip_gpu_arch(ctx: RunContext, details: Mapping[str, str], node: str) -> None:
    """madengine's skip_gpu_arch: a model that does not run on this node's GPU architecture (an exact
    name, e.g. gfx942 or A100) is refused here with one line, before anything runs on the node."""
    skip = [a.strip() for a in ctx.get("SM_SKIP_GPU_ARCH").split(",") if a.strip()]
    arch = details.get("MAD_SYSTEM_GPU_ARCHITECTURE", "")
    names = {arch, arch.replace("NVIDIA ", "").split("-")[0].strip()} - {""}
    hit = [a for a in skip if a in names]
    if hit:
        raise HelperError(
            f"{AREA}: model {ctx.get('SM_MODEL_NAME') or ctx.model_key} skips GPU architecture {hit[0]} "
            f"(its skip_gpu_arch: {', '.join(skip)}) and {node} has {arch}: nothing ran; submit it to "
            "nodes of another architecture"
        )


def docker_options(ctx: RunContext, scratch: str, run: ModelRun) -> list[str]:
    """madengine's GPU options, then the manifest's docker options and mounts, de-duplicated; our
    mounts (/sm-out, the model's scripts) always win."""
    from slurm_multi.mounts import dedup_mounts

    ours = ["-v", f"{scratch}/output:{SM_OUT_MOUNT}", *run.docker_mounts]
    args, dropped = dedup_mounts(ours + run.vendor_options + ctx.docker_opts, ctx.mounts)
    for message in dropped:
        talk("mounts", message)
    return args + (["-w", run.workdir] if run.workdir else [])


def pyxis_mount_list(ctx: RunContext, scratch: str, run: ModelRun) -> list[str]:
    """One --container-mounts worth of mounts for a pyxis rank; our mounts always win."""
    from slurm_multi.mounts import pyxis_mounts

    items, dropped = pyxis_mounts(
        ctx.docker_opts, ctx.mounts, [f"{scratch}/output:{SM_OUT_MOUNT}", *run.pyxis_mounts]
    )
    for message in dropped:
        talk("mounts", message)
    return items


def env_arguments(ctx: RunContext, env_file: str | None, passed: Sequence[str] = ()) -> list[str]:
    args = ["--env-file", env_file] if env_file else []
    # The value comes from the environment the docker client runs in: the user's own wins.
    for name in [*ctx.kept_env, *(n for n in passed if n not in ctx.kept_env)]:
        args += ["-e", name]
    return args


class ModelRun:
    """How this node runs the manifest's model, as madengine does (slurm_multi.madengine)."""

    def __init__(self) -> None:
        self.workdir = ""  # the workload's working directory (container path; bare metal: host path)
        self.setup: list[str] = []  # words before the profiler and the command
        self.docker_mounts: list[str] = []
        self.pyxis_mounts: list[str] = []
        self.vendor_options: list[str] = []
        self.passed: list[str] = []  # env names the job's environment gives
        self.tools_dir = ""  # docker: the container's dir of staged tool outputs (save-outputs copies it)


def model_run(
    ctx: RunContext,
    env: Mapping[str, str],
    runtime: str,
    detected: Mapping[str, Any],
    gpu_args: Sequence[str],
    scratch: str,
    shown: str,
    dry_run: bool,
) -> ModelRun:
    """The madengine contract for this node: the run directory (docker: the container copies the
    read-only script dir; pyxis and bare metal: a copy in this node's scratch, written as the job's
    user), madengine's variables into ctx.docker_env (the user's own values win) and its GPU options."""
    from slurm_multi import madengine as mad

    run = ModelRun()
    if not ctx.manifest:
        return run
    script = ctx.script
    if script is not None and script.host_dir is not None:
        if runtime == "docker":
            run.workdir = mad.RUN_DIRECTORY
            run.docker_mounts = ["-v", f"{script.host_dir}:{mad.MODEL_MOUNT}:ro"]
            run.setup = mad.docker_copy_prefix()
        else:
            local = os.path.join(scratch, "run_directory")
            if not dry_run:
                copy_run_directory(script.host_dir, local)
            shown_local = os.path.join(shown, "run_directory")
            run.workdir = mad.RUN_DIRECTORY if runtime == "pyxis" else shown_local
            run.pyxis_mounts = [f"{shown_local}:{mad.RUN_DIRECTORY}"] if runtime == "pyxis" else []
        talk(AREA, f"model script {script.shown}: {' '.join(script.argv[:2])} in {run.workdir} "
                   f"(a copy of {script.host_dir} for this node)")  # fmt: skip
    elif script is not None:
        where = ctx.get("SM_MODEL_DIR") or "the manifest directory"
        talk(AREA, f"model script {script.shown} is not in the model dir ({where}): "
                   "running it from the image's working directory")  # fmt: skip
    nnodes = int(env.get("NNODES") or env.get("SLURM_NNODES") or 1)
    node_rank = int(env.get("NODE_RANK") or env.get("SM_RANK") or 0)
    dist = mad.job_distributed(ctx.values, ctx.settings, env, nnodes)
    vendor = mad_vendor(ctx, detected)
    container_gpus = _gpu_count(gpu_args, vendor) if runtime == "docker" else 0
    out = os.path.join(shown, "output") if runtime == "none" else SM_OUT_MOUNT
    nodes = _job_nodes(env) if dist.launcher in ("deepspeed", "sglang-disagg") else ()
    details = _gpu_details(vendor, detected, env, dry_run)
    check_skip_gpu_arch(ctx, details, env.get("SLURMD_NODENAME") or socket.gethostname())
    facts = mad.NodeFacts(
        node_rank=node_rank, nnodes=nnodes, master_addr=env.get("MASTER_ADDR", ""), nodes=tuple(nodes),
        vendor=vendor, system_gpus=int(detected.get("count") or 0), container_gpus=container_gpus,
        details=details, output_dir=out,
        ifname="<the node's routable interface>" if dry_run else _routable_ifname(),
    )  # fmt: skip
    ours = mad.mad_env(ctx.values, dist, facts)
    if dist.launcher == "deepspeed" and nnodes > 1:
        shell.write_private(
            os.path.join(scratch, "output", "deepspeed_hostfile"), mad.hostfile_text(nodes, dist.nproc)
        )
    run.passed = mad.passed_by_name(env, list(ours))
    for name, value in ours.items():
        if name not in ctx.docker_env and name not in env:
            ctx.docker_env[name] = value
    if runtime == "docker":
        run.vendor_options = mad.vendor_options(vendor, ctx.docker_opts)
    if script is not None:
        wrap_model(ctx, env, runtime, scratch, shown, run, nnodes, dry_run)
    return run


def wrap_model(ctx: RunContext, env: Mapping[str, str], runtime: str, scratch: str, shown: str, run: ModelRun,
               nnodes: int, dry_run: bool) -> None:  # fmt: skip
    """madengine's run around the model's script (slurm_multi.madrun): scripts/common and the other
    scripts seen from the workspace, the data mounted, the tools' and data's variables set (the
    user's own win), and the command run by bash when anything wraps it or its args need a shell."""
    from slurm_multi import madengine as mad
    from slurm_multi import madrun

    script = ctx.script
    assert script is not None
    # Bare metal: no container to mount into; the data where it is, a custom provider's in scratch.
    bare = runtime == "none"
    mad_run = madrun.plan_run(ctx.mad_parts, ctx.checkout, ctx.values, nnodes, shown if bare else None)
    ctx.mad_run = mad_run
    links = [(mad_run.common, madrun.COMMON)] if mad_run.common else []
    links += mad_run.files
    if bare:
        for host, rel in links:
            if not dry_run:
                _link(host, os.path.join(scratch, rel))
    else:
        mounts = [f"{host}:{mad.WORKSPACE}/{rel}:ro" for host, rel in links]
        mounts += [d.mount for d in mad_run.data if d.mounted]
        for mount in mounts:
            if runtime == "docker":
                run.docker_mounts += ["-v", mount]
            else:
                run.pyxis_mounts.append(mount)
    # (Bare metal: MAD_DATAHOME is a path on this node, ours to say over the manifest's.)
    ours = {"MAD_DATAHOME"} if bare and mad_run.data else set()
    for name, value in mad_run.env.items():
        if name not in env and (name not in ctx.docker_env or name in ours):
            ctx.docker_env[name] = value
    raw_args = ctx.get("SM_MODEL_ARGS")
    missing = None
    if script.host_dir is None:
        where = ctx.checkout or "the manifest's directory"
        kind = "image" if runtime != "none" else "node"
        missing = (
            script.shown,
            f"model script {script.shown} is neither in the model dir {where} nor in the {kind}'s "
            "working directory: give --model-dir DIR (the checkout holding it)",
        )
    if not (ctx.mad_parts.any() or missing or madrun.needs_shell(raw_args)):
        return
    if runtime == "docker" and (mad_run.tools or mad_run.pre or mad_run.post):
        run.tools_dir = madrun.CONTAINER_TOOLS_DIR
        ctx.docker_env["SM_MAD_TOOLS_DIR"] = run.tools_dir
    line = madrun.model_line(mad_run, script.argv, raw_args)
    ctx.workload = ["bash", "-c", madrun.wrapper(mad_run, line, missing), "sm-mad"]
    pre = "; ".join(f"{s.path} {s.args}".strip() for s in mad_run.pre) or "-"
    post = "; ".join(f"{s.path} {s.args}".strip() for s in mad_run.post) or "-"
    tools = ", ".join(mad_run.tools) or "-"
    talk(AREA, f"madengine's run of {script.shown}: tools {tools}; pre-scripts {pre}; command {line}; "
               f"post-scripts {post}")  # fmt: skip


def _link(host: str, path: str) -> None:
    """The bare-metal workspace sees a script or scripts/common where madengine's would hold it."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        os.symlink(host, path)
    except OSError as exc:
        raise HelperError(
            f"{AREA}: cannot link {host} into the workspace at {path}: {exc.strerror}"
        ) from None


def copy_run_directory(source: str, target: str) -> None:
    """madengine's `cp -vLR <script dir>/. run_directory/`: symlinks followed, a fresh copy per node."""
    import shutil

    if os.path.exists(target):
        shutil.rmtree(target)
    try:
        shutil.copytree(source, target, symlinks=False)
    except (OSError, shutil.Error) as exc:
        raise HelperError(f"{AREA}: cannot copy the model's scripts {source} into {target}: {exc}") from None


def mad_vendor(ctx: RunContext, detected: Mapping[str, Any]) -> str:
    """AMD, NVIDIA or NONE: what the node detects wins over the manifest's gpu_vendor."""
    from slurm_multi.gpus import normalise_vendor

    found = normalise_vendor(str(detected.get("vendor", "none")))
    if found != "none":
        return found
    asked = ctx.get("SM_GPU_VENDOR").strip()
    return normalise_vendor(asked) if asked else "NONE"


def _gpu_details(
    vendor: str, detected: Mapping[str, Any], env: Mapping[str, str], dry_run: bool
) -> dict[str, str]:
    """The MAD_SYSTEM_* details of a node with detected GPUs (one more tool call; none without GPUs)."""
    from slurm_multi.gpus import detect_details

    if dry_run or not detected.get("count"):
        return {}
    return detect_details(vendor, path=env.get("PATH"))


def _gpu_count(gpu_args: Sequence[str], vendor: str) -> int:
    if vendor == "NVIDIA":
        for i, word in enumerate(gpu_args[:-1]):
            if word == "--gpus":
                return len([p for p in gpu_args[i + 1].strip('"').removeprefix("device=").split(",") if p])
        return 0
    return sum(1 for word in gpu_args if word.startswith("/dev/dri/renderD"))


def _job_nodes(env: Mapping[str, str]) -> list[str]:
    """The job's host names in rank order (deepspeed's hostfile, sglang's node list)."""
    import subprocess

    listing = env.get("SLURM_JOB_NODELIST", "")
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", listing], capture_output=True, text=True,
                              timeout=20, check=True)  # fmt: skip
        names = done.stdout.split()
    except (OSError, subprocess.SubprocessError):
        names = [n for n in listing.split(",") if n]
    return names or [env.get("SLURMD_NODENAME") or socket.gethostname()]


def _routable_ifname() -> str | None:
    from slurm_multi.net import routable_interface

    try:
        return routable_interface()[0]
    except HelperError:
        return None


def check_docker_engine(env: Mapping[str, str], node: str, timeout: float | None = None) -> None:
    """The node's docker engine answers `GET /_ping` on its socket (what `docker version` would
    ask, without starting the docker CLI). A tcp:// DOCKER_HOST is left to the docker CLI."""
    from slurm_multi import dockerapi

    path = dockerapi.socket_path(env)
    if path is None:
        return
    try:
        reply = dockerapi.get(
            path, "/_ping", dockerapi.PING_TIMEOUT if timeout is None else timeout, limit=256
        )
    except dockerapi.EngineError as exc:
        unreachable = f"{AREA}: docker engine not reachable on {node}"
        if exc.errno == 0:  # it answered, but not HTTP
            raise HelperError(f"{unreachable}: {path} {exc.strerror}") from None
        raise HelperError(
            f"{AREA}: docker engine not reachable on {node}: cannot talk to {path} ({exc.strerror}); "
            "is dockerd running there, and may this user use it (the docker group)?"
        ) from None
    if reply.status != 200:
        raise HelperError(f"{AREA}: docker engine not reachable on {node}: {path} answered {reply.line!r}")


FINGERPRINT_LABEL = "org.slurm-multi.fingerprint"  # = lib/image.sh FINGERPRINT_LABEL


def image_facts(ctx: RunContext, env: Mapping[str, str], runtime: str, rank0: bool) -> dict[str, str]:
    """What the image stage asks first, answered here, where the interpreter and the engine's socket
    are already at hand (lib/image.sh image::ensure_on_rank0, image::ensure_on_worker): the engine's
    ID and fingerprint label of the image (IMAGE_LOCAL_ID, IMAGE_LOCAL_LABEL; IMAGE_LOCAL_ASKED=1
    when the engine answered, "" ID: absent), and on rank 0 the image's build fingerprint
    (IMAGE_FINGERPRINT, when it has a dockerfile; a worker needs it only to rebuild, then asks).
    Nothing when the runtime has no docker image; the image stage asks itself what is missing."""
    from slurm_multi import dockerapi

    if runtime not in ("docker", "pyxis"):
        return {}
    facts: dict[str, str] = {}
    dockerfile = ctx.get("SM_DOCKERFILE")
    if dockerfile and rank0:
        from slurm_multi.fingerprint import fingerprint

        built_from = fingerprint(
            dockerfile, ctx.get("SM_DOCKER_CONTEXT"), [f"{n}={v}" for n, v in ctx.build_args]
        )
        if built_from:
            facts["IMAGE_FINGERPRINT"] = built_from
    local = (
        dockerapi.image_facts(env, ctx.get("SM_IMAGE"), FINGERPRINT_LABEL) if runtime == "docker" else None
    )
    if local is not None:
        facts.update(IMAGE_LOCAL_ASKED="1", IMAGE_LOCAL_ID=local[0], IMAGE_LOCAL_LABEL=local[1])
    return facts


def prepare(
    env: Mapping[str, str],
    scratch: str,
    command: Sequence[str],
    detect: bool,
    shown_scratch: str | None = None,
) -> dict[str, Any]:
    """Resolve and check this node's context; write the files named in the module docstring.

    `shown_scratch` is the scratch path the docker arguments name (the dry run writes its files
    elsewhere but shows the node's paths)."""
    from slurm_multi.gpus import detect_gpus

    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    scratch = os.path.abspath(scratch)
    shown = os.path.abspath(shown_scratch) if shown_scratch else scratch
    detected = (
        detect_gpus(path=env.get("PATH"))
        if detect
        else {"vendor": "none", "count": 0, "gpus": [], "skipped": True}
    )
    ctx = resolve(env, command)
    for warning in ctx.warnings:
        talk("manifest", warning)
    runtime = ctx.get("SM_RUNTIME", "docker")
    if (
        not ctx.get("SM_IMAGE")
        and runtime == "docker"
        or (runtime == "pyxis" and not ctx.get("SM_IMAGE") and not ctx.get("SM_CONTAINER_IMAGE"))
    ):
        raise usage_error(f"{AREA}: no image: give --image or a manifest with docker_image")
    if runtime == "docker" and detect:
        check_docker_engine(env, node)
    resolve_build_paths(ctx, env)
    if shown_scratch is None:  # a fact of the node itself: the dry run cannot know it
        reachable_self_address(ctx, env, socket.gethostname())
    gpu_args = gpu_arguments(ctx, detected, node) if detect else []
    os.makedirs(os.path.join(scratch, "output"), exist_ok=True)
    run = model_run(ctx, env, runtime, detected, gpu_args, scratch, shown, dry_run=shown_scratch is not None)
    env_file = None
    if ctx.docker_env:
        shell.write_private(os.path.join(scratch, "container.env"), env_file_text(ctx.docker_env))
        env_file = os.path.join(shown, "container.env")
    shell.write_private(
        os.path.join(scratch, "workload.env"),
        "".join(shell.scalar(n, v, export=True) + "\n" for n, v in ctx.docker_env.items()),
    )
    secrets = ctx.secret_values(env)
    shell.write_private(os.path.join(scratch, "secrets"), "".join(s + "\n" for s in secrets if "\n" not in s))
    shell.write_json(os.path.join(scratch, "gpus.json"), detected)
    exports = {k: v for k, v in ctx.values.items() if k not in env or env[k] != v}
    arrays = {
        "SM_BUILD_ARGS": [f"{n}={v}" for n, v in ctx.build_args],
        "SM_BUILD_SECRET_NAMES": [n for n, _ in ctx.build_args if n in ctx.secret_names or is_secret_name(n)],
        "RUN_GPU_ARGS": gpu_args,
        "RUN_DOCKER_OPTS": docker_options(ctx, shown, run) if runtime == "docker" else [],
        "RUN_PYXIS_MOUNTS": pyxis_mount_list(ctx, shown, run) if runtime == "pyxis" else [],
        "RUN_ENV_ARGS": env_arguments(ctx, env_file, run.passed),
        "RUN_SETUP": run.setup,
        "RUN_WORKLOAD": ctx.workload,
    }
    scalars = {
        "SM_GPU_DETECTED": f"{detected['vendor']} x{detected['count']}",
        "RUN_WORKDIR": run.workdir,
        "RUN_MAD_TOOLS_DIR": run.tools_dir,
    }
    if detect and shown_scratch is None:
        scalars.update(image_facts(ctx, env, runtime, rank0=env.get("SM_RANK", "0") == "0"))
    shell.write_private(
        os.path.join(scratch, "context.sh"),
        shell.render("slurm-multi node prepare", scalars=scalars, arrays=arrays, exports=exports),
    )
    indexes = ",".join(str(g.get("index")) for g in detected["gpus"]) or "-"
    shown_env = ", ".join(f"{n}={MASK if n in ctx.secret_names else v}" for n, v in ctx.docker_env.items())
    talk(
        AREA,
        f"GPUs detected: {detected['vendor']} ({indexes}); image {ctx.get('SM_IMAGE') or '-'}; "
        f"container env: {shown_env or '-'}",
    )
    return {"detected": detected, "context": ctx}


def reachable_self_address(ctx: Any, env: Mapping[str, str], host: str) -> None:
    """gloo advertises the first address the host's own name resolves to; when that is loopback or
    link-local (Debian's 127.0.1.1 line), peers dial it and never connect. Then the container gets
    GLOO_SOCKET_IFNAME naming the interface of this node's routable address, unless the user set it."""
    from slurm_multi.net import routable_interface, self_name_quirk

    if "GLOO_SOCKET_IFNAME" in ctx.docker_env or "GLOO_SOCKET_IFNAME" in env:
        return
    why = self_name_quirk(host)
    if not why:
        return
    try:
        name, address, _ = routable_interface()
    except HelperError:
        talk(AREA, f"{why}, and no routable interface was found: gloo peers may not connect")
        return
    ctx.docker_env["GLOO_SOCKET_IFNAME"] = name
    talk(AREA, f"{why}: GLOO_SOCKET_IFNAME={name} ({address}) so gloo advertises an address peers reach")


# ---- status.json: slurm_multi.statusfile (no click: it runs at the end of every node task) ----

# ---- --from-job ----------------------------------------------------------------------------------


def _read_json(path: str, what: str) -> dict[str, Any]:
    from slurm_multi.readfile import read_json

    try:
        data = read_json(path)
    except OSError as exc:
        raise usage_error(f"node from-job: cannot read {what} {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:
        raise usage_error(f"node from-job: {what} {path} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise usage_error(f"node from-job: {what} {path} is not a JSON object")
    return data


def _bad_field(jobdir: str, key: str, value: Any, what: str) -> HelperError:
    return usage_error(
        f"node from-job: {jobdir}/job.json: {key} {short(json.dumps(value), 40)} is not {what}"
    )


def _job_list(jobdir: str, job: Mapping[str, Any], key: str, what: str) -> list[Any]:
    """job.json's list `key` ([] when absent or empty); a usage error naming it when it is no list."""
    value = job.get(key) or []
    if not isinstance(value, list):
        raise _bad_field(jobdir, key, value, what)
    return value


def _job_count(jobdir: str, job: Mapping[str, Any], key: str) -> int | None:
    """job.json's node or task count (an integer, or one in digits): None when absent or 0 (the
    caller's default); a usage error naming the field for anything but 1..MAX_NODES, the most a plan
    takes ("x", NaN, 2.5, an object, 10**9)."""
    from slurm_multi.plan import MAX_NODES

    value = job.get(key)
    if not value:
        return None
    count = value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        count = int(value)
    elif isinstance(value, float) and value.is_integer():
        count = int(value)
    if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= MAX_NODES:
        return count
    raise _bad_field(jobdir, key, value, f"a count from 1 to {MAX_NODES}")


def from_job(jobdir: str, rank: int, env: Mapping[str, str]) -> str:
    """Bash that sets what a stage of that job needs on this node: the job's settings (masked ones
    from this environment), its id, node list, rank 0's address and rank 0's image ID."""
    from slurm_multi.statusfile import read_status, status_path

    job = _read_json(os.path.join(jobdir, "job.json"), "job.json")
    settings = job.get("settings")
    if not isinstance(settings, dict):
        raise usage_error(
            f"node from-job: {jobdir}/job.json has no settings (written by an older slurm-multi)"
        )
    nodes = _job_list(jobdir, job, "nodes", "a list of host names")
    nnodes = _job_count(jobdir, job, "nnodes") or len(nodes) or 1
    tasks = _job_count(jobdir, job, "tasks_per_node") or 1
    if not 0 <= rank < nnodes * tasks:
        raise usage_error(
            f"node from-job: rank {rank} is not a rank of job {job.get('job_id')} (0..{nnodes * tasks - 1})"
        )
    exports: dict[str, str] = {}
    missing: list[str] = []
    for name, value in settings.items():
        if not isinstance(value, str):
            continue
        if value == MASK or is_secret_name(name):
            if name not in env:
                missing.append(name)
            continue
        exports[name] = value
    if missing:
        talk(
            "from-job",
            f"masked in job.json, not in this environment: {', '.join(missing)} "
            "(export them if a stage needs them)",
        )
    exports.update(
        {
            "SLURM_JOB_ID": str(job.get("job_id", "")),
            "SM_RANK": str(rank),
            "NNODES": str(nnodes),
            "SLURM_NNODES": str(nnodes),
            "SM_JOBDIR": jobdir,
        }
    )
    if nodes:
        exports["MASTER_ADDR"] = str(nodes[0])
        exports["SLURM_JOB_NODELIST"] = ",".join(str(n) for n in nodes)
    path0 = status_path(os.path.join(jobdir, "node_0"))
    status0 = read_status(path0)
    if status0 is not None and not status0.readable:
        raise usage_error(f"node from-job: cannot read rank 0's status {path0}: {status0.error}")
    image_id = status0.image_id if status0 is not None else ""
    if image_id:
        exports["SM_IMAGE_ID"] = str(image_id)
    command = [str(w) for w in _job_list(jobdir, job, "command", "a list of words")]
    if any(MASK in word for word in command):
        raise usage_error(
            "node from-job: the job's command has masked words (secrets); run the stage with -- CMD"
        )
    return shell.render(
        f"slurm-multi node from-job {jobdir} --rank {rank}", exports=exports, arrays={"SM_CMD": command}
    )
