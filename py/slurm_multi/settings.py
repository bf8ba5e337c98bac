"""Every setting of the toolkit, in one table: option, environment variable, aliases, default, type,
validation and help. Nobody else defines a default.

The batch step hands its whole argv to `slurm-multi job plan`, which parses it here against the
environment (our option > our variable > a madengine alias > Slurm's own option where one applies >
the default), validates every value (the profiling checks included) with one line naming the flag
the user typed, and emits the resolved values for bash to export to every node. `--help`, the dry
run's settings, docs/options.md and job.json come from this table; tests check README.md against it.

`slurm-multi settings env FILE` resolves the environment alone (a stage re-run by hand on a node).

Numbers are ASCII digits, written back without leading zeros: bash reads `08` as a bad octal number
and `((SM_TIMEOUT > 0))` in an `if` is then quietly false (the time limit off). An option typed with
an empty value is refused where empty is not a value of its own (a number, a choice, a path with a
default): bash would see it unset, or the default would run while the user asked for something else.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import NamedTuple


class SettingsError(Exception):
    """A value the user gave that cannot work: one line, exit 2."""


class Setting(NamedTuple):
    """One setting of the table (immutable)."""

    name: str  # SM_*
    option: str | None  # --flag, or None for an environment-only knob
    metavar: str  # FILE, SECONDS, cache|relay|auto ...
    default: str  # "" when none (or resolved elsewhere: default_doc says where)
    help: str
    kind: str = "text"  # text, seconds, port, choice, bool, count, whole, name, abs-path, image
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # madengine's names for the same variable
    slurm: str = ""  # the Slurm input variable that gives it when ours is unset (sbatch's option)
    default_doc: str = ""  # how the default is resolved, when it is not a constant
    core: bool = False  # shown in README's table of core options

    @property
    def shown_default(self) -> str:
        return self.default_doc or self.default


S = Setting
BOOL = ("true", "false", "1", "0", "yes", "no")
TABLE: tuple[Setting, ...] = (
    S("SM_MANIFEST", "--manifest", "FILE", "",
      "madengine build_manifest.json to restore the run context from", core=True),
    S("SM_MODEL", "--model", "NAME", "", "model key or name in the manifest (needed when it has several)",
      core=True),
    S("SM_IMAGE", "--image", "IMAGE", "", "docker image to run (instead of, or overriding, the manifest's)",
      kind="image", core=True),
    S("SM_MODEL_DIR", "--model-dir", "DIR", "",
      "the model checkout the manifest's scripts are relative to", default_doc="the manifest's directory"),
    S("SM_MODEL_ARGS", "--model-args", "ARGS", "", "the model script's arguments, one quoted string "
      "(bash reads them in the container, as under madengine: $VAR expands there)",
      default_doc="the manifest's args"),
    S("SM_MAD_COMMON", "--mad-common", "DIR", "",
      "madengine's scripts/common (tools.json, pre/post scripts, profiler wrappers) for the manifest's "
      "tools; the model sees it as ../scripts/common", kind="abs-path",
      default_doc="the checkout's scripts/common, else the installed madengine package's"),
    S("SM_LAUNCHER", "--launcher", "NAME", "",
      "distributed launcher for MAD_MULTI_NODE_RUNNER: torchrun, torchtitan, deepspeed, megatron, vllm, "
      "sglang, sglang-disagg, primus or none (see docs/madengine.md)",
      default_doc="the manifest's distributed.launcher, else torchrun on more than one node (madengine's)"),
    S("SM_NPROC_PER_NODE", "--nproc-per-node", "N", "", "processes the launcher starts per node",
      kind="count", default_doc="the manifest's distributed.nproc_per_node, else the node's GPUs, else 1"),
    S("SM_IMAGE_CACHE", "--image-cache", "DIR", "",
      "shared directory for image tars (pyxis: squashfs files); the same path on every node",
      kind="abs-path", aliases=("MAD_DOCKER_BUILDS",), core=True),
    S("SM_IMAGE_TRANSPORT", "--image-transport", "cache|relay|auto", "auto",
      "how a cold image reaches the workers: relay (streamed node to node while rank 0 saves; no shared "
      "storage needed), cache (rank 0 saves a tar, then the workers load it), auto (relay unless the "
      "cache already holds the image)", kind="choice", choices=("cache", "relay", "auto")),
    S("SM_IMAGE_LAYERS", "--image-layers", "auto|off", "auto",
      "what moves to a worker that holds part of the image (an earlier build, its base): auto (only the "
      "layers it lacks, through the relay and the cache; the whole image where an engine cannot load a "
      "partial one), off (the whole image)", kind="choice", choices=("auto", "off")),
    S("SM_RELAY_FANOUT", "--relay-fanout", "K", "1",
      "relay topology: 1 is a chain, K a tree where every node forwards to K others", kind="count"),
    S("SM_OUT", "--out", "DIR", "./slurm_output", "where job outputs go: <out>/<model>/<jobid>/", core=True,
      kind="abs-path"),
    S("SM_TIMEOUT", "--timeout", "SECONDS", "", "workload time limit per node (0 = none)", kind="seconds",
      default_doc="the manifest model's timeout, else 7200 (madengine's)", core=True),
    S("SM_HANG_TIMEOUT", "--hang-timeout", "SECONDS", "900",
      "a rank with no new output line and no CPU for this long after GO is hung: the job fails naming it "
      "(0 = off)", kind="seconds", core=True),
    S("SM_IMAGE_TIMEOUT", "--image-timeout", "SECONDS", "1800",
      "how long rank 0 may take to obtain the image (local, cache, rebuild, save)", kind="seconds"),
    S("SM_BARRIER_TIMEOUT", "--barrier-timeout", "SECONDS", "600",
      "how long every worker has to arrive once rank 0 released its image", kind="seconds"),
    S("SM_MASTER_PORT", "--master-port", "PORT", "",
      "MASTER_PORT for the workload; the barrier port derives from it", kind="port",
      default_doc="the manifest's distributed.port, else 29500"),
    S("SM_PROFILE", "--profile", "none|nsys|nsight-slurm", "none",
      "profile every rank (see docs/profiling.md)", kind="choice", choices=("none", "nsys", "nsight-slurm"),
      core=True),
    S("SM_RUNTIME", "--runtime", "docker|pyxis|none", "docker", "how each node runs the workload",
      kind="choice", choices=("docker", "pyxis", "none"), core=True),
    S("SM_NTASKS_PER_NODE", "--ntasks-per-node", "N", "1",
      "ranks per node (pyxis, none: each task is a rank; docker runs one container per node)", kind="count",
      slurm="SLURM_NTASKS_PER_NODE", default_doc="sbatch's --ntasks-per-node, else 1"),
    S("SM_CONTAINER_IMAGE", "--container-image", "IMAGE", "", "pyxis: srun --container-image",
      kind="image", default_doc="the image"),
    S("SM_FRAMEWORK", "--framework", "NAME", "",
      "the workload's framework, e.g. trtllm (enables cuda-api and capture ranges)", kind="name"),
    S("SM_PROFILE_START_ITER", "--profile-start-iter", "N", "",
      "profile window start (TLLM_PROFILE_START_STOP=<start>-<stop>)", kind="whole"),
    S("SM_PROFILE_STOP_ITER", "--profile-stop-iter", "N", "", "profile window stop (give both or neither)",
      kind="whole"),
    S("SM_PROFILE_TOOL_OPTIONS", "--profile-tool-options", "OPTS", "", "nsys options, one quoted string",
      default_doc="the TRT-LLM playbook set"),
    S("SM_PROFILE_DIR", "--profile-dir", "DIR", "", "where reports go",
      default_doc="<jobdir>/profile; nsight-slurm: <jobdir>"),
    S("SM_NSYS_PATH", "--nsys-path", "PATH", "nsys",
      "nsys inside the container (docker, pyxis) or on the node (none)"),
    S("SM_NSYS_HOST_PATH", "--nsys-host-path", "FILE", "",
      "a host nsys, mounted read-only at /opt/slurm-multi/bin/nsys and used"),
    S("SM_NSIGHT_SLURM_HOME", "--nsight-slurm-home", "DIR", "",
      "Nsight Cloud for Slurm install root (<home>/bin/nsight-slurm)"),
    S("SM_NSIGHT_SLURM_MODE", "--nsight-slurm-mode", "MODE", "", "at-launch, manual or cuda-api",
      default_doc="cuda-api with --framework trtllm, else at-launch"),
    S("SM_NSIGHT_SLURM_TOOL_PATH", "--nsight-slurm-tool-path", "PATH", "/usr/local/bin/nsys",
      "nsys as the nsight-slurm connector runs it"),
    S("SM_NVTX_INJECTION_PATH", "--nvtx-injection-path", "PATH", "", "NVTX_INJECTION64_PATH for the workers"),
    S("SM_FLUSH_SETTLE_SECONDS", "--flush-settle-seconds", "S", "60",
      "a report counts once its byte size is unchanged this long", kind="seconds"),
    S("SM_FLUSH_TIMEOUT_SECONDS", "--flush-timeout-seconds", "S", "600",
      "stop waiting for reports after this long", kind="seconds"),
    S("SM_PROFILE_OPTIONAL", "--profile-optional", "true|false", "false",
      "a profiled job whose reports are missing, empty or unsettled still succeeds (the summary says "
      "INCOMPLETE); by default it fails", kind="bool"),
    S("SM_PROFILE_STOP_GRACE", "--profile-stop-grace", "SECONDS", "",
      "docker stop grace for a profiled container (never below the settle window)", kind="seconds",
      default_doc="flush settle + 15"),
    S("SM_COLLECT", "--collect", "true|false", "true", "aggregate results at the end of the job", kind="bool",
      aliases=("MAD_COLLECT_METRICS",)),
    S("SM_PERF_CSV", "--perf-csv", "PATH", "",
      "also append this job's rows to a madengine perf.csv kept across runs (locked)"),
    S("SM_STOP_GRACE", "--stop-grace", "SECONDS", "30",
      "SIGTERM-to-SIGKILL grace when a container is stopped", kind="seconds"),
    S("SM_PEER_GRACE", "--peer-grace", "SECONDS", "30",
      "after one node fails, how long the others may run on", kind="seconds"),
    S("SM_FITNESS", "--fitness", "on|off", "on",
      "check every node (container runtime, disk, GPUs, the network between the nodes, the clock) before "
      "any image moves; a bad node stops the job in seconds (see docs/bad-nodes.md)", kind="choice",
      choices=("on", "off")),
    S("SM_FITNESS_TIMEOUT", "--fitness-timeout", "SECONDS", "10",
      "the fitness check's bound on every node (a node that has not passed by then is bad)", kind="seconds"),
    S("SM_FITNESS_MIN_RATE", "--fitness-min-rate", "MB/S", "0",
      "a floor for the fitness check's ring bandwidth probe, for sites that know their fabric (MB/s, "
      "10^6 bytes; 0 = none): a node whose links in and out are both slower is bad, else both ends of "
      "the slow link are", kind="whole"),
    S("SM_FITNESS_CMD", "--fitness-cmd", "CMD", "",
      "your own check of each node, run by sh inside the job's image on every node once the image is there "
      "(bounded by --fitness-timeout): a node where it exits non-zero is bad; its output is kept in "
      "node_<rank>/fitness-cmd.log"),
    S("SM_ON_BAD_NODE", "--on-bad-node", "fail|requeue", "fail",
      "when the fitness check finds a bad node, or a node is lost or fails during the run: fail the job "
      "naming it, or requeue the job without it "
      "(Slurm's own requeue, the node added to the job's excluded nodes)", kind="choice",
      choices=("fail", "requeue"), core=True),
    S("SM_MAX_REQUEUES", "--max-requeues", "N", "2", "how many times --on-bad-node requeue may requeue a job",
      kind="whole"),
    S("SM_STATE_DIR", "--state-dir", "DIR", "",
      "shared directory of the node quarantine that later jobs respect (same path on every node)",
      kind="abs-path", default_doc="<image-cache>/.slurm-multi-state, else <out>/.slurm-multi-state"),
    S("SM_QUARANTINE_HOURS", "--quarantine-hours", "HOURS", "24",
      "how long a node that failed the fitness check stays quarantined (0 = no quarantine)", kind="whole"),
    # Environment only: secrets and tuning knobs (no option; --help lists them).
    S("SM_BARRIER_TOKEN", None, "TOKEN", "", "the barrier's shared secret", aliases=("MAD_BARRIER_TOKEN",),
      default_doc="generated per job"),
    S("SM_CACHE_LOCK_TIMEOUT", None, "SECONDS", "900", "how long a node waits for the image cache's lock",
      kind="seconds"),
    S("SM_PROGRESS_SECONDS", None, "SECONDS", "15", "how often the batch log says what the nodes are doing",
      kind="count"),
    S("SM_COLLECT_MARGIN", None, "SECONDS", "15",
      "after scancel, the seconds of Slurm's KillWait kept for collecting the results", kind="seconds"),
    S("SM_KEEP_SCRATCH", None, "0|1", "0", "keep each node's scratch dir after the job (debugging)",
      kind="bool"),
)  # fmt: skip
del S

BY_NAME: dict[str, Setting] = {s.name: s for s in TABLE}
BY_OPTION: dict[str, Setting] = {s.option: s for s in TABLE if s.option}


# ---- parsing the batch step's argv ---------------------------------------------------------------


class Parsed:
    """What the user typed after the script."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.given: dict[str, str] = {}  # SM_* -> value, from options
        self.typed: dict[str, str] = {}  # SM_* -> the flag as typed (for errors)
        self.command: list[str] = command if command is not None else []
        self.help = False
        self.dry_run = False
        self.nodes = ""  # -N as given (the dry run's node count)
        self.nodes_flag = "-N"  # as typed: -N or --nodes


