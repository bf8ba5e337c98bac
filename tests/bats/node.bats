#!/usr/bin/env bats
# bin/sm-node and its libraries, without a cluster: a docker shim records every call, the fake
# amd-smi stands in for the GPUs. The seam's regression tests live here: whenever a helper fails,
# the node fails with the helper's own one-line reason in status.json and node.log, and no
# container starts.

load helpers

teardown() {
  [[ -z ${FAKE_ENGINE_PID:-} ]] || kill "${FAKE_ENGINE_PID}" 2>/dev/null || true
}

setup() {
  export SM_JOBDIR=${BATS_TEST_TMPDIR}/job TMPDIR=${BATS_TEST_TMPDIR}/tmp
  mkdir -p "${TMPDIR}" "${BATS_TEST_TMPDIR}/shim"
  # docker: `version` and `image inspect` answer, everything is recorded with the client's env.
  export SHIM_DIR=${BATS_TEST_TMPDIR}
  cat >"${BATS_TEST_TMPDIR}/shim/docker" <<'EOF'
#!/bin/bash
printf '%s\n' "$*" >>"${SHIM_DIR}/docker-calls"
printf 'DOCKER_HOST=%s LD_LIBRARY_PATH=%s PYTHONHOME=%s HF_TOKEN=%s\n' "${DOCKER_HOST-unset}" "${LD_LIBRARY_PATH-unset}" \
  "${PYTHONHOME-unset}" "${HF_TOKEN-unset}" >>"${SHIM_DIR}/docker-env"
id=sha256:1111111111111111111111111111111111111111111111111111111111111111
case "$1 $2" in
  "version "*) echo 24.0.7 ;;
  "image inspect")
    [[ -f ${SHIM_DIR}/no-image ]] && exit 1
    if [[ $* == *Labels* ]]; then echo "${id} "; else echo "${id}"; fi ;;
  "build "*) rm -f "${SHIM_DIR}/no-image"; echo sha256:2222 ;;
  "run "*)
    # A run that fails (run-exit), its engine dying under it first (engine-dies: the socket goes).
    if [[ -f ${SHIM_DIR}/run-exit ]]; then
      [[ ! -f ${SHIM_DIR}/engine-dies ]] || rm -f "${DOCKER_HOST#unix://}"
      exit "$(<"${SHIM_DIR}/run-exit")"
    fi
    echo "toy workload ran" ;;
  *) exit 1 ;;
esac
EOF
  chmod +x "${BATS_TEST_TMPDIR}/shim/docker"
  # The engine's socket, as prepare asks it (GET /_ping): a tiny stand-in that answers OK.
  export DOCKER_HOST=unix://${BATS_TEST_TMPDIR}/docker.sock
  "${SM_PYTHON}" - "${BATS_TEST_TMPDIR}/docker.sock" <<'PY' &
import os, socket, sys
path = sys.argv[1]
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen(16)
server.settimeout(300)
while True:
    try:
        conn, _ = server.accept()
    except OSError:
        break
    with conn:
        conn.recv(1024)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nOK")
PY
  FAKE_ENGINE_PID=$!
  for _ in $(seq 100); do [[ -S ${BATS_TEST_TMPDIR}/docker.sock ]] && break; sleep 0.05; done
  export PATH="${BATS_TEST_TMPDIR}/shim:${PATH}"
  unset SLURM_JOB_ID SLURM_NODEID SLURM_JOB_NODELIST SM_BARRIER_TOKEN
  export SLURM_JOB_ID=77 SLURM_NNODES=1 SM_RANK=0 SLURMD_NODENAME=node1 SM_PYTHON_CHECKED=1
}

# manifest FILE CONTEXT_JSON [MODEL_EXTRA_JSON]: a one-model build manifest.
manifest() {
  cat >"$1" <<EOF
{"built_images": {"m": {"docker_image": "toy/model:local", "dockerfile": "${REPO_ROOT}/examples/toy/Dockerfile"}},
 "built_models": {"m": {"name": "toy_model", "scripts": "run.sh", "args": "--steps 2",
   "dockerfile": "${REPO_ROOT}/examples/toy/Dockerfile", "dockercontext": "${REPO_ROOT}/examples/toy",
   "multiple_results": "perf_toy.csv" ${3:+, $3}}},
 "context": $2}
EOF
}

