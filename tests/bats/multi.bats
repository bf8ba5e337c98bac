#!/usr/bin/env bats
# sbatch/multi.sbatch outside a job: --help, option errors and the dry-run plan need no Slurm.

load helpers

setup() {
  cd "${BATS_TEST_TMPDIR}" || return 1
  # A docker that records any call: the dry-run must never touch docker.
  mkdir -p shim
  printf '#!/bin/sh\necho "$@" >>%q/docker-called\nexit 1\n' "${BATS_TEST_TMPDIR}" >shim/docker
  chmod +x shim/docker
  export PATH="${BATS_TEST_TMPDIR}/shim:${PATH}"
  unset SLURM_JOB_ID SLURM_JOB_NUM_NODES SLURM_JOB_NODELIST
}

@test "--help lists every option with its environment variable and an example" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --help
  assert_success
  for opt in --manifest --model --image --image-cache --out --timeout --dry-run --help; do
    assert_output --partial "${opt}"
  done
  for var in SM_MANIFEST SM_MODEL SM_IMAGE SM_IMAGE_CACHE SM_OUT SM_TIMEOUT; do
    assert_output --partial "env ${var}"
  done
  assert_output --partial "MAD_DOCKER_BUILDS"
  assert_output --partial "MAD_BARRIER_TOKEN"
  assert_output --partial "MAD_COLLECT_METRICS"
  assert_output --partial "Examples:"
}

@test "a usage error is one line without a log prefix, names the flag, offers the nearest option; no usage dump" {
  local m=${REPO_ROOT}/examples/toy/build_manifest.json
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --manifest "${m}" --bogus 1
  assert_failure 2
  assert_output "slurm-multi: unknown option '--bogus'; --help lists every option"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --manifest "${m}" --runtim pyxis
  assert_failure 2
  assert_output "slurm-multi: unknown option '--runtim' (did you mean --runtime?); --help lists every option"
  # A trailing unknown flag is unknown, not "needs a value"; a known one without its value says so.
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --manifest "${m}" --verbose
  assert_output "slurm-multi: unknown option '--verbose'; --help lists every option"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --manifest "${m}" --image-cache
  assert_output "slurm-multi: option --image-cache needs a value (DIR); --help lists every option"
  # --opt=value and a later --opt value of the same option: the last wins, nothing is skipped.
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 1 --manifest "${m}" --hang-timeout=5 --hang-timeout -5
  assert_failure 2
  assert_output --partial "--hang-timeout '-5': expected a whole number of seconds, 0 or more (SM_HANG_TIMEOUT)"
  refute_output --partial "Usage:"
  # The plan's own reason, said once (the batch step used to repeat it with a log prefix).
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest "${m}" --model nosuch
  assert_failure 2
  assert_output "slurm-multi: manifest: no model nosuch in built_models (keys: toy-2node)"
}

@test "-N after the script inside a real job is refused: it is the dry run's count, not sbatch's" {
  SLURM_JOB_ID=5 SLURM_JOB_NUM_NODES=1 run bash "${REPO_ROOT}/sbatch/multi.sbatch" -N 4 \
    --manifest "${REPO_ROOT}/examples/toy/build_manifest.json"
  assert_failure 2
  assert_output --partial "slurm-multi: -N 4 after the script is the dry run's node count, not sbatch's: put it before the script (sbatch -N 4 sbatch/multi.sbatch ...); this job has 1 node(s)"
  # With --dry-run inside an allocation it is what it always was.
  SLURM_JOB_ID=5 SLURM_JOB_NUM_NODES=1 run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 3 \
    --manifest "${REPO_ROOT}/examples/toy/build_manifest.json"
  assert_success
  assert_output --partial "3 nodes"
}

@test "outside a job without --dry-run it says how to submit, exit 2" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --manifest "${REPO_ROOT}/examples/toy/build_manifest.json"
  assert_failure 2
  assert_output --partial "not inside a Slurm job: submit with 'sbatch -N 2 sbatch/multi.sbatch"
}

