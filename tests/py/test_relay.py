"""The node-to-node relay (slurm_multi.relay): real sockets on 127.0.0.1, one thread or process per rank.

The wire format's parsers are tests/py/test_relay_protocol.py; the command line, test_relay_cli.py."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

import squatters
from slurm_multi import EXIT_FAILURE, EXIT_TIMEOUT, EXIT_USAGE, auth
from slurm_multi.common import HelperError
from slurm_multi.net import candidate_ports, read_local_port_range
from slurm_multi.relay import forward, load, protocol, tree

REPO = Path(__file__).resolve().parents[2]
TOKEN = "job-token-" + "a" * 20


def hosts(n: int) -> list[str]:
    return [f"node{r + 1}" for r in range(n)]


def make_plan(rank: int, nnodes: int, job: int, **overrides) -> tree.Plan:
    settings = dict(
        fanout=1,
        hosts=hosts(nnodes),
        ports_of=lambda r: tree.relay_ports(r, 29500, job),
        connect_timeout=10.0,
        stall_timeout=5.0,
        loopback=True,
        log=lambda _message: None,
    )
    settings.update(overrides)
    token = settings.pop("token", TOKEN)
    return tree.Plan(rank, nnodes, token, **settings)


def job_id() -> int:
    return secrets.randbelow(1 << 20)


def source_file(tmp_path: Path, nbytes: int) -> tuple[Path, str]:
    path = tmp_path / "source.bin"
    path.write_bytes(os.urandom(nbytes))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def run_ranks(
    tmp_path: Path,
    source: Path,
    nnodes: int,
    plan_for: Callable[[int], tree.Plan],
    ranks: Sequence[int] = (),
) -> dict[int, tree.Result | HelperError]:
    """Run the given ranks (default all) as threads; rank r >= 1 writes to tmp_path/out<r>."""
    outcomes: dict[int, tree.Result | HelperError] = {}

    def one(rank: int) -> None:
        fd = os.open(source if rank == 0 else tmp_path / f"out{rank}", os.O_RDONLY if rank == 0 else
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC)  # fmt: skip
        try:
            if rank == 0:
                outcomes[rank] = forward.run_node(plan_for(rank), source_fd=fd)
            else:
                outcomes[rank] = forward.run_node(plan_for(rank), out_fd=fd)
        except HelperError as exc:
            outcomes[rank] = exc
        finally:
            os.close(fd)

    in_threads(one, ranks or range(nnodes))
    return outcomes


def in_threads(one: Callable[[int], None], ranks: Iterable[int]) -> None:
    """one(rank) for every rank at once, each in a thread; a rank still running after 30 s fails."""
    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a relay rank hung"


def message(outcome: object) -> str:
    assert isinstance(outcome, HelperError), f"expected a failure, got {outcome!r}"
    return outcome.format_message()


# --------------------------------------------------------------------------------------------------
# Topology and ports


def test_a_chain_is_a_tree_of_fanout_one():
    assert [tree.parent_of(r, 1) for r in range(4)] == [None, 0, 1, 2]
    assert [tree.children_of(r, 1, 4) for r in range(4)] == [[1], [2], [3], []]


def test_a_tree_of_fanout_two_gives_each_rank_its_children():
    assert [tree.parent_of(r, 2) for r in range(7)] == [None, 0, 0, 1, 1, 2, 2]
    assert [tree.children_of(r, 2, 6) for r in range(4)] == [[1, 2], [3, 4], [5], []]


def test_every_rank_has_its_own_ports_clear_of_the_barrier_and_the_ephemeral_range():
    local = read_local_port_range()
    for master_port, job in ((29500, 4242), (29500, 0), (12345, 987654321), (60000, 7)):
        barrier = set(candidate_ports((), master_port, job, None, 32, local))
        seen: set[int] = set()
        for rank in range(256):
            ports = tree.relay_ports(rank, master_port, job, local_range=local)
            assert len(ports) == tree.DEFAULT_PORT_COUNT
            assert not seen & set(ports), f"rank {rank} shares a port with a lower rank"
            assert not barrier & set(ports)
            assert master_port not in ports
            assert all(not local[0] <= p <= local[1] for p in ports)
            assert ports == tree.relay_ports(rank, master_port, job, local_range=local)  # deterministic
            seen |= set(ports)


def test_an_explicit_port_gives_rank_r_its_own_block():
    assert tree.relay_ports(0, None, None, override=30000) == [30000, 30001, 30002, 30003]
    assert tree.relay_ports(3, None, None, override=30000, count=2) == [30006, 30007]


def test_ports_without_inputs_are_a_usage_error():
    with pytest.raises(HelperError) as info:
        tree.relay_ports(1, None, 42)
    assert info.value.exit_code == EXIT_USAGE and "--master-port" in info.value.format_message()


# --------------------------------------------------------------------------------------------------
# Delivery


def test_a_chain_of_four_delivers_identical_bytes_to_every_node(tmp_path):
    source, digest = source_file(tmp_path, 5_000_123)
    job = job_id()
    outcomes = run_ranks(tmp_path, source, 4, lambda r: make_plan(r, 4, job))
    assert all(isinstance(o, tree.Result) for o in outcomes.values()), outcomes
    assert outcomes[0].nodes == 3 and outcomes[0].total == 5_000_123
    for rank in (1, 2, 3):
        assert hashlib.sha256((tmp_path / f"out{rank}").read_bytes()).hexdigest() == digest
        assert outcomes[rank].digest == outcomes[0].digest  # rank 0's chain digest, on every node
    assert [outcomes[r].nodes for r in (1, 2, 3)] == [3, 2, 1]


def test_a_tree_of_fanout_two_delivers_identical_bytes_to_every_node(tmp_path):
    source, digest = source_file(tmp_path, 3_000_000)
    job = job_id()
    outcomes = run_ranks(tmp_path, source, 7, lambda r: make_plan(r, 7, job, fanout=2))
    assert all(isinstance(o, tree.Result) for o in outcomes.values()), outcomes
    assert outcomes[0].nodes == 6
    for rank in range(1, 7):
        assert hashlib.sha256((tmp_path / f"out{rank}").read_bytes()).hexdigest() == digest


def test_an_empty_stream_is_delivered_and_verified(tmp_path):
    source, digest = source_file(tmp_path, 0)
    job = job_id()
    outcomes = run_ranks(tmp_path, source, 2, lambda r: make_plan(r, 2, job))
    assert outcomes[1].total == 0 and outcomes[1].digest == outcomes[0].digest == protocol.CHAIN_START.hex()
    assert (tmp_path / "out1").read_bytes() == b"" and digest == hashlib.sha256(b"").hexdigest()


# --------------------------------------------------------------------------------------------------
# Authentication


def test_a_child_with_a_wrong_token_is_refused_on_both_ends(tmp_path):
    source, _ = source_file(tmp_path, 1000)
    job, logs = job_id(), []

    def plan_for(rank: int) -> tree.Plan:
        if rank == 0:
            return make_plan(0, 2, job, connect_timeout=1.5, log=logs.append)
        return make_plan(1, 2, job, token="not-the-job-token", connect_timeout=1.5)

    outcomes = run_ranks(tmp_path, source, 2, plan_for)
    child, parent = message(outcomes[1]), message(outcomes[0])
    # An unsigned DENY could be anyone's on that port: the child tries on, and says what it met.
    assert outcomes[1].exit_code == EXIT_TIMEOUT
    assert "rank 0 (node1)" in child and "refused us: wrong token" in child and "SM_BARRIER_TOKEN" in child
    assert outcomes[0].exit_code == EXIT_TIMEOUT
    assert "rank 1 (node2) did not connect" in parent and "wrong token" in parent
    assert any("wrong token" in line and "SM_BARRIER_TOKEN" in line for line in logs)
    assert all(TOKEN not in text and "not-the-job-token" not in text for text in (child, parent, *logs))


class Speaker:
    """The sending side of one link, written from the wire format in slurm_multi.relay.protocol's
    docstring: every frame tagged under the link key with its sequence number, data digests chained."""

    def __init__(self, key: bytes) -> None:
        self.key, self.seq, self.chain, self.total = key, 0, protocol.CHAIN_START, 0

    def frame(self, kind: bytes, payload: bytes = b"", seq: int | None = None) -> bytes:
        digest = hashlib.sha256(payload).digest()
        tag = protocol.frame_tag(self.key, self.seq if seq is None else seq, kind, len(payload), digest)
        self.seq += 1
        if kind == protocol.DATA:
            self.chain, self.total = protocol.chain(self.chain, digest), self.total + len(payload)
        return protocol.FRAME.pack(kind, len(payload), tag) + payload

    def data(self, payload: bytes, size: int = 100_000) -> bytes:
        return b"".join(
            self.frame(protocol.DATA, payload[i : i + size]) for i in range(0, len(payload), size)
        )

    def trailer(self, total: int | None = None, chain: bytes | None = None) -> bytes:
        total = self.total if total is None else total
        return self.frame(protocol.END, protocol.trailer_payload(total, chain or self.chain))


def fake_parent(
    script: Callable[[socket.socket, Speaker], None], token: str = TOKEN, proof: str | None = None
) -> tuple[int, threading.Thread]:
    """A hand-written rank 0 on 127.0.0.1: handshake (with `proof` instead of the real one), then
    `script(sock, speaker)`. Returns its port and thread."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        sock, _ = listener.accept()
        listener.close()
        reader = sock.makefile("rb")
        nonce_p = auth.new_nonce()
        sock.sendall(protocol.hello_line(nonce_p))
        rank, purpose, nonce_c, _given = protocol.parse_auth(reader.readline())
        answer = proof or protocol.parent_proof(token, nonce_c, nonce_p, 0, rank, purpose)
        sock.sendall(f"OK 0 {answer}\n".encode() + protocol.header_line(purpose))
        key = protocol.link_key(token, nonce_p, nonce_c, 0, rank, purpose)
        try:
            if proof is None:
                assert protocol.parse_status(reader.readline(), "READY", key) == (True, 0, "")
            script(sock, Speaker(key))
            sock.shutdown(socket.SHUT_WR)  # a clean end: what was sent arrives before the EOF
            sock.settimeout(5)
            while sock.recv(4096):  # the child's WAITs, unread, would turn our close into a reset
                pass
        except OSError:
            pass
        finally:
            sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def receive_from(port: int, tmp_path: Path, **overrides) -> tree.Result | HelperError:
    plan = make_plan(1, 2, 0, ports_of=lambda r: [port], **overrides)
    with open(tmp_path / "out1", "wb") as out:
        try:
            return forward.run_node(plan, out_fd=out.fileno())
        except HelperError as exc:
            return exc


