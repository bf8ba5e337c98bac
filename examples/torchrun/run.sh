#!/usr/bin/env bash
# The launcher of one node, inside the container: starts --nproc-per-node train.py processes with
# the torch.distributed env (env:// rendezvous at MASTER_ADDR:MASTER_PORT), global ranks laid out
# node by node. If one rank fails, its siblings are stopped and this exits with the rank's code, so
# a failing rank never leaves the node hanging in a collective. Debian's torchrun is not used: it
# is broken under Python 3.11 (AttributeError in to_map).
#   run.sh [--nproc-per-node N] [TRAIN.PY OPTION...]
# slurm-multi runs a manifest's .sh script with `sh`, which is dash here: go on in bash.
if [ -z "${BASH_VERSION:-}" ]; then exec bash "$0" "$@"; fi
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

say() { printf 'launcher: node %s: %s\n' "${NODE_RANK:-?}" "$*" >&2; }
die() {
  say "error: $1"
  exit "${2:-1}"
}

usage() {
  cat <<'USAGE'
Usage: run.sh [--nproc-per-node N] [TRAIN.PY OPTION...]

Starts N (default 2) train.py processes on this node with RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE and GROUP_RANK set from NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT. Every
other option goes to train.py. Exits with the first failing rank's code (its siblings are stopped),
0 when every rank exits 0.

Example: NNODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 bash run.sh --nproc-per-node 2 --steps 40
USAGE
}

main() {
  local nproc=2 args=()
  while (($#)); do
    case $1 in
      --nproc-per-node) nproc=${2:-}; shift $(($# > 1 ? 2 : 1)) ;;
      --nproc-per-node=*) nproc=${1#*=}; shift ;;
      -h | --help) usage; return 0 ;;
      *) args+=("$1"); shift ;;
    esac
  done
  [[ ${nproc} =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node must be a positive whole number, got '${nproc}'" 2
  local var
  for var in NNODES NODE_RANK MASTER_ADDR MASTER_PORT; do
    [[ -n ${!var:-} ]] || die "${var} is not set (slurm-multi sets it for every node)" 2
  done
  if ! [[ ${NNODES} =~ ^[1-9][0-9]*$ && ${NODE_RANK} =~ ^[0-9]+$ ]] || ((NODE_RANK >= NNODES)); then
    die "NODE_RANK=${NODE_RANK} NNODES=${NNODES} is not a node of the job" 2
  fi
  export MASTER_ADDR MASTER_PORT WORLD_SIZE=$((NNODES * nproc)) LOCAL_WORLD_SIZE=${nproc}
  export GROUP_RANK=${NODE_RANK} SM_OUTPUT_DIR=${SM_OUTPUT_DIR:-/sm-out}
  mkdir -p "${SM_OUTPUT_DIR}"

  local i rank
  trap 'forward TERM' TERM
  trap 'forward INT' INT
  for ((i = 0; i < nproc; i++)); do
    rank=$((NODE_RANK * nproc + i))
    # A background job of a script starts with SIGINT ignored; give the rank back its default.
    (
      trap - INT
      RANK=${rank} LOCAL_RANK=${i} exec python3 "${HERE}/train.py" "${args[@]+"${args[@]}"}"
    ) &
    RANK_OF[$!]=${rank}
  done
  say "started ranks $((NODE_RANK * nproc))..$((NODE_RANK * nproc + nproc - 1)) of ${WORLD_SIZE} (pids ${!RANK_OF[*]}), master ${MASTER_ADDR}:${MASTER_PORT}"
  supervise
}

# forward SIG: pass a signal this launcher got on to every rank still running.
forward() {
  STOPPING=1
  ((${#RANK_OF[@]})) || return 0
  say "got SIG$1; passing it to ranks ${RANK_OF[*]}"
  kill -s "$1" "${!RANK_OF[@]}" 2>/dev/null || true
}

# supervise: reap the ranks as they exit; the first failure stops the others and sets the exit code.
supervise() {
  local pid rc first=0
  while ((${#RANK_OF[@]})); do
    unset pid
    rc=0
    wait -n -p pid "${!RANK_OF[@]}" || rc=$?
    # No pid: the wait was cut short by a signal, which the trap has already passed on.
    [[ -n ${pid:-} ]] || continue
    local rank=${RANK_OF[${pid}]}
    unset "RANK_OF[${pid}]"
    ((rc == 0)) && continue
    if ((first == 0)); then
      first=${rc}
      if ((${#RANK_OF[@]})) && ((!STOPPING)); then
        say "rank ${rank} exited with ${rc}; stopping ranks ${RANK_OF[*]} on this node"
        kill -s TERM "${!RANK_OF[@]}" 2>/dev/null || true
      else
        say "rank ${rank} exited with ${rc}"
      fi
    fi
  done
  ((first == 0)) && say "all ranks exited 0"
  return "${first}"
}

RANK_OF=() # pid -> global rank, for the ranks still running
STOPPING=0
main "$@" || exit "$?"
