"""Facts that bash and Python both need, held equal: the stage order (lib/node.sh NODE_STAGES and
events.STAGE_ORDER) and the dry run's placeholders for what only the job knows
(lib/job.sh job::dry_run_prepare and tests/e2e/dry_run_vs_job.py, which puts them back into the
job's argv to compare it with the dry run)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from slurm_multi.events import STAGE_ORDER

REPO = Path(__file__).resolve().parents[2]


def test_the_stage_order_has_one_owner_read_by_bash_and_python(tmp_path):
    import subprocess

    # bash's NODE_STAGES, as a node task has it (lib/node.sh sourced from elsewhere), is Python's order.
    sources = "; ".join(f"source {REPO}/lib/{name}.sh" for name in ("log", "util", "node"))
    script = f'{sources}; echo "${{NODE_STAGES[*]}}"'
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert tuple(done.stdout.split()) == STAGE_ORDER
    assert STAGE_ORDER[0] == "prepare" and "run" in STAGE_ORDER
    # Neither side spells the list out again.
    assert re.findall(r"^NODE_STAGES=\(", (REPO / "lib" / "node.sh").read_text(), re.MULTILINE) == []


def _dry_run_vs_job():
    spec = importlib.util.spec_from_file_location(
        "dry_run_vs_job", REPO / "tests" / "e2e" / "dry_run_vs_job.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_placeholders_are_the_ones_the_comparison_puts_back():
    text = (REPO / "lib" / "job.sh").read_text()
    body = text[text.index("job::dry_run_prepare() {") :]
    body = body[: body.index("\n}\n")]
    names = "MASTER_ADDR|SLURMD_NODENAME|SLURM_JOB_NODELIST|SLURM_STEP_ID"
    shown = dict(re.findall(rf'\b({names})="([^"]*)"', body))
    assert set(shown) == {"MASTER_ADDR", "SLURMD_NODENAME", "SLURM_JOB_NODELIST", "SLURM_STEP_ID"}
    node = 3
    words = ["MASTER_ADDR=node9", "SLURMD_NODENAME=node9", "SLURM_JOB_NODELIST=node[1-9]", "SLURM_STEP_ID=7"]
    put_back = _dry_run_vs_job().placeholders(words, "4242", node)
    names = [word.split("=", 1)[0] for word in words]
    assert put_back == [f"{name}={shown[name]}".replace("${node}", str(node)) for name in names]
