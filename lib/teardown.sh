# shellcheck shell=bash
# Teardown hooks. Pre-cleanup hooks (the profiling flush) run exactly once per job, before anything
# stops a step, under a lock: a second caller -- another trap, the watch loop, another process --
# waits for the first to finish instead of killing steps under it. Post-cleanup hooks run after
# the steps have ended (e.g. stopping the nsight-slurm coordinator).

TEARDOWN_PRE_HOOKS=()
TEARDOWN_POST_HOOKS=()
TEARDOWN_PRE_ACTIVE=0

teardown::add_pre_hook() { TEARDOWN_PRE_HOOKS+=("$1"); }
teardown::add_post_hook() { TEARDOWN_POST_HOOKS+=("$1"); }

# teardown::pre_cleanup REASON: run the pre-cleanup hooks once (per job dir), under the lock.
teardown::pre_cleanup() {
  local reason=$1 lockfd dir=${SM_JOBDIR:?} hook saved_traps
  if ((TEARDOWN_PRE_ACTIVE)); then
    # Re-entered from this very shell (a trap while the hooks run): waiting on the lock we hold
    # would deadlock; the running flush finishes when we return.
    log::info teardown "pre-cleanup already running in this shell (${reason}); not starting it again"
    return 0
  fi
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
  # While the hooks run, SIGTERM/SIGINT/SIGHUP/SIGUSR1 are ignored, here and (inherited) in the
  # helpers they start: scancel signals the whole batch step, and neither a second trigger nor a
  # killed `reports wait` may cut the flush short. Slurm's SIGKILL after KillWait still bounds it.
  saved_traps=$(trap -p TERM INT HUP USR1)
  trap '' TERM INT HUP USR1
  TEARDOWN_PRE_ACTIVE=1
  for hook in "${TEARDOWN_PRE_HOOKS[@]+"${TEARDOWN_PRE_HOOKS[@]}"}"; do
    "${hook}" "${reason}" || log::warn teardown "pre-cleanup hook ${hook} failed; going on"
  done
  local stamp
  TZ=UTC printf -v stamp '%(%FT%TZ)T' -1
  printf '%s %s\n' "${stamp}" "${reason}" >"${dir}/.pre-cleanup.done"
  TEARDOWN_PRE_ACTIVE=0
  trap - TERM INT HUP USR1
  # trap -p prints the handlers as trap commands; running them back is how bash restores traps.
  eval "${saved_traps}"
  exec {lockfd}>&-
}

teardown::post_cleanup() {
  local hook
  for hook in "${TEARDOWN_POST_HOOKS[@]+"${TEARDOWN_POST_HOOKS[@]}"}"; do
    "${hook}" || log::warn teardown "post-cleanup hook ${hook} failed; going on"
  done
}
