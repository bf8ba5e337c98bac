# shellcheck shell=bash
# shellcheck disable=SC2034 # state shared by the sourced libraries and bin/sm-node
# One node's task: prepare -> fitness -> image -> barrier -> run -> save-outputs. Each stage can be re-run alone
# on a compute node after the job (`bin/sm-node --from-job JOBDIR --rank R --stage NAME`): prepare is
# cheap and runs first every time, so no stage depends on node-local state that is gone.

# Events on the node's timeline (lib/timeline.sh), also where this file is sourced alone.
# shellcheck source=lib/timeline.sh
declare -F timeline::event >/dev/null || source "$(dirname "${BASH_SOURCE[0]}")/timeline.sh"

declare -gA NODE_STAGE_SECONDS=() NODE_STAGE_STATUS=()
declare -gA NODE_HELD=() NODE_CACHE_SEEN=() # what each worker said it holds (node::holds_read)
NODE_HOLDS_FILE=barrier.holds                # in the task's scratch dir: rank 0's barrier server writes it
NODE_STAGE_ORDER=()
NODE_CURRENT_STAGE='' NODE_CURRENT_T0='' # the stage running now (a signal cuts it short: on_term)
# A node task's stages in the order it runs them: one owner, read by bash and Python (events.STAGE_ORDER).
read -r -a NODE_STAGES <"${BASH_SOURCE[0]%/*}/../py/slurm_multi/stages.txt"
NODE_REASON=
NODE_FAULT= # this node's own fault under a failed run (node::find_fault)
NODE_EXIT=0
NODE_TERMINATED=0
NODE_HOST= # this machine's name (node::init)
NODE_FROM_JOB=0
NODE_SCRATCH_FOREIGN=0
RUN_EXIT=
RUN_HUNG=
RUN_DOCKER_PID=
BARRIER_CTL=
SM_BARRIER_PID=
NODE_JOIN_PID=
NODE_JOIN_FD=
NODE_FITNESS_PID=

# node::init JOBDIR [--reap]: rank, scratch, node dir and the node log (live on shared storage).
# From here on every exit path writes status.json and removes the scratch dir (the traps); a
# SIGTERM that came earlier (bin/sm-node records it) is acted on as soon as they are in place.
node::init() {
  export SM_JOBDIR=${1:-${SM_JOBDIR:-}}
  [[ -n ${SM_JOBDIR} ]] || log::die node "no job directory: pass --jobdir DIR (the batch step does) or --from-job JOBDIR" 2
  export SM_RANK=${SM_RANK:-${SLURM_NODEID:-0}}
  export NNODES=${NNODES:-${SLURM_NNODES:-${SLURM_JOB_NUM_NODES:-1}}}
  export NODE_RANK=${SM_NODE_RANK:-${SM_RANK}} RANK=${RANK:-${SM_RANK}} WORLD_SIZE=${WORLD_SIZE:-${NNODES}} LOCAL_RANK=${LOCAL_RANK:-0}
  # This machine's name as `hostname` says it (the kernel's UTS name), read without a process: the
  # status line and the hang watch name it. (Not HOSTNAME: srun passes on the batch host's.)
  read -r NODE_HOST </proc/sys/kernel/hostname 2>/dev/null || NODE_HOST=$(hostname)
  export SLURMD_NODENAME=${SLURMD_NODENAME:-${NODE_HOST}}
  export SM_OUTPUT_DIR=/sm-out
  if ((NODE_FROM_JOB)); then
    # A re-run by hand: the job's own outputs stay as they were; this run's go beside them.
    export SM_NODE_DIR=${SM_JOBDIR}/node_${SM_RANK}/rerun
    SM_SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/slurm-multi.rerun.XXXXXX") || log::die node "cannot create a scratch dir" 1
    export SM_SCRATCH
  else
    export SM_NODE_DIR=${SM_JOBDIR}/node_${SM_RANK}
    export SM_SCRATCH=${SM_SCRATCH:-${TMPDIR:-/tmp}/slurm-multi.${SLURM_JOB_ID:-local}.r${SM_RANK}}
  fi
  export SM_NODE_LOG=${SM_NODE_DIR}/node.log
  # The traps first: a scancel that kills one of the commands below (it signals the whole step)
  # still ends in on_term -> on_exit, which writes status.json and removes the scratch dir.
  if [[ ${2:-} != --reap ]]; then
    trap node::on_exit EXIT
    trap node::on_term TERM INT
  fi
  node::own_scratch "${SM_SCRATCH}"
  if ! (umask 077 && mkdir -p "${SM_SCRATCH}/output") || ! mkdir -p "${SM_NODE_DIR}"; then
    log::die node "cannot create ${SM_NODE_DIR} or ${SM_SCRATCH} on $(hostname)" 1
  fi
  node::own_scratch "${SM_SCRATCH}"
  chmod 700 "${SM_SCRATCH}"
  : >>"${SM_SCRATCH}/secrets"
  # The helpers mask what the log filter masks before they store or cut a reason (secret_rule.masked).
  export SM_SECRETS_FILE=${SM_SCRATCH}/secrets
  if [[ ${SM_NODE_LOG_REDIRECTED:-0} != 1 ]]; then
    export SM_NODE_LOG_REDIRECTED=1
    # Everything this task prints goes to the node log (secrets masked) and on to srun's output.
    util::log_to "${SM_NODE_LOG}" --secrets-file "${SM_SCRATCH}/secrets"
  fi
  if [[ -n ${SM_EARLY_SIGNAL:-} && ${2:-} != --reap ]]; then node::on_term; fi
  ((NODE_FROM_JOB)) || node::remove_stale
}

# node::own_scratch DIR: the scratch name is predictable (the reaper and the next job find it by it),
# so another user may have made it first, or planted a symlink there: refuse both, naming the owner
# (checked before and after it is made: never a chmod or a secret in someone else's directory).
# The task ends, and its status.json says why: the batch step names the cause and requeues or fails
# the job, but never quarantines the node for it (anybody may make such a dir: docs/bad-nodes.md).
node::own_scratch() {
  local dir=$1 owner
  [[ -L ${dir} || (-e ${dir} && ! -O ${dir}) ]] || return 0
  owner=$(stat -c %U "${dir}" 2>/dev/null || echo unknown)
  NODE_SCRATCH_FOREIGN=1 # the exit path must not remove it
  NODE_REASON="scratch dir ${dir} on $(hostname) is $([[ -L ${dir} ]] && echo "a symlink" || echo "a directory") of ${owner}, not of $(id -un): remove it, or set TMPDIR to a directory of your own"
  mkdir -p "${SM_NODE_DIR}" 2>/dev/null || true # (where the exit path writes status.json)
  log::die node "${NODE_REASON}" 1
}

node::is_rank0() { [[ ${SM_RANK} == 0 ]]; }
# node::multi: more than one rank (several tasks per node count: each is a rank of its own).
node::multi() { ((${SM_NTASKS:-${NNODES}} > 1)); }
# node::has_image: the runtime starts an image every rank must have (docker: loaded per node; pyxis:
# one squashfs on shared storage); bare metal has none, and no image barrier.
node::has_image() { [[ ${SM_RUNTIME} == docker || ${SM_RUNTIME} == pyxis ]]; }
# node::may_have_container: a docker container of this rank may exist (its run stage began, or this
# is the reaper or a re-run by hand, which may find the task's): only then do the stop and the exit
# path ask the engine, which may be the very thing that failed (a hung engine answers nothing, ever).
node::may_have_container() {
  [[ ${SM_RUNTIME} == docker ]] || return 1
  ((NODE_FROM_JOB || ${NODE_REAPING:-0})) || [[ ${NODE_CURRENT_STAGE:-} == run || -n ${NODE_STAGE_STATUS[run]:-} ]]
}

