#!/usr/bin/env bats
# The pages a person reads, from real jobs, opened in a real browser (Debian's chromium, headless):
# the job page the batch step writes after the verdict (here a FAILURE with a hang), and the page
# across runs of a shared perf.csv with a regression planted in its last run. The DOM is read as the
# browser built it (tests/e2e/report_dom.py) and a screenshot of each page is kept: in
# E2E_SCREENSHOTS when set, else in this file's output dir (its path is printed).

load helpers
bats_require_minimum_version 1.5.0

setup_file() {
  e2e::ensure_cluster
  e2e::toy_image_only_on node1
  export E2E_CACHE=${BATS_FILE_TMPDIR}/image-cache
  export E2E_SCREENSHOTS=${E2E_SCREENSHOTS:-${BATS_FILE_TMPDIR}/screenshots}
  mkdir -p "${E2E_SCREENSHOTS}"
  command -v chromium >/dev/null || {
    echo "chromium is not installed: tests/cluster/install-packages installs it (as root)" >&2
    return 1
  }
}

# report::open PAGE NAME: PAGE in headless Chromium, as a file (no server, no network: a page that
# needed one would show broken): its DOM into ${BATS_TEST_TMPDIR}/NAME.dom, a full-width screenshot
# into ${E2E_SCREENSHOTS}/NAME.png. Root runs it, so without Chromium's sandbox.
report::open() {
  local page=$1 name=$2 args
  args=(--headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
    "--user-data-dir=${BATS_TEST_TMPDIR}/chromium")
  timeout 120 chromium "${args[@]}" --dump-dom "file://${page}" >"${BATS_TEST_TMPDIR}/${name}.dom" 2>/dev/null
  [[ -s ${BATS_TEST_TMPDIR}/${name}.dom ]] || { echo "chromium dumped no DOM for ${page}" >&2; return 1; }
  timeout 120 chromium "${args[@]}" --window-size=1280,4000 "--screenshot=${E2E_SCREENSHOTS}/${name}.png" \
    "file://${page}" >/dev/null 2>&1
  assert_file_exists "${E2E_SCREENSHOTS}/${name}.png"
  echo "# screenshot of ${page}: ${E2E_SCREENSHOTS}/${name}.png" >&3
}

# report::dom NAME id|class WHAT: the text of that element (or of each element of that class).
report::dom() {
  "${SM_PYTHON}" "${REPO_ROOT}/tests/e2e/report_dom.py" "${BATS_TEST_TMPDIR}/$1.dom" "${@:2}"
}

# report::manifest PCT: the toy manifest (absolute paths) with TOY_THROUGHPUT_PCT=PCT in the
# workload's environment: a slower build planted without changing the model's args, which are part
# of the configuration the history compares.
report::manifest() {
  local out=${BATS_FILE_TMPDIR}/manifest-$1.json
  "${SM_PYTHON}" - "${TOY_MANIFEST}" "${out}" "${REPO_ROOT}" "$1" <<'PY'
import json, sys
src, dst, repo, pct = sys.argv[1:]
m = json.load(open(src))
for section in ("built_images", "built_models"):
    for entry in m[section].values():
        entry["dockerfile"] = f"{repo}/examples/toy/Dockerfile"
        if "dockercontext" in entry:
            entry["dockercontext"] = f"{repo}/examples/toy"
        if "scripts" in entry:
            entry["scripts"] = f"{repo}/examples/toy/{entry['scripts']}"
m["context"]["docker_env_vars"]["TOY_THROUGHPUT_PCT"] = pct
json.dump(m, open(dst, "w"), indent=2)
PY
  printf '%s' "${out}"
}

