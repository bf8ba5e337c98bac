# shellcheck shell=bash
# pyxis + enroot on the test cluster, built from the upstream sources in ../shared/vendor (never
# copied into this project). Functions only; tests/cluster/up calls them. See docs/test-cluster.md.
#
# The build's Debian packages are in CLUSTER_PACKAGES (lib.sh). Built once into /usr/local (enroot: /usr/local/bin/enroot, pyxis: /usr/local/lib/slurm/
# spank_pyxis.so); a stamp keyed by the two source archives' sha256 lets later bring-ups reuse it.
# Each node gets its own enroot runtime/data paths (the nodes share one filesystem, and every node
# of a step names its container pyxis_<job>.<step>) and its own /run/pyxis, bound inside its slurmd's
# mount namespace like its docker socket.

PYXIS_PREFIX=/usr/local
PYXIS_PLUGIN=${PYXIS_PREFIX}/lib/slurm/spank_pyxis.so
PYXIS_PLUGSTACK=/etc/slurm/plugstack.conf.d/pyxis.conf
PYXIS_ENROOT_DROPIN=${PYXIS_PREFIX}/etc/enroot/enroot.conf.d/50-slurm-multi-test-cluster.conf
PYXIS_STAMP=${PYXIS_PREFIX}/share/slurm-multi/pyxis-build.stamp
# enroot's own per-user directories live below these (created mode 1777: enroot makes its own 077).
PYXIS_ENROOT_DIRS=(/run/enroot /var/lib/enroot-data /var/cache/enroot)

# cluster::pyxis_vendor_dir: where the upstream archives are. SM_VENDOR_DIR first, then
# ../shared/vendor beside the project root (the layout of a checkout), then /work/shared/vendor.
cluster::pyxis_vendor_dir() {
  local root dir
  root=$(cd "${HERE}/../.." && pwd)
  for dir in ${SM_VENDOR_DIR:+"${SM_VENDOR_DIR}"} "${root}/../shared/vendor" /work/shared/vendor; do
    if compgen -G "${dir}/enroot-*.tar.gz" >/dev/null && compgen -G "${dir}/pyxis-*.tar.gz" >/dev/null; then
      printf '%s' "${dir}"
      return 0
    fi
  done
  return 1
}

# cluster::pyxis_sources_key DIR: what the build is made from (the archives' sha256).
cluster::pyxis_sources_key() {
  (cd "$1" && sha256sum enroot-*.tar.gz pyxis-*.tar.gz) | sha256sum | cut -c1-16
}

# cluster::pyxis_built KEY: the installed build is the one of these sources.
cluster::pyxis_built() {
  [[ -x ${PYXIS_PREFIX}/bin/enroot && -f ${PYXIS_PLUGIN} && -f ${PYXIS_STAMP} && $(<"${PYXIS_STAMP}") == "$1" ]]
}