# node_task: the whole task of rank 0 of a single-node job (what srun starts).
node_task() {
  run "${REPO_ROOT}/bin/sm-node" --jobdir "${SM_JOBDIR}"
}

status_field() {
  "${SM_PYTHON}" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "${SM_JOBDIR}/node_0/status.json" "$1"
}

refute_container_started() {
  if [[ -f ${BATS_TEST_TMPDIR}/docker-calls ]]; then
    run grep -c '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
    assert_output 0
    # Nor asked the engine about a container that cannot exist: the engine may be what failed, and
    # a hung one answers nothing, ever (the task, and the job, hung in its exit path).
    run grep -E '^(container inspect|rm|stop|cp) ' "${BATS_TEST_TMPDIR}/docker-calls"
    assert_output ""
  fi
}

@test "sm-node --help explains every stage and --from-job; an unknown stage or option exits 2 with a one-line error" {
  run "${REPO_ROOT}/bin/sm-node" --help
  assert_success
  for s in prepare fitness image barrier run save-outputs; do assert_line --regexp "^  ${s} "; done
  assert_output --partial "--from-job JOBDIR --rank R --stage NAME"
  run "${REPO_ROOT}/bin/sm-node" --stage bogus --jobdir /tmp/x
  assert_failure 2
  assert_output --partial "unknown stage 'bogus'"
  run "${REPO_ROOT}/bin/sm-node" --frobnicate
  assert_failure 2
  # One line, no log prefix, no usage dump (that is --help's).
  assert_output "sm-node: unknown option '--frobnicate'; bin/sm-node --help shows the usage"
  # A job dir that is not one: our line, not an internal helper's click usage block.
  run "${REPO_ROOT}/bin/sm-node" --from-job /nonexistent --rank 0 --stage run
  assert_failure 2
  assert_output --regexp "^sm-node: --from-job /nonexistent: no job.json there; give a job's dir [^$]*$"
  refute_output --partial "Usage:"
  # Every stage the help offers (and each node log's re-run line names) is one --stage takes.
  for s in prepare fitness image barrier run save-outputs; do
    run "${REPO_ROOT}/bin/sm-node" --from-job /nonexistent --rank 0 --stage "${s}"
    assert_failure 2
    assert_output --partial "--from-job /nonexistent: no job.json there"
  done
  run "${REPO_ROOT}/bin/sm-node" --stage "prepare image" --jobdir /tmp/x
  assert_failure 2
  assert_output --partial "unknown stage 'prepare image'"
  # A wrong SM_HOME: our one line, no bash "No such file or directory" before it.
  SM_HOME=/nonexistent run "${REPO_ROOT}/bin/sm-node" --help
  assert_failure 2
  assert_output "sm-node: cannot load /nonexistent/lib/log.sh; is SM_HOME right?"
}

@test "a whole single-node task runs prepare, fitness, image, barrier, run, save-outputs and writes status.json" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"docker_env_vars": {"TOY_MODE": "demo"}}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  assert_equal "$(status_field status)" ok
  run "${SM_PYTHON}" -c 'import json,sys; print(list(json.load(open(sys.argv[1]))["stages"]))' "${SM_JOBDIR}/node_0/status.json"
  assert_output "['prepare', 'fitness', 'image', 'barrier', 'run', 'save-outputs']"
  run grep -c '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output 1
  # Nothing of the job stays on the node: the scratch dir (env file, secrets) is gone.
  assert_not_exists "${TMPDIR}/slurm-multi.77.r0"
}

@test "a run that fails on a healthy node is the workload's; one whose docker engine died under it is the node's (node_fault)" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{}'
  echo 3 >"${BATS_TEST_TMPDIR}/run-exit"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 3
  assert_equal "$(status_field reason)" "container exited 3"
  run "${SM_PYTHON}" -c 'import json,sys; print("node_fault" in json.load(open(sys.argv[1])))' "${SM_JOBDIR}/node_0/status.json"
  assert_output False
  # The engine dies during the run: docker run exits 125, and the engine no longer answers.
  echo 125 >"${BATS_TEST_TMPDIR}/run-exit"
  : >"${BATS_TEST_TMPDIR}/engine-dies"
  rm -rf "${SM_JOBDIR}"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 125
  run status_field node_fault
  assert_output --regexp "^the docker engine on .* stopped answering during the run \(${BATS_TEST_TMPDIR}/docker.sock: "
  run status_field reason
  assert_output --regexp "^the docker engine on .* stopped answering during the run .*: container exited 125$"
  run grep -c "this node's own fault: the docker engine" "${SM_JOBDIR}/node_0/node.log"
  assert_output 1
}

