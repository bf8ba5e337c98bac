# shellcheck shell=bash
# shellcheck disable=SC2034 # SM_PROFILE_PREFIX, RUN_DOCKER_OPTS, SM_EXTRA_ENV_NAMES, SM_STOP_GRACE: read by lib/run.sh
# Profiling every rank (--profile none|nsys|nsight-slurm), see docs/profiling.md.
#
#   nsys          the workload runs under `nsys profile … -o <dir>/<job>_<node>_rank<procid>` inside
#                 its container (docker, pyxis) or on the node (none). nsys writes a report only when
#                 its session ends, so every exit path ends it with SIGTERM and waits for the bytes.
#   nsight-slurm  the worker step is launched through <home>/bin/nsight-slurm (lib/launch.sh); the
#                 batch step configures the wrapper and starts its coordinator once per job, and the
#                 teardown flush ends the sessions and waits for every rank's report.
#
# This file holds what both profilers share; each profiler's own setup, argv and flush are in
# lib/profile-nsys.sh and lib/profile-nsight.sh (loaded below). The settings were validated by the
# job plan (slurm_multi.settings). Batch side: profile::before_steps, the teardown hooks,
# profile::dry_run_panel. Node side (bin/sm-node): profile::before_run / profile::after_run.
#
# Two rules hold for both profilers. Reports that existed before the job never count: the batch step
# snapshots the report dirs before the first worker step and every `reports wait` counts only what
# is new or changed since. And docker never SIGKILLs nsys while it writes: a profiled container's
# stop grace is at least the flush's settle window (profile::stop_grace).

# The TRT-LLM profiling playbook set, without the flags the nsight-slurm connector owns.
PROFILE_PLAYBOOK_OPTIONS=(-t 'cuda-sw,nvtx,python-gil' --cuda-graph-trace=graph --sample=none --cpuctxsw=none)
# One report per rank and attempt, named by what nsys expands from the profiled process's
# environment. A requeued attempt (Slurm sets SLURM_RESTART_COUNT from the first requeue on) writes
# <job>-a<N>_…: it never overwrites, or trips over, an earlier attempt's report of the same rank
# (a --profile-dir outside the job dir keeps them all; collect matches `_rank<R>.nsys-rep`).
PROFILE_ATTEMPT=''
[[ ! ${SLURM_RESTART_COUNT:-} =~ ^[1-9][0-9]*$ ]] || PROFILE_ATTEMPT=-a${SLURM_RESTART_COUNT}
PROFILE_REPORT_NAME="%q{SLURM_JOB_ID}${PROFILE_ATTEMPT}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}"
# The batch step's flush records its outcome here, in the job dir: the verdict's profile section.
PROFILE_FLUSH_FILE=profile-flush.json
# Where --nsys-host-path is mounted inside the container.
PROFILE_NSYS_MOUNT=/opt/slurm-multi/bin/nsys
# A profiled container's default stop grace: the flush's settle window plus this many seconds.
PROFILE_STOP_GRACE_MARGIN=15
PROFILE_BASELINE_TAKEN=0
PROFILE_NODE_ACTIVE=0
PROFILE_NODE_WAITED=0
PROFILE_NSIGHT_CONFIGURED=0
PROFILE_HEAD_IPV4=

# The flush is on the timeline: a rank's own (profile::after_run) and the batch step's.
# shellcheck source=lib/timeline.sh
declare -F timeline::event >/dev/null || source "${BASH_SOURCE[0]%/*}/timeline.sh" || return 2

for _profile_lib in profile-nsys profile-nsight; do
  # shellcheck source=/dev/null
  source "${BASH_SOURCE[0]%/*}/${_profile_lib}.sh" || return 2
done
unset _profile_lib

# ---- settings ------------------------------------------------------------------------------------