def test_a_parent_that_cannot_prove_the_token_is_skipped_and_nothing_is_written(tmp_path):
    port, thread = fake_parent(lambda sock, out: sock.sendall(out.data(b"x" * 1000)), proof="0" * 64)
    outcome = receive_from(port, tmp_path, connect_timeout=1.0)
    thread.join(5)
    assert outcome.exit_code == EXIT_TIMEOUT
    text = message(outcome)
    assert "rank 0 (node1)" in text and "an OK without the job token's proof" in text
    assert (tmp_path / "out1").read_bytes() == b""


def test_frames_under_another_links_key_are_refused_before_anything_is_written(tmp_path):
    """Frames recorded on another link (its own nonces, so its own key) replayed on this one."""
    other = Speaker(protocol.link_key(TOKEN, auth.new_nonce(), auth.new_nonce(), 0, 1, "image"))
    port, thread = fake_parent(
        lambda sock, out: (sock.sendall(other.data(os.urandom(300_000))), time.sleep(0.5))
    )
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    assert outcome.exit_code == EXIT_FAILURE
    assert "frame 0 from rank 0 (node1) (after 0 bytes) does not match its tag" in message(outcome)
    assert (tmp_path / "out1").read_bytes() == b""


def test_a_replayed_or_reordered_frame_is_refused_and_nothing_after_it_is_written(tmp_path):
    first, second = os.urandom(50_000), os.urandom(50_000)

    def replay_first(sock: socket.socket, out: Speaker) -> None:
        frame = out.frame(protocol.DATA, first)
        sock.sendall(frame + frame)  # frame 0 again where frame 1 belongs
        time.sleep(0.5)

    port, thread = fake_parent(replay_first)
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    assert "frame 1 from rank 0 (node1) (after 50 kB) does not match its tag" in message(outcome)
    assert (tmp_path / "out1").read_bytes() == first

    def swap(sock: socket.socket, out: Speaker) -> None:
        one, two = out.frame(protocol.DATA, first), out.frame(protocol.DATA, second)
        sock.sendall(two + one)
        time.sleep(0.5)

    port, thread = fake_parent(swap)
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    assert "frame 0 from rank 0 (node1)" in message(outcome)
    assert (tmp_path / "out1").read_bytes() == b""


