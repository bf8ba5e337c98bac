#!/usr/bin/env bats
# The seam between bash and Python on a real cluster: bad input stops the job before any node
# starts, the cache never trusts a tar that is not what its sidecar says, nothing of a job stays on
# a node after it, and any stage of a finished job can be re-run by hand from its node log.

load helpers
bats_require_minimum_version 1.5.0

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  mkdir -p "${E2E_CACHE}"
}

@test "a bad manifest stops the batch step before any srun: exit 2, one line naming file and key, no node dir" {
  local bad=${BATS_FILE_TMPDIR}/bad-manifest.json
  echo '{"built_models": [1, 2]}' >"${bad}"
  cd "${BATS_FILE_TMPDIR}"
  e2e::sbatch_wait -N2 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${bad}"
  assert_equal "${JOB_RC}" 2
  run cat "${BATS_FILE_TMPDIR}/job-${JOB_ID}.out"
  assert_output --partial "bad-manifest.json: not a build manifest (built_models must be an object, got array)"
  refute_output --partial "srun"
  refute_output --partial Traceback
  run sacct -j "${JOB_ID}" -n -o JobName -P 2>/dev/null
  refute_output --partial sm-node
  run compgen -G "${BATS_FILE_TMPDIR}/out/*/*/node_*"
  assert_failure
}

@test "a cached tar cut to 5 bytes with its sidecar intact is no hit: rank 0 saves it again, the worker never loads it" {
  # The whole-image tar (--image-layers off); a layered entry's blobs are checked by their digest.
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-transport cache --image-cache "${E2E_CACHE}" --image-layers off
  assert_equal "${JOB_RC}" 0
  local tar
  tar=$(find "${E2E_CACHE}" -maxdepth 1 -name '*.tar' | head -n 1)
  assert [ -n "${tar}" ]
  local size
  size=$(stat -c %s "${tar}")
  run grep -c "^bytes=${size}$" "${tar%.tar}.id"
  assert_output 1
  run grep -cE '^cksum=[0-9]+$' "${tar%.tar}.id"
  assert_output 1
  assert_equal "$(grep '^cksum=' "${tar%.tar}.id")" "cksum=$(cksum <"${tar}" | cut -d' ' -f1)"
  head -c 5 "${tar}" >"${tar}.cut" && mv -f "${tar}.cut" "${tar}"
  chmod a+rw "${tar}"
  "${REPO_ROOT}/tests/cluster/exec" node2 docker image rm -f toy/model:local >/dev/null 2>&1 || true
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-transport cache --image-cache "${E2E_CACHE}" --image-layers off
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "does not match its sidecar (5 bytes, sidecar says ${size}); saving it again"
  # The worker loaded the repaired tar, never the cut one.
  assert_equal "$(stat -c %s "${tar}")" "${size}"
  assert_equal "$(e2e::image_id node2)" "$(e2e::image_id node1)"
  run grep -c "is not the tar its sidecar describes" "${JOB_DIR}/node_1/node.log"
  assert_output 0
}

@test "after a scancel nothing of the job stays on any node: no scratch dir (secrets), no container" {
  cd "${BATS_FILE_TMPDIR}"
  local job node deadline
  job=$(sbatch --parsable -N3 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" -- sh run.sh --steps 200)
  local jobdir=${BATS_FILE_TMPDIR}/out/toy_model/${job}
  deadline=$((SECONDS + 90))
  until grep -qs "toy: rank 2 step" "${jobdir}/node_2/node.log" || ((SECONDS > deadline)); do sleep 0.5; done
  # While it runs, each node holds the job's scratch dir (its container env and secrets list).
  run "${REPO_ROOT}/tests/cluster/exec" node2 bash -c "ls -d /tmp/slurm-multi.${job}.r*"
  assert_success
  scancel "${job}"
  e2e::wait_teardown "${job}" "${jobdir}" 120
  assert_file_exists "${jobdir}/summary.json"
  for node in node1 node2 node3; do
    run "${REPO_ROOT}/tests/cluster/exec" "${node}" bash -c "ls -d /tmp/slurm-multi.${job}.* 2>/dev/null; docker ps -aq --filter name=sm-${job}-"
    assert_output ""
  done
}

@test "one stage of a failed 2-node job re-runs by hand from the line its node log prints" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" -- sh run.sh --steps 5 --fail-rank 1
  assert_equal "${JOB_RC}" 1
  # The node log names the command that re-runs each stage of this job on that node.
  local line cmd
  line=$(grep -m1 ' image: stage image (alone, after the job: ' "${JOB_DIR}/node_1/node.log")
  cmd=${line#*alone, after the job: }
  cmd=${cmd%)}
  assert_equal "${cmd}" "${REPO_ROOT}/bin/sm-node --from-job ${JOB_DIR} --rank 1 --stage image"
  "${REPO_ROOT}/tests/cluster/exec" node2 docker image rm -f toy/model:local >/dev/null
  run "${REPO_ROOT}/tests/cluster/exec" node2 runuser -u "${E2E_USER}" -- bash -c "cd /tmp && ${cmd}"
  printf '    rerun: %s\n' "${lines[@]}" >&3
  assert_success
  assert_output --partial "stage image (this re-run of job ${JOB_ID} rank 1)"
  assert_output --regexp "loaded toy/model:local from the cache"
  assert_equal "$(e2e::image_id node2)" "$(e2e::image_id node1)"
  # The job's own record is untouched; the re-run's log is beside it.
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/status.json" 'd["status"]')" failed
  assert_file_exists "${JOB_DIR}/node_1/rerun/node.log"
  # The run stage re-runs with the job's rank env and container env; a command after -- replaces
  # the workload (the toy itself would wait for a rank 0 that is gone). Its outputs go to rerun/.
  run "${REPO_ROOT}/tests/cluster/exec" node2 runuser -u "${E2E_USER}" -- bash -c \
    "cd /tmp && ${REPO_ROOT}/bin/sm-node --from-job ${JOB_DIR} --rank 1 --stage run -- sh -c 'echo \"rank \$RANK of \$WORLD_SIZE, mode \$TOY_MODE\"; exit 3'"
  assert_failure 3
  assert_output --partial "rank 1 of 2, mode demo"
  assert_file_exists "${JOB_DIR}/node_1/rerun/status.json"
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/rerun/status.json" 'd["exit_code"]')" 3
}