@test "every rank's container is told its attempt: SM_ATTEMPT, and SLURM_RESTART_COUNT once Slurm sets it" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{}'
  SM_ATTEMPT=1 SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  run grep '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output --partial " -e SM_ATTEMPT=1 "
  refute_output --partial "SLURM_RESTART_COUNT"
  rm -f "${BATS_TEST_TMPDIR}/docker-calls"
  SM_ATTEMPT=3 SLURM_RESTART_COUNT=2 SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  run grep '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output --partial " -e SLURM_RESTART_COUNT=2 "
  assert_output --partial " -e SM_ATTEMPT=3 "
}

@test "GPUs asked for that the node lacks: the node fails with both lists, no container starts" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"gpu_vendor": "AMD", "docker_gpus": "0-7"}'
  # The fake amd-smi; the shim stays the docker (tests/fakes has a docker of its own).
  FAKE_AMDSMI_GPUS=4 PATH="${BATS_TEST_TMPDIR}/shim:${REPO_ROOT}/tests/fakes:${PATH}" SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 2
  run status_field reason
  assert_output --regexp "GPUs? 4-7 .*asked for.*0-3"
  run grep -c "GPUs\? 4-7" "${SM_JOBDIR}/node_0/node.log"
  refute_output 0
  refute_container_started
}

@test "an AMD manifest on a node with no GPUs fails; it never runs without them" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"gpu_vendor": "AMD"}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 2
  run status_field reason
  assert_output --partial "AMD"
  refute_container_started
}

@test "an amd-smi render node N/A fails the node with the GPU named; no container starts" {
  mkdir -p "${BATS_TEST_TMPDIR}/na"
  printf '#!/bin/sh\necho %s\n' "'[{\"gpu\": 0, \"bdf\": \"0000:0c:00.0\", \"render\": \"renderD128\"}, {\"gpu\": 1, \"bdf\": \"0000:1c:00.0\", \"render\": \"N/A\"}]'" >"${BATS_TEST_TMPDIR}/na/amd-smi"
  chmod +x "${BATS_TEST_TMPDIR}/na/amd-smi"
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"gpu_vendor": "AMD"}'
  PATH="${BATS_TEST_TMPDIR}/na:${PATH}" SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 2
  run status_field reason
  assert_output --regexp "GPU 1.*render"
  refute_container_started
}

@test "an unbalanced quote in the model args fails the node; the workload never runs with its args cut short" {
  cat >"${BATS_TEST_TMPDIR}/m.json" <<'EOF'
{"built_images": {"m": {"docker_image": "toy/model:local"}},
 "built_models": {"m": {"name": "toy_model", "scripts": "run.sh", "args": "--steps 2 --name 'unterminated"}}}
EOF
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 2
  run status_field reason
  assert_output --partial "cannot be split into words"
  refute_container_started
}

@test "a manifest mount that cannot be honoured fails the node; our /sm-out mount is never dropped" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"docker_mounts": {"relative/path": "/data"}}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 2
  run status_field reason
  assert_output --partial "docker_mounts relative/path"
  refute_container_started
  # A manifest option that mounts over /sm-out loses to ours (results are never displaced).
  rm -rf "${SM_JOBDIR}" "${BATS_TEST_TMPDIR}/docker-calls"
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"docker_mounts": {"/data": "/shared/data"}}' '"additional_docker_run_options": "-v /elsewhere:/sm-out"'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  run grep '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output --regexp "-v ${TMPDIR}/slurm-multi.77.r0/output:/sm-out "
  assert_output --partial "-v /shared/data:/data"
  refute_output --partial "/elsewhere:/sm-out"
}

