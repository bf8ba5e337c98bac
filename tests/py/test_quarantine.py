"""slurm_multi.quarantine (the store) and slurm_multi.quarantine_cli (`slurm-multi quarantine
check|add|list|remove`): the shared list of nodes later jobs avoid, <state-dir>/quarantine.json.

Real files and real processes: the commands run as subprocesses (`python -m slurm_multi quarantine
...`), as the batch step and people run them; concurrent writers and a held lock are other processes.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_multi import quarantine
from slurm_multi.quarantine import BrokenFile, Entry, LockTimeout, QuarantineUsageError

REPO = Path(__file__).resolve().parents[2]
T0 = 1796032800.0  # 2026-11-30T10:00:00Z
HOUR = 3600.0


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("SM_STATE_DIR", "SLURM_JOB_ID", "SM_ERROR_FILE")}
    return dict(base, PYTHONPATH=str(REPO / "py"), USER="alice", **extra)


def batch_step(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """A command as the batch step runs it (lib/job.sh: `util::sm quarantine add --quiet ...`)."""
    words = ["add", "--quiet", *args[1:]] if args[:1] == ("add",) else list(args)
    argv = [sys.executable, "-m", "slurm_multi", "quarantine", *words]
    return subprocess.run(argv, capture_output=True, text=True, env=env(**extra), check=False)


def person(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """`bin/slurm-multi quarantine …` (bin/slurm-multi runs `python -m slurm_multi`)."""
    argv = [sys.executable, "-m", "slurm_multi", "quarantine", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env(**extra), check=False)


def one_line_error(
    done: subprocess.CompletedProcess[str], code: int, start: str = r"slurm-multi: quarantine( [a-z]+)?: "
) -> str:
    """The one stderr line: `slurm-multi: quarantine: ...` (the store's), `slurm-multi: quarantine
    add: ...` (click's usage errors)."""
    assert "Traceback" not in done.stderr
    assert (done.returncode, done.stdout) == (code, ""), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and re.match(start, lines[0]), done.stderr
    return lines[0]


def document(state: Path) -> dict:
    return json.loads((state / "quarantine.json").read_text())


def nodes_in_file(state: Path) -> list[str]:
    return [item["node"] for item in document(state)["nodes"]]


# ---- the file ----------------------------------------------------------------------------------


def test_the_file_is_versioned_and_holds_node_reason_job_since_expiry_and_user(tmp_path: Path):
    state = tmp_path / "state"
    written = quarantine.add(
        str(state), ["node3"], "fitness: docker engine hung", "1234", 24, now=T0, who="bob"
    )
    assert written == [Entry("node3", "fitness: docker engine hung", "1234", T0, T0 + 24 * HOUR, "bob")]
    assert document(state) == {
        "version": 1,
        "nodes": [{"node": "node3", "reason": "fitness: docker engine hung", "job": "1234",
                   "since": "2026-11-30T10:00:00Z", "since_epoch": T0,
                   "expires": "2026-12-01T10:00:00Z", "expires_epoch": T0 + 24 * HOUR, "who": "bob"}],
    }  # fmt: skip
    # the module's docstring documents this very shape
    assert '"since": "2026-11-30T10:00:00Z", "since_epoch": 1796032800.0' in quarantine.__doc__


def test_added_nodes_are_listed_sorted_and_removed_one_by_one_or_all(tmp_path: Path):
    state = str(tmp_path)
    quarantine.add(state, ["node10", "node2"], "disk full", "7", 1, now=T0)
    quarantine.add(state, ["node1"], "gpu held", "8", 1, now=T0)
    assert [e.node for e in quarantine.active(state, now=T0)] == ["node1", "node2", "node10"]
    assert quarantine.remove(state, ["node2", "node99"], now=T0) == ["node2"]
    assert [e.node for e in quarantine.active(state, now=T0)] == ["node1", "node10"]
    assert nodes_in_file(tmp_path) == ["node1", "node10"]
    assert quarantine.remove(state, all_nodes=True, now=T0) == ["node1", "node10"]
    assert document(tmp_path) == {"version": 1, "nodes": []}
    assert quarantine.active(state, now=T0) == []


def test_a_missing_file_or_state_dir_is_an_empty_quarantine_and_reading_creates_nothing(tmp_path: Path):
    state = tmp_path / "not-yet"
    assert quarantine.active(str(state)) == []
    assert quarantine.in_allocation(str(state), ["node1"]) == []
    assert quarantine.remove(str(state), ["node1"]) == []
    done = batch_step("check", "--state-dir", str(state), "--nodes", "node1 node2")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert not state.exists()


def test_expired_entries_are_never_active_and_the_next_write_drops_them(tmp_path: Path):
    state = str(tmp_path)
    quarantine.add(state, ["node1"], "slow link", "1", 1, now=T0)
    assert [e.node for e in quarantine.active(state, now=T0 + HOUR - 1)] == ["node1"]
    assert quarantine.active(state, now=T0 + HOUR) == []
    assert quarantine.in_allocation(state, ["node1"], now=T0 + HOUR) == []
    assert nodes_in_file(tmp_path) == ["node1"]  # reading changes nothing
    quarantine.add(state, ["node2"], "disk full", "2", 1, now=T0 + HOUR)
    assert nodes_in_file(tmp_path) == ["node2"]
    quarantine.add(state, ["node3"], "x", "3", 1, now=T0 + HOUR)
    assert quarantine.remove(state, ["node9"], now=T0 + 3 * HOUR) == []
    assert nodes_in_file(tmp_path) == []  # a remove is a write too


def test_the_batch_step_and_list_never_report_an_expired_entry_as_active(tmp_path: Path):
    import time

    quarantine.add(str(tmp_path), ["node2"], "new", "2", 1)
    quarantine.add(str(tmp_path), ["node1"], "old", "1", 1, now=time.time() - 2 * HOUR)  # expired an hour ago
    assert nodes_in_file(tmp_path) == ["node1", "node2"]
    done = batch_step("check", "--state-dir", str(tmp_path), "--nodes", "node1 node2")
    assert (done.returncode, [line.split("\t")[0] for line in done.stdout.splitlines()]) == (0, ["node2"])
    listed = person("list", "--state-dir", str(tmp_path))
    assert listed.returncode == 0 and "node2" in listed.stdout and "node1" not in listed.stdout
    everything = person("list", "--all", "--state-dir", str(tmp_path))
    row = next(line for line in everything.stdout.splitlines() if line.startswith("node1"))
    assert "expired 1h" in row and "old" in row
    as_json = json.loads(person("list", "--all", "--json", "--state-dir", str(tmp_path)).stdout)
    assert [(n["node"], n["active"]) for n in as_json["nodes"]] == [("node1", False), ("node2", True)]


def test_adding_a_quarantined_node_again_refreshes_it_and_never_duplicates_it(tmp_path: Path):
    state = str(tmp_path)
    quarantine.add(state, ["node1"], "docker hung", "100", 1, now=T0, who="alice")
    refreshed = quarantine.add(state, ["node1", "node1"], "disk full", "101", 2, now=T0 + 600, who="bob")
    expected = Entry("node1", "disk full", "101", T0, T0 + 600 + 2 * HOUR, "bob")  # earliest since
    assert refreshed == [expected]
    assert quarantine.active(state, now=T0 + 600) == [expected]
    assert nodes_in_file(tmp_path) == ["node1"]
    # a short add never shortens a longer quarantine (remove, then add, to shorten)
    again = quarantine.add(state, ["node1"], "gpu held", "102", 0.1, now=T0 + 700, who="carol")
    assert again == [Entry("node1", "gpu held", "102", T0, T0 + 600 + 2 * HOUR, "carol")]
    # once expired, the node starts a new quarantine
    fresh = quarantine.add(state, ["node1"], "again", "103", 1, now=T0 + 5 * HOUR)
    assert (fresh[0].since, fresh[0].expires) == (T0 + 5 * HOUR, T0 + 6 * HOUR)


def test_a_hand_edited_file_naming_a_node_twice_reads_as_one_entry(tmp_path: Path):
    first = {"node": "node1", "reason": "a", "job": "1", "since_epoch": T0, "expires_epoch": T0 + HOUR}
    second = dict(first, reason="b", job="2", since_epoch=T0 + 9, expires_epoch=T0 + 2 * HOUR)
    items = [first, second]
    (tmp_path / "quarantine.json").write_text(json.dumps({"version": 1, "nodes": items}))
    assert quarantine.active(str(tmp_path), now=T0) == [Entry("node1", "b", "2", T0, T0 + 2 * HOUR, "")]


def test_the_state_dir_is_created_with_the_users_umask_private_unless_it_shares_it(tmp_path: Path):
    # It was 2775 whatever the umask (lock 0664): any member of the group could replace the file with
    # a FIFO, forge entries or hold the lock. Now the user's umask decides, and the lock of a private
    # dir is the user's alone.
    for umask, modes in (
        (0o077, (0o700, 0o600, 0o600)),
        (0o022, (0o755, 0o644, 0o600)),
        (0o002, (0o775, 0o664, 0o660)),  # a umask that shares with the group: the group writes too
    ):
        state = tmp_path / f"umask-{umask:03o}" / "sm-state"
        old = os.umask(umask)
        try:
            quarantine.add(str(state), ["node1"], "x", "1", 1)
        finally:
            os.umask(old)
        made = tuple(
            stat.S_IMODE((state / name).stat().st_mode) for name in ("", "quarantine.json", "quarantine.lock")
        )
        assert made == modes, umask
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    quarantine.add(str(private), ["node1"], "x", "1", 1)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700  # a dir that exists is left as it is


def test_a_write_goes_through_a_synced_temp_file_renamed_over_the_old_one(tmp_path: Path, monkeypatch):
    state = str(tmp_path)
    quarantine.add(state, ["node1"], "x", "1", 1, now=T0)
    before = (tmp_path / "quarantine.json").read_bytes()
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])

    def failing_replace(source: str, target: str) -> None:
        calls.append(f"replace {Path(source).parent == tmp_path} {Path(target).name}")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(quarantine.QuarantineError, match="cannot write .*quarantine.json: No space left"):
        quarantine.add(state, ["node2"], "y", "2", 1, now=T0)
    assert calls == ["fsync", "replace True quarantine.json"]  # synced before it is renamed into place
    assert (tmp_path / "quarantine.json").read_bytes() == before  # a failed write changes nothing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quarantine.json", "quarantine.lock"]  # no temp
    monkeypatch.setattr(os, "replace", real_replace)
    quarantine.add(state, ["node2"], "y", "2", 1, now=T0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quarantine.json", "quarantine.lock"]


# ---- several writers, one lock -----------------------------------------------------------------

ADDER = """
import sys
from slurm_multi import quarantine
worker, state_dir = sys.argv[1], sys.argv[2]
sys.stdin.readline()  # every worker is up before any of them writes
for k in range(12):
    quarantine.add(state_dir, [f"w{worker}-{k}"], "by " + worker, worker)
"""


def test_writers_adding_at_once_from_many_processes_lose_nothing(tmp_path: Path):
    state = tmp_path / "state"
    workers = [
        subprocess.Popen([sys.executable, "-c", ADDER, str(i), str(state)], stdin=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env(), text=True)
        for i in range(8)
    ]  # fmt: skip
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    results = [worker.communicate(timeout=120) for worker in workers]
    assert [w.returncode for w in workers] == [0] * 8, results
    expected = {f"w{i}-{k}" for i in range(8) for k in range(12)}
    assert set(nodes_in_file(state)) == expected and len(nodes_in_file(state)) == 96
    assert {e.node for e in quarantine.active(str(state))} == expected


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o664)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_a_writer_gives_up_with_one_line_naming_the_lock_when_another_process_holds_it(tmp_path: Path):
    lock = tmp_path / "quarantine.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        line = one_line_error(
            batch_step(
                "add", "--state-dir", str(tmp_path), "--reason", "x", "--lock-timeout", "0.2", "node1"
            ),
            1,
        )
        assert f"the lock {lock} stayed held for 0.2 s" in line and "nothing was changed" in line
        line = one_line_error(
            person("remove", "--all", "--state-dir", str(tmp_path), "--lock-timeout", "0"), 1
        )
        assert str(lock) in line
        with pytest.raises(LockTimeout):
            quarantine.add(str(tmp_path), ["node1"], "x", "1", 1, lock_timeout=0)
        assert not (tmp_path / "quarantine.json").exists()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    done = batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "--lock-timeout", "0.2", "node1")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert nodes_in_file(tmp_path) == ["node1"]
    assert quarantine.LOCK_TIMEOUT_S == 10
    assert re.search(r"--lock-timeout SECONDS .*\s+\[default: 10\]", person("add", "--help").stdout)


# ---- a file that cannot be read ----------------------------------------------------------------

BROKEN = {
    "not JSON": b'{"version": 1, "nodes": [',
    "not UTF-8": b"\xff\xfe{}",
    "not an object": b"[]",
    "a newer version": b'{"version": 2, "nodes": []}',
    "no version": b'{"nodes": []}',
    "nodes not a list": b'{"version": 1, "nodes": {}}',
    "a bad node name": b'{"version": 1, "nodes": [{"node": "a,b", "since_epoch": 1, "expires_epoch": 2}]}',
    "a time that is not a number":
        b'{"version": 1, "nodes": [{"node": "n1", "since_epoch": "x", "expires_epoch": 2}]}',
    "a reason that is not text":
        b'{"version": 1, "nodes": [{"node": "n1", "reason": 5, "since_epoch": 1, "expires_epoch": 2}]}',
}  # fmt: skip


@pytest.mark.parametrize("content", list(BROKEN.values()), ids=list(BROKEN))
def test_a_file_that_cannot_be_read_is_never_overwritten_and_remove_all_sets_it_aside(
    tmp_path: Path, content: bytes
):
    path = tmp_path / "quarantine.json"
    path.write_bytes(content)
    for done in (
        batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "node1"),
        batch_step("check", "--state-dir", str(tmp_path), "--nodes", "node1"),
        person("list", "--state-dir", str(tmp_path)),
        person("add", "node1", "--reason", "x", "--state-dir", str(tmp_path)),
        person("remove", "node1", "--state-dir", str(tmp_path)),
    ):
        line = one_line_error(done, 1)
        assert f"{path} is not a quarantine" in line and "nothing was changed" in line
        assert f"slurm-multi quarantine remove --all --state-dir {tmp_path}" in line
        assert path.read_bytes() == content
    with pytest.raises(BrokenFile):
        quarantine.active(str(tmp_path))

    done = person("remove", "--all", "--state-dir", str(tmp_path))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("quarantine.json.broken-")]
    assert len(kept) == 1 and kept[0].read_bytes() == content
    assert f"kept as {kept[0]}" in done.stderr
    assert document(tmp_path) == {"version": 1, "nodes": []}
    assert batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "node1").returncode == 0
    assert nodes_in_file(tmp_path) == ["node1"]


def test_a_file_that_cannot_be_opened_is_one_line(tmp_path: Path):
    (tmp_path / "quarantine.json").mkdir()
    line = one_line_error(batch_step("check", "--state-dir", str(tmp_path), "--nodes", "node1"), 1)
    assert f"cannot read {tmp_path / 'quarantine.json'}" in line
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    line = one_line_error(batch_step("add", "--state-dir", str(not_a_dir), "--reason", "x", "node1"), 1)
    assert str(not_a_dir) in line and "not a directory" in line


@pytest.mark.parametrize("remove", [("node3",), ("--all",)])
def test_remove_refuses_a_state_dir_that_is_a_file_or_a_dangling_link_as_add_and_list_do(
    tmp_path: Path, remove: tuple[str, ...]
):
    # remove took any non-directory for "no state dir" and said "not quarantined: node3", exit 0.
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    line = one_line_error(person("remove", *remove, "--state-dir", str(not_a_dir)), 1)
    assert f"--state-dir {not_a_dir} exists and is not a directory" in line
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    for argv in (("list",), ("remove", *remove)):
        line = one_line_error(person(*argv, "--state-dir", str(dangling)), 1)
        assert f"cannot read the state dir {dangling}" in line
    assert not (tmp_path / "nowhere").exists() and not_a_dir.read_text() == ""


# ---- what is refused ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["node,2", "node 2", "node[1-3]", "nöde", "a/b", ".node", "x" * 256])
def test_a_node_name_that_is_not_a_slurm_host_name_is_refused(tmp_path: Path, name: str):
    line = one_line_error(batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "--", name), 2)
    assert f"NODE {name!r} is not a node name" in line
    line = one_line_error(person("add", "--reason", "x", "--state-dir", str(tmp_path), "--", name), 2)
    assert f"NODE {name!r} is not a node name" in line
    assert not tmp_path.joinpath("quarantine.json").exists()
    with pytest.raises(QuarantineUsageError):
        quarantine.in_allocation(str(tmp_path), [name])


def test_the_batch_step_gets_one_line_for_a_bad_allocation_list(tmp_path: Path):
    line = one_line_error(batch_step("check", "--state-dir", str(tmp_path), "--nodes", "node1,node2"), 2)
    assert "--nodes 'node1,node2' is not a node name" in line
    line = one_line_error(batch_step("check", "--state-dir", str(tmp_path), "--nodes", "node[1-2]"), 2)
    assert "scontrol show hostnames" in line
    line = one_line_error(batch_step("check", "--state-dir", str(tmp_path), "--nodes", " "), 2)
    assert "no --nodes given" in line  # an empty list is a look-up that failed, not "none quarantined"
    assert "Missing option '--nodes'" in one_line_error(batch_step("check", "--state-dir", str(tmp_path)), 2)


def test_the_store_wants_at_least_one_node(tmp_path: Path):
    with pytest.raises(QuarantineUsageError, match="no NODE given; name at least one node"):
        quarantine.add(str(tmp_path), [], "x", "1")
    with pytest.raises(QuarantineUsageError, match="no NODE given"):
        quarantine.remove(str(tmp_path), [])
    assert not tmp_path.joinpath("quarantine.json").exists()


def test_good_host_names_pass(tmp_path: Path):
    names = ["node1", "gpu-a100-07", "rack2.node_3", "N9"]
    quarantine.add(str(tmp_path), names, "x", "1", 1)
    assert sorted(nodes_in_file(tmp_path)) == sorted(names)


@pytest.mark.parametrize("hours", ["0", "-1", "abc", "nan", "inf", "", "1e9"])
def test_hours_must_be_a_positive_number(tmp_path: Path, hours: str):
    line = one_line_error(
        batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "--hours", hours, "n1"), 2
    )
    assert f"--hours {hours!r}: expected a positive number of hours" in line
    line = one_line_error(
        person("add", "n1", "--reason", "x", "--hours", hours, "--state-dir", str(tmp_path)), 2
    )
    assert f"--hours {hours!r}" in line
    assert not tmp_path.joinpath("quarantine.json").exists()


def test_fractions_of_an_hour_are_allowed(tmp_path: Path):
    assert (
        batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "--hours", "0.5", "n1").returncode
        == 0
    )
    item = document(tmp_path)["nodes"][0]
    assert item["expires_epoch"] - item["since_epoch"] == pytest.approx(1800, abs=0.01)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["add", "--reason", "x", "n1"], "pass --state-dir DIR or set SM_STATE_DIR"),
        (["add", "--state-dir", "D", "n1"], "Missing option '--reason'"),
        (["add", "--state-dir", "D", "--reason", " \n ", "n1"], "--reason is empty"),
        (["add", "--state-dir", "D", "--reason", "x"], "Missing argument 'NODE...'"),
        (["add", "--state-dir", "D", "--reason", "x", "--job", "12 34", "n1"], "--job '12 34' is not a job"),
        (["add", "--state-dir", "D", "--reason", "x", "--lock-timeout", "-1", "n1"], "'-1': expected"),
        (["remove", "--state-dir", "D", "--lock-timeout", "inf", "n1"], "'inf': expected"),
        (["add", "--state-dir", "D", "--reason", "x", "--color", "n1"], "No such option '--color'"),
        (["check", "--state-dir", "D", "--nodes", "n1", "n2"], "unexpected extra argument (n2)"),
        (["lst"], "No such command 'lst'"),
        ([], "Usage: slurm-multi quarantine [OPTIONS] COMMAND"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], says: str):
    args = [str(tmp_path / "state") if word == "D" else word for word in args]
    assert says in one_line_error(batch_step(*args), 2)
    assert not (tmp_path / "state").exists()


def test_an_option_without_its_value_is_one_line_exit_2(tmp_path: Path):
    # click raises this one without its context: cli.main cannot name the command in the line
    done = batch_step("add", "--state-dir", str(tmp_path), "--reason")
    assert "Option '--reason' requires an argument" in one_line_error(done, 2, "slurm-multi: ")
    assert not (tmp_path / "quarantine.json").exists()


def test_the_state_dir_comes_from_the_flag_or_sm_state_dir(tmp_path: Path):
    line = one_line_error(person("list"), 2)
    assert "pass --state-dir DIR or set SM_STATE_DIR" in line
    done = batch_step("add", "--reason", "x", "n1", SM_STATE_DIR=str(tmp_path / "env"))
    assert done.returncode == 0 and nodes_in_file(tmp_path / "env") == ["n1"]
    assert person("list", SM_STATE_DIR=str(tmp_path / "env")).stdout.splitlines()[1].startswith("n1 ")
    done = batch_step(
        "add", "--state-dir", str(tmp_path / "flag"), "--reason", "x", "n2", SM_STATE_DIR="/nonexistent"
    )
    assert done.returncode == 0 and nodes_in_file(tmp_path / "flag") == ["n2"]


# ---- the batch step's commands -----------------------------------------------------------------


def test_check_prints_one_line_per_quarantined_node_of_the_allocation(tmp_path: Path):
    state = str(tmp_path)
    assert batch_step("add", "--state-dir", state, "--reason", "disk full", "--job", "1234", "node1", "node3",
                      "node9").stdout == ""  # fmt: skip
    expires = quarantine.active(state)[0].expires_iso
    done = batch_step("check", "--state-dir", state, "--nodes", "node3\nnode1 node2")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"node3\tdisk full\t1234\t{expires}\nnode1\tdisk full\t1234\t{expires}\n"
    none = batch_step("check", "--state-dir", state, "--nodes", "node2 node4")
    assert (none.returncode, none.stdout, none.stderr) == (0, "", "")


def test_a_reason_stays_one_line_and_one_field(tmp_path: Path):
    reason = "fitness:\tdocker\nengine   hung\r\n"
    assert batch_step("add", "--state-dir", str(tmp_path), "--reason", reason, "node1").returncode == 0
    done = batch_step("check", "--state-dir", str(tmp_path), "--nodes", "node1")
    assert done.stdout.count("\n") == 1
    assert done.stdout.split("\t")[:3] == ["node1", "fitness: docker engine hung", "manual"]


def test_what_add_returns_is_what_is_read_back(tmp_path: Path):
    written = quarantine.add(str(tmp_path), ["n1"], "x", "1", 1 / 7)
    assert quarantine.active(str(tmp_path)) == written


def test_add_records_the_slurm_job_and_the_user(tmp_path: Path):
    batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "n1", SLURM_JOB_ID="5678")
    batch_step(
        "add", "--state-dir", str(tmp_path), "--reason", "x", "--job", "99_1", "n2", SLURM_JOB_ID="5678"
    )
    batch_step("add", "--state-dir", str(tmp_path), "--reason", "x", "n3")
    items = {item["node"]: item for item in document(tmp_path)["nodes"]}
    # who: the user the writer runs as (env() sets USER=alice: a variable anybody sets as they like)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert [(items[n]["job"], items[n]["who"]) for n in ("n1", "n2", "n3")] == [
        ("5678", me), ("99_1", me), ("manual", me)
    ]  # fmt: skip
    assert items["n3"]["expires_epoch"] - items["n3"]["since_epoch"] == pytest.approx(24 * HOUR, abs=0.01)


def test_the_store_the_plan_reads_in_its_own_process_needs_no_command_line(tmp_path: Path):
    """The job plan calls in_allocation (no subprocess): the store is functions, the commands are
    slurm_multi.quarantine_cli, and the store does not import them (nor click)."""
    code = (
        "import sys\nfrom slurm_multi import quarantine\n"
        f"assert quarantine.in_allocation({str(tmp_path)!r}, ['n1']) == []\n"
        "sys.exit('click' in sys.modules or 'slurm_multi.quarantine_cli' in sys.modules)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], env=env(), check=False).returncode == 0


def test_the_batch_step_adds_quietly_and_people_are_told_what_was_added(tmp_path: Path):
    quiet = batch_step("add", "--state-dir", str(tmp_path), "--reason", "disk full", "--job", "7", "n1")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    told = person("add", "n2", "--reason", "disk full", "--state-dir", str(tmp_path))
    assert (told.returncode, told.stdout) == (0, "")
    assert re.search(r" quarantine: n2 quarantined until \S+Z: disk full$", told.stderr.strip())
    assert nodes_in_file(tmp_path) == ["n1", "n2"]


# ---- the people's CLI --------------------------------------------------------------------------


def test_slurm_multi_lists_the_quarantine_command():
    done = subprocess.run([sys.executable, "-m", "slurm_multi", "--help"], capture_output=True, text=True,
                          env=env(), check=False)  # fmt: skip
    assert re.search(
        r"^  quarantine +Show and edit the shared list of nodes later jobs avoid\.$", done.stdout, re.M
    )


def test_people_add_list_and_remove_nodes(tmp_path: Path):
    state = str(tmp_path / "state")
    added = person("add", "node2", "node1", "--reason", "bad NIC", "--hours", "2", "--state-dir", state)
    assert (added.returncode, added.stdout) == (0, "")
    assert "node2 node1 quarantined until" in added.stderr and "bad NIC" in added.stderr
    person("add", "node3", "--reason", "stale GPU process", "--state-dir", state, SLURM_JOB_ID="4242")
    listed = person("list", "--state-dir", state)
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["NODE", "JOB", "WHO", "SINCE", "EXPIRES", "IN", "REASON"]
    me = pwd.getpwuid(os.getuid()).pw_name  # who wrote each entry
    assert [(r[0], r[1], r[2], r[-2:]) for r in rows[1:]] == [
        ("node1", "manual", me, ["bad", "NIC"]), ("node2", "manual", me, ["bad", "NIC"]),
        ("node3", "4242", me, ["GPU", "process"]),
    ]  # fmt: skip
    assert rows[1][4] in ("1h59m", "2h00m") and rows[3][4] in ("23h59m", "24h00m")
    as_json = json.loads(person("list", "--json", "--state-dir", state).stdout)
    assert as_json["version"] == 1 and [n["node"] for n in as_json["nodes"]] == ["node1", "node2", "node3"]
    assert as_json["nodes"][2]["reason"] == "stale GPU process" and as_json["nodes"][2]["active"] is True

    removed = person("remove", "node2", "node7", "--state-dir", state)
    assert removed.returncode == 0 and "removed node2" in removed.stderr
    assert "not quarantined: node7" in removed.stderr
    assert nodes_in_file(tmp_path / "state") == ["node1", "node3"]
    everything = person("remove", "--all", "--state-dir", state)
    assert everything.returncode == 0 and "removed node1 node3" in everything.stderr
    assert person("list", "--state-dir", state).stdout == ""
    assert json.loads(person("list", "--json", "--state-dir", state).stdout) == {"version": 1, "nodes": []}


@pytest.mark.parametrize("command", ["check", "list", "add", "remove"])
def test_every_command_explains_itself_with_an_example(command: str):
    done = person(command, "--help")
    assert done.returncode == 0 and f"Example: slurm-multi quarantine {command} " in done.stdout


def test_remove_wants_nodes_or_all_but_not_both(tmp_path: Path):
    assert "give NODE... or --all" in one_line_error(person("remove", "--state-dir", str(tmp_path)), 2)
    assert "give NODE... or --all" in one_line_error(
        person("remove", "n1", "--all", "--state-dir", str(tmp_path)), 2
    )
    with pytest.raises(QuarantineUsageError):
        quarantine.remove(str(tmp_path), ["n1"], all_nodes=True)
