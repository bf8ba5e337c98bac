#!/usr/bin/env bats
# --profile nsys with the docker runtime on the real cluster: the fake nsys (tests/fakes/nsys) is
# mounted into the toy container with --nsys-host-path and writes its report only when the session
# ends, growing it over NSYS_FAKE_WRITE_SECONDS -- like the real tool. Every rank's report must be
# there, complete and settled, also when the job is scancelled mid-run.

load helpers

setup_file() {
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  mkdir -p "${E2E_CACHE}"
  e2e::nsys_manifest
}

setup() {
  e2e::wait_for_nodes --docker node1 node2
}

# nsys_job_args: the options every job here uses (the fake nsys, short flush values: E2E_NSYS_ARGS).
nsys_job_args() {
  printf '%s\0' --manifest "${NSYS_MANIFEST}" --image-cache "${E2E_CACHE}" "${E2E_NSYS_ARGS[@]}" \
    --profile-start-iter 5 --profile-stop-iter 15 --stop-grace 20
}

# node_of RANK: the node a rank ran on (its status.json).
node_of() { e2e::json "${JOB_DIR}/node_$1/status.json" 'd["node"]'; }

@test "nsys, 2 nodes: one complete, settled report per rank, named per rank, in the job dir" {
  local args=()
  mapfile -d '' args < <(nsys_job_args)
  e2e::run_job -N2 -- "${args[@]}"
  [[ ${JOB_RC} == 0 ]] || tail -n 60 "${JOB_DIR}/batch.log" # shown when the test fails
  assert_equal "${JOB_RC}" 0
  run ls "${JOB_DIR}/profile"
  assert_equal "${#lines[@]}" 2
  local r node
  for r in 0 1; do
    node=$(node_of "${r}")
    e2e::assert_complete_report "${JOB_DIR}/profile/${JOB_ID}_${node}_rank${r}.nsys-rep"
    run cat "${JOB_DIR}/node_${r}/node.log"
    # nsys ran inside the container, with the rank env and the profile window.
    assert_output --regexp "docker run .* -v ${JOB_DIR}/profile:${JOB_DIR}/profile .*-e TLLM_PROFILE_START_STOP .*toy/model:local sh -c .* sm-model /opt/slurm-multi/bin/nsys profile -t cuda-sw,nvtx,python-gil .* -o '${JOB_DIR}/profile/%q\\{SLURM_JOB_ID\\}_%q\\{SLURMD_NODENAME\\}_rank%q\\{SLURM_PROCID\\}' bash run.sh"
    assert_output --partial "Generated:"
    assert_output --partial "nsys report of rank ${r} settled"
  done
  run find "${JOB_DIR}" -name '*.qdstrm'
  assert_output ""
  run cat "${JOB_DIR}/batch.log"
  assert_output --partial "profile: flush: 2 report(s) settled in ${JOB_DIR}/profile"
  # The verdict knows the reports: both there, settled, their bytes counted.
  run cat "${JOB_OUT}"
  assert_output --regexp "profile: 2 of 2 reports \([0-9.]+ kB\)"
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" '[r["settled"] for r in d["profile"]["ranks"]]')" "[True, True]"
  # Each rank's wait for its report is on its timeline, inside the run stage.
  run awk '$2 ~ /^profile_flush_/ { print $2 }' "${JOB_DIR}/node_1/events.log"
  assert_output "$(printf '%s\n' profile_flush_start profile_flush_end)"
  run e2e::json "${JOB_DIR}/timeline.json" '[s["step"] for s in d["nodes"][1]["steps"]]'
  assert_output --partial "'profile_flush'"
  # The dry run showed this argv, profile mount and worker env included.
  e2e::assert_dry_run_is_the_job 0 1
}

@test "nsys, scancelled mid-run: every rank's report is complete, flushed before the steps were killed" {
  local args=() r node
  mapfile -d '' args < <(nsys_job_args)
  e2e::submit_job -N2 -- "${args[@]}" -- sh run.sh --steps 400
  JOB_DIR=${BATS_FILE_TMPDIR}/out/toy_model/${JOB_ID}
  # Cancelled once both ranks are training under nsys (the toy logs every 5th of its 400 steps).
  e2e::cancel_when 120 120 e2e::ranks_say 'step 30/400' 0 1
  assert_file_exists "${JOB_DIR}/summary.json"
  for r in 0 1; do
    node=$(node_of "${r}")
    e2e::assert_complete_report "${JOB_DIR}/profile/${JOB_ID}_${node}_rank${r}.nsys-rep"
    # The task outlived its own report's settling and staged: it was not SIGKILLed.
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"]')" 143
    run grep -n -e "nsys report of rank ${r} settled" -e 'node: done: exit 143' "${JOB_DIR}/node_${r}/node.log"
    assert_line --index 0 --partial "nsys report of rank ${r} settled"
    assert_line --index 1 --partial 'node: done: exit 143'
    run grep -c 'step 400/400' "${JOB_DIR}/node_${r}/node.log"
    assert_output 0
  done
  run find "${JOB_DIR}" -name '*.qdstrm'
  assert_output ""
  # The batch step's flush waited for both reports BEFORE its teardown signalled the step (when
  # the step had not ended by itself by then).
  run grep -e 'profile: flush: 2 report(s) settled' -e 'multi: + scancel --signal=TERM' "${JOB_DIR}/batch.log"
  assert_line --index 0 --partial 'profile: flush: 2 report(s) settled'
}

@test "nsys, rank 1's report stays empty: the job FAILS naming it, rows still written; --profile-optional true lets it pass" {
  local manifest=${BATS_FILE_TMPDIR}/nsys_fail_manifest.json args=()
  "${SM_PYTHON}" - "${NSYS_MANIFEST}" "${manifest}" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["context"]["docker_env_vars"]["NSYS_FAKE_FAIL_RANKS"] = "1"
json.dump(m, open(sys.argv[2], "w"), indent=2)
PY
  mapfile -d '' args < <(nsys_job_args)
  args=("${args[@]/#${NSYS_MANIFEST}/${manifest}}")
  e2e::run_job -N2 -- "${args[@]}" --flush-timeout-seconds 10
  assert_equal "${JOB_RC}" 1
  local node1
  node1=$(node_of 1)
  assert_file_exists "${JOB_DIR}/profile/${JOB_ID}_${node1}_rank1.nsys-rep"
  assert_equal "$(stat -c %s "${JOB_DIR}/profile/${JOB_ID}_${node1}_rank1.nsys-rep")" 0
  run cat "${JOB_OUT}"
  assert_output --partial "profile: INCOMPLETE, 1 of 2: ${node1} (rank 1): empty report (0 bytes)"
  assert_output --partial "reason: profile incomplete: 1 of 2 reports"
  assert_output --partial "verdict: FAILURE"
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["profile"]["complete"]')" False
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" '[r["settled"] for r in d["profile"]["ranks"]]')" "[True, False]"
  # Every rank ran and was measured: the performance rows are written.
  run e2e::json "${JOB_DIR}/summary.json" 'd["perf_rows"]'
  refute_output 0
  run grep -c "toy_model" "${JOB_DIR}/perf.csv"
  refute_output 0
  # The same job, the profile declared optional: said, and the verdict is the run's.
  e2e::run_job -N2 -- "${args[@]}" --flush-timeout-seconds 10 --profile-optional true
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_OUT}"
  assert_output --partial "profile: INCOMPLETE, 1 of 2: $(node_of 1) (rank 1): empty report (0 bytes) (--profile-optional: the verdict stands)"
  assert_output --partial "verdict: SUCCESS"
}