@test "the manifest's env reaches the container only: PYTHONHOME, DOCKER_HOST, LD_LIBRARY_PATH never reach the toolkit" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"docker_env_vars": {"PYTHONHOME": "/nonexistent", "DOCKER_HOST": "tcp://192.0.2.1:1", "LD_LIBRARY_PATH": "/nonexistent/lib", "TOY_MODE": "a b \"c\""}}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  assert_equal "$(status_field status)" ok
  # Every docker client call (and the helpers after prepare, which would fail with that
  # PYTHONHOME) ran without them: the toolkit's own DOCKER_HOST, not the manifest's.
  run grep -v "DOCKER_HOST=${DOCKER_HOST} LD_LIBRARY_PATH=unset PYTHONHOME=unset" "${BATS_TEST_TMPDIR}/docker-env"
  assert_output ""
  # The container gets them, through --env-file.
  run grep '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output --partial "--env-file ${TMPDIR}/slurm-multi.77.r0/container.env"
}

@test "a literal secret in docker_build_arg is in no log line and no argv: it is passed by name" {
  touch "${BATS_TEST_TMPDIR}/no-image"
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"docker_build_arg": {"HF_TOKEN": "hf_literal_build_secret", "GREETING": "hi"}}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  run grep '^build ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output --partial "--build-arg HF_TOKEN "
  assert_output --partial "--build-arg GREETING=hi"
  refute_output --partial hf_literal_build_secret
  run grep -rl hf_literal_build_secret "${SM_JOBDIR}"
  assert_output ""
  refute_output --partial hf_literal_build_secret
  # docker build itself got the value, in its environment.
  run grep -c 'HF_TOKEN=hf_literal_build_secret' "${BATS_TEST_TMPDIR}/docker-env"
  assert_output 1
}

@test "a helper that fails gives its own one-line reason: a manifest that is not JSON" {
  echo 'not json' >"${BATS_TEST_TMPDIR}/m.json"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 2
  run status_field reason
  assert_output --regexp "^manifest: .*m.json: not JSON \(line 1 column 1"
  refute_container_started
}

@test "every stage's logged command pastes back on the node and runs" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{"docker_env_vars": {"TOY_MODE": "demo"}}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json SM_KEEP_SCRATCH=1 node_task
  assert_success
  local log=${SM_JOBDIR}/node_0/node.log cmd n=0
  rm -f "${BATS_TEST_TMPDIR}/docker-calls"
  while IFS= read -r cmd; do
    n=$((n + 1))
    SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json run bash -c "${cmd}"
    assert_success
  done < <(sed -n 's/^.* [a-z-]*: + //p' "${log}")
  # prepare's helper and docker run at least, each run again from its logged line.
  ((n >= 2))
  run grep -c '^run ' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_output 1
}

@test "--from-job re-runs one stage with the job's settings and rank 0's image ID, outputs beside the job's" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{}'
  mkdir -p "${SM_JOBDIR}/node_0"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json SM_IMAGE=toy/model:local slurm-multi job plan --job-id 77 --nnodes 2 \
    --nodes "node1 node2" --write --submit-dir "${BATS_TEST_TMPDIR}" >/dev/null
  local jobdir=${BATS_TEST_TMPDIR}/slurm_output/toy_model/77
  slurm-multi node status --file "${jobdir}/node_0/status.json" --rank 0 --node node1 --exit-code 0 \
    --image-id sha256:1111111111111111111111111111111111111111111111111111111111111111
  run "${REPO_ROOT}/bin/sm-node" --from-job "${jobdir}" --rank 1 --stage image
  assert_success
  assert_output --partial "stage image (this re-run of job 77 rank 1)"
  assert_output --partial "already present with rank 0's ID 111111111111"
  assert_file_exists "${jobdir}/node_1/rerun/node.log"
  assert_file_not_exists "${jobdir}/node_1/status.json"
  run "${REPO_ROOT}/bin/sm-node" --from-job "${jobdir}" --rank 5 --stage image
  assert_failure 2
  assert_output "slurm-multi: node from-job: rank 5 is not a rank of job 77 (0..1)" # once, one line
}

