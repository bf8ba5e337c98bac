"""The fitness stage's verdict: which nodes are bad, from one node's report or from every node's.

Each judge returns [{"rank", "host", "reason", "evidence"}]. `judge_job` judges one attempt of a job
as the batch step and collect do, from the files in its node dirs (fitness.json, status.json's
prepare, fitness-cmd.json: `write_cmd_record`'s, how --fitness-cmd ended on that node), naming each
node from the job's own host list by its rank (never from a report's `hosts`: a report is a file).

Evidence (what the quarantine trusts: docs/bad-nodes.md): `local` when the node's own check failed
(runtime, disk, GPUs, its prepare, the user's --fitness-cmd; also when a peer heard it say so in its
signed HELLO); `peers` when a majority of its peers' reports agree (unreachable, its clock); `none`
for what somebody else could have caused or what cannot be pinned on one node: no report (its stage
crashed, or its task could not start: a scratch dir another user made), a stopped stage, a wrong
job token, a slow link, two nodes that cannot tell which of them is off. Every bad node fails or
requeues the job; only `local` and `peers` go into the quarantine. A port another process holds is
no evidence at all: a node that holds none of its candidate ports is reported, never named.

Verdict rules (`judge`: one node's view, from its own report; `judge_reports`: the batch step's,
over every node's report, None for a node that wrote none). A node named twice gets its reasons
joined with `; `. Host names are shown as given (host:port when several ranks share one host).
- local checks: a node whose own check failed is bad, with that check's reason (both judges; a
  node's view also names a peer whose HELLO carries a failed verdict).
- no report (judge_reports): "no fitness report (the stage did not finish on that node)", plus the
  verdict of its HELLO if a peer heard one that was not ok.
- stopped (SIGTERM before the verdict: scancel, a time limit, or its task ending because a peer
  failed first): the report is written with "stopped" set and "ok" null. It is no verdict and no
  evidence: it never votes on reachability, rates or clocks, and its node is never named for the
  missing verdict (a scancelled healthy job must not quarantine its nodes). Only facts it holds
  count: a local check that finished and failed, a failed verdict a peer heard in its HELLO.
- reachability, node view: with N >= 3, no peer's HELLO heard while some peer took ours: this node
  is "unreachable on port P from every peer"; nothing reached and nothing heard: this node, "...
  and reached none" (or, when every peer answered `bad token`, "every peer rejects this node's job
  token"); nothing reached but something heard: this node "reached no peer". Otherwise each peer
  not heard by the deadline is named (wrong job token / accepted our connection but sent no HELLO
  / no answer on its port: did its stage start?) and each peer heard but not reached ("does not
  accept connections on port P from <me>"). A node that could not listen names only peers it
  could not reach.
- ports: a node's report says which candidate it listened on (`port`), its HELLO says the same to its
  peers; a node that listened nowhere because every candidate was held (`ports_taken`), or whose
  HELLO said so, is never named for being unreachable.
- partners: a node dials and hears from its partners only (slurm_multi.fitness.mesh.partners: its
  ring neighbours and a few offsets drawn from the job ID; every other node when N <= 7), as its
  report's `partners` says (a report without it: every other node). "Peer" below means partner.
- reachability, global: x is unreachable from y when y did not reach x and x did not hear y. A node
  unreachable from a strict majority of its partners that wrote a report is bad ("unreachable on
  port P from every peer" / "from k of m peers (...)"; "wrong job token" when every failing peer's
  connection failed on the token). With N == 2 and neither reaching the other, both are named: "A
  and B cannot reach each other on port P" (or "do not share the job token"): which one is at fault
  cannot be told; with one direction failing, the node that could not be reached is named. A node
  without a report is named for that alone.
- slow link: ring rates r -> r+1 (each node's own, else from a peer's HELLO). A node is judged
  against the links that do not touch it: with N >= 3, a node whose links in and out are both
  slower than --slow-factor x the median of those is bad ("both ring links slow: A->B X MB/s and
  B->C Y MB/s, the other links' median Z MB/s"; MB = 10^6 bytes), so a node slow both ways is
  named even where it sits on most of the ring's links (2 of 3). Any other link slower than
  --slow-factor x the median of all the measured ones (3 or more) names both ends: "link A->B: X
  MB/s, median Y MB/s". --min-rate (bytes/s here, MB/s on the command line; 0 = off) is a floor
  whatever the others measured, with N >= 2: a node with both links below it, else both ends of a
  link below it, are named, "below the --fitness-min-rate floor of F MB/s" (with N == 2 both
  nodes: which one is slow cannot be told). Without the floor, 2 nodes are never judged slow, and
  all links equally slow name nobody. A healthy node on a busy host measured up to 5x below the
  others stays within the default factor (0.1). A rate measured while its sender waited for a CPU
  for more than a tenth of the probe (the kernel's run delay: the ring's `cpu_bound`, "N+" in the
  HELLO) measured the node's cores, not its link: it is a lower bound, counted in the medians and
  never slow itself, floor included (16 nodes sharing 2 cores measured healthy links 11x apart).
- clock: offsets relative to the judging node (itself 0). With 3 or more clocks known, a node
  further than --clock-bound from their median is bad ("clock 5.2 s ahead of the job's median" /
  "behind"); the global judge takes, for each node, the median over the reports of its distance
  from that report's median. With only 2 clocks known (N == 2), a difference beyond the bound names
  both: "clocks of A and B differ by X s (...)".
"""

