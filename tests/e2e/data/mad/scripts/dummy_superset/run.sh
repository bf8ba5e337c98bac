#!/bin/bash
# A superset model: its args name a --config CSV, and its results CSV has one row per config row
# with extra columns (benchmark, temperature); the last node writes the numbers.
config=
while [ $# -gt 0 ]; do
  case $1 in --config) config=$2; shift 2 ;; *) shift ;; esac
done
[ -f "${config}" ] || { echo "superset: no config ${config}" >&2; exit 2; }
echo "superset: rank ${NODE_RANK}/${NNODES} config ${config}"
{
  echo "model,benchmark,temperature,performance,metric"
  if [ "${NODE_RANK}" = $((NNODES - 1)) ]; then
    echo "dummy/model-1,throughput,61,1281.5,tokens_per_second"
    echo "dummy/model-2,serving,62,2562.5,requests_per_second"
    echo "dummy/model-3,latency,63,5.25,ms"
  else
    echo "dummy/model-1,throughput,,,tokens_per_second"
  fi
} >perf_dummy_super.csv