@test "a missing manifest or nothing to run is a clear error" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --manifest /nonexistent.json
  assert_failure 2
  assert_output --partial "--manifest /nonexistent.json: no such readable file"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run
  assert_failure 2
  assert_output --partial "nothing to run: give --manifest FILE or --image IMAGE"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --image x --timeout soon
  assert_failure 2
  assert_output --partial "--timeout 'soon': expected a whole number of seconds"
}

@test "--dry-run -N 3 prints the plan for 3 nodes without Slurm or docker, secrets masked" {
  export HF_TOKEN=hf_dryrun_secret_value MAD_BARRIER_TOKEN=barrier-secret-value-123
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 3 --manifest "${REPO_ROOT}/examples/toy/build_manifest.json"
  assert_success
  assert_output --partial "slurm-multi plan: 3 nodes (-N), model toy_model"
  assert_output --partial "Node 0: rank 0 (serves the barrier)"
  assert_output --partial "Node 2: worker"
  assert_output --regexp "srun --nodes=3 --ntasks-per-node=1 .*bin/sm-node --jobdir"
  # The model's script dir read-only at /sm-model, copied into the run directory by the container
  # (madengine's run_directory), then `bash <script> <args>` there.
  assert_output --regexp "docker run --name sm-DRYRUN-r2 --network host --init -v [^ ]*/slurm-multi.DRYRUN.r2/output:/sm-out -v [^ ]*/examples/toy/scripts/toy_model:/sm-model:ro --shm-size 64M -w /myworkspace/run_directory .* --env-file [^ ]*/slurm-multi.DRYRUN.r2/container.env -e HF_TOKEN toy/model:local sh -c .cp.* sm-model bash run.sh --steps 20"
  assert_output --regexp "MAD_MULTI_NODE_RUNNER=torchrun --standalone --nproc_per_node=1"
  assert_output --partial "MAD_COLLECT_METRICS=false"
  assert_output --partial "mounts and options (after de-duplication)"
  assert_output --partial "TOY_MODE=demo"
  assert_output --regexp "SM_BARRIER_TOKEN +\*\*\*   \(from MAD_BARRIER_TOKEN\)"
  refute_output --partial hf_dryrun_secret_value
  refute_output --partial barrier-secret-value-123
  assert_file_not_exists "${BATS_TEST_TMPDIR}/docker-called"
  # Nothing is left behind by a plan: no scratch dir of the would-be job.
  run compgen -G "${TMPDIR:-/tmp}/slurm-multi.DRYRUN.*"
  assert_failure
}

@test "SM_DEBUG=1 traces the plan and a stage run by hand, and no secret is in the trace" {
  export HF_TOKEN=hf_traced_secret_value SM_BARRIER_TOKEN=barrier-traced-secret-123 SM_DEBUG=1
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest "${REPO_ROOT}/examples/toy/build_manifest.json"
  assert_success
  assert_output --regexp "^\+ [a-z.-]+:[0-9]+ " # it is a trace
  refute_output --partial hf_traced_secret_value
  refute_output --partial barrier-traced-secret-123
  # A stage by hand sources the settings and the context (declare -gx SM_BARRIER_TOKEN=…).
  SM_RUNTIME=none run "${REPO_ROOT}/bin/sm-node" --jobdir "${BATS_TEST_TMPDIR}/jd" --stage run -- true
  assert_success
  assert_output --partial "util::source"
  refute_output --partial barrier-traced-secret-123
}

