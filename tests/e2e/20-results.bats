#!/usr/bin/env bats
# Results on a real cluster: the right CSV is picked, the verdict is deferred to the aggregate,
# and the batch job's exit code is the verdict.

load helpers

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
}

@test "only the last rank has numbers: SUCCESS from its CSV although node 0's CSV is present but empty" {
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  # Node 0 staged a CSV with rows but no performance value: the madengine false FAILURE.
  assert_file_exists "${JOB_DIR}/node_0/perf_toy.csv"
  assert_equal "$(grep -c '^toy-llm,,' "${JOB_DIR}/node_0/perf_toy.csv")" 2
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["chosen_csv"]')" node_2/perf_toy.csv
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" '[c["non_empty"] for c in d["candidates"]]')" "[0, 0, 2]"
  run e2e::perf_column "${JOB_DIR}/perf.csv" performance
  assert_output "$(printf '10143.5\n507.25')"
  run e2e::perf_column "${JOB_DIR}/perf.csv" status
  assert_output "$(printf 'SUCCESS\nSUCCESS')"
  run e2e::perf_column "${JOB_DIR}/perf.csv" machine_name
  assert_line --index 0 "${JOB_ID}"
  run e2e::perf_column "${JOB_DIR}/perf.csv" model
  assert_line --index 0 toy_model_toy-llm
  run head -n 1 "${JOB_DIR}/perf.csv"
  assert_output --regexp '^model,n_gpus,nnodes,gpus_per_node,training_precision,pipeline,args,tags,docker_file,base_docker,docker_sha,docker_image,git_commit,machine_name,deployment_type,launcher,gpu_architecture,performance,metric,relative_change,status,build_duration,test_duration,dataname,data_provider_type,data_size,data_download_duration,build_number,additional_docker_run_options,mode,precision'
  run grep -F 'verdict: SUCCESS' "${JOB_OUT}"
  assert_success
}

@test "re-running collect on the finished job dir from the host gives the same perf.csv, byte for byte" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}"
  assert_equal "${JOB_RC}" 0
  cp "${JOB_DIR}/perf.csv" "${BATS_TEST_TMPDIR}/perf.first.csv"
  run "${REPO_ROOT}/bin/sm-collect" "${JOB_DIR}"
  assert_success
  assert_output --partial SUCCESS
  run cmp "${BATS_TEST_TMPDIR}/perf.first.csv" "${JOB_DIR}/perf.csv"
  assert_success
  run make --no-print-directory -C "${REPO_ROOT}" collect JOBDIR="${JOB_DIR}"
  assert_success
  run cmp "${BATS_TEST_TMPDIR}/perf.first.csv" "${JOB_DIR}/perf.csv"
  assert_success
}

@test "every rank empty: FAILURE rows, and the job exits non-zero" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" -- sh run.sh --steps 5 --empty
  assert_equal "${JOB_RC}" 1
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::perf_column "${JOB_DIR}/perf.csv" status
  assert_output FAILURE
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "performance"
  # Nothing failed on the nodes themselves: the verdict came from the aggregate.
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" '[n["exit_code"] for n in d["nodes"]]')" "[0, 0]"
}

@test "one worker's container exits non-zero: FAILURE naming that node, every output still staged" {
  e2e::run_job -N3 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" -- sh run.sh --steps 5 --fail-rank 1
  assert_equal "${JOB_RC}" 1
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" FAILURE
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "node2 (rank 1)"
  assert_output --partial "exited 3"
  refute_output --partial "node1 (rank 0)"
  refute_output --partial "node3 (rank 2)"
  # The chosen CSV is still reported, and every node's outputs are there.
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["chosen_csv"]')" node_2/perf_toy.csv
  for r in 0 1 2; do
    assert_file_exists "${JOB_DIR}/node_${r}/status.json"
    assert_file_exists "${JOB_DIR}/node_${r}/node.log"
    assert_file_exists "${JOB_DIR}/node_${r}/perf_toy.csv"
  done
  # The failed container left a diagnostic snapshot next to the failure, and its exit code.
  assert_file_exists "${JOB_DIR}/node_1/diagnostics/container-state.txt"
  run cat "${JOB_DIR}/node_1/diagnostics/container-state.txt"
  assert_output --partial "exit=3"
  assert_output --partial "oom_killed=false"
  assert_equal "$(e2e::json "${JOB_DIR}/node_1/status.json" 'd["exit_code"]')" 3
}

@test "a workload past --timeout: stopped, a diagnostic snapshot beside it, exit 124 kept, FAILURE" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --timeout 4 --stop-grace 5 \
    -- sh run.sh --steps 2000
  assert_equal "${JOB_RC}" 1
  local r
  for r in 0 1; do
    assert_equal "$(e2e::json "${JOB_DIR}/node_${r}/status.json" 'd["exit_code"], d["status"]')" "(124, 'timeout')"
    assert_file_exists "${JOB_DIR}/node_${r}/diagnostics/container-state.txt"
    assert_file_exists "${JOB_DIR}/node_${r}/diagnostics/listening-sockets.txt"
    assert_file_exists "${JOB_DIR}/node_${r}/diagnostics/host-processes.txt"
    run cat "${JOB_DIR}/node_${r}/diagnostics/container-state.txt"
    assert_output --partial "reason: timeout after 4 s"
    assert_output --partial "status=running"
  done
  run e2e::json "${JOB_DIR}/summary.json" '" | ".join(d["reasons"])'
  assert_output --partial "timed out after 4 s"
}
