"""The barrier's wire format, and the line rules the relay shares (framing, ranks, the token).

A challenge, then one line each way, UTF-8, `\\n`-terminated, at most 256 bytes including the
newline (a trailing `\\r` is tolerated so `\\r\\n` clients work). Fields are separated by single
ASCII spaces. The token never crosses the wire: rank 0 greets every connection with a fresh nonce S,
the client picks its own nonce C, and each side signs its line with `auth.mac(token, ...)`
(HMAC-SHA256 keyed by the token, over the fields joined by `|`). The first MAC field says the
direction, so a signed request can never pass for a reply (or the other way round).

    rank 0     -> CHALLENGE <S>                                         (on accept)
    worker     -> READY <mac> <C> <rank> [image [<held-id>|- [cache:<16 hex>|- [layers:<k>[:<hex>]]]]|start]
                  (phase defaults to `start`)
                  mac = mac(token, "to-rank0", "READY", S, C, rank, phase[, held-id[, cache[, layers]]])
                  (held-id: the image ID this node already holds; cache: the first 16 hex digits of
                  the image ID this node sees in the --image-cache tar; layers: how many layers of the
                  job plan's chain its engine holds, and the chain ID they end at (slurm_multi.layers.chain);
                  serve --holds-file records all three, so rank 0 never picks the cache from its own
                  view alone and moves only the layers a worker lacks)
    controller -> RELEASE <mac> <C> <image-id>  |  ABORT <mac> <C> <reason>
                  mac = mac(token, "to-rank0", verb, S, C, image-id | reason)
    rank 0     -> WAIT <mac> <rank>   (at once, to a READY it keeps waiting; then, later, one of:)
    rank 0     -> GO <mac> <rank> <image-id>  |  ABORT <mac> <reason>  |  OK <mac>  |  ERR <reason>
                  mac = mac(token, "from-rank0", verb, S, C, rank, image-id | reason | nothing)

A line whose MAC does not verify (wrong token, or signed for another connection's S: a replay)
gets `ERR bad token`. A client trusts GO/ABORT/OK only with a valid MAC over its own C, so a fake
rank 0 cannot forge or replay them; `ERR` is not signed, so a client only ever moves on from the
port that sent it to its next candidate.

Strictness (decided once, here): a rank is ASCII decimal digits without sign, spaces or leading
zeros (`1`, `12`; never `+1`, ` 1`, `01`, `１`) and 1 <= rank < nnodes. The token is 1-64 printable
ASCII characters without spaces, read only from an environment variable and never printed or sent;
MACs are compared in constant time. ERR replies never echo anything secret.

Every function here is pure: it builds or parses one line, and a bad line raises ProtocolError
(never anything else). The relay's lines follow the same framing (`decode_line`), rank and token
rules with its own verbs (slurm_multi.relay).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from slurm_multi import auth
from slurm_multi.common import usage_error
from slurm_multi.layers.chain import parse_claim
from slurm_multi.words import is_cache_seen, is_held_id, is_image_id, is_rank, is_token

MAX_LINE = 256  # bytes per protocol line, newline included
# `RELEASE <mac> <C> <image-id>\n` must fit MAX_LINE: a longer ID is released on the control pipe.
RELEASE_ID_MAX = MAX_LINE - len("RELEASE   \n") - auth.MAC_HEX - auth.NONCE_HEX
PHASES = ("image", "start")
DEFAULT_TOKEN_ENV = "SM_BARRIER_TOKEN"

# The first field of every MAC: a request's MAC can never be passed off as a reply's (both have ABORT).
TO_RANK0, FROM_RANK0 = "to-rank0", "from-rank0"
# The words' rules (slurm_multi.words): a token of 1-64 bytes (an HMAC key no longer than SHA-256's
# block, so a bash HMAC never hashes the key first); an image READY says which local image ID the
# worker holds (is_held_id) and the start of the cached tar's image ID it sees (is_cache_seen: the
# whole would not fit MAX_LINE beside a held ID).


# --------------------------------------------------------------------------------------------------
# Protocol


class ProtocolError(ValueError):
    """A line that breaks the protocol; str() is the short reason sent back as `ERR <reason>`."""


class Message(NamedTuple):
    """A parsed request line (immutable)."""

    kind: str  # READY | RELEASE | ABORT
    rank: int = 0
    phase: str = ""
    image_id: str = ""
    reason: str = ""
    nonce: str = ""  # the client's nonce C: rank 0 signs its reply over it
    holds: str = ""  # an image READY's: the image ID the worker already has (`sha256:…`), if any
    cache: str = ""  # an image READY's: the 16 hex digits of the cache tar's image ID it sees, if any
    layers: str = ""  # an image READY's: `layers:<k>[:<12 hex>]`, the prefix of the plan's chain it holds


class Reply(NamedTuple):
    """A parsed reply line."""

    kind: str  # GO | ABORT | ERR | OK | WAIT
    rank: int = 0
    image_id: str = ""
    reason: str = ""


def decode_line(line: bytes | str, max_line: int = MAX_LINE) -> str:
    """One protocol line (the barrier's and the relay's): UTF-8, printable, shorter than max_line,
    its `\n` (and a `\r` before it) removed; ProtocolError otherwise."""
    raw = line.encode("utf-8", "surrogatepass") if isinstance(line, str) else bytes(line)
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    if len(raw) >= max_line:
        raise ProtocolError("line too long")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("not UTF-8") from None
    if not text:
        raise ProtocolError("empty line")
    if not text.isprintable():
        raise ProtocolError("unprintable character")
    return text


def parse_rank(text: str, nnodes: int) -> int:
    """A worker rank: ASCII digits, no sign/space/leading zero, 1 <= rank < nnodes."""
    if not is_rank(text):
        raise ProtocolError("bad rank")
    rank = int(text)
    if not 1 <= rank < nnodes:
        raise ProtocolError(f"rank out of range 1..{nnodes - 1}")
    return rank


def challenge_line(challenge: str) -> bytes:
    """Rank 0's greeting on every connection: `CHALLENGE <S>`, S fresh from auth.new_nonce()."""
    return f"CHALLENGE {challenge}\n".encode()