@test "--dry-run refuses a manifest the job would refuse, exit 2, one line naming file and key" {
  echo 'not json' >bad1.json
  echo '{"built_models": [1, 2]}' >bad2.json
  echo '{"built_models": {"a": {"name": "x"}, "b": {"name": "y"}}}' >two.json
  echo '{"built_models": {"a": {"name": "x", "args": 5, "scripts": ["run.sh"]}}}' >types.json
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest bad1.json
  assert_failure 2
  assert_output --regexp "bad1.json: not JSON \(line 1 column 1"
  refute_output --partial "image: <none>"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest bad2.json
  assert_failure 2
  assert_output --partial "bad2.json: not a build manifest (built_models must be an object, got array)"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest two.json
  assert_failure 2
  assert_output --partial "several models in built_models (a, b); choose one with --model KEY"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest two.json --model z
  assert_failure 2
  assert_output --partial "no model z in built_models (keys: a, b)"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest types.json
  assert_failure 2
  assert_output --partial "built_models.a.scripts must be a string, number or boolean, got array"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --manifest two.json --model a
  assert_failure 2
  assert_output --partial "no image to run"
  refute_output --partial Traceback
}

@test "the job dir stays inside --out whatever the model is called" {
  local name
  for name in .. ../../etc . '.hidden' 'a/../../b' ''; do
    run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 1 --out "${BATS_TEST_TMPDIR}/out" --image "x:1" --model "${name}"
    assert_success
    assert_output --regexp "job dir +${BATS_TEST_TMPDIR}/out/[A-Za-z0-9_][A-Za-z0-9._-]*/DRYRUN"
  done
}

@test "--dry-run without -N says it assumed 2 nodes, and where a count came from" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --image busybox:latest
  assert_success
  assert_line --index 0 "== slurm-multi plan: 2 nodes (no -N given: 2 assumed; the job's is sbatch's -N), model busybox_latest =="
  SLURM_JOB_NUM_NODES=4 run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --image busybox:latest
  assert_line --index 0 --partial "4 nodes (the allocation)"
}

@test "--dry-run takes the workload command after --" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 1 --image busybox:latest -- sh -c 'echo "hi there"'
  assert_success
  assert_output --partial "Node 0: single node (no cache, no barrier)"
  assert_output --partial "busybox:latest sh -c 'echo \"hi there\"'"
}

@test "command line beats environment beats defaults, and madengine aliases fill ours: the dry run says which" {
  export SM_TIMEOUT=77 MAD_DOCKER_BUILDS=/shared/cache MAD_COLLECT_METRICS=false SM_HANG_TIMEOUT=60
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --image x --timeout 99
  assert_success
  assert_output --regexp "  --timeout +99   \(from --timeout\)"
  assert_output --regexp "  --image-cache +/shared/cache   \(from MAD_DOCKER_BUILDS\)"
  assert_output --regexp "  --collect +false   \(from MAD_COLLECT_METRICS\)"
  assert_output --regexp "  --hang-timeout +60   \(from SM_HANG_TIMEOUT\)"
  # A default is not repeated: --help lists every one.
  refute_output --partial "--barrier-timeout"
}

@test "a helper interpreter without click, or not executable, stops the plan with one line naming it" {
  python3 -m venv --without-pip "${BATS_TEST_TMPDIR}/bare"
  SM_PYTHON=${BATS_TEST_TMPDIR}/bare/bin/python run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --image x
  assert_failure 2
  assert_output --regexp "helper interpreter ${BATS_TEST_TMPDIR}/bare/bin/python .*no 'click' module; set SM_PYTHON"
  refute_output --partial Traceback
  SM_PYTHON=${BATS_TEST_TMPDIR}/nonexistent/python run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --image x
  assert_failure 2
  assert_output --partial "helper interpreter ${BATS_TEST_TMPDIR}/nonexistent/python cannot be executed by"
}