from __future__ import annotations

import bisect
import json
import os
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from slurm_multi.fitness.protocol import DEFAULT_TIMEOUT, MAX_REASON, one_line, ports_text
from slurm_multi.net import secs
from slurm_multi.readfile import finite
from slurm_multi.shell import write_json
from slurm_multi.words import is_host, is_rank

DEFAULT_SLOW_FACTOR = 0.1
DEFAULT_CLOCK_BOUND = 2.0
CMD_RECORD = "fitness-cmd.json"
EXIT_STOPPED = 143  # SIGTERM's, as a shell reports it: a stopped helper, a node task a signal ended


def mbps(rate: float) -> str:
    return f"{rate / 1e6:.1f} MB/s"


class _Report:
    """What a judge reads from one node's report, defensively (a report is another process's file)."""

    def __init__(self, report: Mapping[str, Any], nnodes: int | None = None) -> None:
        self.raw = report
        self.stopped = bool(report.get("stopped"))
        self.n = max(1, _int(report.get("nnodes"), 1)) if nnodes is None else nnodes
        self.me = _int(report.get("rank"), -1)
        self.host = str(report.get("host") or "")
        # (every rank's host and ports are parsed only where one view is judged: over a job's reports
        # they would be N x N)
        self._listed = report.get("ports") if isinstance(report.get("ports"), list) else []
        local = report.get("local") if isinstance(report.get("local"), Mapping) else {}
        self.local_ok = local.get("ok") is not False
        self.local_reason = str(local.get("reason") or "local checks failed")
        self.timeout = finite(report.get("timeout")) or DEFAULT_TIMEOUT
        checks = report.get("checks") if isinstance(report.get("checks"), Mapping) else {}
        net = checks.get("network") if isinstance(checks.get("network"), Mapping) else {}
        self.port = _int(net.get("port"), 0)
        self.listening = net.get("listening") is not False
        taken = _port_list(net.get("ports_taken"))
        mine = self.candidate_ports(self.me)
        # listened nowhere because another process held every candidate: no evidence either way
        self.all_taken = not self.listening and bool(taken) and set(mine) <= set(taken)
        # the ranks it dials and hears from (slurm_multi.fitness.mesh.partners); every other rank in
        # a report that does not say (written before partners)
        chosen = _ranks(net.get("partners"), self.n) - {self.me}
        self.partners = chosen or {q for q in range(self.n) if q != self.me}
        self.reached = _ranks(net.get("reached"), self.n)
        self.heard = _ranks(net.get("heard"), self.n)
        self.token_rejected_by = _ranks(net.get("token_rejected_by"), self.n)
        rejected = net.get("rejected") if isinstance(net.get("rejected"), list) else []
        self.rejected_ranks = _ranks([r.get("rank") for r in rejected if isinstance(r, Mapping)], self.n)
        errors = net.get("errors") if isinstance(net.get("errors"), Mapping) else {}
        self.errors = {_int(k, -1): str(v) for k, v in errors.items()}
        ring = net.get("ring") if isinstance(net.get("ring"), Mapping) else {}
        self.ring_rate = finite(ring.get("bytes_per_s"))
        self.ring_cpu_bound = ring.get("cpu_bound") is True
        offsets = net.get("offsets") if isinstance(net.get("offsets"), Mapping) else {}
        self.offsets = {_int(k, -1): finite(v) for k, v in offsets.items()}
        self.offsets = {k: v for k, v in self.offsets.items() if 0 <= k < self.n and v is not None}
        peers = net.get("peers") if isinstance(net.get("peers"), Mapping) else {}
        self.peers = {_int(k, -1): v for k, v in peers.items() if isinstance(v, Mapping)}

    @property
    def hosts(self) -> list[str]:
        return _strings(self.raw.get("hosts"), self.n)

    @property
    def candidates(self) -> list[list[int]]:
        return [_port_list(p) for p in self._listed]

    def candidate_ports(self, rank: int) -> list[int]:
        """Rank's candidate ports as this report lists them."""
        return _port_list(self._listed[rank]) if 0 <= rank < len(self._listed) else []

    def peer_verdict(self, rank: int) -> str:
        return str(self.peers.get(rank, {}).get("verdict") or "ok")

    def peer_rate(self, rank: int) -> float | None:
        return finite(self.peers.get(rank, {}).get("ring_bytes_per_s"))

    def peer_cpu_bound(self, rank: int) -> bool:
        """Rank's HELLO said its ring rate was measured while it waited for a CPU (a lower bound)."""
        return self.peers.get(rank, {}).get("ring_cpu_bound") is True

    def peer_port(self, rank: int) -> int:
        """The port rank's HELLO said it listens on (0: unknown or none)."""
        return _int(self.peers.get(rank, {}).get("port"), 0)

    def peer_nowhere(self, rank: int) -> bool:
        """Rank's HELLO said it listens on no port (another process held every candidate)."""
        said = self.peers.get(rank, {})
        return "port" in said and said["port"] is None


