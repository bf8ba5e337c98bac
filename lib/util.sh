# shellcheck shell=bash
# Small helpers shared by the entrypoints: the helper CLI, time, node list. (JSON is Python's job:
# bash passes paths and exit codes, and never writes or parses JSON itself.) Slurm look-ups are
# lib/slurm.sh's, loaded here.

# shellcheck source=lib/slurm.sh
source "${BASH_SOURCE[0]%/*}/slurm.sh"

# util::py ARGS…: the helpers' interpreter (SM_PYTHON) with py/ on PYTHONPATH: no install needed on
# a node. Every helper starts through here (UTIL_PY_NICE set: at that niceness, util::sm_aside).
util::py() {
  local python=("${SM_PYTHON}")
  [[ -z ${UTIL_PY_NICE:-} ]] || python=(nice -n "${UTIL_PY_NICE}" "${SM_PYTHON}")
  PYTHONPATH="${SM_HOME}/py${PYTHONPATH:+:${PYTHONPATH}}" "${python[@]}" "$@"
}

# util::sm ARGS…: the slurm-multi helper CLI. It runs exactly what `bin/slurm-multi ARGS…` runs,
# which is what the logs show (util::sm_logged).
util::sm() { util::py -m slurm_multi "$@"; }

# util::sm_aside ARGS…: util::sm for a helper that watches or waits beside the job's path (the
# batch step's watch and warm helper, a rank's hang watch): at a lower CPU priority (nice 10), so
# that its start and its polls yield to what the job waits on (the ranks' prepare, fitness and
# barrier, the container's start: on the batch host that is also rank 0's node). With a core to
# spare it runs as soon; never for a filter on a data path (the log filter), which must keep up.
UTIL_ASIDE_NICE=10
util::sm_aside() { UTIL_PY_NICE=${UTIL_ASIDE_NICE} util::sm "$@"; }

# util::redact [--secrets-file FILE]: the log filter (the one secret rule), stdin to stdout. It runs
# for the whole job on every node (slurm_multi.redact).
util::redact() { util::sm redact "$@"; }

# util::log_to FILE [REDACT ARGS…]: from here on, everything this shell and its children print goes
# through the log filter (secrets masked) into FILE and on to the shell's own stdout. The filter
# ignores TERM, INT and HUP: scancel signals every process of the step, and a dead filter would
# take the shell down (SIGPIPE) before it stages its outputs and says so. util::log_drain ends it.
util::log_to() {
  local file=$1
  shift
  exec {UTIL_LOG_FD}> >(trap '' TERM INT HUP; util::redact "$@" | tee -a "${file}")
  UTIL_LOG_PID=$!
  util::log_resume
}

# util::log_resume: stdout and stderr to the log filter again. A signal's handler runs inside the
# command it interrupted, with that command's redirections (`util::sm … >/dev/null 2>&1`): without
# this, everything the handler and the exit path said went to /dev/null.
util::log_resume() {
  [[ -z ${UTIL_LOG_FD:-} ]] || exec >&"${UTIL_LOG_FD}" 2>&1
}

# util::log_drain: the shell's last words reach the log before it ends. Slurm SIGKILLs what is left
# of a step once its tasks (or the batch script) have exited, and a filter still behind (two cores,
# a dozen processes ending at once) lost a task's last lines: its termination, its save-outputs,
# its `done`. Its pipe is closed here and the filter given up to 5 s to write the rest (a stray
# process of the workload may hold the pipe open: then the end does not wait for it).
util::log_drain() {
  [[ -n ${UTIL_LOG_PID:-} ]] || return 0
  local path fd
  exec >/dev/null 2>&1
  # Every other copy this shell holds goes too (UTIL_LOG_FD, and the stdout bash saved to restore
  # after a redirected command that a signal's handler interrupted): the filter sees its end only
  # when the last copy closes. Nothing after this uses a descriptor (255: bash's own script).
  for path in /proc/"${BASHPID}"/fd/*; do
    fd=${path##*/}
    if ((fd > 2 && fd < 255)) && [[ ${fd} != "${BASH_XTRACEFD:-}" ]]; then exec {fd}>&-; fi
  done
  util::wait_gone "${UTIL_LOG_PID}" 5 -
  UTIL_LOG_PID=
  UTIL_LOG_FD=
}

