# shellcheck shell=bash
# A node's timeline: one line per event, appended to ${SM_NODE_DIR}/events.log, which
# `slurm-multi results collect` turns into JOBDIR/timeline.json (+ .txt, .png) and the summary's
# `time:` line (docs/results.md, "The timeline"). The format's one reader (and its other writer, the
# hang watch) is py/slurm_multi/events.py, whose docstring is the format's reference.
#
#   timeline::event NAME [KEY=VALUE ...]
#   -> 1764500000.123456 NAME rank=0 host=node1 KEY=VALUE ...
#
# Fields are separated by one space; every token (the name, each key and value) is percent-encoded:
# `%`, space and the ASCII control characters (newline, tab, ...; DEL) become %XX, anything else is
# written as it is, so no value can break its line or its field. Bash builds no JSON: the reader
# types the values (a plain JSON number such as 12, -3, 0.25, 1e9 is a number, anything else a
# string).
#
# Pure bash, no fork once the node dir exists (it runs on hot paths), and it never fails the caller:
# a write error costs one warning per process, then silence. One printf of one short line to an
# O_APPEND file is one write(), so a few processes of one node may append at once.
#
# The events the node records (the reader knows these; any other name is kept as a point event, and
# any X_start/X_end pair is drawn as a sub-step X):
#   stage_start stage=S             node::stage, before the stage runs
#   stage_end stage=S status=ok|failed
#   image_stream_start / image_stream_end bytes=N    a worker receiving rank 0's image
#   image_load_start / image_load_end                docker load of the cached tar
#   image_save_start / image_save_end                rank 0 saving the image into the cache
#   release                         rank 0: the image ID is out (workers may start loading)
#   go                              the barrier let this node start
#   container_start                 the workload's container (or process) started
#   first_output                    its first output line (written by the hang watch)
#   exit code=N                     the workload ended

TIMELINE_WARNED=${TIMELINE_WARNED:-0}

# timeline::_warn MESSAGE: once per process, then silent (an event is never worth a log flood).
timeline::_warn() {
  [[ ${TIMELINE_WARNED} == 1 ]] && return 0
  TIMELINE_WARNED=1
  if declare -F log::warn >/dev/null; then
    log::warn timeline "$1 (further timeline problems are not reported)"
  else
    printf 'timeline: warning: %s (further timeline problems are not reported)\n' "$1" >&2
  fi
  return 0
}

# timeline::_encode TEXT: TEXT as a token of an event line (`%`, space and control characters as
# %XX), into REPLY.
timeline::_encode() {
  local s=$1 out='' c i n
  s=${s//%/%25}
  s=${s// /%20}
  s=${s//$'\n'/%0A}
  s=${s//$'\t'/%09}
  s=${s//$'\r'/%0D}
  # The other control characters are rare: a character loop only when there is one. In a UTF-8
  # locale [[:cntrl:]] also matches U+0080-U+009F, which are left as they are (only ASCII is encoded).
  if [[ ${s} == *[[:cntrl:]]* ]]; then
    for ((i = 0; i < ${#s}; i++)); do
      c=${s:i:1}
      if [[ ${c} == [[:cntrl:]] ]]; then
        printf -v n '%d' "'${c}"
        if ((n < 32 || n == 127)); then printf -v c '%%%02X' "${n}"; fi
      fi
      out+=${c}
    done
    s=${out}
  fi
  REPLY=${s}
}

# timeline::event NAME [KEY=VALUE ...]: append one event line; always returns 0.
timeline::event() {
  local name=${1:-} dir=${SM_NODE_DIR:-} line t kv key REPLY
  shift || true
  [[ -n ${name} ]] || { timeline::_warn "timeline::event called without an event name; ignored"; return 0; }
  [[ -n ${dir} ]] || { timeline::_warn "SM_NODE_DIR is not set; event ${name} not recorded"; return 0; }
  t=${EPOCHREALTIME:-}
  t=${t/,/.} # a locale's decimal comma
  [[ -n ${t} ]] || printf -v t '%(%s)T' -1
  timeline::_encode "${name}"
  line="${t} ${REPLY}"
  timeline::_encode "${SM_RANK:-${SLURM_NODEID:-}}"
  line+=" rank=${REPLY}"
  timeline::_encode "${SLURMD_NODENAME:-${HOSTNAME:-}}"
  line+=" host=${REPLY}"
  for kv in "$@"; do
    key=${kv%%=*}
    if [[ ${kv} != *=* || -z ${key} ]]; then
      timeline::_warn "event ${name}: '${kv}' is not KEY=VALUE; left out"
      continue
    fi
    case ${key} in
      t | event | rank | host)
        timeline::_warn "event ${name}: key '${key}' is reserved; left out"
        continue
        ;;
    esac
    timeline::_encode "${key}"
    line+=" ${REPLY}="
    timeline::_encode "${kv#*=}"
    line+=${REPLY}
  done
  if [[ ! -d ${dir} ]]; then
    mkdir -p "${dir}" 2>/dev/null ||
      { timeline::_warn "cannot create ${dir}; event ${name} not recorded"; return 0; }
  fi
  # The redirection's own error message is silenced with the group's stderr.
  { printf '%s\n' "${line}" >>"${dir}/events.log"; } 2>/dev/null ||
    timeline::_warn "cannot append to ${dir}/events.log; event ${name} not recorded"
  return 0
}
