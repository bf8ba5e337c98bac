# shellcheck shell=bash
# shellcheck disable=SC2034 # state shared by the sourced libraries and bin/sm-node
# One node's task: prepare -> image -> barrier -> run -> stage. Each stage can run alone on a
# compute node (`bin/sm-node --stage NAME`); prepare saves the context the later stages read.

declare -gA NODE_STAGE_SECONDS=() NODE_STAGE_STATUS=()
NODE_STAGE_ORDER=()
NODE_REASON=
NODE_EXIT=0
RUN_EXIT=
RUN_DOCKER_PID=

# node::init JOBDIR: rank, scratch, node dir and the node log (live on shared storage).
node::init() {
  export SM_JOBDIR=${1:-${SM_JOBDIR:-}}
  [[ -n ${SM_JOBDIR} ]] || log::die node "no job directory: pass --jobdir DIR (the batch step does)" 2
  export SM_RANK=${SM_RANK:-${SLURM_NODEID:-0}}
  export NNODES=${NNODES:-${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-1}}}
  export NODE_RANK=${SM_NODE_RANK:-${SM_RANK}} RANK=${RANK:-${SM_RANK}} WORLD_SIZE=${WORLD_SIZE:-${NNODES}} LOCAL_RANK=${LOCAL_RANK:-0}
  export SLURMD_NODENAME=${SLURMD_NODENAME:-$(hostname)}
  export SM_NODE_DIR=${SM_JOBDIR}/node_${SM_RANK}
  export SM_SCRATCH=${SM_SCRATCH:-${TMPDIR:-/tmp}/slurm-multi.${SLURM_JOB_ID:-local}.r${SM_RANK}}
  export SM_NODE_LOG=${SM_NODE_DIR}/node.log
  export SM_OUTPUT_DIR=/sm-out
  mkdir -p "${SM_NODE_DIR}" "${SM_SCRATCH}/output" ||
    log::die node "cannot create ${SM_NODE_DIR} or ${SM_SCRATCH} on $(hostname)" 1
  chmod 700 "${SM_SCRATCH}"
  if [[ ${SM_NODE_LOG_REDIRECTED:-0} != 1 ]]; then
    export SM_NODE_LOG_REDIRECTED=1
    # Everything this task prints goes to the node log (secrets masked) and on to srun's output.
    # The logger ignores SIGTERM: scancel signals every process of the step, and a dead logger
    # would take the task down (SIGPIPE) before it stops the workload and stages its outputs.
    exec > >(trap '' TERM INT HUP; util::sm redact --secrets-file "${SM_SCRATCH}/secrets" | tee -a "${SM_NODE_LOG}") 2>&1
  fi
}

node::is_rank0() { [[ ${SM_RANK} == 0 ]]; }
node::multi() { ((NNODES > 1)); }

# node::stage NAME: run node::stage_NAME, time it, remember the outcome; stop at the first failure.
node::stage() {
  local name=$1 t0 rc=0
  t0=$(util::now)
  log::info "${name}" "stage ${name} (alone: SM_JOBDIR=$(printf '%q' "${SM_JOBDIR}") bin/sm-node --stage ${name})"
  "node::stage_${name}" || rc=$?
  NODE_STAGE_SECONDS[${name}]=$(util::elapsed "${t0}")
  NODE_STAGE_ORDER+=("${name}")
  if ((rc == 0)); then
    NODE_STAGE_STATUS[${name}]=ok
    log::info "${name}" "stage ${name}: ok (${NODE_STAGE_SECONDS[${name}]} s)"
  else
    NODE_STAGE_STATUS[${name}]=failed
    [[ -n ${NODE_REASON} ]] || NODE_REASON="stage ${name} failed (exit ${rc})"
    log::error "${name}" "stage ${name}: failed (exit ${rc}): ${NODE_REASON}"
  fi
  return "${rc}"
}

node::fail() {
  NODE_REASON=$1
  return "${2:-1}"
}

# ---- prepare -------------------------------------------------------------------------------------

