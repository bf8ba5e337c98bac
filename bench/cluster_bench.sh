#!/usr/bin/env bash
# The bench rows that need the test cluster: toolkit overhead and image distribution. Called by
# bench/run (bench::cluster_hook) with --out-dir DIR; writes one row file per row into DIR.
set -Eeuo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/log.sh
source "${ROOT}/lib/log.sh"
# shellcheck source=tests/cluster/lib.sh
source "${ROOT}/tests/cluster/lib.sh"
# shellcheck source=bench/midrun_bench.sh
source "${ROOT}/bench/midrun_bench.sh"

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

# overhead_row REPEATS OUT WORK: what the toolkit adds to a warm 2-node job, in seconds and in CPU,
# against bare `srun docker run` (bench/overhead_job.sh runs the pairs inside ONE allocation).
# 3 x REPEATS timed pairs on the toy (the bare side is bimodal: the toy's rank 1 retries its first
# connection after 0.2 s when rank 0 is not listening yet), REPEATS profiled pairs for the CPU, and
# (REPEATS + 1) / 2 pairs on a BENCH_LONG_SECONDS (60) second workload for the ratio where it matters.
overhead_row() {
  local repeats=$1 out=$2 work=$3 long_seconds=${BENCH_LONG_SECONDS:-60}
  local pairs=$(($1 * 3)) cpu_pairs=$1 long_pairs=$((($1 + 1) / 2))
  "${ROOT}/examples/toy/build-image" --node node1 >/dev/null
  local lines budget=$((${BENCH_JOB_TIMEOUT:-600} + long_pairs * 2 * (long_seconds + 60)))
  lines=$(SM_PYTHON=${PY} timeout "${budget}" salloc -N2 --immediate=60 --quiet bash "${ROOT}/bench/overhead_job.sh" --work "${work}" \
    --pairs "${pairs}" --cpu-pairs "${cpu_pairs}" --long-pairs "${long_pairs}" --long-seconds "${long_seconds}") ||
    log::die bench "the overhead pairs failed (see above)" 1
  # samples KIND SIDE: that side's seconds, in pair order.
  samples() { awk -v k="$1" -v s="$2" '$1 == k && $3 == s { print $4 }' <<<"${lines}" | paste -sd,; }
  local bare_cmd="srun -N2 docker run --rm --network host toy/model:local sh run.sh"
  local toolkit_cmd="bash sbatch/multi.sbatch --manifest toy --model-args ... (warm cache, image on both nodes) inside salloc -N2, collect included"
  row --row "toolkit overhead, warm 2-node toy job" --paired \
    --what "${toolkit_cmd}, the toy's ~1 s workload (--steps 20)" \
    --baseline "${bare_cmd} --steps 20" \
    --samples "$(samples short toolkit)" --baseline-samples "$(samples short bare)" --target "<= 0.8 s added" \
    --notes "${pairs} pairs in one allocation, the order alternating; the ratio is on a 1-second toy, not judged" \
    --out "${out}/overhead-1-seconds.json"
  local i
  CPU_OPTS=()
  for ((i = 1; i <= cpu_pairs; i++)); do # a pair whose profile is missing on either side is left out
    [[ -s ${work}/cpu/cpu-toolkit-${i}.json && -s ${work}/cpu/cpu-bare-${i}.json ]] || continue
    CPU_OPTS+=(--cpu "${work}/cpu/cpu-toolkit-${i}.json" --baseline-cpu "${work}/cpu/cpu-bare-${i}.json")
  done
  if ((${#CPU_OPTS[@]})); then
    row --row "toolkit CPU per node, warm 2-node toy job" --paired --nodes 2 --cpu-samples "${CPU_OPTS[@]}" \
      --what "CPU s per node of every process of the toolkit's job but the workload container's own (process accounting; the batch step counted with the nodes)" \
      --baseline "the same for ${bare_cmd} --steps 20 (srun, slurmstepd, docker CLI, engine)" \
      --target "<= 1.5 CPU-s added" \
      --notes "$((${#CPU_OPTS[@]} / 4)) pairs in the same allocation, each run under the CPU recorder" \
      --out "${out}/overhead-2-cpu.json"
  else
    log::warn bench "no CPU profiles of the overhead pairs (BENCH_CPU_PROFILE=0?): no CPU row"
  fi
  CPU_OPTS=()
  cpu_files cpu "${work}/cpu/long-toolkit-"*.json
  cpu_files baseline-cpu "${work}/cpu/long-bare-"*.json
  local job_opts=()
  ((${#CPU_OPTS[@]} == 0)) || job_opts=(--nodes 2 "${CPU_OPTS[@]}")
  row --row "toolkit overhead, warm 2-node ${long_seconds} s workload" --paired \
    --what "${toolkit_cmd}, --steps ${long_seconds} --step-seconds 1" \
    --baseline "${bare_cmd} --steps ${long_seconds} --step-seconds 1" \
    --samples "$(samples long toolkit)" --baseline-samples "$(samples long bare)" \
    --notes "${long_pairs} pair(s) in the same allocation, both sides under the CPU recorder; the ratio where start-up matters" \
    "${job_opts[@]}" --out "${out}/overhead-3-long.json"
}

# badnode_rows REPEATS OUT WORK: how long a 3-node job takes to end FAILURE naming a bad node (the
# default --on-bad-node fail) for each way of making node3 bad, against the same job on healthy
# nodes: the fitness stage's time to detect the fault, and what the job costs then.
badnode_rows() {
  local repeats=$1 out=$2 work=$3 seed_name i t healthy=() took=()
  "${ROOT}/examples/toy/build-image" --node node1 >/dev/null
  local args=(--manifest "${ROOT}/examples/toy/build_manifest.json" --image-cache "${work}/cache-bad"
    --out "${work}/out-bad" --quarantine-hours 0 --fitness-timeout 5)
  local scratch=/var/tmp/sm-bench-scratch
  mkdir -p "${scratch}" && chmod 1777 "${scratch}"
  # submit3 WANT: one job; its exit code must be WANT (0 healthy, 1 FAILURE naming the bad node).
  submit3() {
    local job rc
    job=$(cd "${work}" && TMPDIR=${scratch} sbatch --parsable -N3 -w node1,node2,node3 -o /dev/null \
      "${ROOT}/sbatch/multi.sbatch" "${args[@]}") || return 1
    rc=$(wait_job "${job}" || true)
    [[ ${rc} == "$1" ]] || log::die bench "job ${job} ended with exit ${rc:-?}, not $1 ($(if (($1)); then echo "the bad node was not found"; else echo "a healthy job failed"; fi))" 1
  }
  seed() {
    local dockerd
    dockerd=$(cluster::node_dir node3)/dockerd.pid
    case $1:$2 in
      engine-stopped:on) cluster::stop_pidfile "${dockerd}" ;;
      engine-stopped:off) cluster::start_dockerd node3 && cluster::wait_for "node3's docker engine" env DOCKER_HOST="unix://$(cluster::node_dir node3)/docker.sock" docker version ;;
      engine-hung:on) kill -STOP "$(<"${dockerd}")" ;;
      engine-hung:off) kill -CONT "$(<"${dockerd}")" ;;
      ports-blocked:on | ports-blocked:off)
        local op=-I
        [[ $2 == on ]] || op=-D
        "${EXEC}" node3 iptables "${op}" INPUT -p tcp --dport 10000:32767 -j DROP
        "${EXEC}" node3 iptables "${op}" OUTPUT -p tcp --dport 10000:32767 -j DROP
        ;;
      disk-full:on) "${EXEC}" node3 mount -t tmpfs -o size=2m,mode=1777 tmpfs "${scratch}" ;;
      disk-full:off) "${EXEC}" node3 umount "${scratch}" ;;
    esac
  }
  # (This runs in a subshell of its own: a row that dies here leaves no node bad behind it.)
  local seeded=""
  trap '[[ -z ${seeded:-} ]] || seed "${seeded}" off' EXIT
  submit3 0 # warm-up: every node holds the image
  for ((i = 0; i < repeats; i++)); do
    t=$(now)
    submit3 0
    healthy+=("$(awk -v a="${t}" -v b="$(now)" 'BEGIN { print b - a }')")
  done
  for seed_name in engine-stopped engine-hung ports-blocked disk-full; do
    took=()
    for ((i = 0; i < repeats; i++)); do
      seed "${seed_name}" on
      seeded=${seed_name}
      t=$(now)
      submit3 1
      took+=("$(awk -v a="${t}" -v b="$(now)" 'BEGIN { print b - a }')")
      seed "${seed_name}" off
      seeded=""
      cluster::wait_for "4 idle nodes" cluster::nodes_idle 4
    done
    row --row "bad node found: ${seed_name} on node3" \
      --what "sbatch -N3 of the toy (--on-bad-node fail, --fitness-timeout 5) with node3's ${seed_name//-/ }: submit to the FAILURE verdict naming it" \
      --baseline "the same job, every node healthy: submit to SUCCESS" \
      --samples "$(IFS=,; echo "${took[*]}")" --baseline-samples "$(IFS=,; echo "${healthy[*]}")" \
      --notes "time to detect; the reachability check waits out --fitness-timeout for an unreachable node" \
      --out "${out}/badnode-${seed_name}.json"
  done
}

