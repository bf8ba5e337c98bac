#!/usr/bin/env bats
# A MAD user's whole run on the test cluster, madengine's way: the context's tools (pre-scripts,
# command prefixes, post-scripts, variables) around the model on every node, `$VAR` in args read
# by bash in the container, a local data provider mounted read-only at MAD_DATAHOME with perf.csv's
# data columns, a superset model's perf_super.json with each row's configs, and a script that is
# neither in the model dir nor in the image named in one reason line. Our own fixtures, in
# madengine's shapes (tests/e2e/data/mad: scripts/common/tools.json, data.json, the manifests).

load helpers
bats_require_minimum_version 1.5.0

MAD_DIR=${REPO_ROOT}/tests/e2e/data/mad

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  export E2E_JOB_TIMEOUT=180
}

setup() {
  e2e::wait_for_nodes node1 node2
}

# mad::run_model MODEL: the whole-run manifest's MODEL on 2 nodes, SUCCESS.
mad::run_model() {
  e2e::run_job -N2 -- --manifest "${MAD_DIR}/whole_run_manifest.json" --model "$1"
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
}

@test "two tools, the context's scripts and encapsulate_script run around the model on every node, in madengine's order" {
  e2e::run_job -N2 -- --manifest "${MAD_DIR}/tools_manifest.json"
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"]')" SUCCESS
  local r log
  for r in 0 1; do
    log=${JOB_DIR}/node_${r}/node.log
    # The workload's own lines, in the order they came (pre B, pre A, the context's, the tools'
    # commands outermost first, the model, the context's post-script, post A, post B).
    run grep -oE "^(pre_script [AB]|context pre-script|cmd_[AB]|encapsulated|model: args|context post_script|post_script [AB]( left)?)" "${log}"
    assert_output "$(printf '%s\n' 'pre_script B' 'pre_script A' 'context pre-script' cmd_B cmd_A encapsulated 'model: args' 'context post_script' 'post_script A' 'post_script B' 'post_script B left')"
    # $MAD_MODEL_NAME in args expanded by bash in the container; quotes kept a word whole.
    run grep -h "^model: " "${log}"
    assert_line "model: args [--greeting dummy_tools --quoted a b] rank ${r}/2"
    # The tools' variables, the context's override winning; ../scripts/common as under madengine.
    assert_line "model: SM_TEST_TOOL_A=set by tool A SM_TEST_TOOL_B=overridden by the context"
    assert_line "model: ../scripts/common/tools.json is there"
    run grep -h "context pre-script" "${log}"
    assert_output "context pre-script: from the context (tool A says: set by tool A)"
    # The tools' outputs, staged from the run directory and the workspace into node_<rank>/tools.
    assert_file_exists "${JOB_DIR}/node_${r}/tools/rocprof_output/results.csv"
    assert_file_exists "${JOB_DIR}/node_${r}/tools/dummy_tools_env.csv"
  done
  # Copied out of the container by the node as the job's user: no file of the container's root is
  # left in the scratch dirs (the next job's clean-up would trip over them), and they are gone.
  run find "${JOB_DIR}" -user root
  assert_output ""
  run compgen -G "${TMPDIR:-/tmp}/slurm-multi.${JOB_ID}.r*"
  assert_failure
}

@test "a local data provider: MAD_DATAHOME mounted read-only on every node, perf.csv's data columns filled" {
  mad::run_model dummy_data_local
  local r
  for r in 0 1; do
    run grep -h "^data: " "${JOB_DIR}/node_${r}/node.log"
    assert_line --regexp "^data: sm_data_local at /data_dlm_0: .* on /data_dlm_0 type .*[(,]ro[,)]"
    run grep -h "one sample of the local data set" "${JOB_DIR}/node_${r}/node.log"
    assert_success
  done
  run e2e::perf_column "${JOB_DIR}/perf.csv" dataname
  assert_output sm_data_local
  run e2e::perf_column "${JOB_DIR}/perf.csv" data_provider_type
  assert_output local
  run e2e::perf_column "${JOB_DIR}/perf.csv" data_download_duration
  assert_output 0
}

@test "a custom data provider: its script makes the data in MAD_DATAHOME before the model runs, on every node" {
  mad::run_model dummy_data_custom
  local r
  for r in 0 1; do
    run grep -hE "^(make_data|data): " "${JOB_DIR}/node_${r}/node.log"
    assert_output "$(printf '%s\n' 'make_data: 3 samples in /data_dlm_0' 'data: sm_data_custom at /data_dlm_0: 3 samples')"
  done
  run e2e::perf_column "${JOB_DIR}/perf.csv" data_provider_type
  assert_output custom
}

