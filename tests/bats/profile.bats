#!/usr/bin/env bats
# Profiling (lib/profile.sh) and the worker step's launcher (lib/launch.sh) without a cluster:
# validation errors, the launcher argv per runtime x profile (golden files: pyxis cannot run here),
# the nsight-slurm configure sequence and wrapper env through the fake wrapper, and the teardown
# flush (once, under a lock, in order). Regenerate the goldens with UPDATE_GOLDEN=1 after a
# deliberate change, and read the diff.

# shellcheck disable=SC2016 # the single-quoted scripts expand in the job or the subshell, on purpose
load helpers
bats_require_minimum_version 1.5.0

GOLDEN=${BATS_TEST_DIRNAME}/golden
NSIGHT_HOME=${REPO_ROOT}/tests/fakes/nsight-slurm-home

setup() {
  cd "${BATS_TEST_TMPDIR}" || return 1
  unset SLURM_JOB_ID SLURM_JOB_NUM_NODES SLURM_JOB_NODELIST SLURM_NTASKS_PER_NODE SLURMD_NODENAME
  # Fakes of the Slurm commands the flush uses: they append "<time> <argv>" to TRACE.
  export TRACE=${BATS_TEST_TMPDIR}/trace
  mkdir -p shim
  cat >shim/scancel <<'SH'
#!/bin/sh
printf '%s scancel %s\n' "$(date +%s.%N)" "$*" >>"${TRACE}"
# Like nsys answering SIGTERM: the sessions end and every rank's report appears.
if [ -n "${FAKE_REPORTS_ON_TERM:-}" ]; then
  for f in ${FAKE_REPORTS_ON_TERM}; do head -c 4096 /dev/zero >"${f}"; done
fi
SH
  cat >shim/squeue <<'SH'
#!/bin/sh
printf '%s squeue %s\n' "$(date +%s.%N)" "$*" >>"${TRACE}"
printf '%s\n' ${FAKE_STEPS:-}
SH
  chmod +x shim/scancel shim/squeue
  # The fakes of nsight-slurm are python3 scripts that need pyzmq: the venv first on PATH.
  export PATH="${BATS_TEST_TMPDIR}/shim:${REPO_ROOT}/.venv/bin:${PATH}"
}

