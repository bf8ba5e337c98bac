#!/usr/bin/env bats
# The PyTorch image under pyxis, beyond the madengine job of 47: a frozen DDP rank in its squashfs
# is caught by the hang watch, and Nsight Cloud for Slurm (the fake wrapper and connector,
# tests/fakes/nsight-slurm-home) profiles pyxis ranks end to end: the connector is a python3 +
# pyzmq program that runs inside the rank's container, which only the torch image can hold.
# The squashfs is 47's (one cache for the run): made once, warm here.

# shellcheck disable=SC2016 # the workloads' single-quoted scripts expand in the container
load helpers
bats_require_minimum_version 1.5.0

TORCH_MANIFEST=${REPO_ROOT}/examples/torchrun/build_manifest.json

setup_file() {
  e2e::ensure_cluster
  # The torch image on node1 (rank 0 makes the squashfs from it, unless 47 left it in the cache).
  "${REPO_ROOT}/examples/torchrun/build-image" --node node1 >/dev/null
  export E2E_CACHE
  E2E_CACHE=$(e2e::torch_cache)
  export E2E_JOB_TIMEOUT=420
  # The wrapper and its coordinator run on the host and need pyzmq: the venv's python3 first on
  # PATH (jobs inherit it). Inside a rank's container that path does not exist: the image's own.
  export PATH="${REPO_ROOT}/.venv/bin:${PATH}"
  export NSIGHT_HOME=${REPO_ROOT}/tests/fakes/nsight-slurm-home
  export NSYS_FAKE_WRITE_SECONDS=1 NSYS_FAKE_CHUNKS=3 NSYS_FAKE_CHUNK_KIB=16
}

setup() {
  e2e::wait_for_nodes node1 node2 node3
  cluster::pyxis_on || fail "pyxis is not on in the test cluster (tests/cluster/status): these tests need it"
}

teardown() {
  # A test that failed mid-job leaves no training job behind for the next one.
  [[ -z ${JOB_ID:-} ]] || scancel "${JOB_ID}" 2>/dev/null || true
}

# rank_pids RANK: the image's python processes (torchrun's agent and its workers) of sm-node rank
# RANK's pyxis step; the host's helpers run the venv's python. The nodes share one process table;
# the step's environment says whose a process is.
rank_pids() {
  local pid
  for pid in $(pgrep -u "${E2E_USER}" -f '^/usr/bin/python3'); do
    tr '\0' '\n' <"/proc/${pid}/environ" 2>/dev/null | grep -qx "SM_RANK=$1" && printf '%s\n' "${pid}"
  done
  return 0
}

