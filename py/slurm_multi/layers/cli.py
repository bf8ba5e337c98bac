"""`slurm-multi layers plan|held|filter|cache-put|cache-tar|prune`: layer-level image distribution's
command line (one click group). The image stage (lib/image.sh) runs them; each works by hand too.

Exit codes: 0 done, 1 runtime failure, 2 usage or a file that is not what it should be, 3 timeout.
"""

from __future__ import annotations

import os

import click

from slurm_multi.common import FiniteFloat, HelperError, talk, usage_error
from slurm_multi.layers import engine, plan, store, tarstream
from slurm_multi.relay.tree import size_text

CONTEXT = {"help_option_names": ["-h", "--help"]}


def _talk(message: str) -> None:
    talk("image", message)


def _stats(path: str | None, values: dict[str, int]) -> None:
    """--stats-file: `key=value` lines (bash passes them on to the timeline as they are)."""
    if path:
        with open(path, "w", encoding="ascii") as out:
            out.writelines(f"{key}={value}\n" for key, value in values.items())


@click.group("layers", context_settings=CONTEXT)
def cli() -> None:
    """Move only the layers a node lacks: rank 0's plan, the tar filter, the layered cache.

    \b
    A worker says (in its image READY) how many of the plan's layers its engine holds; rank 0's
    `plan` turns that into each worker's prefix; the relay and the cache leave out what is held.
    Exit codes: 0 ok, 1 failed, 2 usage or a bad file, 3 timeout.
    """


@cli.command("plan", context_settings=CONTEXT)
@click.option("--image", required=True, help="Rank 0's image reference (SM_IMAGE).")
@click.option("--image-id", required=True, help="Its ID, as rank 0 releases it.")
@click.option("--nnodes", type=click.IntRange(min=1), required=True, help="Nodes (ranks) in the job.")
@click.option(
    "--holds-file", type=click.Path(dir_okay=False), help="The barrier's holds file (barrier.holds)."
)
@click.option("--nodes", metavar="HOSTS", help="Host names in rank order, comma-separated (for the log).")
@click.option("--image-layers", type=click.Choice(("auto", "off")), default="auto", show_default=True,
              help="off: the whole image moves (--image-layers).")  # fmt: skip
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Write the plan (JSON) here.")
def plan_cmd(
    image: str,
    image_id: str,
    nnodes: int,
    holds_file: str | None,
    nodes: str | None,
    image_layers: str,
    out: str,
) -> None:
    """Rank 0: how many of its image's layers each worker holds; print `layers` or `whole`.

    \b
    Example: slurm-multi layers plan --image toy/model:local --image-id sha256:… --nnodes 3 \\
               --holds-file "$SM_SCRATCH/barrier.holds" --out "$SM_SCRATCH/layers.plan"
    """
    lines: list[str] = []
    if holds_file:
        try:
            with open(holds_file, encoding="utf-8", errors="replace") as handle:
                lines = handle.readlines()
        except FileNotFoundError:
            pass
    made = plan.make_plan(os.environ, image, image_id, nnodes, lines, off=image_layers == "off")
    plan.write_plan(out, made)
    _talk(plan.describe(made, nnodes, plan.hosts_from(nodes)))
    click.echo("whole" if made.whole else "layers")


@cli.command("held", context_settings=CONTEXT)
@click.option("--layers-from", "variable", default="JOB_IMAGE_LAYERS", show_default=True, metavar="VAR",
              help="The environment variable holding the chain (diff IDs, space-separated).")  # fmt: skip
def held_cmd(variable: str) -> None:
    """Print how many layers of a chain this node's docker engine holds (its longest prefix).

    \b
    Example:
      export JOB_IMAGE_LAYERS="$(docker image inspect -f '{{join .RootFS.Layers " "}}' IMAGE)"
      slurm-multi layers held
    """
    wanted = engine.planned_layers(os.environ, variable)
    if not wanted:
        raise usage_error(
            f"layers held: ${variable} is not a list of diff IDs (sha256:<64 hex>, space-separated)"
        )
    found = engine.held(os.environ, wanted)
    if found.why:
        _talk(found.why)
    click.echo(found.count)


def _chain_of(image: str) -> list[str]:
    mine = engine.image_layers(os.environ, image)
    if mine.why:
        raise HelperError(f"layers: {mine.why}")
    return mine.diff_ids


@cli.command("filter", context_settings=CONTEXT)
@click.option("--image", required=True, help="The image whose `docker save` comes on stdin.")
@click.option(
    "--held", type=click.IntRange(min=0), required=True, help="Leave out the blobs of this many layers."
)
def filter_cmd(image: str, held: int) -> None:
    """Copy `docker save`'s tar from stdin to stdout without the blobs of the first --held layers.

    \b
    Example (the worker holds the first 12 layers):
      docker save IMAGE | slurm-multi layers filter --image IMAGE --held 12 | ssh worker docker load
    """
    if os.isatty(0) or os.isatty(1):
        raise usage_error("layers filter: pipe docker save into it and its output into docker load")
    counts = tarstream.filter_stream(0, 1, _chain_of(image), held)
    _talk(
        f"left out {counts['left_out_layers']} layer(s) ({size_text(counts['left_out_bytes'])}), "
        f"kept {counts['kept_layers']} ({size_text(counts['kept_bytes'])} in all)"
    )


