#!/usr/bin/env bats
# `make demo` is the newcomer's first command: it must keep working, and work twice.

load helpers

setup_file() {
  e2e::ensure_cluster
}

@test "make demo runs a 2-node job to SUCCESS and prints the summary, and does it again" {
  local pass
  for pass in 1 2; do
    run make --no-print-directory -C "${REPO_ROOT}" demo
    assert_success
    assert_output --partial "building toy/model:local on node1 only"
    assert_output --regexp "job [0-9]+ RUNNING: node_0=[a-z]+ node_1=[a-z]+"
    assert_output --regexp "results: job [0-9]+ \(toy_model, 2 nodes\): SUCCESS"
    assert_output --partial "chosen CSV: node_1/perf_toy.csv"
    assert_output --regexp "toy_model_toy-llm +10142\.5 tok_per_s_per_gpu +SUCCESS"
    assert_output --regexp "rank +node +status +exit +prepare +fitness +image +barrier +run +save-outputs"
    # Where the job's page is, which the batch step wrote.
    assert_output --regexp "Page: +/[^ ]+/slurm_output/toy_model/[0-9]+/report\.html  \(open it in a browser"
    assert_output --partial "make cluster-down"
  done
  # The demo leaves the cluster up.
  run tests/cluster/status
  assert_success
}

@test "make demo NODES=3 spreads the image to three nodes" {
  run make --no-print-directory -C "${REPO_ROOT}" demo NODES=3
  assert_success
  assert_output --regexp "results: job [0-9]+ \(toy_model, 3 nodes\): SUCCESS"
  assert_output --partial "chosen CSV: node_2/perf_toy.csv"
  assert_equal "$(e2e::image_id node3)" "$(e2e::image_id node1)"
}

@test "make demo PROFILE=nsys leaves one settled report per rank" {
  run make --no-print-directory -C "${REPO_ROOT}" demo PROFILE=nsys
  assert_success
  assert_output --regexp "results: job [0-9]+ \(toy_model, 2 nodes\): SUCCESS"
  assert_output --regexp "profile/[0-9]+_node1_rank0\.nsys-rep \([1-9][0-9]* bytes\)"
  assert_output --regexp "profile/[0-9]+_node2_rank1\.nsys-rep \([1-9][0-9]* bytes\)"
}
