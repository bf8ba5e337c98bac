"""Whom the quarantine believes (slurm_multi.quarantine, docs/bad-nodes.md): only who may write its
state dir. What another user can put in or near it (a FIFO, a link, a file of theirs, a lock held
open, a reason that moves the terminal) is refused in one line or shown escaped, at once."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_multi import quarantine

REPO = Path(__file__).resolve().parents[2]
NOBODY = pwd.getpwnam("nobody") if "nobody" in {p.pw_name for p in pwd.getpwall()} else None
as_root = pytest.mark.skipif(os.getuid() != 0 or NOBODY is None, reason="needs root and the user nobody")


def command(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SM_STATE_DIR", "SLURM_JOB_ID", "SM_ERROR_FILE")}
    env["PYTHONPATH"] = str(REPO / "py")
    argv = [sys.executable, "-m", "slurm_multi", "quarantine", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)


def one_line(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert "Traceback" not in done.stderr
    assert (done.returncode, done.stdout) == (code, ""), done.stderr
    (line,) = done.stderr.splitlines()
    return line


@contextlib.contextmanager
def reachable_dir() -> Iterator[Path]:
    """A dir another user can reach (pytest's tmp dirs are 0700): 0755, ours."""
    path = Path(tempfile.mkdtemp(prefix="sm-quarantine-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def entry_file(node: str = "node2", reason: str = "forged") -> str:
    return json.dumps(
        {
            "version": 1,
            "nodes": [{"node": node, "reason": reason, "job": "1", "since_epoch": time.time(),
                       "expires_epoch": time.time() + 3600, "who": "x"}],
        }
    )  # fmt: skip


def test_a_fifo_in_place_of_the_file_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    # A FIFO made every job's plan block on reading it, for ever.
    os.mkfifo(tmp_path / "quarantine.json")
    started = time.monotonic()
    for done in (
        command("check", "--state-dir", str(tmp_path), "--nodes", "node1"),
        command("add", "node1", "--reason", "x", "--state-dir", str(tmp_path)),
        command("list", "--state-dir", str(tmp_path)),
    ):
        line = one_line(done)
        assert f"cannot read {tmp_path / 'quarantine.json'}: not a regular file" in line
    assert time.monotonic() - started < 20
    with pytest.raises(quarantine.QuarantineError, match="not a regular file"):
        quarantine.in_allocation(str(tmp_path), ["node1"])


def test_a_link_in_place_of_the_file_or_the_lock_is_refused_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(entry_file())
    state = tmp_path / "state"
    state.mkdir()
    (state / "quarantine.json").symlink_to(elsewhere)
    line = one_line(command("check", "--state-dir", str(state), "--nodes", "node2"))
    assert "a symbolic link" in line
    (state / "quarantine.json").unlink()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (state / "quarantine.lock").symlink_to(victim)
    line = one_line(command("add", "node1", "--reason", "x", "--state-dir", str(state)))
    assert "the lock" in line and "symbolic link" in line
    assert victim.read_text() == "precious" and not (state / "quarantine.json").exists()


@as_root
def test_entries_another_user_wrote_into_a_private_dir_are_refused_not_believed() -> None:
    # The dir is ours and private: a quarantine.json of somebody else's got there only by a hole.
    with reachable_dir() as state:
        forged = state / "quarantine.json"
        forged.write_text(entry_file("node2", "forged by nobody"))
        os.chown(forged, NOBODY.pw_uid, NOBODY.pw_gid)
        line = one_line(command("check", "--state-dir", str(state), "--nodes", "node2"))
        assert "is owned by nobody, not root" in line and "nothing was changed" in line
        with pytest.raises(quarantine.QuarantineError, match="owned by nobody"):
            quarantine.add(str(state), ["node3"], "x", "1", 1)
        # Ours but writable by the group of a private dir: somebody else could have edited it.
        os.chown(forged, 0, 0)
        forged.chmod(0o664)
        assert "is writable by others" in one_line(command("list", "--state-dir", str(state)))
        forged.chmod(0o644)
        assert command("check", "--state-dir", str(state), "--nodes", "node2").stdout.startswith("node2\t")


@as_root
def test_a_group_shared_dir_believes_its_group_and_nobody_else() -> None:
    with reachable_dir() as state:
        state.chmod(0o2775)  # asked for: the group's members write here too
        os.chown(state, 0, NOBODY.pw_gid)
        written = state / "quarantine.json"
        written.write_text(entry_file("node2", "a member's entry"))
        os.chown(written, NOBODY.pw_uid, NOBODY.pw_gid)
        written.chmod(0o664)
        assert command("check", "--state-dir", str(state), "--nodes", "node2").stdout.startswith("node2\t")
        os.chown(written, NOBODY.pw_uid, 0)  # somebody of another group
        assert "is owned by nobody" in one_line(
            command("check", "--state-dir", str(state), "--nodes", "node2")
        )
        state.chmod(0o777)  # everybody may replace files in it: nothing there is believed
        line = one_line(command("check", "--state-dir", str(state), "--nodes", "node2"))
        assert "is writable by everybody" in line


HOLDER = """
import fcntl, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError as exc:
    print("refused", exc.errno, flush=True)
else:
    print("held", flush=True)
sys.stdin.read()
"""


@as_root
def test_nobody_else_can_hold_the_lock_of_a_private_quarantine() -> None:
    # The lock was 0664: another user opened it read-only, flocked it, and every add timed out.
    with reachable_dir() as state:
        old = os.umask(0o022)
        try:
            quarantine.add(str(state), ["node1"], "x", "1", 1)
        finally:
            os.umask(old)

        def as_nobody() -> None:
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)

        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(state / "quarantine.lock")], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, preexec_fn=as_nobody,
        )  # fmt: skip
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().startswith("refused")
            quarantine.add(str(state), ["node2"], "x", "1", 1, lock_timeout=0.5)
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(timeout=30)
        assert [e.node for e in quarantine.active(str(state))] == ["node1", "node2"]


