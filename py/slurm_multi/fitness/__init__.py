"""The fitness stage: a fast check on every node of a job, before any image moves.

One bad node (a hung docker engine, a full disk, GPUs held by a stale job, a port nobody can reach,
a slow link, a clock far off) is the most common reason a multi-node job fails. This stage finds it
in seconds and names it with a one-line reason (docs/bad-nodes.md). Its rooms:

    protocol   the lines the nodes exchange, their signatures, their rules
    links      the sockets: the listener, the dials, every connection's buffers, who keeps a slot
    inbound    what the connections this node accepts say: JOINs, HELLOs, the probe it receives
    mesh       the dials and what their lines mean: candidate ports, the ring probe, retries, figures
    checks     the local checks (runtime, disk) and a tool run within a bound; gpucheck the GPUs'
    stage      one node's run: checks and mesh at once, within --timeout; its report
    verdict    the bad nodes and the evidence against each, from one node's report, every node's, or
               one attempt's files
    cli        `slurm-multi fitness run|judge|record-cmd`
"""

from slurm_multi.fitness.verdict import judge_job

__all__ = ["judge_job"]
