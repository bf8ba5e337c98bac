#!/usr/bin/env bats
# Hangs caught at the launcher, for any container: a rank with no output and no CPU for
# --hang-timeout seconds after GO fails the job, named as the cause; a busy but silent rank does not.

load helpers
bats_require_minimum_version 1.5.0

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
}

@test "a toy rank asleep without output past --hang-timeout: FAILURE naming it as hung, diagnostics, the others staged" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --hang-timeout 5 \
    --peer-grace 2 -- sh run.sh --steps 10 --hang-rank 1
  assert_equal "${JOB_RC}" 1
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::json "${JOB_DIR}/summary.json" 'd["reasons"][0]'
  assert_output --regexp '^hung: node2 \(rank 1\), no output and no CPU for [0-9]+ s since [0-9]{2}:[0-9]{2}:[0-9]{2} \(sleeping'
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/hang.json" 'd["role"], d["state"]')" "('cause', 'sleeping')"
  run cat "${JOB_DIR}/node_1/status.json"
  assert_output --partial '"reason": "hung: no output and no CPU for'
  for f in hang-processes.txt kernel-stacks.txt sockets.txt container-log-tail.txt container-processes.txt; do
    assert_file_exists "${JOB_DIR}/node_1/diagnostics/${f}"
  done
  run cat "${JOB_DIR}/node_1/diagnostics/hang-processes.txt"
  assert_output --partial "sleep"
  # The last line the rank printed is in the snapshot of its log.
  run cat "${JOB_DIR}/node_1/diagnostics/container-log-tail.txt"
  assert_output --partial "toy: rank 1 stops here (--hang-rank)"
  # The other rank finished and staged; the job ended within the hang timeout + 15 s of the hang.
  assert_equal "$(e2e::json "${JOB_DIR}/node_0/status.json" 'd["exit_code"]')" 0
  local hung_at ended_at
  hung_at=$(e2e::json "${JOB_DIR}/node_1/hang.json" 'int(d["last_progress_epoch"])')
  ended_at=$(stat -c %Y "${JOB_DIR}/summary.json")
  echo "toy hang: summary $((ended_at - hung_at)) s after the rank's last progress (hang timeout 5 s)" >&3
  assert [ $((ended_at - hung_at)) -le 20 ]
  # Every rank recorded when it last made progress.
  run e2e::json "${JOB_DIR}/summary.json" '[n["last_progress"] is not None for n in d["nodes"]]'
  assert_output "[True, True]"
}

@test "every rank computing in silence for longer than --hang-timeout is not hung: SUCCESS" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --hang-timeout 3 \
    -- sh run.sh --steps 10 --busy-seconds 8
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  assert_file_not_exists "${JOB_DIR}/node_0/hang.json"
  assert_file_not_exists "${JOB_DIR}/node_1/hang.json"
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "computed silently for 8 s"
}

@test "--hang-timeout 0 turns the watch off: a sleeping rank runs on until --timeout" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --hang-timeout 0 \
    --timeout 12 --peer-grace 2 -- sh run.sh --steps 10 --hang-rank 1
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  assert_file_not_exists "${JOB_DIR}/node_1/hang.json"
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "timed out after 12 s"
  refute_output --partial "hung:"
}

@test "bare metal (--runtime none): a rank asleep without output is hung, read from its process tree" {
  # Rank 1 sleeps in silence; rank 0 prints and ends. No container: CPU time from the step's processes.
  # shellcheck disable=SC2016 # expanded by the workload's shell
  e2e::run_job -N2 -- --runtime none --hang-timeout 4 --peer-grace 2 \
    -- sh -c 'echo "rank ${RANK} up"; if [ "${RANK}" = 1 ]; then sleep 600; fi; echo "performance: 1.5 samples_per_second"'
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" 'd["reasons"][0]'
  assert_output --regexp '^hung: node2 \(rank 1\), no output and no CPU for [0-9]+ s since [0-9:]{8} \(sleeping'
  run e2e::json "${JOB_DIR}/node_1/hang.json" '[p["comm"] for p in d["processes"]]'
  assert_output --partial "'sleep'"
  assert_file_exists "${JOB_DIR}/node_1/diagnostics/hang-processes.txt"
  assert_equal "$(e2e::json "${JOB_DIR}/node_0/status.json" 'd["exit_code"]')" 0
  # The stopped workload is gone from node2: no sleep of this job lingers.
  run "${REPO_ROOT}/tests/cluster/exec" node2 pgrep -u "${E2E_USER}" -f "sleep 600"
  assert_failure
}
