#!/usr/bin/env bash
# The bench rows of layer-level image distribution (issue 38), on the test cluster: a rebuilt image
# whose one changed 1 MiB layer sits on the ~1.3 GB PyTorch example image, 3 nodes, each against the
# whole-image path (--image-layers off) measured in the same run on the same nodes:
#   - relay, no cache: the image stage (slowest node), and the bytes each worker's link carried
#     against the changed layer's bytes
#   - through the shared cache (--image-transport cache)
#   - a worker that holds only the base (imported on its own): it needs the layers above it
# bench/cluster_bench.sh runs it as its `layers` group; alone:
#   bench/layers_bench.sh --out-dir DIR [--repeats N]
set -Eeuo pipefail
LAYERS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/cluster_bench.sh
source "${LAYERS_ROOT}/bench/cluster_bench.sh" # its helpers (row, wait_job, stage_max, now, ...)

LAYERS_IMAGE=sm/layers:bench
LAYERS_MIB=1

# layers::build WORK NAME: LAYERS_IMAGE on node1: the torch example image plus one layer of
# LAYERS_MIB MiB of fresh random bytes (a rebuilt model: its top layer changed); prints its ID.
layers::build() {
  local ctx=$1/ctx
  mkdir -p "${ctx}"
  head -c "$((LAYERS_MIB << 20))" /dev/urandom >"${ctx}/model.bin"
  printf 'FROM sm/torchrun:local\nCOPY model.bin /model/model.bin\n' >"${ctx}/Dockerfile"
  tar -C "${ctx}" -cf - Dockerfile model.bin |
    "${EXEC}" node1 env DOCKER_BUILDKIT=0 docker build -q -t "${LAYERS_IMAGE}" - 2>/dev/null
}

# layers::drop ID: the workers lose image ID (the rebuilt one): they hold what they held before it.
layers::drop() {
  local node
  for node in node2 node3; do "${EXEC}" "${node}" docker image rm -f "$1" >/dev/null 2>&1 || true; done
}

# layers::forget NODE: NODE holds nothing of the torch image's chain.
layers::forget() {
  local base
  base=$("${EXEC}" node1 docker image inspect -f '{{index .RootFS.Layers 0}}' sm/torchrun:local)
  # shellcheck disable=SC2016 # the node's bash expands them
  "${EXEC}" "$1" bash -c '
    for pass in 1 2 3; do
      for id in $(docker image ls -aq --no-trunc); do
        [[ $(docker image inspect -f "{{index .RootFS.Layers 0}}" "${id}" 2>/dev/null) == "$0" ]] && docker image rm -f "${id}"
      done
    done >/dev/null 2>&1; true' "${base}"
}