@test "the helper interpreter without click is one line naming it and the fix, never a traceback" {
  python3 -m venv --without-pip "${BATS_TEST_TMPDIR}/bare"
  SM_PYTHON=${BATS_TEST_TMPDIR}/bare/bin/python SM_PYTHON_CHECKED=0 run "${REPO_ROOT}/bin/sm-node" --jobdir "${SM_JOBDIR}" --stage prepare
  assert_failure 2
  assert_output --regexp "helper interpreter ${BATS_TEST_TMPDIR}/bare/bin/python .*no 'click' module; set SM_PYTHON"
  refute_output --partial Traceback
  SM_PYTHON=/nonexistent/python SM_PYTHON_CHECKED=0 run "${REPO_ROOT}/bin/sm-node" --jobdir "${SM_JOBDIR}"
  assert_failure 2
  assert_output --partial "helper interpreter /nonexistent/python cannot be executed"
  SM_PYTHON=${BATS_TEST_TMPDIR}/bare/bin/python run "${REPO_ROOT}/bin/slurm-multi" --help
  assert_failure 2
  assert_output --partial "has no 'click' module; set SM_PYTHON"
  refute_output --partial Traceback
}

@test "scratch of a job Slurm no longer knows, or knows as ended, is removed by the next job's prepare; a live job's is kept" {
  mkdir -p "${TMPDIR}/slurm-multi.12.r0" "${TMPDIR}/slurm-multi.13.r1" "${TMPDIR}/slurm-multi.14.r0"
  echo secret >"${TMPDIR}/slurm-multi.12.r0/secrets"
  echo secret >"${TMPDIR}/slurm-multi.14.r0/secrets"
  # squeue: job 13 is running, 12 is unknown, 14 was cancelled (Slurm remembers it for MinJobAge:
  # like the real squeue, it is listed only with -t all; without, it prints nothing at all).
  printf '#!/bin/sh\ncase "$*" in *" 13 "*) echo RUNNING ;; *" 14 "*) case "$*" in *"-t all"*) echo CANCELLED ;; esac ;; *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;; esac\n' >"${BATS_TEST_TMPDIR}/shim/squeue"
  chmod +x "${BATS_TEST_TMPDIR}/shim/squeue"
  manifest "${BATS_TEST_TMPDIR}/m.json" '{}'
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_success
  assert_not_exists "${TMPDIR}/slurm-multi.12.r0"
  assert_not_exists "${TMPDIR}/slurm-multi.14.r0"
  assert_dir_exists "${TMPDIR}/slurm-multi.13.r1"
  run grep 'ps -aq --filter name=^sm-12-r' "${BATS_TEST_TMPDIR}/docker-calls"
  assert_success
}

@test "util::split_words honours quotes and never evaluates" {
  # shellcheck source=lib/util.sh
  source "${REPO_ROOT}/lib/util.sh"
  local out
  out=$(util::split_words "--steps 20 --name 'a b' \"\$(touch ${BATS_TEST_TMPDIR}/pwned)\"" | tr '\0' '\n')
  assert_equal "$(wc -l <<<"${out}")" 5
  assert_equal "$(sed -n 4p <<<"${out}")" "a b"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/pwned"
  run util::split_words "unbalanced 'quote"
  assert_failure
}

@test "settings by hand on a node: the table's defaults fill what is unset; a bad value is one line with exit 2" {
  # shellcheck source=/dev/null
  for lib in log util settings; do source "${REPO_ROOT}/lib/${lib}.sh"; done
  run bash -c 'for lib in log util settings; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    unset SM_SETTINGS_RESOLVED; SM_HANG_TIMEOUT=7 MAD_DOCKER_BUILDS=/c settings::resolve_env
    echo "${SM_RUNTIME} ${SM_HANG_TIMEOUT} ${SM_IMAGE_CACHE} ${SM_STOP_GRACE} ${SM_SETTINGS_RESOLVED}"'
  assert_success
  assert_output "docker 7 /c 30 1"
  SM_MASTER_PORT=70000 run settings::resolve_env
  assert_failure 2
  assert_output "slurm-multi: --master-port (from SM_MASTER_PORT) '70000' is not a TCP port (1-65535)"
  SM_PROFILE_OPTIONAL=maybe run settings::resolve_env
  assert_failure 2
  assert_output --partial "--profile-optional (from SM_PROFILE_OPTIONAL) 'maybe': expected true or false"
  # Resolved once by the batch step: nothing to do (no helper starts).
  SM_SETTINGS_RESOLVED=1 SM_MASTER_PORT=70000 SM_PYTHON=/nonexistent run settings::resolve_env
  assert_success
}

