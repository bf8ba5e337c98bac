# shellcheck shell=bash
# shellcheck disable=SC2034 # CACHE_LOCK, CACHE_TMP, CACHE_FOUND are read by the writers (lib/image.sh)
# The shared image cache's one entry protocol, whatever the entry holds (rank 0's docker tar, its
# pyxis squashfs; lib/image.sh writes and reads them). An entry ENTRY = <dir>/<key>.<kind> has
#   a sidecar    <dir>/<key>.id for a tar, ENTRY.id otherwise: key=value lines (id=, image=,
#                fingerprint=, bytes=, cksum=, who wrote it, ...), written whole (temp file, rename)
#                and only after the entry is in place, so it never describes an entry that is not
#   a lock       <dir>/.<key>.lock, one per key whatever the kind: writers flock -x, readers -s,
#                each waiting at most SM_CACHE_LOCK_TIMEOUT s
#   a temp file  <dir>/.<key>.<kind>.tmp.<pid>.<random> while a writer writes it: a sibling, so the
#                rename stays on one filesystem and a reader sees the old entry or the new, never half
# A writer: cache::begin ENTRY ID (CACHE_FOUND: hit? then nothing to write) -> write CACHE_TMP ->
# cache::commit -> cache::end (or cache::abort).
# A reader: cache::lock ENTRY -s -> cache::holds ENTRY ID -> read it -> cache::unlock.

CACHE_LOCK_FD=
CACHE_LOCK=
CACHE_ENTRY=
CACHE_TMP=
CACHE_FOUND=

# cache::sidecar ENTRY [VAR]: the path of ENTRY's sidecar; printed, or into VAR.
cache::sidecar() {
  case $1 in
    *.tar) util::reply "${2:-}" "${1%.tar}.id" ;;
    *) util::reply "${2:-}" "$1.id" ;;
  esac
}

# cache::sidecar_get SIDECAR KEY [VAR]: one value of a sidecar, its first KEY= line (empty when the
# file or the key is missing); printed, or into VAR. Read by this shell itself, no process: every
# node reads its image's sidecar several times before its helpers can start.
cache::sidecar_get() {
  local _cache_line _cache_value=''
  if [[ -f $1 ]]; then
    while IFS= read -r _cache_line || [[ -n ${_cache_line} ]]; do
      if [[ ${_cache_line} == "$2="* ]]; then
        _cache_value=${_cache_line#"$2="}
        break
      fi
    done <"$1"
  fi
  util::reply "${3:-}" "${_cache_value}"
}

# cache::get ENTRY KEY [VAR]: one value of ENTRY's sidecar; printed, or into VAR.
cache::get() {
  local _cache_sidecar
  cache::sidecar "$1" _cache_sidecar
  cache::sidecar_get "${_cache_sidecar}" "$2" "${3:-}"
}

# cache::sidecar_write SIDECAR KEY=VALUE...: the sidecar, one line a pair, whole or not at all.
cache::sidecar_write() {
  local sidecar=$1
  shift
  printf '%s\n' "$@" >"${sidecar}.tmp.$$" && mv -f "${sidecar}.tmp.$$" "${sidecar}"
}

# cache::lock ENTRY -x|-s: take ENTRY's key's lock (CACHE_LOCK, on fd CACHE_LOCK_FD), exclusive or
# shared; fails when it is not free within SM_CACHE_LOCK_TIMEOUT s.
cache::lock() {
  local dir=${1%/*} name=${1##*/}
  CACHE_LOCK=${dir}/.${name%.*}.lock
  exec {CACHE_LOCK_FD}>>"${CACHE_LOCK}" || { CACHE_LOCK_FD=; return 1; }
  flock "$2" -w "${SM_CACHE_LOCK_TIMEOUT}" "${CACHE_LOCK_FD}" && return 0
  cache::unlock
  return 1
}

cache::unlock() {
  [[ -z ${CACHE_LOCK_FD} ]] || exec {CACHE_LOCK_FD}>&-
  CACHE_LOCK_FD=
}

# cache::begin ENTRY [ID [cksum]]: become ENTRY's writer. Holding the lock, every temp file of ENTRY
# is a dead writer's (a SIGKILLed save): removed. CACHE_TMP is then the file to write. With ID,
# CACHE_FOUND says what ENTRY holds now (cache::holds, `cksum` passed on): `hit` (ID, whole: nothing
# to write), `damaged` (ID's, but not the file its sidecar describes), `stale` (another image, or
# a sidecar naming none), `none`. Fails on the lock's timeout; the caller says what that means for
# it (the lock is CACHE_LOCK).
cache::begin() {
  local dir=${1%/*} name=${1##*/} rc=0
  CACHE_ENTRY=$1 CACHE_TMP='' CACHE_FOUND=none
  cache::lock "$1" -x || return 1
  rm -f "${dir}/.${name}.tmp."*
  CACHE_TMP=${dir}/.${name}.tmp.$$.${RANDOM}
  [[ -n ${2:-} ]] || return 0
  cache::holds "$1" "$2" "${3:-}" || rc=$?
  case ${rc} in
    0) CACHE_FOUND=hit ;;
    2) CACHE_FOUND=damaged ;;
    *) [[ ! -s $1 ]] || CACHE_FOUND=stale ;;
  esac
}