# node::remove_stale: scratch dirs and containers of this user's jobs that have ended (a task
# SIGKILLed after KillWait cannot clean up after itself; the next job on the node does). A job counts
# as ended only when Slurm says so: an unreachable controller removes nothing.
node::remove_stale() {
  [[ ${SM_KEEP_SCRATCH} != 1 ]] || return 0
  local dir base job state known=" ${SLURM_JOB_ID:-local} " gone=" "
  for dir in "${TMPDIR:-/tmp}"/slurm-multi.*.r*; do
    [[ -d ${dir} && -O ${dir} ]] || continue
    base=${dir##*/slurm-multi.}
    job=${base%.r*}
    [[ ${job} =~ ^[0-9]+(_[0-9]+)?$ && ${known} != *" ${job} "* ]] || continue
    if [[ ${gone} != *" ${job} "* ]]; then
      # -t all: without it squeue prints nothing for a job that has ended but that Slurm still
      # remembers (MinJobAge), and nothing must not read as alive.
      state=$(squeue -h -t all -j "${job}" -o %T 2>&1) || state="error: ${state}"
      case ${state} in
        *"Invalid job id"* | COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) ;;
        *) known+="${job} "; continue ;;
      esac
      gone+="${job} "
      log::info prepare "removing what ended job ${job} left on $(hostname)"
      if [[ ${SM_RUNTIME} == docker ]]; then
        local ids=()
        read -r -d '' -a ids < <(run::engine -q ps -aq --filter "name=^sm-${job}-r") || true
        ((${#ids[@]} == 0)) || run::engine -q rm -f "${ids[@]}" >/dev/null || true
      fi
    fi
    rm -rf "${dir}"
  done
}

# node::stage NAME: run node::stage_NAME, time it, remember the outcome; stop at the first failure.
node::stage() {
  local name=$1 t0 rc=0 how
  util::now t0
  if ((NODE_FROM_JOB)); then
    how="this re-run of job ${SLURM_JOB_ID} rank ${SM_RANK}"
  else
    log::quote_to how "${SM_HOME}/bin/sm-node" --from-job "${SM_JOBDIR}" --rank "${SM_RANK}" --stage "${name}"
    how="alone, after the job: ${how% }"
  fi
  log::info "${name}" "stage ${name} (${how})"
  timeline::event stage_start stage="${name}"
  NODE_CURRENT_STAGE=${name} NODE_CURRENT_T0=${t0}
  "node::stage_${name//-/_}" || rc=$?
  if ((rc == 0)); then
    node::record_stage "${name}" ok
    log::info "${name}" "stage ${name}: ok (${NODE_STAGE_SECONDS[${name}]} s)"
  else
    node::record_stage "${name}" failed
    [[ -n ${NODE_REASON} ]] || NODE_REASON="stage ${name} failed (exit ${rc})"
    log::error "${name}" "stage ${name}: failed (exit ${rc}): ${NODE_REASON}"
  fi
  return "${rc}"
}

# node::record_stage NAME ok|failed|terminated: the stage begun at NODE_CURRENT_T0 has ended: its
# seconds, place and status for status.json (terminated: failed there, a signal cut it short) and
# its end on the timeline. The one writer of a stage's outcome (node::stage, node::on_term).
node::record_stage() {
  local name=$1 status=$2
  NODE_CURRENT_STAGE=
  util::elapsed "${NODE_CURRENT_T0}" "NODE_STAGE_SECONDS[${name}]"
  NODE_STAGE_ORDER+=("${name}")
  NODE_STAGE_STATUS[${name}]=${status/terminated/failed}
  timeline::event stage_end stage="${name}" status="${status}"
}

node::fail() {
  NODE_REASON=$1
  return "${2:-1}"
}

# ---- prepare -------------------------------------------------------------------------------------

# node::stage_prepare: one helper call resolves and checks everything (GPUs, manifest, mounts,
# workload); bash sources what it wrote only after it succeeded. The manifest's docker_env_vars go
# into container.env for `docker run --env-file`, never into this shell's environment.
node::stage_prepare() {
  [[ -n ${MASTER_ADDR:-} ]] || util::first_node MASTER_ADDR
  export MASTER_ADDR
  # (Resolved by the job plan; a stage run by hand without one gets it from prepare below.)
  export MASTER_PORT=${MASTER_PORT:-${SM_MASTER_PORT:-}}
  # (The helper also asks the node's docker engine for /_ping: a dead engine is its one-line reason.)
  local rc=0
  # In a whole job the fitness check starts now, beside prepare, and first (the mesh waits for
  # every node's: the later it starts, the longer every node waits); the fitness stage then takes
  # its verdict.
  if ((!NODE_FROM_JOB)) && [[ ${NODE_WHOLE_TASK:-0} == 1 ]]; then node::start_fitness; fi
  # So does the barrier in a multi-node job: rank 0 listens, a worker dials and waits for rank 0's
  # image ID. None of them needs what prepare resolves.
  if ((!NODE_FROM_JOB)) && node::multi && node::has_image && [[ ${NODE_WHOLE_TASK:-0} == 1 ]]; then
    node::barrier_args
    if node::is_rank0; then node::serve_barrier; else node::join_image_phase; fi
  fi
  local argv=(node prepare --scratch "${SM_SCRATCH}")
  ((${#SM_CMD[@]})) && argv+=(-- "${SM_CMD[@]}")
  util::sm_logged prepare "${argv[@]}" || rc=$?
  ((rc == 0)) || node::fail "${UTIL_ERROR}" "${rc}" || return $?
  util::source "${SM_SCRATCH}/context.sh"
  [[ -n ${MASTER_PORT} ]] || export MASTER_PORT=${SM_MASTER_PORT}
}

# ---- fitness -------------------------------------------------------------------------------------

# node::stage_fitness: before any image moves, every node checks itself (the container runtime
# answers, free disk where the image and the outputs land, GPUs free of other jobs' processes) and
# the network between the nodes (each reaches every other on the job's fitness ports, a bandwidth
# probe along the ring, the clocks), in one helper (`slurm-multi fitness run`). Every node
# learns every other's verdict, so a bad node stops all of them here, in seconds, each naming it;
# the batch step judges the fitness.json files, requeues without the node or fails (lib/job.sh).
# With several tasks per node, the node's first task checks it. In a whole job the helper started
# beside prepare (node::start_fitness); run alone, the stage runs it.
node::stage_fitness() {
  if [[ ${SM_FITNESS} == off ]]; then
    log::info fitness "--fitness off: not checked"
    return 0
  fi
  if [[ ${SLURM_LOCALID:-0} != 0 ]]; then
    log::info fitness "checked by this node's first task"
    return 0
  fi
  [[ -n ${NODE_FITNESS_PID} ]] || node::start_fitness
  local rc=0
  wait "${NODE_FITNESS_PID}" || rc=$?
  NODE_FITNESS_PID=
  ((rc == 0)) && return 0
  local why="fitness check failed (exit ${rc}; see the lines above)"
  [[ -s ${SM_SCRATCH}/fitness.error ]] && why=$(<"${SM_SCRATCH}/fitness.error") && why=${why#slurm-multi: }
  node::fail "${why}" "${rc}"
}

# node::start_fitness: the fitness helper, in the background (NODE_FITNESS_PID). It needs nothing
# prepare resolves: the image is the plan's, the GPU count is prepare's own check.
node::start_fitness() {
  [[ ${SM_FITNESS} != off && ${SLURM_LOCALID:-0} == 0 ]] || return 0
  local hosts=() nnodes=1 rank=0 image=${SM_IMAGE:-${JOB_IMAGE:-}}
  if ((!NODE_FROM_JOB)) && ((NNODES > 1)); then
    slurm::hostnames_into hosts
    nnodes=${#hosts[@]} rank=${SLURM_NODEID:-0}
  fi
  ((${#hosts[@]})) || hosts=("$(hostname)")
  local argv=(run --rank "${rank}" --nnodes "${nnodes}" --hosts "${hosts[*]}" --job-id "${SLURM_JOB_ID:-0}"
    --master-port "${MASTER_PORT}" --timeout "${SM_FITNESS_TIMEOUT}" --runtime "${SM_RUNTIME}"
    --min-rate "${SM_FITNESS_MIN_RATE}" --out "${SM_NODE_DIR}/fitness.json" --disk "${SM_SCRATCH}=0")
  case ${SM_RUNTIME} in
    docker)
      argv+=(--docker-image "${image}")
      if [[ -n ${SM_IMAGE_CACHE:-} && -n ${image} ]]; then
        local bytes
        image::key_into "${image}"
        # A layered entry's blobs are what a load may need (at most; a holder needs less).
        cache::get "${SM_IMAGE_CACHE}/${IMAGE_KEY}.layers" blob_bytes bytes
        [[ -n ${bytes} ]] || cache::get "${SM_IMAGE_CACHE}/${IMAGE_KEY}.tar" bytes bytes
        [[ -z ${bytes} ]] || argv+=(--image-bytes "${bytes}")
      fi
      ;;
    # The squashfs lands in the cache (or the job dir); its size is known once it is made.
    pyxis) argv+=(--disk "${SM_IMAGE_CACHE:-${SM_JOBDIR}}=0") ;;
  esac
  util::remove "${SM_SCRATCH}/fitness.error"
  SM_ERROR_FILE=${SM_SCRATCH}/fitness.error util::sm fitness "${argv[@]}" &
  NODE_FITNESS_PID=$!
}

# ---- image ---------------------------------------------------------------------------------------

node::barrier_args() {
  BARRIER_ARGS=(--nnodes "${SM_NTASKS:-${NNODES}}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}"
    --job-id "${SLURM_JOB_ID:-0}")
}

# node::stage_image: rank 0 obtains the image (and fills the shared cache); a worker makes rank 0's
# image present. In a whole job rank 0 serves the barrier meanwhile, so workers learn what rank 0
# released the moment it exists, and any failure reaches them in seconds. Run alone, no barrier: a
# worker takes what node_0/status.json recorded. The flow is one for every runtime; the runtime
# supplies its verbs (below): node::image_<runtime>_rank0 alone|barrier (obtain on rank 0; sets
# NODE_IMAGE_RELEASE, what the barrier releases, and NODE_IMAGE_THEN, a step to run once it is
# released, or none), node::image_<runtime>_recorded (a worker run alone: the release rank 0
# recorded, into NODE_RELEASED) and node::image_<runtime>_worker RELEASED (obtain it on a worker).
# A verb that fails says what it could not do in NODE_IMAGE_FAILED.
node::stage_image() {
  if ! node::has_image; then
    log::info image "runtime ${SM_RUNTIME}: no image to distribute"
    node::fitness_cmd || node::fail "${NODE_IMAGE_FAILED}"
    return $?
  fi
  local rt=${SM_RUNTIME} reason alone=0
  NODE_IMAGE_FAILED='' NODE_IMAGE_RELEASE='' NODE_IMAGE_THEN=''
  if ! node::multi || ((NODE_FROM_JOB)); then alone=1; fi
  if node::is_rank0 && ((alone)); then
    "node::image_${rt}_rank0" alone || node::fail "image: ${NODE_IMAGE_FAILED} (see node.log)" || return $?
    node::fitness_cmd || node::fail "${NODE_IMAGE_FAILED}" || return $?
  elif node::is_rank0; then
    node::barrier_args
    [[ -n ${SM_BARRIER_PID} ]] || node::serve_barrier
    "node::image_${rt}_rank0" barrier || { node::image_abort "${NODE_IMAGE_FAILED} (see node_0/node.log)"; return $?; }
    node::fitness_cmd || { node::image_abort "${NODE_IMAGE_FAILED}"; return $?; }
    node::barrier_say "RELEASE ${NODE_IMAGE_RELEASE}"
    timeline::event release
    [[ -z ${NODE_IMAGE_THEN} ]] || "${NODE_IMAGE_THEN}" || { node::image_abort "${NODE_IMAGE_FAILED}"; return $?; }
  else
    if ((alone)); then
      "node::image_${rt}_recorded" || return $?
    else
      node::barrier_args
      node::await_release || return $?
    fi
    if ! "node::image_${rt}_worker" "${NODE_RELEASED}" || ! node::fitness_cmd; then
      reason="$(hostname) (rank ${SM_RANK}): ${NODE_IMAGE_FAILED}"
      if ((!alone)); then
        node::stop_join
        node::barrier_abort "${reason}"
      fi
      node::fail "${reason}" || return $?
    fi
  fi
}

# node::fitness_cmd: --fitness-cmd, the user's own check of this node, inside the job's image once
# it is here (rank 0: before it releases it; a worker: before it says it is ready), with the node's
# GPU arguments and the container env, bounded by --fitness-timeout. Its output goes to
# node_<rank>/fitness-cmd.log through the log filter (it sees the job's environment and may print a
# secret: raw only in the private scratch dir), its outcome to fitness-cmd.json (the batch step's
# judge reads it); the reason is cut only once masked, and said as `record-cmd` stored it.
node::fitness_cmd() {
  [[ -n ${SM_FITNESS_CMD:-} && ${SM_FITNESS} != off ]] || return 0
  local log=${SM_NODE_DIR}/fitness-cmd.log raw=${SM_SCRATCH}/fitness-cmd.out rc=0 argv=() last why stored
  case ${SM_RUNTIME} in
    docker)
      argv=(docker run --rm --network host "${RUN_GPU_ARGS[@]+"${RUN_GPU_ARGS[@]}"}" "${RUN_ENV_ARGS[@]+"${RUN_ENV_ARGS[@]}"}"
        --entrypoint sh "${SM_IMAGE_ID:-${SM_IMAGE}}" -c "${SM_FITNESS_CMD}")
      ;;
    # A step of its own on this node, in the squashfs the rank will run (as the rank's step is).
    pyxis)
      argv=(srun --job-name=sm-fitness-cmd --overlap --nodes=1 --ntasks=1 --nodelist="${SLURMD_NODENAME:-$(hostname)}"
        --kill-on-bad-exit=0 --container-image="${IMAGE_SQSH:-${SM_IMAGE_SQSH:-}}" sh -c "${SM_FITNESS_CMD}")
      ;;
    *) argv=(sh -c "${SM_FITNESS_CMD}") ;;
  esac
  log::cmd fitness timeout "${SM_FITNESS_TIMEOUT}" "${argv[@]}"
  timeout "${SM_FITNESS_TIMEOUT}" "${argv[@]}" </dev/null >"${raw}" 2>&1 || rc=$?
  util::redact --secrets-file "${SM_SCRATCH}/secrets" <"${raw}" >"${log}" ||
    log::warn fitness "could not copy --fitness-cmd's output into ${log} through the log filter"
  util::remove "${raw}"
  if ((rc == 0)); then
    log::info fitness "--fitness-cmd passed on $(hostname)"
    why=
  else
    last=$(grep -v '^[[:space:]]*$' "${log}" | tail -n 1) || last=
    last=${last:0:200} # (masked already: a secret is never cut in half before the filter sees it)
    if ((rc == 124)); then why="did not finish within ${SM_FITNESS_TIMEOUT} s"; else why="exited ${rc}${last:+: ${last}}"; fi
    why="fitness command on $(hostname): ${why} (node_${SM_RANK}/fitness-cmd.log)"
  fi
  if stored=$(util::sm fitness record-cmd "${SM_NODE_DIR}/fitness-cmd.json" "$(hostname)" "${rc}" "${why}"); then
    why=${stored:-${why}}
  else
    log::warn fitness "could not write ${SM_NODE_DIR}/fitness-cmd.json"
  fi
  ((rc != 0)) || return 0
  NODE_IMAGE_FAILED=${why}
  log::error fitness "${why}"
  return 1
}

# node::image_abort WHY: rank 0's image stage failed: every worker is told (ABORT), and it is the
# stage's reason.
node::image_abort() {
  local reason
  reason="rank 0 ($(hostname)): image stage failed: $1"
  node::barrier_say "ABORT ${reason}"
  node::fail "${reason}"
}

# ---- the image stage's verbs: docker -------------------------------------------------------------
# Rank 0 releases its image ID; a worker loads that ID (from the relay, the cache, a rebuild).

# node::image_docker_rank0 alone|barrier: under the barrier it also decides what moves: nothing (every
# worker holds the ID), the relay (released as relay+ID, streamed after), or the cache tar.
node::image_docker_rank0() {
  local id no_save=0
  # Alone, ensure_on_rank0 fills the cache itself.
  [[ $1 == alone ]] || no_save=1
  id=$(IMAGE_NO_SAVE=${no_save} image::ensure_on_rank0) || { NODE_IMAGE_FAILED="cannot obtain ${SM_IMAGE}"; return 1; }
  export SM_IMAGE_ID=${id}
  NODE_IMAGE_RELEASE=${id}
  [[ $1 == barrier ]] || return 0
  local how=
  if ! node::workers_hold "${id}"; then
    how=$(image::transport "${id}")
    # The cache only when every worker sees there what rank 0 sees (never rank 0's view alone).
    if [[ ${how} == cache ]] && ! node::workers_see_cache "${id}"; then
      if [[ ${SM_IMAGE_TRANSPORT} == cache ]]; then
        NODE_IMAGE_FAILED="--image-transport cache: ${NODE_CACHE_UNSEEN}"
        return 1
      fi
      log::warn image "${NODE_CACHE_UNSEEN}; relaying the image instead"
      how=relay
    fi
  fi
  if [[ -z ${how} ]]; then
    # A warm job moves nothing, with or without --image-cache: no save, no stream, no load.
    log::info image "every worker already holds ${SM_IMAGE} ${id:7:12}: nothing to save, stream or load"
  elif [[ ${how} == relay ]]; then
    # Released first: the workers dial in and load while this node saves. What each worker holds
    # of the image is known now (its image READY): the stream leaves it out.
    image::layer_plan "${id}" "${SM_SCRATCH}/${NODE_HOLDS_FILE}"
    log::info image "relaying ${SM_IMAGE} ${id:7:12} to the workers while it is saved (--image-transport ${SM_IMAGE_TRANSPORT})"
    NODE_IMAGE_RELEASE=relay+${id} NODE_IMAGE_THEN=node::image_docker_relay
  else
    image::layer_plan "${id}" "${SM_SCRATCH}/${NODE_HOLDS_FILE}"
    [[ -z ${SM_IMAGE_CACHE:-} ]] || image::cache_save "${SM_IMAGE_CACHE}" "$(image::cache_key "${SM_IMAGE}")" "${id}" "$(image::fingerprint)" || true
  fi
}

# node::image_docker_relay: once `relay+<id>` is out, stream the image to the workers.
node::image_docker_relay() {
  image::relay_send "${SM_IMAGE_ID}" && return 0
  NODE_IMAGE_FAILED=${IMAGE_RELAY_ERROR:-cannot save ${SM_IMAGE} (see node_0/node.log)}
  return 1
}

# node::image_docker_recorded: run alone, a worker loads the image ID rank 0's status.json holds.
node::image_docker_recorded() {
  [[ -n ${SM_IMAGE_ID:-} ]] || node::fail "image: rank 0's image ID is unknown (node_0/status.json has none: did rank 0's image stage succeed?)" 2 || return $?
  NODE_RELEASED=${SM_IMAGE_ID}
}

# node::image_docker_worker ID|relay+ID: SM_IMAGE_ID is then what this node runs (a rebuilt image
# has its own ID).
node::image_docker_worker() {
  local id=$1
  IMAGE_WORKER_ID=
  if [[ ${id} == relay+* ]]; then
    id=${id#relay+}
    log::info image "rank 0's image is ${SM_IMAGE} ${id:7:12}, relayed node to node"
    if image::relay_recv "${id}"; then
      IMAGE_WORKER_ID=${id}
    else
      log::warn image "$(hostname) (rank ${SM_RANK}): ${IMAGE_RELAY_ERROR}; falling back to the cache${SM_IMAGE_CACHE:+ ${SM_IMAGE_CACHE}} or a rebuild"
    fi
  else
    log::info image "rank 0's image is ${SM_IMAGE} ${id:7:12}"
  fi
  if [[ -z ${IMAGE_WORKER_ID} ]] && ! image::ensure_on_worker "${id}"; then
    NODE_IMAGE_FAILED="cannot get rank 0's image ${SM_IMAGE} ${id:7:12}"
    return 1
  fi
  export SM_IMAGE_ID=${IMAGE_WORKER_ID:-${id}}
}

# ---- the image stage's verbs: pyxis --------------------------------------------------------------
# Rank 0 makes (or finds) the squashfs and releases `sqsh:<bytes>:<cksum>`; a worker only checks
# that it sees that file: it needs no docker.

# node::image_pyxis_rank0 alone|barrier: the same either way.
node::image_pyxis_rank0() {
  image::pyxis_rank0 || { NODE_IMAGE_FAILED="cannot make a squashfs of ${SM_IMAGE}"; return 1; }
  NODE_IMAGE_RELEASE=${IMAGE_SQSH_ID}
  export SM_IMAGE_SQSH=${IMAGE_SQSH}
}

# Run alone, any size will do: node_0/status.json records the docker image ID only.
node::image_pyxis_recorded() { NODE_RELEASED=; }

# node::image_pyxis_worker SQSH_ID: SM_IMAGE_SQSH is what this rank starts.
node::image_pyxis_worker() {
  image::pyxis_worker "$1" || { NODE_IMAGE_FAILED="cannot see rank 0's squashfs $(image::sqsh_path)"; return 1; }
  # What the rank runs, for status.json: the docker image the squashfs was made from.
  local made_from
  made_from=$(cache::get "${IMAGE_SQSH}" id)
  export SM_IMAGE_ID=${made_from:-${SM_IMAGE_ID:-$1}} SM_IMAGE_SQSH=${IMAGE_SQSH}
}

# node::workers_hold ID: every worker said, in its image READY, that it already holds ID (the
# server appends `<rank> <id or ->` to barrier.holds as they come). Workers dial in beside prepare,
# so they have usually said it by now; rank 0 waits up to NODE_HOLDS_WAIT s for the others (a relay
# could not start streaming to them before they dial in either).
node::workers_hold() {
  local want=$1 workers=$((${SM_NTASKS:-${NNODES}} - 1)) deadline said=0 holding=0 rank nap=
  [[ ${SM_RUNTIME} == docker ]] && ((workers > 0)) || return 1
  deadline=$((SECONDS + ${NODE_HOLDS_WAIT:-10}))
  while :; do
    node::holds_read
    said=${#NODE_HELD[@]} holding=0
    for rank in "${!NODE_HELD[@]}"; do [[ ${NODE_HELD[${rank}]} != "${want}" ]] || holding=$((holding + 1)); done
    ((said < workers)) || break
    if ((SECONDS >= deadline)); then
      log::info image "$((workers - said)) worker(s) did not say within ${NODE_HOLDS_WAIT:-10} s which image they hold; moving the image"
      return 1
    fi
    # A worker whose join is a moment behind says it within milliseconds: short naps first.
    util::nap nap 0.01 0.02 0.05 0.1
  done
  if ((holding == workers)); then return 0; fi
  log::info image "${holding} of ${workers} worker(s) already hold ${want:7:12}"
  return 1
}

# node::holds_read: the one reader of barrier.holds in bash (NODE_HOLDS_FILE: rank 0's server
# appends `<rank> <held id|-> <cache:16 hex|-> [<layers claim>]` as each worker's image READY comes;
# the writer is py/slurm_multi/barrier.py; the layers claims are read by rank 0's layer plan,
# py/slurm_multi/layers/plan.py), as each worker last said it (a worker that reconnects says it
# again): NODE_HELD[rank]=id|- and NODE_CACHE_SEEN[rank]=hex|-. Empty when the file is not there yet.
node::holds_read() {
  local rank held cache _claim
  NODE_HELD=() NODE_CACHE_SEEN=()
  [[ -f ${SM_SCRATCH}/${NODE_HOLDS_FILE} ]] || return 0
  while read -r rank held cache _claim || [[ -n ${rank} ]]; do
    [[ -n ${rank} ]] || continue
    NODE_HELD[${rank}]=${held} NODE_CACHE_SEEN[${rank}]=${cache:--}
  done <"${SM_SCRATCH}/${NODE_HOLDS_FILE}"
}

# node::workers_see_cache ID: when rank 0's cache tar holds ID, every worker that does not hold ID
# itself said (in its image READY: barrier.holds' third column) that it sees that tar too; else
# NODE_CACHE_UNSEEN says which ranks do not (a cache dir that is node-local, or another directory
# on some nodes). A worker that has not said counts as not seeing it, unless --image-transport
# cache forces the cache (then only what a worker said counts). A cache that holds nothing yet is
# rank 0's to fill: nothing to check.
node::workers_see_cache() {
  local want=$1 tar unseen='' silent=1 workers=$((${SM_NTASKS:-${NNODES}} - 1)) r
  NODE_CACHE_UNSEEN=
  [[ -n ${SM_IMAGE_CACHE:-} ]] || return 0
  image::key_into "${SM_IMAGE}"
  image::cache_entry "${SM_IMAGE_CACHE}/${IMAGE_KEY}" "${want}" || return 0
  tar=${IMAGE_CACHE_ENTRY}
  [[ ${SM_IMAGE_TRANSPORT} != cache ]] || silent=0
  node::holds_read
  for ((r = 1; r <= workers; r++)); do
    if { [[ -v NODE_HELD[${r}] ]] || ((silent)); } && [[ ${NODE_HELD[${r}]:-} != "${want}" && ${NODE_CACHE_SEEN[${r}]:-} != "${want:7:16}" ]]; then
      unseen+="${unseen:+ }${r}"
    fi
  done
  [[ -n ${unseen} ]] || return 0
  local hosts=() names='' list
  list=$(slurm::hostnames "${SLURM_JOB_NODELIST:-}") || list=
  mapfile -t hosts <<<"${list}"
  for r in ${unseen}; do names+="${names:+, }rank ${r}${hosts[r]:+ (${hosts[r]})}"; done
  NODE_CACHE_UNSEEN="${names} do(es) not see the ${SM_IMAGE} tar that rank 0 sees (${tar}): --image-cache ${SM_IMAGE_CACHE} must be the same shared directory on every node"
  return 1
}

# node::await_release: a worker reads the ID rank 0 released (its join helper prints it) into
# NODE_RELEASED; the helper's own reason is the stage's when it fails.
node::await_release() {
  local rc=0
  NODE_RELEASED=
  [[ -n ${NODE_JOIN_PID} ]] || node::join_image_phase
  if ! read -r -u "${NODE_JOIN_FD}" NODE_RELEASED; then
    wait "${NODE_JOIN_PID}" || rc=$?
    node::join_failed "${rc}" || return $?
  fi
}

# node::serve_barrier: rank 0's barrier server, fed on a pipe: `RELEASE <id>` or `ABORT <reason>`.
# The pipe closing before a release (this task died) aborts the workers too.
node::serve_barrier() {
  local argv=(barrier serve "${BARRIER_ARGS[@]}" --timeout "${SM_BARRIER_TIMEOUT}"
    --image-timeout "${SM_IMAGE_TIMEOUT}" --control-stdin)
  [[ ${SM_RUNTIME} != docker ]] || argv+=(--holds-file "${SM_SCRATCH}/${NODE_HOLDS_FILE}")
  # The plan's layer chain: a worker's claim of how much of it its engine holds is checked against it.
  [[ ${SM_RUNTIME} != docker || -z ${JOB_IMAGE_LAYERS:-} ]] || argv+=(--layers-from JOB_IMAGE_LAYERS)
  log::cmd barrier "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
  log::info barrier "(its stdin is a pipe from this task: it gets 'RELEASE <image-id>' or 'ABORT <reason>')"
  exec {BARRIER_CTL}> >(trap - ERR; SM_ERROR_FILE=${SM_SCRATCH}/barrier.error util::sm "${argv[@]}")
  SM_BARRIER_PID=$!
}

# node::join_image_phase: a worker's whole barrier in one helper, started in the background (rank 0
# may still be building): it prints rank 0's image ID on a pipe the image stage reads, then waits
# for SIGUSR1 (this node has the image) to join the start phase; the barrier stage sends that and
# waits for it. Its one-line reason, if it fails, is in join.error.
node::join_image_phase() {
  local argv=(barrier join --rank "${SM_RANK}" "${BARRIER_ARGS[@]}" --phase both
    --connect-timeout "${SM_BARRIER_TIMEOUT}" --wait-timeout "$((SM_IMAGE_TIMEOUT + SM_BARRIER_TIMEOUT))")
  # It tells rank 0 which ID of the image this node holds: rank 0 moves nothing to a holder. (It
  # starts beside prepare, before SM_IMAGE is resolved here: the plan's JOB_IMAGE is the same.)
  local ref=${SM_IMAGE:-${JOB_IMAGE:-}} tar=
  [[ ${SM_RUNTIME} != docker || -z ${ref} ]] || argv+=(--holds-image "${ref}")
  # And how many layers of the plan's chain (rank 0's image when the job was planned) its engine
  # holds: rank 0 moves only the others (a rebuilt image's new top layer, say).
  [[ ${SM_RUNTIME} != docker || -z ${JOB_IMAGE_LAYERS:-} ]] || argv+=(--layers-from JOB_IMAGE_LAYERS)
  # And which image the shared cache's entry holds as this node sees it (rank 0 sends the cache only
  # to nodes that see its entry): read in the helper's own process, off this task's path.
  if [[ ${SM_RUNTIME} == docker && -n ${ref} && -n ${SM_IMAGE_CACHE:-} ]]; then
    image::key_into "${ref}"
    tar=${SM_IMAGE_CACHE}/${IMAGE_KEY}
  fi
  # Not util::py: the process substitution must BE the helper (exec), so SIGUSR1 reaches Python.
  exec {NODE_JOIN_FD}< <(
    local held
    if [[ -n ${tar} ]] && image::cache_entry "${tar}" ""; then
      cache::get "${IMAGE_CACHE_ENTRY}" id held && argv+=(--cache-holds "${held}")
    fi
    log::cmd image "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
    log::info image "(its stdout is a pipe to this task; SIGUSR1 from this task starts its start phase)"
    SM_ERROR_FILE=${SM_SCRATCH}/join.error PYTHONPATH="${SM_HOME}/py${PYTHONPATH:+:${PYTHONPATH}}" \
      exec "${SM_PYTHON}" -m slurm_multi "${argv[@]}"
  )
  NODE_JOIN_PID=$!
}

# node::stop_fitness: a task that fails or is stopped before its fitness stage took the verdict
# ends the fitness helper too (its peers then name this node at their deadline).
# (Not `wait`: on_term may have interrupted the fitness stage's own wait for it; util::wait_gone.)
node::stop_fitness() {
  [[ -n ${NODE_FITNESS_PID} ]] || return 0
  util::stop_child "${NODE_FITNESS_PID}"
  NODE_FITNESS_PID=
}

# node::stop_join: the worker gives up; its join helper goes (SIGTERM; not `wait`, as stop_fitness).
node::stop_join() {
  [[ -n ${NODE_JOIN_PID} ]] || return 0
  util::stop_child "${NODE_JOIN_PID}"
  NODE_JOIN_PID=
}

# node::join_failed RC: the join helper's own reason as the stage's.
node::join_failed() {
  local why="barrier: did not get a GO from rank 0 (join exit $1)"
  [[ -s ${SM_SCRATCH}/join.error ]] && why=$(<"${SM_SCRATCH}/join.error") && why=${why#slurm-multi: }
  NODE_JOIN_PID=
  node::fail "${why}" "$1"
}

# node::barrier_say LINE: one control line to rank 0's server (a subshell: a server that died must
# not take this task down with SIGPIPE).
node::barrier_say() {
  [[ -n ${BARRIER_CTL} ]] || return 0
  (printf '%s\n' "$1" >&"${BARRIER_CTL}") 2>/dev/null || log::warn barrier "the barrier server is gone; could not tell it '${1%% *}'"
}

# node::barrier_abort REASON: a worker that cannot go on tells rank 0, which aborts everyone within
# seconds instead of the whole barrier timeout.
node::barrier_abort() {
  node::barrier_args
  util::sm barrier abort --reason "$1" --connect-timeout 5 "${BARRIER_ARGS[@]:2}" >/dev/null 2>&1 || true
}

# ---- barrier -------------------------------------------------------------------------------------

node::stage_barrier() {
  node::multi || { log::info barrier "single node: no barrier"; return 0; }
  node::has_image || { log::info barrier "runtime ${SM_RUNTIME}: no image to wait for, no barrier"; return 0; }
  local rc=0
  node::barrier_args
  if node::is_rank0; then
    if [[ -z ${SM_BARRIER_PID} ]]; then
      # Alone (a re-run): serve in the foreground with the image already released.
      [[ -n ${SM_IMAGE_ID:-} ]] || node::fail "barrier: rank 0's image ID is unknown; run the image stage first" 2 || return $?
      util::sm_logged barrier barrier serve "${BARRIER_ARGS[@]}" --timeout "${SM_BARRIER_TIMEOUT}" --image-id "${SM_IMAGE_ID}" ||
        node::fail "${UTIL_ERROR}" "$?" || return $?
      return 0
    fi
    exec {BARRIER_CTL}>&-
    BARRIER_CTL=
    wait "${SM_BARRIER_PID}" || rc=$?
    SM_BARRIER_PID=
    if ((rc != 0)); then
      local why="barrier server failed (exit ${rc})"
      [[ -s ${SM_SCRATCH}/barrier.error ]] && why=$(<"${SM_SCRATCH}/barrier.error") && why=${why#slurm-multi: }
      node::fail "${why}" "${rc}" || return $?
    fi
    log::info barrier "every worker is ready; GO sent"
    timeline::event go
  elif [[ -n ${NODE_JOIN_PID} ]]; then
    # The join of the image stage goes on to the start phase: this node has the image.
    kill -USR1 "${NODE_JOIN_PID}"
    wait "${NODE_JOIN_PID}" || rc=$?
    exec {NODE_JOIN_FD}<&-
    ((rc == 0)) || node::join_failed "${rc}" || return $?
    NODE_JOIN_PID=
    log::info barrier "GO received"
    timeline::event go
  else
    util::sm_logged barrier barrier join --rank "${SM_RANK}" "${BARRIER_ARGS[@]}" --phase start \
      --connect-timeout "${SM_BARRIER_TIMEOUT}" --wait-timeout "${SM_BARRIER_TIMEOUT}" >/dev/null ||
      node::fail "${UTIL_ERROR}" "$?" || return $?
    log::info barrier "GO received"
    timeline::event go
  fi
}

# ---- run -----------------------------------------------------------------------------------------

node::stage_run() {
  if declare -F profile::before_run >/dev/null; then
    profile::before_run || node::fail "profile: cannot set up profiling (see node.log)" 2 || return $?
  fi
  case ${SM_RUNTIME} in
    docker) run::docker || node::fail "run: could not start the container" || return $? ;;
    none) run::bare ;;
    pyxis) run::pyxis || node::fail "run: could not start the rank's pyxis step" || return $? ;;
    *) node::fail "unknown runtime ${SM_RUNTIME}" 2 || return $? ;;
  esac
  if declare -F profile::after_run >/dev/null; then profile::after_run; fi # nsys: this rank's report settles
  NODE_EXIT=${RUN_EXIT}
  timeline::event exit code="${RUN_EXIT}"
  # A run that failed or hung on a node whose own engine, disk or clock failed is the node's fault.
  if ((RUN_EXIT != 0)) || [[ -n ${RUN_HUNG:-} ]]; then node::find_fault; fi
  # The hang watch stopped it: its reason, not the exit code the stop caused.
  [[ -z ${RUN_HUNG:-} ]] || { node::fail "${RUN_HUNG}" "$((RUN_EXIT == 0 ? 1 : RUN_EXIT))"; return $?; }
  # A manifest's script that is neither in the model dir nor in the image: madengine's wrapper
  # (slurm_multi.madrun) wrote the reason, naming the script, the model dir and --model-dir.
  local missing=${SM_SCRATCH}/output/.sm-script-missing reason
  if ((RUN_EXIT != 0)) && [[ -s ${missing} ]] && IFS= read -r reason <"${missing}"; then
    node::fail "${reason}" "${RUN_EXIT}"
    return $?
  fi
  case ${RUN_EXIT} in
    0) return 0 ;;
    124) node::fail "workload timed out after ${SM_TIMEOUT} s" 124 ;;
    *) node::fail "${NODE_FAULT:+${NODE_FAULT}: }$([[ ${SM_RUNTIME} == docker ]] && echo container || echo workload) exited ${RUN_EXIT}" "${RUN_EXIT}" ;;
  esac
}

# node::find_fault: NODE_FAULT, this node's own fault under a failed or hung run (the one its hang
# watch named, else its docker engine not answering, else its local disk failing: `slurm-multi
# node fault`, each check bounded), or empty. status.json carries it; collect names the node a bad
# node, and --on-bad-node requeue requeues the job without it. A workload's own failure or hang on
# a healthy node is not one.
node::find_fault() {
  local rc=0
  NODE_FAULT=$(util::sm node fault --runtime "${SM_RUNTIME}" --scratch "${SM_SCRATCH}" \
    --hang-json "${SM_NODE_DIR}/hang.json" --node "${NODE_HOST:-$(hostname)}") || rc=$?
  if ((rc != 0)); then
    NODE_FAULT=
    log::warn run "could not tell whether this node failed under the workload (slurm-multi node fault: exit ${rc})"
  fi
  [[ -z ${NODE_FAULT} ]] || log::error run "this node's own fault: ${NODE_FAULT}"
  return 0
}

# ---- save-outputs --------------------------------------------------------------------------------

# node::remove_container NAME: remove this rank's container in the background (NODE_RM_PID, which
# node::on_exit waits for), unless --keep-container or no container of this rank can exist.
node::remove_container() {
  [[ ${SM_KEEP_CONTAINER:-0} != 1 ]] && node::may_have_container || return 0
  run::engine -q rm -f "$1" >/dev/null &
  NODE_RM_PID=$!
}

# node::stage_save_outputs: copy what the workload left (result CSV, other outputs, diagnostics)
# into <jobdir>/node_<rank>/, and remove the container. Always runs, also after a failure.
node::stage_save_outputs() {
  local name csv src='' copy_out=0 copy_csv=0 copy_tools=0
  run::container_name name
  [[ -d ${SM_NODE_DIR} ]] || mkdir -p "${SM_NODE_DIR}"
  csv=${SM_RESULTS_CSV:-}
  [[ -z ${csv} ]] || src=${SM_SCRATCH}/output/${csv}
  # A CSV the workload left in its working dir is copied out of the container first; otherwise the
  # container is not needed any more and goes now, while the outputs are copied and status.json
  # written (the last rank's exit path no longer waits for a docker CLI started at its very end).
  [[ -z ${src} || -f ${src} ]] || ! node::may_have_container || copy_csv=1
  # madengine's tools' outputs staged inside the container (slurm_multi.madrun) are copied out too.
  [[ -z ${RUN_MAD_TOOLS_DIR:-} ]] || ! node::may_have_container || copy_tools=1
  ((copy_csv || copy_tools)) && copy_out=1
  ((copy_out)) || node::remove_container "${name}"
  if [[ -n ${csv} ]]; then
    # (Bounded, as every docker call on the way out: a hung engine must not hold the task.)
    local workdir
    if ((copy_csv)) && workdir=$(run::engine -q container inspect -f '{{.Config.WorkingDir}}' "${name}"); then
      run::engine -q cp "${name}:${workdir:-/}/${csv}" "${src}" >/dev/null || true
    fi
    # A manifest model writes it in its run directory (madengine's rule), as our -- CMD writes it in
    # the output dir; docker: the run directory is the container's working dir, copied out above.
    [[ -f ${src} || ! -f ${SM_SCRATCH}/run_directory/${csv} ]] || src=${SM_SCRATCH}/run_directory/${csv}
    if [[ -f ${src} ]]; then
      cp -f "${src}" "${SM_NODE_DIR}/${csv}"
      log::info save-outputs "saved ${csv} ($(wc -l <"${src}") lines)"
    else
      log::info save-outputs "no ${csv} on this node"
    fi
  fi
  if [[ -d ${SM_SCRATCH}/diagnostics ]]; then
    cp -rf "${SM_SCRATCH}/diagnostics" "${SM_NODE_DIR}/"
  fi
  # madengine's tools' outputs (rocprof_output/, *_env.csv, traces), staged by its wrapper: docker
  # inside the container (copied out as this user), pyxis and bare metal in the output dir.
  if ((copy_tools)); then
    mkdir -p "${SM_NODE_DIR}/tools"
    run::engine -q cp "${name}:${RUN_MAD_TOOLS_DIR}/." "${SM_NODE_DIR}/tools" >/dev/null 2>&1 ||
      log::info save-outputs "no tool outputs in ${name}:${RUN_MAD_TOOLS_DIR}"
  elif [[ -d ${SM_SCRATCH}/output/tools ]]; then
    cp -rf "${SM_SCRATCH}/output/tools" "${SM_NODE_DIR}/"
  fi
  [[ ! -d ${SM_NODE_DIR}/tools ]] || log::info save-outputs "saved the tools' outputs: $(cd "${SM_NODE_DIR}/tools" && echo *)"
  local f
  for f in "${SM_SCRATCH}"/output/*; do
    if [[ -f ${f} && ${f##*/} != "${csv}" ]]; then cp -f "${f}" "${SM_NODE_DIR}/" 2>/dev/null || true; fi
  done
  ((!copy_out)) || node::remove_container "${name}"
  return 0
}

