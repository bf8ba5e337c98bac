"""The TCP barrier: port derivation, strict parsing, the challenge-response, and a real server on
127.0.0.1 under abuse."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import listening
import squatters
from slurm_multi import auth, barrier, barrier_cli, dockerapi, net, wire, words
from slurm_multi.barrier import BarrierAborted, BarrierServer, format_ranks, join
from slurm_multi.common import HelperError
from slurm_multi.net import choose_bind_address, derive_ports
from slurm_multi.wire import ProtocolError, parse_challenge, parse_line, parse_reply

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-" + secrets.token_hex(8)
LOOPBACK = "127.0.0.1"


# --------------------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def running_barrier(nnodes: int, timeout: float = 20.0, **kwargs: object) -> Iterator[SimpleNamespace]:
    """A BarrierServer on 127.0.0.1 (kernel-chosen port) serving in a thread; logs captured."""
    logs: list[str] = []
    server = BarrierServer(TOKEN, nnodes, LOOPBACK, [0], log=logs.append, **kwargs)  # type: ignore[arg-type]
    box: dict[str, object] = {}

    def run() -> None:
        box["outcome"] = server.serve(until=time.monotonic() + timeout)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def outcome(wait: float = 5.0) -> barrier.Outcome:
        thread.join(wait)
        assert not thread.is_alive(), "server did not finish"
        return box["outcome"]  # type: ignore[return-value]

    handle = SimpleNamespace(server=server, port=server.port, logs=logs, outcome=outcome, thread=thread)
    try:
        yield handle
    finally:
        server.request_stop()
        thread.join(5)
        assert TOKEN not in "\n".join(logs)


def connect(port: int) -> socket.socket:
    """A raw connection: rank 0's CHALLENGE waits unread on it."""
    return socket.create_connection((LOOPBACK, port), timeout=5)


@dataclass
class Conn:
    """A connection whose CHALLENGE was read: what a client knows to sign and to check replies."""

    sock: socket.socket
    challenge: str
    nonce: str = ""
    buf: bytes = b""  # what arrived after the last line read
    waits: int = 0  # rank 0's signed WAIT acks read (and checked) so far

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def greeted(port: int) -> Conn:
    """Connect and read rank 0's greeting, which must be `CHALLENGE <32 hex>`."""
    sock = connect(port)
    return Conn(sock, parse_challenge(read_line(sock)))


def signed(verb: str, rest: str, challenge: str, nonce: str, token: str = TOKEN) -> str:
    """`verb <mac> <nonce> rest` as docs/barrier.md spells it, written out independently of
    barrier.py: the MAC covers READY's rank and phase (`start` when left out), or the whole rest."""
    fields = rest.split(" ") if verb == "READY" else [rest]
    if verb == "READY" and len(fields) == 1:
        fields.append("start")
    tag = auth.mac(token, "to-rank0", verb, challenge, nonce, *fields)
    return f"{verb} {tag} {nonce} {rest}"


def ready(port: int, rank: int | str, phase: str | None = None, token: str = TOKEN) -> Conn:
    conn = greeted(port)
    conn.nonce = auth.new_nonce()
    rest = f"{rank}{' ' + phase if phase else ''}"
    conn.sendall(signed("READY", rest, conn.challenge, conn.nonce, token).encode() + b"\n")
    return conn


def _next_line(raw: socket.socket, buf: bytes, timeout: float) -> tuple[str | None, bytes]:
    """(one line without its newline, what is left); None with what arrived when the server closed."""
    raw.settimeout(timeout)
    while b"\n" not in buf:
        try:
            chunk = raw.recv(512)
        except ConnectionResetError:
            return None, b""
        if not chunk:
            return None, buf
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    return line.decode(), rest


def read_line(sock: socket.socket | Conn, timeout: float = 5.0) -> str:
    """One reply line without its newline; '' when the server closed without one. On a Conn, a
    GO/ABORT/OK must carry rank 0's MAC over our nonces, and is shown without it (`GO 1 sha256:x`);
    rank 0's WAIT acknowledgement (checked the same way) is counted and skipped."""
    if not isinstance(sock, Conn):
        line, rest = _next_line(sock, b"", timeout)
        return rest.decode() if line is None else line
    while True:
        line, sock.buf = _next_line(sock.sock, sock.buf, timeout)
        if line is None:
            return sock.buf.decode()
        if line.split(" ")[0] not in ("GO", "ABORT", "OK", "WAIT"):
            return line
        parse_reply(line, TOKEN, sock.challenge, sock.nonce)  # ProtocolError unless rank 0 signed it
        if line.startswith("WAIT "):
            sock.waits += 1
            continue
        verb, _, rest = line.partition(" ")
        return " ".join([verb, *rest.split(" ", 1)[1:]])


def silent_for(sock: socket.socket | Conn, seconds: float) -> bool:
    """True when nothing (not even EOF) arrives within `seconds` (on a Conn: but rank 0's WAIT)."""
    raw = sock.sock if isinstance(sock, Conn) else sock
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        raw.settimeout(left)
        try:
            chunk = raw.recv(512)
        except (socket.timeout, TimeoutError):
            return True
        if not isinstance(sock, Conn) or not chunk:
            return False
        sock.buf += chunk
        while b"\n" in sock.buf:
            line, _, sock.buf = sock.buf.partition(b"\n")
            if not line.startswith(b"WAIT "):
                sock.buf = line + b"\n" + sock.buf
                return False
            parse_reply(line, TOKEN, sock.challenge, sock.nonce)
            sock.waits += 1
    return True


