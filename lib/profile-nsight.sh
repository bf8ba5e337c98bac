# shellcheck shell=bash
# shellcheck disable=SC2153 # the SM_* settings come from the job plan (slurm_multi.settings)
# Nsight Cloud for Slurm (--profile nsight-slurm): the wrapper's configuration, its coordinator, the
# connector's nsys options, and the teardown's flush and rescue of the reports. Loaded by
# lib/profile.sh (the shared parts: settings, report dirs, the baseline, the settle wait, the dry run).

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

profile::nsight_workspace() { printf '%s/nsight-slurm-reports' "$(profile::report_root)"; }

profile::nsight_direct() { printf '%s/nsight-slurm-direct' "$(profile::report_root)"; }

profile::nsight_rescued() { printf '%s/rescued' "$(profile::nsight_workspace)"; }

profile::nsight_runtime() { printf '%s/nsight-slurm-runtime' "$(profile::log_dir)"; }

profile::nsight_bin() { printf '%s/bin/nsight-slurm' "${SM_NSIGHT_SLURM_HOME}"; }

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
  if [[ ${SM_RUNTIME} == pyxis ]]; then
    words+=(-o "$(profile::nsight_direct)/${PROFILE_REPORT_NAME/SLURM_PROCID/SM_RANK}")
  else
    words+=(-o "$(profile::nsight_direct)/${PROFILE_REPORT_NAME}")
  fi
  printf '%s\0' "${words[@]}"
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
  printf '# %s\n+ %s\n' "$(date -u +%FT%TZ)" "$(log::quote "${argv[@]}")" >>"${out}"
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

profile::_print_call() { printf '      nsight-slurm %s\n' "$(log::quote "$@")"; }

# profile::nsight_setup: check the install, configure the wrapper, start the coordinator. Safe to
# run twice: the wrapper keeps its state per job and reuses a running coordinator.
profile::nsight_setup() {
  if ((PROFILE_NSIGHT_CONFIGURED)); then
    log::info profile "nsight-slurm: already configured for job ${SLURM_JOB_ID}"
    return 0
  fi
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
      "$(log::quote "${LAUNCH_ARGV[@]}")" >>"$(profile::log_dir)/nsight-slurm.out"
  fi
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
  if [[ ${SM_RUNTIME} == none ]]; then
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
  # On the timeline as a sub-step of rank 0's lane (the batch step runs on rank 0's node), for
  # every rank's report: nsight_flush.
  profile::job_event nsight_flush_start reason="${1:-teardown}"
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
  local settled=0
  if ((expect == 0)); then
    log::warn profile "flush: no rank started under the connector; no reports to wait for"
  elif PROFILE_STATE_FILE=${SM_JOBDIR}/${PROFILE_FLUSH_FILE} profile::wait_reports "${direct}" "${expect}" "$(profile::_settle_seconds)" "$(profile::_timeout_seconds)"; then
    log::info profile "flush: ${expect} report(s) settled in ${direct}"
    settled=1
  else
    log::warn profile "flush: not every report settled (see above; the wait gives up at ${SM_FLUSH_TIMEOUT_SECONDS} s, or once nsys has finished and a report stayed empty); going on"
  fi
  profile::rescue_reports
  profile::job_event nsight_flush_end settled="${settled}" expected="${expect}"
}

# profile::job_event NAME KEY=VALUE…: a batch-step event, in the batch step's own events file
# (<jobdir>/batch/events.log: node_0/events.log is rank 0's task's alone); the timeline shows it on
# rank 0's lane (results/timeline.py).
profile::job_event() {
  SM_NODE_DIR=${SM_JOBDIR}/batch SM_RANK=0 timeline::event "$@"
}

# profile::nsight_coordinator_stop (post-cleanup hook): after every step has ended.
profile::nsight_coordinator_stop() {
  profile::nsight_cli coordinator stop --force || true
}