# node::write_status: status.json, the node's verdict input (a helper writes it, atomically).
node::write_status() {
  local name argv=(node status --file "${SM_NODE_DIR}/status.json" --rank "${SM_RANK}" --node "${NODE_HOST:-$(hostname)}"
    --exit-code "${NODE_EXIT}" --reason "${NODE_REASON}" --image-id "${SM_IMAGE_ID:-}")
  [[ ${NODE_TERMINATED} != 1 ]] || argv+=(--terminated)
  [[ -z ${NODE_FAULT} ]] || argv+=(--node-fault "${NODE_FAULT}")
  for name in "${NODE_STAGE_ORDER[@]+"${NODE_STAGE_ORDER[@]}"}"; do
    argv+=(--stage "${name}:${NODE_STAGE_SECONDS[${name}]}:${NODE_STAGE_STATUS[${name}]}")
    [[ ${name} != run || -z ${RUN_EXIT} ]] || argv[-1]+=":${RUN_EXIT}"
  done
  util::helper "${argv[@]}" ||
    log::error node "cannot write ${SM_NODE_DIR}/status.json: ${UTIL_ERROR}"
}

# node::remove_scratch: the scratch dir holds the container env and the secrets list: never left.
node::remove_scratch() {
  [[ ${SM_KEEP_SCRATCH} == 1 || ${NODE_SCRATCH_FOREIGN} == 1 ]] || rm -rf "${SM_SCRATCH}"
}