def parse_argv(argv: Sequence[str]) -> Parsed:
    """Our options into SM_* values; the command after -- as is. SettingsError on a typo."""
    out = Parsed()
    words = list(argv)
    i = 0
    while i < len(words):
        arg = words[i]
        i += 1
        if arg in ("-h", "--help"):
            out.help = True
            continue
        if arg == "--dry-run":
            out.dry_run = True
            continue
        if arg == "--":
            out.command = words[i:]
            break
        if arg in ("-N", "--nodes"):
            if i >= len(words):
                raise SettingsError(f"{arg} needs a node count")
            out.nodes, out.nodes_flag = words[i], arg
            i += 1
            if not out.nodes:
                raise SettingsError(f"{arg} '': an empty node count; give a whole number >= 1")
            continue
        if arg.startswith("--nodes=") or (arg.startswith("-N") and not arg.startswith("--")):
            out.nodes = arg.split("=", 1)[1] if arg.startswith("--nodes=") else arg[2:]
            out.nodes_flag = "--nodes" if arg.startswith("--nodes=") else "-N"
            if not out.nodes:
                raise SettingsError(f"{out.nodes_flag} '': an empty node count; give a whole number >= 1")
            continue
        if not arg.startswith("--"):
            raise SettingsError(f"unexpected argument '{arg}' (the workload command goes after --)")
        flag, eq, value = arg.partition("=")
        setting = BY_OPTION.get(flag)
        if setting is None:
            near = closest_option(flag)
            raise SettingsError(f"unknown option '{flag}'" + (f" (did you mean {near}?)" if near else ""))
        if not eq:
            if i >= len(words):
                raise SettingsError(f"option {flag} needs a value ({setting.metavar})")
            value = words[i]
            i += 1
        out.given[setting.name] = value
        out.typed[setting.name] = flag
    return out


