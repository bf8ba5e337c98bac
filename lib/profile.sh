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
# Batch side: profile::validate, profile::before_steps, the teardown hooks, profile::dry_run_panel.
# Node side (bin/sm-node): profile::before_run / profile::after_run around the run stage.
#
# Two rules hold for both profilers. Reports that existed before the job never count: the batch step
# snapshots the report dirs before the first worker step and every `reports wait` counts only what
# is new or changed since. And docker never SIGKILLs nsys while it writes: a profiled container's
# stop grace is at least the flush's settle window (profile::stop_grace).

# The TRT-LLM profiling playbook set, without the flags the nsight-slurm connector owns.
PROFILE_PLAYBOOK_OPTIONS=(-t 'cuda-sw,nvtx,python-gil' --cuda-graph-trace=graph --sample=none --cpuctxsw=none)
# One report per rank, named by what nsys expands from the profiled process's environment.
PROFILE_REPORT_NAME='%q{SLURM_JOB_ID}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}'
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

# ---- settings ------------------------------------------------------------------------------------

# profile::fit_killwait [warn|show]: under pyxis a rank's container lives in a Slurm step, so a
# cancelled job's nsys is SIGKILLed KillWait seconds after its SIGTERM, whatever our stop grace
# says: the report must be written and settled inside KillWait, and collect must still run. The
# settle window is therefore sized to KillWait - PROFILE_KILLWAIT_RESERVE (at least 5 s); `warn`
# exports the sized window and says so in the log, `show` prints the dry run's line.
PROFILE_KILLWAIT_RESERVE=20
profile::fit_killwait() {
  [[ ${SM_RUNTIME:-docker} == pyxis && ${SM_PROFILE:-none} != none ]] || return 0
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

# profile::nsight_mode: the profiling mode (default cuda-api for TRT-LLM, else at-launch).
profile::nsight_mode() {
  if [[ -n ${SM_NSIGHT_SLURM_MODE:-} ]]; then
    printf '%s' "${SM_NSIGHT_SLURM_MODE}"
  elif [[ ${SM_FRAMEWORK:-} == trtllm ]]; then
    printf cuda-api
  else
    printf at-launch
  fi
}

# profile::stop_grace: the `docker stop -t` grace (SIGTERM to SIGKILL) for this job's containers.
# Profiled: the larger of --stop-grace and --profile-stop-grace (default: the flush's settle window
# + PROFILE_STOP_GRACE_MARGIN). nsys writes its report after the SIGTERM, and the settle window is
# how long a report may take to stop growing; a SIGKILL before that leaves a truncated report.
profile::stop_grace() {
  local grace=${SM_STOP_GRACE:-30} profiled
  [[ ${SM_PROFILE:-none} != none && ${grace} =~ ^[0-9]+$ ]] || { printf '%s' "${grace}"; return 0; }
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
    log::info profile "stop grace for profiled containers: ${grace} s (${why}; --stop-grace ${SM_STOP_GRACE:-unset} is shorter), so docker never SIGKILLs nsys while it writes its report"
  fi
  SM_STOP_GRACE=${grace}
  export SM_STOP_GRACE
}

# profile::_reject_options TYPE WORD…: the first option that slurm-multi or the connector owns.
profile::_reject_options() {
  local type=$1 word
  shift
  for word in "$@"; do
    case ${word} in
      -o | -o?* | --output | --output=*)
        log::error profile "--profile-tool-options '${word}': the output name is slurm-multi's (one report per rank under the report dir); drop it and use --profile-dir to move the reports"
        return 2
        ;;
    esac
    [[ ${type} == nsight-slurm ]] || continue
    case ${word} in
      -f | -f?* | --force-overwrite | --force-overwrite=* | -c | -c?* | --capture-range | --capture-range=* | \
        --capture-range-end | --capture-range-end=* | -Y | -Y?* | --start-later | --start-later=*)
        log::error profile "--profile-tool-options '${word}': the nsight-slurm connector owns this flag (capture range and start come from --nsight-slurm-mode); drop it"
        return 2
        ;;
    esac
  done
}

# profile::_split_tool_options: the user's --profile-tool-options as NUL-separated words.
profile::_split_tool_options() {
  util::split_words "${SM_PROFILE_TOOL_OPTIONS:-}"
}

