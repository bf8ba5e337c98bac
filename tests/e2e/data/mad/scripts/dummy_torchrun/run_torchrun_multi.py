"""A tiny data-parallel job in madengine's fixture shape: every process prints `Rank: R/W`, joins
one gloo group when WORLD_SIZE > 1 (else says it runs standalone), all-reduces a few times, and
local rank 0 of every node writes the multiple-results CSV into its working directory (the run
directory) and a `performance:` line."""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist

CSV = "perf_dummy_torchrun.csv"


def main() -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    print(f"Hostname: {socket.gethostname()} Rank: {rank}/{world} Local Rank: {local_rank}", flush=True)
    if world > 1:
        dist.init_process_group("gloo", init_method="env://")
        print(f"[Rank {rank}] process group initialized, World Size: {dist.get_world_size()}", flush=True)
    else:
        print("=== Running in Standalone Mode ===", flush=True)
    start = time.perf_counter()
    value = torch.ones(1024)
    for _ in range(20):
        if world > 1:
            dist.all_reduce(value)
            value /= world
    elapsed = time.perf_counter() - start
    throughput = 20 * 1024 * world / max(elapsed, 1e-6)
    if local_rank == 0:
        node = rank // local_world
        print(f"performance: {throughput:.2f} samples_per_second", flush=True)
        print(f"node_id: {node}", flush=True)
        with open(CSV, "w", encoding="utf-8") as handle:
            handle.write("model,performance,metric,world_size\n")
            handle.write(f"allreduce,{throughput:.2f},samples_per_second,{world}\n")
        print(f"Wrote {CSV} in {os.getcwd()}", flush=True)
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
