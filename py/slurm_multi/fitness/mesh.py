"""The fitness mesh's decisions: each node with its partners, and the ring probe.

Partners (`partners`): a node dials, and hears from, its ring neighbours (r - 1, r + 1) and the nodes
at EXTRA_OFFSETS more offsets +-o chosen from the job ID, the same on every node: a job costs about
6 N connections and a node 12 whatever N (every node with every other when N <= 7), and every node
is checked by all of its partners (at least 2 with N >= 3). The offsets are drawn per job, so a
rack of consecutive failed nodes does not leave a node only failed checkers.

Every node listens on the first free of its candidate ports on all IPv4 addresses (SO_REUSEADDR): a
candidate another process holds is skipped, and a node with every candidate taken listens nowhere,
which is reported (its HELLO says so) and never counted against it: anybody on the node can hold a
port. It dials each partner's candidates in turn (every IPv4 address of its name on each),
retrying until the deadline, and speaks slurm_multi.fitness.protocol on each connection; the
candidate a peer answered on (a WELCOME signed for our nonce) or named in its signed HELLO is then
the only one dialled. The sockets themselves (buffers, the selector, cutting lines, who keeps a
slot) are slurm_multi.fitness.links'; what the accepted connections say is
slurm_multi.fitness.inbound's; `Mesh` dials, decides what its dials' lines mean, when to dial
again and when to give up, and keeps the figures.

The ring probe: rank r sends --probe-bytes to rank (r+1) % N on a connection of its own and measures
the rate until the receiver acknowledges them all (bytes / seconds from the first byte sent to the
last ACK). At --probe-seconds (or when the HELLOs are due) the probe stops, resets its connection,
and the rate is the bytes acknowledged / the seconds until the last acknowledgement (0 when none
came): a slow link never makes the stage time out.

A node is done once it has delivered its HELLO to every partner (GOT) and received every partner's
HELLO, or at the deadline; it keeps listening until every partner has delivered to it.
"""

from __future__ import annotations

import errno
import hashlib
import selectors
import time
from collections.abc import Sequence
from typing import Any

from slurm_multi import auth
from slurm_multi.fitness.inbound import Inbound
from slurm_multi.fitness.links import GREETING_TIMEOUT, HANDSHAKE_TIMEOUT, Conn, Dial, Links
from slurm_multi.fitness.protocol import (
    BAD_TOKEN,
    Hello,
    ProtocolError,
    Rejected,
    hello_line,
    join_line,
    parse_ack,
    parse_got,
    parse_greeting,
    parse_welcome,
    ports_text,
)
from slurm_multi.net import connect_addresses, describe, secs

ATTEMPT_TIMEOUT = 1.0  # one connect attempt: a dropped SYN never answers
WAITED = {
    "greet": f"no fitness greeting within {secs(GREETING_TIMEOUT)} s",
    "welcome": f"no answer to JOIN within {secs(HANDSHAKE_TIMEOUT)} s",
    "got": f"no GOT for our HELLO within {secs(HANDSHAKE_TIMEOUT)} s",
}


# what fitness.json keeps of each partner's HELLO
PEER_KEYS = ("host", "port", "verdict", "ring_to", "ring_bytes_per_s", "ring_cpu_bound")
CPU_BOUND_SHARE = 0.1  # a probe whose sender waited for a CPU longer than this share of it: cpu-bound
EXTRA_OFFSETS = 2  # offsets beyond the ring's: each node has 2 x (1 + 2) = 6 partners


