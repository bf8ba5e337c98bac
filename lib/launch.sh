# shellcheck shell=bash
# The worker step's argv, per runtime and profiler. One function builds the whole command, so the
# batch log, the dry run and the golden tests (tests/bats/golden/) all show exactly what runs.
#
#   runtime docker|none   srun <native options> bin/sm-node --jobdir DIR [-- CMD]
#                         (sm-node runs docker, or the workload directly on the node)
#   runtime pyxis         [env K=V…] srun <native options> --container-image=IMG
#                         --container-mounts=<ONE list> [nsys profile …] CMD
#   profile nsight-slurm  env SLURM_SUBMIT_DIR=<log dir> [K=V…] <home>/bin/nsight-slurm srun
#                         <native options> -- CMD   (the wrapper re-runs srun with its connector in
#                         front and appends --export=ALL; so no --export here and no --job-name:
#                         the wrapper names the step nsight-slurm-connector)

# launch::tasks_per_node: worker tasks per node (docker: one container per node).
launch::tasks_per_node() {
  local n=${SM_NTASKS_PER_NODE:-${SLURM_NTASKS_PER_NODE:-1}}
  [[ ${SM_RUNTIME:-docker} == docker || ! ${n} =~ ^[1-9][0-9]*$ ]] && n=1
  printf '%s' "${n}"
}

# launch::task_identity (bin/sm-node, before node::init): with several tasks per node (runtime
# none) every task is a rank of its own: RANK = SLURM_PROCID, LOCAL_RANK = SLURM_LOCALID.
launch::task_identity() {
  [[ ${SM_RUNTIME:-docker} != docker && -n ${SLURM_PROCID:-} ]] || return 0
  local ntasks=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}} nnodes=${SLURM_STEP_NUM_NODES:-${SLURM_NNODES:-1}}
  ((ntasks > nnodes)) || return 0
  export SM_RANK=${SM_RANK:-${SLURM_PROCID}} RANK=${RANK:-${SLURM_PROCID}} WORLD_SIZE=${WORLD_SIZE:-${ntasks}}
  export LOCAL_RANK=${LOCAL_RANK:-${SLURM_LOCALID:-0}} SM_NODE_RANK=${SM_NODE_RANK:-${SLURM_NODEID:-0}}
}

# launch::pyxis_image IMAGE: a docker reference as pyxis/enroot spell it. enroot separates the
# registry with '#' (registry.example/llm:1.0 -> registry.example#llm:1.0); a docker-style
# reference would be looked up on Docker Hub. Paths (squashfs files) and '#' forms pass unchanged.
launch::pyxis_image() {
  local image=$1 first=${1%%/*}
  if [[ ${image} != */* || ${image} == /* || ${image} == .* || ${image} == *'#'* ]]; then
    printf '%s' "${image}"
  elif [[ ${first} == *.* || ${first} == *:* || ${first} == localhost ]]; then
    printf '%s#%s' "${first}" "${image#*/}"
  else
    printf '%s' "${image}"
  fi
}

# launch::container_mounts MOUNT…: ONE --container-mounts value, first mount per destination wins.
# pyxis honours only the last --container-mounts, so everything must be in this one.
launch::container_mounts() {
  local m dst list=() seen=" "
  for m in "$@"; do
    dst=${m#*:}
    dst=${dst%%:*}
    [[ ${seen} == *" ${dst} "* ]] && continue
    seen+="${dst} "
    list+=("${m}")
  done
  local IFS=,
  printf '%s' "${list[*]}"
}

# launch::step_argv: the worker step's whole argv, into LAUNCH_ARGV. For pyxis the image, mounts,
# env and workload come from the job plan (JOB_*: lib/job.sh, resolved once by the helper); values
# of secret-named variables never go into argv (visible in ps and logs): the task's environment
# carries them to the container.
launch::step_argv() {
  local nodes=${SLURM_JOB_NUM_NODES:-1} tasks native=() cmd=() env=() mounts=() name
  local launcher=0
  LAUNCH_ARGV=()
  [[ ${SM_PROFILE:-none} == nsight-slurm ]] && launcher=1
  tasks=$(launch::tasks_per_node)
  native=(--nodes="${nodes}" --ntasks-per-node="${tasks}" --kill-on-bad-exit=0)
  ((launcher)) || native+=(--job-name=sm-node)
  native+=(--label)
  if ((launcher)); then
    # The wrapper's job state (and the connectors' view of it) lives under the log dir.
    env+=(SLURM_SUBMIT_DIR="${SM_JOBDIR}")
  fi
  if [[ ${SM_RUNTIME:-docker} == pyxis ]]; then
    mounts=("${JOB_PYXIS_MOUNTS[@]+"${JOB_PYXIS_MOUNTS[@]}"}")
    env+=("${JOB_PYXIS_ENV[@]+"${JOB_PYXIS_ENV[@]}"}")
    for name in "${JOB_PYXIS_SECRET_NAMES[@]+"${JOB_PYXIS_SECRET_NAMES[@]}"}"; do
      [[ -n ${!name+x} ]] || log::warn launch "${name} from the manifest is not in the environment; export it to pass it to pyxis"
    done
    cmd=("${JOB_WORKLOAD[@]+"${JOB_WORKLOAD[@]}"}")
    # No sm-node inside the container: the rank env comes from here and from SLURM_PROCID/LOCALID.
    env+=(MASTER_ADDR="${MASTER_ADDR:-$(util::first_node)}" MASTER_PORT="${SM_MASTER_PORT}"
      NNODES="${nodes}" WORLD_SIZE="$((nodes * tasks))" SM_OUTPUT_DIR="${SM_JOBDIR}/output")
    mounts+=("${SM_JOBDIR}:${SM_JOBDIR}")
    if declare -F profile::container_mounts >/dev/null; then
      local extra
      extra=$(profile::container_mounts | tr '\0' '\n') || return 2
      while IFS= read -r name; do [[ -n ${name} ]] && mounts+=("${name}"); done <<<"${extra}"
    fi
    native+=(--container-image="$(launch::pyxis_image "${SM_CONTAINER_IMAGE:-${JOB_IMAGE:-}}")"
      --container-mounts="$(launch::container_mounts "${mounts[@]}")")
    if [[ ${SM_PROFILE:-none} == nsys ]]; then
      local prefix
      prefix=$(profile::nsys_prefix | tr '\0' '\n') || return 2
      local words=()
      while IFS= read -r name; do words+=("${name}"); done <<<"${prefix}"
      cmd=("${words[@]}" "${cmd[@]+"${cmd[@]}"}")
    fi
  else
    cmd=("${SM_HOME}/bin/sm-node" --jobdir "${SM_JOBDIR}")
    [[ -n ${SM_CMD[0]+x} ]] && cmd+=(-- "${SM_CMD[@]}")
  fi
  ((${#env[@]})) && LAUNCH_ARGV+=(env "${env[@]}")
  if ((launcher)); then
    LAUNCH_ARGV+=("${SM_NSIGHT_SLURM_HOME}/bin/nsight-slurm" srun "${native[@]}" -- "${cmd[@]}")
  else
    LAUNCH_ARGV+=(srun "${native[@]}" "${cmd[@]}")
  fi
}
