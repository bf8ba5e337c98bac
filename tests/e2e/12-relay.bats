#!/usr/bin/env bats
# Image distribution at scale on the real cluster: the cold image streamed node to node while rank 0
# saves it (the relay), with and without the shared cache; a relay node killed mid-stream and a
# corrupted stream each make the nodes behind it fall back, naming the node; every job leaves its
# timeline.

load helpers
bats_require_minimum_version 1.5.0

setup_file() {
  e2e::ensure_cluster
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  # A 48 MB image: long enough a stream for a fault in its middle, short enough for the suite.
  export RELAY_PAD_MB=48
}

setup() {
  e2e::wait_for_nodes --docker node1 node2 node3
  local node
  for node in node2 node3; do
    "${REPO_ROOT}/tests/cluster/exec" "${node}" docker image rm -f toy/model:local >/dev/null 2>&1 || true
  done
  "${REPO_ROOT}/examples/toy/build-image" --node node1 --pad-mb "${RELAY_PAD_MB}" >/dev/null
  rm -rf "${E2E_CACHE}"
}

teardown_file() {
  rm -f "${REPO_ROOT}"/examples/toy/pad/*.bin
}

# assert_timeline N: timeline.json for this job, every node a lane; no timeline.png from the job
# itself (drawing it would hold the allocation after the verdict), but bin/sm-collect draws it.
assert_timeline() {
  assert_file_exists "${JOB_DIR}/timeline.json"
  run e2e::json "${JOB_DIR}/timeline.json" 'len(d["nodes"])'
  assert_output "$1"
  assert_file_not_exists "${JOB_DIR}/timeline.png"
  run grep -F "timeline.png: bin/sm-collect ${JOB_DIR} draws it" "${JOB_OUT}"
  assert_success
  run "${REPO_ROOT}/bin/sm-collect" "${JOB_DIR}"
  assert_success
  run head -c 8 "${JOB_DIR}/timeline.png"  # make setup installs matplotlib (the test extra)
  assert_output --partial PNG
}

@test "relay, 3 nodes, no --image-cache: the image streams node1 -> node2 -> node3, one image ID everywhere" {
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "relaying toy/model:local"
  assert_output --partial "relayed toy/model:local to every node"
  refute_output --partial "into ${E2E_CACHE}"
  local r
  for r in 1 2; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "received toy/model:local"
    assert_output --partial "over the relay"
    refute_output --partial "rebuilding"
  done
  # The chain: node2 forwarded to node3.
  assert_output --regexp "rank 2 of 3: from rank 1 \(node2\)"
  local id1
  id1=$(e2e::image_id node1)
  assert [ -n "${id1}" ]
  assert_equal "$(e2e::image_id node2)" "${id1}"
  assert_equal "$(e2e::image_id node3)" "${id1}"
  # The timeline has the stream and the load inside the image stage.
  # events.log: `T NAME rank=R host=H ...` (lib/timeline.sh); the name is the second field.
  run awk '$2 ~ /^image_/ { print $2 }' "${JOB_DIR}/node_2/events.log"
  assert_line image_stream_start
  assert_line image_load_end
  assert_timeline 3
}

@test "warm without --image-cache: every worker already holds rank 0's image ID, so no byte is saved, streamed or loaded" {
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}"  # cold: the relay puts the image on node2 and node3
  assert_equal "${JOB_RC}" 0
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}"  # warm, still no cache
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "every worker already holds toy/model:local $(e2e::image_id node1 | cut -c8-19): nothing to save, stream or load"
  refute_output --partial "relay"
  refute_output --partial "docker save"
  local r
  for r in 1 2; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "rank ${r} holds toy/model:local"
    assert_output --partial "already present with rank 0's ID"
    refute_output --partial "docker load"
  done
  # Not one image event on any node's timeline: nothing moved.
  run awk '$2 ~ /^image_/ { print FILENAME ": " $2 }' "${JOB_DIR}"/node_*/events.log
  assert_success
  assert_output ""
  # One worker without it: the image moves again (the holder forwards without loading).
  "${REPO_ROOT}/tests/cluster/exec" node3 docker image rm -f toy/model:local >/dev/null
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "1 of 2 worker(s) already hold"
  assert_output --partial "relayed toy/model:local to every node"
  assert_equal "$(e2e::image_id node3)" "$(e2e::image_id node1)"
}

