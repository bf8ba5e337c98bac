#!/usr/bin/env bats
# A changed image moves only the layers the workers lack (issue 38): the ~1.3 GB PyTorch image plus
# small layers built on node1, a cold 3-node job, then a rebuild with one more small layer: each
# worker receives a few MB (measured on its link: the bridge port's tx counter, what the node
# received) and runs the new image ID; a worker that holds only the base (imported on its own)
# receives only the layers above it; through the shared cache the cache grows by the new layer only;
# and the whole image still moves when rank 0's engine says nothing useful about layers.

load helpers
bats_require_minimum_version 1.5.0

IMAGE=sm/layers:e2e

setup_file() {
  e2e::ensure_cluster
  e2e::torch_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  export E2E_JOB_TIMEOUT=600
  export LAYERS_CTX=${BATS_FILE_TMPDIR}/ctx
  mkdir -p "${LAYERS_CTX}"
}

# layers::build LAYER...: IMAGE on node1: the torch example image plus one small COPY layer for
# each LAYER (a file of that name holding its name); prints its ID.
layers::build() {
  local layer dockerfile="FROM sm/torchrun:local"$'\n'
  for layer in "$@"; do
    printf '%s\n' "${layer}" >"${LAYERS_CTX}/${layer}"
    dockerfile+="COPY ${layer} /layers/${layer}"$'\n'
  done
  printf '%s' "${dockerfile}" >"${LAYERS_CTX}/Dockerfile"
  tar -C "${LAYERS_CTX}" -cf - Dockerfile "$@" |
    "${REPO_ROOT}/tests/cluster/exec" node1 env DOCKER_BUILDKIT=0 docker build -q -t "${IMAGE}" - 2>/dev/null
}

# layers::forget NODE: NODE holds nothing of the torch image's chain: every image whose bottom layer
# is the torch base's goes (the example image, its base, this file's images, dangling copies).
layers::forget() {
  local base
  base=$("${REPO_ROOT}/tests/cluster/exec" node1 docker image inspect -f '{{index .RootFS.Layers 0}}' sm/torchrun:local)
  # shellcheck disable=SC2016 # the node's bash expands them
  "${REPO_ROOT}/tests/cluster/exec" "$1" bash -c '
    for pass in 1 2 3; do  # a parent goes only after its children
      for id in $(docker image ls -aq --no-trunc); do
        [[ $(docker image inspect -f "{{index .RootFS.Layers 0}}" "${id}" 2>/dev/null) == "$0" ]] && docker image rm -f "${id}"
      done
    done >/dev/null 2>&1; true' "${base}"
}

# layers::rx NODE: the bytes NODE has received on its link so far (the bridge side of its veth:
# what the bridge sent it, counted by the kernel, not by us).
layers::rx() { cat "/sys/class/net/smv-$1/statistics/tx_bytes"; }

