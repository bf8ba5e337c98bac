#!/usr/bin/env bats
# The test cluster itself: real slurmctld/slurmd, one namespace, hostname and docker engine per node.

load helpers

setup_file() {
  e2e::ensure_cluster
}

@test "sbatch -N2 runs the batch step on node1 and one task per node with distinct hostnames and IPs" {
  cd "${BATS_FILE_TMPDIR}"
  cat >smoke.sbatch <<'SCRIPT'
#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1 -o smoke-%j.out
echo "batch $(hostname)"
srun bash -c 'echo "task $(hostname) $(hostname -I | cut -d" " -f1)"'
SCRIPT
  e2e::sbatch_wait smoke.sbatch
  assert_equal "${JOB_RC}" 0
  run cat "smoke-${JOB_ID}.out"
  assert_line "batch node1"
  assert_line "task node1 10.77.0.11"
  assert_line "task node2 10.77.0.12"
  assert_equal "$(grep -c '^task ' "smoke-${JOB_ID}.out")" 2
}

@test "jobs run as an ordinary user in the docker group, not as root" {
  # shellcheck disable=SC2016 # expanded by the job's shell
  run srun -N2 --ntasks-per-node=1 -l bash -c 'echo "$(id -un) $(id -u) $(id -nG)"'
  assert_success
  assert_line --regexp "^0: ${E2E_USER} [1-9][0-9]* ${E2E_USER} docker$"
  assert_line --regexp "^1: ${E2E_USER} [1-9][0-9]* ${E2E_USER} docker$"
}

@test "inside a job step docker talks to that node's own engine" {
  run srun -N3 --ntasks-per-node=1 -l docker info -f '{{.DockerRootDir}}'
  assert_success
  assert_line --regexp '^0: /var/lib/sm-cluster/node1/docker$'
  assert_line --regexp '^1: /var/lib/sm-cluster/node2/docker$'
  assert_line --regexp '^2: /var/lib/sm-cluster/node3/docker$'
}

@test "an image built on node1 is absent on node2" {
  e2e::toy_image_only_on node1
  run tests/cluster/exec node1 docker image inspect -f '{{.Id}}' toy/model:local
  assert_success
  assert_output --regexp '^sha256:'
  run srun -w node2 docker image inspect toy/model:local
  assert_failure
  assert_output --partial 'No such image'
}

@test "nodes reach each other over the bridge (node2 -> node3 TCP)" {
  tests/cluster/exec node3 busybox nc -l -p 24680 -w 10 >"${BATS_TEST_TMPDIR}/got" &
  local listener=$!
  sleep 0.5
  run srun -w node2 bash -c 'echo hello-node3 >/dev/tcp/node3/24680'
  e2e::wait_pid "${listener}" 30 || true
  assert_success
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/got")" hello-node3
}

@test "self-name quirks resolve as asked inside the node" {
  e2e::ensure_cluster --self-name node1=loopback --self-name node2=linklocal
  # ahostsv4, not hosts: `getent hosts` asks for IPv6 first, and with no IPv6 line in the node's
  # hosts file that goes on to DNS, which is not there (10 s of resolver timeouts per call).
  run tests/cluster/exec node1 getent ahostsv4 node1
  assert_line --index 0 --regexp '^127\.0\.1\.1 +STREAM node1'
  run tests/cluster/exec node2 "${SM_PYTHON}" -c \
    'import socket; print(socket.getaddrinfo("node2", 1, socket.AF_INET6, socket.SOCK_STREAM, 0, socket.AI_V4MAPPED)[0][4][0])'
  assert_output --regexp '^fe80:'
  # Other nodes still see the real addresses; the quirk is the node's own view of its name.
  run tests/cluster/exec node3 getent ahostsv4 node1
  assert_line --index 0 --regexp '^10\.77\.0\.11 +STREAM node1'
  run tests/cluster/exec node3 getent ahostsv4 node2
  assert_line --index 0 --regexp '^10\.77\.0\.12 '
  e2e::ensure_cluster
  run tests/cluster/exec node1 getent ahostsv4 node1
  assert_line --index 0 --regexp '^10\.77\.0\.11 +STREAM node1'
}

@test "pyxis is on: srun --help lists its options, tests/cluster/status says so, a squashfs runs on two nodes" {
  run srun --help
  assert_output --partial "--container-image"
  assert_output --partial "--container-mounts"
  run "${REPO_ROOT}/tests/cluster/status"
  assert_line --regexp '^pyxis on \(enroot [0-9.]+, /usr/local/lib/slurm/spank_pyxis.so\)$'
  e2e::toy_image_only_on node1
  local sqsh=${BATS_FILE_TMPDIR}/toy.sqsh
  run srun -w node1 enroot import -o "${sqsh}" dockerd://toy/model:local
  assert_success
  # shellcheck disable=SC2016 # expanded in the container
  run srun -N2 -w node1,node2 -l --container-image="${sqsh}" sh -c 'echo "in $(hostname) $(cat /toy/run.sh | head -c 9)"'
  assert_success
  assert_line '0: in node1 #!/bin/sh'
  assert_line '1: in node2 #!/bin/sh'
}