# profile::fit_killwait [warn|show]: under pyxis a rank's container lives in a Slurm step, so a
# cancelled job's nsys is SIGKILLed KillWait seconds after its SIGTERM, whatever our stop grace
# says: the report must be written and settled inside KillWait, and collect must still run. The
# settle window is therefore sized to KillWait - PROFILE_KILLWAIT_RESERVE (at least 5 s); `warn`
# exports the sized window and says so in the log, `show` prints the dry run's line.
PROFILE_KILLWAIT_RESERVE=20
profile::fit_killwait() {
  [[ ${SM_RUNTIME} == pyxis && ${SM_PROFILE} != none ]] || return 0
  local kw fit
  kw=$(slurm::killwait)
  if [[ -z ${kw} ]]; then
    [[ $1 == show ]] && printf '  %-16s %s\n' killwait "unknown (scontrol show config unreadable here): the settle window ${SM_FLUSH_SETTLE_SECONDS} s must fit inside Slurm's KillWait"
    [[ $1 == warn ]] && log::warn profile "cannot read Slurm's KillWait (scontrol show config): a scancelled job's nsys is SIGKILLed after it; the settle window stays ${SM_FLUSH_SETTLE_SECONDS} s"
    return 0
  fi
  fit=$((kw - PROFILE_KILLWAIT_RESERVE))
  ((fit >= 5)) || fit=5
  if ((SM_FLUSH_SETTLE_SECONDS <= fit)); then
    [[ $1 == show ]] && printf '  %-16s %s\n' killwait "${kw} s: the settle window ${SM_FLUSH_SETTLE_SECONDS} s fits (pyxis: Slurm SIGKILLs a cancelled rank's nsys after KillWait)"
    return 0
  fi
  local why="Slurm's KillWait is ${kw} s: under pyxis a cancelled rank's nsys is SIGKILLed then, so the settle window ${SM_FLUSH_SETTLE_SECONDS} s is cut to ${fit} s (KillWait - ${PROFILE_KILLWAIT_RESERVE} s for staging and collect); ask the admins for a longer KillWait if reports need more"
  case $1 in
    show) printf '  %-16s WARNING: %s\n' killwait "${why}" ;;
    warn)
      log::warn profile "${why}"
      export SM_FLUSH_SETTLE_SECONDS=${fit}
      ;;
  esac
  return 0
}

# profile::window: "<start>-<stop>" (TLLM_PROFILE_START_STOP), empty for the whole run.
profile::window() {
  [[ -n ${SM_PROFILE_START_ITER:-} ]] && printf '%s-%s' "${SM_PROFILE_START_ITER}" "${SM_PROFILE_STOP_ITER}"
  return 0
}

