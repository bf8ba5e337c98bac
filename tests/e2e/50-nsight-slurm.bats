#!/usr/bin/env bats
# --profile nsight-slurm, bare metal (--runtime none), 2 nodes x 2 tasks, on the real cluster with
# the fake Nsight Cloud for Slurm (tests/fakes/nsight-slurm-home: a real pyzmq coordinator dialled
# with IPv6 on) and the fake nsys. node1 resolves its own name to its fe80:: address first, as the
# hecate nodes did: without the head node's IPv4 as the coordinator address, node1's own ranks time
# out; with it, every rank joins and every rank's report arrives.

# shellcheck disable=SC2016 # the single-quoted scripts expand in the job or the subshell, on purpose
load helpers

setup_file() {
  # The fakes are python3 scripts that need pyzmq: the venv's python3 first on PATH (jobs inherit it).
  export PATH="${REPO_ROOT}/.venv/bin:${PATH}"
  export NSIGHT_HOME=${REPO_ROOT}/tests/fakes/nsight-slurm-home
  export NSYS_FAKE_WRITE_SECONDS=1 NSYS_FAKE_CHUNKS=3 NSYS_FAKE_CHUNK_KIB=16
  export NSIGHT_FAKE_CONNECT_TIMEOUT=4
}

setup() {
  e2e::wait_for_nodes node1 node2
  # Set per test: another test file may have reset the quirks in between.
  "${REPO_ROOT}/tests/cluster/self-name" node1=linklocal
  export FAKE_RECORD_DIR=${BATS_TEST_TMPDIR}/calls
}

teardown_file() {
  "${REPO_ROOT}/tests/cluster/self-name" node1=none
}

# nsight_job: 2 nodes (node1 = the batch node, with the quirk) x 2 tasks, bare metal.
nsight_job() {
  e2e::nsight_args "${REPO_ROOT}/tests/fakes/nsys" --profile-start-iter 5 --profile-stop-iter 15 \
    --flush-timeout-seconds "${1:-60}"
  e2e::run_job -N2 -w node1,node2 --ntasks-per-node=2 -- --runtime none --ntasks-per-node 2 "${E2E_NSIGHT_ARGS[@]}" \
    -- sh -c 'echo "rank ${RANK} of ${WORLD_SIZE} on $(hostname)"; echo "performance: 4${RANK}.5 samples_per_second"; sleep 2'
}

# node1_quirk_held: the quirk was still in place when the job ended (another engineer's tests may
# reset it; then this run proves nothing and says so).
node1_quirk_held() {
  run awk '$1 == "node1" { print $3 }' "${CLUSTER_STATE}/nodes"
  assert_output linklocal
}

# records TOOL FILTER: one line per recorded call of TOOL (python expression over `r`).
records() {
  "${SM_PYTHON}" - "${FAKE_RECORD_DIR}/$1.jsonl" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(eval(sys.argv[2]))
PY
}

