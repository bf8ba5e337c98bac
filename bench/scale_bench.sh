# shellcheck shell=bash
# The `scale` row group of bench/cluster_bench.sh (sourced by it; its helpers: row, cpu_files, log::*,
# CLUSTER_STATE): the warm toy job at 2, 8 and 16 nodes, each against bare `srun docker run` at the
# same node count in the same allocation (bench/overhead_job.sh), with the toolkit's CPU seconds per
# node beside the wall time. Every node of the test cluster runs on this machine's cores: a wall time
# that grows with the node count while the CPU per node stays flat is the shared cores, not the code
# (docs/benchmarks.md#scale-the-warm-toy-job-at-2-8-and-16-nodes-test-cluster).

# scale_cluster N: the test cluster has exactly N nodes (brought up again otherwise: the scale rows
# need 16, and every other group and e2e file expects the 4 they had before).
scale_cluster() {
  local have=0
  [[ -f ${CLUSTER_STATE}/nodes ]] && have=$(wc -l <"${CLUSTER_STATE}/nodes")
  if ((have != $1)) || ! "${ROOT}/tests/cluster/status" >/dev/null 2>&1; then
    log::info bench "scale: bringing the test cluster up with $1 nodes (it has ${have})"
    "${BENCH_CLUSTER_UP:-${ROOT}/tests/cluster/up}" --no-install --nodes "$1" >&2
  fi
}

# scale_sizes: the node counts of the rows (BENCH_SCALE_NODES, default 2,8,16), one per line,
# smallest first; each must fit the test cluster (1..16).
scale_sizes() {
  local -a sizes
  local n
  IFS=, read -r -a sizes <<<"${BENCH_SCALE_NODES:-2,8,16}"
  for n in "${sizes[@]}"; do
    [[ ${n} =~ ^[1-9][0-9]?$ && ${n} -le 16 ]] ||
      log::die bench "BENCH_SCALE_NODES: '${n}' is not a node count of the test cluster (1..16)" 2
  done
  printf '%s\n' "${sizes[@]}" | sort -n -u
}

# scale_rows REPEATS OUT WORK: at each size, 2 x REPEATS timed pairs and REPEATS profiled pairs in
# one allocation; then the largest size against the smallest, wall and CPU per node.
scale_rows() {
  local repeats=$1 out=$2 work=$3 n lines dir file i
  local pairs=$((repeats * 2)) cpu_pairs=${repeats} budget=$((${BENCH_JOB_TIMEOUT:-600} * 2))
  local list
  local -a sizes
  local -A wall=()
  list=$(scale_sizes) || return
  mapfile -t sizes <<<"${list}"
  local small=${sizes[0]} large=${sizes[-1]}
  scale_cluster "${large}"
  "${ROOT}/examples/toy/build-image" --node node1 >/dev/null
  local bare_cmd="srun -NN docker run --rm --network host toy/model:local sh run.sh --steps 20"
  local toolkit_cmd="bash sbatch/multi.sbatch --manifest toy (warm cache, image on every node) inside salloc -NN, collect included"
  for n in "${sizes[@]}"; do
    dir=${work}/scale-${n} file=${out}/scale-$(printf '%02d' "${n}") # the table lists the rows by file name
    mkdir -p "${dir}"
    log::info bench "scale: ${n} nodes, ${pairs} timed + ${cpu_pairs} profiled pairs in one allocation"
    lines=$(SM_PYTHON=${PY} timeout "${budget}" salloc -N"${n}" --immediate=60 --quiet bash "${ROOT}/bench/overhead_job.sh" \
      --work "${dir}" --pairs "${pairs}" --cpu-pairs "${cpu_pairs}" --long-pairs 0) ||
      log::die bench "scale: the ${n}-node pairs failed (see above)" 1
    wall[${n}]=$(awk '$1 == "short" && $3 == "toolkit" { print $4 }' <<<"${lines}" | paste -sd,)
    row --row "scale: warm toy job, ${n} nodes" --paired \
      --what "${toolkit_cmd/NN/N${n}}, the toy's ~1 s workload" --baseline "${bare_cmd/NN/N${n}}, same allocation" \
      --samples "${wall[${n}]}" \
      --baseline-samples "$(awk '$1 == "short" && $3 == "bare" { print $4 }' <<<"${lines}" | paste -sd,)" \
      --notes "${pairs} pairs, the order alternating; every node on this machine's cores" \
      --out "${file}-1-wall.json"
    CPU_OPTS=()
    for ((i = 1; i <= cpu_pairs; i++)); do # a pair whose profile is missing on either side is left out
      [[ -s ${dir}/cpu/cpu-toolkit-${i}.json && -s ${dir}/cpu/cpu-bare-${i}.json ]] || continue
      CPU_OPTS+=(--cpu "${dir}/cpu/cpu-toolkit-${i}.json" --baseline-cpu "${dir}/cpu/cpu-bare-${i}.json")
    done
    if ((${#CPU_OPTS[@]} == 0)); then
      log::warn bench "scale: no CPU profiles at ${n} nodes (BENCH_CPU_PROFILE=0?): no CPU row"
      continue
    fi
    row --row "scale: toolkit CPU per node, ${n} nodes" --paired --nodes "${n}" --cpu-samples "${CPU_OPTS[@]}" \
      --what "CPU s per node of every process of the toolkit's job but the workload containers' own (the batch step counted with the nodes)" \
      --baseline "the same for ${bare_cmd/NN/N${n}}" \
      --notes "$((${#CPU_OPTS[@]} / 4)) pairs under the CPU recorder, same allocation" \
      --out "${file}-2-cpu.json"
  done
  ((large > small)) || return 0
  row --row "scale: warm toy job, ${large} vs ${small} nodes" \
    --what "the toolkit's ${large}-node wall time" --baseline "its ${small}-node wall time, same run" \
    --samples "${wall[${large}]}" --baseline-samples "${wall[${small}]}" \
    --notes "${large} nodes' helpers on the same cores: compare with the CPU row below" \
    --out "${out}/scale-growth-1-wall.json"
  CPU_OPTS=()
  cpu_files cpu "${work}/scale-${large}/cpu/cpu-toolkit-"*.json
  cpu_files baseline-cpu "${work}/scale-${small}/cpu/cpu-toolkit-"*.json
  ((${#CPU_OPTS[@]})) || return 0
  row --row "scale: toolkit CPU per node, ${large} vs ${small} nodes" --cpu-samples \
    --nodes "${large}" --baseline-nodes "${small}" "${CPU_OPTS[@]}" \
    --what "the toolkit's CPU s per node at ${large} nodes" --baseline "at ${small} nodes, same run" \
    --notes "flat or falling: the wall time's growth is the shared cores; a helper whose share per node grows is the code's" \
    --out "${out}/scale-growth-2-cpu.json"
}

# scale_group REPEATS OUT WORK: the rows, then the test cluster back at 4 nodes, whatever happened.
scale_group() {
  local rc=0
  (scale_rows "$@") || rc=$?
  scale_cluster 4 || rc=1
  return "${rc}"
}