def _int(value: Any, default: int) -> int:
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool)
        else (int(value) if isinstance(value, str) and is_rank(value) else default)
    )


def _ranks(value: Any, n: int) -> set[int]:
    return {
        v
        for v in (value if isinstance(value, list) else [])
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n
    }


def _port_list(value: Any) -> list[int]:
    """A rank's candidate ports as a report holds them (a list; one port alone, as older reports)."""
    items = value if isinstance(value, list) else [value]
    return [p for p in (_int(item, 0) for item in items) if 0 < p <= 65535]


def _strings(value: Any, n: int) -> list[str]:
    found = [str(v) for v in value] if isinstance(value, list) else []
    return found + [f"rank{r}" for r in range(len(found), n)]


class _Names:
    """How nodes are named in reasons: their host, or host:port where ranks share a host (tests); and
    a node's port: the one it listened on when a report or a HELLO says, else its candidates."""

    def __init__(
        self, hosts: Sequence[str], candidates: Sequence[Sequence[int]], known: Mapping[int, int]
    ) -> None:
        self.hosts, self.candidates, self.known = list(hosts), [list(c) for c in candidates], dict(known)
        self.unique = len(set(self.hosts)) == len(self.hosts)

    def _first(self, rank: int) -> int:
        if self.known.get(rank):
            return self.known[rank]
        return self.candidates[rank][0] if rank < len(self.candidates) and self.candidates[rank] else 0

    def __call__(self, rank: int) -> str:
        host = self.hosts[rank] if rank < len(self.hosts) else f"rank{rank}"
        if self.unique or not self._first(rank):
            return host
        return f"{host}:{self._first(rank)}"

    def port(self, rank: int) -> str:
        if self.known.get(rank):
            return str(self.known[rank])
        return ports_text(self.candidates[rank]) if rank < len(self.candidates) else "?"


def _known_ports(views: Sequence[_Report | None]) -> dict[int, int]:
    """The port each rank listened on, as its own report or a peer's record of its HELLO says."""
    known: dict[int, int] = {}
    for view in views:
        if view is None:
            continue
        for q in view.heard:
            if view.peer_port(q):
                known.setdefault(q, view.peer_port(q))
    for view in views:
        if view is not None and view.port and view.listening:
            known[view.me] = view.port
    return known


LOCAL, PEERS, NONE = "local", "peers", "none"  # the evidence, strongest first (module docstring)
EVIDENCE = (LOCAL, PEERS, NONE)