teardown() {
  # A coordinator a test started (fake nsight-slurm, detached): stop it.
  local state
  for state in "${BATS_TEST_TMPDIR}"/job/.nsight-slurm/jobs/*/; do
    [[ -d ${state} ]] || continue
    SLURM_SUBMIT_DIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=$(basename "${state}") \
      "${NSIGHT_HOME}/bin/nsight-slurm" coordinator stop --force >/dev/null 2>&1 || true
  done
}

# dry ARGS…: the dry run with the toy manifest.
dry() {
  bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest "${REPO_ROOT}/examples/toy/build_manifest.json" "$@"
}

# libs: source what the batch step sources, in the current (sub)shell, with the defaults applied.
libs() {
  local lib
  for lib in log util settings job profile launch teardown; do
    # shellcheck source=/dev/null
    source "${REPO_ROOT}/lib/${lib}.sh"
  done
  SM_PYTHON=${SM_PYTHON} settings::resolve_env
}

# step_argv RUNTIME PROFILE: the worker step's argv, one word per line, the checkout shown as <repo>.
step_argv() {
  (
    export SM_RUNTIME=$1 SM_PROFILE=$2 SM_HOME=${REPO_ROOT} SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=2
    export SM_OUT=/shared/out MASTER_ADDR=node1 HF_TOKEN=hf_secret_value
    export SM_MANIFEST=${REPO_ROOT}/tests/bats/data/manifest-mounts.json
    [[ $1 == docker ]] || export SM_NTASKS_PER_NODE=2
    [[ $2 == nsys ]] && export SM_NSYS_HOST_PATH=${REPO_ROOT}/tests/fakes/nsys
    [[ $2 == nsight-slurm ]] && export SM_NSIGHT_SLURM_HOME=${NSIGHT_HOME}
    export SM_PROFILE_START_ITER=100 SM_PROFILE_STOP_ITER=120
    SM_CMD=()
    [[ $1 == pyxis ]] || SM_CMD=(python3 bench.py --iters 100)
    libs
    # The pyxis step takes the image, mounts, env and workload from the job plan (job.json's helper).
    JOB_NODES=(node1 node2)
    # A dry run's plan: the same values, no job dir written.
    local plan_args=()
    ((${#SM_CMD[@]} == 0)) || plan_args=(-- "${SM_CMD[@]}")
    SM_DRY_RUN=1 job::plan "${plan_args[@]}" >/dev/null 2>&1 || exit 1
    launch::step_argv || exit 1
    printf '%s\n' "${LAUNCH_ARGV[@]}" | sed "s|${REPO_ROOT}|<repo>|g"
  )
}

# rank_argv PROFILE: a pyxis rank's own step (what sm-node on node2, rank 1, starts), one word per
# line, from the same prepare a node runs (manifest mounts, de-duplicated).
rank_argv() {
  (
    export SM_RUNTIME=pyxis SM_PROFILE=$1 SM_HOME=${REPO_ROOT} SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=2
    export SM_OUT=/shared/out MASTER_ADDR=node1 HF_TOKEN=hf_secret_value SM_RANK=1 SLURMD_NODENAME=node2
    export SM_MANIFEST=${REPO_ROOT}/tests/bats/data/manifest-mounts.json SM_NTASKS_PER_NODE=2
    export SM_SCRATCH=/scratch/r1 SM_OUTPUT_DIR=/sm-out SM_IMAGE_CACHE=/shared/cache
    [[ $1 == nsys ]] && export SM_NSYS_HOST_PATH=${REPO_ROOT}/tests/fakes/nsys
    [[ $1 == nsight-slurm ]] && export SM_NSIGHT_SLURM_HOME=${NSIGHT_HOME}
    export SM_PROFILE_START_ITER=100 SM_PROFILE_STOP_ITER=120
    SM_CMD=()
    libs
    # shellcheck source=/dev/null
    for lib in image run node; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    JOB_NODES=(node1 node2)
    # A dry run's plan: the same values, no job dir written.
    local plan_args=()
    ((${#SM_CMD[@]} == 0)) || plan_args=(-- "${SM_CMD[@]}")
    SM_DRY_RUN=1 job::plan "${plan_args[@]}" >/dev/null 2>&1 || exit 1
    export SM_JOBDIR SM_NODE_DIR=${BATS_TEST_TMPDIR}/node_1
    mkdir -p "${SM_NODE_DIR}" prep
    util::helper node prepare --scratch prep --no-detect --node-scratch /scratch/r1 >/dev/null 2>&1 || exit 1
    source prep/context.sh
    profile::before_run >/dev/null 2>&1 || exit 1
    run::pyxis_argv || exit 1
    printf '%s\n' "${RUN_ARGV[@]}" | sed "s|${REPO_ROOT}|<repo>|g"
  )
}

# assert_golden NAME ACTUAL: ACTUAL equals tests/bats/golden/NAME (UPDATE_GOLDEN=1 rewrites it).
assert_golden() {
  if [[ ${UPDATE_GOLDEN:-0} == 1 ]]; then
    printf '%s\n' "$2" >"${GOLDEN}/$1"
  fi
  assert_file_exists "${GOLDEN}/$1"
  assert_equal "$2" "$(cat "${GOLDEN}/$1")"
}

@test "pyxis image references: the registry is separated with # as enroot wants, paths stay" {
  run bash -c 'source "${REPO_ROOT}/lib/launch.sh"
    for i in registry.example/llm:1.0 gpu-registry.example/nvidia/pytorch:24.05-py3 localhost:5000/x ubuntu:22.04 \
      library/ubuntu /shared/images/llm.sqsh ./llm.sqsh gpu-registry.example#nvidia/pytorch:24.05; do launch::pyxis_image "${i}"; echo; done'
  assert_output "$(printf '%s\n' 'registry.example#llm:1.0' 'gpu-registry.example#nvidia/pytorch:24.05-py3' 'localhost:5000#x' ubuntu:22.04 \
    library/ubuntu /shared/images/llm.sqsh ./llm.sqsh 'gpu-registry.example#nvidia/pytorch:24.05')"
}

# ---- validation: one line, exit 2, before anything is submitted -----------------------------

@test "nsight-slurm with --runtime docker is one line that says why and what to use instead" {
  run dry --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}"
  assert_failure 2
  assert_equal "${#lines[@]}" 1
  assert_output --partial "--profile nsight-slurm cannot run with --runtime docker: nsight-slurm profiles the srun task itself"
  assert_output --partial "use --runtime pyxis (containers) or --runtime none (bare metal)"
}

@test "nsight-slurm needs an absolute home holding executable nsight-slurm and nsight-slurm-connector" {
  run dry --runtime pyxis --profile nsight-slurm
  assert_failure 2
  assert_output --partial "--profile nsight-slurm needs --nsight-slurm-home DIR"
  run dry --runtime pyxis --profile nsight-slurm --nsight-slurm-home tests/fakes/nsight-slurm-home
  assert_failure 2
  assert_output --partial "--nsight-slurm-home 'tests/fakes/nsight-slurm-home' must be an absolute path"
  mkdir -p home/bin
  run dry --runtime pyxis --profile nsight-slurm --nsight-slurm-home "${PWD}/home"
  assert_failure 2
  assert_output --partial "${PWD}/home/bin/nsight-slurm is missing or not executable"
  cp "${NSIGHT_HOME}/bin/nsight-slurm" home/bin/
  cp "${NSIGHT_HOME}/bin/nsight-slurm-connector" home/bin/
  chmod -x home/bin/nsight-slurm-connector
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${PWD}/home"
  assert_failure 2
  assert_equal "${#lines[@]}" 1
  assert_output --partial "${PWD}/home/bin/nsight-slurm-connector is missing or not executable; install Nsight Cloud for Slurm there"
  refute_output --partial "slurm-multi plan"
}

@test "an unknown profiling mode, and cuda-api without TRT-LLM, are rejected; trtllm defaults to cuda-api" {
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --nsight-slurm-mode always
  assert_failure 2
  assert_output --partial "--nsight-slurm-mode 'always': expected at-launch, manual or cuda-api"
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --nsight-slurm-mode cuda-api
  assert_failure 2
  assert_output --partial "--nsight-slurm-mode cuda-api needs a framework that calls cudaProfilerStart/Stop (--framework trtllm)"
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --framework sglang --nsight-slurm-mode cuda-api
  assert_failure 2
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --framework trtllm
  assert_success
  assert_output --regexp "profiling mode +cuda-api"
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}"
  assert_success
  assert_output --regexp "profiling mode +at-launch"
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --nsight-slurm-tool-path nsys
  assert_failure 2
  assert_output --partial "--nsight-slurm-tool-path 'nsys' must be an absolute path"
}

@test "every connector-owned nsys flag is rejected for nsight-slurm, one by one" {
  local flag
  for flag in "-o out" "--output=out" "-oout" "--force-overwrite true" "-f" "-c cudaProfilerApi" \
    "--capture-range=cudaProfilerApi" "--capture-range-end repeat" "--capture-range-end=stop" "--start-later" "-Y"; do
    run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" \
      --profile-tool-options "-t cuda,nvtx ${flag} --sample=none"
    assert_failure 2
    assert_equal "${#lines[@]}" 1
    assert_output --partial "--profile-tool-options '${flag%% *}'"
  done
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --profile-tool-options "-t cuda,nvtx --wait=all"
  assert_success
  # The user's --wait is kept; --wait=primary is only added when there is none.
  assert_output --regexp "tool options +-t cuda,nvtx --wait=all -o '[^ ]*/nsight-slurm-direct/%q"
}

@test "nsys tool options may not set the output name; the connector-owned flags are fine for plain nsys" {
  local flag
  for flag in "-o x" "--output x" "--output=x" "-ox"; do
    run dry --profile nsys --profile-tool-options "-t cuda ${flag}"
    assert_failure 2
    assert_output --partial "the output name is slurm-multi's (one report per rank under the report dir)"
  done
  run dry --profile nsys --profile-tool-options "-t cuda --capture-range=cudaProfilerApi --capture-range-end=stop -f true"
  assert_success
  assert_output --regexp "nsys profile -t cuda --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o "
  run dry --profile nsys --profile-tool-options "-t 'cuda"
  assert_failure 2
  assert_output --partial "--profile-tool-options '-t 'cuda': unbalanced quotes"
}

@test "profile window, flush knobs, tasks per node, host nsys and pyxis paths are checked" {
  run dry --profile nsys --profile-start-iter 10
  assert_failure 2
  assert_output --partial "give both --profile-start-iter and --profile-stop-iter"
  run dry --profile nsys --profile-start-iter 10 --profile-stop-iter soon
  assert_failure 2
  run dry --profile nsys --profile-start-iter 20 --profile-stop-iter 10
  assert_failure 2
  assert_output --partial "--profile-stop-iter must not be before --profile-start-iter"
  run dry --profile nsys --flush-settle-seconds 1m
  assert_failure 2
  assert_output --partial "--flush-settle-seconds '1m': expected a whole number of seconds, 0 or more (SM_FLUSH_SETTLE_SECONDS)"
  run dry --profile nsys --flush-timeout-seconds -5
  assert_failure 2
  run dry --ntasks-per-node 4
  assert_failure 2
  assert_output --partial "--ntasks-per-node 4 with --runtime docker: the docker runtime runs one container per node"
  run dry --profile nsys --nsys-host-path "${PWD}/no-such-nsys"
  assert_failure 2
  assert_output --partial "--nsys-host-path ${PWD}/no-such-nsys: not an executable file"
  run dry --runtime pyxis --profile-dir /shared/a,b
  assert_failure 2
  assert_output --partial "pyxis cannot mount a path with a comma"
  run dry --framework TRT-LLM
  assert_failure 2
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --runtime none -- sh -c 'echo bare'
  assert_success
}