# cache::commit ID FINGERPRINT CKSUM BY [KEY=VALUE...]: CACHE_TMP, written whole, becomes the entry:
# renamed first, then its sidecar (id, image, fingerprint, bytes, cksum, BY=<host> job <job>, the
# rest). CKSUM is the POSIX cksum CRC taken while it was written, or empty: taken now. The writer
# still holds the lock (cache::end).
cache::commit() {
  local id=$1 fp=$2 crc=$3 by=$4 bytes sum
  shift 4
  bytes=$(stat -c %s "${CACHE_TMP}") || return 1
  if [[ -z ${crc} ]]; then
    sum=$(cksum <"${CACHE_TMP}") || return 1
    crc=${sum%% *}
  fi
  mv -f "${CACHE_TMP}" "${CACHE_ENTRY}" || return 1
  CACHE_TMP=
  local sidecar
  cache::sidecar "${CACHE_ENTRY}" sidecar
  cache::sidecar_write "${sidecar}" "id=${id}" "image=${SM_IMAGE}" "fingerprint=${fp}" \
    "bytes=${bytes}" "cksum=${crc}" "${by}=$(hostname) job ${SLURM_JOB_ID:-}" "$@"
}

# cache::abort: the write failed: its temp file (and the writer's files beside it: .err, .log) go.
cache::abort() {
  [[ -z ${CACHE_TMP} ]] || rm -f "${CACHE_TMP}" "${CACHE_TMP}".*
  CACHE_TMP=
  cache::end
}

cache::end() {
  cache::unlock
  CACHE_ENTRY=
}

# cache::holds ENTRY [ID] [cksum]: 0 when ENTRY is the file its sidecar describes, of image ID when
# one is given; 1 when it is missing, or its sidecar names no image or another; 2 when it is that
# image's but not at the sidecar's size (one stat; with `cksum` also not of its cksum, one read):
# cut, padded or overwritten in place. A reader holds the lock (shared) while it decides.
cache::holds() {
  local entry=$1 want=${2:-} sidecar id bytes sum recorded
  cache::sidecar "${entry}" sidecar
  cache::sidecar_get "${sidecar}" id id
  [[ -s ${entry} && -n ${id} && (-z ${want} || ${id} == "${want}") ]] || return 1
  cache::sidecar_get "${sidecar}" bytes bytes
  [[ -n ${bytes} && $(stat -c %s "${entry}") == "${bytes}" ]] || return 2
  [[ ${3:-} == cksum ]] || return 0
  sum=$(cksum <"${entry}") || return 2
  cache::sidecar_get "${sidecar}" cksum recorded
  [[ ${sum} == "${recorded} ${bytes}" ]] || return 2
}

# cache::mismatch ENTRY: how ENTRY differs from its sidecar, for a log line.
cache::mismatch() {
  printf '%s bytes, sidecar says %s' "$(stat -c %s "$1" 2>/dev/null || echo 0)" "$(cache::get "$1" bytes)"
}
