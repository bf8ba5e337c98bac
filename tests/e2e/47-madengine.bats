#!/usr/bin/env bats
# madengine's model scripts run unchanged: a MAD checkout (tests/e2e/data/mad: build_manifest.json
# beside scripts/<model>/, the scripts on the host, not in the image) runs through real torchrun
# with MAD_MULTI_NODE_RUNNER, under docker and pyxis; every process sees the whole world; a script
# that falls back to a single-node run fails the job instead of reporting SUCCESS.

load helpers
bats_require_minimum_version 1.5.0

MAD_DIR=${REPO_ROOT}/tests/e2e/data/mad
MAD_MANIFEST=${MAD_DIR}/build_manifest.json

setup_file() {
  e2e::ensure_cluster
  # The torch image on node1 (built if missing). The other nodes may hold it already (45-torch
  # relayed it there): a madengine script's world does not depend on how the image got there, and
  # moving 1.3 GB again costs the suite ~35 s; a node without it gets it from rank 0.
  "${REPO_ROOT}/examples/torchrun/build-image" --node node1 >/dev/null
  e2e::toy_image_only_on node1
  # One cache with 48: the torch squashfs made here is reused there.
  export E2E_CACHE
  E2E_CACHE=$(e2e::torch_cache)
  export E2E_JOB_TIMEOUT=420
  # Anything written into the checkout after this is a node writing where it must not.
  touch "${BATS_FILE_TMPDIR}/checkout-mark"
}

setup() {
  e2e::wait_for_nodes node1 node2 node3
}

# mad::one_world JOBDIR WORLD: every process printed `Rank: R/WORLD`, each rank once.
mad::one_world() {
  local ranks
  ranks=$(grep -ohE "Rank: [0-9]+/[0-9]+ " "$1"/node_*/node.log | sort -u)
  echo "ranks seen: ${ranks}"
  [[ $(grep -c "/$2 " <<<"${ranks}") -eq $2 && $(wc -l <<<"${ranks}") -eq $2 ]]
}

# mad::assert_one_torchrun_world: the last job (2 nodes x 2 processes) SUCCEEDED as one world of 4:
# every process saw the whole world, every node ran madengine's torchrun runner (never a standalone
# fallback), and job.json and summary.json say so.
mad::assert_one_torchrun_world() {
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  run mad::one_world "${JOB_DIR}" 4
  assert_success
  local r
  for r in 0 1; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "Launcher Command: torchrun --nnodes=2 --nproc_per_node=2 --node_rank=${r} --master_addr=node1 --master_port=29500"
    refute_output --partial "using standalone torchrun"
    refute_output --partial "Running in Standalone Mode"
  done
  assert_equal "$(e2e::json "${JOB_DIR}/job.json" 'd["world_size"], d["nproc_per_node"], d["launcher"]')" "(4, 2, 'torchrun')"
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["world"]')" "{'expected': 4, 'seen': {'0': 4, '1': 4}, 'silent': []}"
}

# mad::assert_every_node_alone: the last job (2 nodes x 2 processes) FAILED although each node ran
# fine, because each node's processes made a world of their own: both nodes are named.
mad::assert_every_node_alone() {
  assert_equal "${JOB_RC}" 1
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" '[n["status"] for n in d["nodes"]]')" "['ok', 'ok']"
  run e2e::json "${JOB_DIR}/summary.json" '"\n".join(d["reasons"])'
  assert_line --regexp "^node1 \(rank 0\): the workload ran in a world of 2 \(2 processes: this node alone\), not the job's 4"
  assert_line --regexp "^node2 \(rank 1\): the workload ran in a world of 2 \(2 processes: this node alone\), not the job's 4"
}

# mad::checkout_untouched: no node wrote into the shared checkout (each has its own run directory).
mad::checkout_untouched() {
  run find "${MAD_DIR}" -newer "${BATS_FILE_TMPDIR}/checkout-mark"
  assert_output ""
}

@test "docker, 2 nodes x 2 processes: a madengine model script through real torchrun, one world of 4, SUCCESS" {
  e2e::run_job -N2 -- --manifest "${MAD_MANIFEST}" --model dummy_torchrun_multi --image-cache "${E2E_CACHE}"
  mad::assert_one_torchrun_world
  # The script ran as madengine runs it: bash, in the run directory, with this node's runner.
  local r
  for r in 0 1; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --partial "dummy_torchrun: run directory /myworkspace/run_directory"
    assert_file_exists "${JOB_DIR}/node_${r}/perf_dummy_torchrun.csv"
  done
  # perf.csv holds the script's row (the CSV written in the run directory), its extra column kept.
  run e2e::perf_column "${JOB_DIR}/perf.csv" model
  assert_output dummy_torchrun_allreduce
  run e2e::perf_column "${JOB_DIR}/perf.csv" world_size
  assert_output 4
  run e2e::perf_column "${JOB_DIR}/perf.csv" launcher
  assert_output torchrun
  mad::checkout_untouched
}

