# shellcheck shell=bash
# The test cluster: a real slurmctld, one slurmd + dockerd per node, each node a network namespace
# with its own hostname, /etc/hosts and docker socket. Functions only; the entrypoints beside this
# file (up, down, status, exec) call them. See docs/test-cluster.md.

CLUSTER_STATE=${SM_CLUSTER_STATE:-/run/sm-cluster}      # pids, sockets, hosts files (tmpfs)
CLUSTER_DATA=${SM_CLUSTER_DATA:-/var/lib/sm-cluster}     # docker data roots, slurm spool
CLUSTER_BRIDGE=smbr0
CLUSTER_NET=10.77.0                                      # only inside namespaces we create
CLUSTER_CTL_ADDR=${CLUSTER_NET}.254
CLUSTER_NETNS_PREFIX=smc-
CLUSTER_SLURM_CONF=/etc/slurm/slurm.conf
CLUSTER_MUNGE_PID=/run/munge/munged.sm-cluster.pid
CLUSTER_MARK="# managed by slurm-multi tests/cluster"
CLUSTER_PACKAGES=(slurmctld slurmd slurm-client munge docker.io iptables iproute2 util-linux
  bats bats-assert bats-support bats-file busybox-static procps psmisc acl python3-venv debootstrap
  gcc make libc6-dev makeself squashfs-tools squashfuse fuse-overlayfs parallel pigz jq libbsd-dev libslurm-dev
  chromium)
# The ordinary user the end-to-end jobs run as (real users are not root): in the docker group,
# nothing else. It stays after `down` (a user account holds no process and no port).
CLUSTER_USER=${SM_CLUSTER_USER:-smuser}

cluster::node_addr() { printf '%s.%s' "${CLUSTER_NET}" "$((10 + ${1#node}))"; }
cluster::netns() { printf '%s%s' "${CLUSTER_NETNS_PREFIX}" "$1"; }
cluster::node_dir() { printf '%s/%s' "${CLUSTER_STATE}" "$1"; }

cluster::require_root() {
  [[ ${EUID} -eq 0 ]] || log::die cluster "the test cluster needs root (namespaces, bridges, daemons); run as root" 2
}

# Nodes that exist now, from the namespaces (works after a crash, unlike any state file).
cluster::nodes() {
  ip netns list 2>/dev/null | awk -v p="${CLUSTER_NETNS_PREFIX}" 'index($1, p) == 1 { print substr($1, length(p) + 1) }' | sort -V
}