@test "pyxis, 3 nodes, DDP in the torch squashfs: one rank frozen (SIGSTOP) is hung, the cause; the others wait on it" {
  local hang=8 grace=3 job dir deadline pids t0 took
  cd "${BATS_FILE_TMPDIR}"
  job=$(sbatch --parsable -N3 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${TORCH_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" \
    --hang-timeout "${hang}" --peer-grace "${grace}" --model-args '--steps 1000000 --log-every 20')
  JOB_ID=${job}
  dir=${BATS_FILE_TMPDIR}/out/torchrun_ddp/${job}
  deadline=$((SECONDS + 180))
  # Training is under way on every node (6 logged steps) before rank 1 is frozen.
  until [[ $(cat "${dir}"/node_*/node.log 2>/dev/null | grep -c ' step ') -ge 6 ]]; do
    ((SECONDS < deadline)) || { tail -n 40 "${BATS_FILE_TMPDIR}/job-${job}.out" >&2; scancel "${job}"; false; }
    sleep 0.5
  done
  pids=$(rank_pids 1)
  # torchrun's agent and its 2 workers, on node2.
  assert_equal "$(wc -l <<<"${pids}")" 3
  # shellcheck disable=SC2086 # one pid per word
  "${REPO_ROOT}/tests/cluster/exec" node2 kill -STOP ${pids}
  t0=${SECONDS}
  e2e::wait_job "${job}"
  took=$((SECONDS - t0))
  echo "# pyxis frozen DDP rank: job over ${took} s after SIGSTOP (hang timeout ${hang} s, peer grace ${grace} s)" >&3
  e2e::json "${dir}/summary.json" '"\n".join("# reason: " + r for r in d["reasons"])' >&3
  # Detection: hang + 1 s poll after the rank's last progress; the others' watches speak as soon as
  # the cause is known (a poll), the cause's stop, the others' stop after the peer grace; then the
  # teardown, which for torch ranks under pyxis (torchrun's shutdown, the steps' end, enroot's
  # unmount) measured 11-13 s in CI: 15 s (the toy image's pyxis test allows 10).
  assert [ "${took}" -le $((hang + 2 * grace + 15)) ]
  run e2e::json "${dir}/summary.json" 'd["verdict"], d["reasons"][0]'
  assert_output --regexp "^\('FAILURE', 'hung: node2 \(rank 1\), no output and no CPU for [0-9]+ s since [0-9:]{8} \(stopped"
  assert_equal "$(e2e::json "${dir}/node_1/hang.json" 'd["role"], d["state"]')" "('cause', 'stopped')"
  run e2e::json "${dir}/summary.json" 'd["reasons"][1]'
  assert_output --regexp "^waiting \(not the cause\): node1 \(rank 0\), node3 \(rank 2\): "
  run e2e::json "${dir}/summary.json" '[(w["node"], w["state"]) for w in d["hang"]["waiters"]]'
  assert_output "[('node1', 'lock-wait'), ('node3', 'lock-wait')]"
  assert_file_exists "${dir}/node_1/diagnostics/hang-processes.txt"
  assert_file_exists "${dir}/node_1/diagnostics/step-state.txt"
  run cat "${dir}/node_1/diagnostics/hang-processes.txt"
  assert_output --partial python3
  # Every rank staged; no step is left, and nothing of rank 1 lingers stopped on node2.
  local r
  for r in 0 1 2; do assert_file_exists "${dir}/node_${r}/status.json"; done
  run squeue -h -s -j "${job}"
  assert_output ""
  assert_equal "$(rank_pids 1)" ""
}

# nsight_pyxis_job [ARGS…] -- CMD…: 2 nodes under pyxis in the torch image, profiled by nsight-slurm;
# the fake nsys is mounted where the wrapper's tool path says (--nsys-host-path).
nsight_pyxis_job() {
  local extra=()
  while (($#)) && [[ $1 != -- ]]; do extra+=("$1"); shift; done
  shift
  e2e::nsight_args /usr/local/bin/nsys --nsys-host-path "${REPO_ROOT}/tests/fakes/nsys" \
    --profile-start-iter 5 --profile-stop-iter 15 "${extra[@]}"
  NSIGHT_ARGS=(--runtime pyxis --image sm/torchrun:local --image-cache "${E2E_CACHE}" "${E2E_NSIGHT_ARGS[@]}" -- "$@")
}

# both_ranks_printed: both ranks run under nsys, in their run stage, and have printed.
both_ranks_printed() {
  e2e::ranks_profiled 2 && [[ $(cat "${JOB_DIR}"/node_*/node.log 2>/dev/null | grep -c ' of 2 on ') == 2 ]]
}

@test "nsight-slurm under pyxis, 2 nodes, scancelled mid-run: the connector runs in each rank's container, every rank's report arrives" {
  nsight_pyxis_job --flush-timeout-seconds 40 -- sh -c 'echo "rank ${RANK} of ${WORLD_SIZE} on $(hostname)"; sleep 60'
  local f r
  e2e::submit_job -N2 -w 'node1,node2' -- "${NSIGHT_ARGS[@]}"
  JOB_DIR=${BATS_FILE_TMPDIR}/out/torchrun_local/${JOB_ID}
  # Cancelled once both ranks run under nsys (their streams open), in their run stage, and have printed.
  e2e::cancel_when 120 90 both_ranks_printed
  assert_file_exists "${JOB_DIR}/summary.json"
  sed -n '/^results:/,/^ *timeline/p' "${JOB_OUT}" | grep -E '^ *(results|profile|rank|[0-9])' | sed 's/^/# /' >&3
  # Both ranks registered with the one coordinator (each from a one-task step: SLURM_PROCID 0 in
  # both; the report names take the rank from SM_RANK). Every report complete.
  run e2e::json "${JOB_DIR}/.nsight-slurm/jobs/${JOB_ID}/sessions.json" 'sorted(s["node"] for s in d["sessions"])'
  assert_output "['node1', 'node2']"
  run ls "${JOB_DIR}/nsight-slurm-direct"
  assert_output "$(printf '%s\n' "${JOB_ID}_node1_rank0.nsys-rep" "${JOB_ID}_node2_rank1.nsys-rep")"
  for f in "${JOB_DIR}"/nsight-slurm-direct/*; do
    assert_equal "$(stat -c %s "${f}")" "$(($(head -n 1 "${f}" | wc -c) + 3 * 16 * 1024))"
  done
  # The connector ran in the rank's container: the image's python3 and Debian's pyzmq, not the
  # venv's python first on the host's PATH.
  run grep -h 'joined tcp://' "${JOB_DIR}"/node_*/node.log
  assert_equal "${#lines[@]}" 2
  refute_output --partial "${REPO_ROOT}/.venv"
  assert_line --regexp "rank 0 on node1 joined tcp://10\.77\.0\.11:[0-9]+ \(python /usr/bin/python3, pyzmq 24\."
  assert_line --regexp "rank 0 on node2 joined tcp://10\.77\.0\.11:[0-9]+ \(python /usr/bin/python3, pyzmq 24\."
  # Its mounts ride in our one --container-mounts (pyxis honours only the last).
  for r in 0 1; do
    run grep -c -- '--container-mounts=' "${JOB_DIR}/node_${r}/node.log"
    assert_output 1
    run grep -o -- "--container-mounts=[^ ]*" "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "${NSIGHT_HOME}:${NSIGHT_HOME}:ro"
    assert_output --partial "${NSIGHT_HOME}/bin/nsight-slurm-connector:/usr/local/bin/nsight-slurm-connector:ro"
    assert_output --partial "${REPO_ROOT}/tests/fakes/nsys:/usr/local/bin/nsys:ro"
    assert_output --partial "${JOB_DIR}:${JOB_DIR}"
    run grep "rank ${r} of 2 on" "${JOB_DIR}/node_${r}/node.log"
    assert_success
    # Stopped by the cancel (SIGTERM through the connector and nsys), staged, not SIGKILLed.
    run e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"] != 0 and d["exit_code"] != 137'
    assert_output True
  done
  # The verdict knows the reports.
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["profile"]["complete"], len(d["profile"]["ranks"])')" "(True, 2)"
  run grep -E '^ *profile: 2 of 2 reports' "${JOB_OUT}"
  assert_success
  e2e::assert_dry_run_is_the_job 0 1
}
