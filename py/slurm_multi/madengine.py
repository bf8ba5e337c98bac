"""madengine's contract with a model's container, in one place: how the model's script runs, which
variables the container gets, MAD_MULTI_NODE_RUNNER per launcher, and the docker options of a GPU
job. docs/madengine.md is the table of what is here and where madengine's own source says it.

Read from ROCm/madengine (execution/container_runner.py, deployment/slurm.py, templates/slurm/
job.sh.j2). Where madengine contradicts its own docs, we do what the docs promise and say so in
docs/madengine.md: megatron gets a multi-node runner (madengine's dispatcher never reaches it), the
launcher variables (VLLM_*, SGLANG_*, TORCHTITAN_*) reach the container, the node count is the
allocation's (madengine renders distributed.nnodes and hangs when it differs), and deepspeed's
hostfile is where the container can read it.

No click here: `node prepare` and `job plan` call these functions in their one Python start.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from slurm_multi.common import usage_error
from slurm_multi.settings import tasks_per_node

AREA = "madengine"
# Inside the container: madengine's workspace and the model's run directory (its cwd).
WORKSPACE = "/myworkspace"
RUN_DIRECTORY = f"{WORKSPACE}/run_directory"
# docker: the host's script directory, read-only; the container copies it into RUN_DIRECTORY first
# (a copy on the host would fill the node's scratch with files of the container's root user).
MODEL_MOUNT = "/sm-model"
DEFAULT_PORT = 29500
# The launcher of a multi-node manifest that names none (madengine's default; `--launcher none`
# still means none).
DEFAULT_MULTI_NODE_LAUNCHER = "torchrun"
RDZV_TIMEOUT = "3600"

# Launchers by the name we use; madengine's spellings map onto them.
LAUNCHERS = ("torchrun", "torchtitan", "deepspeed", "megatron", "vllm", "sglang", "sglang-disagg", "primus",
             "none")  # fmt: skip
LAUNCHER_ALIASES = {"megatron-lm": "megatron", "sglang_disagg": "sglang-disagg", "docker": "none", "": "none"}
# Launchers whose runner joins every node's processes into one world of nodes x nproc_per_node: a
# rank that shows a smaller world ran alone (collect fails the job, results/worldsize.py).
ONE_WORLD = frozenset({"torchrun", "torchtitan", "deepspeed", "megatron"})
# Launchers that start their own servers: MAD_MULTI_NODE_RUNNER is empty, nproc_per_node is theirs.
SERVING = frozenset({"vllm", "sglang", "sglang-disagg", "primus"})

# Host variables madengine passes into the container by name when they are set (container_runner's
# pass-through list), plus MIOPEN_USER_DB_PATH; names containing MAD_SECRETS pass too.
PASSTHROUGH = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "NNODES", "NPROC_PER_NODE",
               "MAD_MULTI_NODE_RUNNER", "MAD_COLLECT_METRICS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
               "NCCL_DEBUG", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL", "PRIMUS_CONFIG_PATH",
               "PRIMUS_CLI_EXTRA",
               "TORCH_ELASTIC_RDZV_TIMEOUT", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
               "CUDA_VISIBLE_DEVICES", "MIOPEN_USER_DB_PATH")  # fmt: skip
# The rank variables are the node task's own (lib/run.sh passes them to every runtime); Slurm sets
# the *_VISIBLE_DEVICES of a GPU job in host numbering, which is wrong inside a docker container.
NOT_PASSED = frozenset({"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "NNODES",
                        "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"})  # fmt: skip

# The options madengine's container runner gives every GPU container, per vendor, in its order.
# --network host is the node task's own (lib/run.sh): the barrier and the workload need it.
VENDOR_OPTIONS: dict[str, tuple[tuple[str, ...], ...]] = {
    "AMD": (("-u", "root"), ("--group-add", "video"), ("--cap-add=SYS_PTRACE",), ("--cap-add", "SYS_ADMIN"),
            ("--device", "/dev/fuse"), ("--security-opt", "seccomp=unconfined"),
            ("--security-opt", "apparmor=unconfined"), ("--ipc=host",)),
    "NVIDIA": (("-u", "root"), ("--cap-add=SYS_PTRACE",), ("--cap-add", "SYS_ADMIN"),
               ("--cap-add", "SYS_NICE"),
               ("--device", "/dev/fuse"), ("--security-opt", "seccomp=unconfined"),
               ("--security-opt", "apparmor=unconfined"), ("--ipc=host",)),
}  # fmt: skip


_NO_SOURCES: Mapping[str, str] = MappingProxyType({})


class Distributed(NamedTuple):
    """How the model's processes are laid out: the launcher and its numbers, resolved once."""

    launcher: str  # one of LAUNCHERS
    nnodes: int  # the job's nodes (the allocation's)
    nproc: int  # processes per node the launcher starts
    port: int  # MASTER_PORT
    source: Mapping[str, str] = _NO_SOURCES  # launcher/nproc/port -> where it came from

    @property
    def world_size(self) -> int:
        """Processes in the one world a multi-node launcher makes (0: no such world)."""
        return self.nnodes * self.nproc if self.launcher in ONE_WORLD else 0