@test "nsight-slurm, bare metal, 2x2, node1 link-local: every rank joins and every rank's report arrives" {
  run tests/cluster/exec node1 "${SM_PYTHON}" -c \
    'import socket; print(socket.getaddrinfo("node1", 1, socket.AF_INET6, socket.SOCK_STREAM, 0, socket.AI_V4MAPPED)[0][4][0])'
  assert_output --regexp '^fe80:'
  nsight_job
  node1_quirk_held
  [[ ${JOB_RC} == 0 ]] || tail -n 60 "${JOB_DIR}/batch.log" # shown when the test fails
  assert_equal "${JOB_RC}" 0
  local state=${JOB_DIR}/.nsight-slurm/jobs/${JOB_ID}
  # Every rank registered with the one coordinator, published as the head node's IPv4 literal.
  run e2e::json "${state}/sessions.json" 'sorted((s["rank"], s["node"], s["state"]) for s in d["sessions"])'
  assert_output "[(0, 'node1', 'exited'), (1, 'node1', 'exited'), (2, 'node2', 'exited'), (3, 'node2', 'exited')]"
  run grep -o 'coordinator started: tcp://[^ ]*' "${JOB_DIR}/nsight-slurm.out"
  assert_output --regexp '^coordinator started: tcp://10\.77\.0\.11:[0-9]+$'
  # One non-empty report per rank, named after the rank's own node, written straight to shared storage.
  run ls "${JOB_DIR}/nsight-slurm-direct"
  assert_output "$(printf '%s\n' "${JOB_ID}_node1_rank0.nsys-rep" "${JOB_ID}_node1_rank1.nsys-rep" \
    "${JOB_ID}_node2_rank2.nsys-rep" "${JOB_ID}_node2_rank3.nsys-rep")"
  local f
  for f in "${JOB_DIR}"/nsight-slurm-direct/*; do
    assert [ "$(stat -c %s "${f}")" -gt $((3 * 16 * 1024)) ]
  done
  run find "${JOB_DIR}" -name '*.qdstrm'
  assert_output ""
  # The workload ran under nsys as 4 ranks, with the worker env.
  for r in 0 1 2 3; do
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"]')" 0
    run grep "rank ${r} of 4 on" "${JOB_DIR}/node_${r}/node.log"
    assert_success
  done
  run records nsight-slurm-connector 'r["env"]["SLURM_PROCID"], r["env"]["SLURMD_NODENAME"], r["env"]["TLLM_PROFILE_START_STOP"], r["env"]["TLLM_PROFILE_LOG_RANKS"], r["env"]["DYN_ENABLE_RUST_NVTX"]'
  assert_equal "$(sort <<<"${output}")" "$(printf '%s\n' "('0', 'node1', '5-15', 'all', '1')" "('1', 'node1', '5-15', 'all', '1')" \
    "('2', 'node2', '5-15', 'all', '1')" "('3', 'node2', '5-15', 'all', '1')")"
  # The IPv4 override is in the wrapper CLI calls' environment only, never in the launcher's.
  run records nsight-slurm 'r["argv"][1], r["env"].get("SLURMD_NODENAME"), r["env"].get("SLURM_SUBMIT_DIR")'
  assert_line --index 0 "('configure', '10.77.0.11', '${JOB_DIR}')"
  assert_line "('coordinator', '10.77.0.11', '${JOB_DIR}')"
  assert_line "('stop', '10.77.0.11', '${JOB_DIR}')"
  assert_line "('srun', 'node1', '${JOB_DIR}')"
  run records nsight-slurm 'r["argv"][1] == "srun" and " ".join(r["argv"])'
  assert_line --regexp " srun --nodes=2 --ntasks-per-node=2 --kill-on-bad-exit=0 --label -- ${REPO_ROOT}/bin/sm-node --jobdir "
  refute_output --partial -- '--export'
  # Every wrapper call in order: the once-per-job configure sequence, the worker step, then the
  # teardown flush (stop) and, after the steps ended, the coordinator stop.
  run bash -c "grep -E '^\+ env ' '${JOB_DIR}/nsight-slurm.out' | sed -E 's|.*/bin/nsight-slurm ([a-z-]+( [a-z-]+)?).*|\1|'"
  assert_output "$(printf '%s\n' 'configure tool-path' 'configure tool-command' 'configure profiling-mode' \
    'configure tool-options' 'configure report-output' 'disable pyxis' 'coordinator start' 'configure' \
    'srun --nodes' 'stop --job' 'coordinator stop')"
  # The batch step's flush (every rank's report) is on the timeline, on rank 0's lane; its events
  # are in the batch step's own file, none in rank 0's task's.
  run awk '$2 ~ /^nsight_flush_/ { print $2 }' "${JOB_DIR}/batch/events.log"
  assert_output "$(printf '%s\n' nsight_flush_start nsight_flush_end)"
  run grep -c ' nsight_flush_end .*settled=1 expected=4$' "${JOB_DIR}/batch/events.log"
  assert_output 1
  run grep -c nsight_flush "${JOB_DIR}/node_0/events.log"
  assert_output 0
  run e2e::json "${JOB_DIR}/timeline.json" '[s["step"] for n in d["nodes"] if n["rank"] == 0 for s in n["steps"]]'
  assert_output --partial "'nsight_flush'"
  e2e::assert_dry_run_is_the_job 0 1
}

