# Common setup for every bats file: bats-support/assert/file, the repo root, the venv python.
# shellcheck shell=bash
BATS_LIB_DIR=${BATS_LIB_DIR:-/usr/lib/bats}
load "${BATS_LIB_DIR}/bats-support/load.bash"
load "${BATS_LIB_DIR}/bats-assert/load.bash"
load "${BATS_LIB_DIR}/bats-file/load.bash"

REPO_ROOT="$(cd "${BATS_TEST_DIRNAME}/../.." && pwd)"
export REPO_ROOT
export SM_HOME="${REPO_ROOT}"
export SM_PYTHON="${SM_PYTHON:-${REPO_ROOT}/.venv/bin/python}"
export PYTHONPATH="${REPO_ROOT}/py${PYTHONPATH:+:${PYTHONPATH}}"
export PATH="${REPO_ROOT}/bin:${PATH}"

# slurm-multi <args>: the helper CLI as a node runs it.
slurm-multi() { "${SM_PYTHON}" -m slurm_multi "$@"; }