@test "a signal that comes during the teardown (Slurm killing the job for a failed node) does not skip collect" {
  # The reaper step waits on a node that died; Slurm then signals the whole batch step. The old trap
  # ran `exit 143` once it found the teardown already started: no collect, no summary.json.
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_JOBDIR=${BATS_TEST_TMPDIR}/job SM_COLLECT=1 SM_STOP_GRACE=1 SLURM_JOB_NUM_NODES=2 SM_FITNESS=off
mkdir -p "\${SM_JOBDIR}"
util::sm() { echo "util::sm \$*"; }
util::sm_logged() { echo "collect ran: \$*"; return 1; }
util::warm_logged() { echo "collect ran: \$*"; return 1; }
job::reap() { : >${BATS_TEST_TMPDIR}/in-reap; sleep 30 & wait \$!; echo "reap ended (\$?)"; }
job::traps
exit 0
SCRIPT
  bash batch.sh >out.log 2>&1 &
  local pid=$! n=0
  until [[ -f in-reap ]] || ((n++ > 100)); do sleep 0.1; done
  assert_file_exists in-reap
  kill -TERM "${pid}"
  local rc=0
  wait "${pid}" || rc=$?
  run cat out.log
  assert_output --partial "SIGTERM (scancel or time limit) during the teardown: finishing it"
  assert_output --partial "reap ended (143)"
  assert_output --partial "collect ran: multi results collect ${BATS_TEST_TMPDIR}/job"
  assert_output --partial "verdict: FAILURE"
  # The teardown's own verdict is the exit status, not the signal's 143.
  assert_equal "${rc}" 1
}

@test "after a signal the reaper gets what is left of Slurm's KillWait before collect, never more" {
  mkdir -p shim
  cat >shim/scontrol <<'SH'
#!/bin/sh
[ "$1 $2" = "show config" ] && printf 'KillWait                = %s sec\n' "${FAKE_KILLWAIT}"
SH
  chmod +x shim/scontrol
  local lib="for lib in log util settings teardown launch job; do source ${REPO_ROOT}/lib/\${lib}.sh; done; SM_STOP_GRACE=30 settings::resolve_env"
  run bash -c "${lib}; job::reap_timeout"
  assert_output 60
  FAKE_KILLWAIT=60 run bash -c "${lib}; JOB_SIGNAL_AT=\${SECONDS}; job::reap_timeout"
  assert_regex "${output}" '^4[45]$' # 60 - 15, less the second the clock may tick (below)
  FAKE_KILLWAIT=300 run bash -c "${lib}; JOB_SIGNAL_AT=\${SECONDS}; job::reap_timeout"
  assert_output 60
  FAKE_KILLWAIT=10 run bash -c "${lib}; JOB_SIGNAL_AT=\${SECONDS}; job::reap_timeout"
  assert_output 0
  # Time already spent in the teardown counts against KillWait: 60 - 40 - 15. SECONDS counts whole
  # seconds, and the clock may tick between the test's read and the product's (the scontrol call
  # lies between them; 1 CI run in ~20 saw 4): 40 s spent leaves 5, 41 s leave 4, nothing else.
  FAKE_KILLWAIT=60 run bash -c "${lib}; JOB_SIGNAL_AT=\$((SECONDS - 40)); job::reap_timeout"
  assert_regex "${output}" '^[45]$'
}

@test "the dry run says, per runtime, what watches and stops the ranks" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --image x --runtime docker --hang-timeout 45 -- true
  assert_success
  assert_output --regexp "hang watch +a rank with no new output line and no CPU for 45 s after GO fails the job"
  assert_output --regexp "stop +docker stop -t 30 per node"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --image x --runtime pyxis -- true
  assert_output --regexp "hang watch +a rank whose step printed no new output line and whose tasks on its node \(under the step.s slurmstepd\) used no CPU for 900 s"
  assert_output --regexp "stop +SIGTERM to each rank's step; Slurm SIGKILLs it after its KillWait"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run --image x --runtime none --hang-timeout 0 -- true
  assert_output --regexp "hang watch +off \(--hang-timeout 0\)"
  assert_output --regexp "stop +SIGTERM to the workload's process tree, SIGKILL after --stop-grace 30 s"
}

