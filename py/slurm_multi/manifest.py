"""Restore a run context from a madengine build_manifest.json as bash to `source`, or as JSON.

Precedence, the bug this module exists to avoid repeating: a value already in the environment always
wins over the manifest (runtime detection exports SM_GPU_VENDOR/SM_DOCKER_GPUS before restore, and a
rerun must not clobber a real HF_TOKEN with the manifest's literal `${HF_TOKEN}`, which gave HTTP
401/403 on gated models). A `${VAR}`/`$VAR` reference is resolved from the environment or the variable
is dropped with a warning; it is never passed on as a literal.

Every value on stdout is shlex-quoted, so sourcing the output never runs anything that a manifest
value contains. Secret values never reach stderr; in `--format json` (for display) they are masked.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from slurm_multi.common import usage_error
from slurm_multi.madengine import ignored_fields
from slurm_multi.secret_rule import MASK, is_secret_name, redact, secret_values

AREA = "manifest"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# `${VAR}` or `$VAR`; any other `${...}` form is unsupported and refused rather than passed on.
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)|\$\{")

# Names that would change the host shell that sources the output (or that bash refuses to assign,
# which would abort a `set -e` caller) are never exported from a manifest.
HOST_RESERVED_NAMES = frozenset(
    {
        "_", "BASH", "BASHOPTS", "BASHPID", "BASH_ENV", "BASH_ARGV0", "BASH_COMMAND", "BASH_SUBSHELL",
        "BASH_VERSINFO", "BASH_VERSION", "CDPATH", "ENV", "EUID", "GLOBIGNORE", "GROUPS", "HISTFILE",
        "HOME", "IFS", "LD_AUDIT", "LD_PRELOAD", "OLDPWD", "OPTERR", "OPTIND", "PATH", "PPID",
        "PROMPT_COMMAND", "PS1", "PS2", "PS4", "PWD", "RANDOM", "SECONDS", "SHELL", "SHELLOPTS",
        "SHLVL", "SRANDOM", "UID", "LINENO", "FUNCNAME", "EPOCHSECONDS", "EPOCHREALTIME",
    }
)  # fmt: skip

# Scalar SM_* variables as (name, section, field). Sections: "model" = built_models[KEY], "image" =
# built_images[KEY], "context", "distributed"/"slurm" = deployment_config.distributed / .slurm.
SCALAR_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("SM_MODEL_NAME", "model", "name"),
    ("SM_IMAGE", "image", "docker_image"),
    ("SM_DOCKERFILE", "model", "dockerfile"),
    ("SM_DOCKER_CONTEXT", "model", "dockercontext"),
    ("SM_BASE_DOCKER", "image", "base_docker"),
    ("SM_LOCAL_IMAGE", "image", "local_image"),
    ("SM_MODEL_SCRIPTS", "model", "scripts"),
    ("SM_MODEL_ARGS", "model", "args"),
    ("SM_N_GPUS", "model", "n_gpus"),
    ("SM_SKIP_GPU_ARCH", "model", "skip_gpu_arch"),
    ("SM_MODEL_TIMEOUT", "model", "timeout"),
    ("SM_MODEL_TAGS", "model", "tags"),
    ("SM_RESULTS_CSV", "model", "multiple_results"),
    ("SM_DOCKER_GPUS", "context", "docker_gpus"),
    ("SM_GPU_VENDOR", "context", "gpu_vendor"),
    ("SM_GUEST_OS", "context", "guest_os"),
    ("SM_BUILD_DURATION", "image", "build_duration"),
    ("SM_LAUNCHER", "distributed", "launcher"),
    ("SM_GPUS_PER_NODE", "slurm", "gpus_per_node"),
    ("SM_REGISTRY_IMAGE", "image", "registry_image"),
    ("SM_NPROC_PER_NODE", "distributed", "nproc_per_node"),
    ("SM_DIST_NNODES", "distributed", "nnodes"),
    ("SM_DIST_PORT", "distributed", "port"),
    ("SM_SLURM_NODES", "slurm", "nodes"),
    ("SM_PRIMUS_CONFIG_PATH", "primus", "config_path"),
    ("SM_PRIMUS_CLI_EXTRA", "primus", "cli_extra"),
    ("SM_PRIMUS_BACKEND", "primus", "backend"),
    ("SM_DISAGG_PREFILL_NODES", "sglang_disagg", "prefill_nodes"),
    ("SM_DISAGG_DECODE_NODES", "sglang_disagg", "decode_nodes"),
    ("SM_TRAINING_PRECISION", "model", "training_precision"),
    # madengine's log error scan switch (default on); exported as "true" or "false" (scan_switch).
    ("SM_LOG_ERROR_PATTERN_SCAN", "model", "log_error_pattern_scan"),
)
# Lists of literal strings (madengine's log error scan: the patterns that replace its default ones,
# and the texts that keep a line from counting), exported as JSON text: a pattern may hold a comma.
LIST_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("SM_LOG_ERROR_PATTERNS", "model", "log_error_patterns"),
    ("SM_LOG_ERROR_BENIGN_PATTERNS", "model", "log_error_benign_patterns"),
)
SWITCH_FIELDS = ("log_error_pattern_scan",)  # scalars that must read as true or false
# Scalars of deployment_config.<part> (and of distributed.<part>) that validate_manifest type-checks.
DEPLOYMENT_SCALARS = tuple(
    (s, f) for _, s, f in SCALAR_FIELDS if s in ("distributed", "slurm", "primus", "sglang_disagg")
)
# Fields of a built_models entry that may also be a list (joined with commas, as madengine reads them).
LIST_OK = ("tags", "skip_gpu_arch")
# Fields of a built_models/built_images entry that we read as scalars (others are ignored).
ENTRY_SCALARS = tuple(
    sorted({key for _, section, key in SCALAR_FIELDS if section in ("model", "image") and key not in LIST_OK})
) + ("additional_docker_run_options",)
ARRAY_NAMES = ("SM_BUILD_ARGS", "SM_MOUNTS", "SM_DOCKER_OPTS", "SM_DOCKER_ENV_NAMES")


class ShapeError(ValueError):
    """The manifest decoded but does not have the shape of a madengine build_manifest.json."""


# ---------------------------------------------------------------------------------------------
# Loading and shape checks


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ShapeError(f"duplicate key {printable(key)}")
        result[key] = value
    return result


def load_manifest(path: str) -> dict[str, Any]:
    """Read and shape-check a build_manifest.json ('-' = stdin); one-line usage error on any problem."""
    label = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            raw = sys.stdin.buffer.read()
        else:
            with open(path, "rb") as handle:
                raw = handle.read()
    except OSError as exc:
        raise usage_error(f"{AREA}: {printable(label)}: cannot read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise usage_error(
            f"{AREA}: {printable(label)}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    try:
        manifest = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise usage_error(
            f"{AREA}: {printable(label)}: not JSON (line {exc.lineno} column {exc.colno}: {exc.msg})"
        ) from None
    except ShapeError as exc:
        raise usage_error(f"{AREA}: {printable(label)}: not a build manifest ({exc})") from None
    except RecursionError:
        raise usage_error(f"{AREA}: {printable(label)}: not JSON (nested too deeply)") from None
    try:
        validate_manifest(manifest)
    except ShapeError as exc:
        raise usage_error(f"{AREA}: {printable(label)}: not a build manifest ({exc})") from None
    return manifest


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _expect_object(value: Any, where: str, optional: bool = True) -> dict[str, Any]:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise ShapeError(f"{where} must be an object, got {_type_name(value)}")
    return value


def _check_text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise ShapeError(f"{where} must be a string, got {_type_name(value)}")
    # bash variables cannot hold NUL and a lone surrogate has no UTF-8 form: either would silently
    # change the value on its way through `source`.
    if "\x00" in value:
        raise ShapeError(f"{where} contains a NUL character")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ShapeError(f"{where} contains an unpaired surrogate (\\ud800-\\udfff)")


def _check_scalar(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, int, float)):
        return
    if isinstance(value, str):
        _check_text(value, where)
        return
    raise ShapeError(f"{where} must be a string, number or boolean, got {_type_name(value)}")


def _check_text_list(value: Any, where: str) -> None:
    """A list of non-empty strings, or absent (an empty string would match, or excuse, every line)."""
    if value is None:
        return
    if not isinstance(value, list):
        raise ShapeError(f"{where} must be a list of strings, got {_type_name(value)}")
    for i, item in enumerate(value):
        _check_text(item, f"{where}[{i}]")
        if not item:
            raise ShapeError(f"{where}[{i}] is empty (it would match every line); remove it")


def scan_switch(value: Any) -> bool | None:
    """A switch as madengine reads one: a JSON boolean, a number (0 is off), or the text true/false,
    yes/no, on/off, 1/0 (any case; "" is off); None when the value is none of these."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("0", "false", "no", "off", ""):
            return False
        if text in ("1", "true", "yes", "on"):
            return True
    return None


