"""Data-parallel training of a small MLP with torch.distributed (gloo over TCP) and DDP.

One process per rank, started by torchrun (run.sh: $MAD_MULTI_NODE_RUNNER train.py) with the env://
rendezvous variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK). Every rank builds the same model (seed 0), trains on its own synthetic regression data
(seeded by rank) and, at the end, proves its weights equal rank 0's bit for bit. The last global
rank writes the throughput rows of the multiple-results CSV into the run directory (its working
directory, where madengine looks for it); local rank 0 of every other node writes the same rows
with the performance left empty (present-but-empty, as Primus does).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

MODEL = "ddp-mlp"  # the CSV's model column: perf.csv names it <model>_ddp-mlp, as madengine does
HEADER = "model,performance,metric,mode,precision,batch_size,global_batch_size,seq_len,device,num_gpus"
IN_FEATURES = 32
HIDDEN = 128
MISMATCH_EXIT = 7


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step (default 32)")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    parser.add_argument("--log-every", type=int, default=5, help="print the loss every N steps (default 5)")
    parser.add_argument("--fail-rank", type=int, default=-1, help="this global rank fails on purpose ...")
    parser.add_argument("--fail-step", type=int, default=1, help="... at this step (default 1)")
    parser.add_argument(
        "--quiet-compute",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before step 1 every rank computes for SECONDS without printing (a silent but busy job)",
    )
    parser.add_argument("--csv", default="perf_ddp.csv", help="results CSV name (default perf_ddp.csv)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.log_every < 1:
        parser.error("--steps, --batch and --log-every must be at least 1")
    return args


def env_int(name: str, default: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            sys.exit(f"ddp: {name} is not set (torchrun sets it)")
        return default
    try:
        return int(value)
    except ValueError:
        sys.exit(f"ddp: {name}={value!r} is not a whole number")


def emit(line: str, stream=sys.stdout) -> None:
    """One whole line per write: ranks share the node's stdout, and print() writes the text and the
    newline separately when unbuffered (PYTHONUNBUFFERED=1), so lines of two ranks could interleave."""
    stream.write(line + "\n")
    stream.flush()


def say(rank: int, message: str) -> None:
    emit(f"ddp: rank {rank} {message}")


def build_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return nn.Sequential(
        nn.Linear(IN_FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, 1),
    )


def quiet_compute(seconds: float) -> None:
    """Keep the CPU busy for `seconds` with matrix products, printing nothing."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(256, 256, generator=gen)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)


def flat_parameters(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).contiguous()


def write_csv(path: str, rows: list[tuple[str, str]], batch: int, world: int) -> None:
    lines = [HEADER]
    for value, metric in rows:
        lines.append(f"{MODEL},{value},{metric},train,FP32,{batch},{batch * world},,cpu,{world}")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = env_int("RANK")
    world = env_int("WORLD_SIZE")
    local_rank = env_int("LOCAL_RANK", 0)
    local_world = env_int("LOCAL_WORLD_SIZE", 1)
    node = env_int("GROUP_RANK", rank // local_world)
    out_dir = os.environ.get("SM_OUTPUT_DIR") or "."  # the weight digests (the CSV goes to the cwd)
    last = world - 1
    last_node = last // local_world
    # No address tricks here: a node whose own name resolves to 127.0.1.1 gets GLOO_SOCKET_IFNAME
    # from slurm-multi's prepare, as any torch job would.
    master = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"

    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    say(rank, f"of {world} (node {node}, local rank {local_rank}) joined the gloo group (master {master})")

    model = DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    # One target function for all ranks; each rank draws its own samples of it.
    true_w = torch.randn(IN_FEATURES, 1, generator=torch.Generator().manual_seed(1234))
    data = torch.Generator().manual_seed(1000 + rank)

    if args.quiet_compute > 0:
        quiet_compute(args.quiet_compute)

    dist.barrier()
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        if rank == args.fail_rank and step == args.fail_step:
            say(rank, f"failing on purpose at step {step}")
            raise RuntimeError(f"rank {rank} failed on purpose at step {step} (--fail-rank/--fail-step)")
        x = torch.randn(args.batch, IN_FEATURES, generator=data)
        y = torch.sin(x @ true_w) + 0.01 * torch.randn(args.batch, 1, generator=data)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        if step % args.log_every == 0 or step == args.steps:
            say(rank, f"step {step}/{args.steps} loss={loss.item():.6f}")
    dist.barrier()
    elapsed = time.perf_counter() - start

    # Data parallelism means identical weights everywhere: check it bit for bit against rank 0.
    mine = flat_parameters(model.module)
    reference = mine.clone()
    dist.broadcast(reference, src=0)
    matches = torch.equal(mine, reference)
    mismatched = torch.tensor([0 if matches else 1], dtype=torch.int64)
    dist.all_reduce(mismatched)
    digest = hashlib.sha256(mine.numpy().tobytes()).hexdigest()
    with open(os.path.join(out_dir, f"weights-rank{rank}.sha256"), "w", encoding="utf-8") as handle:
        handle.write(digest + "\n")
    if matches:
        say(rank, f"weights match rank 0 (sha256 {digest[:8]}…)")
    else:
        say(rank, f"weights DIFFER from rank 0 (sha256 {digest[:8]}…)")

    if mismatched.item():
        # No throughput for a run whose result is wrong.
        emit(
            f"ddp: rank {rank}: {mismatched.item()} of {world} ranks ended with weights that differ "
            "from rank 0's: data-parallel training went wrong",
            sys.stderr,
        )
        dist.destroy_process_group()
        return MISMATCH_EXIT

    samples_per_s = args.steps * args.batch * world / elapsed
    step_time_ms = elapsed / args.steps * 1000.0
    csv_path = args.csv
    if rank == last:
        write_csv(
            csv_path,
            [(f"{samples_per_s:.2f}", "samples_per_s"), (f"{step_time_ms:.3f}", "step_time_ms")],
            args.batch,
            world,
        )
        say(rank, f"wrote {csv_path}")
        emit(f"performance: {samples_per_s:.2f} samples_per_s")
    elif local_rank == 0 and node != last_node:
        write_csv(csv_path, [("", "samples_per_s"), ("", "step_time_ms")], args.batch, world)
        say(rank, f"wrote {csv_path} (performance left empty: the last rank reports it)")

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