def parse_challenge(line: bytes | str) -> str:
    """The nonce S from rank 0's greeting; ProtocolError when the peer greets otherwise."""
    verb, _, challenge = decode_line(line).partition(" ")
    if verb != "CHALLENGE" or not auth.is_nonce(challenge):
        raise ProtocolError("no challenge")
    return challenge


def _signed_fields(verb: str, rest: str) -> list[str]:
    """What a line's MAC covers after its verb and nonces: READY's rank and phase (`start` when
    left out), RELEASE's image ID, ABORT's reason, OK's nothing."""
    if verb in ("ABORT", "RELEASE"):
        return [rest]
    if verb == "OK":
        return []
    fields = rest.split(" ")
    return [*fields, "start"] if verb == "READY" and len(fields) == 1 else fields


def _fit(head: Sequence[str], tail: str) -> str:
    """`tail` on one line, cut so that `head… tail\\n` fits MAX_LINE (reasons are free text), with
    no space left at the end, where a client's `read` would trim it from under the MAC."""
    budget = MAX_LINE - 1 - sum(len(f.encode()) + 1 for f in head)
    return " ".join(tail.splitlines()).encode()[:budget].decode("utf-8", "ignore").rstrip()


def _signed_line(
    token: str, direction: str, verb: str, challenge: str, nonce: str, fields: Sequence[str]
) -> bytes:
    """`verb <mac> [<C>] fields…` (the client's nonce C only on requests), an ABORT reason cut to
    fit before it is signed. ValueError when any other line would not fit MAX_LINE."""
    head = [verb, "0" * auth.MAC_HEX, *([nonce] if direction == TO_RANK0 else [])]
    fields = list(fields)
    if verb == "ABORT":
        fields[-1] = _fit([*head, *fields[:-1]], fields[-1])
    line = " ".join([*head, *fields]) + "\n"
    if len(line.encode()) > MAX_LINE:
        raise ValueError(f"{verb} line longer than {MAX_LINE} bytes")
    head[1] = auth.mac(token, direction, verb, challenge, nonce, *fields)
    return (" ".join([*head, *fields]) + "\n").encode()


def request_line(token: str, verb: str, challenge: str, nonce: str, *fields: str) -> bytes:
    """A client's line to rank 0 (READY rank phase | RELEASE image-id | ABORT reason), signed over
    rank 0's challenge S and our nonce C."""
    return _signed_line(token, TO_RANK0, verb, challenge, nonce, fields)


def reply_line(token: str, verb: str, challenge: str, nonce: str, *fields: str) -> bytes:
    """Rank 0's answer (GO rank image-id | ABORT reason | OK), signed over S and the client's C."""
    return _signed_line(token, FROM_RANK0, verb, challenge, nonce, fields)