def test_an_abort_without_the_links_tag_is_not_believed(tmp_path):
    stranger = Speaker(protocol.link_key("not-the-token", auth.new_nonce(), auth.new_nonce(), 0, 1, "image"))
    port, thread = fake_parent(
        lambda sock, out: (sock.sendall(out.data(b"y" * 10) + stranger.frame(protocol.ABORT, b"stop", seq=1)),
                           time.sleep(0.5))
    )  # fmt: skip
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    assert "frame 1" in message(outcome) and "does not match its tag" in message(outcome)
    assert "aborted" not in message(outcome)


# --------------------------------------------------------------------------------------------------
# Failures: every one is a one-line error naming this node and the upstream


def test_a_truncated_stream_fails_naming_the_upstream(tmp_path):
    port, thread = fake_parent(lambda sock, out: sock.sendall(out.data(os.urandom(2_500_000))))
    started = time.monotonic()
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    text = message(outcome)
    assert outcome.exit_code == EXIT_FAILURE and time.monotonic() - started < 5
    assert text.startswith("relay: node2 (rank 1): stream from rank 0 (node1) ended after 2.5 MB")
    assert "of an unfinished stream" in text and "rank 0 died or its link broke" in text


@pytest.mark.parametrize(
    ("trailer", "needle"),
    [({"total": 10_001}, "received 10000 bytes from rank 0 (node1) but the stream had 10001"),
     ({"chain": hashlib.sha256(b"other").digest()}, "is not rank 0's: chain digest")],
)  # fmt: skip
def test_a_trailer_that_disagrees_with_the_stream_is_caught(tmp_path, trailer, needle):
    payload = os.urandom(10_000)

    def script(sock: socket.socket, out: Speaker) -> None:
        sock.sendall(out.data(payload) + out.trailer(**trailer))
        time.sleep(0.5)

    port, thread = fake_parent(script)
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    assert needle in message(outcome)


