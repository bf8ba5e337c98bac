#!/usr/bin/env bats
# --runtime pyxis on the real cluster, with enroot and pyxis built from ../shared/vendor: rank 0 makes
# one squashfs of its docker image in the shared cache, every rank starts it with
# srun --container-image, and every rank is staged and judged like a docker rank.

# shellcheck disable=SC2016 # the workloads' single-quoted scripts expand in the container
load helpers
bats_require_minimum_version 1.5.0

setup_file() {
  e2e::ensure_cluster
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  mkdir -p "${E2E_CACHE}"
}

setup() {
  e2e::wait_for_nodes node1 node2 node3
  # Not a skip: a cluster without pyxis fails every test here (tests/cluster/up builds it).
  cluster::pyxis_on || fail "pyxis is not on in the test cluster (tests/cluster/status): these tests need it"
  e2e::toy_image_only_on node1
}

# sqsh: the squashfs rank 0 makes of the toy image in the cache.
sqsh() { printf '%s/toy_model_local-%s.sqsh' "${E2E_CACHE}" "$(printf %s toy/model:local | sha256sum | cut -c1-8)"; }

# staged JOBDIR RANK...: each rank has status.json with every stage, its log and its CSV.
staged() {
  local dir=$1 r
  shift
  for r in "$@"; do
    assert_file_exists "${dir}/node_${r}/status.json"
    assert_file_exists "${dir}/node_${r}/node.log"
    assert_equal "$(e2e::json "${dir}/node_${r}/status.json" '",".join(d["stages"])')" "prepare,fitness,image,barrier,run,save-outputs"
  done
}

@test "pyxis, 2 nodes, toy image on node1 only: one squashfs made by rank 0, both ranks staged, SUCCESS" {
  rm -f "$(sqsh)" "$(sqsh).id"
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["chosen_csv"]')" node_1/perf_toy.csv
  staged "${JOB_DIR}" 0 1
  assert_file_exists "${JOB_DIR}/node_0/perf_toy.csv"
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "+ enroot import -o ${E2E_CACHE}/.toy_model_local-"
  assert_output --partial "made $(sqsh) from toy/model:local"
  assert_output --regexp "srun --job-name=sm-rank0 --overlap --nodes=1 --ntasks=1 --nodelist=node1 .*--container-image=$(sqsh) "
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "rank 0's squashfs $(sqsh) is here"
  assert_output --partial "toy: rank 1/2 node_rank 1 on node2, master node1:29500"
  assert_output --partial "toy: rank 1 reached rank 0 at node1:29500"
  # The worker never needed docker: node2 has no toy image at all.
  assert_equal "$(e2e::image_id node2)" ""
  # The sidecar names the docker image the squashfs was made from, and its size.
  assert_equal "$(sed -n 's/^id=//p' "$(sqsh).id")" "$(e2e::image_id node1)"
  assert_equal "$(sed -n 's/^bytes=//p' "$(sqsh).id")" "$(stat -c %s "$(sqsh)")"
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/status.json" 'd["image_id"]')" "$(e2e::image_id node1)"
  e2e::assert_dry_run_is_the_job 0 1
}

@test "pyxis, 3 nodes, warm: the squashfs is reused as it is, the last rank's CSV is chosen" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  local before
  before=$(stat -c '%i %Y %s' "$(sqsh)")
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  assert_equal "$(stat -c '%i %Y %s' "$(sqsh)")" "${before}"
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "squashfs cache hit: $(sqsh)"
  refute_output --partial "enroot import"
  staged "${JOB_DIR}" 0 1 2
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["chosen_csv"]')" node_2/perf_toy.csv
  run cat "${JOB_DIR}/node_2/node.log"
  assert_output --partial "toy: rank 2/3 node_rank 2 on node3"
}

@test "pyxis: a squashfs corrupted in place (same size) is detected and replaced" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  local size
  size=$(stat -c %s "$(sqsh)")
  printf 'CORRUPT!' | dd of="$(sqsh)" bs=1 seek=$((size / 2)) conv=notrunc status=none
  assert_equal "$(stat -c %s "$(sqsh)")" "${size}"
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "$(sqsh) does not match its sidecar (corrupt or cut"
  assert_output --partial "made $(sqsh) from toy/model:local"
  local sum
  sum=$(cksum <"$(sqsh)")
  assert_equal "$(sed -n 's/^cksum=//p' "$(sqsh).id")" "${sum%% *}"
}

