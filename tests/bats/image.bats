#!/usr/bin/env bats
# lib/image.sh, lib/cache.sh and the image stage of lib/node.sh without a cluster: every "node" is
# its own engine of the fake docker (tests/fakes/docker, state dir $BATS_TEST_TMPDIR/<node>), the
# shared cache is a directory, enroot is tests/fakes/enroot, and the barrier is replaced by files.

# shellcheck disable=SC2016 # the single-quoted scripts run in the node's shell (see on)
load helpers
bats_require_minimum_version 1.5.0

setup() {
  export TMPDIR=${BATS_TEST_TMPDIR}/tmp
  mkdir -p "${TMPDIR}" "${BATS_TEST_TMPDIR}/bin" "${BATS_TEST_TMPDIR}/ctx"
  ln -s "${REPO_ROOT}/tests/fakes/docker" "${REPO_ROOT}/tests/fakes/enroot" "${BATS_TEST_TMPDIR}/bin/"
  export PATH="${BATS_TEST_TMPDIR}/bin:${PATH}" FAKE_RECORD_DIR=${BATS_TEST_TMPDIR}/calls
  unset SM_IMAGE_CACHE SM_DOCKERFILE SM_REGISTRY_IMAGE SM_IMAGE_ID SM_IMAGE_TRANSPORT SM_CONTAINER_IMAGE SM_NTASKS
  export SM_IMAGE=toy/model:local SM_RUNTIME=docker SM_RANK=0 NNODES=1 SLURM_JOB_ID=57 MASTER_ADDR=node1 MASTER_PORT=29500
  export SM_NODE_DIR=${BATS_TEST_TMPDIR}/node_0 SM_SCRATCH=${BATS_TEST_TMPDIR}/scratch SM_JOBDIR=${BATS_TEST_TMPDIR}/job
  mkdir -p "${SM_NODE_DIR}" "${SM_SCRATCH}"
  printf 'FROM scratch\nWORKDIR /toy\nENTRYPOINT ["/bin/busybox", "sh", "/toy/entry.sh"]\nCMD ["sh", "run.sh"]\n' \
    >"${BATS_TEST_TMPDIR}/ctx/Dockerfile"
  export CACHE=${BATS_TEST_TMPDIR}/cache
  export KEY=toy_model_local-$(printf %s toy/model:local | sha256sum | cut -c1-8)
  export TAR=${CACHE}/${KEY}.tar SQSH=${CACHE}/${KEY}.sqsh
  # The barrier, replaced by files: rank 0's control lines (RELEASE/ABORT) go to control, a worker's
  # release is $RELEASED, its abort to rank 0 goes to aborted.
  cat >"${BATS_TEST_TMPDIR}/barrier.sh" <<'EOF'
node::serve_barrier() { exec {BARRIER_CTL}>>"${BATS_TEST_TMPDIR}/control"; }
node::await_release() { NODE_RELEASED=${RELEASED}; }
node::barrier_abort() { printf '%s\n' "$1" >>"${BATS_TEST_TMPDIR}/aborted"; }
node::stop_join() { :; }
EOF
}