# util::sm_logged AREA ARGS…: log the helper call as a command that pastes back on the node
# (bin/slurm-multi ARGS…), then run it through util::helper.
util::sm_logged() {
  local area=$1
  shift
  log::cmd "${area}" "${SM_HOME}/bin/slurm-multi" "$@"
  util::helper "$@"
}

# util::helper ARGS…: `slurm-multi ARGS…`, its exit status returned as is. On failure UTIL_ERROR
# holds the helper's own one-line reason (it writes it to SM_ERROR_FILE), so the stage's reason in
# status.json and node.log is the helper's, not "something failed". Call it directly, never in a
# command substitution (the reason would stay in the subshell); redirect its stdout to a file.
util::helper() { util::_helper util::sm "$@"; }

# util::warm_logged AREA WORD WORD ARGS…: log `slurm-multi WORD WORD ARGS…` (it pastes back), then
# run it through the helper util::warm_start started for it, if any (cold when none was).
util::warm_logged() {
  local area=$1
  shift
  log::cmd "${area}" "${SM_HOME}/bin/slurm-multi" "$@"
  util::warm_run "$@"
}

util::_helper() {
  util::private_dir || { UTIL_ERROR="cannot create a private temp dir in ${TMPDIR:-/tmp}" UTIL_ERROR_SHOWN=0; return 1; }
  util::_helper_with "${UTIL_PRIVATE}/.sm-error.$$.${BASHPID}.${RANDOM}" "$@"
}

# util::private_dir: UTIL_PRIVATE, where a helper's one-line reason goes (its name is predictable:
# in a shared /tmp another user could plant a file or a link there first; the helper creates it
# O_EXCL|O_NOFOLLOW as well). A node task's scratch dir (0700, checked to be ours: node::own_scratch),
# else one of this shell's own (mktemp -d: 0700, a random name), made once and removed by
# util::remove_private_dir on the way out (the batch step makes it before its first helper).
util::private_dir() {
  if [[ -n ${SM_SCRATCH:-} && -d ${SM_SCRATCH} && ! -L ${SM_SCRATCH} && -O ${SM_SCRATCH} ]]; then
    UTIL_PRIVATE=${SM_SCRATCH}
    return 0
  fi
  if [[ -z ${UTIL_PRIVATE_OWN:-} || ! -d ${UTIL_PRIVATE_OWN} ]]; then
    UTIL_PRIVATE_OWN=$(mktemp -d "${TMPDIR:-/tmp}/sm-private.XXXXXX") || return 1
  fi
  UTIL_PRIVATE=${UTIL_PRIVATE_OWN}
}

# util::remove_private_dir: the dir util::private_dir made for this shell, if any.
util::remove_private_dir() {
  [[ -z ${UTIL_PRIVATE_OWN:-} ]] || rm -rf "${UTIL_PRIVATE_OWN}"
  UTIL_PRIVATE_OWN=
}

