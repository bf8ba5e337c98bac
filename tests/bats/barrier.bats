#!/usr/bin/env bats
# The barrier from the shell: a worker can join with nothing but bash's /dev/tcp.

load helpers
bats_require_minimum_version 1.5.0

setup() {
  SM_BARRIER_TOKEN="bats-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  export SM_BARRIER_TOKEN
  unset MASTER_ADDR MASTER_PORT SM_BARRIER_PORT
  SERVE_PID=""
}

teardown() {
  if [[ -n "${SERVE_PID}" ]] && kill -0 "${SERVE_PID}" 2>/dev/null; then
    kill "${SERVE_PID}" 2>/dev/null || true
    wait "${SERVE_PID}" 2>/dev/null || true
  fi
}

# free_port: a loopback port nothing listens on right now.
free_port() {
  "${SM_PYTHON}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_serve <nnodes> [serve options…]: rank 0's barrier in the background; sets PORT.
# It must not inherit fd 3: bats reports through it and waits for every holder to close it.
start_serve() {
  local nnodes="$1"
  shift
  PORT="$(free_port)"
  slurm-multi barrier serve --nnodes "${nnodes}" --bind 127.0.0.1 --port "${PORT}" \
    --ready-file "${BATS_TEST_TMPDIR}/ready" "$@" 2>"${BATS_TEST_TMPDIR}/serve.err" 3>&- &
  SERVE_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s "${BATS_TEST_TMPDIR}/ready" ]] && return 0
    sleep 0.05
  done
  cat "${BATS_TEST_TMPDIR}/serve.err" >&2
  return 1
}

@test "a worker joins from pure bash over /dev/tcp and gets GO with rank 0's image id" {
  start_serve 2 --image-id sha256:abc --timeout 20
  run cat "${BATS_TEST_TMPDIR}/ready"
  assert_output "127.0.0.1 ${PORT}"

  # What a node script does with `exec 3<>/dev/tcp/…`; bats owns fd 3, so let bash pick one.
  local line fd
  exec {fd}<>"/dev/tcp/127.0.0.1/${PORT}"
  printf 'READY %s 1\n' "${SM_BARRIER_TOKEN}" >&"${fd}"
  read -r -t 10 line <&"${fd}"
  exec {fd}<&-
  [[ "${line}" == "GO ${SM_BARRIER_TOKEN} 1 sha256:abc" ]]

  local rc=0
  wait "${SERVE_PID}" || rc=$?
  [[ "${rc}" -eq 0 ]]
  run cat "${BATS_TEST_TMPDIR}/serve.err"
  assert_output --partial "released 1 worker(s) with image sha256:abc"
  refute_output --partial "${SM_BARRIER_TOKEN}"
}

@test "barrier join with a wrong token exits 2 without printing either token" {
  start_serve 2 --image-id sha256:abc --timeout 20
  local real_token="${SM_BARRIER_TOKEN}"

  SM_BARRIER_TOKEN="not-the-job-token" run --separate-stderr \
    slurm-multi barrier join --rank 1 --nnodes 2 --master-addr 127.0.0.1 --port "${PORT}" --connect-timeout 5
  assert_failure 2
  assert_output ""
  [[ "${stderr}" == *"rejected our token"* ]]
  [[ "${stderr}" != *"not-the-job-token"* && "${stderr}" != *"${real_token}"* ]]
  grep -q "bad token" "${BATS_TEST_TMPDIR}/serve.err"
  run ! grep -q -e "${real_token}" -e "not-the-job-token" "${BATS_TEST_TMPDIR}/serve.err"
}

@test "barrier port prints the same candidates every time, one per line" {
  run slurm-multi barrier port --master-port 29500 --job-id 4242
  assert_success
  [[ "${#lines[@]}" -eq 4 ]]
  local first="${output}"
  run slurm-multi barrier port --master-port 29500 --job-id 4242
  assert_output "${first}"
  SM_BARRIER_PORT=21000 run slurm-multi barrier port --master-port 29500 --job-id 4242 --count 2
  assert_output $'21000\n21001'
}