def canonical_launcher(name: str, where: str) -> str:
    text = name.strip().lower()
    text = LAUNCHER_ALIASES.get(text, text)
    if text not in LAUNCHERS:
        raise usage_error(
            f"{AREA}: {where} '{name}' is not a launcher madengine knows ({', '.join(LAUNCHERS)})"
        )
    return text


def _whole(value: str, what: str, minimum: int, maximum: int | None = None) -> int:
    text = value.strip()
    try:
        number = int(float(text)) if re.fullmatch(r"[0-9]+(\.0*)?", text) else int(text)
    except ValueError:
        number = None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        allowed = f"{minimum}-{maximum}" if maximum is not None else f">= {minimum}"
        raise usage_error(f"{AREA}: {what} '{value}' is not a whole number {allowed}")
    return number


def resolve_distributed(
    values: Mapping[str, str], nnodes: int, gpus: int, settings: Mapping[str, str]
) -> Distributed:
    """The launcher, nproc_per_node and port: our option (--launcher, --nproc-per-node,
    --master-port) > the manifest's deployment_config.distributed > madengine's default."""
    source: dict[str, str] = {}

    def origin(name: str, manifest_field: str) -> str:
        return f"option/env {name}" if name in settings else f"manifest distributed.{manifest_field}"

    raw = values.get("SM_LAUNCHER", "")
    if raw.strip():
        launcher = canonical_launcher(
            raw, "--launcher" if "SM_LAUNCHER" in settings else "distributed.launcher"
        )
        source["launcher"] = origin("SM_LAUNCHER", "launcher")
    elif nnodes > 1 and tasks_per_node(values) == 1:
        # madengine's default (deployment/slurm.py: `launcher_type or "torchrun"`): a multi-node
        # manifest that names none runs one torchrun world, never one standalone run per node.
        launcher = DEFAULT_MULTI_NODE_LAUNCHER
        source["launcher"] = f"madengine's default for {nnodes} nodes"
    else:
        launcher = "none"
        source["launcher"] = (
            "default (one node: none)" if nnodes < 2 else "default (Slurm's tasks are the ranks: none)"
        )
    if values.get("SM_NPROC_PER_NODE", ""):
        nproc = _whole(values["SM_NPROC_PER_NODE"], "--nproc-per-node / distributed.nproc_per_node", 1, 4096)
        source["nproc_per_node"] = origin("SM_NPROC_PER_NODE", "nproc_per_node")
    else:
        nproc = max(gpus, 1)
        source["nproc_per_node"] = f"the node's GPUs ({gpus})" if gpus else "1 (no GPUs, no nproc_per_node)"
    port_text = values.get("SM_MASTER_PORT", "") or values.get("SM_DIST_PORT", "")
    port = _whole(port_text, "--master-port / distributed.port", 1, 65535) if port_text else DEFAULT_PORT
    if "SM_MASTER_PORT" in settings:
        source["port"] = "option/env SM_MASTER_PORT"
    else:
        source["port"] = "manifest distributed.port" if port_text else f"default {DEFAULT_PORT}"
    return Distributed(launcher, nnodes, nproc, port, source)