node::stage_prepare() {
  local restore
  export MASTER_ADDR=${MASTER_ADDR:-$(util::first_node)}
  export MASTER_PORT=${MASTER_PORT:-${SM_MASTER_PORT:-29500}}
  # Runtime detection first: detected values win over the manifest (restore never overwrites).
  if util::sm gpus detect --json >"${SM_SCRATCH}/gpus.json"; then
    local vendor
    vendor=$(sed -n 's/.*"vendor": *"\([^"]*\)".*/\1/p' "${SM_SCRATCH}/gpus.json")
    [[ ${vendor} != none ]] && export SM_GPU_VENDOR=${SM_GPU_VENDOR:-${vendor}}
    log::info prepare "GPUs: $(tr -d '\n' <"${SM_SCRATCH}/gpus.json" | cut -c1-200)"
  else
    node::fail "GPU detection failed (see node.log)" || return
  fi
  if [[ ${SM_RUNTIME:-docker} == docker ]]; then
    local engine
    if ! engine=$(timeout 20 docker version --format '{{.Server.Version}}' 2>&1); then
      node::fail "docker engine not reachable on $(hostname): ${engine##*$'\n'}" || return
    fi
  fi
  if [[ -n ${SM_MANIFEST:-} ]]; then
    log::cmd prepare slurm-multi manifest restore "${SM_MANIFEST}" ${SM_MODEL:+--model "${SM_MODEL}"}
    restore=$(util::sm manifest restore "${SM_MANIFEST}" ${SM_MODEL:+--model "${SM_MODEL}"}) ||
      node::fail "manifest restore of ${SM_MANIFEST} failed" 2 || return
    # The output is bash made for sourcing: every value is quoted by the helper.
    # shellcheck source=/dev/null
    source /dev/stdin <<<"${restore}"
    node::remember_secrets
    node::resolve_manifest_paths
  fi
  [[ -n ${SM_IMAGE:-} || ${SM_RUNTIME:-docker} == none ]] ||
    node::fail "no image: give --image or a manifest with docker_image" 2 || return
  node::save_context
}

# Secret values the manifest brought (literals under secret names) join the log filter's list.
node::remember_secrets() {
  local var
  (
    umask 077
    for var in $(compgen -v); do
      [[ ${var^^} =~ TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|^MAD_SECRETS ]] || continue
      [[ -n ${!var:-} && ${!var} != *$'\n'* ]] && printf '%s\n' "${!var}"
    done >>"${SM_SCRATCH}/secrets"
  )
}

