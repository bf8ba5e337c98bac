# shellcheck shell=bash
# shellcheck disable=SC2034 # state shared by the sourced libraries and bin/sm-node
# The run stage: docker run the workload with host networking, the node's GPUs, de-duplicated
# mounts, the restored env and the rank env; a bounded diagnostic snapshot on failure.

# Events on the node's timeline (lib/timeline.sh), also where this file is sourced alone.
# shellcheck source=lib/timeline.sh
declare -F timeline::event >/dev/null || source "$(dirname "${BASH_SOURCE[0]}")/timeline.sh"

# How long the node's docker engine may take to answer one control call (inspect, stop, kill, cp,
# rm, logs): a healthy engine answers in well under a second, and a hung one (it accepts and never
# answers) must never hold a task, its TERM handler or its exit path. The one bound of every such
# call (run::engine); `docker stop -t G` gets the grace G on top.
RUN_ENGINE_TIMEOUT=15

# run::engine [-q] [-t EXTRA] ARGS…: `docker ARGS…` within RUN_ENGINE_TIMEOUT (+ EXTRA) seconds, its
# stdout and exit status as docker's (-q: its stderr dropped, for calls whose status is the answer;
# -t: a call that waits on purpose, e.g. `docker stop -t GRACE`, gets GRACE on top). When the engine
# did not answer in time: one warning naming the call on stderr, and 124.
run::engine() {
  local quiet=0 rc=0 bound=${RUN_ENGINE_TIMEOUT}
  [[ $1 != -q ]] || { quiet=1 && shift; }
  [[ $1 != -t ]] || { bound=$((bound + $2)) && shift 2; }
  if ((quiet)); then
    timeout "${bound}" docker "$@" 2>/dev/null || rc=$?
  else
    timeout "${bound}" docker "$@" || rc=$?
  fi
  ((rc != 124)) || log::warn run "the docker engine did not answer 'docker $*' within ${bound} s"
  return "${rc}"
}

# run::container_name [VAR]: one name per job and rank, so cleanup can always find the container;
# printed, or into VAR (no subshell on the run stage's path).
run::container_name() { util::reply "${1:-}" "sm-${SLURM_JOB_ID:-local}-r${SM_RANK:-0}"; }

# Variables a job step carries that the workload and profilers (nsys %q{}) need. Passed as
# NAME=VALUE (none of them is a secret), so the logged docker command pastes back as it ran.
# SM_ATTEMPT (the batch step's job::export_attempt) and SLURM_RESTART_COUNT (Slurm sets it once the
# job was requeued) let a checkpointing workload resume.
RUN_RANK_ENV=(MASTER_ADDR MASTER_PORT NNODES NODE_RANK RANK WORLD_SIZE LOCAL_RANK
  SLURM_JOB_ID SLURM_PROCID SLURM_NODEID SLURMD_NODENAME SLURM_NNODES SLURM_JOB_NODELIST SLURM_STEP_ID
  SLURM_RESTART_COUNT SM_OUTPUT_DIR SM_RANK SM_ATTEMPT)

# run::docker_argv: the full `docker run` argv into RUN_ARGV, from what prepare resolved
# (RUN_GPU_ARGS, RUN_DOCKER_OPTS with the de-duplicated mounts, RUN_ENV_ARGS with the manifest's env
# file, RUN_WORKLOAD). No helper runs here: prepare already checked every piece.
run::docker_argv() {
  local var name
  run::container_name name
  RUN_ARGV=(docker run --name "${name}" --network host --init
    "${RUN_GPU_ARGS[@]+"${RUN_GPU_ARGS[@]}"}" "${RUN_DOCKER_OPTS[@]+"${RUN_DOCKER_OPTS[@]}"}")
  for var in "${RUN_RANK_ENV[@]}"; do
    [[ -n ${!var+x} ]] && RUN_ARGV+=(-e "${var}=${!var}")
  done
  # Profiling adds its own variables (values in this shell, passed by name).
  for var in "${SM_EXTRA_ENV_NAMES[@]+"${SM_EXTRA_ENV_NAMES[@]}"}"; do
    [[ -n ${!var+x} ]] && RUN_ARGV+=(-e "${var}")
  done
  # RUN_SETUP (a manifest model's run directory, filled from its read-only scripts) comes first, so
  # the profiler sees the model's own command.
  RUN_ARGV+=("${RUN_ENV_ARGS[@]+"${RUN_ENV_ARGS[@]}"}" "${SM_IMAGE}" "${RUN_SETUP[@]+"${RUN_SETUP[@]}"}"
    "${SM_PROFILE_PREFIX[@]+"${SM_PROFILE_PREFIX[@]}"}" "${RUN_WORKLOAD[@]+"${RUN_WORKLOAD[@]}"}")
}

