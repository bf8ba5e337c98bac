#!/usr/bin/env bash
# bench/overhead_job.sh: the toolkit-overhead pairs, run by bench/cluster_bench.sh inside ONE
# `salloc -N2` (so Slurm's scheduling latency is on neither side). Each pair is one warm 2-node toy
# job through `bash sbatch/multi.sbatch` (as a batch step runs it, collect included) and one bare
# `srun -N2 docker run` of the same image and workload, back to back; the order alternates from
# pair to pair (toolkit first, then bare first), so drift on a shared machine hits both sides.
#
#   overhead_job.sh --work DIR --pairs N --cpu-pairs N --long-pairs N [--long-seconds S]
#
# stdout, one line per run: `KIND PAIR SIDE SECONDS`, KIND short (timed, not profiled), cpu (the
# short workload under bench/cpu_profile.py) or long (the S-second workload, profiled), SIDE toolkit
# or bare. Profiles go to DIR/cpu/KIND-SIDE-PAIR.json (BENCH_CPU_PROFILE=0: none, and no cpu pairs).
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${SM_PYTHON:-${ROOT}/.venv/bin/python}
IMAGE=toy/model:local

now() { date +%s.%N; }

# toolkit ARGS: the warm toy job as a batch step runs it (bash, in this allocation).
toolkit() {
  local args="--steps $1 --step-seconds $2"
  bash "${ROOT}/sbatch/multi.sbatch" --manifest "${ROOT}/examples/toy/build_manifest.json" \
    --image-cache "${WORK}/cache-overhead" --out "${WORK}/out" --model-args "${args}" >/dev/null 2>&1
}

# bare STEPS STEP_SECONDS: the same image and workload with nothing but srun and docker run (the
# rank variables the toy needs set by hand).
bare() {
  # shellcheck disable=SC2016 # $SLURM_NODEID expands in each task's shell
  local env='-e RANK=$SLURM_NODEID -e NODE_RANK=$SLURM_NODEID -e NNODES=2 -e WORLD_SIZE=2 -e MASTER_ADDR=node1 -e MASTER_PORT=29500'
  srun --nodes=2 --ntasks-per-node=1 bash -c "docker run --rm --network host ${env} ${IMAGE} sh run.sh --steps $1 --step-seconds $2" \
    >/dev/null 2>&1
}

# run_one KIND PAIR SIDE PROFILE STEPS STEP_SECONDS: one run, timed; PROFILE=1 records its CPU.
run_one() {
  local kind=$1 pair=$2 side=$3 profile=$4 rc=0 pid t took recording=${WORK}/cpu/$1-$3-$2
  shift 4
  if ((profile)); then
    local start=("${PY}" "${ROOT}/bench/cpu_profile.py" start "${recording}.d" --max-seconds 900)
    [[ ${BENCH_CPU_ACCT:-1} != 0 ]] || start+=(--no-acct)
    "${start[@]}" || { echo "overhead_job: cannot start the CPU recorder" >&2; return 1; }
  fi
  t=$(now)
  "${side}" "$@" &
  pid=$! # the root of this run's host processes (the batch step, srun)
  wait "${pid}" || rc=$?
  took=$(awk -v a="${t}" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }')
  if ((profile)); then
    "${PY}" "${ROOT}/bench/cpu_profile.py" stop "${recording}.d" --out "${recording}.json" --root "${pid}" \
      --job-nodes "${JOB_NODES}" ||
      echo "overhead_job: no CPU profile in ${recording}.json" >&2
    [[ -n ${BENCH_CPU_KEEP:-} ]] || rm -rf "${recording}.d"
  fi
  if ((rc != 0)); then
    echo "overhead_job: the ${side} run of ${kind} pair ${pair} failed (exit ${rc}); see ${WORK}/out" >&2
    return "${rc}"
  fi
  echo "${kind} ${pair} ${side} ${took}"
}

# pairs KIND COUNT PROFILE STEPS STEP_SECONDS: COUNT pairs, the order alternating.
pairs() {
  local kind=$1 count=$2 profile=$3 i
  shift 3
  for ((i = 1; i <= count; i++)); do
    if ((i % 2)); then
      run_one "${kind}" "${i}" toolkit "${profile}" "$@" || return
      run_one "${kind}" "${i}" bare "${profile}" "$@" || return
    else
      run_one "${kind}" "${i}" bare "${profile}" "$@" || return
      run_one "${kind}" "${i}" toolkit "${profile}" "$@" || return
    fi
  done
}

main() {
  local count=3 cpu_count=2 long_count=1 long_seconds=60
  WORK=
  while (($#)); do
    case $1 in
      --work) WORK=$2; shift 2 ;;
      --pairs) count=$2; shift 2 ;;
      --cpu-pairs) cpu_count=$2; shift 2 ;;
      --long-pairs) long_count=$2; shift 2 ;;
      --long-seconds) long_seconds=$2; shift 2 ;;
      *) echo "overhead_job: unknown option '$1'" >&2; return 2 ;;
    esac
  done
  [[ -n ${WORK} && -d ${WORK} ]] || { echo "overhead_job: --work DIR is required" >&2; return 2; }
  cd "${WORK}"
  export SM_HOME=${ROOT} SM_PYTHON=${PY}
  JOB_NODES=$(scontrol show hostnames "${SLURM_JOB_NODELIST:?run inside salloc -N2}" | paste -sd,)
  mkdir -p "${WORK}/cache-overhead" "${WORK}/cpu"
  local profile=1
  [[ ${BENCH_CPU_PROFILE:-1} != 0 ]] || profile=0 cpu_count=0
  # Warm-up, not counted: fills the cache, loads node2, warms both sides' page cache.
  toolkit 20 0.05 || { echo "overhead_job: the toolkit's warm-up job failed; see ${WORK}/out" >&2; return 1; }
  bare 20 0.05 || { echo "overhead_job: the bare warm-up run failed" >&2; return 1; }
  pairs short "${count}" 0 20 0.05 || return
  pairs cpu "${cpu_count}" 1 20 0.05 || return
  pairs long "${long_count}" "${profile}" "${long_seconds}" 1
}

# Sourced (tests/bats/bench.bats): functions only.
[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
