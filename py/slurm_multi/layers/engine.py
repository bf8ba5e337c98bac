"""What this node's docker engine holds of an image's layers, asked on its socket (slurm_multi.dockerapi):
no docker CLI starts on the image stage's path.

An answer is believed only when it is whole: every image the engine lists inspects to a `layers`
root file system of diff IDs. Anything else (no socket, a tcp:// DOCKER_HOST, an answer that is not
an image list, a containerd image store) means "nothing held": the whole image moves, and the
reason is one line in the node log.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from slurm_multi import dockerapi
from slurm_multi.layers.chain import common_prefix, held_prefix, is_diff_ids

CONTAINERD_STORE = "io.containerd.snapshotter.v1"


class Held(NamedTuple):
    count: int  # layers of the wanted chain the engine holds (a prefix)
    why: str = ""  # why it counts none even though it may hold some (the engine cannot say, or use them)


class Layers(NamedTuple):
    image_id: str
    diff_ids: list[str]
    why: str = ""  # why there are none (the image's layers cannot be used to leave anything out)


def blind(env: Mapping[str, str]) -> bool:
    """SM_LAYERS_FAULT=blind:<rank>[,<rank>…] (the end-to-end tests' fault): on those ranks the engine
    is taken to say nothing useful about layers. Production never sets it."""
    match = re.fullmatch(r"blind:([0-9]+(?:,[0-9]+)*)", env.get("SM_LAYERS_FAULT", "").strip())
    return bool(match) and env.get("SM_RANK", "") in match.group(1).split(",")


def store_problem(env: Mapping[str, str]) -> str:
    """ "" when the engine's image store loads a tar that leaves out the layers it holds (the classic
    store); else why not, in one line."""
    if blind(env):
        return "SM_LAYERS_FAULT: this engine's answer about layers is taken as useless"
    facts = dockerapi.info(env)
    if facts is None:
        return "the docker engine did not answer /info on its socket (a tcp:// DOCKER_HOST, or no engine)"
    status = facts.get("DriverStatus")
    for pair in status if isinstance(status, list) else []:
        if isinstance(pair, list) and pair[:2] == ["driver-type", CONTAINERD_STORE]:
            return (
                f"the engine keeps images in the containerd image store (driver-type {CONTAINERD_STORE}), "
                "which cannot load a tar that leaves out layers"
            )
    return ""


def image_layers(env: Mapping[str, str], ref: str) -> Layers:
    """Image `ref`'s ID and diff IDs on this engine, or why they cannot be used."""
    problem = store_problem(env)
    if problem:
        return Layers("", [], problem)
    got = dockerapi.image_rootfs(env, ref)
    if got is None:
        return Layers("", [], f"the docker engine did not say which layers {ref} has")
    image_id, diff_ids = got
    if not image_id:
        return Layers("", [], f"the docker engine has no image {ref}")
    if not diff_ids or not is_diff_ids(diff_ids):
        return Layers(image_id, [], f"the docker engine's layers of {ref} are not a list of diff IDs")
    return Layers(image_id, list(diff_ids))


def held(env: Mapping[str, str], wanted: Sequence[str]) -> Held:
    """How much of the chain `wanted` (diff IDs, bottom first) this engine holds: the longest prefix
    that one of its images starts with (each image's inspect, on the socket)."""
    if not wanted:
        return Held(0)
    problem = store_problem(env)
    if problem:
        return Held(0, problem)
    ids = dockerapi.image_list(env)
    if ids is None:
        return Held(0, "the docker engine did not list its images on its socket")
    chains: list[list[str]] = []
    for image in ids:
        got = dockerapi.image_rootfs(env, image)
        if got is None or not is_diff_ids(got[1]):
            return Held(0, f"the docker engine's answer about image {image[:19]} is not a list of layers")
        chains.append(got[1])
        if common_prefix(wanted, got[1]) == len(wanted):
            break
    return Held(held_prefix(wanted, chains))


def planned_layers(env: Mapping[str, str] | None = None, name: str = "JOB_IMAGE_LAYERS") -> list[str]:
    """Rank 0's image's diff IDs as the job's plan found them (space-separated in `$name`); [] when
    the plan found none or the variable is not a list of diff IDs."""
    values = (env if env is not None else os.environ).get(name, "").split()
    return values if is_diff_ids(values) else []