# Relative dockerfile/context paths in a manifest are relative to where madengine ran: try the
# submit dir, then the manifest's dir and its parents.
node::resolve_manifest_paths() {
  local var base candidate
  for var in SM_DOCKERFILE SM_DOCKER_CONTEXT; do
    [[ -n ${!var:-} && ${!var} != /* ]] || continue
    for base in "${SLURM_SUBMIT_DIR:-${PWD}}" "$(dirname "${SM_MANIFEST}")" \
      "$(dirname "$(dirname "${SM_MANIFEST}")")" "$(dirname "$(dirname "$(dirname "${SM_MANIFEST}")")")"; do
      candidate=${base}/${!var}
      if [[ -e ${candidate} ]]; then
        printf -v "${var}" '%s' "$(cd "$(dirname "${candidate}")" && pwd)/$(basename "${candidate}")"
        break
      fi
    done
  done
}

# The context later stages read when run alone (node-local, 0600: it may hold manifest values).
node::save_context() {
  local file=${SM_SCRATCH}/context.sh names=() var
  for var in $(compgen -v SM_) MASTER_ADDR MASTER_PORT NNODES NODE_RANK RANK WORLD_SIZE LOCAL_RANK \
    "${SM_DOCKER_ENV_NAMES[@]+"${SM_DOCKER_ENV_NAMES[@]}"}"; do
    case ${var} in SM_NODE_LOG_REDIRECTED | SM_BARRIER_PID | SM_CMD) continue ;; esac
    [[ -n ${!var+x} ]] && names+=("${var}")
  done
  (umask 077 && declare -p "${names[@]}" | sed 's/^declare -- /declare -g /; s/^declare -\([a-zA-Z]\{1,\}\) /declare -g\1 /' >"${file}")
}

node::load_context() {
  local file=${SM_SCRATCH}/context.sh
  [[ -f ${file} ]] || log::die node "no saved context ${file}: run the prepare stage first (bin/sm-node --stage prepare)" 2
  # shellcheck source=/dev/null
  source "${file}"
}

# ---- image ---------------------------------------------------------------------------------------

node::barrier_args() {
  printf '%s\0' --nnodes "${NNODES}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}" \
    --job-id "${SLURM_JOB_ID:-0}"
}

node::stage_image() {
  local id reason rc=0 bargs=()
  [[ ${SM_RUNTIME:-docker} == docker ]] || { log::info image "runtime ${SM_RUNTIME}: no image to distribute"; return 0; }
  if ! node::multi; then
    id=$(image::ensure_on_rank0) || node::fail "image: cannot obtain ${SM_IMAGE} (see node.log)" || return
    export SM_IMAGE_ID=${id}
    node::save_context
    return 0
  fi
  mapfile -d '' bargs < <(node::barrier_args)
  if node::is_rank0; then
    # Listen first, so workers can connect (and be told to abort) while rank 0 builds.
    rm -f "${SM_SCRATCH}/barrier.rc" "${SM_SCRATCH}/barrier.addr"
    log::cmd barrier slurm-multi barrier serve "${bargs[@]}" --timeout "${SM_BARRIER_TIMEOUT}"
    (
      rc=0
      util::sm barrier serve "${bargs[@]}" --timeout "${SM_BARRIER_TIMEOUT}" \
        --ready-file "${SM_SCRATCH}/barrier.addr" || rc=$?
      [[ -d ${SM_SCRATCH} ]] && echo "${rc}" >"${SM_SCRATCH}/barrier.rc"
    ) &
    export SM_BARRIER_PID=$!
    if id=$(image::ensure_on_rank0); then
      export SM_IMAGE_ID=${id}
      node::save_context
      node::barrier_control release --image-id "${id}" || node::fail "barrier: could not release the workers" || return
    else
      reason="rank 0 ($(hostname)): image stage failed: cannot obtain ${SM_IMAGE} (see node_0/node.log)"
      node::barrier_control abort --reason "${reason}" || true
      node::fail "${reason}" || return
    fi
  else
    log::cmd barrier slurm-multi barrier join --rank "${SM_RANK}" "${bargs[@]}" --phase image
    id=$(util::sm barrier join --rank "${SM_RANK}" "${bargs[@]}" --phase image \
      --connect-timeout "${SM_BARRIER_TIMEOUT}" --wait-timeout "${SM_BARRIER_TIMEOUT}") || rc=$?
    if ((rc != 0)); then
      node::fail "barrier: did not get rank 0's image ID (join exit ${rc}; see node.log)" "${rc}" || return
    fi
    log::info image "rank 0's image is ${SM_IMAGE} ${id:7:12}"
    if ! image::ensure_on_worker "${id}"; then
      reason="$(hostname) (rank ${SM_RANK}): cannot get rank 0's image ${SM_IMAGE} ${id:7:12}"
      node::barrier_control abort --reason "${reason}" || true
      node::fail "${reason}" || return
    fi
    # What this node really runs (a rebuilt image has its own ID).
    SM_IMAGE_ID=$(image::local_id "${SM_IMAGE}" || echo "${id}")
    export SM_IMAGE_ID
    node::save_context
  fi
}

# node::barrier_control release|abort ARGS…: talk to rank 0's barrier server as a controller.
node::barrier_control() {
  local verb=$1 bargs=()
  shift
  mapfile -d '' bargs < <(node::barrier_args)
  # --nnodes is not a controller option.
  bargs=("${bargs[@]:2}")
  local extra=()
  [[ -f ${SM_SCRATCH}/barrier.addr ]] && extra=(--ready-file "${SM_SCRATCH}/barrier.addr")
  util::sm barrier "${verb}" "$@" "${bargs[@]}" "${extra[@]+"${extra[@]}"}"
}

# ---- barrier -------------------------------------------------------------------------------------

node::stage_barrier() {
  node::multi || { log::info barrier "single node: no barrier"; return 0; }
  [[ ${SM_RUNTIME:-docker} == docker ]] || { log::info barrier "runtime ${SM_RUNTIME}: no image to wait for, no barrier"; return 0; }
  local rc=0 bargs=()
  if node::is_rank0; then
    while [[ ! -f ${SM_SCRATCH}/barrier.rc ]]; do sleep 0.1; done
    rc=$(<"${SM_SCRATCH}/barrier.rc")
    case ${rc} in
      0) log::info barrier "every worker is ready; GO sent" ;;
      3) node::fail "barrier: timed out after ${SM_BARRIER_TIMEOUT} s waiting for workers (missing ranks in node.log)" 3 || return ;;
      *) node::fail "barrier: aborted (see node.log)" "${rc}" || return ;;
    esac
  else
    mapfile -d '' bargs < <(node::barrier_args)
    log::cmd barrier slurm-multi barrier join --rank "${SM_RANK}" "${bargs[@]}" --phase start
    util::sm barrier join --rank "${SM_RANK}" "${bargs[@]}" --phase start \
      --connect-timeout "${SM_BARRIER_TIMEOUT}" --wait-timeout "${SM_BARRIER_TIMEOUT}" >/dev/null || rc=$?
    ((rc == 0)) || node::fail "barrier: no GO from rank 0 (join exit ${rc}; see node.log)" "${rc}" || return
    log::info barrier "GO received"
  fi
}

# ---- run -----------------------------------------------------------------------------------------

node::stage_run() {
  if declare -F profile::before_run >/dev/null; then
    profile::before_run || node::fail "profile: cannot set up profiling (see node.log)" 2 || return
  fi
  case ${SM_RUNTIME:-docker} in
    docker) run::docker || node::fail "run: could not start the container" || return ;;
    none) run::bare ;;
    *) node::fail "runtime ${SM_RUNTIME} is launched by the batch step, not by sm-node" 2 || return ;;
  esac
  if declare -F profile::after_run >/dev/null; then profile::after_run; fi # nsys: this rank's report settles
  NODE_EXIT=${RUN_EXIT}
  case ${RUN_EXIT} in
    0) return 0 ;;
    124) node::fail "workload timed out after ${SM_TIMEOUT} s" 124 ;;
    *) node::fail "container exited ${RUN_EXIT}" "${RUN_EXIT}" ;;
  esac
}

# ---- stage ---------------------------------------------------------------------------------------

node::stage_stage() {
  local name csv src
  name=$(run::container_name)
  mkdir -p "${SM_NODE_DIR}"
  csv=${SM_RESULTS_CSV:-}
  if [[ -n ${csv} ]]; then
    src=${SM_SCRATCH}/output/${csv}
    if [[ ! -f ${src} ]] && docker container inspect "${name}" >/dev/null 2>&1; then
      local workdir
      workdir=$(docker container inspect -f '{{.Config.WorkingDir}}' "${name}" 2>/dev/null)
      docker cp "${name}:${workdir:-/}/${csv}" "${src}" >/dev/null 2>&1 || true
    fi
    if [[ -f ${src} ]]; then
      cp -f "${src}" "${SM_NODE_DIR}/${csv}"
      log::info stage "staged ${csv} ($(wc -l <"${src}") lines)"
    else
      log::info stage "no ${csv} on this node"
    fi
  fi
  if [[ -d ${SM_SCRATCH}/diagnostics ]]; then
    cp -rf "${SM_SCRATCH}/diagnostics" "${SM_NODE_DIR}/"
  fi
  local f
  for f in "${SM_SCRATCH}"/output/*; do
    [[ -f ${f} && ${f##*/} != "${csv}" ]] && cp -f "${f}" "${SM_NODE_DIR}/" 2>/dev/null
  done
  [[ ${SM_KEEP_CONTAINER:-0} == 1 ]] || docker rm -f "${name}" >/dev/null 2>&1 || true
  return 0
}

