"""The fitness stage's wire format: its lines, their signatures, and the rules a line must pass.

Lines are UTF-8, `\\n`-terminated, at most 1024 bytes; MACs are slurm_multi.auth's (HMAC-SHA256 keyed
by the job token over `|`-joined fields), their first field the direction, so nothing signed one way
passes the other way:

    listener -> FITNESS <S>                                  on accept; S = auth.new_nonce()
    dialer   -> JOIN <mac> <C> <rank> <to-rank> mesh|probe <bytes>
                mac = mac(token, "fitness-to-listener", "JOIN", S, C, job, rank, to-rank, purpose, bytes)
    listener -> WELCOME <mac> <rank> <purpose>    mac = mac(token, "fitness-from-listener", "WELCOME",
                                                  S, C, job, rank, purpose)
             |  ERR <reason>                      (unsigned: `bad token`, `wrong rank`, ...; dropped)
    mesh:  dialer -> HELLO <mac> <rank> <host> <port> <time> <ring-to> <ring-bytes/s> <verdict...>
                     mac = mac(token, "fitness-to-listener", "HELLO", S, C, job, rank, host, port,
                     time, ring-to, ring-bytes/s, verdict)  (`-` for an unknown ring figure; port:
                     the candidate the sender listens on, `-` when another process holds them all)
           listener -> GOT <mac> <rank>
                     mac = mac(token, "fitness-from-listener", "GOT", S, C, job, rank)
    probe: dialer -> <bytes> raw bytes;  listener -> ACK <mac> <n> (at least every 256 KiB or 0.1 s,
                     and at the end) mac = mac(token, "fitness-from-listener", "ACK", S, C, job, n)

A connection whose JOIN does not verify (another job, a wrong token, a replay: S is fresh every
time) gets `ERR bad token` and is dropped; it counts for nothing. The token is never printed and
never sent.

Ports: every node has the same few candidate ports (slurm_multi.fitness.cli derives them as the
barrier's are derived) and listens on the first one free; a dialer tries them in order until one
answers with a WELCOME signed for its own nonce, so a port another process holds (silent, talking,
or answering `ERR`) only sends it on to the next candidate. The port a node chose travels in its
signed HELLO: the judge names it, and a node that holds no candidate at all is reported, not blamed.

When: a node sends its HELLO (rank, host, its port, time.time() at send, its local verdict: `ok` or
the one-line reason, its ring link's rate) once its local checks and its probe are done, at the latest
when 2 s (a quarter of --timeout if less) are left, so a late probe or check still leaves time to
deliver. The receiver records the clock offset (the sender's time - its own at receipt).

Every function here is pure: it builds one line, or parses one and raises ProtocolError (Rejected
for a peer's `ERR`). Ranks, counts, job IDs, hosts and decimals follow slurm_multi.words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from slurm_multi import auth
from slurm_multi.logline import escaped, short
from slurm_multi.words import is_count, is_decimal, is_host, is_rank

MIB, GIB = 1 << 20, 1 << 30
MAX_LINE = 1024  # bytes per protocol line, newline included
MAX_REASON = 400  # characters of a one-line reason
MAX_PROBE_BYTES = GIB  # the most a JOIN may announce (and --probe-bytes may ask for)
DEFAULT_TIMEOUT = 10.0  # the whole stage's bound (--timeout)
HELLO_MARGIN = 2.0  # the HELLOs go out at the latest this long before the deadline ...
HELLO_MARGIN_SHARE = 0.25  # ... or this share of --timeout, when that is less

TO_LISTENER, FROM_LISTENER = "fitness-to-listener", "fitness-from-listener"
PURPOSES = ("mesh", "probe")
BAD_TOKEN = "bad token"


class ProtocolError(ValueError):
    """A line that breaks the protocol; str() is the short reason."""


class Rejected(ProtocolError):
    """The peer answered `ERR <reason>`."""


def ports_text(ports: Sequence[int]) -> str:
    """Candidate ports in a message: `21576`, `21576-21579` for a run, else `21576, 30001`."""
    ports = list(ports)
    if len(ports) > 2 and ports == list(range(ports[0], ports[0] + len(ports))):
        return f"{ports[0]}-{ports[-1]}"
    return ", ".join(str(port) for port in ports) or "?"


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """Free text as one bounded line (a reason, a verdict), control characters escaped."""
    text = escaped(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode(line: bytes) -> str:
    raw = line[:-1] if line.endswith(b"\n") else line
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) >= MAX_LINE:
        raise ProtocolError("line too long")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("not UTF-8") from None
    if not text or not text.isprintable():
        raise ProtocolError("empty or unprintable line")
    return text


def is_port(text: str) -> bool:
    """A TCP port on the wire: 1-65535, plain decimal (words.is_rank's spelling)."""
    return is_rank(text) and 1 <= int(text) <= 65535


def parse_rank(text: str, nnodes: int) -> int:
    if not is_rank(text) or int(text) >= nnodes:
        raise ProtocolError(f"bad rank (0..{nnodes - 1})")
    return int(text)


def greeting_line(challenge: str) -> bytes:
    return f"FITNESS {challenge}\n".encode()


def parse_greeting(text: str) -> str:
    verb, _, challenge = text.partition(" ")
    if verb != "FITNESS" or not auth.is_nonce(challenge):
        raise ProtocolError(f"not a fitness stage ({short(text, 60)!r})")
    return challenge


def join_line(
    token: str, job: str, challenge: str, nonce: str, rank: int, to_rank: int, purpose: str, nbytes: int
) -> bytes:
    fields = (str(rank), str(to_rank), purpose, str(nbytes))
    mac = auth.mac(token, TO_LISTENER, "JOIN", challenge, nonce, job, *fields)
    return f"JOIN {mac} {nonce} {' '.join(fields)}\n".encode()


class Join(NamedTuple):
    nonce: str
    rank: int
    purpose: str
    nbytes: int


def claimed_rank(text: str, nnodes: int) -> int | None:
    """The rank a JOIN says it comes from, before (or without) its MAC verifying: for the record."""
    parts = text.split(" ")
    if len(parts) == 7 and is_rank(parts[3]) and int(parts[3]) < nnodes:
        return int(parts[3])
    return None


def parse_join(text: str, token: str, job: str, challenge: str, me: int, nnodes: int) -> Join:
    """A dialer's JOIN on the connection greeted with `challenge`; the MAC is checked first."""
    parts = text.split(" ")
    if len(parts) != 7 or parts[0] != "JOIN":
        raise ProtocolError("malformed JOIN")
    _, given, nonce, *fields = parts
    if not auth.is_nonce(nonce) or not auth.check(
        token, given, TO_LISTENER, "JOIN", challenge, nonce, job, *fields
    ):
        raise ProtocolError(BAD_TOKEN)
    rank, to_rank = parse_rank(fields[0], nnodes), parse_rank(fields[1], nnodes)
    if to_rank != me:
        raise ProtocolError(f"wrong rank: this is rank {me}")
    if rank == me:
        raise ProtocolError("a JOIN from this very rank")
    if fields[2] not in PURPOSES or not is_count(fields[3]) or int(fields[3]) > MAX_PROBE_BYTES:
        raise ProtocolError("malformed JOIN")
    return Join(nonce, rank, fields[2], int(fields[3]))


def welcome_line(token: str, job: str, challenge: str, nonce: str, rank: int, purpose: str) -> bytes:
    mac = auth.mac(token, FROM_LISTENER, "WELCOME", challenge, nonce, job, str(rank), purpose)
    return f"WELCOME {mac} {rank} {purpose}\n".encode()


def _reply_fields(text: str, verb: str, count: int) -> list[str]:
    """The fields after `<verb> <mac>` of a listener's reply; Rejected for an `ERR` line."""
    head, _, rest = text.partition(" ")
    if head == "ERR":
        raise Rejected(short(rest, 80) or "unspecified")
    parts = text.split(" ")
    if head != verb or len(parts) != count + 2:
        raise ProtocolError(f"expected {verb}, got {short(text, 60)!r}")
    return parts[1:]


def parse_welcome(
    text: str, token: str, job: str, challenge: str, nonce: str, rank: int, purpose: str
) -> None:
    given, *fields = _reply_fields(text, "WELCOME", 2)
    if not auth.check(token, given, FROM_LISTENER, "WELCOME", challenge, nonce, job, *fields):
        raise ProtocolError("its WELCOME is not signed with this job's token")
    if fields != [str(rank), purpose]:
        raise ProtocolError(f"rank {fields[0]} answered where rank {rank} was expected")


class Hello(NamedTuple):
    rank: int
    host: str
    port: int | None  # the candidate the sender listens on; None: every one is held by another process
    sent: float  # the sender's time.time() at send
    ring_to: int | None
    ring_rate: float | None  # bytes/s of the sender's ring link, None when not measured
    verdict: str  # `ok`, or the sender's local checks' one-line reason
    ring_cpu_bound: bool = False  # the rate was measured while the sender waited for a CPU: a lower bound


def _hello_fields(hello: Hello) -> list[str]:
    rate = "-" if hello.ring_rate is None else f"{int(hello.ring_rate)}{'+' if hello.ring_cpu_bound else ''}"
    ring_to = "-" if hello.ring_to is None else str(hello.ring_to)
    port = "-" if hello.port is None else str(hello.port)
    return [str(hello.rank), hello.host, port, f"{hello.sent:.6f}", ring_to, rate]


def _fit_verdict(head: Sequence[str], verdict: str) -> str:
    """The verdict on one line after `head`, `|` kept out (auth's field separator), cut to fit."""
    verdict = one_line(verdict.replace("|", "/")) or "ok"
    budget = MAX_LINE - 2 - sum(len(field.encode()) + 1 for field in head)
    return verdict.encode()[:budget].decode("utf-8", "ignore").rstrip() or "?"


def hello_line(token: str, job: str, challenge: str, nonce: str, hello: Hello) -> bytes:
    fields = _hello_fields(hello)
    verdict = _fit_verdict(["HELLO", "0" * auth.MAC_HEX, *fields], hello.verdict)
    mac = auth.mac(token, TO_LISTENER, "HELLO", challenge, nonce, job, *fields, verdict)
    return f"HELLO {mac} {' '.join(fields)} {verdict}\n".encode()


def parse_hello(text: str, token: str, job: str, challenge: str, nonce: str, rank: int, nnodes: int) -> Hello:
    parts = text.split(" ", 8)
    if len(parts) != 9 or parts[0] != "HELLO":
        raise ProtocolError("malformed HELLO")
    _, given, *fields = parts
    if not auth.check(token, given, TO_LISTENER, "HELLO", challenge, nonce, job, *fields):
        raise ProtocolError(BAD_TOKEN)
    rank_text, host, port, sent, ring_to, rate, verdict = fields
    cpu_bound = rate.endswith("+")  # "N+": at least N (measured while the sender waited for a CPU)
    rate = rate[:-1] if cpu_bound else rate
    if parse_rank(rank_text, nnodes) != rank:
        raise ProtocolError("HELLO from another rank than its JOIN")
    if not is_host(host) or not is_decimal(sent) or (port != "-" and not is_port(port)):
        raise ProtocolError("malformed HELLO")
    if (ring_to != "-" and not is_rank(ring_to)) or (rate != "-" and not is_count(rate)):
        raise ProtocolError("malformed HELLO")
    return Hello(
        rank,
        host,
        None if port == "-" else int(port),
        float(sent),
        None if ring_to == "-" else parse_rank(ring_to, nnodes),
        None if rate == "-" else float(rate),
        verdict,
        cpu_bound and rate != "-",
    )


def got_line(token: str, job: str, challenge: str, nonce: str, rank: int) -> bytes:
    return f"GOT {auth.mac(token, FROM_LISTENER, 'GOT', challenge, nonce, job, str(rank))} {rank}\n".encode()


def parse_got(text: str, token: str, job: str, challenge: str, nonce: str, rank: int) -> None:
    given, field = _reply_fields(text, "GOT", 1)
    if not auth.check(token, given, FROM_LISTENER, "GOT", challenge, nonce, job, field) or field != str(rank):
        raise ProtocolError("its GOT is not signed with this job's token")


def ack_line(token: str, job: str, challenge: str, nonce: str, count: int) -> bytes:
    return (
        f"ACK {auth.mac(token, FROM_LISTENER, 'ACK', challenge, nonce, job, str(count))} {count}\n".encode()
    )


def parse_ack(text: str, token: str, job: str, challenge: str, nonce: str, total: int) -> int:
    given, field = _reply_fields(text, "ACK", 1)
    if not auth.check(token, given, FROM_LISTENER, "ACK", challenge, nonce, job, field):
        raise ProtocolError("its ACK is not signed with this job's token")
    if not is_count(field) or int(field) > total:
        raise ProtocolError("malformed ACK")
    return int(field)


def err_line(reason: str) -> bytes:
    return f"ERR {reason}\n".encode()