def test_a_reason_with_escape_codes_and_newlines_is_stored_and_shown_escaped(tmp_path: Path) -> None:
    # It shifted the batch log's fields and printed raw in `quarantine list` (the terminal cleared).
    reason = "disk full\x1b[2J\x1b[31m\nnode9\tfake field\x9b2J\u202eok"
    assert command("add", "node1", "--reason", reason, "--state-dir", str(tmp_path)).returncode == 0
    stored = json.loads((tmp_path / "quarantine.json").read_text())["nodes"][0]["reason"]
    assert stored == "disk full\\x1b[2J\\x1b[31m node9 fake field\\x9b2J\\u202eok"
    listed = command("list", "--state-dir", str(tmp_path)).stdout
    assert "\x1b" not in listed and "\x9b" not in listed and "\u202e" not in listed
    assert listed.count("\n") == 2  # the header and one row
    # A hand-edited (or older) file with raw control characters: shown escaped, each field one line.
    (tmp_path / "quarantine.json").write_text(entry_file("node2", "a\nb\tc\x1b[2Jd"))
    checked = command("check", "--state-dir", str(tmp_path), "--nodes", "node2").stdout
    assert checked.count("\n") == 1 and checked.split("\t")[1] == "a b c\\x1b[2Jd"
    assert "\x1b" not in command("list", "--state-dir", str(tmp_path)).stdout


def test_a_reason_is_masked_before_it_is_cut_and_stored(tmp_path: Path) -> None:
    secret = "hf_" + "s3cr3t" * 8
    reason = "x" * 230 + secret
    env = {**os.environ, "HF_TOKEN": secret, "PYTHONPATH": str(REPO / "py")}
    env.pop("SM_STATE_DIR", None)
    argv = [sys.executable, "-m", "slurm_multi", "quarantine", "add", "node1", "--reason", reason,
            "--state-dir", str(tmp_path)]  # fmt: skip
    assert subprocess.run(argv, env=env, capture_output=True, check=False).returncode == 0
    stored = json.loads((tmp_path / "quarantine.json").read_text())["nodes"][0]["reason"]
    assert stored == "x" * 230 + "***" and secret[:6] not in stored
