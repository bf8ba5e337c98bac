"""The fitness mesh's listening side: what the connections this node accepts say, and what it answers.

Every accepted connection is greeted with a fresh challenge (`FITNESS <S>`) and must show the token
within links.TOKEN_DEADLINE: a JOIN signed over S, the job and the ranks. Only then does it keep its
slot (Links.trust); one that does not verify gets `ERR <reason>`, is recorded (at most MAX_REJECTED
of them, with the rank it claims: unsigned, so for the record only) and drained. A verified `mesh`
JOIN delivers one HELLO (answered with GOT); a `probe` JOIN streams the bytes it announced
(acknowledged at least every ACK_EVERY bytes or ACK_SECONDS, and what came before a stall). What
each peer's HELLO said is `heard`; the port it carries is passed on (`learned`), so this node's own
dials to that peer go straight there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from slurm_multi import auth
from slurm_multi.fitness.links import Conn, Links
from slurm_multi.fitness.protocol import (
    BAD_TOKEN,
    ProtocolError,
    Rejected,
    ack_line,
    claimed_rank,
    err_line,
    got_line,
    greeting_line,
    parse_hello,
    parse_join,
    welcome_line,
)

ACK_EVERY, ACK_SECONDS = 256 << 10, 0.1
MAX_REJECTED = 20  # rejected connections kept in the report


class Inbound:
    """The connections this node accepted, and what their peers' HELLOs said."""

    def __init__(
        self,
        links: Links,
        me: int,
        n: int,
        job: str,
        token: str,
        deadline: float,
        learned: Callable[[int, int | None], None],
    ) -> None:
        self.links, self.me, self.n, self.job, self.token = links, me, n, job, token
        self.deadline, self.learned = deadline, learned
        self.heard: dict[int, dict[str, Any]] = {}
        self.rejected: list[dict[str, Any]] = []

    def on_accepted(self, conn: Conn, now: float) -> None:
        conn.challenge = auth.new_nonce()
        self.links.queue(conn, greeting_line(conn.challenge))

    def on_line(self, conn: Conn, text: str, now: float) -> None:
        if conn.state == "join":
            self._on_join(conn, text, now)
        elif conn.state == "hello":
            hello = parse_hello(text, self.token, self.job, conn.challenge, conn.nonce, conn.rank, self.n)
            received = time.time()
            if hello.rank not in self.heard:
                self.heard[hello.rank] = {
                    "host": hello.host,
                    "port": hello.port,
                    "verdict": hello.verdict,
                    "ring_to": hello.ring_to,
                    "ring_bytes_per_s": hello.ring_rate,
                    "ring_cpu_bound": hello.ring_cpu_bound,
                    "offset": round(hello.sent - received, 6),
                }
                self.learned(hello.rank, hello.port)
            self.links.queue(conn, got_line(self.token, self.job, conn.challenge, conn.nonce, self.me))
            conn.state = "drain"
        elif conn.state != "drain":
            raise ProtocolError(f"unexpected line in state {conn.state}")

    def _on_join(self, conn: Conn, text: str, now: float) -> None:
        try:
            join = parse_join(text, self.token, self.job, conn.challenge, self.me, self.n)
        except ProtocolError as exc:
            if str(exc) == BAD_TOKEN and len(self.rejected) < MAX_REJECTED:
                self.rejected.append(
                    {"from": conn.addr, "rank": claimed_rank(text, self.n), "reason": BAD_TOKEN}
                )
            self.links.queue(conn, err_line(str(exc)))
            conn.state, conn.until = "drain", min(conn.until, self.deadline)
            return
        self.links.trust(conn)
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

    def on_timeout(self, conn: Conn, now: float) -> None:
        if conn.state == "probe" and now < self.deadline:
            if conn.count > conn.acked:
                self._ack(conn, now)  # what came before the link stalled
            conn.until = self.deadline
        else:
            self.links.close(conn)  # the token not shown in time, a silent client, or the deadline

    def on_broken(self, conn: Conn, exc: OSError | ProtocolError) -> None:
        """Tell the dialer why (best effort, unless it was its own `ERR`), then drop it."""
        if isinstance(exc, ProtocolError) and not isinstance(exc, Rejected) and conn.error is None:
            try:
                conn.sock.send(err_line(str(exc)))
            except OSError:
                pass
        self.links.close(conn)
