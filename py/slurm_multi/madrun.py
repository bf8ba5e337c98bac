"""What a MAD model's run has around its script: madengine's `scripts/common` (tools.json, the pre
and post scripts, the profiler wrappers), the context's `tools`, `pre_scripts`, `post_scripts` and
`encapsulate_script`, and the model's data provider, composed into the one bash command a node runs
in the model's run directory, in madengine's order.

Read from ROCm/madengine (execution/container_runner.py = CR, orchestration/run_orchestrator.py =
RO, core/dataprovider.py = DP, deployment/slurm.py + deployment/common.py = S/CM); docs/madengine.md
has the table. In short:

- `scripts/common` is `<checkout>/scripts/common` (RO `_copy_scripts` lays it beside the model's
  scripts), else the installed madengine package's, else `--mad-common DIR` (given, it wins). The
  workload sees it as `../scripts/common` from its run directory, as under madengine.
- Tools (CR apply_tools 783-845): each named tool of tools.json, with the context's `cmd` and
  `env_vars` overrides; its pre-scripts go before the ones already listed, its post-scripts after,
  its command in front of the command so far (the last tool is outermost), its variables into the
  container. On more than one node, `rocprof` becomes `rocprofv3` (S:627-656, CM:261-267).
- Pre/post scripts (CR run_pre_post_script 1006-1021): each copied into the run directory and run
  there as `bash <name> <args>`. A post-script also runs when the model failed (madengine skips
  them then, and a profiler started by a pre-script is never stopped: docs/madengine.md).
- The model's command is `<tools' commands> <encapsulate_script> bash <script> <args>`, run by
  bash: `$VAR` in args expands inside the container, as `bash -c` does under madengine.
- Data (DP, CR 1455-1566): data.json in the checkout; `local` (and `nas`, a path every node
  mounts) is mounted read-only at MAD_DATAHOME (`home`, else /data_dlm_<i>); the other providers
  need madengine's downloaders inside the container and fail in the plan with one line.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from slurm_multi.common import usage_error

AREA = "madengine"
COMMON = "scripts/common"
# Tools whose outputs are profiles: every rank's output is part of the verdict (profile-optional).
PROFILER_TOOLS = frozenset({"rocprof", "rocprof_hip_only", "rocprof_sys", "rpd", "rocm_trace_lite",
                            "rocm_trace_lite_default"})  # fmt: skip
# What madengine's tools leave in the run directory or the workspace (CR 1973-1995, the SLURM
# template's per-node collection): staged into node_<rank>/tools/.
TOOL_OUTPUTS = ("rocprof_output", "rpd_output", "rocm_trace_lite_output", "*_env.csv", "gpu_info_*.csv",
                "library_trace.csv", "*_profiler_output.csv", "*_trace.csv")  # fmt: skip
MISSING_MARKER = ".sm-script-missing"
# docker: where the wrapper stages the tools' outputs inside the container (the node copies them out).
CONTAINER_TOOLS_DIR = "/myworkspace/sm-tools"
DATA_HOME = "/data_dlm"
DATA_PROVIDERS = ("custom", "local", "minio", "nas", "aws")  # madengine's order of trying (DP 648-675)
MOUNTED_PROVIDERS = ("local", "nas")
# Providers that download with madengine's own tools (awscli installed at run time, its
# credentials): not run here; the plan says so (docs/madengine.md).
DOWNLOADERS = ("minio", "aws")


def is_profiler(name: str) -> bool:
    return name in PROFILER_TOOLS or name.startswith("rocprofv3")


@dataclass(frozen=True)
class Script:
    """A pre- or post-script: a path relative to the workspace (madengine's cwd) and its args."""

    path: str
    args: str
    origin: str  # "context" or "tool <name>"


@dataclass(frozen=True)
class DataSource:
    """One of the model's data names, as the provider that serves it."""

    name: str
    provider: str
    path: str  # on the host (the node): the data (local, nas) or the custom provider's script
    home: str  # MAD_DATAHOME: where the container sees it
    writable: bool = False  # mounted: data.json's "readwrite": "true" (else read-only)
    script: str = ""  # custom: the script, relative to the workspace (madengine's /myworkspace)
    args: str = ""  # custom: its args

    @property
    def mounted(self) -> bool:
        return self.provider in MOUNTED_PROVIDERS

    @property
    def mount(self) -> str:
        """A mounted provider's `<path>:<home>[:ro]` (docker -v, pyxis --container-mounts)."""
        return f"{self.path}:{self.home}{'' if self.writable else ':ro'}"


@dataclass
class MadParts:
    """The manifest's fields around the model's script, shape-checked in the plan and on each node."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    pre: list[Script] = field(default_factory=list)
    post: list[Script] = field(default_factory=list)
    encapsulate: str = ""
    data: list[str] = field(default_factory=list)

    def any(self) -> bool:
        return bool(self.tools or self.pre or self.post or self.encapsulate or self.data)


@dataclass
class MadRun:
    """This model's run, resolved: what the node mounts, sets and runs."""

    common: str | None = None  # host dir seen as <workspace>/scripts/common
    files: list[tuple[str, str]] = field(default_factory=list)  # (host path, workspace path) of other scripts
    tools: list[str] = field(default_factory=list)
    pre: list[Script] = field(default_factory=list)
    post: list[Script] = field(default_factory=list)
    prefix: str = ""  # the tools' commands and encapsulate_script, in madengine's order
    env: dict[str, str] = field(default_factory=dict)
    data: list[DataSource] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said once, by the plan (not by every node)

    @property
    def profilers(self) -> list[str]:
        return [name for name in self.tools if is_profiler(name)]

    def job_facts(self) -> dict[str, Any]:
        """What job.json records of this run: perf.csv's data columns, the profiler tools."""
        return {**self.data_columns(), "profiler_tools": self.profilers}

    def data_columns(self) -> dict[str, str]:
        """perf.csv's data columns as madengine fills them for these providers (CR 1549-1560)."""
        if not self.data:
            return {}
        return {
            "dataname": ",".join(d.name for d in self.data),
            "data_provider_type": ",".join(d.provider for d in self.data),
            "data_size": "",
            "data_download_duration": "0",
        }


# ---- the manifest's fields -------------------------------------------------------------------------


def _scripts(value: Any, where: str) -> list[Script]:
    if value in (None, ""):
        return []
    if not isinstance(value, list):
        raise usage_error(f"{AREA}: {where} must be a list of {{path, args}} objects")
    found = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or not item["path"].strip():
            raise usage_error(f"{AREA}: {where}[{i}] must be an object with a path (a string)")
        args = item.get("args", "")
        if not isinstance(args, str):
            raise usage_error(f"{AREA}: {where}[{i}].args must be a string")
        path = os.path.normpath(item["path"].strip())
        if os.path.isabs(path) or path.startswith(".."):
            raise usage_error(f"{AREA}: {where}[{i}].path {item['path']!r} must be relative to the checkout")
        found.append(
            Script(path, args.strip(), where.split(".")[0] if where.startswith("tool") else "context")
        )
    return found


def read_parts(manifest: Mapping[str, Any], key: str) -> MadParts:
    """The tools, scripts, encapsulate_script and data names of this model, shape-checked."""
    context = manifest.get("context") or {}
    model = (manifest.get("built_models") or {}).get(key) or {}
    tools = context.get("tools") or []
    if not isinstance(tools, list):
        raise usage_error(f"{AREA}: context.tools must be a list of {{name, cmd, env_vars}} objects")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise usage_error(f"{AREA}: context.tools[{i}] must be an object with a name (a string)")
        if not isinstance(tool.get("cmd", ""), str):
            raise usage_error(f"{AREA}: context.tools[{i}].cmd must be a string")
        env_vars = tool.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
            isinstance(v, (str, int, float)) for v in env_vars.values()
        ):
            raise usage_error(f"{AREA}: context.tools[{i}].env_vars must be an object of strings")
    encapsulate = context.get("encapsulate_script") or ""
    if not isinstance(encapsulate, str):
        raise usage_error(f"{AREA}: context.encapsulate_script must be a string")
    data = model.get("data") or ""
    if not isinstance(data, str):
        raise usage_error(f"{AREA}: built_models.{key}.data must be a string (data names, comma-separated)")
    return MadParts(
        tools=list(tools),
        pre=_scripts(context.get("pre_scripts"), "context.pre_scripts"),
        post=_scripts(context.get("post_scripts"), "context.post_scripts"),
        encapsulate=encapsulate.strip(),
        data=[name.strip() for name in data.split(",") if name.strip()],
    )