@test "a profiled stop grace shorter than the settle window is one line naming both values" {
  run dry --profile nsys --profile-stop-grace 10
  assert_failure 2
  assert_equal "${#lines[@]}" 1
  assert_output --partial "--profile-stop-grace 10 is shorter than --flush-settle-seconds 60: docker stop would SIGKILL nsys while it writes its report; give at least 60"
  run dry --runtime none --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --flush-settle-seconds 30 --profile-stop-grace 29
  assert_failure 2
  assert_output --partial "--profile-stop-grace 29 is shorter than --flush-settle-seconds 30"
  run dry --profile nsys --profile-stop-grace 1m
  assert_failure 2
  assert_output --partial "--profile-stop-grace '1m': expected a whole number of seconds, 0 or more (SM_PROFILE_STOP_GRACE)"
  run dry --profile nsys --flush-settle-seconds 30 --profile-stop-grace 30
  assert_success
  # Without profiling there is no report to protect.
  run dry --profile-stop-grace 10
  assert_success
}

# ---- the worker step's argv ----------------------------------------------------------------

@test "the worker step's argv for every runtime x profile matches its golden file" {
  local runtime profile
  for runtime in docker none pyxis; do
    for profile in none nsys nsight-slurm; do
      [[ ${runtime}/${profile} == docker/nsight-slurm ]] && continue
      assert_golden "step-${runtime}-${profile}.txt" "$(step_argv "${runtime}" "${profile}")"
    done
  done
}

@test "pyxis: every node runs sm-node (one task per rank); each rank's container is a step sm-node starts" {
  local profile
  for profile in none nsys nsight-slurm; do
    run step_argv pyxis "${profile}"
    assert_line "<repo>/bin/sm-node"
    assert_line --partial "--ntasks-per-node=2"
    refute_line --partial "--container-image"
    assert_golden "rank-pyxis-${profile}.txt" "$(rank_argv "${profile}")"
  done
  # One task, this node, sharing the allocation with sm-node's step; the job's ids put back.
  run rank_argv none
  assert_line --index 0 srun
  assert_line --index 1 --job-name=sm-rank1
  assert_line --overlap
  assert_line --nodes=1
  assert_line --ntasks=1
  assert_line --nodelist=node2
  assert_line "--container-image=/shared/cache/registry.example_llm_1.0-$(printf %s registry.example/llm:1.0 | sha256sum | cut -c1-8).sqsh"
  assert_line --partial 'export SLURM_PROCID="${SM_PYXIS_PROCID:-$SLURM_PROCID}"'
}

@test "through the nsight-slurm launcher: native options, then --, then the command; no --export, no job name" {
  local runtime argv=() i dashdash
  for runtime in none pyxis; do
    # bare metal: the wrapper starts sm-node's step; pyxis: each rank's own step.
    if [[ ${runtime} == none ]]; then
      mapfile -t argv < <(step_argv none nsight-slurm)
    else
      mapfile -t argv < <(rank_argv nsight-slurm)
    fi
    assert_equal "${argv[0]}" env
    assert_equal "${argv[1]}" "SLURM_SUBMIT_DIR=/shared/out/llm_bench/4242"
    dashdash=""
    for i in "${!argv[@]}"; do
      [[ ${argv[i]} == --export* || ${argv[i]} == --job-name* ]] && fail "${argv[i]} in the launcher argv"
      [[ ${argv[i]} == SLURMD_NODENAME=* ]] && fail "SLURMD_NODENAME in the launcher's environment"
      [[ -z ${dashdash} && ${argv[i]} == -- ]] && dashdash=${i}
    done
    assert [ -n "${dashdash}" ]
    # Right before --: srun's options; right after: the command, never an option.
    [[ ${argv[dashdash - 1]} == --* ]] || fail "'${argv[dashdash - 1]}' before -- is not an srun option"
    [[ ${argv[dashdash + 1]} != -* ]] || fail "'${argv[dashdash + 1]}' after -- is an option"
    local wrapper=$((dashdash))
    for i in "${!argv[@]}"; do [[ ${argv[i]} == '<repo>/tests/fakes/nsight-slurm-home/bin/nsight-slurm' ]] && wrapper=${i}; done
    assert_equal "${argv[wrapper + 1]}" srun
  done
}

@test "pyxis: ONE --container-mounts holding the job's mounts and the connector's, each destination once" {
  local argv=() mounts=() count=0 a
  mapfile -t argv < <(rank_argv nsight-slurm)
  for a in "${argv[@]}"; do
    [[ ${a} == --container-mounts* ]] || continue
    count=$((count + 1))
    IFS=, read -r -a mounts <<<"${a#--container-mounts=}"
  done
  assert_equal "${count}" 1
  assert_equal "$(printf '%s\n' "${mounts[@]}")" "$(printf '%s\n' /scratch/r1/output:/sm-out /shared/data:/data /shared/models:/models \
    '<repo>/tests/fakes/nsight-slurm-home:<repo>/tests/fakes/nsight-slurm-home:ro' \
    '<repo>/tests/fakes/nsight-slurm-home/bin/nsight-slurm-connector:/usr/local/bin/nsight-slurm-connector:ro' \
    /shared/out/llm_bench/4242:/shared/out/llm_bench/4242 /shared/out/llm_bench/4242/nsight-slurm-runtime:/nsrt)"
  # The manifest's env rides in the step's environment (workload.env); its secret never in argv.
  run printf '%s\n' "${argv[@]}"
  refute_output --partial NCCL_DEBUG
  refute_output --partial hf_secret_value
  refute_output --partial HF_TOKEN
}

