"""`slurm-multi quarantine check|add|list|remove`: the command line of the shared node quarantine.

Thin click commands over slurm_multi.quarantine (the file, its lock and every check of a value),
the same for the batch step and for people:

    slurm-multi quarantine check --state-dir DIR --nodes "node1 node2 node3"
    slurm-multi quarantine add --state-dir DIR --reason TEXT [--job ID] [--hours H] [--quiet] NODE...
    slurm-multi quarantine list [--all] [--json] --state-dir DIR
    slurm-multi quarantine remove NODE... | --all --state-dir DIR

`check` prints `<node>\\t<reason>\\t<job>\\t<expires ISO>` for each quarantined node of the list
(nothing: none); `list` shows who wrote each entry. What the file holds is printed with control
characters escaped, each field on one line. `add` says on stderr what it quarantined until when
(`--quiet`: nothing; the batch step says it in its own line). `--state-dir` defaults to
$SM_STATE_DIR, `--job` to $SLURM_JOB_ID or `manual`, `--hours` to 24, `--lock-timeout SECONDS` (the
lock wait of add and remove) to 10.
Exit 0 done, 2 usage error, 1 the file cannot be read or written or the lock stays held.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import click

from slurm_multi import quarantine
from slurm_multi.common import HelperError, talk
from slurm_multi.logline import escaped
from slurm_multi.quarantine import AREA, Entry, QuarantineError

CONTEXT = {"help_option_names": ["-h", "--help"]}


@contextmanager
def _one_line() -> Iterator[None]:
    """A store error as the helper's one line (`slurm-multi: quarantine: ...`) and its exit code."""
    try:
        yield
    except QuarantineError as exc:
        raise HelperError(str(exc), exc.exit_code) from None


def _expires_in(entry: Entry, now: float) -> str:
    seconds = entry.expires - now
    span = abs(seconds)
    text = f"{int(span // 3600)}h{int(span % 3600 // 60):02d}m" if span >= 3600 else f"{int(span // 60)}m"
    return text if seconds > 0 else f"expired {text} ago"


def table(rows: Sequence[Entry], now: float) -> str:
    """The `list` table; the reason last, so that a long one does not push the other columns. What
    the file says is shown, never sent to the terminal: control characters escaped (logline.escaped)."""
    header = ("NODE", "JOB", "WHO", "SINCE", "EXPIRES IN", "REASON")
    lines = [header] + [
        (e.node, escaped(e.job), escaped(e.who) or "?", e.since_iso, _expires_in(e, now), escaped(e.reason))
        for e in rows
    ]
    widths = [max(len(line[column]) for line in lines) for column in range(len(header) - 1)]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths)) + "  " + line[-1] + "\n"
        for line in lines
    )


state_dir_option = click.option(
    "--state-dir",
    metavar="DIR",
    help=f"The shared dir that holds {quarantine.FILE_NAME} (default: ${quarantine.STATE_DIR_ENV}).",
)
lock_option = click.option(
    "--lock-timeout",
    default=f"{quarantine.LOCK_TIMEOUT_S:g}",
    show_default=True,
    metavar="SECONDS",
    help=f"How long to wait for {quarantine.LOCK_NAME} (0 or more).",
)


@click.group("quarantine", context_settings=CONTEXT)
def cli() -> None:
    """The nodes later jobs avoid, shared through <state-dir>/quarantine.json."""


@cli.command("check", context_settings=CONTEXT)
@click.option(
    "--nodes", required=True, metavar="'NODE NODE...'",
    help="The job's node names, separated by spaces or newlines (`scontrol show hostnames`).",
)  # fmt: skip
@state_dir_option
def check_command(nodes: str, state_dir: str | None) -> None:
    """Print the quarantined nodes among --nodes: NODE<TAB>REASON<TAB>JOB<TAB>EXPIRES each, in the
    order given (nothing: none is quarantined).

    \b
    Example: slurm-multi quarantine check --nodes "$(scontrol show hostnames)" --state-dir /shared/sm-state
    """
    with _one_line():
        directory = quarantine.resolve_state_dir(state_dir)
        found = quarantine.in_allocation(directory, quarantine.split_nodes(nodes))
    for entry in found:
        click.echo(entry.check_line())