def closest_option(word: str) -> str:
    """The known option nearest to a mistyped one (edit distance at most a third of its length, at
    least 2), for "did you mean"; "" when none is that close."""
    limit = max(len(word) // 3, 2)
    best, best_d = "", limit + 1
    for option in BY_OPTION:
        d = _distance(word, option)
        if d < best_d:
            best, best_d = option, d
    return best


def _distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


# ---- resolving -----------------------------------------------------------------------------------


class Resolved:
    def __init__(self, values: dict[str, str], source: dict[str, str]) -> None:
        self.values = values  # every setting, "" where unset
        self.source = source  # SM_* -> where its value came from ("--timeout", "SM_TIMEOUT", "default", ...)

    def label(self, name: str) -> str:
        return self.source.get(name, "")


def resolve(env: Mapping[str, str], given: Mapping[str, str] | None = None,
            typed: Mapping[str, str] | None = None) -> Resolved:  # fmt: skip
    """Our option > our variable > a madengine alias > Slurm's own option > the default."""
    given = given or {}
    typed = typed or {}
    values: dict[str, str] = {}
    source: dict[str, str] = {}
    for s in TABLE:
        if s.name in given:
            values[s.name], source[s.name] = given[s.name], typed.get(s.name, s.option or s.name)
            continue
        if env.get(s.name):
            values[s.name], source[s.name] = env[s.name], s.name
            continue
        alias = next((a for a in s.aliases if env.get(a)), None)
        if alias:
            values[s.name], source[s.name] = env[alias], alias
        elif s.slurm and env.get(s.slurm):
            values[s.name], source[s.name] = _slurm_value(env[s.slurm]), f"sbatch ({s.slurm})"
        elif s.default:
            values[s.name], source[s.name] = s.default, "default"
        else:
            values[s.name] = ""
    for s in TABLE:
        if s.kind in NUMBERS and DIGITS.fullmatch(values[s.name]):
            values[s.name] = str(int(values[s.name]))  # 08 -> 8: bash reads a leading 0 as octal
    _derived_defaults(env, values, source)
    return Resolved(values, source)


def _derived_defaults(env: Mapping[str, str], values: dict[str, str], source: dict[str, str]) -> None:
    """The defaults made of other settings (their default_doc says how)."""
    if not values["SM_STATE_DIR"]:
        base = values["SM_IMAGE_CACHE"] or values["SM_OUT"]
        if base:
            if not os.path.isabs(base):
                base = os.path.join(env.get("SLURM_SUBMIT_DIR") or os.getcwd(), base)
            values["SM_STATE_DIR"] = os.path.join(os.path.normpath(base), ".slurm-multi-state")
            source["SM_STATE_DIR"] = "default"


def _slurm_value(text: str) -> str:
    """SLURM_NTASKS_PER_NODE as Slurm writes it for a heterogeneous count ("2(x3)"): its first count."""
    match = re.match(r"\d+", text)
    return match.group(0) if match else text


# ---- validation ----------------------------------------------------------------------------------


def flag_of(r: Resolved, name: str) -> str:
    """How the user gave NAME: the flag they typed, else the variable that set it."""
    src = r.label(name)
    if src.startswith("--"):
        return src
    setting = BY_NAME.get(name)
    if src and src != "default" and not src.startswith("sbatch"):
        return f"{setting.option} (from {src})" if setting and setting.option else src
    if src.startswith("sbatch"):
        return "sbatch --ntasks-per-node" if name == "SM_NTASKS_PER_NODE" else src
    return setting.option if setting and setting.option else name


NUMBERS = ("seconds", "whole", "count", "port")
DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() takes '٣' and '²', which bash cannot count
MAX_NUMBER = 10**9  # a number setting above it is a typo (31 years in seconds), and bash's are 64-bit


def _check_kind(r: Resolved, s: Setting) -> None:
    value = r.values[s.name]
    flag = flag_of(r, s.name)
    if value == "":
        if r.label(s.name).startswith("--") and (s.kind != "text" or s.default):
            raise SettingsError(
                f"{flag} '': an empty value; give {_expected(s)}, or drop {flag} for its default"
            )
        return
    number = int(value) if s.kind in NUMBERS and DIGITS.fullmatch(value) else None
    if number is not None and number > MAX_NUMBER and s.kind != "port":
        raise SettingsError(f"{flag} '{value}': expected {_expected(s)}, at most {MAX_NUMBER}")
    if s.kind in ("seconds", "whole") and number is None:
        raise SettingsError(f"{flag} '{value}': expected {_expected(s)} ({s.name})")
    if s.kind == "count" and not (number is not None and number >= 1):
        raise SettingsError(f"{flag} '{value}': expected {_expected(s)} ({s.name})")
    if s.kind == "port" and not (number is not None and 1 <= number <= 65535):
        raise SettingsError(f"{flag} '{value}' is not a TCP port (1-65535)")
    if s.kind == "image" and (value.startswith("-") or not value.isprintable() or " " in value):
        from slurm_multi.logline import escaped

        raise SettingsError(
            f"{flag} '{escaped(value)}': not an image reference (no leading '-', no spaces or "
            "control characters)"
        )
    if s.kind == "choice" and value not in s.choices:
        raise SettingsError(f"{flag} '{value}': expected {_one_of(s.choices)}")
    if s.kind == "bool" and value.lower() not in BOOL:
        raise SettingsError(f"{flag} '{value}': expected true or false")
    # The default ./slurm_output is the submit dir's (job.json records it as it is, for re-runs).
    if s.kind == "abs-path" and not value.startswith("/") and value != s.default:
        raise SettingsError(
            f"{flag} '{value}' must be absolute: every node resolves it, each from its own working "
            f"directory (give the same shared directory on every node, e.g. {os.path.abspath(value)} "
            "if that is shared)"
        )
    if s.kind == "name" and not re.fullmatch(r"[a-z0-9_.-]+", value):
        raise SettingsError(f"{flag} '{value}': expected a lowercase name such as trtllm")


def _expected(s: Setting) -> str:
    """What a value of `s` looks like, for its one-line error."""
    if s.kind == "choice":
        return _one_of(s.choices)
    return {
        "seconds": "a whole number of seconds, 0 or more",
        "whole": "a whole number, 0 or more",
        "count": "a whole number >= 1",
        "port": "a TCP port (1-65535)",
        "bool": "true or false",
        "abs-path": "an absolute path",
        "name": "a lowercase name such as trtllm",
        "image": "an image reference",
    }.get(s.kind, f"a {s.metavar}")


def _one_of(choices: Sequence[str]) -> str:
    return ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]