@test "the node's docker argv under nsys: report dir at the same path, host nsys read-only, window env by name" {
  run --separate-stderr bash -c '
    for lib in log util settings image run node profile launch; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    settings::resolve_env
    export SM_PROFILE=nsys SM_RUNTIME=docker SM_NSYS_HOST_PATH=${REPO_ROOT}/tests/fakes/nsys SLURM_JOB_ID=4242
    export SM_JOBDIR=${BATS_TEST_TMPDIR}/job SM_NODE_DIR=${BATS_TEST_TMPDIR}/job/node_1 SM_RANK=1 SLURM_PROCID=1
    export SM_SCRATCH=/scratch/r1 SM_IMAGE=toy/model:local SM_GPU_VENDOR=none TLLM_PROFILE_START_STOP=5-9
    export TLLM_PROFILE_LOG_RANKS=all DYN_ENABLE_RUST_NVTX=1 SM_PROFILE_START_ITER=5 SM_PROFILE_STOP_ITER=9
    mkdir -p "${SM_NODE_DIR}"
    RUN_DOCKER_OPTS=(-v /scratch/r1/output:/sm-out -v /shared/data:/data) RUN_WORKLOAD=(sh run.sh)
    profile::before_run
    run::docker_argv
    printf "%s\n" "${RUN_ARGV[@]}"'
  assert_success
  assert_golden docker-run-nsys.txt "$(sed "s|${BATS_TEST_TMPDIR}|<tmp>|g; s|${REPO_ROOT}|<repo>|g" <<<"${output}")"
  assert_file_exists "${BATS_TEST_TMPDIR}/job/node_1/.profile-nsys"
  assert_dir_exists "${BATS_TEST_TMPDIR}/job/profile"
}

@test "a requeued attempt's reports are named per attempt: <job>-a<N>_<node>_rank<R>, never the first attempt's name" {
  local attempt
  for attempt in "" 0 2; do
    SLURM_RESTART_COUNT=${attempt} run bash -c '
      for lib in log util settings profile; do source "${REPO_ROOT}/lib/${lib}.sh"; done
      printf "%s\n" "${PROFILE_REPORT_NAME}"'
    case ${attempt} in
      2) assert_output '%q{SLURM_JOB_ID}-a2_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}' ;;
      *) assert_output '%q{SLURM_JOB_ID}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}' ;;
    esac
  done
  # Collect maps an attempt's report to its rank like any other.
  run "${SM_PYTHON}" -c 'from slurm_multi.results.profile import RANK_RE; print(RANK_RE.search("4242-a2_node2_rank11.nsys-rep").group(1))'
  assert_output 11
}

# node_stop_grace [VAR=VALUE…]: the `docker stop` lib/run.sh runs after the node's profile::before_run,
# through a recording docker, with the settings given (defaults otherwise).
node_stop_grace() {
  printf '#!/bin/sh\nprintf "%%s\\n" "docker $*" >>"${TRACE}"\n' >shim/docker
  chmod +x shim/docker
  : >"${TRACE}"
  env "$@" bash -c '
    for lib in log util settings image run node profile launch; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    settings::resolve_env
    export SM_RUNTIME=${SM_RUNTIME:-docker} SLURM_JOB_ID=4242 SM_JOBDIR=${BATS_TEST_TMPDIR}/job SM_RANK=1 SLURM_PROCID=1
    export SM_NODE_DIR=${SM_JOBDIR}/node_1
    mkdir -p "${SM_NODE_DIR}"
    RUN_DOCKER_OPTS=() RUN_WORKLOAD=(sh run.sh)
    profile::before_run
    run::stop_container sm-4242-r1' 2>&1
  grep -o "stop -t [0-9]*" "${TRACE}"
}

@test "a profiled container's docker stop grace: settle + 15 s by default, never below --stop-grace" {
  run node_stop_grace SM_PROFILE=nsys
  assert_success
  assert_line "stop -t 75"
  assert_output --partial "stop grace for profiled containers: 75 s (the flush settle window 60 s + 15 s; --stop-grace 30 is shorter)"
  run node_stop_grace SM_PROFILE=nsys SM_FLUSH_SETTLE_SECONDS=120
  assert_line "stop -t 135"
  run node_stop_grace SM_PROFILE=nsys SM_PROFILE_STOP_GRACE=90
  assert_line "stop -t 90"
  assert_output --partial "stop grace for profiled containers: 90 s (--profile-stop-grace; --stop-grace 30 is shorter)"
  # A longer --stop-grace is kept: the grace is a lower bound.
  run node_stop_grace SM_PROFILE=nsys SM_FLUSH_SETTLE_SECONDS=3 SM_STOP_GRACE=20
  assert_line "stop -t 20"
  refute_output --partial "stop grace for profiled containers"
  run node_stop_grace SM_PROFILE=nsight-slurm SM_RUNTIME=none
  assert_line "stop -t 75"
  # Not profiled: the plain --stop-grace.
  run node_stop_grace SM_PROFILE=none
  assert_line "stop -t 30"
}

@test "the batch step exports the profiled stop grace too (reaper and teardown bounds), and the dry run shows it" {
  run nsight_batch eval 'export SM_PROFILE=nsys SM_RUNTIME=docker SM_FLUSH_SETTLE_SECONDS=60
    profile::before_steps && echo "batch grace=${SM_STOP_GRACE}" && bash -c "echo child grace=\${SM_STOP_GRACE}"'
  assert_success
  assert_line "batch grace=75"
  assert_line "child grace=75"
  run dry --profile nsys --flush-settle-seconds 45
  assert_success
  assert_output --regexp "stop grace +60 s \(the larger of --stop-grace 30 and settle 45 \+ 15\)"
  assert_output --partial "each node: docker stop -t 60"
}

# ---- nsight-slurm: the configure sequence and the wrapper env ------------------------------

# nsight_batch CMD…: run CMD in a simulated batch step of job 4242 on node1, log dir ./job.
nsight_batch() {
  (
    export SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=2 SLURMD_NODENAME=node1 SM_JOBDIR=${BATS_TEST_TMPDIR}/job
    export SM_HOME=${REPO_ROOT} SM_RUNTIME=none SM_PROFILE=nsight-slurm SM_NSIGHT_SLURM_HOME=${NSIGHT_HOME_OVERRIDE:-${NSIGHT_HOME}}
    export SM_NSIGHT_SLURM_TOOL_PATH=${REPO_ROOT}/tests/fakes/nsys SM_NSIGHT_COORDINATOR_ADDR=127.0.0.1
    export FAKE_RECORD_DIR=${BATS_TEST_TMPDIR}/calls SM_FLUSH_SETTLE_SECONDS=${SM_FLUSH_SETTLE_SECONDS:-1}
    export SM_FLUSH_TIMEOUT_SECONDS=${SM_FLUSH_TIMEOUT_SECONDS:-20}
    mkdir -p "${SM_JOBDIR}"
    SM_CMD=(sh -c 'exit 0')
    libs
    "$@"
  )
}

# calls FIELDS: the wrapper calls the fake recorded, one per line (python expression over r).
calls() {
  "${SM_PYTHON}" -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(eval(sys.argv[2]))' "${BATS_TEST_TMPDIR}/calls/nsight-slurm.jsonl" "$1"
}

