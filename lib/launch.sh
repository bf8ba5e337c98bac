# shellcheck shell=bash
# The worker step's argv, per runtime and profiler. One function builds the whole command, so the
# batch log, the dry run and the golden tests (tests/bats/golden/) all show exactly what runs.
#
#   every runtime         srun <native options> bin/sm-node --jobdir DIR [-- CMD]
#                         (sm-node runs docker, the workload on the node, or -- pyxis -- each rank's
#                         own step: srun --overlap -N1 -n1 -w NODE --container-image=<squashfs>
#                         --container-mounts=<ONE list> sh -c <rank ids> [nsys profile …] CMD)
#   nsight-slurm, none    env SLURM_SUBMIT_DIR=<log dir> <home>/bin/nsight-slurm srun <native
#                         options> -- bin/sm-node …  (the wrapper re-runs srun with its connector in
#                         front and appends --export=ALL; so no --export here and no --job-name:
#                         the wrapper names the step nsight-slurm-connector). Under pyxis the wrapper
#                         starts each rank's step instead (lib/run.sh).

# launch::tasks_per_node: worker tasks per node (docker: one container per node).
launch::tasks_per_node() {
  local n=${SM_NTASKS_PER_NODE}
  [[ ${SM_RUNTIME} == docker || ! ${n} =~ ^[1-9][0-9]*$ ]] && n=1
  printf '%s' "${n}"
}

# launch::task_identity (bin/sm-node, before node::init): with several tasks per node (runtime
# none) every task is a rank of its own: RANK = SLURM_PROCID, LOCAL_RANK = SLURM_LOCALID.
launch::task_identity() {
  [[ ${SM_RUNTIME} != docker && -n ${SLURM_PROCID:-} ]] || return 0
  local ntasks=${SLURM_STEP_NUM_TASKS:-${SLURM_NTASKS:-1}} nnodes=${SLURM_STEP_NUM_NODES:-${SLURM_NNODES:-1}}
  ((ntasks > nnodes)) || return 0
  export SM_RANK=${SM_RANK:-${SLURM_PROCID}} RANK=${RANK:-${SLURM_PROCID}} WORLD_SIZE=${WORLD_SIZE:-${ntasks}}
  export LOCAL_RANK=${LOCAL_RANK:-${SLURM_LOCALID:-0}} SM_NODE_RANK=${SM_NODE_RANK:-${SLURM_NODEID:-0}}
  export SM_NTASKS=${SM_NTASKS:-${ntasks}}
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

# launch::step_argv: the worker step's whole argv, into LAUNCH_ARGV. Every runtime runs sm-node on
# the nodes (one task per node; per rank with --ntasks-per-node under none and pyxis): it stages,
# times and judges each rank. Under pyxis each rank's container is a step sm-node starts itself
# (lib/run.sh run::pyxis); under nsight-slurm with bare metal the wrapper starts this step, so the
# connector profiles the rank's own process tree.
launch::step_argv() {
  local nodes=${SLURM_JOB_NUM_NODES:-1} tasks native=() cmd=() env=()
  local launcher=0
  LAUNCH_ARGV=()
  [[ ${SM_PROFILE} == nsight-slurm && ${SM_RUNTIME} == none ]] && launcher=1
  tasks=$(launch::tasks_per_node)
  # --no-kill: a node that fails does not make Slurm SIGKILL the step's other tasks (they could not
  # stage); the batch step's watch stops them gracefully and names the node (docs/bad-nodes.md).
  native=(--nodes="${nodes}" --ntasks-per-node="${tasks}" --kill-on-bad-exit=0 --no-kill)
  ((launcher)) || native+=(--job-name=sm-node)
  # pyxis: the GPUs belong to the ranks' own steps (lib/run.sh asks for them there).
  [[ ${SM_RUNTIME} != pyxis || ! ${SLURM_GPUS_ON_NODE:-0} =~ ^[1-9] ]] || native+=(--gres=none)
  native+=(--label)
  # The wrapper's job state (and the connectors' view of it) lives under the log dir.
  ((launcher)) && env+=(SLURM_SUBMIT_DIR="${SM_JOBDIR}")
  cmd=("${SM_HOME}/bin/sm-node" --jobdir "${SM_JOBDIR}")
  [[ -n ${SM_CMD[0]+x} ]] && cmd+=(-- "${SM_CMD[@]}")
  ((${#env[@]})) && LAUNCH_ARGV+=(env "${env[@]}")
  if ((launcher)); then
    LAUNCH_ARGV+=("${SM_NSIGHT_SLURM_HOME}/bin/nsight-slurm" srun "${native[@]}" -- "${cmd[@]}")
  else
    LAUNCH_ARGV+=(srun "${native[@]}" "${cmd[@]}")
  fi
}
