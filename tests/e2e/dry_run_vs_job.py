"""The dry run is the job: each command the dry run shows against the one the real job logged.

    dry_run_vs_job.py JOB_ID DRY_RUN_OUTPUT JOB_DIR RANK...

For the batch step's srun line (batch.log) and every RANK's run line (node_<RANK>/node.log, the
`run: + ` line that log::cmd wrote), the words of the real command, with what only the real job can
know put back as the dry run's placeholders, must equal the dry run's words. The placeholders:
the job ID (DRYRUN), a rank's host (`<node N>`, N its node's index: SLURMD_NODENAME, pyxis's
--nodelist), rank 0's (`<node 0>`: MASTER_ADDR), the nodelist (`<job nodes>`) and the step ID
(`<step>`). Nothing else is rewritten: any other difference is a dry run that is not the job.
Exit 1 with a word diff.
"""

from __future__ import annotations

import difflib
import re
import shlex
import sys
from pathlib import Path

RUN_MARK = " run: + "
BATCH_MARK = " multi: + "  # the first such line that starts sm-node (srun, or a wrapper's)


def placeholders(words: list[str], job_id: str, node: int) -> list[str]:
    out = []
    for word in words:
        word = re.sub(rf"(?<![0-9]){re.escape(job_id)}(?![0-9])", "DRYRUN", word)
        for name, shown in (
            ("MASTER_ADDR=", "<node 0>"),
            ("SLURMD_NODENAME=", f"<node {node}>"),
            ("SLURM_JOB_NODELIST=", "<job nodes>"),
            ("SLURM_STEP_ID=", "<step>"),
            ("--nodelist=", f"<node {node}>"),
        ):
            if word.startswith(name):
                word = name + shown
        out.append(word)
    return out


def dry_commands(text: str) -> tuple[dict[str, str], dict[str, int]]:
    """The dry run's batch step and each rank's command line, by `batch` / rank (a block per node,
    `Node R:`, or per rank where each task is one, `Rank R (node N, local rank L):`), and each
    rank's node index."""
    lines = text.splitlines()
    found: dict[str, str] = {}
    nodes: dict[str, int] = {}
    node = None
    for i, line in enumerate(lines):
        if line.startswith("Batch step"):
            found["batch"] = lines[i + 1].strip()
        match = re.match(r"(?:Node (\d+)|Rank (\d+) \(node (\d+), local rank \d+\)): ", line)
        if match:
            node = match.group(1) or match.group(2)
            nodes[node] = int(match.group(3) or match.group(1))
        if node is None:
            continue
        if line.startswith("  bare metal: "):
            found[node] = line[len("  bare metal: ") :]
        elif line.startswith("  docker (GPU arguments") or line.startswith("  pyxis: sm-node on the node"):
            found[node] = lines[i + 1].strip()
    return found, nodes


def logged(path: Path, mark: str, holding: str = "") -> str:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if mark in line and holding in line:
            return line.split(" + ", 1)[1]
    raise SystemExit(f"{path}: no line with {mark.strip()!r}")


def compare(what: str, dry: str, real: str, job_id: str, node: int) -> bool:
    want = shlex.split(dry)
    got = placeholders(shlex.split(real), job_id, node)
    if want == got:
        return True
    print(f"{what}: the dry run shows another command than the job ran", file=sys.stderr)
    for line in difflib.unified_diff(want, got, "dry run", "job", lineterm="", n=2):
        print("  " + line, file=sys.stderr)
    return False


def main(argv: list[str]) -> int:
    job_id, dry_file, job_dir, *ranks = argv
    dry, node_of = dry_commands(Path(dry_file).read_text(encoding="utf-8"))
    jobdir = Path(job_dir)
    ok = True
    if "batch" not in dry:
        raise SystemExit("the dry run shows no batch step")
    ok &= compare(
        "batch step", dry["batch"], logged(jobdir / "batch.log", BATCH_MARK, "/bin/sm-node "), job_id, 0
    )
    for rank in ranks:
        if rank not in dry:
            raise SystemExit(f"the dry run shows no command for node {rank}")
        real = logged(jobdir / f"node_{rank}" / "node.log", RUN_MARK)
        ok &= compare(f"rank {rank}", dry[rank], real, job_id, node_of[rank])
    if not ok:
        return 1
    print(f"dry run == job: the batch step and rank(s) {' '.join(ranks)} of job {job_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