# layers::job [SBATCH_ARGS...] [-- MULTI_ARGS...]: a job of IMAGE (no fitness probe: its 16 MiB
# would be on every link), each rank printing a performance line; LAYERS_RX[node] is then what each
# worker's link carried during the job.
layers::job() {
  local node before=() sargs=()
  while (($#)) && [[ $1 != -- ]]; do
    sargs+=("$1")
    shift
  done
  (($#)) && shift
  for node in node2 node3; do before+=("$(layers::rx "${node}")"); done
  e2e::run_job "${sargs[@]}" -- --image "${IMAGE}" --fitness off "$@" -- sh -c 'echo "performance: 1 samples_per_second"'
  declare -gA LAYERS_RX=([node2]=$(($(layers::rx node2) - before[0])) [node3]=$(($(layers::rx node3) - before[1])))
  echo "# job ${JOB_ID}: node2 received ${LAYERS_RX[node2]} bytes, node3 ${LAYERS_RX[node3]} bytes on their links" >&3
}

# layers::moved RANK: what summary.json says the node's image stage moved.
layers::moved() { e2e::json "${JOB_DIR}/summary.json" "d['nodes'][$1]['image']"; }

@test "a rebuilt image moves only its new layer: a cold 3-node job, then a few MB per worker, the new ID everywhere" {
  local v1 v2 node
  v1=$(layers::build v1)
  layers::forget node2
  layers::forget node3
  layers::job -N3
  assert_equal "${JOB_RC}" 0
  for node in node2 node3; do
    assert [ "${LAYERS_RX[${node}]}" -gt 1000000000 ]  # cold: the whole ~1.3 GB image
    assert_equal "$(e2e::image_id "${node}" "${IMAGE}")" "${v1}"
  done
  v2=$(layers::build v1 v2)
  assert [ "${v2}" != "${v1}" ]
  layers::job -N3
  assert_equal "${JOB_RC}" 0
  for node in node2 node3; do
    assert [ "${LAYERS_RX[${node}]}" -lt 8000000 ]  # a few MB: the new layer, the config, the barrier
    assert_equal "$(e2e::image_id "${node}" "${IMAGE}")" "${v2}"
  done
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --regexp "of the image's [0-9]+ layers the workers hold: rank 1 \(node2\) [0-9]+, rank 2 \(node3\) [0-9]+"
  run cat "${JOB_DIR}/node_2/node.log"
  assert_output --regexp "layers: 1 of [0-9]+ layers \([0-9.]+ (kB|bytes)\) loaded, [0-9]+ held \([0-9.]+ GB\)"
  echo "# summary.json, rank 1: $(layers::moved 1)" >&3
  echo "# summary.json, rank 2: $(layers::moved 2)" >&3
  run layers::moved 2
  assert_output --partial "'loaded_layers': 1"
}

@test "a worker that holds only the base, imported on its own, receives only the layers above it" {
  local v2 key base
  v2=$(layers::build v1 v2)
  # node3: nothing of the chain but the base, imported from the same rootfs tar as node1's.
  layers::forget node3
  base=$("${REPO_ROOT}/tests/cluster/exec" node1 docker image ls --format '{{.Repository}}:{{.Tag}}' sm/torch-base | head -n 1)
  key=${base#sm/torch-base:}
  "${REPO_ROOT}/tests/cluster/exec" node3 docker import - "${base}" <"${SM_TORCH_CACHE:-/var/cache/slurm-multi/torch}/rootfs-${key}.tar" >/dev/null
  assert_equal "$("${REPO_ROOT}/tests/cluster/exec" node3 docker image inspect -f '{{index .RootFS.Layers 0}}' "${base}")" \
    "$("${REPO_ROOT}/tests/cluster/exec" node1 docker image inspect -f '{{index .RootFS.Layers 0}}' "${base}")"
  layers::job -N3
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::image_id node3 "${IMAGE}")" "${v2}"
  assert [ "${LAYERS_RX[node3]}" -lt 8000000 ]  # the example image's and this file's small layers
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "rank 2 (node3) 1"
}

@test "through the cache: it grows by the new layer only, and a worker reads only the layer it lacks" {
  local c2 blobs before
  rm -rf "${E2E_CACHE}"
  # An image no worker holds yet: the cache gets every layer once (node2 holds all but its top one).
  layers::build v1 v2 c1 >/dev/null
  layers::job -N2 -- --image-cache "${E2E_CACHE}" --image-transport cache
  assert_equal "${JOB_RC}" 0
  blobs=$(find "${E2E_CACHE}/blobs/sha256" -type f | wc -l)
  before=$(du -sb "${E2E_CACHE}" | cut -f1)
  c2=$(layers::build v1 v2 c1 c2)
  layers::job -N2 -- --image-cache "${E2E_CACHE}" --image-transport cache
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::image_id node2 "${IMAGE}")" "${c2}"
  assert_equal "$(find "${E2E_CACHE}/blobs/sha256" -type f | wc -l)" "$((blobs + 1))"
  assert [ "$(($(du -sb "${E2E_CACHE}" | cut -f1) - before))" -lt 1000000 ]
  run cat "${JOB_DIR}/node_1/node.log"
  assert_output --regexp "read 1 of [0-9]+ layers \([0-9.]+ (kB|bytes)\) from .*; this node holds [0-9]+ \([0-9.]+ GB\)"
  assert_output --partial "loaded ${IMAGE} from the cache"
  assert [ "${LAYERS_RX[node2]}" -lt 8000000 ]  # the cache is on this machine: nothing on the link
}

@test "the whole image still moves when rank 0's engine says nothing useful about layers" {
  local v4
  v4=$(layers::build v1 v2 v4)
  layers::job -N2 --export=ALL,SM_LAYERS_FAULT=blind:0
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::image_id node2 "${IMAGE}")" "${v4}"
  assert [ "${LAYERS_RX[node2]}" -gt 1000000000 ]
  run cat "${JOB_DIR}/node_0/node.log"
  assert_output --partial "the whole image moves: SM_LAYERS_FAULT"
}