@test "a node whose docker engine does not answer fails prepare with one line naming it, no container starts" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{}'
  kill "${FAKE_ENGINE_PID}"
  wait "${FAKE_ENGINE_PID}" 2>/dev/null || true
  rm -f "${BATS_TEST_TMPDIR}/docker.sock"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure 1
  run status_field reason
  assert_output --regexp "^prepare: docker engine not reachable on .*: cannot talk to ${BATS_TEST_TMPDIR}/docker.sock"
  refute_container_started
}

@test "a scratch dir another user made first, or a symlink planted there, is refused in one line naming its owner" {
  manifest "${BATS_TEST_TMPDIR}/m.json" '{}'
  mkdir -p "${TMPDIR}/slurm-multi.77.r0"
  chown nobody "${TMPDIR}/slurm-multi.77.r0"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure
  assert_output --partial "scratch dir ${TMPDIR}/slurm-multi.77.r0 on $(hostname) is a directory of nobody, not of $(id -un)"
  refute_output --partial "toy workload ran"
  assert_not_exists "${TMPDIR}/slurm-multi.77.r0/secrets"
  assert_dir_exists "${TMPDIR}/slurm-multi.77.r0" # not ours to remove either
  rmdir "${TMPDIR}/slurm-multi.77.r0"
  mkdir -p "${BATS_TEST_TMPDIR}/elsewhere"
  ln -s "${BATS_TEST_TMPDIR}/elsewhere" "${TMPDIR}/slurm-multi.77.r0"
  SM_MANIFEST=${BATS_TEST_TMPDIR}/m.json node_task
  assert_failure
  assert_output --partial "is a symlink of"
  run ls -A "${BATS_TEST_TMPDIR}/elsewhere"
  assert_output ""
}

@test "run::kill_tree signals a workload only while its PID is still that process (start time)" {
  # shellcheck source=/dev/null
  for lib in log util run; do source "${REPO_ROOT}/lib/${lib}.sh"; done
  sleep 60 &
  local pid=$! ticks
  ticks=$(run::start_ticks "${pid}")
  [[ ${ticks} =~ ^[0-9]+$ ]]
  # A PID the kernel gave to another process since: a different start time, nothing is signalled.
  run::kill_tree TERM "${pid}" "$((ticks + 1))"
  kill -0 "${pid}"
  run::kill_tree TERM "${pid}" "${ticks}"
  local rc=0
  wait "${pid}" || rc=$?
  assert_equal "${rc}" 143
}

@test "run::kill_tree of a workload without children says nothing under the task's ERR trap (a hang's stop printed a call tree)" {
  run bash -c 'for lib in log util run; do source "$1/lib/${lib}.sh"; done
    log::install_err_trap
    sleep 60 &
    run::kill_tree TERM $!
    wait $! || echo "ended $?"' _ "${REPO_ROOT}"
  assert_output "ended 143"
}

# hanging_engine ANSWERED: a docker CLI that records each call in calls, answers the calls whose
# first word is ANSWERED at once, and blocks on every other (a SIGSTOPped dockerd accepts and never
# answers).
hanging_engine() {
  # shellcheck disable=SC2016 # the shim expands them
  printf '#!/bin/sh\necho "$*" >>"%s/calls"\n[ "$1" = %s ] && exit 0\nexec sleep 30\n' \
    "${BATS_TEST_TMPDIR}" "$1" >"${BATS_TEST_TMPDIR}/shim/docker"
}

# with_run_lib SCRIPT: `run` SCRIPT in bash with lib/run.sh and what it needs loaded.
with_run_lib() {
  run bash -c 'for lib in log util run; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    '"$1"
}