cluster::install_packages() {
  local missing=() pkg
  for pkg in "${CLUSTER_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q 'install ok installed' || missing+=("${pkg}")
  done
  ((${#missing[@]} == 0)) && return 0
  log::info cluster "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Keep the packages' own init scripts from starting daemons: we start them ourselves.
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
}

# cluster::ensure_user: the ordinary user (CLUSTER_USER) exists and may use the nodes' docker engines
# (dockerd gives its socket to the docker group).
cluster::ensure_user() {
  getent group docker >/dev/null || groupadd --system docker
  if ! id -u "${CLUSTER_USER}" >/dev/null 2>&1; then
    useradd --create-home --shell /bin/bash --groups docker "${CLUSTER_USER}"
    log::info cluster "created the ordinary user ${CLUSTER_USER} (group docker) that the end-to-end jobs run as"
  elif ! id -nG "${CLUSTER_USER}" | tr ' ' '\n' | grep -qx docker; then
    usermod -aG docker "${CLUSTER_USER}"
  fi
}

# cluster::alive PID: running and not a zombie (a SIGKILLed daemon whose parent is gone can stay
# a zombie for a while, and `kill -0` still succeeds on it).
cluster::alive() {
  [[ $1 =~ ^[0-9]+$ ]] && [[ -r /proc/$1/status ]] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# cluster::pidfile_alive FILE: the daemon of this pid file runs.
cluster::pidfile_alive() {
  [[ -f $1 ]] && cluster::alive "$(<"$1")"
}

# Stop a daemon by its pid file (never by name: other daemons of that name may be someone else's).
cluster::stop_pidfile() {
  local pidfile=$1 pid i
  [[ -f ${pidfile} ]] || return 0
  pid=$(<"${pidfile}")
  if cluster::alive "${pid}"; then
    kill -TERM "${pid}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      cluster::alive "${pid}" || break
      sleep 0.1
    done
    kill -KILL "${pid}" 2>/dev/null || true
  fi
  rm -f "${pidfile}"
}

cluster::teardown() {
  local node dir
  for dir in "${CLUSTER_STATE}"/node*/; do
    [[ -d ${dir} ]] || continue
    cluster::stop_pidfile "${dir}slurmd.pid"
    cluster::stop_pidfile "${dir}dockerd.pid"
  done
  cluster::stop_pidfile "${CLUSTER_STATE}/slurmctld.pid"
  cluster::stop_pidfile "${CLUSTER_MUNGE_PID}"
  # Containers whose dockerd died keep their shims; their processes live in the node namespace.
  for node in $(cluster::nodes); do
    ip netns pids "$(cluster::netns "${node}")" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
    ip netns delete "$(cluster::netns "${node}")" 2>/dev/null || true
  done
  ip link delete "${CLUSTER_BRIDGE}" 2>/dev/null || true
  while iptables -D FORWARD -i "${CLUSTER_BRIDGE}" -o "${CLUSTER_BRIDGE}" -j ACCEPT 2>/dev/null; do :; done
  # Docker leaves overlay and netns mounts below its roots when killed.
  grep -E " (${CLUSTER_DATA}|${CLUSTER_STATE})/" /proc/mounts | awk '{ print $2 }' | sort -r |
    xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "${CLUSTER_STATE}"
  cluster::pyxis_clean
}

cluster::setup_network() {
  local nnodes=$1 node ns addr i
  ip link add "${CLUSTER_BRIDGE}" type bridge
  ip addr add "${CLUSTER_CTL_ADDR}/24" dev "${CLUSTER_BRIDGE}"
  ip link set "${CLUSTER_BRIDGE}" up
  # br_netfilter sends bridged frames through FORWARD, whose policy docker may set to DROP.
  iptables -I FORWARD -i "${CLUSTER_BRIDGE}" -o "${CLUSTER_BRIDGE}" -j ACCEPT
  for ((i = 1; i <= nnodes; i++)); do
    node=node${i} ns=$(cluster::netns "node${i}") addr=$(cluster::node_addr "node${i}")
    ip netns add "${ns}"
    ip link add "smv-${node}" type veth peer name eth0 netns "${ns}"
    ip link set "smv-${node}" master "${CLUSTER_BRIDGE}" up
    ip -n "${ns}" addr add "${addr}/24" dev eth0
    ip -n "${ns}" link set lo up
    ip -n "${ns}" link set eth0 up
    ip -n "${ns}" route add default via "${CLUSTER_CTL_ADDR}"
  done
}

# The node's hosts file; a quirk puts the node's own name on loopback or link-local first.
cluster::write_hosts() {
  local node=$1 nnodes=$2 quirk=$3 ns lladdr i
  ns=$(cluster::netns "${node}")
  {
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n'
    case ${quirk} in
      loopback) printf '127.0.1.1\t%s\n' "${node}" ;;
      linklocal)
        lladdr=$(cluster::link_local "${ns}")
        printf '%s\t%s\n' "${lladdr}" "${node}"
        ;;
    esac
    printf '%s\tctl\n' "${CLUSTER_CTL_ADDR}"
    for ((i = 1; i <= nnodes; i++)); do
      # Like Debian, a loopback node knows its own name only as 127.0.1.1.
      [[ ${quirk} == loopback && node${i} == "${node}" ]] && continue
      printf '%s\tnode%s\n' "$(cluster::node_addr "node${i}")" "${i}"
    done
  } >"$(cluster::node_dir "${node}")/hosts.new"
  # Same inode: truncate and rewrite, never replace (the node bind-mounts this file).
  cat "$(cluster::node_dir "${node}")/hosts.new" >"$(cluster::node_dir "${node}")/hosts"
  rm -f "$(cluster::node_dir "${node}")/hosts.new"
}

# cluster::set_self_name NODE QUIRK: rewrite a running node's hosts file in place (same inode, so
# the bind mount inside the node sees it at once) and record the quirk.
cluster::set_self_name() {
  local node=$1 quirk=$2 nnodes
  [[ ${quirk} =~ ^(loopback|linklocal|none)$ ]] ||
    log::die cluster "self-name ${node}=${quirk}: expected loopback, linklocal or none" 2
  grep -q "^${node} " "${CLUSTER_STATE}/nodes" 2>/dev/null ||
    log::die cluster "self-name: no node '${node}' in the running cluster" 2
  nnodes=$(wc -l <"${CLUSTER_STATE}/nodes")
  cluster::write_hosts "${node}" "${nnodes}" "${quirk}"
  sed -i "s/^\(${node} [^ ]*\) .*/\1 ${quirk}/" "${CLUSTER_STATE}/nodes"
}

cluster::link_local() {
  local ns=$1 addr i
  for ((i = 0; i < 50; i++)); do
    addr=$(ip -n "${ns}" -6 -o addr show dev eth0 scope link 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4; exit }')
    [[ -n ${addr} ]] && { printf '%s' "${addr}"; return 0; }
    sleep 0.1
  done
  log::die cluster "${ns}: eth0 has no fe80:: address (is IPv6 disabled?)"
}

cluster::write_slurm_conf() {
  local nnodes=$1
  mkdir -p /etc/slurm "${CLUSTER_DATA}/slurmctld"
  if [[ -f ${CLUSTER_SLURM_CONF} ]] && ! grep -qF "${CLUSTER_MARK}" "${CLUSTER_SLURM_CONF}"; then
    cp "${CLUSTER_SLURM_CONF}" "${CLUSTER_SLURM_CONF}.before-sm-cluster"
    log::warn cluster "saved the existing ${CLUSTER_SLURM_CONF} as ${CLUSTER_SLURM_CONF}.before-sm-cluster"
  fi
  cat >"${CLUSTER_SLURM_CONF}" <<CONF
${CLUSTER_MARK}
ClusterName=smtest
SlurmctldHost=ctl(${CLUSTER_CTL_ADDR})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=${CLUSTER_DATA}/slurmctld
SlurmctldPidFile=${CLUSTER_STATE}/slurmctld.pid
SlurmctldLogFile=${CLUSTER_STATE}/slurmctld.log
SlurmdSpoolDir=${CLUSTER_DATA}/%n/slurmd
SlurmdPidFile=${CLUSTER_STATE}/%n/slurmd.pid
SlurmdLogFile=${CLUSTER_STATE}/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
# The profiling flush needs time between SIGTERM and SIGKILL (see docs/profiling.md).
KillWait=60
# A requeued job (--on-bad-node requeue) waits cred_expire seconds before it may start again
# (Slurm's default 120; see docs/bad-nodes.md).
AuthInfo=cred_expire=10
MinJobAge=600
SlurmdTimeout=20
InactiveLimit=0
Waittime=0
NodeName=DEFAULT CPUs=2 RealMemory=1000 State=UNKNOWN
CONF
  local i
  for ((i = 1; i <= nnodes; i++)); do
    printf 'NodeName=node%s NodeAddr=%s\n' "${i}" "$(cluster::node_addr "node${i}")" >>"${CLUSTER_SLURM_CONF}"
  done
  printf 'PartitionName=debug Nodes=node[1-%s] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n' \
    "${nnodes}" >>"${CLUSTER_SLURM_CONF}"
}

cluster::start_munge() {
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  # munged runs as munge and writes its pid file where munge may write.
  runuser -u munge -- /usr/sbin/munged --pid-file="${CLUSTER_MUNGE_PID}" --force </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-
  cluster::wait_for "munged pid file" test -s "${CLUSTER_MUNGE_PID}"
}

cluster::start_slurmctld() {
  setsid unshare --uts -- bash -c 'hostname ctl && exec slurmctld -D -i' \
    >"${CLUSTER_STATE}/slurmctld.out" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
}

# dockerd and slurmd share the node's net namespace; slurmd gets its own UTS and mount namespaces
# so that job steps see the node's hostname, hosts file and docker socket (and its own /run/pyxis,
# where pyxis keeps its per-step state).
cluster::start_dockerd() {
  local node=$1 dir ns data
  dir=$(cluster::node_dir "${node}") ns=$(cluster::netns "${node}") data=${CLUSTER_DATA}/${node}
  mkdir -p "${data}/docker" "${data}/slurmd" "${dir}/docker-exec"
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid nsenter --net="/run/netns/${ns}" -- unshare --mount --uts -- bash -c '
      hostname "$1"
      mount --bind "$2/hosts" /etc/hosts
      exec dockerd -H "unix://$2/docker.sock" --data-root "$3/docker" --exec-root "$2/docker-exec" \
        --pidfile "$2/dockerd.pid" --bridge=none --iptables=false --ip-masq=false --ip-forward=false \
        --userland-proxy=false' _ "${node}" "${dir}" "${data}" >"${dir}/dockerd.log" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
}

cluster::start_slurmd() {
  local node=$1 dir ns
  dir=$(cluster::node_dir "${node}") ns=$(cluster::netns "${node}")
  # Job steps must talk to this node's engine at the default /var/run/docker.sock. That path is a
  # symlink into /run/sm-node, and each node binds its own state dir there, so a restarted dockerd
  # (new socket inode) is still found. A host with its own engine keeps its socket; then we bind the
  # node's socket file over it instead.
  mkdir -p /run/sm-node /run/pyxis "${dir}/pyxis"
  [[ -e /var/run/docker.sock || -L /var/run/docker.sock ]] || ln -s /run/sm-node/docker.sock /var/run/docker.sock
  # shellcheck disable=SC2016 # expanded by the inner shell
  setsid nsenter --net="/run/netns/${ns}" -- unshare --mount --uts -- bash -c '
      hostname "$1"
      mount --bind "$2/hosts" /etc/hosts
      mount --bind "$2" /run/sm-node
      mount --bind "$2/pyxis" /run/pyxis
      [ -L /var/run/docker.sock ] || mount --bind "$2/docker.sock" /var/run/docker.sock
      exec slurmd -D -N "$1"' _ "${node}" "${dir}" >"${dir}/slurmd.out" 2>&1 </dev/null 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&- &
}

# cluster::wait_for WHAT CMD…: poll CMD for up to SM_CLUSTER_WAIT seconds (default 60).
cluster::wait_for() {
  local what=$1 deadline
  shift
  deadline=$((SECONDS + ${SM_CLUSTER_WAIT:-60}))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || log::die cluster "timed out waiting for ${what} (see ${CLUSTER_STATE}/*.log)"
    sleep 0.2
  done
}

cluster::nodes_idle() {
  local want=$1 idle
  idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle" { n++ } END { print n + 0 }')
  [[ ${idle} -ge ${want} ]]
}

# cluster::exec NODE CMD…: run CMD inside NODE's namespaces, as a job step on that node sees it.
cluster::exec() {
  local node=$1 pid
  shift
  pid=$(cat "$(cluster::node_dir "${node}")/slurmd.pid" 2>/dev/null) ||
    log::die cluster "${node} is not running (no slurmd pid file); is the cluster up? try tests/cluster/up" 2
  if ! cluster::alive "${pid}"; then
    log::die cluster "${node}: slurmd (pid ${pid}) is not running" 1
  fi
  nsenter -t "${pid}" --net --uts --mount --wd="${PWD}" -- "$@"
}

# shellcheck source=tests/cluster/pyxis.sh
source "$(dirname "${BASH_SOURCE[0]}")/pyxis.sh"