@test "pipelined with the cache: workers load while rank 0 saves, the tar lands in the cache, the re-run is a hit" {
  # The whole image's tar (--image-layers off); the layered entry written while relaying: 13-layers.bats.
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --image-layers off
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "relayed toy/model:local to every node"
  assert_output --partial "saved toy/model:local into ${E2E_CACHE}/"
  assert_output --partial "while relaying it"
  local tar
  tar=$(find "${E2E_CACHE}" -name '*.tar' | head -n 1)
  assert [ -s "${tar}" ]
  assert_equal "$(sed -n 's/^bytes=//p' "${tar%.tar}.id")" "$(stat -c %s "${tar}")"
  assert_equal "$(sed -n 's/^id=//p' "${tar%.tar}.id")" "$(e2e::image_id node1)"
  # Warm: the cache holds it, every node has it: no relay, no save, no load.
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log" "${JOB_DIR}/node_1/node.log" "${JOB_DIR}/node_2/node.log"
  assert_output --partial "every worker already holds toy/model:local"
  refute_output --partial "relay send"
  refute_output --partial "docker load"
  assert_timeline 3
}

@test "an --image-cache that is node-local: the warm run sees it on rank 0 only, says so and relays; forced, it fails naming the node" {
  # Each node its own empty directory under one name (a tmpfs in each node's mount namespace).
  local dir=/var/tmp/sm-e2e-localcache node
  for node in node1 node2; do
    "${REPO_ROOT}/tests/cluster/exec" "${node}" sh -c "mkdir -p ${dir} && mount -t tmpfs -o size=256m,mode=1777 tmpfs ${dir}"
  done
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${dir}"  # cold: rank 0 fills its own
  assert_equal "${JOB_RC}" 0
  "${REPO_ROOT}/tests/cluster/exec" node2 docker image rm -f toy/model:local >/dev/null
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${dir}"
  local ok_rc=${JOB_RC} ok_dir=${JOB_DIR}
  "${REPO_ROOT}/tests/cluster/exec" node2 docker image rm -f toy/model:local >/dev/null
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${dir}" --image-transport cache
  for node in node1 node2; do "${REPO_ROOT}/tests/cluster/exec" "${node}" umount "${dir}"; done
  # Rank 0 saw a warm tar, the worker did not: relayed, never "no tar" on the worker.
  assert_equal "${ok_rc}" 0
  run cat "${ok_dir}/node_0/node.log"
  assert_output --partial "rank 1 (node2) do(es) not see the toy/model:local tar that rank 0 sees (${dir}/"
  assert_output --partial "--image-cache ${dir} must be the same shared directory on every node; relaying the image instead"
  run cat "${ok_dir}/node_1/node.log"
  assert_output --partial "over the relay"
  # Forced to the cache, the job cannot be what it was told: FAILURE naming the node, nothing moved.
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" 'd["verdict"], " | ".join(d["reasons"])'
  assert_output --partial "('FAILURE', "
  assert_output --partial "--image-transport cache: rank 1 (node2) do(es) not see the toy/model:local tar"
  assert_equal "$(e2e::image_id node2)" ""
}

@test "the relay's middle node dies mid-stream: the last node says so, naming node2, and falls back within seconds" {
  local half=$((RELAY_PAD_MB * 1024 * 1024 / 2))
  local t0=${SECONDS}
  e2e::run_job -N3 --export="ALL,SM_RELAY_FAULT=1:die:${half}" -- --manifest "${TOY_MANIFEST}" \
    --image-cache "${E2E_CACHE}"
  local took=$((SECONDS - t0))
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "SM_RELAY_FAULT: dying (SIGKILL)"
  run cat "${JOB_DIR}/node_2/node.log"
  assert_output --regexp "relay: node3 \(rank 2\): stream from rank 1 \(node2\) ended after [0-9.]+ [KMG]?B of an unfinished stream"
  assert_output --partial "falling back to the cache ${E2E_CACHE}"
  assert_output --partial "loaded toy/model:local from the cache"
  # Both fell back to rank 0's tar, which it kept writing; the job itself succeeds.
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::image_id node3)" "$(e2e::image_id node1)"
  assert_equal "$(e2e::image_id node2)" "$(e2e::image_id node1)"
  echo "middle-node-killed job took ${took} s" >&3
  assert [ "${took}" -lt 90 ]
}