@test "the dry run says ranks and what sbatch needs when each task is a rank, the transport, the ports and the fitness plan" {
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --runtime none --ntasks-per-node 4 --on-bad-node requeue -- hostname
  assert_success
  assert_line "Ranks: 2 nodes x 4 tasks = 8 ranks; submit with: sbatch -N 2 --ntasks-per-node=4 sbatch/multi.sbatch ..."
  # A block per rank, each with its node and local rank, as sm-node gives them.
  assert_line "Rank 1 (node 0, local rank 1): bare metal: no image, no barrier"
  assert_line "Ranks 2..6: like rank 1, with their own rank"
  assert_line "Rank 7 (node 1, local rank 3): bare metal: no image, no barrier"
  refute_output --partial "Node 1:"
  assert_line --regexp "^  ports +the fitness check's derive from MASTER_PORT 29500 and the job ID"
  assert_line --regexp "^  a bad node +requeue the job without it, at most 2 time\(s\)"
  refute_output --partial "image transport"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --image toy/model:local --runtime pyxis --ntasks-per-node 2 -- true
  assert_line "Rank 0 (node 0, local rank 0): serves the barrier"
  assert_line "Rank 3 (node 1, local rank 1): worker"
  assert_output --regexp "srun --job-name=sm-rank3 --overlap --nodes=1 --ntasks=1 '--nodelist=<node 1>'"
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --image x --image-transport relay --fitness off
  assert_success
  refute_output --partial "Ranks:"
  assert_line --regexp "^  image transport +relay: rank 0 streams its image node to node"
  assert_line --regexp "^  checks +off \(--fitness off\)"
}

# requeue::try RESTART_COUNT MAX: job::requeue_without with a recording scontrol; prints what ran.
requeue::try() {
  mkdir -p shim
  printf '#!/bin/sh\necho "scontrol $*" >>%q\n' "${BATS_TEST_TMPDIR}/scontrol.calls" >shim/scontrol
  chmod +x shim/scontrol
  : >scontrol.calls
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job slurm; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77 SLURM_RESTART_COUNT=$1 SM_MAX_REQUEUES=$2
job::keep_attempt() { echo "kept attempt \$1"; }
JOB_BAD_NODES=(\$'node2\tengine does not answer')
job::requeue_without fitness
echo "requeue_without returned \$?"
SCRIPT
  PATH="${BATS_TEST_TMPDIR}/shim:${PATH}" bash batch.sh 2>&1
  cat scontrol.calls
}

@test "requeue: --max-requeues 2 allows the second requeue (attempt 2) and refuses the third (attempt 3)" {
  run requeue::try 1 2
  assert_output --partial "kept attempt 1"
  assert_output --partial "scontrol update JobId=77 Requeue=1"
  assert_output --partial "scontrol release 77"
  refute_output --partial "requeue_without returned"
  run requeue::try 2 2
  assert_output --partial "not requeued: this is attempt 3 and --max-requeues 2 are used"
  assert_output --partial "requeue_without returned 1"
  refute_output --partial "scontrol update"
  refute_output --partial "kept attempt"
  run requeue::try 0 0
  assert_output --partial "requeue_without returned 1"
  refute_output --partial "scontrol update"
}

@test "bad nodes: only those whose own check failed or whose peers agree go into the quarantine; the others fail the job alone" {
  # What somebody else could have caused (no fitness report: its task could not start in a scratch
  # dir another user made, or its stage crashed) never becomes a 24-hour ban for every later job.
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job slurm; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_STATE_DIR=${BATS_TEST_TMPDIR}/state SM_QUARANTINE_HOURS=24 SM_ON_BAD_NODE=fail SLURM_JOB_ID=77
job::take_bad_nodes <<'LINES'
0	node1	docker engine did not answer /_ping within 3 s	local
1	node2	unreachable on port 21577 from every peer	peers
2	node3	no fitness report (scratch dir /tmp/slurm-multi.77.r2 on node3 is a directory of nobody, not of alice: remove it)	none
LINES
job::on_bad_nodes
SCRIPT
  run bash batch.sh
  assert_success
  assert_output --partial "bad node node3 (rank 2): no fitness report (scratch dir"
  assert_output --partial "node3 is not quarantined: what failed there is no proof against the node"
  assert_output --partial "quarantined for 24 h in ${BATS_TEST_TMPDIR}/state: node1 node2"
  run slurm-multi quarantine check --state-dir "${BATS_TEST_TMPDIR}/state" --nodes "node1 node2 node3"
  assert_success
  assert_line --regexp "^node1	docker engine did not answer"
  assert_line --regexp "^node2	unreachable on port 21577"
  refute_output --partial node3
}

