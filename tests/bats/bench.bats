#!/usr/bin/env bats
# bench/cluster_bench.sh without a cluster: `make demo` (2 nodes) then `make bench` once hung on a
# 3-node job that could never start. Now the bench brings the cluster to the nodes its rows need,
# and a job Slurm says can never start (or that runs too long) is cancelled, not waited for.

load helpers

setup() {
  mkdir -p "${BATS_TEST_TMPDIR}/shim" "${BATS_TEST_TMPDIR}/state"
  export TRACE=${BATS_TEST_TMPDIR}/trace SM_CLUSTER_STATE=${BATS_TEST_TMPDIR}/state
  printf '#!/bin/sh\necho "scancel $*" >>"%s"\n' "${TRACE}" >"${BATS_TEST_TMPDIR}/shim/scancel"
  printf '#!/bin/sh\necho "up $*" >>"%s"\n' "${TRACE}" >"${BATS_TEST_TMPDIR}/shim/cluster-up"
  chmod +x "${BATS_TEST_TMPDIR}/shim/scancel" "${BATS_TEST_TMPDIR}/shim/cluster-up"
  export PATH="${BATS_TEST_TMPDIR}/shim:${PATH}" BENCH_CLUSTER_UP=${BATS_TEST_TMPDIR}/shim/cluster-up
  # shellcheck source=bench/cluster_bench.sh
  source "${REPO_ROOT}/bench/cluster_bench.sh"
}

# shellcheck disable=SC2016 # $3 expands in the fake, not here
fake_scontrol() {
  printf '#!/bin/sh\necho "JobId=$3 JobState=%s Reason=%s ExitCode=0:0"\n' "$1" "$2" >"${BATS_TEST_TMPDIR}/shim/scontrol"
  chmod +x "${BATS_TEST_TMPDIR}/shim/scontrol"
}

@test "a bench job Slurm says can never start is cancelled at once, not waited for" {
  fake_scontrol PENDING PartitionNodeLimit
  run wait_job 42
  assert_failure
  assert_output --partial "job 42 can never start here (PartitionNodeLimit); cancelled"
  assert_line 255
  run cat "${TRACE}"
  assert_line "scancel 42"
}

@test "a bench job that runs past BENCH_JOB_TIMEOUT is cancelled" {
  fake_scontrol RUNNING None
  BENCH_JOB_TIMEOUT=1 run wait_job 43
  assert_failure
  assert_output --partial "job 43 still RUNNING after 1 s; cancelled"
  run cat "${TRACE}"
  assert_line "scancel 43"
}

@test "the bench brings a 2-node cluster (what make demo leaves) up with the 4 nodes its rows need" {
  printf 'node1 10.77.0.11 none\nnode2 10.77.0.12 none\n' >"${SM_CLUSTER_STATE}/nodes"
  run ensure_nodes 4
  assert_success
  assert_output --partial "the cluster rows need 4 nodes (the test cluster has 2); bringing it up with 4"
  run cat "${TRACE}"
  assert_line "up --no-install --nodes 4"
}