def partners(me: int, n: int, job: str, extra: int = EXTRA_OFFSETS) -> list[int]:
    """The ranks rank `me` of an `n`-node job dials and hears from: me +- 1 and me +- o for `extra`
    offsets o drawn from the job ID (a symmetric set: `me` is a partner of each of its partners);
    every other rank when that would be all or nearly all of them."""
    if n - 1 <= 2 * (1 + extra):
        return [q for q in range(n) if q != me]
    # 2 .. (n - 1) // 2: o and n - o are the same pair of partners, and n / 2 would be one node
    candidates, offsets = list(range(2, (n - 1) // 2 + 1)), [1]
    for i in range(extra):
        digest = hashlib.sha256(f"fitness-partners|{job}|{n}|{i}".encode()).digest()
        offsets.append(candidates.pop(int.from_bytes(digest[:8], "big") % len(candidates)))
    return sorted({(me + sign * offset) % n for offset in offsets for sign in (1, -1)})


def cpu_waited() -> float | None:
    """Seconds this thread has waited for a CPU while ready to run (the kernel's run delay, the second
    field of /proc/thread-self/schedstat); None where the kernel does not keep it. A probe whose
    sender waited for a CPU for much of it measured the node's cores, not its link: its rate is only
    a lower bound (the judge never calls it slow)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class Mesh:
    """This node's side of the mesh; the caller's loop feeds it events and timer ticks."""

    def __init__(
        self,
        sel: selectors.BaseSelector,
        me: int,
        hosts: Sequence[str],
        ports: Sequence[Sequence[int]],
        job: str,
        token: str,
        probe_bytes: int,
        probe_seconds: float,
        hello_by: float,
        deadline: float,
        peers: Sequence[int] | None = None,
    ) -> None:
        """`peers`: the ranks to dial and hear from (default: `partners`)."""
        self.me, self.job, self.token = me, job, token
        self.hosts, self.ports = list(hosts), [list(candidates) for candidates in ports]
        self.n = len(hosts)
        self.probe_bytes, self.probe_seconds = probe_bytes, probe_seconds
        self.hello_by, self.deadline = hello_by, deadline
        self.peers = sorted(set(partners(me, self.n, job) if peers is None else peers) - {me})
        self.dials = {q: Dial(q, hosts[q], self.ports[q], "mesh") for q in self.peers}
        successor = (me + 1) % self.n
        self.probe = (
            Dial(successor, hosts[successor], self.ports[successor], "probe") if probe_bytes > 0 else None
        )
        self.ring: dict[str, Any] = {
            "to": successor,
            "bytes": 0,
            "seconds": 0.0,
            "bytes_per_s": None,
            "complete": False,
            "error": "",
            "cpu_wait": None,
            "cpu_bound": False,
        }
        self._waited_at_start: float | None = None
        if self.probe is None:
            self.ring["error"] = "no probe (--probe-bytes 0)"
        # Two connections per partner at most are ours; the rest of the table is room for retries
        # (and for strangers, who never take a trusted slot: slurm_multi.fitness.links).
        room = len(self.peers) + 1
        self.links = Links(sel, self, max_conns=4 * room + 64, per_source=max(8, 2 * room))
        self.inbound = Inbound(self.links, me, self.n, job, token, deadline, self.learned)
        self.listen_error = ""
        self.all_taken = False
        self.reached: set[int] = set()
        self.nowhere: set[int] = set()  # peers whose HELLO says they listen on no port
        self.token_rejected_by: set[int] = set()
        self.hello: Hello | None = None

    # -- setup and state ---------------------------------------------------------------------------

    def listen(self) -> None:
        mine = self.ports[self.me]
        exc = self.links.listen(mine, max(128, 4 * len(self.peers)))
        if exc is not None:
            self.listen_error = f"cannot listen on port {exc.filename or mine[0]} ({describe(exc)})"
            if exc.errno == errno.EADDRNOTAVAIL:
                self.listen_error += "; is IPv4 configured on this node?"
        elif self.links.listener is None:
            self.all_taken = True
            self.listen_error = (
                f"every candidate fitness port ({ports_text(mine)}) is held by another process on "
                "this node: not judged, but no peer could check that it reaches this node"
            )

    def local_listen_error(self) -> str:
        """A listen error that is this node's own failure (a port another process holds is not)."""
        return "" if self.all_taken else self.listen_error

    @property
    def heard(self) -> dict[int, dict[str, Any]]:
        return self.inbound.heard

    def learned(self, rank: int, port: int | None) -> None:
        """Rank's signed HELLO said where it listens: dial it there, or not at all (`None`)."""
        for dial in (self.dials.get(rank), self.probe if self.probe and self.probe.rank == rank else None):
            if dial is None or dial.done:
                continue
            if port is not None:
                dial.known = port
                continue
            self.nowhere.add(rank)
            if dial.conn is not None:
                self.links.close(dial.conn)
                dial.conn = None
            dial.done, dial.error = True, "listens on no port (another process holds every candidate)"
            if dial.purpose == "probe":
                self.ring["error"] = f"no probe to rank {rank}: it {dial.error}"

    def probe_done(self) -> bool:
        return self.probe is None or self.probe.done

    def done(self) -> bool:
        delivered = all(dial.done for dial in self.dials.values())
        heard_all = self.links.listener is None or len(self.heard) == len(self.peers)
        return delivered and heard_all and self.probe_done()

    def not_heard(self) -> list[int]:
        return [q for q in self.peers if q not in self.heard]

    def set_hello(self, hello: Hello, now: float) -> None:
        self.hello = hello
        for conn in list(self.links.conns):
            if conn.dial is not None and conn.state == "joined":
                self._send_hello(conn, now)

    def _all_dials(self) -> list[Dial]:
        return [*self.dials.values(), *([self.probe] if self.probe else [])]

    def next_timer(self) -> float:
        times = [self.deadline]
        for dial in self._all_dials():
            if not dial.done and dial.conn is None:
                times.append(dial.next_at)
        if self.probe is not None and not self.probe.done:
            times.append(self.hello_by)
        if self.links.paused_until:
            times.append(self.links.paused_until)
        times += [conn.until for conn in self.links.conns]
        return min(times)

    # -- timers --------------------------------------------------------------------------------------

    def on_timers(self, now: float) -> None:
        self.links.tick(now)
        probe = self.probe
        if probe is not None and not probe.done and now >= self.hello_by:
            if probe.conn is not None and probe.conn.state == "send":
                self._finish_probe(
                    probe.conn, now, f"stopped at the bound after {probe.conn.acked} bytes acknowledged"
                )
            else:
                if probe.conn is not None:
                    self.links.close(probe.conn)
                    probe.conn = None
                probe.done = True
                self.ring["error"] = (
                    f"no probe connection to {probe.host} (rank {probe.rank}) in time: "
                    f"{probe.said() or 'no answer'}"
                )
        for dial in self._all_dials():
            if not dial.done and dial.conn is None and now >= dial.next_at and now < self.deadline:
                self._start_dial(dial, now)
        for conn in [c for c in self.links.conns if now >= c.until]:
            if conn in self.links.conns:  # a timeout before may have closed it
                self._on_timeout(conn, now)

    def _on_timeout(self, conn: Conn, now: float) -> None:
        if conn.dial is None:
            self.inbound.on_timeout(conn, now)
        elif conn.state == "send":
            self._finish_probe(conn, now, f"stopped at the bound after {conn.acked} bytes acknowledged")
        elif conn.state == "connect":
            self._fail(conn, "timed out", now)
        else:
            self._fail(conn, WAITED.get(conn.state, "no answer"), now)

    # -- dialing -------------------------------------------------------------------------------------

    def _start_dial(self, dial: Dial, now: float) -> None:
        if dial.addresses is None:
            try:
                dial.addresses = connect_addresses(dial.host) or None
            except OSError as exc:
                dial.error = f"{dial.host} does not resolve ({describe(exc)})"
            if dial.addresses is None:
                dial.error = dial.error or f"{dial.host} has no IPv4 address"
                dial.retry(now)
                return
        address, port = dial.target()
        dial.attempts += 1
        dial.conn = self.links.connect(dial, address, port, now + ATTEMPT_TIMEOUT)
        if dial.conn is None:
            dial.retry(now)

    def _fail(self, conn: Conn, error: str, now: float, refused: bool = False) -> None:
        """A dialled connection that broke (`refused`: its connect was): note why and dial again
        (the next candidate, unless the peer's port is known: Dial.retry says when)."""
        dial = conn.dial
        assert dial is not None
        if dial.purpose == "probe" and conn.state == "send":
            self._finish_probe(conn, now, f"{error} after {conn.acked} bytes acknowledged", broken=True)
            return
        self.links.close(conn)
        dial.conn = None
        dial.note(conn.port, error, refused)
        dial.retry(now)

    def _on_dial_line(self, conn: Conn, text: str, now: float) -> None:
        dial = conn.dial
        assert dial is not None
        if conn.state == "greet":
            conn.challenge = parse_greeting(text)
            conn.nonce = auth.new_nonce()
            nbytes = self.probe_bytes if dial.purpose == "probe" else 0
            self.links.queue(
                conn,
                join_line(
                    self.token, self.job, conn.challenge, conn.nonce, self.me, dial.rank, dial.purpose, nbytes
                ),
            )
            conn.state, conn.until = "welcome", now + HANDSHAKE_TIMEOUT
        elif conn.state == "welcome":
            parse_welcome(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank, dial.purpose)
            self.token_rejected_by.discard(dial.rank)  # (an ERR on another candidate was not its)
            for same in (self.dials.get(dial.rank), self.probe):
                if same is not None and same.rank == dial.rank:
                    same.known = conn.port
            if dial.purpose == "probe":
                conn.state, conn.total, conn.started = "send", self.probe_bytes, now
                self._waited_at_start = cpu_waited()
                conn.until = min(now + self.probe_seconds, self.hello_by)
                self.links.pump(conn)
            else:
                conn.state, conn.until = "joined", float("inf")
                if self.hello is not None:
                    self._send_hello(conn, now)
        elif conn.state == "got":
            parse_got(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank)
            self.reached.add(dial.rank)
            dial.done, dial.error = True, ""
            self.links.close(conn)
            dial.conn = None
        elif conn.state == "send":
            conn.acked, conn.last_ack = (
                parse_ack(text, self.token, self.job, conn.challenge, conn.nonce, conn.total),
                now,
            )
            if conn.acked >= conn.total:
                self._finish_probe(conn, now, "")
        else:
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def _send_hello(self, conn: Conn, now: float) -> None:
        assert self.hello is not None
        hello = self.hello._replace(sent=time.time())
        self.links.queue(conn, hello_line(self.token, self.job, conn.challenge, conn.nonce, hello))
        conn.state, conn.until = "got", now + HANDSHAKE_TIMEOUT

    def _finish_probe(self, conn: Conn, now: float, error: str, broken: bool = False) -> None:
        """The probe ended: complete, stopped at its bound (its rate from the acks: a slow link), or
        `broken` (the connection failed: the peer's stage ended under it, e.g. its task stopped it
        after a failed prepare): no rate, or a dying peer's link read as slow and named both ends."""
        complete = conn.acked >= conn.total > 0
        seconds = (conn.last_ack if conn.acked else now) - conn.started
        rate = conn.acked / max(seconds, 1e-6) if conn.acked else 0.0
        waited, start = cpu_waited(), self._waited_at_start
        share = None
        if waited is not None and start is not None and seconds > 0:
            share = (waited - start) / seconds
        self.ring.update(
            bytes=conn.acked,
            seconds=round(seconds, 6),
            bytes_per_s=None if broken and not complete else round(rate),
            complete=complete,
            error=error,
            cpu_wait=None if share is None else round(min(share, 1.0), 3),
            cpu_bound=share is not None and share > CPU_BOUND_SHARE,
        )
        assert self.probe is not None
        self.probe.done, self.probe.conn = True, None
        if complete:
            self.links.close(conn)
        else:  # reset: what is still queued must not compete with the HELLOs
            self.links.reset(conn)

    # -- the handler of every connection's events (links.Handler) -----------------------------------

    def on_event(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        self.links.on_event(key, mask, now)

    def on_events(self, events: Sequence[tuple[selectors.SelectorKey, int]], now: float) -> None:
        """One round of the selector: the connections first, new ones last (a JOIN that came in this
        round is trusted before a flood of new connections could push it out)."""
        for key, mask in sorted(events, key=lambda event: event[0].data is self.links):
            self.links.on_event(key, mask, now)

    def on_accepted(self, conn: Conn, now: float) -> None:
        self.inbound.on_accepted(conn, now)

    def on_line(self, conn: Conn, text: str, now: float) -> None:
        if conn.dial is not None:
            self._on_dial_line(conn, text, now)
        else:
            self.inbound.on_line(conn, text, now)

    def on_probe_bytes(self, conn: Conn, received: int, now: float) -> None:
        self.inbound.on_probe_bytes(conn, received, now)

    def on_broken(self, conn: Conn, exc: OSError | ProtocolError, now: float) -> None:
        """A connection whose socket failed or whose peer broke the protocol: only it is dropped."""
        if conn.dial is None:
            self.inbound.on_broken(conn, exc)
            return
        if isinstance(exc, Rejected):
            if str(exc) == BAD_TOKEN and conn.dial.rank not in self.reached:
                self.token_rejected_by.add(conn.dial.rank)
            self._fail(conn, f"rejected: {exc}", now)
            return
        if isinstance(exc, OSError):
            self._fail(conn, describe(exc), now, refused=exc.errno == errno.ECONNREFUSED)
            return
        self._fail(conn, str(exc), now)

    def close(self, linger: float = 0.5) -> None:
        """Flush what is still queued (a GOT, an ACK) for up to `linger` s, then close everything."""
        self.links.close_all(linger)

    # -- the record ----------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        heard = self.heard
        offsets = {str(self.me): 0.0, **{str(q): info["offset"] for q, info in sorted(heard.items())}}
        peers = {str(q): {key: info[key] for key in PEER_KEYS} for q, info in sorted(heard.items())}
        return {
            "port": self.links.port,
            "candidates": self.ports[self.me],
            "ports_taken": self.links.taken,
            "listening": self.links.listener is not None,
            "listen_error": self.listen_error,
            "partners": self.peers,
            "connections": {
                "dialled": sum(dial.attempts for dial in self._all_dials()),
                "accepted": self.links.accepted,
            },
            "reached": sorted(self.reached),
            "heard": sorted(heard),
            "errors": {
                str(q): d.said() for q, d in sorted(self.dials.items()) if q not in self.reached and d.said()
            },
            "token_rejected_by": sorted(self.token_rejected_by),
            "rejected": self.inbound.rejected,
            "ring": self.ring,
            "offsets": offsets,
            "peers": peers,
        }
