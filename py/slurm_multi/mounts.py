"""Merge mounts into docker run options without two mounts on one container path.

Docker rejects a run with two mounts on the same container path ("Duplicate mount point"); madengine
hit this when a manifest mount repeated a `-v` already in additional_docker_run_options. The options
come first and win; a --mount whose container path is already a target is dropped and reported.
"""

from __future__ import annotations

import csv
import posixpath

from slurm_multi.common import usage_error

AREA = "mounts"
VOLUME_OPTIONS = frozenset(
    {"ro", "rw", "z", "Z", "shared", "slave", "private", "rshared", "rslave", "rprivate", "nocopy",
     "consistent", "cached", "delegated", "bind", "rbind"}
)  # fmt: skip
# `docker run` options that take a separate value: the value is skipped, so `-e -v` or `--name -v`
# is never read as a mount.
VALUE_OPTIONS = frozenset(
    {"-a", "--attach", "--add-host", "--blkio-weight", "--cap-add", "--cap-drop", "--cgroup-parent",
     "--cgroupns", "--cidfile", "--cpu-period", "--cpu-quota", "--cpu-shares", "-c", "--cpus",
     "--cpuset-cpus", "--cpuset-mems", "--device", "--device-cgroup-rule", "--dns", "--dns-option",
     "--dns-search", "--domainname", "--entrypoint", "-e", "--env", "--env-file", "--expose", "--gpus",
     "--group-add", "--health-cmd", "--health-interval", "--health-retries", "--health-timeout", "-h",
     "--hostname", "--ip", "--ip6", "--ipc", "--isolation", "--kernel-memory", "-l", "--label",
     "--label-file", "--link", "--log-driver", "--log-opt", "--mac-address", "-m", "--memory",
     "--memory-reservation", "--memory-swap", "--name", "--network", "--net", "--network-alias",
     "--pid", "--pids-limit", "--platform", "-p", "--publish", "--pull", "--restart", "--runtime",
     "--security-opt", "--shm-size", "--stop-signal", "--stop-timeout", "--storage-opt", "--sysctl",
     "--ulimit", "-u", "--user", "--userns", "--uts", "--volume-driver", "--volumes-from", "-w",
     "--workdir"}
)  # fmt: skip
# Boolean short flags that docker lets stand in front of `-v` in one word (`-itv /a:/b`).
BOOL_SHORT_FLAGS = frozenset("diPqt")


def normalise_path(path: str) -> str:
    """Container path as docker compares it: `/data/`, `//data` and `/x/../data` all mean `/data`."""
    cleaned = posixpath.normpath(path) if path else path
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def volume_target(spec: str) -> str | None:
    """The container path of a `-v` spec: `HOST:CONTAINER[:OPTS]`, `NAME:CONTAINER`, or `CONTAINER`."""
    parts = spec.split(":")
    if len(parts) == 1:
        return parts[0] or None  # anonymous volume
    return parts[1] or None


def mount_target(spec: str) -> str | None:
    """The `target=`/`dst=`/`destination=` of a `--mount` spec (CSV, keys in any order)."""
    try:
        fields = next(csv.reader([spec]), [])
    except csv.Error:
        return None
    for field in fields:
        key, _, value = field.partition("=")
        if key.strip().lower() in ("target", "dst", "destination"):
            return value.strip() or None
    return None


def tmpfs_target(spec: str) -> str | None:
    return spec.split(":", 1)[0] or None


def find_targets(docker_opts: list[str]) -> list[tuple[int, int, str, str]]:
    """Every mount in docker_opts as (first index, number of words, normalised target, shown text).

    Recognised: `-v X:Y`, `-vX:Y`, `-itv X:Y`, `--volume X:Y`, `--volume=X:Y`, `--mount SPEC`,
    `--mount=SPEC`, `--tmpfs PATH`, `--tmpfs=PATH`.
    """
    found: list[tuple[int, int, str, str]] = []
    i = 0
    while i < len(docker_opts):
        word = docker_opts[i]
        value: str | None = None
        kind = ""
        width = 1
        if word in ("-v", "--volume", "--mount", "--tmpfs"):
            kind = word
            if i + 1 < len(docker_opts):
                value, width = docker_opts[i + 1], 2
        elif word.startswith(("--volume=", "--mount=", "--tmpfs=")):
            kind, _, value = word.partition("=")
        elif word.startswith("-") and not word.startswith("--") and "v" in word:
            flags, _, rest = word[1:].partition("v")
            if all(flag in BOOL_SHORT_FLAGS for flag in flags):
                kind = "-v"
                if rest:
                    value = rest
                elif i + 1 < len(docker_opts):
                    value, width = docker_opts[i + 1], 2
        elif word in VALUE_OPTIONS:
            i += 2
            continue
        if value is not None:
            if kind in ("-v", "--volume"):
                target = volume_target(value)
            elif kind == "--mount":
                target = mount_target(value)
            else:
                target = tmpfs_target(value)
            if target is not None:
                found.append((i, width, normalise_path(target), f"{kind} {value}"))
        i += width
    return found


