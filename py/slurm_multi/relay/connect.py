"""Setting a node's links up: dial the parent (the child's side of the handshake), listen, and
gather the children (the parent's side), until every subtree below is connected and READY.

Both sides prove the job token (slurm_multi.relay.protocol has the lines). Whatever else answers on
a candidate port (a squatter, another rank's relay, a stale run) costs a child seconds, never the
job: it is named and passed over. A parent greets every connection at once and drops one that sends
no valid AUTH within PROOF_TIMEOUT, so idle or slow connections never keep a child out.
"""

from __future__ import annotations

import selectors
import socket
import time

from slurm_multi import auth, net
from slurm_multi.common import HelperError, timeout_error, usage_error
from slurm_multi.relay.link import ABORT_SEND_TIMEOUT, Link, collect
from slurm_multi.relay.protocol import (
    auth_line,
    header_line,
    hello_line,
    link_key,
    parent_proof,
    parse_answer,
    parse_auth,
    parse_header,
    parse_hello,
)
from slurm_multi.relay.tree import Plan, parent_of
from slurm_multi.wire import ProtocolError

HANDSHAKE_TIMEOUT = 10.0  # a child's wait for the stream header once its parent proved the token
MAX_PENDING = 64  # handshakes a parent keeps open at once
BACKOFF_START, BACKOFF_MAX = 0.05, 1.0
READY_GRACE = 10.0  # a parent waits this much longer than a child, so the child's reason arrives
# A peer that vanishes without a FIN (a node powered off) is noticed by the stall timer first;
# keepalive is the backstop for an idle link (rank 0 waiting on its source, the DONE wait), so it
# probes sooner than the barrier's. No Nagle delay on the status lines and small last frames.
KEEPALIVE = net.Keepalive(idle=10, interval=5, probes=3, nodelay=True)


# --------------------------------------------------------------------------------------------------
# The child's side: dial the parent


def dial_parent(plan: Plan, deadline: float) -> Link:
    """Our authenticated parent's link, trying its candidates at each address until `deadline`."""
    parent = parent_of(plan.rank, plan.fanout)
    assert parent is not None
    met: dict[str, str] = {}  # candidate address -> what answered there that was not our parent
    pname = plan.name(parent)
    host = plan.parent_host or (plan.hosts[parent] if parent < len(plan.hosts) else None)
    if host is None and not plan.loopback:
        raise usage_error(f"relay: {plan.me}: no host for {pname}; give --nodes or --parent-host")
    ports = plan.ports_of(parent)
    if plan.loopback:
        addresses = [net.LOOPBACK]
    else:
        try:
            addresses = net.connect_addresses(str(host))
        except OSError as exc:
            raise usage_error(
                f"relay: {plan.me}: cannot resolve {host} ({pname}): {net.describe(exc)}"
            ) from None
    last_error, backoff = "nothing tried", net.Backoff(BACKOFF_START, BACKOFF_MAX)
    while True:
        for address in addresses:
            for port in ports:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    sock = net.dial_once(address, port, left)
                except OSError as exc:
                    last_error = net.describe(exc)
                    continue
                link = Link(sock, parent, pname, f"{address}:{port}")
                try:
                    what = _handshake_as_child(plan, link, parent)
                    if not what:
                        _say_met(plan, met, link.where)
                        return link
                    met[link.where] = what
                    last_error = f"{link.where} {what}"
                except (OSError, ProtocolError) as exc:
                    last_error = f"{link.where}: {net.describe(exc)}"
                    met[link.where] = net.describe(exc)
                except HelperError:
                    link.close()
                    raise
                link.close()
        if time.monotonic() >= deadline:
            span = f"{ports[0]}-{ports[-1]}" if len(ports) > 1 else str(ports[0])
            shown = net.LOOPBACK if plan.loopback else host
            seen = "; ".join(f"{where}: {what}" for where, what in met.items())
            hint = (
                "; every node must get the same job token ($SM_BARRIER_TOKEN or --token-env)"
                if "token" in seen
                else "; is its relay running?"
            )
            raise timeout_error(
                f"relay: {plan.me}: {pname} did not answer on {shown}:{span} within "
                f"{net.secs(plan.connect_timeout)} s (last error: {last_error}"
                + (f"; met: {seen}" if seen else "")
                + f"){hint}"
            )
        time.sleep(min(backoff.next(), max(0.0, deadline - time.monotonic())))


def _say_met(plan: Plan, met: dict[str, str], where: str) -> None:
    """Name what answered on the candidates before our parent did (a squatter, a stale relay)."""
    others = {w: what for w, what in met.items() if w != where}
    if others:
        plan.log(
            "before our parent at " + where + ": " + "; ".join(f"{w} {what}" for w, what in others.items())
        )


