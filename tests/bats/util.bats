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
