# shellcheck shell=bash
# shellcheck disable=SC2031 # dry-run helpers read the subshell's SLURM_JOB_ID
# The batch step: job directory, one srun task per node, the watch loop, teardown, aggregation.

JOB_SRUN_PID=
JOB_STEP_ID=
JOB_TEARDOWN_STARTED=0

# job::manifest_value VAR: a value the manifest would restore, read in a subshell so the batch
# step's environment (which srun passes to the tasks) is not filled with manifest values.
job::manifest_values() {
  [[ -n ${SM_MANIFEST:-} ]] || return 0
  (
    # shellcheck source=/dev/null
    source <(util::sm manifest restore "${SM_MANIFEST}" ${SM_MODEL:+--model "${SM_MODEL}"} 2>/dev/null) || exit 2
    declare -p SM_MODEL_KEY SM_MODEL_NAME SM_IMAGE SM_RESULTS_CSV SM_MODEL_ARGS SM_MODEL_TAGS SM_DOCKERFILE \
      SM_BASE_DOCKER SM_N_GPUS SM_GPUS_PER_NODE SM_LAUNCHER SM_BUILD_DURATION SM_DOCKER_OPTS SM_MODEL_SCRIPTS \
      2>/dev/null | sed 's/^declare -[a-zA-Z-]* /JOBM_/'
  )
}