@test "a superset model: perf_super.json carries each row's own config and its extra columns" {
  mad::run_model dummy_superset
  assert_file_exists "${JOB_DIR}/perf_entry.json"
  assert_file_exists "${JOB_DIR}/perf_super.csv"
  assert_file_exists "${JOB_DIR}/perf_entry_super.json"
  run e2e::json "${JOB_DIR}/perf_super.json" '[(r["model"], r["configs"]["model"], r["configs"]["batch_size"], r["multi_results"]["temperature"], r["status"]) for r in d]'
  assert_output "[('dummy_superset_dummy/model-1', 'dummy/model-1', 8, 61, 'SUCCESS'), ('dummy_superset_dummy/model-2', 'dummy/model-2', 16, 62, 'SUCCESS'), ('dummy_superset_dummy/model-3', 'dummy/model-3', 32, 63, 'SUCCESS')]"
  echo "first record: $(e2e::json "${JOB_DIR}/perf_super.json" 'd[0]')" >&3
}

@test "a manifest away from its checkout: one reason line naming the script, the model dir and --model-dir" {
  local away=${BATS_FILE_TMPDIR}/away
  mkdir -p "${away}"
  cp "${REPO_ROOT}/examples/toy/build_manifest.json" "${away}/"
  e2e::run_job -N2 -- --manifest "${away}/build_manifest.json"
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" '"\n".join(d["reasons"])'
  assert_line --regexp "^node1 \(rank 0\): .*model script scripts/toy_model/run.sh is neither in the model dir ${away} nor in the image's working directory: give --model-dir DIR"
  # The plan said so before any node started.
  run grep -h "warning: model script scripts/toy_model/run.sh is not in the model dir ${away}" "${JOB_OUT}"
  assert_success
}

# mad::rocprof_common DIR: a --mad-common with the fixture's scripts/common, a rocprofv3 tool as
# madengine's tools.json has it (`-d ./rocprof_output`, the output its trace.sh collects) and the
# fake rocprofv3 (tests/fakes: no AMD GPU here) where the container sees it.
mad::rocprof_common() {
  cp -R "${MAD_DIR}/scripts/common" "$1"
  mkdir -p "$1/tools"
  cp "${REPO_ROOT}/tests/fakes/rocprofv3" "$1/tools/rocprofv3"
  cat >"$1/tools.json" <<'JSON'
{"tools": {"rocprofv3": {"pre_scripts": [],
  "cmd": "../scripts/common/tools/rocprofv3 --runtime-trace --kernel-trace --output-format csv -d ./rocprof_output --",
  "env_vars": {}, "post_scripts": []}}}
JSON
}

@test "a profiler tool (rocprofv3, faked): every rank's output staged and judged; a rank without one fails the job" {
  local common=${BATS_FILE_TMPDIR}/mad-common manifest=${BATS_FILE_TMPDIR}/rocprof_manifest.json
  mad::rocprof_common "${common}"
  # The tools manifest with the one profiler tool; its checkout is still tests/e2e/data/mad.
  "${SM_PYTHON}" - "${MAD_DIR}/tools_manifest.json" "${manifest}" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["context"] = {**m["context"], "tools": [{"name": "rocprofv3"}], "pre_scripts": [], "post_scripts": [],
                "encapsulate_script": ""}
json.dump(m, open(sys.argv[2], "w"))
# The same, with the fake told to lose its output on rank 1.
m["context"]["docker_env_vars"] = {"ROCPROF_FAKE_NO_OUTPUT_RANK": "1"}
json.dump(m, open(sys.argv[2].replace(".json", "_lost.json"), "w"))
PY
  e2e::run_job -N2 -- --manifest "${manifest}" --model-dir "${MAD_DIR}" --mad-common "${common}"
  assert_equal "${JOB_RC}" 0
  assert_equal "$(e2e::json "${JOB_DIR}/summary.json" 'd["verdict"], d["profile"]["type"], d["profile"]["complete"]')" "('SUCCESS', 'rocprofv3', True)"
  local r
  for r in 0 1; do
    run find "${JOB_DIR}/node_${r}/tools/rocprof_output" -name '*_kernel_stats.csv'
    assert_output --regexp "/node$((r + 1))/[0-9]+/[0-9]+_kernel_stats.csv$"
  done
  # The profiler lost its output on one node: the job says which, and fails.
  e2e::run_job -N2 -- --manifest "${manifest%.json}_lost.json" --model-dir "${MAD_DIR}" --mad-common "${common}"
  assert_equal "${JOB_RC}" 1
  run e2e::json "${JOB_DIR}/summary.json" '"\n".join(d["reasons"])'
  assert_line --partial "profile incomplete: 1 of 2 reports"
  run grep -h "profile: INCOMPLETE, 1 of 2: node2 (rank 1): rocprofv3: no rocprof_output/ in node_1/tools" "${JOB_OUT}"
  assert_success
}
