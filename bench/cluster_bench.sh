#!/usr/bin/env bash
# The bench rows that need the test cluster: toolkit overhead and image distribution. Called by
# bench/run (bench::cluster_hook) with --out-dir DIR; writes one row file per row into DIR.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/log.sh
source "${ROOT}/lib/log.sh"
# shellcheck source=tests/cluster/lib.sh
source "${ROOT}/tests/cluster/lib.sh"

PY=${SM_PYTHON:-${ROOT}/.venv/bin/python}
EXEC=${ROOT}/tests/cluster/exec
BENCH_IMAGE=toy/model:bench

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }'; }
join() { local IFS=,; printf '%s' "$*"; }

row() { PYTHONPATH="${ROOT}/bench" "${PY}" "${ROOT}/bench/cluster_rows.py" "$@"; }

# wait_job ID: until the job ends, at most BENCH_JOB_TIMEOUT seconds (then it is cancelled); a job
# that Slurm says can never start (too few nodes, say) fails at once. Prints its exit code.
wait_job() {
  local line state reason deadline=$((SECONDS + ${BENCH_JOB_TIMEOUT:-600}))
  while :; do
    line=$(scontrol show job -o "$1" 2>/dev/null)
    state=$(grep -o 'JobState=[A-Z_]*' <<<"${line}" | cut -d= -f2)
    reason=$(grep -o ' Reason=[A-Za-z_]*' <<<"${line}" | cut -d= -f2)
    if [[ ${state} == PENDING && ${reason} =~ ^(PartitionNodeLimit|PartitionConfig|BadConstraints|ReqNodeNotAvail)$ ]]; then
      scancel "$1" 2>/dev/null || true
      log::error bench "job $1 can never start here (${reason}); cancelled"
      echo 255
      return 1
    fi
    case ${state} in PENDING | RUNNING | CONFIGURING | COMPLETING | "") ;; *) break ;; esac
    if ((SECONDS >= deadline)); then
      scancel "$1" 2>/dev/null || true
      log::error bench "job $1 still ${state} after ${BENCH_JOB_TIMEOUT:-600} s; cancelled"
      echo 255
      return 1
    fi
    sleep 0.2
  done
  grep -o ' ExitCode=[0-9]*' <<<"${line}" | cut -d= -f2
}

# ensure_nodes N: the test cluster has at least N nodes (the demo may have left 2): bring it up again
# with N if not. Every row's job fits then.
ensure_nodes() {
  local have=0
  [[ -f ${CLUSTER_STATE}/nodes ]] && have=$(wc -l <"${CLUSTER_STATE}/nodes")
  if ((have < $1)) || ! "${ROOT}/tests/cluster/status" >/dev/null 2>&1; then
    log::info bench "the cluster rows need $1 nodes (the test cluster has ${have}); bringing it up with $1"
    "${BENCH_CLUSTER_UP:-${ROOT}/tests/cluster/up}" --no-install --nodes "$1" >&2
  fi
}

# Inside ONE allocation, so scheduling latency is out of both sides of the ratio.
overhead_row() {
  local repeats=$1 out=$2 work=$3
  "${ROOT}/examples/toy/build-image" --node node1 >/dev/null
  local cache=${work}/cache-overhead
  mkdir -p "${cache}"
  cat >"${work}/overhead.sh" <<SCRIPT
#!/bin/bash
set -euo pipefail
cd "${work}"
export SM_HOME="${ROOT}" SM_PYTHON="${PY}"
run_toolkit() { bash "${ROOT}/sbatch/multi.sbatch" --manifest "${ROOT}/examples/toy/build_manifest.json" --image-cache "${cache}" --out "${work}/out" >/dev/null 2>&1; }
run_bare() {
  srun --nodes=2 --ntasks-per-node=1 bash -c 'docker run --rm --network host -e RANK=\$SLURM_NODEID -e NODE_RANK=\$SLURM_NODEID -e NNODES=2 -e WORLD_SIZE=2 -e MASTER_ADDR=node1 -e MASTER_PORT=29500 toy/model:local sh run.sh --steps 20' >/dev/null 2>&1
}
now() { date +%s.%N; }
run_toolkit   # warm-up: fills the cache and loads node2
run_bare
for i in \$(seq ${repeats}); do
  t=\$(now); run_toolkit; echo "toolkit \$(awk -v a=\$t -v b=\$(now) 'BEGIN { print b - a }')"
  t=\$(now); run_bare; echo "bare \$(awk -v a=\$t -v b=\$(now) 'BEGIN { print b - a }')"
done
SCRIPT
  local lines
  lines=$(timeout "${BENCH_JOB_TIMEOUT:-600}" salloc -N2 --immediate=60 --quiet bash "${work}/overhead.sh")
  local toolkit bare
  toolkit=$(awk '$1 == "toolkit" { print $2 }' <<<"${lines}" | paste -sd,)
  bare=$(awk '$1 == "bare" { print $2 }' <<<"${lines}" | paste -sd,)
  row --row "toolkit overhead, warm 2-node toy job" \
    --what "bash sbatch/multi.sbatch --manifest toy (warm cache, image on both nodes) inside salloc -N2, incl. collect" \
    --baseline "srun -N2 docker run --rm --network host toy/model:local sh run.sh --steps 20" \
    --samples "${toolkit}" --baseline-samples "${bare}" --target "<= 1.3x" \
    --notes "same allocation for both; the toy trains ~1.3 s" --out "${out}/toolkit-overhead.json"
}

