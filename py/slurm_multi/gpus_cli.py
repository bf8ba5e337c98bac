"""`slurm-multi gpus parse|detect|docker-args`: the click commands over slurm_multi.gpus (which has no
click: every node's prepare detects its GPUs through it)."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from slurm_multi.gpus import detect_gpus, docker_gpu_args, load_detected, parse_amdsmi, read_input
from slurm_multi.logline import this_host


def _print_json(document: dict[str, Any]) -> None:
    click.echo(json.dumps(document))


@click.group("gpus", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Detect GPUs and parse amd-smi / nvidia-smi output."""


@cli.command("parse")
@click.argument("source", metavar="[FILE|-]", default="-")
def parse_command(source: str) -> None:
    """Parse `amd-smi list -e --json` output (noise tolerated) from FILE or stdin; print JSON.

    Example: amd-smi list -e --json 2>&1 | slurm-multi gpus parse
    """
    _print_json(parse_amdsmi(read_input(source)))


@cli.command("detect")
@click.option("--json", "as_json", is_flag=True, help="Print the full JSON document.")
def detect_command(as_json: bool) -> None:
    """Detect this node's GPUs with amd-smi, else nvidia-smi, else report none.

    Without --json prints SM_GPU_VENDOR=…, SM_GPU_COUNT=…, SM_GPU_INDEXES=… (one per line).

    Example: slurm-multi gpus detect --json > gpus.json
    """
    detected = detect_gpus(path=os.environ.get("PATH"))
    if as_json:
        _print_json(detected)
        return
    indexes = ",".join(str(gpu["index"]) for gpu in detected["gpus"])
    click.echo(
        f"SM_GPU_VENDOR={detected['vendor']}\nSM_GPU_COUNT={detected['count']}\nSM_GPU_INDEXES={indexes}"
    )


@cli.command("docker-args")
@click.option(
    "--detected",
    "detected_source",
    metavar="FILE|-",
    help="`gpus detect --json` output, or raw amd-smi output (default: detect now).",
)
@click.option(
    "--vendor", metavar="V", help="gpu_vendor asked for: AMD, NVIDIA or none (default: the detected one)."
)
@click.option(
    "--docker-gpus",
    "docker_gpus",
    metavar="LIST",
    help="GPU indexes asked for: 0-7 / 0,1,2 / 0-3,6 / all (default: every detected GPU).",
)
@click.option(
    "--node", metavar="NAME", help="Node name for errors (default: $SLURMD_NODENAME or the host name)."
)
@click.option("-0", "null_terminated", is_flag=True, help="End each argument with NUL instead of a newline.")
def docker_args_command(
    detected_source: str | None,
    vendor: str | None,
    docker_gpus: str | None,
    node: str | None,
    null_terminated: bool,
) -> None:
    """Print the complete docker run GPU arguments, one per line.

    AMD: --device /dev/kfd, --device /dev/dri/renderD<N> per GPU, --group-add video.
    NVIDIA: --gpus "device=0,1". No GPUs detected and none asked for: nothing.
    What the node detects wins: a GPU or vendor asked for but not detected, or an AMD GPU with no
    known render node, is one line on stderr and exit 2, never a container with fewer GPUs.

    Example: slurm-multi gpus docker-args -0 --docker-gpus 0-7 >"$f" || exit 2; mapfile -d '' a <"$f"
    """
    if detected_source is not None:
        detected = load_detected(read_input(detected_source), detected_source)
    else:
        detected = detect_gpus(path=os.environ.get("PATH"))
    args = docker_gpu_args(detected, vendor, docker_gpus, node or this_host())
    terminator = "\0" if null_terminated else "\n"
    click.echo("".join(arg + terminator for arg in args), nl=False)