def parse_mount(mount: str) -> tuple[str, str, str]:
    """`HOST:CONTAINER[:OPTS]` -> (host, container, opts); usage error when it is not one."""
    parts = mount.split(":")
    if len(parts) < 2 or len(parts) > 3:
        raise usage_error(f"{AREA}: --mount {mount!r} is not HOST:CONTAINER[:ro|rw]")
    host, container = parts[0], parts[1]
    options = parts[2] if len(parts) == 3 else ""
    if not host:
        raise usage_error(f"{AREA}: --mount {mount!r} has an empty host path")
    if not container.startswith("/"):
        raise usage_error(f"{AREA}: --mount {mount!r}: the container path must be absolute")
    if len(parts) == 3 and not all(opt in VOLUME_OPTIONS for opt in options.split(",")):
        raise usage_error(f"{AREA}: --mount {mount!r}: unknown mount option {options!r} (use ro or rw)")
    return host, container, options


def dedup_mounts(docker_opts: list[str], mounts: list[str]) -> tuple[list[str], list[str]]:
    """docker_opts with `-v MOUNT` appended for each mount whose container path is not yet taken.

    Returns (args, dropped messages). The first mount on a container path wins: one in docker_opts over
    any --mount, and earlier over later within either list (a later duplicate inside docker_opts is
    removed too, since docker would reject the run).
    """
    parsed = [parse_mount(mount) for mount in mounts]
    taken: set[str] = set()
    dropped: list[str] = []
    remove: dict[int, tuple[int, str]] = {}
    for index, width, target, shown in find_targets(docker_opts):
        if target in taken:
            remove[index] = (width, shown)
            dropped.append(f"dropped {shown} (container path {target} already mounted)")
        else:
            taken.add(target)
    args: list[str] = []
    i = 0
    while i < len(docker_opts):
        if i in remove:
            width, _ = remove[i]
            word = docker_opts[i]
            # `-itv /a:/b`: keep the boolean flags, drop only the volume
            flags = word[1:].partition("v")[0] if word.startswith("-") and not word.startswith("--") else ""
            if flags:
                args.append("-" + flags)
            i += width
            continue
        args.append(docker_opts[i])
        i += 1
    for mount, (_, container, _) in zip(mounts, parsed):
        target = normalise_path(container)
        if target in taken:
            dropped.append(f"dropped -v {mount} (container path {target} already mounted)")
            continue
        taken.add(target)
        args += ["-v", mount]
    return args, dropped


def pyxis_mounts(docker_opts: list[str], mounts: list[str], ours: list[str]) -> tuple[list[str], list[str]]:
    """The mounts of a pyxis step as `SRC:DST[:FLAGS]` items for ONE --container-mounts, first per
    container path wins: ours, then the -v/--volume mounts in the manifest's docker options, then
    the manifest's and the user's mounts. pyxis keeps only the last --container-mounts given, so
    every mount must be in this one list. A docker option pyxis cannot honour (a named volume,
    --mount, --tmpfs) is a usage error: a run without its mount would be a degraded run.

    Returns (items, dropped messages)."""
    args, dropped = dedup_mounts([w for m in ours for w in ("-v", m)] + docker_opts, mounts)
    items: list[str] = []
    found = find_targets(args)
    skip = {i + k for i, width, _, _ in found for k in range(width)}
    ignored = [word for i, word in enumerate(args) if i not in skip]
    if ignored:
        dropped.append(f"ignored under pyxis (docker run options): {' '.join(ignored)}")
    for _, _, _, shown in found:
        kind, _, spec = shown.partition(" ")
        if kind not in ("-v", "--volume"):
            raise usage_error(f"{AREA}: {shown}: pyxis mounts host paths; give --mount HOST:CONTAINER[:ro]")
        if ":" not in spec or not spec.startswith("/"):
            raise usage_error(
                f"{AREA}: {shown}: pyxis mounts host paths only, not named or anonymous volumes"
            )
        if "," in spec:
            raise usage_error(
                f"{AREA}: {shown}: pyxis cannot mount a path with a comma (it separates the mounts)"
            )
        items.append(spec)
    return items, dropped
