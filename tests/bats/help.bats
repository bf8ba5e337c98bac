#!/usr/bin/env bats
# Every entrypoint explains itself: --help with an example, and a one-line error plus the usage
# for an option it does not know.

load helpers

leaf_commands() {
  local group cmd
  for group in $(slurm-multi --help | awk '/^Commands:/ { f = 1; next } f && !NF { exit } f { print $1 }'); do
    if slurm-multi "${group}" --help | grep -q '^Commands:'; then
      for cmd in $(slurm-multi "${group}" --help | awk '/^Commands:/ { f = 1; next } f && !NF { exit } f { print $1 }'); do
        echo "${group} ${cmd}"
      done
    else
      echo "${group}"
    fi
  done
}

@test "slurm-multi --help and --version start without importing pandas or zmq" {
  run "${SM_PYTHON}" -c 'import sys, runpy; sys.argv = ["slurm-multi", "--help"]
try:
    runpy.run_module("slurm_multi", run_name="__main__")
except SystemExit:
    pass
print("heavy:", sorted(m for m in ("pandas", "zmq") if m in sys.modules))'
  assert_success
  assert_line "heavy: []"
  run slurm-multi --version
  assert_success
  assert_output --regexp '^slurm-multi, version [0-9]+\.[0-9]+'
}

@test "every slurm-multi command has --help with an example, and rejects an unknown option" {
  local line count=0
  while read -r line; do
    # shellcheck disable=SC2086 # "group cmd" splits on purpose
    run slurm-multi ${line} --help
    assert_success
    assert_output --partial "Example"
    # shellcheck disable=SC2086
    run slurm-multi ${line} --no-such-option
    assert_failure 2
    # One line naming the command and where its usage is; never click's usage block.
    assert_output --regexp "^slurm-multi: ${line}: No such option '--no-such-option'; Usage: slurm-multi ${line} \[OPTIONS\].* \(--help lists the options\)$"
    count=$((count + 1))
  done < <(leaf_commands)
  ((count >= 14))
}

@test "every bin/ command and the test cluster entrypoints have --help with an example" {
  local cmd
  for cmd in bin/sm-node bin/sm-collect bin/sm-demo tests/cluster/up tests/cluster/down tests/cluster/status \
    tests/cluster/exec tests/cluster/self-name tests/cluster/install-packages examples/toy/build-image bench/run; do
    run "${REPO_ROOT}/${cmd}" --help
    assert_success
    assert_output --regexp '(Example|e\.g\.)'
  done
}

@test "bin/ commands reject an unknown option with a one-line error and the usage, exit 2" {
  local cmd
  for cmd in bin/sm-demo tests/cluster/up examples/toy/build-image; do
    run "${REPO_ROOT}/${cmd}" --no-such-option
    assert_failure 2
    assert_line --index 0 --partial "unknown option '--no-such-option'"
    assert_output --partial "Usage:"
  done
}