def wait_for(predicate, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def logged(handle: SimpleNamespace, text: str) -> bool:
    return any(text in line for line in handle.logs)


def control_line(port: int, verb: str, rest: str) -> str:
    """What a controller gets for `RELEASE <image-id>` or `ABORT <reason>` (MAC checked, left out)."""
    with greeted(port) as conn:
        conn.nonce = auth.new_nonce()
        conn.sendall(signed(verb, rest, conn.challenge, conn.nonce).encode() + b"\n")
        return read_line(conn)


@contextlib.contextmanager
def impostor(*answers: Callable[[str, wire.Message], bytes | None]) -> Iterator[SimpleNamespace]:
    """A fake rank 0 on 127.0.0.1. For each answer in turn it accepts one connection, greets it with
    a fresh CHALLENGE, reads the client's line (checked with the real token: the client is genuine)
    and sends `answer(challenge, message)`, or closes without a word for None."""
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(10)
    seen: list[tuple[str, wire.Message]] = []

    def run() -> None:
        for answer in answers:
            sock, _ = listener.accept()
            with sock:
                challenge = auth.new_nonce()
                sock.sendall(wire.challenge_line(challenge))
                line = read_line(sock)
                message = parse_line(line.encode(), TOKEN, 4, challenge)
                seen.append((line, message))
                out = answer(challenge, message)
                if out:
                    sock.sendall(out)
                    read_line(sock)  # until the client hangs up

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield SimpleNamespace(port=listener.getsockname()[1], seen=seen)
    finally:
        thread.join(10)
        listener.close()


class RecordingProxy:
    """A TCP relay on 127.0.0.1 in front of `target` that keeps every byte either side sends: what
    a packet capture between the nodes would see, without needing one."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.wire = bytearray()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.listener = socket.create_server((LOOPBACK, 0))
        self.port = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                upstream = socket.create_connection((LOOPBACK, self.target), timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            self._socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(4096):
                with self._lock:
                    self.wire += chunk
                dst.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)  # pass the half-close on: rank 0 drains until EOF

    def close(self) -> None:
        listening.stop(self.listener, self._thread)
        for sock in self._socks:
            sock.close()


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on (bound then released; nothing else on a test box takes them)."""
    socks = [socket.socket() for _ in range(count)]
    for sock in socks:
        sock.bind((LOOPBACK, 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "SM_BARRIER_PORT")}
    env.update(SM_BARRIER_TOKEN=TOKEN, PYTHONPATH=str(REPO / "py"))
    env.update(extra)
    return env


def slurm_multi(command: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `slurm-multi <command> <extra…>` (command split on spaces) to completion."""
    return subprocess.run(
        [sys.executable, "-m", "slurm_multi", *command.split(), *extra],
        env=env or cli_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )


def spawn(command: str, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "slurm_multi", *command.split(), *extra],
        env=env or cli_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready_file(path: Path, proc: subprocess.Popen) -> int:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    address, port = path.read_text().split()
    assert address == LOOPBACK
    return int(port)


# --------------------------------------------------------------------------------------------------
# ports

RANGES = [(32768, 60999), (32768, 65535), (15000, 65000), (10500, 60000), (2000, 64999), (40000, 50000)]


@pytest.mark.parametrize("local_range", RANGES)
def test_derived_ports_are_deterministic_and_avoid_the_ephemeral_range(local_range: tuple[int, int]) -> None:
    lo, hi = local_range
    ports = derive_ports(29500, 4242, local_range, 4)
    assert ports == derive_ports(29500, 4242, local_range, 4)
    assert len(set(ports)) == 4
    assert all(1024 <= p <= 65535 and not lo <= p <= hi for p in ports)
    assert derive_ports(29500, 4243, local_range, 4) != ports


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 65535),
    st.integers(0, 2**32),
    st.integers(1024, 65535).flatmap(lambda lo: st.tuples(st.just(lo), st.integers(lo, 65535))),
    st.integers(1, 32),
)
def test_derived_ports_never_land_in_the_ephemeral_range(
    master_port: int, job_id: int, local_range: tuple[int, int], count: int
) -> None:
    lo, hi = local_range
    try:
        ports = derive_ports(master_port, job_id, local_range, count)
    except ValueError:
        assert lo - 1024 < 64 and 65535 - hi < 64  # only when the range leaves no usable gap
        return
    assert len(ports) == len(set(ports)) == count
    assert all(1024 <= p <= 65535 and not lo <= p <= hi and p != master_port for p in ports)


def test_derived_ports_skip_master_port_itself() -> None:
    start, end = net.port_window((32768, 60999))
    master_port = 12345
    job_id = (master_port - start - master_port * 1000003) % (end - start)  # base lands on MASTER_PORT
    ports = derive_ports(master_port, job_id, (32768, 60999), 4)
    assert master_port not in ports
    assert ports == [12346, 12347, 12348, 12349]


def test_common_ranges_agree_so_nodes_with_different_sysctls_still_meet() -> None:
    assert derive_ports(29500, 7, (32768, 60999)) == derive_ports(29500, 7, (32768, 65535))
    assert derive_ports(29500, 7, (32768, 60999)) == derive_ports(29500, 7, (40000, 60999))


def test_override_and_explicit_ports() -> None:
    assert net.override_ports(20000, 4) == [20000, 20001, 20002, 20003]
    assert net.override_ports(65535, 3) == [65535, 1024, 1025]
    assert net.candidate_ports((5000, 5001), 29500, 1, 20000, 4) == [5000, 5001]
    assert net.candidate_ports((), 29500, 1, 20000, 2) == [20000, 20001]
    with pytest.raises(HelperError) as err:
        net.candidate_ports((), None, None, None, 4)
    assert err.value.exit_code == 2


def test_local_port_range_is_read_not_assumed(tmp_path: Path) -> None:
    good = tmp_path / "range"
    good.write_text("15000\t65000\n")
    assert net.read_local_port_range(str(good)) == (15000, 65000)
    garbage = tmp_path / "garbage"
    garbage.write_text("nope\n")
    assert net.read_local_port_range(str(garbage)) == (32768, 60999)
    assert net.read_local_port_range(str(tmp_path / "missing")) == (32768, 60999)


def test_port_command_prints_the_candidates_one_per_line() -> None:
    runner = CliRunner()
    env = {"MASTER_PORT": None, "SLURM_JOB_ID": None, "SM_BARRIER_PORT": None}
    result = runner.invoke(barrier_cli.cli, ["port", "--master-port", "29500", "--job-id", "4242"], env=env)
    assert result.exit_code == 0, result.output
    expected = derive_ports(29500, 4242, net.read_local_port_range(), 4)
    assert result.output.split() == [str(p) for p in expected]
    result = runner.invoke(barrier_cli.cli, ["port", "--count", "2"], env={**env, "SM_BARRIER_PORT": "21000"})
    assert result.output.split() == ["21000", "21001"]
    result = runner.invoke(barrier_cli.cli, ["port"], env=env)
    assert result.exit_code == 2


# --------------------------------------------------------------------------------------------------
# parsing

# One connection's nonces: rank 0's challenge S and the client's C.
S, C = auth.new_nonce(), auth.new_nonce()


def from_template(template: str, challenge: str = S) -> bytes:
    """`{sig}` becomes `<mac> <C>` signed over what follows it, `{t}` the token itself."""
    template = template.replace("{t}", TOKEN)
    if "{sig}" not in template:
        return template.encode()
    head, tail = template.split("{sig}", 1)
    verb, rest = head.split(" ")[0], tail.removeprefix(" ").rstrip("\r\n")
    tag = signed(verb, rest, challenge, C).split(" ")[1]
    return f"{head}{tag} {C}{tail}".encode()


VALID = [
    ("READY {sig} 1", ("READY", 1, "start")),
    ("READY {sig} 3", ("READY", 3, "start")),
    ("READY {sig} 2 image", ("READY", 2, "image")),
    ("READY {sig} 2 start\r\n", ("READY", 2, "start")),
    ("READY {sig} 1\n", ("READY", 1, "start")),
]
REJECTED = [
    ("", "empty line"),
    ("\n", "empty line"),
    ("READY {sig} 0", "rank out of range 1..3"),
    ("READY {sig} 4", "rank out of range 1..3"),
    ("READY {sig} 99999999999999999999", "bad rank"),
    ("READY {sig} +1", "bad rank"),
    ("READY {sig} -1", "bad rank"),
    ("READY {sig} 01", "bad rank"),  # leading zeros are refused: bash would read 010 as octal
    ("READY {sig}  1", "bad rank"),
    ("READY {sig} 1 ", "bad phase"),
    ("READY {sig} １", "bad rank"),  # fullwidth digit one
    ("READY {sig} ١", "bad rank"),  # arabic-indic digit one
    ("READY {sig} 1e0", "bad rank"),
    ("READY {sig} 0x1", "bad rank"),
    ("READY {sig} ", "bad rank"),
    ("READY {sig} 1 later", "bad phase"),
    ("READY {sig} 1 start extra", "bad held image id"),  # only an image READY says what it holds
    ("READY {sig} 1 image sha256:" + "a" * 63, "bad held image id"),
    ("READY {sig} 1 image sha256:" + "A" * 64, "bad held image id"),
    ("READY {sig} 1 image toy/model:local", "bad held image id"),  # an ID, never a name
    ("READY {sig} 1 image sha256:" + "a" * 64 + " x", "bad cache id"),
    ("READY {sig} 1 image sha256:" + "a" * 64 + " cache:" + "a" * 15, "bad cache id"),
    ("READY {sig} 1 image - cache:" + "A" * 16, "bad cache id"),
    ("READY {sig} 1 image - cache:" + "a" * 16 + " x", "bad layer prefix"),
    ("READY {sig} 1 image - - layers:2:abcdefabcdef x", "malformed READY"),
    ("READY {sig} 1 image - - layers:2", "bad layer prefix"),  # a claim names the chain ID it ends at
    ("READY {sig} 1 image - - layers:0:abcdefabcdef", "bad layer prefix"),
    ("READY {sig} 1 image - - layers:02:abcdefabcdef", "bad layer prefix"),
    ("READY {sig} 1 image - - layers:2:ABCDEFABCDEF", "bad layer prefix"),
    ("READY {sig} 1 image - - held:2:abcdefabcdef", "bad layer prefix"),
    ("READY {sig} 1 image - x layers:0", "bad cache id"),
    ("READY {sig} 1 start - - layers:0", "bad held image id"),
    ("READY {sig} 1 image -", "bad held image id"),  # `-` only holds the place of a cache field
    ("READY {sig} 1 start - cache:" + "a" * 16, "bad held image id"),
    ("READY {sig}\t1", "unprintable character"),
    ("READY {sig} 1\x00", "unprintable character"),
    ("READY {t} 1", "bad token"),  # the old clear-text token is no MAC
    ("READY {t} " + C + " 1", "bad token"),
    ("READY " + "0" * 64 + " " + C + " 1", "bad token"),
    ("READY wrong 1", "bad token"),
    ("READY {sig}x 1", "bad token"),  # the nonce is not 32 hex any more
    ("READY  {sig} 1", "bad token"),
    ("READY", "bad token"),
    ("ready {sig} 1", "unknown command"),
    ("GO {sig} 1 sha256:abc", "unknown command"),
    ("CHALLENGE " + S, "unknown command"),
    ("RELEASE {sig}", "bad image id"),
    ("RELEASE {sig} a b", "bad image id"),
    ("RELEASE {sig} -rf", "bad image id"),
    # A controller's RELEASE or ABORT whose MAC is not the token's is refused like a READY's.
    ("RELEASE wrong " + C + " sha256:abc", "bad token"),
    ("RELEASE " + "0" * 64 + " " + C + " sha256:abc", "bad token"),
    ("RELEASE {t} " + C + " sha256:abc", "bad token"),
    ("ABORT " + "0" * 64 + " " + C + " disk full", "bad token"),
    ("ABORT wrong " + C + " disk full", "bad token"),
    ("ABORT {sig}x disk full", "bad token"),
    ("READY {sig} " + "1" * 300, "line too long"),
]


@pytest.mark.parametrize(("line", "expected"), VALID)
def test_parse_line_accepts(line: str, expected: tuple[str, int, str]) -> None:
    msg = parse_line(from_template(line), TOKEN, 4, S)
    assert (msg.kind, msg.rank, msg.phase, msg.nonce) == (*expected, C)


@pytest.mark.parametrize(("line", "reason"), REJECTED)
def test_parse_line_rejects(line: str, reason: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_line(from_template(line), TOKEN, 4, S)
    assert str(err.value) == reason
    assert TOKEN not in str(err.value)


def test_a_line_signed_for_another_challenge_or_with_another_token_is_a_bad_token() -> None:
    for line in (from_template("READY {sig} 1", challenge=auth.new_nonce()),  # a replay
                 signed("READY", "1", S, C, token="not-the-token").encode(),
                 signed("READY", "1", S, C, token=TOKEN + "x").encode(),
                 signed("READY", "1", S, "xyz").encode(),  # a MAC over a nonce that is none
                 signed("READY", "1", S, C.upper()).encode()):  # fmt: skip
        with pytest.raises(ProtocolError, match="^bad token$"):
            parse_line(line, TOKEN, 2, S)


def test_the_mac_is_hmac_sha256_over_the_documented_fields() -> None:
    # Pinned, so that a bash or C client written from docs/barrier.md interoperates.
    s, c = "a" * 32, "b" * 32

    def hmac_hex(message: str) -> str:
        return hmac.new(b"k3y", message.encode(), hashlib.sha256).hexdigest()

    ready_mac = hmac_hex(f"to-rank0|READY|{s}|{c}|1|start")
    assert (
        wire.request_line("k3y", "READY", s, c, "1", "start") == f"READY {ready_mac} {c} 1 start\n".encode()
    )
    go_mac = hmac_hex(f"from-rank0|GO|{s}|{c}|1|sha256:abc")
    assert wire.reply_line("k3y", "GO", s, c, "1", "sha256:abc") == f"GO {go_mac} 1 sha256:abc\n".encode()
    assert wire.reply_line("k3y", "OK", s, c) == f"OK {hmac_hex(f'from-rank0|OK|{s}|{c}')}\n".encode()
    assert wire.challenge_line(s) == f"CHALLENGE {s}\n".encode()


def test_an_image_ready_says_which_image_id_the_worker_holds_under_the_mac() -> None:
    held = "sha256:" + "0123456789abcdef" * 4
    msg = parse_line(from_template(f"READY {{sig}} 2 image {held}"), TOKEN, 4, S)
    assert (msg.kind, msg.rank, msg.phase, msg.holds) == ("READY", 2, "image", held)
    assert parse_line(from_template("READY {sig} 2 image"), TOKEN, 4, S).holds == ""
    # The held ID is signed: another one in its place is a bad token.
    line = from_template(f"READY {{sig}} 2 image {held}").decode().replace(held, "sha256:" + "f" * 64)
    with pytest.raises(ProtocolError, match="bad token"):
        parse_line(line.encode(), TOKEN, 4, S)
    assert wire.request_line(TOKEN, "READY", S, C, "2", "image", held) == from_template(
        f"READY {{sig}} 2 image {held}\n"
    )


def test_an_image_ready_says_what_the_worker_sees_in_the_cache_under_the_mac() -> None:
    held, seen = "sha256:" + "0123456789abcdef" * 4, "fedcba9876543210"
    msg = parse_line(from_template(f"READY {{sig}} 2 image - cache:{seen}"), TOKEN, 4, S)
    assert (msg.rank, msg.phase, msg.holds, msg.cache) == (2, "image", "", seen)
    both = parse_line(from_template(f"READY {{sig}} 2 image {held} cache:{seen}"), TOKEN, 4, S)
    assert (both.holds, both.cache) == (held, seen)
    line = from_template(f"READY {{sig}} 2 image - cache:{seen}").decode().replace(seen, "0" * 16)
    with pytest.raises(ProtocolError, match="bad token"):
        parse_line(line.encode(), TOKEN, 4, S)
    # The longest READY (a 9-digit rank, a held ID and the cache's) fits one line.
    longest = wire.request_line(TOKEN, "READY", S, C, "123456789", "image", held, f"cache:{seen}")
    assert len(longest) <= wire.MAX_LINE


def test_parse_line_controller_messages() -> None:
    assert parse_line(from_template("RELEASE {sig} sha256:abc"), TOKEN, 2, S).image_id == "sha256:abc"
    assert (
        parse_line(from_template("ABORT {sig} disk full on node0"), TOKEN, 2, S).reason
        == "disk full on node0"
    )
    assert parse_line(from_template("ABORT {sig}"), TOKEN, 2, S).reason == "no reason given"
    with pytest.raises(ProtocolError, match="not UTF-8"):
        parse_line(b"READY \xff\xfe 1", TOKEN, 2, S)


def test_a_signed_line_never_outgrows_max_line() -> None:
    reason = "é" * 300  # multi-byte characters are cut whole, then signed as cut
    for line in (
        wire.request_line(TOKEN, "ABORT", S, C, reason),
        wire.reply_line(TOKEN, "ABORT", S, C, reason),
    ):
        assert len(line) <= wire.MAX_LINE
    assert parse_line(wire.request_line(TOKEN, "ABORT", S, C, reason), TOKEN, 2, S).reason.startswith("éé")
    image_id = "r/" + "x" * (wire.RELEASE_ID_MAX - 2)
    assert parse_line(wire.request_line(TOKEN, "RELEASE", S, C, image_id), TOKEN, 2, S).image_id == image_id
    with pytest.raises(ValueError):
        wire.request_line(TOKEN, "RELEASE", S, C, image_id + "x")  # never cut: a wrong ID is worse
    longest = "r/" + "x" * 158  # the longest image ID still fits GO
    assert parse_reply(wire.reply_line(TOKEN, "GO", S, C, "99999", longest), TOKEN, S, C).image_id == longest


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(1, 10))
def test_random_bytes_never_crash_the_parser(data: bytes, nnodes: int) -> None:
    for line in (data, f"READY {'0' * 64} {C} ".encode() + data):
        try:
            msg = parse_line(line, TOKEN, nnodes, S)
        except ProtocolError:
            continue
        if msg.kind == "READY":
            assert 1 <= msg.rank < nnodes


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12), st.integers(2, 50))
def test_only_plain_ascii_decimal_ranks_in_range_are_accepted(rank_text: str, nnodes: int) -> None:
    try:
        msg = parse_line(signed("READY", rank_text, S, C), TOKEN, nnodes, S)
    except ProtocolError:
        return
    assert rank_text.isascii() and rank_text.isdigit() and str(msg.rank) == rank_text
    assert 1 <= msg.rank < nnodes


def test_parse_reply_checks_rank0s_mac_and_never_repeats_the_token() -> None:
    go = wire.reply_line(TOKEN, "GO", S, C, "2", "sha256:abc")
    assert parse_reply(go, TOKEN, S, C) == wire.Reply("GO", 2, "sha256:abc")
    assert (
        parse_reply(wire.reply_line(TOKEN, "ABORT", S, C, "build failed"), TOKEN, S, C).reason
        == "build failed"
    )
    assert parse_reply(wire.reply_line(TOKEN, "OK", S, C), TOKEN, S, C).kind == "OK"
    assert TOKEN not in parse_reply(f"ERR weird {TOKEN}", TOKEN, S, C).reason
    request_mac = auth.mac(TOKEN, "to-rank0", "ABORT", S, C, "stop")
    forged = [
        wire.reply_line("other-token", "GO", S, C, "2", "sha256:abc"),
        wire.reply_line(TOKEN, "GO", S, auth.new_nonce(), "2", "sha256:abc"),  # another client's GO
        wire.reply_line(TOKEN, "GO", auth.new_nonce(), C, "2", "sha256:abc"),
        go.replace(b"sha256:abc", b"sha256:bad"),  # the image ID is inside the MAC
        f"ABORT {request_mac} stop",  # a signed request is never a reply
        f"GO {TOKEN} 2 sha256:abc",  # the old protocol
        "OK",
        "HTTP/1.1 400 Bad Request",
    ]
    for line in forged:
        with pytest.raises(ProtocolError):
            parse_reply(line, TOKEN, S, C)


def test_a_greeting_other_than_a_challenge_is_not_our_barrier() -> None:
    assert parse_challenge(f"CHALLENGE {S}\r\n") == S
    for line in (
        "SSH-2.0-OpenSSH_9.6",
        f"CHALLENGE {S.upper()}",
        "CHALLENGE",
        f"CHALLENGE {S} x",
        "ERR busy",
    ):
        with pytest.raises(ProtocolError, match="no challenge"):
            parse_challenge(line)


def test_format_ranks_compresses_runs() -> None:
    assert format_ranks([2, 5]) == "2,5"
    assert format_ranks([1, 2, 3, 5, 7, 8]) == "1-3,5,7,8"
    assert format_ranks([]) == "none"


# --------------------------------------------------------------------------------------------------
# bind address


def test_name_resolving_to_loopback_binds_a_routable_address_instead() -> None:
    choice = choose_bind_address(
        "node1", resolve=lambda host: ["127.0.1.1"], routable=lambda: ("10.1.2.3", "eth0, default route")
    )
    assert choice.address == "10.1.2.3"
    assert (
        choice.why
        == "node1 resolves to 127.0.1.1 (loopback); listening on 10.1.2.3 (eth0, default route) instead"
    )


def test_first_non_loopback_address_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def fake_getaddrinfo(host: str, port: object, family: int = 0, *rest: object) -> list:
        seen.append(family)
        return [(family, 1, 6, "", (a, 0)) for a in ("127.0.1.1", "10.0.0.5", "10.0.0.6")]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    choice = choose_bind_address("node1", routable=lambda: pytest.fail("must not be needed"))
    assert choice == ("10.0.0.5", "")
    assert seen == [socket.AF_INET]  # IPv4 only: a fe80:: first answer must not win


def test_unresolvable_name_also_falls_back_to_a_routable_address() -> None:
    def broken(host: str) -> list[str]:
        raise socket.gaierror(-2, "Name or service not known")

    choice = choose_bind_address("ghost", resolve=broken, routable=lambda: ("10.9.9.9", "ib0"))
    assert choice.address == "10.9.9.9"
    assert "ghost does not resolve" in choice.why


def test_default_route_interface_is_read_from_proc_net_route(tmp_path: Path) -> None:
    route = tmp_path / "route"
    route.write_text(
        "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"
        "eth1\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        "ib0\t00000000\t010011AC\t0003\t0\t0\t200\t00000000\t0\t0\t0\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    )
    assert net._default_route_interfaces(str(route)) == ["eth0", "ib0"]


# --------------------------------------------------------------------------------------------------
# server behaviour


def test_all_workers_get_go_with_the_released_image_id() -> None:
    with running_barrier(4) as b:
        workers = {rank: ready(b.port, rank) for rank in (1, 2, 3)}
        wait_for(lambda: logged(b, "rank 3 ready"))
        assert silent_for(workers[1], 0.2)  # all ranks there, but no image yet
        # ...and each READY was acknowledged at once with rank 0's signed WAIT.
        assert all(silent_for(w, 0.05) and w.waits == 1 for w in workers.values())
        assert control_line(b.port, "RELEASE", "sha256:abc") == "OK"
        for rank, sock in workers.items():
            assert read_line(sock) == f"GO {rank} sha256:abc"
        assert b.outcome().exit_code == 0


def test_no_early_release_while_a_rank_is_missing() -> None:
    with running_barrier(4, image_id="sha256:abc") as b:
        first = [ready(b.port, 1), ready(b.port, 2)]
        assert all(silent_for(sock, 0.3) for sock in first)
        last = ready(b.port, 3)
        assert read_line(last) == "GO 3 sha256:abc"
        assert [read_line(s) for s in first] == ["GO 1 sha256:abc", "GO 2 sha256:abc"]


def test_image_phase_is_answered_as_soon_as_the_image_is_released() -> None:
    with running_barrier(3) as b:
        early_image = ready(b.port, 2, "image")
        start1 = ready(b.port, 1, "start")
        wait_for(lambda: logged(b, "rank 1 ready (start)"))
        assert control_line(b.port, "RELEASE", "toy/model:local") == "OK"
        assert read_line(early_image) == "GO 2 toy/model:local"
        late_image = ready(b.port, 1, "image")
        assert read_line(late_image, 2) == "GO 1 toy/model:local"
        assert silent_for(start1, 0.2)  # rank 2 has not said `start` yet
        start2 = ready(b.port, 2)
        assert read_line(start1) == "GO 1 toy/model:local"
        assert read_line(start2) == "GO 2 toy/model:local"
        assert b.outcome().exit_code == 0


@contextlib.contextmanager
def holds_file(path: Path) -> Iterator[int]:
    """The O_APPEND fd serve --holds-file opens."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        yield fd
    finally:
        os.close(fd)


def test_what_each_worker_holds_is_appended_to_the_holds_file_until_the_release(tmp_path: Path) -> None:
    held = "sha256:" + "ab" * 32
    path = tmp_path / "barrier.holds"
    with holds_file(path) as fd, running_barrier(4, holds_fd=fd) as b:
        one = ready(b.port, 1, f"image {held}")
        two = ready(b.port, 2, "image")  # an old worker, or one that holds nothing
        three = ready(b.port, 3, "start")  # a start READY says nothing of images
        wait_for(lambda: logged(b, "rank 3 ready (start)") and path.read_text().count("\n") == 2)
        assert sorted(path.read_text().splitlines()) == [f"1 {held} -", "2 - -"]
        again = ready(b.port, 1, f"image - cache:{held[7:23]}")  # reconnects: its last word counts (node.sh)
        wait_for(lambda: path.read_text().count("\n") == 3)
        assert path.read_text().splitlines()[-1] == f"1 - {held[7:23]}"
        assert control_line(b.port, "RELEASE", held) == "OK"
        assert read_line(again) == f"GO 1 {held}" and read_line(two) == f"GO 2 {held}"
        late = ready(b.port, 2, f"image {held}")  # after the release nothing is recorded
        assert read_line(late) == f"GO 2 {held}"
        assert path.read_text().count("\n") == 3
        for conn in (one, three):
            conn.close()


def test_join_tells_rank_0_the_id_its_docker_engine_has_of_the_image(tmp_path: Path) -> None:
    held = "sha256:" + "cd" * 32
    sock_path = tmp_path / "docker.sock"
    asked: list[bytes] = []
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    server.listen(4)

    def engine() -> None:  # dockerd's answer to GET /images/<ref>/json, HTTP/1.0: close at the end
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                request = conn.recv(4096)
                asked.append(request.split(b"\r\n", 1)[0])
                found = b"/images/toy/model:local/json" in request
                body = json.dumps({"Id": held, "RepoTags": ["toy/model:local"]}).encode() if found else b"{}"
                status = b"200 OK" if found else b"404 Not Found"
                conn.sendall(b"HTTP/1.0 " + status + b"\r\nContent-Type: application/json\r\n\r\n" + body)

    thread = threading.Thread(target=engine, daemon=True)
    thread.start()
    env = {"DOCKER_HOST": f"unix://{sock_path}"}
    try:
        assert dockerapi.image_id(env, "toy/model:local") == held
        assert dockerapi.image_id(env, "other:tag") == ""
    finally:
        thread.join(5)
        server.close()
    assert asked == [b"GET /images/toy/model:local/json HTTP/1.0", b"GET /images/other:tag/json HTTP/1.0"]
    assert dockerapi.image_id({"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}, "toy/model:local") == ""
    assert dockerapi.image_id({"DOCKER_HOST": "tcp://127.0.0.1:1"}, "toy/model:local") == ""
    with running_barrier(2) as b:
        box: dict[str, str] = {}
        worker = threading.Thread(
            target=lambda: box.update(
                id=join(
                    LOOPBACK, [b.port], TOKEN, 1, phase="image", holds=held, connect_timeout=5, wait_timeout=5
                )
            ),  # fmt: skip
            daemon=True,
        )
        worker.start()
        wait_for(lambda: logged(b, "rank 1 ready (image)"))
        assert control_line(b.port, "RELEASE", held) == "OK"
        worker.join(5)
        assert box == {"id": held}
    with pytest.raises(HelperError, match="not an image ID"):
        join(LOOPBACK, [1], TOKEN, 1, phase="start", holds=held, connect_timeout=0.1)
    with pytest.raises(HelperError, match="not an image ID"):
        join(LOOPBACK, [1], TOKEN, 1, phase="image", cache="toy/model:local", connect_timeout=0.1)


def test_join_tells_rank_0_what_it_sees_in_the_cache(tmp_path: Path) -> None:
    seen = "sha256:" + "ef" * 32
    path = tmp_path / "barrier.holds"
    with holds_file(path) as fd, running_barrier(2, holds_fd=fd) as b:
        box: dict[str, str] = {}
        worker = threading.Thread(
            target=lambda: box.update(
                id=join(
                    LOOPBACK, [b.port], TOKEN, 1, phase="image", cache=seen, connect_timeout=5, wait_timeout=5
                )
            ),  # fmt: skip
            daemon=True,
        )
        worker.start()
        wait_for(lambda: path.read_text().count("\n") == 1)
        assert path.read_text() == f"1 - {seen[7:23]}\n"
        assert control_line(b.port, "RELEASE", seen) == "OK"
        worker.join(5)
        assert box == {"id": seen}


def test_wrong_token_gets_err_and_never_counts() -> None:
    with running_barrier(2, image_id="sha256:abc") as b:
        intruder = ready(b.port, 1, token="not-the-token")
        assert read_line(intruder) == "ERR bad token"
        assert read_line(intruder) == ""  # closed
        assert b.thread.is_alive()
        assert any("rejected 127.0.0.1:" in line and "bad token" in line for line in b.logs)
        assert read_line(ready(b.port, 1)) == "GO 1 sha256:abc"


def test_rank_out_of_range_and_garbage_are_rejected_without_stalling() -> None:
    with running_barrier(3, image_id="sha256:abc") as b:
        assert read_line(ready(b.port, 3)) == "ERR rank out of range 1..2"
        assert read_line(ready(b.port, 0)) == "ERR rank out of range 1..2"
        assert read_line(ready(b.port, "01")) == "ERR bad rank"
        for junk in (b"\xff\xfe\x00garbage\n", b"GET / HTTP/1.1\r\n", os.urandom(200) + b"\n"):
            with greeted(b.port) as sock:
                sock.sendall(junk)
                assert read_line(sock).startswith("ERR ")
        workers = [ready(b.port, 1), ready(b.port, 2)]
        assert [read_line(s) for s in workers] == ["GO 1 sha256:abc", "GO 2 sha256:abc"]


def test_duplicate_rank_replaces_the_older_connection() -> None:
    with running_barrier(3, image_id="sha256:abc") as b:
        older = ready(b.port, 1)
        wait_for(lambda: logged(b, "rank 1 ready"))
        newer = ready(b.port, 1)
        assert read_line(older) == ""  # closed by rank 0
        assert any("reconnected" in line for line in b.logs)
        rank2 = ready(b.port, 2)
        assert read_line(newer) == "GO 1 sha256:abc"
        assert read_line(rank2) == "GO 2 sha256:abc"


def test_client_that_disconnects_stops_counting() -> None:
    with running_barrier(3, image_id="sha256:abc") as b:
        with greeted(b.port) as half:  # dies mid-line
            half.sendall(signed("READY", "1", half.challenge, auth.new_nonce()).encode()[:80])
        ready(b.port, 1).close()  # said READY, then went away before GO
        wait_for(lambda: logged(b, "disconnected before GO"))
        rank2 = ready(b.port, 2)
        assert silent_for(rank2, 0.4)  # rank 1 is missing again
        rank1 = ready(b.port, 1)
        assert read_line(rank2) == "GO 2 sha256:abc"
        assert read_line(rank1) == "GO 1 sha256:abc"


def test_slowloris_is_cut_off_and_does_not_stall_real_workers() -> None:
    with running_barrier(3, image_id="sha256:abc", line_timeout=1.0) as b:
        slow = greeted(b.port)
        slow.sendall(b"READY ")  # and never finishes the line
        t0 = time.monotonic()
        workers = [ready(b.port, 1), ready(b.port, 2)]
        assert [read_line(s) for s in workers] == ["GO 1 sha256:abc", "GO 2 sha256:abc"]
        assert time.monotonic() - t0 < 0.9


def test_slowloris_gets_line_timeout() -> None:
    with running_barrier(3, line_timeout=0.5) as b:
        slow = greeted(b.port)
        slow.sendall(b"READY ")
        t0 = time.monotonic()
        assert read_line(slow, 3) == "ERR line timeout"
        assert 0.4 < time.monotonic() - t0 < 2.5


def test_one_megabyte_line_is_cut_off_at_the_limit() -> None:
    with running_barrier(2, image_id="sha256:abc") as b:
        with greeted(b.port) as big:
            try:
                big.sendall(b"A" * (1 << 20))
            except OSError:
                pass  # rank 0 may stop reading before all of it arrived
            assert read_line(big) == "ERR line too long"  # rank 0 keeps draining, so no RST eats it
        assert any("line too long" in line for line in b.logs)
        assert read_line(ready(b.port, 1)) == "GO 1 sha256:abc"


def test_hundreds_of_idle_connections_do_not_delay_the_release() -> None:
    with running_barrier(4, image_id="sha256:abc") as b:
        idle = [connect(b.port) for _ in range(500)]
        t0 = time.monotonic()
        workers = [ready(b.port, rank) for rank in (1, 2, 3)]
        replies = [read_line(s) for s in workers]
        elapsed = time.monotonic() - t0
        assert replies == [f"GO {rank} sha256:abc" for rank in (1, 2, 3)]
        assert elapsed < 1.0
        assert b.outcome().exit_code == 0
        for sock in idle:
            sock.close()


def test_running_out_of_file_descriptors_drops_idle_clients_not_the_barrier(tmp_path: Path) -> None:
    import resource

    ready_file = tmp_path / "barrier.addr"
    serve = subprocess.Popen(
        [sys.executable, "-m", "slurm_multi", "barrier", "serve", "--nnodes=3", f"--bind={LOOPBACK}",
         f"--port={free_ports(1)[0]}", "--image-id=sha256:abc", "--timeout=20", f"--ready-file={ready_file}"],
        env=cli_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)),
    )  # fmt: skip
    port = wait_ready_file(ready_file, serve)
    idle = [connect(port) for _ in range(120)]
    workers = [ready(port, 1), ready(port, 2)]
    assert [read_line(s) for s in workers] == ["GO 1 sha256:abc", "GO 2 sha256:abc"]
    _, err = serve.communicate(timeout=10)
    assert serve.returncode == 0
    assert "out of file descriptors" in err and "Traceback" not in err
    for sock in idle:
        sock.close()


def test_progress_line_counts_ready_workers() -> None:
    with running_barrier(4, progress_every=0.2) as b:
        worker = ready(b.port, 2)
        wait_for(lambda: logged(b, "1/3 workers ready (start), image not released yet"))
        worker.close()


def test_controller_abort_reaches_waiting_and_late_workers() -> None:
    # 5 nodes: rank 4 never joins, so the server lingers its full time for it.
    with running_barrier(5, linger=1.5) as b:
        waiting = [ready(b.port, 1), ready(b.port, 2, "image")]
        wait_for(lambda: logged(b, "rank 2 ready (image)"))
        t0 = time.monotonic()
        assert control_line(b.port, "ABORT", "image build failed on node0") == "OK"
        for sock in waiting:
            assert read_line(sock) == "ABORT image build failed on node0"
        assert time.monotonic() - t0 < 0.5
        assert read_line(ready(b.port, 3)) == "ABORT image build failed on node0"
        assert read_line(ready(b.port, 3, token="bad")) == "ERR bad token"  # ABORT carries the token
        assert control_line(b.port, "RELEASE", "sha256:abc").startswith("ABORT ")
        outcome = b.outcome()
        assert outcome.exit_code == 1 and "image build failed" in outcome.message
        assert time.monotonic() - t0 >= 1.4  # lingered for late joiners


def test_after_an_abort_the_linger_ends_once_every_worker_has_heard_it() -> None:
    with running_barrier(3, linger=30) as b:
        waiting = ready(b.port, 1, "image")
        wait_for(lambda: logged(b, "rank 1 ready (image)"))
        t0 = time.monotonic()
        assert control_line(b.port, "ABORT", "build failed") == "OK"
        assert read_line(waiting) == "ABORT build failed"
        assert read_line(ready(b.port, 2)) == "ABORT build failed"  # the late one
        outcome = b.outcome()
        assert outcome.exit_code == 1
        assert time.monotonic() - t0 < 10  # not the 30 s linger: nobody is left to tell


def test_timeout_names_missing_ranks_and_aborts_connected_workers() -> None:
    with running_barrier(6, timeout=0.8, image_id="sha256:abc", linger=0) as b:
        workers = [ready(b.port, rank) for rank in (1, 3, 4)]
        outcome = b.outcome()
        assert outcome.exit_code == 3
        assert "missing ranks 2,5 of 6; connected: 1,3,4" in outcome.message
        for sock in workers:
            line = read_line(sock)
            assert line.startswith("ABORT timeout after") and "missing ranks 2,5 of 6" in line


# --------------------------------------------------------------------------------------------------
# clients


def test_join_returns_the_image_id_and_reconnects_after_a_drop_with_a_fresh_nonce() -> None:
    def go(challenge: str, msg: wire.Message) -> bytes:
        return wire.reply_line(TOKEN, "GO", challenge, msg.nonce, "2", "sha256:abc")

    with impostor(lambda challenge, msg: None, go) as rank0:  # rank 0 drops us once while we wait
        image = join(LOOPBACK, [rank0.port], TOKEN, 2, connect_timeout=5, wait_timeout=5, log=lambda m: None)
    assert image == "sha256:abc"
    assert [(m.kind, m.rank, m.phase) for _, m in rank0.seen] == [("READY", 2, "start")] * 2
    first, second = (line for line, _ in rank0.seen)
    assert first != second  # each connection is signed anew: nothing to replay


@pytest.mark.parametrize(
    ("answer", "verb"),
    [
        (lambda s, m: f"GO {'0' * 64} 1 sha256:evil\n".encode(), "GO"),
        (lambda s, m: wire.reply_line("other-token", "GO", s, m.nonce, "1", "sha256:evil"), "GO"),
        # A GO that the real rank 0 signed for another connection, replayed to us.
        (lambda s, m: wire.reply_line(TOKEN, "GO", s, auth.new_nonce(), "1", "sha256:evil"), "GO"),
        (lambda s, m: f"GO {TOKEN} 1 sha256:evil\n".encode(), "GO"),  # the old protocol
        (lambda s, m: wire.reply_line("other-token", "ABORT", s, m.nonce, "fake"), "ABORT"),
    ],
)  # fmt: skip
def test_join_refuses_a_reply_that_rank_0_did_not_sign(answer: Callable[..., bytes], verb: str) -> None:
    with impostor(answer) as rank0:
        with pytest.raises(HelperError) as err:
            join(LOOPBACK, [rank0.port], TOKEN, 1, connect_timeout=5, wait_timeout=5, log=lambda m: None)
    assert not isinstance(err.value, BarrierAborted)  # a forged ABORT stops nobody... but this join
    assert err.value.exit_code == 1
    assert str(err.value) == (
        f"barrier: {LOOPBACK}:{rank0.port} is not our barrier (its {verb} is not signed with our token)"
    )
    assert TOKEN not in str(err.value)


def test_join_cli_against_a_fake_rank_0_exits_1_in_one_line() -> None:
    def fake_go(challenge: str, msg: wire.Message) -> bytes:
        return wire.reply_line("guessed-token", "GO", challenge, msg.nonce, "1", "sha256:evil")

    with impostor(fake_go) as rank0:
        result = slurm_multi(
            f"barrier join --rank 1 --nnodes 2 --master-addr {LOOPBACK} --port {rank0.port}",
            "--connect-timeout=5",
            "--wait-timeout=5",
        )
    assert result.returncode == 1 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.endswith(f"{LOOPBACK}:{rank0.port} is not our barrier (its GO is not signed with our token)")
    assert "Traceback" not in result.stderr and TOKEN not in result.stderr


def test_a_controller_refuses_an_ok_that_rank_0_did_not_sign() -> None:
    with impostor(lambda challenge, msg: f"OK {'f' * 64}\n".encode()) as rank0:
        with pytest.raises(HelperError, match=r"is not our barrier \(its OK is not signed with our token\)"):
            barrier.control(LOOPBACK, [rank0.port], TOKEN, "RELEASE", "sha256:abc", log=lambda m: None)
    assert [(m.kind, m.image_id) for _, m in rank0.seen] == [("RELEASE", "sha256:abc")]


def test_join_gives_up_on_a_peer_that_never_sends_a_challenge() -> None:
    with socket.create_server((LOOPBACK, 0)) as silent:  # accepts (the backlog does), says nothing
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(HelperError) as err:
            join(LOOPBACK, [port], TOKEN, 1, connect_timeout=30, wait_timeout=30, log=lambda m: None)
    # Not the whole wait budget: our rank 0 greets at once, so the proof window is seconds.
    assert time.monotonic() - started < net.PROOF_TIMEOUT + 2
    assert err.value.exit_code == 1
    assert str(err.value) == (
        f"barrier: {LOOPBACK}:{port} is not our barrier (it accepted but sent no CHALLENGE within 2 s)"
    )


def forged_go(sock: socket.socket) -> None:
    """A fake CHALLENGE, then a GO that no token signed."""
    sock.sendall(wire.challenge_line(auth.new_nonce()))
    sock.recv(512)
    sock.sendall(f"GO {'0' * 64} 1 sha256:evil\n".encode())


def unsigned_err(sock: socket.socket) -> None:
    """A fake CHALLENGE, then an ERR (unsigned, as every ERR is): the old join ended on it, exit 2."""
    sock.sendall(wire.challenge_line(auth.new_nonce()))
    sock.recv(512)
    sock.sendall(b"ERR rank out of range\n")


def greets_then_silent(sock: socket.socket) -> None:
    """A CHALLENGE (anyone can send one), then nothing: the old join waited its whole budget."""
    sock.sendall(wire.challenge_line(auth.new_nonce()))
    sock.recv(512)


SQUATTERS = {
    "silent": squatters.silent,
    "banner": squatters.banner,
    "forged-go": forged_go,
    "err": unsigned_err,
    "greets-then-silent": greets_then_silent,
}


def squatter(kind: str) -> contextlib.AbstractContextManager[int]:
    """Something that is not our rank 0 on a port: silent, a banner, a fake CHALLENGE + a forged GO,
    or a fake CHALLENGE + an ERR."""
    return squatters.squatter(SQUATTERS[kind])


@pytest.mark.parametrize("kind", ["silent", "banner", "forged-go", "err", "greets-then-silent"])
def test_a_squatter_on_the_first_candidate_costs_a_join_seconds_not_the_job(kind: str) -> None:
    def go(challenge: str, msg: wire.Message) -> bytes:
        return wire.reply_line(TOKEN, "GO", challenge, msg.nonce, "1", "sha256:abc")

    lines: list[str] = []
    with squatter(kind) as first, impostor(go) as rank0:
        started = time.monotonic()
        image = join(
            LOOPBACK, [first, rank0.port], TOKEN, 1, connect_timeout=30, wait_timeout=30, log=lines.append
        )
    assert image == "sha256:abc"
    assert time.monotonic() - started < net.PROOF_TIMEOUT + 3
    assert any(f"{LOOPBACK}:{first} is not our rank 0 (" in line for line in lines), lines


def test_a_controller_skips_a_squatter_and_a_join_names_what_it_met_on_every_candidate() -> None:
    with (
        squatter("banner") as first,
        impostor(lambda c, m: wire.reply_line(TOKEN, "OK", c, m.nonce)) as rank0,
    ):
        barrier.control(LOOPBACK, [first, rank0.port], TOKEN, "RELEASE", "sha256:abc", log=lambda m: None)
    assert [(m.kind, m.image_id) for _, m in rank0.seen] == [("RELEASE", "sha256:abc")]
    for kind in ("err", "greets-then-silent"):
        with (
            squatter(kind) as first,
            impostor(lambda c, m: wire.reply_line(TOKEN, "OK", c, m.nonce)) as rank0,
        ):
            barrier.control(LOOPBACK, [first, rank0.port], TOKEN, "ABORT", "stop", log=lambda m: None)
        assert [m.kind for _, m in rank0.seen] == ["ABORT"]
    with squatter("banner") as a, squatter("forged-go") as b:
        with pytest.raises(HelperError) as err:
            join(LOOPBACK, [a, b], TOKEN, 1, connect_timeout=30, wait_timeout=30, log=lambda m: None)
    assert str(err.value) == (
        f"barrier: no candidate port on {LOOPBACK} is our rank 0 ("
        + "; ".join(sorted([f"{a}: no challenge", f"{b}: its GO is not signed with our token"]))
        + ")"
    )
    assert err.value.exit_code == 1


def test_release_cli_refuses_an_image_id_too_long_for_a_signed_line() -> None:
    image_id = "registry.example.com/" + "x" * 140  # 161 > 149, still a valid reference
    assert words.is_image_id(image_id[:160])
    result = CliRunner().invoke(
        barrier_cli.cli,
        ["release", "--image-id", image_id[:160], "--master-addr", LOOPBACK, "--port", str(free_ports(1)[0])],
        env={"SM_BARRIER_TOKEN": TOKEN},
    )
    assert result.exit_code == 2
    assert "--image-id is 160 characters; a signed RELEASE line holds at most 149" in result.output
    assert "--control-stdin" in result.output


def test_a_replayed_line_from_another_connection_is_refused_and_displaces_nobody() -> None:
    with running_barrier(3, image_id="sha256:abc") as b:
        original = greeted(b.port)
        original.nonce = auth.new_nonce()
        line = signed("READY", "1", original.challenge, original.nonce).encode() + b"\n"
        original.sendall(line)
        wait_for(lambda: logged(b, "rank 1 ready (start)"))
        with greeted(b.port) as replay:  # an eavesdropper sends the recorded line on its own connection
            assert replay.challenge != original.challenge
            replay.sendall(line)
            assert read_line(replay) == "ERR bad token"
        assert any("rejected 127.0.0.1:" in log and "bad token" in log for log in b.logs)
        assert not logged(b, "reconnected")  # the genuine rank 1 still holds its place
        assert silent_for(original, 0.2)
        rank2 = ready(b.port, 2)
        assert [read_line(original), read_line(rank2)] == ["GO 1 sha256:abc", "GO 2 sha256:abc"]


def test_a_recorded_release_cannot_release_the_image_again() -> None:
    with running_barrier(2) as b:
        worker = ready(b.port, 1, "image")
        wait_for(lambda: logged(b, "rank 1 ready (image)"))
        with greeted(b.port) as recorded:  # a RELEASE signed on one connection, never sent there
            line = signed("RELEASE", "sha256:evil", recorded.challenge, auth.new_nonce()).encode() + b"\n"
        with greeted(b.port) as replay:
            replay.sendall(line)
            assert read_line(replay) == "ERR bad token"
        assert silent_for(worker, 0.3)
        assert control_line(b.port, "RELEASE", "sha256:good") == "OK"
        assert read_line(worker) == "GO 1 sha256:good"


def test_the_token_never_crosses_the_wire() -> None:
    wrong = "wrong-" + secrets.token_hex(8)
    proxies: list[RecordingProxy] = []
    try:
        with running_barrier(3) as b:
            proxies.append(proxy := RecordingProxy(b.port))
            via = [proxy.port]
            with pytest.raises(HelperError) as err:
                join(LOOPBACK, via, wrong, 1, connect_timeout=5, log=lambda m: None)
            assert err.value.exit_code == 2
            image_join = spawn(
                f"barrier join --rank 2 --nnodes 3 --master-addr {LOOPBACK} --port {proxy.port} --phase image"
            )
            wait_for(lambda: logged(b, "rank 2 ready (image)"))
            release = slurm_multi(
                f"barrier release --image-id sha256:feed --master-addr {LOOPBACK} --port {proxy.port}"
            )
            assert release.returncode == 0, release.stderr
            assert image_join.communicate(timeout=20)[0] == "sha256:feed\n"
            box: dict[str, str] = {}
            start2 = threading.Thread(
                target=lambda: box.update(two=join(LOOPBACK, via, TOKEN, 2, log=lambda m: None))
            )
            start2.start()
            assert join(LOOPBACK, via, TOKEN, 1, log=lambda m: None) == "sha256:feed"
            start2.join(10)
            assert box == {"two": "sha256:feed"} and b.outcome().exit_code == 0
        with running_barrier(3, linger=5) as b:
            proxies.append(proxy := RecordingProxy(b.port))
            waiting = ready(proxy.port, 1)
            wait_for(lambda: logged(b, "rank 1 ready (start)"))
            abort = slurm_multi(
                f"barrier abort --master-addr {LOOPBACK} --port {proxy.port}", "--reason", "disk full"
            )
            assert abort.returncode == 0, abort.stderr
            assert read_line(waiting) == "ABORT disk full"
            with pytest.raises(BarrierAborted):
                join(LOOPBACK, [proxy.port], TOKEN, 2, log=lambda m: None)  # the late one hears it too
    finally:
        for proxy in proxies:
            proxy.close()
    wire = b"".join(bytes(proxy.wire) for proxy in proxies)
    for verb in (b"CHALLENGE ", b"READY ", b"GO ", b"RELEASE ", b"OK ", b"ABORT ", b"ERR bad token"):
        assert verb in wire  # the whole conversation went through the proxies...
    for secret in (TOKEN, wrong):  # ...and neither token, nor its random part, in any spelling
        for form in (secret, secret.split("-", 1)[1], secret.encode().hex(), secret.upper()):
            assert form.encode() not in wire


def test_join_skips_another_jobs_barrier_on_a_shared_candidate_port() -> None:
    other = BarrierServer("other-jobs-token", 2, LOOPBACK, [0], image_id="x", log=lambda m: None)
    threading.Thread(target=other.serve, args=(time.monotonic() + 10,), daemon=True).start()
    try:
        with running_barrier(2, image_id="sha256:ours") as b:
            image = join(LOOPBACK, [other.port, b.port], TOKEN, 1, connect_timeout=5, log=lambda m: None)
            assert image == "sha256:ours"
    finally:
        other.request_stop()


def test_join_raises_on_abort() -> None:
    with running_barrier(3, linger=0.5) as b:
        assert control_line(b.port, "ABORT", "out of disk") == "OK"
        with pytest.raises(BarrierAborted) as err:
            join(LOOPBACK, [b.port], TOKEN, 1, connect_timeout=5, log=lambda m: None)
        assert err.value.exit_code == 1 and err.value.reason == "out of disk"


def test_join_cli_prints_the_image_id_on_stdout() -> None:
    with running_barrier(2, image_id="sha256:abc") as b:
        result = slurm_multi(f"barrier join --rank 1 --nnodes 2 --master-addr {LOOPBACK} --port {b.port}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "sha256:abc\n"
    assert TOKEN not in result.stdout + result.stderr


def test_join_cli_that_cannot_connect_exits_3_naming_ports_and_attempts() -> None:
    p1, p2 = free_ports(2)
    t0 = time.monotonic()
    result = slurm_multi(
        f"barrier join --rank 1 --nnodes 2 --master-addr {LOOPBACK} --port {p1} --port {p2}",
        "--connect-timeout=1",
    )
    assert result.returncode == 3
    assert 0.9 < time.monotonic() - t0 < 10
    last = result.stderr.strip().splitlines()[-1]
    assert f"rank 0 did not answer on 127.0.0.1:{p1},{p2} after" in last
    assert "attempts, last error: connection refused); is rank 0's task running?" in last
    assert "Traceback" not in result.stderr and TOKEN not in result.stderr


def test_join_cli_exit_codes_for_abort_bad_token_and_bad_usage() -> None:
    with running_barrier(3, linger=5) as b:
        join_cmd = f"barrier join --nnodes 3 --master-addr {LOOPBACK} --port {b.port}"
        wrong = slurm_multi(f"{join_cmd} --rank 1", env=cli_env(SM_BARRIER_TOKEN="wrong-token"))
        assert wrong.returncode == 2 and "rejected our token" in wrong.stderr
        out_of_range = slurm_multi(f"{join_cmd} --rank 3")
        assert out_of_range.returncode == 2 and "not a worker rank" in out_of_range.stderr
        no_token = slurm_multi(f"{join_cmd} --rank 1", env=cli_env(SM_BARRIER_TOKEN=""))
        assert no_token.returncode == 2 and "SM_BARRIER_TOKEN is not set or empty" in no_token.stderr
        assert control_line(b.port, "ABORT", "image pull failed") == "OK"
        aborted = slurm_multi(f"{join_cmd} --rank 1")
        assert aborted.returncode == 1
        assert "barrier: rank 0 aborted: image pull failed" in aborted.stderr
        for result in (wrong, out_of_range, no_token, aborted):
            assert "Traceback" not in result.stderr
            assert TOKEN not in result.stdout + result.stderr
            assert result.stdout == ""


def test_serve_cli_end_to_end_never_prints_the_token(tmp_path: Path) -> None:
    ready_file = tmp_path / "barrier.addr"
    serve = spawn(
        f"barrier serve --nnodes 3 --bind {LOOPBACK} --port {free_ports(1)[0]} --timeout 20",
        f"--ready-file={ready_file}",
    )
    port = wait_ready_file(ready_file, serve)
    join_cmd = f"barrier join --nnodes 3 --master-addr {LOOPBACK} --port {port}"
    # In the order a real worker goes: the image phase is answered before anyone joins the start
    # phase (the server exits once the start phase is released, so a slow-starting image join
    # spawned alongside could otherwise find nobody listening on a loaded machine).
    image_join = spawn(f"{join_cmd} --rank 2 --phase image")
    with ready(port, 1, token=TOKEN[:-1]) as intruder:  # one character short of the token
        assert read_line(intruder) == "ERR bad token"
    release = slurm_multi("barrier release --image-id sha256:feed", f"--ready-file={ready_file}")
    image_output = image_join.communicate(timeout=20)
    joins = [spawn(f"{join_cmd} --rank {rank}") for rank in (1, 2)]
    outputs = [image_output] + [p.communicate(timeout=20) for p in (*joins, serve)]
    assert release.returncode == 0, release.stderr
    assert [p.returncode for p in (image_join, *joins, serve)] == [0, 0, 0, 0]
    assert [out for out, _ in outputs[:3]] == ["sha256:feed\n"] * 3
    serve_err = outputs[3][1]
    assert "rejected 127.0.0.1:" in serve_err and "released 2 worker(s) with image sha256:feed" in serve_err
    assert not ready_file.exists()
    everything = release.stdout + release.stderr + "".join(out + err for out, err in outputs)
    assert TOKEN not in everything and TOKEN[:-1] not in everything


def test_serve_cli_sigterm_aborts_connected_workers(tmp_path: Path) -> None:
    ready_file = tmp_path / "barrier.addr"
    serve = spawn(
        f"barrier serve --nnodes 3 --bind {LOOPBACK} --port {free_ports(1)[0]}", f"--ready-file={ready_file}"
    )
    port = wait_ready_file(ready_file, serve)
    worker = ready(port, 1)
    time.sleep(0.2)
    serve.send_signal(signal.SIGTERM)
    assert read_line(worker) == "ABORT rank 0 terminated"
    out, err = serve.communicate(timeout=10)
    assert serve.returncode == 1
    assert "rank 0 terminated" in err and TOKEN not in out + err and "Traceback" not in err


def test_serve_cli_timeout_exits_3_listing_missing_ranks(tmp_path: Path) -> None:
    ready_file = tmp_path / "barrier.addr"
    serve = spawn(
        f"barrier serve --nnodes 4 --bind {LOOPBACK} --port {free_ports(1)[0]} --image-id sha256:abc",
        "--timeout=1",
        "--linger=0",
        f"--ready-file={ready_file}",
    )
    port = wait_ready_file(ready_file, serve)
    worker = ready(port, 2)
    assert read_line(worker).startswith(
        "ABORT --barrier-timeout ran out: not every worker arrived within 1 s of the release; "
        "missing ranks 1,3 of 4"
    )
    out, err = serve.communicate(timeout=10)
    assert serve.returncode == 3
    assert "--barrier-timeout ran out" in err and "missing ranks 1,3 of 4; connected: 2" in err
    assert TOKEN not in out + err


def test_release_and_abort_cli_answer_ok_and_report_a_missing_server() -> None:
    with running_barrier(2, linger=5) as b:
        where = f"--master-addr {LOOPBACK} --port {b.port}"
        release = slurm_multi(f"barrier release --image-id sha256:abc {where}")
        assert release.returncode == 0, release.stderr
        abort = slurm_multi(f"barrier abort {where}", "--reason", "too late")
        assert abort.returncode == 0, abort.stderr
    nobody = slurm_multi(
        f"barrier release --image-id x --master-addr {LOOPBACK} --port {free_ports(1)[0]}",
        "--connect-timeout=0.5",
    )
    assert nobody.returncode == 3 and "is `barrier serve` running?" in nobody.stderr
    for result in (release, abort, nobody):
        assert TOKEN not in result.stdout + result.stderr


def test_the_token_has_no_command_line_option() -> None:
    for command in ("serve", "join", "release", "abort"):
        help_text = CliRunner().invoke(barrier_cli.cli, [command, "--help"]).output
        assert "--token-env" in help_text and "--token " not in help_text


def test_each_command_prints_its_help_on_stdout() -> None:
    for command in ("port", "serve", "join", "release", "abort"):
        done = slurm_multi(f"barrier {command} --help")
        assert done.returncode == 0 and done.stdout.startswith(f"Usage: slurm-multi barrier {command} ")


def test_barrier_options_take_their_environment_variables() -> None:
    """MASTER_PORT, SLURM_JOB_ID and SM_BARRIER_PORT fill the options not given; a given option wins;
    a bad value in a variable is one line naming both."""
    env = {k: v for k, v in cli_env().items() if k != "SLURM_JOB_ID"}
    flags = slurm_multi("barrier port --master-port 29500 --job-id 4242", env=env)
    from_env = slurm_multi("barrier port", env={**env, "MASTER_PORT": "29500", "SLURM_JOB_ID": "4242"})
    assert flags.returncode == from_env.returncode == 0, flags.stderr + from_env.stderr
    assert flags.stdout == from_env.stdout and len(flags.stdout.split()) == 4
    given = slurm_multi("barrier port --override 21000 --count 2", env={**env, "SM_BARRIER_PORT": "30000"})
    assert given.stdout.split() == ["21000", "21001"]
    bad = slurm_multi("barrier port", env={**env, "MASTER_PORT": "29500", "SLURM_JOB_ID": "x"})
    assert bad.returncode == 2 and bad.stdout == ""
    (line,) = bad.stderr.splitlines()
    assert line.startswith(
        "slurm-multi: barrier port: Invalid value for '--job-id' (env var: 'SLURM_JOB_ID'): 'x' "
    )
    assert line.endswith("; Usage: slurm-multi barrier port [OPTIONS] (--help lists the options)")
    nothing = slurm_multi("barrier port", env=env)  # no derivation input at all: a usage error
    assert nothing.returncode == 2 and len(nothing.stderr.splitlines()) == 1, nothing.stderr
    required = slurm_multi(
        "barrier join --rank 1 --nnodes 2 --connect-timeout 0",
        env={**env, "MASTER_ADDR": LOOPBACK, "MASTER_PORT": "1"},
    )
    assert "Missing option" not in required.stderr  # --master-addr came from MASTER_ADDR


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        ("--nnodes 0", "Invalid value for '--nnodes': 0 is not in the range x>=1"),
        ("--nnodes 2 --count 33", "'--count': 33 is not in the range 1<=x<=32"),
        ("--nnodes 2 --timeout -1", "'--timeout': -1.0 is not in the range x>=0"),
        ("--nnodes 2 --timeout nan", "'--timeout': 'nan' is not a finite number"),
        ("--nnodes 2 --image-timeout inf", "'--image-timeout': 'inf' is not a finite number"),
        ("--nnodes 2 --port 70000", "'--port': 70000 is not in the range 1<=x<=65535"),
        ("--nnodes 2 --bogus", "No such option '--bogus'"),
        ("", "Missing option '--nnodes'"),
    ],
)
def test_barrier_serve_refuses_in_one_line_naming_the_option(argv: str, says: str) -> None:
    done = slurm_multi(f"barrier serve {argv}")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("slurm-multi: barrier serve: ") and line.endswith(
        f"{says}; Usage: slurm-multi barrier serve [OPTIONS] (--help lists the options)"
    )


def test_barrier_join_refuses_a_phase_it_does_not_know() -> None:
    done = slurm_multi(f"barrier join --rank 1 --nnodes 2 --master-addr {LOOPBACK} --phase late")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "Invalid value for '--phase': 'late' is not one of 'image', 'start', 'both'" in line


# --------------------------------------------------------------------------------------------------
# rank 0's own task on the control pipe, and the two budgets


def test_control_pipe_release_reaches_image_waiters_and_start_workers() -> None:
    read_end, write_end = os.pipe()
    try:
        with running_barrier(3, control_fd=read_end) as b:
            image_waiter = ready(b.port, 1, "image")
            start_worker = ready(b.port, 2)
            wait_for(lambda: logged(b, "rank 2 ready (start)"))
            assert silent_for(image_waiter, 0.2)
            os.write(write_end, b"RELEASE sha256:feed\n")
            assert read_line(image_waiter) == "GO 1 sha256:feed"
            late = ready(b.port, 1)
            assert read_line(late) == "GO 1 sha256:feed"
            assert read_line(start_worker) == "GO 2 sha256:feed"
            assert b.outcome().exit_code == 0
    finally:
        os.close(write_end)


def test_control_pipe_abort_and_eof_before_release_abort_every_worker() -> None:
    read_end, write_end = os.pipe()
    with running_barrier(2, control_fd=read_end, linger=0) as b:
        worker = ready(b.port, 1, "image")
        wait_for(lambda: logged(b, "rank 1 ready (image)"))
        os.write(write_end, b"ABORT rank 0 (node1): cannot obtain toy/model:local\n")
        assert read_line(worker) == "ABORT rank 0 (node1): cannot obtain toy/model:local"
        assert b.outcome().exit_code == 1
    os.close(write_end)
    # The task dying (its end of the pipe closing) before a release is an abort too, not a hang.
    read_end, write_end = os.pipe()
    with running_barrier(2, control_fd=read_end, linger=0) as b:
        worker = ready(b.port, 1, "image")
        wait_for(lambda: logged(b, "rank 1 ready (image)"))
        os.close(write_end)
        line = read_line(worker)
        assert line.startswith("ABORT ") and "ended before it released the image" in line
        assert b.outcome().exit_code == 1


def test_a_slow_image_is_charged_to_the_image_budget_not_the_barrier_budget() -> None:
    # Rank 0 takes longer to obtain its image than the whole barrier budget: still released, since
    # the barrier budget starts at the release.
    read_end, write_end = os.pipe()
    try:
        with running_barrier(2, timeout=30, control_fd=read_end, image_timeout=10, barrier_timeout=0.5) as b:
            worker = ready(b.port, 1)
            time.sleep(1.0)
            os.write(write_end, b"RELEASE sha256:slow\n")
            assert read_line(worker) == "GO 1 sha256:slow"
            assert b.outcome().exit_code == 0
    finally:
        os.close(write_end)


def test_the_timeout_error_names_the_budget_that_ran_out() -> None:
    read_end, write_end = os.pipe()
    try:
        with running_barrier(
            2, timeout=30, control_fd=read_end, image_timeout=0.5, barrier_timeout=30, linger=0
        ) as b:
            outcome = b.outcome()
            assert outcome.exit_code == 3
            assert "--image-timeout ran out" in outcome.message
    finally:
        os.close(write_end)
    with running_barrier(3, timeout=30, image_id="sha256:abc", barrier_timeout=1.0, linger=0) as b:
        worker = ready(b.port, 1)
        wait_for(lambda: logged(b, "rank 1 ready (start)"))
        outcome = b.outcome()
        worker.close()
        assert outcome.exit_code == 3
        assert "--barrier-timeout ran out" in outcome.message and "missing ranks 2 of 3" in outcome.message


def test_serve_cli_takes_release_on_stdin_without_a_ready_file() -> None:
    port = free_ports(1)[0]
    serve = subprocess.Popen(
        [sys.executable, "-m", "slurm_multi", "barrier", "serve", "--nnodes", "2", "--bind", LOOPBACK,
         "--port", str(port), "--control-stdin", "--timeout", "20"],
        env=cli_env(), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        join = spawn(
            "barrier join --rank 1 --nnodes 2 --master-addr",
            LOOPBACK,
            "--port",
            str(port),
            "--phase",
            "start",
        )
        time.sleep(0.3)
        assert serve.stdin is not None
        serve.stdin.write("RELEASE sha256:cafe\n")
        serve.stdin.flush()
        out, err = join.communicate(timeout=20)
        assert join.returncode == 0, err
        assert out.strip() == "sha256:cafe"
        serve.stdin.close()
        assert serve.wait(timeout=20) == 0
    finally:
        serve.kill()
        serve.wait()


def test_join_phase_both_prints_the_image_id_then_joins_the_start_phase_on_sigusr1() -> None:
    # A worker's whole barrier, as lib/node.sh drives it: one join process, two signed exchanges.
    read_end, write_end = os.pipe()
    try:
        with running_barrier(2, control_fd=read_end) as b:
            worker = spawn(
                f"barrier join --rank 1 --nnodes 2 --master-addr {LOOPBACK} --port {b.port} --phase both"
            )
            assert worker.stdout is not None
            wait_for(lambda: logged(b, "rank 1 ready (image)"), timeout=10)
            os.write(write_end, b"RELEASE sha256:both\n")
            assert worker.stdout.readline() == "sha256:both\n"
            time.sleep(0.3)
            assert worker.poll() is None  # holding on until this node has the image
            worker.send_signal(signal.SIGUSR1)
            _, err = worker.communicate(timeout=10)
            assert worker.returncode == 0, err
            assert "rank 1: GO (start)" in err and TOKEN not in err
            assert b.outcome().exit_code == 0
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    ("first", "quirk"),
    [("127.0.1.1", "loopback"), ("fe80::1%eth0", "link-local"), ("10.77.0.11", ""), ("::1", "loopback")],
)
def test_a_host_name_resolving_to_an_unreachable_address_first_is_a_quirk(
    first: str, quirk: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = socket.AF_INET6 if ":" in first else socket.AF_INET
    infos = [
        (family, socket.SOCK_STREAM, 6, "", (first, 0)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.9", 0)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: infos)
    why = net.self_name_quirk("node1")
    assert (quirk in why) if quirk else why == ""


def test_gloo_is_told_the_routable_interface_only_for_the_quirk_and_only_when_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from slurm_multi import node

    monkeypatch.setattr(
        net, "routable_interface", lambda: ("eth7", "10.77.0.11", "eth7, the default route's")
    )
    monkeypatch.setattr(net, "self_name_quirk", lambda host: f"{host} resolves to 127.0.1.1 (loopback) first")
    ctx = SimpleNamespace(docker_env={"A": "1"})
    node.reachable_self_address(ctx, {}, "node1")
    assert ctx.docker_env == {"A": "1", "GLOO_SOCKET_IFNAME": "eth7"}
    for ctx, env in ((SimpleNamespace(docker_env={"GLOO_SOCKET_IFNAME": "ib0"}), {}),
                     (SimpleNamespace(docker_env={}), {"GLOO_SOCKET_IFNAME": "ib0"})):  # fmt: skip
        node.reachable_self_address(ctx, env, "node1")
        assert ctx.docker_env.get("GLOO_SOCKET_IFNAME", "ib0") == "ib0"
    monkeypatch.setattr(net, "self_name_quirk", lambda host: "")
    ctx = SimpleNamespace(docker_env={})
    node.reachable_self_address(ctx, {}, "node1")
    assert ctx.docker_env == {}


def dial_waits(seconds: float) -> list[float]:
    """The waits between a worker's rounds of dials to a rank 0 that never listens, for `seconds`."""
    waits: list[float] = []

    def sleep(wait: float) -> None:
        waits.append(round(wait, 3))
        time.sleep(wait)

    dialer = barrier._Dialer(LOOPBACK, free_ports(2), log=lambda _: None, sleep=sleep)
    assert dialer.dial(time.monotonic() + seconds) is None
    return waits


def test_a_worker_dials_again_every_50th_of_a_second_while_rank_0_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Doubling from the first refusal put a round 0.16-0.3 s after rank 0 listened, while rank 0
    # waited for this worker's image READY: the first QUICK_SECONDS keep the first wait.
    waits = dial_waits(0.4)
    assert len(waits) >= 5 and max(waits) == barrier.BACKOFF_START
    # Then twice as long each time (a rank 0 that builds its image for minutes is not hammered).
    monkeypatch.setattr(barrier, "QUICK_SECONDS", 0.05)
    later = dial_waits(0.6)
    assert later[0] == barrier.BACKOFF_START and max(later) >= 4 * barrier.BACKOFF_START


@pytest.mark.parametrize(
    "verb", ["join --rank 1 --nnodes 2", "abort --reason x", f"release --image-id sha256:{'0' * 64}"]
)
def test_the_token_given_where_its_name_goes_is_never_said_back(verb: str) -> None:
    # --token-env wants the variable's NAME; given the token itself, "$<token> is not set" printed it.
    for pasted in (
        "3fa9c0d1e2b4a6978877665544332211",
        "abcdefTOKENxyz",
    ):  # not a name; a name that is the token
        env = cli_env(SM_BARRIER_TOKEN=pasted)
        result = slurm_multi(f"barrier {verb} --master-addr {LOOPBACK} --port 20111 --connect-timeout 1",
                             "--token-env", pasted, env=env)  # fmt: skip
        assert result.returncode == 2 and pasted not in result.stdout + result.stderr, result.stderr
        assert result.stderr.splitlines() == [
            "slurm-multi: barrier: --token-env is not an environment variable name; pass the NAME of the "
            "variable that holds the job's barrier token, not the token"
        ]
