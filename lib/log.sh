# shellcheck shell=bash
# One logger for every script: `<UTC time> <host> r<rank> <area>: <message>` on stderr.
# stdout is data; everything a person reads goes through here.

# log::_emit LEVEL AREA MESSAGE…
log::_emit() {
  local level=$1 area=$2
  shift 2
  local stamp host rank
  # printf's own clock: no `date` process per log line.
  TZ=UTC printf -v stamp '%(%Y-%m-%dT%H:%M:%SZ)T' -1
  host=${SLURMD_NODENAME:-${HOSTNAME:-$(hostname)}}
  rank=${SM_RANK:-${SLURM_NODEID:--}}
  if [[ ${level} == info ]]; then
    printf '%s %s r%s %s: %s\n' "${stamp}" "${host}" "${rank}" "${area}" "$*" >&2
  else
    printf '%s %s r%s %s: %s: %s\n' "${stamp}" "${host}" "${rank}" "${area}" "${level}" "$*" >&2
  fi
}

log::info() { log::_emit info "$@"; }
log::warn() { log::_emit warning "$@"; }
log::error() { log::_emit error "$@"; }

# log::quote WORD…: the words as a shell reads them back, each quoted only when it needs it: bare
# when it is made of [A-Za-z0-9_@%+=:,./-] (Python's shlex.quote set), else in single quotes, and
# with $'…' when it holds a control character (a logged command stays on one line). The one way a
# command is shown: in node logs (log::cmd), the dry run and nsight-slurm.out.
LOG_QUOTE_SAFE='^[A-Za-z0-9_@%+=:,./-]+$'
log::quote() {
  log::quote_to LOG_QUOTED "$@"
  printf '%s' "${LOG_QUOTED}"
}

# log::quote_to VAR WORD…: log::quote into VAR (no subshell: log::cmd is on every job's path).
log::quote_to() {
  local _var=$1 w s='' sep='' q="'"
  shift
  for w in "$@"; do
    if [[ ${w} =~ ${LOG_QUOTE_SAFE} ]]; then
      s+="${sep}${w}"
    elif [[ ${w} == *[[:cntrl:]]* ]]; then
      printf -v w '%q' "${w}"
      s+="${sep}${w}"
    else
      s+="${sep}${q}${w//${q}/${q}\\${q}${q}}${q}"
    fi
    sep=' '
  done
  printf -v "${_var}" '%s' "${s}"
}

# log::cmd AREA CMD…: log a command exactly as it can be pasted back into a shell.
log::cmd() {
  local area=$1
  shift
  local LOG_QUOTED
  log::quote_to LOG_QUOTED "$@"
  log::_emit info "${area}" "+ ${LOG_QUOTED}"
}

# log::die AREA MESSAGE [EXIT_CODE]: one line, then exit (default 1).
log::die() {
  log::_emit error "$1" "$2"
  exit "${3:-1}"
}

# log::enable_debug: SM_DEBUG=1 turns on xtrace with a PS4 that says where we are.
log::enable_debug() {
  if [[ ${SM_DEBUG:-0} == 1 ]]; then
    export PS4='+ ${BASH_SOURCE[0]##*/}:${LINENO} ${FUNCNAME[0]:-main}: '
    set -x
  fi
}

# log::install_err_trap: on an unexpected error print the failing command and the call tree.
log::install_err_trap() {
  set -o errtrace
  trap 'log::_on_err $? "${BASH_COMMAND}"' ERR
}

log::_on_err() {
  local rc=$1 cmd=$2 i
  # A wait cut short by SIGTERM/SIGINT (scancel, a stop) is how a job ends, not a bug of ours.
  ((rc != 143 && rc != 130)) || return 0
  log::_emit error "${SM_LOG_AREA:-slurm-multi}" "command failed (exit ${rc}): ${cmd}"
  for ((i = 1; i < ${#FUNCNAME[@]}; i++)); do
    printf '    at %s (%s:%s)\n' "${FUNCNAME[i]}" "${BASH_SOURCE[i]##*/}" "${BASH_LINENO[i - 1]}" >&2
  done
}