def _handshake_as_child(plan: Plan, link: Link, parent: int) -> str:
    """Nothing ("") when `link` is our authenticated parent; else what answered there instead
    (another rank's relay, a refusal, an OK without the job token's proof)."""
    net.keepalive(link.sock, KEEPALIVE)
    try:
        nonce_p = parse_hello(link.read_line(net.PROOF_TIMEOUT))
    except ProtocolError as exc:
        raise ProtocolError(f"not a relay ({exc})") from None
    link.own_nonce, link.peer_nonce = auth.new_nonce(), nonce_p
    link.send(auth_line(plan.token, nonce_p, plan.rank, plan.purpose, link.own_nonce))
    verb, rank_p, text = parse_answer(link.read_line(net.PROOF_TIMEOUT))
    if verb == "DENY":
        # Unsigned: our parent's word or anyone's on this port. Never the end: the next candidate.
        return f"refused us: {text}"
    if rank_p != parent:
        return f"rank {rank_p}'s relay"
    if not auth.check(
        plan.token, text, link.own_nonce, nonce_p, str(rank_p), str(plan.rank), plan.purpose, "parent"
    ):
        return "an OK without the job token's proof"
    link.key = link_key(plan.token, nonce_p, link.own_nonce, rank_p, plan.rank, plan.purpose)
    purpose = parse_header(link.read_line(HANDSHAKE_TIMEOUT))
    if purpose != plan.purpose:
        raise usage_error(f"relay: {plan.me}: {link.name} sends {purpose!r}, we expect {plan.purpose!r}")
    return ""


# --------------------------------------------------------------------------------------------------
# The parent's side: listen, then gather the children


def listen(plan: Plan, child_ranks: list[int]) -> socket.socket:
    """The listener our children dial: the first free candidate port on our routable address."""
    if plan.loopback:
        address = net.LOOPBACK
    else:
        own = plan.hosts[plan.rank] if plan.hosts else socket.gethostname()
        try:
            choice = net.choose_bind_address(own)
        except HelperError:
            raise plan.fail(
                f"{own} resolves only to loopback and this host has no routable IPv4 address to listen on"
            ) from None
        address = choice.address
        if choice.why:
            plan.log(choice.why)
    ports = plan.ports_of(plan.rank)
    if not ports:
        raise usage_error("relay: no candidate port to listen on")
    try:
        sock, busy = net.bind_first_free(address, ports, 64)
    except OSError as exc:
        raise plan.fail(f"cannot listen on {address}:{exc.filename}: {net.describe(exc)}") from None
    if sock is not None:
        kids = ", ".join(plan.name(r) for r in child_ranks)
        plan.log(f"listening on {address}:{sock.getsockname()[1]} for {kids}")
        return sock
    raise plan.fail(
        f"every candidate port on {address} is in use ({','.join(busy)}); set --port (SM_RELAY_PORT) "
        "to a free range on every node"
    )


def gather_children(
    plan: Plan, listener: socket.socket, child_ranks: list[int], children: list[Link], deadline: float
) -> None:
    """Accept and authenticate every child into `children`, then wait until each reports its
    subtree READY. `children` is the node's own list, so a child taken before a failure is still
    sent the abort."""
    _Gathering(plan, listener, child_ranks, children).accept(deadline)
    listener.close()
    children.sort(key=lambda link: link.rank)
    statuses = collect(plan, children, "READY", deadline + READY_GRACE)
    for link in children:
        ok, _, why = statuses[link.rank]
        if not ok:
            raise plan.fail(f"{link.name} cannot take the stream: {why}")