# ---- scripts/common and tools.json -------------------------------------------------------------------


def find_common(checkout: str | None, option: str = "") -> str | None:
    """`--mad-common DIR` when given, else the checkout's scripts/common, else the installed
    madengine package's (found without importing it)."""
    if option:
        if not os.path.isdir(option):
            raise usage_error(f"{AREA}: --mad-common {option}: no such directory")
        return os.path.abspath(option)
    if checkout and os.path.isdir(os.path.join(checkout, COMMON)):
        return os.path.abspath(os.path.join(checkout, COMMON))
    import importlib.util

    try:
        spec = importlib.util.find_spec("madengine")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = os.path.join(location, COMMON)
            if os.path.isdir(candidate):
                return candidate
    return None


def load_tools(common: str) -> dict[str, Any]:
    path = os.path.join(common, "tools.json")
    try:
        with open(path, encoding="utf-8") as handle:
            tools = json.load(handle).get("tools")
    except OSError as exc:
        raise usage_error(f"{AREA}: cannot read {path}: {exc.strerror}") from None
    except (ValueError, AttributeError) as exc:
        raise usage_error(f"{AREA}: {path} is not madengine's tools.json ({exc})") from None
    if not isinstance(tools, dict):
        raise usage_error(f'{AREA}: {path} has no "tools" object')
    return tools


