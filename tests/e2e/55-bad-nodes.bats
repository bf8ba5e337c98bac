#!/usr/bin/env bats
# Bad nodes on a 4-node cluster (an idle cluster gives a 3-node job node1-3, so node3 is in the first
# attempt; a requeue excluding it cannot use -w, which would require it): one node is made bad in one way per test (docker engine stopped or
# hung, local disk full, a stale process on a GPU, its network to the peers blocked on the job's
# ports). The fitness stage finds it before any image moves; `--on-bad-node requeue` requeues the job
# through Slurm without it (SUCCESS on the other three, both attempts kept), the default fails naming
# it, and the quarantine keeps the next job off it.

load helpers
bats_require_minimum_version 1.5.0

BAD=node3

setup_file() {
  e2e::ensure_cluster --nodes 4
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  # The scratch dir every node uses in these jobs (a disk test fills it on one node only).
  export E2E_SCRATCH=/var/tmp/sm-e2e-scratch
  mkdir -p "${E2E_SCRATCH}"
  chmod 1777 "${E2E_SCRATCH}"
}

setup() {
  STATE=${BATS_TEST_TMPDIR}/state
  ARGS=(--manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --state-dir "${STATE}" --quarantine-hours 24
    --fitness-timeout 5)
}

teardown() {
  local sock node=${BAD}
  throttle_off node2
  "${REPO_ROOT}/tests/cluster/exec" "${node}" iptables -D INPUT -p tcp --dport 10000:32767 -j DROP 2>/dev/null || true
  "${REPO_ROOT}/tests/cluster/exec" "${node}" iptables -D OUTPUT -p tcp --dport 10000:32767 -j DROP 2>/dev/null || true
  "${REPO_ROOT}/tests/cluster/exec" "${node}" umount "${E2E_SCRATCH}" 2>/dev/null || true
  if [[ -f $(cluster::node_dir "${node}")/dockerd.pid ]]; then
    kill -CONT "$(<"$(cluster::node_dir "${node}")/dockerd.pid")" 2>/dev/null || true
  fi
  sock=unix://$(cluster::node_dir "${node}")/docker.sock
  if ! DOCKER_HOST=${sock} timeout 10 docker version >/dev/null 2>&1; then
    cluster::start_dockerd "${node}"
    cluster::wait_for "${node}'s docker engine" env DOCKER_HOST="${sock}" docker version
  fi
  cluster::wait_for "4 idle nodes" cluster::nodes_idle 4
}

# throttle NODE RATE: shape NODE's link both ways (tc tbf on both ends of its veth: the bridge's side
# shapes what reaches the node, the node's eth0 what leaves it). throttle_off NODE: remove both, quietly.
throttle() {
  local ns
  ns=$(cluster::netns "$1")
  tc qdisc add dev "smv-$1" root tbf rate "$2" burst 32kbit latency 400ms
  ip netns exec "${ns}" tc qdisc add dev eth0 root tbf rate "$2" burst 32kbit latency 400ms
}
throttle_off() {
  tc qdisc del dev "smv-$1" root 2>/dev/null || true
  ip netns exec "$(cluster::netns "$1")" tc qdisc del dev eth0 root 2>/dev/null || true
}

# requeued_without_bad WHY: the job ended SUCCESS on the three good nodes after one requeue that
# excluded the bad node for WHY; the first attempt's evidence is kept; no image moved before
# (unless --after-image).
requeued_without_bad() {
  assert_equal "${JOB_RC}" 0
  run e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]'
  assert_output SUCCESS
  run e2e::json "${JOB_DIR}/summary.json" '" ".join(n["node"] for n in d["nodes"])'
  refute_output --partial "${BAD}"
  run e2e::json "${JOB_DIR}/summary.json" 'len(d["attempts"])'
  assert_output 1
  run e2e::json "${JOB_DIR}/summary.json" 'd["attempts"][0]["cause"] + " " + d["attempts"][0]["bad_nodes"][0]["node"]'
  assert_output "fitness ${BAD}"
  run e2e::json "${JOB_DIR}/summary.json" 'd["attempts"][0]["bad_nodes"][0]["reason"]'
  assert_output --partial "$1"
  run e2e::json "${JOB_DIR}/summary.json" 'd["attempts"][0]["excluded"]'
  assert_output "['${BAD}']"
  # The first attempt: its node dirs, its fitness reports, its batch log and its own verdict.
  assert_file_exists "${JOB_DIR}/attempt_0/requeue.json"
  assert_file_exists "${JOB_DIR}/attempt_0/batch.log"
  # A healthy node's report too: a node failing before its run stops the step at once, and node0's
  # helper, still waiting for the bad node's HELLO, is SIGTERMed: it writes what it saw, marked
  # stopped (no verdict), or a verdict if it had finished (1 CI run in 5 lost it before).
  assert_file_exists "${JOB_DIR}/attempt_0/node_0/fitness.json"
  run e2e::json "${JOB_DIR}/attempt_0/node_0/fitness.json" 'd["stopped"] in ("", "SIGTERM before the verdict") and d["rank"] == 0'
  assert_output True
  run e2e::json "${JOB_DIR}/attempt_0/summary.json" 'd["verdict"]'
  assert_output FAILURE
  # No image moved before the bad node was found: no rank reached the image stage's end (your own
  # --fitness-cmd runs in the image, so once it is there: $2 says so).
  if [[ ${2:-} != --after-image ]]; then
    run grep -l 'stage image: ok' "${JOB_DIR}"/attempt_0/node_*/node.log
    assert_failure
  fi
  local after
  after=$(e2e::json "${JOB_DIR}/summary.json" 'd["attempts"][0]["requeued_after_s"]')
  echo "${BAD} ($1): requeued ${after} s after the first attempt started" >&3
  # The quarantine has it, for the next job.
  run runuser -u "${E2E_USER}" -- "${REPO_ROOT}/bin/slurm-multi" quarantine list --state-dir "${STATE}"
  assert_success
  assert_output --partial "${BAD}"
}