@test "configure sequence: in order, once per job, state under the log dir, head IPv4 for the CLI only" {
  run nsight_batch profile::before_steps
  assert_success
  run calls '" ".join(r["argv"][1:3]), r["env"]["SLURMD_NODENAME"], r["env"]["SLURM_SUBMIT_DIR"]'
  local job=${BATS_TEST_TMPDIR}/job
  assert_output "$(printf "%s\n" "('configure tool-path', '127.0.0.1', '${job}')" "('configure tool-command', '127.0.0.1', '${job}')" \
    "('configure profiling-mode', '127.0.0.1', '${job}')" "('configure tool-options', '127.0.0.1', '${job}')" \
    "('configure report-output', '127.0.0.1', '${job}')" "('disable pyxis', '127.0.0.1', '${job}')" \
    "('coordinator start', '127.0.0.1', '${job}')" "('configure', '127.0.0.1', '${job}')")"
  # The tool options end with OUR -o, next to (not inside) the report workspace.
  run calls 'r["argv"][1:3] == ["configure", "tool-options"] and r["argv"][-3:]'
  assert_line "['--wait=primary', '-o', '${job}/nsight-slurm-direct/%q{SLURM_JOB_ID}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID}']"
  run e2e_json "${job}/.nsight-slurm/jobs/4242/coordinator.json" 'd["endpoint"].rsplit(":", 1)[0]'
  assert_output "tcp://127.0.0.1"
  # Every call and its output is in nsight-slurm.out, and so is the worker step's launcher.
  run grep -c '^+ env SLURM_SUBMIT_DIR=' "${job}/nsight-slurm.out"
  assert_output 9
  run grep -A1 'worker step' "${job}/nsight-slurm.out"
  assert_output --regexp "\+ env SLURM_SUBMIT_DIR=${job} ${NSIGHT_HOME}/bin/nsight-slurm srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=0 --no-kill --label -- ${REPO_ROOT}/bin/sm-node --jobdir ${job} -- sh -c 'exit 0'"
  run cat "${job}/nsight-slurm.out"
  assert_output --partial "[Nsight] coordinator started: tcp://127.0.0.1:"
}

# e2e_json FILE EXPR: a Python expression over the parsed JSON file (bound to d).
e2e_json() { "${SM_PYTHON}" -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

@test "running the configure sequence again reuses the coordinator and keeps the config" {
  run nsight_batch profile::before_steps
  assert_success
  local job=${BATS_TEST_TMPDIR}/job pid config
  pid=$(e2e_json "${job}/.nsight-slurm/jobs/4242/coordinator.json" 'd["pid"]')
  config=$(cat "${job}/.nsight-slurm/jobs/4242/config.json")
  touch "${job}/nsight-slurm-reports/from-the-first-run" # a non-empty workspace by now
  run nsight_batch profile::before_steps
  assert_success
  assert_output --partial "coordinator already running"
  assert_equal "$(e2e_json "${job}/.nsight-slurm/jobs/4242/coordinator.json" 'd["pid"]')" "${pid}"
  assert_equal "$(cat "${job}/.nsight-slurm/jobs/4242/config.json")" "${config}"
  # In one batch shell the second call does not even talk to the wrapper.
  run nsight_batch eval 'profile::nsight_setup && profile::nsight_setup'
  assert_success
  assert_output --partial "nsight-slurm: already configured for job 4242"
}

@test "the launcher's environment keeps the task's own SLURMD_NODENAME; the wrapper adds --export=ALL" {
  # A recording srun, found by the fake wrapper on PATH.
  printf '#!/bin/sh\nenv >%q/srun.env\nprintf "%%s\\n" "$@" >%q/srun.argv\n' "${BATS_TEST_TMPDIR}" "${BATS_TEST_TMPDIR}" >shim/srun
  chmod +x shim/srun
  run nsight_batch eval 'profile::before_steps && launch::step_argv && "${LAUNCH_ARGV[@]}"'
  assert_success
  run grep -E '^(SLURMD_NODENAME|SLURM_SUBMIT_DIR|TLLM_PROFILE_LOG_RANKS|DYN_ENABLE_RUST_NVTX)=' "${BATS_TEST_TMPDIR}/srun.env"
  assert_line "SLURMD_NODENAME=node1"
  assert_line "SLURM_SUBMIT_DIR=${BATS_TEST_TMPDIR}/job"
  assert_line "TLLM_PROFILE_LOG_RANKS=all"
  assert_line "DYN_ENABLE_RUST_NVTX=1"
  run grep -c -- '--export' "${BATS_TEST_TMPDIR}/srun.argv"
  assert_output 1
  run cat "${BATS_TEST_TMPDIR}/srun.argv"
  assert_line --index 5 -- '--export=ALL'
  assert_line --index 6 -- '--job-name=nsight-slurm-connector'
  assert_line --index 7 "${NSIGHT_HOME}/bin/nsight-slurm-connector"
  assert_line --index 8 "${REPO_ROOT}/bin/sm-node"
}

@test "the head node's IPv4: not loopback, not link-local; hostname -I as the fallback" {
  run bash -c '
    source "${REPO_ROOT}/lib/profile.sh"
    hostname() { [[ ${1:-} == -I ]] && echo "169.254.1.1 10.0.0.7 fd00::1" || echo node1; }
    getent() { printf "127.0.1.1 STREAM node1\n10.77.0.11 STREAM\n"; }
    profile::head_ipv4; echo
    getent() { return 2; }
    profile::head_ipv4; echo
    SM_NSIGHT_COORDINATOR_ADDR=192.0.2.1 profile::head_ipv4'
  assert_output "$(printf '%s\n' 10.77.0.11 10.0.0.7 192.0.2.1)"
}

@test "a broken nsight-slurm install fails the batch step before any srun" {
  mkdir -p badhome/bin
  printf '#!/bin/sh\necho srun-called >>%q/srun-called\n' "${BATS_TEST_TMPDIR}" >shim/srun
  chmod +x shim/srun
  # The job plan checks the install (slurm_multi.settings): the batch step stops before anything runs.
  SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=1 run bash "${REPO_ROOT}/sbatch/multi.sbatch" --runtime none \
    --profile nsight-slurm --nsight-slurm-home "${PWD}/badhome" --out "${PWD}/out" -- true
  assert_failure 2
  assert_output --partial "badhome/bin/nsight-slurm is missing or not executable"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/srun-called"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/calls/nsight-slurm.jsonl"
}

# ---- the teardown flush ---------------------------------------------------------------------

@test "two concurrent cleanup triggers: the flush runs once, and neither signals a step before it ends" {
  export SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=4242 FAKE_STEPS="4242.0|sm-node"
  mkdir -p "${SM_JOBDIR}"
  # trigger NAME: what job::stop_step does from the watch loop or a trap, in its own process.
  trigger() {
    (
      libs
      # shellcheck disable=SC2329 # called as a pre-cleanup hook
      slow_flush() {
        printf '%s flush-start %s\n' "$(date +%s.%N)" "$1" >>"${TRACE}"
        sleep 2
        printf '%s flush-end\n' "$(date +%s.%N)" >>"${TRACE}"
      }
      teardown::add_pre_hook slow_flush
      job::stop_step "$1"
    ) 2>>"${BATS_TEST_TMPDIR}/$1.log"
  }
  trigger watch-loop &
  local first=$!
  sleep 0.3
  trigger sigterm &
  wait "${first}" "$!"
  run grep -c flush-start "${TRACE}"
  assert_output 1
  run awk '$2 == "flush-end" { end = $1 } $2 == "scancel" { n++; if ($1 < end || !end) bad++ } END { print n + 0, bad + 0 }' "${TRACE}"
  assert_output "2 0"
  run grep -h "waiting for it before going on" "${BATS_TEST_TMPDIR}/sigterm.log"
  assert_success
  run grep -h "scancel --signal=TERM 4242.0" "${BATS_TEST_TMPDIR}/watch-loop.log" "${BATS_TEST_TMPDIR}/sigterm.log"
  assert_equal "${#lines[@]}" 2
}

@test "a signal during the flush does not cut it short; the old traps come back afterwards" {
  export SM_JOBDIR=${BATS_TEST_TMPDIR}/job
  mkdir -p "${SM_JOBDIR}"
  # Its own process group, signalled as a whole like scancel does: the hook's children too.
  setsid bash -c '
    for lib in log util teardown; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    trap "echo handler-ran >>${TRACE}" TERM
    flush() { echo flush-start >>"${TRACE}"; sleep 1.5; echo flush-end >>"${TRACE}"; }
    reenter() { teardown::pre_cleanup "again, from a trap"; echo reentered-returned >>"${TRACE}"; }
    teardown::add_pre_hook flush
    teardown::add_pre_hook reenter
    teardown::pre_cleanup test
    trap -p TERM >>"${TRACE}"
  ' 2>"${BATS_TEST_TMPDIR}/err" &
  local pid=$!
  sleep 0.5
  kill -TERM -- "-${pid}"
  local i
  for ((i = 0; i < 100; i++)); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pid}" 2>/dev/null; then
    kill -KILL -- "-${pid}"
    fail "pre-cleanup deadlocked (re-entered from its own hook)"
  fi
  wait "${pid}" || true
  run cat "${TRACE}"
  assert_output "$(printf '%s\n' flush-start flush-end reentered-returned "trap -- 'echo handler-ran >>${TRACE}' SIGTERM")"
  assert_file_exists "${SM_JOBDIR}/.pre-cleanup.done"
}

