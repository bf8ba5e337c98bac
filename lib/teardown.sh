# shellcheck shell=bash
# Teardown hooks. Pre-cleanup hooks (the profiling flush) run exactly once per job, before anything
# stops a step, under a lock: a second caller -- another trap, the watch loop, another process --
# waits for the first to finish instead of killing steps under it. Post-cleanup hooks run after
# the steps have ended (e.g. stopping the nsight-slurm coordinator).

TEARDOWN_PRE_HOOKS=()
TEARDOWN_POST_HOOKS=()

teardown::add_pre_hook() { TEARDOWN_PRE_HOOKS+=("$1"); }
teardown::add_post_hook() { TEARDOWN_POST_HOOKS+=("$1"); }

# teardown::pre_cleanup REASON: run the pre-cleanup hooks once (per job dir), under the lock.
teardown::pre_cleanup() {
  local reason=$1 lockfd dir=${SM_JOBDIR:?} hook
  exec {lockfd}>>"${dir}/.pre-cleanup.lock"
  if ! flock -n "${lockfd}"; then
    log::info teardown "pre-cleanup already running (another trigger); waiting for it before going on"
    flock "${lockfd}"
  fi
  if [[ -f ${dir}/.pre-cleanup.done ]]; then
    exec {lockfd}>&-
    return 0
  fi
  log::info teardown "pre-cleanup (${reason}): ${#TEARDOWN_PRE_HOOKS[@]} hook(s)"
  for hook in "${TEARDOWN_PRE_HOOKS[@]+"${TEARDOWN_PRE_HOOKS[@]}"}"; do
    "${hook}" "${reason}" || log::warn teardown "pre-cleanup hook ${hook} failed; going on"
  done
  printf '%s %s\n' "$(date -u +%FT%TZ)" "${reason}" >"${dir}/.pre-cleanup.done"
  exec {lockfd}>&-
}

teardown::post_cleanup() {
  local hook
  for hook in "${TEARDOWN_POST_HOOKS[@]+"${TEARDOWN_POST_HOOKS[@]}"}"; do
    "${hook}" || log::warn teardown "post-cleanup hook ${hook} failed; going on"
  done
}
