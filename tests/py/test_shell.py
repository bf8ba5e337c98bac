"""slurm_multi.shell: the one atomic writer every helper's file goes through."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_multi import shell


def test_the_write_is_atomic_with_its_mode_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    shell.write_atomic(str(target), "one\n")
    shell.write_private(str(target), "two\n")
    assert target.read_text() == "two\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["status.json"]


def test_a_symlink_planted_at_a_predictable_temp_name_never_redirects_the_write(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    # The names the writers used to use: .<name>.tmp.<pid> and .<name>.<pid>.tmp.
    for name in (f".ready.tmp.{os.getpid()}", f".ready.{os.getpid()}.tmp"):
        (tmp_path / name).symlink_to(victim)
    shell.write_atomic(str(tmp_path / "ready"), "10.0.0.1 21544\n")
    assert victim.read_text() == "untouched\n"
    assert (tmp_path / "ready").read_text() == "10.0.0.1 21544\n"
    assert not (tmp_path / "ready").is_symlink()


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old\n")

    def broken(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        shell.write_atomic(str(target), "new\n")
    assert target.read_text() == "old\n" and sorted(os.listdir(tmp_path)) == ["summary.json"]


def test_a_durable_write_syncs_the_file_before_the_rename_and_the_directory_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "quarantine.json"
    target.write_text("old\n")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else f"fsync {os.pread(fd, 9, 0)!r}")
        real_fsync(fd)

    def replace(source: str, destination: str) -> None:
        calls.append(f"replace {Path(destination).name}")
        real_replace(source, destination)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    shell.write_atomic(str(target), "new whole\n", durable=True)
    assert calls == ["fsync b'new whole'", "replace quarantine.json", "fsync dir"]
    assert target.read_text() == "new whole\n" and sorted(os.listdir(tmp_path)) == ["quarantine.json"]
    calls.clear()
    shell.write_atomic(str(target), "derived\n")  # not durable: no fsync at all
    assert calls == ["replace quarantine.json"]


def test_a_durable_write_that_fails_before_the_rename_leaves_the_old_whole_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "quarantine.json"
    target.write_text("old whole\n")
    renamed: list[str] = []

    def failing_fsync(fd: int) -> None:  # between the write and the rename: the disk gave up
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    monkeypatch.setattr(os, "replace", lambda *a: renamed.append("replace"))
    with pytest.raises(OSError, match="Input/output error"):
        shell.write_atomic(str(target), "new\n", durable=True)
    assert renamed == []  # never renamed into place unsynced
    assert target.read_text() == "old whole\n" and sorted(os.listdir(tmp_path)) == ["quarantine.json"]


def test_a_directory_that_refuses_fsync_does_not_fail_a_durable_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument")  # some filesystems refuse it on a directory
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    shell.write_atomic(str(tmp_path / "status.json"), "done\n", durable=True)
    assert (tmp_path / "status.json").read_text() == "done\n"


def test_a_pipe_or_device_given_as_the_path_is_written_through_never_replaced(tmp_path: Path) -> None:
    """`--out /dev/null` once turned /dev/null into a root-only regular file (a rename over it),
    and every later open of it by another user failed. A FIFO stands in for the device here."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so the writer's open returns
    try:
        shell.write_atomic(fifo, "rows\n", durable=True)
        assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the pipe was replaced by a file"
        assert os.read(reader, 100) == b"rows\n"
    finally:
        os.close(reader)
    link = tmp_path / "stdout"
    link.symlink_to(fifo)  # as /dev/stdout names the caller's pipe
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        shell.write_atomic(link, b"more")
        assert link.is_symlink() and os.read(reader, 100) == b"more"
    finally:
        os.close(reader)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.fifo", "stdout"]  # no temp file
    # A file of secrets (0600 is its point) is never written into a pipe, nor the pipe replaced.
    with pytest.raises(OSError, match="a pipe or a device"):
        shell.write_private(str(fifo), "token\n")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_another_users_symlink_to_a_pipe_is_replaced_never_written_through(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a symlink another user's needs root (CI runs as root)")
    fifo = tmp_path / "theirs.fifo"
    os.mkfifo(fifo)
    planted = tmp_path / "summary.json"
    planted.symlink_to(fifo)
    os.lchown(planted, 65534, 65534)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        shell.write_atomic(planted, "verdict\n")
        assert os.read(reader, 100) == b""  # nothing reached the planted pipe
    finally:
        os.close(reader)
    assert not planted.is_symlink() and planted.read_text() == "verdict\n"


def test_collect_writes_through_the_same_writer_with_its_own_wording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """results.shared.write_atomic is this writer plus a one-line HelperError: one protocol."""
    from slurm_multi.common import HelperError
    from slurm_multi.results import shared

    calls: list[tuple[object, ...]] = []
    real = shell.write_atomic
    monkeypatch.setattr(shell, "write_atomic", lambda *a: calls.append(a) or real(*a))
    target = tmp_path / "perf.csv"
    shared.write_atomic(target, "model,perf\nx,\udcff\n")  # an undecoded CSV byte, kept as a surrogate
    assert calls == [(target, "model,perf\nx,\udcff\n", None, True)]
    assert target.read_bytes() == b"model,perf\nx,\xff\n"  # written back as the byte it stands for
    old = os.umask(0o027)
    try:
        shared.write_atomic(tmp_path / "summary.json", b"{}\n", durable=False)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == 0o640  # 0666 less the umask
    with pytest.raises(HelperError) as caught:
        shared.write_atomic(tmp_path / "missing" / "summary.json", "{}\n", "is the job directory writable?")
    assert str(caught.value).startswith(f"results: cannot write {tmp_path}/missing/summary.json: ")
    assert str(caught.value).endswith("; is the job directory writable?")


@settings(max_examples=400)
@given(st.text(max_size=12) | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True))
def test_a_variable_name_is_taken_exactly_when_bash_s_rule_takes_it(name: str) -> None:
    """[A-Za-z_][A-Za-z0-9_]* (the rule, as a regex): anything else is refused before bash sees it."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        assert shell.scalar(name, "it's") == f"declare -g {name}='it'\"'\"'s'"
        assert shell.array(name, ["a b", ""]) == f"declare -ga {name}=('a b' '')"
    else:
        with pytest.raises(ValueError, match="not a shell variable name"):
            shell.scalar(name, "v")