class _Gathering:
    """The parent's side of the handshake, with every connection at once.

    Handshakes run side by side: a connection that sends no valid AUTH within PROOF_TIMEOUT is
    dropped, so idle or slow connections (a squatter, a port scan) never keep a child out."""

    def __init__(
        self, plan: Plan, listener: socket.socket, child_ranks: list[int], children: list[Link]
    ) -> None:
        self.plan = plan
        self.listener = listener
        self.child_ranks = child_ranks
        self.children = children
        self.waiting = dict.fromkeys(child_ranks)
        self.pending: dict[int, Link] = {}  # by file descriptor: greeted, AUTH not yet complete
        self.refused: list[str] = []  # peers refused meanwhile (shown if a child never comes)

    def accept(self, deadline: float) -> None:
        """Until every child is in `children`; a timeout names the missing ones."""
        plan, pending, waiting = self.plan, self.pending, self.waiting
        self.listener.setblocking(False)

        def drop(link: Link) -> None:
            sel.unregister(link.sock)
            del pending[link.sock.fileno()]

        with selectors.DefaultSelector() as sel:
            sel.register(self.listener, selectors.EVENT_READ, None)
            while waiting:
                now = time.monotonic()
                if now >= deadline:
                    for link in pending.values():
                        link.close()
                    missing = ", ".join(plan.name(r) for r in waiting)
                    refused = f"; refused meanwhile: {'; '.join(self.refused[-3:])}" if self.refused else ""
                    raise timeout_error(
                        f"relay: {plan.me}: {missing} did not connect within "
                        f"{net.secs(plan.connect_timeout)} s{refused}; "
                        "is its relay recv running with the same --nodes/--job-id/token?"
                    )
                for link in [link for link in pending.values() if now - link.started >= net.PROOF_TIMEOUT]:
                    drop(link)
                    self._refuse(
                        link,
                        "no AUTH in time",
                        f"{link.where} sent no AUTH within {net.secs(net.PROOF_TIMEOUT)} s",
                    )
                wait = min(
                    [deadline - now, 1.0]
                    + [link.started + net.PROOF_TIMEOUT - now for link in pending.values()]
                )
                for key, _ in sel.select(max(0.0, wait)):
                    if key.data is None:
                        self._accept_all(sel)
                        continue
                    link = key.data
                    try:
                        alive = link.feed()
                        line = link.take_line()
                    except (OSError, ProtocolError) as exc:
                        alive, line = False, None
                        self.refused.append(f"bad handshake from {link.where}: {net.describe(exc)}")
                    if line is None and alive:
                        continue
                    drop(link)
                    if line is None:
                        link.close()
                        continue
                    child = self._admit(link, line)
                    if child is not None:
                        del waiting[child.rank]
                        self.children.append(child)
                        plan.log(f"{child.name} connected from {child.where}")
            for link in pending.values():
                link.close()

    def _accept_all(self, sel: selectors.BaseSelector) -> None:
        """Every connection waiting on the listener, greeted; the oldest pending one goes when too
        many are open at once (a flood costs the flood, not our file descriptors)."""
        pending = self.pending
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.refused.append(f"accept failed ({net.describe(exc)})")
                return
            link = _greet(sock, net.peer(addr))
            if link is None:
                continue
            if len(pending) >= MAX_PENDING:
                oldest = min(pending.values(), key=lambda other: other.started)
                sel.unregister(oldest.sock)
                del pending[oldest.sock.fileno()]
                oldest.close()
            pending[sock.fileno()] = link
            sel.register(sock, selectors.EVENT_READ, link)

    def _admit(self, link: Link, line: bytes) -> Link | None:
        """The peer's AUTH line: our child, with OK and the header sent; None when refused."""
        plan, where, nonce_p = self.plan, link.where, link.own_nonce
        try:
            rank, purpose, nonce_c, given = parse_auth(line)
        except ProtocolError as exc:
            self._refuse(
                link,
                f"no valid AUTH ({net.describe(exc)})",
                f"bad handshake from {where}: {net.describe(exc)}",
            )
            return None
        if not auth.check(plan.token, given, nonce_p, str(rank), purpose, "child"):
            self._refuse(link, "wrong token", f"rank {rank} from {where} has a wrong token")
            return None
        if purpose != plan.purpose:
            self._refuse(link, f"purpose {purpose} is not {plan.purpose}", f"rank {rank} wants {purpose!r}")
            return None
        if rank not in self.child_ranks:
            self._refuse(link, f"not my child (rank {rank}'s parent is not rank {plan.rank})", "")
            return None
        if rank not in self.waiting:
            self._refuse(link, "rank already connected", f"a second rank {rank} from {where}")
            return None
        link.rank, link.name = rank, plan.name(rank)
        link.peer_nonce = nonce_c
        link.key = link_key(plan.token, nonce_p, nonce_c, plan.rank, rank, plan.purpose)
        proof = parent_proof(plan.token, nonce_c, nonce_p, plan.rank, rank, plan.purpose)
        try:
            link.send(f"OK {plan.rank} {proof}\n".encode() + header_line(plan.purpose))
        except OSError as exc:
            link.close()
            self.refused.append(f"{link.name} dropped during the handshake ({net.describe(exc)})")
            return None
        return link

    def _refuse(self, link: Link, reason: str, note: str) -> None:
        try:
            link.sock.settimeout(ABORT_SEND_TIMEOUT)
            link.send(f"DENY {reason}\n".encode())
        except OSError:
            pass
        link.close()
        if note:
            self.refused.append(note)
            hint = "; check $SM_BARRIER_TOKEN on that node" if "token" in note else ""
            self.plan.log(f"refused a connection: {note}{hint}")


def _greet(sock: socket.socket, where: str) -> Link | None:
    """A fresh connection: our HELLO goes out at once; its AUTH is read when it comes."""
    link = Link(sock, -1, "an unknown peer", where, own_nonce=auth.new_nonce(), started=time.monotonic())
    try:
        net.keepalive(sock, KEEPALIVE)
        sock.settimeout(ABORT_SEND_TIMEOUT)
        link.send(hello_line(link.own_nonce))
    except OSError:
        link.close()
        return None
    return link