# profile::validate: every profiling/runtime setting that cannot work, as one line, exit 2.
profile::validate() {
  local n words=()
  for n in SM_FLUSH_SETTLE_SECONDS SM_FLUSH_TIMEOUT_SECONDS; do
    [[ ${!n:-} =~ ^[0-9]+$ ]] || { log::error profile "$(settings::var_option "${n}") '${!n:-}': expected a whole number of seconds (${n})"; return 2; }
  done
  [[ -z ${SM_PROFILE_STOP_GRACE:-} || ${SM_PROFILE_STOP_GRACE} =~ ^[0-9]+$ ]] ||
    { log::error profile "--profile-stop-grace '${SM_PROFILE_STOP_GRACE}': expected a whole number of seconds (SM_PROFILE_STOP_GRACE)"; return 2; }
  if [[ -n ${SM_PROFILE_START_ITER:-}${SM_PROFILE_STOP_ITER:-} ]]; then
    [[ ${SM_PROFILE_START_ITER:-} =~ ^[0-9]+$ && ${SM_PROFILE_STOP_ITER:-} =~ ^[0-9]+$ ]] || {
      log::error profile "profile window '${SM_PROFILE_START_ITER:-}'-'${SM_PROFILE_STOP_ITER:-}': give both --profile-start-iter and --profile-stop-iter as iteration numbers"
      return 2
    }
    ((10#${SM_PROFILE_STOP_ITER} >= 10#${SM_PROFILE_START_ITER})) || {
      log::error profile "profile window ${SM_PROFILE_START_ITER}-${SM_PROFILE_STOP_ITER}: --profile-stop-iter must not be before --profile-start-iter"
      return 2
    }
  fi
  if [[ -n ${SM_NTASKS_PER_NODE:-} ]]; then
    [[ ${SM_NTASKS_PER_NODE} =~ ^[1-9][0-9]*$ ]] ||
      { log::error profile "--ntasks-per-node '${SM_NTASKS_PER_NODE}' must be a positive whole number"; return 2; }
    if [[ ${SM_RUNTIME} == docker && ${SM_NTASKS_PER_NODE} != 1 ]]; then
      log::error profile "--ntasks-per-node ${SM_NTASKS_PER_NODE} with --runtime docker: the docker runtime runs one container per node; start the ranks inside it, or use --runtime pyxis or none"
      return 2
    fi
  fi
  [[ -z ${SM_FRAMEWORK:-} || ${SM_FRAMEWORK} =~ ^[a-z0-9_.-]+$ ]] ||
    { log::error profile "--framework '${SM_FRAMEWORK}': expected a lowercase name such as trtllm"; return 2; }
  if [[ ${SM_RUNTIME} == pyxis ]]; then
    # pyxis reads --container-mounts as SRC:DST[:FLAGS],…: a comma in a path would split it.
    for n in SM_OUT SM_PROFILE_DIR SM_NSIGHT_SLURM_HOME SM_NSYS_HOST_PATH; do
      [[ ${!n:-} != *,* ]] || { log::error profile "${n}='${!n}': pyxis cannot mount a path with a comma; choose another"; return 2; }
    done
  fi
  if [[ -n ${SM_PROFILE_TOOL_OPTIONS:-} ]] && ! util::split_words "${SM_PROFILE_TOOL_OPTIONS}" >/dev/null 2>&1; then
    log::error profile "--profile-tool-options '${SM_PROFILE_TOOL_OPTIONS}': unbalanced quotes"
    return 2
  fi
  util::split0 words profile::_split_tool_options || return 2
  # A stop grace shorter than the settle window lets docker SIGKILL nsys in the middle of writing.
  if [[ ${SM_PROFILE} != none && -n ${SM_PROFILE_STOP_GRACE:-} ]] &&
    ((10#${SM_PROFILE_STOP_GRACE} < 10#${SM_FLUSH_SETTLE_SECONDS})); then
    log::error profile "--profile-stop-grace ${SM_PROFILE_STOP_GRACE} is shorter than --flush-settle-seconds ${SM_FLUSH_SETTLE_SECONDS}: docker stop would SIGKILL nsys while it writes its report; give at least ${SM_FLUSH_SETTLE_SECONDS} (or leave it unset: settle + ${PROFILE_STOP_GRACE_MARGIN} s)"
    return 2
  fi
  case ${SM_PROFILE} in
    none) return 0 ;;
    nsys) profile::_reject_options nsys "${words[@]+"${words[@]}"}" || return 2 ;;
    nsight-slurm) profile::_validate_nsight "${words[@]+"${words[@]}"}" || return 2 ;;
  esac
  if [[ -n ${SM_NSYS_HOST_PATH:-} && ! (-f ${SM_NSYS_HOST_PATH} && -x ${SM_NSYS_HOST_PATH}) ]]; then
    log::error profile "--nsys-host-path ${SM_NSYS_HOST_PATH}: not an executable file on $(hostname); give the path of an nsys binary on shared storage"
    return 2
  fi
  return 0
}

