"""Network plumbing the barrier and the relay share: ports, addresses, listening, socket options,
and how a network error or a peer is named in a message.

Ports: every node of a job derives the same candidate ports from MASTER_PORT and the job ID, in a
window outside the kernel's ephemeral range (so an outgoing connection never holds one) and never
MASTER_PORT itself (the workload binds it on rank 0 right after the barrier).

Addresses (IPv4 only): a listener takes the first non-loopback address of its host's name; a name
that resolves only to loopback (Debian's 127.0.1.1 line) gets the default route's interface
instead, and a client dialing such a name tries that address too. Nothing here sends traffic to
find an address.

Keepalive: each caller passes its own timings (`Keepalive`): the barrier's idle connections wait
for minutes, the relay's links stream and have a stall timer in front of keepalive.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from slurm_multi.common import HelperError, usage_error

LOCAL_RANGE_PATH = "/proc/sys/net/ipv4/ip_local_port_range"
ROUTE_PATH = "/proc/net/route"
FALLBACK_LOCAL_RANGE = (32768, 60999)  # Linux default when the sysctl cannot be read
WINDOW_FLOOR = 10000
# Capping the low window at the usual ephemeral start keeps nodes whose ranges differ only above
# 32768 (60999 vs 65535, 32768 vs 40000) agreeing on the same ports.
WINDOW_CEILING = 32768
MIN_WINDOW = 1024
MAX_CANDIDATES = 32
LOOPBACK = "127.0.0.1"

ATTEMPT_TIMEOUT = 5.0  # one TCP connect attempt
# Our listeners greet every connection at once; a candidate port that does not within this is
# something else (a squatter, a silent listener) and the client moves on.
PROOF_TIMEOUT = 2.0


# --------------------------------------------------------------------------------------------------
# Ports


def read_local_port_range(path: str = LOCAL_RANGE_PATH) -> tuple[int, int]:
    """The kernel's ephemeral port range, or Linux's default when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as handle:
            lo, hi = (int(part) for part in handle.read().split())
    except (OSError, ValueError):
        return FALLBACK_LOCAL_RANGE
    if 1 <= lo <= hi <= 65535:
        return lo, hi
    return FALLBACK_LOCAL_RANGE


def port_window(local_range: tuple[int, int]) -> tuple[int, int]:
    """A port window `[start, end)` that does not overlap the ephemeral range `local_range`."""
    lo, hi = local_range
    low_end = min(lo, WINDOW_CEILING)
    if low_end - WINDOW_FLOOR >= MIN_WINDOW:
        return WINDOW_FLOOR, low_end
    if 65536 - (hi + 1) >= MIN_WINDOW:
        return hi + 1, 65536
    start, end = max(((1024, lo), (hi + 1, 65536)), key=lambda gap: gap[1] - gap[0])
    if end - start < 2 * MAX_CANDIDATES:
        raise ValueError(f"the ephemeral port range {lo}-{hi} leaves no room for the barrier port")
    return start, end


def derive_ports(master_port: int, job_id: int, local_range: tuple[int, int], count: int = 4) -> list[int]:
    """`count` candidate ports, the same on every node of the job, outside the ephemeral range.

    MASTER_PORT itself is skipped: the workload binds it on rank 0 right after the barrier.
    """
    if not 1 <= count <= MAX_CANDIDATES:
        raise ValueError(f"count must be 1..{MAX_CANDIDATES}")
    start, end = port_window(local_range)
    size = end - start
    base = (master_port * 1000003 + job_id) % size
    ports: list[int] = []
    offset = 0
    while len(ports) < count:
        port = start + (base + offset) % size
        offset += 1
        if port != master_port:
            ports.append(port)
    return ports


def override_ports(port: int, count: int = 4) -> list[int]:
    """An explicit first port followed by its successors (wrapping to 1024 past 65535, as often as
    it takes: the relay moves a rank's first port by rank x count, which may pass 65535 many times)."""
    return [p if p <= 65535 else 1024 + (p - 65536) % (65536 - 1024) for p in range(port, port + count)]


