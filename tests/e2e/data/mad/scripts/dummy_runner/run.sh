#!/bin/bash
# Prints the madengine context this node's container got, one `mad: NAME=VALUE` line each, and
# writes a one-row CSV: a check of the variables and the runner per launcher on every node.
for name in MAD_MULTI_NODE_RUNNER MAD_RUNTIME_NGPUS MAD_SYSTEM_NGPUS MAD_MODEL_NAME MAD_OUTPUT_CSV \
  MAD_GUEST_OS MAD_COLLECT_METRICS NNODES NODE_RANK RANK WORLD_SIZE MASTER_ADDR MASTER_PORT NPROC_PER_NODE \
  TORCH_ELASTIC_RDZV_TIMEOUT GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME MIOPEN_USER_DB_PATH; do
  eval "value=\${${name}-<unset>}"
  echo "mad: ${name}=${value}"
done
echo "mad: pwd=$(pwd)"
hostfile=${MAD_MULTI_NODE_RUNNER#*--hostfile=}
hostfile=${hostfile%% *}
if [ "${hostfile}" != "${MAD_MULTI_NODE_RUNNER}" ]; then
  echo "mad: hostfile ${hostfile}: $(tr '\n' ';' <"${hostfile}")"
fi
printf 'model,performance,metric\nrunner,1,ok\n' >perf_dummy_runner.csv