def truthy(value: str) -> bool:
    return value.lower() in ("true", "1", "yes")


# The TRT-LLM profiling playbook's nsys output flags are ours; the connector owns its own.
_OUTPUT_FLAGS = ("-o", "--output")
_CONNECTOR_FLAGS = ("-f", "--force-overwrite", "-c", "--capture-range", "--capture-range-end", "-Y",
                    "--start-later")  # fmt: skip


def _owned(word: str, flags: Sequence[str]) -> bool:
    for flag in flags:
        if word == flag or word.startswith(flag + "=") or (len(flag) == 2 and word.startswith(flag)):
            return True
    return False


def tasks_per_node(values: Mapping[str, str]) -> int:
    """Ranks per node, as lib/launch.sh starts them: the resolved --ntasks-per-node (ours, else
    sbatch's own); docker runs one container per node. Above 1, Slurm's tasks are the ranks: no
    launcher of ours starts processes on top of them (slurm_multi.madengine)."""
    if values.get("SM_RUNTIME") == "docker":
        return 1
    text = values.get("SM_NTASKS_PER_NODE") or "1"
    return int(text) if DIGITS.fullmatch(text) and int(text) > 0 else 1


def nsight_mode(values: Mapping[str, str]) -> str:
    """The nsight-slurm mode: ours, else cuda-api for TRT-LLM, else at-launch."""
    if values.get("SM_NSIGHT_SLURM_MODE"):
        return values["SM_NSIGHT_SLURM_MODE"]
    return "cuda-api" if values.get("SM_FRAMEWORK") == "trtllm" else "at-launch"


