# shellcheck shell=bash
# Settings: every option of sbatch/multi.sbatch and bin/sm-node, each also an SM_* environment
# variable; madengine's names are accepted as aliases. Command line > environment > manifest.

# name|option|default|help — the one table that --help, --dry-run and the README are made from.
SETTINGS_TABLE=(
  "SM_MANIFEST|--manifest FILE||madengine build_manifest.json to restore the run context from"
  "SM_MODEL|--model NAME||model key or name in the manifest (needed when it has several)"
  "SM_IMAGE|--image IMAGE||docker image to run (instead of, or overriding, the manifest's)"
  "SM_MODEL_DIR|--model-dir DIR||the model checkout the manifest's scripts are relative to (default: the manifest's directory)"
  "SM_MODEL_ARGS|--model-args ARGS||the model script's arguments, one quoted string (default: the manifest's args)"
  "SM_LAUNCHER|--launcher NAME||distributed launcher for MAD_MULTI_NODE_RUNNER: torchrun, torchtitan, deepspeed, megatron, vllm, sglang, sglang-disagg, primus or none (default: the manifest's distributed.launcher; see docs/madengine.md)"
  "SM_NPROC_PER_NODE|--nproc-per-node N||processes the launcher starts per node (default: the manifest's distributed.nproc_per_node, else the node's GPUs, else 1)"
  "SM_IMAGE_CACHE|--image-cache DIR||shared directory for image tars (alias MAD_DOCKER_BUILDS)"
  "SM_IMAGE_TRANSPORT|--image-transport cache|relay|auto|auto|how a cold image reaches the workers: relay (streamed node to node while rank 0 saves; no shared storage needed), cache (rank 0 saves a tar, then the workers load it), auto (relay unless the cache already holds the image)"
  "SM_RELAY_FANOUT|--relay-fanout K|1|relay topology: 1 is a chain, K a tree where every node forwards to K others"
  "SM_OUT|--out DIR|./slurm_output|where job outputs go: <out>/<model>/<jobid>/"
  "SM_TIMEOUT|--timeout SECONDS||workload time limit per node (0 = none; default: the manifest model's timeout, else 3600)"
  "SM_HANG_TIMEOUT|--hang-timeout SECONDS|900|a rank with no new output line and no CPU for this long after GO is hung: the job fails naming it (0 = off)"
  "SM_IMAGE_TIMEOUT|--image-timeout SECONDS|1800|how long rank 0 may take to obtain the image (local, cache, rebuild, save)"
  "SM_BARRIER_TIMEOUT|--barrier-timeout SECONDS|600|how long every worker has to arrive once rank 0 released its image"
  "SM_MASTER_PORT|--master-port PORT||MASTER_PORT for the workload; the barrier port derives from it (default: the manifest's distributed.port, else 29500)"
  "SM_PROFILE|--profile none|nsys|nsight-slurm|none|profile every rank (see docs/profiling.md)"
  "SM_RUNTIME|--runtime docker|pyxis|none|docker|how each node runs the workload"
  "SM_NTASKS_PER_NODE|--ntasks-per-node N||worker tasks per node (pyxis, none; default the allocation's; docker: 1)"
  "SM_CONTAINER_IMAGE|--container-image IMAGE||pyxis: srun --container-image (default: the image)"
  "SM_FRAMEWORK|--framework NAME||the workload's framework, e.g. trtllm (enables cuda-api and capture ranges)"
  "SM_PROFILE_START_ITER|--profile-start-iter N||profile window start (TLLM_PROFILE_START_STOP=<start>-<stop>)"
  "SM_PROFILE_STOP_ITER|--profile-stop-iter N||profile window stop (give both or neither)"
  "SM_PROFILE_TOOL_OPTIONS|--profile-tool-options OPTS||nsys options, one quoted string (default: the TRT-LLM playbook set)"
  "SM_PROFILE_DIR|--profile-dir DIR||where reports go (default <jobdir>/profile; nsight-slurm: <jobdir>)"
  "SM_NSYS_PATH|--nsys-path PATH|nsys|nsys inside the container (docker, pyxis) or on the node (none)"
  "SM_NSYS_HOST_PATH|--nsys-host-path FILE||a host nsys, mounted read-only at /opt/slurm-multi/bin/nsys and used"
  "SM_NSIGHT_SLURM_HOME|--nsight-slurm-home DIR||Nsight Cloud for Slurm install root (<home>/bin/nsight-slurm)"
  "SM_NSIGHT_SLURM_MODE|--nsight-slurm-mode MODE||at-launch, manual or cuda-api (default: cuda-api with --framework trtllm, else at-launch)"
  "SM_NSIGHT_SLURM_TOOL_PATH|--nsight-slurm-tool-path PATH|/usr/local/bin/nsys|nsys as the nsight-slurm connector runs it"
  "SM_NVTX_INJECTION_PATH|--nvtx-injection-path PATH||NVTX_INJECTION64_PATH for the workers"
  "SM_FLUSH_SETTLE_SECONDS|--flush-settle-seconds S|60|a report counts once its byte size is unchanged this long"
  "SM_FLUSH_TIMEOUT_SECONDS|--flush-timeout-seconds S|600|stop waiting for reports after this long"
  "SM_PROFILE_OPTIONAL|--profile-optional true|false|false|a profiled job whose reports are missing, empty or unsettled still succeeds (the summary says INCOMPLETE); by default it fails"
  "SM_PROFILE_STOP_GRACE|--profile-stop-grace SECONDS||docker stop grace for a profiled container (default: flush settle + 15; never below the settle window)"
  "SM_COLLECT|--collect true|false|true|aggregate results at the end of the job (alias MAD_COLLECT_METRICS)"
  "SM_PERF_CSV|--perf-csv PATH||also append this job's rows to a madengine perf.csv kept across runs (locked)"
  "SM_STOP_GRACE|--stop-grace SECONDS|30|SIGTERM-to-SIGKILL grace when a container is stopped"
  "SM_PEER_GRACE|--peer-grace SECONDS|30|after one node fails, how long the others may run on"
)

