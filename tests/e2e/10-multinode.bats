#!/usr/bin/env bats
# The madengine seed's core on a real cluster: rank 0's local image reaches every node, the barrier
# holds everyone until it has, the workload runs with the rank env, and every node is staged. The
# tar cache's own paths run with --image-transport cache (a cold run relays by default:
# 12-relay.bats).

load helpers

setup_file() {
  e2e::ensure_cluster
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  mkdir -p "${E2E_CACHE}"
}

setup() {
  e2e::toy_image_only_on node1
}

@test "2 nodes, image only on node1: the worker loads rank 0's tar, the barrier releases, all staged" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-transport cache --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run grep -h 'loaded toy/model:local from the cache' "${JOB_DIR}/node_1/node.log"
  assert_success
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "saved toy/model:local into ${E2E_CACHE}/"
  assert_output --partial "every worker is ready; GO sent"
  assert_output --partial "toy: rank 0 heard from 1 of 1 ranks"
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "toy: rank 1 reached rank 0 at node1:29500"
  assert_output --partial "GO received"
  for r in 0 1; do
    assert_file_exists "${JOB_DIR}/node_${r}/status.json"
    assert_file_exists "${JOB_DIR}/node_${r}/perf_toy.csv"
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"]')" 0
  done
  local id1 id2
  id1=$(e2e::image_id node1) id2=$(e2e::image_id node2)
  assert [ -n "${id1}" ]
  assert_equal "${id2}" "${id1}"
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/status.json" 'd["image_id"]')" "${id1}"
  e2e::assert_dry_run_is_the_job 0 1
}

@test "a second run finds the warm cache: no save, no load, and a faster image stage" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  local cold_dir=${JOB_DIR}
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log" "${JOB_DIR}/node_1/node.log"
  # The worker said it holds rank 0's ID: rank 0 does not even look at the cache.
  assert_output --partial "every worker already holds toy/model:local"
  refute_output --partial "cache hit:"
  assert_output --partial "already present with rank 0's ID"
  refute_output --partial "docker save"
  refute_output --partial "docker load"
}

