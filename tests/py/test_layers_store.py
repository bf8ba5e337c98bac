"""The layered cache (slurm_multi.layers.store, .prune), rank 0's layer plan (.plan) and the commands
that use them (`slurm-multi layers …`, `relay send --layer-plan`). The source tar is the real
`docker save` of tests/py/data/layers (test_layers.py says what it holds)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import test_layers as fixture
from slurm_multi.common import HelperError
from slurm_multi.layers import chain, plan, store, tarstream
from slurm_multi.layers.prune import prune

REPO = Path(__file__).resolve().parents[2]
CLASSIC, DIFFS, IMAGE_ID = fixture.CLASSIC, fixture.DIFFS, fixture.FACTS["image_id"]
OTHER = [*DIFFS[:3], "sha256:" + "e" * 64]  # a rebuild: its top layer changed


def put(
    cache: Path, key: str = "img-00000000", source: Path = CLASSIC, diffs: list[str] = DIFFS
) -> store.Writer:
    fd = os.open(source, os.O_RDONLY)
    try:
        return store.put(
            str(cache), str(cache / f"{key}.layers"), IMAGE_ID, diffs, tarstream.Scanner(fd, diffs).pieces()
        )
    finally:
        os.close(fd)


def tar_from(cache: Path, held: int, key: str = "img-00000000") -> tuple[bytes, dict[str, int]]:
    out = cache.parent / f"loaded{held}.tar"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        counts = store.write_tar(str(cache), store.read_index(str(cache / f"{key}.layers")), held, fd)
    finally:
        os.close(fd)
    return out.read_bytes(), counts


# --------------------------------------------------------------------------------------------------
# The layered cache


def test_a_stored_image_is_each_blob_once_plus_an_index_and_comes_back_byte_for_byte(tmp_path):
    cache = tmp_path / "cache"
    writer = put(cache)
    assert not writer.failed
    blobs = sorted(os.listdir(store.blob_dir(str(cache))))
    assert blobs == sorted({d[7:] for d in DIFFS})  # the repeated layer once
    for name in blobs:  # content-addressed
        assert chain.DIFF_ID.fullmatch("sha256:" + name)
        assert fixture.hashlib.sha256((cache / "blobs" / "sha256" / name).read_bytes()).hexdigest() == name
    index = json.loads((cache / "img-00000000.layers").read_text())
    blob_bytes = sum(m["size"] for m in index["members"] if "blob" in m)
    assert blob_bytes == sum(os.path.getsize(p) for p in (cache / "blobs" / "sha256").iterdir())
    assert not any(len(m.get("raw", "")) > 4 * 4096 for m in index["members"])  # no layer's bytes in it
    assert "layers=4" in (cache / "img-00000000.layers.facts").read_text()
    data, counts = tar_from(cache, 0)
    assert data == CLASSIC.read_bytes() and counts["read_layers"] == 3


@pytest.mark.parametrize("held", [1, 2, 3, 4])
def test_a_reader_reads_only_the_blobs_it_lacks(held, tmp_path):
    cache = tmp_path / "cache"
    put(cache)
    data, counts = tar_from(cache, held)
    want, _ = fixture.filtered(CLASSIC, DIFFS, held, tmp_path)
    assert data == want  # the same tar the relay's filter gives that node
    needed = {d for d in DIFFS[held:]}
    assert counts["read_layers"] == len(needed) and counts["held_layers"] + counts["read_layers"] == 3


def test_a_second_image_sharing_layers_adds_only_its_new_blob(tmp_path):
    cache = tmp_path / "cache"
    put(cache)
    before = set(os.listdir(store.blob_dir(str(cache))))
    second = put(cache, key="other-11111111")  # the same blobs under another key: nothing new
    assert second.new == {} and sum(second.kept.values()) == second.blob_bytes
    assert set(os.listdir(store.blob_dir(str(cache)))) == before


def test_a_blob_that_does_not_hash_to_its_layer_is_never_stored(tmp_path):
    import tarfile

    data = bytearray(CLASSIC.read_bytes())
    with tarfile.open(CLASSIC) as tar:
        layer = next(m for m in tar.getmembers() if m.name.endswith("/layer.tar") and m.size > 4096)
    data[layer.offset_data + 100] ^= 0xFF  # the biggest layer's bytes, changed after docker saved them
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    writer = put(cache, source=bad)
    assert "does not hash to its layer's diff ID" in writer.failed
    assert not (cache / "img-00000000.layers").exists()
    assert not [n for n in os.listdir(store.blob_dir(str(cache))) if n.startswith(".")]


def test_a_write_that_fails_leaves_no_index_and_no_temp_blob(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    real_write = os.write
    calls = {"n": 0}

    def failing(fd, data):
        if "/blobs/sha256/." in os.readlink(f"/proc/self/fd/{fd}"):
            calls["n"] += 1
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(store.os, "write", failing)
    writer = put(cache)
    assert calls["n"] and "No space left on device" in writer.failed
    assert not (cache / "img-00000000.layers").exists()
    assert not [n for n in os.listdir(store.blob_dir(str(cache))) if n.startswith(".")]


def test_a_missing_blob_is_a_damaged_entry_not_a_short_tar(tmp_path):
    cache = tmp_path / "cache"
    put(cache)
    os.unlink(store.blob_path(str(cache), DIFFS[0]))
    with pytest.raises(HelperError, match="damaged"):
        tar_from(cache, 0)
    assert tar_from(cache, 1)[0]  # a node that holds that layer does not need it


def test_an_index_that_is_not_one_is_refused(tmp_path):
    (tmp_path / "x.layers").write_text('{"format": "something else"}')
    with pytest.raises(HelperError, match="not a layer index"):
        store.read_index(str(tmp_path / "x.layers"))


# --------------------------------------------------------------------------------------------------
# Pruning


def entry(cache: Path, key: str, age_days: float, now: float) -> None:
    path = cache / f"{key}.layers"
    os.utime(path, (now - age_days * 86400, now - age_days * 86400))


def test_pruning_by_age_removes_old_entries_and_then_the_blobs_no_index_names(tmp_path):
    cache = tmp_path / "cache"
    put(cache, key="old-00000000")
    (cache / "old-00000000.layers.id").write_text("id=x\n")
    put(cache, key="new-11111111", diffs=DIFFS[:2])  # names only the first two blobs
    (cache / "tar-22222222.tar").write_bytes(b"x" * 10)
    (cache / "tar-22222222.id").write_text("id=y\n")
    now = time.time()
    entry(cache, "old-00000000", 30, now)
    os.utime(cache / "tar-22222222.tar", (now - 40 * 86400, now - 40 * 86400))
    (Path(store.blob_dir(str(cache))) / ".deadbeef.tmp.1.2").write_bytes(b"left by a killed writer")
    lines: list[str] = []
    gone = prune(str(cache), 14 * 86400, None, False, lines.append, now=now)
    assert not (cache / "old-00000000.layers").exists() and not (cache / "old-00000000.layers.id").exists()
    assert not (cache / "tar-22222222.tar").exists() and not (cache / "tar-22222222.id").exists()
    left = set(os.listdir(store.blob_dir(str(cache))))
    assert left == {d[7:] for d in DIFFS[:2]}  # still named by new's index; the temp file went too
    assert gone["entries"] == 2 and gone["blobs"] == 2


def test_pruning_by_size_removes_the_oldest_first_and_keeps_an_entry_in_use(tmp_path):
    import fcntl

    cache = tmp_path / "cache"
    put(cache, key="a-00000000")
    put(cache, key="b-11111111", diffs=DIFFS[:1])
    now = time.time()
    entry(cache, "a-00000000", 3, now)
    entry(cache, "b-11111111", 1, now)
    busy = os.open(cache / ".a-00000000.lock", os.O_WRONLY | os.O_CREAT)
    fcntl.flock(busy, fcntl.LOCK_SH)  # a job reads it now
    try:
        lines: list[str] = []
        prune(str(cache), None, 1, False, lines.append, now=now)
    finally:
        os.close(busy)
    assert (cache / "a-00000000.layers").exists() and not (cache / "b-11111111.layers").exists()
    assert any("kept a-00000000: in use" in line for line in lines)
    assert set(os.listdir(store.blob_dir(str(cache)))) == {d[7:] for d in DIFFS}  # a's blobs stay


def test_a_dry_run_removes_nothing(tmp_path):
    cache = tmp_path / "cache"
    put(cache)
    entry(cache, "img-00000000", 30, time.time())
    files = lambda: sorted(p.name for p in cache.rglob("*") if not p.name.endswith(".lock"))  # noqa: E731
    before = files()
    gone = prune(str(cache), 86400, None, True, lambda _line: None)
    assert gone["entries"] == 1 and gone["blobs"] == 3 and files() == before


# --------------------------------------------------------------------------------------------------
# Rank 0's plan


def test_a_worker_holds_what_its_claim_and_rank_0s_rebuild_share():
    claim = chain.claim_text(DIFFS, 4)  # it holds the plan's (earlier) image whole
    assert plan.worker_prefix("", claim, "sha256:new", OTHER, DIFFS, {}) == 3
    assert plan.worker_prefix("", chain.claim_text(DIFFS, 1), "sha256:new", OTHER, DIFFS, {}) == 1
    assert plan.worker_prefix("sha256:new", "", "sha256:new", OTHER, DIFFS, {}) == 4  # rank 0's own ID
    assert (
        plan.worker_prefix("", "layers:2:" + "0" * 12, "sha256:new", OTHER, DIFFS, {}) == 0
    )  # another chain
    held = "sha256:" + "7" * 64  # an image rank 0's engine has too (the tag's earlier build)
    assert plan.worker_prefix(held, "", "sha256:new", OTHER, [], {held: DIFFS}) == 3


def test_the_holds_file_counts_each_workers_last_word():
    lines = [f"1 - - {chain.claim_text(DIFFS, 1)}\n", "2 sha256:" + "a" * 64 + " -\n",
             f"1 - cache:0123456789abcdef {chain.claim_text(DIFFS, 2)}\n",
             "9 - - -\n", "garbage\n"]  # fmt: skip
    said = plan.read_holds(lines, 3)
    assert said == {1: ("", chain.claim_text(DIFFS, 2)), 2: ("sha256:" + "a" * 64, "")}


def test_a_plan_written_is_the_plan_read(tmp_path):
    made = plan.LayerPlan(IMAGE_ID, DIFFS, {1: 3, 2: 0})
    plan.write_plan(str(tmp_path / "p"), made)
    assert plan.read_plan(str(tmp_path / "p")) == made
    (tmp_path / "bad").write_text(json.dumps({**made.to_dict(), "prefixes": {"1": 9}}))
    with pytest.raises(HelperError, match="not a layer plan"):
        plan.read_plan(str(tmp_path / "bad"))


def test_rank_0_plans_from_its_engine_and_the_workers_claims(tmp_path):
    a = "sha256:" + "1" * 64
    env, server = fixture.engine_env(tmp_path, {
        "/info": b'{"DriverStatus":[]}',
        "/images/fixture:1/json": fixture.inspect(IMAGE_ID, OTHER),
        f"/images/{a}/json": fixture.inspect(a, DIFFS[:2] + ["sha256:" + "f" * 64]),
    })  # fmt: skip
    env["JOB_IMAGE_LAYERS"] = " ".join(DIFFS)
    holds = [f"1 - - {chain.claim_text(DIFFS, 4)}\n", f"2 {a} - layers:0\n", f"3 {IMAGE_ID} - -\n"]
    try:
        made = plan.make_plan(env, "fixture:1", IMAGE_ID, 5, holds)
        off = plan.make_plan(env, "fixture:1", IMAGE_ID, 5, holds, off=True)
        stale = plan.make_plan(env, "fixture:1", "sha256:" + "2" * 64, 5, holds)
    finally:
        server.close()
    assert not made.whole and made.diff_ids == OTHER and made.prefixes == {1: 3, 2: 2, 3: 4}
    assert made.prefix(4) == 0 and made.prefix(0) == 4
    assert "rank 1 (n2) 3" in plan.describe(made, 5, ["n1", "n2", "n3", "n4", "n5"])
    assert off.whole == "--image-layers off" and "now" in stale.whole


# --------------------------------------------------------------------------------------------------
# The commands


def sm(args: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO / "py"), **(env or {})}
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(
        [sys.executable, "-m", "slurm_multi", *args], env=full, stderr=subprocess.PIPE, **kwargs
    )


def test_cache_put_then_cache_tar_round_trip_through_the_commands(tmp_path):
    cache = tmp_path / "cache"
    plan.write_plan(str(tmp_path / "plan"), plan.LayerPlan(IMAGE_ID, DIFFS, {}))
    with open(CLASSIC, "rb") as source:
        done = sm(["layers", "cache-put", "--cache", str(cache), "--index", str(cache / "k.layers"),
                   "--plan", str(tmp_path / "plan")], stdin=source)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert b"stored 3 new layer blob(s)" in done.stderr
    out = tmp_path / "out.tar"
    with open(out, "wb") as sink:
        done = sm(["layers", "cache-tar", "--cache", str(cache), "--index", str(cache / "k.layers"),
                   "--image-id", IMAGE_ID, "--held", "3", "--stats-file", str(tmp_path / "stats")],
                  stdout=sink)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert out.read_bytes() == fixture.filtered(CLASSIC, DIFFS, 3, tmp_path)[0]
    assert "read_layers=1" in (tmp_path / "stats").read_text()
    with open(out, "wb") as sink:
        other = sm(["layers", "cache-tar", "--cache", str(cache), "--index", str(cache / "k.layers"),
                    "--image-id", "sha256:" + "0" * 64, "--held", "0"], stdout=sink)  # fmt: skip
    assert other.returncode == 1 and b"holds d40bb36257b4, not 000000000000" in other.stderr


@pytest.mark.parametrize(
    "args, needle",
    [(["prune", "--cache", "."], "--older-than DAYS and/or --max-size"),
     (["prune", "--cache", ".", "--max-size", "lots"], "is not a size"),
     (["held", "--layers-from", "NOPE"], "$NOPE is not a list of diff IDs")],
)  # fmt: skip
def test_bad_layers_command_lines_are_one_line_usage_errors(args, needle):
    done = sm(["layers", *args])
    assert done.returncode == 2 and needle in done.stderr.decode() and b"Traceback" not in done.stderr


def test_relay_send_with_a_layer_plan_moves_only_what_each_worker_lacks_and_fills_the_cache(tmp_path):
    """The production path: three processes on this host's routable address."""
    from slurm_multi.net import choose_bind_address

    try:
        choose_bind_address(socket.gethostname())
    except HelperError as exc:
        pytest.skip(f"no routable address here: {exc}")
    host = socket.gethostname()
    plan.write_plan(str(tmp_path / "plan"), plan.LayerPlan(IMAGE_ID, DIFFS, {1: 1, 2: 3}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "py"), "SM_BARRIER_TOKEN": "t0ken"}
    common = ["--nodes", f"{host},{host},{host}", "--master-port", "29500",
              "--job-id", str(int.from_bytes(os.urandom(3), "big")), "--connect-timeout", "20"]  # fmt: skip
    cmd = [sys.executable, "-m", "slurm_multi", "relay"]
    recvs = []
    for rank in (1, 2):
        with open(tmp_path / f"out{rank}", "wb") as out:
            recvs.append(subprocess.Popen([*cmd, "recv", "--rank", str(rank), *common,
                                           "--stats-file", str(tmp_path / f"stats{rank}")],
                                          env=env, stdout=out, stderr=subprocess.PIPE))  # fmt: skip
    cache = tmp_path / "cache"
    with open(CLASSIC, "rb") as source:
        send = subprocess.run([*cmd, "send", *common, "--layer-plan", str(tmp_path / "plan"), "--cache-dir",
                               str(cache), "--cache-index", str(tmp_path / "index")], env=env, stdin=source,
                              capture_output=True, timeout=60)  # fmt: skip
    errs = [proc.communicate(timeout=30)[1] for proc in recvs]
    assert send.returncode == 0, send.stderr.decode()
    for rank, held, proc, err in zip((1, 2), (1, 3), recvs, errs):
        assert proc.returncode == 0, err.decode()
        assert (tmp_path / f"out{rank}").read_bytes() == fixture.filtered(CLASSIC, DIFFS, held, tmp_path)[0]
    assert b"layers: 2 of 3 layers" in errs[0] and b"1 held" in errs[0]
    assert len((tmp_path / "stats2").read_text().split()) == 8
    assert b"cache: 3 new layer blob(s)" in send.stderr
    assert json.loads((tmp_path / "index").read_text())["image_id"] == IMAGE_ID
    assert sorted(os.listdir(store.blob_dir(str(cache)))) == sorted({d[7:] for d in DIFFS})