# node::write_status: status.json, the node's verdict input (written last, atomically).
node::write_status() {
  local file=${SM_NODE_DIR}/status.json status=ok name first=1
  ((NODE_EXIT == 0)) || status=failed
  [[ ${NODE_EXIT} == 124 ]] && status=timeout
  [[ ${NODE_TERMINATED:-0} == 1 && ${status} == ok ]] && status=terminated
  {
    printf '{"rank": %s, "node": %s, "exit_code": %s, "status": "%s", "reason": %s, "image_id": %s, "stages": {' \
      "${SM_RANK}" "$(util::json_str "$(hostname)")" "${NODE_EXIT}" "${status}" "$(util::json_str "${NODE_REASON}")" \
      "$(util::json_str "${SM_IMAGE_ID:-}")"
    for name in "${NODE_STAGE_ORDER[@]+"${NODE_STAGE_ORDER[@]}"}"; do
      ((first)) || printf ', '
      first=0
      printf '"%s": {"seconds": %s, "status": "%s"' "${name}" "${NODE_STAGE_SECONDS[${name}]}" "${NODE_STAGE_STATUS[${name}]}"
      [[ ${name} == run && -n ${RUN_EXIT} ]] && printf ', "exit_code": %s' "${RUN_EXIT}"
      printf '}'
    done
    printf '}}\n'
  } >"${file}.tmp" && mv -f "${file}.tmp" "${file}"
}

