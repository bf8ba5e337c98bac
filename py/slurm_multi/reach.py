"""Whether the batch host still reaches the job's other nodes on the network (the batch step's watch).

A node whose network is gone is lost long before Slurm says so: slurmctld declares it DOWN only
after SlurmdTimeout (300 s by default), and until then srun waits for its task. So the
watch dials every other node of the job, every few seconds, on a port of the job's window (the
ports the nodes must already reach each other on: slurm_multi.net), chosen by the job's secret
token (`secret_port`): another user cannot know it in advance, so cannot hold it with a full
accept queue to make a healthy node look silent. Any answer proves the node's network is up: an
accepted connection, closed at once, or a refusal (RST). No answer within CONNECT_TIMEOUT (or
"no route to host") is silence.

A node silent for LOST_AFTER seconds without a break is lost: "its network is gone". The rules
that keep a healthy job alive:
- a node is judged only once it has answered at least once (a site whose firewall drops the port
  never loses a node here; Slurm's DOWN still does);
- nothing is judged in a round where the controller did not answer the watch (`scontrol`), nor
  when every node is silent at once: then the batch host's own network is the one in doubt.

One round dials every node at once (non-blocking sockets), so 1,000 nodes cost one round's
CONNECT_TIMEOUT, not a thousand of them.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections.abc import Callable, Mapping, Sequence

LOST_AFTER = 10.0  # seconds of silence that make a node lost
CONNECT_TIMEOUT = 1.0  # one dial; a node on the same fabric answers within milliseconds
# A dial that ends with one of these has reached the node's kernel: its network is up.
ANSWERED = (0, errno.ECONNREFUSED, errno.ECONNRESET)


def secret_port(token: str, job_id: str, master_port: int, local_range: tuple[int, int]) -> int:
    """A port of the job's window (net.port_window) picked by HMAC-SHA256 of the job's token, never
    MASTER_PORT (the workload's)."""
    import hmac

    from slurm_multi.net import port_window

    start, end = port_window(local_range)
    digest = hmac.new(token.encode(), f"reach:{job_id}".encode(), "sha256").digest()
    offset = int.from_bytes(digest[:4], "big") % (end - start)
    if start + offset == master_port:
        offset = (offset + 1) % (end - start)
    return start + offset


def resolve(hosts: Sequence[str], port: int) -> dict[str, tuple[str, int]]:
    """Each host's first IPv4 address; a host that does not resolve is left out (never judged)."""
    addresses = {}
    for host in hosts:
        try:
            found = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
        except OSError:
            continue
        if found:
            addresses[host] = found[0][4][:2]
    return addresses


def dial_all(addresses: Mapping[str, tuple[str, int]], timeout: float = CONNECT_TIMEOUT) -> dict[str, bool]:
    """host -> whether it answered one dial within `timeout` (all hosts dialled at once)."""
    answered = {host: False for host in addresses}
    selector = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    try:
        for host, address in addresses.items():
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EAGAIN):
                selector.register(sock, selectors.EVENT_WRITE, host)
            else:
                answered[host] = code in ANSWERED
        deadline = time.monotonic() + timeout
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                code = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # type: ignore[union-attr]
                answered[key.data] = code in ANSWERED
                selector.unregister(key.fileobj)
    finally:
        selector.close()
        for sock in socks:
            sock.close()
    return answered


class Reach:
    """The watch's view of which nodes still answer, round after round (see the module docstring)."""

    def __init__(
        self,
        hosts: Sequence[str],
        port: int,
        lost_after: float = LOST_AFTER,
        dial: Callable[[Mapping[str, tuple[str, int]]], dict[str, bool]] | None = None,
        addresses: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        self.addresses = dict(resolve(hosts, port) if addresses is None else addresses)
        self.lost_after, self.dial = lost_after, dial
        self.answered_once: set[str] = set()
        self.silent_since: dict[str, float] = {}
        self.lost: set[str] = set()

    def look(self, now: float, controller_answered: bool) -> list[tuple[str, float]]:
        """One round; the nodes newly lost, each with how long it has been silent."""
        if not self.addresses:
            return []
        dial = self.dial or dial_all
        answers = dial({h: a for h, a in self.addresses.items() if h not in self.lost})
        for host, answered in answers.items():
            if answered:
                self.answered_once.add(host)
                self.silent_since.pop(host, None)
            elif host in self.answered_once:
                self.silent_since.setdefault(host, now)
        silent = [host for host, answered in answers.items() if not answered]
        if not controller_answered or (len(answers) > 1 and len(silent) == len(answers)):
            return []
        found = []
        for host in silent:
            since = self.silent_since.get(host)
            if since is not None and now - since >= self.lost_after:
                self.lost.add(host)
                found.append((host, now - since))
        return found