PROFILE_STOP_GRACE_MARGIN = 15  # lib/profile.sh's default profiled stop grace: settle + this


def validate(r: Resolved, has_command: bool = False, host: str = "") -> None:
    """Every value that cannot work, as one SettingsError line (first one found)."""
    v = r.values
    for s in TABLE:
        _check_kind(r, s)
    if v["SM_MANIFEST"] and not os.access(v["SM_MANIFEST"], os.R_OK):
        raise SettingsError(f"{flag_of(r, 'SM_MANIFEST')} {v['SM_MANIFEST']}: no such readable file")
    if not v["SM_MANIFEST"] and not v["SM_IMAGE"] and not (v["SM_RUNTIME"] == "none" and has_command):
        raise SettingsError(
            "nothing to run: give --manifest FILE or --image IMAGE (or, with --runtime none, -- CMD)"
        )
    if v["SM_MODEL_ARGS"]:
        try:
            shlex.split(v["SM_MODEL_ARGS"])
        except ValueError as exc:
            raise SettingsError(
                f"{flag_of(r, 'SM_MODEL_ARGS')} {v['SM_MODEL_ARGS']!r} cannot be split into words ({exc}); "
                "fix its quoting"
            ) from None
    _validate_runtime(r)
    _validate_profile(r, host or os.uname().nodename)