def runner(dist: Distributed, node_rank: int, master_addr: str, hostfile: str) -> str:
    """MAD_MULTI_NODE_RUNNER for this node ('' where madengine gives none: the serving launchers)."""
    n, p = dist.nnodes, dist.nproc
    if dist.launcher in SERVING:
        return ""
    if dist.launcher == "deepspeed":
        if n == 1:
            return f"deepspeed --num_gpus={p}"
        # madengine writes its hostfile to the host's /tmp (the container never sees it) and lets every
        # node launch onto all nodes over ssh; each node here launches its own share, deepspeed's
        # --no_ssh, from a hostfile in the container's output dir.
        return (f"deepspeed --hostfile={hostfile} --no_ssh --node_rank={node_rank} "
                f"--master_addr={master_addr} --master_port={dist.port}")  # fmt: skip
    if dist.launcher == "none" or n == 1:
        return f"torchrun --standalone --nproc_per_node={p}"
    # torchrun, torchtitan and megatron (madengine's docs: Megatron-LM runs under torchrun).
    return (f"torchrun --nnodes={n} --nproc_per_node={p} --node_rank={node_rank} "
            f"--master_addr={master_addr} --master_port={dist.port}")  # fmt: skip


def launcher_env(
    dist: Distributed, values: Mapping[str, str], node_rank: int, nodes: Sequence[str]
) -> dict[str, str]:
    """The launcher's own variables (madengine exports them on the host only; its docs say the
    container gets them)."""
    n, p, env = dist.nnodes, dist.nproc, {}
    if dist.launcher == "torchtitan":
        env.update(TORCHTITAN_TENSOR_PARALLEL_SIZE=str(p), TORCHTITAN_PIPELINE_PARALLEL_SIZE=str(n),
                   TORCHTITAN_FSDP_ENABLED="1", TORCHTITAN_CONTEXT_PARALLEL_SIZE="1")  # fmt: skip
    elif dist.launcher == "vllm":
        env.update(VLLM_TENSOR_PARALLEL_SIZE=str(p), VLLM_PIPELINE_PARALLEL_SIZE="1",
                   VLLM_DISTRIBUTED_BACKEND="none" if n > 1 else "auto")  # fmt: skip
    elif dist.launcher == "sglang":
        env.update(SGLANG_TENSOR_PARALLEL_SIZE=str(p), SGLANG_PIPELINE_PARALLEL_SIZE="1")
    elif dist.launcher == "sglang-disagg":
        if n < 3:
            raise usage_error(
                f"{AREA}: sglang-disagg needs at least 3 nodes (1 proxy, prefill, decode); the job has {n}"
            )
        prefill = values.get("SM_DISAGG_PREFILL_NODES", "")
        decode = values.get("SM_DISAGG_DECODE_NODES", "")
        if prefill and decode:
            x = _whole(prefill, "distributed.sglang_disagg.prefill_nodes", 1)
            y = _whole(decode, "distributed.sglang_disagg.decode_nodes", 1)
            if x + y + 1 != n:
                raise usage_error(
                    f"{AREA}: sglang_disagg prefill_nodes {x} + decode_nodes {y} + 1 proxy is not "
                    f"the job's {n} nodes"
                )
        else:
            x = max(1, (n - 1) * 2 // 5)
            y = n - 1 - x
        env.update(SGLANG_DISAGG_MODE="enabled", SGLANG_DISAGG_PREFILL_NODES=str(x),
                   SGLANG_DISAGG_DECODE_NODES=str(y), SGLANG_DISAGG_TOTAL_NODES=str(n), SGLANG_TP_SIZE=str(p),
                   SGLANG_NODE_RANK=str(node_rank), SGLANG_NODE_IPS=",".join(nodes))  # fmt: skip
    elif dist.launcher == "primus":
        env["PRIMUS_CONFIG_PATH"] = values.get("SM_PRIMUS_CONFIG_PATH") or "exp_pretrain.yaml"
        if values.get("SM_PRIMUS_CLI_EXTRA"):
            env["PRIMUS_CLI_EXTRA"] = values["SM_PRIMUS_CLI_EXTRA"]
        if values.get("SM_PRIMUS_BACKEND"):
            env["BACKEND"] = values["SM_PRIMUS_BACKEND"]
    return env


def hostfile_text(nodes: Sequence[str], nproc: int) -> str:
    return "".join(f"{node} slots={nproc}\n" for node in nodes)


class NodeFacts(NamedTuple):
    """What the node task knows about itself when it prepares."""

    node_rank: int
    nnodes: int
    master_addr: str
    nodes: tuple[str, ...]
    vendor: str  # AMD, NVIDIA or NONE (detected wins over the manifest)
    system_gpus: int  # GPUs the node has
    container_gpus: int  # GPUs the container is given
    details: Mapping[str, str]  # detected arch / product / hip version, where the tools said
    output_dir: str  # the output dir as the workload sees it (/sm-out in a container)
    ifname: str | None  # the interface of the node's routable address


def mad_env(values: Mapping[str, str], dist: Distributed, facts: NodeFacts) -> dict[str, str]:
    """Every variable madengine gives a model's container, for this node. The caller drops the names
    that the user set (environment or the manifest's docker_env_vars): theirs win."""
    p = dist.nproc
    env: dict[str, str] = {
        "MAD_MULTI_NODE_RUNNER": runner(
            dist, facts.node_rank, facts.master_addr, f"{facts.output_dir}/deepspeed_hostfile"
        ),  # fmt: skip
        "MAD_RUNTIME_NGPUS": str(facts.container_gpus or p),
        "MAD_SYSTEM_NGPUS": str(facts.system_gpus),
        "NPROC_PER_NODE": str(p),
        "MAD_GUEST_OS": (values.get("SM_GUEST_OS") or "UBUNTU").upper(),
        "JENKINS_BUILD_NUMBER": values.get("BUILD_NUMBER") or "0",
        "MIOPEN_USER_DB_PATH": f"/tmp/.miopen/node_{facts.node_rank}_rank_${{LOCAL_RANK:-0}}",
    }
    if facts.vendor in ("AMD", "NVIDIA"):
        env["MAD_GPU_VENDOR"] = facts.vendor
    for name in ("MAD_SYSTEM_GPU_ARCHITECTURE", "MAD_SYSTEM_HIP_VERSION", "MAD_SYSTEM_GPU_PRODUCT_NAME"):
        if facts.details.get(name):
            env[name] = facts.details[name]
    if values.get("SM_MODEL_NAME"):
        env["MAD_MODEL_NAME"] = values["SM_MODEL_NAME"]
    if values.get("SM_RESULTS_CSV"):
        env["MAD_OUTPUT_CSV"] = values["SM_RESULTS_CSV"]
    if facts.nnodes > 1:
        env["MAD_COLLECT_METRICS"] = "true" if facts.node_rank == 0 else "false"
        env["TORCH_ELASTIC_RDZV_TIMEOUT"] = RDZV_TIMEOUT
    if facts.ifname:
        env["NCCL_SOCKET_IFNAME"] = facts.ifname
        env["GLOO_SOCKET_IFNAME"] = facts.ifname
    if facts.container_gpus:
        visible = ",".join(str(i) for i in range(facts.container_gpus))
        env.update(HIP_VISIBLE_DEVICES=visible, ROCR_VISIBLE_DEVICES=visible, CUDA_VISIBLE_DEVICES=visible)
    env.update(launcher_env(dist, values, facts.node_rank, facts.nodes))
    return env


def passed_by_name(env: Mapping[str, str], ours: Sequence[str]) -> list[str]:
    """Names whose value the job's environment gives the container (the user's own value wins)."""
    names = [n for n in PASSTHROUGH if n in env and n not in NOT_PASSED]
    names += [n for n in ours if n in env and n not in names and n not in NOT_PASSED]
    names += sorted(n for n in env if "MAD_SECRETS" in n and n not in names)
    return names


# ---- the model's script ------------------------------------------------------------------------


class ModelScript(NamedTuple):
    """A manifest model's script as madengine runs it."""

    host_dir: str | None  # the directory copied into the run directory (None: the script is in the image)
    argv: list[str]  # run in the run directory: bash <script> <args>, python3 for .py
    shown: str  # the script as the manifest names it


def script_command(script: str, args: Sequence[str], model_dir: str | None) -> ModelScript:
    """madengine's rule: a .sh/.slurm runs with bash, a .py with python3, a directory as `bash
    run.sh` in it; the script's whole directory is the run directory. A script not on the host
    (not under the model dir) runs from the image's working directory instead."""
    path = script if os.path.isabs(script) or model_dir is None else os.path.join(model_dir, script)
    if model_dir is not None and os.path.isdir(path):
        return ModelScript(os.path.abspath(path), ["bash", "run.sh", *args], script)
    name = os.path.basename(script)
    interpreter = "python3" if name.endswith(".py") else "bash"
    if model_dir is not None and os.path.isfile(path):
        return ModelScript(os.path.dirname(os.path.abspath(path)), [interpreter, name, *args], script)
    return ModelScript(None, [interpreter, script, *args], script)


def split_args(text: str, where: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise usage_error(
            f"{AREA}: {where}args {text!r} cannot be split into words ({exc}); "
            "fix the quoting or use --model-args"
        ) from None


def docker_copy_prefix() -> list[str]:
    """The words in front of the model's command in a docker container: copy the read-only script
    dir into the run directory (the container's cwd), then become the command."""
    return ["sh", "-c", f'cp -RL {MODEL_MOUNT}/. . && exec "$@"', "sm-model"]


# ---- docker options of a GPU job -----------------------------------------------------------------


def _option_key(words: tuple[str, ...]) -> tuple[str, str]:
    """What a default option sets, as (flag, what): a user's option with the same key replaces it."""
    flag, _, inline = words[0].partition("=")
    value = inline or (words[1] if len(words) > 1 else "")
    if flag in ("-u", "--user"):
        return ("--user", "")
    if flag in ("--ipc", "--shm-size"):
        return ("--ipc", "")
    if flag == "--security-opt":
        return (flag, value.split("=", 1)[0])
    if flag in ("--cap-add", "--cap-drop"):
        return ("--cap", value.upper().removeprefix("CAP_"))
    return (flag, value)


def _user_keys(options: Sequence[str]) -> set[tuple[str, str]]:
    keys: set[tuple[str, str]] = set()
    for i, word in enumerate(options):
        if not word.startswith("-"):
            continue
        flag = word.split("=", 1)[0]
        if "=" in word:
            keys.add(_option_key((word,)))
        elif i + 1 < len(options):
            keys.add(_option_key((flag, options[i + 1])))
        else:
            keys.add(_option_key((flag,)))
    return keys


def vendor_options(vendor: str, user_options: Sequence[str]) -> list[str]:
    """madengine's options for a GPU container of this vendor, each left out where the manifest's own
    options set the same thing (`--ipc`/`--shm-size`, `-u`, a `--security-opt` kind, a capability
    added or dropped, a device)."""
    taken = _user_keys(user_options)
    result: list[str] = []
    for words in VENDOR_OPTIONS.get(vendor, ()):
        if _option_key(words) not in taken:
            result.extend(words)
    return result


# ---- manifest fields ---------------------------------------------------------------------------

# Manifest fields that we read (section -> fields); everything else with a value is reported as ignored.
USED_FIELDS = {
    "built_images": {"docker_image", "dockerfile", "base_docker", "local_image", "registry_image",
                     "build_duration"},
    "built_models": {"name", "dockerfile", "dockercontext", "scripts", "args", "n_gpus", "timeout",
                     "multiple_results", "tags", "additional_docker_run_options", "data",
                     "training_precision", "log_error_pattern_scan", "log_error_patterns",
                     "log_error_benign_patterns", "skip_gpu_arch"},
    "context": {"docker_env_vars", "docker_mounts", "docker_build_arg", "docker_gpus", "gpu_vendor",
                "guest_os", "tools", "pre_scripts", "post_scripts", "encapsulate_script"},
    "deployment_config": {"target", "slurm", "distributed"},
    "slurm": {"nodes", "gpus_per_node"},
    "distributed": {"launcher", "nnodes", "nproc_per_node", "port", "sglang_disagg", "primus"},
}  # fmt: skip


def _has_value(value: Any) -> bool:
    return value not in (None, "", [], {}, False)


def ignored_fields(manifest: Mapping[str, Any], key: str) -> list[str]:
    """`section.field` for every field of this model's manifest entry that slurm-multi does not use."""
    ignored: list[str] = []
    for section in ("built_images", "built_models"):
        entry = (manifest.get(section) or {}).get(key) or {}
        for name, value in entry.items():
            if name not in USED_FIELDS[section] and _has_value(value):
                ignored.append(f"{section}.{key}.{name}")
    context = manifest.get("context") or {}
    ignored += [
        f"context.{n}" for n, v in context.items() if n not in USED_FIELDS["context"] and _has_value(v)
    ]
    deployment = manifest.get("deployment_config") or {}
    for name, value in deployment.items():
        if name not in USED_FIELDS["deployment_config"] and _has_value(value):
            ignored.append(f"deployment_config.{name}")
    for part in ("slurm", "distributed"):
        section = deployment.get(part) or {}
        if isinstance(section, dict):
            ignored += [f"deployment_config.{part}.{n}" for n, v in section.items()
                        if n not in USED_FIELDS[part] and _has_value(v)]  # fmt: skip
    for name, value in manifest.items():
        known = (
            "built_images",
            "built_models",
            "context",
            "deployment_config",
            "credentials_required",
            "summary",
        )
        if name not in known and _has_value(value):
            ignored.append(name)
    return ignored


def node_count_warning(values: Mapping[str, str], nnodes: int) -> str | None:
    """A manifest that asks for another node count than the job has: the job's count is used."""
    for name, where in (("SM_DIST_NNODES", "distributed.nnodes"), ("SM_SLURM_NODES", "slurm.nodes")):
        text = values.get(name, "")
        if text and text.strip() != str(nnodes):
            return (f"the manifest's deployment_config.{where} is {text} but the job has {nnodes} node"
                    f"{'s' if nnodes != 1 else ''}: the runner and NNODES use {nnodes} "
                    f"(give sbatch -N {text} to run as planned)")  # fmt: skip
    return None


def planned_gpus(values: Mapping[str, str], env: Mapping[str, str]) -> int:
    """The GPUs per node the launcher's default process count follows (madengine: gpus_per_node):
    the manifest's slurm.gpus_per_node, else the docker_gpus list, else Slurm's GPUs on this node."""
    from slurm_multi.gpus import parse_docker_gpus

    text = values.get("SM_GPUS_PER_NODE", "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    try:
        asked = parse_docker_gpus(values.get("SM_DOCKER_GPUS") or None)
    except Exception:  # noqa: BLE001 - prepare reports a bad docker_gpus with its own line
        asked = None
    if asked:
        return len(asked)
    slurm = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(slurm) if slurm.isdigit() else 0


def job_distributed(values: Mapping[str, str], settings: Mapping[str, str], env: Mapping[str, str],
                    nnodes: int) -> Distributed:  # fmt: skip
    return resolve_distributed(values, nnodes, planned_gpus(values, env), settings)
