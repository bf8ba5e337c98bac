"""The run context of one job: the settings (SM_* from the command line and environment) merged with
one model of the manifest, resolved once, in one place.

The batch step resolves it to validate and to write job.json (`slurm-multi job plan`); every node
resolves it again against its own environment (`slurm-multi node prepare`), because `${VAR}`
references and "the environment wins" are a node's business. Nobody else reads the manifest.

Precedence: command line > environment > manifest (the job plan resolves the first two and the
defaults against slurm_multi.settings and exports them; here they are the environment). A setting
already in the environment is never replaced by a manifest value. The manifest's docker_env_vars
are for the container only: they are returned as data, never exported into the toolkit's own shell.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurm_multi.common import usage_error
from slurm_multi.madengine import ModelScript, script_command, split_args
from slurm_multi.madrun import MadParts, MadRun, read_parts
from slurm_multi.manifest import load_manifest, printable, restore_context
from slurm_multi.secret_rule import MASK, MIN_SECRET_LEN, is_secret_name
from slurm_multi.settings import BY_NAME as SETTINGS

AREA = "context"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class RunContext:
    """Everything a job needs from the settings and the manifest (values unmasked: handle with care)."""

    manifest: str | None = None
    model_key: str = ""
    settings: dict[str, str] = field(default_factory=dict)  # SM_* from the command line/environment
    values: dict[str, str] = field(default_factory=dict)  # settings, then the manifest's SM_* scalars
    build_args: list[tuple[str, str]] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)  # docker HOST:CONTAINER order
    docker_opts: list[str] = field(default_factory=list)
    docker_env: dict[str, str] = field(default_factory=dict)  # the manifest's values, for the container
    kept_env: list[str] = field(default_factory=list)  # names whose value the environment gives
    secret_names: set[str] = field(default_factory=set)
    workload: list[str] = field(default_factory=list)
    script: ModelScript | None = None  # the manifest model's script, run as madengine runs it
    warnings: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # manifest fields slurm-multi does not use
    sources: dict[str, str] = field(default_factory=dict)  # setting -> where a resolved value came from
    checkout: str | None = None  # the model checkout (--model-dir, else the manifest's dir)
    mad_parts: MadParts = field(default_factory=MadParts)  # the manifest's tools, pre/post, encapsulate, data
    mad_run: MadRun | None = None  # those resolved for this job (the plan) or node (prepare)

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def secret_values(self, env: Mapping[str, str]) -> list[str]:
        """Every secret value this context can put into a log line, longest first."""
        found: set[str] = set()
        for name, value in self.docker_env.items():
            if name in self.secret_names:
                found.add(value)
        for name in self.kept_env:
            if name in self.secret_names or is_secret_name(name):
                found.add(env.get(name, ""))
        for name, value in self.build_args:
            if name in self.secret_names:
                found.add(value)
        for name, value in self.values.items():
            if is_secret_name(name):
                found.add(value)
        return sorted((v for v in found if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)

    def masked_build_args(self) -> list[str]:
        return [f"{n}={MASK if n in self.secret_names else v}" for n, v in self.build_args]

    def masked_env(self) -> dict[str, str]:
        return {n: (MASK if n in self.secret_names else v) for n, v in self.docker_env.items()}


DEFAULT_TIMEOUT = "7200"  # madengine run's --timeout default (its -1 means 7200 s)
DEFAULT_MASTER_PORT = "29500"


def _script(values: Mapping[str, str], manifest: str | None, where: str) -> ModelScript | None:
    """The manifest model's script as madengine runs it (see slurm_multi.madengine), resolved against
    --model-dir, else the manifest's directory (the model checkout's root)."""
    script = values.get("SM_MODEL_SCRIPTS", "")
    if not script:
        return None
    model_dir = checkout_dir(values, manifest)
    if values.get("SM_MODEL_DIR") and not os.path.isdir(model_dir or ""):
        raise usage_error(f"{AREA}: --model-dir {printable(values['SM_MODEL_DIR'])}: no such directory")
    return script_command(script, split_args(values.get("SM_MODEL_ARGS", ""), where), model_dir)


def checkout_dir(values: Mapping[str, str], manifest: str | None) -> str | None:
    """The model checkout: --model-dir, else the manifest's directory (madengine's cwd)."""
    return values.get("SM_MODEL_DIR") or (os.path.dirname(os.path.abspath(manifest)) if manifest else None)


def _resolved_numbers(values: dict[str, str], settings: Mapping[str, str]) -> None:
    """--timeout: ours, else the model's timeout (madengine's rule: when it is above 0), else 7200.
    --master-port: ours, else the manifest's distributed.port, else 29500."""
    if not settings.get("SM_TIMEOUT"):
        model = values.get("SM_MODEL_TIMEOUT", "").strip()
        try:
            seconds = int(float(model)) if model else 0
        except ValueError:
            raise usage_error(
                f"{AREA}: the model's timeout {printable(model)!r} is not a number of seconds"
            ) from None
        values["SM_TIMEOUT"] = str(seconds) if seconds > 0 else DEFAULT_TIMEOUT
    if not settings.get("SM_MASTER_PORT"):
        values["SM_MASTER_PORT"] = values.get("SM_DIST_PORT") or DEFAULT_MASTER_PORT