profile::_validate_nsight() {
  local home=${SM_NSIGHT_SLURM_HOME:-} tool mode
  if [[ ${SM_RUNTIME} == docker ]]; then
    log::error profile "--profile nsight-slurm cannot run with --runtime docker: nsight-slurm profiles the srun task itself, and with docker that task is the docker client, not the workload; use --runtime pyxis (containers) or --runtime none (bare metal)"
    return 2
  fi
  [[ -n ${home} ]] || { log::error profile "--profile nsight-slurm needs --nsight-slurm-home DIR (the install root holding bin/nsight-slurm)"; return 2; }
  [[ ${home} == /* ]] || { log::error profile "--nsight-slurm-home '${home}' must be an absolute path (every node resolves it)"; return 2; }
  for tool in nsight-slurm nsight-slurm-connector; do
    if [[ ! -f ${home}/bin/${tool} || ! -x ${home}/bin/${tool} ]]; then
      log::error profile "--nsight-slurm-home ${home}: ${home}/bin/${tool} is missing or not executable; install Nsight Cloud for Slurm there (on shared storage) or fix --nsight-slurm-home"
      return 2
    fi
  done
  mode=$(profile::nsight_mode)
  case ${mode} in at-launch | manual | cuda-api) ;; *)
    log::error profile "--nsight-slurm-mode '${mode}': expected at-launch, manual or cuda-api"; return 2 ;;
  esac
  if [[ ${mode} == cuda-api && ${SM_FRAMEWORK:-} != trtllm ]]; then
    log::error profile "--nsight-slurm-mode cuda-api needs a framework that calls cudaProfilerStart/Stop (--framework trtllm); for '${SM_FRAMEWORK:-no framework}' use at-launch or manual"
    return 2
  fi
  [[ ${SM_NSIGHT_SLURM_TOOL_PATH:-} == /* ]] ||
    { log::error profile "--nsight-slurm-tool-path '${SM_NSIGHT_SLURM_TOOL_PATH:-}' must be an absolute path to nsys on the nodes"; return 2; }
  profile::_reject_options nsight-slurm "$@"
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
profile::nsight_workspace() { printf '%s/nsight-slurm-reports' "$(profile::report_root)"; }
profile::nsight_direct() { printf '%s/nsight-slurm-direct' "$(profile::report_root)"; }
profile::nsight_rescued() { printf '%s/rescued' "$(profile::nsight_workspace)"; }
profile::nsight_runtime() { printf '%s/nsight-slurm-runtime' "$(profile::log_dir)"; }
profile::nsight_bin() { printf '%s/bin/nsight-slurm' "${SM_NSIGHT_SLURM_HOME}"; }

# profile::nsys_tool_options: NUL-separated nsys options (the user's, else the playbook set; with
# TRT-LLM and a window, the cudaProfilerApi capture range that TLLM_PROFILE_START_STOP drives).
profile::nsys_tool_options() {
  local words=()
  if [[ -n ${SM_PROFILE_TOOL_OPTIONS:-} ]]; then
    util::split0 words profile::_split_tool_options || return 2
  else
    words=("${PROFILE_PLAYBOOK_OPTIONS[@]}")
    if [[ ${SM_FRAMEWORK:-} == trtllm && -n $(profile::window) ]]; then
      words+=(--capture-range=cudaProfilerApi --capture-range-end=stop)
    fi
  fi
  ((${#words[@]})) && printf '%s\0' "${words[@]}"
  return 0
}

# profile::nsight_tool_options: what `configure tool-options` gets: the user's or the playbook set,
# --wait=primary (nsys must not wait for re-parented children), and our -o LAST, so every rank
# writes straight to shared storage when its session ends.
profile::nsight_tool_options() {
  local words=() word wait=0
  if [[ -n ${SM_PROFILE_TOOL_OPTIONS:-} ]]; then
    util::split0 words profile::_split_tool_options || return 2
  else
    words=("${PROFILE_PLAYBOOK_OPTIONS[@]}")
  fi
  for word in "${words[@]+"${words[@]}"}"; do
    [[ ${word} == --wait || ${word} == --wait=* ]] && wait=1
  done
  ((wait)) || words+=(--wait=primary)
  # Under pyxis the connector runs in the rank's own one-task step, where SLURM_PROCID is 0 on every
  # node: the rank is sm-node's SM_RANK, which that step inherits.
  if [[ ${SM_RUNTIME:-docker} == pyxis ]]; then
    words+=(-o "$(profile::nsight_direct)/${PROFILE_REPORT_NAME/SLURM_PROCID/SM_RANK}")
  else
    words+=(-o "$(profile::nsight_direct)/${PROFILE_REPORT_NAME}")
  fi
  printf '%s\0' "${words[@]}"
}

# profile::nsys_bin: the nsys the workload runs under (--nsys-host-path wins; in a container it is
# mounted at PROFILE_NSYS_MOUNT).
profile::nsys_bin() {
  if [[ -z ${SM_NSYS_HOST_PATH:-} ]]; then
    printf '%s' "${SM_NSYS_PATH:-nsys}"
  elif [[ ${SM_RUNTIME:-docker} == none ]]; then
    printf '%s' "${SM_NSYS_HOST_PATH}"
  else
    printf '%s' "${PROFILE_NSYS_MOUNT}"
  fi
}

# profile::nsys_prefix: `nsys profile <options> -o <dir>/<name>`, NUL-separated.
profile::nsys_prefix() {
  local opts=()
  util::split0 opts profile::nsys_tool_options || return 2
  printf '%s\0' "$(profile::nsys_bin)" profile "${opts[@]+"${opts[@]}"}" -o "$(profile::dir)/${PROFILE_REPORT_NAME}"
}

# profile::worker_env: NAME=VALUE lines (NUL-separated) every profiled worker gets.
profile::worker_env() {
  [[ ${SM_PROFILE:-none} != none ]] || return 0
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
  case ${SM_PROFILE:-none} in
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
  case ${SM_PROFILE:-none} in
    none) return 0 ;;
    nsys) profile::nsys_setup || return ;;
    nsight-slurm) profile::nsight_setup || return ;;
  esac
  profile::take_baseline || return
  profile::fit_killwait warn
  # Exported here too: the reaper step and the batch step's teardown bounds use the same grace.
  profile::apply_stop_grace
  # The worker env rides in the process environment (srun, the wrapper and pyxis pass it on).
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
  case ${SM_PROFILE:-none} in
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

profile::nsys_setup() {
  local dir
  dir=$(profile::dir)
  mkdir -p "${dir}" || { log::error profile "cannot create the report directory ${dir}"; return 1; }
  export SM_PROFILE_DIR=${dir}
  teardown::add_pre_hook profile::flush_nsys
  log::info profile "nsys: one report per rank in ${dir}; flush: settle ${SM_FLUSH_SETTLE_SECONDS} s on bytes, timeout ${SM_FLUSH_TIMEOUT_SECONDS} s"
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

# profile::nsight_cli ARGS…: one wrapper CLI call, with the job's state under the log dir and the
# head node's IPv4 as SLURMD_NODENAME -- in this call's environment only: the worker tasks must keep
# their own node names. The call and its output are appended to <log_dir>/nsight-slurm.out.
profile::nsight_cli() {
  local out env_args argv rc=0 size
  out=$(profile::log_dir)/nsight-slurm.out
  env_args=(SLURM_SUBMIT_DIR="$(profile::log_dir)")
  if [[ ${SM_NSIGHT_NO_IPV4_OVERRIDE:-0} != 1 ]]; then
    [[ -n ${PROFILE_HEAD_IPV4} ]] || PROFILE_HEAD_IPV4=$(profile::head_ipv4) ||
      { log::error profile "cannot find this node's IPv4 address for the coordinator; set SM_NSIGHT_COORDINATOR_ADDR"; return 1; }
    env_args+=(SLURMD_NODENAME="${PROFILE_HEAD_IPV4}")
  fi
  argv=(env "${env_args[@]}" "$(profile::nsight_bin)" "$@")
  log::cmd profile "${argv[@]}"
  size=$(stat -c %s "${out}" 2>/dev/null || echo 0)
  printf '# %s\n+ %s\n' "$(date -u +%FT%TZ)" "$(printf '%q ' "${argv[@]}")" >>"${out}"
  # Output to the file, never through a pipe we read: a daemon the wrapper leaves behind (the
  # coordinator) could hold the pipe open forever.
  "${argv[@]}" </dev/null >>"${out}" 2>&1 || rc=$?
  printf '# exit %s\n' "${rc}" >>"${out}"
  tail -c +"$((size + 1))" "${out}" | sed -n '3,$p' | sed '$d' | sed 's/^/    /' >&2
  ((rc == 0)) || log::error profile "nsight-slurm $1 failed (exit ${rc}); see ${out}"
  return "${rc}"
}

# profile::nsight_configure RUNNER: the once-per-job sequence, each call through RUNNER
# (profile::nsight_cli to run it, profile::_print_call for the dry run).
profile::nsight_configure() {
  local run=$1 opts=()
  util::split0 opts profile::nsight_tool_options || return 2
  "${run}" configure tool-path "${SM_NSIGHT_SLURM_TOOL_PATH}" &&
    "${run}" configure tool-command profile &&
    "${run}" configure profiling-mode "$(profile::nsight_mode)" &&
    "${run}" configure tool-options "${opts[@]}" &&
    "${run}" configure report-output "$(profile::nsight_workspace)" &&
    "${run}" disable pyxis &&
    "${run}" coordinator start &&
    "${run}" configure
}

profile::_print_call() { printf '      nsight-slurm %s\n' "$(printf '%q ' "$@")"; }

# profile::nsight_setup: check the install, configure the wrapper, start the coordinator. Safe to
# run twice: the wrapper keeps its state per job and reuses a running coordinator.
profile::nsight_setup() {
  local launcher=()
  if ((PROFILE_NSIGHT_CONFIGURED)); then
    log::info profile "nsight-slurm: already configured for job ${SLURM_JOB_ID}"
    return 0
  fi
  profile::_validate_nsight || return 2
  mkdir -p "$(profile::nsight_direct)" "$(profile::nsight_runtime)" ||
    { log::error profile "cannot create $(profile::nsight_direct) or $(profile::nsight_runtime)"; return 1; }
  # Registered first: a half-done start is still flushed and its coordinator stopped.
  teardown::add_pre_hook profile::flush_nsight
  teardown::add_post_hook profile::nsight_coordinator_stop
  log::info profile "nsight-slurm: configuring $(profile::nsight_bin) for job ${SLURM_JOB_ID} (calls and output: $(profile::log_dir)/nsight-slurm.out)"
  profile::nsight_configure profile::nsight_cli || return 1
  PROFILE_NSIGHT_CONFIGURED=1
  if declare -F launch::step_argv >/dev/null; then
    launch::step_argv || return 2
    printf '# %s worker step (its output: batch.log)\n+ %s\n' "$(date -u +%FT%TZ)" \
      "$(printf '%q ' "${LAUNCH_ARGV[@]}")" >>"$(profile::log_dir)/nsight-slurm.out"
  fi
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

# profile::flush_nsys REASON (pre-cleanup hook): end every nsys session gracefully -- SIGTERM to
# the step, so each node stops its container with SIGTERM -- then wait until the reports of every
# rank that started under nsys are non-empty and their bytes have settled.
profile::flush_nsys() {
  local dir expect step
  dir=$(profile::dir)
  profile::_worker_step_started || { log::info profile "flush: the worker step never started; no reports to wait for"; return 0; }
  expect=$(find "${SM_JOBDIR}" -mindepth 2 -maxdepth 2 -path '*/node_*/.profile-nsys' 2>/dev/null | wc -l)
  ((expect > 0)) || { log::info profile "flush: no rank started under nsys; no reports to wait for"; return 0; }
  log::info profile "flush (${1:-teardown}): waiting for ${expect} nsys report(s) in ${dir}"
  if profile::_worker_step_running && [[ ${SM_RUNTIME:-docker} == pyxis ]]; then
    # The ranks' own steps: SIGTERM to sm-node's step would make its srun SIGKILL the rank.
    for step in $(job::rank_steps); do profile::_signal_step "${step}"; done
  elif profile::_worker_step_running; then
    step=$(job::step_id)
    [[ -z ${step} ]] || profile::_signal_step "${step}"
  fi
  if PROFILE_STATE_FILE=${SM_JOBDIR}/${PROFILE_FLUSH_FILE} profile::wait_reports "${dir}" "${expect}" "$(profile::_settle_seconds)" "$(profile::_timeout_seconds)"; then
    log::info profile "flush: ${expect} report(s) settled in ${dir}"
  else
    log::warn profile "flush: not every report settled (see above; the wait gives up at ${SM_FLUSH_TIMEOUT_SECONDS} s, or once nsys has finished and a report stayed empty); going on"
  fi
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

# profile::rescue_reports: copy reports the connector left in its runtime workspace (the job's
# <log_dir>/nsight-slurm-runtime, mounted at /nsrt) into <workspace>/rescued/. A connector that
# never sees the collection-stop keeps them there (connector 1.5.0 with nsys 2026.3 did).
profile::rescue_reports() {
  local src dst file name
  src=$(profile::nsight_runtime) dst=$(profile::nsight_rescued)
  [[ -d ${src} ]] || return 0
  local found=()
  util::split0 found find "${src}" -name '*.nsys-rep' -type f -size +0 -print0 ||
    log::warn profile "flush: cannot list every report under ${src}; rescuing what was found"
  for file in "${found[@]+"${found[@]}"}"; do
    mkdir -p "${dst}"
    name=${file#"${src}"/}
    name=${name//\//_}
    cp -p "${file}" "${dst}/${name}" 2>/dev/null && log::info profile "rescued ${file} -> ${dst}/${name}"
  done
  return 0
}

# profile::_expected_nsight_reports: one per rank that started. Bare metal: a rank whose task ran
# has a node dir (sm-node runs under the connector); a rank that never joined has none.
profile::_expected_nsight_reports() {
  if [[ ${SM_RUNTIME:-none} == none ]]; then
    # nsys starts before the sm-node it wraps writes its node.log: a rank whose session already
    # left this job's file (.qdstrm while it records) counts too.
    local logs sessions
    logs=$(find "${SM_JOBDIR}" -mindepth 2 -maxdepth 2 -path '*/node_*/node.log' 2>/dev/null | wc -l)
    sessions=$(find "$(profile::nsight_direct)" -maxdepth 1 -type f \( -name "${SLURM_JOB_ID}_*.qdstrm" -o \
      -name "${SLURM_JOB_ID}_*.nsys-rep" \) -printf '%f\n' 2>/dev/null | sed 's/\.[a-z-]*$//' | sort -u | wc -l)
    printf '%s' "$((logs > sessions ? logs : sessions))"
  else
    printf '%s' "$(($(launch::tasks_per_node) * ${SLURM_JOB_NUM_NODES:-1}))"
  fi
}

# profile::flush_nsight REASON (pre-cleanup hook), in this order: baseline, `nsight-slurm stop`,
# rescue, SIGTERM to the connector steps if nothing new appeared, wait for bytes to settle.
profile::flush_nsight() {
  local direct rescued prestop before now steps=() step expect deadline
  direct=$(profile::nsight_direct) rescued=$(profile::nsight_rescued)
  prestop=${SM_JOBDIR}/.profile-prestop.json
  profile::_worker_step_started || { log::info profile "flush: the worker step never started; no reports to wait for"; return 0; }
  # The baseline for "did the stop make nsys write?": every report as it is right before the stop.
  # By identity, not by count: a requeued job rewrites its reports under the same names.
  before=$(profile::_count_new "$(profile::baseline_file)" "${direct}" "${rescued}")
  rm -f "${prestop}"
  log::cmd profile "${SM_HOME}/bin/slurm-multi" reports snapshot "${direct}" "${rescued}" --out "${prestop}"
  util::sm reports snapshot "${direct}" "${rescued}" --out "${prestop}" ||
    log::warn profile "flush: cannot snapshot the reports before the stop (${prestop}); the connector steps get SIGTERM"
  log::info profile "flush (${1:-teardown}): ${before} report(s) of this job before the stop"
  profile::nsight_cli stop --job "${SLURM_JOB_ID}" --timeout "$((SM_FLUSH_TIMEOUT_SECONDS < 30 ? SM_FLUSH_TIMEOUT_SECONDS : 30))" ||
    log::warn profile "flush: nsight-slurm stop did not confirm every session; going on"
  profile::rescue_reports
  local ids
  ids=$(slurm::step_ids nsight-slurm-connector)
  steps=()
  [[ -z ${ids} ]] || mapfile -t steps <<<"${ids}"
  if ((${#steps[@]})); then
    # Give the stop a moment to show: a new (even empty) report means nsys is writing.
    deadline=$((SECONDS + (SM_FLUSH_SETTLE_SECONDS < 10 ? SM_FLUSH_SETTLE_SECONDS : 10)))
    now=$(profile::_count_new "${prestop}" "${direct}" "${rescued}")
    while ((now == 0 && SECONDS < deadline)); do
      sleep 0.5
      now=$(profile::_count_new "${prestop}" "${direct}" "${rescued}")
    done
    if ((now == 0)); then
      log::warn profile "flush: no new report after the stop; SIGTERM to the connector steps (${steps[*]}) so nsys ends its sessions"
      for step in "${steps[@]}"; do profile::_signal_step "${step}"; done
    fi
  fi
  expect=$(profile::_expected_nsight_reports)
  if ((expect == 0)); then
    log::warn profile "flush: no rank started under the connector; no reports to wait for"
  elif PROFILE_STATE_FILE=${SM_JOBDIR}/${PROFILE_FLUSH_FILE} profile::wait_reports "${direct}" "${expect}" "$(profile::_settle_seconds)" "$(profile::_timeout_seconds)"; then
    log::info profile "flush: ${expect} report(s) settled in ${direct}"
  else
    log::warn profile "flush: not every report settled (see above; the wait gives up at ${SM_FLUSH_TIMEOUT_SECONDS} s, or once nsys has finished and a report stayed empty); going on"
  fi
  profile::rescue_reports
}

# profile::nsight_coordinator_stop (post-cleanup hook): after every step has ended.
profile::nsight_coordinator_stop() {
  profile::nsight_cli coordinator stop --force || true
}

# ---- node side (bin/sm-node) ---------------------------------------------------------------------

# profile::before_run: set SM_PROFILE_PREFIX (run::docker_argv and run::bare put it in front of the
# workload), mount the report dir (and --nsys-host-path) into the container, pass the worker env.
profile::before_run() {
  [[ ${SM_PROFILE:-none} != none ]] || return 0
  # lib/run.sh stops the container with `docker stop -t ${SM_STOP_GRACE}`: never shorter than the
  # time nsys needs to write its report after the SIGTERM.
  profile::apply_stop_grace
  [[ ${SM_PROFILE} == nsys ]] || return 0
  local dir pair name
  dir=$(profile::dir)
  mkdir -p "${dir}" || { log::error profile "cannot create the report directory ${dir} on $(hostname)"; return 1; }
  if [[ ${SM_RUNTIME:-docker} == docker ]]; then
    # Same path inside: nsys writes straight to shared storage.
    RUN_DOCKER_OPTS+=(-v "${dir}:${dir}")
    [[ -n ${SM_NSYS_HOST_PATH:-} ]] && RUN_DOCKER_OPTS+=(-v "${SM_NSYS_HOST_PATH}:${PROFILE_NSYS_MOUNT}:ro")
    local pairs=()
    util::split0 pairs profile::worker_env || return 2
    for pair in "${pairs[@]+"${pairs[@]}"}"; do
      name=${pair%%=*}
      [[ -n ${!name+x} ]] && SM_EXTRA_ENV_NAMES+=("${name}")
    done
  fi
  util::split0 SM_PROFILE_PREFIX profile::nsys_prefix || return 2
  : >"${SM_NODE_DIR}/.profile-nsys" # tells the batch flush this rank's report is coming
  PROFILE_NODE_ACTIVE=1
  log::info profile "nsys: this rank's report: ${dir}/${SLURM_JOB_ID:-}_${SLURMD_NODENAME:-}_rank${SLURM_PROCID:-}.nsys-rep"
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
  if profile::wait_reports "$(profile::dir)" 1 "${SM_FLUSH_SETTLE_SECONDS}" "${SM_FLUSH_TIMEOUT_SECONDS}" "*_rank${SLURM_PROCID:-}.nsys-rep"; then
    log::info profile "nsys report of rank ${SLURM_PROCID:-} settled"
  else
    log::warn profile "nsys report of rank ${SLURM_PROCID:-} did not settle within ${SM_FLUSH_TIMEOUT_SECONDS} s; staging anyway"
  fi
  return 0
}

# ---- dry run -------------------------------------------------------------------------------------

# profile::dry_run_panel NNODES: type, runtime, windows, the launcher argv, tool options, reports.
profile::dry_run_panel() {
  local nnodes=$1 argv=() opts=() env=() window
  window=$(profile::window)
  SLURM_JOB_NUM_NODES=${nnodes} launch::step_argv || return 2
  argv=("${LAUNCH_ARGV[@]}")
  util::split0 env profile::worker_env || return 2
  printf 'Profiling\n'
  printf '  %-16s %s\n' type "${SM_PROFILE}" runtime "${SM_RUNTIME}" framework "${SM_FRAMEWORK:-(not set)}"
  if [[ ${SM_PROFILE} == none ]]; then
    printf '  %-16s %s\n' window "(profiling off)"
  elif [[ -n ${window} ]]; then
    printf '  %-16s %s\n' window "iterations ${window} (TLLM_PROFILE_START_STOP=${window})"
  else
    printf '  %-16s %s\n' window "the whole run"
  fi
  printf '  %-16s %s\n' "worker step" "$(printf '%q ' "${argv[@]}")"
  case ${SM_PROFILE} in
    nsys)
      util::split0 opts profile::nsys_prefix || return 2
      printf '  %-16s %s\n' "nsys prefix" "$(printf '%q ' "${opts[@]}")"
      printf '  %-16s %s\n' "tool options" "${SM_PROFILE_TOOL_OPTIONS:-$(printf '%q ' "${opts[@]:2:${#opts[@]}-4}")}"
      printf '  %-16s %s\n' "report output" "$(profile::dir)/${PROFILE_REPORT_NAME}.nsys-rep (one per rank)"
      [[ ${SM_RUNTIME} == docker ]] &&
        printf '  %-16s %s\n' mounts "$(profile::dir) (same path)${SM_NSYS_HOST_PATH:+, ${SM_NSYS_HOST_PATH} -> ${PROFILE_NSYS_MOUNT} (ro)}"
      printf '  %-16s %s\n' flush "SIGTERM to the step (each node: docker stop -t $(profile::stop_grace)), then wait for every rank's report: settle ${SM_FLUSH_SETTLE_SECONDS} s on bytes, timeout ${SM_FLUSH_TIMEOUT_SECONDS} s"
      printf '  %-16s %s\n' "stop grace" "$(profile::stop_grace) s (the larger of --stop-grace ${SM_STOP_GRACE} and ${SM_PROFILE_STOP_GRACE:+--profile-stop-grace }${SM_PROFILE_STOP_GRACE:-settle ${SM_FLUSH_SETTLE_SECONDS} + ${PROFILE_STOP_GRACE_MARGIN}})"
      # The per-node docker argv below shows the prefix too (this is the dry run's subshell).
      util::split0 SM_PROFILE_PREFIX profile::nsys_prefix || return 2
      ;;
    nsight-slurm)
      util::split0 opts profile::nsight_tool_options || return 2
      printf '  %-16s %s\n' install "${SM_NSIGHT_SLURM_HOME} (bin/nsight-slurm, bin/nsight-slurm-connector)"
      printf '  %-16s %s\n' "tool path" "${SM_NSIGHT_SLURM_TOOL_PATH}" "profiling mode" "$(profile::nsight_mode)"
      printf '  %-16s %s\n' "tool options" "$(printf '%q ' "${opts[@]}")"
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