@cli.command("cache-put", context_settings=CONTEXT)
@click.option("--cache", "cache_dir", required=True, type=click.Path(file_okay=False), help="--image-cache.")
@click.option("--index", required=True, type=click.Path(dir_okay=False), help="Write the image's index here.")
@click.option(
    "--plan", "plan_file", required=True, type=click.Path(dir_okay=False), help="`layers plan`'s file."
)
def cache_put_cmd(cache_dir: str, index: str, plan_file: str) -> None:
    """Store `docker save`'s tar from stdin in the cache: the blobs it lacks, and the image's index.

    \b
    Example: docker save IMAGE | slurm-multi layers cache-put --cache DIR --index DIR/.K.layers.tmp --plan P
    """
    made = plan.read_plan(plan_file)
    if made.whole:
        raise usage_error(
            f"layers cache-put: the plan moves the whole image ({made.whole}); save a tar instead"
        )
    pieces = tarstream.Scanner(0, made.diff_ids).pieces()
    writer = store.put(cache_dir, index, made.image_id, made.diff_ids, pieces)
    if writer.failed:
        raise HelperError(f"layers: cannot store the image in {cache_dir}: {writer.failed}")
    _talk(
        f"stored {len(writer.new)} new layer blob(s) ({size_text(sum(writer.new.values()))}) in {cache_dir}; "
        f"{len(writer.kept)} were there already ({size_text(sum(writer.kept.values()))})"
    )


@cli.command("cache-tar", context_settings=CONTEXT)
@click.option("--cache", "cache_dir", required=True, type=click.Path(file_okay=False), help="--image-cache.")
@click.option(
    "--index", required=True, type=click.Path(dir_okay=False), help="The image's index (<key>.layers)."
)
@click.option("--image-id", default="", help="Refuse an index of another image.")
@click.option(
    "--held", type=click.IntRange(min=0), help="Leave out this many layers [default: ask the engine]."
)
@click.option("--stats-file", type=click.Path(dir_okay=False), help="Write what was read (key=value lines).")
def cache_tar_cmd(
    cache_dir: str, index: str, image_id: str, held: int | None, stats_file: str | None
) -> None:
    """Write the image's tar to stdout from the cache, without the blobs this node's engine holds.

    \b
    Example: slurm-multi layers cache-tar --cache DIR --index DIR/K.layers | docker load -q
    """
    if os.isatty(1):
        raise usage_error("layers cache-tar: stdout is a terminal; pipe it into docker load")
    found = store.read_index(index)
    if image_id and found.image_id != image_id:
        raise HelperError(f"layers: {index} holds {found.image_id[7:19]}, not {image_id[7:19]}")
    if held is None:
        holding = engine.held(os.environ, found.diff_ids)
        if holding.why:
            _talk(f"{holding.why}; reading every layer")
        held = holding.count
    try:
        os.utime(index)  # its age is its last use (pruning)
    except OSError:
        pass
    counts = store.write_tar(cache_dir, found, min(held, len(found.diff_ids)), 1)
    _stats(stats_file, counts)
    _talk(
        f"read {counts['read_layers']} of {counts['layers']} layers ({size_text(counts['read_bytes'])}) from "
        f"{cache_dir}; this node holds {counts['held_layers']} ({size_text(counts['held_bytes'])})"
    )


def _size(text: str) -> int:
    """`500G`, `2T`, `1.5TiB`, `1000000` -> bytes (binary units)."""
    import re

    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?", text.strip().upper())
    if match is None:
        raise usage_error(f"layers prune: --max-size {text!r} is not a size (e.g. 500G, 2T)")
    return int(float(match.group(1)) * (1 << (10 * " KMGT".index(match.group(2) or " "))))


@cli.command("prune", context_settings=CONTEXT)
@click.option(
    "--cache",
    "cache_dir",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="--image-cache.",
)
@click.option(
    "--older-than", type=FiniteFloat(min=0), metavar="DAYS", help="Remove entries unused this long."
)
@click.option(
    "--max-size", metavar="SIZE", help="Then remove the oldest until the cache holds at most SIZE (500G)."
)
@click.option("--dry-run", is_flag=True, help="Say what would go; remove nothing.")
def prune_cmd(cache_dir: str, older_than: float | None, max_size: str | None, dry_run: bool) -> None:
    """Remove old cache entries (layered and whole-image tars), then every blob no index names.

    \b
    Example: slurm-multi layers prune --cache /shared/$USER/sm-cache --older-than 14 --max-size 2T
    """
    from slurm_multi.layers.prune import prune

    if older_than is None and max_size is None:
        raise usage_error("layers prune: give --older-than DAYS and/or --max-size SIZE")
    limit = _size(max_size) if max_size else None
    gone = prune(cache_dir, older_than * 86400 if older_than is not None else None, limit, dry_run,
                 lambda line: talk("cache", line))  # fmt: skip
    talk("cache", f"{'would free' if dry_run else 'freed'} {size_text(gone['bytes'])} "
                  f"({gone['entries']} entries, {gone['blobs']} blobs)")  # fmt: skip