@test "docker engine stopped on a node: the job is requeued without it and ends SUCCESS; the next job avoids it" {
  cluster::stop_pidfile "$(cluster::node_dir "${BAD}")/dockerd.pid"
  e2e::run_job -N3 -- "${ARGS[@]}" --on-bad-node requeue
  requeued_without_bad "docker engine"
  # The engine is back, but the node stays quarantined: the next job that lands on it requeues itself
  # without it before anything runs.
  cluster::start_dockerd "${BAD}"
  cluster::wait_for "${BAD}'s docker engine" env DOCKER_HOST="unix://$(cluster::node_dir "${BAD}")/docker.sock" docker version
  e2e::run_job -N3 -- "${ARGS[@]}"
  assert_equal "${JOB_RC}" 0
  run e2e::json "${JOB_DIR}/summary.json" 'd["attempts"][0]["cause"] + " " + d["attempts"][0]["bad_nodes"][0]["node"]'
  assert_output "quarantine ${BAD}"
  run e2e::json "${JOB_DIR}/summary.json" '" ".join(n["node"] for n in d["nodes"])'
  refute_output --partial "${BAD}"
}

@test "docker engine hung on a node, default --on-bad-node fail: FAILURE naming it within seconds, nothing moved" {
  kill -STOP "$(<"$(cluster::node_dir "${BAD}")/dockerd.pid")"
  local t0=${SECONDS}
  e2e::run_job -N3 -w "node1,node2,${BAD}" -- "${ARGS[@]}"
  local took=$((SECONDS - t0))
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "${BAD}"
  assert_output --partial "docker"
  run e2e::json "${JOB_DIR}/summary.json" '[b["node"] for b in d["bad_nodes"]]'
  assert_output "['${BAD}']"
  run grep -l 'stage image: ok' "${JOB_DIR}"/node_*/node.log
  assert_failure
  echo "hung docker engine: FAILURE in ${took} s" >&3
  assert [ "${took}" -lt 60 ]
}

@test "a node whose link is throttled both ways in a 3-node job: named slow by the fitness stage, FAILURE, no image moved" {
  # node2 (rank 1) sits on two of the ring's three links, so the median link is its own slow one: it
  # is judged against the link that does not touch it (node3 -> node1).
  throttle node2 20mbit
  local t0=${SECONDS}
  e2e::run_job -N3 -w "node1,node2,${BAD}" -- "${ARGS[@]}"
  local took=$((SECONDS - t0))
  throttle_off node2
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" 'd["verdict"], [b["node"] for b in d["bad_nodes"]]'
  assert_output "('FAILURE', ['node2'])"
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node2"
  assert_output --partial "both ring links slow"
  echo "throttled node2: ${output}" >&3
  run grep -l 'stage image: ok' "${JOB_DIR}"/node_*/node.log
  assert_failure
  echo "throttled node2 (20 Mbit/s both ways): FAILURE in ${took} s" >&3
  assert [ "${took}" -lt 60 ]
}

@test "a node's local disk is full: requeued without it, SUCCESS" {
  "${REPO_ROOT}/tests/cluster/exec" "${BAD}" mount -t tmpfs -o size=2m,mode=1777 tmpfs "${E2E_SCRATCH}"
  TMPDIR=${E2E_SCRATCH} e2e::run_job -N3 -- "${ARGS[@]}" --on-bad-node requeue
  requeued_without_bad "free"
}

@test "a stale process of another job holds a GPU on a node: requeued without it, SUCCESS" {
  # Every node has the fake nvidia-smi's 8 GPUs; on the bad node one of them is held by pid 4242.
  # (--runtime none: docker on the test cluster cannot pass GPUs through.)
  local bin=${BATS_TEST_TMPDIR}/gpubin hosts=${BATS_TEST_TMPDIR}/gpu-hosts
  mkdir -p "${bin}" "${hosts}"
  ln -s "${REPO_ROOT}/tests/fakes/nvidia-smi" "${bin}/nvidia-smi"
  printf 'FAKE_NVIDIA_PROCS=1:4242:2048\n' >"${hosts}/${BAD}.env"
  chmod -R a+rX "${BATS_TEST_TMPDIR}"
  PATH=${bin}:${PATH} FAKE_GPU_HOST_DIR=${hosts} e2e::run_job -N3 -- \
    --runtime none --state-dir "${STATE}" --quarantine-hours 24 --fitness-timeout 5 --on-bad-node requeue \
    -- sh -c 'echo "performance: 1 samples_per_second"'
  requeued_without_bad "4242"
}