@test "nsight-slurm without the IPv4 override: node1's ranks time out, node2's join, and the probe says why" {
  export SM_NSIGHT_NO_IPV4_OVERRIDE=1
  nsight_job 15
  node1_quirk_held
  local state=${JOB_DIR}/.nsight-slurm/jobs/${JOB_ID} port
  run grep -o 'coordinator started: tcp://node1:[0-9]*' "${JOB_DIR}/nsight-slurm.out"
  assert_success
  port=${output##*:}
  run grep -E '^[0-9]+: \[Nsight ERROR\] Timeout connecting to Coordinator$' "${JOB_DIR}/batch.log"
  assert_line '0: [Nsight ERROR] Timeout connecting to Coordinator'
  assert_line '1: [Nsight ERROR] Timeout connecting to Coordinator'
  assert_equal "${#lines[@]}" 2
  run e2e::json "${state}/sessions.json" 'sorted((s["rank"], s["node"]) for s in d["sessions"])'
  assert_output "[(2, 'node2'), (3, 'node2')]"
  run ls "${JOB_DIR}/nsight-slurm-direct"
  assert_output "$(printf '%s\n' "${JOB_ID}_node2_rank2.nsys-rep" "${JOB_ID}_node2_rank3.nsys-rep")"
  assert_not_equal "${JOB_RC}" 0
  # On node1, ZeroMQ with IPv6 on dials node1's fe80:: address: the probe flags it.
  run bash -c "'${REPO_ROOT}/tests/cluster/exec' node1 env PYTHONPATH='${REPO_ROOT}/py' '${SM_PYTHON}' -m slurm_multi coordinator probe --timeout-seconds 2 tcp://node1:${port} 2>/dev/null"
  assert_failure
  run e2e::json /dev/stdin 'd["link_local"], d["zmq_ipv6_dials"].startswith("fe80:"), d["ipv4"]' <<<"${output}"
  assert_output "(True, True, '10.77.0.11')"
}

# submit_long_job: the 2x2 bare-metal job of nsight_job, training for a minute, submitted without
# waiting; sets JOB_ID and JOB_DIR (the tests cancel it).
submit_long_job() {
  e2e::nsight_args "${REPO_ROOT}/tests/fakes/nsys" --flush-timeout-seconds 40
  e2e::submit_job -N2 -w node1,node2 --ntasks-per-node=2 -- --runtime none --ntasks-per-node 2 \
    "${E2E_NSIGHT_ARGS[@]}" -- sh -c 'echo "rank ${RANK} training"; sleep 60' || return 1
  JOB_DIR=${BATS_FILE_TMPDIR}/out/job/${JOB_ID}
}

@test "nsight-slurm scancelled mid-run: the flush still gets every rank's report before the steps die" {
  submit_long_job
  # Cancelled once all 4 ranks run under nsys (4 sessions registered, 4 streams open) and every
  # rank's sm-node is in its run stage (mid-run: a node.log alone can be a rank still in prepare,
  # and a cancel there is another test's case; CI saw it twice).
  e2e::cancel_when 90 90 e2e::ranks_profiled 4
  assert_file_exists "${JOB_DIR}/summary.json"
  node1_quirk_held
  run ls "${JOB_DIR}/nsight-slurm-direct"
  assert_output "$(printf '%s\n' "${JOB_ID}_node1_rank0.nsys-rep" "${JOB_ID}_node1_rank1.nsys-rep" \
    "${JOB_ID}_node2_rank2.nsys-rep" "${JOB_ID}_node2_rank3.nsys-rep")"
  local f
  for f in "${JOB_DIR}"/nsight-slurm-direct/*; do
    # Complete: the fake's header line plus every chunk (a SIGKILLed nsys leaves less, or nothing).
    assert_equal "$(stat -c %s "${f}")" "$(($(head -n 1 "${f}" | wc -c) + 3 * 16 * 1024))"
  done
  for r in 0 1 2 3; do
    # Every rank staged a status after the cancel: stopped by a signal, not finished, not lost.
    # (Which process in connector -> nsys -> sm-node -> workload saw the SIGTERM first decides the
    # exact code; a SIGKILL would have left no status.json at all.)
    run e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"] != 0 and d["exit_code"] != 137'
    assert_output True
  done
  # The flush came first; the teardown's own SIGTERM to the step (if the step was still there)
  # and the coordinator stop only after it. (Whether that SIGTERM is logged before or after the
  # coordinator stop depends on when srun notices the cancelled step; both follow the flush.)
  run grep -e 'profile: flush: 4 report(s) settled' -e 'multi: + scancel --signal=TERM' -e 'coordinator stop --force' "${JOB_DIR}/batch.log"
  assert_line --index 0 --partial 'profile: flush: 4 report(s) settled'
  assert_line --partial 'coordinator stop --force'
}

every_rank_has_a_node_log() { [[ $(find "${JOB_DIR}" -name node.log 2>/dev/null | wc -l) == 4 ]]; }

@test "nsight-slurm scancelled as soon as every rank has a node.log (some still in prepare or fitness): every rank stages" {
  # scancel, nsys and the connector each forward a SIGTERM to sm-node; a task that took them while
  # in prepare or fitness hung in its handler until Slurm's SIGKILL (2 of 12 such cancels), with
  # no status.json and no summary within the teardown.
  local r
  submit_long_job
  E2E_POLL=0.05 e2e::cancel_when 90 60 every_rank_has_a_node_log
  grep -h 'stage_start' "${JOB_DIR}"/node_*/events.log 2>/dev/null | grep -o 'stage=[a-z-]*' | sort | uniq -c | sed 's/^/# /' >&3 || true
  assert_file_exists "${JOB_DIR}/summary.json"
  for r in 0 1 2 3; do
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"]')" 143
    run grep -c 'received a termination signal' "${JOB_DIR}/node_${r}/node.log"
    assert_output 1
  done
}
