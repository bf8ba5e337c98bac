# shellcheck shell=bash
# shellcheck disable=SC2153 # the SM_* settings come from the job plan (slurm_multi.settings)
# Nsight Systems (--profile nsys): the nsys command line every rank runs under, the batch step's
# setup, and the teardown's flush of the reports. Loaded by lib/profile.sh (the shared parts:
# settings, report dirs, the baseline, the settle wait, the node hooks, the dry run).

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

# profile::nsys_bin: the nsys the workload runs under (--nsys-host-path wins; in a container it is
# mounted at PROFILE_NSYS_MOUNT).
profile::nsys_bin() {
  if [[ -z ${SM_NSYS_HOST_PATH:-} ]]; then
    printf '%s' "${SM_NSYS_PATH}"
  elif [[ ${SM_RUNTIME} == none ]]; then
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

profile::nsys_setup() {
  local dir
  dir=$(profile::dir)
  mkdir -p "${dir}" || { log::error profile "cannot create the report directory ${dir}"; return 1; }
  export SM_PROFILE_DIR=${dir}
  teardown::add_pre_hook profile::flush_nsys
  log::info profile "nsys: one report per rank in ${dir}; flush: settle ${SM_FLUSH_SETTLE_SECONDS} s on bytes, timeout ${SM_FLUSH_TIMEOUT_SECONDS} s"
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
  if profile::_worker_step_running && [[ ${SM_RUNTIME} == pyxis ]]; then
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
