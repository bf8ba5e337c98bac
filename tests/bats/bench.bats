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

# A fake tests/cluster/exec and docker: `save` writes 300 kB, `load` keeps what it read per node.
# shellcheck disable=SC2016 # $1, $* and $@ expand in the fake, not here
fake_nodes() {
  export LOADED=${BATS_TEST_TMPDIR}/loaded
  mkdir -p "${LOADED}"
  printf '#!/bin/bash\nnode=$1; shift; echo "exec ${node} $*" >>"%s"; NODE=${node} exec "$@"\n' "${TRACE}" >"${BATS_TEST_TMPDIR}/shim/exec"
  cat >"${BATS_TEST_TMPDIR}/shim/docker" <<'SH'
#!/bin/bash
case $1 in
  save) head -c 300000 /dev/zero ;;
  load) [[ -z ${FAIL_LOAD_ON:-} || ${FAIL_LOAD_ON} != "${NODE}" ]] || exit 7; cat >"${LOADED}/${NODE}" ;;
  image) ;;
esac
SH
  chmod +x "${BATS_TEST_TMPDIR}/shim/exec" "${BATS_TEST_TMPDIR}/shim/docker"
  EXEC=${BATS_TEST_TMPDIR}/shim/exec
}

@test "the hand pipeline feeds one docker save to a concurrent docker load on every other node" {
  fake_nodes
  run hand_pipeline_seconds 4 "${BATS_TEST_TMPDIR}" "${BATS_TEST_TMPDIR}/hand.tar"
  assert_success
  assert_output --regexp '^[0-9]+\.[0-9]+$'
  for node in node2 node3 node4; do
    [[ $(stat -c %s "${LOADED}/${node}") == 300000 ]] || fail "${node} loaded $(stat -c %s "${LOADED}/${node}") bytes"
  done
  [[ ! -e ${LOADED}/node1 ]] || fail "node1 (the source) loaded too"
  run grep -c "^exec node1 docker save toy/model:bench$" "${TRACE}"
  assert_output 1
  run grep -c "^exec node1 tee " "${TRACE}" # tee on the source node, writing the tar as well
  assert_output 1
  assert_file_not_exists "${BATS_TEST_TMPDIR}/hand.tar" # measured, then removed
}

@test "a load that fails in the hand pipeline fails the row group, not a silent floor" {
  fake_nodes
  FAIL_LOAD_ON=node2 run hand_pipeline_seconds 3 "${BATS_TEST_TMPDIR}"
  assert_failure
  assert_output --partial "the hand pipeline (docker save | tee | 2 docker loads) failed"
}

@test "BENCH_CLUSTER_GROUPS picks the row groups and rejects an unknown one" {
  BENCH_CLUSTER_GROUPS=transport,pyxis run want_group pyxis
  assert_success
  BENCH_CLUSTER_GROUPS=transport run want_group overhead
  assert_failure
  BENCH_CLUSTER_GROUPS=badnode run want_group badnode
  assert_success
  run want_group image # default: every group
  assert_success
  BENCH_CLUSTER_GROUPS=transprot run want_group transport
  assert_failure 2
  assert_output --partial "unknown group 'transprot'"
}

@test "only CPU profiles that were written become row options" {
  : >"${BATS_TEST_TMPDIR}/empty.json"
  echo '{}' >"${BATS_TEST_TMPDIR}/a.json"
  CPU_OPTS=()
  cpu_files baseline-cpu "${BATS_TEST_TMPDIR}/a.json" "${BATS_TEST_TMPDIR}/empty.json" "${BATS_TEST_TMPDIR}/missing-*.json"
  [[ ${CPU_OPTS[*]} == "--baseline-cpu ${BATS_TEST_TMPDIR}/a.json" ]] || fail "got: ${CPU_OPTS[*]}"
}

@test "a profiled command keeps its output and leaves a CPU summary (none with BENCH_CPU_PROFILE=0)" {
  BENCH_CPU_ACCT=0 run profiled "${BATS_TEST_TMPDIR}/cpu.json" echo measured
  assert_success
  assert_output measured
  run "${PY}" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["acct"], sorted(d["cpu_s"]))' "${BATS_TEST_TMPDIR}/cpu.json"
  assert_output "False ['load', 'other', 'python', 'relay', 'save', 'tee']"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/cpu.json.d"
  BENCH_CPU_PROFILE=0 run profiled "${BATS_TEST_TMPDIR}/none.json" echo plain
  assert_output plain
  assert_file_not_exists "${BATS_TEST_TMPDIR}/none.json"
}

@test "the overhead pairs alternate their order and a failed run ends them, naming it" {
  # shellcheck source=bench/overhead_job.sh
  source "${REPO_ROOT}/bench/overhead_job.sh"
  WORK=${BATS_TEST_TMPDIR}
  # shellcheck disable=SC2329 # called by pairs
  toolkit() { :; }
  # shellcheck disable=SC2329
  bare() { :; }
  run pairs short 3 0 20 0.05
  assert_success
  [[ $(awk '{ print $1, $2, $3 }' <<<"${output}" | paste -sd,) == "short 1 toolkit,short 1 bare,short 2 bare,short 2 toolkit,short 3 toolkit,short 3 bare" ]] ||
    fail "got: ${output}"
  assert_output --regexp '^short 1 toolkit [0-9]+\.[0-9]{4}'
  # shellcheck disable=SC2329
  bare() { return 7; }
  run pairs short 2 0 20 0.05
  assert_failure 7
  assert_output --partial "the bare run of short pair 1 failed (exit 7)"
  refute_output --partial "pair 2"
}