def log_scan_values(values: Mapping[str, str]) -> dict[str, Any]:
    """The model's log error scan for job.json, from the SM_* values restore_context exported (or the
    environment gave): {"log_error_pattern_scan": bool, "log_error_patterns": [str],
    "log_error_benign_patterns": [str]}. A value of another shape is a one-line usage error."""
    switch = values.get("SM_LOG_ERROR_PATTERN_SCAN")
    scan = True if switch is None else scan_switch(switch)
    if scan is None:
        raise usage_error(
            f"{AREA}: SM_LOG_ERROR_PATTERN_SCAN={printable(switch or '')!r} (log_error_pattern_scan) "
            "must be true or false; unset it to use the manifest's"
        )
    result: dict[str, Any] = {"log_error_pattern_scan": scan}
    for name, _, field in LIST_FIELDS:
        text = values.get(name)
        try:
            items = json.loads(text) if text else []
            _check_text_list(items, field)
        except (json.JSONDecodeError, ShapeError, RecursionError) as exc:
            why = str(exc) if isinstance(exc, ShapeError) else "not a JSON list of strings"
            raise usage_error(f"{AREA}: {name} ({field}): {why}; unset it to use the manifest's") from None
        result[field] = items
    return result


def _check_string_map(value: Any, where: str) -> None:
    for key, item in _expect_object(value, where).items():
        _check_text(key, f"{where} key")
        _check_scalar(item, f"{where}.{printable(key)}")