@test "with a 64 MB image the warm run's image stage is measurably faster than the cold one" {
  # Compared within this test, not against a fixed number: the cold run saves and loads 64 MB.
  "${REPO_ROOT}/examples/toy/build-image" --node node1 --pad-mb 64 >/dev/null
  local node
  for node in node2 node3; do tests/cluster/exec "${node}" docker image rm -f toy/model:local >/dev/null 2>&1 || true; done
  rm -rf "${E2E_CACHE:?}"/*  # (a directory too: the layered entries' blobs)
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  local cold_dir=${JOB_DIR}
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  local total='sum(v["seconds"] for k, v in d["stages"].items() if k == "image")'
  local cold warm
  cold=$(awk '{ s += $1 } END { print s }' <(e2e::json "${cold_dir}/node_0/status.json" "${total}") <(e2e::json "${cold_dir}/node_1/status.json" "${total}"))
  warm=$(awk '{ s += $1 } END { print s }' <(e2e::json "${JOB_DIR}/node_0/status.json" "${total}") <(e2e::json "${JOB_DIR}/node_1/status.json" "${total}"))
  echo "image stage, both nodes: cold ${cold} s, warm ${warm} s" >&3
  "${REPO_ROOT}/examples/toy/build-image" --node node1 >/dev/null
  rm -rf "${E2E_CACHE:?}"/*  # (a directory too: the layered entries' blobs)
  assert awk -v c="${cold}" -v w="${warm}" 'BEGIN { exit !(w < c) }'
}

@test "3 nodes: every worker loads the tar, every rank reaches rank 0, all nodes hold one image ID" {
  rm -rf "${E2E_CACHE:?}"/*  # (a directory too: the layered entries' blobs)
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --image-transport cache --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "toy: rank 0 heard from 2 of 2 ranks"
  for r in 1 2; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "loaded toy/model:local from the cache"
    assert_output --partial "toy: rank ${r} reached rank 0"
  done
  local id1
  id1=$(e2e::image_id node1)
  assert_equal "$(e2e::image_id node2)" "${id1}"
  assert_equal "$(e2e::image_id node3)" "${id1}"
}

@test "a broken Dockerfile on rank 0: workers stop within seconds with rank 0's reason, logs staged" {
  local ctx=${BATS_TEST_TMPDIR}/broken
  mkdir -p "${ctx}"
  printf 'FROM scratch\nCOPY does-not-exist /x\n' >"${ctx}/Dockerfile"
  sed -e "s#\"toy/model:local\"#\"toy/broken:local\"#" \
    -e "s#\"examples/toy/Dockerfile\"#\"${ctx}/Dockerfile\"#g" \
    -e "s#\"dockercontext\": \"examples/toy\"#\"dockercontext\": \"${ctx}\"#" \
    "${TOY_MANIFEST}" >"${ctx}/manifest.json"
  local t0=${SECONDS}
  e2e::run_job -N2 -- --manifest "${ctx}/manifest.json" --image-cache "${E2E_CACHE}" --barrier-timeout 300
  local took=$((SECONDS - t0))
  assert_equal "${JOB_RC}" 1
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "rank 0 aborted: rank 0 (node1): image stage failed"
  assert_file_exists "${JOB_DIR}/node_0/status.json"
  assert_file_exists "${JOB_DIR}/node_1/status.json"
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  # Far below the 300 s barrier timeout: the ABORT reached the worker.
  echo "broken-dockerfile job took ${took} s" >&3
  assert [ "${took}" -lt 120 ]
}

@test "a worker with no cache configured rebuilds the image from the manifest and runs" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-transport cache
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --partial "rebuilding toy/model:local from the manifest"
  assert_output --partial "toy: rank 1 reached rank 0"
  assert [ -n "$(e2e::image_id node2)" ]
}

@test "a stale tar (an older image under the same tag) is detected and replaced" {
  # The whole-image tar's own protocol (--image-layers off); layered entries: 13-layers.bats.
  rm -rf "${E2E_CACHE:?}"/*  # (a directory too: the layered entries' blobs)
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-transport cache --image-cache "${E2E_CACHE}" --image-layers off
  assert_equal "${JOB_RC}" 0
  local old
  old=$(e2e::image_id node1)
  # Same tag, new content, on node1 only.
  "${REPO_ROOT}/examples/toy/build-image" --node node1 --build-arg GREETING=stale-test >/dev/null
  local new
  new=$(e2e::image_id node1)
  assert [ "${new}" != "${old}" ]
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-transport cache --image-cache "${E2E_CACHE}" --image-layers off
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "stale tar in the cache"
  assert_equal "$(grep '^id=' "${E2E_CACHE}"/toy_model_local-*.id)" "id=${new}"
  assert_equal "$(e2e::image_id node2)" "${new}"
  "${REPO_ROOT}/examples/toy/build-image" --node node1 >/dev/null
}

@test "node1 resolving its own name to 127.0.1.1: the barrier binds a routable address and releases" {
  "${REPO_ROOT}/tests/cluster/self-name" node1=loopback
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  "${REPO_ROOT}/tests/cluster/self-name" node1=none
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --regexp "127\.0\.1\.1.*listening on 10\.77\.0\.11"
  assert_output --partial "listening on 10.77.0.11:"
}

@test "a single-node run takes none of the multi-node paths" {
  e2e::run_job -N1 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  run cat "${JOB_DIR}/node_0/node.log"
  refute_output --partial "barrier serve"
  refute_output --partial "docker save"
  assert_output --partial "single node: no barrier"
  assert_output --partial "toy: rank 0/1"
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
}

@test "sbatch's own --ntasks-per-node=2 with --runtime none: job.json, the ranks that ran and collect agree on 4" {
  # shellcheck disable=SC2016 # expanded by each rank's shell
  e2e::run_job -N2 --ntasks-per-node=2 -- --runtime none \
    -- sh -c 'echo "rank ${RANK} of ${WORLD_SIZE}"; echo "performance: 1.5 samples_per_second"'
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/job.json" 'd["tasks_per_node"]')" 2
  run grep -h -o '^rank [0-9] of [0-9]' "${JOB_DIR}"/node_*/node.log
  assert_equal "$(printf '%s\n' "${lines[@]}" | sort | paste -sd,)" "rank 0 of 4,rank 1 of 4,rank 2 of 4,rank 3 of 4"
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'len(d["nodes"]), d["verdict"]')" "(4, 'SUCCESS')"
  e2e::assert_dry_run_is_the_job 0 1
}

@test "the batch script run twice in one allocation: the second run starts clean, the first one's files are kept in run_1/" {
  # salloc (or a batch script of one's own), then sbatch/multi.sbatch twice: one job id, one job dir.
  # Before, the second run appended to every events.log: its timeline and `time:` held both runs.
  local out=${BATS_FILE_TMPDIR}/out-twice script=${BATS_FILE_TMPDIR}/twice.sh
  mkdir -p "${out}"
  cat >"${script}" <<SCRIPT
#!/bin/bash
set -e
for run in 1 2; do
  bash "${REPO_ROOT}/sbatch/multi.sbatch" --out "${out}" --runtime none -- sh -c 'echo "performance: 1.5 samples_per_second"'
done
SCRIPT
  cd "${BATS_FILE_TMPDIR}"
  e2e::sbatch_wait -N2 -o "${BATS_FILE_TMPDIR}/twice-%j.out" "${script}"
  assert_equal "${JOB_RC}" 0
  local dir
  dir=$(find "${out}" -mindepth 2 -maxdepth 2 -type d -name "${JOB_ID}")
  local runs='[sum(1 for s in n["stages"] if s["stage"] == "run") for n in d["nodes"]]'
  assert_equal "$(e2e::json "${dir}/timeline.json" "${runs}")" "[1, 1]"
  assert_equal "$(e2e::json "${dir}/run_1/timeline.json" "${runs}")" "[1, 1]"
  assert_equal "$(e2e::json "${dir}/run_1/summary.json" 'd["verdict"]')" SUCCESS
  assert_equal "$(e2e::json "${dir}/summary.json" 'd["verdict"]')" SUCCESS
  run grep -c "moved to ${dir}/run_1/" "${dir}/batch.log"
  assert_output 1
  refute [ -e "${dir}/run_2" ]
}