def test_a_corrupted_byte_in_transit_is_caught_by_the_frames_tag(tmp_path):
    source, _ = source_file(tmp_path, 3_000_000)
    job = job_id()
    upstream = tree.relay_ports(0, 29500, job)
    proxy = socket.socket()
    proxy.bind(("127.0.0.1", 0))
    proxy.listen(1)
    flip_at = 500_000  # deep inside the first data frame (the handshake is a few hundred bytes)

    def pump(src: socket.socket, dst: socket.socket, flip: int | None) -> None:
        """One direction of a well-behaved link, but for the flipped byte: once `dst` is gone the
        rest of `src` is read and dropped, and `dst` is half-closed at the end, so nothing the
        other direction still carries (the child's FAIL) is cut off."""
        seen, open_ = 0, True
        try:
            while chunk := src.recv(65536):
                if flip is not None and seen <= flip < seen + len(chunk):
                    chunk = bytearray(chunk)
                    chunk[flip - seen] ^= 0x01
                seen += len(chunk)
                if open_:
                    try:
                        dst.sendall(chunk)
                    except OSError:
                        open_ = False
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def run_proxy() -> None:
        child, _ = proxy.accept()
        parent = None
        deadline = time.monotonic() + 20
        # Rank 0 (another thread) may not listen yet: retry, as a real child dials until it does.
        while parent is None and time.monotonic() < deadline:
            for port in upstream:
                try:
                    parent = socket.create_connection(("127.0.0.1", port))
                    break
                except OSError:
                    continue
            else:
                time.sleep(0.05)
        if parent is None:
            child.close()
            return
        threading.Thread(target=pump, args=(child, parent, None), daemon=True).start()
        pump(parent, child, flip_at)

    threading.Thread(target=run_proxy, daemon=True).start()

    def plan_for(rank: int) -> tree.Plan:
        ports = (lambda r: [proxy.getsockname()[1]]) if rank == 1 else (lambda r: upstream)
        return make_plan(rank, 2, job, ports_of=ports)

    outcomes = run_ranks(tmp_path, source, 2, plan_for)
    assert "frame 0 from rank 0 (node1) (after 0 bytes) does not match its tag" in message(outcomes[1])
    assert "changed on the way" in message(outcomes[1])
    assert (tmp_path / "out1").read_bytes() == b""  # the bad frame was the first: nothing written
    # Rank 0 hears it too: the child's FAIL (as its answer to the trailer, or read when the link
    # broke under rank 0's next frame, whichever came first).
    assert "rank 1 (node2)" in message(outcomes[0]) and "does not match its tag" in message(outcomes[0])