def apply_tools(parts: MadParts, tools_json: Mapping[str, Any], nnodes: int, run: MadRun) -> None:
    """madengine's apply_tools: pre-scripts prepended, post-scripts appended, commands in front of
    the command so far (the same command once), variables set; rocprof -> rocprofv3 on >1 node."""
    pre, post, prefix, added = list(parts.pre), list(parts.post), parts.encapsulate, set()
    for entry in parts.tools:
        name = entry["name"]
        if name == "rocprof" and nnodes > 1 and "rocprofv3" in tools_json:
            run.notes.append("tool rocprof runs as rocprofv3 on a multi-node job (madengine's rule)")
            name = "rocprofv3"
        if name not in tools_json or not isinstance(tools_json[name], dict):
            known = ", ".join(sorted(tools_json))
            raise usage_error(
                f"{AREA}: context.tools names {name!r}, which tools.json does not have ({known})"
            )
        tool = tools_json[name]
        where = f"tool {name}"
        pre = _scripts(tool.get("pre_scripts"), f"{where}.pre_scripts") + pre
        post = post + _scripts(tool.get("post_scripts"), f"{where}.post_scripts")
        env = {**(tool.get("env_vars") or {}), **(entry.get("env_vars") or {})}
        run.env.update({str(k): str(v) for k, v in env.items()})
        cmd = entry.get("cmd", tool.get("cmd", "")) or ""
        if cmd.strip() and cmd not in added:
            added.add(cmd)
            prefix = f"{cmd} {prefix}" if prefix else cmd
        run.tools.append(name)
    run.pre, run.post, run.prefix = pre, post, prefix.strip()


# ---- data providers -----------------------------------------------------------------------------