# bad_nodes::take FILE_TEXT [JUDGE]: job::bad_nodes_from on collect's --bad-nodes file holding
# FILE_TEXT (or, with JUDGE, the fitness judge's lines without collect), then job::on_bad_nodes with
# --on-bad-node requeue; the quarantine and the requeue are recorded, not done.
bad_nodes::take() {
  printf '%b' "$1" >bad-nodes
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job slurm; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77 SM_STATE_DIR=${BATS_TEST_TMPDIR}/state SM_QUARANTINE_HOURS=24
SM_ON_BAD_NODE=requeue SM_FITNESS=on JOB_NODES=(node1 node2 node3)
util::sm() { [[ \$1 == fitness ]] && { cat ${BATS_TEST_TMPDIR}/bad-nodes; return 0; }; echo "util::sm \$*"; }
job::requeue_without() { echo "requeue without \${JOB_BAD_NODES[*]%%\$'\t'*}, cause \$1"; }
if [[ -n "${2:-}" ]]; then job::judge_fitness; else job::bad_nodes_from bad-nodes; fi && job::on_bad_nodes
SCRIPT
  bash batch.sh 2>&1
}

@test "a node lost during the run (collect's cause run) is quarantined with its reason and the job requeued for run" {
  run bad_nodes::take '1\tnode2\tlost during the run: node2 stopped answering on the network\tpeers\trun\n'
  assert_output --partial "bad node node2 (rank 1): lost during the run: node2 stopped answering on the network"
  assert_output --partial "util::sm quarantine add --quiet --state-dir ${BATS_TEST_TMPDIR}/state --job 77 --hours 24 --reason lost during the run: node2 stopped answering on the network -- node2"
  assert_output --partial "requeue without node2, cause run"
  # A rank that vanished (evidence none): requeued around, not quarantined.
  run bad_nodes::take '1\tnode2\tlost during the run: the task of rank 1 on node2 vanished\tnone\trun\n'
  refute_output --partial "quarantine add"
  assert_output --partial "requeue without node2, cause run"
  # The fitness stage's, from collect (with its cause) or from the judge alone (without one): fitness.
  run bad_nodes::take '2\tnode3\tdocker engine did not answer\tlocal\tfitness\n'
  assert_output --partial "requeue without node3, cause fitness"
  run bad_nodes::take '2\tnode3\tdocker engine did not answer\tlocal\n' judge
  assert_output --partial "bad node node3 (rank 2): docker engine did not answer"
  assert_output --partial "requeue without node3, cause fitness"
}

@test "the attempt a workload is in: SM_ATTEMPT is Slurm's restart count + 1, in the job and in its dry run" {
  run bash -c "source ${REPO_ROOT}/lib/job.sh; job::export_attempt; echo \${SM_ATTEMPT}"
  assert_output 1
  run env SLURM_RESTART_COUNT=2 bash -c "source ${REPO_ROOT}/lib/job.sh; job::export_attempt; echo \${SM_ATTEMPT}"
  assert_output 3
  run bash "${REPO_ROOT}/sbatch/multi.sbatch" --dry-run -N 2 --image toy/model:local -- true
  assert_success
  assert_output --partial "-e SM_ATTEMPT=1 "
}

# teardown::vanished SIGNAL: the teardown's mark-lost calls after a reaper that left a rank unstaged
# (no collect); with SIGNAL, a signal came first.
teardown::vanished() {
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job slurm; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77 SLURM_JOB_NUM_NODES=2 SM_COLLECT=0 SM_FITNESS=off SM_STOP_GRACE=1
JOB_NODES=(node1 node2) ${1:+JOB_SIGNAL_AT=1}
mkdir -p "\${SM_JOBDIR}/node_0" && echo '{}' >"\${SM_JOBDIR}/node_0/status.json"
util::sm() { echo "util::sm \$*"; }
job::reap() { JOB_REAPED=1; }
job::teardown "normal end"
SCRIPT
  bash batch.sh 2>&1
}

