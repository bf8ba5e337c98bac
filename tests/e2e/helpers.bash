# shellcheck shell=bash
# End-to-end helpers: the real test cluster, real jobs. Loaded by every tests/e2e/*.bats.
load ../bats/helpers
# shellcheck source=lib/log.sh
source "${REPO_ROOT}/lib/log.sh"
# shellcheck source=tests/cluster/lib.sh
source "${REPO_ROOT}/tests/cluster/lib.sh"

# Real users are not root: every job this suite submits (sbatch, srun) runs as the cluster's
# ordinary user, in the docker group and nothing else, with the checkout and its venv used as a
# user would use them on shared storage (README: SM_HOME, .venv). Root only inspects and injects
# faults (tests/cluster/exec, scancel, scontrol).
E2E_USER=${SM_CLUSTER_USER:-smuser}
export E2E_USER
# The faults tests inject on purpose (a docker engine stopped, a node's disk filled) would otherwise
# quarantine that node for the tests after them: only tests/e2e/55-bad-nodes.bats keeps one, its own.
export SM_QUARANTINE_HOURS=${SM_QUARANTINE_HOURS:-0}
# sbatch returns at once; a step that hangs is cut off (no wait in this suite is unbounded).
sbatch() { runuser -u "${E2E_USER}" -- timeout 60 sbatch "$@"; }
srun() { runuser -u "${E2E_USER}" -- timeout "${E2E_STEP_TIMEOUT:-120}" srun "$@"; }

# e2e::wait_pid PID [SECONDS]: wait for a background process, at most SECONDS (default 120); then
# kill it and fail. Its exit status is returned.
e2e::wait_pid() {
  local pid=$1 deadline=$((SECONDS + ${2:-120}))
  while kill -0 "${pid}" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      kill -TERM "${pid}" 2>/dev/null || true
      echo "background process ${pid} still running after ${2:-120} s; killed" >&2
      return 124
    fi
    sleep 0.1
  done
  wait "${pid}"
}

# e2e::share_dir DIR…: the job user may write in DIR and in everything created there later (a
# default ACL), and reach it (o+x on the bats run dirs above it).
e2e::share_dir() {
  local dir parent
  for dir in "$@"; do
    [[ -d ${dir} ]] || continue
    parent=$(dirname "${dir}")
    while [[ ${parent} == "${BATS_RUN_TMPDIR:-/nonexistent}"* ]]; do
      chmod o+x "${parent}"
      parent=$(dirname "${parent}")
    done
    chmod o+x "${dir}"
    setfacl -m "u:${E2E_USER}:rwx" -m "d:u:${E2E_USER}:rwx" -m "d:u::rwx" "${dir}"
  done
}
if id -u "${E2E_USER}" >/dev/null 2>&1; then
  e2e::share_dir "${BATS_FILE_TMPDIR:-}" "${BATS_TEST_TMPDIR:-}"
fi