def resolve_data(names: Sequence[str], checkout: str | None) -> list[DataSource]:
    """Each data name's provider from the checkout's data.json, tried in madengine's order; one line
    for a name it lacks or a provider we cannot run."""
    if not names:
        return []
    path = os.path.join(checkout or ".", "data.json")
    try:
        with open(path, encoding="utf-8") as handle:
            table = json.load(handle)
    except OSError as exc:
        raise usage_error(
            f"{AREA}: the model needs data ({', '.join(names)}) but {path} cannot be read ({exc.strerror})"
        ) from None
    except ValueError as exc:
        raise usage_error(f"{AREA}: {path} is not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise usage_error(f"{AREA}: {path} must be an object of data names")
    found = []
    for index, name in enumerate(names):
        providers = table.get(name)
        if not isinstance(providers, dict) or not providers:
            raise usage_error(f"{AREA}: data name {name!r} is not in {path}")
        tried = []
        for provider in DATA_PROVIDERS + tuple(p for p in providers if p not in DATA_PROVIDERS):
            config = providers.get(provider)
            if not isinstance(config, dict):
                continue
            if provider in DOWNLOADERS or provider not in (*MOUNTED_PROVIDERS, "custom"):
                tried.append(f"{provider}: slurm-multi cannot run madengine's {provider} downloader")
                continue
            home = str(config.get("home") or f"{DATA_HOME}_{index}")
            if provider == "custom":
                # madengine: `mkdir -p <home>; cd <home>; bash /myworkspace/<path> <args>` in the
                # container, the script's path relative to its cwd (the checkout).
                script = os.path.normpath(str(config.get("path") or ""))
                host = os.path.join(checkout or ".", script)
                if (
                    not config.get("path")
                    or os.path.isabs(script)
                    or script.startswith("..")
                    or not os.path.isfile(host)
                ):
                    tried.append(
                        f"custom: script {config.get('path') or '(none)'} is not a file in the checkout"
                    )
                    continue
                args = str(config.get("args") or "")
                host = os.path.abspath(host)
                found.append(DataSource(name, provider, host, home, script=script, args=args))
                break
            source = str(config.get("path") or "")
            if source and not os.path.isabs(source):  # ours: relative to the checkout, as data.json is
                source = os.path.join(checkout or ".", source)
            if not source or not os.path.isdir(source):
                tried.append(f"{provider}: path {source or '(none)'} is not a directory on this node")
                continue
            writable = str(config.get("readwrite", "")).lower() == "true"
            found.append(DataSource(name, provider, os.path.abspath(source), home, writable))
            break
        else:
            raise usage_error(
                f"{AREA}: no data provider of {name!r} in {path} can serve it: {'; '.join(tried)}"
            )
    return found


# ---- the command ---------------------------------------------------------------------------------


def plan_run(parts: MadParts, checkout: str | None, values: Mapping[str, str], nnodes: int,
             bare_root: str | None = None) -> MadRun:  # fmt: skip
    """The run around the model's script, resolved (raises a one-line usage error). `bare_root`: the
    node's directory of a bare-metal run (no container to mount into): a mounted provider's data is
    seen where it is, a custom provider's made under `bare_root` (its home there), and MAD_DATAHOME
    names those."""
    run = MadRun()
    run.common = find_common(checkout, values.get("SM_MAD_COMMON", ""))
    if parts.tools:
        if run.common is None:
            raise usage_error(
                f"{AREA}: context.tools needs madengine's {COMMON}/tools.json: none in the checkout "
                f"({checkout}), no madengine package installed; give --mad-common DIR"
            )
        apply_tools(parts, load_tools(run.common), nnodes, run)
    else:
        run.pre, run.post, run.prefix = list(parts.pre), list(parts.post), parts.encapsulate
    for script in run.pre + run.post:
        if script.path.startswith(COMMON + "/"):
            if run.common is None or not os.path.isfile(
                os.path.join(run.common, script.path[len(COMMON) + 1 :])
            ):
                raise usage_error(
                    f"{AREA}: {script.origin} script {script.path} is not in {run.common or COMMON}"
                )
            continue
        host = os.path.join(checkout or ".", script.path)
        if not os.path.isfile(host):
            raise usage_error(
                f"{AREA}: {script.origin} script {script.path} is not in the checkout ({checkout})"
            )
        if (os.path.abspath(host), script.path) not in run.files:
            run.files.append((os.path.abspath(host), script.path))
    run.data = resolve_data(parts.data, checkout)
    if bare_root is not None:
        homes = [d.path if d.mounted else os.path.join(bare_root, d.home.strip("/")) for d in run.data]
        run.data = [replace(d, home=home) for d, home in zip(run.data, homes)]
    run.files += [(d.path, d.script) for d in run.data if d.script and (d.path, d.script) not in run.files]
    if run.data:
        run.env["MAD_DATAHOME"] = ",".join(d.home for d in run.data)
        run.env["MAD_DATANAME"] = ",".join(parts.data)
    return run


def model_line(run: MadRun, argv: Sequence[str], raw_args: str) -> str:
    """The model's command as madengine builds it: the prefix, the interpreter and script, the args
    as written (bash reads them)."""
    words = [run.prefix, " ".join(shlex.quote(w) for w in argv[:2]), raw_args.strip()]
    return " ".join(w for w in words if w)


# The wrapper's helpers: a step before the model (a pre-script, a custom provider's data) runs only
# while every step so far succeeded, and its failure stops the model (sm_step); a script is copied
# from the workspace into the run directory and run there by bash with its args (madengine's
# run_pre_post_script); a failed post-script fails a model that succeeded.
_HELPERS = """sm_rc=0
sm_step() {
  [ "$sm_rc" = 0 ] || return 0
  sm_what=$1; shift
  "$@" || {
    sm_rc=$?
    printf 'mad: %s failed (exit %s): the model does not run\\n' "$sm_what" "$sm_rc" >&2
  }
}
sm_script() {
  sm_kind=$1 sm_from=$2 sm_path=$3; shift 3
  printf 'mad: %s-script %s %s (%s)\\n' "$sm_kind" "$sm_path" "$*" "$sm_from"
  cp -LR "../$sm_path" . && bash "${sm_path##*/}" "$@"
}
sm_pre() { sm_step "pre-script $2" sm_script pre "$@"; }
sm_post() {
  sm_script post "$@" || {
    sm_p=$?
    printf 'mad: post-script %s failed (exit %s)\\n' "$2" "$sm_p" >&2
    [ "$sm_rc" != 0 ] || sm_rc=$sm_p
  }
}"""


def _call(verb: str, script: Script) -> str:
    words = [verb, shlex.quote(script.origin), shlex.quote(script.path)]
    return " ".join(words + ([script.args] if script.args else []))


def wrapper(run: MadRun, line: str, missing: tuple[str, str] | None = None) -> str:
    """The bash the node runs in the run directory: pre-scripts (a failed one: the model does not
    run), the model, post-scripts (always), the tools' outputs staged into $SM_OUTPUT_DIR/tools;
    its exit status is the model's, else the first failed script's. `missing`: (script, reason)
    of a script expected in the image: absent, the reason goes to $SM_OUTPUT_DIR and the exit is 127."""
    out = []
    if missing is not None:
        script, reason = (shlex.quote(part) for part in missing)
        out.append(
            f"if [ ! -e {script} ]; then printf '%s\\n' {reason} >&2; "
            f'[ -z "${{SM_OUTPUT_DIR:-}}" ] || printf \'%s\\n\' {reason} >"$SM_OUTPUT_DIR/{MISSING_MARKER}"; '
            "exit 127; fi"
        )
    fetch = [d for d in run.data if d.script]
    if not (run.pre or run.post or run.prefix or run.tools or fetch):
        # Only the script and its args: bash becomes the model (signals reach it as without us).
        return "\n".join([*out, f"exec {line}"])
    out.append(_HELPERS if run.pre or run.post or fetch else "sm_rc=0")
    out += [_call("sm_pre", script) for script in run.pre]
    for i, data in enumerate(fetch):  # madengine's data prepare: after the pre-scripts, before the model
        what = shlex.quote(f"data {data.name} ({data.provider}): {data.script} {data.args}".strip())
        home, script = shlex.quote(data.home), shlex.quote(data.script)
        # A function: its args expand when it runs, in <home>, as madengine's `cd <home>; bash ...`.
        out.append(
            f"sm_data_{i}() {{ printf 'mad: %s into %s\\n' {what} {home}; "
            f'mkdir -p {home} && (sm_ws=$(cd .. && pwd) && cd {home} && bash "$sm_ws/"{script}'
            f"{' ' + data.args if data.args else ''}); }}; sm_step {what} sm_data_{i}"
        )
    out.append(f"if [ \"$sm_rc\" = 0 ]; then printf 'mad: model: %s\\n' {shlex.quote(line)}")
    out.append(line)
    out.append("sm_rc=$?; fi")
    out += [_call("sm_post", script) for script in run.post]
    if run.tools or run.pre or run.post:
        # Staged where the node collects them: $SM_MAD_TOOLS_DIR (docker: a directory inside the
        # container, copied out by the node as its own user; root's files in the mounted output
        # dir would outlive the job's scratch), else $SM_OUTPUT_DIR/tools.
        patterns = " ".join(p for name in TOOL_OUTPUTS for p in (name, f"../{name}"))
        out.append(
            "sm_tools=${SM_MAD_TOOLS_DIR:-${SM_OUTPUT_DIR:+$SM_OUTPUT_DIR/tools}}; "
            'if [ -n "$sm_tools" ]; then mkdir -p "$sm_tools"; '
            f'for sm_f in {patterns}; do [ -e "$sm_f" ] && cp -LR "$sm_f" "$sm_tools/"; done; fi'
        )
    out.append('exit "$sm_rc"')
    return "\n".join(out)


def needs_shell(raw_args: str) -> bool:
    """Args whose meaning differs between word splitting and bash (expansions, globs, operators)."""
    return any(ch in raw_args for ch in "$`*?[;&|<>(){}~!#\\")
