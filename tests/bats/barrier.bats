#!/usr/bin/env bats
# The barrier from the shell: a worker can join with nothing but bash's /dev/tcp and openssl, and
# the token it signs with never shows in a command line or on the wire.

load helpers
bats_require_minimum_version 1.5.0

setup() {
  SM_BARRIER_TOKEN="bats-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  export SM_BARRIER_TOKEN
  unset MASTER_ADDR MASTER_PORT SM_BARRIER_PORT
  SERVE_PID=""
  FAKE_PID=""
}

teardown() {
  local pid
  for pid in "${SERVE_PID}" "${FAKE_PID}"; do
    if [[ -n "${pid}" ]] && kill -0 "${pid}" 2>/dev/null; then
      kill "${pid}" 2>/dev/null || true
      wait "${pid}" 2>/dev/null || true
    fi
  done
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

# load_docs_recipe: source barrier_mac and barrier_join exactly as docs/barrier.md shows them, so
# that the page and this test cannot drift apart. Sets RECIPE (the extracted file).
load_docs_recipe() {
  RECIPE=${BATS_TEST_TMPDIR}/recipe.sh
  # shellcheck disable=SC2016 # a sed script, not an expansion
  sed -n '/^# barrier_mac FIELD/,/^```$/{/^```$/d;p;}' "${REPO_ROOT}/docs/barrier.md" >"${RECIPE}"
  if ! grep -q '^barrier_mac() {' "${RECIPE}" || ! grep -q '^barrier_join() {' "${RECIPE}"; then
    echo "docs/barrier.md no longer holds the barrier_mac/barrier_join recipe" >&2
    return 1
  fi
  # shellcheck source=/dev/null
  source "${RECIPE}"
}

# start_fake_rank0 TOKEN: a fake rank 0 that greets like the real one, then answers any READY with a
# well-formed GO for sha256:evil signed with TOKEN; sets FAKE_PORT.
start_fake_rank0() {
  local script='
import socket, sys
from slurm_multi import auth, wire
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
challenge = auth.new_nonce()
conn.sendall(wire.challenge_line(challenge))
nonce = conn.makefile("rb").readline().decode().split(" ")[2]
conn.sendall(wire.reply_line(sys.argv[1], "GO", challenge, nonce, "1", "sha256:evil"))
conn.close()
'
  "${SM_PYTHON}" -c "${script}" "$1" >"${BATS_TEST_TMPDIR}/fake.port" 3>&- &
  FAKE_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s "${BATS_TEST_TMPDIR}/fake.port" ]] && FAKE_PORT=$(<"${BATS_TEST_TMPDIR}/fake.port") && return 0
    sleep 0.05
  done
  return 1
}