@cli.command("list", context_settings=CONTEXT)
@state_dir_option
@click.option("--all", "show_all", is_flag=True, help="Include expired entries.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the file's entries, plus 'active').")
def list_command(state_dir: str | None, show_all: bool, as_json: bool) -> None:
    """Show the quarantined nodes.

    \b
    Example: slurm-multi quarantine list --state-dir /shared/sm-state --all
    """
    now = time.time()
    with _one_line():
        directory = quarantine.resolve_state_dir(state_dir)
        rows = quarantine.entries(directory) if show_all else quarantine.active(directory, now)
    if as_json:
        nodes = [dict(entry.to_json(), active=entry.is_active(now)) for entry in rows]
        click.echo(json.dumps({"version": quarantine.VERSION, "nodes": nodes}, indent=2, ensure_ascii=False))
    elif rows:
        click.echo(table(rows, now), nl=False)
    else:
        talk(AREA, f"no node is quarantined in {directory}")


@cli.command("add", context_settings=CONTEXT)
@click.argument("nodes", nargs=-1, required=True, metavar="NODE...")
@click.option("--reason", required=True, metavar="TEXT", help="One line: why the nodes are quarantined.")
@click.option(
    "--hours", default=f"{quarantine.DEFAULT_HOURS:g}", show_default=True, metavar="HOURS",
    help="How long (fractions allowed).",
)  # fmt: skip
@click.option(
    "--job", metavar="ID", help=f"The job to record (default: $SLURM_JOB_ID, else {quarantine.MANUAL_JOB})."
)
@state_dir_option
@lock_option
@click.option("-q", "--quiet", is_flag=True, help="Say nothing when it worked (the batch step logs its own).")
def add_command(
    nodes: tuple[str, ...], reason: str, hours: str, job: str | None, state_dir: str | None,
    lock_timeout: str, quiet: bool,
) -> None:  # fmt: skip
    """Quarantine NODE... (a node already there is refreshed).

    \b
    Example: slurm-multi quarantine add node3 --reason "disk full" --hours 48 --state-dir /shared/sm-state
    """
    with _one_line():
        written = quarantine.add(
            quarantine.resolve_state_dir(state_dir), nodes, reason, job or quarantine.default_job(), hours,
            lock_timeout=lock_timeout,
        )  # fmt: skip
    if not quiet:
        until = max(entry.expires for entry in written)
        nodes_text = " ".join(entry.node for entry in written)
        talk(AREA, f"{nodes_text} quarantined until {quarantine.iso(until)}: {written[0].reason}")


@cli.command("remove", context_settings=CONTEXT)
@click.argument("nodes", nargs=-1, metavar="[NODE...]")
@click.option("--all", "all_nodes", is_flag=True, help="Every node (and a broken file, set aside).")
@state_dir_option
@lock_option
def remove_command(nodes: tuple[str, ...], all_nodes: bool, state_dir: str | None, lock_timeout: str) -> None:
    """Lift the quarantine of NODE... or of --all.

    \b
    Example: slurm-multi quarantine remove node3 --state-dir /shared/sm-state
    """
    with _one_line():
        if bool(nodes) == all_nodes:
            raise quarantine.QuarantineUsageError(f"{AREA}: remove: give NODE... or --all (one of the two)")
        directory = quarantine.resolve_state_dir(state_dir)
        if all_nodes:
            removed, moved = quarantine.remove_all(directory, lock_timeout=lock_timeout)
        else:
            removed, moved = quarantine.remove(directory, nodes, lock_timeout=lock_timeout), ""
    if moved:
        path = quarantine.file_path(directory)
        talk(AREA, f"{path} could not be read: kept as {moved}; the quarantine is empty")
    if removed:
        talk(AREA, f"removed {' '.join(removed)}")
    missing = [name for name in nodes if name not in removed]
    if missing:
        talk(AREA, f"not quarantined: {' '.join(missing)}")
    if all_nodes and not removed and not moved:
        talk(AREA, "no node was quarantined")
