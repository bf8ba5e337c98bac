"""Layer chains and the tar filter (slurm_multi.layers.chain, .tarstream, .engine).

tests/py/data/layers/classic.tar is a real `docker save` by docker 20.10 (the test cluster's engine)
of a four-layer image: an imported base, `COPY a /a`, `COPY b /b`, `COPY a /a` again, so the fourth
layer repeats the second and is a symlink to its `layer.tar` (classic.json: its ID and diff IDs).
The OCI layout docker 25+ saves is built from it here, as docker lays it out."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

import fake_engine
from slurm_multi.layers import chain, engine, tarstream

DATA = Path(__file__).parent / "data" / "layers"
CLASSIC = DATA / "classic.tar"
FACTS = json.loads((DATA / "classic.json").read_text())
DIFFS: list[str] = FACTS["diff_ids"]


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


def filtered(path: Path, diff_ids: list[str], held: int, tmp_path: Path) -> tuple[bytes, dict[str, int]]:
    out = tmp_path / f"out{held}.tar"
    fd, sink = os.open(path, os.O_RDONLY), os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        counts = tarstream.filter_stream(fd, sink, diff_ids, held)
    finally:
        os.close(fd)
        os.close(sink)
    return out.read_bytes(), counts


def oci_layout(tmp_path: Path) -> Path:
    """The same image as docker 25+ saves it: blobs/sha256/<digest> (a layer's digest is its diff ID
    in the classic store), index.json, manifest.json, oci-layout, repositories."""
    with tarfile.open(CLASSIC) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())[0]
        blobs = {}
        for path, diff in zip(manifest["Layers"], DIFFS):
            if not tar.getmember(path).issym():  # a repeated layer's symlink: its first copy is the blob
                blobs[diff[7:]] = tar.extractfile(path).read()
        config = tar.extractfile(manifest["Config"]).read()
    blobs[hashlib.sha256(config).hexdigest()] = config
    out = tmp_path / "oci.tar"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for digest, data in sorted(blobs.items()):
            add(f"blobs/sha256/{digest}", data)
        add("index.json", b'{"schemaVersion":2,"manifests":[]}')
        layers = [f"blobs/sha256/{d[7:]}" for d in DIFFS]
        config_path = f"blobs/sha256/{hashlib.sha256(config).hexdigest()}"
        add(
            "manifest.json",
            json.dumps([{"Config": config_path, "RepoTags": ["f:1"], "Layers": layers}]).encode(),
        )
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    return out


# --------------------------------------------------------------------------------------------------
# The chain


def test_chain_ids_are_the_engines_rule():
    a, b, c = (f"sha256:{ch * 64}" for ch in "abc")
    ab = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert chain.chain_ids([a, b, c]) == [a, ab, "sha256:" + hashlib.sha256(f"{ab} {c}".encode()).hexdigest()]


def test_the_held_prefix_is_the_longest_one_some_image_starts_with():
    a, b, c, d = (f"sha256:{ch * 64}" for ch in "abcd")
    wanted = [a, b, c]
    assert chain.held_prefix(wanted, []) == 0
    assert chain.held_prefix(wanted, [[a]]) == 1  # the base alone
    assert chain.held_prefix(wanted, [[a], [a, b, d]]) == 2  # the earlier build shares two
    assert chain.held_prefix(wanted, [[b, c]]) == 0  # the same layers on another base are not held
    assert chain.held_prefix(wanted, [[a, b, c, d]]) == 3


def test_a_blob_is_labelled_after_its_last_place_in_the_chain():
    a, b = (f"sha256:{ch * 64}" for ch in "ab")
    assert chain.labels([a, b, a]) == {a: 3, b: 2}  # a repeated layer is needed while any copy is


def test_a_claim_names_its_prefix_and_the_chain_id_it_ends_at():
    text = chain.claim_text(DIFFS, 2)
    count, hexes = chain.parse_claim(text)
    assert count == 2 and chain.chain_ids(DIFFS)[1].startswith("sha256:" + hexes)
    assert chain.claim_fits(DIFFS, count, hexes)
    assert chain.claim_text(DIFFS, 0) == "layers:0" and chain.parse_claim("layers:0") == (0, "")
    assert not chain.claim_fits(DIFFS, 2, "0" * 12)  # another chain's
    assert not chain.claim_fits(DIFFS, 5, hexes)  # longer than the chain


@pytest.mark.parametrize(
    "text", ["layers:", "layers:2", "layers:0:abcdefabcdef", "layers:02:abcdefabcdef", "layers:-1",
             "layers:2:ABCDEFABCDEF", "layers:2:abc", "layers:99999:abcdefabcdef", "held:2:abcdefabcdef"],
)  # fmt: skip
def test_a_malformed_claim_is_none(text):
    assert chain.parse_claim(text) is None


def test_each_link_carries_what_the_least_holder_below_it_lacks():
    # chain 0 -> 1 -> 2 -> 3: rank 1 holds only the base, rank 2 the earlier build, rank 3 nothing
    assert chain.thresholds({1: 1, 2: 3, 3: 0}, 1, 4) == {1: 0, 2: 0, 3: 0}
    assert chain.thresholds({1: 0, 2: 3, 3: 4}, 1, 4) == {1: 0, 2: 3, 3: 4}
    # a tree of fanout 2: 1 -> (3, 4), 2 -> (5,)
    assert chain.thresholds({1: 4, 2: 4, 3: 2, 4: 4, 5: 1}, 2, 6) == {1: 2, 2: 1, 3: 2, 4: 4, 5: 1}


# --------------------------------------------------------------------------------------------------
# The tar filter


def test_the_classic_layouts_v1_ids_tell_each_layer_tar_its_layer():
    with tarfile.open(CLASSIC) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())[0]
        chains = chain.chain_ids(DIFFS)
        for position, path in enumerate(manifest["Layers"]):
            v1 = path.split("/")[0]
            document = tar.extractfile(f"{v1}/json").read()
            assert tarstream.v1_position(document, v1, chains) == position
            assert tarstream.v1_position(document, v1, chains[:position]) is None


@pytest.mark.parametrize("layout", ["classic", "oci"])
def test_the_filter_keeps_everything_for_a_receiver_that_holds_nothing(layout, tmp_path):
    source = CLASSIC if layout == "classic" else oci_layout(tmp_path)
    data, counts = filtered(source, DIFFS, 0, tmp_path)
    assert data == source.read_bytes()
    assert counts["left_out_bytes"] == 0 and counts["kept_layers"] == 3  # 4 layers, one blob twice


@pytest.mark.parametrize("layout", ["classic", "oci"])
@pytest.mark.parametrize("held", [1, 2, 3, 4])
def test_the_filter_leaves_out_exactly_the_blobs_of_the_held_prefix(layout, held, tmp_path):
    source = CLASSIC if layout == "classic" else oci_layout(tmp_path)
    whole = members(source.read_bytes())
    data, counts = filtered(source, DIFFS, held, tmp_path)
    kept = members(data)  # still a tar, whole members only
    manifest = json.loads(tarfile.open(source).extractfile("manifest.json").read())[0]
    needed = {d for d in DIFFS[held:]}
    for diff in DIFFS:
        copies = [p for p, d in zip(manifest["Layers"], DIFFS) if d == diff]
        for copy in copies:  # a blob (and each link to it) goes whole or not at all
            assert (copy in kept) == (diff in needed), (copy, held)
    assert set(whole) - set(kept) == {p for p, d in zip(manifest["Layers"], DIFFS) if d not in needed}
    assert counts["kept_bytes"] == len(data) and counts["kept_bytes"] + counts["left_out_bytes"] == len(
        source.read_bytes()
    )
    for name in kept:  # what is kept is byte for byte what docker saved
        if kept[name].isfile():
            with tarfile.open(source) as a, tarfile.open(fileobj=io.BytesIO(data)) as b:
                assert a.extractfile(name).read() == b.extractfile(name).read()


def test_the_second_layers_blob_stays_while_the_fourth_repeats_it(tmp_path):
    data, _ = filtered(CLASSIC, DIFFS, 3, tmp_path)
    kept = members(data)
    links = [m for m in kept.values() if m.issym()]
    assert len(links) == 1 and links[0].linkname.removeprefix("../") in kept


def test_bytes_that_are_not_a_tar_pass_on_unchanged(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a tar at all " * 1000)
    data, counts = filtered(junk, DIFFS, 4, tmp_path)
    assert data == junk.read_bytes() and counts["left_out_bytes"] == 0


def test_a_cut_tar_keeps_what_arrived(tmp_path):
    cut = tmp_path / "cut.tar"
    cut.write_bytes(CLASSIC.read_bytes()[:7000])
    data, _ = filtered(cut, DIFFS, 0, tmp_path)
    assert data == cut.read_bytes()


def test_a_chain_the_tar_does_not_match_leaves_nothing_out(tmp_path):
    other = [f"sha256:{ch * 64}" for ch in "abcd"]
    data, counts = filtered(CLASSIC, other, 4, tmp_path)
    assert data == CLASSIC.read_bytes() and counts["left_out_layers"] == 0


# --------------------------------------------------------------------------------------------------
# The engine


def inspect(image_id: str, layers: list[str]) -> bytes:
    return json.dumps({"Id": image_id, "RootFS": {"Type": "layers", "Layers": layers}}).encode()


def engine_env(tmp_path: Path, answers: dict) -> tuple[dict[str, str], fake_engine.Engine]:
    path, server = fake_engine.engine(tmp_path, answers)
    return {"DOCKER_HOST": f"unix://{path}"}, server


def test_the_engine_holds_the_longest_prefix_one_of_its_images_starts_with(tmp_path):
    a, b = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    env, server = engine_env(tmp_path, {
        "/info": b'{"Driver":"overlay2","DriverStatus":[["Backing Filesystem","extfs"]]}',
        "/images/json?all=1": json.dumps([{"Id": a}, {"Id": b}]).encode(),
        f"/images/{a}/json": inspect(a, DIFFS[:1]),
        f"/images/{b}/json": inspect(b, DIFFS[:3] + ["sha256:" + "9" * 64]),
    })  # fmt: skip
    try:
        assert engine.held(env, DIFFS) == engine.Held(3)
    finally:
        server.close()


def test_a_containerd_image_store_holds_nothing_it_could_use_and_says_why(tmp_path):
    env, server = engine_env(tmp_path, {
        "/info": b'{"Driver":"overlayfs","DriverStatus":[["driver-type","io.containerd.snapshotter.v1"]]}',
    })  # fmt: skip
    try:
        held = engine.held(env, DIFFS)
        mine = engine.image_layers(env, "fixture:1")
    finally:
        server.close()
    assert held.count == 0 and "containerd image store" in held.why
    assert mine.diff_ids == [] and "containerd" in mine.why


def test_an_engine_answer_that_is_not_a_list_of_layers_counts_as_nothing(tmp_path):
    a = "sha256:" + "1" * 64
    env, server = engine_env(tmp_path, {
        "/info": b"{}",
        "/images/json?all=1": json.dumps([{"Id": a}]).encode(),
        f"/images/{a}/json": json.dumps({"Id": a, "RootFS": {"Type": "layers", "Layers": ["x"]}}).encode(),
    })  # fmt: skip
    try:
        held = engine.held(env, DIFFS)
    finally:
        server.close()
    assert held.count == 0 and "not a list of layers" in held.why


def test_no_engine_on_the_socket_holds_nothing(tmp_path):
    held = engine.held({"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}, DIFFS)
    assert held.count == 0 and "/info" in held.why
    assert engine.held({"DOCKER_HOST": "tcp://10.0.0.1:2375"}, DIFFS).count == 0


def test_the_blind_fault_is_one_ranks_and_nothing_else(monkeypatch):
    assert engine.blind({"SM_LAYERS_FAULT": "blind:0,2", "SM_RANK": "2"})
    assert not engine.blind({"SM_LAYERS_FAULT": "blind:0,2", "SM_RANK": "1"})
    assert not engine.blind({"SM_LAYERS_FAULT": "deaf:1", "SM_RANK": "1"})


def test_the_plans_layers_are_believed_only_as_a_list_of_diff_ids():
    assert engine.planned_layers({"JOB_IMAGE_LAYERS": " ".join(DIFFS)}) == DIFFS
    assert engine.planned_layers({"JOB_IMAGE_LAYERS": "sha256:abc"}) == []
    assert engine.planned_layers({}) == []