@test "pyxis: one rank exiting non-zero gives FAILURE naming it; the other rank is staged" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" \
    -- sh run.sh --steps 20 --fail-rank 1 --fail-code 7
  assert_equal "${JOB_RC}" 1
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node2 (rank 1)"
  assert_output --partial "exited 7"
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/status.json" 'd["exit_code"]')" 7
  assert_file_exists "${JOB_DIR}/node_1/diagnostics/step-state.txt"
  assert_file_exists "${JOB_DIR}/node_0/status.json"
}

@test "pyxis: scancel mid-run stages every rank, and no container is left on any node" {
  local dir r
  e2e::submit_job -N3 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" \
    -- sh run.sh --steps 400
  JOB_DIR=${BATS_FILE_TMPDIR}/out/toy_model/${JOB_ID}
  dir=${JOB_DIR}
  e2e::cancel_when 120 120 e2e::ranks_say 'step 10/400' 0 2
  assert_file_exists "${dir}/summary.json"
  assert_equal "$(e2e::json "${dir}/summary.json" 'd["verdict"]')" FAILURE
  for r in 0 1 2; do
    assert_file_exists "${dir}/node_${r}/status.json"
    assert_equal "$(e2e::json "${dir}/node_${r}/status.json" 'd["exit_code"]')" 143
    run grep -c 'step 400/400' "${dir}/node_${r}/node.log"
    assert_output 0
  done
  # pyxis removed each rank's container (its unpacked filesystem under the enroot data path).
  run find /var/lib/enroot-data -maxdepth 3 -name "pyxis_${JOB_ID}.*"
  assert_output ""
  run squeue -h -j "${JOB_ID}"
  assert_output ""
}

