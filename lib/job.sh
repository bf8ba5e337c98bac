# shellcheck shell=bash
# shellcheck disable=SC2031 # dry-run helpers read the subshell's SLURM_JOB_ID
# The batch step: job directory, one srun task per node, the watch loop, teardown, aggregation.

JOB_SRUN_PID=
JOB_STEP_ID=
JOB_TEARDOWN_STARTED=0
JOB_WATCH_STOPPED=0
JOB_REAPED=0
JOB_SCANCEL_WAIT=3 # seconds (job::signal_step)
JOB_BAD_CAUSE=fitness

# job::plan ARGS...: the one helper call that parses the batch step's ARGS and the environment
# against the settings table (slurm_multi.settings), validates them with the manifest, places the
# job dir and, in a real job, writes job.json. Its bash is sourced only after it succeeded: a typo or
# a bad manifest stops the job here, before any srun, with the helper's own one-line reason.
job::plan() {
  local plan
  plan=$(mktemp "${TMPDIR:-/tmp}/sm-plan.XXXXXX") || log::die multi "cannot create a temp file" 1
  local argv=(job plan --batch-args --emit "${plan}" --submit-dir "${SLURM_SUBMIT_DIR:-${PWD}}")
  ((${#JOB_NODES[@]})) && argv+=(--nodes "${JOB_NODES[*]}")
  if ! util::helper "${argv[@]}" -- "$@"; then
    rm -f "${plan}"
    # The plan's own one line is already on stderr: said once, not twice.
    ((UTIL_ERROR_SHOWN)) && exit 2
    # No line of its own: the interpreter itself may be what fails; its line says so.
    util::check_python || exit 2
    log::die multi "${UTIL_ERROR}" 2
  fi
  util::source "${plan}"
  rm -f "${plan}"
  # The plan ran as a click command: the interpreter has click. Every node's task trusts this (same
  # path, shared storage).
  export SM_PYTHON_CHECKED=1
}

# job::srun_argv: how the batch step starts the worker step, into JOB_SRUN_ARGV (lib/launch.sh
# builds it for every runtime and profiler).
job::srun_argv() {
  launch::step_argv
  JOB_SRUN_ARGV=("${LAUNCH_ARGV[@]}")
}

# job::run: the job itself, after job::plan (in the batch step, inside the allocation).
job::run() {
  # The barrier's per-job secret; never printed (it travels in the environment, not in argv). Made
  # before the log filter starts, so the filter knows to mask it.
  [[ -n ${SM_BARRIER_TOKEN:+given} ]] || util::generate_token SM_BARRIER_TOKEN
  export SM_BARRIER_TOKEN
  # JOB_IMAGE (the plan's image): a worker's barrier tells rank 0 which ID of it the node holds
  # before prepare has resolved SM_IMAGE again on the node; JOB_IMAGE_LAYERS (its layers as rank 0's
  # engine held it when the plan ran): and how many of those layers it holds (lib/node.sh).
  export SM_JOBDIR SM_BATCH_LOG=${SM_JOBDIR}/batch.log JOB_IMAGE JOB_IMAGE_LAYERS
  job::export_attempt
  # Its cache key too, worked out once here (a process) instead of on every node at its start, while
  # the nodes' helpers compete for the cores (image::key_into takes it when the ref is JOB_IMAGE).
  if [[ -n ${JOB_IMAGE:-} ]]; then
    image::key_into "${JOB_IMAGE}"
    export SM_JOB_IMAGE_KEY=${IMAGE_KEY}
  fi
  util::log_to "${SM_BATCH_LOG}"
  log::enable_debug
  log::info multi "job ${SLURM_JOB_ID}: ${SLURM_JOB_NUM_NODES} nodes (${SLURM_JOB_NODELIST}), outputs in ${SM_JOBDIR}$(job::attempt_note)"
  [[ -z ${PLAN_EARLIER_RUN:-} ]] ||
    log::info multi "an earlier run of the batch script in this allocation left its files in the job dir: moved to ${SM_JOBDIR}/${PLAN_EARLIER_RUN}/"
  # Before anything runs: a node that an earlier job found bad is not used (requeued without it).
  job::respect_quarantine
  job::traps
  if declare -F profile::before_steps >/dev/null; then
    profile::before_steps || log::die multi "profiling setup failed (see ${SM_BATCH_LOG})" 1
  fi
  local argv=()
  job::srun_argv
  argv=("${JOB_SRUN_ARGV[@]}")
  log::cmd multi "${argv[@]}"
  "${argv[@]}" &
  JOB_SRUN_PID=$!
  # A manifest model's collect writes madengine's record files once the job is judged, which needs
  # pandas (~0.4 s): collect starts warm, its imports paid while the workload runs, not after the
  # last rank's exit (the watch wakes it once every rank runs, not while the nodes start).
  [[ -z ${JOB_MODEL_KEY:-} ]] || ! settings::truthy "${SM_COLLECT}" || util::warm_start results collect --wake-later
  job::watch
  # The watch stopped the step for a failed or lost rank: a lost node's task never ends, and srun
  # waits for it until Slurm declares the node dead (SlurmdTimeout, 300 s by default). The teardown
  # waits for the ranks instead (a lost one is recorded as such), bounded.
  ((JOB_WATCH_STOPPED == 0)) || job::teardown "a node failed or was lost ${SM_PEER_GRACE} s ago"
  local rc=0
  wait "${JOB_SRUN_PID}" 2>/dev/null || rc=$?
  JOB_SRUN_PID=
  log::info multi "node tasks ended (srun exit ${rc})"
  JOB_SRUN_RC=${rc}
}

# job::step_id: the id of our sm-node step (for scancel --signal=TERM <job>.<step>).
job::step_id() {
  local launcher=nsight-slurm-connector
  # Under pyxis the connector steps are the ranks' own (lib/run.sh); ours is always sm-node.
  [[ ${SM_RUNTIME} != pyxis ]] || launcher=sm-node
  [[ -n ${JOB_STEP_ID} ]] || JOB_STEP_ID=$(slurm::step_ids "sm-node|${launcher}" | head -n 1)
  printf '%s' "${JOB_STEP_ID}"
}

# job::rank_steps: under pyxis, the ids of the ranks' own steps (sm-rank<R>, or the connector's).
job::rank_steps() {
  slurm::step_ids 'sm-rank[0-9]+|nsight-slurm-connector'
}

# job::watch: wait for the tasks while a helper watches them (progress, a rank's status.json saying
# it failed, a node Slurm declares DOWN or failed, a node silent on the network: slurm_multi.watch).
# When one fails or is lost, the others get --peer-grace seconds, then they are stopped gracefully
# (SIGTERM to the step, never SIGKILL).
job::watch() {
  local rc=0 per_node
  per_node=$(launch::tasks_per_node)
  # It wakes the warm helpers once every rank's workload runs.
  local wake=() key
  for key in "${!UTIL_WARM_FD[@]}"; do wake+=(--wake-fd "${UTIL_WARM_FD[${key}]}"); done
  util::sm_aside job watch --jobdir "${SM_JOBDIR}" --nodes "${JOB_NODES[*]}" \
    --tasks-per-node "${per_node}" --srun-pid "${JOB_SRUN_PID}" --peer-grace "${SM_PEER_GRACE}" \
    --progress-seconds "${SM_PROGRESS_SECONDS}" --master-port "${SM_MASTER_PORT}" "${wake[@]+"${wake[@]}"}" &
  JOB_WATCH_PID=$!
  wait "${JOB_WATCH_PID}" || rc=$?
  JOB_WATCH_PID=
  if ((rc == 10)); then
    JOB_WATCH_STOPPED=1
    job::stop_step "a node failed or was lost ${SM_PEER_GRACE} s ago"
  elif ((rc != 0)); then
    log::warn multi "the watch helper ended with exit ${rc}; waiting for the node tasks without it"
  fi
}

# job::stop_step REASON: run the pre-cleanup hooks (profiling flush), then SIGTERM the node tasks.
# Not SIGTERM to srun: srun turns that into SIGKILL for the tasks.
job::stop_step() {
  local step
  teardown::pre_cleanup "$1"
  if [[ ${SM_RUNTIME} == pyxis ]]; then
    # Not the sm-node step: each sm-node's srun of its rank would SIGKILL the rank (see above).
    # SIGTERM to the ranks' steps; each sm-node then stages its rank as it ends.
    for step in $(job::rank_steps); do job::signal_step TERM "${step}"; done
    return 0
  fi
  step=$(job::step_id)
  [[ -n ${step} ]] || return 0
  job::signal_step TERM "${step}"
}

# job::signal_step SIGNAL STEP: scancel --signal=SIGNAL <job>.STEP, at most JOB_SCANCEL_WAIT s: the
# signal reaches the live nodes at once, but scancel itself waits for every node of the step to
# answer, MessageTimeout (10 s by default) for one that was lost, and the teardown has no time for it.
job::signal_step() {
  log::cmd multi scancel --signal="$1" "${SLURM_JOB_ID}.$2"
  timeout "${JOB_SCANCEL_WAIT}" scancel --signal="$1" "${SLURM_JOB_ID}.$2" 2>/dev/null || true
}

# job::reap: a node task that died without staging (SIGKILL, crash) left a container and outputs
# behind; one short step per node stops the container and stages them. Skipped when every node
# staged already.
job::reap() {
  job::all_staged && return 0
  local argv=(srun --overlap --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node="$(launch::tasks_per_node)" --kill-on-bad-exit=0
    --job-name=sm-reap --label "${SM_HOME}/bin/sm-node" --stage reap --jobdir "${SM_JOBDIR}")
  local limit
  limit=$(job::reap_timeout)
  if ((limit < 1)); then
    log::warn multi "no time left before Slurm's KillWait to reap the unstaged ranks; collecting what is there"
    return 0
  fi
  log::cmd multi timeout "${limit}" "${argv[@]}"
  JOB_REAPED=1
  # A node that is down cannot be reaped; do not let it hold the teardown for long.
  timeout "${limit}" "${argv[@]}" ||
    log::warn multi "the reaper step did not finish on every node within ${limit} s (a node down?); going on"
}

# job::mark_lost [--vanished]: the teardown's record of the ranks whose node Slurm reports dead or
# cannot reach, or the watch found silent on the network (the job is ending: such a rank will never
# stage, and the reaper cannot reach it). --vanished (after the reaper ran on every node): also the
# node of a rank that still has no status.json (slurm_multi.watch, lost.json).
job::mark_lost() {
  util::sm job mark-lost --jobdir "${SM_JOBDIR}" --nodes "${JOB_NODES[*]}" \
    --tasks-per-node "$(launch::tasks_per_node)" --not-responding "$@" || true
}

# job::reap_timeout: how long the reaper step may take. After a signal, Slurm SIGKILLs the batch
# step KillWait seconds later; collect must come before that, so the reaper gets what is left of
# KillWait minus a margin for collect (0: no time left to reap).
job::reap_timeout() {
  local limit=${SM_REAP_TIMEOUT:-$((SM_STOP_GRACE + 30))} kill_wait left
  if [[ -n ${JOB_SIGNAL_AT:-} ]]; then
    kill_wait=$(slurm::killwait)
    [[ -n ${kill_wait} ]] || kill_wait=30 # Slurm's default
    left=$((kill_wait - (SECONDS - JOB_SIGNAL_AT) - SM_COLLECT_MARGIN))
    ((left > 0)) || left=0
    ((left >= limit)) || limit=${left}
  fi
  printf '%s' "${limit}"
}

# job::all_staged: every rank of the worker step wrote its status.json.
job::all_staged() {
  local per_node=1 r
  declare -F launch::tasks_per_node >/dev/null && per_node=$(launch::tasks_per_node)
  for ((r = 0; r < ${SLURM_JOB_NUM_NODES:-1} * per_node; r++)); do
    [[ -f ${SM_JOBDIR}/node_${r}/status.json ]] || return 1
  done
}

# job::traps: every way out of the batch step goes through the teardown, once.
job::traps() {
  trap 'job::teardown "normal end"' EXIT
  trap 'job::on_signal "SIGTERM (scancel or time limit)" 143' TERM
  trap 'job::on_signal SIGINT 130' INT
  trap 'job::on_signal "SIGUSR1 (time limit approaching)" 3' USR1
}

# job::on_signal REASON RC: a signal's way into the teardown. A signal that comes while the teardown
# runs (Slurm signals the whole batch step when it kills the job for a failed node, often while the
# reaper step waits on that node) must not end the batch step before collect: the teardown goes on,
# and exits with its own verdict.
job::on_signal() {
  [[ -n ${JOB_SIGNAL_AT:-} ]] || JOB_SIGNAL_AT=${SECONDS} JOB_SIGNAL_RC=$2
  if ((JOB_TEARDOWN_STARTED)); then
    log::warn multi "${1} during the teardown: finishing it (collect still runs)"
    return 0
  fi
  job::teardown "$1"
  exit "$2"
}

# job::teardown REASON: every exit path ends here, once: flush, stop tasks, aggregate.
job::teardown() {
  ((JOB_TEARDOWN_STARTED == 0)) || return 0
  JOB_TEARDOWN_STARTED=1
  trap - EXIT
  util::log_resume
  local reason=$1 rc=${JOB_SRUN_RC:-0} deadline
  log::info multi "teardown: ${reason}"
  # (scancel signals the watch helper too: it may be gone already)
  if [[ -n ${JOB_WATCH_PID:-} ]]; then kill -TERM "${JOB_WATCH_PID}" 2>/dev/null || true; fi
  if [[ -n ${JOB_SRUN_PID} ]] && kill -0 "${JOB_SRUN_PID}" 2>/dev/null; then
    # (Not twice: after the watch stopped the step, a second scancel would wait on the lost node again.)
    ((JOB_WATCH_STOPPED)) || job::stop_step "${reason}"
    # Wait for the tasks, not for srun: after a cancel srun can sit for a minute waiting for the
    # step to be reaped, and Slurm's SIGKILL (KillWait after the SIGTERM) must not find us before
    # collect. Once every rank has staged (status.json), go on.
    deadline=$((SECONDS + SM_STOP_GRACE + 30))
    # A rank on a node Slurm declared dead never stages: recorded as lost, not waited for.
    local next_check=0
    while kill -0 "${JOB_SRUN_PID}" 2>/dev/null && ((SECONDS < deadline)) && ! job::all_staged; do
      if ((SECONDS >= next_check)); then
        job::mark_lost
        next_check=$((SECONDS + 5))
      fi
      sleep 0.2
    done
    if kill -0 "${JOB_SRUN_PID}" 2>/dev/null; then
      log::info multi "every rank has staged; not waiting for srun to notice"
    elif [[ -z ${JOB_SIGNAL_AT:-} ]]; then
      # srun's own status, asked only off a signal's path: a signal's handler may have interrupted
      # the wait for srun, and a second `wait` could block for ever (util::wait_gone); there the
      # exit is the signal's.
      wait "${JOB_SRUN_PID}" 2>/dev/null || rc=$?
    else
      rc=${JOB_SIGNAL_RC}
    fi
  else
    teardown::pre_cleanup "${reason}"
  fi
  # A rank whose node Slurm declared dead is recorded as lost (and not reaped: nothing answers there).
  job::all_staged || job::mark_lost
  job::reap
  # The reaper cannot reach a node that died; Slurm may have declared it dead meanwhile. What the
  # reaper could not stage it could not reach: that node is lost too (not after a signal: scancel or
  # the time limit may have cut a healthy node's reap short).
  if ! job::all_staged; then
    if ((JOB_REAPED)) && [[ -z ${JOB_SIGNAL_AT:-} ]]; then job::mark_lost --vanished; else job::mark_lost; fi
  fi
  teardown::post_cleanup
  # A node that failed the fitness check: quarantined for later jobs, and this job requeued without
  # it (--on-bad-node requeue) once this attempt's evidence is judged and kept. Collect judges the
  # fitness reports as it judges the job (one helper, one judgement); without collect, the judge alone.
  if ! settings::truthy "${SM_COLLECT}"; then
    job::judge_fitness && job::on_bad_nodes
    util::log_drain
    util::remove_private_dir
    exit "${rc}"
  fi
  rc=0
  local bad held=0
  bad=$(mktemp "${TMPDIR:-/tmp}/sm-bad-nodes.XXXXXX") || log::die multi "cannot create a temp file" 1
  # Collect reads job.json (written by the plan), never the manifest.
  # No timeline.png here: matplotlib's import and the drawing would hold the allocation a second
  # after the verdict is known; bin/sm-collect draws it on request.
  local cargs=("${SM_JOBDIR}" --no-picture --bad-nodes "${bad}") extras=()
  # Once the job is judged, in collect's own process: a manifest model's madengine files
  # (perf_entry.*, perf_super.*; beside --perf-csv only where collect appended the rows), then the
  # job's page (report.html: a helper of its own would add ~0.09 s to every job; the page itself is
  # ~1 ms). The failure of either is a warning, never the job's exit.
  [[ -z ${JOB_MODEL_KEY:-} ]] || extras+=(--mad-outputs)
  extras+=(--page)
  cargs+=("${extras[@]}")
  if [[ -n ${SM_PERF_CSV:-} ]]; then
    cargs+=(--perf-csv "${SM_PERF_CSV}")
    # A job to be requeued appends its rows with the attempt that counts.
    [[ ${SM_ON_BAD_NODE} != requeue ]] || { cargs+=(--no-perf-csv-on-bad-nodes); held=1; }
  fi
  # collected: the last collect's exit, 0 or 1 once it has judged the job and appended its rows to
  # --perf-csv (when it held them for a requeue, the collect below appends them); 2 or 3 when not.
  local collected=0
  util::warm_logged multi results collect "${cargs[@]}" || collected=$?
  rc=${collected}
  local found=0
  job::bad_nodes_from "${bad}" && found=1
  rm -f "${bad}" # before a requeue, which ends the batch step
  if ((found)); then
    job::on_bad_nodes
    # Not requeued after all: this attempt is the job's, its rows go to the shared perf.csv.
    if ((held)); then
      collected=0
      # (cold: the warm helper ran the first; madengine's files beside --perf-csv now too)
      util::sm_logged multi results collect "${SM_JOBDIR}" --no-picture --perf-csv "${SM_PERF_CSV}" "${extras[@]}" ||
        collected=$?
      ((collected == 0)) || rc=${collected}
    fi
  fi
  log::info multi "verdict: $( ((rc == 0)) && echo SUCCESS || echo FAILURE) (${SM_JOBDIR}/summary.json)"
  # A collect that did not judge the job (2, 3) wrote no page: the page on its own.
  if ((collected >= 2)) && [[ -f ${SM_JOBDIR}/summary.json ]]; then
    util::sm_logged multi report "${SM_JOBDIR}" ||
      log::warn multi "the job's page (report.html) not written: ${UTIL_ERROR}"
  fi
  util::log_drain
  util::remove_private_dir
  exit "${rc}"
}

# ---- bad nodes: the fitness verdict, the quarantine, the requeue ---------------------------------

# job::export_attempt: SM_ATTEMPT, this attempt's number (1 for the first; Slurm's
# SLURM_RESTART_COUNT + 1 once requeued), for every rank's workload: a workload that checkpoints
# resumes from it (docs/bad-nodes.md). The docker runtime passes it (lib/run.sh RUN_RANK_ENV).
job::export_attempt() {
  export SM_ATTEMPT=$((${SLURM_RESTART_COUNT:-0} + 1))
}

# job::attempt_note: ", attempt N" on a requeued job's first line.
job::attempt_note() {
  ((${SLURM_RESTART_COUNT:-0} == 0)) || printf ', attempt %s (requeued %s time(s))' "$((SLURM_RESTART_COUNT + 1))" "${SLURM_RESTART_COUNT}"
}

# job::respect_quarantine: the allocation holds a node of the shared quarantine (--state-dir): the
# job requeues itself without it before anything runs, or, with no requeue left, fails naming it.
# The plan read the quarantine (PLAN_QUARANTINED: `quarantine check`'s lines for JOB_NODES). An
# unreadable quarantine is said and not used (the fitness check still runs on every node).
job::respect_quarantine() {
  [[ -n ${SM_STATE_DIR:-} ]] || return 0
  local entry node reason job until bad=() why=()
  if [[ -n ${PLAN_QUARANTINE_ERROR:-} ]]; then
    log::warn multi "the quarantine in ${SM_STATE_DIR} is not used: ${PLAN_QUARANTINE_ERROR}"
    return 0
  fi
  for entry in ${PLAN_QUARANTINED[@]+"${PLAN_QUARANTINED[@]}"}; do
    IFS=$'\t' read -r node reason job until <<<"${entry}"
    [[ -n ${node} ]] || continue
    bad+=("${node}")
    why+=("${node}"$'\t'"quarantined until ${until} by job ${job}: ${reason}")
    log::warn multi "node ${node} is quarantined until ${until} (job ${job}: ${reason})"
  done
  ((${#bad[@]})) || return 0
  JOB_BAD_NODES=("${why[@]}")
  job::requeue_without quarantine && return 0
  log::die multi "the allocation holds quarantined node(s) ${bad[*]}: submit with sbatch --exclude=$(IFS=,; echo "${bad[*]}"), or release them: bin/slurm-multi quarantine remove --state-dir ${SM_STATE_DIR} ${bad[*]}" 1
}

# job::judge_fitness: the bad nodes of this attempt, from every node's fitness.json and status.json
# (`slurm-multi fitness judge`), into JOB_BAD_NODES (`<node>\t<reason>` each) and JOB_BAD_EVIDENCE;
# false when there are none. Only without collect: collect judges them itself (job::bad_nodes_from
# reads what it found), and only collect judges the nodes lost during the run.
job::judge_fitness() {
  JOB_BAD_NODES=()
  [[ ${SM_FITNESS} != off ]] || return 1
  local out
  if ! out=$(util::sm fitness judge --jobdir "${SM_JOBDIR}" --nodes "${JOB_NODES[*]}" \
    --min-rate "${SM_FITNESS_MIN_RATE}" 2>&1); then
    log::warn multi "cannot judge the fitness reports: ${out#slurm-multi: }"
    return 1
  fi
  job::take_bad_nodes <<<"${out}"
}

# job::bad_nodes_from FILE: the bad nodes collect wrote (--bad-nodes), into JOB_BAD_NODES; false
# when there are none. A collect that failed before writing FILE leaves the judge alone to find them.
job::bad_nodes_from() {
  JOB_BAD_NODES=()
  if [[ ! -s $1 ]]; then
    # Empty: collect found none. Missing is unreadable here only when collect itself failed.
    [[ -e $1 ]] && return 1
    job::judge_fitness
    return $?
  fi
  job::take_bad_nodes <"$1"
}

# job::take_bad_nodes [CAUSE]: `<rank>\t<node>\t<reason>\t<evidence>[\t<cause>]` lines on stdin
# (the judge's, collect's) into JOB_BAD_NODES, JOB_BAD_EVIDENCE (local, peers or none:
# slurm_multi.fitness.verdict, slurm_multi.results.midrun) and JOB_BAD_CAUSE (what found them: the
# requeue records it), each said on the batch log; false when there are none. The fitness judge's
# lines have no cause: CAUSE (fitness) is theirs.
job::take_bad_nodes() {
  local given=${1:-fitness} rank node reason evidence cause
  JOB_BAD_NODES=() JOB_BAD_EVIDENCE=() JOB_BAD_CAUSE=${given}
  while IFS=$'\t' read -r rank node reason evidence cause; do
    [[ -n ${node} ]] || continue
    JOB_BAD_NODES+=("${node}"$'\t'"${reason}")
    JOB_BAD_EVIDENCE+=("${evidence:-none}")
    cause=${cause:-${given}}
    # One attempt, one cause: a node lost during the run outweighs (the run began, so none failed fitness).
    [[ ${cause} != run ]] || JOB_BAD_CAUSE=run
    log::error multi "bad node ${node} (rank ${rank}): ${reason}"
  done
  ((${#JOB_BAD_NODES[@]}))
}

# job::on_bad_nodes: quarantine those whose own check failed or whose peers agree (--quarantine-hours;
# never what somebody else could have caused: a missing report, a port or a scratch dir another user
# holds; docs/bad-nodes.md) and, with --on-bad-node requeue, keep this attempt's evidence (collect
# has judged it into its own summary, unless collect is off) and requeue the job without them all.
job::on_bad_nodes() {
  local i entry node nodes=()
  if [[ -n ${SM_STATE_DIR:-} ]] && ((SM_QUARANTINE_HOURS > 0)); then
    for i in "${!JOB_BAD_NODES[@]}"; do
      entry=${JOB_BAD_NODES[i]} node=${JOB_BAD_NODES[i]%%$'\t'*}
      if [[ ${JOB_BAD_EVIDENCE[i]:-none} == none ]]; then
        log::warn multi "${node} is not quarantined: what failed there is no proof against the node (somebody else could have caused it)"
        continue
      fi
      nodes+=("${node}")
      util::sm quarantine add --quiet --state-dir "${SM_STATE_DIR}" --job "${SLURM_JOB_ID}" \
        --hours "${SM_QUARANTINE_HOURS}" --reason "${entry#*$'\t'}" -- "${node}" ||
        log::warn multi "could not quarantine ${node} in ${SM_STATE_DIR} (see the line above)"
    done
    ((${#nodes[@]} == 0)) ||
      log::info multi "quarantined for ${SM_QUARANTINE_HOURS} h in ${SM_STATE_DIR}: ${nodes[*]} (bin/slurm-multi quarantine list)"
  fi
  [[ ${SM_ON_BAD_NODE} == requeue ]] || return 0
  job::requeue_without "${JOB_BAD_CAUSE}" || log::error multi "the job is not requeued: it fails with this attempt's verdict"
}

# job::requeue_without CAUSE: requeue this job without the nodes of JOB_BAD_NODES, through Slurm
# (the job's excluded nodes grow by them; `scontrol requeuehold`, then `release`: a running job's
# ExcNodeList cannot be changed). This attempt's files move to <jobdir>/attempt_<N>/ with a
# requeue.json saying why. Exits the batch step on success; false when no requeue is left or Slurm
# refused (the caller fails the job).
job::requeue_without() {
  local cause=$1 attempt=${SLURM_RESTART_COUNT:-0} excluded entry nodes=()
  for entry in "${JOB_BAD_NODES[@]}"; do nodes+=("${entry%%$'\t'*}"); done
  if ((attempt >= SM_MAX_REQUEUES)); then
    log::error multi "not requeued: this is attempt $((attempt + 1)) and --max-requeues ${SM_MAX_REQUEUES} are used"
    return 1
  fi
  excluded=$(scontrol show job -o "${SLURM_JOB_ID}" 2>/dev/null | grep -o 'ExcNodeList=[^ ]*' | cut -d= -f2)
  [[ ${excluded} != "(null)" ]] || excluded=
  excluded=$({ [[ -z ${excluded} ]] || slurm::hostnames "${excluded}"; printf '%s\n' "${nodes[@]}"; } | sort -u | paste -sd, -)
  log::info multi "requeueing job ${SLURM_JOB_ID} without ${nodes[*]} (excluded now: ${excluded}); attempt $((attempt + 2)) runs on other nodes"
  # The requeue signals this batch step: the calls below must still run.
  trap '' TERM INT
  local rc=0
  scontrol update "JobId=${SLURM_JOB_ID}" Requeue=1 && scontrol requeuehold "${SLURM_JOB_ID}" || rc=$?
  if ((rc == 0)); then
    # Held now, not running again before it is released: this attempt's files move aside (only
    # when Slurm took the requeue: a refused one leaves the job's own summary where it was).
    job::keep_attempt "${attempt}" "${cause}" "${excluded}"
    scontrol update "JobId=${SLURM_JOB_ID}" "ExcNodeList=${excluded}" || rc=$?
    # Released whatever the update did: a job left held would never run.
    scontrol release "${SLURM_JOB_ID}" || rc=$?
  fi
  if ((rc != 0)); then
    log::error multi "Slurm refused the requeue of job ${SLURM_JOB_ID} (exit ${rc}; see the lines above)"
    return 1
  fi
  trap - EXIT
  util::remove_private_dir
  exit 0
}

# job::keep_attempt N CAUSE EXCLUDED: <jobdir>/attempt_<N>/ gets this attempt's node dirs, job.json,
# summary and batch log (the logger goes on writing there: a rename keeps the open file), and
# requeue.json: when (seconds from the batch step's start), why, the nodes excluded and each one's reason.
job::keep_attempt() {
  local dir=${SM_JOBDIR}/attempt_$1 entry f
  mkdir -p "${dir}"
  local reasons=()
  for entry in "${JOB_BAD_NODES[@]}"; do reasons+=("${entry}"); done
  util::sm job record-attempt -- "${dir}/requeue.json" "$1" "$2" "${SECONDS}" "$3" "${reasons[@]}" ||
    log::warn multi "could not write ${dir}/requeue.json"
  # The profilers' outputs in the job dir go with the attempt too (a --profile-dir elsewhere keeps
  # every attempt's reports side by side: their names carry the attempt, lib/profile.sh).
  for f in "${SM_JOBDIR}"/node_* "${SM_JOBDIR}"/{job.json,summary.json,report.html,perf.csv,timeline.json,timeline.txt,batch.log,batch,profile-flush.json,profile,hang-cause.json,.pre-cleanup.done} \
    "${SM_JOBDIR}"/{nsight-slurm-direct,nsight-slurm-reports,nsight-slurm-runtime,nsight-slurm.out,.nsight-slurm}; do
    [[ -e ${f} ]] && mv -f "${f}" "${dir}/"
  done
  return 0
}

# ---- dry run -------------------------------------------------------------------------------------

# job::dry_run NODES: the full plan, without Slurm or docker, through the same helpers a job uses
# (so a manifest the job would refuse is refused here, exit 2). Secrets are masked by the one rule.
job::dry_run() {
  local nnodes=$1 scratch rc=0
  # The plan's output goes through the helpers' log filter: an unusable interpreter is one line here.
  util::helper --version >/dev/null 2>&1 || log::die multi "${UTIL_ERROR}" 2
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/sm-dry-run.XXXXXX") || log::die multi "cannot create a temp dir" 1
  : >"${scratch}/secrets"
  # shellcheck disable=SC2030,SC2031 # the plan runs in a subshell on purpose
  (
    export SLURM_JOB_ID=${SLURM_JOB_ID:-DRYRUN} SLURM_JOB_NUM_NODES=${nnodes}
    job::export_attempt
    JOB_NODES=()
    for ((r = 0; r < nnodes; r++)); do JOB_NODES+=("node_${r}"); done
    # Prepare (without GPU detection) for rank 0 first: its secrets file masks what follows.
    job::dry_run_prepare "${scratch}" 0 "${nnodes}"
    job::dry_run_plan "${nnodes}" "${scratch}"
  ) | util::redact --secrets-file "${scratch}/secrets" || rc=$?
  rm -rf "${scratch}"
  return "${rc}"
}

# job::dry_run_prepare SCRATCH RANK NNODES [TASKS_PER_NODE]: what `node prepare` resolves for that
# rank (no GPUs), with the identity sm-node gives it (launch::task_identity when each task is a rank).
job::dry_run_prepare() {
  local dir=$1/r$2 r=$2 nnodes=$3 per=${4:-1}
  local node=$((r / per)) local_rank=$((r % per))
  mkdir -p "${dir}"
  export SM_RANK=${r} NODE_RANK=${node} RANK=${r} NNODES=${nnodes} WORLD_SIZE=$((nnodes * per)) LOCAL_RANK=${local_rank}
  export SLURM_NODEID=${node} SLURM_PROCID=${r} SLURMD_NODENAME="<node ${node}>" MASTER_ADDR="<node 0>"
  export MASTER_PORT=${SM_MASTER_PORT} SM_SCRATCH="${TMPDIR:-/tmp}/slurm-multi.${SLURM_JOB_ID}.r${r}" SM_OUTPUT_DIR=/sm-out
  export SLURM_NNODES=${nnodes} SLURM_JOB_NODELIST="<job nodes>" SLURM_STEP_ID="<step>"
  if ((per > 1)); then
    export SM_NTASKS=$((nnodes * per)) SM_NODE_RANK=${node} SLURM_LOCALID=${local_rank}
  fi
  local argv=(node prepare --scratch "${dir}" --no-detect --node-scratch "${SM_SCRATCH}")
  ((${#SM_CMD[@]})) && argv+=(-- "${SM_CMD[@]}")
  util::helper "${argv[@]}" 2>/dev/null || log::die multi "${UTIL_ERROR}" 2
  cat "${dir}/secrets" >>"$1/secrets"
  util::source "${dir}/context.sh"
}

job::dry_run_plan() {
  local nnodes=$1 scratch=$2 r
  # shellcheck disable=SC2153 # JOB_MODEL comes from the job plan (job::plan)
  printf '== slurm-multi plan: %s nodes (%s), model %s ==\n\n' "${nnodes}" "${PLAN_NNODES_FROM:-"-N"}" "${JOB_MODEL}"
  local per_node
  per_node=$(launch::tasks_per_node)
  if ((per_node > 1)); then
    # Each task is a rank: what sbatch must be given for this plan to be the job.
    printf 'Ranks: %s nodes x %s tasks = %s ranks; submit with: sbatch -N %s --ntasks-per-node=%s sbatch/multi.sbatch ...\n\n' \
      "${nnodes}" "${per_node}" "$((nnodes * per_node))" "${nnodes}" "${per_node}"
  fi
  # shellcheck disable=SC2153 # PLAN_SETTINGS_SHOWN comes from the job plan
  printf 'Settings (set, or not the default; --help lists every one)\n'
  ((${#PLAN_SETTINGS_SHOWN[@]})) && printf '  %s\n' "${PLAN_SETTINGS_SHOWN[@]}"
  [[ -n ${SM_BARRIER_TOKEN:+given} ]] || printf '  %-26s %s\n' SM_BARRIER_TOKEN '(generated per job)'
  printf '  %-26s %s\n\n' "job dir" "${SM_JOBDIR}"
  job::srun_argv
  printf 'Batch step (on the first node)\n  %s\n\n' "$(log::quote "${JOB_SRUN_ARGV[@]}")"
  job::dry_run_runtime
  job::dry_run_fitness
  if declare -F profile::dry_run_panel >/dev/null; then
    profile::dry_run_panel
    profile::export_worker_env
    profile::apply_stop_grace 2>/dev/null # the panel said it; the nodes below apply it silently
  fi
  # Every rank but 0 and the last looks like rank 1: show three, however large the job. Where
  # each task is a rank, the blocks are ranks (each with its node), else nodes.
  local what=node total=$((nnodes * per_node))
  ((per_node == 1)) || what=rank
  for ((r = 0; r < total; r++)); do
    if ((r >= 2 && r < total - 1)); then
      ((r == 2)) && printf '%ss 2..%s: like %s 1, with their own rank\n\n' "${what^}" "$((total - 2))" "${what}"
      continue
    fi
    job::dry_run_node "${scratch}" "${r}" "${nnodes}" "${per_node}"
  done
}

# job::dry_run_runtime: what watches and stops the ranks under this runtime (each runtime differs).
job::dry_run_runtime() {
  local hang stop kw
  kw=$(slurm::killwait || true)
  if ((SM_HANG_TIMEOUT == 0)); then
    hang="off (--hang-timeout 0)"
  elif [[ ${SM_RUNTIME} == pyxis ]]; then
    hang="a rank whose step printed no new output line and whose tasks on its node (under the step's slurmstepd) used no CPU for ${SM_HANG_TIMEOUT} s after GO fails the job, naming it (--hang-timeout)"
  else
    hang="a rank with no new output line and no CPU for ${SM_HANG_TIMEOUT} s after GO fails the job, naming it (--hang-timeout)"
  fi
  case ${SM_RUNTIME} in
    docker) stop="docker stop -t $(profile::stop_grace) per node (SIGTERM, then SIGKILL after the grace)" ;;
    pyxis) stop="SIGTERM to each rank's step; Slurm SIGKILLs it after its KillWait ($([[ -n ${kw} ]] && echo "${kw} s" || echo "unknown here"))" ;;
    none) stop="SIGTERM to the workload's process tree, SIGKILL after --stop-grace ${SM_STOP_GRACE} s" ;;
  esac
  printf 'Runtime %s\n' "${SM_RUNTIME}"
  printf '  %-16s %s\n' "hang watch" "${hang}" "stop" "${stop}" "peer grace" "${SM_PEER_GRACE} s after one rank fails in its run, the others are stopped (at once when it fails before)"
  if [[ ${SM_RUNTIME} == docker ]]; then
    local transport
    case ${SM_IMAGE_TRANSPORT} in
      relay) transport="relay: rank 0 streams its image node to node while it saves it (--image-transport relay)" ;;
      cache) transport="cache: rank 0 saves a tar in --image-cache, the workers load it; a worker that does not see rank 0's tar there fails the job (--image-transport cache)" ;;
      auto)
        local via_cache=
        [[ -z ${SM_IMAGE_CACHE:-} ]] || via_cache="the tar in ${SM_IMAGE_CACHE} when it holds rank 0's image as every node sees it, else "
        transport="auto: nothing moves to a worker that already holds rank 0's image; else ${via_cache}the relay"
        ;;
    esac
    printf '  %-16s %s\n' "image transport" "${transport}"
  fi
  local which="the barrier's, the relay's and the fitness check's"
  [[ ${SM_RUNTIME} != none ]] || which="the fitness check's"
  printf '  %-16s %s\n' "ports" "${which} derive from MASTER_PORT ${SM_MASTER_PORT} and the job ID (the window below the ephemeral range); open them between the nodes"
  printf '\n'
}

# job::dry_run_fitness: the fitness stage's plan and the quarantine as it stands.
job::dry_run_fitness() {
  printf 'Fitness (every node, after prepare, before any image moves)\n'
  if [[ ${SM_FITNESS} == off ]]; then
    printf '  %-16s %s\n\n' checks "off (--fitness off)"
    return 0
  fi
  local on_bad="fail the job naming it (--on-bad-node fail)"
  [[ ${SM_ON_BAD_NODE} != requeue ]] || on_bad="requeue the job without it, at most ${SM_MAX_REQUEUES} time(s) (--on-bad-node requeue)"
  local runtime="the ${SM_RUNTIME} runtime answers; " floor=""
  [[ ${SM_RUNTIME} != none ]] || runtime=""
  ((SM_FITNESS_MIN_RATE == 0)) || floor=" (a link below --fitness-min-rate ${SM_FITNESS_MIN_RATE} MB/s is slow)"
  printf '  %-16s %s\n' checks "${runtime}free disk for the image and the outputs; no other job's process on a GPU; every node reaches its partners (ring neighbours and 4 more drawn from the job ID; every other node up to 7 nodes) on the job's fitness ports (4 candidates derived from MASTER_PORT and the job ID: one another process holds is skipped, never held against the node); a ring bandwidth probe${floor}; the clocks (docs/bad-nodes.md)" \
    bound "--fitness-timeout ${SM_FITNESS_TIMEOUT} s" "a bad node" "${on_bad}"
  if [[ -z ${SM_STATE_DIR:-} ]] || ((SM_QUARANTINE_HOURS == 0)); then
    printf '  %-16s %s\n\n' quarantine "off"
    return 0
  fi
  local listing
  if ! listing=$(util::sm quarantine list --state-dir "${SM_STATE_DIR}" 2>&1 >/dev/null); then
    listing="unreadable: ${listing#slurm-multi: }"
  else
    listing=$(util::sm quarantine list --state-dir "${SM_STATE_DIR}" 2>/dev/null)
    [[ -n ${listing} ]] || listing="no node is quarantined"
  fi
  printf '  %-16s %s, %s h per bad node whose own check failed or whose peers agree (never what somebody else could have caused)\n' quarantine "${SM_STATE_DIR}" "${SM_QUARANTINE_HOURS}"
  printf '%s\n' "${listing}" | sed 's/^/    /'
  printf '\n'
}

# job::dry_run_node SCRATCH RANK NNODES TASKS_PER_NODE: what sm-node would run for that rank.
job::dry_run_node() {
  local r=$2 nnodes=$3 per=$4
  (
    # shellcheck source=/dev/null
    for lib in image run node; do source "${SM_HOME}/lib/${lib}.sh"; done
    job::dry_run_prepare "$1" "${r}" "${nnodes}" "${per}"
    local role="worker"
    ((r == 0)) && role="rank 0 (serves the barrier)"
    [[ ${SM_RUNTIME} != none ]] || role="rank ${r} (bare metal: no image, no barrier)"
    ((nnodes == 1)) && role="single node (no cache, no barrier)"
    if ((per > 1)); then
      case ${role} in "rank 0 (serves the barrier)") role="serves the barrier" ;; "rank ${r} ("*) role=${role#"rank ${r} ("} role=${role%)} ;; esac
      printf 'Rank %s (node %s, local rank %s): %s\n' "${r}" "${NODE_RANK}" "${LOCAL_RANK}" "${role}"
    else
      printf 'Node %s: %s\n' "${r}" "${role}"
    fi
    [[ ${SM_RUNTIME} == none ]] || printf '  image: %s%s\n' "${SM_IMAGE:-}" "${SM_IMAGE_CACHE:+ (shared tar cache ${SM_IMAGE_CACHE})}"
    # What the node's run stage adds (profiling), through the same function: the argv is the job's.
    if declare -F profile::run_args >/dev/null; then profile::run_args || return 2; fi
    case ${SM_RUNTIME} in
      docker)
        run::docker_argv
        printf '  docker (GPU arguments are added on the node from what it detects)\n'
        printf '  %s\n' "$(log::quote "${RUN_ARGV[@]}")"
        printf '  mounts and options (after de-duplication): %s\n' "$(log::quote "${RUN_DOCKER_OPTS[@]+"${RUN_DOCKER_OPTS[@]}"}")"
        ;;
      none) printf '  bare metal: %s\n' "$(log::quote "${SM_PROFILE_PREFIX[@]+"${SM_PROFILE_PREFIX[@]}"}" "${RUN_WORKLOAD[@]+"${RUN_WORKLOAD[@]}"}")" ;;
      pyxis)
        IMAGE_SQSH=$(image::sqsh_path)
        printf '  squashfs: %s (%s)\n' "${IMAGE_SQSH}" "$(image::sqsh_state "${IMAGE_SQSH}")"
        run::pyxis_argv
        printf '  pyxis: sm-node on the node starts the rank as a step of its own:\n'
        printf '  %s\n' "$(log::quote "${RUN_ARGV[@]}")"
        ;;
    esac
    if [[ -f $1/r${r}/container.env ]]; then
      if [[ ${SM_RUNTIME} == docker ]]; then
        printf '  container env (--env-file: the manifest docker_env_vars and madengine variables):\n'
      else
        printf '  workload env (in its environment: the manifest docker_env_vars and madengine variables):\n'
      fi
      sed 's/^/    /' "$1/r${r}/container.env"
    fi
    printf '\n'
  )
}