@test "a manifest that names no launcher: madengine's torchrun on 2 nodes x 2 processes, one world of 4, SUCCESS" {
  # The worst thing this tool could do: every node training alone and a SUCCESS. No launcher in
  # deployment_config.distributed means madengine's default, torchrun across the nodes.
  e2e::run_job -N2 -- --manifest "${MAD_DIR}/no_launcher_manifest.json" --model dummy_torchrun_multi \
    --image-cache "${E2E_CACHE}"
  mad::assert_one_torchrun_world
}

@test "--launcher none on a multi-node manifest: every node runs alone and the world check fails the job" {
  e2e::run_job -N2 -- --manifest "${MAD_DIR}/no_launcher_manifest.json" --model dummy_torchrun_multi \
    --launcher none --image-cache "${E2E_CACHE}"
  # The job's world is still 2 nodes x 2 processes; each node's `torchrun --standalone` made its own.
  mad::assert_every_node_alone
}

@test "a model script that falls back to a standalone run on every node: FAILURE naming each node, exit 1" {
  e2e::run_job -N2 -- --manifest "${MAD_MANIFEST}" --model dummy_torchrun_standalone --image-cache "${E2E_CACHE}"
  # Each node trained alone and succeeded; the job is still not a 2-node result.
  mad::assert_every_node_alone
  assert_line --regexp "^node1 \(rank 0\): the workload ran in a world of 2 \(2 processes: this node alone\), not the job's 4; .*node.log:[0-9]+: .*Rank: [01]/2"
  run grep -h "world size: 2 node(s) ran in a smaller world than the job's 4" "${JOB_OUT}"
  assert_success
}

@test "the deepspeed runner and madengine's variables on every node of a 3-node job (--launcher deepspeed)" {
  e2e::run_job -N3 -- --manifest "${MAD_MANIFEST}" --model dummy_runner --launcher deepspeed
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  local r collect
  for r in 0 1 2; do
    run grep -h '^mad: ' "${JOB_DIR}/node_${r}/node.log"
    assert_line "mad: MAD_MULTI_NODE_RUNNER=deepspeed --hostfile=/sm-out/deepspeed_hostfile --no_ssh --node_rank=${r} --master_addr=node1 --master_port=29500"
    assert_line "mad: hostfile /sm-out/deepspeed_hostfile: node1 slots=2;node2 slots=2;node3 slots=2;"
    collect=false
    ((r == 0)) && collect=true
    assert_line "mad: MAD_COLLECT_METRICS=${collect}"
    assert_line "mad: NODE_RANK=${r}"
    assert_line "mad: NNODES=3"
    assert_line "mad: NPROC_PER_NODE=2"
    assert_line "mad: MAD_RUNTIME_NGPUS=2"
    assert_line "mad: MAD_SYSTEM_NGPUS=0"
    assert_line "mad: MAD_MODEL_NAME=dummy_runner"
    assert_line "mad: MAD_OUTPUT_CSV=perf_dummy_runner.csv"
    assert_line "mad: TORCH_ELASTIC_RDZV_TIMEOUT=3600"
    assert_line --regexp "^mad: GLOO_SOCKET_IFNAME=[a-z0-9]+$"
    assert_line "mad: MIOPEN_USER_DB_PATH=/tmp/.miopen/node_${r}_rank_\${LOCAL_RANK:-0}"
    assert_line "mad: pwd=/myworkspace/run_directory"
  done
  # The script printed no world size: the summary says the check could not be made.
  run grep -h "world size: not shown by node1 (rank 0), node2 (rank 1), node3 (rank 2)" "${JOB_OUT}"
  assert_success
}

@test "pyxis, 3 nodes x 2 processes: the same madengine script through torchrun in a squashfs, one world of 6" {
  e2e::run_job -N3 -- --manifest "${MAD_MANIFEST}" --model dummy_torchrun_multi --runtime pyxis \
    --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  run mad::one_world "${JOB_DIR}" 6
  assert_success
  local r
  for r in 0 1 2; do
    run cat "${JOB_DIR}/node_${r}/node.log"
    assert_output --regexp "srun --job-name=sm-rank${r} .*--container-mounts=[^ ]*/run_directory:/myworkspace/run_directory[^ ]* --container-workdir=/myworkspace/run_directory "
    assert_output --partial "Launcher Command: torchrun --nnodes=3 --nproc_per_node=2 --node_rank=${r} --master_addr=node1"
    assert_file_exists "${JOB_DIR}/node_${r}/perf_dummy_torchrun.csv"
  done
  run e2e::perf_column "${JOB_DIR}/perf.csv" world_size
  assert_output 6
  # Every node saw the one world of 6 (a warm squashfs is reused: 25-pyxis, toy image).
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["world"]["seen"]')" "{'0': 6, '1': 6, '2': 6}"
  mad::checkout_untouched
}
