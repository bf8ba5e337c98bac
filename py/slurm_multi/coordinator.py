"""Probe a ZeroMQ endpoint the way the nsight-slurm connector dials its coordinator.

The wrapper publishes `tcp://$SLURMD_NODENAME:<port>` and the connectors dial it with ZeroMQ, IPv6
on. libzmq then resolves the name with AF_INET6|AI_V4MAPPED and dials ONLY the first result; glibc
returns v4-mapped addresses only when the name has no IPv6 address at all, so a node whose own name
maps to `fe80::…` (no scope id) is dialled there and never connects (libzmq #4313). On hecate this
timed out the 4 ranks on the coordinator's own node ("Timeout connecting to Coordinator"). The probe
shows every address, the one ZeroMQ picks, whether a real ZeroMQ socket connects, and whether the
IPv4 literal would have worked.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import click

from slurm_multi.common import FiniteFloat, HelperError, usage_error
from slurm_multi.words import is_address

Resolver = Callable[..., list]
Dialer = Callable[[Sequence[str], float], dict[str, bool]]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """`tcp://HOST:PORT`, `HOST:PORT`, `[v6]:PORT` -> (host, port); anything else is a usage error."""
    text = endpoint.strip()
    if "://" in text:
        scheme, _, text = text.partition("://")
        if scheme != "tcp":
            raise usage_error(
                f"coordinator: {endpoint!r} uses {scheme}://; only tcp://HOST:PORT endpoints can be probed"
            )
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise usage_error(f"coordinator: malformed endpoint {endpoint!r}; expected tcp://[IPV6]:PORT")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise usage_error(f"coordinator: {endpoint!r} has no port; expected tcp://HOST:PORT or HOST:PORT")
        if ":" in host:
            raise usage_error(
                f"coordinator: IPv6 address in {endpoint!r} must be bracketed: tcp://[{host}]:{port_text}"
            )
    if host == "*" or not is_address(host):
        raise usage_error(f"coordinator: malformed host {host!r} in {endpoint!r}; expected tcp://HOST:PORT")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise usage_error(f"coordinator: malformed port {port_text!r} in {endpoint!r}; expected 1-65535")
    return host, int(port_text)


def zmq_url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def family_name(family: int) -> str:
    return {socket.AF_INET: "AF_INET", socket.AF_INET6: "AF_INET6"}.get(family, str(family))


def sockaddr_text(family: int, sockaddr: tuple) -> str:
    address = str(sockaddr[0])
    if family == socket.AF_INET6 and len(sockaddr) >= 4 and sockaddr[3] and "%" not in address:
        address = f"{address}%{sockaddr[3]}"
    return address


def is_unscoped_link_local(address: str | None) -> bool:
    """fe80::/10 without a %scope: the kernel cannot route it, ZeroMQ dials it anyway."""
    if not address or "%" in address:
        return False
    try:
        return ipaddress.ip_address(address).is_link_local and ":" in address
    except ValueError:
        return False


def zmq_connects(urls: Sequence[str], timeout: float) -> dict[str, bool]:
    """Dial every url with a real DEALER socket (IPV6=1, CONNECT_TIMEOUT) and watch its monitor for
    EVENT_CONNECTED, all at once, for at most `timeout` seconds."""
    try:
        import zmq
        from zmq.utils.monitor import recv_monitor_message
    except ImportError:
        raise HelperError("coordinator: pyzmq is not installed; install it (pip install pyzmq)") from None

    result = {url: False for url in urls}
    context = zmq.Context()
    sockets = []
    poller = zmq.Poller()
    monitors: dict[Any, str] = {}
    try:
        for url in result:
            sock = context.socket(zmq.DEALER)
            sock.setsockopt(zmq.IPV6, 1)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.CONNECT_TIMEOUT, max(1, int(timeout * 1000)))
            monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED)
            sockets.append((sock, monitor))
            try:
                sock.connect(url)
            except zmq.ZMQError:
                continue  # libzmq rejected the address outright: it never connects
            poller.register(monitor, zmq.POLLIN)
            monitors[monitor] = url
        deadline = time.monotonic() + timeout
        while monitors:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for monitor, _ in poller.poll(int(remaining * 1000) + 1):
                event = recv_monitor_message(monitor)
                if event["event"] == zmq.EVENT_CONNECTED:
                    result[monitors.pop(monitor)] = True
                    poller.unregister(monitor)
    finally:
        for sock, monitor in sockets:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)
        context.term()
    return result


def first_address(resolve: Resolver, host: str, port: int, family: int, flags: int = 0) -> str | None:
    try:
        infos = resolve(host, port, family, socket.SOCK_STREAM, 0, flags)
    except (OSError, UnicodeError):
        return None
    return sockaddr_text(infos[0][0], infos[0][4]) if infos else None


def advise(report: dict[str, Any], resolve_error: str | None, timeout: float) -> str:
    host, port = report["host"], report["port"]
    dials, ipv4 = report["zmq_ipv6_dials"], report["ipv4"]
    if resolve_error is not None:
        return (
            f"{host} does not resolve ({resolve_error}); publish an address every node can resolve, "
            "e.g. the head node's IPv4 literal in SLURMD_NODENAME for the nsight-slurm CLI calls."
        )
    if report["connected"]:
        return f"{host}:{port} accepts ZeroMQ connections (ZeroMQ with IPv6 on dials {dials})."
    ipv4_fix = f"Publish the IPv4 literal instead: set SLURMD_NODENAME={ipv4} for the nsight-slurm CLI calls."
    if report["link_local"]:
        lead = (
            f"{host} resolves to link-local {dials} first; ZeroMQ with IPv6 on dials only that and "
            "never connects (libzmq #4313)."
        )
        if report["ipv4_connected"]:
            return f"{lead} {ipv4_fix}"
        return (
            f"{lead} The IPv4 address {ipv4 or '(none)'} did not connect either: is the coordinator "
            f"running and listening on port {port}?"
        )
    if report["ipv4_connected"]:
        return (
            f"ZeroMQ with IPv6 on dials {dials} for {host} and does not connect there, but "
            f"{ipv4}:{port} does. {ipv4_fix}"
        )
    return (
        f"Nothing accepted a ZeroMQ connection on {host}:{port} (dialled {dials}) within {timeout:g} s; "
        "is the coordinator running (nsight-slurm coordinator start) and is the port reachable?"
    )


def probe(
    endpoint: str,
    timeout: float = 5.0,
    resolve: Resolver | None = None,
    dial: Dialer | None = None,
) -> dict[str, Any]:
    """Everything worth knowing about how ZeroMQ (IPv6 on) reaches `endpoint`, as a JSON-able dict.

    `resolve` (getaddrinfo) and `dial` (zmq_connects) are looked up at call time so tests can swap them.
    """
    resolve = resolve or socket.getaddrinfo
    dial = dial or zmq_connects
    host, port = parse_endpoint(endpoint)
    resolve_error: str | None = None
    addresses: list[dict[str, str]] = []
    try:
        for family, _, _, _, sockaddr in resolve(host, port, 0, socket.SOCK_STREAM):
            entry = {"family": family_name(family), "address": sockaddr_text(family, sockaddr)}
            if entry not in addresses:
                addresses.append(entry)
    except (OSError, UnicodeError) as err:
        resolve_error = str(err)
    dials = first_address(resolve, host, port, socket.AF_INET6, socket.AI_V4MAPPED)
    ipv4 = first_address(resolve, host, port, socket.AF_INET)
    host_url = zmq_url(host, port)
    urls = [host_url]
    ipv4_url = zmq_url(ipv4, port) if ipv4 else None
    if ipv4_url and ipv4_url not in urls:
        urls.append(ipv4_url)
    connected = dial(urls, timeout)
    report: dict[str, Any] = {
        "endpoint": host_url,
        "host": host,
        "port": port,
        "addresses": addresses,
        "zmq_ipv6_dials": dials,
        "link_local": is_unscoped_link_local(dials),
        "connected": connected.get(host_url, False),
        "ipv4": ipv4,
        "ipv4_connected": connected.get(ipv4_url, False) if ipv4_url else False,
    }
    report["advice"] = advise(report, resolve_error, timeout)
    return report


@click.group("coordinator", context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Probe a ZeroMQ coordinator endpoint the way nsight-slurm dials it."""


@cli.command("probe")
@click.argument("endpoint")
@click.option(
    "--timeout-seconds",
    type=FiniteFloat(min=0.01),
    default=5.0,
    show_default=True,
    help="How long each ZeroMQ connect may take.",
)
def probe_command(endpoint: str, timeout_seconds: float) -> None:
    """Resolve ENDPOINT (tcp://HOST:PORT or HOST:PORT) like ZeroMQ with IPv6 on, try to connect,
    and print a JSON report with advice. Exit 0 if it connects, 1 if not.

    Example: slurm-multi coordinator probe tcp://node1:45123
    """
    report = probe(endpoint, timeout_seconds)
    click.echo(json.dumps(report, indent=2))
    if not report["connected"]:
        raise HelperError(f"coordinator: cannot connect to {report['endpoint']}: {report['advice']}")
