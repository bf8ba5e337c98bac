#!/usr/bin/env bats
# Faults on a real cluster: a dead docker engine, a dead slurmd, a killed rank 0, a broken cache.
# Each must give a clear FAILURE naming the node, in bounded time, with every survivor staged.

load helpers
bats_require_minimum_version 1.5.0

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
}

teardown() {
  # Whatever a test broke comes back, so the next test (and file) finds a whole cluster: slurmd
  # first (tests/cluster/exec enters a node through its slurmd), then the docker engine.
  local node sock
  for node in node1 node2 node3; do
    cluster::pidfile_alive "$(cluster::node_dir "${node}")/slurmd.pid" || cluster::start_slurmd "${node}"
    sock=unix://$(cluster::node_dir "${node}")/docker.sock
    if ! DOCKER_HOST=${sock} docker version >/dev/null 2>&1; then
      cluster::start_dockerd "${node}"
      cluster::wait_for "${node}'s docker engine" env DOCKER_HOST="${sock}" docker version
    fi
  done
  cluster::wait_for "3 idle nodes" cluster::nodes_idle 3
  "${REPO_ROOT}/tests/cluster/exec" node1 umount "${BATS_FILE_TMPDIR}/tiny-cache" 2>/dev/null || true
}

@test "a worker's docker engine is down at job start: FAILURE naming node2, quickly, node 0 staged" {
  cluster::stop_pidfile "$(cluster::node_dir node2)/dockerd.pid"
  local t0=${SECONDS}
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --barrier-timeout 300
  local took=$((SECONDS - t0))
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node2 (rank 1)"
  assert_output --partial "docker engine not reachable on node2"
  assert_file_exists "${JOB_DIR}/node_0/status.json"
  assert_file_exists "${JOB_DIR}/node_0/node.log"
  run cat "${JOB_DIR}/node_0/node.log"
  # (Said by node2's prepare through the barrier, or by the fitness check: whichever is first.)
  assert_output --regexp "node2 \(rank 1\): (prepare: )?docker engine"
  echo "docker-down job took ${took} s (barrier timeout 300 s)" >&3
  assert [ "${took}" -lt 90 ]
}