# node::stage_reap: run by the batch step after the tasks ended, on every node. A task that died
# without staging (SIGKILL, OOM killer, a crash) left its container running under dockerd and its
# outputs in scratch: stop the container gracefully, stage what it left, write its status.
node::stage_reap() {
  local name
  name=$(run::container_name)
  if [[ -f ${SM_NODE_DIR}/status.json ]]; then
    docker rm -f "${name}" >/dev/null 2>&1 || true
    return 0
  fi
  log::warn reap "the task on $(hostname) ended without staging; collecting what it left"
  [[ -f ${SM_SCRATCH}/context.sh ]] && node::load_context
  NODE_EXIT=137
  NODE_REASON="the sm-node task on $(hostname) died before staging (killed?); outputs recovered by the reaper"
  if docker container inspect "${name}" >/dev/null 2>&1; then
    run::diagnose "${name}" "task died; container left behind"
    run::stop_container "${name}"
    RUN_EXIT=$(docker container inspect -f '{{.State.ExitCode}}' "${name}" 2>/dev/null || echo "")
  fi
  node::stage_stage
  NODE_STAGE_ORDER+=(reap) NODE_STAGE_SECONDS[reap]=0 NODE_STAGE_STATUS[reap]=ok
  node::write_status
  [[ ${SM_KEEP_SCRATCH:-0} == 1 ]] || rm -rf "${SM_SCRATCH}"
  return 0
}

# ---- the whole task ------------------------------------------------------------------------------

# node::on_term: scancel / srun cancel / time limit. Stop the container gracefully (SIGTERM first,
# so nsys writes its report), then let the EXIT path stage everything.
node::on_term() {
  NODE_TERMINATED=1
  log::warn node "received a termination signal; stopping the workload gracefully"
  run::stop_container "$(run::container_name)"
  # Bare metal: the workload is our child (under nsight-slurm only this task gets the signal).
  if [[ ${SM_RUNTIME:-docker} == none && -n ${RUN_DOCKER_PID} ]]; then kill -TERM "${RUN_DOCKER_PID}" 2>/dev/null || true; fi
  [[ -n ${RUN_DOCKER_PID} ]] && wait "${RUN_DOCKER_PID}" 2>/dev/null
  [[ -n ${SM_BARRIER_PID:-} ]] && kill -TERM "${SM_BARRIER_PID}" 2>/dev/null
  ((NODE_EXIT != 0)) || NODE_EXIT=143
  [[ -n ${NODE_REASON} ]] || NODE_REASON="terminated by a signal (scancel, time limit or a failed peer)"
  exit "${NODE_EXIT}"
}

node::on_exit() {
  local rc=$?
  # Finishing up: a second SIGTERM must not cut the report wait or the staging short (Slurm's
  # SIGKILL after KillWait still bounds it).
  trap - EXIT
  trap '' TERM INT
  ((NODE_EXIT != 0)) || NODE_EXIT=${rc}
  if declare -F profile::after_run >/dev/null; then profile::after_run; fi
  # rank 0 leaving early (e.g. after an ABORT): stop its barrier server, which tells any worker
  # still connected to abort, so it does not hold the step open.
  # After an ABORT the server lingers until every worker has heard it (a worker may still be
  # connecting), at most its linger time; then it is stopped.
  if [[ -n ${SM_BARRIER_PID:-} ]] && kill -0 "${SM_BARRIER_PID}" 2>/dev/null; then
    local waited=0
    while kill -0 "${SM_BARRIER_PID}" 2>/dev/null && ((waited < ${SM_BARRIER_LINGER:-15} * 5)); do
      sleep 0.2
      waited=$((waited + 1))
    done
    pkill -TERM -P "${SM_BARRIER_PID}" 2>/dev/null || true
    wait "${SM_BARRIER_PID}" 2>/dev/null || true
  fi
  if [[ ${NODE_STAGE_STATUS[stage]:-} != ok ]]; then
    node::stage stage || true
  fi
  node::write_status
  log::info node "done: exit ${NODE_EXIT}${NODE_REASON:+ (${NODE_REASON})}"
  [[ ${SM_KEEP_SCRATCH:-0} == 1 ]] || rm -rf "${SM_SCRATCH}"
  exit "${NODE_EXIT}"
}

node::run_all() {
  trap node::on_exit EXIT
  trap node::on_term TERM INT
  local name
  for name in prepare image barrier run; do
    if ! node::stage "${name}"; then
      ((NODE_EXIT != 0)) || NODE_EXIT=$?
      # A worker that cannot start tells rank 0, which aborts everyone within seconds instead
      # of waiting for the barrier timeout. (rank 0 aborts its own barrier in the image stage.)
      if [[ ${name} != run ]] && node::multi && ! node::is_rank0; then
        node::barrier_control abort --connect-timeout 5 \
          --reason "$(hostname) (rank ${SM_RANK}): ${NODE_REASON}" >/dev/null 2>&1 || true
      fi
      return "${NODE_EXIT}"
    fi
  done
  node::stage stage
  return "${NODE_EXIT}"
}
