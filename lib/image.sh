# shellcheck shell=bash
# The image stage: make the same image (by ID) present on every node.
# Shared tar cache layout, for image IMAGE with key K = sanitised IMAGE (the entry protocol, lock,
# temp file, rename, sidecar, is lib/cache.sh's, the same for the tar and pyxis' squashfs):
#   <cache>/K.tar   written as a sibling temp file, then renamed (a reader never sees half a tar)
#   <cache>/K.id    sidecar written after the rename: id=, image=, fingerprint=, bytes=, cksum=
#                   (bytes and the POSIX cksum CRC are taken while the tar is written, no second
#                   pass; a reader checks the size, which is free: a tar that does not match is
#                   never a hit. cksum, not sha256: it guards against accidents, not tampering,
#                   and costs a tenth: 0.15 s on a 200 MB save here, sha256 0.46 s)
#   <cache>/.K.lock flock: writers exclusive, readers shared, so concurrent jobs cannot corrupt it
# A layered entry instead of the tar (rank 0's engine can say its image's layers and load a partial
# image: the classic image store), written and read by `slurm-multi layers` (slurm_multi.layers.store)
# under the same protocol, the tar's still read:
#   <cache>/K.layers    the image's index: docker save's tar without its layers' bytes (JSON)
#   <cache>/K.layers.id its sidecar, as the tar's plus layers= and blob_bytes=
#   <cache>/blobs/sha256/<diff id>   each layer's blob once, shared by every image that has it

# Events on the node's timeline (lib/timeline.sh) and the cache protocol (lib/cache.sh), also where
# this file is sourced alone.
# shellcheck source=lib/timeline.sh
declare -F timeline::event >/dev/null || source "$(dirname "${BASH_SOURCE[0]}")/timeline.sh"
# shellcheck source=lib/cache.sh
declare -F cache::begin >/dev/null || source "$(dirname "${BASH_SOURCE[0]}")/cache.sh"

FINGERPRINT_LABEL=org.slurm-multi.fingerprint

image::local_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null; }