@test "nsight flush: stop, SIGTERM to the connector steps when nothing new appears, wait, then coordinator stop" {
  local job=${BATS_TEST_TMPDIR}/job
  mkdir -p "${job}/node_0" "${job}/node_1"
  : >"${job}/node_0/node.log"
  : >"${job}/node_1/node.log"
  export FAKE_STEPS="4242.0|batch 4242.3|nsight-slurm-connector 4242.4|nsight-slurm-connector"
  export FAKE_REPORTS_ON_TERM="${job}/nsight-slurm-direct/4242_node1_rank0.nsys-rep ${job}/nsight-slurm-direct/4242_node2_rank1.nsys-rep"
  run nsight_batch eval 'sleep 60 & JOB_SRUN_PID=$!; profile::before_steps &&
    teardown::pre_cleanup "a step died" && teardown::post_cleanup; kill "${JOB_SRUN_PID}"'
  assert_success
  # The order, over the wrapper calls and the Slurm commands, by time.
  run bash -c "{ '${SM_PYTHON}' -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(\"%.6f nsight-slurm %s\" % (r[\"time\"], \" \".join(r[\"argv\"][1:3])))' '${BATS_TEST_TMPDIR}/calls/nsight-slurm.jsonl'; grep scancel '${TRACE}'; } | sort -n | cut -d' ' -f2- | sed -n '/stop --job/,\$p'"
  assert_output "$(printf '%s\n' 'nsight-slurm stop --job' 'scancel --signal=TERM 4242.3' 'scancel --signal=TERM 4242.4' \
    'nsight-slurm coordinator stop')"
}

@test "nsight flush: reports rescued from the runtime workspace count; no SIGTERM when new ones appear" {
  local job=${BATS_TEST_TMPDIR}/job
  mkdir -p "${job}/node_0" "${job}/nsight-slurm-runtime/rank0"
  : >"${job}/node_0/node.log"
  head -c 2048 /dev/zero >"${job}/nsight-slurm-runtime/rank0/session.nsys-rep"
  export FAKE_STEPS="4242.3|nsight-slurm-connector"
  export FAKE_REPORTS_ON_TERM=
  run nsight_batch eval 'sleep 60 & JOB_SRUN_PID=$!; profile::before_steps || exit
    (sleep 0.5; head -c 4096 /dev/zero >"${SM_JOBDIR}/nsight-slurm-direct/4242_node1_rank0.nsys-rep") &
    teardown::pre_cleanup "normal end"; kill "${JOB_SRUN_PID}"'
  assert_success
  assert_file_exists "${job}/nsight-slurm-reports/rescued/rank0_session.nsys-rep"
  assert_output --partial "rescued ${job}/nsight-slurm-runtime/rank0/session.nsys-rep"
  assert_output --partial "profile: flush: 1 report(s) settled"
  run grep -c scancel "${TRACE}"
  assert_output 0
}

@test "nsys flush: SIGTERM to the running step first, then every started rank's report settles" {
  local job=${BATS_TEST_TMPDIR}/job
  mkdir -p "${job}/node_0" "${job}/node_1" "${job}/profile"
  : >"${job}/node_0/.profile-nsys"
  : >"${job}/node_1/.profile-nsys"
  export FAKE_STEPS="4242.0|sm-node"
  export FAKE_REPORTS_ON_TERM="${job}/profile/4242_node1_rank0.nsys-rep ${job}/profile/4242_node2_rank1.nsys-rep"
  run nsight_batch eval 'export SM_PROFILE=nsys SM_RUNTIME=docker; sleep 60 & JOB_SRUN_PID=$!;
    profile::before_steps && teardown::pre_cleanup "SIGTERM (scancel or time limit)"; kill "${JOB_SRUN_PID}"'
  assert_success
  assert_output --partial "flush (SIGTERM (scancel or time limit)): waiting for 2 nsys report(s) in ${job}/profile"
  assert_output --partial "reports: 2/2 settled"
  assert_output --partial "profile: flush: 2 report(s) settled in ${job}/profile"
  run grep -c 'scancel --signal=TERM 4242.0' "${TRACE}"
  assert_output 1
}

