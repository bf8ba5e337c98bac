"""The fitness mesh's decisions: every node with every other, and the ring probe.

Every node listens on its port on all IPv4 addresses (SO_REUSEADDR; a port already taken is a local
failure naming it), dials every other node's port (every IPv4 address of its name in turn), retrying
until the deadline, and speaks slurm_multi.fitness.protocol on each connection. The sockets
themselves (buffers, the selector, cutting lines) are slurm_multi.fitness.links'; `Mesh` decides
what each line means, what to answer, when to dial again and when to give up.

The ring probe: rank r sends --probe-bytes to rank (r+1) % N on a connection of its own and measures
the rate until the receiver acknowledges them all (bytes / seconds from the first byte sent to the
last ACK). At --probe-seconds (or when the HELLOs are due) the probe stops, resets its connection,
and the rate is the bytes acknowledged / the seconds until the last acknowledgement (0 when none
came): a slow link never makes the stage time out.

A node is done once it has delivered its HELLO to every peer (GOT) and received every peer's HELLO,
or at the deadline; it keeps listening until every peer has delivered to it.
"""

from __future__ import annotations

import errno
import selectors
import time
from collections.abc import Sequence
from typing import Any

from slurm_multi import auth
from slurm_multi.fitness.links import HANDSHAKE_TIMEOUT, Conn, Dial, Links
from slurm_multi.fitness.protocol import (
    BAD_TOKEN,
    Hello,
    ProtocolError,
    Rejected,
    ack_line,
    claimed_rank,
    err_line,
    got_line,
    greeting_line,
    hello_line,
    join_line,
    parse_ack,
    parse_got,
    parse_greeting,
    parse_hello,
    parse_join,
    parse_welcome,
    welcome_line,
)
from slurm_multi.net import connect_addresses, describe, secs

ATTEMPT_TIMEOUT = 1.0  # one connect attempt: a dropped SYN never answers
ACK_EVERY, ACK_SECONDS = 256 << 10, 0.1
MAX_REJECTED = 20  # rejected connections kept in the report