def _validate_runtime(r: Resolved) -> None:
    v = r.values
    hours = v["SM_QUARANTINE_HOURS"]
    if hours:
        from slurm_multi.quarantine import MAX_HOURS

        if int(hours) > MAX_HOURS:
            raise SettingsError(
                f"{flag_of(r, 'SM_QUARANTINE_HOURS')} '{hours}': expected at most {MAX_HOURS:g} hours"
            )
    tasks = v["SM_NTASKS_PER_NODE"]
    if v["SM_RUNTIME"] == "docker" and tasks not in ("", "1"):
        raise SettingsError(
            f"{flag_of(r, 'SM_NTASKS_PER_NODE')} {tasks} with --runtime docker: the docker runtime runs one "
            "container per node; start the ranks inside it, or use --runtime pyxis or none"
        )
    if v["SM_RUNTIME"] == "pyxis":
        # pyxis reads --container-mounts as SRC:DST[:FLAGS],...: a comma in a path would split it.
        for name in ("SM_OUT", "SM_PROFILE_DIR", "SM_NSIGHT_SLURM_HOME", "SM_NSYS_HOST_PATH"):
            if "," in v[name]:
                raise SettingsError(
                    f"{flag_of(r, name)} '{v[name]}': pyxis cannot mount a path with a comma; choose another"
                )


def _validate_profile(r: Resolved, host: str) -> None:
    v = r.values
    start, stop = v["SM_PROFILE_START_ITER"], v["SM_PROFILE_STOP_ITER"]
    if (start or stop) and not (start and stop):
        raise SettingsError(
            f"profile window '{start}'-'{stop}': give both --profile-start-iter and --profile-stop-iter as "
            "iteration numbers"
        )
    if start and int(stop) < int(start):
        raise SettingsError(
            f"profile window {start}-{stop}: --profile-stop-iter must not be before --profile-start-iter"
        )
    try:
        words = shlex.split(v["SM_PROFILE_TOOL_OPTIONS"])
    except ValueError:
        raise SettingsError(
            f"--profile-tool-options '{v['SM_PROFILE_TOOL_OPTIONS']}': unbalanced quotes"
        ) from None
    profile = v["SM_PROFILE"]
    settle = v["SM_FLUSH_SETTLE_SECONDS"]
    grace = v["SM_PROFILE_STOP_GRACE"]
    if profile != "none" and grace and int(grace) < int(settle):
        raise SettingsError(
            f"--profile-stop-grace {grace} is shorter than --flush-settle-seconds {settle}: docker stop "
            f"would SIGKILL nsys while it writes its report; give at least {settle} (or leave it unset: "
            f"settle + {PROFILE_STOP_GRACE_MARGIN} s)"
        )
    if profile == "none":
        return
    for word in words:
        if _owned(word, _OUTPUT_FLAGS):
            raise SettingsError(
                f"--profile-tool-options '{word}': the output name is slurm-multi's (one report per rank "
                "under the report dir); drop it and use --profile-dir to move the reports"
            )
    if profile == "nsight-slurm":
        _validate_nsight(r, words)
    path = v["SM_NSYS_HOST_PATH"]
    if path and not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SettingsError(
            f"--nsys-host-path {path}: not an executable file on {host}; give the path of an nsys binary on "
            "shared storage"
        )


