#!/bin/bash
# A madengine-style model script (the shape of madengine's dummy_torchrun/run_multi.sh, written
# here): bash, its own directory by BASH_SOURCE, the runner from MAD_MULTI_NODE_RUNNER, and the
# standalone fallback madengine's fixtures use when the runner is unset or empty.
set -e
SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$SCRIPT_DIR"
echo "dummy_torchrun: run directory ${SCRIPT_DIR}"
if [ -z "$MAD_MULTI_NODE_RUNNER" ]; then
  N_GPUS="${MAD_RUNTIME_NGPUS:-1}"
  echo "MAD_MULTI_NODE_RUNNER not set, using standalone torchrun"
  MAD_MULTI_NODE_RUNNER="torchrun --standalone --nproc_per_node=$N_GPUS"
fi
echo "Launcher Command: $MAD_MULTI_NODE_RUNNER"
echo "Executing: $MAD_MULTI_NODE_RUNNER run_torchrun_multi.py $*"
# shellcheck disable=SC2086 # a command line, split on purpose
$MAD_MULTI_NODE_RUNNER run_torchrun_multi.py "$@"