# job::model_name: the directory name for this model under --out.
job::model_name() {
  local name=${JOBM_SM_MODEL_NAME:-${SM_MODEL:-}}
  [[ -n ${name} ]] || name=${SM_IMAGE:-${JOBM_SM_IMAGE:-job}}
  name=${name##*/}
  printf '%s' "${name}" | tr -c 'A-Za-z0-9._-' '_'
}

job::write_job_json() {
  local file=$1 nodes=() n first=1
  mapfile -t nodes < <(scontrol show hostnames "${SLURM_JOB_NODELIST}" 2>/dev/null)
  {
    printf '{\n'
    printf '  "job_id": %s,\n' "$(util::json_str "${SLURM_JOB_ID}")"
    printf '  "model_key": %s,\n' "$(util::json_str "${JOBM_SM_MODEL_KEY:-}")"
    printf '  "model": %s,\n' "$(util::json_str "$(job::model_name)")"
    printf '  "nnodes": %s,\n' "${SLURM_JOB_NUM_NODES:-${#nodes[@]}}"
    printf '  "nodes": ['
    for n in "${nodes[@]}"; do
      ((first)) || printf ', '
      first=0
      util::json_str "${n}"
    done
    printf '],\n'
    printf '  "results_csv": %s,\n' "$(util::json_str "${SM_RESULTS_CSV:-${JOBM_SM_RESULTS_CSV:-}}")"
    printf '  "image": %s,\n' "$(util::json_str "${SM_IMAGE:-${JOBM_SM_IMAGE:-}}")"
    printf '  "args": %s,\n' "$(util::json_str "${JOBM_SM_MODEL_ARGS:-}")"
    printf '  "tags": %s,\n' "$(util::json_str "${JOBM_SM_MODEL_TAGS:-}")"
    printf '  "dockerfile": %s,\n' "$(util::json_str "${JOBM_SM_DOCKERFILE:-}")"
    printf '  "base_docker": %s,\n' "$(util::json_str "${JOBM_SM_BASE_DOCKER:-}")"
    printf '  "n_gpus": %s,\n' "$(util::json_str "${JOBM_SM_N_GPUS:-}")"
    printf '  "gpus_per_node": %s,\n' "$(util::json_str "${JOBM_SM_GPUS_PER_NODE:-}")"
    printf '  "launcher": %s,\n' "$(util::json_str "${JOBM_SM_LAUNCHER:-}")"
    printf '  "build_duration": %s,\n' "$(util::json_str "${JOBM_SM_BUILD_DURATION:-}")"
    printf '  "additional_docker_run_options": %s,\n' "$(util::json_str "${JOBM_SM_DOCKER_OPTS[*]:-}")"
    printf '  "manifest": %s,\n' "$(util::json_str "${SM_MANIFEST:-}")"
    printf '  "profile": %s,\n' "$(util::json_str "${SM_PROFILE}")"
    printf '  "runtime": %s,\n' "$(util::json_str "${SM_RUNTIME}")"
    printf '  "started": %s\n' "$(util::json_str "$(date -u +%FT%TZ)")"
    printf '}\n'
  } >"${file}.tmp" && mv -f "${file}.tmp" "${file}"
}

# job::srun_argv: how the batch step starts one sm-node task per node (NUL-separated).
job::srun_argv() {
  # Other runtimes and nsight-slurm change the step's shape: lib/launch.sh builds it then.
  if declare -F launch::step_argv >/dev/null; then
    launch::step_argv
    return
  fi
  local argv=(srun --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 --kill-on-bad-exit=0
    --job-name=sm-node --label "${SM_HOME}/bin/sm-node" --jobdir "${SM_JOBDIR}")
  ((${#SM_CMD[@]})) && argv+=(-- "${SM_CMD[@]}")
  printf '%s\0' "${argv[@]}"
}

job::run() {
  # shellcheck source=/dev/null
  source <(job::manifest_values) || log::die multi "cannot read the manifest ${SM_MANIFEST}" 2
  local out=${SM_OUT}
  [[ ${out} == /* ]] || out=${SLURM_SUBMIT_DIR:-${PWD}}/${out#./}
  SM_JOBDIR=${out}/$(job::model_name)/${SLURM_JOB_ID}
  export SM_JOBDIR
  mkdir -p "${SM_JOBDIR}" || log::die multi "cannot create the job directory ${SM_JOBDIR}" 1
  export SM_BATCH_LOG=${SM_JOBDIR}/batch.log
  # The barrier's per-job secret; never printed (it travels in the environment, not in argv). Made
  # before the log filter starts, so the filter knows to mask it.
  [[ -n ${SM_BARRIER_TOKEN:-} ]] || SM_BARRIER_TOKEN=$(util::generate_token)
  export SM_BARRIER_TOKEN
  # The logger ignores SIGTERM (scancel signals the whole batch step): teardown must still be heard.
  exec > >(trap '' TERM INT HUP; util::sm redact | tee -a "${SM_BATCH_LOG}") 2>&1
  [[ -n ${SM_MANIFEST:-} ]] && SM_MANIFEST=$(readlink -f "${SM_MANIFEST}") && export SM_MANIFEST
  job::write_job_json "${SM_JOBDIR}/job.json"
  log::info multi "job ${SLURM_JOB_ID}: ${SLURM_JOB_NUM_NODES} nodes (${SLURM_JOB_NODELIST}), outputs in ${SM_JOBDIR}"
  trap 'job::teardown "normal end"' EXIT
  trap 'job::teardown "SIGTERM (scancel or time limit)"; exit 143' TERM
  trap 'job::teardown "SIGINT"; exit 130' INT
  trap 'job::teardown "SIGUSR1 (time limit approaching)"; exit 3' USR1
  if declare -F profile::before_steps >/dev/null; then
    profile::before_steps || log::die multi "profiling setup failed (see ${SM_BATCH_LOG})" 1
  fi
  local argv=()
  mapfile -d '' argv < <(job::srun_argv)
  log::cmd multi "${argv[@]}"
  "${argv[@]}" &
  JOB_SRUN_PID=$!
  job::watch
  local rc=0
  wait "${JOB_SRUN_PID}" 2>/dev/null || rc=$?
  JOB_SRUN_PID=
  log::info multi "node tasks ended (srun exit ${rc})"
  JOB_SRUN_RC=${rc}
}

# job::step_id: the id of our sm-node step (for scancel --signal=TERM <job>.<step>).
job::step_id() {
  [[ -n ${JOB_STEP_ID} ]] || JOB_STEP_ID=$(squeue -s -j "${SLURM_JOB_ID}" -h -o '%i|%j' 2>/dev/null |
    awk -F'|' '$2 == "sm-node" || $2 == "nsight-slurm-connector" { split($1, a, "."); print a[2]; exit }')
  printf '%s' "${JOB_STEP_ID}"
}

# job::node_stage RANK: the stage a node is in, from its live log.
job::node_stage() {
  local log=${SM_JOBDIR}/node_$1/node.log
  [[ -f ${SM_JOBDIR}/node_$1/status.json ]] && { echo finished; return; }
  [[ -f ${log} ]] || { echo starting; return; }
  grep -o ' stage [a-z]*' "${log}" 2>/dev/null | tail -n 1 | awk '{ print $2 }' || true
}

# job::watch: wait for the tasks; show progress; when one node fails, give the others
# --peer-grace seconds, then stop them gracefully (SIGTERM to the step, never SIGKILL).
job::watch() {
  local failed_since=0 last_progress=${SECONDS} r progress status tick=0
  while kill -0 "${JOB_SRUN_PID}" 2>/dev/null; do
    # A short poll, so the job ends as soon as the tasks do; the checks below run once a second.
    sleep 0.1
    (((tick += 1) % 10 == 0)) || continue
    if ((SECONDS - last_progress >= ${SM_PROGRESS_SECONDS:-15})); then
      progress=""
      for ((r = 0; r < ${SLURM_JOB_NUM_NODES:-1}; r++)); do progress+=" node_${r}=$(job::node_stage "${r}")"; done
      log::info multi "progress:${progress}"
      last_progress=${SECONDS}
    fi
    if ((failed_since == 0)); then
      for status in "${SM_JOBDIR}"/node_*/status.json; do
        [[ -f ${status} ]] || continue
        if ! grep -q '"exit_code": 0,' "${status}"; then
          failed_since=${SECONDS}
          log::warn multi "${status%/status.json} failed; the other nodes get ${SM_PEER_GRACE} s before they are stopped"
          break
        fi
      done
    elif ((SECONDS - failed_since >= SM_PEER_GRACE)); then
      job::stop_step "a node failed ${SM_PEER_GRACE} s ago"
      failed_since=$((SECONDS + 1000000))
    fi
  done
}

# job::stop_step REASON: run the pre-cleanup hooks (profiling flush), then SIGTERM the node tasks.
# Not SIGTERM to srun: srun turns that into SIGKILL for the tasks.
job::stop_step() {
  local step
  teardown::pre_cleanup "$1"
  step=$(job::step_id)
  [[ -n ${step} ]] || return 0
  log::cmd multi scancel --signal=TERM "${SLURM_JOB_ID}.${step}"
  scancel --signal=TERM "${SLURM_JOB_ID}.${step}" 2>/dev/null || true
}

# job::reap: a node task that died without staging (SIGKILL, crash) left a container and outputs
# behind; one short step per node stops the container and stages them. Skipped when every node
# staged already.
job::reap() {
  local r missing=0
  for ((r = 0; r < ${SLURM_JOB_NUM_NODES:-1}; r++)); do
    [[ -f ${SM_JOBDIR}/node_${r}/status.json ]] || missing=1
  done
  ((missing)) || return 0
  [[ ${SM_RUNTIME:-docker} == docker ]] || return 0
  local argv=(srun --overlap --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 --kill-on-bad-exit=0
    --job-name=sm-reap --label "${SM_HOME}/bin/sm-node" --stage reap --jobdir "${SM_JOBDIR}")
  log::cmd multi "${argv[@]}"
  # A node that is down cannot be reaped; do not let it hold the teardown for long.
  timeout "${SM_REAP_TIMEOUT:-$((SM_STOP_GRACE + 30))}" "${argv[@]}" ||
    log::warn multi "the reaper step did not finish on every node (a node down?); going on"
}

# job::all_staged: every rank of the worker step wrote its status.json.
job::all_staged() {
  local per_node=1 r
  declare -F launch::tasks_per_node >/dev/null && per_node=$(launch::tasks_per_node)
  for ((r = 0; r < ${SLURM_JOB_NUM_NODES:-1} * per_node; r++)); do
    [[ -f ${SM_JOBDIR}/node_${r}/status.json ]] || return 1
  done
}

# job::teardown REASON: every exit path ends here, once: flush, stop tasks, aggregate.
job::teardown() {
  ((JOB_TEARDOWN_STARTED == 0)) || return 0
  JOB_TEARDOWN_STARTED=1
  trap - EXIT
  local reason=$1 rc=${JOB_SRUN_RC:-0} deadline
  log::info multi "teardown: ${reason}"
  if [[ -n ${JOB_SRUN_PID} ]] && kill -0 "${JOB_SRUN_PID}" 2>/dev/null; then
    job::stop_step "${reason}"
    # Wait for the tasks, not for srun: after a cancel srun can sit for a minute waiting for the
    # step to be reaped, and Slurm's SIGKILL (KillWait after the SIGTERM) must not find us before
    # collect. Once every rank has staged (status.json), go on.
    deadline=$((SECONDS + SM_STOP_GRACE + 30))
    while kill -0 "${JOB_SRUN_PID}" 2>/dev/null && ((SECONDS < deadline)) && ! job::all_staged; do sleep 0.2; done
    if kill -0 "${JOB_SRUN_PID}" 2>/dev/null; then
      log::info multi "every rank has staged; not waiting for srun to notice"
    else
      wait "${JOB_SRUN_PID}" 2>/dev/null || rc=$?
    fi
  else
    teardown::pre_cleanup "${reason}"
  fi
  job::reap
  teardown::post_cleanup
  if settings::truthy "${SM_COLLECT}"; then
    local cargs=("${SM_JOBDIR}")
    [[ -n ${SM_MANIFEST:-} ]] && cargs+=(--manifest "${SM_MANIFEST}")
    log::cmd multi slurm-multi results collect "${cargs[@]}"
    rc=0
    util::sm results collect "${cargs[@]}" || rc=$?
    log::info multi "verdict: $( ((rc == 0)) && echo SUCCESS || echo FAILURE) (${SM_JOBDIR}/summary.json)"
  fi
  exit "${rc}"
}

# ---- dry run -------------------------------------------------------------------------------------

# job::dry_run NODES: the full plan, without Slurm or docker. Secrets are masked.
job::dry_run() {
  local nnodes=$1
  # shellcheck disable=SC2030,SC2031 # the plan runs in a subshell on purpose
  (
    export SLURM_JOB_ID=${SLURM_JOB_ID:-DRYRUN} SLURM_JOB_NUM_NODES=${nnodes}
    # shellcheck source=/dev/null
    source <(job::manifest_values) || log::die multi "cannot read the manifest ${SM_MANIFEST}" 2
    job::dry_run_plan "${nnodes}"
  ) | util::sm redact
}

job::dry_run_plan() {
  local nnodes=$1 r out=${SM_OUT} argv=() entry name
  [[ ${out} == /* ]] || out=${PWD}/${out#./}
  SM_JOBDIR=${out}/$(job::model_name)/${SLURM_JOB_ID}
  printf '== slurm-multi plan: %s nodes, model %s ==\n\n' "${nnodes}" "$(job::model_name)"
  printf 'Settings\n'
  for entry in "${SETTINGS_TABLE[@]}"; do
    name=${entry%%|*}
    printf '  %-20s %s\n' "${name}" "${!name:-}"
  done
  printf '  %-20s %s\n' SM_BARRIER_TOKEN "$([[ -n ${SM_BARRIER_TOKEN:-} ]] && echo '*** (given)' || echo '(generated per job)')"
  printf '  %-20s %s\n\n' "job dir" "${SM_JOBDIR}"
  mapfile -d '' argv < <(SLURM_JOB_NUM_NODES=${nnodes} job::srun_argv)
  printf 'Batch step (on the first node)\n  %s\n\n' "$(printf '%q ' "${argv[@]}")"
  if declare -F profile::dry_run_panel >/dev/null; then
    profile::dry_run_panel "${nnodes}"
  fi
  for ((r = 0; r < nnodes; r++)); do
    job::dry_run_node "${r}" "${nnodes}"
  done
}

# job::dry_run_node RANK NNODES: what sm-node would run on that node (its prepare stage, simulated).
job::dry_run_node() {
  local r=$1 nnodes=$2
  (
    # shellcheck source=/dev/null
    for lib in image run node; do source "${SM_HOME}/lib/${lib}.sh"; done
    export SM_RANK=${r} NODE_RANK=${r} RANK=${r} NNODES=${nnodes} WORLD_SIZE=${nnodes} LOCAL_RANK=0
    export SLURM_NODEID=${r} SLURM_PROCID=${r} SLURMD_NODENAME="<node ${r}>" MASTER_ADDR="<node 0>"
    export MASTER_PORT=${SM_MASTER_PORT} SM_SCRATCH="${TMPDIR:-/tmp}/slurm-multi.${SLURM_JOB_ID}.r${r}"
    export SM_OUTPUT_DIR=/sm-out
    if [[ -n ${SM_MANIFEST:-} ]]; then
      # shellcheck source=/dev/null
      source <(util::sm manifest restore "${SM_MANIFEST}" ${SM_MODEL:+--model "${SM_MODEL}"} 2>/dev/null)
    fi
    local role="worker"
    ((r == 0)) && role="rank 0 (serves the barrier)"
    ((nnodes == 1)) && role="single node (no cache, no barrier)"
    printf 'Node %s: %s\n' "${r}" "${role}"
    printf '  image: %s%s\n' "${SM_IMAGE:-<none>}" "${SM_IMAGE_CACHE:+ (shared tar cache ${SM_IMAGE_CACHE})}"
    local argv=() m
    mapfile -d '' argv < <(SM_GPU_VENDOR=none run::docker_argv 2>/dev/null)
    printf '  %s (GPU arguments are added on the node from what it detects)\n' "${SM_RUNTIME}"
    printf '  %s\n' "$(printf '%q ' "${argv[@]}")"
    printf '  mounts (host -> container):\n'
    for m in "${SM_MOUNTS[@]+"${SM_MOUNTS[@]}"}" "${SM_SCRATCH}/output:/sm-out"; do
      printf '    %-50s -> %s\n' "${m%%:*}" "${m#*:}"
    done
    printf '  env:\n'
    local var
    for var in "${RUN_RANK_ENV[@]}" "${SM_DOCKER_ENV_NAMES[@]+"${SM_DOCKER_ENV_NAMES[@]}"}"; do
      [[ -n ${!var+x} ]] || continue
      if [[ ${var^^} =~ TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|^MAD_SECRETS ]]; then
        printf '    %s=***\n' "${var}"
      else
        printf '    %s=%s\n' "${var}" "${!var}"
      fi
    done
    printf '\n'
  )
}