class Mesh:
    """This node's side of the mesh; the caller's loop feeds it events and timer ticks."""

    def __init__(
        self,
        sel: selectors.BaseSelector,
        me: int,
        hosts: Sequence[str],
        ports: Sequence[int],
        job: str,
        token: str,
        probe_bytes: int,
        probe_seconds: float,
        hello_by: float,
        deadline: float,
    ) -> None:
        self.me, self.job, self.token = me, job, token
        self.hosts, self.ports = list(hosts), list(ports)
        self.n = len(hosts)
        self.probe_bytes, self.probe_seconds = probe_bytes, probe_seconds
        self.hello_by, self.deadline = hello_by, deadline
        self.peers = [q for q in range(self.n) if q != me]
        self.dials = {q: Dial(q, hosts[q], ports[q], "mesh") for q in self.peers}
        successor = (me + 1) % self.n
        self.probe = Dial(successor, hosts[successor], ports[successor], "probe") if probe_bytes > 0 else None
        self.ring: dict[str, Any] = {
            "to": successor,
            "bytes": 0,
            "seconds": 0.0,
            "bytes_per_s": None,
            "complete": False,
            "error": "",
        }
        if self.probe is None:
            self.ring["error"] = "no probe (--probe-bytes 0)"
        self.links = Links(sel, self, max_conns=4 * self.n + 64)
        self.listen_error = ""
        self.heard: dict[int, dict[str, Any]] = {}
        self.reached: set[int] = set()
        self.token_rejected_by: set[int] = set()
        self.rejected: list[dict[str, Any]] = []
        self.hello: Hello | None = None

    # -- setup and state ---------------------------------------------------------------------------

    def listen(self) -> None:
        port = self.ports[self.me]
        exc = self.links.listen(port, max(128, 4 * self.n))
        if exc is not None:
            if exc.errno == errno.EADDRINUSE:
                self.listen_error = (
                    f"port {port} is already in use on this node (another job's, or a stale stage?)"
                )
            else:
                self.listen_error = f"cannot listen on port {port} ({describe(exc)})"

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

    def next_timer(self) -> float:
        times = [self.deadline]
        for dial in [*self.dials.values(), *([self.probe] if self.probe else [])]:
            if not dial.done and dial.conn is None:
                times.append(dial.next_at)
        if self.probe is not None and not self.probe.done:
            times.append(self.hello_by)
        times += [conn.until for conn in self.links.conns]
        return min(times)

    # -- timers --------------------------------------------------------------------------------------

    def on_timers(self, now: float) -> None:
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
                    f"{probe.error or 'no answer'}"
                )
        for dial in [*self.dials.values(), *([self.probe] if self.probe else [])]:
            if not dial.done and dial.conn is None and now >= dial.next_at and now < self.deadline:
                self._start_dial(dial, now)
        for conn in [c for c in self.links.conns if now >= c.until]:
            self._on_timeout(conn, now)

    def _on_timeout(self, conn: Conn, now: float) -> None:
        if conn.dial is None and conn.state == "probe" and now < self.deadline:
            if conn.count > conn.acked:
                self._ack(conn, now)  # what came before the link stalled
            conn.until = self.deadline
        elif conn.dial is None:
            self.links.close(conn)  # a silent client, or the deadline
        elif conn.state == "send":
            self._finish_probe(conn, now, f"stopped at the bound after {conn.acked} bytes acknowledged")
        elif conn.state == "connect":
            self._fail(conn, "timed out", now)
        else:
            waited = {
                "greet": "no fitness greeting",
                "welcome": "no answer to JOIN",
                "got": "no GOT for our HELLO",
            }
            self._fail(conn, f"{waited.get(conn.state, 'no answer')} within {secs(HANDSHAKE_TIMEOUT)} s", now)

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
        address = dial.addresses[dial.attempts % len(dial.addresses)]
        dial.attempts += 1
        dial.conn = self.links.connect(dial, address, now + ATTEMPT_TIMEOUT)
        if dial.conn is None:
            dial.retry(now)

    def _fail(self, conn: Conn, error: str, now: float) -> None:
        """A dialled connection that broke: note why and dial again later."""
        dial = conn.dial
        assert dial is not None
        if dial.purpose == "probe" and conn.state == "send":
            self._finish_probe(conn, now, f"{error} after {conn.acked} bytes acknowledged")
            return
        self.links.close(conn)
        dial.conn = None
        dial.error = error
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
            conn.state = "welcome"
        elif conn.state == "welcome":
            parse_welcome(text, self.token, self.job, conn.challenge, conn.nonce, dial.rank, dial.purpose)
            if dial.purpose == "probe":
                conn.state, conn.total, conn.started = "send", self.probe_bytes, now
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

    def _finish_probe(self, conn: Conn, now: float, error: str) -> None:
        complete = conn.acked >= conn.total > 0
        seconds = (conn.last_ack if conn.acked else now) - conn.started
        rate = conn.acked / max(seconds, 1e-6) if conn.acked else 0.0
        self.ring.update(
            bytes=conn.acked,
            seconds=round(seconds, 6),
            bytes_per_s=round(rate),
            complete=complete,
            error=error,
        )
        assert self.probe is not None
        self.probe.done, self.probe.conn = True, None
        if complete:
            self.links.close(conn)
        else:  # reset: what is still queued must not compete with the HELLOs
            self.links.reset(conn)

    # -- accepting -----------------------------------------------------------------------------------

    def on_accepted(self, conn: Conn, now: float) -> None:
        conn.challenge = auth.new_nonce()
        self.links.queue(conn, greeting_line(conn.challenge))

    def on_line(self, conn: Conn, text: str, now: float) -> None:
        if conn.dial is not None:
            self._on_dial_line(conn, text, now)
        else:
            self._on_accepted_line(conn, text, now)

    def _on_accepted_line(self, conn: Conn, text: str, now: float) -> None:
        if conn.state == "join":
            try:
                join = parse_join(text, self.token, self.job, conn.challenge, self.me, self.n)
            except ProtocolError as exc:
                if str(exc) == BAD_TOKEN and len(self.rejected) < MAX_REJECTED:
                    self.rejected.append(
                        {"from": conn.addr, "rank": claimed_rank(text, self.n), "reason": BAD_TOKEN}
                    )
                self.links.queue(conn, err_line(str(exc)))
                conn.state, conn.until = "drain", now + HANDSHAKE_TIMEOUT
                return
            conn.nonce, conn.rank = join.nonce, join.rank
            self.links.queue(
                conn, welcome_line(self.token, self.job, conn.challenge, conn.nonce, self.me, join.purpose)
            )
            conn.until = self.deadline
            if join.purpose == "probe":
                conn.state, conn.total, conn.last_ack = "probe", join.nbytes, now
                early, conn.inbuf = bytes(conn.inbuf), bytearray()  # came with the JOIN
                self.on_probe_bytes(conn, len(early), now)
            else:
                conn.state = "hello"
        elif conn.state == "hello":
            hello = parse_hello(text, self.token, self.job, conn.challenge, conn.nonce, conn.rank, self.n)
            received = time.time()
            self.heard.setdefault(
                hello.rank,
                {
                    "host": hello.host,
                    "verdict": hello.verdict,
                    "ring_to": hello.ring_to,
                    "ring_bytes_per_s": hello.ring_rate,
                    "offset": round(hello.sent - received, 6),
                },
            )
            self.links.queue(conn, got_line(self.token, self.job, conn.challenge, conn.nonce, self.me))
            conn.state = "drain"
        elif conn.state != "drain":
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def on_probe_bytes(self, conn: Conn, received: int, now: float) -> None:
        conn.count += received
        if conn.count > conn.total:
            raise ProtocolError("more probe bytes than announced")
        if (
            conn.count == conn.total
            or conn.count - conn.acked >= ACK_EVERY
            or (conn.count > conn.acked and now - conn.last_ack >= ACK_SECONDS)
        ):
            self._ack(conn, now)
        elif conn.count > conn.acked:  # acknowledged within ACK_SECONDS even if no more come (a stall)
            conn.until = min(self.deadline, conn.last_ack + ACK_SECONDS)
        if conn.count == conn.total:
            conn.state = "drain"

    def _ack(self, conn: Conn, now: float) -> None:
        conn.acked, conn.last_ack, conn.until = conn.count, now, self.deadline
        self.links.queue(conn, ack_line(self.token, self.job, conn.challenge, conn.nonce, conn.count))

    # -- the loop's entry points and a broken connection ------------------------------------------

    def on_event(self, key: selectors.SelectorKey, mask: int, now: float) -> None:
        self.links.on_event(key, mask, now)

    def on_broken(self, conn: Conn, exc: OSError | ProtocolError, now: float) -> None:
        """A connection whose socket failed or whose peer broke the protocol."""
        if isinstance(exc, Rejected):
            if conn.dial is not None:
                if str(exc) == BAD_TOKEN:
                    self.token_rejected_by.add(conn.dial.rank)
                self._fail(conn, f"rejected: {exc}", now)
            else:
                self.links.close(conn)
            return
        error = describe(exc) if isinstance(exc, OSError) else str(exc)
        if conn.dial is not None:
            self._fail(conn, error, now)
        else:  # tell the dialer why (best effort), then drop it
            if isinstance(exc, ProtocolError):
                try:
                    conn.sock.send(err_line(str(exc)))
                except OSError:
                    pass
            self.links.close(conn)

    def close(self, linger: float = 0.5) -> None:
        """Flush what is still queued (a GOT, an ACK) for up to `linger` s, then close everything."""
        self.links.close_all(linger)

    # -- the record ----------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        offsets = {str(self.me): 0.0, **{str(q): info["offset"] for q, info in sorted(self.heard.items())}}
        peers = {
            str(q): {key: info[key] for key in ("host", "verdict", "ring_to", "ring_bytes_per_s")}
            for q, info in sorted(self.heard.items())
        }
        return {
            "port": self.ports[self.me],
            "listening": self.links.listener is not None,
            "listen_error": self.listen_error,
            "reached": sorted(self.reached),
            "heard": sorted(self.heard),
            "errors": {
                str(q): d.error for q, d in sorted(self.dials.items()) if q not in self.reached and d.error
            },
            "token_rejected_by": sorted(self.token_rejected_by),
            "rejected": self.rejected,
            "ring": self.ring,
            "offsets": offsets,
            "peers": peers,
        }