def validate_manifest(manifest: Any) -> None:
    """Raise ShapeError naming the first field whose type is not what madengine writes."""
    if not isinstance(manifest, dict):
        raise ShapeError(f"top level must be an object, got {_type_name(manifest)}")
    if "built_models" not in manifest:
        raise ShapeError("built_models is missing")
    models = _expect_object(manifest["built_models"], "built_models", optional=False)
    images = _expect_object(manifest.get("built_images"), "built_images")
    for section, entries in (("built_models", models), ("built_images", images)):
        for key, entry in entries.items():
            _check_text(key, f"{section} key")
            where = f"{section}.{printable(key)}"
            fields = _expect_object(entry, where, optional=False)
            for field in ENTRY_SCALARS:
                _check_scalar(fields.get(field), f"{where}.{field}")
            for name in LIST_OK:
                items = fields.get(name)
                for i, item in enumerate(items if isinstance(items, list) else [items]):
                    _check_scalar(
                        item, f"{where}.{name}[{i}]" if isinstance(items, list) else f"{where}.{name}"
                    )
            for field in SWITCH_FIELDS:
                if fields.get(field) is not None and scan_switch(fields[field]) is None:
                    raise ShapeError(
                        f"{where}.{field} must be true or false (or 1/0, yes/no, on/off), "
                        f"got {printable(repr(fields[field]))}"
                    )
            for _, _, field in LIST_FIELDS:
                _check_text_list(fields.get(field), f"{where}.{field}")
    context = _expect_object(manifest.get("context"), "context")
    for field in ("docker_env_vars", "docker_mounts", "docker_build_arg"):
        _check_string_map(context.get(field), f"context.{field}")
    for field in ("docker_gpus", "gpu_vendor", "guest_os"):
        _check_scalar(context.get(field), f"context.{field}")
    deployment = _expect_object(manifest.get("deployment_config"), "deployment_config")
    distributed = _expect_object(deployment.get("distributed"), "deployment_config.distributed")
    parents = {
        "distributed": deployment,
        "slurm": deployment,
        "primus": distributed,
        "sglang_disagg": distributed,
    }
    for part, field in DEPLOYMENT_SCALARS:
        where = "deployment_config." + ("distributed." if parents[part] is distributed else "") + part
        section = _expect_object(parents[part].get(part), where)
        _check_scalar(section.get(field), f"{where}.{field}")


