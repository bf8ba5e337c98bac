"""The node's docker engine asked directly on its unix socket (HTTP/1.0, one request a connection):
what `docker version` or `docker image inspect` would ask, without starting the docker CLI, whose
start costs a node more CPU than the answer. A tcp:// DOCKER_HOST is left to the docker CLI."""

from __future__ import annotations

import json
import socket
import urllib.parse
from collections.abc import Mapping
from typing import Any, NamedTuple

DEFAULT_HOST = "unix:///var/run/docker.sock"
MAX_REPLY = 4 << 20  # an inspect of an image with hundreds of layers is well under this
# How long a healthy engine may take to answer /_ping (prepare and the fitness stage): one that
# takes longer is hung, and its node is bad.
PING_TIMEOUT = 3.0


class EngineError(OSError):
    """The engine could not be asked (no socket, refused, timed out, a reply that is not HTTP)."""


def socket_path(env: Mapping[str, str]) -> str | None:
    """The engine's unix socket, or None when DOCKER_HOST is not a unix:// one."""
    host = env.get("DOCKER_HOST") or DEFAULT_HOST
    return host[len("unix://") :] if host.startswith("unix://") else None


class Reply(NamedTuple):
    status: int
    line: str  # the status line, e.g. `HTTP/1.1 500 Internal Server Error`
    body: bytes


def get(path: str, url: str, timeout: float, limit: int = MAX_REPLY) -> Reply:
    """The reply to `GET url` on the engine's socket at `path`. EngineError when there is none."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(f"GET {url} HTTP/1.0\r\nHost: docker\r\n\r\n".encode("ascii"))
            chunks, size = [], 0
            while size <= limit:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
    except OSError as exc:
        raise EngineError(exc.errno, exc.strerror or type(exc).__name__) from None
    reply = b"".join(chunks)
    head, _, body = reply.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    fields = status_line.split(b" ")
    if not status_line.startswith(b"HTTP/") or len(fields) < 2 or not fields[1].isdigit():
        raise EngineError(0, f"answered {status_line[:80].decode('ascii', 'replace')!r}")
    return Reply(int(fields[1]), status_line.decode("ascii", "replace"), body)


def _inspect(env: Mapping[str, str], url: str, timeout: float) -> tuple[int, Any] | None:
    """(status, the JSON the engine answers on its socket for `GET url`, None unless 200); None when
    it cannot be asked this way (a tcp:// DOCKER_HOST, no answer, a 200 that is not JSON)."""
    path = socket_path(env)
    if path is None:
        return None
    try:
        reply = get(path, url, timeout)
        return reply.status, (json.loads(reply.body) if reply.status == 200 else None)
    except (EngineError, ValueError, RecursionError):
        return None


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _image_url(ref: str) -> str:
    return f"/images/{urllib.parse.quote(ref, safe='/:@')}/json"


def image_id(env: Mapping[str, str], ref: str, timeout: float = 5.0) -> str:
    """The ID (`sha256:...`) of image `ref` on this node's engine; "" when it has no such image or
    cannot say (a worker that cannot tell what it holds is one that holds nothing)."""
    asked = _inspect(env, _image_url(ref), timeout) if ref else None
    found = asked[1] if asked else None
    value = found.get("Id") if isinstance(found, dict) else None
    return value if isinstance(value, str) and value.startswith("sha256:") else ""


def image_facts(env: Mapping[str, str], ref: str, label: str, timeout: float = 5.0) -> tuple[str, str] | None:
    """(ID, the value of `label`, "" if unset) of image `ref` on this node's engine: what `docker
    image inspect -f '{{.Id}} {{index .Config.Labels LABEL}}'` says. ("", "") when the engine has no
    such image; None when it cannot be asked this way (a tcp:// DOCKER_HOST, no answer): the caller
    then asks the docker CLI."""
    asked = _inspect(env, _image_url(ref), timeout) if ref else None
    if asked is None:
        return None
    status, found = asked
    if status == 404:
        return "", ""
    if not isinstance(found, dict) or not isinstance(found.get("Id"), str):
        return None
    config = found.get("Config")
    labels = config.get("Labels") if isinstance(config, dict) else None
    value = labels.get(label) if isinstance(labels, dict) else None
    return found["Id"], value if isinstance(value, str) else ""


def container_state(env: Mapping[str, str], name: str, timeout: float = 5.0) -> tuple[int, bool] | None:
    """(the PID of its first process, whether it runs) of container `name`: what `docker inspect -f
    '{{.State.Pid}} {{.State.Running}}'` says; (0, False) when the engine has no such container (yet);
    None when it cannot be asked this way (the caller asks the docker CLI)."""
    asked = _inspect(env, f"/containers/{urllib.parse.quote(name, safe='')}/json", timeout) if name else None
    if asked is None:
        return None
    status, found = asked
    if status == 404:
        return 0, False
    state = found.get("State") if isinstance(found, dict) else None
    if not isinstance(state, dict):
        return None
    pid, running = state.get("Pid"), state.get("Running")
    if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(running, bool):
        return None
    return pid, running


def image_rootfs(env: Mapping[str, str], ref: str, timeout: float = 5.0) -> tuple[str, list[Any]] | None:
    """(ID, `RootFS.Layers`) of image `ref`: its layers' diff IDs, bottom first, as the engine says
    them (the caller checks them). ("", []) when the engine has no such image; None when it cannot
    be asked this way or answers something else than an image with a `layers` root file system."""
    asked = _inspect(env, _image_url(ref), timeout) if ref else None
    if asked is None:
        return None
    status, found = asked
    if status == 404:
        return "", []
    rootfs = found.get("RootFS") if isinstance(found, dict) else None
    if not isinstance(rootfs, dict) or rootfs.get("Type") != "layers" or not isinstance(found.get("Id"), str):
        return None
    layers = rootfs.get("Layers")
    return found["Id"], layers if isinstance(layers, list) else []


def image_list(env: Mapping[str, str], timeout: float = 5.0) -> list[str] | None:
    """The IDs of every image the engine holds (`docker image ls -aq`, intermediate images too);
    None when it cannot be asked this way or answers something else than a list of images."""
    asked = _inspect(env, "/images/json?all=1", timeout)
    if asked is None or asked[0] != 200 or not isinstance(asked[1], list):
        return None
    ids = [item.get("Id") for item in asked[1] if isinstance(item, dict)]
    return [i for i in ids if isinstance(i, str)] if len(ids) == len(asked[1]) else None


def info(env: Mapping[str, str], timeout: float = 5.0) -> dict[str, Any] | None:
    """`docker info` as the engine answers it on its socket; None when it cannot be asked this way."""
    asked = _inspect(env, "/info", timeout)
    if asked is None or asked[0] != 200 or not isinstance(asked[1], dict):
        return None
    return asked[1]