def candidate_ports(
    ports: Sequence[int],
    master_port: int | None,
    job_id: int | None,
    override: int | None,
    count: int,
    local_range: tuple[int, int] | None = None,
) -> list[int]:
    """Explicit --port values win, then --override/SM_BARRIER_PORT, then the derivation."""
    if ports:
        return list(dict.fromkeys(ports))
    if override is not None:
        return override_ports(override, count)
    if master_port is None or job_id is None:
        raise usage_error(
            "barrier: no port to use; give --port, or --master-port and --job-id "
            "(MASTER_PORT and SLURM_JOB_ID), or --override (SM_BARRIER_PORT)"
        )
    try:
        return derive_ports(master_port, job_id, local_range or read_local_port_range(), count)
    except ValueError as exc:
        raise usage_error(f"barrier: {exc}; set SM_BARRIER_PORT on every node") from None


# --------------------------------------------------------------------------------------------------
# Addresses


def _ipv4(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 literal `text` is (4 decimal octets), None for anything else."""
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        return None


def _is_loopback(address: str) -> bool:
    found = _ipv4(address)
    return found is not None and found.is_loopback  # 127.0.0.0/8


def _is_ipv4_literal(host: str) -> bool:
    return _ipv4(host) is not None


def dial_once(address: str, port: int, left: float) -> socket.socket:
    """One TCP connection attempt to a peer's address and port (the barrier's and the relay's dial),
    given at most ATTEMPT_TIMEOUT and never more than the `left` seconds of its caller's deadline;
    OSError when it fails (the caller describes it and tries the next address or port)."""
    try:
        return socket.create_connection((address, port), timeout=min(ATTEMPT_TIMEOUT, left))
    except UnicodeError as exc:  # a name the idna codec refuses ("a..b"): as any unresolvable name
        raise OSError(errno.EINVAL, f"bad host name {address!r} ({exc})") from None


def resolve_ipv4(host: str) -> list[str]:
    """IPv4 addresses of `host` in resolver order (the barrier listens on IPv4 only)."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except UnicodeError as exc:  # a name the idna codec refuses ("a..b"): as any unresolvable name
        raise OSError(errno.EINVAL, f"bad host name {host!r} ({exc})") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def interface_ipv4(name: str) -> str | None:
    """The primary IPv4 address of interface `name` (SIOCGIFADDR; sends nothing)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _default_route_interfaces(route_path: str) -> list[str]:
    try:
        with open(route_path, encoding="utf-8") as handle:
            rows = handle.read().splitlines()[1:]
    except OSError:
        return []
    found: list[tuple[int, str]] = []
    for row in rows:
        cols = row.split()
        if len(cols) >= 8 and cols[1] == "00000000" and cols[7] == "00000000":
            try:
                if int(cols[3], 16) & 0x1:  # RTF_UP
                    found.append((int(cols[6]), cols[0]))
            except ValueError:
                continue
    return [name for _, name in sorted(found)]


def routable_interface(route_path: str = ROUTE_PATH) -> tuple[str, str, str]:
    """(interface, its IPv4 address, where the choice came from) of a non-loopback address of this
    host: the default route's interface first (no traffic is sent)."""
    for name in _default_route_interfaces(route_path):
        address = interface_ipv4(name)
        if address and not _is_loopback(address) and address != "0.0.0.0":
            return name, address, f"{name}, the default route's interface"
    try:
        interfaces = [name for _, name in socket.if_nameindex()]
    except OSError:
        interfaces = []
    for name in interfaces:
        address = interface_ipv4(name)
        if address and not _is_loopback(address) and address != "0.0.0.0":
            return name, address, f"{name}, first interface with an IPv4 address"
    raise HelperError("barrier: this host has no routable IPv4 address; pass --bind ADDR")


def routable_local_address(route_path: str = ROUTE_PATH) -> tuple[str, str]:
    """A non-loopback IPv4 address of this host and where it came from (no traffic is sent)."""
    _, address, source = routable_interface(route_path)
    return address, source


def self_name_quirk(host: str) -> str:
    """Why `host`'s first address is one peers cannot reach (Debian's 127.0.1.1 line, an fe80::
    address first), or "" when it is fine. gloo and NCCL advertise that first address."""
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except OSError:
        return ""
    if not infos:
        return ""
    first = ipaddress.ip_address(str(infos[0][4][0]).split("%")[0])
    if first.is_loopback or first.is_link_local:
        kind = "loopback" if first.is_loopback else "link-local"
        return f"{host} resolves to {first} ({kind}) first"
    return ""


def bind_first_free(
    address: str, ports: Sequence[int], backlog: int
) -> tuple[socket.socket | None, list[str]]:
    """Listen on the first of `ports` that is free on `address`: (socket, the ports found in use);
    (None, all of them) when every one is. Any other error is raised, its `filename` the port."""
    busy: list[str] = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                busy.append(str(port))
                continue
            exc.filename = str(port)
            raise
        return sock, busy
    return None, busy


class BindChoice(NamedTuple):
    address: str
    why: str  # empty when `host` resolved to a routable address directly


def choose_bind_address(
    host: str,
    resolve: Callable[[str], list[str]] | None = None,
    routable: Callable[[], tuple[str, str]] | None = None,
) -> BindChoice:
    """The address rank 0 listens on: the first non-loopback IPv4 address of `host`.

    When `host` resolves only to loopback (Debian maps the host name to 127.0.1.1) or not at all,
    a listener there would strand every worker, so a routable local address is used instead.
    """
    resolve = resolve or resolve_ipv4
    routable = routable or routable_local_address
    try:
        addresses = resolve(host)
    except OSError as exc:
        why = f"{host} does not resolve ({exc.strerror or exc})"
    else:
        for address in addresses:
            if not _is_loopback(address) and address != "0.0.0.0":
                return BindChoice(address, "")
        why = f"{host} resolves to {', '.join(addresses) or 'nothing'} (loopback)"
    address, source = routable()
    return BindChoice(address, f"{why}; listening on {address} ({source}) instead")


def connect_addresses(host: str) -> list[str]:
    """Where a client dials `host`: its IPv4 addresses; for a name that resolves only to loopback
    (this host, Debian style) also the routable address rank 0 listens on in that case."""
    if _is_ipv4_literal(host):
        return [host]
    addresses = resolve_ipv4(host)
    if addresses and all(_is_loopback(a) for a in addresses):
        try:
            addresses.append(routable_local_address()[0])
        except HelperError:
            pass
    return list(dict.fromkeys(addresses))


class Backoff:
    """The waits between rounds of dials to a peer that does not listen yet, one owner for the
    barrier's join, the relay's child and the fitness mesh: `start` seconds while the first `quick`
    seconds of the dial last (a peer usually starts a moment late, and a round of refused connects
    costs microseconds), then twice the last wait each time, up to `cap` (a peer that takes minutes
    is not hammered). A round tries every candidate at once; only the rounds wait."""

    __slots__ = ("cap", "quick_until", "wait")

    def __init__(self, start: float, cap: float, quick: float = 0.0) -> None:
        self.wait, self.cap = start, cap
        self.quick_until = time.monotonic() + quick if quick > 0 else None

    def next(self, now: float | None = None) -> float:
        """The wait before the next round (`now`: monotonic seconds, when the caller has them)."""
        wait = self.wait
        if self.quick_until is None or (time.monotonic() if now is None else now) >= self.quick_until:
            self.wait = min(wait * 2, self.cap)
        return wait


# --------------------------------------------------------------------------------------------------
# Socket options and messages


class Keepalive(NamedTuple):
    """TCP keepalive timings (seconds, probes): a peer that vanishes without a FIN (a node powered
    off) is dropped after about idle + interval * probes seconds of silence."""

    idle: int
    interval: int
    probes: int
    nodelay: bool = False  # also TCP_NODELAY: lines go out at once instead of waiting to coalesce


def keepalive(sock: socket.socket, timings: Keepalive) -> None:
    """Turn on TCP keepalive with `timings` (the TCP_KEEP* options where the platform has them)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", timings.idle),
        ("TCP_KEEPINTVL", timings.interval),
        ("TCP_KEEPCNT", timings.probes),
    ):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if timings.nodelay:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def peer(addr: object) -> str:
    """`10.0.0.3:21544` for an accepted connection's address."""
    if isinstance(addr, tuple) and len(addr) >= 2:
        return f"{addr[0]}:{addr[1]}"
    return str(addr)


def describe(exc: BaseException) -> str:
    """A network error as a message says it: `connection refused`, `timed out`, `no route to host`."""
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, BrokenPipeError):
        return "broken pipe"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def secs(value: float) -> str:
    """A wait or a timeout in a message: `30`, `2.5`, `120`."""
    return f"{value:.0f}" if value >= 10 or abs(value - round(value)) < 0.05 else f"{value:.1f}"