# image::held: the engine's ID and fingerprint label of SM_IMAGE on this node, in IMAGE_HELD_ID and
# IMAGE_HELD_LABEL ("" when absent). Prepare asked the engine's socket already (IMAGE_LOCAL_*): an
# image it found serves the first call (a warm start pays for no docker CLI); a later call, or one
# after prepare found none (another job may have loaded it since), asks the engine, one inspect
# for both.
image::held() {
  if [[ ${IMAGE_LOCAL_ASKED:-0} == 1 && -n ${IMAGE_LOCAL_ID:-} ]]; then
    IMAGE_HELD_ID=${IMAGE_LOCAL_ID} IMAGE_HELD_LABEL=${IMAGE_LOCAL_LABEL:-}
    IMAGE_LOCAL_ASKED=0 # what the engine held then: a second call asks again
    return 0
  fi
  local both
  both=$(docker image inspect -f "{{.Id}} {{with .Config.Labels}}{{index . \"${FINGERPRINT_LABEL}\"}}{{end}}" "${SM_IMAGE}" 2>/dev/null || true)
  IMAGE_HELD_ID=${both%% *} IMAGE_HELD_LABEL=${both#* }
  [[ ${IMAGE_HELD_LABEL} != "<no value>" && ${IMAGE_HELD_LABEL} != "${both}" ]] || IMAGE_HELD_LABEL=""
}

image::label() {
  docker image inspect -f "{{ index .Config.Labels \"${2}\" }}" "$1" 2>/dev/null | sed 's/^<no value>$//'
}

# image::cache_key REF: the cache entry's name for REF: REF with every byte outside [A-Za-z0-9._-]
# made `_`, then the first 8 hex digits of REF's sha256. One process (sha256sum), not five, and
# once per shell (image::key_into): every node asks for it before its prepare and again after.
image::cache_key() { image::key_into "$1" && printf '%s' "${IMAGE_KEY}"; }

# image::key_into REF: image::cache_key REF into IMAGE_KEY, without a process when this shell worked
# out REF's before (a node asks for its image's in the fitness check, the barrier and the image stage).
IMAGE_KEY='' IMAGE_KEY_REF='' # (a key is never "": it ends in -<8 hex>)
image::key_into() {
  local ref=$1 sum LC_ALL=C # byte by byte, as tr does: a multibyte character is several `_`
  if [[ -n ${IMAGE_KEY} && ${IMAGE_KEY_REF} == "${ref}" ]]; then return 0; fi
  # The job's image's key, which the batch step worked out (job::run) and every task inherits.
  if [[ -n ${SM_JOB_IMAGE_KEY:-} && ${ref} == "${JOB_IMAGE:-}" && ${SM_JOB_IMAGE_KEY} == "${ref//[^A-Za-z0-9._-]/_}-"???????? ]]; then
    IMAGE_KEY=${SM_JOB_IMAGE_KEY} IMAGE_KEY_REF=${ref}
    return 0
  fi
  sum=$(printf '%s' "${ref}" | sha256sum)
  IMAGE_KEY="${ref//[^A-Za-z0-9._-]/_}-${sum:0:8}" IMAGE_KEY_REF=${ref}
}

# image::cache_entry BASE WANT_ID: the cache entry of key BASE (<cache>/<key>) that holds WANT_ID (any
# image when empty), whole as its sidecar describes it, into IMAGE_CACHE_ENTRY: the layered entry
# first (not with --image-layers off: then only whole images move), then the whole-image tar. Fails
# when neither does.
image::cache_entry() {
  local entry kinds=(layers tar)
  IMAGE_CACHE_ENTRY=
  [[ ${SM_IMAGE_LAYERS} != off ]] || kinds=(tar)
  for entry in "${kinds[@]/#/$1.}"; do
    if cache::holds "${entry}" "$2"; then
      IMAGE_CACHE_ENTRY=${entry}
      return 0
    fi
  done
  return 1
}

# image::layer_plan ID [HOLDS_FILE]: rank 0's layer plan (slurm_multi.layers.plan) for its image ID,
# from what the workers said in their image READYs (the barrier's holds file; without one, nobody
# holds anything), into ${SM_SCRATCH}/layers.plan, which the relay
# and the cache read. IMAGE_LAYER_MODE is then `layers` (the stream and the cache leave out what is
# held) or `whole` (the engine cannot say or cannot load a partial image: the plan logs why).
image::layer_plan() {
  local id=$1 holds=${2:-} out hosts=() argv
  IMAGE_LAYER_MODE=whole
  if [[ ${SM_IMAGE_LAYERS} == off ]]; then
    log::info image "--image-layers off: the whole image moves"
    return 0
  fi
  slurm::hostnames_into hosts
  # The relay's ranks: one per node, in the job's node order (image::relay_argv).
  argv=(layers plan --image "${SM_IMAGE}" --image-id "${id}" --nnodes "$((${#hosts[@]} ? ${#hosts[@]} : NNODES))"
    --out "${SM_SCRATCH}/layers.plan")
  ((${#hosts[@]} == 0)) || argv+=(--nodes "$(IFS=,; printf '%s' "${hosts[*]}")")
  [[ -z ${holds} || ! -f ${holds} ]] || argv+=(--holds-file "${holds}")
  log::cmd image "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
  if ! out=$(util::sm "${argv[@]}"); then
    log::warn image "no layer plan (see above): the whole image moves"
    return 0
  fi
  IMAGE_LAYER_MODE=${out}
}

# image::fingerprint: what the image would be built from (dockerfile, context files, build args).
# A local image whose label differs was built from something else under a reused tag. The rule is
# slurm_multi.fingerprint's; rank 0's prepare computed it already (IMAGE_FINGERPRINT), a worker
# that rebuilds asks the module.
image::fingerprint() {
  [[ -n ${SM_DOCKERFILE:-} && -f ${SM_DOCKERFILE} ]] || return 0
  if [[ -n ${IMAGE_FINGERPRINT:-} ]]; then
    printf '%s' "${IMAGE_FINGERPRINT}"
    return 0
  fi
  util::sm node fingerprint -- "${SM_DOCKERFILE}" "${SM_DOCKER_CONTEXT:-}" "${SM_BUILD_ARGS[@]+"${SM_BUILD_ARGS[@]}"}"
}

# image::build FINGERPRINT: docker build from the manifest. A build arg under a secret name is passed
# by name (`--build-arg HF_TOKEN`, its value in the build's environment only), so its value is in
# no argv and no log line; the logged command pastes back where that variable is exported.
image::build() {
  local fp=$1 ctx args=() kv name secret=() rc=0
  ctx=${SM_DOCKER_CONTEXT:-$(dirname "${SM_DOCKERFILE}")}
  [[ -d ${ctx} ]] || { log::error image "docker context ${ctx} is not a directory on $(hostname)"; return 1; }
  for kv in "${SM_BUILD_ARGS[@]+"${SM_BUILD_ARGS[@]}"}"; do
    name=${kv%%=*}
    if [[ " ${SM_BUILD_SECRET_NAMES[*]:-} " == *" ${name} "* ]]; then
      args+=(--build-arg "${name}")
      secret+=("${kv}")
    else
      args+=(--build-arg "${kv}")
    fi
  done
  local cmd=(docker build -q -t "${SM_IMAGE}" -f "${SM_DOCKERFILE}" --label "${FINGERPRINT_LABEL}=${fp}" "${args[@]+"${args[@]}"}" "${ctx}")
  log::cmd image "${cmd[@]}"
  (
    for kv in "${secret[@]+"${secret[@]}"}"; do export "${kv?}"; done
    exec "${cmd[@]}" >/dev/null 2>"${SM_SCRATCH}/build.err"
  ) || rc=$?
  grep -vE 'DEPRECATED|legacy builder|buildx|BuildKit|environment-variable|^ *$' "${SM_SCRATCH}/build.err" >&2 || true
  return "${rc}"
}

# image::cache_load CACHE KEY WANT_ID: load the cached image if an entry's sidecar says WANT_ID (any
# image when WANT_ID is empty): the layered entry (this node reads only the layers its engine lacks)
# or the whole-image tar. Prints the loaded ID. Fails if there is no matching entry.
image::cache_load() {
  local cache=$1 key=$2 want=$3 entry t0 loaded rc=0 fields=()
  cache::lock "${cache}/${key}.tar" -s || return 1
  if ! image::cache_entry "${cache}/${key}" "${want}"; then
    for entry in "${cache}/${key}.layers" "${cache}/${key}.tar"; do
      rc=0
      cache::holds "${entry}" "${want}" || rc=$?
      ((rc != 2)) || log::error image "${entry} is not the ${entry##*.} its sidecar describes ($(cache::mismatch "${entry}")); not loading it"
    done
    cache::unlock
    return 1
  fi
  entry=${IMAGE_CACHE_ENTRY}
  t0=$(util::now)
  timeline::event image_load_start
  if [[ ${entry} == *.layers ]]; then
    image::load_layers "${cache}" "${entry}" "${want}" || rc=$?
    fields=("${IMAGE_LOAD_FIELDS[@]}")
  else
    log::cmd image docker load -q -i "${entry}"
    docker load -q -i "${entry}" >/dev/null || rc=$?
    fields=(bytes="$(stat -c %s "${entry}")")
  fi
  if ((rc != 0)); then
    timeline::event image_load_end status=failed
    cache::unlock
    log::error image "docker load of ${entry} failed"
    return 1
  fi
  timeline::event image_load_end "${fields[@]}"
  cache::unlock
  loaded=$(image::local_id "${SM_IMAGE}")
  if [[ ${entry} == *.tar ]]; then entry=$(du -h "${entry}" | cut -f1); else entry="the layers it lacked"; fi
  log::info image "loaded ${SM_IMAGE} from the cache (${entry}, $(util::elapsed "${t0}") s)"
  printf '%s' "${loaded}"
}

# image::load_layers CACHE ENTRY WANT_ID: `docker load` the layered ENTRY, its tar rebuilt from the
# index and the blobs this node's engine lacks (slurm-multi layers cache-tar asks the engine). Its
# counts (read_layers=, read_bytes=, held_layers=, held_bytes=, bytes=) in IMAGE_LOAD_FIELDS.
image::load_layers() {
  local cache=$1 entry=$2 want=$3 stats=${SM_SCRATCH}/cache-tar.stats rc=0
  local argv=(layers cache-tar --cache "${cache}" --index "${entry}" --stats-file "${stats}")
  [[ -z ${want} ]] || argv+=(--image-id "${want}")
  IMAGE_LOAD_FIELDS=()
  # shellcheck disable=SC2016 # the inner bash's arguments
  log::cmd image bash -o pipefail -c '"${@:2}" | docker load -q' load "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
  rm -f "${stats}"
  (
    set -o pipefail
    util::sm "${argv[@]}" | docker load -q >/dev/null
  ) || rc=$?
  [[ ! -s ${stats} ]] || mapfile -t IMAGE_LOAD_FIELDS <"${stats}"
  return "${rc}"
}

# image::cache_save CACHE KEY ID FINGERPRINT: save the image unless the cache already holds ID: as a
# layered entry when rank 0's layer plan allows (image::layer_plan), else as a whole-image tar.
image::cache_save() {
  [[ -n ${IMAGE_LAYER_MODE:-} ]] || image::layer_plan "$3"
  if [[ ${IMAGE_LAYER_MODE} == layers ]]; then
    image::cache_save_layers "$@"
    return $?
  fi
  local cache=$1 key=$2 id=$3 fp=$4 tar t0
  tar=${cache}/${key}.tar
  image::cache_open "${cache}" "${tar}" "${id}" tar || return $(($? == 3 ? 0 : 1))
  t0=$(util::now)
  # To a pipe, not -o: the file grows under our own temp name (whatever a killed save leaves is
  # ours to recognise and remove), and the digest is taken from the same bytes as they pass.
  # shellcheck disable=SC2016 # $1 and $2 are the inner bash's arguments
  local digest err save=(bash -o pipefail -c 'docker save "$1" | tee "$2" | cksum' save "${SM_IMAGE}" "${CACHE_TMP}")
  log::cmd image "${save[@]}"
  timeline::event image_save_start
  if ! digest=$("${save[@]}" 2>"${CACHE_TMP}.err"); then
    timeline::event image_save_end status=failed
    err=$(tail -n 1 "${CACHE_TMP}.err" 2>/dev/null)
    cache::abort
    log::error image "cannot save ${SM_IMAGE} into ${cache}: ${err##*: } (is the disk full? the run goes on without the cache)"
    return 1
  fi
  rm -f "${CACHE_TMP}.err"
  timeline::event image_save_end bytes="$(stat -c %s "${CACHE_TMP}")"
  if ! cache::commit "${id}" "${fp}" "${digest%% *}" saved_by; then
    cache::abort
    log::error image "cannot put the saved tar of ${SM_IMAGE} in place as ${tar} (the run goes on without the cache)"
    return 1
  fi
  cache::end
  log::info image "saved ${SM_IMAGE} into ${tar} ($(($(stat -c %s "${tar}") / 1024 / 1024)) MB, $(util::elapsed "${t0}") s)"
}

# image::cache_open CACHE ENTRY ID KIND: begin writing ENTRY (a `tar` or an `index`) of image ID
# under the cache's lock (lib/cache.sh). 0: write it (CACHE_TMP); 3: the cache already holds ID (the
# lock released, nothing to write); 1: no cache dir or no lock (said).
image::cache_open() {
  local cache=$1 entry=$2 id=$3 kind=$4
  mkdir -p "${cache}" || { log::error image "cannot create the image cache ${cache}"; return 1; }
  cache::begin "${entry}" "${id}" || { log::error image "timed out waiting for the cache lock ${CACHE_LOCK}"; return 1; }
  case ${CACHE_FOUND} in
    hit)
      cache::end
      log::info image "cache hit: ${entry} already holds ${id:7:12}; no save"
      return 3
      ;;
    damaged) log::warn image "${entry} does not match its sidecar ($(cache::mismatch "${entry}")); saving it again" ;;
    stale) log::info image "stale ${kind} in the cache (holds $(cache::get "${entry}" id | cut -c8-19), want ${id:7:12}); replacing it" ;;
  esac
}

# image::cache_save_layers CACHE KEY ID FINGERPRINT: the layered entry <key>.layers (the entry
# protocol of lib/cache.sh): `docker save | slurm-multi layers cache-put` stores the blobs the cache
# lacks and writes the index to the entry's temp file; then rename, sidecar.
image::cache_save_layers() {
  local cache=$1 key=$2 id=$3 fp=$4 entry t0 facts=() rc=0
  entry=${cache}/${key}.layers
  image::cache_open "${cache}" "${entry}" "${id}" index || return $(($? == 3 ? 0 : 1))
  t0=$(util::now)
  local argv=(layers cache-put --cache "${cache}" --index "${CACHE_TMP}" --plan "${SM_SCRATCH}/layers.plan")
  # shellcheck disable=SC2016 # the inner bash's arguments
  log::cmd image bash -o pipefail -c 'docker save "$1" | "${@:2}"' save "${SM_IMAGE}" "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
  timeline::event image_save_start
  (
    set -o pipefail
    docker save "${SM_IMAGE}" | SM_ERROR_FILE=${CACHE_TMP}.err util::sm "${argv[@]}"
  ) || rc=$?
  if ((rc != 0)) || [[ ! -s ${CACHE_TMP} ]]; then
    timeline::event image_save_end status=failed
    local err=''
    [[ ! -s ${CACHE_TMP}.err ]] || err=$(<"${CACHE_TMP}.err")
    cache::abort
    log::error image "cannot save ${SM_IMAGE} into ${cache}: ${err#slurm-multi: } (is the disk full? the run goes on without the cache)"
    return 1
  fi
  [[ ! -s ${CACHE_TMP}.facts ]] || mapfile -t facts <"${CACHE_TMP}.facts"
  rm -f "${CACHE_TMP}.err" "${CACHE_TMP}.facts"
  timeline::event image_save_end "${facts[@]}"
  if ! cache::commit "${id}" "${fp}" "" saved_by "${facts[@]}"; then
    cache::abort
    log::error image "cannot put the index of ${SM_IMAGE} in place as ${entry} (the run goes on without the cache)"
    return 1
  fi
  cache::end
  log::info image "saved ${SM_IMAGE} into ${entry} (its layers in ${cache}/blobs, $(util::elapsed "${t0}") s)"
}

# image::ensure_on_rank0: obtain the image (fresh local, matching tar, rebuild, pull); print its ID.
image::ensure_on_rank0() {
  local fp id label key cache=${SM_IMAGE_CACHE:-}
  fp=$(image::fingerprint)
  image::key_into "${SM_IMAGE}"
  key=${IMAGE_KEY}
  image::held
  id=${IMAGE_HELD_ID} label=${IMAGE_HELD_LABEL}
  if [[ -n ${id} ]]; then
    if [[ -n ${fp} && -n ${label} && ${label} != "${fp}" ]]; then
      log::info image "${SM_IMAGE} is present but was built from another dockerfile/context (tag reused); rebuilding"
      id=
    else
      log::info image "${SM_IMAGE} is present locally (${id:7:12})"
    fi
  fi
  if [[ -z ${id} && -n ${cache} ]]; then
    local tar_fp=''
    ! image::cache_entry "${cache}/${key}" "" || tar_fp=$(cache::get "${IMAGE_CACHE_ENTRY}" fingerprint)
    if [[ -n ${fp} && -n ${tar_fp} && ${tar_fp} != "${fp}" ]]; then
      log::info image "the cached tar was built from another dockerfile/context (stale); not loading it"
    else
      id=$(image::cache_load "${cache}" "${key}" "" || true)
    fi
  fi
  if [[ -z ${id} && -n ${SM_DOCKERFILE:-} ]]; then
    image::build "${fp}" || { log::error image "docker build of ${SM_IMAGE} from ${SM_DOCKERFILE} failed"; return 1; }
    id=$(image::local_id "${SM_IMAGE}")
  fi
  if [[ -z ${id} ]]; then
    # A manifest's registry_image is where the image can be pulled from (madengine pulls it on a
    # compute node); it is tagged as the image the job runs.
    local pull=${SM_REGISTRY_IMAGE:-${SM_IMAGE}}
    log::cmd image docker pull -q "${pull}"
    docker pull -q "${pull}" >/dev/null || {
      log::error image "${SM_IMAGE} is not on $(hostname), not in the cache${cache:+ ${cache}} and cannot be built or pulled${SM_REGISTRY_IMAGE:+ (registry_image ${SM_REGISTRY_IMAGE})}"
      return 1
    }
    if [[ ${pull} != "${SM_IMAGE}" ]]; then
      log::cmd image docker tag "${pull}" "${SM_IMAGE}"
      docker tag "${pull}" "${SM_IMAGE}" || { log::error image "docker tag ${pull} ${SM_IMAGE} failed"; return 1; }
    fi
    id=$(image::local_id "${SM_IMAGE}")
  fi
  if [[ -n ${cache} && ${NNODES:-1} -gt 1 && ${IMAGE_NO_SAVE:-0} != 1 ]]; then
    image::cache_save "${cache}" "${key}" "${id}" "${fp}" || true
  fi
  printf '%s' "${id}"
}

# ---- the relay: the image streamed node to node while rank 0 saves it ----------------------------
# Rank 0 releases `relay+<id>`, then `docker save | tee -p <cache tmp> | slurm-multi relay send`;
# every worker runs `slurm-multi relay recv -- docker load` and forwards the bytes to the next node
# as they arrive (lib/../docs/relay.md). The tar still lands in the cache, atomically, for the next
# job. A worker whose stream fails (short, corrupt, its upstream died) says so and falls back to
# image::ensure_on_worker: the cache tar (it waits for rank 0's lock), else a rebuild.

# image::transport ID: relay or cache, for this multi-node docker run (auto: relay unless the cache
# already holds a matching tar of ID: then workers load it, or already have it, as before).
image::transport() {
  local id=$1 cache=${SM_IMAGE_CACHE:-} key
  case ${SM_IMAGE_TRANSPORT} in cache | relay) printf '%s' "${SM_IMAGE_TRANSPORT}"; return 0 ;; esac
  image::key_into "${SM_IMAGE}"
  key=${IMAGE_KEY}
  if [[ -n ${cache} ]] && image::cache_entry "${cache}/${key}" "${id}"; then
    printf cache
  else
    printf relay
  fi
}