@test "pyxis, 3 nodes: a rank stopped (SIGSTOP) while another prints is hung, the cause; the rank waiting on it is listed" {
  # Rank 0 prints, then waits for a peer that never comes (accept: a socket wait, as a collective);
  # rank 2 prints until it is stopped; rank 1 is SIGSTOPped mid-run on node2, in its pyxis step.
  local hang=8 grace=3 job dir deadline pid='' t0 took
  cd "${BATS_FILE_TMPDIR}"
  job=$(sbatch --parsable -N3 -w node1,node2,node3 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --image toy/model:local --runtime pyxis --image-cache "${E2E_CACHE}" \
    --hang-timeout "${hang}" --peer-grace "${grace}" -- sh -c 'i=0
      while [ "${RANK}" != 0 ] || [ "${i}" -lt 10 ]; do i=$((i + 1)); echo "rank ${RANK} step ${i}"; sleep 0.5; done
      echo "rank 0 waits for its peer"; exec nc -l -p 29777')
  dir=${BATS_FILE_TMPDIR}/out/model_local/${job} # the model dir of --image toy/model:local
  deadline=$((SECONDS + 120))
  until grep -qs 'rank 1 step 4$' "${dir}/node_1/node.log"; do
    ((SECONDS < deadline)) || { cat "${BATS_FILE_TMPDIR}/job-${job}.out" >&2; scancel "${job}"; false; }
    sleep 0.2
  done
  # Rank 1's own shell, in its container on node2 (never the srun that started the step; the nodes
  # share one process table, so its environment says which rank a shell is).
  for pid in $(pgrep -u "${E2E_USER}" -x -f 'sh -c i=0.*'); do
    tr '\0' '\n' <"/proc/${pid}/environ" 2>/dev/null | grep -qx 'RANK=1' && break
    pid=
  done
  assert [ -n "${pid}" ]
  "${REPO_ROOT}/tests/cluster/exec" node2 kill -STOP "${pid}"
  t0=${SECONDS}
  e2e::wait_job "${job}"
  took=$((SECONDS - t0))
  echo "# pyxis stopped rank: job over ${took} s after SIGSTOP (hang timeout ${hang} s, peer grace ${grace} s)" >&3
  # Detection: hang + 1 s poll after its last progress; the cause holds its stop until the waiter's
  # watch has spoken (at most the peer grace); the others stop after the peer grace; teardown.
  assert [ "${took}" -le $((hang + 2 * grace + 10)) ]
  e2e::json "${dir}/summary.json" '"\n".join("# reason: " + r for r in d["reasons"])' >&3
  run e2e::json "${dir}/summary.json" 'd["verdict"], d["reasons"][0]'
  assert_output --regexp "^\('FAILURE', 'hung: node2 \(rank 1\), no output and no CPU for [0-9]+ s since [0-9:]{8} \(stopped"
  assert_equal "$(e2e::json "${dir}/node_1/hang.json" 'd["role"], d["state"]')" "('cause', 'stopped')"
  run e2e::json "${dir}/summary.json" '[(w["node"], w["state"]) for w in d["hang"]["waiters"]]'
  assert_output "[('node1', 'socket-wait')]"
  assert_file_exists "${dir}/node_1/diagnostics/hang-processes.txt"
  assert_file_exists "${dir}/node_1/diagnostics/step-state.txt"
  # Every rank staged; no step of the job is left, nothing stopped lingers on node2.
  local r
  for r in 0 1 2; do assert_file_exists "${dir}/node_${r}/status.json"; done
  run squeue -h -s -j "${job}"
  assert_output ""
  run pgrep -u "${E2E_USER}" -f 'sh -c i=0'
  assert_failure
}

@test "pyxis: a manifest mount and a mount given twice each reach the container once" {
  local data=${BATS_FILE_TMPDIR}/data other=${BATS_FILE_TMPDIR}/other models=${BATS_FILE_TMPDIR}/models
  mkdir -p "${data}" "${other}" "${models}"
  echo from-data >"${data}/a.txt"
  echo from-other >"${other}/a.txt"
  echo from-models >"${models}/b.txt"
  local manifest=${BATS_FILE_TMPDIR}/mounts.json
  # The manifest mounts /models, and its docker options give /data twice (the first one wins).
  "${SM_PYTHON}" - "${TOY_MANIFEST}" "${manifest}" "${models}" "${REPO_ROOT}" "${data}" "${other}" <<'PY'
import json, sys
src, dst, models, repo, data, other = sys.argv[1:]
m = json.load(open(src))
for section in ("built_images", "built_models"):
    for entry in m[section].values():
        entry["dockerfile"] = f"{repo}/examples/toy/Dockerfile"
        if "dockercontext" in entry:
            entry["dockercontext"] = f"{repo}/examples/toy"
        if section == "built_models":
            entry["additional_docker_run_options"] = f"--shm-size 64M -v {data}:/data:ro -v {other}:/data"
m["context"]["docker_mounts"] = {"/models": models}
json.dump(m, open(dst, "w"), indent=2)
PY
  e2e::run_job -N2 -- --manifest "${manifest}" --runtime pyxis --image-cache "${E2E_CACHE}" \
    -- sh -c 'echo "seen: $(cat /data/a.txt) $(cat /models/b.txt) mode=${TOY_MODE}"; sh run.sh --steps 5'
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "seen: from-data from-models mode=demo"
  assert_output --regexp "mounts: dropped -v ${other}:/data \(container path /data already mounted\)"
  # ONE --container-mounts, each destination once.
  run grep -o -- '--container-mounts=[^ ]*' "${JOB_DIR}/node_1/node.log"
  assert_equal "${#lines[@]}" 1
  assert_output --partial "${data}:/data:ro"
  assert_output --partial "${models}:/models"
  refute_output --partial "${other}"
}

@test "pyxis: no docker on any node, a verified squashfs in the cache is enough; --image X.sqsh runs as given" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  # No engine for anyone in the job: rank 0 cannot make a squashfs, only check the cached one.
  e2e::run_job -N2 --export=ALL,DOCKER_HOST=unix:///nonexistent/docker.sock -- --manifest "${TOY_MANIFEST}" \
    --runtime pyxis --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "no docker engine on node1: using $(sqsh)"
  local copy=${BATS_FILE_TMPDIR}/given.sqsh
  cp "$(sqsh)" "${copy}"
  chmod a+r "${copy}"
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image "${copy}" -- sh run.sh --steps 5
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "using the squashfs ${copy} as given"
  assert_output --partial "--container-image=${copy}"
}

@test "pyxis, 2 tasks per node: 4 ranks, each with its own RANK, LOCAL_RANK and SLURM_PROCID, all staged" {
  e2e::run_job -N2 --ntasks-per-node=2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis \
    --image-cache "${E2E_CACHE}" --ntasks-per-node 2 \
    -- sh -c 'echo "ids rank=${RANK} local=${LOCAL_RANK} world=${WORLD_SIZE} procid=${SLURM_PROCID} localid=${SLURM_LOCALID} node=${SLURM_NODEID} ntasks=${SLURM_NTASKS}"; sh run.sh --steps 5'
  assert_equal "${JOB_RC}" 0
  local r
  for r in 0 1 2 3; do
    assert_file_exists "${JOB_DIR}/node_${r}/status.json"
    run grep -h 'ids rank=' "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "ids rank=${r} local=$((r % 2)) world=4 procid=${r} localid=$((r % 2)) node=$((r / 2)) ntasks=4"
  done
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["chosen_csv"]')" node_3/perf_toy.csv
  # The dry run shows ranks, each with its node: rank 1 is node 0's second task, rank 3 node 1's.
  e2e::assert_dry_run_is_the_job 1 3
}

