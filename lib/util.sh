# shellcheck shell=bash
# Small helpers shared by the entrypoints: JSON strings, the helper CLI, time, node list.

# util::json_str STRING: a JSON string literal (quotes included).
util::json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  # Other control characters would make invalid JSON; drop them.
  s=$(printf '%s' "${s}" | tr -d '\000-\010\013\014\016-\037')
  printf '"%s"' "${s}"
}

# util::sm ARGS…: the slurm-multi helper CLI (py/ on PYTHONPATH, no install needed on a node).
util::sm() {
  PYTHONPATH="${SM_HOME}/py${PYTHONPATH:+:${PYTHONPATH}}" "${SM_PYTHON}" -m slurm_multi "$@"
}

# util::find_python: the venv beside the checkout if it exists, else python3.
util::find_python() {
  if [[ -n ${SM_PYTHON:-} ]]; then
    printf '%s' "${SM_PYTHON}"
  elif [[ -x ${SM_HOME}/.venv/bin/python ]]; then
    printf '%s' "${SM_HOME}/.venv/bin/python"
  else
    command -v python3
  fi
}

util::now() { date +%s.%N; }

# util::elapsed START: seconds since START (from util::now), two decimals.
util::elapsed() {
  local now
  now=$(util::now)
  awk -v a="$1" -v b="${now}" 'BEGIN { printf "%.2f", b - a }'
}

# util::first_node: rank 0's host = the first line of the expanded node list.
util::first_node() {
  local list=${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}
  if [[ -z ${list} ]]; then
    hostname
  elif command -v scontrol >/dev/null; then
    scontrol show hostnames "${list}" | head -n 1
  else
    printf '%s' "${list%%[,\[]*}"
  fi
}

# util::generate_token: a per-job secret for the barrier (hex, 48 chars).
util::generate_token() {
  od -An -N24 -tx1 /dev/urandom | tr -d ' \n'
}

# util::split_words STRING: print the shell words of STRING NUL-separated (quotes honoured, no
# expansion, no eval). Unbalanced quotes fail.
util::split_words() {
  [[ -z ${1//[[:space:]]/} ]] && return 0
  printf '%s' "$1" | xargs printf '%s\0'
}