def test_a_frozen_parent_trips_the_stall_timeout(tmp_path):
    release = threading.Event()

    def script(sock: socket.socket, out: Speaker) -> None:
        sock.sendall(out.data(os.urandom(300_000)))
        release.wait(10)  # keeps the socket open and sends nothing

    port, thread = fake_parent(script)
    started = time.monotonic()
    outcome = receive_from(port, tmp_path, stall_timeout=0.5)
    elapsed = time.monotonic() - started
    release.set()
    thread.join(5)
    assert outcome.exit_code == EXIT_TIMEOUT and elapsed < 3
    assert "no bytes from rank 0 (node1) for 0.5 s after 300 kB: rank 0 is frozen" in message(outcome)


def test_a_child_that_stops_reading_is_dropped_by_its_parent(tmp_path):
    source, _ = source_file(tmp_path, 40_000_000)
    job = job_id()
    port = tree.relay_ports(0, 29500, job)
    frozen = threading.Event()

    def lazy_child() -> None:
        for _ in range(100):
            try:
                sock = socket.create_connection(("127.0.0.1", port[0]))
                break
            except OSError:
                time.sleep(0.05)
        key = child_handshake(sock)
        sock.sendall(protocol.status_line(key, "READY"))
        frozen.wait(10)  # never reads a frame
        sock.close()

    helper = threading.Thread(target=lazy_child, daemon=True)
    helper.start()
    started = time.monotonic()
    outcome = run_ranks(tmp_path, source, 2, lambda r: make_plan(r, 2, job, stall_timeout=0.5), ranks=[0])[0]
    frozen.set()
    helper.join(5)
    assert time.monotonic() - started < 5
    assert "no child left to send to: rank 1 (node2) took no bytes for 0.5 s" in message(outcome)


def test_a_slow_reader_within_the_stall_timeout_is_waited_for(tmp_path):
    """docker load pausing for a moment (shorter than --stall-timeout) backs up the chain, no more."""
    source, digest = source_file(tmp_path, 24_000_000)
    job = job_id()
    read_fd, write_fd = os.pipe()
    got = hashlib.sha256()

    def slow_reader() -> None:
        time.sleep(1.5)  # longer than any handshake timeout, shorter than --stall-timeout
        with os.fdopen(read_fd, "rb") as pipe:
            while chunk := pipe.read(1 << 20):
                got.update(chunk)

    reader = threading.Thread(target=slow_reader, daemon=True)
    reader.start()
    outcomes: dict[int, object] = {}

    def receiver() -> None:
        try:
            outcomes[1] = forward.run_node(make_plan(1, 2, job, stall_timeout=4), out_fd=write_fd)
        except HelperError as exc:
            outcomes[1] = exc
        finally:
            os.close(write_fd)

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    outcomes[0] = run_ranks(tmp_path, source, 2, lambda r: make_plan(r, 2, job, stall_timeout=4), [0])[0]
    thread.join(10)
    reader.join(10)
    assert isinstance(outcomes[0], tree.Result) and isinstance(outcomes[1], tree.Result), outcomes
    assert got.hexdigest() == digest


def child_handshake(sock: socket.socket) -> bytes:
    """A hand-written rank 1's handshake with rank 0; the link key."""
    reader = sock.makefile("rb")
    nonce_p, nonce_c = protocol.parse_hello(reader.readline()), auth.new_nonce()
    sock.sendall(protocol.auth_line(TOKEN, nonce_p, 1, "image", nonce_c))
    reader.readline(), reader.readline()
    return protocol.link_key(TOKEN, nonce_p, nonce_c, 0, 1, "image")


def fake_child(port: int, after_trailer: Callable[[socket.socket, bytes], None]) -> threading.Thread:
    """A hand-written rank 1: handshake, READY, read every frame up to the trailer, then `after_trailer`."""

    def run() -> None:
        for _ in range(200):
            try:
                sock = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.02)
        key = child_handshake(sock)
        sock.sendall(protocol.status_line(key, "READY"))
        reader = sock.makefile("rb")
        while True:
            kind, length, _tag = protocol.parse_frame_header(reader.read(protocol.FRAME.size))
            reader.read(length)
            if kind == protocol.END:
                break
        after_trailer(sock, key)
        sock.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_lagging_subtree_that_sends_wait_is_waited_for_past_the_stall_timeout(tmp_path):
    source, _ = source_file(tmp_path, 100_000)
    job = job_id()

    def lagging(sock: socket.socket, key: bytes) -> None:  # its own subtree is still busy for 1.5 s
        for _ in range(8):
            sock.sendall(b"WAIT\n")
            time.sleep(0.2)
        sock.sendall(protocol.status_line(key, "DONE", 5))

    child = fake_child(tree.relay_ports(0, 29500, job)[0], lagging)
    plan = make_plan(0, 2, job, stall_timeout=0.6)
    outcome = run_ranks(tmp_path, source, 2, lambda r: plan, [0])[0]
    child.join(5)
    assert isinstance(outcome, tree.Result) and outcome.nodes == 5


