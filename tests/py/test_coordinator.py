"""`slurm-multi coordinator probe`: how ZeroMQ with IPv6 on dials an nsight-slurm coordinator."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Sequence

import pytest
import zmq
from click.testing import CliRunner

from slurm_multi import EXIT_FAILURE, EXIT_USAGE, coordinator
from slurm_multi.coordinator import cli, is_unscoped_link_local, parse_endpoint, probe


@pytest.fixture
def router() -> Iterator[tuple[str, int]]:
    """A real ZeroMQ ROUTER listening on 127.0.0.1 (what the nsight-slurm coordinator is)."""
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield "127.0.0.1", port
    sock.close(linger=0)
    context.term()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_probe(*args: str):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(cli, ["probe", *args])


def test_a_listening_router_on_loopback_connects(router: tuple[str, int]) -> None:
    host, port = router
    result = run_probe(f"tcp://{host}:{port}", "--timeout-seconds", "5")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["endpoint"] == f"tcp://127.0.0.1:{port}"
    assert report["host"] == "127.0.0.1" and report["port"] == port
    assert {"family": "AF_INET", "address": "127.0.0.1"} in report["addresses"]
    assert report["zmq_ipv6_dials"] == "::ffff:127.0.0.1"  # v4-mapped: the name has no IPv6 address
    assert report["link_local"] is False
    assert report["connected"] is True
    assert report["ipv4"] == "127.0.0.1" and report["ipv4_connected"] is True
    assert "accepts ZeroMQ connections" in report["advice"]


def test_host_port_without_scheme_is_accepted(router: tuple[str, int]) -> None:
    host, port = router
    result = run_probe(f"{host}:{port}", "--timeout-seconds", "5")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["connected"] is True


def test_nothing_listening_is_exit_1_with_json_and_advice() -> None:
    port = closed_port()
    result = run_probe(f"127.0.0.1:{port}", "--timeout-seconds", "0.5")
    assert result.exit_code == EXIT_FAILURE
    report = json.loads(result.stdout)
    assert report["connected"] is False and report["ipv4_connected"] is False
    assert "is the coordinator running" in report["advice"]
    assert result.stderr.count("\n") == 1 and "cannot connect to" in result.stderr
    assert "Traceback" not in result.output


def test_ipv6_loopback_literal_connects() -> None:
    context = zmq.Context()
    sock = context.socket(zmq.ROUTER)
    sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        port = sock.bind_to_random_port("tcp://[::1]")
    except zmq.ZMQError:
        sock.close()
        context.term()
        pytest.skip("no IPv6 loopback here")
    try:
        report = probe(f"tcp://[::1]:{port}", timeout=5)
    finally:
        sock.close(linger=0)
        context.term()
    assert report["endpoint"] == f"tcp://[::1]:{port}"
    assert report["zmq_ipv6_dials"] == "::1"
    assert report["connected"] is True
    assert report["ipv4"] is None and report["ipv4_connected"] is False


def fake_resolver(v6: list[str], v4: list[str]):  # noqa: ANN201
    """getaddrinfo for a node whose own name maps to the given addresses (glibc order: v6 first).
    AI_V4MAPPED yields v4-mapped addresses only when there is no IPv6 address at all."""

    def resolve(host: str, port: int, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0):  # noqa: A002
        if isinstance(host, str) and host.startswith("node"):
            rows = []
            if family in (0, socket.AF_INET6):
                addresses = v6 or ([f"::ffff:{a}" for a in v4] if flags & socket.AI_V4MAPPED else [])
                rows += [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port, 0, 0)) for a in addresses]
            if family in (0, socket.AF_INET):
                rows += [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in v4]
            if not rows:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return rows
        raise AssertionError(f"unexpected lookup of {host!r}")

    return resolve


def test_link_local_first_address_is_detected_and_the_ipv4_literal_advised(
    router: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # hecate: a node's own name resolves to fe80:: (no scope id) and ZeroMQ dials only that one
    _, port = router
    monkeypatch.setattr(socket, "getaddrinfo", fake_resolver(["fe80::1", "fe80::2"], ["127.0.0.1"]))
    real_dial = coordinator.zmq_connects

    def dial(urls: Sequence[str], timeout: float) -> dict[str, bool]:
        # the name itself would be dialled on fe80::1 (never connects); the IPv4 literal is real
        literal = [u for u in urls if "node" not in u]
        return {**{u: False for u in urls}, **real_dial(literal, timeout)}

    monkeypatch.setattr(coordinator, "zmq_connects", dial)
    result = run_probe(f"tcp://node1:{port}", "--timeout-seconds", "5")
    assert result.exit_code == EXIT_FAILURE
    report = json.loads(result.stdout)
    assert report["addresses"][0] == {"family": "AF_INET6", "address": "fe80::1"}
    assert {"family": "AF_INET", "address": "127.0.0.1"} in report["addresses"]
    assert report["zmq_ipv6_dials"] == "fe80::1"
    assert report["link_local"] is True
    assert report["connected"] is False
    assert report["ipv4"] == "127.0.0.1" and report["ipv4_connected"] is True
    assert "link-local fe80::1 first" in report["advice"]
    assert "libzmq #4313" in report["advice"]
    assert "SLURMD_NODENAME=127.0.0.1" in report["advice"]


def test_a_name_with_only_ipv4_is_dialled_v4_mapped() -> None:
    resolve = fake_resolver([], ["127.0.0.1"])
    report = probe("node2:5555", timeout=1, resolve=resolve, dial=lambda urls, t: {u: True for u in urls})
    assert report["zmq_ipv6_dials"] == "::ffff:127.0.0.1"
    assert report["link_local"] is False and report["connected"] is True


def test_an_unresolvable_name_is_reported_not_raised() -> None:
    def resolve(*args: object, **kwargs: object) -> list:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    report = probe("nodeX:5555", timeout=1, resolve=resolve, dial=lambda urls, t: {u: False for u in urls})
    assert report["addresses"] == [] and report["zmq_ipv6_dials"] is None and report["ipv4"] is None
    assert report["connected"] is False
    assert "does not resolve" in report["advice"]


@pytest.mark.parametrize(
    "address, expected",
    [
        ("fe80::1", True),
        ("fe80::1%eth0", False),
        ("febf::1", True),
        ("::ffff:127.0.0.1", False),
        ("fd00::2", False),
        ("127.0.0.1", False),
        (None, False),
        ("garbage", False),
    ],
)
def test_unscoped_link_local(address: str | None, expected: bool) -> None:
    assert is_unscoped_link_local(address) is expected


@pytest.mark.parametrize(
    "endpoint, expected",
    [
        ("tcp://node1:5555", ("node1", 5555)),
        ("node1:1", ("node1", 1)),
        ("tcp://[::1]:80", ("::1", 80)),
        ("[fe80::1%eth0]:65535", ("fe80::1%eth0", 65535)),
        (" 10.0.0.1:7000 ", ("10.0.0.1", 7000)),
    ],
)
def test_parse_endpoint_accepts(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


@pytest.mark.parametrize(
    "endpoint",
    [
        "",
        "node1",
        "tcp://node1",
        "tcp://:5555",
        "node1:0",
        "node1:65536",
        "node1:http",
        "udp://node1:5",
        "ipc:///tmp/x",
        "tcp://*:5555",
        "fe80::1:5555",
        "[::1:5555",
        "tcp://no de:5",
        "tcp://a/b:5",
    ],
)
def test_malformed_endpoints_are_usage_errors(endpoint: str) -> None:
    result = run_probe(endpoint)
    assert result.exit_code == EXIT_USAGE
    assert result.stdout == ""
    assert "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_timeout_is_a_usage_error() -> None:
    result = run_probe("node1:5", "--timeout-seconds", "0")
    assert result.exit_code == EXIT_USAGE