# image::relay_argv send|recv: the relay helper's argv (nodes in rank order, ports from the barrier's
# derivation), into IMAGE_RELAY_ARGV.
image::relay_argv() {
  local nodes
  nodes=$(slurm::hostnames "${SLURM_JOB_NODELIST:-}" | paste -sd, -)
  IMAGE_RELAY_ARGV=(relay "$1" --nodes "${nodes}" --fanout "${SM_RELAY_FANOUT}" --master-port "${MASTER_PORT}"
    --job-id "${SLURM_JOB_ID:-0}" --stats-file "${SM_SCRATCH}/relay.stats")
  [[ $1 == send ]] || IMAGE_RELAY_ARGV+=(--rank "${SM_RANK}")
}

# image::relay_send ID: rank 0 streams its image to every worker, writing the cache tar as it goes.
# A relay that does not reach every node is a warning (those workers fall back); a save that fails
# is rank 0's failure.
image::relay_send() {
  # tar: the cache entry this relay writes as it goes (none: the stream's copy goes to /dev/null).
  # With a layer plan (image::layer_plan) the stream leaves out what the workers hold and the entry
  # is the layered one, which `relay send` writes itself as the tar passes.
  local id=$1 cache=${SM_IMAGE_CACHE:-} tar="" tmp=/dev/null t0 st=() layered=0 kind=tar
  [[ ${IMAGE_LAYER_MODE:-whole} != layers ]] || layered=1 kind=layers
  image::relay_argv send
  if [[ -n ${cache} ]] && mkdir -p "${cache}" 2>/dev/null; then
    tar=${cache}/$(image::cache_key "${SM_IMAGE}").${kind}
    if cache::begin "${tar}"; then
      tmp=${CACHE_TMP}
    else
      log::warn image "timed out waiting for the cache lock ${CACHE_LOCK}; streaming without writing the cache"
      tar=""
    fi
  fi
  if ((layered)); then
    IMAGE_RELAY_ARGV+=(--layer-plan "${SM_SCRATCH}/layers.plan")
    [[ -z ${tar} ]] || IMAGE_RELAY_ARGV+=(--cache-dir "${cache}" --cache-index "${tmp}")
    # shellcheck disable=SC2016 # the inner bash's arguments
    log::cmd image bash -c 'docker save "$1" | "${@:2}"' save "${SM_IMAGE}" "${SM_HOME}/bin/slurm-multi" "${IMAGE_RELAY_ARGV[@]}"
  else
    # shellcheck disable=SC2016 # the inner bash's arguments
    log::cmd image bash -c 'docker save "$1" | tee -p "$2" | "${@:3}"' save "${SM_IMAGE}" "${tmp}" \
      "${SM_HOME}/bin/slurm-multi" "${IMAGE_RELAY_ARGV[@]}"
  fi
  t0=$(util::now)
  timeline::event image_save_start
  timeline::event image_stream_start
  # In the background, watched: a barrier that ends while the stream runs was aborted (a worker
  # failed before it connected), and nobody would ever take the stream.
  rm -f "${SM_SCRATCH}/relay.status"
  (
    trap - ERR
    if ((layered)); then
      docker save "${SM_IMAGE}" | util::sm "${IMAGE_RELAY_ARGV[@]}"
      echo "${PIPESTATUS[0]} 0 ${PIPESTATUS[1]}" >"${SM_SCRATCH}/relay.status"
    else
      docker save "${SM_IMAGE}" | tee -p "${tmp}" | util::sm "${IMAGE_RELAY_ARGV[@]}"
      echo "${PIPESTATUS[*]}" >"${SM_SCRATCH}/relay.status"
    fi
  ) &
  local pid=$! aborted=0
  IMAGE_RELAY_ERROR=
  while kill -0 "${pid}" 2>/dev/null; do
    if [[ -n ${SM_BARRIER_PID:-} ]] && ! kill -0 "${SM_BARRIER_PID}" 2>/dev/null; then
      aborted=1
      IMAGE_RELAY_ERROR="the barrier ended while the image was relayed"
      [[ -s ${SM_SCRATCH}/barrier.error ]] && IMAGE_RELAY_ERROR=$(<"${SM_SCRATCH}/barrier.error") && IMAGE_RELAY_ERROR=${IMAGE_RELAY_ERROR#slurm-multi: }
      log::warn image "${IMAGE_RELAY_ERROR}; stopping the relay"
      run::kill_tree TERM "${pid}"
      break
    fi
    sleep 0.2
  done
  wait "${pid}" 2>/dev/null || true
  read -r -a st <"${SM_SCRATCH}/relay.status" 2>/dev/null || st=(143 143 143)
  if ((aborted)); then
    [[ -z ${tar} ]] || cache::abort
    return 1
  fi
  local bytes
  bytes=$(cut -d' ' -f1 "${SM_SCRATCH}/relay.stats" 2>/dev/null) || bytes=
  timeline::event image_save_end status="$( ((st[0] == 0)) && echo ok || echo failed)"
  timeline::event image_stream_end ${bytes:+bytes="${bytes}"} status="$( ((st[2] == 0)) && echo ok || echo failed)"
  if ((st[0] != 0)); then
    [[ -z ${tar} ]] || cache::abort
    log::error image "docker save of ${SM_IMAGE} failed (exit ${st[0]}) while relaying it"
    return 1
  fi
  if ((st[2] == 0)); then
    log::info image "relayed ${SM_IMAGE} to every node ($(util::elapsed "${t0}") s)"
  else
    log::warn image "the relay did not reach every node (exit ${st[2]}, see above); the workers it missed fall back to ${tar:-a rebuild}"
  fi
  if [[ -n ${tar} ]] && ((layered)); then
    # relay send wrote the blobs and, when all of them were stored, the index.
    local facts=()
    [[ ! -s ${tmp}.facts ]] || mapfile -t facts <"${tmp}.facts"
    rm -f "${tmp}.facts"
    if [[ -s ${tmp} ]] && cache::commit "${id}" "$(image::fingerprint)" "" saved_by "${facts[@]}"; then
      cache::end
      log::info image "saved ${SM_IMAGE} into ${tar} while relaying it (its layers in ${cache}/blobs)"
    else
      cache::abort
      log::warn image "could not write ${tar} while relaying (see the relay's line above; is the disk full?); the next job saves it again"
    fi
  elif [[ -n ${tar} ]]; then
    # tee -p wrote the cache's copy; its cksum is one more read of it, after the stream.
    if ((st[1] == 0)) && [[ -s ${tmp} ]] && cache::commit "${id}" "$(image::fingerprint)" "" saved_by; then
      cache::end
      log::info image "saved ${SM_IMAGE} into ${tar} while relaying it ($(($(stat -c %s "${tar}") / 1024 / 1024)) MB)"
    else
      cache::abort
      log::warn image "could not write ${tar} while relaying (tee exit ${st[1]}; is the disk full?); the next job saves it again"
    fi
  fi
  return 0
}

# image::relay_recv ID: receive rank 0's stream, forward it, load it (or only forward it, when this
# node already has ID). On failure IMAGE_RELAY_ERROR holds the relay's one-line reason.
image::relay_recv() {
  local want=$1 have rc=0 errfile=${SM_SCRATCH}/relay.error bytes='' fields=()
  IMAGE_RELAY_ERROR=
  image::relay_argv recv
  rm -f "${errfile}" "${SM_SCRATCH}/relay.stats"
  have=$(image::local_id "${SM_IMAGE}" || true)
  timeline::event image_stream_start
  if [[ ${have} == "${want}" ]]; then
    log::info image "${SM_IMAGE} already present with rank 0's ID ${want:7:12}: forwarding the stream without loading it"
    log::cmd image "${SM_HOME}/bin/slurm-multi" "${IMAGE_RELAY_ARGV[@]}"
    { SM_ERROR_FILE=${errfile} util::sm "${IMAGE_RELAY_ARGV[@]}" >/dev/null; } || rc=$?
  else
    # The relay runs docker load itself: every frame is checked before docker load reads it, and a
    # stream that fails kills docker load before it could read a clean end (a cut tar never loads).
    log::cmd image "${SM_HOME}/bin/slurm-multi" "${IMAGE_RELAY_ARGV[@]}" -- docker load -q
    timeline::event image_load_start
    { SM_ERROR_FILE=${errfile} util::sm "${IMAGE_RELAY_ARGV[@]}" -- docker load -q >/dev/null; } || rc=$?
    timeline::event image_load_end status="$( ((rc == 0)) && echo ok || echo failed)"
  fi
  image::relay_stats fields
  bytes=${fields[0]:-}
  bytes=${bytes#bytes=}
  timeline::event image_stream_end "${fields[@]}" status="$( ((rc == 0)) && echo ok || echo failed)"
  if ((rc != 0)); then
    [[ -n ${IMAGE_RELAY_ERROR} || ! -s ${errfile} ]] || IMAGE_RELAY_ERROR=$(<"${errfile}")
    IMAGE_RELAY_ERROR=${IMAGE_RELAY_ERROR#slurm-multi: }
    IMAGE_RELAY_ERROR=${IMAGE_RELAY_ERROR:-the relay failed (exit ${rc})}
    # This node's own copy arrived whole and loaded; only a node below it failed (and falls back).
    if [[ $(image::local_id "${SM_IMAGE}" || true) == "${want}" ]]; then
      log::warn image "this node has rank 0's image; below it: ${IMAGE_RELAY_ERROR}"
      return 0
    fi
    return 1
  fi
  have=$(image::local_id "${SM_IMAGE}" || true)
  if [[ ${have} != "${want}" ]]; then
    IMAGE_RELAY_ERROR="after the relay ${SM_IMAGE} here is ${have:7:12}, not rank 0's ${want:7:12}"
    return 1
  fi
  log::info image "received ${SM_IMAGE} ${want:7:12} over the relay${bytes:+ ($((bytes / 1024 / 1024)) MB)}"
}

# image::relay_stats ARRAY: the relay's stats file (`<bytes> <seconds>`, then a layered stream's
# counts in slurm_multi.relay.load.STATS_LAYERS' order) as timeline fields into ARRAY.
image::relay_stats() {
  local -n _image_fields=$1
  local bytes _seconds layers received loaded loaded_bytes held held_bytes
  _image_fields=()
  read -r bytes _seconds layers received loaded loaded_bytes held held_bytes <"${SM_SCRATCH}/relay.stats" 2>/dev/null || return 0
  [[ -n ${bytes} ]] || return 0
  _image_fields=(bytes="${bytes}")
  [[ -n ${held_bytes} ]] || return 0
  _image_fields+=(layers="${layers}" received_layers="${received}" loaded_layers="${loaded}"
    loaded_bytes="${loaded_bytes}" held_layers="${held}" held_bytes="${held_bytes}")
}

# image::ensure_on_worker WANT_ID: make rank 0's image present here; IMAGE_WORKER_ID is then the ID
# this node runs (rank 0's, or a rebuild's own).
image::ensure_on_worker() {
  local want=$1 id key cache=${SM_IMAGE_CACHE:-}
  IMAGE_WORKER_ID=${want}
  image::key_into "${SM_IMAGE}"
  key=${IMAGE_KEY}
  image::held
  id=${IMAGE_HELD_ID}
  if [[ ${id} == "${want}" ]]; then
    log::info image "${SM_IMAGE} already present with rank 0's ID ${want:7:12}; no load"
    return 0
  fi
  [[ -n ${id} ]] && log::info image "local ${SM_IMAGE} is ${id:7:12}, rank 0 has ${want:7:12}"
  if [[ -n ${cache} ]]; then
    id=$(image::cache_load "${cache}" "${key}" "${want}" || true)
    if [[ -n ${id} ]]; then
      [[ ${id} == "${want}" ]] && return 0
      log::error image "loaded ${cache}/${key}.tar but ${SM_IMAGE} is ${id:7:12}, not rank 0's ${want:7:12}"
      return 1
    fi
    log::info image "no tar of ${want:7:12} in ${cache}"
  fi
  if [[ -n ${SM_DOCKERFILE:-} && -f ${SM_DOCKERFILE} ]]; then
    log::info image "rebuilding ${SM_IMAGE} from the manifest (${SM_DOCKERFILE})"
    image::build "$(image::fingerprint)" || { log::error image "rebuild of ${SM_IMAGE} failed"; return 1; }
    IMAGE_WORKER_ID=$(image::local_id "${SM_IMAGE}")
    log::warn image "rebuilt ${SM_IMAGE} is ${IMAGE_WORKER_ID:7:12}, not byte-identical to rank 0's ${want:7:12} (same dockerfile, context and build args)"
    return 0
  fi
  if ! settings::truthy "${SM_LOCAL_IMAGE:-false}"; then
    log::cmd image docker pull -q "${SM_IMAGE}"
    if docker pull -q "${SM_IMAGE}" >/dev/null && [[ $(image::local_id "${SM_IMAGE}") == "${want}" ]]; then
      return 0
    fi
  fi
  log::error image "rank 0 has ${SM_IMAGE} (${want:7:12}) but $(hostname) has no copy, no tar in the cache (${cache:-none configured}) and no dockerfile to rebuild from; set --image-cache to a shared directory"
  return 1
}

# ---- pyxis: a squashfs per image, the counterpart of the tar cache --------------------------------
# The same entry protocol as the tar's (lib/cache.sh):
# <cache>/K.sqsh     `enroot import -o` into a sibling temp file, then renamed
# <cache>/K.sqsh.id  sidecar written after the rename: id= (the docker image ID), image=, fingerprint=,
#                    bytes=, cksum= (of the whole file: a squashfs cut or overwritten in place is
#                    never a hit), made_by=, workdir=; K.sqsh.cmd: the image's ENTRYPOINT + CMD
# <cache>/.K.lock    the same flock as the tar's: one writer, readers shared
# Without --image-cache the squashfs goes to <jobdir>/.sqsh/ (this job only). The barrier releases
# `sqsh:<bytes>:<cksum>`: a worker needs no docker, only the file at that size.

# image::sqsh_path: where this job's squashfs is (SM_IMAGE itself when it names a .sqsh file).
image::sqsh_path() {
  if [[ -n ${SM_CONTAINER_IMAGE:-} ]]; then
    launch::pyxis_image "${SM_CONTAINER_IMAGE}"
  elif image::is_sqsh "${SM_IMAGE}"; then
    printf '%s' "${SM_IMAGE}"
  else
    printf '%s/%s.sqsh' "${SM_IMAGE_CACHE:-${SM_JOBDIR}/.sqsh}" "$(image::cache_key "${SM_IMAGE}")"
  fi
}

image::is_sqsh() { [[ $1 == *.sqsh || $1 == *.squashfs ]]; }

# image::pyxis_given: the image names what pyxis starts as it is (a squashfs file, or with
# --container-image a reference pyxis imports itself); no squashfs is made.
image::pyxis_given() { [[ -n ${SM_CONTAINER_IMAGE:-} ]] || image::is_sqsh "${SM_IMAGE}"; }

# image::sqsh_id FILE: `sqsh:<bytes>:<cksum>` of a squashfs (one read of the file).
image::sqsh_id() {
  local sum
  sum=$(cksum <"$1") || return 1
  printf 'sqsh:%s:%s' "${sum#* }" "${sum%% *}"
}

# image::sqsh_sidecar_ok SQSH ID: the file is the one its sidecar describes (size, then cksum) and,
# when ID is given, of that docker image (cache::holds' status). Prints the sqsh id.
image::sqsh_sidecar_ok() {
  cache::holds "$1" "$2" cksum || return $?
  image::sqsh_recorded "$1"
}

# image::sqsh_recorded SQSH: the sqsh id its sidecar records.
image::sqsh_recorded() { printf 'sqsh:%s:%s' "$(cache::get "$1" bytes)" "$(cache::get "$1" cksum)"; }

# image::sqsh_make SQSH ID FINGERPRINT: `enroot import dockerd://IMAGE` into SQSH unless it already
# holds ID; a stale or corrupt one is replaced. Prints the sqsh id.
image::sqsh_make() {
  local sqsh=$1 id=$2 fp=$3 t0 sid err
  command -v enroot >/dev/null || { log::error image "enroot is not on $(hostname)'s PATH: --runtime pyxis needs enroot (and pyxis) installed on the nodes"; return 1; }
  mkdir -p "${sqsh%/*}" || { log::error image "cannot create the squashfs directory ${sqsh%/*}"; return 1; }
  cache::begin "${sqsh}" "${id}" cksum || { log::error image "timed out waiting for the cache lock ${CACHE_LOCK}"; return 1; }
  case ${CACHE_FOUND} in
    hit)
      cache::end
      log::info image "squashfs cache hit: ${sqsh} holds ${id:7:12}; no import"
      image::sqsh_recorded "${sqsh}"
      return 0
      ;;
    damaged) log::warn image "${sqsh} does not match its sidecar (corrupt or cut: $(cache::mismatch "${sqsh}")); importing it again" ;;
    stale) log::info image "stale squashfs ${sqsh} (holds $(cache::get "${sqsh}" id | cut -c8-19), want ${id:7:12}); replacing it" ;;
  esac
  t0=$(util::now)
  # enroot takes the docker image from this node's engine (DOCKER_HOST, or the default socket).
  log::cmd image enroot import -o "${CACHE_TMP}" "dockerd://${SM_IMAGE}"
  timeline::event image_import_start
  if ! enroot import -o "${CACHE_TMP}" "dockerd://${SM_IMAGE}" >"${CACHE_TMP}.log" 2>&1 || [[ ! -s ${CACHE_TMP} ]]; then
    err=$(grep -v '^\s*$' "${CACHE_TMP}.log" | tail -n 1)
    cache::abort
    log::error image "enroot import of ${SM_IMAGE} failed: ${err:-no output} (is the disk full?)"
    return 1
  fi
  rm -f "${CACHE_TMP}.log"
  timeline::event image_import_end bytes="$(stat -c %s "${CACHE_TMP}")"
  chmod a+r "${CACHE_TMP}"
  sid=$(image::sqsh_id "${CACHE_TMP}")
  local sum=${sid#sqsh:}
  if ! cache::commit "${id}" "${fp}" "${sum#*:}" made_by \
    "workdir=$(docker image inspect -f '{{.Config.WorkingDir}}' "${SM_IMAGE}" 2>/dev/null)"; then
    cache::abort
    log::error image "cannot put the squashfs of ${SM_IMAGE} in place as ${sqsh}"
    return 1
  fi
  # The image's own command (ENTRYPOINT + CMD, one word a line): what docker would run with no
  # command given, and pyxis never runs by itself.
  docker image inspect -f '{{range .Config.Entrypoint}}{{println .}}{{end}}{{range .Config.Cmd}}{{println .}}{{end}}' \
    "${SM_IMAGE}" >"${sqsh}.cmd.tmp.$$" 2>/dev/null && mv -f "${sqsh}.cmd.tmp.$$" "${sqsh}.cmd"
  cache::end
  log::info image "made ${sqsh} from ${SM_IMAGE} ($((${sum%%:*} / 1024 / 1024)) MB, $(util::elapsed "${t0}") s)"
  printf '%s' "${sid}"
}

# image::sqsh_state SQSH: what the dry run says of the squashfs (size only: no read of the file).
image::sqsh_state() {
  local sqsh=$1
  if image::pyxis_given; then
    image::is_sqsh "${sqsh}" || { printf 'a reference: pyxis imports it on every node'; return 0; }
    [[ -r ${sqsh} ]] && printf 'exists, %s bytes, used as given' "$(stat -c %s "${sqsh}")" || printf 'MISSING: --image names a squashfs this host cannot read'
    return 0
  fi
  if cache::holds "${sqsh}"; then
    printf 'exists: %s %s, made by %s; rank 0 checks it against its image' "$(cache::get "${sqsh}" image)" \
      "$(cache::get "${sqsh}" id | cut -c8-19)" "$(cache::get "${sqsh}" made_by)"
  elif [[ -e ${sqsh} ]]; then
    printf 'exists but does not match its sidecar: rank 0 imports it again'
  else
    printf 'missing: rank 0 makes it with enroot import dockerd://%s' "${SM_IMAGE}"
  fi
}

# image::pyxis_rank0: the squashfs every rank starts: the given .sqsh, or rank 0's docker image
# (fresh local, rebuilt, pulled) imported into the cache. Sets IMAGE_SQSH, IMAGE_SQSH_ID, and
# SM_IMAGE_ID (the docker image ID, when there is one).
image::pyxis_rank0() {
  local id="" fp
  IMAGE_SQSH=$(image::sqsh_path)
  if image::pyxis_given && ! image::is_sqsh "${IMAGE_SQSH}"; then
    IMAGE_SQSH_ID=pyxis-reference
    log::info image "--container-image ${IMAGE_SQSH}: pyxis imports it on every node itself (no squashfs cache)"
    return 0
  fi
  if image::pyxis_given; then
    [[ -f ${IMAGE_SQSH} && -r ${IMAGE_SQSH} ]] || { log::error image "${IMAGE_SQSH}: no such squashfs file on $(hostname) (it must be on storage every node sees)"; return 1; }
    IMAGE_SQSH_ID=$(image::sqsh_id "${IMAGE_SQSH}") || return 1
    log::info image "using the squashfs ${IMAGE_SQSH} as given (${IMAGE_SQSH_ID})"
    return 0
  fi
  if ! docker version -f '{{.Server.Version}}' >/dev/null 2>&1; then
    # No docker on rank 0: a verified squashfs of this image is still good; nothing can make one.
    if IMAGE_SQSH_ID=$(image::sqsh_sidecar_ok "${IMAGE_SQSH}" ""); then
      SM_IMAGE_ID=$(cache::get "${IMAGE_SQSH}" id)
      log::warn image "no docker engine on $(hostname): using ${IMAGE_SQSH} (${SM_IMAGE} ${SM_IMAGE_ID:7:12}, made by $(cache::get "${IMAGE_SQSH}" made_by)) without checking it against a local image"
      return 0
    fi
    log::error image "no docker engine on $(hostname) to make a squashfs of ${SM_IMAGE}, and ${IMAGE_SQSH} is missing or does not match its sidecar; give --image /path/to/IMAGE.sqsh, or run rank 0 where docker is"
    return 1
  fi
  fp=$(image::fingerprint)
  # The tar cache is not needed: every node starts from the squashfs.
  id=$(NNODES=1 image::ensure_on_rank0) || return 1
  export SM_IMAGE_ID=${id}
  IMAGE_SQSH_ID=$(image::sqsh_make "${IMAGE_SQSH}" "${id}" "${fp}") || return 1
}

# image::pyxis_worker SQSH_ID: rank 0's squashfs is visible here, at the size it released.
image::pyxis_worker() {
  local want=$1 bytes sqsh
  sqsh=$(image::sqsh_path)
  IMAGE_SQSH=${sqsh}
  IMAGE_SQSH_ID=${want}
  image::pyxis_given && ! image::is_sqsh "${sqsh}" && return 0
  bytes=${want#sqsh:}
  bytes=${bytes%%:*}
  if [[ ! -r ${sqsh} ]]; then
    log::error image "rank 0 made ${sqsh}, but $(hostname) cannot read it: is $(dirname "${sqsh}") on storage every node sees?"
    return 1
  fi
  if [[ -n ${want} && $(stat -c %s "${sqsh}") != "${bytes}" ]]; then
    log::error image "${sqsh} here is $(stat -c %s "${sqsh}") bytes, rank 0 released ${bytes}: the shared storage does not show rank 0's file"
    return 1
  fi
  log::info image "rank 0's squashfs ${sqsh} is here ($(stat -c %s "${sqsh}") bytes)"
}