# profile::stop_grace: the `docker stop -t` grace (SIGTERM to SIGKILL) for this job's containers.
# Profiled: the larger of --stop-grace and --profile-stop-grace (default: the flush's settle window
# + PROFILE_STOP_GRACE_MARGIN). nsys writes its report after the SIGTERM, and the settle window is
# how long a report may take to stop growing; a SIGKILL before that leaves a truncated report.
profile::stop_grace() {
  local grace=${SM_STOP_GRACE} profiled
  [[ ${SM_PROFILE} != none && ${grace} =~ ^[0-9]+$ ]] || { printf '%s' "${grace}"; return 0; }
  profiled=${SM_PROFILE_STOP_GRACE:-}
  if [[ -z ${profiled} && ${SM_FLUSH_SETTLE_SECONDS:-} =~ ^[0-9]+$ ]]; then
    profiled=$((10#${SM_FLUSH_SETTLE_SECONDS} + PROFILE_STOP_GRACE_MARGIN))
  fi
  if [[ ${profiled} =~ ^[0-9]+$ ]] && ((10#${profiled} > 10#${grace})); then grace=$((10#${profiled})); fi
  printf '%s' "${grace}"
}

# profile::apply_stop_grace: export the effective SM_STOP_GRACE (lib/run.sh's docker stop, the batch
# step's reap and teardown bounds read it). Idempotent: the batch step and every node apply it.
profile::apply_stop_grace() {
  local grace why
  grace=$(profile::stop_grace)
  if [[ ${grace} != "${SM_STOP_GRACE:-}" ]]; then
    why="the flush settle window ${SM_FLUSH_SETTLE_SECONDS:-} s + ${PROFILE_STOP_GRACE_MARGIN} s"
    [[ -n ${SM_PROFILE_STOP_GRACE:-} ]] && why="--profile-stop-grace"
    log::info profile "stop grace for profiled containers: ${grace} s (${why}; --stop-grace ${SM_STOP_GRACE} is shorter), so docker never SIGKILLs nsys while it writes its report"
  fi
  SM_STOP_GRACE=${grace}
  export SM_STOP_GRACE
}

# profile::_split_tool_options: the user's --profile-tool-options as NUL-separated words.
profile::_split_tool_options() {
  util::split_words "${SM_PROFILE_TOOL_OPTIONS:-}"
}

# ---- paths and argv ------------------------------------------------------------------------------

# profile::dir: the nsys report directory (absolute; default <jobdir>/profile).
profile::dir() {
  local dir=${SM_PROFILE_DIR:-${SM_JOBDIR}/profile}
  [[ ${dir} == /* ]] || dir=${SLURM_SUBMIT_DIR:-${PWD}}/${dir#./}
  printf '%s' "${dir}"
}

# nsight-slurm: the log dir holds nsight-slurm.out, the wrapper's state and the runtime workspace;
# the report root (--profile-dir, default the log dir) holds the report workspace and, NEXT TO it
# (the wrapper refuses a non-empty workspace), the per-rank reports every rank writes directly.
profile::log_dir() { printf '%s' "${SM_JOBDIR}"; }
profile::report_root() {
  if [[ -n ${SM_PROFILE_DIR:-} ]]; then profile::dir; else profile::log_dir; fi
}

# profile::worker_env: NAME=VALUE lines (NUL-separated) every profiled worker gets.
profile::worker_env() {
  [[ ${SM_PROFILE} != none ]] || return 0
  local window
  window=$(profile::window)
  [[ -n ${window} ]] && printf '%s\0' "TLLM_PROFILE_START_STOP=${window}"
  printf '%s\0' TLLM_PROFILE_LOG_RANKS=all DYN_ENABLE_RUST_NVTX=1
  [[ -n ${SM_NVTX_INJECTION_PATH:-} ]] && printf '%s\0' "NVTX_INJECTION64_PATH=${SM_NVTX_INJECTION_PATH}"
  return 0
}

# profile::container_mounts: pyxis mounts the profiler needs (SRC:DST[:ro], NUL-separated).
profile::container_mounts() {
  local home=${SM_NSIGHT_SLURM_HOME:-} log_dir root
  case ${SM_PROFILE} in
    nsys)
      printf '%s\0' "$(profile::dir):$(profile::dir)"
      [[ -n ${SM_NSYS_HOST_PATH:-} ]] && printf '%s\0' "${SM_NSYS_HOST_PATH}:${PROFILE_NSYS_MOUNT}:ro"
      ;;
    nsight-slurm)
      log_dir=$(profile::log_dir) root=$(profile::report_root)
      # The connector's mounts ride in OUR single --container-mounts: `enable pyxis` would append a
      # second one, and pyxis honours only the last (the job's own mounts vanished on hecate).
      printf '%s\0' "${home}:${home}:ro" "${home}/bin/nsight-slurm-connector:/usr/local/bin/nsight-slurm-connector:ro" \
        "${log_dir}:${log_dir}" "$(profile::nsight_runtime):/nsrt"
      [[ ${root} == "${log_dir}" ]] || printf '%s\0' "${root}:${root}"
      [[ -n ${SM_NSYS_HOST_PATH:-} ]] && printf '%s\0' "${SM_NSYS_HOST_PATH}:${SM_NSIGHT_SLURM_TOOL_PATH}:ro"
      ;;
  esac
  return 0
}

# ---- batch step: setup ---------------------------------------------------------------------------

# profile::before_steps: once per job, in the batch step, before the first worker step.
profile::before_steps() {
  local pair
  case ${SM_PROFILE} in
    none) return 0 ;;
    nsys) profile::nsys_setup || return $? ;;
    nsight-slurm) profile::nsight_setup || return $? ;;
  esac
  profile::take_baseline || return $?
  profile::fit_killwait warn
  # Exported here too: the reaper step and the batch step's teardown bounds use the same grace.
  profile::apply_stop_grace
  profile::export_worker_env
}

# profile::export_worker_env: the worker env rides in the process environment (srun, the wrapper
# and pyxis pass it on; docker gets it by name).
profile::export_worker_env() {
  local pairs=() pair
  util::split0 pairs profile::worker_env || return 2
  for pair in "${pairs[@]+"${pairs[@]}"}"; do
    export "${pair?}"
  done
}

# profile::baseline_file: the snapshot of the reports that existed before the job (every node reads
# it from the job dir; `slurm-multi reports` writes and reads it).
profile::baseline_file() { printf '%s/.profile-baseline.json' "${SM_JOBDIR}"; }

# profile::report_dirs: the directories reports are counted in, NUL-separated.
profile::report_dirs() {
  case ${SM_PROFILE} in
    nsys) printf '%s\0' "$(profile::dir)" ;;
    nsight-slurm) printf '%s\0' "$(profile::nsight_direct)" "$(profile::nsight_rescued)" ;;
  esac
  return 0
}

# profile::take_baseline: once per job (per batch shell), before the first worker step, record every
# report already in the report dirs. A reused --profile-dir holds earlier jobs' reports, and a
# requeued job keeps its id and so its report names: none of them may count toward any wait.
profile::take_baseline() {
  local dirs=() argv file
  ((PROFILE_BASELINE_TAKEN == 0)) || return 0
  file=$(profile::baseline_file)
  util::split0 dirs profile::report_dirs || return 2
  argv=(reports snapshot "${dirs[@]}" --out "${file}")
  log::cmd profile "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
  util::sm "${argv[@]}" || {
    log::error profile "cannot record the reports that exist before the job in ${file}; is the job dir writable? (see above)"
    return 1
  }
  PROFILE_BASELINE_TAKEN=1
}

# profile::head_ipv4: the batch node's IPv4 address. The coordinator is published as
# tcp://$SLURMD_NODENAME:<port>, and a node's own name can resolve to an unscoped fe80:: first,
# which ZeroMQ with IPv6 on dials and never reaches (hecate: the 4 ranks on the coordinator's own
# node timed out). An IPv4 literal works from every node. SM_NSIGHT_COORDINATOR_ADDR overrides.
profile::head_ipv4() {
  local addr
  if [[ -n ${SM_NSIGHT_COORDINATOR_ADDR:-} ]]; then
    printf '%s' "${SM_NSIGHT_COORDINATOR_ADDR}"
    return 0
  fi
  addr=$(getent ahostsv4 "$(hostname)" 2>/dev/null | awk '$1 !~ /^(127|169\.254)\./ { print $1; exit }')
  [[ -n ${addr} ]] || addr=$(hostname -I 2>/dev/null | tr ' ' '\n' |
    awk '/^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$/ && !/^(127|169\.254)\./ { print; exit }')
  [[ -n ${addr} ]] || return 1
  printf '%s' "${addr}"
}

# ---- batch step: teardown flush ------------------------------------------------------------------

# profile::_worker_step_started: whether the worker step was ever launched (job.sh's state).
profile::_worker_step_started() { [[ -n ${JOB_SRUN_PID:-}${JOB_SRUN_RC:-} ]]; }
profile::_worker_step_running() { [[ -n ${JOB_SRUN_PID:-} ]] && kill -0 "${JOB_SRUN_PID}" 2>/dev/null; }

# profile::_settle_seconds, profile::_timeout_seconds: the full window and timeout while writers
# may still be running; once every worker task has ended (each waited for its own report, and the
# writers are gone), a short recheck is enough.
profile::_settle_seconds() {
  local s=${SM_FLUSH_SETTLE_SECONDS}
  if ! profile::_worker_step_running && ((s > 5)); then s=5; fi
  printf '%s' "${s}"
}
profile::_timeout_seconds() {
  local t=${SM_FLUSH_TIMEOUT_SECONDS}
  if ! profile::_worker_step_running && ((t > 60)); then t=60; fi
  printf '%s' "${t}"
}

# profile::_signal_step STEP: SIGTERM to a step's tasks. Never SIGTERM to srun or the wrapper:
# srun turns that into SIGKILL for the tasks, and nsys then writes nothing.
profile::_signal_step() {
  log::cmd profile scancel --signal=TERM "${SLURM_JOB_ID}.$1"
  scancel --signal=TERM "${SLURM_JOB_ID}.$1" 2>/dev/null || log::warn profile "scancel of step ${SLURM_JOB_ID}.$1 failed (already ending or ended?)"
}

# profile::wait_reports DIR EXPECT SETTLE TIMEOUT [PATTERN]: slurm-multi reports wait, logged,
# counting only reports new or changed since the job's baseline snapshot. The batch step's flush
# sets PROFILE_STATE_FILE: the outcome, per report, that the verdict reads (results.profile).
profile::wait_reports() {
  local baseline argv=(reports wait "$1" --pattern "${5:-*.nsys-rep}" --expect "$2" --settle-seconds "$3"
    --timeout-seconds "$4")
  [[ -z ${PROFILE_STATE_FILE:-} ]] || argv+=(--state-file "${PROFILE_STATE_FILE}")
  baseline=$(profile::baseline_file)
  if [[ -f ${baseline} ]]; then
    argv+=(--since-file "${baseline}")
  else
    log::warn profile "no snapshot of the reports from before the job (${baseline}, written by the batch step); reports already in $1 may count"
  fi
  log::cmd profile "${SM_HOME}/bin/slurm-multi" "${argv[@]}"
  util::sm "${argv[@]}" >/dev/null
}

# profile::_count_new SNAPSHOT DIR…: how many reports in the DIRs (empty ones too) are new or changed
# since SNAPSHOT; 0 without the snapshot or when the helper fails, so the caller ends the sessions.
profile::_count_new() {
  local since=$1 n
  shift
  [[ -f ${since} ]] || { printf 0; return 0; }
  n=$(util::sm reports count "$@" --since-file "${since}") && [[ ${n} =~ ^[0-9]+$ ]] || n=0
  printf '%s' "${n}"
}

# ---- node side (bin/sm-node) ---------------------------------------------------------------------

# profile::run_args: what profiling adds to this node's run, and nothing else (the dry run shows the
# node's argv through it): SM_PROFILE_PREFIX (run::docker_argv, run::bare and run::pyxis_argv put it
# in front of the workload), the report dir (and --nsys-host-path) mounted into the container, the
# worker env passed by name, the profiled stop grace.
profile::run_args() {
  [[ ${SM_PROFILE} != none ]] || return 0
  # lib/run.sh stops the container with `docker stop -t ${SM_STOP_GRACE}`: never shorter than the
  # time nsys needs to write its report after the SIGTERM.
  profile::apply_stop_grace
  [[ ${SM_PROFILE} == nsys ]] || return 0
  local dir pair name pairs=()
  dir=$(profile::dir)
  if [[ ${SM_RUNTIME} == docker ]]; then
    # Same path inside: nsys writes straight to shared storage.
    RUN_DOCKER_OPTS+=(-v "${dir}:${dir}")
    [[ -n ${SM_NSYS_HOST_PATH:-} ]] && RUN_DOCKER_OPTS+=(-v "${SM_NSYS_HOST_PATH}:${PROFILE_NSYS_MOUNT}:ro")
    util::split0 pairs profile::worker_env || return 2
    for pair in "${pairs[@]+"${pairs[@]}"}"; do
      name=${pair%%=*}
      [[ -n ${!name+x} ]] && SM_EXTRA_ENV_NAMES+=("${name}")
    done
  fi
  util::split0 SM_PROFILE_PREFIX profile::nsys_prefix || return 2
}

# profile::before_run: profile::run_args, and for nsys the report dir made and this rank's report
# announced to the batch step's flush.
profile::before_run() {
  [[ ${SM_PROFILE} == nsys ]] || { profile::run_args; return $?; }
  local dir
  dir=$(profile::dir)
  mkdir -p "${dir}" || { log::error profile "cannot create the report directory ${dir} on $(hostname)"; return 1; }
  profile::run_args || return $?
  : >"${SM_NODE_DIR}/.profile-nsys" # tells the batch flush this rank's report is coming
  PROFILE_NODE_ACTIVE=1
  log::info profile "nsys: this rank's report: ${dir}/${SLURM_JOB_ID:-}${PROFILE_ATTEMPT}_${SLURMD_NODENAME:-}_rank${SLURM_PROCID:-}.nsys-rep"
}

# profile::after_run: once the workload has ended (normally, failed, or stopped by SIGTERM), wait
# for THIS rank's report to settle before staging. Never fails the task: a missing report is logged.
profile::after_run() {
  ((PROFILE_NODE_ACTIVE == 1 && PROFILE_NODE_WAITED == 0)) || return 0
  PROFILE_NODE_WAITED=1
  # The container never started, or nsys was not found (docker's 125-127): no report will come;
  # taking the marker back tells the batch step's flush not to wait for one either.
  if [[ -z ${RUN_EXIT:-}${RUN_DOCKER_PID:-} || ${RUN_EXIT:-} =~ ^12[567]$ ]]; then
    log::warn profile "rank ${SLURM_PROCID:-}: the workload never ran under nsys (exit ${RUN_EXIT:-none}); no report"
    rm -f "${SM_NODE_DIR:-/nonexistent}/.profile-nsys"
    return 0
  fi
  # On the node's timeline: the flush is a sub-step of the run stage (profile_flush).
  timeline::event profile_flush_start
  if profile::wait_reports "$(profile::dir)" 1 "${SM_FLUSH_SETTLE_SECONDS}" "${SM_FLUSH_TIMEOUT_SECONDS}" "*_rank${SLURM_PROCID:-}.nsys-rep"; then
    log::info profile "nsys report of rank ${SLURM_PROCID:-} settled"
    timeline::event profile_flush_end settled=1
  else
    log::warn profile "nsys report of rank ${SLURM_PROCID:-} did not settle within ${SM_FLUSH_TIMEOUT_SECONDS} s; staging anyway"
    timeline::event profile_flush_end settled=0
  fi
  return 0
}

# ---- dry run -------------------------------------------------------------------------------------

# profile::dry_run_panel: type, runtime, windows, tool options, reports (the launcher is the batch step's).
profile::dry_run_panel() {
  local opts=() env=() window
  window=$(profile::window)
  util::split0 env profile::worker_env || return 2
  printf 'Profiling\n'
  printf '  %-16s %s\n' type "${SM_PROFILE}" runtime "${SM_RUNTIME}"
  [[ -z ${SM_FRAMEWORK:-} ]] || printf '  %-16s %s\n' framework "${SM_FRAMEWORK}"
  if [[ ${SM_PROFILE} == none ]]; then
    printf '  %-16s %s\n' window "(profiling off)"
  elif [[ -n ${window} ]]; then
    printf '  %-16s %s\n' window "iterations ${window} (TLLM_PROFILE_START_STOP=${window})"
  else
    printf '  %-16s %s\n' window "the whole run"
  fi
  case ${SM_PROFILE} in
    nsys)
      util::split0 opts profile::nsys_prefix || return 2
      printf '  %-16s %s\n' "nsys prefix" "$(log::quote "${opts[@]}")"
      printf '  %-16s %s\n' "tool options" "${SM_PROFILE_TOOL_OPTIONS:-$(log::quote "${opts[@]:2:${#opts[@]}-4}")}"
      printf '  %-16s %s\n' "report output" "$(profile::dir)/${PROFILE_REPORT_NAME}.nsys-rep (one per rank)"
      [[ ${SM_RUNTIME} == docker ]] &&
        printf '  %-16s %s\n' mounts "$(profile::dir) (same path)${SM_NSYS_HOST_PATH:+, ${SM_NSYS_HOST_PATH} -> ${PROFILE_NSYS_MOUNT} (ro)}"
      printf '  %-16s %s\n' flush "SIGTERM to the step (each node: docker stop -t $(profile::stop_grace)), then wait for every rank's report: settle ${SM_FLUSH_SETTLE_SECONDS} s on bytes, timeout ${SM_FLUSH_TIMEOUT_SECONDS} s"
      local profiled_grace="settle ${SM_FLUSH_SETTLE_SECONDS} + ${PROFILE_STOP_GRACE_MARGIN}"
      [[ -z ${SM_PROFILE_STOP_GRACE:-} ]] || profiled_grace="--profile-stop-grace ${SM_PROFILE_STOP_GRACE}"
      printf '  %-16s %s\n' "stop grace" "$(profile::stop_grace) s (the larger of --stop-grace ${SM_STOP_GRACE} and ${profiled_grace})"
      ;;
    nsight-slurm)
      util::split0 opts profile::nsight_tool_options || return 2
      printf '  %-16s %s\n' install "${SM_NSIGHT_SLURM_HOME} (bin/nsight-slurm, bin/nsight-slurm-connector)"
      printf '  %-16s %s\n' "tool path" "${SM_NSIGHT_SLURM_TOOL_PATH}" "profiling mode" "$(profile::nsight_mode)"
      printf '  %-16s %s\n' "tool options" "$(log::quote "${opts[@]}")"
      printf '  %-16s %s\n' "report output" "$(profile::nsight_workspace) (workspace)"
      printf '  %-16s %s\n' "direct reports" "$(profile::nsight_direct)/${PROFILE_REPORT_NAME}.nsys-rep (one per rank)"
      printf '  %-16s %s\n' "runtime dir" "$(profile::nsight_runtime) (pyxis: mounted at /nsrt; rescued into $(profile::nsight_rescued))"
      printf '  %-16s %s\n' "wrapper env" "SLURM_SUBMIT_DIR=$(profile::log_dir) SLURMD_NODENAME=<head node IPv4> (CLI calls only; log: $(profile::log_dir)/nsight-slurm.out)"
      printf '  %-16s\n' "configure (once per job, before the worker step)"
      profile::nsight_configure profile::_print_call
      printf '  %-16s %s\n' flush "nsight-slurm stop --job ${SLURM_JOB_ID}, rescue from the runtime dir, SIGTERM to the nsight-slurm-connector steps if nothing new, wait: settle ${SM_FLUSH_SETTLE_SECONDS} s on bytes, timeout ${SM_FLUSH_TIMEOUT_SECONDS} s; then coordinator stop --force"
      ;;
  esac
  profile::fit_killwait show
  [[ ${SM_PROFILE} == none ]] ||
    printf '  %-16s %s\n' "old reports" "never count: reports already there before the job are recorded in $(profile::baseline_file) and left out of every wait"
  ((${#env[@]})) && printf '  %-16s %s\n' "worker env" "${env[*]}"
  printf '\n'
}