@test "rank 0's task killed after GO: FAILURE naming node1, its container reaped and its outputs staged" {
  cd "${BATS_FILE_TMPDIR}"
  local job
  job=$(sbatch --parsable -N2 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" -- sh run.sh --steps 100)
  local pid="" deadline=$((SECONDS + 60))
  # Wait until rank 0 is running its container, then SIGKILL rank 0's sm-node task.
  while [[ -z ${pid} ]] && ((SECONDS < deadline)); do
    sleep 0.5
    "${REPO_ROOT}/tests/cluster/exec" node1 docker container inspect "sm-${job}-r0" >/dev/null 2>&1 || continue
    pid=$(e2e::task_pid "${job}" 0)
  done
  assert [ -n "${pid}" ]
  kill -KILL "${pid}"
  JOB_ID=${job}
  local t0=${SECONDS} state=""
  while ((SECONDS - t0 < 180)); do
    state=$(scontrol show job -o "${job}" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    [[ ${state} == RUNNING || ${state} == COMPLETING || ${state} == PENDING ]] || break
    sleep 0.5
  done
  local jobdir=${BATS_FILE_TMPDIR}/out/toy_model/${job}
  assert_equal "$(e2e::json "${jobdir}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::json "${jobdir}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node1 (rank 0)"
  # The reaper stopped the orphaned container and staged what rank 0 left.
  run "${REPO_ROOT}/tests/cluster/exec" node1 docker container inspect "sm-${job}-r0"
  assert_failure
  assert_file_exists "${jobdir}/node_0/status.json"
  run cat "${jobdir}/node_0/status.json"
  assert_output --partial "died before saving its outputs"
  assert_file_exists "${jobdir}/node_1/status.json"
  assert_file_exists "${jobdir}/node_1/perf_toy.csv"
  # Nothing of the killed task lingers on the node: its watchdogs notice it is gone (the --timeout
  # watchdog used to sleep out the whole hour).
  local n=0
  while pgrep -f -- "--jobdir ${jobdir}" >/dev/null && ((n++ < 20)); do sleep 0.5; done
  run pgrep -af -- "--jobdir ${jobdir}"
  assert_output ""
}

@test "a worker's slurmd killed mid-job: FAILURE naming node2 within SlurmdTimeout + peer grace + 15 s" {
  cd "${BATS_FILE_TMPDIR}"
  local job slurmd_timeout peer_grace=10
  slurmd_timeout=$(scontrol show config | awk '$1 == "SlurmdTimeout" { print $3 }')
  [[ ${slurmd_timeout} =~ ^[0-9]+$ ]] || fail "cannot read SlurmdTimeout from scontrol show config"
  job=$(sbatch --parsable -N2 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" \
    --peer-grace "${peer_grace}" -- sh run.sh --steps 200)
  local deadline=$((SECONDS + 60))
  until "${REPO_ROOT}/tests/cluster/exec" node2 docker container inspect "sm-${job}-r1" >/dev/null 2>&1 || ((SECONDS > deadline)); do
    sleep 0.5
  done
  # slurmd and the step's processes on node2 die together, as when a node drops. Only node2's:
  # every node's processes are visible from the host, so select them by node2's namespace.
  local p
  for p in $(ip netns pids "$(cluster::netns node2)"); do
    [[ $(tr '\0' ' ' <"/proc/${p}/cmdline" 2>/dev/null) =~ ^(slurmd|slurmstepd|bash\ [^ ]*/bin/sm-node) ]] &&
      kill -KILL "${p}" 2>/dev/null
  done
  # The batch step's watch notices Slurm declaring node2 DOWN (after SlurmdTimeout) and gives the
  # survivors the peer grace; the teardown then records node2's rank as lost instead of waiting.
  local t0=${SECONDS} bound=$((slurmd_timeout + peer_grace + 15))
  local jobdir=${BATS_FILE_TMPDIR}/out/toy_model/${job}
  while [[ ! -f ${jobdir}/summary.json ]] && ((SECONDS - t0 < bound + 60)); do sleep 0.5; done
  echo "slurmd-killed job: summary after $((SECONDS - t0)) s (bound ${bound} s)" >&3
  # When it is late, say why: the batch step's own account of its teardown.
  [[ -f ${jobdir}/summary.json ]] || tail -n 40 "${BATS_FILE_TMPDIR}/job-${job}.out" | cut -c1-240 >&3
  assert [ $((SECONDS - t0)) -le "${bound}" ]
  assert_file_exists "${jobdir}/node_0/status.json"
  assert_file_exists "${jobdir}/summary.json"
  assert_equal "$(e2e::json "${jobdir}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::json "${jobdir}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node2 (rank 1)"
  assert_output --partial "Slurm reports node2 DOWN"
  e2e::wait_teardown "${job}" "${jobdir}" 120
  "${REPO_ROOT}/tests/cluster/exec" node2 docker rm -f "sm-${job}-r1" >/dev/null 2>&1 || true
}

@test "docker save SIGKILLed halfway leaves no tar a reader would accept; the next save cleans up" {
  "${REPO_ROOT}/examples/toy/build-image" --node node1 --pad-mb 96 >/dev/null
  local cache=${BATS_TEST_TMPDIR}/cache
  mkdir -p "${cache}"
  local lib="source ${REPO_ROOT}/lib/log.sh; source ${REPO_ROOT}/lib/util.sh; source ${REPO_ROOT}/lib/settings.sh; source ${REPO_ROOT}/lib/image.sh; settings::resolve_env; SM_IMAGE=toy/model:local SM_IMAGE_LAYERS=off"
  local id key
  id=$(e2e::image_id node1)
  key=$(bash -c "${lib}; image::cache_key toy/model:local")
  "${REPO_ROOT}/tests/cluster/exec" node1 bash -c "${lib}; image::cache_save ${cache} ${key} ${id} fp" &
  local saver=$!
  # Catch `docker save` in the act and freeze it, then SIGKILL it together with the task that ran
  # it (a node task killed mid-save): nothing is left to clean up but the next writer.
  local deadline=$((SECONDS + 30)) pid=""
  until [[ -n ${pid} ]] || ((SECONDS > deadline)); do
    pid=$(pgrep -f "^docker save toy/model:local" | head -n 1 || true)
  done
  assert [ -n "${pid}" ]
  kill -STOP "${pid}"
  pkill -KILL -f "image::cache_save ${cache}" || true
  kill -KILL "${pid}"
  e2e::wait_pid "${saver}" 60 || true
  local tmp
  tmp=$(find "${cache}" -name ".${key}.tar.tmp.*" | head -n 1)
  assert [ -n "${tmp}" ]
  assert_file_not_exists "${cache}/${key}.tar"
  assert_file_not_exists "${cache}/${key}.id"
  run "${REPO_ROOT}/tests/cluster/exec" node2 bash -c "${lib}; image::cache_load ${cache} ${key} ${id}"
  assert_failure
  # The next writer removes the dead writer's temp file and saves a whole tar.
  run "${REPO_ROOT}/tests/cluster/exec" node1 bash -c "${lib}; image::cache_save ${cache} ${key} ${id} fp"
  assert_success
  assert_equal "$(find "${cache}" -name '.*.tmp.*' | wc -l)" 0
  assert_equal "$(grep '^id=' "${cache}/${key}.id")" "id=${id}"
  "${REPO_ROOT}/examples/toy/build-image" --node node1 >/dev/null
}

@test "two jobs saving the same image at once end with one valid tar" {
  local cache=${BATS_TEST_TMPDIR}/cache
  mkdir -p "${cache}"
  local lib="source ${REPO_ROOT}/lib/log.sh; source ${REPO_ROOT}/lib/util.sh; source ${REPO_ROOT}/lib/settings.sh; source ${REPO_ROOT}/lib/image.sh; settings::resolve_env; SM_IMAGE=toy/model:local SM_IMAGE_LAYERS=off"
  local id key
  e2e::toy_image_only_on node1
  "${REPO_ROOT}/tests/cluster/exec" node2 docker image rm -f toy/model:local >/dev/null 2>&1 || true
  id=$(e2e::image_id node1)
  # The same image on node3 too, so two nodes save it at once.
  docker_save_load() { "${REPO_ROOT}/tests/cluster/exec" node1 docker save toy/model:local | "${REPO_ROOT}/tests/cluster/exec" node3 docker load -q >/dev/null; }
  docker_save_load
  key=$(bash -c "${lib}; image::cache_key toy/model:local")
  "${REPO_ROOT}/tests/cluster/exec" node1 bash -c "${lib}; image::cache_save ${cache} ${key} ${id} fp" 2>"${BATS_TEST_TMPDIR}/a.log" &
  local a=$!
  "${REPO_ROOT}/tests/cluster/exec" node3 bash -c "${lib}; image::cache_save ${cache} ${key} ${id} fp" 2>"${BATS_TEST_TMPDIR}/b.log" &
  local b=$!
  e2e::wait_pid "${a}" 120
  e2e::wait_pid "${b}" 120
  # Exactly one saved; the other found the finished tar under the lock.
  assert_equal "$(cat "${BATS_TEST_TMPDIR}"/{a,b}.log | grep -c 'saved toy/model:local')" 1
  assert_equal "$(cat "${BATS_TEST_TMPDIR}"/{a,b}.log | grep -c 'cache hit')" 1
  run --separate-stderr "${REPO_ROOT}/tests/cluster/exec" node2 bash -c "${lib}; image::cache_load ${cache} ${key} ${id}"
  assert_success
  assert_output "${id}"
  "${REPO_ROOT}/tests/cluster/exec" node3 docker image rm -f toy/model:local >/dev/null 2>&1 || true
}

@test "a full cache disk: a clear error, and the run falls back to rebuilding on the worker" {
  local tiny=${BATS_FILE_TMPDIR}/tiny-cache
  mkdir -p "${tiny}"
  # Mounted inside node1 (rank 0, the writer): nodes have their own mount namespaces.
  "${REPO_ROOT}/tests/cluster/exec" node1 mount -t tmpfs -o size=256k tmpfs "${tiny}"
  e2e::toy_image_only_on node1
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${tiny}" --image-transport cache --image-layers off
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --regexp "cannot save toy/model:local into ${tiny}: .*(is the disk full\?)"
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "rebuilding toy/model:local from the manifest"
  # Relayed (the default for a cold run): the worker needs no tar; rank 0 says it could not write it,
  # and leaves no partial tar behind.
  e2e::toy_image_only_on node1
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${tiny}" --image-layers off
  run "${REPO_ROOT}/tests/cluster/exec" node1 find "${tiny}" -name "*.tar*"
  "${REPO_ROOT}/tests/cluster/exec" node1 umount "${tiny}"
  assert_output ""
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --regexp "could not write ${tiny}/toy_model_local-[0-9a-f]+\.tar while relaying \(tee exit [1-9][0-9]*; is the disk full\?\)"
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "received toy/model:local"
}

@test "secrets in the environment and the manifest never reach the job dir or any log" {
  local secret=hf_e2e_secret_0123456789 mad=mad_e2e_secret_9876543210 barrier=barrier-e2e-secret-value
  local m=${BATS_TEST_TMPDIR}/manifest.json
  sed "s#\"TOY_MODE\": \"demo\"#\"TOY_MODE\": \"demo\", \"MAD_SECRETS_HFTOKEN\": \"${mad}\"#" "${TOY_MANIFEST}" >"${m}"
  # shellcheck disable=SC2016 # expanded inside the container
  HF_TOKEN=${secret} MAD_BARRIER_TOKEN=${barrier} e2e::run_job -N2 -- --manifest "${m}" --image-cache "${E2E_CACHE}" \
    -- sh -c 'echo "token seen: $HF_TOKEN / $MAD_SECRETS_HFTOKEN"; exec sh run.sh --steps 5'
  assert_equal "${JOB_RC}" 0
  # The container did get the values (the workload printed them; the log shows them masked).
  run grep -h 'token seen: \*\*\* / \*\*\*' "${JOB_DIR}/node_0/node.log"
  assert_success
  run grep -rl -e "${secret}" -e "${mad}" -e "${barrier}" "${JOB_DIR}" "${JOB_OUT}" /run/sm-cluster/
  assert_failure
  refute_output
}
