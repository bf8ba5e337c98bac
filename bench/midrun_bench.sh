# shellcheck shell=bash
# The `midrun` row group of bench/cluster_bench.sh (sourced by it; its helpers: row, now, wait_job,
# cluster::*): how long a 3-node job takes to end after one of its nodes is lost during the run,
# naming it (docs/bad-nodes.md#a-node-lost-during-the-run), against the same job whose rank fails by
# itself at that point (what detecting the loss adds), measured in the same run.

# The workload: rank 1 waits for a file in its output dir and fails when it appears (the baseline's
# plain workload failure); every rank runs long otherwise.
# shellcheck disable=SC2016 # expanded in the container
MIDRUN_WORKLOAD='echo started; if [ "${RANK}" = 1 ]; then until [ -e "${SM_OUTPUT_DIR}/fail-now" ]; do sleep 0.1; done; echo "failing"; exit 3; fi; sleep 600'

# midrun_rows REPEATS OUT WORK: two rows, a node's network cut and its docker engine killed: the
# job's end (summary.json) from the fault, against the job's end from rank 1's own failure.
midrun_rows() {
  local repeats=$1 out=$2 work=$3 i cut=() engine=() plain=()
  "${ROOT}/examples/toy/build-image" --node node1 >/dev/null
  local args=(--manifest "${ROOT}/examples/toy/build_manifest.json" --image-cache "${work}/cache-midrun"
    --out "${work}/out-midrun" --quarantine-hours 0 --peer-grace 5)
  # (A subshell of its own, as every group: a row that dies here leaves no node cut or engine dead.)
  trap 'ip link set smv-node2 up 2>/dev/null || true; midrun_engine_up' EXIT
  for ((i = 0; i < repeats; i++)); do
    midrun_sample cut "${args[@]}"
    cut+=("${MIDRUN_TOOK}")
    midrun_sample engine "${args[@]}"
    engine+=("${MIDRUN_TOOK}")
    midrun_sample plain "${args[@]}"
    plain+=("${MIDRUN_TOOK}")
  done
  row --row "node lost mid-run: network cut" \
    --what "sbatch -N3 of the toy, node2's link cut in its run: the cut to the job's end naming node2 (--peer-grace 5)" \
    --baseline "the same job, rank 1's workload exiting 3 instead: that exit to the job's end" \
    --samples "$(IFS=,; echo "${cut[*]}")" --baseline-samples "$(IFS=,; echo "${plain[*]}")" \
    --notes "the watch dials every node every 2 s and loses one silent for 10 s (Slurm would wait SlurmdTimeout, $(midrun_slurmd_timeout) s here); then the peer grace and the teardown" \
    --out "${out}/midrun-network.json"
  row --row "node lost mid-run: docker engine killed" \
    --what "sbatch -N3 of the toy, node2's dockerd SIGKILLed in its run: the kill to the job's end naming node2 (--peer-grace 5)" \
    --baseline "the same job, rank 1's workload exiting 3 instead: that exit to the job's end" \
    --samples "$(IFS=,; echo "${engine[*]}")" --baseline-samples "$(IFS=,; echo "${plain[*]}")" \
    --notes "docker run loses its engine at once; the node names the engine (node fault), then the peer grace and the teardown" \
    --out "${out}/midrun-engine.json"
}

# midrun_sample FAULT ARGS…: one job with FAULT (cut, engine or plain) in rank 1's run; MIDRUN_TOOK
# is the fault to summary.json.
midrun_sample() {
  local fault=$1 job jobdir t deadline
  shift
  job=$(cd "${work}" && sbatch --parsable -N3 -w node1,node2,node3 -o "${work}/midrun-%j.out" \
    "${ROOT}/sbatch/multi.sbatch" "$@" -- sh -c "${MIDRUN_WORKLOAD}") || log::die bench "sbatch failed" 1
  jobdir=${work}/out-midrun/toy_model/${job}
  deadline=$((SECONDS + 120))
  until grep -qs '^started' "${jobdir}/node_1/node.log"; do
    ((SECONDS < deadline)) || log::die bench "job ${job}: rank 1 never started its run" 1
    sleep 0.2
  done
  t=$(now)
  case ${fault} in
    cut) ip link set smv-node2 down ;;
    engine) kill -KILL "$(<"$(cluster::node_dir node2)/dockerd.pid")" ;;
    plain) : >"${TMPDIR:-/tmp}/slurm-multi.${job}.r1/output/fail-now" ;;
  esac
  until [[ -f ${jobdir}/summary.json ]]; do
    ((SECONDS < deadline + 300)) || log::die bench "job ${job}: no summary.json 300 s after the ${fault}" 1
    sleep 0.1
  done
  MIDRUN_TOOK=$(since "${t}")
  grep -qs "node2" "${jobdir}/summary.json" || log::die bench "job ${job}: the summary does not name node2" 1
  [[ ${fault} != cut ]] || ip link set smv-node2 up
  [[ ${fault} != engine ]] || midrun_engine_up
  wait_job "${job}" >/dev/null || true
  "${EXEC}" node2 docker rm -f "sm-${job}-r1" >/dev/null 2>&1 || true
  SM_CLUSTER_WAIT=180 cluster::wait_for "4 idle nodes" cluster::nodes_idle 4
}

midrun_engine_up() {
  local sock
  sock=unix://$(cluster::node_dir node2)/docker.sock
  DOCKER_HOST=${sock} timeout 10 docker version >/dev/null 2>&1 && return 0
  cluster::start_dockerd node2
  cluster::wait_for "node2's docker engine" env DOCKER_HOST="${sock}" docker version
}

midrun_slurmd_timeout() {
  scontrol show config | awk '$1 == "SlurmdTimeout" { print $3 }'
}
