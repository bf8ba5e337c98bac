#!/usr/bin/env bats
# A node lost during the run is a bad node (issue 39): a 3-node job on a 4-node cluster (an idle
# cluster gives it node1-3) loses node2 a few seconds into its run, its network cut or its docker
# engine killed. The job ends within a stated bound naming node2 and how it was lost, the other
# nodes' outputs staged; node2 is quarantined and `--on-bad-node requeue` runs the job again without
# it (node1, node3, node4), where it succeeds. The workload learns its attempt (SM_ATTEMPT,
# SLURM_RESTART_COUNT): the first attempt runs long, the second short, as a checkpointing one would.

load helpers
bats_require_minimum_version 1.5.0

BAD=node2
PEER_GRACE=5
# Each attempt says which it is, then trains: for minutes the first time (the fault comes in its
# run), 40 steps (2 s) once requeued.
# shellcheck disable=SC2016 # expanded in the container
WORKLOAD='echo "attempt ${SM_ATTEMPT:-?} restart ${SLURM_RESTART_COUNT:-none}"; if [ "${SM_ATTEMPT:-1}" = 1 ]; then exec sh run.sh --steps 6000; else exec sh run.sh --steps 40; fi'

setup_file() {
  e2e::ensure_cluster --nodes 4
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
}

setup() {
  STATE=${BATS_TEST_TMPDIR}/state
  ARGS=(--manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --state-dir "${STATE}" --quarantine-hours 24
    --peer-grace "${PEER_GRACE}" --on-bad-node requeue)
}

teardown() {
  local sock
  # The first attempt's processes on the bad node (frozen, or orphaned by its dead engine) go first:
  # once back, they would write into the job dir the requeued attempt owns.
  midrun::job_pids "${JOB_ID:-none}" | xargs -r kill -KILL 2>/dev/null || true
  midrun::job_pids "${JOB_ID:-none}" | xargs -r kill -CONT 2>/dev/null || true
  ip link set "smv-${BAD}" up 2>/dev/null || true
  # A test that failed before its job ended leaves nothing running into the next one.
  [[ -z ${JOB_ID:-} ]] || scancel "${JOB_ID}" 2>/dev/null || true
  sock=unix://$(cluster::node_dir "${BAD}")/docker.sock
  if ! DOCKER_HOST=${sock} timeout 10 docker version >/dev/null 2>&1; then
    cluster::start_dockerd "${BAD}"
    cluster::wait_for "${BAD}'s docker engine" env DOCKER_HOST="${sock}" docker version
  fi
  DOCKER_HOST=${sock} docker rm -f "sm-${JOB_ID:-none}-r1" >/dev/null 2>&1 || true
  SM_CLUSTER_WAIT=120 cluster::wait_for "4 idle nodes" cluster::nodes_idle 4
}

# midrun::job_pids JOB: the processes of JOB on the bad node (its task, its hang watch, its docker
# client, its container's workload: each has the job's SLURM_JOB_ID in its environment).
midrun::job_pids() {
  local p
  for p in $(ip netns pids "$(cluster::netns "${BAD}")" 2>/dev/null); do
    tr '\0' '\n' 2>/dev/null <"/proc/${p}/environ" | grep -qx "SLURM_JOB_ID=$1" && echo "${p}"
  done
  return 0
}

# midrun::fault_in_run FAULT: submit the job, wait until the bad node's rank trains, then FAULT
# (a command); sets JOB_ID, JOB_DIR and FAULT_AT (the host's clock).
midrun::fault_in_run() {
  e2e::submit_job -N3 -- "${ARGS[@]}" -- sh -c "${WORKLOAD}"
  JOB_DIR=${BATS_FILE_TMPDIR}/out/toy_model/${JOB_ID}
  local deadline=$((SECONDS + 120))
  until grep -qs 'toy: rank 1 step 20/' "${JOB_DIR}/node_1/node.log"; do
    ((SECONDS < deadline)) || { cat "${JOB_OUT}" >&2; fail "rank 1 never trained"; }
    sleep 0.3
  done
  run scontrol show job -o "${JOB_ID}"
  assert_output --regexp "NodeList=node\[1-3\]"
  "$@"
  FAULT_AT=${EPOCHREALTIME}
}

# midrun::cut_network: the node's link gone, and with it (as NFS would) its writes to the job dir:
# the job's processes there are frozen (the test cluster's nodes share the host's disk).
midrun::cut_network() {
  ip link set "smv-${BAD}" down
  # (One of them may end meanwhile: its kill fails, the others are stopped.)
  midrun::job_pids "${JOB_ID}" | xargs -r kill -STOP 2>/dev/null || true
}