# ---------------------------------------------------------------------------------------------
# Resolution


def printable(text: str) -> str:
    """Text safe for one log or comment line: control characters shown as escapes."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


def is_bash_name(name: str) -> bool:
    return _IDENT.fullmatch(name) is not None


def scalar_text(value: Any) -> str:
    """A manifest scalar as the string a shell variable holds (JSON spelling for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class Unresolved(Exception):
    """A `${VAR}`/`$VAR` reference names an unset variable (or uses an unsupported form)."""

    def __init__(self, var: str) -> None:
        super().__init__(var)
        self.var = var


def expand_references(value: str, env: Mapping[str, str]) -> tuple[str, list[str]]:
    """Substitute `${VAR}`/`$VAR` from env; return (text, referenced names). Raise Unresolved.

    A `$` not followed by a name (`$5`, `$$`, a trailing `$`) is literal text, as in a shell.
    """
    used: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        var = match.group(1) or match.group(2)
        if var is None:
            raise Unresolved("${…} (only ${VAR} and $VAR are supported)")
        if var not in env:
            raise Unresolved(var)
        used.append(var)
        return env[var]

    return _REFERENCE.sub(substitute, value), used


def select_model(manifest: Mapping[str, Any], model: str | None) -> str:
    """The built_models key chosen by --model (a key or a model name), or the only model."""
    models: dict[str, Any] = manifest.get("built_models") or {}
    keys = list(models)
    listing = ", ".join(printable(k) for k in keys)
    if not keys:
        raise usage_error(f"{AREA}: built_models is empty; nothing to restore")
    if model is None:
        if len(keys) == 1:
            return keys[0]
        raise usage_error(f"{AREA}: several models in built_models ({listing}); choose one with --model KEY")
    if model in models:
        return model
    by_name = [k for k, entry in models.items() if isinstance(entry, dict) and entry.get("name") == model]
    if len(by_name) == 1:
        return by_name[0]
    if len(by_name) > 1:
        matches = ", ".join(printable(k) for k in by_name)
        raise usage_error(
            f"{AREA}: model name {printable(model)} matches several keys ({matches}); use a key"
        )
    raise usage_error(f"{AREA}: no model {printable(model)} in built_models (keys: {listing})")


def _field(sections: Mapping[str, Mapping[str, Any]], section: str, key: str) -> str | None:
    value = sections[section].get(key)
    if value is None:
        return None
    if key in SWITCH_FIELDS:
        return "true" if scan_switch(value) else "false"
    if isinstance(value, list):  # tags, skip_gpu_arch
        return ",".join(scalar_text(item) for item in value if item is not None)
    return scalar_text(value)


def _list_field(sections: Mapping[str, Mapping[str, Any]], section: str, key: str) -> str | None:
    value = sections[section].get(key)
    return None if value is None else json.dumps(list(value), ensure_ascii=False)


def restore_context(manifest: Mapping[str, Any], model: str | None, env: Mapping[str, str]) -> dict[str, Any]:
    """Resolve the run context of one model against the environment.

    Returns {"model_key", "exports": {SM_*: str}, "arrays": {name: [str]}, "docker_env": {NAME: str},
    "kept_from_env": [NAME], "secret_names": [NAME], "skipped_set": [SM_* already in env],
    "warnings": [str]}. Only variables that are not set in env appear in exports/arrays/docker_env.
    Raises HelperError (usage) on a wrong-shaped manifest or an ambiguous model.
    """
    try:
        validate_manifest(manifest)
    except ShapeError as exc:
        raise usage_error(f"{AREA}: not a build manifest ({exc})") from None
    key = select_model(manifest, model)
    context = manifest.get("context") or {}
    deployment = manifest.get("deployment_config") or {}
    distributed = deployment.get("distributed") or {}
    sections: dict[str, Mapping[str, Any]] = {
        "model": manifest["built_models"][key],
        "image": (manifest.get("built_images") or {}).get(key) or {},
        "context": context,
        "distributed": distributed,
        "slurm": deployment.get("slurm") or {},
        "primus": distributed.get("primus") or {},
        "sglang_disagg": distributed.get("sglang_disagg") or {},
    }
    warnings: list[str] = []
    if key not in (manifest.get("built_images") or {}):
        warnings.append(
            f"built_images has no entry {printable(key)}; SM_IMAGE and build details not restored"
        )

    exports: dict[str, str] = {}
    skipped: list[str] = []
    candidates = [("SM_MODEL_KEY", key)] + [(n, _field(sections, s, k)) for n, s, k in SCALAR_FIELDS]
    candidates += [(n, _list_field(sections, s, k)) for n, s, k in LIST_FIELDS]
    for i, (name, value) in enumerate(candidates):
        if name == "SM_DOCKERFILE" and value is None:  # the model's entry first, then the image's
            candidates[i] = (name, _field(sections, "image", "dockerfile"))
    for name, value in candidates:
        if value is None:
            continue
        if name in env:
            skipped.append(name)
        else:
            exports[name] = value

    secret_names: set[str] = set()
    arrays: dict[str, list[str]] = {}
    arrays["SM_BUILD_ARGS"] = _build_args(context.get("docker_build_arg") or {}, env, warnings, secret_names)
    arrays["SM_MOUNTS"] = _mounts(context.get("docker_mounts") or {}, env, warnings)
    arrays["SM_DOCKER_OPTS"] = _docker_opts(sections["model"].get("additional_docker_run_options"), env)
    docker_env, kept, names = _docker_env(context.get("docker_env_vars") or {}, env, warnings, secret_names)
    arrays["SM_DOCKER_ENV_NAMES"] = names
    for name in ARRAY_NAMES:
        if name in env:
            skipped.append(name)
            del arrays[name]
    return {
        "model_key": key,
        "exports": exports,
        "arrays": arrays,
        "docker_env": docker_env,
        "kept_from_env": kept,
        "secret_names": sorted(secret_names),
        "skipped_set": skipped,
        "warnings": warnings,
        "ignored": ignored_fields(manifest, key),
    }


def _docker_env(
    variables: Mapping[str, Any], env: Mapping[str, str], warnings: list[str], secret_names: set[str]
) -> tuple[dict[str, str], list[str], list[str]]:
    docker_env: dict[str, str] = {}
    kept: list[str] = []
    names: list[str] = []
    for name, raw in variables.items():
        shown = printable(name)
        if not is_bash_name(name):
            warnings.append(f"dropped docker_env_vars {shown}: not a valid variable name")
            continue
        if name in HOST_RESERVED_NAMES or name.startswith("SM_") or name.startswith("BASH_FUNC_"):
            warnings.append(f"dropped docker_env_vars {shown}: reserved name on the host shell")
            continue
        if name in env:  # the environment wins, whatever the manifest holds
            kept.append(name)
            names.append(name)
            if is_secret_name(name):
                secret_names.add(name)
            continue
        if raw is None:
            warnings.append(f"dropped docker_env_vars {shown}: null value")
            continue
        try:
            value, used = expand_references(scalar_text(raw), env)
        except Unresolved as exc:
            warnings.append(
                f"dropped docker_env_vars {shown}: it references {printable(exc.var)}, which is not set "
                f"(export {printable(exc.var) if is_bash_name(exc.var) else 'it'} "
                "before the run to pass it on)"
            )
            continue
        if is_secret_name(name) or any(is_secret_name(var) for var in used):
            secret_names.add(name)
        docker_env[name] = value
        names.append(name)
    return docker_env, kept, names


def _build_args(
    build_args: Mapping[str, Any], env: Mapping[str, str], warnings: list[str], secret_names: set[str]
) -> list[str]:
    result: list[str] = []
    for name, raw in build_args.items():
        shown = printable(name)
        if not is_bash_name(name):
            warnings.append(f"dropped docker_build_arg {shown}: not a valid build-arg name")
            continue
        if raw is None:
            warnings.append(f"dropped docker_build_arg {shown}: null value")
            continue
        try:
            value, used = expand_references(scalar_text(raw), env)
        except Unresolved as exc:
            warnings.append(
                f"dropped docker_build_arg {shown}: it references {printable(exc.var)}, which is not set"
            )
            continue
        if is_secret_name(name) or any(is_secret_name(var) for var in used):
            secret_names.add(name)
        result.append(f"{name}={value}")
    return result


def _mounts(mounts: Mapping[str, Any], env: Mapping[str, str], warnings: list[str]) -> list[str]:
    """docker_mounts maps CONTAINER -> HOST; the array holds docker's HOST:CONTAINER order."""
    result: list[str] = []
    for container, raw in mounts.items():
        shown = printable(container)
        if raw is None or not str(raw):
            raise usage_error(
                f"{AREA}: docker_mounts {shown}: no host path; a mount the job needs cannot be left out"
            )
        try:
            host, _ = expand_references(scalar_text(raw), env)
            container_path, _ = expand_references(container, env)
        except Unresolved as exc:
            warnings.append(
                f"dropped docker_mounts {shown}: it references {printable(exc.var)}, which is not set"
            )
            continue
        if not container_path.startswith("/") or ":" in container_path or ":" in host or not host:
            raise usage_error(
                f"{AREA}: docker_mounts {shown}: expected an absolute container path and a host path, "
                "neither with ':'; a mount the job needs cannot be left out"
            )
        result.append(f"{host}:{container_path}")
    return result


def _docker_opts(options: Any, env: Mapping[str, str]) -> list[str]:
    if options is None:
        return []
    try:
        words = shlex.split(scalar_text(options))
    except ValueError as exc:
        raise usage_error(
            f"{AREA}: additional_docker_run_options cannot be split into words ({exc})"
        ) from None
    result: list[str] = []
    for word in words:
        try:
            expanded, _ = expand_references(word, env)
        except Unresolved as exc:
            raise usage_error(
                f"{AREA}: additional_docker_run_options references {printable(exc.var)}, which is not set; "
                "export it or edit the manifest"
            ) from None
        result.append(expanded)
    return result


# ---------------------------------------------------------------------------------------------
# Rendering


def render_bash(resolved: Mapping[str, Any], source: str) -> str:
    """Bash that `source` turns into the resolved variables; every value is a single shell word."""
    lines = [f"# slurm-multi manifest restore: {printable(source)} model {printable(resolved['model_key'])}"]
    for name, value in resolved["exports"].items():
        lines.append(f"export {name}={shlex.quote(value)}")
    for name, values in resolved["arrays"].items():
        lines.append(f"{name}=({' '.join(shlex.quote(v) for v in values)})")
    for name, value in resolved["docker_env"].items():
        lines.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def render_json(resolved: Mapping[str, Any], source: str, env: Mapping[str, str]) -> str:
    """The resolved context for display: secret values (by name or by value) shown as ***."""
    secret_names = set(resolved["secret_names"])
    secrets = secret_values(env) + sorted(
        (v for k, v in resolved["docker_env"].items() if k in secret_names and v), key=len, reverse=True
    )
    docker_env = {
        k: (MASK if k in secret_names else redact(v, secrets)) for k, v in resolved["docker_env"].items()
    }
    arrays = {name: [redact(v, secrets) for v in values] for name, values in resolved["arrays"].items()}
    if "SM_BUILD_ARGS" in arrays:
        arrays["SM_BUILD_ARGS"] = [
            f"{arg.split('=', 1)[0]}={MASK}" if arg.split("=", 1)[0] in secret_names else arg
            for arg in arrays["SM_BUILD_ARGS"]
        ]
    document = {
        "manifest": source,
        "model_key": resolved["model_key"],
        "exports": {k: redact(v, secrets) for k, v in resolved["exports"].items()},
        "arrays": arrays,
        "docker_env": docker_env,
        "kept_from_env": resolved["kept_from_env"],
        "skipped_set": resolved["skipped_set"],
        "warnings": resolved["warnings"],
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


__all__ = [
    "expand_references",
    "load_manifest",
    "render_bash",
    "render_json",
    "restore_context",
    "select_model",
    "validate_manifest",
]