# layers::base_only NODE: NODE holds the torch base alone, imported from the cached rootfs tar.
layers::base_only() {
  local base key
  layers::forget "$1"
  base=$("${EXEC}" node1 docker image ls --format '{{.Repository}}:{{.Tag}}' sm/torch-base | head -n 1)
  key=${base#sm/torch-base:}
  "${EXEC}" "$1" docker import - "${base}" <"${SM_TORCH_CACHE:-/var/cache/slurm-multi/torch}/rootfs-${key}.tar" >/dev/null
}

layers::rx() { cat "/sys/class/net/smv-$1/statistics/tx_bytes"; }

# layers::job WORK ARGS...: one 3-node job of LAYERS_IMAGE (no fitness probe: its 16 MiB would be on
# every link); LAYERS_STAGE is then its image stage (slowest node), LAYERS_BYTES the most bytes a
# worker's link carried during it.
layers::job() {
  local work=$1 job dir rx2 rx3
  shift
  rx2=$(layers::rx node2) rx3=$(layers::rx node3)
  job=$(cd "${work}" && sbatch --parsable -N3 -o /dev/null "${ROOT}/sbatch/multi.sbatch" --image "${LAYERS_IMAGE}" \
    --fitness off --out "${work}/out" --collect false "$@" -- true)
  [[ $(wait_job "${job}") == 0 ]] || log::die bench "job ${job} ($*) did not succeed; see ${work}/out" 1
  dir=$(find "${work}/out" -mindepth 2 -maxdepth 2 -name "${job}" | head -n 1)
  LAYERS_STAGE=$(stage_max "${dir}" image)
  rx2=$(($(layers::rx node2) - rx2)) rx3=$(($(layers::rx node3) - rx3))
  LAYERS_BYTES=$((rx2 > rx3 ? rx2 : rx3))
  log::info bench "job ${job} ($*): image stage ${LAYERS_STAGE} s, node2 received ${rx2} bytes, node3 ${rx3}"
}

# layers_rows REPEATS OUT WORK: the three rows, each side in the same run.
layers_rows() {
  local repeats=$1 out=$2 work=$3 i v1 v2 size base_size
  local cache=${work}/cache-layers
  local relay=() relay_whole=() bytes=() layer=() cached=() cached_whole=() base=() base_whole=()
  "${ROOT}/examples/torchrun/build-image" --node node1 >/dev/null
  layers::forget node2
  layers::forget node3
  # Every worker holds the first build (cold, once): from then on a rebuild changes its top layer.
  v1=$(layers::build "${work}")
  layers::job "${work}"
  rm -rf "${cache}" && mkdir -p "${cache}"
  for ((i = 0; i < repeats; i++)); do
    # The relay, no cache: the rebuilt image, then the same with the whole-image path.
    v2=$(layers::build "${work}")
    layers::job "${work}"
    relay+=("${LAYERS_STAGE}") bytes+=("${LAYERS_BYTES}")
    size=$("${EXEC}" node1 docker image inspect -f '{{.Size}}' "${v2}")
    base_size=$("${EXEC}" node1 docker image inspect -f '{{.Size}}' sm/torchrun:local)
    layer+=("$((size - base_size))")
    layers::drop "${v2}"
    layers::job "${work}" --image-layers off
    relay_whole+=("${LAYERS_STAGE}")
    layers::drop "${v2}"
    # Through the cache: it holds the earlier build's layers (the first round fills it).
    ((i > 0)) || { layers::job "${work}" --image-cache "${cache}" --image-transport cache && layers::drop "${v2}"; }
    v2=$(layers::build "${work}")
    layers::job "${work}" --image-cache "${cache}" --image-transport cache
    cached+=("${LAYERS_STAGE}")
    layers::drop "${v2}"
    layers::job "${work}" --image-cache "${cache}" --image-transport cache --image-layers off
    cached_whole+=("${LAYERS_STAGE}")
    layers::drop "${v2}"
  done
  # A worker that holds only the base: the layers above it move (the example image's and the model's).
  for ((i = 0; i < repeats; i++)); do
    layers::base_only node2
    layers::base_only node3
    layers::job "${work}"
    base+=("${LAYERS_STAGE}")
    layers::base_only node2
    layers::base_only node3
    layers::job "${work}" --image-layers off
    base_whole+=("${LAYERS_STAGE}")
  done
  local what="image stage (slowest node) of a 3-node job of a rebuilt image: one changed ${LAYERS_MIB} MiB layer on the ~1.3 GB torch example image, the workers holding the earlier build"
  row --row "layers: rebuilt image, one changed ${LAYERS_MIB} MiB layer (3 nodes, relay, no cache)" --what "${what}" \
    --baseline "the same job with --image-layers off (the whole image), same run" \
    --samples "$(join "${relay[@]}")" --baseline-samples "$(join "${relay_whole[@]}")" --paired --target "<= 0.1x" \
    --notes "the floor is rank 0's docker save of the whole image: the engine exports every layer before its first byte" \
    --out "${out}/layers-relay-vs-whole.json"
  row --row "layers: bytes on each worker's link vs the changed layer (3 nodes, relay)" \
    --what "the most bytes a worker's link received during that job (the bridge port's counter, everything the node received)" \
    --baseline "the changed layer's bytes (the image's size minus the example image's)" \
    --samples "$(join "${bytes[@]}")" --baseline-samples "$(join "${layer[@]}")" --target "<= 1.1x" \
    --paired --unit bytes --notes "includes the config, the manifest, the barrier and Slurm's own traffic" \
    --out "${out}/layers-bytes-vs-layer.json"
  row --row "layers: rebuilt image through the shared cache (3 nodes)" \
    --what "image stage (slowest node), --image-transport cache: rank 0 stores the new blob and index, each worker reads the layer it lacks" \
    --baseline "the same with --image-layers off: a whole-image tar saved and loaded, same run" \
    --samples "$(join "${cached[@]}")" --baseline-samples "$(join "${cached_whole[@]}")" --paired --target "<= 0.1x" \
    --out "${out}/layers-cache-vs-whole.json"
  row --row "layers: the workers hold only the base (3 nodes, relay)" \
    --what "image stage (slowest node) when each worker holds only the torch base, imported on its own: the layers above it move" \
    --baseline "the same with --image-layers off, same run" \
    --samples "$(join "${base[@]}")" --baseline-samples "$(join "${base_whole[@]}")" --paired \
    --out "${out}/layers-base-only-vs-whole.json"
  layers::forget node2
  layers::forget node3
  "${EXEC}" node1 docker image rm -f "${LAYERS_IMAGE}" "${v1}" >/dev/null 2>&1 || true
}

layers_main() {
  local repeats=3 out=""
  while (($#)); do
    case $1 in
      --repeats) repeats=$2; shift 2 ;;
      --out-dir) out=$2; shift 2 ;;
      -h | --help) echo "Usage: bench/layers_bench.sh --out-dir DIR [--repeats N]"; return 0 ;;
      *) log::error bench "unknown option '$1'"; return 2 ;;
    esac
  done
  [[ -n ${out} ]] || log::die bench "--out-dir is required" 2
  mkdir -p "${out}"
  local work
  work=$(mktemp -d /tmp/sm-bench-layers.XXXXXX)
  chmod a+rwx "${work}"
  # shellcheck disable=SC2064 # expand now: work is local
  trap "rm -rf '${work}'" EXIT
  ensure_nodes 3
  log::info bench "layers: a rebuilt torch image by layers vs whole (${repeats} runs each)"
  layers_rows "${repeats}" "${out}" "${work}"
}

[[ ${BASH_SOURCE[0]} != "$0" ]] || layers_main "$@"