def _validate_nsight(r: Resolved, words: Sequence[str]) -> None:
    v = r.values
    if v["SM_RUNTIME"] == "docker":
        raise SettingsError(
            "--profile nsight-slurm cannot run with --runtime docker: nsight-slurm profiles the srun task "
            "itself, and with docker that task is the docker client, not the workload; use --runtime pyxis "
            "(containers) or --runtime none (bare metal)"
        )
    home = v["SM_NSIGHT_SLURM_HOME"]
    if not home:
        raise SettingsError(
            "--profile nsight-slurm needs --nsight-slurm-home DIR (the install root holding bin/nsight-slurm)"
        )
    if not home.startswith("/"):
        raise SettingsError(f"--nsight-slurm-home '{home}' must be an absolute path (every node resolves it)")
    for tool in ("nsight-slurm", "nsight-slurm-connector"):
        path = os.path.join(home, "bin", tool)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise SettingsError(
                f"--nsight-slurm-home {home}: {path} is missing or not executable; install Nsight Cloud for "
                "Slurm there (on shared storage) or fix --nsight-slurm-home"
            )
    mode = nsight_mode(v)
    if mode not in ("at-launch", "manual", "cuda-api"):
        raise SettingsError(f"--nsight-slurm-mode '{mode}': expected at-launch, manual or cuda-api")
    if mode == "cuda-api" and v["SM_FRAMEWORK"] != "trtllm":
        raise SettingsError(
            "--nsight-slurm-mode cuda-api needs a framework that calls cudaProfilerStart/Stop (--framework "
            f"trtllm); for '{v['SM_FRAMEWORK'] or 'no framework'}' use at-launch or manual"
        )
    if not v["SM_NSIGHT_SLURM_TOOL_PATH"].startswith("/"):
        raise SettingsError(
            f"--nsight-slurm-tool-path '{v['SM_NSIGHT_SLURM_TOOL_PATH']}' must be an absolute path to nsys "
            "on the nodes"
        )
    for word in words:
        if _owned(word, _CONNECTOR_FLAGS):
            raise SettingsError(
                f"--profile-tool-options '{word}': the nsight-slurm connector owns this flag (capture range "
                "and start come from --nsight-slurm-mode); drop it"
            )


# ---- options that do nothing here -----------------------------------------------------------------

_PROFILING = ("SM_FRAMEWORK", "SM_PROFILE_START_ITER", "SM_PROFILE_STOP_ITER", "SM_PROFILE_TOOL_OPTIONS",
              "SM_PROFILE_DIR", "SM_NSYS_PATH", "SM_NSYS_HOST_PATH", "SM_FLUSH_SETTLE_SECONDS",
              "SM_FLUSH_TIMEOUT_SECONDS", "SM_PROFILE_OPTIONAL", "SM_PROFILE_STOP_GRACE",
              "SM_NVTX_INJECTION_PATH")  # fmt: skip
_NSIGHT = ("SM_NSIGHT_SLURM_HOME", "SM_NSIGHT_SLURM_MODE", "SM_NSIGHT_SLURM_TOOL_PATH")


_MANIFEST_ONLY = ("SM_MODEL_DIR", "SM_MODEL_ARGS", "SM_LAUNCHER", "SM_NPROC_PER_NODE", "SM_MAD_COMMON")


def unused(r: Resolved, has_command: bool = False) -> list[str]:
    """A warning for each setting the user gave that does nothing in this configuration (the job
    runs; the user learns their option was not what made it run so). `has_command`: a workload
    command was given after --, which runs instead of the manifest model's script."""
    v = r.values
    runtime, profile = v["SM_RUNTIME"], v["SM_PROFILE"]
    why: dict[str, str] = {}
    if not v["SM_MANIFEST"]:
        why.update({n: "without --manifest (it is the manifest model's)" for n in _MANIFEST_ONLY})
    elif has_command:
        why["SM_MODEL_ARGS"] = "with a command after -- (it runs instead of the model's script)"
    if profile == "none":
        why.update({n: "with --profile none" for n in _PROFILING + _NSIGHT})
    elif profile != "nsight-slurm":
        why.update({n: f"with --profile {profile}" for n in _NSIGHT})
    if runtime != "docker":
        reason = "the squashfs is shared, nothing is relayed" if runtime == "pyxis" else "there is no image"
        why.update(
            {
                n: f"with --runtime {runtime} ({reason})"
                for n in ("SM_IMAGE_TRANSPORT", "SM_RELAY_FANOUT", "SM_IMAGE_LAYERS")
            }  # fmt: skip
        )
    elif v["SM_IMAGE_TRANSPORT"] == "cache":
        why["SM_RELAY_FANOUT"] = "with --image-transport cache"
    if runtime != "pyxis":
        why["SM_CONTAINER_IMAGE"] = f"with --runtime {runtime}"
    if runtime == "none":
        why["SM_IMAGE_CACHE"] = "with --runtime none (there is no image)"
    if v["SM_FITNESS"] == "off":
        # (--on-bad-node still applies: to a node lost or failed during the run, docs/bad-nodes.md)
        fitness = ("SM_FITNESS_TIMEOUT", "SM_FITNESS_CMD", "SM_FITNESS_MIN_RATE")
        why.update({n: "with --fitness off" for n in fitness})
    if v["SM_ON_BAD_NODE"] != "requeue":
        why["SM_MAX_REQUEUES"] = f"with --on-bad-node {v['SM_ON_BAD_NODE']}"
    out = []
    for s in TABLE:
        source = r.label(s.name)
        if s.name in why and source and source != "default" and not source.startswith("sbatch"):
            out.append(f"{flag_of(r, s.name)} {v[s.name]} does nothing {why[s.name]}; ignored")
    return out