# cluster::pyxis_build: build and install enroot and pyxis from the vendor archives unless the
# installed build is of the same archives. The recipe is ../shared/vendor/README.md's.
cluster::pyxis_build() {
  local vendor key build t0=${SECONDS}
  vendor=$(cluster::pyxis_vendor_dir) ||
    log::die cluster "pyxis: the enroot and pyxis source archives are not in ../shared/vendor, /work/shared/vendor or \$SM_VENDOR_DIR; set SM_VENDOR_DIR or bring the cluster up with --no-pyxis" 2
  key=$(cluster::pyxis_sources_key "${vendor}")
  if cluster::pyxis_built "${key}"; then
    log::info cluster "pyxis: reusing the enroot + pyxis build of ${vendor} (key ${key})"
    return 0
  fi
  log::info cluster "pyxis: building enroot and pyxis from ${vendor} (key ${key})"
  build=$(mktemp -d /tmp/sm-pyxis-build.XXXXXX)
  # shellcheck disable=SC2064 # the path is fixed now
  trap "rm -rf '${build}'" RETURN
  tar -xzf "${vendor}"/enroot-*.tar.gz -C "${build}"
  tar -xzf "${vendor}"/pyxis-*.tar.gz -C "${build}"
  # The archive has no submodules: Debian's makeself and linux-libc-dev stand in for them. glibc
  # 2.36 has no strlcpy/strlcat: libbsd's, passed in the environment (the Makefile appends to it).
  cp /usr/bin/makeself "${build}/enroot/deps/makeself/makeself.sh"
  touch "${build}/enroot/deps/linux-headers/.stamp"
  (
    cd "${build}/enroot"
    export CPPFLAGS='-D_GNU_SOURCE= -include bsd/string.h' LOADLIBES=/usr/lib/x86_64-linux-gnu/libbsd.a
    make -j"$(nproc)" FORCE_GLIBC=1 prefix="${PYXIS_PREFIX}" && make FORCE_GLIBC=1 prefix="${PYXIS_PREFIX}" install
  ) >"${build}/enroot.log" 2>&1 || {
    tail -n 20 "${build}/enroot.log" >&2
    log::die cluster "pyxis: the enroot build failed (last lines above)"
  }
  (cd "${build}/pyxis" && make -j"$(nproc)" && make install) >"${build}/pyxis.log" 2>&1 || {
    tail -n 20 "${build}/pyxis.log" >&2
    log::die cluster "pyxis: the pyxis build failed (last lines above)"
  }
  [[ -f ${PYXIS_PLUGIN} ]] || log::die cluster "pyxis: the build installed no ${PYXIS_PLUGIN}"
  mkdir -p "${PYXIS_STAMP%/*}"
  printf '%s' "${key}" >"${PYXIS_STAMP}"
  log::info cluster "pyxis: enroot $("${PYXIS_PREFIX}/bin/enroot" version 2>/dev/null) and pyxis built in $((SECONDS - t0)) s"
}

# cluster::pyxis_enable: the plugin line, the per-node enroot paths and their base directories.
cluster::pyxis_enable() {
  local dir
  mkdir -p "${PYXIS_PLUGSTACK%/*}" "${PYXIS_ENROOT_DROPIN%/*}"
  printf '%s\nrequired %s runtime_path=/run/pyxis\n' "${CLUSTER_MARK}" "${PYXIS_PLUGIN}" >"${PYXIS_PLUGSTACK}"
  # enroot.conf evaluates $(…): the network namespace tells the nodes apart (they share one disk).
  # shellcheck disable=SC2016 # evaluated by enroot on the node
  printf '%s\n%s\n%s\n%s\n%s\n' "${CLUSTER_MARK}" \
    'ENROOT_RUNTIME_PATH /run/enroot/user-$(id -u)/ns-$(readlink /proc/self/ns/net | tr -dc 0-9)' \
    'ENROOT_DATA_PATH /var/lib/enroot-data/user-$(id -u)/ns-$(readlink /proc/self/ns/net | tr -dc 0-9)' \
    'ENROOT_CACHE_PATH /var/cache/enroot/user-$(id -u)' \
    'ENROOT_TEMP_PATH /tmp' >"${PYXIS_ENROOT_DROPIN}"
  for dir in "${PYXIS_ENROOT_DIRS[@]}"; do
    mkdir -p "${dir}"
    chmod 1777 "${dir}"
  done
}

# cluster::pyxis_disable: no plugin line (slurmd started after this loads no pyxis).
cluster::pyxis_disable() {
  [[ -f ${PYXIS_PLUGSTACK} ]] && grep -qF "${CLUSTER_MARK}" "${PYXIS_PLUGSTACK}" && rm -f "${PYXIS_PLUGSTACK}"
  return 0
}

# cluster::pyxis_on: the running cluster has pyxis (the plugin line is ours and srun lists it).
cluster::pyxis_on() {
  [[ -f ${PYXIS_PLUGSTACK} ]] && srun --help 2>/dev/null | grep -q -- '--container-image'
}

# cluster::pyxis_clean: what enroot and pyxis left (named containers persist across restarts, and
# network namespace inode numbers repeat).
cluster::pyxis_clean() {
  local dir
  for dir in "${PYXIS_ENROOT_DIRS[@]:0:2}"; do
    [[ -d ${dir} ]] && find "${dir}" -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null
  done
  return 0
}