@test "no flush when the worker step never started (the setup failed first)" {
  run nsight_batch eval 'export SM_PROFILE=nsys SM_RUNTIME=docker; profile::before_steps && teardown::pre_cleanup "setup failed"'
  assert_success
  assert_output --partial "flush: the worker step never started; no reports to wait for"
  assert_file_not_exists "${TRACE}"
}

@test "nsys flush: reports from before the job never count toward the ranks' reports" {
  local job=${BATS_TEST_TMPDIR}/job
  mkdir -p "${job}/node_0" "${job}/node_1" "${job}/profile"
  : >"${job}/node_0/.profile-nsys"
  : >"${job}/node_1/.profile-nsys"
  # A reused --profile-dir: an earlier job's two settled reports, as many as this job's ranks.
  head -c 4096 /dev/zero >"${job}/profile/4100_node1_rank0.nsys-rep"
  head -c 4096 /dev/zero >"${job}/profile/4100_node2_rank1.nsys-rep"
  export FAKE_STEPS="4242.0|sm-node"
  export FAKE_REPORTS_ON_TERM="${job}/profile/4242_node1_rank0.nsys-rep" # rank 1 never writes
  SM_FLUSH_TIMEOUT_SECONDS=3 run nsight_batch eval 'export SM_PROFILE=nsys SM_RUNTIME=docker; sleep 60 & JOB_SRUN_PID=$!;
    profile::before_steps && teardown::pre_cleanup "SIGTERM (scancel or time limit)"; kill "${JOB_SRUN_PID}"'
  assert_success
  assert_output --partial "reports snapshot ${job}/profile --out ${job}/.profile-baseline.json"
  assert_output --partial "--since-file ${job}/.profile-baseline.json"
  assert_output --partial "2 file(s) unchanged since before the job: not counted"
  assert_output --partial "1/2 settled"
  assert_output --partial "flush: not every report settled"
  run e2e_json "${job}/.profile-baseline.json" 'sorted(p.rsplit("/", 1)[1] for p in d["files"])'
  assert_output "['4100_node1_rank0.nsys-rep', '4100_node2_rank1.nsys-rep']"
}

@test "nsight flush: a report rewritten under its old name after the stop is new (a requeued job): no SIGTERM" {
  local job=${BATS_TEST_TMPDIR}/job
  mkdir -p "${job}/node_0" "${job}/nsight-slurm-direct"
  : >"${job}/node_0/node.log"
  # The first run of job 4242 left its report; the requeued run (same id) rewrites it in place.
  head -c 2048 /dev/zero >"${job}/nsight-slurm-direct/4242_node1_rank0.nsys-rep"
  touch -d '1 hour ago' "${job}/nsight-slurm-direct/4242_node1_rank0.nsys-rep"
  export FAKE_STEPS="4242.3|nsight-slurm-connector"
  export FAKE_REPORTS_ON_TERM=
  run nsight_batch eval 'sleep 60 & JOB_SRUN_PID=$!; profile::before_steps || exit
    (for _ in $(seq 200); do [[ -f ${SM_JOBDIR}/.profile-prestop.json ]] && break; sleep 0.05; done
     head -c 8192 /dev/zero >"${SM_JOBDIR}/nsight-slurm-direct/4242_node1_rank0.nsys-rep") &
    teardown::pre_cleanup "normal end"; kill "${JOB_SRUN_PID}"'
  assert_success
  assert_output --partial "flush (normal end): 0 report(s) of this job before the stop"
  assert_output --partial "profile: flush: 1 report(s) settled"
  run grep -c scancel "${TRACE}"
  assert_output 0
}

@test "a node ignores its own rank's report from an earlier run until this run rewrites it" {
  mkdir -p job/profile
  head -c 4096 /dev/zero >job/profile/4242_node2_rank1.nsys-rep
  touch -d '1 hour ago' job/profile/4242_node2_rank1.nsys-rep
  # node_after_run: the batch step's snapshot, then this rank's wait after its workload ended.
  node_after_run() {
    bash -c '
      for lib in log util settings profile; do source "${REPO_ROOT}/lib/${lib}.sh"; done
      export SM_JOBDIR=${PWD}/job SM_PROFILE=nsys SLURM_PROCID=1 SM_FLUSH_SETTLE_SECONDS=1 SM_FLUSH_TIMEOUT_SECONDS=3
      [[ -f job/.profile-baseline.json ]] || profile::take_baseline || exit
      PROFILE_NODE_ACTIVE=1 RUN_EXIT=143
      "$@"
      profile::after_run' node_after_run "$@" 2>&1
  }
  run node_after_run true
  assert_success
  assert_output --partial "--since-file ${PWD}/job/.profile-baseline.json"
  assert_output --partial "1 file(s) unchanged since before the job: not counted"
  assert_output --partial "nsys report of rank 1 did not settle within 3 s"
  run node_after_run eval 'head -c 8192 /dev/zero >job/profile/4242_node2_rank1.nsys-rep'
  assert_success
  assert_output --partial "nsys report of rank 1 settled"
}

# ---- node side ------------------------------------------------------------------------------

@test "after the run a node waits for its OWN rank's report: rank1, not rank10 or rank11" {
  mkdir -p job/profile
  head -c 4096 /dev/zero >job/profile/4242_node2_rank1.nsys-rep
  : >job/profile/4242_node3_rank10.nsys-rep # another rank's report, still empty
  mkdir -p job/node_1
  run bash -c '
    for lib in log util settings timeline profile; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    export SM_JOBDIR=${PWD}/job SM_NODE_DIR=${PWD}/job/node_1 SLURM_PROCID=1 SM_FLUSH_SETTLE_SECONDS=1 SM_FLUSH_TIMEOUT_SECONDS=10
    PROFILE_NODE_ACTIVE=1 RUN_EXIT=143
    profile::after_run; profile::after_run'
  assert_success
  assert_output --partial "--pattern '*_rank1.nsys-rep' --expect 1 --settle-seconds 1"
  assert_output --partial "nsys report of rank 1 settled"
  run grep -c "reports wait" <<<"${output}"
  assert_output 1
  # The wait is on the node's timeline, once, with its outcome.
  run awk '{ print $2, $NF }' job/node_1/events.log
  assert_output "$(printf '%s\n' "profile_flush_start host=$(hostname)" "profile_flush_end settled=1")"
}

