#!/usr/bin/env bats
# lib/timeline.sh: timeline::event appends one line per event to ${SM_NODE_DIR}/events.log
# (`T NAME rank=R host=H KEY=VALUE ...`, percent-encoded). Every line is read back with
# slurm_multi.events.parse_line, the format's one reader (`results collect` and the watch use it).

load helpers
bats_require_minimum_version 1.5.0

setup() {
  # shellcheck source=../../lib/timeline.sh
  source "${REPO_ROOT}/lib/timeline.sh"
  export SM_NODE_DIR=${BATS_TEST_TMPDIR}/job/node_2 SM_RANK=2 SLURMD_NODENAME=node3
  EVENTS=${SM_NODE_DIR}/events.log
}

# events EXPR: EXPR evaluated over `events` (every line of events.log, each with its line end,
# parsed by slurm_multi.events.parse_line); a line that does not parse fails the test.
events() {
  "${SM_PYTHON}" -c '
import sys
from slurm_multi.events import parse_line
lines = open(sys.argv[1], "rb").read().split(b"\n")
assert lines[-1] == b"", "the last line has no line end"
events = [parse_line(line) for line in lines[:-1]]
assert None not in events, "a line does not parse"
print(eval(sys.argv[2]))' "${EVENTS}" "$1"
}

@test "an event is one line: epoch seconds, the event, the rank and the host" {
  before=${EPOCHREALTIME/,/.}
  run timeline::event stage_start stage=image
  assert_success
  assert_output ""
  run events 'len(events), events[0]["event"], events[0]["rank"], events[0]["host"], events[0]["stage"]'
  assert_output "(1, 'stage_start', 2, 'node3', 'image')"
  run events "type(events[0]['t']).__name__, events[0]['t'] >= ${before}, sorted(events[0])"
  assert_output "('float', True, ['event', 'host', 'rank', 'stage', 't'])"
  run cat "${EVENTS}"
  [[ ${output} =~ ^[0-9]+[.][0-9]{6}' stage_start rank=2 host=node3 stage=image'$ ]]
}

@test "percent signs, spaces, newlines, tabs and control characters are percent-encoded" {
  # shellcheck disable=SC1003 # a value that ends in a backslash
  timeline::event 'odd "name"' 'q=say "hi"' 'b=C:\dir\' $'nl=one\ntwo' $'tab=a\tb\rc' $'ctl=\x01\x1b[31mred\x7f' 'u=größe' 'pct=50% %20' 'my key=v'
  assert_equal "$(wc -l <"${EVENTS}")" 1
  run cat "${EVENTS}"
  [[ ${output} == *' odd%20"name" rank=2 host=node3 q=say%20"hi" b=C:\dir\ nl=one%0Atwo tab=a%09b%0Dc ctl=%01%1B[31mred%7F u=größe pct=50%25%20%2520 my%20key=v' ]]
  run events 'events[0]["event"]'
  assert_output 'odd "name"'
  run events '[events[0][k] for k in ("q", "b", "nl", "tab", "ctl", "u", "pct", "my key")]'
  assert_output "['say \"hi\"', 'C:\\\\dir\\\\', 'one\\ntwo', 'a\\tb\\rc', '\\x01\\x1b[31mred\\x7f', 'größe', '50% %20', 'v']"
}

@test "plain numbers are read as numbers, everything else as strings" {
  timeline::event exit code=137 neg=-3 frac=0.25 sci=1e9 zero=0 lead=007 plus=+1 dot=1. word=nan empty= space='1 2' hex=0x10
  run events '{k: v for k, v in events[0].items() if k not in ("t", "event", "rank", "host")}'
  assert_output "{'code': 137, 'neg': -3, 'frac': 0.25, 'sci': 1000000000.0, 'zero': 0, 'lead': '007', 'plus': '+1', 'dot': '1.', 'word': 'nan', 'empty': '', 'space': '1 2', 'hex': '0x10'}"
}

@test "a rank that is not a number is a string; a value may contain '='" {
  SM_RANK=r1 timeline::event go 'arg=--steps=20'
  run events 'events[0]["rank"], events[0]["arg"]'
  assert_output "('r1', '--steps=20')"
}

@test "each call appends one line and keeps what was there" {
  timeline::event stage_start stage=prepare
  timeline::event stage_end stage=prepare status=ok
  first=$(head -n 1 "${EVENTS}")
  timeline::event release
  assert_equal "$(wc -l <"${EVENTS}")" 3
  assert_equal "$(head -n 1 "${EVENTS}")" "${first}"
  run events '[e["event"] for e in events], [e.get("status") for e in events]'
  assert_output "(['stage_start', 'stage_end', 'release'], [None, 'ok', None])"
}

@test "several processes appending at once leave only whole lines" {
  local pid pids=()
  for worker in 1 2 3 4; do
    (for ((i = 0; i < 200; i++)); do timeline::event tick worker="${worker}" i="${i}" pad="$(printf '%0200d' 0)"; done) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "${pid}"; done
  assert_equal "$(wc -l <"${EVENTS}")" 800
  run events 'sorted({(e["worker"], e["i"]) for e in events}) == [(w, i) for w in range(1, 5) for i in range(200)]'
  assert_output True
}

@test "the node directory is created when it is missing" {
  export SM_NODE_DIR=${BATS_TEST_TMPDIR}/new/deeper/node_0
  EVENTS=${SM_NODE_DIR}/events.log
  timeline::event stage_start stage=prepare
  assert_file_exists "${EVENTS}"
}

@test "a write error never fails the caller and is warned about once" {
  mkdir -p "${SM_NODE_DIR}"
  mkdir "${EVENTS}" # a directory where the file should be: every append fails
  # shellcheck disable=SC2016 # the inner shell expands $1
  run --separate-stderr bash -c 'set -Eeuo pipefail; trap "echo ERR-trap >&2" ERR; set -o errtrace
    source "$1"; timeline::event a; timeline::event b; timeline::event c; echo still-running' _ "${REPO_ROOT}/lib/timeline.sh"
  assert_success
  assert_output still-running
  assert_equal "$(grep -c warning <<<"${stderr}")" 1
  assert_equal "$(grep -c ERR-trap <<<"${stderr}")" 0
  [[ ${stderr} == *"cannot append to ${EVENTS}; event a not recorded"* ]]
}

@test "without SM_NODE_DIR nothing is written and the caller goes on" {
  unset SM_NODE_DIR
  run --separate-stderr timeline::event go
  assert_success
  [[ ${stderr} == *"SM_NODE_DIR is not set; event go not recorded"* ]]
}

@test "arguments that are not KEY=VALUE and reserved keys are left out" {
  run --separate-stderr timeline::event go flag rank=9 =x ok=1
  assert_success
  run events 'sorted(events[0]), events[0]["rank"]'
  assert_output "(['event', 'host', 'ok', 'rank', 't'], 2)"
}