# node::stage_reap: run by the batch step after the tasks ended, on every node. A task that died
# without staging (SIGKILL, OOM killer, a crash) left its container running under dockerd and its
# outputs in scratch: stop the container gracefully, save what it left, write its status, and
# remove its scratch.
node::stage_reap() {
  local name
  NODE_REAPING=1
  # The reaper reached this node (the batch step tells a rank that vanished with its node from one
  # whose reaper step never started: slurm_multi.watch mark_vanished).
  timeline::event reap
  run::container_name name
  if [[ -f ${SM_NODE_DIR}/status.json ]]; then
    [[ ${SM_RUNTIME} != docker ]] || run::engine -q rm -f "${name}" >/dev/null || true
    node::remove_scratch
    return 0
  fi
  log::warn reap "the task on $(hostname) ended without saving its outputs; collecting what it left"
  NODE_EXIT=137
  NODE_REASON="the sm-node task on $(hostname) died before saving its outputs (killed?); outputs recovered by the reaper"
  [[ -f ${SM_SCRATCH}/context.sh ]] && util::source "${SM_SCRATCH}/context.sh"
  if [[ ${SM_RUNTIME} == docker ]] && run::engine -q container inspect "${name}" >/dev/null; then
    run::diagnose "${name}" "task died; container left behind"
    run::stop_container "${name}"
    RUN_EXIT=$(run::engine -q container inspect -f '{{.State.ExitCode}}' "${name}" || echo "")
  fi
  node::stage_save_outputs
  NODE_STAGE_ORDER+=(reap) NODE_STAGE_SECONDS[reap]=0 NODE_STAGE_STATUS[reap]=ok
  node::write_status
  if [[ -n ${NODE_RM_PID:-} ]]; then wait "${NODE_RM_PID}" 2>/dev/null || true; fi
  node::remove_scratch
  return 0
}