@test "a node's network to its peers is blocked on the job's ports: requeued without it, SUCCESS" {
  "${REPO_ROOT}/tests/cluster/exec" "${BAD}" iptables -I INPUT -p tcp --dport 10000:32767 -j DROP
  "${REPO_ROOT}/tests/cluster/exec" "${BAD}" iptables -I OUTPUT -p tcp --dport 10000:32767 -j DROP
  e2e::run_job -N3 -- "${ARGS[@]}" --on-bad-node requeue
  requeued_without_bad "reach"
}

@test "a healthy 3-node job: no bad node, no attempt, every node's fitness report says why it is fit" {
  e2e::run_job -N3 -- "${ARGS[@]}" --on-bad-node requeue
  assert_equal "${JOB_RC}" 0
  run e2e::json "${JOB_DIR}/summary.json" 'len(d.get("attempts", [])), d["bad_nodes"]'
  assert_output "(0, [])"
  local r
  for r in 0 1 2; do
    run e2e::json "${JOB_DIR}/node_${r}/fitness.json" 'd["ok"]'
    assert_output True
  done
  run grep -c 'stage_end.*stage=fitness.*status=ok' "${JOB_DIR}"/node_0/events.log
  assert_output 1
}

@test "your own --fitness-cmd fails on one node: requeued without it, SUCCESS; its output is kept" {
  # Run in the job's image on every node once the image is there; exits 3 on the bad node only.
  e2e::run_job -N3 -- "${ARGS[@]}" --on-bad-node requeue \
    --fitness-cmd "echo checking \$(hostname); [ \"\$(hostname)\" != ${BAD} ] || { echo 'no IB link'; exit 3; }"
  requeued_without_bad "no IB link" --after-image
  run cat "${JOB_DIR}/attempt_0/node_2/fitness-cmd.log"
  assert_output --partial "checking ${BAD}"
  run e2e::json "${JOB_DIR}/node_0/fitness-cmd.json" 'd["ok"]'
  assert_output True
}

@test "another user holds the job's fitness port on a node: the node listens on its next candidate, SUCCESS, no node quarantined" {
  # The port is a function of MASTER_PORT and the job ID: anybody can work it out and hold it before
  # the job starts (here `nobody` on node2, for the ID of the job submitted held). It made node2 a
  # bad node (`port ... is already in use on this node`), and quarantined it for 24 h.
  e2e::submit_job -N3 -w "node1,node2,${BAD}" -H -- "${ARGS[@]}"
  local ports port next pidfile=${BATS_TEST_TMPDIR}/squatter.pid
  ports=$("${REPO_ROOT}/tests/cluster/exec" node2 env PYTHONPATH="${REPO_ROOT}/py" "${SM_PYTHON}" -c \
    'import sys; from slurm_multi.fitness.cli import job_ports; print(*job_ports("", "29500", sys.argv[1]))' "${JOB_ID}")
  read -r port next _ <<<"${ports}"
  "${REPO_ROOT}/tests/cluster/exec" node2 runuser -u nobody -- python3 -I -c '
import os, socket, sys, time
s = socket.socket()
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print(os.getpid(), flush=True)
time.sleep(300)' "${port}" >"${pidfile}" &
  for _ in $(seq 100); do [[ -s ${pidfile} ]] && break; sleep 0.1; done
  [[ -s ${pidfile} ]] || fail "the squatter did not start"
  scontrol release "${JOB_ID}"
  e2e::wait_job "${JOB_ID}"
  kill "$(<"${pidfile}")" 2>/dev/null || true
  JOB_DIR=$(find "${BATS_FILE_TMPDIR}/out" -mindepth 2 -maxdepth 2 -type d -name "${JOB_ID}" | head -n 1)
  assert_equal "${JOB_RC}" 0
  run e2e::json "${JOB_DIR}/summary.json" 'd["verdict"], len(d.get("attempts", [])), d["bad_nodes"]'
  assert_output "('SUCCESS', 0, [])"
  # node2 (rank 1) found the port held and listened on the next candidate; its peers reached it there.
  run e2e::json "${JOB_DIR}/node_1/fitness.json" 'd["checks"]["network"]["ports_taken"], d["checks"]["network"]["port"], d["ok"]'
  assert_output "([${port}], ${next}, True)"
  run e2e::json "${JOB_DIR}/node_0/fitness.json" '1 in d["checks"]["network"]["reached"], d["checks"]["network"]["peers"]["1"]["port"]'
  assert_output "(True, ${next})"
  run runuser -u "${E2E_USER}" -- "${REPO_ROOT}/bin/slurm-multi" quarantine list --state-dir "${STATE}"
  assert_success
  assert_output --partial "no node is quarantined"
}