# e2e::ensure_cluster [--nodes N] [--self-name NODE=QUIRK]...: the cluster with at least N nodes
# (default 3), with exactly these quirks. Bring-up takes seconds and the nodes' docker data survives
# it, so tests change quirks freely.
e2e::ensure_cluster() {
  local nodes=3
  [[ ${1:-} != --nodes ]] || { nodes=$2; shift 2; }
  local want="" arg node quirk i
  for ((i = 1; i <= nodes; i++)); do want+="${want:+|}node${i} none"; done
  while (($#)); do
    arg=$2 node=${2%%=*} quirk=${2#*=}
    want=${want/"${node} none"/"${node} ${quirk}"}
    shift 2
    : "${arg}"
  done
  local have entry args=(--nodes "${nodes}") names=()
  have=$(awk '{ printf "%s%s %s", (NR > 1 ? "|" : ""), $1, $3 }' "${CLUSTER_STATE}/nodes" 2>/dev/null || true)
  # Fewer nodes than asked for: a bring-up with N.
  (($(wc -l <"${CLUSTER_STATE}/nodes" 2>/dev/null || echo 0) >= nodes)) || have=""
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
  # Always built: docker's layer cache makes an unchanged toy a no-op (same ID), and a changed
  # examples/toy/ is never tested through a stale image.
  "${REPO_ROOT}/examples/toy/build-image" --node "${node}" >/dev/null
}

# e2e::torch_image_only_on NODE: the PyTorch example image on NODE's engine and on no other node
# (the base rootfs is cached on the machine, keyed by its inputs: minutes the first time, then
# seconds); prints how long it took on fd 3.
e2e::torch_image_only_on() {
  local node=$1 other t0=${SECONDS}
  for other in node1 node2 node3; do
    [[ ${other} == "${node}" ]] && continue
    "${REPO_ROOT}/tests/cluster/exec" "${other}" docker image rm -f sm/torchrun:local >/dev/null 2>&1 || true
  done
  "${REPO_ROOT}/examples/torchrun/build-image" --node "${node}" >/dev/null
  echo "# torch image on ${node} in $((SECONDS - t0)) s" >&3
}

# e2e::torch_cache: the image cache that the torch-image pyxis tests share for this run of the
# suite (47 and 48): the squashfs of the torch image is made once (about a minute) and reused warm.
e2e::torch_cache() {
  local dir=${BATS_RUN_TMPDIR}/torch-image-cache
  mkdir -p "${dir}" && e2e::share_dir "${dir}" && printf '%s' "${dir}"
}

# e2e::image_id NODE [IMAGE]: the image ID on NODE's engine (empty if absent).
e2e::image_id() {
  "${REPO_ROOT}/tests/cluster/exec" "$1" docker image inspect -f '{{.Id}}' "${2:-toy/model:local}" 2>/dev/null || true
}

# e2e::sbatch_wait ARGS...: submit, then poll until the job ends (sbatch --wait polls slowly);
# sets JOB_ID and JOB_RC (the batch script's exit code).
e2e::sbatch_wait() {
  local out
  out=$(sbatch --parsable "$@" 2>&1) || { echo "sbatch failed: ${out}" >&2; return 1; }
  e2e::wait_job "$(printf '%s\n' "${out}" | grep -Eo '^[0-9]+' | head -1)"
}

# e2e::wait_job ID: poll until job ID ends; sets JOB_ID, JOB_RC and JOB_STATE.
e2e::wait_job() {
  local state line deadline=$((SECONDS + ${E2E_JOB_TIMEOUT:-300}))
  JOB_ID=$1
  while ((SECONDS < deadline)); do
    line=$(scontrol show job -o "${JOB_ID}" 2>/dev/null)
    state=$(grep -o 'JobState=[A-Z_]*' <<<"${line}" | cut -d= -f2)
    case ${state} in
      # (A requeued job goes back to PENDING, through these: it has not ended.)
      PENDING | RUNNING | CONFIGURING | COMPLETING | SUSPENDED | REQUEUED | REQUEUE_HOLD | REQUEUE_FED | "") sleep 0.3 ;;
      *)
        JOB_RC=$(grep -o ' ExitCode=[0-9]*' <<<"${line}" | cut -d= -f2)
        # A job Slurm could not launch (JobLaunchFailure: FAILED, ExitCode=0:53) never ran our
        # script: its exit code 0 is no verdict.
        if [[ ${state} == FAILED && ${JOB_RC} == 0 ]]; then
          JOB_RC=$((128 + $(grep -o ' ExitCode=[0-9]*:[0-9]*' <<<"${line}" | cut -d: -f2)))
          echo "job ${JOB_ID} FAILED without an exit code of its own (${line##*Reason=}); JOB_RC=${JOB_RC}" >&2
        fi
        export JOB_ID JOB_RC JOB_STATE=${state}
        return 0
        ;;
    esac
  done
  echo "job ${JOB_ID} did not end within ${E2E_JOB_TIMEOUT:-300} s" >&2
  scancel "${JOB_ID}" 2>/dev/null
  return 1
}

# e2e::nsight_args TOOL_PATH [MORE_ARGS...]: --profile nsight-slurm with the fake tool's home
# (tests/fakes/nsight-slurm-home), the tool path in the ranks' view and a 2 s flush settle, then
# MORE_ARGS, into E2E_NSIGHT_ARGS: the one spelling of a profiled job for 48 and 50.
e2e::nsight_args() {
  local tool=$1
  shift
  # shellcheck disable=SC2034 # read by the test files
  E2E_NSIGHT_ARGS=(--profile nsight-slurm --nsight-slurm-home "${REPO_ROOT}/tests/fakes/nsight-slurm-home"
    --nsight-slurm-tool-path "${tool}" --flush-settle-seconds 2 "$@")
}

# e2e::run_job [SBATCH_ARGS...] -- [MULTI_ARGS...]: submit sbatch/multi.sbatch and wait.
# Sets JOB_ID, JOB_RC, JOB_DIR (the job's output dir) and JOB_OUT (the batch output file).
e2e::run_job() {
  local sargs=()
  while (($#)) && [[ $1 != -- ]]; do
    sargs+=("$1")
    shift
  done
  (($#)) && shift
  local out=${E2E_OUT:-${BATS_FILE_TMPDIR}/out}
  mkdir -p "${out}"
  cd "${BATS_FILE_TMPDIR}" || return 1
  e2e::sbatch_wait "${sargs[@]}" -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${out}" "$@"
  # What e2e::assert_dry_run_is_the_job gives the dry run.
  E2E_JOB_SARGS=("${sargs[@]}") E2E_JOB_ARGS=(--out "${out}" "$@")
  JOB_OUT=${BATS_FILE_TMPDIR}/job-${JOB_ID}.out
  JOB_DIR=$(find "${out}" -mindepth 2 -maxdepth 2 -type d -name "${JOB_ID}" | head -n 1)
  export JOB_OUT JOB_DIR
  if [[ -z ${JOB_DIR} ]]; then
    echo "no job dir for job ${JOB_ID} (rc ${JOB_RC}); batch output:" >&2
    cat "${JOB_OUT}" >&2 2>/dev/null || true
    return 1
  fi
}

# e2e::submit_job [SBATCH_ARGS...] -- [MULTI_ARGS...]: submit sbatch/multi.sbatch and return at once
# (a test that cancels the job: e2e::cancel_when). Sets JOB_ID and JOB_OUT, and what
# e2e::assert_dry_run_is_the_job gives the dry run; the test sets JOB_DIR (<out>/<model>/JOB_ID).
e2e::submit_job() {
  local sargs=() out
  while (($#)) && [[ $1 != -- ]]; do
    sargs+=("$1")
    shift
  done
  (($#)) && shift
  mkdir -p "${BATS_FILE_TMPDIR}/out"
  cd "${BATS_FILE_TMPDIR}" || return 1
  out=$(sbatch --parsable "${sargs[@]}" -o "${BATS_FILE_TMPDIR}/job-%j.out" "${REPO_ROOT}/sbatch/multi.sbatch" \
    --out "${BATS_FILE_TMPDIR}/out" "$@") || return 1
  JOB_ID=${out%%;*} JOB_OUT=${BATS_FILE_TMPDIR}/job-${out%%;*}.out
  E2E_JOB_SARGS=("${sargs[@]}") E2E_JOB_ARGS=(--out "${BATS_FILE_TMPDIR}/out" "$@")
}

# e2e::cancel_when WAIT TEARDOWN CHECK...: scancel JOB_ID once CHECK (a command, tried every
# E2E_POLL s, default 0.3) succeeds, then wait up to TEARDOWN s for its teardown (JOB_DIR's
# summary.json). CHECK still failing after WAIT s: the batch output on stderr, scancel, fail.
e2e::cancel_when() {
  local deadline=$((SECONDS + $1)) teardown=$2
  shift 2
  until "$@"; do
    ((SECONDS < deadline)) || { cat "${JOB_OUT}" >&2; scancel "${JOB_ID}"; return 1; }
    sleep "${E2E_POLL:-0.3}"
  done
  scancel "${JOB_ID}"
  e2e::wait_teardown "${JOB_ID}" "${JOB_DIR}" "${teardown}"
}

# e2e::ranks_say TEXT RANK...: every RANK's node.log in JOB_DIR holds TEXT (a check for cancel_when).
e2e::ranks_say() {
  local text=$1 r
  shift
  for r in "$@"; do grep -qs -- "${text}" "${JOB_DIR}/node_${r}/node.log" || return 1; done
}

# e2e::ranks_profiled N: N ranks run under nsight-slurm's nsys (N streams open in
# JOB_DIR/nsight-slurm-direct) and are in their run stage (a node.log alone can be a rank still in
# prepare: a cancel there is another test's case).
e2e::ranks_profiled() {
  [[ $(find "${JOB_DIR}/nsight-slurm-direct" -name '*.qdstrm' 2>/dev/null | wc -l) == "$1" &&
    $(grep -ls 'stage_start .*stage=run' "${JOB_DIR}"/node_*/events.log 2>/dev/null | wc -l) == "$1" ]]
}

# e2e::assert_dry_run_is_the_job [RANK...]: the dry run of the last e2e::run_job (its sbatch -N and
# --ntasks-per-node, its arguments, as the job's user, from where it was submitted) shows the batch
# step's srun and each RANK's run command (default 0 1) word for word as the job logged them, bar
# what only the job can know (tests/e2e/dry_run_vs_job.py).
e2e::assert_dry_run_is_the_job() {
  local ranks=("${@:-0}") nodes=1 tasks="" arg prev="" dry=${BATS_TEST_TMPDIR}/dry-run.txt
  (($#)) || ranks=(0 1)
  for arg in "${E2E_JOB_SARGS[@]}"; do
    case ${prev}:${arg} in
      -N:* | --nodes:*) nodes=${arg} ;;
      *:-N?*) nodes=${arg#-N} ;;
      *:--nodes=*) nodes=${arg#--nodes=} ;;
      *:--ntasks-per-node=*) tasks=${arg#--ntasks-per-node=} ;;
    esac
    prev=${arg}
  done
  (cd "${BATS_FILE_TMPDIR}" && runuser -u "${E2E_USER}" -- env ${tasks:+SLURM_NTASKS_PER_NODE=${tasks}} \
    bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N "${nodes}" "${E2E_JOB_ARGS[@]}") >"${dry}" 2>&1 ||
    { cat "${dry}" >&2; return 1; }
  run "${SM_PYTHON}" "${REPO_ROOT}/tests/e2e/dry_run_vs_job.py" "${JOB_ID}" "${dry}" "${JOB_DIR}" "${ranks[@]}"
  assert_success
  assert_output --partial "dry run == job"
}

# e2e::json FILE EXPR: evaluate a Python expression over the parsed JSON file (bound to `d`).
e2e::json() {
  "${SM_PYTHON}" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# e2e::perf_column FILE COLUMN: one column of perf.csv, one value per row.
e2e::perf_column() {
  "${SM_PYTHON}" -c 'import csv, sys; [print(r[sys.argv[2]]) for r in csv.DictReader(open(sys.argv[1]))]' "$1" "$2"
}

export TOY_MANIFEST=${REPO_ROOT}/examples/toy/build_manifest.json

# e2e::wait_for_nodes [--docker] NODE...: these nodes' daemons up (another test file may be restarting
# one of them on purpose); these tests never start the cluster themselves.
e2e::wait_for_nodes() {
  local docker=0 node line deadline=$((SECONDS + 120)) ok
  [[ $1 == --docker ]] && { docker=1; shift; }
  while :; do
    ok=1
    for node in "$@"; do
      line=$("${REPO_ROOT}/tests/cluster/status" 2>/dev/null | awk -v n="${node}" '$1 == n')
      [[ $(awk '{ print $4 }' <<<"${line}") == up ]] || ok=0
      ((docker == 0)) || [[ $(awk '{ print $5 }' <<<"${line}") == up ]] || ok=0
    done
    ((ok)) && return 0
    ((SECONDS < deadline)) || { echo "cluster nodes $* not up (tests/cluster/status); these tests never start the cluster" >&2; return 1; }
    sleep 1
  done
}

# e2e::wait_teardown JOB_ID JOB_DIR SECONDS: after a scancel, wait for the job to leave RUNNING and
# for its batch step's teardown to finish. The state says CANCELLED at once, while the teardown
# (flush, stop, collect) runs on within KillWait; its last act is summary.json.
e2e::wait_teardown() {
  local job=$1 dir=$2 deadline=$((SECONDS + $3)) state
  while state=$(scontrol show job -o "${job}" 2>/dev/null | grep -o 'JobState=[A-Z]*'); [[ ${state} =~ RUNNING|COMPLETING|PENDING ]]; do
    ((SECONDS < deadline)) || break
    sleep 0.5
  done
  while [[ ! -f ${dir}/summary.json ]] && ((SECONDS < deadline)); do sleep 0.5; done
}

# The fake nsys's report (tests/fakes/nsys): a header line, then CHUNKS appends of CHUNK_KIB KiB,
# written only when its session ends, over NSYS_FAKE_WRITE_SECONDS -- like the real tool.
FAKE_CHUNKS=4
FAKE_CHUNK_KIB=32

# A job profiled by the fake nsys (--nsys-host-path), with short flush values (the fake writes in
# 1 s): the one spelling of these options for 25's pyxis jobs and 40's docker jobs.
# shellcheck disable=SC2034 # read by the test files
E2E_NSYS_ARGS=(--profile nsys --nsys-host-path "${REPO_ROOT}/tests/fakes/nsys" --flush-settle-seconds 3
  --flush-timeout-seconds 60)

# e2e::nsys_manifest: NSYS_MANIFEST, the toy manifest with absolute paths and the fake's knobs in
# the workload's env (passed to the container, or the pyxis rank's step).
e2e::nsys_manifest() {
  export NSYS_MANIFEST=${BATS_FILE_TMPDIR}/nsys_manifest.json
  "${SM_PYTHON}" - "${TOY_MANIFEST}" "${NSYS_MANIFEST}" "${REPO_ROOT}" "${FAKE_CHUNKS}" "${FAKE_CHUNK_KIB}" <<'PY'
import json, sys
src, dst, repo, chunks, kib = sys.argv[1:]
m = json.load(open(src))
for section in ("built_images", "built_models"):
    for entry in m[section].values():
        entry["dockerfile"] = f"{repo}/examples/toy/Dockerfile"
        if "dockercontext" in entry:
            entry["dockercontext"] = f"{repo}/examples/toy"
        if "scripts" in entry:  # this copy is not beside the model's scripts: name them absolutely
            entry["scripts"] = f"{repo}/examples/toy/{entry['scripts']}"
m["context"]["docker_env_vars"].update(
    NSYS_FAKE_WRITE_SECONDS="1", NSYS_FAKE_CHUNKS=chunks, NSYS_FAKE_CHUNK_KIB=kib
)
json.dump(m, open(dst, "w"), indent=2)
PY
}

# e2e::assert_complete_report FILE: non-empty, nothing cut short: header line + every chunk.
e2e::assert_complete_report() {
  local file=$1 header size
  assert_file_exists "${file}"
  header=$(head -n 1 "${file}" | wc -c)
  size=$(stat -c %s "${file}")
  assert_equal "${size}" "$((header + FAKE_CHUNKS * FAKE_CHUNK_KIB * 1024))"
  run head -n 1 "${file}"
  assert_output --regexp '^FAKE-NSYS-REP session=profile-[0-9]+ app=(ba)?sh$'
}

# e2e::task_pid JOB NODEID: the pid of JOB's sm-node task on that node (its parent is slurmstepd),
# empty while there is none.
e2e::task_pid() {
  local p
  for p in $(pgrep -f "bin/sm-node --jobdir [^ ]*/$1( |\$)" || true); do
    tr '\0' '\n' <"/proc/${p}/environ" 2>/dev/null | grep -qx "SLURM_NODEID=$2" || continue
    [[ $(ps -o comm= -p "$(ps -o ppid= -p "${p}" | tr -d ' ')") == slurmstepd ]] && { printf '%s' "${p}"; return 0; }
  done
  return 0
}