# ---- the whole task ------------------------------------------------------------------------------

# node::on_term: scancel / srun cancel / time limit. Stop the container gracefully (SIGTERM first,
# so nsys writes its report), then let the EXIT path save everything.
node::on_term() {
  # Once: scancel, nsys and the nsight-slurm connector each forward a SIGTERM, a moment apart. Run
  # again inside itself, the handler waited on the same processes again, and the task hung in
  # that wait until Slurm's SIGKILL, staging nothing. Slurm's KillWait still bounds the stop.
  trap '' TERM INT
  util::log_resume
  NODE_TERMINATED=1
  log::warn node "received a termination signal; stopping the workload gracefully"
  local stage=${NODE_CURRENT_STAGE:-}
  if node::may_have_container; then run::stop_container "$(run::container_name)"; fi
  # Bare metal: the workload is our child (under nsight-slurm only this task gets the signal).
  if [[ ${SM_RUNTIME} == none && -n ${RUN_DOCKER_PID} ]]; then kill -TERM "${RUN_DOCKER_PID}" 2>/dev/null || true; fi
  # Polled, not `wait`ed: this handler may have interrupted the run stage's own wait for it.
  if [[ -n ${RUN_DOCKER_PID} ]]; then util::wait_gone "${RUN_DOCKER_PID}"; fi
  if [[ -n ${SM_BARRIER_PID} ]]; then node::barrier_say "ABORT rank 0 ($(hostname)) was terminated"; fi
  node::stop_fitness
  node::stop_join
  ((NODE_EXIT != 0)) || NODE_EXIT=143
  [[ -n ${NODE_REASON} ]] || NODE_REASON="terminated by a signal (scancel, time limit or a failed peer)"
  # The stage the signal cut short is in status.json and on the timeline with the time it ran.
  [[ -z ${stage} ]] || node::record_stage "${stage}" terminated
  exit "${NODE_EXIT}"
}