@test "run::engine bounds every docker control call: a hung engine gets 124 and one warning" {
  # A SIGSTOPped dockerd accepts and never answers: its CLI blocks. Every control call on the exit
  # and TERM paths (inspect, stop, kill, cp, rm, logs) goes through run::engine. (No clock here: an
  # unbounded call would end after the shim's 30 s with status 0, and the stop would follow.)
  hanging_engine rm
  # shellcheck disable=SC2016 # the script expands them
  with_run_lib '
    RUN_ENGINE_TIMEOUT=1 SM_STOP_GRACE=0
    rc=0; run::engine -q container inspect sm-1-r0 >/dev/null || rc=$?
    echo "inspect rc=${rc}"
    run::stop_container sm-1-r0
    rc=0; run::engine -q rm -f id1 id2 || rc=$?
    echo "rm rc=${rc}"'
  assert_success
  assert_line "inspect rc=124"
  assert_line "rm rc=0"
  assert_output --partial "warning: the docker engine did not answer 'docker container inspect sm-1-r0' within 1 s"
  # stop_container could not ask the container's state: no docker stop follows (it would block too).
  run grep -c '^stop ' "${BATS_TEST_TMPDIR}/calls"
  assert_output 0
  run grep -c '^container inspect sm-1-r0$' "${BATS_TEST_TMPDIR}/calls"
  assert_output 2
}

@test "run::stop_container bounds docker stop by the grace plus the engine's bound" {
  # The engine answers the inspect; the stop hangs (SIGSTOPped dockerd after the inspect).
  hanging_engine container
  with_run_lib '
    RUN_ENGINE_TIMEOUT=1 SM_STOP_GRACE=1
    run::stop_container sm-1-r0; echo "stop_container rc=$?"'
  assert_success
  assert_line "stop_container rc=0"
  assert_output --partial "warning: the docker engine did not answer 'docker stop -t 1 sm-1-r0' within 2 s"
  run grep -c '^stop -t 1 sm-1-r0$' "${BATS_TEST_TMPDIR}/calls"
  assert_output 1
}

@test "SIGTERM three times while the workload takes a second to stop: one graceful stop, outputs staged, exit 143" {
  # scancel, nsys and the nsight-slurm connector each forward a SIGTERM to a bare-metal task, a
  # moment apart. The handler must not run again inside itself: nested, it waited on the same
  # processes again and the task hung until Slurm's SIGKILL, staging nothing (2 in 12 e2e runs).
  local out=${BATS_TEST_TMPDIR}/task.out pid i
  SM_RUNTIME=none SM_FITNESS=off SM_HANG_TIMEOUT=0 "${REPO_ROOT}/bin/sm-node" --jobdir "${SM_JOBDIR}" -- \
    sh -c 'trap "sleep 1; echo stopped; exit 143" TERM; echo started; while :; do sleep 0.1; done' >"${out}" 2>&1 &
  pid=$!
  for i in $(seq 200); do grep -qs '^started$' "${SM_JOBDIR}/node_0/node.log" && break; sleep 0.05; done
  for i in 1 2 3; do
    kill -TERM "${pid}"
    # (the workload's own shell gets scancel's SIGTERM too)
    pkill -TERM -f 'trap "sleep 1; echo stopped' 2>/dev/null || true
    sleep 0.2
  done
  for i in $(seq 150); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${pid}" 2>/dev/null; then
    kill -KILL "${pid}"
    cat "${out}" >&2
    fail "sm-node still running 15 s after the SIGTERMs"
  fi
  run wait "${pid}"
  assert_equal "${status}" 143
  run grep -c 'received a termination signal' "${SM_JOBDIR}/node_0/node.log"
  assert_output 1
  assert_equal "$(status_field exit_code)" 143
  run grep -c 'stage save-outputs: ok' "${SM_JOBDIR}/node_0/node.log"
  assert_output 1
  # The stage the signal cut short is in status.json, failed, with the time it ran.
  run "${SM_PYTHON}" -c 'import json,sys; d=json.load(open(sys.argv[1]))["stages"]; print(list(d), d["run"]["status"], d["run"]["seconds"] >= 0.5)' "${SM_JOBDIR}/node_0/status.json"
  assert_output "['prepare', 'fitness', 'image', 'barrier', 'run', 'save-outputs'] failed True"
  run grep -c ' stage_end .*stage=run .*status=terminated' "${SM_JOBDIR}/node_0/events.log"
  assert_output 1
}