@test "the batch step's flush events go to its own batch/events.log (rank 0's lane): node_0/events.log is rank 0's task's alone" {
  mkdir -p job/node_0
  printf 'rank 0s task\n' >job/node_0/events.log
  run bash -c '
    for lib in log util settings timeline profile; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    export SM_JOBDIR=${PWD}/job SM_NODE_DIR=${PWD}/job/node_1 SM_RANK=3
    profile::job_event nsight_flush_end settled=1 expected=4'
  assert_success
  run awk '{ print $2, $3, $NF }' job/batch/events.log
  assert_output "nsight_flush_end rank=0 expected=4"
  assert_equal "$(cat job/node_0/events.log)" "rank 0s task"
  assert_file_not_exists job/node_1/events.log
}

@test "a container that never started, or nsys not found (125-127), waits for no report and says so" {
  local code
  for code in 125 127; do
    mkdir -p job/node_0
    : >job/node_0/.profile-nsys
    run bash -c '
      for lib in log util settings profile; do source "${REPO_ROOT}/lib/${lib}.sh"; done
      export SM_JOBDIR=${PWD}/job SM_NODE_DIR=${PWD}/job/node_0 SLURM_PROCID=0 SM_FLUSH_TIMEOUT_SECONDS=600
      PROFILE_NODE_ACTIVE=1 RUN_EXIT='"${code}"' RUN_DOCKER_PID=
      profile::after_run'
    assert_success
    refute_output --partial "reports wait"
    assert_output --partial "rank 0: the workload never ran under nsys (exit ${code}); no report"
    # ... and the batch step's flush does not wait for this rank either.
    assert_file_not_exists job/node_0/.profile-nsys
  done
}

# ---- dry run -------------------------------------------------------------------------------

@test "the dry-run Profiling panel: type, runtime, window, launcher argv, tool options, report output" {
  run dry --runtime pyxis --profile nsight-slurm --nsight-slurm-home "${NSIGHT_HOME}" --framework trtllm \
    --profile-start-iter 100 --profile-stop-iter 120 --nvtx-injection-path /opt/nvtx/libinject.so
  assert_success
  assert_output --regexp "type +nsight-slurm"
  assert_output --regexp "runtime +pyxis"
  assert_output --regexp "window +iterations 100-120 \(TLLM_PROFILE_START_STOP=100-120\)"
  # The worker step is the batch step's line, shown once (under pyxis the wrapper is per rank step).
  refute_output --regexp "worker step +srun"
  # Each node's rank step goes through the wrapper, the connector in the ONE --container-mounts.
  assert_output --regexp "  env SLURM_SUBMIT_DIR=[^ ]*/toy_model/DRYRUN .*/nsight-slurm-home/bin/nsight-slurm srun --overlap --nodes=1 .* --container-mounts=[^ ]*nsight-slurm-connector[^ ]* --container-workdir=/myworkspace/run_directory -- sh -c .* sm-rank bash run.sh --steps 20"
  assert_output --regexp "tool options +-t cuda-sw,nvtx,python-gil --cuda-graph-trace=graph --sample=none --cpuctxsw=none --wait=primary -o '[^ ]*/DRYRUN/nsight-slurm-direct/"
  assert_output --regexp "report output +[^ ]*/DRYRUN/nsight-slurm-reports \(workspace\)"
  assert_output --regexp "profiling mode +cuda-api"
  assert_output --partial "nsight-slurm coordinator start"
  assert_output --partial "worker env       TLLM_PROFILE_START_STOP=100-120 TLLM_PROFILE_LOG_RANKS=all DYN_ENABLE_RUST_NVTX=1 NVTX_INJECTION64_PATH=/opt/nvtx/libinject.so"
  run dry --profile nsys --nsys-host-path "${REPO_ROOT}/tests/fakes/nsys"
  assert_success
  assert_output --regexp "nsys prefix +/opt/slurm-multi/bin/nsys profile -t cuda-sw"
  assert_output --regexp "report output +[^ ]*/DRYRUN/profile/%q\{SLURM_JOB_ID\}_%q\{SLURMD_NODENAME\}_rank%q\{SLURM_PROCID\}.nsys-rep \(one per rank\)"
  # The per-node docker argv shows nsys in front of the workload too.
  assert_output --regexp "toy/model:local sh -c .* sm-model /opt/slurm-multi/bin/nsys profile .* bash run.sh --steps 20"
  run dry
  assert_success
  assert_output --regexp "type +none"
  assert_output --regexp "window +\(profiling off\)"
}

@test "pyxis: the settle window is sized to fit Slurm's KillWait, with a warning, and the dry run says so" {
  run bash -c 'for lib in log util settings profile; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    export SM_RUNTIME=pyxis SM_PROFILE=nsys
    fit() { SM_RUNTIME=$1 SM_FLUSH_SETTLE_SECONDS=60 SM_KILLWAIT=$2; profile::fit_killwait warn; echo "$1 $2 -> ${SM_FLUSH_SETTLE_SECONDS}"; }
    fit pyxis 60; fit pyxis 30; fit pyxis 10; fit pyxis 300; fit docker 30'
  assert_success
  assert_line "pyxis 60 -> 40"
  assert_line "pyxis 30 -> 10"
  assert_line "pyxis 10 -> 5"
  assert_line "pyxis 300 -> 60"
  assert_line "docker 30 -> 60"
  assert_output --partial "Slurm's KillWait is 30 s: under pyxis a cancelled rank's nsys is SIGKILLed then, so the settle window 60 s is cut to 10 s"
  SM_KILLWAIT=30 run dry --runtime pyxis --profile nsys
  assert_success
  assert_output --regexp "killwait +WARNING: Slurm's KillWait is 30 s"
  SM_KILLWAIT=300 run dry --runtime pyxis --profile nsys
  assert_output --regexp "killwait +300 s: the settle window 60 s fits"
}

@test "bare metal: a rank whose nsys session already started counts before its sm-node wrote node.log" {
  run bash -c 'for lib in log util settings profile launch; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    export SM_RUNTIME=none SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77
    d=${SM_JOBDIR}/nsight-slurm-direct
    mkdir -p "${d}" "${SM_JOBDIR}"/node_{0,1,2}
    touch "${SM_JOBDIR}"/node_{0,1,2}/node.log
    touch "${d}/77_node1_rank0.nsys-rep" "${d}/77_node1_rank1.qdstrm" "${d}/77_node2_rank3.qdstrm" \
      "${d}/77_node2_rank2.qdstrm" "${d}/77_node2_rank2.nsys-rep" "${d}/76_node1_rank0.nsys-rep"
    profile::_expected_nsight_reports; echo
    rm -f "${d}"/*; profile::_expected_nsight_reports; echo'
  assert_success
  assert_line --index 0 4
  assert_line --index 1 3
}
