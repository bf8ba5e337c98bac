"""The job dir is the job's alone: the verdict believes what is in it (fitness.json, status.json,
hang-cause.json), and its name is as predictable as the next job ID. A dir another user made first,
or can write, is refused by the plan; the judge names nodes from the job's own host list, never from
a report's; a hang-cause.json that is not the job user's makes no rank stop."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_multi.fitness.verdict import judge_job
from slurm_multi.hangwatch import CAUSE_FILE, Peers

ROOT = Path(__file__).resolve().parents[2]
NOBODY = pwd.getpwnam("nobody") if "nobody" in {p.pw_name for p in pwd.getpwall()} else None
as_root = pytest.mark.skipif(os.getuid() != 0 or NOBODY is None, reason="needs root and the user nobody")


def plan(tmp_path: Path, job_id: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SLURM_", "MAD_"))}
    base.update(PYTHONPATH=str(ROOT / "py"), SLURM_JOB_ID=job_id, SLURM_JOB_NUM_NODES="2")
    emit = str(tmp_path / "plan.sh")
    argv = [sys.executable, "-m", "slurm_multi", "job", "plan", "--batch-args", "--emit", emit,
            "--submit-dir", str(tmp_path), "--", "--runtime", "none", "--", "true"]  # fmt: skip
    return subprocess.run(argv, env=base, capture_output=True, text=True, cwd=tmp_path, check=False)


def job_dir_of(tmp_path: Path, job_id: str) -> Path:
    """Where the plan puts job `job_id` (it made job 1's first: the same <out>/<model>/ for every ID)."""
    done = plan(tmp_path, "1")
    assert done.returncode == 0, done.stderr
    (made,) = [p for p in tmp_path.rglob("1") if p.is_dir() and (p / "job.json").exists()]
    return made.parent / job_id


@as_root
def test_a_job_dir_another_user_made_first_is_refused_in_one_line(tmp_path: Path) -> None:
    target = job_dir_of(tmp_path, "94")
    target.mkdir()
    os.chown(target, NOBODY.pw_uid, NOBODY.pw_gid)
    done = plan(tmp_path, "94")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert f"the job dir {target} belongs to nobody, not to root" in done.stderr
    assert not (target / "job.json").exists()


def test_a_job_dir_others_can_write_or_a_link_is_refused_and_a_new_one_is_writable_by_nobody_else(
    tmp_path: Path,
) -> None:
    target = job_dir_of(tmp_path, "95")
    target.mkdir()
    target.chmod(0o777)
    done = plan(tmp_path, "95")
    assert done.returncode == 1 and "is writable by other users (mode 0777)" in done.stderr
    target.rmdir()
    elsewhere = target.with_name("elsewhere")  # (one outside --out is refused for that already)
    elsewhere.mkdir()
    target.symlink_to(elsewhere)
    done = plan(tmp_path, "95")
    assert done.returncode == 1 and "is a symbolic link" in done.stderr
    assert not (elsewhere / "job.json").exists()
    target.unlink()
    # A umask that shares with the group still makes a job dir only its user writes (requeued
    # attempts of the job find it again as it was made).
    old = os.umask(0o002)
    try:
        for _attempt in range(2):
            done = plan(tmp_path, "96")
            assert done.returncode == 0, done.stderr
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.with_name("96").stat().st_mode) == 0o755


def test_the_judge_names_nodes_from_the_jobs_host_list_never_from_a_report(tmp_path: Path) -> None:
    # A forged fitness.json named node[001-999] bad (its own `hosts` list was believed).
    forged = {
        "rank": 0,
        "host": "node[001-999]",
        "nnodes": 3,
        "hosts": ["node[001-999]", "node[001-999]", "node[001-999]"],
        "local": {"ok": False, "reason": "forged"},
        "checks": {"network": {}},
    }
    for rank in range(3):
        (tmp_path / f"node_{rank}").mkdir()
    (tmp_path / "node_0" / "fitness.json").write_text(json.dumps(forged))
    found = judge_job(str(tmp_path), ["n1", "n2", "n3"])
    assert {entry["host"] for entry in found} <= {"n1", "n2", "n3"}
    assert [(entry["rank"], entry["host"]) for entry in found] == [(0, "n1"), (1, "n2"), (2, "n3")]


def test_a_hang_cause_that_is_not_the_job_users_makes_no_rank_stop(tmp_path: Path) -> None:
    peers = Peers(str(tmp_path), 3, 5.0)
    record = {"rank": 2, "node": "n3", "detected_epoch": time.time()}
    (tmp_path / CAUSE_FILE).write_text(json.dumps(record))
    assert peers.cause(0, time.time() - 60) == record  # the job's own: heard
    elsewhere = tmp_path / "elsewhere.json"
    shutil.move(tmp_path / CAUSE_FILE, elsewhere)
    (tmp_path / CAUSE_FILE).symlink_to(elsewhere)
    assert peers.cause(0, time.time() - 60) is None  # a link: not followed
    (tmp_path / CAUSE_FILE).unlink()
    os.mkfifo(tmp_path / CAUSE_FILE)
    assert peers.cause(0, time.time() - 60) is None  # a FIFO: not waited on
    (tmp_path / CAUSE_FILE).unlink()
    if os.getuid() == 0 and NOBODY is not None:
        (tmp_path / CAUSE_FILE).write_text(json.dumps(record))
        os.chown(tmp_path / CAUSE_FILE, NOBODY.pw_uid, NOBODY.pw_gid)
        assert peers.cause(0, time.time() - 60) is None  # another user's: no rank stops for it