# on NODE SCRIPT | on NODE CMD ARGS...: with the libraries loaded (as bin/sm-node runs them), against
# NODE's docker engine.
on() {
  local node=$1
  shift
  FAKE_DOCKER_STATE=${BATS_TEST_TMPDIR}/${node} SLURMD_NODENAME=${node} bash -c '
    set -Eeuo pipefail
    for lib in log util settings timeline cache image run node; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    settings::resolve_env # the settings as the batch step exports them (the table'"'"'s defaults)
    if (($# == 1)); then eval "$1"; else "$@"; fi' on "$@"
}

# stage NODE RANK [SCRIPT]: node::stage_image of rank RANK of a 2-node job on NODE (SCRIPT first);
# then rc=, reason=, image_id=, sqsh= lines.
stage() {
  SM_RANK=$2 NNODES=2 SM_NODE_DIR=${BATS_TEST_TMPDIR}/node_$2 on "$1" "
    mkdir -p \"\${SM_NODE_DIR}\"
    source \"\${BATS_TEST_TMPDIR}/barrier.sh\"
    ${3:-}
    rc=0
    node::stage_image || rc=\$?
    printf 'rc=%s\nreason=%s\nimage_id=%s\nsqsh=%s\n' \"\${rc}\" \"\${NODE_REASON}\" \"\${SM_IMAGE_ID:-}\" \"\${SM_IMAGE_SQSH:-}\""
}

# build NODE: the toy image built on NODE's engine; prints its ID.
build() {
  FAKE_DOCKER_STATE=${BATS_TEST_TMPDIR}/$1 docker build -q -t toy/model:local \
    --label org.slurm-multi.fingerprint=fp "${BATS_TEST_TMPDIR}/ctx"
}

image_id_on() { FAKE_DOCKER_STATE=${BATS_TEST_TMPDIR}/$1 docker image inspect -f '{{.Id}}' "${2:-toy/model:local}"; }

sidecar() { sed -n "s/^$2=//p" "$1"; }

# calls [TOOL]: every recorded call of the fake, one line each: <node> <argv without argv[0]>.
calls() {
  [[ -f ${FAKE_RECORD_DIR}/${1:-docker}.jsonl ]] || return 0
  "${SM_PYTHON}" -c '
import json, os, sys
for line in open(sys.argv[1]):
    call = json.loads(line)
    print(os.path.basename(call["env"].get("FAKE_DOCKER_STATE", "")), *call["argv"][1:])
' "${FAKE_RECORD_DIR}/${1:-docker}.jsonl"
}

count_calls() { calls "${2:-docker}" | grep -c "^$1" || true; }

temp_files() { find "${CACHE}" -name '*.tmp*' | wc -l; }

# save_slowly ID FINGERPRINT LOG: node1 saves ID into the cache in the background, its docker save
# taking a while; returns once the save is under way (its temp file exists). SAVER is its pid.
save_slowly() {
  FAKE_DOCKER_SAVE_SECONDS=1.5 on node1 image::cache_save "${CACHE}" "${KEY}" "$1" "$2" 2>"$3" &
  SAVER=$!
  local deadline=$((SECONDS + 20))
  until compgen -G "${CACHE}/.${KEY}.tar.tmp.*" >/dev/null || ((SECONDS > deadline)); do sleep 0.05; done
}

# hold_lock -x|-s: another job holds the image's cache lock (HOLDER is its pid) until killed.
hold_lock() {
  mkdir -p "${CACHE}"
  (exec 9>>"${CACHE}/.${KEY}.lock" && flock "$1" 9 && exec sleep 30) &
  HOLDER=$!
  until ! flock -n "${CACHE}/.${KEY}.lock" true; do sleep 0.05; done
}

# ---- rank 0 obtains the image --------------------------------------------------------------------

@test "a sidecar's value: its first KEY= line, read without a process, printed or into a variable" {
  local dir=${BATS_TEST_TMPDIR}/cache
  mkdir -p "${dir}"
  printf 'id=sha256:aa\nimage=toy/model:local\nidx=1\nbytes=4096\nid=sha256:bb\nargs=a=b c\ncksum=77' >"${dir}/k.id"
  run bash -c '
    for lib in log util cache; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    PATH= # no sed, no head: a process would fail here
    cache::get "$1/k.tar" id; echo
    cache::get "$1/k.tar" args; echo
    cache::get "$1/k.tar" cksum; echo   # (the last line, without a newline)
    cache::get "$1/k.tar" missing; echo "[missing]"
    cache::sidecar_get "$1/none.id" id; echo "[no file]"
    v=stale; cache::get "$1/k.tar" bytes v; echo "v=${v}"
    v=stale; cache::get "$1/k.tar" missing v; echo "v=${v}"
    cache::sidecar "$1/k.tar" s; cache::sidecar "$1/k.sqsh"; echo " s=${s}"' _ "${dir}"
  assert_success
  assert_output "sha256:aa
a=b c
77
[missing]
[no file]
v=4096
v=
${dir}/k.sqsh.id s=${dir}/k.id"
}

@test "a cache entry's name is the reference with every other byte made _, then 8 hex of its sha256 (existing caches keep their names)" {
  local ref want
  for ref in toy/model:local 'rocm/pytorch:rocm6.2_ubuntu22.04_py3.10' 'réf/ü:1' 'x*y[z] w' ''; do
    want=$(printf '%s' "${ref}" | tr -c 'A-Za-z0-9._-' '_')-$(printf '%s' "${ref}" | sha256sum | cut -c1-8)
    LANG=C.UTF-8 run on node1 image::cache_key "${ref}"
    assert_output "${want}"
  done
  # Worked out once per shell: asked again (no sha256sum to run now), the same; another ref, its own.
  run on node1 'image::key_into toy/model:local; first=${IMAGE_KEY}
    PATH=/nonexistent image::key_into toy/model:local; echo "${first} ${IMAGE_KEY}"
    image::key_into "a b"; echo "${IMAGE_KEY}"'
  assert_line --index 0 "${KEY} ${KEY}"
  assert_line --index 1 "a_b-$(printf %s 'a b' | sha256sum | cut -c1-8)"
}

@test "a node takes the job image's cache key from the batch step; another ref, or a key not of that ref, is worked out" {
  # The batch step exports it (job::run): no process on the node (an empty PATH would fail one).
  JOB_IMAGE=toy/model:local SM_JOB_IMAGE_KEY=${KEY} run on node1 'PATH= image::key_into toy/model:local; echo "${IMAGE_KEY}"'
  assert_output "${KEY}"
  JOB_IMAGE=toy/model:local SM_JOB_IMAGE_KEY=${KEY} run on node1 'image::key_into other:1; echo "${IMAGE_KEY}"'
  assert_output "other_1-$(printf %s other:1 | sha256sum | cut -c1-8)"
  # Inherited from somewhere else (a stale or foreign value): not that ref's shape, not taken.
  JOB_IMAGE=toy/model:local SM_JOB_IMAGE_KEY=toy_model_local-zz run on node1 'image::key_into toy/model:local; echo "${IMAGE_KEY}"'
  assert_output "${KEY}"
  JOB_IMAGE=toy/model:local SM_JOB_IMAGE_KEY=other_1-12345678 run on node1 'image::key_into toy/model:local; echo "${IMAGE_KEY}"'
  assert_output "${KEY}"
}

@test "rank 0 without the image and nothing to build it from pulls the manifest's registry_image, tagged as the image" {
  export SM_REGISTRY_IMAGE=registry.example/toy:1
  run --separate-stderr on node1 image::ensure_on_rank0
  assert_success
  assert_output "$(image_id_on node1 registry.example/toy:1)"
  run calls
  assert_line "node1 pull -q registry.example/toy:1"
  assert_line "node1 tag registry.example/toy:1 toy/model:local"
  refute_line "node1 pull -q toy/model:local"
}

@test "without a registry_image rank 0 pulls the image itself, and a failed pull names both" {
  run on node1 image::ensure_on_rank0
  assert_failure
  assert_output --partial "toy/model:local is not on"
  export SM_REGISTRY_IMAGE=elsewhere/toy:1
  run on node1 image::ensure_on_rank0
  assert_failure
  assert_output --partial "cannot be built or pulled (registry_image elsewhere/toy:1)"
}

# ---- the tar cache: one entry protocol ------------------------------------------------------------

@test "cache miss: the tar is written under a temp name, renamed into place, then its sidecar (ID, size, cksum)" {
  local id
  id=$(build node1)
  save_slowly "${id}" fp1 "${BATS_TEST_TMPDIR}/save.log"
  # Half written: only the temp file is there, no tar and no sidecar a reader could take.
  assert_file_not_exists "${TAR}"
  assert_file_not_exists "${CACHE}/${KEY}.id"
  wait "${SAVER}"
  run cat "${BATS_TEST_TMPDIR}/save.log"
  assert_output --regexp "\+ bash -o pipefail -c .* save toy/model:local ${CACHE}/\.${KEY}\.tar\.tmp\.[0-9]+\.[0-9]+"
  assert_output --partial "saved toy/model:local into ${TAR}"
  local side=${CACHE}/${KEY}.id
  assert_equal "$(sidecar "${side}" id)" "${id}"
  assert_equal "$(sidecar "${side}" image)" toy/model:local
  assert_equal "$(sidecar "${side}" fingerprint)" fp1
  assert_equal "$(sidecar "${side}" bytes)" "$(stat -c %s "${TAR}")"
  assert_equal "$(sidecar "${side}" cksum)" "$(cksum <"${TAR}" | cut -d' ' -f1)"
  assert_equal "$(sidecar "${side}" saved_by)" "$(hostname) job 57"
  assert_equal "$(temp_files)" 0
  run grep -c ' image_save_\(start\|end\) ' "${SM_NODE_DIR}/events.log"
  assert_output 2
  # The tar is the image: another node loads it and then has rank 0's ID.
  run --separate-stderr on node2 image::cache_load "${CACHE}" "${KEY}" "${id}"
  assert_success
  assert_output "${id}"
  assert_equal "$(image_id_on node2)" "${id}"
}

@test "cache hit: a tar whose sidecar names the image at the tar's size is not saved again" {
  local id
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  run on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp
  assert_success
  assert_output --partial "cache hit: ${TAR} already holds ${id:7:12}; no save"
  assert_equal "$(count_calls 'node1 save')" 1
  SM_IMAGE_CACHE=${CACHE} run on node1 image::transport "${id}"
  assert_output cache
}

@test "a tar is a hit only at the size its sidecar records: a cut or padded one is never loaded, and rank 0 saves it again" {
  local id change
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  cp "${TAR}" "${BATS_TEST_TMPDIR}/good.tar"
  for change in cut padded; do
    # A padded tar would load (tar readers skip trailing zeros): only the size check stops it.
    if [[ ${change} == cut ]]; then truncate -s -1 "${TAR}"; else head -c 1024 /dev/zero >>"${TAR}"; fi
    run on node1 cache::holds "${TAR}" "${id}"
    assert_failure 2
    run on node2 image::cache_load "${CACHE}" "${KEY}" "${id}"
    assert_failure
    assert_output --partial "${TAR} is not the tar its sidecar describes"
    assert_equal "$(count_calls 'node2 load')" 0
    SM_IMAGE_CACHE=${CACHE} run on node1 image::transport "${id}"
    assert_output relay
    run on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp
    assert_success
    assert_output --partial "${TAR} does not match its sidecar"
    assert_output --partial "saved toy/model:local into ${TAR}"
    cmp "${TAR}" "${BATS_TEST_TMPDIR}/good.tar"
  done
}

@test "a sidecar that names another image, or none, is not a hit: a worker does not load it, rank 0 replaces it" {
  local id other=sha256:0000000000000000000000000000000000000000000000000000000000000000
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  sed -i "s/^id=.*/id=${other}/" "${CACHE}/${KEY}.id"
  run on node2 image::cache_load "${CACHE}" "${KEY}" "${id}"
  assert_failure
  run on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp
  assert_success
  assert_output --partial "stale tar in the cache (holds 000000000000, want ${id:7:12}); replacing it"
  assert_equal "$(sidecar "${CACHE}/${KEY}.id" id)" "${id}"
  # No id= at all: no image is any image.
  sed -i '/^id=/d' "${CACHE}/${KEY}.id"
  run on node2 image::cache_load "${CACHE}" "${KEY}" ""
  assert_failure
  assert_equal "$(count_calls 'node2 load')" 0
}

@test "a dead writer's temp file is never read, and the next writer of that entry removes it under the lock" {
  local id
  id=$(build node1)
  mkdir -p "${CACHE}"
  head -c 4096 /dev/zero >"${CACHE}/.${KEY}.tar.tmp.999.1"
  echo "killed" >"${CACHE}/.${KEY}.tar.tmp.999.1.err"
  touch "${CACHE}/.other_image-12345678.tar.tmp.999.1"
  run on node2 image::cache_load "${CACHE}" "${KEY}" "${id}"
  assert_failure
  run on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp
  assert_success
  assert_file_not_exists "${CACHE}/.${KEY}.tar.tmp.999.1"
  assert_file_not_exists "${CACHE}/.${KEY}.tar.tmp.999.1.err"
  # Another entry's temp file is not this writer's to judge.
  assert_file_exists "${CACHE}/.other_image-12345678.tar.tmp.999.1"
}

@test "two writers at once: the second waits on the lock and finds the first one's tar (one save, one cache hit)" {
  local id
  id=$(build node1)
  save_slowly "${id}" fp "${BATS_TEST_TMPDIR}/a.log"
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>"${BATS_TEST_TMPDIR}/b.log"
  wait "${SAVER}"
  run grep -c "saved toy/model:local" "${BATS_TEST_TMPDIR}/a.log"
  assert_output 1
  run grep -c "cache hit" "${BATS_TEST_TMPDIR}/b.log"
  assert_output 1
  assert_equal "$(count_calls 'node1 save')" 1
}

@test "a writer or reader that cannot take the lock within SM_CACHE_LOCK_TIMEOUT gives up, naming the lock, and touches nothing" {
  local id
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  hold_lock -x
  rm -f "${TAR}"
  SM_CACHE_LOCK_TIMEOUT=1 run on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp
  assert_failure
  assert_output --partial "timed out waiting for the cache lock ${CACHE}/.${KEY}.lock"
  assert_equal "$(count_calls 'node1 save')" 1
  SM_CACHE_LOCK_TIMEOUT=1 run on node2 image::cache_load "${CACHE}" "${KEY}" "${id}"
  assert_failure
  assert_equal "$(count_calls 'node2 load')" 0
  kill "${HOLDER}"
}

# ---- pyxis: the squashfs, through the same protocol ------------------------------------------------

@test "the squashfs goes through the same protocol: enroot writes a temp name, renamed, then the sidecar; a hit imports nothing" {
  export SM_RUNTIME=pyxis SM_IMAGE_CACHE=${CACHE}
  local id
  id=$(build node1)
  mkdir -p "${CACHE}"
  touch "${CACHE}/.${KEY}.sqsh.tmp.999.1"
  run --separate-stderr on node1 'image::pyxis_rank0; printf "%s\n" "${IMAGE_SQSH}" "${IMAGE_SQSH_ID}" "${SM_IMAGE_ID}"'
  assert_success
  assert_line --index 0 "${SQSH}"
  assert_line --index 1 "sqsh:$(stat -c %s "${SQSH}"):$(cksum <"${SQSH}" | cut -d' ' -f1)"
  assert_line --index 2 "${id}"
  local released=${lines[1]}
  run calls enroot
  assert_line --regexp "^node1 import -o ${CACHE}/\.${KEY}\.sqsh\.tmp\.[0-9]+\.[0-9]+ dockerd://toy/model:local$"
  assert_equal "$(temp_files)" 0
  assert_equal "$(sidecar "${SQSH}.id" id)" "${id}"
  assert_equal "$(sidecar "${SQSH}.id" bytes)" "$(stat -c %s "${SQSH}")"
  assert_equal "$(sidecar "${SQSH}.id" cksum)" "$(cksum <"${SQSH}" | cut -d' ' -f1)"
  assert_equal "$(sidecar "${SQSH}.id" made_by)" "$(hostname) job 57"
  assert_equal "$(sidecar "${SQSH}.id" workdir)" /toy
  assert_equal "$(cat "${SQSH}.cmd")" "$(printf '%s\n' /bin/busybox sh /toy/entry.sh sh run.sh)"
  run on node1 'image::pyxis_rank0 && echo "released ${IMAGE_SQSH_ID}"'
  assert_success
  assert_output --partial "squashfs cache hit: ${SQSH} holds ${id:7:12}; no import"
  assert_line "released ${released}"
  assert_equal "$(count_calls node1 enroot)" 1
  # Overwritten in place, same size: only the cksum tells, and rank 0 imports it again.
  printf 'X' | dd of="${SQSH}" bs=1 seek=100 conv=notrunc 2>/dev/null
  run on node1 image::pyxis_rank0
  assert_success
  assert_output --partial "${SQSH} does not match its sidecar (corrupt or cut"
  assert_equal "$(count_calls node1 enroot)" 2
  assert_equal "$(sidecar "${SQSH}.id" cksum)" "$(cksum <"${SQSH}" | cut -d' ' -f1)"
}

@test "a failed enroot import leaves no squashfs, sidecar or temp file, and says enroot's last line" {
  export SM_RUNTIME=pyxis SM_IMAGE_CACHE=${CACHE}
  build node1 >/dev/null
  FAKE_ENROOT_FAIL="Write failed because No space left on device" run on node1 image::pyxis_rank0
  assert_failure
  assert_output --partial "enroot import of toy/model:local failed: [ERROR] Write failed because No space left on device (is the disk full?)"
  assert_file_not_exists "${SQSH}"
  assert_file_not_exists "${SQSH}.id"
  assert_equal "$(temp_files)" 0
}

@test "the tar and the squashfs of one image share its lock: a squashfs writer waits for the tar's" {
  export SM_RUNTIME=pyxis SM_IMAGE_CACHE=${CACHE}
  build node1 >/dev/null
  hold_lock -s
  SM_CACHE_LOCK_TIMEOUT=1 run on node1 image::pyxis_rank0
  assert_failure
  assert_output --partial "timed out waiting for the cache lock ${CACHE}/.${KEY}.lock"
  assert_equal "$(count_calls node1 enroot)" 0
  kill "${HOLDER}"
}

# ---- the image stage: one flow, the runtime's verbs ----------------------------------------------

@test "a cache entry of the image: the layered one first, the whole-image tar after it, only the tar with --image-layers off" {
  mkdir -p "${CACHE}"
  local id=sha256:$(printf '%064d' 7) other=sha256:$(printf '%064d' 8)
  printf 'index' >"${CACHE}/${KEY}.layers"
  printf 'id=%s\nbytes=5\n' "${id}" >"${CACHE}/${KEY}.layers.id"
  printf 'a tar' >"${TAR}"
  printf 'id=%s\nbytes=5\n' "${id}" >"${CACHE}/${KEY}.id"
  run on node1 'image::cache_entry "${CACHE}/${KEY}" '"${id}"' && echo "${IMAGE_CACHE_ENTRY}"'
  assert_output "${CACHE}/${KEY}.layers"
  SM_IMAGE_LAYERS=off run on node1 'image::cache_entry "${CACHE}/${KEY}" '"${id}"' && echo "${IMAGE_CACHE_ENTRY}"'
  assert_output "${TAR}"
  printf 'id=%s\nbytes=5\n' "${other}" >"${CACHE}/${KEY}.layers.id" # a stale index: the tar holds it
  run on node1 'image::cache_entry "${CACHE}/${KEY}" '"${id}"' && echo "${IMAGE_CACHE_ENTRY}"'
  assert_output "${TAR}"
  run on node1 'image::cache_entry "${CACHE}/${KEY}" sha256:none || echo none'
  assert_output none
}

@test "rank 0 whose engine cannot say its image's layers moves and caches the whole image, saying why" {
  export SM_IMAGE_CACHE=${CACHE} SM_IMAGE_TRANSPORT=cache DOCKER_HOST=unix://${BATS_TEST_TMPDIR}/no-engine.sock
  local id
  id=$(build node1)
  echo "1 - - layers:0" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0
  assert_line "rc=0"
  assert_output --partial "image: the whole image moves: the docker engine did not answer /info on its socket"
  assert_equal "$(sidecar "${CACHE}/${KEY}.id" id)" "${id}"
  assert_file_not_exists "${CACHE}/${KEY}.layers"
}

@test "rank 0 releases its image ID after filling the cache; workers that already hold it get it at once, nothing moves" {
  export SM_IMAGE_CACHE=${CACHE} SM_IMAGE_TRANSPORT=cache
  local id
  id=$(build node1)
  echo "1 -" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE ${id}"
  assert_equal "$(sidecar "${CACHE}/${KEY}.id" id)" "${id}"
  # The tar is complete before the workers hear of it.
  run awk '{ print $2 }' "${BATS_TEST_TMPDIR}/node_0/events.log"
  assert_output "$(printf '%s\n' image_save_start image_save_end release)"
  # A warm job: every worker said it holds rank 0's ID.
  rm -f "${BATS_TEST_TMPDIR}/control" "${TAR}"
  echo "1 ${id}" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0
  assert_line "rc=0"
  assert_output --partial "every worker already holds toy/model:local ${id:7:12}: nothing to save, stream or load"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE ${id}"
  assert_file_not_exists "${TAR}"
  assert_equal "$(count_calls 'node1 save')" 1
  # A worker that reconnected said it again: its last line counts (it loaded the image meanwhile).
  rm -f "${BATS_TEST_TMPDIR}/control"
  printf '1 -\n1 %s\n' "${id}" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0
  assert_line "rc=0"
  assert_output --partial "every worker already holds toy/model:local ${id:7:12}"
  assert_equal "$(count_calls 'node1 save')" 1
}

@test "rank 0 reads each worker's last word on what it holds: a holder among others, a silent worker, a last line without its end" {
  local id=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
  printf '1 %s\n2 -\n1 -\n2 %s\n' "${id}" "${id}" >"${SM_SCRATCH}/barrier.holds"
  run on node1 "SM_NTASKS=3; node::workers_hold ${id} && echo held || echo moved"
  assert_line --partial "1 of 2 worker(s) already hold ${id:7:12}"
  assert_line moved
  printf '2 %s\n' "${id}" >"${SM_SCRATCH}/barrier.holds"
  run on node1 "SM_NTASKS=3 NODE_HOLDS_WAIT=0; node::workers_hold ${id} && echo held || echo moved"
  assert_line --partial "1 worker(s) did not say within 0 s which image they hold; moving the image"
  assert_line moved
  printf '1 %s\n2 %s' "${id}" "${id}" >"${SM_SCRATCH}/barrier.holds"
  run on node1 "SM_NTASKS=3; node::workers_hold ${id} && echo held || echo moved"
  assert_output held
}

@test "rank 0 sends the warm cache only when every worker sees its tar; a node-local cache is relayed, or refused when forced" {
  export SM_IMAGE_CACHE=${CACHE} SLURM_JOB_NODELIST=node1,node2
  local id
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  # The worker sees the same tar: the cache it is.
  echo "1 - ${id:7:16}" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0
  assert_line "rc=0"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE ${id}"
  refute_output --partial "relaying"
  # It sees no tar there (a node-local dir): the relay, saying why.
  rm -f "${BATS_TEST_TMPDIR}/control"
  echo "1 - -" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0 'image::relay_send() { return 0; }'
  assert_line "rc=0"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE relay+${id}"
  assert_output --partial "rank 1 (node2) do(es) not see the toy/model:local tar that rank 0 sees (${TAR}): --image-cache ${CACHE} must be the same shared directory on every node; relaying the image instead"
  # Another image's tar under that name, or a worker that never said: not seen either.
  for said in "1 - 0123456789abcdef" ""; do
    rm -f "${BATS_TEST_TMPDIR}/control"
    printf '%s' "${said:+${said}$'\n'}" >"${SM_SCRATCH}/barrier.holds"
    run stage node1 0 'image::relay_send() { return 0; }; NODE_HOLDS_WAIT=0'
    assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE relay+${id}"
  done
  # --image-transport cache: the job cannot do what it was told, and says so before anything moves.
  rm -f "${BATS_TEST_TMPDIR}/control"
  echo "1 - -" >"${SM_SCRATCH}/barrier.holds"
  SM_IMAGE_TRANSPORT=cache run stage node1 0
  assert_line "rc=1"
  assert_line --partial "reason=rank 0 ($(hostname)): image stage failed: --image-transport cache: rank 1 (node2) do(es) not see"
  assert_equal "$(head -c 6 "${BATS_TEST_TMPDIR}/control")" "ABORT "
  # Forced to a cache that is not configured: nothing to check (the workers rebuild or pull).
  rm -f "${BATS_TEST_TMPDIR}/control"
  SM_IMAGE_CACHE='' SM_IMAGE_TRANSPORT=cache run stage node1 0 'unset SM_IMAGE_CACHE'
  assert_line "rc=0"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE ${id}"
}

@test "rank 0 that cannot obtain the image tells every worker why (ABORT) and fails with that reason" {
  run stage node1 0
  local reason="rank 0 ($(hostname)): image stage failed: cannot obtain toy/model:local (see node_0/node.log)"
  assert_line "rc=1"
  assert_line "reason=${reason}"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "ABORT ${reason}"
  refute grep -qs ' release ' "${BATS_TEST_TMPDIR}/node_0/events.log"
}

@test "rank 0 releases relay+ID first, then streams; a relay that fails aborts the workers with the relay's reason" {
  export SM_IMAGE_TRANSPORT=relay
  local id
  id=$(build node1)
  echo "1 -" >"${SM_SCRATCH}/barrier.holds"
  run stage node1 0 'image::relay_send() { [[ -s ${BATS_TEST_TMPDIR}/control ]] && IMAGE_RELAY_ERROR="node2 did not take the stream ($1)"; return 1; }'
  local reason="rank 0 ($(hostname)): image stage failed: node2 did not take the stream (${id})"
  assert_line "rc=1"
  assert_line "reason=${reason}"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "$(printf 'RELEASE relay+%s\nABORT %s' "${id}" "${reason}")"
}

@test "rank 0 run alone (a re-run of a 2-node job) obtains the image and fills the cache itself, with no barrier" {
  export SM_IMAGE_CACHE=${CACHE}
  local id
  id=$(build node1)
  run stage node1 0 'NODE_FROM_JOB=1'
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_equal "$(sidecar "${CACHE}/${KEY}.id" id)" "${id}"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/control"
}

@test "a worker loads rank 0's released image from the shared tar and runs rank 0's ID" {
  export SM_IMAGE_CACHE=${CACHE}
  local id
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  RELEASED=${id} run stage node2 1
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_output --partial "rank 0's image is toy/model:local ${id:7:12}"
  assert_output --partial "loaded toy/model:local from the cache"
  assert_equal "$(image_id_on node2)" "${id}"
  run awk '{ print $2 }' "${BATS_TEST_TMPDIR}/node_1/events.log"
  assert_output "$(printf '%s\n' image_load_start image_load_end)"
  # Next time it holds it: no load.
  RELEASED=${id} run stage node2 1
  assert_output --partial "already present with rank 0's ID ${id:7:12}; no load"
  assert_equal "$(count_calls 'node2 load')" 1
}

@test "a worker takes the image its prepare found on the engine (IMAGE_LOCAL_*) once; none found, or a second look, asks the engine" {
  local id
  id=$(build node2)
  # Prepare's answer names rank 0's ID: no docker CLI at all in the image stage.
  RELEASED=${id} run stage node2 1 "IMAGE_LOCAL_ASKED=1 IMAGE_LOCAL_ID=${id} IMAGE_LOCAL_LABEL=fp"
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_output --partial "already present with rank 0's ID ${id:7:12}; no load"
  assert_equal "$(count_calls 'node2 image inspect')" 0
  # Prepare found none: the engine is asked again (another job may have loaded it since).
  RELEASED=${id} run stage node2 1 "IMAGE_LOCAL_ASKED=1 IMAGE_LOCAL_ID= IMAGE_LOCAL_LABEL="
  assert_line "rc=0"
  assert_output --partial "already present with rank 0's ID ${id:7:12}; no load"
  assert_equal "$(count_calls 'node2 image inspect')" 1
  # Used once: the next look is the engine's (it says what is there now).
  run on node2 'IMAGE_LOCAL_ASKED=1 IMAGE_LOCAL_ID=sha256:old IMAGE_LOCAL_LABEL=old
    image::held; echo "${IMAGE_HELD_ID} ${IMAGE_HELD_LABEL}"; image::held; echo "${IMAGE_HELD_ID} ${IMAGE_HELD_LABEL}"'
  assert_line --index 0 "sha256:old old"
  assert_line --index 1 "${id} fp"
  assert_equal "$(count_calls 'node2 image inspect')" 2
}

@test "a worker whose relay fails falls back to the shared tar" {
  export SM_IMAGE_CACHE=${CACHE}
  local id
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  RELEASED=relay+${id} run stage node2 1 'image::relay_recv() { IMAGE_RELAY_ERROR="the stream from node1 was cut"; return 1; }'
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_output --partial "rank 0's image is toy/model:local ${id:7:12}, relayed node to node"
  assert_output --partial "(rank 1): the stream from node1 was cut; falling back to the cache ${CACHE} or a rebuild"
  assert_output --partial "loaded toy/model:local from the cache"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/aborted"
}

@test "a worker that cannot get rank 0's image tells rank 0 and fails naming the image and its ID" {
  local id
  id=$(build node1)
  SM_LOCAL_IMAGE=true RELEASED=${id} run stage node2 1
  local reason="$(hostname) (rank 1): cannot get rank 0's image toy/model:local ${id:7:12}"
  assert_line "rc=1"
  assert_line "reason=${reason}"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/aborted")" "${reason}"
}

@test "a worker that rebuilds from the manifest runs its own image ID, and says it is not rank 0's" {
  local id
  id=$(build node1)
  SM_DOCKERFILE=${BATS_TEST_TMPDIR}/ctx/Dockerfile RELEASED=${id} run stage node2 1
  assert_line "rc=0"
  assert_output --partial "rebuilding toy/model:local from the manifest"
  local rebuilt
  rebuilt=$(image_id_on node2)
  [[ ${rebuilt} != "${id}" ]]
  assert_line "image_id=${rebuilt}"
  assert_output --partial "not byte-identical to rank 0's ${id:7:12}"
}

@test "a worker run alone takes rank 0's recorded image ID; without one it fails with exit 2 and tells nobody" {
  export SM_IMAGE_CACHE=${CACHE}
  run stage node2 1 'NODE_FROM_JOB=1'
  assert_line "rc=2"
  assert_line "reason=image: rank 0's image ID is unknown (node_0/status.json has none: did rank 0's image stage succeed?)"
  assert_file_not_exists "${BATS_TEST_TMPDIR}/aborted"
  local id
  id=$(build node1)
  on node1 image::cache_save "${CACHE}" "${KEY}" "${id}" fp 2>/dev/null
  SM_IMAGE_ID=${id} run stage node2 1 'NODE_FROM_JOB=1'
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_equal "$(image_id_on node2)" "${id}"
}

@test "pyxis: rank 0 releases its squashfs by size and cksum; a worker only checks that it sees that file, no docker" {
  export SM_RUNTIME=pyxis SM_IMAGE_CACHE=${CACHE}
  local id released
  id=$(build node1)
  run stage node1 0
  assert_line "rc=0"
  assert_line "sqsh=${SQSH}"
  released="sqsh:$(stat -c %s "${SQSH}"):$(cksum <"${SQSH}" | cut -d' ' -f1)"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "RELEASE ${released}"
  RELEASED=${released} run stage node2 1
  assert_line "rc=0"
  assert_line "image_id=${id}"
  assert_line "sqsh=${SQSH}"
  assert_output --partial "rank 0's squashfs ${SQSH} is here"
  assert_equal "$(count_calls node2)" 0
  # Shared storage that shows another size: the worker fails and tells rank 0.
  RELEASED=sqsh:12:34 run stage node2 1
  local reason="$(hostname) (rank 1): cannot see rank 0's squashfs ${SQSH}"
  assert_line "rc=1"
  assert_line "reason=${reason}"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/aborted")" "${reason}"
}

@test "pyxis: rank 0 that cannot make the squashfs aborts the workers, naming it" {
  export SM_RUNTIME=pyxis SM_IMAGE_CACHE=${CACHE}
  run stage node1 0
  local reason="rank 0 ($(hostname)): image stage failed: cannot make a squashfs of toy/model:local (see node_0/node.log)"
  assert_line "rc=1"
  assert_line "reason=${reason}"
  assert_equal "$(cat "${BATS_TEST_TMPDIR}/control")" "ABORT ${reason}"
}
