"""Forwarding: one node moves the stream frame by frame, from its source or its parent to its
children (and, on a receiver, to its output), and collects what its subtree verified.

Rank 0 reads its source and sends each frame to every child; a receiver checks each frame's tag
before its payload goes to its output or a child, then the trailer against what arrived. Nothing
holds more than one frame: a child that takes nothing (its loader paused) backs its parent up, and
so on up to rank 0's source. A stream that ends without a trailer, an abort, or a mismatch fails the
node with a one-line reason naming the upstream. A node whose upstream fails aborts its children at
once, so the whole subtree fails within seconds; a parent that sends nothing for --stall-timeout
seconds (or a child that takes nothing for that long) is given up on.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import select
import socket
import time
from collections.abc import Callable, Iterator

from slurm_multi import net
from slurm_multi.common import HelperError, timeout_error, usage_error
from slurm_multi.relay.connect import dial_parent, gather_children, listen
from slurm_multi.relay.link import ABORT_SEND_TIMEOUT, Link, collect
from slurm_multi.relay.protocol import (
    ABORT,
    CHAIN_START,
    CHUNK,
    DATA,
    EMPTY_DIGEST,
    END,
    FRAME,
    LAYERED_END,
    LAYOUT,
    MAX_FRAME,
    MAX_LINE,
    PING,
    PURPOSE_RE,
    SECTION,
    abort_payload,
    chain,
    clean_reason,
    frame_tag,
    parse_frame_header,
    parse_section,
    parse_trailer,
    status_line,
    trailer_payload,
)
from slurm_multi.relay.sections import LayeredSource, Layering, Sink
from slurm_multi.relay.tree import Plan, Result, children_of, parent_of, size_text
from slurm_multi.wire import ProtocolError

F_SETPIPE_SZ = 1031  # fcntl: a 1 MiB pipe moves the stream in fewer, larger reads and writes


def widen_pipe(fd: int) -> None:
    """Ask for a 1 MiB pipe buffer when `fd` is a pipe (best effort; a no-op for files)."""
    import fcntl

    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, CHUNK)
    except OSError:
        pass


def write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]


def parse_fault(text: str, rank: int) -> tuple[str, int] | None:
    """SM_RELAY_FAULT=<rank>:corrupt|die:<offset> (the end-to-end tests' fault injection): this
    rank's fault, or None. Anything else is ignored: production never sets it."""
    match = re.fullmatch(r"([0-9]+):(corrupt|die):([0-9]+)", text.strip())
    if not match or int(match.group(1)) != rank:
        return None
    return match.group(2), int(match.group(3))


class Children:
    """A node's links to its children: every frame goes to each live child, tagged for its link; a
    child that fails or takes nothing for --stall-timeout (its send blocks that long: back-pressure
    gone stale) is dropped and named, and the others go on."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.links: list[Link] = []  # filled by gather_children, in rank order
        self._ping = bytearray(FRAME.size)

    def live(self) -> list[Link]:
        return [link for link in self.links if not link.failed]

    def forward(
        self,
        frame: memoryview | bytearray,
        kind: bytes,
        length: int,
        digest: bytes,
        sent_so_far: int,
        flip: int | None = None,
        wants: Callable[[int], bool] | None = None,
    ) -> None:
        """Send one frame (header + payload, the header rewritten per child with that link's tag)
        to every live child (that `wants` it: a layered stream's section some node below it lacks;
        one that has had nothing for a heartbeat gets a PING instead, so that a long section it does
        not need never looks like a frozen parent); a child that fails is dropped, the others go
        on. `flip`: the fault hook's byte to flip in a data frame's payload, after its tag was made."""
        now = time.monotonic()
        for link in self.links:
            if link.failed:
                continue
            if wants is not None and not wants(link.rank):
                if now - link.last_sent >= self.plan.heartbeat:
                    self._send(link, self._ping, PING, 0, EMPTY_DIGEST, sent_so_far, None, now)
                continue
            self._send(link, frame, kind, length, digest, sent_so_far, flip, now)

    def idle(self, sent_so_far: int) -> None:
        """A PING to every live child that has had nothing for a heartbeat (rank 0 reading a
        section no node below needs)."""
        now = time.monotonic()
        for link in self.live():
            if now - link.last_sent >= self.plan.heartbeat:
                self._send(link, self._ping, PING, 0, EMPTY_DIGEST, sent_so_far, None, now)

    def _send(
        self,
        link: Link,
        frame: memoryview | bytearray,
        kind: bytes,
        length: int,
        digest: bytes,
        sent_so_far: int,
        flip: int | None,
        now: float,
    ) -> None:
        link.tagged(frame, kind, length, digest)
        link.last_sent = now
        if kind == DATA:
            link.sent += length
        try:
            if flip is not None and kind == DATA:
                copy = bytearray(frame)  # the fault hook: a bad link after the tag was made
                copy[FRAME.size + flip] ^= 0xFF
                link.sock.sendall(copy)
            else:
                link.sock.sendall(frame)
        except OSError as exc:
            if isinstance(exc, (socket.timeout, TimeoutError)):
                why = (
                    f"took no bytes for {net.secs(self.plan.stall_timeout)} s after "
                    f"{size_text(sent_so_far)}: it is frozen, its output is blocked, or its link is down"
                )
            else:
                said = self._failure_said(link)
                why = (
                    f"failed after {size_text(sent_so_far)}: {said}"
                    if said
                    else f"dropped the connection after {size_text(sent_so_far)} ({net.describe(exc)})"
                )
            link.failed = why
            link.close()
            self.plan.log(f"{link.name} {why}; going on with the others")

    def check(self) -> None:
        """Fail when every child has been dropped: nobody is left to send to."""
        if self.links and not self.live():
            failures = "; ".join(f"{link.name} {link.failed}" for link in self.links)
            raise self.plan.fail(f"no child left to send to: {failures}")

    @staticmethod
    def _failure_said(link: Link) -> str:
        """The FAIL reason a child sent before it dropped the link (read without waiting)."""
        try:
            link.sock.setblocking(False)
            while len(link.buf) < 64 * MAX_LINE and (chunk := link.sock.recv(MAX_LINE)):
                link.buf += chunk
        except OSError:
            pass
        for line in bytes(link.buf).splitlines():
            if line.startswith(b"FAIL "):
                return clean_reason(line[5:].decode("utf-8", "replace"))
        return ""

    def abort(self, reason: str) -> None:
        """An ABORT frame with `reason` to every live child, then its link closed."""
        payload = abort_payload(reason)
        frame = bytearray(FRAME.size) + payload
        digest = hashlib.sha256(payload).digest()
        for link in self.live():
            try:
                link.tagged(frame, ABORT, len(payload), digest)
                link.sock.settimeout(ABORT_SEND_TIMEOUT)
                link.sock.sendall(frame)
                link.sock.shutdown(socket.SHUT_WR)
                # Closing with the child's WAITs unread would reset the link and could drop the
                # abort still queued for it; read them away first.
                link.sock.setblocking(False)
                while link.sock.recv(65536):
                    pass
            except OSError:
                pass
            link.close()

    def finish(self, total: int, trailer: tuple[bytes, bytes], beat: Callable[[], None]) -> int:
        """Send the trailer (E, or a layered stream's T: kind and payload) to each child and collect
        DONE (`beat` keeps our parent waiting meanwhile); the nodes verified below us."""
        kind, payload = trailer
        frame = bytearray(FRAME.size) + payload
        digest = hashlib.sha256(payload).digest()
        for link in self.live():
            try:
                link.tagged(frame, kind, len(payload), digest)
                link.sock.sendall(frame)
            except OSError as exc:
                said = self._failure_said(link)
                link.failed = (
                    f"failed: {said}" if said else f"dropped before the trailer ({net.describe(exc)})"
                )
                link.close()
        live = self.live()
        window = self.plan.stall_timeout
        statuses = collect(
            self.plan,
            live,
            "DONE",
            time.monotonic() + window,
            stop_on_fail=False,
            quiet_for=window,
            beat=beat,
        )
        verified = 0
        for link in live:
            ok, count, why = statuses.get(link.rank, (False, 0, "did not answer"))
            if ok:
                verified += count
            else:
                link.failed = why
        failures = [f"{link.name}: {link.failed}" for link in self.links if link.failed]
        if failures:
            raise self.plan.fail(
                f"the stream ({size_text(total)}) reached {verified} node(s) below us but failed for "
                + "; ".join(failures)
            )
        return verified

    def close(self) -> None:
        for link in self.links:
            link.close()


class Node:
    """One rank: dial the parent, gather the children, then move the stream frame by frame."""

    def __init__(self, plan: Plan) -> None:
        if plan.fanout < 1:
            raise usage_error("relay: --fanout must be at least 1")
        if not 0 <= plan.rank < plan.nnodes:
            raise usage_error(f"relay: --rank {plan.rank} is not in 0..{plan.nnodes - 1}")
        if not PURPOSE_RE.fullmatch(plan.purpose):
            raise usage_error(f"relay: --purpose {plan.purpose!r} must match {PURPOSE_RE.pattern}")
        self.plan = plan
        self.parent = parent_of(plan.rank, plan.fanout)
        self.child_ranks = children_of(plan.rank, plan.fanout, plan.nnodes)
        self.up: Link | None = None
        self.down = Children(plan)
        self.listener: socket.socket | None = None
        self._next_beat = 0.0
        self.buffer = bytearray(FRAME.size + MAX_FRAME)
        self.view = memoryview(self.buffer)
        self.fault = parse_fault(os.environ.get("SM_RELAY_FAULT", ""), plan.rank)
        self.layering: Layering | None = None  # a layered stream's (rank 0: set before run)
        self.source: LayeredSource | None = None  # rank 0's layered source (set before run)
        self.trailer: tuple[bytes, bytes] = (END, b"")  # what this node sends its children last

    # -- the parent: WAIT while we stream, the final word ------------------------------------------

    def _beat(self) -> None:
        """Tell the parent we are alive and streaming (at most every `heartbeat` seconds)."""
        now = time.monotonic()
        if self.up is None or now < self._next_beat:
            return
        self._next_beat = now + self.plan.heartbeat
        try:
            self.up.sock.send(b"WAIT\n", socket.MSG_DONTWAIT)
        except OSError:
            pass  # a broken upstream shows on the next read

    def _report_up(self, line: str | bytes) -> None:
        if self.up is None:
            return
        try:
            self.up.sock.settimeout(ABORT_SEND_TIMEOUT)
            self.up.send(line if isinstance(line, bytes) else f"{line}\n".encode())
        except OSError:
            pass

    # -- streaming ---------------------------------------------------------------------------------

    def stream_from(self, source_fd: int) -> tuple[int, bytes, float]:
        """Rank 0: frames from `source_fd` to the children; (total, chain digest, start time)."""
        sha256 = hashlib.sha256
        view, total, stream = self.view, 0, CHAIN_START
        ping = bytearray(FRAME.size)
        ping_every = self.plan.heartbeat
        widen_pipe(source_fd)
        started = time.monotonic()
        payload = view[FRAME.size :]
        while True:
            ready, _, _ = select.select([source_fd], [], [], ping_every)
            if not ready:
                self.down.forward(ping, PING, 0, EMPTY_DIGEST, total)
                self.down.check()
                continue
            got = os.readv(source_fd, [payload[:CHUNK]])
            if got == 0:
                break
            # A pipe hands out what is buffered; top the frame up while more is already waiting.
            while got < CHUNK and select.select([source_fd], [], [], 0)[0]:
                more = os.readv(source_fd, [payload[got:CHUNK]])
                if more == 0:
                    break
                got += more
            digest = sha256(payload[:got]).digest()
            stream = chain(stream, digest)
            total += got
            self.down.forward(view[: FRAME.size + got], DATA, got, digest, total)
            self.down.check()
        return total, stream, started

    def stream_through(self, out_fd: int | None) -> tuple[int, bytes, float]:
        """A receiver: every frame's tag checked before its payload goes to `out_fd` or a child;
        then the trailer against what arrived."""
        plan, up = self.plan, self.up
        assert up is not None
        sha256 = hashlib.sha256
        view, total, stream = self.view, 0, CHAIN_START
        header = view[: FRAME.size]
        up.sock.settimeout(plan.stall_timeout)
        started = time.monotonic()
        if out_fd is not None:
            widen_pipe(out_fd)
        while True:
            try:
                up.read_into(header)
                kind, length, tag = parse_frame_header(header)
                body = view[FRAME.size : FRAME.size + length]
                up.read_into(body)
            except (socket.timeout, TimeoutError):
                raise timeout_error(
                    f"relay: {plan.me}: no bytes from {up.name} for {net.secs(plan.stall_timeout)} s after "
                    f"{size_text(total)}: {up.name.split(' (')[0]} is frozen or its link is down"
                ) from None
            except ProtocolError as exc:
                raise self.plan.fail(
                    f"protocol error from {up.name} after {size_text(total)}: {exc}"
                ) from None
            except OSError as exc:
                cut = "" if isinstance(exc, ConnectionError) and not exc.errno else f" ({net.describe(exc)})"
                raise self.plan.fail(
                    f"stream from {up.name} ended after {size_text(total)} of an unfinished stream{cut}: "
                    f"{up.name.split(' (')[0]} died or its link broke"
                ) from None
            digest = sha256(body).digest() if length else EMPTY_DIGEST
            if not hmac.compare_digest(tag, frame_tag(up.key, up.seq, kind, length, digest)):
                raise self.plan.fail(
                    f"frame {up.seq} from {up.name} (after {size_text(total)}) does not match its tag "
                    "(the sha256 digest of its bytes under the link key): changed on the way, forged, "
                    "reordered or replayed; nothing of it was written or forwarded"
                )
            up.seq += 1
            layering = self.layering
            if kind == DATA:
                self._beat()
                flip = self._inject(total, length) if self.fault is not None else None
                wants = layering.to_child if layering is not None else None
                frame = view[: FRAME.size + length]
                self.down.forward(frame, DATA, length, digest, total + length, flip, wants)
                loading = out_fd is not None and (layering is None or layering.to_loader())
                if loading:
                    try:
                        write_all(out_fd, body)  # type: ignore[arg-type]
                    except OSError as exc:
                        raise self.plan.fail(
                            f"cannot write the stream to stdout after {size_text(total)} "
                            f"({net.describe(exc)}); did the reader (docker load) exit? see its error above"
                        ) from None
                if layering is not None:
                    layering.frame(digest, length)
                    layering.data(length, loading)
                else:
                    stream = chain(stream, digest)
                total += length
            elif kind == PING:
                self.down.forward(view[: FRAME.size], PING, 0, EMPTY_DIGEST, total)
            elif kind == ABORT:
                reason = clean_reason(bytes(body).decode("utf-8", "replace"))
                raise self.plan.fail(f"{up.name} aborted the stream after {size_text(total)}: {reason}")
            elif kind in (LAYOUT, SECTION):
                self._layered_frame(kind, body, digest, total)
            elif (kind == LAYERED_END) != (layering is not None):
                raise self.plan.fail(f"protocol error from {up.name} after {size_text(total)}: a trailer "
                                     "of the other kind of stream (layered or not)")  # fmt: skip
            elif layering is not None:
                return self._verify_layered(layering, body, total, started)
            else:
                return self._verify(body, total, stream, started)

    def _layered_frame(self, kind: bytes, body: memoryview, digest: bytes, total: int) -> None:
        """An L frame (first: this stream is layered) or an S frame (a section starts), checked,
        counted in the chain and forwarded to the children that want it."""
        up, plan = self.up, self.plan
        assert up is not None
        try:
            if kind == LAYOUT:
                if self.layering is not None or total:
                    raise ProtocolError("a layer layout after the stream started")
                self.layering = Layering.from_layout(body, plan.rank, plan.fanout, plan.nnodes)
                self.down.forward(self.view[: FRAME.size + len(body)], LAYOUT, len(body), digest, total)
                return
            if self.layering is None:
                raise ProtocolError("a section before the layer layout")
            self.layering.section(parse_section(body))
        except ProtocolError as exc:
            raise plan.fail(f"protocol error from {up.name} after {size_text(total)}: {exc}") from None
        self.layering.frame(digest, 0)
        wants = self.layering.to_child
        self.down.forward(self.view[: FRAME.size + len(body)], SECTION, len(body), digest, total, wants=wants)

    def _verify_layered(
        self, layering: Layering, body: memoryview, total: int, started: float
    ) -> tuple[int, bytes, float]:
        up = self.up
        assert up is not None
        try:
            digest, why = layering.verify(body, total, up.name)
        except ProtocolError as exc:
            raise self.plan.fail(f"bad trailer from {up.name}: {exc}") from None
        if why:
            raise self.plan.fail(why)
        self.trailer = (LAYERED_END, bytes(body))
        return total, digest, started

    def _inject(self, total: int, length: int) -> int | None:
        """The end-to-end tests' fault (SM_RELAY_FAULT=<rank>:corrupt|die:<offset>), on this rank
        only, once the stream passes <offset>: `corrupt` flips one byte of what this node forwards,
        after its tag was made (its own copy stays intact, as after a bad link); `die` SIGKILLs this
        process. The offset of the byte to flip in this frame's payload, or None."""
        kind, offset = self.fault  # type: ignore[misc]
        if total + length <= offset:
            return None
        self.fault = None
        if kind == "die":
            self.plan.log(f"SM_RELAY_FAULT: dying (SIGKILL) after {size_text(total)}")
            os.kill(os.getpid(), 9)
        self.plan.log(f"SM_RELAY_FAULT: flipping the byte at offset {offset} of what this node forwards")
        return max(0, offset - total)

    def _verify(
        self, body: memoryview, total: int, stream: bytes, started: float
    ) -> tuple[int, bytes, float]:
        up = self.up
        assert up is not None
        try:
            their_total, their_stream = parse_trailer(body)
        except ProtocolError as exc:
            raise self.plan.fail(f"bad trailer from {up.name}: {exc}") from None
        if their_total != total:
            raise self.plan.fail(
                f"received {total} bytes from {up.name} but the stream had {their_total}: bytes were lost"
            )
        if their_stream != stream:
            raise self.plan.fail(
                f"the stream from {up.name} ({size_text(total)}) is not rank 0's: chain digest "
                f"{stream.hex()[:16]}..., rank 0 sent {their_stream.hex()[:16]}...; a node upstream "
                "relayed other bytes"
            )
        return total, stream, started

    def close(self) -> None:
        self.down.close()
        if self.up is not None:
            self.up.close()
        if self.listener is not None:
            self.listener.close()

    # -- the whole run -----------------------------------------------------------------------------

    def run(
        self,
        source_fd: int | None = None,
        out_fd: int | None = None,
        on_verified: Callable[[], None] | None = None,
    ) -> Result:
        plan = self.plan
        deadline = time.monotonic() + plan.connect_timeout
        try:
            if self.child_ranks:
                self.listener = listen(plan, self.child_ranks)
            if self.parent is not None:
                self.up = dial_parent(plan, deadline)
                plan.log(f"connected to {self.up.name} at {self.up.where}")
            if self.listener is not None:
                gather_children(plan, self.listener, self.child_ranks, self.down.links, deadline)
                for link in self.down.links:  # a child that takes nothing this long is given up on
                    link.sock.settimeout(plan.stall_timeout)
            if self.up is not None:
                self.up.sock.settimeout(plan.stall_timeout)
                self.up.send(status_line(self.up.key, "READY"))
            if self.parent is None:
                plan.log(f"every node below is ready ({len(self.down.links)} direct); streaming")
                if self.source is not None and self.layering is not None:
                    started = time.monotonic()
                    total = self.source.run()
                    self.trailer = (LAYERED_END, self.layering.trailer())
                    digest = min(self.layering.chains.items())[1][1] if self.layering.chains else CHAIN_START
                elif source_fd is None:
                    raise usage_error("relay: rank 0 needs a source")
                else:
                    total, digest, started = self.stream_from(source_fd)
            else:
                total, digest, started = self.stream_through(out_fd)
                if on_verified is not None:
                    on_verified()
            if self.trailer[0] == END:
                self.trailer = (END, trailer_payload(total, digest))
        except HelperError as exc:
            self.down.abort(exc.format_message().removeprefix("relay: "))
            self._report_up(f"FAIL {clean_reason(exc.format_message().removeprefix('relay: '))}")
            self.close()
            raise
        except BaseException:
            self.down.abort(f"{plan.me}: relay stopped")
            self.close()
            raise
        try:
            below = self.down.finish(total, self.trailer, self._beat)
        except HelperError as exc:
            self._report_up(f"FAIL {clean_reason(exc.format_message().removeprefix('relay: '))}")
            self.close()
            raise
        seconds = time.monotonic() - started
        if self.up is not None:
            self._report_up(status_line(self.up.key, "DONE", below + 1))
        self.close()
        result = Result(total, digest.hex(), seconds, below if self.parent is None else below + 1)
        if self.layering is not None:
            result.layers = self.layering.stats(out_fd is not None) if self.parent is not None else None
            result.sent = {link.rank: link.sent for link in self.down.links}
        return result


def run_node(
    plan: Plan,
    source_fd: int | None = None,
    out_fd: int | None = None,
    on_verified: Callable[[], None] | None = None,
) -> Result:
    """Run one rank to the end (the importable core of `relay send` / `relay recv`)."""
    return Node(plan).run(source_fd, out_fd, on_verified)


def run_layered(
    plan: Plan, pieces: Iterator, diff_ids: list[str], prefixes: dict[int, int], sink: Sink | None = None
) -> Result:
    """Rank 0 of a layered stream (slurm_multi.relay.sections): `pieces` are rank 0's tar as
    slurm_multi.layers.tarstream reads it (its image has `diff_ids`), each worker holds
    `prefixes[rank]` of them; `sink` is fed every piece too."""
    node = Node(plan)
    layers = len(diff_ids)
    node.layering = Layering(layers, [layers] + [prefixes.get(r, 0) for r in range(1, plan.nnodes)], 0,
                             plan.fanout, plan.nnodes)  # fmt: skip
    node.source = LayeredSource(node, node.layering, pieces, sink)
    return node.run()
