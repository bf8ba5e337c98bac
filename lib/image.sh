# shellcheck shell=bash
# The image stage: make the same image (by ID) present on every node.
# Shared tar cache layout, for image IMAGE with key K = sanitised IMAGE:
#   <cache>/K.tar   written as a sibling temp file, then renamed (a reader never sees half a tar)
#   <cache>/K.id    sidecar written after the rename: id=, image=, fingerprint=, bytes=, cksum=
#                   (bytes and the POSIX cksum CRC are taken while the tar is written, no second
#                   pass; a reader checks the size, which is free: a tar that does not match is
#                   never a hit. cksum, not sha256: it guards against accidents, not tampering,
#                   and costs a tenth: 0.15 s on a 200 MB save here, sha256 0.46 s)
#   <cache>/.K.lock flock: writers exclusive, readers shared, so concurrent jobs cannot corrupt it

FINGERPRINT_LABEL=org.slurm-multi.fingerprint

image::local_id() { docker image inspect -f '{{.Id}}' "$1" 2>/dev/null; }

image::label() {
  docker image inspect -f "{{ index .Config.Labels \"${2}\" }}" "$1" 2>/dev/null | sed 's/^<no value>$//'
}

image::cache_key() {
  local ref=$1 sum
  sum=$(printf '%s' "${ref}" | sha256sum | cut -c1-8)
  printf '%s-%s' "$(printf '%s' "${ref}" | tr -c 'A-Za-z0-9._-' '_')" "${sum}"
}

# image::sidecar_get FILE KEY
image::sidecar_get() {
  [[ -f $1 ]] || return 0
  sed -n "s/^$2=//p" "$1" | head -n 1
}