@test "--fitness-cmd's output passes the log filter before it is kept or cut: no secret in its log, its record or the reason" {
  # It sees the job's environment; a command that prints $HF_TOKEN and fails put the token in
  # fitness-cmd.log, fitness-cmd.json and status.json (and the quarantine), and `cut -c1-200` before
  # the mask left half of one that straddled the cut.
  export HF_TOKEN=hf_0123456789abcdefghijSECRET
  # shellcheck disable=SC2016 # the command expands it, not this shell
  SM_RUNTIME=none SM_HANG_TIMEOUT=0 SM_FITNESS_CMD='echo "token is $HF_TOKEN"; printf "%0190d%s\n" 0 "$HF_TOKEN"; exit 3' \
    run "${REPO_ROOT}/bin/sm-node" --jobdir "${SM_JOBDIR}" -- sh -c 'echo ran'
  assert_failure
  assert_file_exists "${SM_JOBDIR}/node_0/fitness-cmd.log"
  assert_file_exists "${SM_JOBDIR}/node_0/fitness-cmd.json"
  run grep -rlF "hf_0123456" "${SM_JOBDIR}"
  assert_output ""
  run grep -c 'token is \*\*\*' "${SM_JOBDIR}/node_0/fitness-cmd.log"
  assert_output 1
  run status_field reason
  assert_output --regexp "fitness command on [^ ]+: exited 3: 0+\*\*\* \(node_0/fitness-cmd.log\)$"
  # Nothing of it stays in the scratch dir either (its raw output is there only while it runs).
  assert_not_exists "${TMPDIR}/slurm-multi.77.r0"
}

@test "run::diagnose_host never keeps a snapshot unfiltered: when the log filter refuses, the file says so instead" {
  # An unreadable secrets file (here a directory) makes the filter refuse in one line; the snapshot
  # it could not filter was kept as it was, secrets and all.
  mkdir -p "${BATS_TEST_TMPDIR}/diag" "${BATS_TEST_TMPDIR}/scr/secrets"
  echo "pw tok_diag_secret_77" >"${BATS_TEST_TMPDIR}/diag/extra.txt"
  export API_TOKEN=tok_diag_secret_77 SM_SCRATCH="${BATS_TEST_TMPDIR}/scr" SM_NODE_LOG=
  with_run_lib "run::diagnose_host '${BATS_TEST_TMPDIR}/diag'"
  assert_success
  run grep -rlF "tok_diag_secret_77" "${BATS_TEST_TMPDIR}/diag"
  assert_output ""
  run cat "${BATS_TEST_TMPDIR}/diag/extra.txt"
  assert_output "(not kept: the log filter could not run on it)"
}

@test "a scratch dir another user made first ends the task with the cause in status.json, for the batch step to name" {
  # The name is predictable; the task refuses it (never a secret in someone else's dir) and says why,
  # and the batch step names it without quarantining the node (slurm_multi.fitness.verdict: no evidence).
  mkdir -p "${TMPDIR}/slurm-multi.77.r0"
  chown nobody "${TMPDIR}/slurm-multi.77.r0" || skip "cannot give a dir to another user here"
  SM_RUNTIME=none SM_HANG_TIMEOUT=0 run "${REPO_ROOT}/bin/sm-node" --jobdir "${SM_JOBDIR}" -- sh -c 'echo ran'
  assert_failure 1
  run status_field reason
  assert_output --regexp "^scratch dir ${TMPDIR}/slurm-multi.77.r0 on [^ ]+ is a directory of nobody, not of "
  assert_exists "${TMPDIR}/slurm-multi.77.r0" # not ours to remove
  # Its peer's report, as a 2-node job would have it: the judge names rank 0 with the cause.
  mkdir -p "${SM_JOBDIR}/node_1"
  echo '{"rank": 1, "nnodes": 2, "host": "other", "local": {"ok": true, "reason": ""}, "checks": {"network": {}}}' \
    >"${SM_JOBDIR}/node_1/fitness.json"
  run "${SM_PYTHON}" -m slurm_multi fitness judge --jobdir "${SM_JOBDIR}" --nodes "$(cat /proc/sys/kernel/hostname) other"
  assert_success
  assert_line --regexp "^0	[^	]+	no fitness report \(scratch dir .* is a directory of nobody, not of [^	]*\)	none$"
}