class _Bad:
    def __init__(self) -> None:
        self.reasons: dict[int, list[str]] = {}
        self.evidence: dict[int, str] = {}

    def add(self, rank: int, reason: str, evidence: str = NONE) -> None:
        listed = self.reasons.setdefault(rank, [])
        if reason not in listed:
            listed.append(reason)
        held = self.evidence.get(rank, NONE)
        self.evidence[rank] = min(held, evidence, key=EVIDENCE.index)

    def listing(self, hosts: Sequence[str]) -> list[dict[str, Any]]:
        return [
            {
                "rank": r,
                "host": hosts[r] if r < len(hosts) else f"rank{r}",
                "reason": one_line("; ".join(self.reasons[r]), 2 * MAX_REASON),
                "evidence": self.evidence[r],
            }
            for r in sorted(self.reasons)
        ]


def slow_links(
    rates: Mapping[int, float | None],
    n: int,
    name: Callable[[int], str],
    factor: float,
    bad: _Bad,
    min_rate: float = 0.0,
    bounds: Collection[int] = (),
) -> None:
    """The slow-link rule over ring rates `rates[r]` of link r -> (r+1) % n (the module docstring).

    A node is judged against the links that do not touch it (the rates its other peers reach): in a
    3-node ring a node slow both ways sits on two of the three links, so any median over all of them
    is its own slow link. `min_rate` (bytes/s, 0 = off) is the site's floor: a link below it is slow
    whatever the others measured. A link in `bounds` was measured while its sender waited for a CPU:
    its rate is a lower bound, counted in the medians but never slow itself."""
    links = {r: rate for r, rate in rates.items() if rate is not None and rate >= 0 and 0 <= r < n}
    if n < 2 or not links:
        return
    floor = f"below the --fitness-min-rate floor of {mbps(min_rate)}" if min_rate > 0 else ""
    named: set[int] = set()
    ordered = sorted(links.values())
    for node in range(n):
        before = (node - 1) % n
        if before not in links or node not in links or (n == 2 and node == 1):
            continue  # (two nodes share both links: one judgement names both)
        if before in bounds or node in bounds:
            continue  # a lower bound is never slow (the cores were busy, not the link)
        reference = _median_without(ordered, [links[before], links[node]]) if n >= 3 else None
        against = []
        if reference is not None and max(links[before], links[node]) < factor * reference:
            against.append(f"the other links' median {mbps(reference)}")
        if floor and max(links[before], links[node]) < min_rate:
            against.append(floor)
        if not against:
            continue
        reason = (
            f"both ring links slow: {name(before)}->{name(node)} {mbps(links[before])} and "
            f"{name(node)}->{name((node + 1) % n)} {mbps(links[node])}, {', '.join(against)}"
        )
        for who in (node, before) if n == 2 else (node,):
            bad.add(who, reason)
            named.add(who)
    mid = statistics.median(links.values()) if n >= 3 and len(links) >= 3 else None
    for r, rate in sorted(links.items()):
        a, b = r, (r + 1) % n
        if a in named or b in named or r in bounds:
            continue
        against = []
        if mid is not None and rate < factor * mid:
            against.append(f"median {mbps(mid)}")
        if floor and rate < min_rate:
            against.append(floor)
        if against:
            reason = f"link {name(a)}->{name(b)}: {mbps(rate)}, {', '.join(against)}"
            bad.add(a, reason)
            bad.add(b, reason)