def parse_line(line: bytes | str, token: str, nnodes: int, challenge: str) -> Message:
    """Parse one line sent to rank 0 on the connection greeted with `challenge`; raise
    ProtocolError (never anything else) when it is bad. The MAC is checked before the fields, so a
    client without the token learns nothing but `bad token`."""
    text = decode_line(line)
    verb, _, rest = text.partition(" ")
    if verb not in ("READY", "RELEASE", "ABORT"):
        raise ProtocolError("unknown command")
    given, _, rest = rest.partition(" ")
    nonce, _, rest = rest.partition(" ")
    fields = _signed_fields(verb, rest)
    if not auth.is_nonce(nonce) or not auth.check(token, given, TO_RANK0, verb, challenge, nonce, *fields):
        raise ProtocolError("bad token")
    if verb == "ABORT":
        return Message("ABORT", reason=rest.strip() or "no reason given", nonce=nonce)
    if verb == "RELEASE":
        if not is_image_id(rest):
            raise ProtocolError("bad image id")
        return Message("RELEASE", image_id=rest, nonce=nonce)
    if len(fields) not in (2, 3, 4, 5):
        raise ProtocolError("malformed READY")
    rank = parse_rank(fields[0], nnodes)
    if fields[1] not in PHASES:
        raise ProtocolError("bad phase")
    holds = fields[2] if len(fields) >= 3 else ""
    cache = fields[3] if len(fields) >= 4 else ""
    layers = fields[4] if len(fields) == 5 else ""
    if holds and (fields[1] != "image" or not (is_held_id(holds) or (cache and holds == "-"))):
        raise ProtocolError("bad held image id")
    if cache and not (is_cache_seen(cache) or (layers and cache == "-")):
        raise ProtocolError("bad cache id")
    if layers and parse_claim(layers) is None:
        raise ProtocolError("bad layer prefix")
    holds = "" if holds == "-" else holds
    cache = "" if cache == "-" else cache.removeprefix("cache:")
    return Message("READY", rank=rank, phase=fields[1], nonce=nonce, holds=holds, cache=cache, layers=layers)


def parse_reply(line: bytes | str, token: str, challenge: str, nonce: str) -> Reply:
    """Parse rank 0's answer to our line (sent with `nonce` on the connection greeted with
    `challenge`); GO/ABORT/OK must carry rank 0's MAC over them (else it is not our barrier)."""
    text = decode_line(line)
    verb, _, rest = text.partition(" ")
    if verb == "ERR":
        return Reply("ERR", reason=rest.replace(token, "***") or "unspecified")
    if verb not in ("GO", "ABORT", "OK", "WAIT"):
        raise ProtocolError("unexpected reply")
    given, _, rest = rest.partition(" ")
    fields = _signed_fields(verb, rest)
    if not auth.check(token, given, FROM_RANK0, verb, challenge, nonce, *fields):
        raise ProtocolError(f"its {verb} is not signed with our token")
    if verb == "OK":
        if rest:
            raise ProtocolError("malformed OK")
        return Reply("OK")
    if verb == "ABORT":
        return Reply("ABORT", reason=rest.replace(token, "***").strip() or "no reason given")
    if verb == "WAIT":
        if len(fields) != 1 or not is_rank(fields[0]):
            raise ProtocolError("malformed WAIT")
        return Reply("WAIT", rank=int(fields[0]))
    if len(fields) != 2 or not is_rank(fields[0]) or not is_image_id(fields[1]):
        raise ProtocolError("malformed GO")
    return Reply("GO", rank=int(fields[0]), image_id=fields[1])


# --------------------------------------------------------------------------------------------------
# The token


def read_token(env_name: str) -> str:
    """The barrier token from `$env_name`; it never travels in argv and is never printed."""
    from slurm_multi.secret_rule import shown_name

    if shown_name(env_name) is None:  # the token itself where its name goes: never said back
        raise usage_error(
            "barrier: --token-env is not an environment variable name; pass the NAME of the variable "
            "that holds the job's barrier token, not the token"
        )
    value = os.environ.get(env_name, "")
    if not value:
        raise usage_error(
            f"barrier: ${env_name} is not set or empty; export the job's barrier token "
            "(the batch step generates one) and pass its name with --token-env"
        )
    if not is_token(value):
        raise usage_error(f"barrier: ${env_name} must be 1-64 printable ASCII characters without spaces")
    return value