# madengine aliases: alias -> our name.
SETTINGS_ALIASES=(
  "MAD_DOCKER_BUILDS|SM_IMAGE_CACHE"
  "MAD_BARRIER_TOKEN|SM_BARRIER_TOKEN"
  "MAD_COLLECT_METRICS|SM_COLLECT"
)

# settings::apply_aliases: an alias fills our variable when ours is unset.
settings::apply_aliases() {
  local entry alias name
  for entry in "${SETTINGS_ALIASES[@]}"; do
    alias=${entry%%|*} name=${entry#*|}
    if [[ -z ${!name:-} && -n ${!alias:-} ]]; then
      printf -v "${name}" '%s' "${!alias}"
      export "${name?}"
    fi
  done
}

# settings::apply_defaults: defaults for what neither the command line nor the environment set.
# Manifest-restored values are applied later by the node and never overwrite these.
settings::apply_defaults() {
  local entry name option default help
  for entry in "${SETTINGS_TABLE[@]}"; do
    settings::_fields "${entry}"
    if [[ -z ${!name:-} && -n ${default} ]]; then
      printf -v "${name}" '%s' "${default}"
      export "${name?}"
    fi
  done
}

# settings::_fields ENTRY: split a SETTINGS_TABLE entry into name, option, default, help (the
# caller's locals). The option may itself contain '|' (its choices), so split from both ends.
settings::_fields() {
  local rest
  name=${1%%|*} help=${1##*|} rest=${1%|*}
  default=${rest##*|} rest=${rest%|*}
  option=${rest#*|}
}

# settings::usage_options: the options block of --help.
settings::usage_options() {
  local entry name option default help
  for entry in "${SETTINGS_TABLE[@]}"; do
    settings::_fields "${entry}"
    printf '  %-34s %s\n' "${option}" "${help}"
    printf '  %-34s env %s%s\n' "" "${name}" "${default:+, default ${default}}"
  done
}

# settings::option_var OPTION: the variable an option sets (empty if unknown).
settings::option_var() {
  local want=$1 entry name option default help
  for entry in "${SETTINGS_TABLE[@]}"; do
    settings::_fields "${entry}"
    option=${option%% *}
    [[ ${option} == "${want}" ]] && { printf '%s' "${name}"; return 0; }
  done
  return 1
}

# settings::var_option NAME: the option that sets variable NAME (`--hang-timeout`), else NAME.
settings::var_option() {
  local want=$1 entry name option default help
  for entry in "${SETTINGS_TABLE[@]}"; do
    settings::_fields "${entry}"
    [[ ${name} == "${want}" ]] && { printf '%s' "${option%% *}"; return 0; }
  done
  printf '%s' "${want}"
}

# settings::closest_option WORD: the known option nearest to a mistyped WORD (edit distance at most
# a third of its length, at least 2), for "did you mean"; nothing when none is that close.
settings::closest_option() {
  local word=$1 entry name option default help best="" best_d=999 d limit
  limit=$((${#word} / 3 > 2 ? ${#word} / 3 : 2))
  for entry in "${SETTINGS_TABLE[@]}"; do
    settings::_fields "${entry}"
    option=${option%% *}
    d=$(settings::_distance "${word}" "${option}")
    ((d < best_d)) && best_d=${d} best=${option}
  done
  ((best_d <= limit)) && printf '%s' "${best}"
  return 0
}

# settings::_distance A B: the Levenshtein distance of two short strings (pure bash).
settings::_distance() {
  local a=$1 b=$2 i j cost prev=() cur=()
  for ((j = 0; j <= ${#b}; j++)); do prev[j]=${j}; done
  for ((i = 1; i <= ${#a}; i++)); do
    cur=("${i}")
    for ((j = 1; j <= ${#b}; j++)); do
      cost=1
      [[ ${a:i-1:1} == "${b:j-1:1}" ]] && cost=0
      cur[j]=$((prev[j] + 1))
      ((cur[j - 1] + 1 < cur[j])) && cur[j]=$((cur[j - 1] + 1))
      ((prev[j - 1] + cost < cur[j])) && cur[j]=$((prev[j - 1] + cost))
    done
    prev=("${cur[@]}")
  done
  printf '%s' "${prev[${#b}]}"
}

# settings::validate: one-line errors for values that cannot work.
settings::validate() {
  local n
  for n in SM_HANG_TIMEOUT SM_IMAGE_TIMEOUT SM_BARRIER_TIMEOUT SM_STOP_GRACE SM_PEER_GRACE; do
    [[ ${!n} =~ ^[0-9]+$ ]] ||
      { log::error settings "$(settings::var_option "${n}") '${!n}': expected a whole number of seconds, 0 or more (${n})"; return 2; }
  done
  # (Empty: the manifest model's timeout, resolved with the manifest by the job plan.)
  [[ -z ${SM_TIMEOUT:-} || ${SM_TIMEOUT} =~ ^[0-9]+$ ]] ||
    { log::error settings "--timeout '${SM_TIMEOUT}': expected a whole number of seconds (0 = none)"; return 2; }
  [[ -z ${SM_MASTER_PORT:-} ]] || { [[ ${SM_MASTER_PORT} =~ ^[0-9]+$ ]] && ((SM_MASTER_PORT >= 1 && SM_MASTER_PORT <= 65535)); } ||
    { log::error settings "--master-port '${SM_MASTER_PORT}' is not a TCP port (1-65535)"; return 2; }
  case ${SM_PROFILE} in none | nsys | nsight-slurm) ;; *)
    log::error settings "--profile '${SM_PROFILE}': expected none, nsys or nsight-slurm"; return 2 ;;
  esac
  case ${SM_RUNTIME} in docker | pyxis | none) ;; *)
    log::error settings "--runtime '${SM_RUNTIME}': expected docker, pyxis or none"; return 2 ;;
  esac
  case ${SM_IMAGE_TRANSPORT} in cache | relay | auto) ;; *)
    log::error settings "--image-transport '${SM_IMAGE_TRANSPORT}': expected cache, relay or auto"; return 2 ;;
  esac
  [[ ${SM_RELAY_FANOUT} =~ ^[1-9][0-9]*$ ]] ||
    { log::error settings "--relay-fanout '${SM_RELAY_FANOUT}': expected a whole number >= 1"; return 2; }
  case ${SM_COLLECT,,} in true | false | 1 | 0 | yes | no) ;; *)
    log::error settings "--collect '${SM_COLLECT}': expected true or false"; return 2 ;;
  esac
  case ${SM_PROFILE_OPTIONAL,,} in true | false | 1 | 0 | yes | no) ;; *)
    log::error settings "--profile-optional '${SM_PROFILE_OPTIONAL}': expected true or false"; return 2 ;;
  esac
  if [[ -n ${SM_MANIFEST:-} && ! -r ${SM_MANIFEST} ]]; then
    log::error settings "--manifest ${SM_MANIFEST}: no such readable file"
    return 2
  fi
  if [[ -z ${SM_MANIFEST:-} && -z ${SM_IMAGE:-} ]] && ! [[ ${SM_RUNTIME} == none && -n ${SM_CMD[0]+x} ]]; then
    log::error settings "nothing to run: give --manifest FILE or --image IMAGE (or, with --runtime none, -- CMD)"
    return 2
  fi
  # Profiling and runtime combinations (lib/profile.sh): one-line errors before anything starts.
  if declare -F profile::validate >/dev/null; then
    profile::validate || return 2
  fi
  return 0
}

settings::truthy() { [[ ${1,,} == true || $1 == 1 || ${1,,} == yes ]]; }
