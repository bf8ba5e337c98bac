#!/bin/sh
# A toy multi-node "training" run. Every rank reads the rank env, proves it can reach rank 0 over
# TCP and "trains" for --steps. The last global rank writes the throughput rows of the
# multiple-results CSV; every other rank writes the present-but-empty rows Primus writes.
# TOY_THROUGHPUT_PCT (environment, default 100) scales that throughput: a slower build, planted
# without changing the model's args (tests/e2e/75-report.bats).
set -u
steps=20 step_seconds=0.05 fail_rank=-1 fail_code=3 empty=0 hang=0 hang_rank=-1 busy=0
csv=${TOY_RESULTS_CSV:-perf_toy.csv}
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --step-seconds) step_seconds=$2; shift 2 ;;
    --fail-rank) fail_rank=$2; shift 2 ;;
    --fail-code) fail_code=$2; shift 2 ;;
    --empty) empty=1; shift ;;
    --hang) hang=1; shift ;;
    --hang-rank) hang_rank=$2; shift 2 ;;
    --busy-seconds) busy=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    *) echo "toy: unknown option $1" >&2; exit 2 ;;
  esac
done
: "${RANK:?toy: RANK is not set}" "${NNODES:?}" "${MASTER_ADDR:?}" "${MASTER_PORT:?}"
world=${WORLD_SIZE:-${NNODES}}
out=${SM_OUTPUT_DIR:-.}
echo "toy: rank ${RANK}/${world} node_rank ${NODE_RANK:-?} on $(hostname), master ${MASTER_ADDR}:${MASTER_PORT}, ${TOY_GREETING:-}"

# Reach rank 0: rank 0 keeps one listener open (nc -ll, a handler per connection) that records
# each hello; the others retry until it listens.
if [ "${RANK}" = 0 ]; then
  # shellcheck disable=SC2016 # the handler expands ${line} itself
  printf '#!/bin/sh\nread -r line\necho "${line}" >>/tmp/toy-hellos\n' >/tmp/toy-hello.sh
  chmod +x /tmp/toy-hello.sh
  : >/tmp/toy-hellos
  if [ "${world}" -gt 1 ]; then
    nc -ll -p "${MASTER_PORT}" -e /tmp/toy-hello.sh </dev/null >/dev/null 2>&1 &
    listener=$!
  fi
else
  tries=0
  until echo "hello from rank ${RANK}" | nc -w 3 "${MASTER_ADDR}" "${MASTER_PORT}" >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "${tries}" -ge 150 ] && { echo "toy: rank ${RANK} cannot reach rank 0 at ${MASTER_ADDR}:${MASTER_PORT}" >&2; exit 4; }
    sleep 0.2
  done
  echo "toy: rank ${RANK} reached rank 0 at ${MASTER_ADDR}:${MASTER_PORT}"
fi

i=1
while [ "${i}" -le "${steps}" ]; do
  sleep "${step_seconds}"
  [ $((i % 5)) -eq 0 ] && echo "toy: rank ${RANK} step ${i}/${steps} loss=0.$((1000 - i))"
  i=$((i + 1))
done
while [ "${hang}" = 1 ]; do sleep 1; done
# One rank stops making progress: asleep, no output, no CPU (what the hang watch must catch).
if [ "${RANK}" = "${hang_rank}" ]; then
  echo "toy: rank ${RANK} stops here (--hang-rank)"
  while :; do sleep 1; done
fi
# Every rank computes in silence for a while: busy, not hung.
if [ "${busy}" -gt 0 ]; then
  end=$(($(date +%s) + busy))
  while [ "$(date +%s)" -lt "${end}" ]; do :; done
  echo "toy: rank ${RANK} computed silently for ${busy} s"
fi

if [ "${RANK}" = 0 ] && [ "${world}" -gt 1 ]; then
  waited=0
  while [ "$(grep -c hello /tmp/toy-hellos)" -lt $((world - 1)) ] && [ "${waited}" -lt 600 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill "${listener}" 2>/dev/null
  heard=$(grep -c hello /tmp/toy-hellos)
  echo "toy: rank 0 heard from ${heard} of $((world - 1)) ranks"
  [ "${heard}" -eq $((world - 1)) ] || { echo "toy: rank 0 did not hear from every rank" >&2; exit 5; }
fi

last=$((world - 1))
tok=$(((10000 + steps * 7 + world) * ${TOY_THROUGHPUT_PCT:-100} / 100))
{
  echo "model,performance,metric,mode,precision,batch_size,global_batch_size,seq_len,device,num_gpus"
  if [ "${RANK}" = "${last}" ] && [ "${empty}" = 0 ]; then
    echo "toy-llm,${tok}.5,tok_per_s_per_gpu,pretrain,BF16,4,512,8192,busybox,${world}"
    echo "toy-llm,$((tok / 20)).25,TFLOPS_per_gpu,pretrain,BF16,4,512,8192,busybox,${world}"
  else
    echo "toy-llm,,tok_per_s_per_gpu,pretrain,BF16,4,512,8192,busybox,${world}"
    echo "toy-llm,,TFLOPS_per_gpu,pretrain,BF16,4,512,8192,busybox,${world}"
  fi
} >"${out}/${csv}"
if [ "${RANK}" = "${last}" ] && [ "${empty}" = 0 ]; then
  echo "performance: ${tok}.5 tok_per_s_per_gpu"
fi
echo "toy: rank ${RANK} wrote ${out}/${csv}"
if [ "${RANK}" = "${fail_rank}" ]; then
  echo "toy: rank ${RANK} failing on purpose with exit ${fail_code}" >&2
  exit "${fail_code}"
fi
exit 0
