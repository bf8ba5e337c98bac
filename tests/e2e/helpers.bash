# shellcheck shell=bash
# End-to-end helpers: the real test cluster, real jobs. Loaded by every tests/e2e/*.bats.
load ../bats/helpers
# shellcheck source=lib/log.sh
source "${REPO_ROOT}/lib/log.sh"
# shellcheck source=tests/cluster/lib.sh
source "${REPO_ROOT}/tests/cluster/lib.sh"

# e2e::ensure_cluster [--self-name NODE=QUIRK]...: the 3-node cluster, with exactly these quirks.
# Bring-up takes seconds and the nodes' docker data survives it, so tests change quirks freely.
e2e::ensure_cluster() {
  local want="node1 none|node2 none|node3 none" arg node quirk
  while (($#)); do
    arg=$2 node=${2%%=*} quirk=${2#*=}
    want=${want/"${node} none"/"${node} ${quirk}"}
    shift 2
    : "${arg}"
  done
  local have entry args=(--nodes 3) names=()
  have=$(awk '{ printf "%s%s %s", (NR > 1 ? "|" : ""), $1, $3 }' "${CLUSTER_STATE}/nodes" 2>/dev/null || true)
  local IFS='|'
  for entry in ${want}; do
    names+=("${entry% *}=${entry#* }")
    [[ ${entry#* } == none ]] || args+=(--self-name "${entry% *}=${entry#* }")
  done
  unset IFS
  if [[ ${have} == "${want}" ]] && "${REPO_ROOT}/tests/cluster/status" >/dev/null 2>&1; then
    return 0
  fi
  # Only the quirks differ: rewrite the hosts files in place, no restart.
  if [[ -n ${have} ]] && "${REPO_ROOT}/tests/cluster/status" >/dev/null 2>&1; then
    "${REPO_ROOT}/tests/cluster/self-name" "${names[@]}"
    return 0
  fi
  "${REPO_ROOT}/tests/cluster/up" --no-install "${args[@]}" >&3 2>&1 ||
    "${REPO_ROOT}/tests/cluster/up" "${args[@]}"
}

# e2e::toy_image_only_on NODE: toy/model:local on NODE's engine and on no other node.
e2e::toy_image_only_on() {
  local node=$1 other
  for other in node1 node2 node3; do
    [[ ${other} == "${node}" ]] && continue
    "${REPO_ROOT}/tests/cluster/exec" "${other}" docker image rm -f toy/model:local >/dev/null 2>&1 || true
  done
  "${REPO_ROOT}/tests/cluster/exec" "${node}" docker image inspect toy/model:local >/dev/null 2>&1 ||
    "${REPO_ROOT}/examples/toy/build-image" --node "${node}" >/dev/null
}

# e2e::image_id NODE [IMAGE]: the image ID on NODE's engine (empty if absent).
e2e::image_id() {
  "${REPO_ROOT}/tests/cluster/exec" "$1" docker image inspect -f '{{.Id}}' "${2:-toy/model:local}" 2>/dev/null || true
}

# e2e::sbatch_wait ARGS...: submit with --wait from a shared dir; sets JOB_ID and JOB_RC.
e2e::sbatch_wait() {
  local out
  out=$(sbatch --parsable --wait "$@" 2>&1) && JOB_RC=0 || JOB_RC=$?
  JOB_ID=$(printf '%s\n' "${out}" | grep -Eo '^[0-9]+' | head -1)
  export JOB_ID JOB_RC
}
