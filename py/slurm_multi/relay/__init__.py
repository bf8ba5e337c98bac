"""Node-to-node relay for one byte stream (a `docker save`): no shared storage, forward as received.

Rank 0 reads the stream on stdin and sends it to its children; every other rank connects to its
parent, hands the stream to its loader (`docker load`) or stdout, and forwards the same bytes to its
own children while it receives them. Nothing holds more than one frame (1 MiB). docs/relay.md
tells the story; one module per concern:

- protocol  the wire format: lines, frames, tags, the chain digest (pure functions)
- tree      who is whose parent, which ports, what one node knows (Plan) and reports (Result)
- link      one connection (its buffer, key, frame count) and the status lines children send up
- connect   dialing the parent and gathering the children: both sides of the handshake
- forward   moving the stream: from the source or the parent to the children, stalls, aborts
- load      where a receiver's verified stream goes (its loader or stdout) and the stats file
- cli       `slurm-multi relay send|recv|port`

Exit codes: 0 delivered and verified, 1 runtime failure, 2 usage or rejected, 3 timeout.
"""

from slurm_multi.relay.forward import run_node, widen_pipe
from slurm_multi.relay.protocol import CHUNK
from slurm_multi.relay.tree import Log, Plan, Result, relay_ports

__all__ = ["CHUNK", "Log", "Plan", "Result", "relay_ports", "run_node", "widen_pipe"]
