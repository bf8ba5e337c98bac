# shellcheck shell=bash
# Helpers for bench/run: pick the interpreter, run one benchmark into a row file, and the hook for
# the rows that need the test cluster. Functions only; nothing runs at source time.
# Callers set BENCH_ROOT (the repo root) and BENCH_PY (the interpreter) before calling these.

# Row groups bench/run knows, in the order they are measured and printed.
# (No start-up row: start-up is judged in the seconds it adds to a job, in the cluster rows.)
BENCH_ROWS=(barrier fitness collect report relay cluster)
BENCH_CLUSTER_ROW="toolkit overhead / image distribution"

# bench::python: the interpreter every benchmark runs with (stdout): the same choice as every
# other entrypoint (util::find_python: SM_PYTHON, else the checkout's .venv, else python3).
# shellcheck disable=SC2153 # BENCH_ROOT is set by the caller (see the top of this file)
bench::python() {
  SM_HOME=${BENCH_ROOT} util::find_python
  printf '\n'
}

# bench::is_row NAME: true when NAME is one of BENCH_ROWS.
bench::is_row() {
  local row
  for row in "${BENCH_ROWS[@]}"; do
    [[ ${row} == "$1" ]] && return 0
  done
  return 1
}

# bench::write_skipped ROW WHY OUT: a row the table shows as "skipped (WHY)".
bench::write_skipped() {
  # BASH_SOURCE[0] is this file wherever it is sourced from; benchlib.py sits next to it.
  local here
  here=$(dirname "${BASH_SOURCE[0]}")
  "${BENCH_PY}" "${here}/benchlib.py" skip "$1" "$2" "$3"
}

# bench::run_row NAME OUT CMD…: run one benchmark that writes its rows to OUT. On failure the table
# gets a row saying so, and the function returns 1 so bench/run can exit non-zero at the end.
bench::run_row() {
  local name=$1 out=$2
  shift 2
  local started rc=0
  started=${SECONDS}
  log::info bench "${name}: starting"
  log::cmd bench "$@"
  "$@" || rc=$?
  if ((rc != 0)); then
    log::error bench "${name}: failed (exit ${rc}); its row says so, the other rows still run"
    bench::write_skipped "${name}" "failed: exit ${rc}, see the log on stderr" "${out}"
    return 1
  fi
  log::info bench "${name}: done in $((SECONDS - started)) s"
}

# bench::cluster_hook OUT_DIR [ARGS…]: the toolkit-overhead and image-distribution rows need real
# SLURM nodes and docker engines. bench/cluster_bench.sh measures them; it brings the test cluster
# to the 3 nodes its rows need (as root; otherwise the rows are skipped, saying why), gets ARGS plus
# `--out-dir DIR` and writes one or more row files (*.json) there.
bench::cluster_hook() {
  local out_dir=$1
  shift
  local script=${BENCH_ROOT}/bench/cluster_bench.sh
  local status=${BENCH_ROOT}/tests/cluster/status
  if [[ ! -f ${script} ]]; then
    log::warn bench "cluster rows: ${script#"${BENCH_ROOT}"/} is not there yet; skipped"
    bench::write_skipped "${BENCH_CLUSTER_ROW}" "bench/cluster_bench.sh not present yet" \
      "${out_dir}/05-cluster-skipped.json"
    return 0
  fi
  # Only root can bring the test cluster up (cluster_bench.sh does, to the node count it needs).
  local can_bring_up=${BENCH_CAN_BRING_UP:-$((EUID == 0))}
  if ((!can_bring_up)) && ! "${status}" >/dev/null 2>&1; then
    log::warn bench "cluster rows: the test cluster is not up and only root can bring it up; skipped"
    bench::write_skipped "${BENCH_CLUSTER_ROW}" "test cluster not up (bringing it up needs root)" \
      "${out_dir}/05-cluster-skipped.json"
    return 0
  fi
  local rows_dir=${out_dir}/cluster
  mkdir -p "${rows_dir}"
  # Its stdout goes to stderr: bench/run's stdout is the table alone.
  local rc=0
  # A failed group still leaves the rows of the groups that worked: they are shown too.
  bench::run_row "${BENCH_CLUSTER_ROW}" "${out_dir}/05-cluster-failed.json" \
    bash "${script}" "$@" --out-dir "${rows_dir}" >&2 || rc=1
  local file found=0
  for file in "${rows_dir}"/*.json; do
    [[ -f ${file} ]] || continue
    found=1
    cp "${file}" "${out_dir}/06-cluster-${file##*/}"
  done
  ((rc == 0)) || return 1
  if ((found == 0)); then
    log::error bench "cluster rows: ${script#"${BENCH_ROOT}"/} succeeded but wrote no *.json row file"
    bench::write_skipped "${BENCH_CLUSTER_ROW}" "failed: cluster_bench.sh wrote no rows" \
      "${out_dir}/05-cluster-failed.json"
    return 1
  fi
}