midrun::kill_engine() {
  kill -KILL "$(<"$(cluster::node_dir "${BAD}")/dockerd.pid")"
}

# midrun::requeued_without_bad HOW BOUND: the first attempt ended within BOUND s of the fault naming
# the bad node and HOW it was lost, the other nodes staged; the requeued attempt succeeded without
# it; the quarantine has it. Prints the summaries and the times on fd 3.
midrun::requeued_without_bad() {
  local how=$1 bound=$2 ended took finished
  e2e::wait_job "${JOB_ID}"
  finished=$(bc <<<"${EPOCHREALTIME} - ${FAULT_AT}")
  assert_file_exists "${JOB_DIR}/attempt_0/requeue.json"
  ended=$(stat -c %.3Y "${JOB_DIR}/attempt_0/requeue.json")
  took=$(bc <<<"${ended} - ${FAULT_AT}")
  {
    echo "# ${how}: attempt 1 ended (requeued) ${took} s after the fault (bound ${bound} s); the job ${JOB_STATE} (exit ${JOB_RC}) ${finished} s after it"
    e2e::json "${JOB_DIR}/attempt_0/summary.json" '"\n".join("#   attempt 1 reason: " + r for r in d["reasons"][:4])'
    e2e::json "${JOB_DIR}/summary.json" '"#   final: " + d["verdict"] + " on " + " ".join(n["node"] for n in d["nodes"])'
    e2e::json "${JOB_DIR}/summary.json" '"\n".join("#   attempt %s: cause %s after %s s, excluded %s: %s" % (a["attempt"], a["cause"], a["requeued_after_s"], a["excluded"], a["bad_nodes"]) for a in d["attempts"])'
  } >&3
  assert [ "$(bc <<<"${took} <= ${bound}")" = 1 ]
  # The first attempt: FAILURE naming the node and how it was lost, not "hung", not "failed".
  run e2e::json "${JOB_DIR}/attempt_0/summary.json" '[(b["node"], b["cause"]) for b in d["bad_nodes"]]'
  assert_output "[('${BAD}', 'run')]"
  run e2e::json "${JOB_DIR}/attempt_0/summary.json" 'd["bad_nodes"][0]["reason"]'
  assert_output --partial "${how}"
  refute_output --partial "hung"
  # Every other node's outputs are staged (stopped by the teardown, their status and logs kept).
  local r
  for r in 0 2; do
    assert_file_exists "${JOB_DIR}/attempt_0/node_${r}/status.json"
    run grep -c "attempt 1 restart none" "${JOB_DIR}/attempt_0/node_${r}/node.log"
    assert_output 1
  done
  # The requeued attempt: SUCCESS on the other nodes, told it is attempt 2.
  assert_equal "${JOB_RC}" 0
  run e2e::json "${JOB_DIR}/summary.json" 'd["verdict"], " ".join(n["node"] for n in d["nodes"])'
  assert_output "('SUCCESS', 'node1 node3 node4')"
  run e2e::json "${JOB_DIR}/summary.json" '[(a["cause"], a["excluded"]) for a in d["attempts"]]'
  assert_output "[('run', ['${BAD}'])]"
  for r in 0 1 2; do
    run grep -c "attempt 2 restart 1" "${JOB_DIR}/node_${r}/node.log"
    assert_output 1
  done
  # The quarantine has it, for the next job.
  run runuser -u "${E2E_USER}" -- "${REPO_ROOT}/bin/slurm-multi" quarantine list --state-dir "${STATE}"
  assert_success
  assert_output --partial "${BAD}"
  assert_output --partial "${how}"
}

@test "a node's network cut during the run: the job ends within the bound naming it, quarantined, requeued without it: SUCCESS" {
  midrun::fault_in_run midrun::cut_network
  # The watch dials every node every 2 s (1 s bound); 10 s of silence lose it; the others get the
  # peer grace; the teardown stops them (their stop, the collect and the requeue: well within 30 s).
  midrun::requeued_without_bad "stopped answering on the network" $((10 + 3 + PEER_GRACE + 30))
}

@test "a node's docker engine killed during the run: the job ends within the bound naming it, quarantined, requeued without it: SUCCESS" {
  midrun::fault_in_run midrun::kill_engine
  # docker run loses its engine at once; the node names its engine, the others get the peer grace.
  midrun::requeued_without_bad "docker engine on ${BAD} stopped answering" $((PEER_GRACE + 30))
  run e2e::json "${JOB_DIR}/attempt_0/node_1/status.json" 'd["node_fault"]'
  assert_output --partial "the docker engine on ${BAD} stopped answering during the run"
}
