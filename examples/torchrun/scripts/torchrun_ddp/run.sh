#!/bin/bash
# The model script of the torchrun example, written as a MAD model's run script is: madengine (and
# slurm-multi) copy this directory into the container's run directory and run `bash run.sh ARGS`
# there, with MAD_MULTI_NODE_RUNNER set to this node's torchrun command line. Every ARG goes to
# train.py. Outside a multi-node job (no runner) it trains alone, as madengine's own fixtures do.
#   run.sh [TRAIN.PY OPTION...]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "${HERE}"

if [[ -z ${MAD_MULTI_NODE_RUNNER:-} ]]; then
  echo "MAD_MULTI_NODE_RUNNER not set, using standalone torchrun"
  MAD_MULTI_NODE_RUNNER="torchrun --standalone --nproc_per_node=${MAD_RUNTIME_NGPUS:-2}"
fi
echo "Launcher command: ${MAD_MULTI_NODE_RUNNER} train.py $*"
# The runner is a command line: split into words on purpose, as every MAD model script does.
# shellcheck disable=SC2086
exec ${MAD_MULTI_NODE_RUNNER} train.py "$@"
