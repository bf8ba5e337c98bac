"""Start-up time of the click group and of each node-side helper, against `python -c pass`.

Every sample is one fork/exec/wait of the same interpreter with the same environment (the repo's
py/ on PYTHONPATH), stdout and stderr to /dev/null. Each helper gets a cheap but real invocation,
so its module import and argument parsing are included, not just `--help`. The baseline series is
shared by every row and interleaved with them: each round runs the baseline once, then every
helper once, so a noisy neighbour slows both sides alike.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import format_seconds, helper_env, make_row, repo_root, talk, timed, write_rows  # noqa: E402

SMALL_CSV = "model,performance,metric\ntoy,,samples_per_second\ntoy,41.5,samples_per_second\n"


@dataclass(frozen=True)
class Helper:
    name: str  # the row's short name
    args: tuple[str, ...]  # after `python -m slurm_multi`
    stdin: str | None = None  # a file to feed on stdin (None = /dev/null)
    empty_path: bool = False  # run with a PATH that holds no amd-smi / nvidia-smi


def helpers(workdir: Path) -> list[Helper]:
    """The invocations measured; files they need are created under `workdir`."""
    csv = workdir / "perf_toy.csv"
    csv.write_text(SMALL_CSV)
    manifest = repo_root() / "examples" / "toy" / "build_manifest.json"
    return [
        Helper("slurm-multi --help", ("--help",)),
        Helper("barrier port", ("barrier", "port", "--master-port", "29500", "--job-id", "1")),
        Helper("manifest restore", ("manifest", "restore", str(manifest))),
        Helper("gpus detect (no GPU tools)", ("gpus", "detect"), empty_path=True),
        Helper("mounts dedup", ("mounts", "dedup", "--", "--shm-size", "1G")),
        Helper("redact", ("redact",)),
        Helper("results pick", ("results", "pick", str(csv))),
        Helper("reports wait --help", ("reports", "wait", "--help")),
        Helper("coordinator probe --help", ("coordinator", "probe", "--help")),
    ]


def _command(helper: Helper | None) -> list[str]:
    if helper is None:
        return [sys.executable, "-c", "pass"]
    return [sys.executable, "-m", "slurm_multi", *helper.args]


def _env(helper: Helper | None, empty_dir: Path) -> dict[str, str]:
    extra = {"PATH": str(empty_dir)} if helper is not None and helper.empty_path else None
    return helper_env(extra)


def run_once(helper: Helper | None, empty_dir: Path, check: bool = False) -> float:
    """Seconds for one start of `helper` (None = `python -c pass`); check=True verifies exit 0."""
    command, env = _command(helper), _env(helper, empty_dir)
    stderr = subprocess.PIPE if check else subprocess.DEVNULL

    def start() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr, check=False
        )

    seconds, done = timed(start)
    if check and done.returncode != 0:
        tail = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        shown = " ".join(command[1:])
        raise RuntimeError(f"startup: `{shown}` exited {done.returncode}: {tail[0]}")
    return seconds


def run(repeats: int = 10, only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="sm-bench-startup-") as tmp:
        workdir = Path(tmp)
        empty_dir = workdir / "empty-path"
        empty_dir.mkdir()
        known = helpers(workdir)
        unknown = sorted(set(only or ()) - {h.name for h in known})
        if unknown:
            names = ", ".join(h.name for h in known)
            raise ValueError(f"unknown helper {', '.join(unknown)!s}; known: {names}")
        chosen = [h for h in known if not only or h.name in only]
        for helper in [None, *chosen]:  # warm-up and check: every command must succeed
            run_once(helper, empty_dir, check=True)
        talk("startup", f"{repeats} rounds of `python -c pass` + {len(chosen)} helpers")
        baseline: list[float] = []
        samples: dict[str, list[float]] = {h.name: [] for h in chosen}
        for round_number in range(repeats):
            order = chosen if round_number % 2 == 0 else list(reversed(chosen))
            baseline.append(run_once(None, empty_dir))
            for helper in order:
                samples[helper.name].append(run_once(helper, empty_dir))
    rows = []
    for helper in chosen:
        shown = "python -m slurm_multi " + " ".join(
            Path(a).name if a.startswith("/") else a for a in helper.args
        )
        notes = "PATH holds no amd-smi/nvidia-smi" if helper.empty_path else ""
        if helper.name == "redact":
            shown += " </dev/null"
        rows.append(
            make_row(
                f"start-up: {helper.name}",
                shown,
                "python -c pass (same interpreter and environment)",
                samples[helper.name],
                baseline,
                notes=notes,
            )
        )
        talk(
            "startup",
            f"{helper.name}: {format_seconds(rows[-1]['median_s'])}, ratio {rows[-1]['ratio']:.2f}x",
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="rounds (each helper and the baseline once)")
    parser.add_argument(
        "--only", action="append", metavar="NAME", help="measure only this helper (repeatable)"
    )
    parser.add_argument("--out", default="-", help="write the rows (JSON list) here; '-' = stdout")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be positive")
    write_rows(run(args.repeats, args.only), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
