#!/usr/bin/env bash
# A real 2-node Slurm on this one Debian machine, each node in its own network namespace.
#
#   sudo tests/helpers/local_slurm.sh up      # install slurm-wlm + munge if missing, start everything
#   sinfo; sbatch --wait configs/slurm/train.sbatch --config quick
#   sudo tests/helpers/local_slurm.sh down    # stop what `up` started, remove what it made
#   tests/helpers/local_slurm.sh status       # exit 0 when both nodes answer
#
# `up` is idempotent (a second `up` only checks), `down` too. Root only.
#
# What it makes (and `down` removes, nothing else):
# - a bridge tfslurm0 with 10.213.0.1/24 (slurmctld listens there) and, per node
#   n1 and n2, a network namespace tfslurm-nI whose veth has 10.213.0.1I/24;
# - two lines in /etc/hosts, "10.213.0.11 n1" and "10.213.0.12 n2", marked
#   with "# tfdist-local-slurm" (so that TensorFlow's `n1:PORT` resolves);
# - /etc/slurm/slurm.conf, marked on its first line (an existing one that is
#   not ours is left alone and `up` refuses), and its state under $STATE;
# - munged as the munge user (only if none runs), slurmctld on the host, and
#   one `slurmd -N nI` per node, started with `nsenter --net=` inside its
#   namespace (`ip netns exec` remounts /sys, and slurmd then dies with
#   "No filesystem mounted on /sys/fs/cgroup").
# Each node declares 32 CPUs (SlurmdParameters=config_overrides), whatever the
# box has: four 2-node jobs of configs/slurm/train.sbatch (4 CPUs a task) and
# its 4-task parameter-server form fit at once. A second partition, "one",
# holds n1 alone (a 2-node job there can never start). A requeued job starts
# again 10 s after it ended (AuthInfo=cred_expire=10; Slurm's default is 120).
set -euo pipefail

STATE="${TFDIST_SLURM_STATE:-/var/lib/tfdist-slurm}"
CONF=/etc/slurm/slurm.conf
MARK="# tfdist-local-slurm"
BRIDGE=tfslurm0
SUBNET_PREFIX=10.213.0
CTLD_ADDR="$SUBNET_PREFIX.1"
NODES=(n1 n2)
CPUS_PER_NODE=32
WAIT_S=60

say() { echo "local_slurm: $*" >&2; }
die() { say "$*"; exit 1; }

node_addr() { echo "$SUBNET_PREFIX.1${1#n}"; }   # n1 -> 10.213.0.11
netns() { echo "tfslurm-$1"; }

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

require_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages, makes network namespaces and starts daemons)"
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
      && command -v sbatch >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get to install them"
  say "installing slurm-wlm munge"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >"$STATE/apt.log" 2>&1 \
    || { DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$STATE/apt.log" 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge \
              >>"$STATE/apt.log" 2>&1; } \
    || die "apt-get install slurm-wlm munge failed (see $STATE/apt.log)"
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    install -d -o munge -g munge -m 0700 /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key >/dev/null 2>&1 \
      || dd if=/dev/urandom of=/etc/munge/munge.key bs=128 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
  if munge -n </dev/null >/dev/null 2>&1; then
    return  # a munged already answers (ours from an earlier `up`, or the machine's)
  fi
  runuser -u munge -- munged 9>&-   # daemons must not keep the lock (fd 9)
  touch "$STATE/munged.ours"
  for _ in $(seq 50); do munge -n </dev/null >/dev/null 2>&1 && return; sleep 0.2; done
  die "munged does not answer"
}

make_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    if ip -4 addr | grep -q "inet $SUBNET_PREFIX\."; then
      die "$SUBNET_PREFIX.0/24 is already used on this machine (ip -4 addr); not making $BRIDGE"
    fi
    ip link add "$BRIDGE" type bridge
    ip addr add "$CTLD_ADDR/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  for node in "${NODES[@]}"; do
    local ns host_if="tfsl-$node" peer_if="tfsl-${node}p"
    ns=$(netns "$node")
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    if ! ip link show "$host_if" >/dev/null 2>&1; then
      ip link add "$host_if" type veth peer name "$peer_if"
      ip link set "$peer_if" netns "$ns"
      ip link set "$host_if" master "$BRIDGE"
      ip link set "$host_if" up
      ip -n "$ns" addr add "$(node_addr "$node")/24" dev "$peer_if"
      ip -n "$ns" link set "$peer_if" up
      ip -n "$ns" link set lo up
    fi
  done
  [ -z "$(tail -c1 /etc/hosts)" ] || echo >>/etc/hosts  # a last line without its newline
  for node in "${NODES[@]}"; do
    grep -q "^$(node_addr "$node") $node $MARK\$" /etc/hosts \
      || echo "$(node_addr "$node") $node $MARK" >>/etc/hosts
  done
}

