"""Network plumbing shared by the barrier and the relay (slurm_multi.net): socket options on real
sockets, and how an error or a peer is named in a message. Ports and addresses: test_barrier.py."""

from __future__ import annotations

import errno
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_multi import barrier, net
from slurm_multi.relay import connect as relay_connect

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    """Both ends of a TCP connection on 127.0.0.1."""
    with socket.create_server((net.LOOPBACK, 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    with client, server:
        yield client, server


def options(sock: socket.socket) -> dict[str, int]:
    return {
        "keepalive": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        "idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        "interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        "probes": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        "nodelay": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY),
    }


def test_keepalive_sets_the_callers_timings_on_a_real_socket(connected) -> None:
    client, server = connected
    net.keepalive(client, net.Keepalive(idle=17, interval=4, probes=6))
    assert options(client) == {"keepalive": 1, "idle": 17, "interval": 4, "probes": 6, "nodelay": 0}
    net.keepalive(server, net.Keepalive(idle=9, interval=2, probes=3, nodelay=True))
    assert options(server) == {"keepalive": 1, "idle": 9, "interval": 2, "probes": 3, "nodelay": 1}


def test_the_barrier_keeps_the_keepalive_its_doc_promises_and_the_relay_probes_sooner() -> None:
    doc = (REPO / "docs/barrier.md").read_text()
    promised = re.search(r"\| TCP keepalive \| idle (\d+) s, interval (\d+) s, (\d+) probes", doc)
    assert promised is not None, "docs/barrier.md no longer states the barrier's keepalive"
    assert barrier.KEEPALIVE == net.Keepalive(*(int(n) for n in promised.groups()))
    assert relay_connect.KEEPALIVE.idle < barrier.KEEPALIVE.idle and relay_connect.KEEPALIVE.nodelay


def test_a_barrier_client_connection_carries_the_barrier_keepalive() -> None:
    with socket.create_server((net.LOOPBACK, 0)) as listener:
        dialer = barrier._Dialer(net.LOOPBACK, [listener.getsockname()[1]], log=lambda _message: None)
        dialed = dialer.dial(time.monotonic() + 5)
        assert dialed is not None
        sock, _ = dialed
        with sock:
            got = options(sock)
    assert (got["keepalive"], got["idle"], got["interval"], got["probes"]) == (1, *barrier.KEEPALIVE[:3])


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
        (socket.timeout("timed out"), "timed out"),
        (TimeoutError(), "timed out"),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "connection reset"),
        (BrokenPipeError(errno.EPIPE, "Broken pipe"), "broken pipe"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
        (socket.gaierror(-2, "Name or service not known"), "name or service not known"),
        (OSError("plain"), "plain"),
        (ValueError(), "ValueError"),
    ],
)
def test_describe_names_a_network_error_in_lower_case_words(exc: BaseException, said: str) -> None:
    assert net.describe(exc) == said


def test_describe_names_a_real_refused_connection() -> None:
    with socket.create_server((net.LOOPBACK, 0)) as listener:
        port = listener.getsockname()[1]
    with pytest.raises(OSError) as info:
        socket.create_connection((net.LOOPBACK, port), timeout=2)
    assert net.describe(info.value) == "connection refused"


def test_peer_and_secs_read_as_a_message_says_them() -> None:
    assert net.peer(("10.0.0.3", 21544)) == "10.0.0.3:21544"
    assert net.peer(("fe80::1", 21544, 0, 2)) == "fe80::1:21544"
    assert net.peer("/run/x.sock") == "/run/x.sock"
    assert [net.secs(v) for v in (30, 2.5, 2.0, 2.04, 12.4, 0.4)] == ["30", "2.5", "2", "2", "12", "0.4"]


def test_a_name_the_idna_codec_refuses_is_an_os_error_as_any_unresolvable_name() -> None:
    with pytest.raises(OSError):
        net.resolve_ipv4("a..b")  # the codec: UnicodeError (a ValueError no caller expects)
    with pytest.raises(OSError):
        net.dial_once("a..b", 1, 1.0)


def test_dial_once_reaches_a_listener_and_fails_as_oserror_where_none_listens() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with net.dial_once("localhost", port, 600.0) as sock:
            conn, _ = server.accept()
            conn.close()
            assert sock.gettimeout() == net.ATTEMPT_TIMEOUT  # one attempt's bound
        with net.dial_once("127.0.0.1", port, 0.25) as sock:
            assert sock.gettimeout() == 0.25  # the caller's time left, when that is the shorter
            server.accept()[0].close()
    with pytest.raises(OSError):
        net.dial_once("127.0.0.1", port, 1.0)  # the listener is closed: refused


def test_the_barrier_and_the_relay_dial_through_net_dial_once() -> None:
    # One owner of a dial: neither opens its own connection.
    root = Path(net.__file__).parent
    for name in ("barrier.py", "relay/connect.py"):
        text = (root / name).read_text()
        assert "create_connection" not in text, name
        assert "dial_once(" in text, name
    for path in (root / "relay").glob("*.py"):
        assert "create_connection" not in path.read_text(), path.name


def test_backoff_keeps_its_first_wait_for_the_quick_window_then_doubles_up_to_its_cap() -> None:
    doubling = net.Backoff(0.02, 0.1)
    assert [doubling.next() for _ in range(5)] == [0.02, 0.04, 0.08, 0.1, 0.1]
    quick = net.Backoff(0.02, 2.0, quick=60.0)
    start = time.monotonic()
    assert [quick.next(start + t) for t in (0.0, 1.0, 59.0)] == [0.02, 0.02, 0.02]
    # Past the window: twice the last wait each round, capped.
    assert [quick.next(start + 61.0) for _ in range(4)] == [0.02, 0.04, 0.08, 0.16]
    assert max(quick.next(start + 61.0) for _ in range(12)) == 2.0