def test_a_subtree_silent_after_the_trailer_is_given_up_on(tmp_path):
    source, _ = source_file(tmp_path, 100_000)
    job = job_id()
    child = fake_child(tree.relay_ports(0, 29500, job)[0], lambda sock, key: time.sleep(2))
    started = time.monotonic()
    plan = make_plan(0, 2, job, stall_timeout=0.6)
    outcome = run_ranks(tmp_path, source, 2, lambda r: plan, [0])[0]
    elapsed = time.monotonic() - started
    child.join(5)
    assert elapsed < 1.8
    assert "rank 1 (node2): showed no progress for 0.6 s after the trailer" in message(outcome)


def test_a_missing_child_times_out_naming_it(tmp_path):
    source, _ = source_file(tmp_path, 1000)
    outcome = run_ranks(tmp_path, source, 3, lambda r: make_plan(r, 3, job_id(), connect_timeout=0.5), [0])[0]
    assert outcome.exit_code == EXIT_TIMEOUT
    assert message(outcome).startswith("relay: node1 (rank 0): rank 1 (node2) did not connect within 0.5 s")


def test_a_parent_that_never_listens_times_out_naming_it(tmp_path):
    outcome = receive_from(1, tmp_path, connect_timeout=0.3)
    assert outcome.exit_code == EXIT_TIMEOUT
    assert "rank 0 (node1) did not answer on 127.0.0.1:1 within 0.3 s" in message(outcome)


def _process_rank(plan: tree.Plan, source_fd: int | None, out: str | None, conn, close_fds) -> None:
    for fd in close_fds:
        os.close(fd)
    out_fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if out else None
    try:
        forward.run_node(plan, source_fd, out_fd)
        conn.send(("ok", ""))
    except HelperError as exc:
        conn.send((exc.exit_code, exc.format_message()))