write_conf() {
  if [ -f "$CONF" ] && ! head -n1 "$CONF" | grep -qF "$MARK"; then
    die "$CONF exists and was not written by this script; move it away first (not touching it)"
  fi
  local nodes_conf="" node
  for node in "${NODES[@]}"; do
    nodes_conf+="NodeName=$node NodeAddr=$(node_addr "$node") CPUs=$CPUS_PER_NODE State=UNKNOWN"$'\n'
  done
  install -d -m 0755 /etc/slurm "$STATE/ctld" "$STATE/slurmd"
  cat >"$CONF.tmp" <<EOF
$MARK: written by tests/helpers/local_slurm.sh up, removed by its down.
ClusterName=tfdist
SlurmctldHost=$(hostname -s)($CTLD_ADDR)
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmUser=root
SlurmdUser=root
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=10
MinJobAge=600
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdSpoolDir=$STATE/slurmd/%n
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmdLogFile=$STATE/slurmd-%n.log
${nodes_conf}PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
PartitionName=one Nodes=${NODES[0]} MaxTime=INFINITE State=UP
EOF
  if [ -f "$CONF" ] && cmp -s "$CONF" "$CONF.tmp"; then
    rm -f "$CONF.tmp"
  else
    mv "$CONF.tmp" "$CONF"
    stop_daemons  # running ones (from an `up` of another version of this script) restart with it
  fi
}

start_daemons() {
  if ! pid_alive "$STATE/slurmctld.pid"; then
    slurmctld 9>&- || die "slurmctld did not start (see $STATE/slurmctld.log)"
  fi
  for node in "${NODES[@]}"; do
    install -d "$STATE/slurmd/$node"
    if ! pid_alive "$STATE/slurmd-$node.pid"; then
      nsenter --net="/run/netns/$(netns "$node")" slurmd -N "$node" 9>&- \
        || die "slurmd -N $node did not start (see $STATE/slurmd-$node.log)"
    fi
  done
}

nodes_idle() {
  local states
  states=$(timeout 10 sinfo -h -N -p debug -o '%N %t' 2>/dev/null | sort -u) || return 1
  for node in "${NODES[@]}"; do
    grep -Eq "^$node (idle|mix|alloc)\$" <<<"$states" || return 1
  done
}

wait_idle() {
  local deadline=$((SECONDS + WAIT_S))
  while ! nodes_idle; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      say "the nodes are not up after ${WAIT_S}s:"
      sinfo -N 2>&1 | sed 's/^/  /' >&2 || true
      tail -n 5 "$STATE"/slurm*.log 2>/dev/null | sed 's/^/  /' >&2 || true
      return 1
    fi
    sleep 1
  done
}

up() {
  require_root
  install -d -m 0755 "$STATE"
  install_packages
  start_munge
  make_network
  write_conf
  start_daemons
  wait_idle
  say "up: nodes ${NODES[*]} on $BRIDGE ($SUBNET_PREFIX.0/24), slurmctld on $CTLD_ADDR"
}

stop_pidfile() {  # stop_pidfile FILE NAME: SIGTERM, then SIGKILL after 10 s
  local file="$1" pid
  pid_alive "$file" || return 0
  pid=$(cat "$file")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  say "$2 ($pid) did not stop on SIGTERM; SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
}

stop_daemons() {
  local node
  for node in "${NODES[@]}"; do
    stop_pidfile "$STATE/slurmd-$node.pid" "slurmd -N $node"
  done
  stop_pidfile "$STATE/slurmctld.pid" slurmctld
}

down() {
  require_root
  if command -v scancel >/dev/null && [ -f "$CONF" ] && head -n1 "$CONF" | grep -qF "$MARK"; then
    timeout 10 scancel --full --quiet --state=RUNNING,PENDING --user=root 2>/dev/null || true
  fi
  stop_daemons
  # Job steps whose slurmstepd outlived its slurmd (inside our namespaces only).
  for node in "${NODES[@]}"; do
    local ns pids
    ns=$(netns "$node")
    [ -e "/run/netns/$ns" ] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
  done
  if [ -f "$STATE/munged.ours" ]; then
    stop_pidfile /run/munge/munged.pid munged
  fi
  for node in "${NODES[@]}"; do
    ip link del "tfsl-$node" 2>/dev/null || true
    ip netns del "$(netns "$node")" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if grep -qF "$MARK" /etc/hosts; then
    # rewrite in place (/etc/hosts may be a bind mount that cannot be replaced)
    local kept
    kept=$(grep -vF "$MARK" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
  fi
  if [ -f "$CONF" ] && head -n1 "$CONF" | grep -qF "$MARK"; then
    rm -f "$CONF"
  fi
  rm -rf "$STATE"
  say "down"
}

lock() {  # one `up` or `down` at a time on this machine
  exec 9>/run/tfdist-local-slurm.lock
  flock -w 300 9 || die "another local_slurm.sh up/down holds /run/tfdist-local-slurm.lock"
}

case "${1:-}" in
  up) require_root; lock; up ;;
  down) require_root; lock; down ;;
  status) nodes_idle ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