@test "a worker joins from pure bash over /dev/tcp, signs READY with openssl and checks rank 0's GO" {
  start_serve 2 --image-id sha256:abc --timeout 20
  run cat "${BATS_TEST_TMPDIR}/ready"
  assert_output "127.0.0.1 ${PORT}"
  load_docs_recipe

  # The short form from docs/barrier.md; bats owns fd 3, so let bash pick one.
  local line fd challenge nonce image_id
  exec {fd}<>"/dev/tcp/127.0.0.1/${PORT}"
  read -r -t 10 _ challenge <&"${fd}"
  nonce=$(openssl rand -hex 16)
  printf 'READY %s %s 1 start\n' "$(barrier_mac to-rank0 READY "${challenge}" "${nonce}" 1 start)" "${nonce}" >&"${fd}"
  IFS= read -r -t 10 line <&"${fd}"
  # Rank 0 acknowledges a READY it keeps at once, signed: WAIT <mac> 1; the GO follows.
  if [[ ${line} == "WAIT "* ]]; then
    [[ "${line}" == "WAIT $(barrier_mac from-rank0 WAIT "${challenge}" "${nonce}" 1) 1" ]]
    IFS= read -r -t 10 line <&"${fd}"
  fi
  exec {fd}<&-
  image_id=${line##* }
  [[ "${image_id}" == sha256:abc ]]
  [[ "${line}" == "GO $(barrier_mac from-rank0 GO "${challenge}" "${nonce}" 1 "${image_id}") 1 ${image_id}" ]]
  [[ "${line}" != *"${SM_BARRIER_TOKEN}"* ]]

  local rc=0
  wait "${SERVE_PID}" || rc=$?
  [[ "${rc}" -eq 0 ]]
  run cat "${BATS_TEST_TMPDIR}/serve.err"
  assert_output --partial "released 1 worker(s) with image sha256:abc"
  refute_output --partial "${SM_BARRIER_TOKEN}"
}

@test "barrier_mac in bash computes the same MAC as auth.mac, for awkward tokens too" {
  load_docs_recipe
  local token fields=(to-rank0 READY 'a|b' 'é and spaces' '')
  # '6' XORs to a zero byte in the inner pad; quotes, backslash and '|' are legal token characters.
  for token in 6 'x' "q'\"\\|\$*" "$(printf 'k%.0s' {1..64})" "${SM_BARRIER_TOKEN}"; do
    SM_BARRIER_TOKEN=${token} run barrier_mac "${fields[@]}"
    assert_success
    local from_bash=${output}
    SM_BARRIER_TOKEN=${token} run "${SM_PYTHON}" -c \
      'import os, sys; from slurm_multi import auth; print(auth.mac(os.environ["SM_BARRIER_TOKEN"], *sys.argv[1:]))' \
      "${fields[@]}"
    assert_output "${from_bash}"
  done
  SM_BARRIER_TOKEN="$(printf 'k%.0s' {1..65})" run barrier_mac x
  assert_failure 2
  assert_output "barrier_mac: SM_BARRIER_TOKEN must be 1-64 characters"
}

@test "the documented barrier_join tries every port and prints rank 0's image id" {
  start_serve 2 --image-id sha256:abc --timeout 20
  load_docs_recipe
  local nobody
  nobody=$(free_port)
  MASTER_ADDR=127.0.0.1 BARRIER_TIMEOUT=15 run --separate-stderr barrier_join 1 "${nobody}" "${PORT}"
  assert_success
  assert_output "sha256:abc"
  [[ -z "${stderr}" ]]
}

@test "openssl never gets the token on its command line, and set -x does not print it" {
  start_serve 2 --image-id sha256:abc --timeout 20
  load_docs_recipe
  # A recording openssl first on PATH: every command line the recipe runs, as ps would show it.
  mkdir -p "${BATS_TEST_TMPDIR}/shim"
  printf '#!/bin/sh\nprintf "%%s\\n" "$*" >>"%s"\nexec "%s" "$@"\n' \
    "${BATS_TEST_TMPDIR}/openssl.argv" "$(command -v openssl)" >"${BATS_TEST_TMPDIR}/shim/openssl"
  chmod +x "${BATS_TEST_TMPDIR}/shim/openssl"

  PATH="${BATS_TEST_TMPDIR}/shim:${PATH}" MASTER_ADDR=127.0.0.1 BARRIER_TIMEOUT=15 \
    run bash -x -c 'source "$1" && barrier_join 1 "$2"' _ "${RECIPE}" "${PORT}"
  assert_success
  assert_line "sha256:abc"
  refute_output --partial "${SM_BARRIER_TOKEN}"     # the xtrace is in the output too

  run cat "${BATS_TEST_TMPDIR}/openssl.argv"
  assert_line "rand -hex 16"
  assert_line "dgst -sha256 -binary"
  assert_line "dgst -sha256 -r"
  refute_output --partial "${SM_BARRIER_TOKEN}"
  refute_output --partial "$(printf '%s' "${SM_BARRIER_TOKEN}" | od -An -tx1 | tr -d ' \n')"
}

@test "the documented barrier_join refuses a GO that rank 0 did not sign" {
  start_fake_rank0 guessed-token
  load_docs_recipe
  MASTER_ADDR=127.0.0.1 BARRIER_TIMEOUT=10 run --separate-stderr barrier_join 1 "${FAKE_PORT}"
  assert_failure 1
  assert_output ""
  [[ "${stderr}" == "barrier join: 127.0.0.1:${FAKE_PORT} is not our barrier (its GO is not signed with our token)" ]]
}

@test "the documented barrier_join with a wrong token exits 2 once every port refused it" {
  start_serve 2 --image-id sha256:abc --timeout 20
  load_docs_recipe
  SM_BARRIER_TOKEN=not-the-job-token MASTER_ADDR=127.0.0.1 BARRIER_TIMEOUT=10 \
    run --separate-stderr barrier_join 1 "${PORT}"
  assert_failure 2
  assert_output ""
  [[ "${stderr}" == "barrier join: rank 0 on 127.0.0.1 rejected our token on every port; every node must get the same SM_BARRIER_TOKEN" ]]
}

@test "without openssl the documented barrier_join says what is missing in one line and exits 2" {
  load_docs_recipe
  mkdir -p "${BATS_TEST_TMPDIR}/empty"
  # shellcheck disable=SC2016 # $1 expands in the child bash, which finds no openssl on its PATH
  run --separate-stderr env PATH="${BATS_TEST_TMPDIR}/empty" "${BASH}" -c 'source "$1" && barrier_join 1 1' _ "${RECIPE}"
  assert_failure 2
  assert_output ""
  [[ "${stderr}" == "barrier join: openssl is needed to sign READY with the token (HMAC-SHA256); install it, or use slurm-multi barrier join" ]]
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
