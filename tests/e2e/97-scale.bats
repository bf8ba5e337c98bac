#!/usr/bin/env bats
# The toy job at 8 and 16 nodes (issue 39): the test cluster is brought up with 16 nodes, every one
# of them on this machine's cores. The image is on node1 only at first, so the 8-node job relays it
# to 7 nodes and the first 16-node job to the 8 that still lack it (7 workers hold it); a second 16-node job is warm.
# Each job must end SUCCESS with every node's outputs staged and every node's fitness report there,
# each node reached by at least two peers. The cluster is brought back to 4 nodes afterwards (what
# `make test` gives the files before this one), so any e2e file still runs alone after it.

load helpers

setup_file() {
  e2e::ensure_cluster --nodes 16
  e2e::wait_for_nodes --docker $(seq -f 'node%g' 1 16)
  # The nodes' docker data outlives a bring-up: a node from an earlier 16-node cluster may hold an
  # old toy image. node1 alone has it, built now.
  local i
  for ((i = 2; i <= 16; i++)); do
    "${REPO_ROOT}/tests/cluster/exec" "node${i}" docker image rm -f toy/model:local >/dev/null 2>&1 || true
  done
  "${REPO_ROOT}/examples/toy/build-image" --node node1 >/dev/null
}

teardown_file() {
  # What `make test` brings up before the e2e files (4 nodes, the torch image on node1: cached).
  "${REPO_ROOT}/tests/cluster/up" --no-install --nodes 4 >&3 2>&1 ||
    "${REPO_ROOT}/tests/cluster/up" --nodes 4 >&3 2>&1
  "${REPO_ROOT}/examples/torchrun/build-image" --node node1 >/dev/null 2>&1 ||
    echo "# the torch image was not rebuilt on node1; 45/47/48 build it themselves" >&3
}

# scale_job N: a toy job on N nodes; asserts SUCCESS, every node's outputs and fitness report, the
# summary's node count; prints the wall time and rank 0's stages on fd 3.
scale_job() {
  local n=$1 t0 took r
  t0=$(date +%s.%N)
  e2e::run_job -N"${n}" -- --manifest "${TOY_MANIFEST}"
  took=$(awk -v a="${t0}" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  [[ ${JOB_RC} == 0 ]] || cat "${JOB_OUT}" >&2
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'len(d["nodes"]), d["verdict"]')" "(${n}, 'SUCCESS')"
  for ((r = 0; r < n; r++)); do
    assert_file_exists "${JOB_DIR}/node_${r}/perf_toy.csv"
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"]')" 0
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/fitness.json" 'd["ok"], d["rank"]')" "(True, ${r})"
  done
  # Every node was checked by at least two peers: each rank is in two other nodes' `reached` (they
  # dialed it) or `heard` (it dialed them), whichever peers the mesh pairs it with.
  run "${SM_PYTHON}" - "${JOB_DIR}" "${n}" <<'PY'
import json, sys
job, n = sys.argv[1], int(sys.argv[2])
net = {r: json.load(open(f"{job}/node_{r}/fitness.json"))["checks"]["network"] for r in range(n)}
checked = {q: {r for r in range(n) if r != q and q in set(net[r]["reached"]) | set(net[r]["heard"])} for q in range(n)}
print([q for q in range(n) if len(checked[q]) < 2])
PY
  assert_output "[]"
  run grep -c 'stage_end.*stage=fitness.*status=ok' "${JOB_DIR}/node_0/events.log"
  assert_output 1
  local stages
  stages=$(e2e::json "${JOB_DIR}/node_0/status.json" '", ".join("%s %.1f" % (k, v["seconds"]) for k, v in d["stages"].items())')
  echo "# ${n} nodes: ${took} s from sbatch to the job's end (0.3 s polls); rank 0's stages: ${stages}" >&3
}

@test "8 nodes, toy image on node1 only: the relay reaches 7 nodes, SUCCESS, all 8 staged and fitness-checked" {
  scale_job 8
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "relayed toy/model:local to every node"
  local r
  for r in 1 2 3 4 5 6 7; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "received toy/model:local"
  done
}

@test "16 nodes (node9-16 without the image): SUCCESS, all 16 staged and fitness-checked" {
  scale_job 16
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "7 of 15 worker(s) already hold"
  assert_output --partial "relayed toy/model:local to every node"
}

@test "16 nodes warm (every node holds the image): SUCCESS, all 16 staged, no image moved" {
  scale_job 16
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "every worker already holds toy/model:local"
}