# run::workload_started: the workload is on its way (every runtime says so here): on the timeline.
run::workload_started() {
  timeline::event container_start
}

# run::diagnose NAME REASON: a bounded, non-fatal snapshot next to the failure.
run::diagnose() {
  local name=$1 reason=$2 dir=${SM_SCRATCH}/diagnostics rc=0
  mkdir -p "${dir}" || return 0
  log::info run "capturing diagnostics (${reason}) into node_${SM_RANK}/diagnostics/"
  {
    printf 'reason: %s\nnode: %s\ntime: %s\n' "${reason}" "$(hostname)" "$(date -u +%FT%TZ)"
    run::engine inspect -f 'status={{.State.Status}} exit={{.State.ExitCode}} oom_killed={{.State.OOMKilled}} error={{.State.Error}} started={{.State.StartedAt}} finished={{.State.FinishedAt}}' "${name}"
  } >"${dir}/container-state.txt" 2>&1 || rc=$?
  # An engine that did not answer once is not asked again: the snapshot stays within one bound.
  if ((rc != 124)); then
    run::engine logs --tail 200 "${name}" >"${dir}/container-log-tail.txt" 2>&1 || true
    run::engine top "${name}" >"${dir}/container-processes.txt" 2>&1 || true
  fi
  timeout 10 ss -ltnp >"${dir}/listening-sockets.txt" 2>&1 || true
  run::diagnose_host "${dir}"
}

