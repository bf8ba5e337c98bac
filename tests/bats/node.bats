#!/usr/bin/env bats
# bin/sm-node and its libraries, without a cluster: usage, settings, argv building, status.json.

load helpers

setup() {
  for lib in log util settings image run node; do
    # shellcheck source=/dev/null
    source "${REPO_ROOT}/lib/${lib}.sh"
  done
  export SM_JOBDIR=${BATS_TEST_TMPDIR}/job SM_SCRATCH=${BATS_TEST_TMPDIR}/scratch
  mkdir -p "${SM_SCRATCH}/output"
}

@test "sm-node --help explains every stage; an unknown stage or option exits 2 with a one-line error" {
  run "${REPO_ROOT}/bin/sm-node" --help
  assert_success
  for s in prepare image barrier run stage; do assert_line --regexp "^  ${s} "; done
  run "${REPO_ROOT}/bin/sm-node" --stage bogus --jobdir /tmp/x
  assert_failure 2
  assert_output --partial "unknown stage 'bogus'"
  run "${REPO_ROOT}/bin/sm-node" --frobnicate
  assert_failure 2
  assert_line --index 0 --partial "unknown option '--frobnicate'"
}

@test "a single stage without a saved context says to run prepare first" {
  run "${REPO_ROOT}/bin/sm-node" --stage run --jobdir "${SM_JOBDIR}"
  assert_failure 2
  assert_output --partial "run the prepare stage first"
}

@test "util::json_str escapes quotes, backslashes, newlines and drops control characters" {
  run util::json_str $'a"b\\c\nd\te\001f'
  assert_output '"a\"b\\c\nd\te'"f"'"'
  run "${SM_PYTHON}" -c 'import json,sys; print(json.loads(sys.argv[1]))' "$(util::json_str $'x"y\nz')"
  assert_output $'x"y\nz'
}

@test "util::split_words honours quotes and never evaluates" {
  local words=()
  mapfile -d '' words < <(util::split_words "--steps 20 --name 'a b' \"\$(touch ${BATS_TEST_TMPDIR}/pwned)\"")
  assert_equal "${#words[@]}" 5
  assert_equal "${words[3]}" "a b"
  assert_equal "${words[4]}" "\$(touch ${BATS_TEST_TMPDIR}/pwned)"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/pwned"
  run util::split_words "unbalanced 'quote"
  assert_failure
}

@test "the workload command: -- CMD wins, else the manifest script by its kind, then its args" {
  local cmd=()
  SM_CMD=() SM_MODEL_SCRIPTS=run.sh SM_MODEL_ARGS="--steps 20 --tag 'x y'"
  mapfile -d '' cmd < <(run::workload_argv)
  assert_equal "${cmd[*]}" "sh run.sh --steps 20 --tag x y"
  SM_MODEL_SCRIPTS=train.py SM_MODEL_ARGS=""
  mapfile -d '' cmd < <(run::workload_argv)
  assert_equal "${cmd[*]}" "python3 train.py"
  SM_CMD=(echo "hello world")
  mapfile -d '' cmd < <(run::workload_argv)
  assert_equal "${#cmd[@]}" 2
  assert_equal "${cmd[1]}" "hello world"
}

@test "docker argv: host network, one mount per container path, env by name only, SLURM ids" {
  export SLURM_JOB_ID=42 SM_RANK=1 SM_IMAGE=toy/model:local SLURM_PROCID=1 SLURMD_NODENAME=node2
  export MASTER_ADDR=node1 MASTER_PORT=29500 HF_TOKEN=hf_do_not_print
  SM_CMD=(sh run.sh) SM_GPU_VENDOR=none
  SM_MOUNTS=(/shared/data:/data /other:/data/)
  SM_DOCKER_OPTS=(--shm-size 1G -v /dev/shm:/dev/shm)
  SM_DOCKER_ENV_NAMES=(HF_TOKEN)
  local argv=()
  mapfile -d '' argv < <(run::docker_argv 2>/dev/null)
  local joined=" ${argv[*]} "
  assert_equal "${argv[0]} ${argv[1]}" "docker run"
  [[ ${joined} == *" --name sm-42-r1 --network host "* ]]
  [[ ${joined} == *" -v /shared/data:/data "* ]]
  [[ ${joined} != *"/other:/data"* ]]
  [[ ${joined} == *" -e HF_TOKEN "* ]]
  [[ ${joined} != *hf_do_not_print* ]]
  [[ ${joined} == *" -e SLURM_JOB_ID "* && ${joined} == *" -e SLURM_PROCID "* && ${joined} == *" -e SLURMD_NODENAME "* ]]
  [[ ${joined} == *" toy/model:local sh run.sh " ]]
  assert_equal "$(grep -o -- ' -v [^ ]*/sm-out ' <<<"${joined}" | wc -l)" 1
}

@test "status.json records exit code, reason and per-stage seconds as valid JSON" {
  export SM_NODE_DIR=${BATS_TEST_TMPDIR}/node_1 SM_RANK=1 SM_IMAGE_ID=sha256:abc
  mkdir -p "${SM_NODE_DIR}"
  NODE_STAGE_ORDER=(prepare run) NODE_EXIT=3 RUN_EXIT=3 NODE_REASON='container exited 3 "boom"'
  NODE_STAGE_SECONDS[prepare]=0.12 NODE_STAGE_STATUS[prepare]=ok
  NODE_STAGE_SECONDS[run]=1.50 NODE_STAGE_STATUS[run]=failed
  node::write_status
  run "${SM_PYTHON}" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["exit_code"], d["status"], d["stages"]["run"]["exit_code"], d["stages"]["prepare"]["seconds"], d["reason"])' "${SM_NODE_DIR}/status.json"
  assert_output '3 failed 3 0.12 container exited 3 "boom"'
}

@test "settings: each option maps to its variable; a bad value is one line with exit 2" {
  assert_equal "$(settings::option_var --image-cache)" SM_IMAGE_CACHE
  assert_equal "$(settings::option_var --profile)" SM_PROFILE
  run settings::option_var --nope
  assert_failure
  SM_TIMEOUT=1 SM_BARRIER_TIMEOUT=1 SM_MASTER_PORT=70000 SM_STOP_GRACE=1 SM_PEER_GRACE=1 SM_PROFILE=none \
    SM_RUNTIME=docker SM_COLLECT=true SM_IMAGE=x run settings::validate
  assert_failure 2
  assert_output --partial "--master-port 70000 is not a TCP port"
}
