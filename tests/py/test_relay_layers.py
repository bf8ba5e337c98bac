"""A layered relay stream (slurm_multi.relay.sections): each link carries what the nodes below it lack,
each loader gets what its node lacks, and every node still checks that it got rank 0's stream.

Real sockets on 127.0.0.1, one thread per rank, as tests/py/test_relay.py; the source is the real
`docker save` of tests/py/data/layers (test_layers.py says what it holds)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

import test_relay as base
from slurm_multi.common import HelperError
from slurm_multi.layers import tarstream
from slurm_multi.relay import forward, protocol, sections, tree

DATA = Path(__file__).parent / "data" / "layers"
CLASSIC = DATA / "classic.tar"
DIFFS: list[str] = json.loads((DATA / "classic.json").read_text())["diff_ids"]


def expected(held: int, tmp_path: Path) -> bytes:
    """What a loader holding `held` layers must get: the tar filter's output."""
    out = tmp_path / f"want{held}.tar"
    fd, sink = os.open(CLASSIC, os.O_RDONLY), os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        tarstream.filter_stream(fd, sink, DIFFS, held)
    finally:
        os.close(fd)
        os.close(sink)
    return out.read_bytes()


def relay(tmp_path: Path, nnodes: int, prefixes: dict[int, int], fanout: int = 1, loaders=None, source=None,
          **plan):  # fmt: skip
    """Run rank 0 (layered) and every receiver; receiver r writes tmp_path/out<r> unless
    loaders[r] is False (it only forwards). `source`: rank 0's stdin fd (default: the fixture)."""
    job = base.job_id()
    outcomes: dict[int, object] = {}
    loaders = loaders or {}

    def one(rank: int) -> None:
        settings = dict(fanout=fanout, **plan)
        try:
            if rank == 0:
                fd = source if source is not None else os.open(CLASSIC, os.O_RDONLY)
                try:
                    rank0 = base.make_plan(0, nnodes, job, **settings)
                    pieces = tarstream.Scanner(
                        fd, DIFFS, quiet_every=rank0.heartbeat
                    ).pieces()  # as relay send
                    outcomes[0] = forward.run_layered(rank0, pieces, DIFFS, prefixes)
                finally:
                    os.close(fd)
            elif loaders.get(rank, True):
                fd = os.open(tmp_path / f"out{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                try:
                    outcomes[rank] = forward.run_node(
                        base.make_plan(rank, nnodes, job, **settings), out_fd=fd
                    )
                finally:
                    os.close(fd)
            else:
                outcomes[rank] = forward.run_node(base.make_plan(rank, nnodes, job, **settings))
        except HelperError as exc:
            outcomes[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(nnodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a relay rank hung"
    return outcomes


def test_each_loader_gets_the_tar_without_the_blobs_its_node_holds(tmp_path):
    # a chain: rank 1 holds every layer, rank 2 the base only, rank 3 three layers
    prefixes = {1: 4, 2: 1, 3: 3}
    outcomes = relay(tmp_path, 4, prefixes)
    assert all(isinstance(o, tree.Result) for o in outcomes.values()), outcomes
    for rank, held in prefixes.items():
        assert (tmp_path / f"out{rank}").read_bytes() == expected(held, tmp_path), rank
    assert outcomes[0].nodes == 3


def test_a_link_carries_only_what_some_node_below_it_lacks(tmp_path):
    prefixes = {1: 4, 2: 1, 3: 3}  # rank 1's link must carry rank 2's needs; rank 3's only its own
    outcomes = relay(tmp_path, 4, prefixes)
    below_1 = len(expected(1, tmp_path))
    assert outcomes[0].sent == {1: below_1}
    assert outcomes[1].total == below_1 and outcomes[2].total == below_1
    assert outcomes[3].total == len(expected(3, tmp_path)) < below_1
    # what each says it loaded and held, from the sizes in rank 0's trailer
    sizes = {}
    for member, _part, piece in tarstream.Scanner(os.open(CLASSIC, os.O_RDONLY), DIFFS).pieces():
        if member.label != tarstream.ALWAYS:
            sizes[member.label] = sizes.get(member.label, 0) + len(piece)
    assert outcomes[3].layers == {
        "layers": 3, "received_layers": 1, "received_bytes": sizes[4], "loaded_layers": 1,
        "loaded_bytes": sizes[4], "held_layers": 2, "held_bytes": sizes[1] + sizes[3],
    }  # fmt: skip
    assert outcomes[1].layers["loaded_layers"] == 0 and outcomes[1].layers["received_layers"] == 2
    assert outcomes[2].layers["held_layers"] == 1 and outcomes[2].layers["loaded_layers"] == 2


def test_a_tree_gives_each_subtree_what_its_least_holder_lacks(tmp_path):
    # fanout 2: 0 -> (1, 2), 1 -> (3, 4), 2 -> (5,)
    prefixes = {1: 4, 2: 4, 3: 3, 4: 4, 5: 0}
    outcomes = relay(tmp_path, 6, prefixes, fanout=2)
    assert all(isinstance(o, tree.Result) for o in outcomes.values()), outcomes
    for rank, held in prefixes.items():
        assert (tmp_path / f"out{rank}").read_bytes() == expected(held, tmp_path), rank
    assert outcomes[0].sent == {1: len(expected(3, tmp_path)), 2: len(expected(0, tmp_path))}
    assert outcomes[4].total == len(expected(4, tmp_path))


def test_a_node_that_only_forwards_passes_its_subtree_what_it_lacks(tmp_path):
    prefixes = {1: 4, 2: 0}
    outcomes = relay(tmp_path, 3, prefixes, loaders={1: False})
    assert isinstance(outcomes[1], tree.Result) and outcomes[1].layers["loaded_layers"] == 0
    assert (tmp_path / "out2").read_bytes() == CLASSIC.read_bytes()


def test_when_every_worker_holds_every_layer_only_the_rest_of_the_tar_moves(tmp_path):
    outcomes = relay(tmp_path, 3, {1: 4, 2: 4})
    assert outcomes[0].sent == {1: len(expected(4, tmp_path))}
    assert (tmp_path / "out2").read_bytes() == expected(4, tmp_path)


def test_a_layered_trailer_without_the_nodes_threshold_is_refused():
    layering = sections.Layering(4, [4, 1, 3], 2, 1, 3)
    payload = protocol.layered_trailer_payload({1: (0, protocol.CHAIN_START)}, {})
    with pytest.raises(protocol.ProtocolError, match="threshold 3"):
        layering.verify(payload, 0, "rank 1 (node2)")


def test_a_layered_trailer_that_disagrees_with_what_arrived_names_the_upstream():
    layering = sections.Layering(4, [4, 1, 3], 2, 1, 3)
    payload = protocol.layered_trailer_payload({3: (10, protocol.CHAIN_START)}, {})
    digest, why = layering.verify(payload, 0, "rank 1 (node2)")
    assert not digest and "bytes were lost" in why and "rank 1 (node2)" in why
    payload = protocol.layered_trailer_payload({3: (0, b"\1" * 32)}, {})
    assert "is not rank 0's" in layering.verify(payload, 0, "rank 1 (node2)")[1]


@pytest.mark.parametrize(
    "payload",
    [b"[]", b"not json", b'{"layers": 4, "prefixes": [4, 1]}', b'{"layers": 4, "prefixes": [4, 5, 0]}',
     b'{"layers": -1, "prefixes": [0, 0, 0]}', b'{"layers": 4, "prefixes": [4, true, 0]}'],
)  # fmt: skip
def test_a_malformed_layout_is_a_protocol_error(payload):
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_layout(payload, 3)


def test_section_and_layout_frames_have_bounded_sizes():
    assert protocol.parse_frame_header(protocol.FRAME.pack(protocol.SECTION, 4, b"\0" * 16))[1] == 4
    for kind, length in ((protocol.SECTION, 5), (protocol.LAYOUT, 0), (protocol.LAYERED_END, 2 << 20)):
        with pytest.raises(protocol.ProtocolError):
            protocol.parse_frame_header(protocol.FRAME.pack(kind, length, b"\0" * 16))


def slow_source(seconds: float) -> int:
    """A pipe that gives the fixture's bytes over `seconds`, 512 at a time (docker save on a slow
    disk): sections nobody below needs take longer than a stall timeout to pass."""
    read, write = os.pipe()
    data = CLASSIC.read_bytes()

    def feed() -> None:
        with os.fdopen(write, "wb", buffering=0) as out:
            for start in range(0, len(data), 512):
                out.write(data[start : start + 512])
                time.sleep(seconds * 512 / len(data))

    threading.Thread(target=feed, daemon=True).start()
    return read


@pytest.mark.parametrize("prefixes", [{1: 4}, {1: 0, 2: 4}])
def test_a_long_section_a_child_does_not_need_never_trips_its_stall_timeout(tmp_path, prefixes):
    # {1: 4}: rank 0 reads every blob and sends none of them; {1: 0, 2: 4}: rank 1 loads them all
    # and forwards none to rank 2. Either way the child hears PINGs, not silence.
    nnodes = len(prefixes) + 1
    outcomes = relay(tmp_path, nnodes, prefixes, source=slow_source(2.5), stall_timeout=0.6)
    assert all(isinstance(o, tree.Result) for o in outcomes.values()), outcomes
    for rank, held in prefixes.items():
        assert (tmp_path / f"out{rank}").read_bytes() == expected(held, tmp_path)
