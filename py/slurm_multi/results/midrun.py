"""The nodes lost or failed during the run: bad nodes, as the fitness stage's are (collect judges both).

A node is bad for what happened during the run when
- the batch step lost it (slurm_multi.lost: Slurm reported it dead, it went silent on the
  network, or a rank's task vanished without a status where the reaper could not reach it):
  "lost during the run: <how>";
- one of its ranks named its own node's fault (status.json `node_fault`, slurm_multi.nodefault:
  its docker engine stopped answering, its local disk or its clock failed): that fault.

A hang inside the workload, a workload's own exit, a rank stopped because a peer failed: none of
them is a node's fault; its rank fails the job and no node is bad. Each bad node is
{"rank": <the node's index>, "node": <host>, "cause": "run", "reason": <one line>, "evidence": …},
the fitness judge's shape with the cause that the batch step's requeue records
(slurm_multi.attempts). The evidence says whether the quarantine may take it (docs/bad-nodes.md):
`local` for the node's own fault, `peers` for a node Slurm or the batch host lost (nobody else can
fake either: the batch host dials a port derived from the job's secret token), `none` for a rank
that vanished (its task may not have started for a reason another user caused).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm_multi import lost
from slurm_multi.results.jobdir import NodeReport
from slurm_multi.secret_rule import reason_line

CAUSE = "run"
EVIDENCE = {"slurm": "peers", "network": "peers", "vanished": "none"}  # lost.json's `how`


def judge_run(
    root: Path, nodes: Sequence[NodeReport], hosts: Sequence[str], tasks_per_node: int = 1
) -> list[dict[str, Any]]:
    """The bad nodes of this attempt's run, in node order, each once (its first reason)."""
    per = max(tasks_per_node, 1)
    found: dict[str, tuple[int, str, str]] = {}

    def name(node: str, index: int, reason: str, evidence: str) -> None:
        if node and node not in found:
            found[node] = (index, reason_line(reason, 800), evidence)

    for host, entry in lost.read(str(root)).items():
        ranks = entry.get("ranks") if isinstance(entry.get("ranks"), list) else []
        index = list(hosts).index(host) if host in hosts else (int(ranks[0]) // per if ranks else 0)
        evidence = EVIDENCE.get(str(entry.get("how")), "none")
        name(host, index, f"lost during the run: {entry.get('reason') or 'no reason recorded'}", evidence)
    for node in sorted(nodes, key=lambda n: n.rank):
        if node.node_fault:
            index = node.rank // per
            host = hosts[index] if index < len(hosts) and hosts[index] else node.node
            name(node.node or host, index, node.node_fault, "local")
    return [
        {"rank": index, "node": node, "cause": CAUSE, "reason": reason, "evidence": evidence}
        for node, (index, reason, evidence) in sorted(found.items(), key=lambda item: item[1][0])
    ]
