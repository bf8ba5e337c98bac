#!/usr/bin/env bats
# shellcheck disable=SC2016 # the shims are sh scripts in single quotes: their $1 is theirs
# lib/slurm.sh: the Slurm look-ups written once (steps, KillWait, host names), against shims that
# print what squeue and scontrol print.

load helpers

setup() {
  mkdir -p "${BATS_TEST_TMPDIR}/shim"
  PATH=${BATS_TEST_TMPDIR}/shim:${PATH}
  # shellcheck source=lib/util.sh
  source "${REPO_ROOT}/lib/util.sh" # loads lib/slurm.sh
  export SLURM_JOB_ID=42
}

shim() {
  printf '#!/bin/sh\n%s\n' "$2" >"${BATS_TEST_TMPDIR}/shim/$1"
  chmod +x "${BATS_TEST_TMPDIR}/shim/$1"
}

@test "step ids by name, whole names only, optionally on one node, in squeue's order" {
  # squeue -s -h -o '%i|%j|%N' as Slurm prints it (the extern and batch steps included).
  shim squeue '[ "$*" = "-s -j 42 -h -o %i|%j|%N" ] || exit 1
printf "%s\n" "42.extern|extern|node[1-3]" "42.batch|batch|node1" "42.0|sm-node|node[1-3]" "42.1|sm-rank0|node1" "42.2|sm-rank1|node2" "42.3|sm-rank10|node3" "42.4|nsight-slurm-connector|node1"'
  run slurm::step_ids sm-node
  assert_output 0
  run slurm::step_ids 'sm-rank[0-9]+|nsight-slurm-connector'
  assert_output $'1\n2\n3\n4'
  run slurm::step_ids sm-rank1 node2
  assert_output 2
  run slurm::step_ids sm-rank1 node3 # rank 10's step is not rank 1's
  assert_output ""
  run slurm::step_ids sm-rank
  assert_output ""
}

@test "without squeue's answer there are no steps, and the caller goes on" {
  shim squeue 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1'
  run slurm::step_ids sm-node
  assert_success
  assert_output ""
}

@test "KillWait from scontrol show config in whole seconds; SM_KILLWAIT wins; empty when unreadable" {
  shim scontrol '[ "$1 $2" = "show config" ] && printf "JobAcctGatherType       = (null)\nKillWaitSomething       = 5\nKillWait                = 60 sec\nKillOnBadExit           = 0\n"'
  run slurm::killwait
  assert_output 60
  SM_KILLWAIT=300 run slurm::killwait
  assert_output 300
  shim scontrol 'exit 1'
  run slurm::killwait
  assert_success
  assert_output ""
}

@test "host names expanded by scontrol, or the list split at its commas without it" {
  shim scontrol '[ "$1 $2" = "show hostnames" ] && [ "$3" = "node[1-3]" ] && printf "node1\nnode2\nnode3\n"'
  run slurm::hostnames 'node[1-3]'
  assert_output $'node1\nnode2\nnode3'
  SLURM_JOB_NODELIST='node[1-3]' run slurm::hostnames
  assert_output $'node1\nnode2\nnode3'
  shim scontrol 'exit 1'
  run slurm::hostnames 'a,b'
  assert_output $'a\nb'
  run slurm::hostnames ''
  assert_output ""
}

@test "the job's own host list, expanded once by the batch step, needs no scontrol on the nodes" {
  # A node's task inherits the batch step's expansion: scontrol is not asked again (it would fail).
  shim scontrol 'echo called >>"${BATS_TEST_TMPDIR}/calls"; exit 1'
  export SLURM_JOB_NODELIST='gpu[07-08]'
  slurm::export_hostnames gpu07 gpu08
  run bash -c "source '${REPO_ROOT}/lib/util.sh'; slurm::hostnames"
  assert_success
  assert_output $'gpu07\ngpu08'
  run bash -c "source '${REPO_ROOT}/lib/util.sh'; slurm::hostnames 'gpu[07-08]'"
  assert_output $'gpu07\ngpu08'
  [[ ! -e ${BATS_TEST_TMPDIR}/calls ]]
  # Another list (an exclude list, a requeue's nodes) is still expanded by scontrol.
  run slurm::hostnames 'gpu[01-02]'
  assert_output 'gpu[01-02]'
  [[ $(wc -l <"${BATS_TEST_TMPDIR}/calls") == 1 ]]
}

@test "slurm::hostnames_into fills an array: the job's own list without a process, another through scontrol" {
  shim scontrol 'echo called >>"${BATS_TEST_TMPDIR}/calls"; printf "gpu01\ngpu02\n"'
  export SLURM_JOB_NODELIST='gpu[07-09]'
  slurm::export_hostnames gpu07 gpu08 gpu09
  # No process: with an empty PATH, a subshell's command would fail, a fork would not be counted.
  run bash -c "source '${REPO_ROOT}/lib/util.sh'; PATH=; hosts=(stale); slurm::hostnames_into hosts; echo \"\${#hosts[@]}:\${hosts[*]}\""
  assert_success
  assert_output '3:gpu07 gpu08 gpu09'
  [[ ! -e ${BATS_TEST_TMPDIR}/calls ]]
  local hosts=(stale)
  slurm::hostnames_into hosts 'gpu[01-02]'
  assert_equal "${#hosts[@]}:${hosts[*]}" '2:gpu01 gpu02'
  [[ $(wc -l <"${BATS_TEST_TMPDIR}/calls") == 1 ]]
  SLURM_JOB_NODELIST='' slurm::hostnames_into hosts
  assert_equal "${#hosts[@]}" 0
}