# util::_helper_with ERRFILE RUN ARGS…: util::_helper with the helper's error file named (a warm
# helper was given its file when it started).
util::_helper_with() {
  local errfile=$1 run=$2 rc=0
  shift 2
  UTIL_ERROR='' UTIL_ERROR_SHOWN=0
  SM_ERROR_FILE=${errfile} "${run}" "$@" || rc=$?
  if ((rc == 126 || rc == 127)) && [[ ! -s ${errfile} ]]; then
    UTIL_ERROR="helper interpreter ${SM_PYTHON} cannot be executed by $(id -un) on $(hostname); set SM_PYTHON to a usable Python 3.9+ with click (e.g. a venv on shared storage: python3 -m venv \$SM_HOME/.venv && \$SM_HOME/.venv/bin/pip install -e \$SM_HOME)"
  elif ((rc != 0)); then
    # A reason in the file is one the helper has also printed on stderr (UTIL_ERROR_SHOWN, which
    # callers such as job::plan read).
    # shellcheck disable=SC2034
    [[ -s ${errfile} ]] && UTIL_ERROR=$(<"${errfile}") && UTIL_ERROR_SHOWN=1
    UTIL_ERROR=${UTIL_ERROR#slurm-multi: }
    [[ -n ${UTIL_ERROR} ]] || UTIL_ERROR="slurm-multi $1${2:+ $2} failed (exit ${rc}; see the log above)"
  fi
  util::remove "${errfile}"
  return "${rc}"
}

# util::remove FILE...: `rm -f` of those that are there; no process when none is (a helper's error
# file, a stage's markers: on every node's path, and almost never there).
util::remove() {
  local _file _there=()
  for _file; do [[ ! -e ${_file} && ! -L ${_file} ]] || _there+=("${_file}"); done
  ((${#_there[@]} == 0)) || rm -f -- "${_there[@]}"
}

# util::warm_start WORD WORD [--wake-later]: start `slurm-multi WORD WORD` now, on a pipe
# (`slurm-multi warm`, py/slurm_multi/warm.py: only a command whose imports cost a job 0.1 s or
# more), so that its interpreter and imports are paid while the job runs; util::warm_run gives it
# its arguments when its moment comes. It imports at once, or with --wake-later when an empty line
# comes on its pipe (UTIL_WARM_FD["WORD WORD"], which children inherit: the batch step's watch
# writes it once every rank's workload has printed). Like the log filter it ignores TERM, INT and
# HUP: a scancel must not take away a helper that the exit path needs. Unused, it ends when this
# shell does (its pipe closes).
declare -gA UTIL_WARM_FD=() UTIL_WARM_PID=() UTIL_WARM_ERR=()
util::warm_start() {
  local key="$1 $2" fd errfile
  [[ -z ${UTIL_WARM_PID[${key}]:-} ]] || return 0
  util::private_dir || return 0 # (a cold start later says why)
  errfile=${UTIL_PRIVATE}/.sm-error.$$.${BASHPID}.${RANDOM}
  exec {fd}> >(trap '' TERM INT HUP; SM_ERROR_FILE=${errfile} PYTHONPATH="${SM_HOME}/py${PYTHONPATH:+:${PYTHONPATH}}" \
    exec nice -n "${UTIL_ASIDE_NICE}" "${SM_PYTHON}" -m slurm_multi warm "$1" "$2")
  UTIL_WARM_PID[${key}]=$! UTIL_WARM_FD[${key}]=${fd} UTIL_WARM_ERR[${key}]=${errfile}
  [[ ${3:-} == --wake-later ]] || (printf '\n' 1>&"${fd}") 2>/dev/null || true
}

# util::warm_run WORD WORD ARGS…: util::helper WORD WORD ARGS… through the helper util::warm_start
# started (the same command, the same exit status and one-line reason in UTIL_ERROR); cold, as
# util::helper, when none was started or it is gone. Used once: a second call starts it cold.
util::warm_run() {
  local key="$1 $2"
  [[ -n ${UTIL_WARM_PID[${key}]:-} ]] || { util::helper "$@"; return $?; }
  util::_helper_with "${UTIL_WARM_ERR[${key}]}" util::_warm_feed "$@"
}

# util::_warm_feed WORD WORD ARGS…: the argv to the warm helper (a word count, then each word
# NUL-terminated), then its exit status. A helper that cannot take it (it died: the write fails in
# a subshell, never a SIGPIPE to this shell) is replaced by a cold start.
util::_warm_feed() {
  local key="$1 $2" rc=0 fed=1
  local pid=${UTIL_WARM_PID[${key}]} fd=${UTIL_WARM_FD[${key}]}
  unset "UTIL_WARM_PID[${key}]" "UTIL_WARM_FD[${key}]"
  (printf '%d\n' "$(($# - 2))" && { (($# == 2)) || printf '%s\0' "${@:3}"; }) 1>&"${fd}" 2>/dev/null || fed=0
  exec {fd}>&-
  wait "${pid}" || rc=$?
  if ((fed)); then return "${rc}"; fi
  util::sm "$@"
}

# util::python_executable: SM_PYTHON can be executed (asked of the file system, no process); else one
# line naming it and the fix.
util::python_executable() {
  if [[ ! -x ${SM_PYTHON} ]] && ! command -v "${SM_PYTHON}" >/dev/null 2>&1; then
    log::error python "helper interpreter ${SM_PYTHON} cannot be executed by $(id -un) on $(hostname); set SM_PYTHON to a usable Python 3.9+ with click (e.g. a venv on shared storage: python3 -m venv \$SM_HOME/.venv && \$SM_HOME/.venv/bin/pip install -e \$SM_HOME)"
    return 2
  fi
}

# util::check_python: the helper interpreter runs and has click; else one line naming it and the fix.
# (The batch step asks the plan first, which answers from its own process: lib/job.sh job::plan.)
util::check_python() {
  local out rc=0
  util::python_executable || return 2
  # Found, not imported (~20 ms, not the ~50 ms of importing click).
  out=$(util::py -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("click") else "no click")' 2>&1) || rc=$?
  if ((rc != 0)); then
    [[ ${out} == *click* ]] && out="it has no 'click' module" || out="it fails to start (exit ${rc}: ${out##*$'\n'})"
    log::error python "helper interpreter ${SM_PYTHON} on $(hostname): ${out}; set SM_PYTHON to a Python 3.9+ with click (e.g. the venv on shared storage: python3 -m venv \$SM_HOME/.venv && \$SM_HOME/.venv/bin/pip install -e \$SM_HOME)"
    return 2
  fi
}

# util::kill_children SIGNAL PID: signal PID's children, as `pkill -SIGNAL -P PID` does, read from the
# kernel's per-thread children lists instead of a scan of every process (pkill: ~15 ms, twice on
# each node between the workload's exit and its status). pkill where the kernel keeps no such list.
# UTIL_KILLED: how many it signalled (1 for pkill's any).
util::kill_children() {
  local sig=$1 pid=$2 file words kids=()
  UTIL_KILLED=0
  [[ -d /proc/${pid}/task ]] || return 0
  for file in /proc/"${pid}"/task/*/children; do
    if [[ ! -r ${file} ]]; then
      ! pkill "-${sig}" -P "${pid}" 2>/dev/null || UTIL_KILLED=1
      return 0
    fi
    words=()
    read -r -a words <"${file}" || true # one line, no line end
    kids+=("${words[@]}")
  done
  UTIL_KILLED=${#kids[@]}
  ((${#kids[@]} == 0)) || kill "-${sig}" "${kids[@]}" 2>/dev/null || true
}

# util::wait_gone PID [GRACE [SIGNAL]]: until PID has ended, asked of the kernel (kill -0, every
# 50 ms), never with `wait`. A signal handler that interrupted a `wait` for PID must not `wait` for
# it again: bash 5.2 may have reaped it without marking its job done, and that second `wait` then
# blocks on the shell's other children (the log filter, which outlives it) until Slurm's SIGKILL,
# and the task stages nothing. After GRACE seconds, a PID still there gets SIGNAL (KILL; `-`: none,
# and the wait ends there).
util::wait_gone() {
  local pid=$1 grace=${2:-} sig=${3:-KILL} until=
  # shellcheck disable=SC2034 # util::nap reads and moves it, by name
  local nap=
  [[ -z ${grace} ]] || until=$((${EPOCHREALTIME//[!0-9]/} + grace * 1000000))
  while kill -0 "${pid}" 2>/dev/null; do
    if [[ -n ${until} ]] && ((${EPOCHREALTIME//[!0-9]/} >= until)); then
      [[ ${sig} != - ]] || return 0
      kill "-${sig}" "${pid}" 2>/dev/null || true
      until=
    fi
    # Most are gone within milliseconds (the log filter's last flush): short naps first.
    util::nap nap 0.001 0.004 0.016 0.05
  done
}

# util::nap VAR STEP…: the short-naps-first ladder of a poll. Sleeps VAR's seconds (the first STEP
# while VAR is empty), then moves VAR to the STEP after the one it slept; the last STEP repeats.
# VAR is the caller's local, empty before its loop: `local nap=; while …; do util::nap nap 0.01 0.1; done`.
util::nap() {
  local -n util_nap_var=$1
  shift
  local step next=0
  util_nap_var=${util_nap_var:-$1}
  sleep "${util_nap_var}"
  for step; do
    ((next == 0)) || { util_nap_var=${step}; return 0; }
    [[ ${step} != "${util_nap_var}" ]] || next=1
  done
}

# util::stop_child PID [GRACE]: a background helper ends: SIGTERM to the process PID runs (a
# subshell's child, which the subshell then outlives only to exit) or to PID itself when it has no
# child (it is the helper); SIGKILL to PID after GRACE seconds (5); see util::wait_gone.
util::stop_child() {
  util::kill_children TERM "$1"
  ((UTIL_KILLED)) || kill -TERM "$1" 2>/dev/null || true
  util::wait_gone "$1" "${2:-5}"
}

# util::split0 ARRAY CMD…: run CMD (a function or a command) and split its NUL-separated output into
# ARRAY, only when CMD succeeded; its exit status is returned. (`mapfile < <(CMD)` would check
# mapfile and lose CMD's failure: STYLE.md, the seam.)
util::split0() {
  local -n util_split0_into=$1
  shift
  local util_split0_tmp util_split0_rc=0
  util_split0_tmp=$(mktemp "${TMPDIR:-/tmp}/sm-split.XXXXXX") || return 1
  "$@" >"${util_split0_tmp}" || util_split0_rc=$?
  # shellcheck disable=SC2034 # a nameref: mapfile fills the caller's array through it
  ((util_split0_rc != 0)) || mapfile -d '' util_split0_into <"${util_split0_tmp}"
  rm -f "${util_split0_tmp}"
  return "${util_split0_rc}"
}

# util::find_python [VAR]: SM_PYTHON if set, else the venv beside the checkout if it exists, else
# python3; printed, or into VAR (no subshell where SM_PYTHON or the venv answers: every node's start).
util::find_python() {
  local _python
  if [[ -n ${SM_PYTHON:-} ]]; then
    _python=${SM_PYTHON}
  elif [[ -x ${SM_HOME}/.venv/bin/python ]]; then
    _python=${SM_HOME}/.venv/bin/python
  else
    _python=$(command -v python3) || _python=
  fi
  util::reply "${1:-}" "${_python}"
}

# util::now [VAR]: microseconds since the epoch (EPOCHREALTIME, whatever the locale's decimal
# point), printed, or into VAR (no subshell: every stage of every node takes one).
util::now() { util::reply "${1:-}" "${EPOCHREALTIME/[.,]/}"; }

# util::reply VAR VALUE: VALUE into the caller's VAR, or printed when VAR is "": how a helper that
# prints also sets a variable without the subshell of a command substitution.
util::reply() { if [[ -n $1 ]]; then printf -v "$1" '%s' "$2"; else printf '%s' "$2"; fi; }

# util::elapsed START [VAR]: seconds since START (from util::now), two decimals, printed or into VAR.
# A wall clock stepped back since START counts 0 (it printed "-1.-20", which status.json refuses).
util::elapsed() {
  local _us=$((${EPOCHREALTIME/[.,]/} - $1)) _seconds
  ((_us >= 0)) || _us=0
  printf -v _seconds '%d.%02d' "$((_us / 1000000))" "$((_us % 1000000 / 10000))"
  util::reply "${2:-}" "${_seconds}"
}

# util::first_node [VAR]: rank 0's host = the first line of the expanded node list, printed, or into
# VAR (every node's prepare asks: no process when the batch step expanded the job's list).
# shellcheck disable=SC2120 # VAR is lib/node.sh's
util::first_node() {
  local list=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}} _first=''
  if [[ -z ${list} ]]; then
    _first=$(hostname)
  elif slurm::expanded "${list}"; then
    read -r _first _ <<<"${SM_JOB_HOSTS}"
  elif command -v scontrol >/dev/null; then
    _first=$(slurm::hostnames "${list}" | head -n 1) || _first=''
  else
    _first=${list%%[,\[]*}
  fi
  util::reply "${1:-}" "${_first}"
}

# util::source FILE: source bash our helpers wrote (`declare -g` and `export` lines: the plan, the
# settings, a node's context, the workload's env) with xtrace off. SM_DEBUG=1 traces every line we
# run, and a sourced `declare -gx SM_BARRIER_TOKEN=…` or a manifest's secret would be in the trace,
# which no log filter masks. Its status is the source's.
util::source() {
  local -
  set +x
  # shellcheck source=/dev/null
  source "$1"
}

# util::generate_token [VAR]: a per-job secret for the barrier (192 random bits as 48 hex characters),
# printed or into VAR. bash's SRANDOM (5.1 and later) is the system's random source (getrandom):
# no od and tr on the batch step's path; an older bash reads /dev/urandom with them.
util::generate_token() {
  # Never traced (SM_DEBUG=1): a trace would show the token's pieces, which no log filter masks.
  local - _token='' _word
  set +x
  if [[ -n ${SRANDOM:-} ]]; then
    for _word in 1 2 3 4 5 6; do printf -v _token '%s%08x' "${_token}" "${SRANDOM}"; done
  else
    _token=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')
  fi
  util::reply "${1:-}" "${_token}"
}

# util::split_words STRING: print the shell words of STRING NUL-separated (quotes honoured, no
# expansion, no eval). Unbalanced quotes fail.
util::split_words() {
  [[ -z ${1//[[:space:]]/} ]] && return 0
  printf '%s' "$1" | xargs printf '%s\0'
}