image_rows() {
  local repeats=$1 out=$2 work=$3 pad_mb=${BENCH_PAD_MB:-200}
  "${ROOT}/examples/toy/build-image" --node node1 --tag "${BENCH_IMAGE}" --pad-mb "${pad_mb}" >/dev/null
  sed "s#\"toy/model:local\"#\"${BENCH_IMAGE}\"#" "${ROOT}/examples/toy/build_manifest.json" >"${work}/manifest.json"
  local cache=${work}/cache-image cold=() warm=() nocache=() saveload=() rebuild=() i job node t dir
  for ((i = 0; i < repeats; i++)); do
    # Cold: image on node1 only, empty cache: rank 0 saves once, workers load in parallel.
    for node in node2 node3; do "${EXEC}" "${node}" docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true; done
    rm -rf "${cache}" && mkdir -p "${cache}"
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --image-cache "${cache}" --out "${work}/out" --collect false -- sh -c 'true')
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "cold job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    cold+=("$(stage_max "${dir}" image)")
    # Warm: cache holds the tar, every node has the image: no save, no load.
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --image-cache "${cache}" --out "${work}/out" --collect false -- sh -c 'true')
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "warm job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    warm+=("$(stage_max "${dir}" image)")
    # Warm without --image-cache: every worker tells rank 0 it holds the image; nothing moves.
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --out "${work}/out" --collect false -- sh -c 'true')
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "warm job ${job} without a cache did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    nocache+=("$(stage_max "${dir}" image)")
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
  row --row "image distribution, warm without --image-cache vs cold" \
    --what "image stage (slowest node) when every node already has the image and there is no cache" \
    --baseline "the cold image stage, same run" \
    --samples "$(join "${nocache[@]}")" --baseline-samples "$(join "${cold[@]}")" --target "<= 0.05x" \
    --notes "workers say what they hold in their first READY; rank 0 releases at once" \
    --out "${out}/image-warm-nocache-vs-cold.json"
  for node in node1 node2 node3; do "${EXEC}" "${node}" docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true; done
  rm -f "${ROOT}"/examples/toy/pad/*.bin
}

# pyxis_rows REPEATS OUT WORK: the squashfs path, each ratio measured in this run. Cold: rank 0
# imports the image into an empty cache and every rank starts it; the floor is the same work by
# hand (one enroot import, one srun --container-image). Warm: the cache holds it. Job: the warm
# pyxis toy job against bare srun --container-image of the same command, in one allocation.
pyxis_rows() {
  local repeats=$1 out=$2 work=$3 pad_mb=${BENCH_PAD_MB:-200}
  if ! cluster::pyxis_on; then
    log::warn bench "pyxis is not on in the test cluster (tests/cluster/up --no-pyxis?): no pyxis rows"
    return 0
  fi
  "${ROOT}/examples/toy/build-image" --node node1 --tag "${BENCH_IMAGE}" --pad-mb "${pad_mb}" >/dev/null
  sed "s#\"toy/model:local\"#\"${BENCH_IMAGE}\"#" "${ROOT}/examples/toy/build_manifest.json" >"${work}/manifest.json"
  local cache=${work}/cache-pyxis cold=() warm=() byhand=() i job t dir sqsh=${work}/by-hand.sqsh
  # The by-hand floor runs as the job user, who must reach the work dir.
  chmod a+rwx "${work}"
  for ((i = 0; i < repeats; i++)); do
    rm -rf "${cache}" && mkdir -p "${cache}"
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --runtime pyxis --image-cache "${cache}" --out "${work}/out" --collect false -- sh -c true)
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "cold pyxis job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    cold+=("$(stage_max "${dir}" image run)")
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --runtime pyxis --image-cache "${cache}" --out "${work}/out" --collect false -- sh -c true)
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "warm pyxis job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    warm+=("$(stage_max "${dir}" image run)")
    # The floor: one import and one container start, by hand (as the job user, on the nodes).
    rm -f "${sqsh}"
    t=$(now)
    runuser -u "${CLUSTER_USER}" -- srun -w node1 -N1 enroot import -o "${sqsh}" "dockerd://${BENCH_IMAGE}" >/dev/null 2>&1 ||
      log::die bench "enroot import of ${BENCH_IMAGE} by hand failed" 1
    runuser -u "${CLUSTER_USER}" -- srun -w node2 -N1 --container-image="${sqsh}" sh -c true >/dev/null 2>&1 ||
      log::die bench "srun --container-image=${sqsh} by hand failed" 1
    byhand+=("$(since "${t}")")
  done
  row --row "pyxis: squashfs distribution, cold (3 nodes, ${pad_mb} MB)" \
    --what "image + run stage of a 3-node pyxis job running 'true' (slowest node), empty cache: rank 0 imports, every rank starts it" \
    --baseline "one enroot import + one srun --container-image=<sqsh> true, by hand" \
    --samples "$(join "${cold[@]}")" --baseline-samples "$(join "${byhand[@]}")" \
    --out "${out}/pyxis-cold-vs-import.json"
  row --row "pyxis: warm (squashfs cache hit) vs cold" --what "the same stages when the cache holds the squashfs" \
    --baseline "the cold stages, same run" --samples "$(join "${warm[@]}")" --baseline-samples "$(join "${cold[@]}")" \
    --notes "warm still starts (unpacks) the squashfs on every rank" --out "${out}/pyxis-warm-vs-cold.json"
  # The whole warm toy job against bare srun --container-image, in one allocation.
  "${ROOT}/examples/toy/build-image" --node node1 >/dev/null
  local pcache=${work}/cache-pyxis-job
  mkdir -p "${pcache}"
  chmod -R a+rwx "${work}"
  cat >"${work}/pyxis-job.sh" <<SCRIPT
#!/bin/bash
set -euo pipefail
cd "${work}"
export SM_HOME="${ROOT}" SM_PYTHON="${PY}"
run_toolkit() { bash "${ROOT}/sbatch/multi.sbatch" --manifest "${ROOT}/examples/toy/build_manifest.json" --runtime pyxis --image-cache "${pcache}" --out "${work}/out" >/dev/null 2>&1; }
run_bare() {
  srun --nodes=2 --ntasks-per-node=1 --container-image="\$(ls "${pcache}"/*.sqsh)" --container-workdir=/toy sh -c 'export RANK=\$SLURM_NODEID NODE_RANK=\$SLURM_NODEID NNODES=2 WORLD_SIZE=2 MASTER_ADDR=node1 MASTER_PORT=29500; exec sh run.sh --steps 20' >/dev/null 2>&1
}
now() { date +%s.%N; }
run_toolkit   # warm-up: makes the squashfs
for i in \$(seq ${repeats}); do
  t=\$(now); run_toolkit; echo "toolkit \$(awk -v a=\$t -v b=\$(now) 'BEGIN { print b - a }')"
  t=\$(now); run_bare; echo "bare \$(awk -v a=\$t -v b=\$(now) 'BEGIN { print b - a }')"
done
SCRIPT
  local lines toolkit bare
  lines=$(cd "${work}" && timeout "${BENCH_JOB_TIMEOUT:-600}" runuser -u "${CLUSTER_USER}" -- salloc -N2 --immediate=60 --quiet bash "${work}/pyxis-job.sh")
  toolkit=$(awk '$1 == "toolkit" { print $2 }' <<<"${lines}" | paste -sd,)
  bare=$(awk '$1 == "bare" { print $2 }' <<<"${lines}" | paste -sd,)
  row --row "pyxis: toolkit overhead, warm 2-node toy job" \
    --what "bash sbatch/multi.sbatch --manifest toy --runtime pyxis (warm squashfs) inside salloc -N2, incl. collect" \
    --baseline "srun -N2 --container-image=<the same squashfs> sh run.sh --steps 20" \
    --samples "${toolkit}" --baseline-samples "${bare}" \
    --notes "same allocation for both; each rank's container is unpacked on every start" --out "${out}/pyxis-overhead.json"
  "${EXEC}" node1 docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true
  rm -f "${ROOT}"/examples/toy/pad/*.bin
}

# transport_rows REPEATS OUT WORK: the cold image on a ~1 GB image, node to node. Each cold job's
# figure is its slowest node's image stage; its floor, measured by hand in the same run, is
# max(one docker save on node1, N-1 concurrent docker loads of that tar on the other nodes): the
# nodes here share one disk and two cores, so N loads at once compete as they never would on
# real nodes.
transport_rows() {
  local repeats=$1 out=$2 work=$3 mb=${BENCH_RELAY_MB:-1000} i n job dir cache
  cache=${work}/cache-relay
  "${ROOT}/examples/toy/build-image" --node node1 --tag "${BENCH_IMAGE}" --pad-mb "${mb}" >/dev/null
  sed "s#\"toy/model:local\"#\"${BENCH_IMAGE}\"#" "${ROOT}/examples/toy/build_manifest.json" >"${work}/manifest.json"
  local -A relay_cold=() relay_floor=() relay_hand=()
  local pipelined=() pfloor=() phand=() warm=() wcold=() cpu=${work}/cpu
  mkdir -p "${cpu}"
  for ((i = 0; i < repeats; i++)); do
    for n in 2 3 4; do
      clear_workers "${n}"
      job=$(cd "${work}" && profiled "${cpu}/relay-${n}-${i}.json" cold_job "${n}" --image-transport relay)
      dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
      relay_cold[${n}]+="$(stage_max "${dir}" image),"
      relay_floor[${n}]+="$(floor_seconds "${n}" "${work}"),"
      relay_hand[${n}]+="$(profiled "${cpu}/hand-${n}-${i}.json" hand_pipeline_seconds "${n}" "${work}"),"
    done
    # Pipelined with the cache, 3 nodes: the tar is written while the workers load; then warm
    # (its floors first: measuring them clears the workers, and warm means they keep the image).
    pfloor+=("$(floor_seconds 3 "${work}")")
    phand+=("$(profiled "${cpu}/handtar-3-${i}.json" hand_pipeline_seconds 3 "${work}" "${work}/hand.tar")")
    clear_workers 3
    rm -rf "${cache}" && mkdir -p "${cache}"
    job=$(cd "${work}" && profiled "${cpu}/pipelined-3-${i}.json" cold_job 3 --image-cache "${cache}")
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    pipelined+=("$(stage_max "${dir}" image)")
    wcold+=("${pipelined[-1]}")
    job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${work}/manifest.json" \
      --image-cache "${cache}" --out "${work}/out" --collect false -- true)
    [[ $(wait_job "${job}") == 0 ]] || log::die bench "warm job ${job} did not succeed; see ${work}/out" 1
    dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
    warm+=("$(stage_max "${dir}" image)")
  done
  local size="${mb} MB image"
  row --row "image: cold pipelined with the cache (3 nodes, ${size})" \
    --what "image stage of a 3-node job (slowest node): rank 0's docker save streams to the workers' docker load while it is written into the cache" \
    --baseline "max(one docker save, 2 concurrent docker loads), by hand" \
    --samples "$(join "${pipelined[@]}")" --baseline-samples "$(join "${pfloor[@]}")" --target "<= 1.15x" \
    --out "${out}/image-pipelined-vs-floor.json"
  local hand="docker save on node1 | tee | concurrent docker loads on the other nodes, by hand (no toolkit)"
  for n in 2 3 4; do
    CPU_OPTS=()
    cpu_files cpu "${cpu}/relay-${n}-"*.json
    cpu_files baseline-cpu "${cpu}/hand-${n}-"*.json
    row --row "image: cold relay vs hand pipeline (${n} nodes, ${size})" \
      --what "image stage of a ${n}-node job (slowest node), --image-transport relay, no shared storage" \
      --baseline "${hand} ($((n - 1)) loads), same run" \
      --samples "${relay_cold[${n}]%,}" --baseline-samples "${relay_hand[${n}]%,}" --target "<= 1.15x" \
      "${CPU_OPTS[@]}" --out "${out}/image-relay-${n}-vs-hand.json"
  done
  CPU_OPTS=()
  cpu_files cpu "${cpu}/pipelined-3-"*.json
  cpu_files baseline-cpu "${cpu}/handtar-3-"*.json
  row --row "image: cold pipelined (cache) vs hand pipeline (3 nodes, ${size})" \
    --what "image stage of a 3-node job (slowest node) with --image-cache: the stream is written into the cache as it passes" \
    --baseline "${hand} (2 loads, tee also writes the tar), same run" \
    --samples "$(join "${pipelined[@]}")" --baseline-samples "$(join "${phand[@]}")" --target "<= 1.15x" \
    "${CPU_OPTS[@]}" --out "${out}/image-pipelined-vs-hand.json"
  for n in 2 3 4; do
    row --row "image: cold relay, no cache (${n} nodes, ${size})" \
      --what "image stage of a ${n}-node job (slowest node), --image-transport relay, no shared storage" \
      --baseline "max(one docker save, $((n - 1)) concurrent docker loads), by hand" \
      --samples "${relay_cold[${n}]%,}" --baseline-samples "${relay_floor[${n}]%,}" --target "<= 1.15x" \
      --out "${out}/image-relay-${n}-vs-floor.json"
  done
  row --row "image: cold relay at 4 nodes vs at 2 (${size})" --what "the 4-node cold relay's image stage" \
    --baseline "the 2-node cold relay's, same run" --samples "${relay_cold[4]%,}" --baseline-samples "${relay_cold[2]%,}" \
    --notes "one disk and two cores shared by every node here: the loads compete" --out "${out}/image-relay-4-vs-2.json"
  row --row "image: warm (cache hit) vs cold pipelined (3 nodes, ${size})" \
    --what "image stage when every node has the image and the cache holds it" --baseline "the cold pipelined stage, same run" \
    --samples "$(join "${warm[@]}")" --baseline-samples "$(join "${wcold[@]}")" --target "<= 0.05x" \
    --out "${out}/image-warm-vs-pipelined.json"
  clear_workers 4
  "${EXEC}" node1 docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true
  rm -f "${ROOT}"/examples/toy/pad/*.bin
}

# hand_pipeline_seconds N WORK [TAR]: the same transport with no toolkit, the floor a pipelined
# relay is held to: `docker save` on node1 piped through one tee to N-1 concurrent `docker load`s on
# nodes 2..N, each on its own engine (tests/cluster/exec; tee on node1, as rank 0's tee is), all at
# once on the same cores and disk.
# With TAR, tee also writes the tar there (what the pipelined job writes into its cache).
hand_pipeline_seconds() {
  local n=$1 work=$2 tar=${3:-} t i rc=0 pids=() fifos=()
  clear_workers "${n}"
  t=$(now)
  for ((i = 2; i < n; i++)); do
    rm -f "${work}/hand.${i}" && mkfifo "${work}/hand.${i}"
    "${EXEC}" "node${i}" docker load -q <"${work}/hand.${i}" >/dev/null &
    pids+=($!) fifos+=("${work}/hand.${i}")
  done
  "${EXEC}" node1 docker save "${BENCH_IMAGE}" | "${EXEC}" node1 tee "${fifos[@]}" ${tar:+"${tar}"} |
    "${EXEC}" "node${n}" docker load -q >/dev/null || rc=$?
  # A tee that never started leaves the other loads blocked opening their FIFO: end them.
  ((rc == 0)) || kill "${pids[@]}" 2>/dev/null || true
  for i in "${pids[@]}"; do wait "${i}" || rc=$?; done
  local took
  took=$(since "${t}")
  rm -f "${fifos[@]}" ${tar:+"${tar}"}
  ((rc == 0)) || log::die bench "the hand pipeline (docker save | tee | $((n - 1)) docker loads) failed (exit ${rc})" 1
  clear_workers "${n}"
  printf '%s' "${took}"
}

# profiled OUT CMD...: run CMD with bench/cpu_profile.py recording every cluster process's CPU into
# OUT (JSON); CMD's stdout is passed on. BENCH_CPU_PROFILE=0: CMD alone, no OUT; BENCH_CPU_ACCT=0:
# the /proc poll alone, without the kernel's process accounting.
profiled() {
  local out=$1 rc=0 start=()
  shift
  if [[ ${BENCH_CPU_PROFILE:-1} == 0 ]]; then
    "$@"
    return
  fi
  start=("${PY}" "${ROOT}/bench/cpu_profile.py" start "${out}.d" --max-seconds "$((${BENCH_JOB_TIMEOUT:-600} + 120))")
  [[ ${BENCH_CPU_ACCT:-1} != 0 ]] || start+=(--no-acct)
  "${start[@]}" || log::die bench "cannot start the CPU recorder" 1
  ("$@") || rc=$? # a subshell: a log::die in CMD still stops the recorder
  "${PY}" "${ROOT}/bench/cpu_profile.py" stop "${out}.d" --out "${out}" || log::warn bench "no CPU profile in ${out}"
  [[ -n ${BENCH_CPU_KEEP:-} ]] || rm -rf "${out}.d"
  return "${rc}"
}

# cpu_files KIND FILE...: append `--KIND FILE` to CPU_OPTS for each FILE that holds a profile
# (cluster_rows.py reads them: the row carries the CPU by role, measured side against baseline).
cpu_files() {
  local kind=$1 file
  shift
  for file in "$@"; do [[ ! -s ${file} ]] || CPU_OPTS+=("--${kind}" "${file}"); done
}

# cold_job N ARG...: run one N-node job of the bench manifest (in WORK, the current directory) with
# ARGs, running `true`, and wait for it; prints its id. A job that fails ends the row group.
cold_job() {
  local n=$1 job
  shift
  job=$(sbatch --parsable -N"${n}" -o /dev/null "${ROOT}/sbatch/multi.sbatch" --manifest "${PWD}/manifest.json" \
    "$@" --out "${PWD}/out" --collect false -- true)
  [[ $(wait_job "${job}") == 0 ]] || log::die bench "cold job ${job} (${n} nodes, $*) did not succeed; see ${PWD}/out" 1
  printf '%s' "${job}"
}

# clear_workers N: the bench image on node1 only (nodes 2..N lose it).
clear_workers() {
  local i
  for ((i = 2; i <= $1; i++)); do "${EXEC}" "node${i}" docker image rm -f "${BENCH_IMAGE}" >/dev/null 2>&1 || true; done
}

# floor_seconds N WORK: max(one docker save on node1, N-1 concurrent docker loads on nodes 2..N).
floor_seconds() {
  local n=$1 work=$2 t save load i
  t=$(now)
  "${EXEC}" node1 docker save -o "${work}/floor.tar" "${BENCH_IMAGE}"
  save=$(since "${t}")
  clear_workers "${n}"
  t=$(now)
  for ((i = 2; i <= n; i++)); do "${EXEC}" "node${i}" docker load -q -i "${work}/floor.tar" >/dev/null & done
  wait
  load=$(since "${t}")
  rm -f "${work}/floor.tar"
  clear_workers "${n}"
  awk -v a="${save}" -v b="${load}" 'BEGIN { printf "%.4f", (a > b ? a : b) }'
}

# stage_max JOBDIR STAGE...: the slowest node's summed STAGEs, from status.json.
stage_max() {
  "${PY}" - "$@" <<'PY'
import glob, json, os, sys
dirs, stages = sys.argv[1], sys.argv[2:]
times = [sum(json.load(open(p))["stages"].get(s, {}).get("seconds", 0.0) for s in stages)
         for p in glob.glob(os.path.join(dirs, "node_*", "status.json"))]
print(max(times) if times else 0.0)
PY
}

# want_group NAME: true when BENCH_CLUSTER_GROUPS (comma-separated: overhead, badnode, midrun, image,
# transport, pyxis, layers; default all) names NAME. Unknown names are an error, not a silent empty table.
want_group() {
  local groups=${BENCH_CLUSTER_GROUPS:-overhead,badnode,midrun,image,transport,pyxis,layers} item
  local -a items
  IFS=, read -r -a items <<<"${groups}"
  for item in "${items[@]}"; do
    case ${item} in overhead | badnode | midrun | image | transport | pyxis | layers) ;; *) log::die bench "BENCH_CLUSTER_GROUPS: unknown group '${item}' (use overhead, badnode, midrun, image, transport, pyxis, layers)" 2 ;; esac
  done
  [[ ,${groups}, == *,"$1",* ]]
}

# stop_recorders WORK: end any CPU recorder a failed row group left running (process accounting off).
stop_recorders() {
  local dir
  for dir in "$1"/cpu/*.d; do
    [[ -d ${dir} ]] && "${PY}" "${ROOT}/bench/cpu_profile.py" off "${dir}" || true
  done
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
  trap "stop_recorders '${work}'; rm -rf '${work}'" EXIT
  ensure_nodes 4
  # Each group in a subshell: one that fails (log::die) costs its own rows, never the others'.
  local failed=()
  if want_group overhead; then
    log::info bench "toolkit overhead: $((repeats * 3)) + ${repeats} profiled pairs on the toy, $(((repeats + 1) / 2)) on ${BENCH_LONG_SECONDS:-60} s, one allocation"
    (overhead_row "${repeats}" "${out}" "${work}") || failed+=(overhead)
  fi
  if want_group badnode; then
    log::info bench "bad nodes: time to detect each seeded fault (${repeats} runs each)"
    (badnode_rows "${repeats}" "${out}" "${work}") || failed+=(badnode)
  fi
  if want_group midrun; then
    log::info bench "nodes lost mid-run: time to the job's end after a network cut and a killed engine (${repeats} runs each)"
    (midrun_rows "${repeats}" "${out}" "${work}") || failed+=(midrun)
  fi
  if want_group image; then
    log::info bench "image distribution (${repeats} runs each)"
    (image_rows "${repeats}" "${out}" "${work}") || failed+=(image)
  fi
  if want_group transport; then
    log::info bench "image transport: relay and pipelined, ~1 GB (${repeats} runs each)"
    (transport_rows "${repeats}" "${out}" "${work}") || failed+=(transport)
  fi
  if want_group pyxis; then
    log::info bench "pyxis (${repeats} runs each)"
    (pyxis_rows "${repeats}" "${out}" "${work}") || failed+=(pyxis)
  fi
  # Layer-level distribution (issue 38): its own script, each row against the whole-image path.
  if want_group layers; then
    bash "${ROOT}/bench/layers_bench.sh" --out-dir "${out}" --repeats "${repeats}" || failed+=(layers)
  fi
  ((${#failed[@]} == 0)) || log::die bench "row groups that failed: ${failed[*]} (see above); the others' rows are written"
}

# Sourced (tests/bats/bench.bats): functions only.
[[ ${BASH_SOURCE[0]} != "$0" ]] || main "$@"