@test "pyxis + nsys, 2 nodes: one complete report per rank, nsys inside the rank's container" {
  e2e::nsys_manifest
  e2e::run_job -N2 -- --manifest "${NSYS_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" "${E2E_NSYS_ARGS[@]}"
  assert_equal "${JOB_RC}" 0
  local r node
  for r in 0 1; do
    node=$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["node"]')
    e2e::assert_complete_report "${JOB_DIR}/profile/${JOB_ID}_${node}_rank${r}.nsys-rep"
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --regexp "--container-mounts=[^ ]*${JOB_DIR}/profile:${JOB_DIR}/profile"
    assert_output --regexp "sm-rank /opt/slurm-multi/bin/nsys profile .* -o '${JOB_DIR}/profile/"
    assert_output --partial "nsys report of rank ${r} settled"
  done
  run find "${JOB_DIR}/profile" -name '*.nsys-rep'
  assert_equal "${#lines[@]}" 2
  e2e::assert_dry_run_is_the_job 0 1
}

@test "pyxis + nsys scancelled mid-run: no report is lost, every rank staged" {
  e2e::nsys_manifest
  local dir r node
  e2e::submit_job -N2 -- --manifest "${NSYS_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" \
    "${E2E_NSYS_ARGS[@]}" -- sh run.sh --steps 400
  JOB_DIR=${BATS_FILE_TMPDIR}/out/toy_model/${JOB_ID}
  dir=${JOB_DIR}
  e2e::cancel_when 120 120 e2e::ranks_say 'step 20/400' 0 1
  assert_file_exists "${dir}/summary.json"
  for r in 0 1; do
    node=$(e2e::json "${dir}/node_${r}/status.json" 'd["node"]')
    e2e::assert_complete_report "${dir}/profile/${JOB_ID}_${node}_rank${r}.nsys-rep"
    assert_equal "$(e2e::json "${dir}/node_${r}/status.json" 'd["exit_code"]')" 143
    run grep -c 'step 400/400' "${dir}/node_${r}/node.log"
    assert_output 0
  done
}

@test "pyxis: a worker's sm-node task killed while its rank runs: reaped, its outputs staged, FAILURE naming it" {
  mkdir -p "${BATS_FILE_TMPDIR}/out"
  cd "${BATS_FILE_TMPDIR}"
  local job pid="" deadline=$((SECONDS + 60))
  job=$(sbatch --parsable -N2 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" \
    -- sh run.sh --steps 100)
  # Wait until rank 1's own step runs, then SIGKILL rank 1's sm-node task.
  while [[ -z ${pid} ]] && ((SECONDS < deadline)); do
    sleep 0.5
    squeue -s -j "${job}" -h -o '%j' 2>/dev/null | grep -qx sm-rank1 || continue
    pid=$(e2e::task_pid "${job}" 1)
  done
  assert [ -n "${pid}" ]
  kill -KILL "${pid}"
  JOB_ID=${job}
  local jobdir=${BATS_FILE_TMPDIR}/out/toy_model/${job}
  e2e::wait_teardown "${job}" "${jobdir}" 180
  assert_equal "$(e2e::json "${jobdir}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::json "${jobdir}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node2 (rank 1)"
  run cat "${jobdir}/node_1/status.json"
  assert_output --partial "died before saving its outputs"
  # What the rank wrote into its output dir was recovered by the reaper.
  assert_file_exists "${jobdir}/node_1/perf_toy.csv"
  assert_file_exists "${jobdir}/node_0/status.json"
}

@test "pyxis: --fitness-cmd runs in the squashfs on every node, as a step of its own; one failing fails the job naming it" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --runtime pyxis --image-cache "${E2E_CACHE}" --quarantine-hours 0 \
    --fitness-cmd 'echo "in the image on $(hostname)"; test -f /sm-model/run.sh || test -e /bin/busybox; [ "$(hostname)" != node2 ]'
  assert_equal "${JOB_RC}" 1
  run cat "${JOB_DIR}/node_0/fitness-cmd.log"
  assert_output --partial "in the image on node1"
  run cat "${JOB_DIR}/node_1/fitness-cmd.log"
  assert_output --partial "in the image on node2"
  run grep -c 'srun --job-name=sm-fitness-cmd' "${JOB_DIR}/node_1/node.log"
  assert_output 1
  run e2e::json "${JOB_DIR}/summary.json" '[(b["node"], b["reason"].startswith("fitness command on node2: exited 1")) for b in d["bad_nodes"]]'
  assert_output "[('node2', True)]"
}