@test "a corrupted stream is detected by the node after the bad link, which falls back to a rebuild" {
  local half=$((RELAY_PAD_MB * 1024 * 1024 / 2))
  e2e::run_job -N3 --export="ALL,SM_RELAY_FAULT=1:corrupt:${half}" -- --manifest "${TOY_MANIFEST}"
  run cat "${JOB_DIR}/node_2/node.log"
  assert_output --partial "relay: node3 (rank 2):"
  assert_output --regexp "sha256|digest"
  assert_output --partial "falling back to the cache or a rebuild"
  assert_output --partial "rebuilding toy/model:local from the manifest"
  # node2's own copy was intact: it loaded rank 0's image, and says what failed below it.
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "this node has rank 0's image; below it: relay: node2 (rank 1):"
  refute_output --partial "falling back"
  assert_equal "$(e2e::image_id node2)" "$(e2e::image_id node1)"
  assert_equal "${JOB_RC}" 0
  assert_timeline 3
}

@test "--image-transport cache keeps the save-then-load path; a tree (--relay-fanout 2) feeds both workers from rank 0" {
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --image-transport cache
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "loaded toy/model:local from the cache"
  refute_output --partial "over the relay"
  local node
  for node in node2 node3; do
    "${REPO_ROOT}/tests/cluster/exec" "${node}" docker image rm -f toy/model:local >/dev/null 2>&1 || true
  done
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --relay-fanout 2
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_2/node.log"
  assert_output --regexp "rank 2 of 3: from rank 0 \(node1\)"
  assert_equal "$(e2e::image_id node3)" "$(e2e::image_id node1)"
}

@test "squatters without the token on the barrier's and the relay's first ports: SUCCESS, one image ID, the logs name them" {
  cd "${BATS_FILE_TMPDIR}"
  local job bport rport sq1 sq2 t0
  job=$(sbatch --parsable --hold -N3 -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" --manifest "${TOY_MANIFEST}" --image-transport relay --master-port 29500)
  bport=$(PYTHONPATH=${REPO_ROOT}/py "${SM_PYTHON}" -m slurm_multi barrier port --master-port 29500 --job-id "${job}" | head -1)
  rport=$(PYTHONPATH=${REPO_ROOT}/py "${SM_PYTHON}" -m slurm_multi relay port --rank 1 --master-port 29500 --job-id "${job}" | head -1)
  # Rank 0's barrier candidate on node1, rank 1's relay candidate on node2: taken before the job starts.
  "${REPO_ROOT}/tests/cluster/exec" node1 python3 "${REPO_ROOT}/tests/e2e/data/squat.py" barrier "${bport}" \
    >"${BATS_FILE_TMPDIR}/squat1.out" 2>&1 &
  sq1=$!
  "${REPO_ROOT}/tests/cluster/exec" node2 python3 "${REPO_ROOT}/tests/e2e/data/squat.py" relay "${rport}" \
    >"${BATS_FILE_TMPDIR}/squat2.out" 2>&1 &
  sq2=$!
  local tries=100
  until [[ $(cat "${BATS_FILE_TMPDIR}"/squat[12].out 2>/dev/null | grep -c listening) -eq 2 ]] || ((--tries == 0)); do
    sleep 0.1
  done
  assert [ "${tries}" -gt 0 ]
  t0=${SECONDS}
  scontrol release "${job}"
  e2e::wait_job "${job}"
  echo "# squatted cold 3-node relay job: $((SECONDS - t0)) s" >&3
  pkill -f "tests/e2e/data/squat.py" || true
  wait "${sq1}" "${sq2}" 2>/dev/null || true
  JOB_DIR=${BATS_FILE_TMPDIR}/out/toy_model/${job}
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  assert_equal "$(e2e::image_id node2)" "$(e2e::image_id node1)"
  assert_equal "$(e2e::image_id node3)" "$(e2e::image_id node1)"
  # Each node that met a squatter says so, naming the port and what answered there.
  run cat "${JOB_DIR}/node_2/node.log"
  assert_output --regexp "relay: before our parent at [0-9.]+:[0-9]+: [0-9.]+:${rport} refused us: wrong token"
  run cat "${JOB_DIR}"/node_[12]/node.log
  assert_output --regexp ":${bport} is not our rank 0 \("
  refute_output --partial "falling back"
}