@test "after the reaper ran on every node, a rank still without a status loses its node; not after a signal" {
  run teardown::vanished
  assert_line --regexp "^util::sm job mark-lost .* --not-responding --vanished$"
  run teardown::vanished signal
  refute_output --partial "--vanished"
  assert_output --partial "--not-responding"
}

@test "requeue: Slurm refusing it leaves this attempt's files where they are (the job's own verdict)" {
  mkdir -p shim
  # shellcheck disable=SC2016 # expanded by the shim, not here
  printf '#!/bin/sh\necho "scontrol $*" >>%q\ncase "$1" in requeuehold) exit 1 ;; esac\n' "${BATS_TEST_TMPDIR}/scontrol.calls" >shim/scontrol
  chmod +x shim/scontrol
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job slurm; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77 SLURM_RESTART_COUNT=0 SM_MAX_REQUEUES=2
job::keep_attempt() { echo "kept attempt \$1"; }
JOB_BAD_NODES=(\$'node2\tlost during the run')
job::requeue_without run
echo "requeue_without returned \$?"
SCRIPT
  PATH="${BATS_TEST_TMPDIR}/shim:${PATH}" run bash batch.sh
  assert_output --partial "Slurm refused the requeue of job 77"
  assert_output --partial "requeue_without returned 1"
  refute_output --partial "kept attempt"
}

@test "stopping the step waits at most 3 s for scancel, which waits on a lost node for MessageTimeout" {
  mkdir -p shim
  printf '#!/bin/sh\necho "scancel $*" >>%q\nexec sleep 30\n' "${BATS_TEST_TMPDIR}/scancel.calls" >shim/scancel
  chmod +x shim/scancel
  local started=${SECONDS}
  PATH="${BATS_TEST_TMPDIR}/shim:${PATH}" run bash -c "for lib in log util settings teardown launch job slurm; do source ${REPO_ROOT}/lib/\${lib}.sh; done
    SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77 SM_RUNTIME=docker JOB_STEP_ID=0; mkdir -p \${SM_JOBDIR}; job::stop_step test"
  assert_success
  assert [ $((SECONDS - started)) -le 6 ]
  run cat scancel.calls
  assert_output "scancel --signal=TERM 77.0"
}

# teardown::after_watch STOPPED: the teardown with the step still running, every rank staged,
# JOB_WATCH_STOPPED=STOPPED; prints whether it stopped the step.
teardown::after_watch() {
  cat >batch.sh <<SCRIPT
for lib in log util settings teardown launch job slurm; do source "${REPO_ROOT}/lib/\${lib}.sh"; done
SM_JOBDIR=${BATS_TEST_TMPDIR}/job SLURM_JOB_ID=77 SLURM_JOB_NUM_NODES=1 SM_COLLECT=0 SM_FITNESS=off SM_STOP_GRACE=1
JOB_NODES=(node1) JOB_WATCH_STOPPED=$1
mkdir -p "\${SM_JOBDIR}/node_0" && echo '{}' >"\${SM_JOBDIR}/node_0/status.json"
util::sm() { :; }
job::stop_step() { echo "stop_step: \$1"; }
sleep 5 & JOB_SRUN_PID=\$!
job::teardown "a node failed or was lost 5 s ago"
SCRIPT
  bash batch.sh 2>&1
}

@test "after the watch stopped the step the teardown does not stop it again (scancel would wait on the lost node)" {
  run teardown::after_watch 1
  refute_output --partial "stop_step:"
  assert_output --partial "every rank has staged; not waiting for srun to notice"
  run teardown::after_watch 0
  assert_output --partial "stop_step: a node failed or was lost 5 s ago"
}
