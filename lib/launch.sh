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

# launch::_is_secret NAME: values of these never go into argv (it is visible in ps and logs).
launch::_is_secret() { [[ ${1^^} =~ TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|^MAD_SECRETS ]]; }

# launch::_pyxis_context: what pyxis needs from the manifest, as NUL-separated KIND VALUE pairs
# (image, mount, env NAME=VALUE, cmd). Restored in a subshell, as the batch step never holds
# manifest values in its own environment.
launch::_pyxis_context() {
  (
    if [[ -n ${SM_MANIFEST:-} ]]; then
      # shellcheck source=/dev/null
      source <(util::sm manifest restore "${SM_MANIFEST}" ${SM_MODEL:+--model "${SM_MODEL}"} 2>/dev/null) || exit 2
    fi
    # shellcheck source=lib/run.sh
    source "${SM_HOME}/lib/run.sh"
    local m name cmd=()
    printf 'image\0%s\0' "${SM_CONTAINER_IMAGE:-${SM_IMAGE:-}}"
    for m in "${SM_MOUNTS[@]+"${SM_MOUNTS[@]}"}"; do printf 'mount\0%s\0' "${m}"; done
    for name in "${SM_DOCKER_ENV_NAMES[@]+"${SM_DOCKER_ENV_NAMES[@]}"}"; do
      [[ -n ${!name+x} ]] || continue
      if launch::_is_secret "${name}"; then
        # pyxis passes the task's environment on: an exported secret still reaches the container.
        printf 'secret\0%s\0' "${name}"
      else
        printf 'env\0%s=%s\0' "${name}" "${!name}"
      fi
    done
    mapfile -d '' cmd < <(run::workload_argv)
    for m in "${cmd[@]+"${cmd[@]}"}"; do printf 'cmd\0%s\0' "${m}"; done
  )
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

# launch::step_argv: the worker step's whole argv (NUL-separated).
launch::step_argv() {
  local nodes=${SLURM_JOB_NUM_NODES:-1} tasks native=() cmd=() env=() argv=() mounts=() kind value
  local launcher=0
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
    local image=""
    while IFS= read -r -d '' kind && IFS= read -r -d '' value; do
      case ${kind} in
        image) image=$(launch::pyxis_image "${value}") ;;
        mount) mounts+=("${value}") ;;
        env) env+=("${value}") ;;
        secret) [[ -n ${!value+x} ]] || log::warn launch "${value} from the manifest is not in the environment; export it to pass it to pyxis" ;;
        cmd) cmd+=("${value}") ;;
      esac
    done < <(launch::_pyxis_context)
    # No sm-node inside the container: the rank env comes from here and from SLURM_PROCID/LOCALID.
    env+=(MASTER_ADDR="${MASTER_ADDR:-$(util::first_node)}" MASTER_PORT="${SM_MASTER_PORT}"
      NNODES="${nodes}" WORLD_SIZE="$((nodes * tasks))" SM_OUTPUT_DIR="${SM_JOBDIR}/output")
    mounts+=("${SM_JOBDIR}:${SM_JOBDIR}")
    if declare -F profile::container_mounts >/dev/null; then
      mapfile -d '' -O "${#mounts[@]}" mounts < <(profile::container_mounts)
    fi
    native+=(--container-image="${image}" --container-mounts="$(launch::container_mounts "${mounts[@]}")")
    if [[ ${SM_PROFILE:-none} == nsys ]]; then
      local prefix=()
      mapfile -d '' prefix < <(profile::nsys_prefix)
      cmd=("${prefix[@]}" "${cmd[@]+"${cmd[@]}"}")
    fi
  else
    cmd=("${SM_HOME}/bin/sm-node" --jobdir "${SM_JOBDIR}")
    [[ -n ${SM_CMD[0]+x} ]] && cmd+=(-- "${SM_CMD[@]}")
  fi
  ((${#env[@]})) && argv+=(env "${env[@]}")
  if ((launcher)); then
    argv+=("${SM_NSIGHT_SLURM_HOME}/bin/nsight-slurm" srun "${native[@]}" -- "${cmd[@]}")
  else
    argv+=(srun "${native[@]}" "${cmd[@]}")
  fi
  printf '%s\0' "${argv[@]}"
}
