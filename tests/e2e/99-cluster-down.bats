#!/usr/bin/env bats
# Runs last: `make cluster-down` must leave no namespace, bridge, daemon, rule or mount behind.

load helpers

@test "cluster down leaves no namespace, bridge, daemon, iptables rule or mount behind" {
  e2e::ensure_cluster
  local pids=()
  local f
  for f in "${CLUSTER_STATE}"/*.pid "${CLUSTER_STATE}"/node*/*.pid "${CLUSTER_MUNGE_PID}"; do
    [[ -f ${f} ]] && pids+=("$(<"${f}")")
  done
  ((${#pids[@]} >= 8))
  run make --no-print-directory -C "${REPO_ROOT}" cluster-down
  assert_success
  run ip netns list
  refute_output --partial "${CLUSTER_NETNS_PREFIX}"
  run ip link show "${CLUSTER_BRIDGE}"
  assert_failure
  run iptables -C FORWARD -i "${CLUSTER_BRIDGE}" -o "${CLUSTER_BRIDGE}" -j ACCEPT
  assert_failure
  run grep -E " (${CLUSTER_DATA}|${CLUSTER_STATE}|/run/sm-node)" /proc/mounts
  assert_failure
  for f in "${pids[@]}"; do
    run cluster::alive "${f}"
    assert_failure
  done
  run tests/cluster/status
  assert_failure
}