# ---- what people read: --help, docs/options.md ---------------------------------------------------


USAGE = """\
Usage: sbatch -N NODES sbatch/multi.sbatch [options] [-- CMD...]
       bash sbatch/multi.sbatch --dry-run -N NODES [options] [-- CMD...]   (plan only, no Slurm needed)

Runs one containerised job on every node of the allocation: one task per node restores the run
context, makes rank 0's image present (shared tar cache or a node-to-node relay), waits at a TCP
barrier, runs the workload with MASTER_ADDR/MASTER_PORT/NNODES/NODE_RANK/RANK/WORLD_SIZE, and
stages its outputs. At the end the batch step aggregates perf.csv and summary.json; its exit code
is the verdict.

Options (each also settable by its environment variable; the option wins):
{options}
  --dry-run                          print the plan (per-node argv, mounts, env, profiling); submit nothing
  -N, --nodes N                      node count for --dry-run (default: the allocation's, else 2); a
                                     real job's node count is sbatch's -N, before the script
  -h, --help                         this help
  -- CMD...                          run CMD in the container instead of the manifest's script

Outputs: <out>/<model>/<jobid>/{{batch.log,job.json,perf.csv,summary.json,node_<rank>/}}
Exit status: the verdict (0 SUCCESS, 1 FAILURE), also after scancel or the time limit; 2 usage error.

Examples:
  sbatch -N 2 sbatch/multi.sbatch --manifest examples/toy/build_manifest.json --image-cache /shared/sm-cache
  sbatch -N 4 -t 60 sbatch/multi.sbatch --image rocm/pytorch:latest -- python3 train.py --steps 100
  bash sbatch/multi.sbatch --dry-run -N 2 --manifest examples/toy/build_manifest.json
"""


def usage() -> str:
    return USAGE.format(options=usage_options())


def usage_options() -> str:
    """The options block of `sbatch/multi.sbatch --help`."""
    lines = []
    for s in TABLE:
        if not s.option:
            continue
        lines.append(f"  {s.option + ' ' + s.metavar:<34} {s.help}")
        default = f", default {s.shown_default}" if s.shown_default else ""
        alias = f" (alias {', '.join(s.aliases)})" if s.aliases else ""
        lines.append(f"  {'':<34} env {s.name}{alias}{default}")
    lines.append("")
    lines.append("Environment only:")
    for s in TABLE:
        if s.option:
            continue
        default = f", default {s.shown_default}" if s.shown_default else ""
        alias = f" (alias {', '.join(s.aliases)})" if s.aliases else ""
        lines.append(f"  {s.name + alias:<34} {s.help}{default}")
    return "\n".join(lines)


def markdown_row(s: Setting) -> str:
    """One row of README's / docs/options.md's option table."""
    option = f"`{s.option} {s.metavar}`".replace("|", "\\|") if s.option else ""
    var = f"`{s.name}`" + (f" (alias {', '.join(f'`{a}`' for a in s.aliases)})" if s.aliases else "")
    default = s.default_doc if s.default_doc else (f"`{s.default}`" if s.default else "")
    return f"| {option} | {var} | {default} | {s.help} |"


def markdown_table(core_only: bool = False) -> str:
    rows = ["| option | environment | default | what it does |", "| --- | --- | --- | --- |"]
    rows += [markdown_row(s) for s in TABLE if (s.core or not core_only)]
    return "\n".join(rows)


# ---- bash for the command line (`slurm-multi settings env`, slurm_multi.settings_cli) -------------


def env_exports(r: Resolved) -> str:
    """bash `declare -gx` lines for every setting with a value (an empty one stays unset: the manifest
    may still give it)."""
    return (
        "".join(
            f"declare -gx {name}={shlex.quote(value)}\n" for name, value in r.values.items() if value != ""
        )
        + "declare -gx SM_SETTINGS_RESOLVED=1\n"
    )


def write_env(path: str) -> None:
    """`slurm-multi settings env FILE`: resolve the environment alone (a node stage run by hand),
    validated, into FILE as bash to source; a SettingsError when a value is refused."""
    from slurm_multi.shell import write_private

    r = resolve(os.environ)
    for s in TABLE:
        _check_kind(r, s)
    _validate_runtime(r)
    write_private(path, env_exports(r))