image_rows() {
  local repeats=$1 out=$2 work=$3 pad_mb=${BENCH_PAD_MB:-200}
  "${ROOT}/examples/toy/build-image" --node node1 --tag "${BENCH_IMAGE}" --pad-mb "${pad_mb}" >/dev/null
  sed "s#\"toy/model:local\"#\"${BENCH_IMAGE}\"#" "${ROOT}/examples/toy/build_manifest.json" >"${work}/manifest.json"
  local cache=${work}/cache-image cold=() warm=() saveload=() rebuild=() i job node t dir
  for ((i = 0; i < repeats; i++)); do
    # Cold: image on node1 only, empty cache: rank 0 saves once, workers load in parallel.
    for node in node2 node3; do "${EXEC}" "${node}" docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true; done
    rm -rf "${cache}" && mkdir -p "${cache}"
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --image-cache "${cache}" --out "${work}/out" --collect false -- sh -c 'true')
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "cold job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    cold+=("$(image_stage_max "${dir}")")
    # Warm: cache holds the tar, every node has the image: no save, no load.
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --image-cache "${cache}" --out "${work}/out" --collect false -- sh -c 'true')
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "warm job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    warm+=("$(image_stage_max "${dir}")")
    # Baseline 1: one docker save plus one docker load, by hand.
    "${EXEC}" node2 docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true
    t=$(now)
    "${EXEC}" node1 docker save -o "${work}/by-hand.tar" "${BENCH_IMAGE}"
    "${EXEC}" node2 docker load -q -i "${work}/by-hand.tar" >/dev/null
    saveload+=("$(since "${t}")")
    rm -f "${work}/by-hand.tar"
    # Baseline 2: every node rebuilds from the same context, in parallel.
    t=$(now)
    for node in node1 node2 node3; do
      DOCKER_BUILDKIT=0 timeout 600 "${EXEC}" "${node}" docker build -q -t toy/model:bench-rebuild "${ROOT}/examples/toy" >/dev/null 2>&1 &
    done
    wait # (each build is bounded by its timeout)
    rebuild+=("$(since "${t}")")
    for node in node1 node2 node3; do "${EXEC}" "${node}" docker image rm -f toy/model:bench-rebuild >/dev/null 2>&1 || true; done
  done
  local what="image stage of a 3-node job (slowest node), ${pad_mb} MB image on node1 only, empty shared cache"
  row --row "image distribution, cold (3 nodes, ${pad_mb} MB)" --what "${what}" \
    --baseline "one docker save + one docker load by hand" \
    --samples "$(join "${cold[@]}")" --baseline-samples "$(join "${saveload[@]}")" \
    --notes "cold = rank 0 saves once, 2 workers load in parallel" --out "${out}/image-cold-vs-saveload.json"
  row --row "image distribution, cold vs every node rebuilding" --what "${what}" \
    --baseline "docker build on all 3 nodes in parallel" \
    --samples "$(join "${cold[@]}")" --baseline-samples "$(join "${rebuild[@]}")" \
    --out "${out}/image-cold-vs-rebuild.json"
  row --row "image distribution, warm (cache hit) vs cold" \
    --what "image stage (slowest node) when every node already has the image and the cache holds it" \
    --baseline "the cold image stage, same run" \
    --samples "$(join "${warm[@]}")" --baseline-samples "$(join "${cold[@]}")" --target "<= 0.1x" \
    --out "${out}/image-warm-vs-cold.json"
  for node in node1 node2 node3; do "${EXEC}" "${node}" docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true; done
  rm -f "${ROOT}"/examples/toy/pad/*.bin
}

# image_stage_max JOBDIR: the slowest node's image stage, from status.json.
image_stage_max() {
  "${PY}" - "$1" <<'PY'
import glob, json, os, sys
times = [json.load(open(p))["stages"].get("image", {}).get("seconds", 0.0)
         for p in glob.glob(os.path.join(sys.argv[1], "node_*", "status.json"))]
print(max(times) if times else 0.0)
PY
}

main() {
  local repeats=3 out="" quick=0
  while (($#)); do
    case $1 in
      --repeats) repeats=$2; shift 2 ;;
      --quick) quick=1; shift ;;
      --out-dir) out=$2; shift 2 ;;
      -h | --help) echo "Usage: bench/cluster_bench.sh --out-dir DIR [--repeats N] [--quick]"; return 0 ;;
      *) log::error bench "unknown option '$1'"; return 2 ;;
    esac
  done
  [[ -n ${out} ]] || log::die bench "--out-dir is required" 2
  ((quick)) && repeats=2
  ((repeats > 5)) && repeats=5
  mkdir -p "${out}"
  local work
  work=$(mktemp -d /tmp/sm-bench.XXXXXX)
  # shellcheck disable=SC2064 # expand now: work is local
  trap "rm -rf '${work}'" EXIT
  ensure_nodes 3
  log::info bench "toolkit overhead (${repeats} runs each side)"
  overhead_row "${repeats}" "${out}" "${work}"
  log::info bench "image distribution (${repeats} runs each)"
  image_rows "${repeats}" "${out}" "${work}"
}

# Sourced (tests/bats/bench.bats): functions only.
[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
