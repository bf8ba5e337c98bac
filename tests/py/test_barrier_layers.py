"""A worker's image READY says how many layers of the job plan's chain it holds (slurm_multi.wire,
.barrier, .barrier_cli): signed like the image ID it holds, refused when forged or malformed, and
recorded for rank 0's layer plan. The helpers are tests/py/test_barrier.py's."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import fake_engine
import test_barrier as base
from slurm_multi import barrier_cli, wire
from slurm_multi.barrier import join
from slurm_multi.layers import chain
from slurm_multi.wire import ProtocolError, parse_line

CHAIN = [f"sha256:{ch * 64}" for ch in "1234"]
HELD = "sha256:" + "ab" * 32


def test_an_image_ready_carries_its_layers_claim_under_the_mac() -> None:
    claim = chain.claim_text(CHAIN, 3)
    msg = parse_line(base.from_template(f"READY {{sig}} 2 image {HELD} - {claim}"), base.TOKEN, 4, base.S)
    assert (msg.rank, msg.phase, msg.holds, msg.cache, msg.layers) == (2, "image", HELD, "", claim)
    seen = parse_line(base.from_template(f"READY {{sig}} 2 image - cache:{'f' * 16} layers:0"), base.TOKEN, 4,
                      base.S)  # fmt: skip
    assert (seen.holds, seen.cache, seen.layers) == ("", "f" * 16, "layers:0")
    # The longest image READY (a 9-digit rank, a held ID, the cache's, a claim) fits one line.
    longest = wire.request_line(base.TOKEN, "READY", base.S, base.C, "123456789", "image", HELD,
                                f"cache:{'f' * 16}", "layers:4096:" + "a" * 12)  # fmt: skip
    assert len(longest) <= wire.MAX_LINE


@pytest.mark.parametrize("forged", ["layers:4:", "layers:2:"])
def test_a_forged_claim_is_a_bad_token_as_a_forged_image_id_is(forged) -> None:
    claim = chain.claim_text(CHAIN, 3)
    line = base.from_template(f"READY {{sig}} 2 image - - {claim}").decode()
    tampered = line.replace(claim, forged + claim.split(":")[2])  # another count, the same chain ID
    with pytest.raises(ProtocolError, match="^bad token$"):
        parse_line(tampered.encode(), base.TOKEN, 4, base.S)
    held_forged = (
        base.from_template(f"READY {{sig}} 2 image {HELD} - {claim}")
        .decode()
        .replace(HELD, "sha256:" + "0" * 64)
    )
    with pytest.raises(ProtocolError, match="^bad token$"):
        parse_line(held_forged.encode(), base.TOKEN, 4, base.S)


def test_rank_0_refuses_a_claim_that_is_not_a_prefix_of_the_plans_chain_and_records_the_others(
    tmp_path: Path,
):
    path = tmp_path / "barrier.holds"
    other = chain.claim_text([f"sha256:{ch * 64}" for ch in "5678"], 2)  # signed, but another chain's
    with base.holds_file(path) as fd, base.running_barrier(4, holds_fd=fd, planned=CHAIN) as b:
        good = base.ready(b.port, 1, f"image - - {chain.claim_text(CHAIN, 2)}")
        zero = base.ready(b.port, 2, f"image {HELD} - layers:0")
        base.wait_for(lambda: path.read_text().count("\n") == 2)
        bad = base.ready(b.port, 3, f"image - - {other}")
        assert base.read_line(bad) == "ERR bad layer prefix"
        longer = base.ready(b.port, 3, f"image - - layers:5:{chain.chain_ids(CHAIN)[3][7:19]}")
        assert base.read_line(longer) == "ERR bad layer prefix"
        assert sorted(path.read_text().splitlines()) == [
            f"1 - - {chain.claim_text(CHAIN, 2)}",
            f"2 {HELD} - layers:0",
        ]
        for conn in (good, zero):
            conn.close()


def test_a_server_without_a_plan_refuses_any_claim_of_layers_it_cannot_check() -> None:
    with base.running_barrier(2) as b:
        claim = base.ready(b.port, 1, f"image - - {chain.claim_text(CHAIN, 1)}")
        assert base.read_line(claim) == "ERR bad layer prefix"
        none = base.ready(b.port, 1, "image - - layers:0")
        base.wait_for(lambda: base.logged(b, "rank 1 ready (image)"))
        none.close()


def test_join_sends_its_claim_and_rank_0_records_it(tmp_path: Path) -> None:
    path = tmp_path / "barrier.holds"
    claim = chain.claim_text(CHAIN, 4)
    with base.holds_file(path) as fd, base.running_barrier(2, holds_fd=fd, planned=CHAIN) as b:
        box: dict[str, str] = {}
        waits = {"connect_timeout": 5, "wait_timeout": 5}
        worker = threading.Thread(
            target=lambda: box.update(
                id=join(base.LOOPBACK, [b.port], base.TOKEN, 1, phase="image", layers=claim, **waits)
            ),
            daemon=True,
        )
        worker.start()
        base.wait_for(lambda: path.read_text().count("\n") == 1)
        assert path.read_text() == f"1 - - {claim}\n"
        assert base.control_line(b.port, "RELEASE", HELD) == "OK"
        worker.join(5)
        assert box == {"id": HELD}
    with pytest.raises(base.HelperError, match="not a layers claim"):
        join(base.LOOPBACK, [1], base.TOKEN, 1, phase="start", layers=claim, connect_timeout=0.1)
    with pytest.raises(base.HelperError, match="not a layers claim"):
        join(base.LOOPBACK, [1], base.TOKEN, 1, phase="image", layers="layers:x", connect_timeout=0.1)


def test_the_worker_claims_what_its_engine_holds_of_the_plans_chain(tmp_path: Path, monkeypatch) -> None:
    image = "sha256:" + "9" * 64
    path, server = fake_engine.engine(tmp_path, {
        "/info": b'{"DriverStatus":[]}',
        "/images/json?all=1": json.dumps([{"Id": image}]).encode(),
        f"/images/{image}/json": json.dumps({"Id": image, "RootFS": {"Type": "layers", "Layers": CHAIN[:2]}})
        .encode(),
    })  # fmt: skip
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    monkeypatch.setenv("JOB_IMAGE_LAYERS", " ".join(CHAIN))
    try:
        assert barrier_cli._layers_claim(1, "JOB_IMAGE_LAYERS") == chain.claim_text(CHAIN, 2)
    finally:
        server.close()
    monkeypatch.setenv("JOB_IMAGE_LAYERS", "")
    assert barrier_cli._layers_claim(1, "JOB_IMAGE_LAYERS") == ""  # no plan: nothing to claim
    monkeypatch.setenv("JOB_IMAGE_LAYERS", " ".join(CHAIN))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/gone.sock")
    assert barrier_cli._layers_claim(1, "JOB_IMAGE_LAYERS") == "layers:0"  # the engine says nothing