# image::fingerprint: what the image would be built from (dockerfile, context files, build args).
# A local image whose label differs was built from something else under a reused tag.
image::fingerprint() {
  [[ -n ${SM_DOCKERFILE:-} && -f ${SM_DOCKERFILE} ]] || return 0
  local ctx=${SM_DOCKER_CONTEXT:-$(dirname "${SM_DOCKERFILE}")}
  # Small files by content; big ones (model blobs, padding) by size and mtime, so a warm run does
  # not hash gigabytes on every start. Any change to either still changes the fingerprint.
  {
    sha256sum <"${SM_DOCKERFILE}"
    (cd "${ctx}" && find . -type f ! -name '.*' -size -1048576c -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum)
    (cd "${ctx}" && find . -type f ! -name '.*' -size +1048575c -printf '%p %s %T@\n' | LC_ALL=C sort)
    printf '%s\n' "${SM_BUILD_ARGS[@]+"${SM_BUILD_ARGS[@]}"}" | LC_ALL=C sort
  } | sha256sum | cut -c1-32
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

# image::cache_load CACHE KEY WANT_ID: load the cached tar if its sidecar says WANT_ID (or any id
# when WANT_ID is empty). Prints the loaded ID. Fails if there is no matching tar.
image::cache_load() {
  local cache=$1 key=$2 want=$3 tar sidecar id t0 loaded lockfd
  tar=${cache}/${key}.tar sidecar=${cache}/${key}.id
  exec {lockfd}>>"${cache}/.${key}.lock"
  flock -s -w "${SM_CACHE_LOCK_TIMEOUT:-900}" "${lockfd}" || { exec {lockfd}>&-; return 1; }
  id=$(image::sidecar_get "${sidecar}" id)
  if [[ ! -s ${tar} || -z ${id} || (-n ${want} && ${id} != "${want}") ]]; then
    exec {lockfd}>&-
    return 1
  fi
  if ! image::tar_matches "${tar}" "${sidecar}"; then
    exec {lockfd}>&-
    log::error image "${tar} is not the tar its sidecar describes ($(stat -c %s "${tar}") bytes, sidecar says $(image::sidecar_get "${sidecar}" bytes)); not loading it"
    return 1
  fi
  t0=$(util::now)
  log::cmd image docker load -q -i "${tar}"
  if ! docker load -q -i "${tar}" >/dev/null; then
    exec {lockfd}>&-
    log::error image "docker load of ${tar} failed"
    return 1
  fi
  exec {lockfd}>&-
  loaded=$(image::local_id "${SM_IMAGE}")
  log::info image "loaded ${SM_IMAGE} from the cache ($(du -h "${tar}" | cut -f1), $(util::elapsed "${t0}") s)"
  printf '%s' "${loaded}"
}

# image::tar_matches TAR SIDECAR: the tar's size is the one recorded when it was written (a cut or
# padded tar is never a hit; checking costs one stat).
image::tar_matches() {
  local want
  want=$(image::sidecar_get "$2" bytes)
  [[ -n ${want} && $(stat -c %s "$1" 2>/dev/null) == "${want}" ]]
}

# image::cache_save CACHE KEY ID FINGERPRINT: save the image unless the cache already holds ID.
image::cache_save() {
  local cache=$1 key=$2 id=$3 fp=$4 tar sidecar tmp t0 bytes lockfd
  tar=${cache}/${key}.tar sidecar=${cache}/${key}.id tmp=${cache}/.${key}.tar.tmp.$$.${RANDOM}
  mkdir -p "${cache}" || { log::error image "cannot create the image cache ${cache}"; return 1; }
  exec {lockfd}>>"${cache}/.${key}.lock"
  flock -x -w "${SM_CACHE_LOCK_TIMEOUT:-900}" "${lockfd}" ||
    { exec {lockfd}>&-; log::error image "timed out waiting for the cache lock ${cache}/.${key}.lock"; return 1; }
  # Holding the lock, any temp file of this key is a dead writer's (e.g. a SIGKILLed save).
  rm -f "${cache}/.${key}.tar.tmp."*
  if [[ -s ${tar} && $(image::sidecar_get "${sidecar}" id) == "${id}" ]]; then
    if image::tar_matches "${tar}" "${sidecar}"; then
      exec {lockfd}>&-
      log::info image "cache hit: ${tar} already holds ${id:7:12}; no save"
      return 0
    fi
    log::warn image "${tar} does not match its sidecar ($(stat -c %s "${tar}") bytes, sidecar says $(image::sidecar_get "${sidecar}" bytes)); saving it again"
  elif [[ -s ${tar} ]]; then
    log::info image "stale tar in the cache (holds $(image::sidecar_get "${sidecar}" id | cut -c8-19), want ${id:7:12}); replacing it"
  fi
  t0=$(util::now)
  # To a pipe, not -o: the file grows under our own temp name (whatever a killed save leaves is
  # ours to recognise and remove), and the digest is taken from the same bytes as they pass.
  # shellcheck disable=SC2016 # $1 and $2 are the inner bash's arguments
  local digest save=(bash -o pipefail -c 'docker save "$1" | tee "$2" | cksum' save "${SM_IMAGE}" "${tmp}")
  log::cmd image "${save[@]}"
  if ! digest=$("${save[@]}" 2>"${tmp}.err"); then
    local err
    err=$(tail -n 1 "${tmp}.err" 2>/dev/null)
    rm -f "${tmp}" "${tmp}.err"
    exec {lockfd}>&-
    log::error image "cannot save ${SM_IMAGE} into ${cache}: ${err##*: } (is the disk full? the run goes on without the cache)"
    return 1
  fi
  rm -f "${tmp}.err"
  bytes=$(stat -c %s "${tmp}")
  # Rename first, sidecar second: a sidecar never describes a tar that is not complete.
  mv -f "${tmp}" "${tar}"
  printf 'id=%s\nimage=%s\nfingerprint=%s\nbytes=%s\ncksum=%s\nsaved_by=%s job %s\n' "${id}" "${SM_IMAGE}" "${fp}" \
    "${bytes}" "${digest%% *}" "$(hostname)" "${SLURM_JOB_ID:-}" >"${sidecar}.tmp.$$" && mv -f "${sidecar}.tmp.$$" "${sidecar}"
  exec {lockfd}>&-
  log::info image "saved ${SM_IMAGE} into ${tar} ($((bytes / 1024 / 1024)) MB, $(util::elapsed "${t0}") s)"
}

# image::ensure_on_rank0: obtain the image (fresh local, matching tar, rebuild, pull); print its ID.
image::ensure_on_rank0() {
  local fp id label key cache=${SM_IMAGE_CACHE:-}
  fp=$(image::fingerprint)
  key=$(image::cache_key "${SM_IMAGE}")
  # One inspect for both the ID and the fingerprint label (a warm start pays for nothing else).
  local both
  both=$(docker image inspect -f "{{.Id}} {{with .Config.Labels}}{{index . \"${FINGERPRINT_LABEL}\"}}{{end}}" "${SM_IMAGE}" 2>/dev/null || true)
  id=${both%% *} label=${both#* }
  [[ ${label} == "<no value>" || ${label} == "${both}" ]] && label=""
  if [[ -n ${id} ]]; then
    if [[ -n ${fp} && -n ${label} && ${label} != "${fp}" ]]; then
      log::info image "${SM_IMAGE} is present but was built from another dockerfile/context (tag reused); rebuilding"
      id=
    else
      log::info image "${SM_IMAGE} is present locally (${id:7:12})"
    fi
  fi
  if [[ -z ${id} && -n ${cache} ]]; then
    local tar_fp
    tar_fp=$(image::sidecar_get "${cache}/${key}.id" fingerprint)
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
    log::cmd image docker pull -q "${SM_IMAGE}"
    docker pull -q "${SM_IMAGE}" >/dev/null || {
      log::error image "${SM_IMAGE} is not on $(hostname), not in the cache${cache:+ ${cache}} and cannot be built or pulled"
      return 1
    }
    id=$(image::local_id "${SM_IMAGE}")
  fi
  if [[ -n ${cache} && ${NNODES:-1} -gt 1 ]]; then
    image::cache_save "${cache}" "${key}" "${id}" "${fp}" || true
  fi
  printf '%s' "${id}"
}

# image::ensure_on_worker WANT_ID: make rank 0's image present here; IMAGE_WORKER_ID is then the ID
# this node runs (rank 0's, or a rebuild's own).
image::ensure_on_worker() {
  local want=$1 id key cache=${SM_IMAGE_CACHE:-}
  IMAGE_WORKER_ID=${want}
  key=$(image::cache_key "${SM_IMAGE}")
  id=$(image::local_id "${SM_IMAGE}" || true)
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
