#!/bin/bash
# A model script that ignores the multi-node runner and always trains on its own node: in a
# multi-node job every node succeeds alone. slurm-multi must fail such a job, not report SUCCESS.
set -e
cd "$(dirname "${BASH_SOURCE[0]}")"
echo "Running torchrun standalone, whatever MAD_MULTI_NODE_RUNNER says"
torchrun --standalone --nproc_per_node="${NPROC_PER_NODE:-2}" run_torchrun_multi.py "$@"
