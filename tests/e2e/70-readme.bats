#!/usr/bin/env bats
# Every command the README shows, run as written (placeholders filled in) on the test cluster.

load helpers

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  # The README's jobs run as the ordinary user too: the places they write are theirs.
  mkdir -p "${REPO_ROOT}/slurm_output/toy_model" /tmp/sm-image-cache /tmp/sm-runs
  chown -R "${E2E_USER}" "${REPO_ROOT}/slurm_output" /tmp/sm-image-cache /tmp/sm-runs
}

# readme_commands: the command lines of the README's ```bash blocks, comments stripped.
readme_commands() {
  awk '/^```bash$/ { on = 1; next } /^```$/ { on = 0 } on' "${REPO_ROOT}/README.md" |
    sed -e 's/[[:space:]]\{2,\}#.*$//' -e 's/[[:space:]]*$//' | grep -v '^$'
}

# Commands not run here, each for a reason: installation steps for a real cluster (the clone URL
# is a placeholder and the venv is what `make setup` makes); `make test` is this suite; `make bench`
# has its own smoke test (tests/py/test_bench.py); `make cluster-down` runs last in 99-cluster-down.
SKIP_REGEX='^(git clone |python3 -m venv |export SM_HOME=|make test$|make bench$|make cluster-down$)'

@test "the README shows the two commands up front" {
  run sed -n '1,15p' "${REPO_ROOT}/README.md"
  assert_output --partial "make demo"
  assert_output --partial "make test"
}

@test "every command in the README works as written" {
  local line cmd count=0 job=""
  while IFS= read -r line; do
    [[ ${line} =~ ${SKIP_REGEX} ]] && continue
    cmd=${line}
    if [[ ${cmd} == *"<jobid>"* ]]; then
      # The newest job the README's own sbatch ran (as the ordinary user; make demo's run as root).
      job=$(find "${REPO_ROOT}/slurm_output/toy_model" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9]+' -user "${E2E_USER}" -printf '%T@ %f\n' |
        sort -rn | awk 'NR == 1 { print $2 }')
      cmd=${cmd//<jobid>/${job}}
    fi
    echo "README: ${cmd}" >&3
    if [[ ${cmd} == sbatch* ]]; then
      # A real job, submitted as the ordinary user: wait for it and require SUCCESS.
      run runuser -u "${E2E_USER}" -- bash -c "cd '${REPO_ROOT}' && ${cmd/sbatch /sbatch --parsable }"
      assert_success
      local id=${output##*$'\n'}
      e2e::wait_job "${id}"
      assert_equal "${JOB_RC}" 0
    elif [[ ${cmd} == bin/sm-node* ]]; then
      # "on a compute node": inside node2, as the user whose job it was.
      run "${REPO_ROOT}/tests/cluster/exec" node2 runuser -u "${E2E_USER}" -- bash -c "cd '${REPO_ROOT}' && ${cmd}"
      assert_success
    else
      run bash -c "cd '${REPO_ROOT}' && ${cmd}"
      # A long command (make test-unit) that fails names its failing tests first: the whole output
      # is hundreds of lines, and a CI log that shows only its ends would hide them.
      ((status == 0)) || fail "$(printf 'README command failed (exit %s): %s\n' "${status}" "${cmd}"
        grep -E -A25 '^(not ok|FAILED|E  |ERROR|make.*Error)' <<<"${output}" | head -120)"
    fi
    count=$((count + 1))
  done < <(readme_commands)
  echo "ran ${count} README commands" >&3
  # A guard against an extraction that silently finds nothing.
  ((count >= 13))
}

@test "every option of sbatch/multi.sbatch is documented (profiling ones in docs/profiling.md)" {
  local opt doc
  for opt in $(bash "${REPO_ROOT}/sbatch/multi.sbatch" --help | grep -oE '^  --[a-z-]+' | tr -d ' '); do
    doc=${REPO_ROOT}/README.md
    [[ ${opt} =~ ^--(profile-|nsys-|nsight-slurm-|flush-|framework|container-image|nvtx-) ]] &&
      doc=${REPO_ROOT}/docs/profiling.md
    grep -qF -- "${opt}" "${doc}" || fail "option ${opt} is not documented in ${doc#"${REPO_ROOT}"/}"
  done
}
