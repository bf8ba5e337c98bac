#!/usr/bin/env bats
# examples/torchrun/build-image without root, debootstrap or a docker engine: what makes the base
# rootfs's cache key (a tar made once, minutes of debootstrap, reused while the key stays the same).

load helpers

# torch SCRIPT: SCRIPT run with build-image's functions defined (its main not run).
torch() {
  bash -c 'source "${REPO_ROOT}/examples/torchrun/build-image"; eval "$1"' torch "$1"
}

@test "the base rootfs key is the recipe's: the same for the same packages in any order, another for another input" {
  run torch 'torch::base_key http://mirror.example/debian'
  assert_success
  assert_output --regexp '^[0-9a-f]{12}$'
  local key=${output}
  run torch 'PACKAGES=(python3-torch python3-torch); torch::base_key http://mirror.example/debian'
  assert_output "${key}"
  run torch 'PACKAGES=(python3-torch python3-numpy); torch::base_key http://mirror.example/debian'
  local two=${output}
  run torch 'PACKAGES=(python3-numpy python3-torch); torch::base_key http://mirror.example/debian'
  assert_output "${two}"
  for change in 'PACKAGES+=(python3-numpy)' 'APT_PACKAGES+=(vim)' 'BASE_RECIPE_VERSION=99' 'MIRROR=http://other/debian'; do
    run torch "MIRROR=http://mirror.example/debian; ${change}; torch::base_key \"\${MIRROR}\""
    assert_success
    refute_output "${key}"
  done
}

@test "debootstrap's package list is the key's: sorted, each package once, comma-joined" {
  run torch 'PACKAGES=(python3-zz python3-torch python3-zz python3-aa); torch::packages'
  assert_output python3-aa,python3-torch,python3-zz
}
