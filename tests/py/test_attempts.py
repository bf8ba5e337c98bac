"""A requeued job's attempt records: written by the batch step, listed oldest first by collect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_multi import attempts

REPO = Path(__file__).resolve().parents[2]


def write(jobdir: Path, index: int, *args: str) -> subprocess.CompletedProcess[str]:
    (jobdir / f"attempt_{index}").mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "record-attempt", "--",
         str(jobdir / f"attempt_{index}" / "requeue.json"), *args],
        capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "py")},
    )  # fmt: skip


def test_records_are_written_and_listed_oldest_first_with_their_dirs(tmp_path: Path) -> None:
    assert write(tmp_path, 1, "1", "quarantine", "3", "node3,node5", "node5\tquarantined").returncode == 0
    assert write(tmp_path, 0, "0", "fitness", "7", "node3", "node3\tdisk full", "bare").returncode == 0
    (tmp_path / "attempt_10").mkdir()  # a dir without its record: said, not listed
    found, warnings = attempts.earlier(str(tmp_path))
    assert warnings == ["attempt_10/requeue.json unreadable (FileNotFoundError); that attempt is not listed"]
    seen = [(a["attempt"], a["cause"], a["dir"]) for a in found]
    assert seen == [(1, "fitness", "attempt_0"), (2, "quarantine", "attempt_1")]
    assert found[0]["requeued_after_s"] == 7 and found[0]["excluded"] == ["node3"]
    assert found[0]["bad_nodes"] == [
        {"node": "node3", "reason": "disk full"},
        {"node": "bare", "reason": "(no reason given)"},
    ]
    assert found[1]["excluded"] == ["node3", "node5"]


def test_an_unreadable_record_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "attempt_0").mkdir()
    (tmp_path / "attempt_0" / "requeue.json").write_text("{not json")
    found, warnings = attempts.earlier(str(tmp_path))
    assert found == [] and len(warnings) == 1 and "attempt_0/requeue.json unreadable" in warnings[0]
    assert attempts.earlier(str(tmp_path / "missing")) == ([], [])


@pytest.mark.parametrize(
    "args", [("x", "fitness", "1", ""), ("0", "whim", "1", ""), ("0", "fitness", "-1", "")]
)
def test_bad_arguments_are_one_line_exit_2_and_write_nothing(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = write(tmp_path, 0, *args)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "attempt_0" / "requeue.json").exists()
    assert json.dumps(attempts.record(0, "fitness", 1, "", [])["bad_nodes"]) == "[]"


def test_a_reason_is_stored_and_listed_with_its_secrets_masked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "pw_zz_secret_991"
    (tmp_path / "attempt_0").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "slurm_multi", "job", "record-attempt", "--",
         str(tmp_path / "attempt_0" / "requeue.json"), "0", "run", "5", "node2",
         f"node2\tleaked {secret}\nx"],
        capture_output=True, text=True, env={"PYTHONPATH": str(REPO / "py"), "DB_PASSWORD": secret},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stored = (tmp_path / "attempt_0" / "requeue.json").read_text()
    assert secret not in stored and json.loads(stored)["bad_nodes"][0]["reason"] == "leaked *** x"
    # a record written before the rule (or before the secret was known): masked as collect reads it
    (tmp_path / "attempt_1").mkdir()
    old = attempts.record(1, "run", 5, "node2", [])
    old["bad_nodes"] = [{"node": "node2", "reason": f"leaked {secret}"}]
    attempts.write(str(tmp_path / "attempt_1" / "requeue.json"), old)
    monkeypatch.setenv("DB_PASSWORD", secret)
    found, _ = attempts.earlier(str(tmp_path))
    assert [a["bad_nodes"][0]["reason"] for a in found] == ["leaked *** x", "leaked ***"]