def resolve(
    env: Mapping[str, str],
    command: Sequence[str] = (),
    manifest_path: str | None = None,
    model: str | None = None,
) -> RunContext:
    """Resolve the settings in `env` with the manifest (if any). One-line usage error on bad input."""
    manifest_path = manifest_path if manifest_path is not None else env.get("SM_MANIFEST") or None
    model = model if model is not None else env.get("SM_MODEL") or None
    ctx = RunContext(manifest=manifest_path)
    # The user's settings are the table's (slurm_multi.settings): what the toolkit exports for itself
    # while it runs (SM_JOBDIR, SM_RANK, the manifest's own SM_* values on a node) is not one.
    ctx.settings = {k: env[k] for k in SETTINGS if env.get(k)}
    values = dict(ctx.settings)
    where = ""
    if manifest_path:
        manifest = load_manifest(manifest_path)
        resolved = restore_context(manifest, model, env)
        ctx.model_key = resolved["model_key"]
        where = f"manifest {printable(manifest_path)}: built_models.{printable(ctx.model_key)}."
        for name, value in resolved["exports"].items():
            values.setdefault(name, value)
        # A manifest value the environment already gives (a node re-resolving after its prepare, or
        # a user's own override): the environment wins.
        for name in resolved["skipped_set"]:
            if name.startswith("SM_") and name in env:
                values.setdefault(name, env[name])
        arrays = resolved["arrays"]
        ctx.build_args = [tuple(a.split("=", 1)) for a in arrays.get("SM_BUILD_ARGS", [])]  # type: ignore[misc]
        ctx.mounts = list(arrays.get("SM_MOUNTS", []))
        ctx.docker_opts = list(arrays.get("SM_DOCKER_OPTS", []))
        ctx.docker_env = dict(resolved["docker_env"])
        ctx.kept_env = list(resolved["kept_from_env"])
        ctx.secret_names = set(resolved["secret_names"])
        ctx.warnings = list(resolved["warnings"])
        for host_container in ctx.mounts:
            container = host_container.rsplit(":", 1)[-1]
            if is_secret_name(container):
                ctx.secret_names.add(container)
        ctx.ignored = list(resolved["ignored"])
        ctx.mad_parts = read_parts(manifest, ctx.model_key)
    _resolved_numbers(values, ctx.settings)
    ctx.values = values
    ctx.checkout = checkout_dir(values, manifest_path)
    if command:
        ctx.workload = list(command)
    else:
        ctx.script = _script(values, manifest_path, where)
        ctx.workload = list(ctx.script.argv) if ctx.script else []
    return ctx


def model_dir_name(ctx: RunContext) -> str:
    """The directory for this model under --out: one safe path component, never '.' or '..'."""
    name = ctx.get("SM_MODEL_NAME") or ctx.get("SM_MODEL") or ctx.get("SM_IMAGE") or "job"
    name = name.rstrip("/").rsplit("/", 1)[-1]
    name = _SAFE_NAME.sub("_", name).lstrip(".")
    return name or "job"


def safe_component(text: str, fallback: str) -> str:
    cleaned = _SAFE_NAME.sub("_", text).lstrip(".")
    return cleaned or fallback


def masked_settings(ctx: RunContext) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) else v) for k, v in sorted(ctx.settings.items())}


def manifest_values(ctx: RunContext) -> dict[str, Any]:
    """The manifest's resolved values for job.json (secrets masked)."""
    scalars = {k: v for k, v in ctx.values.items() if k not in ctx.settings}
    return {
        "model_key": ctx.model_key,
        "scalars": {k: (MASK if is_secret_name(k) else v) for k, v in sorted(scalars.items())},
        "build_args": ctx.masked_build_args(),
        "mounts": list(ctx.mounts),
        "docker_opts": list(ctx.docker_opts),
        "docker_env": ctx.masked_env(),
        "env_from_environment": list(ctx.kept_env),
        "workload": list(ctx.workload),
        "warnings": list(ctx.warnings),
    }