def test_layers_plan_prints_layers_or_whole_and_writes_the_plan(tmp_path):
    env, server = fixture.engine_env(tmp_path, {
        "/info": b'{"DriverStatus":[]}',
        "/images/fixture:1/json": fixture.inspect(IMAGE_ID, DIFFS),
    })  # fmt: skip
    (tmp_path / "holds").write_text(f"1 - - {chain.claim_text(DIFFS, 3)}\n2 {IMAGE_ID} -\n")
    args = ["layers", "plan", "--image", "fixture:1", "--image-id", IMAGE_ID, "--nnodes", "3",
            "--holds-file", str(tmp_path / "holds"), "--nodes", "n1,n2,n3",
            "--out", str(tmp_path / "plan")]  # fmt: skip
    try:
        done = sm(args, env={**env, "JOB_IMAGE_LAYERS": " ".join(DIFFS)})
        blind = sm(
            [*args[:-1], str(tmp_path / "blind")], env={**env, "SM_LAYERS_FAULT": "blind:0", "SM_RANK": "0"}
        )
    finally:
        server.close()
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"layers\n" and b"rank 1 (n2) 3, rank 2 (n3) 4" in done.stderr
    assert plan.read_plan(str(tmp_path / "plan")).prefixes == {1: 3, 2: 4}
    assert blind.stdout == b"whole\n" and b"the whole image moves: SM_LAYERS_FAULT" in blind.stderr


def test_relay_send_takes_the_cache_only_with_a_layer_plan(tmp_path):
    done = sm(["relay", "send", "--nodes", "a,b", "--port", "30000", "--cache-dir", str(tmp_path)],
              env={"SM_BARRIER_TOKEN": "t"}, stdin=subprocess.DEVNULL)  # fmt: skip
    assert (
        done.returncode == 2
        and b"--cache-dir and --cache-index go together, with --layer-plan" in done.stderr
    )