def _median_without(ordered: Sequence[float], removed: Sequence[float]) -> float | None:
    """The median of `ordered` (sorted) without one occurrence of each of `removed` (values it holds),
    None when nothing is left: the median of the links that do not touch a node, for every node of a
    4,096-node ring in milliseconds (a new list per node took 2 s)."""
    gaps: list[int] = []
    for index in sorted(bisect.bisect_left(ordered, value) for value in removed):
        gaps.append(max(index, gaps[-1] + 1) if gaps else index)  # (equal values: the next copy)
    left = len(ordered) - len(gaps)

    def at(position: int) -> float:  # the position-th of what is left
        for gap in gaps:
            position += position >= gap
        return ordered[position]

    return (at((left - 1) // 2) + at(left // 2)) / 2 if left else None


def clock_rule(
    offsets: Mapping[int, float], name: Callable[[int], str], bound: float, bad: _Bad, evidence: str = NONE
) -> None:
    """The clock rule over `offsets` (seconds, relative to any one node); a clock off the median of
    3 or more is named with `evidence`, two that differ without it (which one is off is not known)."""
    if len(offsets) < 2:
        return
    if len(offsets) == 2:
        (a, first), (b, second) = sorted(offsets.items())
        if abs(first - second) > bound:
            reason = (
                f"clocks of {name(a)} and {name(b)} differ by {abs(first - second):.1f} s (more than "
                f"{bound:g} s; with two clocks, which one is off cannot be told)"
            )
            bad.add(a, reason)
            bad.add(b, reason)
        return
    mid = statistics.median(offsets.values())
    for rank, offset in sorted(offsets.items()):
        distance = offset - mid
        if abs(distance) > bound:
            bad.add(
                rank,
                f"clock {abs(distance):.1f} s {'ahead of' if distance > 0 else 'behind'} the job's median",
                evidence,
            )


def _token_hint() -> str:
    return "is the job token the same on every node?"


def judge(
    report: Mapping[str, Any],
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    clock_bound: float = DEFAULT_CLOCK_BOUND,
    min_rate: float = 0.0,
) -> list[dict[str, Any]]:
    """The bad nodes in one node's view (its report, or the same figures): [{"rank", "host", "reason",
    "evidence"}] (one view is no majority: only the checks a node says failed are `local`). Pure;
    the rules are the module docstring's."""
    view = _Report(report)
    hosts = view.hosts
    name, bad = _Names(hosts, view.candidates, _known_ports([view])), _Bad()
    me, n = view.me, view.n
    if not 0 <= me < n:
        return [{"rank": me, "host": "?", "reason": "not a fitness report (no valid rank)", "evidence": NONE}]
    if not view.local_ok:
        bad.add(me, view.local_reason, LOCAL)
    for q in sorted(view.heard):
        if view.peer_verdict(q) != "ok":
            bad.add(q, view.peer_verdict(q), LOCAL)
    if view.stopped:  # cut short: what it did not see yet is no evidence
        return bad.listing(hosts)
    if n > 1:
        _reach_view(view, name, bad)
    rates = {q: view.peer_rate(q) for q in view.heard}
    rates[me] = view.ring_rate
    bounds = {q for q in view.heard if view.peer_cpu_bound(q)} | ({me} if view.ring_cpu_bound else set())
    slow_links(rates, n, name, slow_factor, bad, min_rate, bounds)
    clock_rule(view.offsets, name, clock_bound, bad)
    return bad.listing(hosts)


def _reach_view(view: _Report, name: _Names, bad: _Bad) -> None:
    me, n = view.me, view.n
    peers = sorted(view.partners)
    mine = name.port(me)

    def first_error() -> str:
        return next((view.errors[q] for q in peers if view.errors.get(q)), "no answer")

    if not view.listening:  # nobody could deliver to us: only the peers we could not reach say anything
        for q in peers:
            if q not in view.reached:
                bad.add(
                    q,
                    f"does not accept connections on port {name.port(q)} from {name(me)} "
                    f"({view.errors.get(q) or 'no answer'})",
                )
        return
    if n >= 3 and not view.heard:
        if view.reached:
            bad.add(me, f"unreachable on port {mine} from every peer")
        elif all(q in view.token_rejected_by for q in peers):
            bad.add(me, f"every peer rejects this node's job token on port {mine} ({_token_hint()})")
        else:
            bad.add(me, f"unreachable on port {mine} from every peer and reached none ({first_error()})")
        return
    if n >= 3 and not view.reached:
        bad.add(me, f"reached no peer ({first_error()})")
        return
    for q in peers:
        if (q in view.heard and q in view.reached) or view.peer_nowhere(q):
            continue  # (a peer that listens nowhere said so: nothing to reach there)
        port = name.port(q)
        if q not in view.heard:
            if q in view.rejected_ranks or q in view.token_rejected_by:
                reason = f"wrong job token: its connections on port {port} do not verify ({_token_hint()})"
            elif q in view.reached:
                reason = (
                    f"accepted {name(me)}'s connection on port {port} but sent no HELLO within "
                    f"{secs(view.timeout)} s"
                )
            else:
                reason = (
                    f"no answer on port {port} within {secs(view.timeout)} s "
                    f"({view.errors.get(q) or 'no answer'}): did its fitness stage start?"
                )
        else:
            error = view.errors.get(q) or "no answer"
            reason = f"does not accept connections on port {port} from {name(me)} ({error})"
        bad.add(q, reason)


def judge_reports(
    reports: Sequence[Mapping[str, Any] | None],
    nnodes: int,
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    clock_bound: float = DEFAULT_CLOCK_BOUND,
    hosts: Sequence[str] | None = None,
    missing: Mapping[int, str] | None = None,
    min_rate: float = 0.0,
    terminated: frozenset[int] = frozenset(),
) -> list[dict[str, Any]]:
    """The bad nodes over every node's report (None: a node that wrote none), as the batch step
    judges after the stage: [{"rank", "host", "reason", "evidence"}]. `hosts`: the job's host names
    by rank (without them, a rank is named by its own report's `host`, else `rank<r>`); `missing`:
    why a rank wrote no report, where its task said (status.json); `terminated`: ranks whose task a
    signal ended (status.json's exit 143): without a report they are stopped, not named (their
    helper died in its start, before it could write one). Pure; the rules are the module
    docstring's."""
    views: list[_Report | None] = [
        _Report(r, nnodes) if isinstance(r, Mapping) else None for r in list(reports)[:nnodes]
    ]
    views += [None] * (nnodes - len(views))
    if hosts is None:
        hosts = [
            view.host if view is not None and is_host(view.host) else f"rank{r}"
            for r, view in enumerate(views)
        ]
    hosts = [hosts[r] if r < len(hosts) else f"rank{r}" for r in range(nnodes)]
    candidates = [view.candidate_ports(r) if view is not None else [] for r, view in enumerate(views)]
    name, bad = _Names(hosts, candidates, _known_ports(views)), _Bad()
    for r in range(nnodes):
        view = views[r]
        if view is not None and not view.local_ok:
            bad.add(r, view.local_reason, LOCAL)
        elif view is None or view.stopped:
            said = [v.peer_verdict(r) for v in views if v is not None and r in v.heard]
            failed = next((verdict for verdict in said if verdict != "ok"), "")
            # what its HELLO said is its own word, signed: evidence; a missing report alone is none
            if view is None and r in terminated and not failed:
                continue  # stopped in its start: no verdict, no evidence (as a stopped report)
            if view is None:
                why = (missing or {}).get(r) or "the stage did not finish on that node"
                heard = f"; its HELLO said: {failed}" if failed else ""
                bad.add(r, f"no fitness report ({why}){heard}", LOCAL if failed else NONE)
            elif failed:
                bad.add(r, failed, LOCAL)
    # A stopped report votes on nothing below (what it had not seen yet is no evidence).
    views = [None if view is not None and view.stopped else view for view in views]
    present = [r for r in range(nnodes) if views[r] is not None]
    _reach_global(views, nnodes, present, name, bad)
    # each node's ring rate: its own report's, else what a partner heard in its HELLO
    rates: dict[int, float | None] = {}
    bounds: set[int] = set()
    for view in views:
        for q in view.heard if view is not None else ():
            if rates.get(q) is None:
                rates[q] = view.peer_rate(q)
                if view.peer_cpu_bound(q):
                    bounds.add(q)
    for r, view in enumerate(views):
        if view is not None and view.ring_rate is not None:
            rates[r] = view.ring_rate
            bounds.discard(r)
            if view.ring_cpu_bound:
                bounds.add(r)
    slow_links(rates, nnodes, name, slow_factor, bad, min_rate, bounds)
    _clock_global(views, nnodes, name, clock_bound, bad)
    return bad.listing(hosts)


def _reach_global(
    views: Sequence[_Report | None], n: int, present: Sequence[int], name: _Names, bad: _Bad
) -> None:
    def works(a: int, b: int) -> bool:  # a's connection to b got through (either side's record)
        va, vb = views[a], views[b]
        return (va is not None and b in va.reached) or (vb is not None and a in vb.heard)

    def token_failed(a: int, b: int) -> bool:
        va, vb = views[a], views[b]
        return (va is not None and b in va.token_rejected_by) or (vb is not None and a in vb.rejected_ranks)

    said_nowhere: set[int] = set()  # a peer heard it say so in its HELLO
    checkers: dict[int, list[int]] = {}  # each node's partners that wrote a report
    for y in present:
        view = views[y]
        assert view is not None
        said_nowhere.update(q for q in view.heard if view.peer_nowhere(q))
        for x in view.partners:
            checkers.setdefault(x, []).append(y)

    def nowhere(x: int) -> bool:  # listened on no port: another process held every candidate
        view = views[x]
        return (view is not None and view.all_taken) or x in said_nowhere

    if n == 2 and len(present) == 2:
        if nowhere(0) or nowhere(1):
            return
        if not works(0, 1) and not works(1, 0):
            token = token_failed(0, 1) or token_failed(1, 0)
            port = name.port(0) if name.port(0) == name.port(1) else f"{name.port(0)}/{name.port(1)}"
            what = "do not share the job token" if token else "cannot reach each other"
            for r in (0, 1):
                bad.add(r, f"{name(0)} and {name(1)} {what} on port {port}")
        elif not works(0, 1) or not works(1, 0):
            x = 1 if not works(0, 1) else 0
            bad.add(x, f"unreachable on port {name.port(x)} from every peer", PEERS)
        return
    for x in present:
        if nowhere(x):
            continue
        voters = checkers.get(x, [])  # (a node dials and hears only its partners)
        failing = [y for y in voters if not works(y, x)]
        if not voters or 2 * len(failing) <= len(voters):
            continue
        if all(token_failed(y, x) for y in failing):
            reason = (
                f"wrong job token: {len(failing)} of {len(voters)} peers reject its connections "
                f"on port {name.port(x)}"
            )
            bad.add(x, reason)  # the job's setup, not the node: nothing to quarantine
            continue
        if len(failing) == len(voters):
            reason = f"unreachable on port {name.port(x)} from every peer"
        else:
            names = ", ".join(name(y) for y in failing)
            reason = (
                f"unreachable on port {name.port(x)} from {len(failing)} of {len(voters)} peers ({names})"
            )
        bad.add(x, reason, PEERS)


def _clock_global(views: Sequence[_Report | None], n: int, name: _Names, bound: float, bad: _Bad) -> None:
    if n == 2:
        for view in views:
            if view is not None and len(view.offsets) == 2:
                clock_rule(view.offsets, name, bound, bad)
                return
        return
    distances: dict[int, list[float]] = {}
    for view in views:
        if view is None or len(view.offsets) < 3:
            continue
        mid = statistics.median(view.offsets.values())
        for rank, offset in view.offsets.items():
            distances.setdefault(rank, []).append(offset - mid)
    for rank, found in sorted(distances.items()):
        distance = statistics.median(found)
        if abs(distance) > bound:
            bad.add(
                rank,
                f"clock {abs(distance):.1f} s {'ahead of' if distance > 0 else 'behind'} the job's median",
                PEERS,
            )


def read_reports(jobdir: str, nnodes: int) -> list[dict[str, Any] | None]:
    """DIR/node_<r>/fitness.json for every rank; None where it is missing or not a JSON object."""
    reports: list[dict[str, Any] | None] = []
    for rank in range(nnodes):
        try:
            with open(os.path.join(jobdir, f"node_{rank}", "fitness.json"), encoding="utf-8") as handle:
                found = json.loads(handle.read())
        except (OSError, ValueError, RecursionError):
            found = None
        reports.append(found if isinstance(found, dict) else None)
    return reports


def _node_dirs(jobdir: str) -> list[str]:
    try:
        names = os.listdir(jobdir)
    except OSError:
        return []
    return sorted((n for n in names if n.startswith("node_") and n[5:].isdecimal()), key=lambda n: int(n[5:]))


def write_cmd_record(path: str, host: str, code: int, reason: str) -> None:
    """node_<rank>/fitness-cmd.json: how --fitness-cmd ended on that node (lib/node.sh writes it)."""
    write_json(path, {"host": host, "exit_code": code, "ok": code == 0, "reason": reason})


def read_cmd_records(jobdir: str, nodes: Sequence[str]) -> dict[int, tuple[bool, str]]:
    """Node index -> (ok, reason) of every fitness-cmd.json in the job's node dirs."""
    out: dict[int, tuple[bool, str]] = {}
    for name in _node_dirs(jobdir):
        try:
            with open(os.path.join(jobdir, name, CMD_RECORD), encoding="utf-8") as handle:
                found = json.loads(handle.read())
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(found, dict) and found.get("host") in nodes:
            index = list(nodes).index(found["host"])
            ok = found.get("ok") is True
            if not ok or index not in out:
                out[index] = (ok, str(found.get("reason") or "fitness command failed"))
    return out


def judge_job(
    jobdir: str,
    nodes: Sequence[str],
    slow_factor: float = DEFAULT_SLOW_FACTOR,
    clock_bound: float = DEFAULT_CLOCK_BOUND,
    min_rate: float = 0.0,
) -> list[dict[str, Any]]:
    """The bad nodes of one attempt of a job, as the batch step and collect judge it: [{"rank" (the
    node's index), "host" (nodes[rank]), "reason", "evidence"}].

    `nodes` are the job's host names in node order: every node is named from them by its index.
    The fitness reports are found in every node_<rank>/ dir (with several tasks per node, the
    node's first task wrote one) and placed by the node index each holds. A node that wrote none
    because its prepare failed for a reason of its own (another node passed prepare: a dead docker
    engine is caught there first) is bad with that reason (`local`); when every node failed prepare
    alike (a bad manifest), no node is to blame. A node that wrote none for another reason its
    task gave (status.json: a scratch dir another user made) is named with that reason, as no
    evidence. Without a single report (the stage did not run), only the prepare rule applies."""
    from slurm_multi.statusfile import read_status, status_path

    nnodes = len(nodes)
    reports: list[dict[str, Any] | None] = [None] * nnodes
    prepare: dict[int, tuple[bool, str]] = {}
    said: dict[int, str] = {}  # why a node's task ended, as its status.json says
    terminated: set[int] = set()  # a signal ended its task (exit 143): scancel, or a failed peer
    for name in _node_dirs(jobdir):
        node_dir = os.path.join(jobdir, name)
        try:
            with open(os.path.join(node_dir, "fitness.json"), encoding="utf-8") as handle:
                found = json.loads(handle.read())
        except (OSError, ValueError, RecursionError):
            found = None
        if isinstance(found, dict) and isinstance(found.get("rank"), int) and 0 <= found["rank"] < nnodes:
            reports[found["rank"]] = found
        status = read_status(status_path(node_dir))
        document = status.document if status is not None and isinstance(status.document, dict) else {}
        host, stages = document.get("node"), document.get("stages")
        if not isinstance(host, str) or host not in nodes:
            continue
        index = list(nodes).index(host)
        if document.get("reason") and index not in said:
            said[index] = one_line(str(document["reason"]))
        if document.get("exit_code") == EXIT_STOPPED:
            terminated.add(index)
        stage = stages.get("prepare") if isinstance(stages, dict) else None
        if isinstance(stage, dict):
            ok = stage.get("status") == "ok"
            if not ok or index not in prepare:
                prepare[index] = (ok, str(document.get("reason") or "prepare failed"))
    passed = any(ok for ok, _ in prepare.values())
    own = {i: why for i, (ok, why) in prepare.items() if not ok and passed}
    # --fitness-cmd, the user's own check: the same rule (all failing alike blames the check).
    cmds = read_cmd_records(jobdir, nodes)
    if any(ok for ok, _ in cmds.values()):
        own.update({i: why for i, (ok, why) in cmds.items() if not ok and i not in own})

    def own_entry(i: int) -> dict[str, Any]:  # (a file's reason: one line, nothing raw)
        return {"rank": i, "host": nodes[i], "reason": one_line(own[i], 2 * MAX_REASON), "evidence": LOCAL}

    if not any(reports):
        return [own_entry(i) for i in sorted(own)]
    found = judge_reports(
        reports,
        nnodes,
        slow_factor,
        clock_bound,
        hosts=nodes,
        missing=said,
        min_rate=min_rate,
        terminated=frozenset(terminated),
    )
    out = [
        own_entry(entry["rank"]) if entry["rank"] in own and reports[entry["rank"]] is None else entry
        for entry in found
    ]
    named = {e["rank"] for e in out}
    out += [own_entry(i) for i in sorted(own) if i not in named]
    return sorted(out, key=lambda e: e["rank"])
