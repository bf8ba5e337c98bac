#!/usr/bin/env bats
# lib/image.sh without a cluster: a docker shim that holds images by tag in a directory records
# every call.

load helpers

setup() {
  export SHIM_DIR=${BATS_TEST_TMPDIR} TMPDIR=${BATS_TEST_TMPDIR}/tmp
  mkdir -p "${TMPDIR}" "${BATS_TEST_TMPDIR}/shim" "${BATS_TEST_TMPDIR}/images"
  # docker: an image is a file named by its tag; pull makes one only for a registry-looking name.
  cat >"${BATS_TEST_TMPDIR}/shim/docker" <<'SHIM'
#!/bin/bash
printf '%s\n' "$*" >>"${SHIM_DIR}/docker-calls"
store=${SHIM_DIR}/images
ref=${*: -1}
case "$1 $2" in
  "image inspect") [[ -f ${store}/${ref//\//_} ]] || exit 1; cat "${store}/${ref//\//_}"; [[ $* == *Labels* ]] && echo " " ;;
  "pull -q") [[ ${ref} == registry.example/* ]] || exit 1; echo "sha256:3333" >"${store}/${ref//\//_}" ;;
  "tag "*) cp "${store}/${2//\//_}" "${store}/${3//\//_}" ;;
  *) exit 1 ;;
esac
SHIM
  chmod +x "${BATS_TEST_TMPDIR}/shim/docker"
  export PATH="${BATS_TEST_TMPDIR}/shim:${PATH}"
}

rank0() {
  (
    # shellcheck source=/dev/null
    for lib in log util timeline image; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    image::ensure_on_rank0
  )
}

@test "rank 0 without the image and nothing to build it from pulls the manifest's registry_image, tagged as the image" {
  export SM_IMAGE=toy/model:local SM_REGISTRY_IMAGE=registry.example/toy:1 NNODES=1
  run rank0
  assert_success
  assert_output --partial "sha256:3333"
  run cat "${BATS_TEST_TMPDIR}/docker-calls"
  assert_line "pull -q registry.example/toy:1"
  assert_line "tag registry.example/toy:1 toy/model:local"
  refute_line "pull -q toy/model:local"
}

@test "without a registry_image rank 0 pulls the image itself, and a failed pull names both" {
  export SM_IMAGE=toy/model:local NNODES=1
  run rank0
  assert_failure
  assert_output --partial "toy/model:local is not on"
  export SM_REGISTRY_IMAGE=elsewhere/toy:1
  run rank0
  assert_failure
  assert_output --partial "cannot be built or pulled (registry_image elsewhere/toy:1)"
}

@test "a cached tar is a hit only at the size its sidecar records: a cut or padded tar is not" {
  (
    # shellcheck source=/dev/null
    for lib in log util timeline image; do source "${REPO_ROOT}/lib/${lib}.sh"; done
    head -c 1000 /dev/zero >"${BATS_TEST_TMPDIR}/x.tar"
    printf 'id=sha256:1\nbytes=1000\n' >"${BATS_TEST_TMPDIR}/x.id"
    image::tar_matches "${BATS_TEST_TMPDIR}/x.tar" "${BATS_TEST_TMPDIR}/x.id" || exit 10
    head -c 999 /dev/zero >"${BATS_TEST_TMPDIR}/x.tar"
    ! image::tar_matches "${BATS_TEST_TMPDIR}/x.tar" "${BATS_TEST_TMPDIR}/x.id" || exit 11
    head -c 1001 /dev/zero >"${BATS_TEST_TMPDIR}/x.tar"
    ! image::tar_matches "${BATS_TEST_TMPDIR}/x.tar" "${BATS_TEST_TMPDIR}/x.id" || exit 12
    printf 'id=sha256:1\n' >"${BATS_TEST_TMPDIR}/x.id"
    ! image::tar_matches "${BATS_TEST_TMPDIR}/x.tar" "${BATS_TEST_TMPDIR}/x.id" || exit 13
  )
}