node::on_exit() {
  local rc=$?
  # Finishing up: a second SIGTERM must not cut the report wait or the saving short (Slurm's
  # SIGKILL after KillWait still bounds it).
  trap - EXIT
  trap '' TERM INT
  util::log_resume
  ((NODE_EXIT != 0)) || NODE_EXIT=${rc}
  node::stop_fitness
  if declare -F profile::after_run >/dev/null; then profile::after_run; fi
  # rank 0 leaving early (after an ABORT, or a failure before its release): closing the pipe tells
  # the server, which answers every worker still connecting with ABORT for its linger time.
  if [[ -n ${SM_BARRIER_PID} ]]; then
    [[ -n ${BARRIER_CTL} ]] && exec {BARRIER_CTL}>&-
    local waited=0 linger=${SM_BARRIER_LINGER:-15}
    # A failed fitness check: every node saw the same verdict and stops too; nobody joins late.
    [[ ${NODE_STAGE_STATUS[fitness]:-} != failed ]] || linger=0
    while kill -0 "${SM_BARRIER_PID}" 2>/dev/null && ((waited < linger * 5)); do
      sleep 0.2
      waited=$((waited + 1))
    done
    util::stop_child "${SM_BARRIER_PID}"
  fi
  # Outputs are saved on every exit path of a job's task (and of a re-run that ran the workload).
  if [[ ${NODE_STAGE_STATUS[save-outputs]:-} != ok ]] && { ((!NODE_FROM_JOB)) || [[ -n ${NODE_STAGE_STATUS[run]:-} ]]; }; then
    node::stage save-outputs || true
  fi
  node::write_status
  if [[ -n ${NODE_RM_PID:-} ]]; then wait "${NODE_RM_PID}" 2>/dev/null || true; fi
  log::info node "done: exit ${NODE_EXIT}${NODE_REASON:+ (${NODE_REASON})}"
  util::log_drain
  node::remove_scratch
  util::remove_private_dir # (a re-run by hand may have used one before its scratch dir was made)
  exit "${NODE_EXIT}"
}

# node::run STAGE…: run the stages in order, stopping at the first failure; status.json and the
# scratch clean-up happen on every exit path (the EXIT trap).
node::run() {
  local name rc
  for name in "$@"; do
    rc=0
    node::stage "${name}" || rc=$?
    if ((rc != 0)); then
      ((NODE_EXIT != 0)) || NODE_EXIT=${rc}
      # A worker that cannot start tells rank 0, which aborts everyone within seconds instead
      # of waiting for the barrier timeout. (rank 0 aborts its own barrier in the image stage.)
      if [[ ${name} == prepare || ${name} == fitness ]] && node::multi && ! node::is_rank0 && ((!NODE_FROM_JOB)); then
        node::stop_join
        node::barrier_abort "$(hostname) (rank ${SM_RANK}): ${NODE_REASON}"
      fi
      # rank 0 failing before its release tells the workers why (its server is already up).
      if [[ ${name} == prepare || ${name} == fitness ]] && [[ -n ${BARRIER_CTL} ]]; then
        node::barrier_say "ABORT rank 0 ($(hostname)): ${NODE_REASON}"
      fi
      return "${NODE_EXIT}"
    fi
  done
  return "${NODE_EXIT}"
}