def test_a_killed_middle_node_makes_the_rest_of_the_chain_fail_within_seconds_naming_it(tmp_path):
    ctx = multiprocessing.get_context("fork")
    job = job_id()
    read_fd, write_fd = os.pipe()
    procs, pipes = {}, {}
    for rank in range(4):
        recv_end, send_end = ctx.Pipe(duplex=False)
        source, close = (read_fd, [write_fd]) if rank == 0 else (None, [read_fd, write_fd])
        out = None if rank == 0 else str(tmp_path / f"out{rank}")
        proc = ctx.Process(target=_process_rank, args=(make_plan(rank, 4, job), source, out, send_end, close))
        proc.start()
        send_end.close()
        procs[rank], pipes[rank] = proc, recv_end
    os.close(read_fd)
    stop = threading.Event()

    def feed() -> None:  # a slow `docker save`: 64 kB every 10 ms
        try:
            while not stop.is_set():
                os.write(write_fd, os.urandom(65536))
                time.sleep(0.01)
        except OSError:
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        last = tmp_path / "out3"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not last.exists() or last.stat().st_size < 500_000):
            time.sleep(0.02)
        assert last.stat().st_size >= 500_000, "the stream did not reach the last node"
        os.kill(procs[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        assert pipes[3].poll(5), "the last node did not notice within 5 s"
        code, text = pipes[3].recv()
        assert time.monotonic() - killed < 5
        assert pipes[2].poll(5)
        code2, text2 = pipes[2].recv()
    finally:
        stop.set()
        for proc in procs.values():
            proc.join(5)
            if proc.is_alive():
                proc.kill()
        os.close(write_fd)
    assert code2 == EXIT_FAILURE
    assert text2.startswith("relay: node3 (rank 2): stream from rank 1 (node2) ended")
    assert "rank 1 died or its link broke" in text2
    assert code == EXIT_FAILURE
    assert text.startswith("relay: node4 (rank 3): rank 2 (node3) aborted the stream")
    assert "stream from rank 1 (node2) ended" in text


def test_a_receiver_given_an_unknown_frame_type_fails_with_a_protocol_error(tmp_path):
    port, thread = fake_parent(
        lambda sock, out: (
            sock.sendall(b"Z\x00\x00\x00\x05" + bytes(protocol.TAG_BYTES) + b"hello"),
            time.sleep(0.5),
        )
    )
    outcome = receive_from(port, tmp_path)
    thread.join(5)
    assert "protocol error from rank 0 (node1) after 0 bytes: unknown frame type 0x5a" in message(outcome)


# --------------------------------------------------------------------------------------------------
# The end-to-end tests' fault hook (SM_RELAY_FAULT)


def test_the_fault_hook_is_one_rank_s_and_ignores_anything_else() -> None:
    assert forward.parse_fault("2:corrupt:1000", 2) == ("corrupt", 1000)
    assert forward.parse_fault("2:die:5", 2) == ("die", 5)
    assert forward.parse_fault("2:die:5", 1) is None
    for junk in ("", "x", "2:explode:5", "2:die", "-1:die:3", "2:die:5:6"):
        assert forward.parse_fault(junk, 2) is None


def test_the_corrupt_fault_on_a_middle_rank_is_caught_by_the_next_rank_only(tmp_path, monkeypatch):
    source, digest = source_file(tmp_path, 3_000_000)
    job = job_id()
    monkeypatch.setenv("SM_RELAY_FAULT", "1:corrupt:1500000")
    outcomes = run_ranks(tmp_path, source, 3, lambda r: make_plan(r, 3, job))
    # rank 1's own copy is intact; what it forwarded is not, and rank 2 says so.
    assert hashlib.sha256((tmp_path / "out1").read_bytes()).hexdigest() == digest
    assert isinstance(outcomes[2], HelperError)
    assert "rank 2" in message(outcomes[2]) and "rank 1 (node2)" in message(outcomes[2])
    assert isinstance(outcomes[0], HelperError)


# --------------------------------------------------------------------------------------------------
# Squatters: whatever holds a candidate port without the token costs a node seconds, never the job


def greet_then(answer: bytes) -> Callable[[socket.socket], None]:
    """A squatter that greets like a relay, reads the AUTH, then answers `answer` (unsigned)."""

    def reply(sock: socket.socket) -> None:
        sock.sendall(protocol.hello_line(auth.new_nonce()))
        sock.recv(1024)
        sock.sendall(answer + protocol.header_line("image"))

    return reply


SQUATTERS = {
    "silent": squatters.silent,
    "banner": squatters.banner,
    "deny": greet_then(b"DENY wrong token\n"),
    "forged-ok": greet_then(f"OK 0 {'e' * 64}\n".encode()),
}


@pytest.mark.parametrize("behaviour", ["silent", "banner", "deny", "forged-ok"])
def test_a_squatter_on_the_parents_first_port_is_skipped_and_named(tmp_path, behaviour):
    source, digest = source_file(tmp_path, 2_000_000)
    job, logs = job_id(), []
    ports = tree.relay_ports(0, 29500, job)
    with squatters.squatter(SQUATTERS[behaviour], ports[0]):
        # Both ranks' budgets are short: the old child gave up on the first DENY or bad OK (exit 2)
        # and sat out 10 s on a silent port, longer than this whole budget.
        outcomes = run_ranks(
            tmp_path, source, 2,
            lambda r: make_plan(r, 2, job, connect_timeout=8.0, log=logs.append if r else (lambda _m: None)),
        )  # fmt: skip
    assert all(isinstance(o, tree.Result) for o in outcomes.values()), outcomes
    assert hashlib.sha256((tmp_path / "out1").read_bytes()).hexdigest() == digest
    met = [line for line in logs if line.startswith("before our parent at ")]
    assert met and f"127.0.0.1:{ports[0]}" in met[0], logs
    expected = {"silent": "timed out", "banner": "not a relay", "deny": "refused us: wrong token",
                "forged-ok": "an OK without the job token's proof"}[behaviour]  # fmt: skip
    assert expected in met[0]


def test_idle_connections_to_a_parent_do_not_keep_its_child_out(tmp_path):
    """Three connections that never send AUTH, made before the real child: the parent greets
    them all at once and drops each after the proof timeout; its child is taken meanwhile."""
    source, digest = source_file(tmp_path, 1_000_000)
    job, logs = job_id(), []
    port = tree.relay_ports(0, 29500, job)[0]
    idle: list[socket.socket] = []
    outcomes: dict[int, object] = {}

    def parent() -> None:
        outcomes.update(run_ranks(tmp_path, source, 2, lambda r: make_plan(0, 2, job, connect_timeout=6.0,
                                                                          log=logs.append), [0]))  # fmt: skip

    first = threading.Thread(target=parent, daemon=True)
    first.start()
    deadline = time.monotonic() + 5
    while len(idle) < 3 and time.monotonic() < deadline:
        try:
            idle.append(socket.create_connection(("127.0.0.1", port)))
        except OSError:
            time.sleep(0.02)
    assert len(idle) == 3
    # The old parent handshook one connection at a time, 10 s each: 30 s before it read our child.
    outcomes.update(run_ranks(tmp_path, source, 2, lambda r: make_plan(1, 2, job, connect_timeout=6.0), [1]))
    first.join(10)
    for sock in idle:
        sock.close()
    assert isinstance(outcomes[0], tree.Result) and isinstance(outcomes[1], tree.Result), outcomes
    assert hashlib.sha256((tmp_path / "out1").read_bytes()).hexdigest() == digest


# --------------------------------------------------------------------------------------------------
# The loader (`relay recv -- CMD`): never sees a clean end of a stream that failed


def recv_with_loader(port: int, tmp_path: Path, loader: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """`relay recv` as the image stage runs it; by default its loader a script that marks a clean EOF."""
    loader = loader or ["sh", "-c", 'cat >"$1" && echo clean >"$1.eof"', "loader", str(tmp_path / "loaded")]
    env = {**os.environ, "PYTHONPATH": str(REPO / "py"), "SM_BARRIER_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "slurm_multi", "relay", "recv", "--rank", "1",
            "--parent-host", "127.0.0.1", "--nnodes", "2", "--port", str(port), "--count", "1",
            "--connect-timeout", "5"]  # fmt: skip
    return subprocess.run(
        [*argv, "--", *loader], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_cut_stream_never_reaches_the_loader_as_a_clean_end(tmp_path):
    payload = os.urandom(300_000)
    port, thread = fake_parent(lambda sock, out: sock.sendall(out.data(payload)))  # no trailer: cut
    proc = recv_with_loader(port, tmp_path)
    thread.join(5)
    assert proc.returncode == EXIT_FAILURE, proc.stderr
    assert (
        "ended after 300 kB of an unfinished stream" in proc.stderr
        and "sh stopped before the end" in proc.stderr
    )
    assert not (tmp_path / "loaded.eof").exists()  # the loader was killed, never saw an EOF
    assert payload.startswith((tmp_path / "loaded").read_bytes())


def test_a_verified_stream_ends_the_loader_cleanly_and_its_failure_is_ours(tmp_path):
    payload = os.urandom(300_000)

    def whole(sock: socket.socket, out: Speaker) -> None:
        sock.sendall(out.data(payload) + out.trailer())
        time.sleep(1)

    port, thread = fake_parent(whole)
    proc = recv_with_loader(port, tmp_path)
    thread.join(5)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "loaded").read_bytes() == payload and (tmp_path / "loaded.eof").exists()
    # A loader that fails on a verified stream fails the relay, naming it.
    port, thread = fake_parent(whole)
    proc = recv_with_loader(port, tmp_path, ["sh", "-c", "cat >/dev/null; exit 4"])
    thread.join(5)
    assert (
        proc.returncode == EXIT_FAILURE
        and "was verified, but sh -c" in proc.stderr
        and "exited 4" in proc.stderr
    )


def test_the_stats_file_holds_the_verified_bytes_and_seconds(tmp_path):
    """--stats-file, read by the image stage (lib/image.sh) for the timeline: `<bytes> <seconds>`."""
    path = tmp_path / "relay.stats"
    load.write_stats(str(path), tree.Result(total=812_000_000, digest="ab" * 32, seconds=2.34567, nodes=3))
    assert path.read_text() == "812000000 2.346\n"
    load.write_stats(None, tree.Result(1, "", 1.0, 1))  # no --stats-file: nothing written anywhere
    assert [p.name for p in tmp_path.iterdir()] == ["relay.stats"]
