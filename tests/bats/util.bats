#!/usr/bin/env bats
# lib/util.sh helpers that no other bats file reaches.

load helpers

setup() {
  # shellcheck source=/dev/null
  source "${REPO_ROOT}/lib/log.sh"
  # shellcheck source=/dev/null
  source "${REPO_ROOT}/lib/util.sh"
}

teardown() {
  [[ -z ${PARENT:-} ]] || { pkill -KILL -P "${PARENT}" 2>/dev/null; kill -KILL "${PARENT}" 2>/dev/null; } || true
}

@test "util::kill_children signals every child, as pkill -P does, and not the process itself" {
  bash -c 'sleep 30 & sleep 31 & wait; sleep 30' &
  PARENT=$!
  disown # (no "Killed" line when the teardown ends it)
  local kids=() tries=0
  while ((${#kids[@]} < 2 && tries++ < 100)); do
    read -r -a kids <<<"$(cat /proc/"${PARENT}"/task/*/children 2>/dev/null)"
    sleep 0.05
  done
  assert_equal "${#kids[@]}" 2
  util::kill_children TERM "${PARENT}"
  local kid
  for kid in "${kids[@]}"; do
    tries=0
    while kill -0 "${kid}" 2>/dev/null && ((tries++ < 100)); do sleep 0.05; done
    run kill -0 "${kid}"
    assert_failure
  done
  run kill -0 "${PARENT}"
  assert_success # it goes on to its next command
}

@test "util::kill_children of a process that is gone does nothing and succeeds" {
  run util::kill_children TERM 2147483646
  assert_success
  assert_output ""
}

# shellcheck disable=SC2016 # the task script's words expand in the task, not here
@test "util::stop_child in a TERM handler that interrupted the wait for that child never hangs (a second wait did)" {
  # A task's shape: a log filter that outlives everything (a process substitution), a helper in the
  # background, and scancel's SIGTERM to the whole group while the main flow waits for the helper.
  # The handler's own `wait` for it blocked for ever in about one run in four (bash 5.2; CI's
  # nsight-slurm cancel test); 40 runs here, at delays across the signal's window.
  local script=${BATS_TEST_TMPDIR}/task.sh said=${BATS_TEST_TMPDIR}/said i pid tries hung=0 handled=0
  printf '%s\n' 'source "$1/lib/log.sh"' 'source "$1/lib/util.sh"' 'SAID=$2' \
    'on_term() { trap "" TERM; util::stop_child "${P}"; echo handled >>"${SAID}"; exit 143; }' \
    'trap on_term TERM' 'exec > >(trap "" TERM; cat >/dev/null)' '(sleep 5) &' 'P=$!' \
    'echo started >>"${SAID}"' 'wait "${P}"' >"${script}"
  for i in $(seq 1 40); do
    : >"${said}"
    setsid bash "${script}" "${REPO_ROOT}" "${said}" &
    pid=$!
    tries=0
    until grep -q started "${said}" || ((tries++ > 200)); do sleep 0.01; done
    sleep "0.0$((i % 10))"
    kill -TERM -- "-${pid}" 2>/dev/null || true
    tries=0
    while kill -0 "${pid}" 2>/dev/null && ((tries++ < 100)); do sleep 0.05; done
    if kill -0 "${pid}" 2>/dev/null; then
      hung=$((hung + 1))
      kill -KILL -- "-${pid}" 2>/dev/null || true
    fi
    wait "${pid}" 2>/dev/null || true
    ! grep -q handled "${said}" || handled=$((handled + 1))
  done
  assert_equal "${hung}" 0
  assert_equal "${handled}" 40
}

# shellcheck disable=SC2016 # $1 and $! expand in the child shell
@test "util::stop_child: a helper that ignores SIGTERM gets SIGKILL after the grace, and is gone" {
  run timeout 20 bash -c 'source "$1/lib/log.sh"; source "$1/lib/util.sh"
    exec 2>/dev/null # (bash may say "Killed" of its job)
    (trap "" TERM; while :; do sleep 0.1; done) &
    util::stop_child $! 1
    if kill -0 $! 2>/dev/null; then echo alive; else echo gone; fi' _ "${REPO_ROOT}"
  assert_success
  assert_output gone
}

# shellcheck disable=SC2016 # the helper's words expand in the helper
@test "util::stop_child of a subshell running a helper: the helper gets the SIGTERM and finishes before it returns" {
  local done=${BATS_TEST_TMPDIR}/finished
  # The helper takes half a second to finish after SIGTERM (a server answering its peers ABORT).
  (bash -c 'trap "sleep 0.5; echo finished >$1; exit 0" TERM; while :; do sleep 0.05; done' _ "${done}"; true) &
  local pid=$! tries=0 kids=()
  until ((${#kids[@]})) || ((tries++ > 100)); do read -r -a kids </proc/"${pid}"/task/"${pid}"/children || true; sleep 0.02; done
  util::stop_child "${pid}"
  assert_file_exists "${done}"
  run kill -0 "${pid}"
  assert_failure
}

# shellcheck disable=SC2016 # the task's words expand in the task
@test "util::log_resume and util::log_drain: a handler that interrupted a redirected call is heard, and the filter ends" {
  # A TERM handler runs inside the call it interrupted (here `f >/dev/null 2>&1`): its lines went to
  # /dev/null, and bash's saved copy of stdout kept the filter from ever seeing its end.
  local log=${BATS_TEST_TMPDIR}/task.log
  run timeout 20 bash -c 'source "$1/lib/log.sh"; source "$1/lib/util.sh"
    util::log_to "$2"
    state=$2.state
    on_term() {
      trap "" TERM
      util::log_resume
      echo "handler speaks"
      local filter=${UTIL_LOG_PID}
      util::log_drain
      if kill -0 "${filter}" 2>/dev/null; then echo "filter still there" >>"${state}"; else echo "filter ended" >>"${state}"; fi
      exit 143
    }
    trap on_term TERM
    f() { sleep 5; }
    echo before
    (sleep 0.3; kill -TERM $$) &
    f >/dev/null 2>&1' _ "${REPO_ROOT}" "${log}"
  assert_equal "${status}" 143
  assert_equal "$(cat "${log}")" "$(printf '%s\n' before "handler speaks")"
  assert_equal "$(cat "${log}.state")" "filter ended"
}

# shellcheck disable=SC2016 # the words expand in the child shell
@test "util::warm_run in an EXIT trap after a failure gives the helper's status, not the failure's" {
  # A bare `return` in a trap handler returns the status from before the trap: every task that
  # failed logged "cannot write status.json" after writing it.
  run bash -c 'source "$1/lib/log.sh"; source "$1/lib/util.sh"
    dir=$2
    on_exit() {
      trap - EXIT
      if util::warm_run node status --file "${dir}/status.json" --rank 0 --node node1 --exit-code 3 --reason "stage run failed" --stage run:0.1:failed:3; then echo written; else echo "failed $?"; fi
    }
    trap on_exit EXIT
    exit 3' _ "${REPO_ROOT}" "${BATS_TEST_TMPDIR}"
  assert_output written
  assert_file_exists "${BATS_TEST_TMPDIR}/status.json"
}

# status_args FILE: a status line's argv (a reason with spaces and an empty image ID included).
status_args() {
  printf '%s\n' --file "$1" --rank 0 --node node1 --exit-code 3 --reason "stage run failed: exit 3" --image-id "" \
    --stage "prepare:0.21:ok" --stage "run:1.5:failed:3"
}

@test "util::warm_run writes through the warm helper what util::helper writes cold" {
  local args=()
  mapfile -t args < <(status_args "${BATS_TEST_TMPDIR}/cold.json")
  util::helper node status "${args[@]}"
  util::warm_start node status
  local pid=${UTIL_WARM_PID[node status]}
  mapfile -t args < <(status_args "${BATS_TEST_TMPDIR}/warm.json")
  util::warm_run node status "${args[@]}"
  assert_equal "$("${SM_PYTHON}" -c 'import json,sys; print(json.load(open(sys.argv[1])) == json.load(open(sys.argv[2])))' \
    "${BATS_TEST_TMPDIR}/cold.json" "${BATS_TEST_TMPDIR}/warm.json")" True
  # It was that helper that wrote it, and it is gone: a second run would start cold.
  run kill -0 "${pid}"
  assert_failure
  assert_equal "${UTIL_WARM_PID[node status]:-}" ""
}

@test "util::warm_run gives the warm helper's failure and its one-line reason, as util::helper does" {
  util::warm_start results collect
  local rc=0
  util::warm_run results collect "${BATS_TEST_TMPDIR}/no-such-job" || rc=$?
  assert_equal "${rc}" 2
  assert_equal "${UTIL_ERROR}" "results: job directory ${BATS_TEST_TMPDIR}/no-such-job does not exist; pass the directory the job wrote"
  rc=0
  util::helper results collect "${BATS_TEST_TMPDIR}/no-such-job" 2>/dev/null || rc=$?
  assert_equal "${rc}" 2
}

@test "a warm helper that died is replaced by a cold start, and a scancel's SIGTERM does not kill it" {
  util::warm_start node status
  kill -TERM "${UTIL_WARM_PID[node status]}" # ignored: the exit path still needs it
  sleep 0.2
  run kill -0 "${UTIL_WARM_PID[node status]}"
  assert_success
  kill -KILL "${UTIL_WARM_PID[node status]}"
  sleep 0.2
  local args=()
  mapfile -t args < <(status_args "${BATS_TEST_TMPDIR}/status.json")
  util::warm_run node status "${args[@]}"
  assert_file_exists "${BATS_TEST_TMPDIR}/status.json"
}

@test "util::warm_run without a warm helper is util::helper" {
  local args=()
  mapfile -t args < <(status_args "${BATS_TEST_TMPDIR}/status.json")
  util::warm_run node status "${args[@]}"
  assert_file_exists "${BATS_TEST_TMPDIR}/status.json"
}

@test "a warm helper never given its argv ends with the shell that started it, having done nothing" {
  run bash -c 'source "${REPO_ROOT}/lib/log.sh"; source "${REPO_ROOT}/lib/util.sh"; util::warm_start node status; echo "${UTIL_WARM_PID[node status]}"'
  assert_success
  local pid=${output} tries=0
  while kill -0 "${pid}" 2>/dev/null && ((tries++ < 100)); do sleep 0.05; done
  run kill -0 "${pid}"
  assert_failure
  assert_equal "$(find "${BATS_TEST_TMPDIR}" -mindepth 1 | wc -l)" 0
}

@test "util::elapsed of a start after now (the wall clock stepped back during the stage) is 0, a time status.json takes" {
  local t0
  util::now t0
  assert_equal "$(util::elapsed $((t0 + 1234567000)))" 0.00
}

@test "util::now, util::elapsed and util::first_node into a variable say what they print, without a process" {
  local t0 printed into first
  util::now t0
  [[ ${t0} =~ ^[0-9]{16}$ ]]
  printed=$(util::elapsed $((t0 - 1234567)))
  PATH=/nonexistent util::elapsed $((t0 - 1234567)) into
  [[ ${printed} =~ ^1\.2[0-9]$ && ${into} =~ ^1\.2[0-9]$ ]]
  # The job's own list, expanded by the batch step: the first host with no scontrol, head or fork.
  export SLURM_JOB_NODELIST='gpu[07-09]' SM_JOB_HOSTS='gpu07 gpu08 gpu09' SM_JOB_HOSTS_OF='gpu[07-09]'
  PATH=/nonexistent util::first_node first
  assert_equal "${first}" gpu07
  assert_equal "$(util::first_node)" gpu07
  # Another list (no scontrol here): its first name, printed or into VAR alike.
  export SLURM_JOB_NODELIST='a1,b2'
  PATH=/nonexistent util::first_node first
  assert_equal "${first}" a1
  assert_equal "$(PATH=/nonexistent util::first_node)" a1
}

@test "util::find_python into a variable says what it prints: SM_PYTHON, else the checkout's venv, else python3" {
  local found
  SM_PYTHON=/opt/py/bin/python3 PATH=/nonexistent util::find_python found
  assert_equal "${found}" /opt/py/bin/python3
  assert_equal "$(SM_PYTHON=/opt/py/bin/python3 util::find_python)" /opt/py/bin/python3
  mkdir -p "${BATS_TEST_TMPDIR}/home/.venv/bin"
  printf '#!/bin/sh\n' >"${BATS_TEST_TMPDIR}/home/.venv/bin/python" && chmod +x "${BATS_TEST_TMPDIR}/home/.venv/bin/python"
  SM_PYTHON='' SM_HOME=${BATS_TEST_TMPDIR}/home PATH=/nonexistent util::find_python found
  assert_equal "${found}" "${BATS_TEST_TMPDIR}/home/.venv/bin/python"
  SM_PYTHON='' SM_HOME=${BATS_TEST_TMPDIR}/none util::find_python found
  assert_equal "${found}" "$(command -v python3)"
}

@test "util::remove removes what is there (a dangling symlink too) and starts no rm for what is not" {
  local d=${BATS_TEST_TMPDIR}
  rm() { : >>"${d}/rm-ran"; command rm "$@"; }
  touch "${d}/a" "${d}/-b"
  ln -s "${d}/gone" "${d}/link"
  util::remove "${d}/a" "${d}/-b" "${d}/link" "${d}/never"
  [[ ! -e ${d}/a && ! -e ${d}/-b && ! -L ${d}/link && -e ${d}/rm-ran ]]
  command rm "${d}/rm-ran"
  util::remove "${d}/a" "${d}/never"
  [[ ! -e ${d}/rm-ran ]]
}

@test "util::generate_token: 48 lowercase hex characters, a new one each time, printed or into a VAR without a process" {
  local a b
  PATH=/nonexistent util::generate_token a
  PATH=/nonexistent util::generate_token b
  [[ ${a} =~ ^[0-9a-f]{48}$ && ${b} =~ ^[0-9a-f]{48}$ && ${a} != "${b}" ]]
  [[ $(util::generate_token) =~ ^[0-9a-f]{48}$ ]]
  # A bash without SRANDOM (before 5.1) reads /dev/urandom.
  run bash -c "unset SRANDOM; source '${SM_HOME}/lib/util.sh'; util::generate_token"
  assert_success
  [[ ${output} =~ ^[0-9a-f]{48}$ ]]
}

@test "util::generate_token leaves no piece of the token in a trace (SM_DEBUG=1 traces the batch step)" {
  local token
  exec 9>"${BATS_TEST_TMPDIR}/trace"
  BASH_XTRACEFD=9
  set -x
  util::generate_token token
  set +x
  exec 9>&-
  [[ ${token} =~ ^[0-9a-f]{48}$ ]]
  run grep -c "${token:0:8}" "${BATS_TEST_TMPDIR}/trace"
  assert_output 0
}

@test "a helper's error file is never one a planted link names: it is made in a private dir, O_EXCL|O_NOFOLLOW" {
  # The name is predictable ($$, BASHPID, RANDOM: seeded here as anybody could guess it); in a shared
  # TMPDIR another user could plant a link there first, and the helper's reason overwrote its target.
  export TMPDIR=${BATS_TEST_TMPDIR}/shared-tmp
  mkdir -p "${TMPDIR}"
  echo "precious" >"${BATS_TEST_TMPDIR}/victim"
  RANDOM=4242
  ln -s "${BATS_TEST_TMPDIR}/victim" "${TMPDIR}/.sm-error.$$.${BASHPID}.${RANDOM}"
  RANDOM=4242
  local rc=0
  util::helper results collect "${BATS_TEST_TMPDIR}/no-such-job" 2>/dev/null || rc=$?
  assert_equal "${rc}" 2
  assert_equal "$(<"${BATS_TEST_TMPDIR}/victim")" "precious"
  assert_equal "${UTIL_ERROR}" "results: job directory ${BATS_TEST_TMPDIR}/no-such-job does not exist; pass the directory the job wrote"
  # The private dir is this shell's own (0700), and goes on the way out.
  assert_equal "$(stat -c %a "${UTIL_PRIVATE}")" 700
  util::remove_private_dir
  assert_not_exist "${UTIL_PRIVATE}"
}

@test "util::sm_aside runs the helper at nice 10 and util::sm at the caller's niceness" {
  SM_HOME=${REPO_ROOT} SM_PYTHON=$(command -v python3)
  run util::py -c 'import os; print(os.nice(0))'
  assert_output "$(nice)"
  util::sm() { util::py -c 'import os; print(os.nice(0))'; }
  run util::sm_aside
  assert_output "$(($(nice) + 10))"
}

@test "util::nap sleeps the ladder's steps in order, from an empty VAR, and repeats the last" {
  local slept=() nap=
  # shellcheck disable=SC2329 # util::nap calls it
  sleep() { slept+=("$1"); }
  for _ in 1 2 3 4 5; do util::nap nap 0.001 0.004 0.016 0.05; done
  assert_equal "${slept[*]}" "0.001 0.004 0.016 0.05 0.05"
  assert_equal "${nap}" 0.05
  # A one-step ladder is a fixed nap.
  slept=() nap=
  util::nap nap 0.2
  util::nap nap 0.2
  assert_equal "${slept[*]}" "0.2 0.2"
}

@test "the polls nap through util::nap: util::wait_gone's first look is within a millisecond" {
  local slept=()
  sleep() { slept+=("$1"); command sleep "$1"; }
  command sleep 0.05 &
  util::wait_gone $!
  assert_equal "${slept[0]}" 0.001
  assert [ "${#slept[@]}" -ge 3 ]
  assert_equal "${slept[*]:0:3}" "0.001 0.004 0.016"
}
