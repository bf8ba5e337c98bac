# shellcheck shell=bash
# Slurm look-ups, each written once: this job's steps (squeue -s), Slurm's KillWait (scontrol show
# config) and the job's host names (scontrol show hostnames). lib/util.sh loads this file, so every
# entrypoint has it. Each prints nothing (and succeeds) when Slurm cannot say.

# slurm::steps: this job's steps, one `<step>|<name>|<nodes>` line each (<step> without the job id).
slurm::steps() {
  squeue -s -j "${SLURM_JOB_ID:-}" -h -o '%i|%j|%N' 2>/dev/null |
    awk -F'|' '{ n = split($1, a, "."); print a[n] "|" $2 "|" $3 }' || true
}

# slurm::step_ids NAMES [NODE]: the ids of this job's steps whose name matches NAMES (an awk ERE,
# matched whole: `sm-node|nsight-slurm-connector`, `sm-rank[0-9]+`), only those on NODE if given;
# in squeue's order, one per line.
slurm::step_ids() {
  slurm::steps | awk -F'|' -v re="^(${1})\$" -v node="${2:-}" '$2 ~ re && (node == "" || $3 == node) { print $1 }'
}

# slurm::killwait: Slurm's KillWait in whole seconds (SIGTERM to SIGKILL of a cancelled job's
# steps); SM_KILLWAIT overrides it; empty when it cannot be read.
slurm::killwait() {
  local kw=${SM_KILLWAIT:-}
  [[ -n ${kw} ]] || kw=$(scontrol show config 2>/dev/null | awk -F= '$1 ~ /^KillWait[[:space:]]*$/ { gsub(/[^0-9]/, "", $2); print $2; exit }')
  [[ ${kw} =~ ^[0-9]+$ ]] && printf '%s' "${kw}"
  return 0
}

# slurm::hostnames [LIST]: the node list (default the job's) expanded, one host per line; the list
# split at its commas when scontrol cannot expand it. The job's own list the batch step expanded
# once (slurm::export_hostnames): no scontrol call on every node, three times, before prepare.
slurm::hostnames() {
  local list=${1-${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}} out host
  [[ -n ${list} ]] || return 0
  if slurm::expanded "${list}"; then
    for host in ${SM_JOB_HOSTS}; do printf '%s\n' "${host}"; done
    return 0
  fi
  if out=$(scontrol show hostnames "${list}" 2>/dev/null) && [[ -n ${out} ]]; then
    printf '%s\n' "${out}"
  else
    tr ',' '\n' <<<"${list}"
  fi
}

# slurm::hostnames_into ARRAY [LIST]: slurm::hostnames into ARRAY, one host an element; without a
# process when LIST is the job's own (the batch step expanded it: every node's task asks at its start).
slurm::hostnames_into() {
  local -n _slurm_into=$1
  local _slurm_list=${2-${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}}
  _slurm_into=()
  [[ -n ${_slurm_list} ]] || return 0
  if slurm::expanded "${_slurm_list}"; then
    read -r -a _slurm_into <<<"${SM_JOB_HOSTS}"
  else
    read -r -d '' -a _slurm_into <<<"$(slurm::hostnames "${_slurm_list}")" || true
  fi
}

# slurm::expanded LIST: LIST is the job's own node list, which the batch step expanded already.
slurm::expanded() { [[ -n ${SM_JOB_HOSTS:-} && $1 == "${SM_JOB_HOSTS_OF:-}" ]]; }

# slurm::export_hostnames HOST…: the expansion of SLURM_JOB_NODELIST, for every later
# slurm::hostnames of this job (the tasks inherit it): SM_JOB_HOSTS, and the list it expands.
slurm::export_hostnames() {
  export SM_JOB_HOSTS="$*" SM_JOB_HOSTS_OF=${SLURM_JOB_NODELIST:-}
}