# run::diagnose_host DIR: what every snapshot has (the node's processes, the node log's tail), then
# every file of it redacted: secrets stay out of diagnostics too.
run::diagnose_host() {
  local dir=$1 f
  timeout 10 ps -eo pid,ppid,stat,etime,rss,args --sort=-rss 2>&1 | head -n 60 >"${dir}/host-processes.txt" || true
  [[ -f ${SM_NODE_LOG:-} ]] && tail -n 100 "${SM_NODE_LOG}" >"${dir}/node-log-tail.txt" 2>/dev/null
  for f in "${dir}"/*.txt; do
    if util::redact --secrets-file "${SM_SCRATCH}/secrets" <"${f}" >"${f}.r" 2>/dev/null; then
      mv -f "${f}.r" "${f}"
    else # (a secrets file it cannot read): never kept unfiltered, it may hold a secret
      rm -f "${f}.r"
      echo "(not kept: the log filter could not run on it)" >"${f}"
    fi
  done
  return 0
}

# run::stop_container NAME: SIGTERM (so profilers write their reports), SIGKILL after the grace.
# (Bounded: a hung engine must not hold a stopped task, and the job, for ever.)
run::stop_container() {
  local name=$1
  run::engine -q container inspect "${name}" >/dev/null || return 0
  log::cmd run docker stop -t "${SM_STOP_GRACE}" "${name}"
  run::engine -q -t "${SM_STOP_GRACE}" stop -t "${SM_STOP_GRACE}" "${name}" >/dev/null || true
}

# run::hang_watch TARGET_ARGS...: the hang watch beside the workload (py/slurm_multi/hangwatch.py:
# no new output line in the node log and no CPU for --hang-timeout seconds; a hang under which this
# node's engine, local disk or clock failed is named the node's fault). When it says hung, this
# subshell snapshots diagnostics, records the reason in ${SM_SCRATCH}/hung and stops the workload
# (SIGKILL for a frozen or stopped one: SIGTERM cannot reach it). Sets RUN_HANG_PID.
run::hang_watch() {
  RUN_HANG_PID=
  util::remove "${SM_SCRATCH}/hung"
  ((SM_HANG_TIMEOUT > 0)) || return 0
  # A cause holds its stop up to the peer grace until the other ranks' watches have spoken (a rerun
  # by hand has no peers running).
  local peers=()
  ((${NODE_FROM_JOB:-0})) || peers=(--job-dir "${SM_JOBDIR}" --ranks "${SM_NTASKS:-${NNODES:-1}}" --hold "${SM_PEER_GRACE}")
  (
    trap - TERM INT EXIT
    local rc=0 state line target=("$@") step=
    if [[ $1 == --step-name ]]; then
      # A pyxis rank: its step shows up in Slurm a moment after srun starts it; its tasks on this
      # node are what the watch reads.
      local tries=0
      while [[ -z ${step} && ! -e ${SM_SCRATCH}/run-done ]] && ((tries++ < 150)); do
        step=$(run::pyxis_step_id) || step=
        [[ -n ${step} ]] || sleep 0.2
      done
      [[ -n ${step} ]] || { [[ -e ${SM_SCRATCH}/run-done ]] || log::warn run "no step $2 of this job on this node: this rank has no hang watch"; exit 0; }
      target=(--step "${SLURM_JOB_ID}.${step}")
    fi
    # A direct child (no command substitution), so stopping this subshell's children stops it.
    util::sm_aside node hang-watch "${target[@]}" --timeout "${SM_HANG_TIMEOUT}" --output "${SM_NODE_LOG}" \
      --node-dir "${SM_NODE_DIR}" --diagnostics "${SM_SCRATCH}/diagnostics" --rank "${SM_RANK}" \
      --node "${NODE_HOST:-$(hostname)}" --local-dir "${SM_SCRATCH}" "${peers[@]+"${peers[@]}"}" >"${SM_SCRATCH}/hang-watch.out" || rc=$?
    ((rc == 3)) && [[ ! -e ${SM_SCRATCH}/run-done ]] || exit 0
    read -r state line <"${SM_SCRATCH}/hang-watch.out"
    printf '%s\n' "${line}" >"${SM_SCRATCH}/hung"
    log::error run "${line}; stopping the workload"
    if [[ ${1} == --container ]]; then
      run::diagnose "$2" "${line}"
      run::stop_hung_container "$2" "${state}"
    elif [[ ${1} == --step-name ]]; then
      run::pyxis_diagnose "${line}"
      # A stopped or frozen task cannot take SIGTERM: SIGKILL, then SIGCONT so that it goes.
      case ${state} in
        frozen | stopped)
          log::cmd run scancel --signal=KILL "${SLURM_JOB_ID}.${step}"
          scancel --signal=KILL "${SLURM_JOB_ID}.${step}" 2>/dev/null || true
          scancel --signal=CONT "${SLURM_JOB_ID}.${step}" 2>/dev/null || true
          ;;
        *) run::pyxis_stop "${line}" ;;
      esac
    else
      case ${state} in frozen | stopped) run::kill_tree KILL "$2" "${RUN_WORKLOAD_TICKS:-}" ;; *) run::kill_tree TERM "$2" "${RUN_WORKLOAD_TICKS:-}" ;; esac
      run::kill_tree CONT "$2" "${RUN_WORKLOAD_TICKS:-}"
    fi
  ) &
  RUN_HANG_PID=$!
}

# run::start_ticks PID: when PID started (clock ticks since boot, /proc/PID/stat field 22). With the
# PID it names one process: a PID the kernel reused belongs to a process with another start time.
run::start_ticks() {
  local stat fields=()
  stat=$(<"/proc/$1/stat") 2>/dev/null || return 1
  read -r -a fields <<<"${stat##*) }"
  printf '%s' "${fields[19]:-}"
}

# run::kill_tree SIGNAL PID [TICKS]: PID and every descendant (children first). A bare-metal
# workload is a tree (sh -c '… sleep …'); signalling only its top would orphan the rest, still
# holding the log. With TICKS (run::start_ticks at launch), nothing is signalled unless PID is still
# that process: the workload may have ended and been reaped, and its PID reused, since the watch
# looked.
run::kill_tree() {
  local sig=$1 pid=$2 ticks=${3:-} child
  if [[ -n ${ticks} && $(run::start_ticks "${pid}" || true) != "${ticks}" ]]; then
    return 0
  fi
  # (pgrep exits 1 when there is no child: inside $(…) under errtrace that was an "error" and a call tree)
  for child in $(pgrep -P "${pid}" 2>/dev/null || true); do run::kill_tree "${sig}" "${child}"; done
  kill "-${sig}" "${pid}" 2>/dev/null || true
}

# run::stop_hung_container NAME STATE: a paused container must be unpaused before docker can stop
# it; a frozen or stopped workload cannot act on SIGTERM, so it is killed at once.
run::stop_hung_container() {
  local name=$1 state=$2
  if [[ $(run::engine -q container inspect -f '{{.State.Paused}}' "${name}") == true ]]; then
    log::cmd run docker unpause "${name}"
    run::engine -q unpause "${name}" >/dev/null || true
  fi
  case ${state} in
    frozen | stopped)
      log::cmd run docker kill "${name}"
      run::engine -q kill "${name}" >/dev/null || true
      ;;
    *) run::stop_container "${name}" ;;
  esac
}

# run::took_hang_verdict: once the workload has ended (docker, bare metal, pyxis): when the hang watch
# stopped it, wait for the watch to finish that stop and take its reason into RUN_HUNG (0); else
# end the watch (1).
run::took_hang_verdict() {
  if [[ -f ${SM_SCRATCH}/hung ]]; then
    wait "${RUN_HANG_PID}" 2>/dev/null || true
    RUN_HUNG=$(<"${SM_SCRATCH}/hung")
    return 0
  fi
  run::end_watchers "${RUN_HANG_PID}"
  return 1
}

# run::end_watchers PID...: stop the watchdogs of a workload that ended on its own.
run::end_watchers() {
  local pid
  for pid in "$@"; do
    [[ -n ${pid} ]] || continue
    util::kill_children TERM "${pid}"
    kill -TERM "${pid}" 2>/dev/null || true
    wait "${pid}" 2>/dev/null || true
  done
}

# run::docker: run the container, enforce SM_TIMEOUT; sets RUN_EXIT (124 = timed out).
# The wait is on the docker client itself (it returns the moment the container exits); a
# watchdog subshell handles the time limit: snapshot first, then a graceful stop.
run::docker() {
  local name pid rc=0 watchdog=""
  run::docker_argv
  run::container_name name
  # The name is the job's and the rank's: only a re-run by hand can find an old one in the way.
  if ((${NODE_FROM_JOB:-0})); then run::engine -q rm -f "${name}" >/dev/null || true; fi
  util::remove "${SM_SCRATCH}/timed-out" "${SM_SCRATCH}/run-done"
  log::cmd run "${RUN_ARGV[@]}"
  "${RUN_ARGV[@]}" </dev/null &
  pid=$!
  RUN_DOCKER_PID=${pid}
  run::workload_started
  if ((SM_TIMEOUT > 0)); then
    local task=${BASHPID}
    (
      trap - TERM INT EXIT
      # A second at a time, so a task killed outright (SIGKILL, OOM) leaves no watchdog behind.
      local deadline=$((SECONDS + SM_TIMEOUT))
      while ((SECONDS < deadline)); do
        kill -0 "${task}" 2>/dev/null || exit 0
        [[ ! -e ${SM_SCRATCH}/run-done ]] || exit 0
        # Never on the node log's pipe: a sleep orphaned by run::end_watchers would hold it open, and
        # srun waits for that pipe (a whole second per job, measured by bench/cpu_profile.py).
        sleep 1 >/dev/null 2>&1
      done
      # The workload ended first: this watchdog's sleep was cut short on purpose, nothing to do.
      [[ -e ${SM_SCRATCH}/run-done ]] && exit 0
      : >"${SM_SCRATCH}/timed-out"
      log::error run "workload exceeded --timeout ${SM_TIMEOUT} s; stopping ${name}"
      run::diagnose "${name}" "timeout after ${SM_TIMEOUT} s"
      run::stop_container "${name}"
    ) &
    watchdog=$!
  fi
  run::hang_watch --container "${name}"
  wait "${pid}" || rc=$?
  RUN_DOCKER_PID=
  # Said before the watchdogs are stopped, so a watchdog woken by that stop does nothing.
  : >"${SM_SCRATCH}/run-done"
  if [[ -f ${SM_SCRATCH}/timed-out ]]; then
    wait "${watchdog}" 2>/dev/null || true
    run::end_watchers "${RUN_HANG_PID}"
    RUN_EXIT=124
    return 0
  fi
  run::end_watchers "${watchdog}"
  RUN_EXIT=${rc}
  # Stopped by the hang watch: its reason is the verdict (the same helper as bare metal and pyxis).
  run::took_hang_verdict && return 0
  if ((rc != 0)); then
    log::error run "container ${name} exited ${rc}"
    run::diagnose "${name}" "container exited ${rc}"
  fi
  return 0
}

# run::bare: the bare-metal runtime (--runtime none): the workload runs as this task itself.
run::bare() {
  local cmd=() rc=0 pid
  ((${#RUN_WORKLOAD[@]})) || { log::error run "no workload command: give -- CMD or a manifest with scripts"; RUN_EXIT=2; return 0; }
  cmd=("${SM_PROFILE_PREFIX[@]+"${SM_PROFILE_PREFIX[@]}"}" "${RUN_WORKLOAD[@]}")
  log::cmd run "${cmd[@]}"
  # The manifest's env reaches the workload only: exported in the subshell that becomes it.
  (
    util::source "${SM_SCRATCH}/workload.env" || exit 2
    cd "${RUN_WORKDIR:-${SM_SCRATCH}/output}" && SM_OUTPUT_DIR=${SM_SCRATCH}/output exec "${cmd[@]}"
  ) </dev/null &
  pid=$!
  RUN_DOCKER_PID=${pid}
  RUN_WORKLOAD_TICKS=$(run::start_ticks "${pid}" || true)
  run::workload_started
  rm -f "${SM_SCRATCH}/run-done"
  run::hang_watch --pid "${pid}"
  if ((SM_TIMEOUT > 0)); then
    local deadline=$((SECONDS + SM_TIMEOUT))
    while kill -0 "${pid}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    if kill -0 "${pid}" 2>/dev/null; then
      log::error run "workload exceeded --timeout ${SM_TIMEOUT} s; sending SIGTERM"
      run::kill_tree TERM "${pid}"
      wait "${pid}" 2>/dev/null || true
      : >"${SM_SCRATCH}/run-done"
      run::end_watchers "${RUN_HANG_PID}"
      RUN_EXIT=124
      return 0
    fi
  fi
  wait "${pid}" || rc=$?
  RUN_DOCKER_PID=
  : >"${SM_SCRATCH}/run-done"
  run::took_hang_verdict || true
  RUN_EXIT=${rc}
}

# ---- pyxis ---------------------------------------------------------------------------------------
# The rank's container is a step of its own: this task (on the node, outside any container) starts
# `srun --overlap -N1 -n1 -w <this node> --container-image=<squashfs> …` and waits for it, so the
# rank is staged and judged exactly like a docker rank. Slurm gives that inner step its own task
# ids (SLURM_PROCID 0 on every node); the first words of its command put the job's back.
# shellcheck disable=SC2016 # expanded by sh inside the container
RUN_PYXIS_RANK_SH='export SLURM_PROCID="${SM_PYXIS_PROCID:-$SLURM_PROCID}" SLURM_LOCALID="${SM_PYXIS_LOCALID:-$SLURM_LOCALID}" SLURM_NODEID="${SM_PYXIS_NODEID:-$SLURM_NODEID}" SLURM_NTASKS="${SM_PYXIS_NTASKS:-$SLURM_NTASKS}" SLURM_NNODES="${SM_PYXIS_NNODES:-$SLURM_NNODES}"; exec "$@"'

# run::pyxis_step_name: the inner step's name (the nsight-slurm wrapper names its own).
run::pyxis_step_name() {
  if [[ ${SM_PROFILE} == nsight-slurm ]]; then printf nsight-slurm-connector; else printf 'sm-rank%s' "${SM_RANK:-0}"; fi
}

# run::pyxis_argv: the inner step's whole argv into RUN_ARGV: ONE --container-mounts (pyxis keeps
# only the last) with the job's mounts, the node's output dir and the profiler's, each destination
# once; the profiler's prefix in front of the workload.
run::pyxis_argv() {
  local mounts=() extra name native=()
  mounts=("${RUN_PYXIS_MOUNTS[@]+"${RUN_PYXIS_MOUNTS[@]}"}" "${SM_SCRATCH}/output:${SM_OUTPUT_DIR}")
  if declare -F profile::container_mounts >/dev/null; then
    extra=$(profile::container_mounts | tr '\0' '\n') || return 2
    while IFS= read -r name; do [[ -n ${name} ]] && mounts+=("${name}"); done <<<"${extra}"
  fi
  native=(--overlap --nodes=1 --ntasks=1 --nodelist="${SLURMD_NODENAME:-$(hostname)}" --kill-on-bad-exit=0)
  # A job with GPUs: the rank's step asks for its share (a step gets no GPU it does not ask for).
  if [[ ${SLURM_GPUS_ON_NODE:-0} =~ ^[1-9][0-9]*$ ]]; then
    native+=(--gpus-per-task="$((SLURM_GPUS_ON_NODE / $(launch::tasks_per_node) > 0 ? SLURM_GPUS_ON_NODE / $(launch::tasks_per_node) : 1))")
  fi
  local sqsh=${IMAGE_SQSH:-$(image::sqsh_path)} workdir
  native+=(--container-image="${sqsh}" --container-mounts="$(launch::container_mounts "${mounts[@]}")")
  # A manifest model runs in its run directory (prepare); any other command in the image's WORKDIR,
  # as docker runs it (recorded when the squashfs was imported).
  workdir=${RUN_WORKDIR:-$(cache::sidecar_get "${sqsh}.id" workdir)}
  [[ -z ${workdir} ]] || native+=(--container-workdir="${workdir}")
  RUN_ARGV=()
  if [[ ${SM_PROFILE} == nsight-slurm ]]; then
    RUN_ARGV=(env SLURM_SUBMIT_DIR="${SM_JOBDIR}" "$(profile::nsight_bin)" srun "${native[@]}" --)
  else
    RUN_ARGV=(srun --job-name="$(run::pyxis_step_name)" "${native[@]}")
  fi
  RUN_ARGV+=(sh -c "${RUN_PYXIS_RANK_SH}" sm-rank "${SM_PROFILE_PREFIX[@]+"${SM_PROFILE_PREFIX[@]}"}" "${RUN_WORKLOAD[@]}")
}

# run::pyxis_step_id: the id of this rank's inner step, from Slurm (empty while it is not there).
run::pyxis_step_id() {
  slurm::step_ids "$(run::pyxis_step_name)" "${SLURMD_NODENAME:-$(hostname)}" | head -n 1
}

# run::pyxis_stop REASON: SIGTERM to this rank's step (never to srun: srun turns that into SIGKILL
# for the tasks, and nsys would write nothing), SIGKILL after the stop grace.
run::pyxis_stop() {
  local step waited=0
  step=$(run::pyxis_step_id)
  [[ -n ${step} ]] || { log::warn run "no step of this rank to stop ($1)"; return 0; }
  log::cmd run scancel --signal=TERM "${SLURM_JOB_ID}.${step}"
  scancel --signal=TERM "${SLURM_JOB_ID}.${step}" 2>/dev/null || true
  while [[ -n ${RUN_DOCKER_PID:-} ]] && kill -0 "${RUN_DOCKER_PID}" 2>/dev/null && ((waited < SM_STOP_GRACE * 5)); do
    sleep 0.2
    waited=$((waited + 1))
  done
  if [[ -n ${RUN_DOCKER_PID:-} ]] && kill -0 "${RUN_DOCKER_PID}" 2>/dev/null; then
    log::cmd run scancel --signal=KILL "${SLURM_JOB_ID}.${step}"
    scancel --signal=KILL "${SLURM_JOB_ID}.${step}" 2>/dev/null || true
  fi
}

# run::pyxis_diagnose REASON: what Slurm and the node show of the rank's step.
run::pyxis_diagnose() {
  local dir=${SM_SCRATCH}/diagnostics step
  mkdir -p "${dir}" || return 0
  log::info run "capturing diagnostics ($1) into node_${SM_RANK}/diagnostics/"
  step=$(run::pyxis_step_id)
  {
    printf 'reason: %s\nnode: %s\ntime: %s\nstep: %s\n' "$1" "$(hostname)" "$(date -u +%FT%TZ)" "${SLURM_JOB_ID}.${step:-?}"
    timeout 10 squeue -s -j "${SLURM_JOB_ID}" 2>&1
    [[ -z ${step} ]] || timeout 10 scontrol listpids "${SLURM_JOB_ID}.${step}" 2>&1
  } >"${dir}/step-state.txt" 2>&1 || true
  run::diagnose_host "${dir}"
}

# run::pyxis: start the rank's step and wait for it; --timeout stops it (SIGTERM, then SIGKILL after
# the stop grace). Sets RUN_EXIT (124 = timed out).
run::pyxis() {
  local pid rc=0 deadline
  if ((${#RUN_WORKLOAD[@]} == 0)) && [[ -s ${IMAGE_SQSH:-$(image::sqsh_path)}.cmd ]]; then
    # No command: the image's ENTRYPOINT + CMD, as docker would run it.
    mapfile -t RUN_WORKLOAD <"${IMAGE_SQSH:-$(image::sqsh_path)}.cmd"
    log::info run "no command given: running the image's own ENTRYPOINT + CMD (${RUN_WORKLOAD[*]})"
  fi
  ((${#RUN_WORKLOAD[@]})) || { log::error run "no workload command: pyxis runs no image entrypoint by itself; give -- CMD or a manifest with scripts"; RUN_EXIT=2; return 0; }
  run::pyxis_argv || return 1
  export SM_PYXIS_PROCID=${SLURM_PROCID:-${SM_RANK}} SM_PYXIS_LOCALID=${SLURM_LOCALID:-${LOCAL_RANK:-0}}
  export SM_PYXIS_NODEID=${SLURM_NODEID:-${NODE_RANK:-0}} SM_PYXIS_NTASKS=${SLURM_STEP_NUM_TASKS:-${WORLD_SIZE:-1}}
  export SM_PYXIS_NNODES=${SLURM_STEP_NUM_NODES:-${NNODES:-1}}
  rm -f "${SM_SCRATCH}/run-done"
  log::cmd run "${RUN_ARGV[@]}"
  # The manifest's env reaches the container through the step's environment (never argv).
  (
    util::source "${SM_SCRATCH}/workload.env" || exit 2
    exec "${RUN_ARGV[@]}"
  ) </dev/null &
  pid=$!
  RUN_DOCKER_PID=${pid}
  run::workload_started
  run::hang_watch --step-name "$(run::pyxis_step_name)"
  if ((SM_TIMEOUT > 0)); then
    deadline=$((SECONDS + SM_TIMEOUT))
    while kill -0 "${pid}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "${pid}" 2>/dev/null; then
      log::error run "workload exceeded --timeout ${SM_TIMEOUT} s; stopping its step"
      run::pyxis_diagnose "timeout after ${SM_TIMEOUT} s"
      run::pyxis_stop "timeout"
      wait "${pid}" 2>/dev/null || true
      RUN_DOCKER_PID=
      : >"${SM_SCRATCH}/run-done"
      run::end_watchers "${RUN_HANG_PID}"
      RUN_EXIT=124
      return 0
    fi
  fi
  wait "${pid}" || rc=$?
  RUN_DOCKER_PID=
  : >"${SM_SCRATCH}/run-done"
  RUN_EXIT=${rc}
  run::took_hang_verdict && return 0
  if ((rc != 0)); then
    log::error run "the rank's step exited ${rc}"
    run::pyxis_diagnose "step exited ${rc}"
  fi
  return 0
}
