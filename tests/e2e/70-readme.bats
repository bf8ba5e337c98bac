#!/usr/bin/env bats
# Every command the README shows, run as written (placeholders filled in) on the test cluster, as
# the ordinary user that jobs on a real cluster run as; the make targets as root (they set up the
# machine and the cluster).

load helpers

# The README's shared storage is /shared/$USER. On the test cluster every node sees the host's
# filesystem, so a directory of this file's own, owned by the job user, is that storage: the
# placeholder is replaced by it (as <jobid> by the newest job), and what the README's checks and
# jobs write there goes with the file's temporary directory.
# shellcheck disable=SC2016 # the literal text of the README, not this shell's $USER
SHARED_PLACEHOLDER='/shared/$USER'

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  e2e::share_dir "${BATS_FILE_TMPDIR}"
  install -d -o "${E2E_USER}" "${BATS_FILE_TMPDIR}/shared"
}

# readme_commands: the command lines of the README's ```bash blocks, comments stripped, a line that
# ends in a backslash joined with the next.
readme_commands() {
  awk '/^```bash$/ { on = 1; next } /^```$/ { on = 0 } on' "${REPO_ROOT}/README.md" |
    sed -e 's/[[:space:]]\{2,\}#.*$//' -e 's/[[:space:]]*$//' |
    awk '{ if (sub(/\\$/, "")) { joined = joined $0; next } print joined $0; joined = "" }' | grep -v '^$'
}

# Commands not run here, each for a reason: installation steps for a real cluster (the clone URL
# is a placeholder; the venv is what `make setup` made, and SM_HOME is exported below as the
# install step would); `make test` is this suite.
SKIP_REGEX='^(git clone |(/usr/bin/)?python3 -m venv |export SM_HOME=|make test$)'

@test "the README shows the two commands up front" {
  run sed -n '1,15p' "${REPO_ROOT}/README.md"
  assert_output --partial "make demo"
  assert_output --partial "make test"
}

@test "every command in the README works as written" {
  local line cmd count=0 job="" shared=${BATS_FILE_TMPDIR}/shared
  export SM_HOME=${REPO_ROOT}
  # Every command reads /dev/null: srun would otherwise eat the list of commands this loop reads.
  # The user's commands run in the user's shared directory, where the README submits from (Slurm
  # writes slurm-multi-<jobid>.out there); the make targets in the checkout, as root.
  while IFS= read -r line; do
    [[ ${line} =~ ${SKIP_REGEX} ]] && continue
    cmd=${line//"${SHARED_PLACEHOLDER}"/"${shared}"}
    if [[ ${cmd} == *"<jobid>"* ]]; then
      # The newest job the README's own sbatch ran (the toy manifest's: its model is toy_model).
      job=$(find "${shared}/sm-runs/toy_model" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9]+' -user "${E2E_USER}" -printf '%T@ %f\n' |
        sort -rn | awk 'NR == 1 { print $2 }')
      [[ -n ${job} ]] || fail "no README job under ${shared}/sm-runs/toy_model for: ${line}"
      cmd=${cmd//<jobid>/${job}}
    fi
    echo "README: ${cmd}" >&3
    if [[ ${cmd} == sbatch* ]]; then
      # A real job, submitted as the ordinary user: wait for it and require SUCCESS.
      run runuser -u "${E2E_USER}" -- bash -c "cd '${shared}' && ${cmd/sbatch /sbatch --parsable }" </dev/null
      assert_success
      local id=${output##*$'\n'}
      e2e::wait_job "${id}"
      # The state too: a job Slurm could not launch (say, its output file) is FAILED with ExitCode 0:53.
      assert_equal "${JOB_STATE} ${JOB_RC}" "COMPLETED 0"
    elif [[ ${cmd} == *"bin/sm-node "* ]]; then
      # "on a compute node": inside node2, as the user whose job it was.
      run "${REPO_ROOT}/tests/cluster/exec" node2 runuser -u "${E2E_USER}" -- bash -c "cd '${shared}' && ${cmd}" </dev/null
      assert_success
    else
      if [[ ${cmd} == make* ]]; then
        run bash -c "cd '${REPO_ROOT}' && ${cmd}" </dev/null
      else
        # The requirement checks, the dry run, the outputs: as the user, each bounded.
        run runuser -u "${E2E_USER}" -- timeout "${E2E_STEP_TIMEOUT:-120}" bash -c "cd '${shared}' && ${cmd}" </dev/null
      fi
      # A long command (make demo) that fails names its failing lines first: the whole output
      # is hundreds of lines, and a CI log that shows only its ends would hide them.
      ((status == 0)) || fail "$(printf 'README command failed (exit %s): %s\n' "${status}" "${cmd}"
        grep -E -A25 '^(not ok|FAILED|E  |ERROR|make.*Error)' <<<"${output}" | head -120
        tail -n 40 <<<"${output}")"
    fi
    count=$((count + 1))
  done < <(readme_commands)
  echo "ran ${count} README commands" >&3
  # A guard against an extraction that silently finds nothing.
  ((count >= 12))
}

@test "every option of sbatch/multi.sbatch is documented (README or docs/options.md; profiling ones in docs/profiling.md too)" {
  # The README shows the core options only and points to docs/options.md for the rest.
  local opt
  for opt in $(bash "${REPO_ROOT}/sbatch/multi.sbatch" --help | grep -oE '^  --[a-z-]+' | tr -d ' '); do
    grep -qF -- "${opt}" "${REPO_ROOT}/README.md" "${REPO_ROOT}/docs/options.md" ||
      fail "option ${opt} is documented neither in README.md nor in docs/options.md"
    if [[ ${opt} =~ ^--(profile-|nsys-|nsight-slurm-|flush-|framework|container-image|nvtx-) ]]; then
      grep -qF -- "${opt}" "${REPO_ROOT}/docs/profiling.md" || fail "option ${opt} is not documented in docs/profiling.md"
    fi
  done
}