@test "a failed job with a hang: its report.html in Chromium shows FAILURE, every reason, the cause and its stacks" {
  e2e::run_job -N2 -- --manifest "${TOY_MANIFEST}" --image-cache "${E2E_CACHE}" --hang-timeout 5 \
    --peer-grace 2 -- sh run.sh --steps 10 --hang-rank 1
  assert_equal "${JOB_RC}" 1
  # The batch step wrote the page after the verdict, and said where it is.
  assert_file_exists "${JOB_DIR}/report.html"
  run grep -F "report: page: ${JOB_DIR}/report.html" "${JOB_OUT}"
  assert_success
  run grep -c -E '<script|<link |src="https?:|href="https?:' "${JOB_DIR}/report.html"
  assert_output 0
  report::open "${JOB_DIR}/report.html" job-hang
  run report::dom job-hang tags
  refute_line script
  assert_equal "$(report::dom job-hang id verdict)" FAILURE
  # Every reason of summary.json, in its order, as the browser shows them.
  run report::dom job-hang class reason
  assert_output "$(e2e::json "${JOB_DIR}/summary.json" '"\n".join(d["reasons"])')"
  assert_line --index 0 --regexp '^hung: node2 \(rank 1\), no output and no CPU for [0-9]+ s since'
  # The hang: the cause named, and the stacks its diagnostics captured, inline and linked.
  run report::dom job-hang id hang-table
  assert_output --regexp 'cause.*node2.*sleeping'
  run report::dom job-hang id hang
  assert_output --partial "node2 (rank 1), cause: what its diagnostics captured"
  assert_output --partial "node_1/diagnostics/kernel-stacks.txt"
  assert_output --partial "== pid "
  assert_output --partial "node_1/diagnostics/hang-processes.txt"
  run report::dom job-hang id stage-table
  assert_output --partial node1
  assert_output --partial node2
  run grep -c '<svg' "${BATS_TEST_TMPDIR}/job-hang.dom"
  assert_output 1
}

@test "a history with a regression planted in its last run: perf_history.html in Chromium flags it" {
  local shared=${BATS_FILE_TMPDIR}/shared pct manifest
  mkdir -p "${shared}"
  e2e::share_dir "${shared}"
  for pct in 100 100 85; do
    manifest=$(report::manifest "${pct}")
    e2e::run_job -N2 -- --manifest "${manifest}" --image-cache "${E2E_CACHE}" --perf-csv "${shared}/perf.csv"
    assert_equal "${JOB_RC}" 0
    assert_file_exists "${JOB_DIR}/report.html"
  done
  run e2e::perf_column "${shared}/perf.csv" performance
  assert_output "$(printf '10142.5\n507.25\n10142.5\n507.25\n8620.5\n431.25')"
  # Every job appended its nodes' stage times beside the perf.csv.
  assert_equal "$(wc -l <"${shared}/perf_stages.jsonl")" 3
  run slurm-multi report --history "${shared}/perf.csv"
  assert_success
  assert_output --partial "history: ${shared}/perf_history.html"
  assert_output --partial "2 configuration(s), 2 regressed past 5% in their last run"
  report::open "${shared}/perf_history.html" history-regression
  run report::dom history-regression id regression-summary
  assert_output --regexp '^2 configuration\(s\) regressed in their last run past 5%: toy_model_toy-llm · tok_per_s_per_gpu .*-15\.0%'
  run report::dom history-regression class regression
  assert_line REGRESSION
  run report::dom history-regression id last-runs
  assert_output --partial "8620.50"
  assert_output --partial "10142.50"
  run report::dom history-regression id node-stages
  assert_output --partial "toy_model: 3 run(s)"
  assert_output --partial node1
  assert_output --partial node2
  # The plots are inline pictures; nothing is fetched.
  run grep -c 'src="data:image/png;base64,' "${BATS_TEST_TMPDIR}/history-regression.dom"
  assert_output --regexp '^[1-9]'
  run grep -c -E '<script|src="https?:|href="https?:' "${shared}/perf_history.html"
  assert_output 0
}

@test "a job with no manifest: collect writes its page in its own process (no helper of its own)" {
  e2e::run_job -N2 -- --image toy/model:local --image-cache "${E2E_CACHE}" -- sh run.sh --steps 2
  assert_equal "${JOB_RC}" 0
  assert_file_exists "${JOB_DIR}/report.html"
  run grep -F "report: page: ${JOB_DIR}/report.html" "${JOB_OUT}"
  assert_success
  # One writer: collect's call says it; no `slurm-multi report` helper ran.
  run grep -E "bin/slurm-multi (report|results mad-outputs)" "${JOB_OUT}"
  assert_failure
  run grep -E "bin/slurm-multi results collect .*--page" "${JOB_OUT}"
  assert_success
  report::open "${JOB_DIR}/report.html" plain-job
  assert_equal "$(report::dom plain-job id verdict)" SUCCESS
}
