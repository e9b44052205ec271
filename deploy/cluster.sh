#!/usr/bin/env bash
# A real SLURM cluster on one machine: slurmctld + slurmdbd (private MariaDB) on the host, and
# N compute nodes, each a network namespace with its own hostname, address and eth0.
#
#   deploy/cluster.sh up   [--nodes N] [--cpus C] [--gpus G] [--gpu-type T] [--dir DIR]   (idempotent)
#   deploy/cluster.sh down [--dir DIR]                                     (idempotent)
#   deploy/cluster.sh status [--dir DIR]
#   source DIR/env    # exports SLURM_CONF for sbatch, sacct, submitit ...
#
# Needs root and Debian 12 (it installs slurm-wlm 22.05, munge, slurmdbd and MariaDB itself).
# Daemons are stopped by the PIDs recorded in DIR only. Fake GPUs are GRES backed by character
# devices (mknod c 1 3), so scheduling and CUDA_VISIBLE_DEVICES binding are real; CUDA is not.
# They are typed (--gpu-type, default a100: Gres=gpu:a100:G), so jobs may ask for
# --gpus-per-node=a100:2 as on a real cluster; untyped requests (--gpus-per-node=2) match them
# too. --gpu-type '' gives untyped GPUs (Gres=gpu:G), which typed requests do not match.
set -euo pipefail

CMD=${1:-}; shift || true
NODES=2; CPUS=4; GPUS=2; GPU_TYPE=a100; DIR=${ORCH_CLUSTER_DIR:-/var/tmp/orch-cluster}
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --gpu-type) GPU_TYPE=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$NODES$CPUS$GPUS" in *[!0-9]*|'') echo "--nodes, --cpus and --gpus take whole numbers" >&2; exit 2 ;; esac
# A GRES type as slurm.conf and gres.conf spell it; refused here rather than by slurmctld's log.
[[ -z "$GPU_TYPE" || "$GPU_TYPE" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ ]] || {
  echo "--gpu-type '$GPU_TYPE': use letters, digits, '_', '.' or '-' (e.g. a100), or '' for untyped GPUs" >&2; exit 2; }
BRIDGE=orchbr0; NET=10.77.0; CTL_ADDR=$NET.1; CLUSTER=orch; DB_PORT=3307
log() { echo "[cluster] $*" >&2; }
alive() { [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat")" != Z ]; }
pid_of() { [ -s "$1" ] && cat "$1" || true; }

install_packages() {
  local need=()
  for bin in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge slurmdbd:slurmdbd \
             mariadbd:mariadb-server ip:iproute2 nsenter:util-linux; do
    command -v "${bin%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${bin%%:*}" ] || need+=("${bin##*:}")
  done
  [ ${#need[@]} -eq 0 ] && return 0
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
    apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
    apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "${need[@]}" >/dev/null
  }
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
  # munged runs as the munge user and cannot write into DIR: record its PID ourselves, so that
  # `down` stops the munged this script started (and only that one).
  for _ in $(seq 50); do
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
      pgrep -u munge -x munged -n > "$DIR/munged.pid" || true
      return 0
    fi
    sleep 0.1
  done
  log "munged did not start"; return 1
}

start_mariadb() {
  alive "$(pid_of "$DIR/mysql.pid")" && return 0
  if [ ! -d "$DIR/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$DIR/mysql" --auth-root-authentication-method=normal >/dev/null 2>&1
  fi
  setsid /usr/sbin/mariadbd --user=root --datadir="$DIR/mysql" --socket="$DIR/mysql.sock" --port=$DB_PORT \
    --bind-address=127.0.0.1 --pid-file="$DIR/mysql.pid" --skip-name-resolve --log-error="$DIR/log/mariadb.log" \
    </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do mariadb -S "$DIR/mysql.sock" -e "select 1" >/dev/null 2>&1 && break; sleep 0.2; done
  mariadb -S "$DIR/mysql.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

write_configs() {
  local host; host=$(hostname)
  mkdir -p "$DIR"/{state,spool,log,dev}
  for i in $(seq 0 $((GPUS - 1))); do [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 1 3; done
  {
    echo "127.0.0.1 localhost"
    echo "$CTL_ADDR $host"
    for i in $(seq 1 "$NODES"); do echo "$NET.$((10 + i)) node$i"; done
  } > "$DIR/hosts"
  # Nodes resolve names from the hosts file only. The host's DNS server is unreachable from a
  # namespace, and each reverse lookup (c10d does them) would otherwise wait 5 s for a timeout.
  echo "nameserver 127.0.0.1" > "$DIR/resolv.conf"
  cat > "$DIR/slurmdbd.conf" <<EOF
DbdHost=localhost
SlurmUser=root
AuthType=auth/munge
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
EOF
  chmod 600 "$DIR/slurmdbd.conf"
  local gres="" typed=""
  [ -n "$GPU_TYPE" ] && typed="$GPU_TYPE:"
  [ "$GPUS" -gt 0 ] && gres="Gres=gpu:$typed$GPUS"
  cat > "$DIR/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$host($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
SlurmdTimeout=10
MessageTimeout=10
KillWait=5
MinJobAge=600
InactiveLimit=0
MaxArraySize=1001
JobRequeue=1
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) NodeHostname=node$i CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=8000 $gres State=UNKNOWN" >> "$DIR/slurm.conf"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$DIR/slurm.conf"
  if [ "$GPUS" -gt 0 ]; then
    { echo "AutoDetect=off"
      echo "NodeName=node[1-$NODES] Name=gpu${GPU_TYPE:+ Type=$GPU_TYPE} File=$DIR/dev/nvidia[0-$((GPUS - 1))]"; } > "$DIR/gres.conf"
  else
    echo "AutoDetect=off" > "$DIR/gres.conf"
  fi
  echo "export SLURM_CONF=$DIR/slurm.conf" > "$DIR/env"
}

make_network() {
  ip link show $BRIDGE >/dev/null 2>&1 || { ip link add $BRIDGE type bridge; ip addr add $CTL_ADDR/24 dev $BRIDGE; }
  ip link set $BRIDGE up
  for i in $(seq 1 "$NODES"); do
    local ns=orch-node$i
    ip netns list | grep -qw "$ns" || ip netns add "$ns"
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip link del "orchv$i" 2>/dev/null || true
      ip link add "orchv$i" type veth peer name "orchp$i"
      ip link set "orchp$i" netns "$ns"
      ip -n "$ns" link set "orchp$i" name eth0
      ip -n "$ns" addr add "$NET.$((10 + i))/24" dev eth0
      ip link set "orchv$i" master $BRIDGE
      ip link set "orchv$i" up
    fi
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route replace default via $CTL_ADDR
  done
}

start_slurmd() {
  local i=$1
  alive "$(pid_of "$DIR/slurmd-node$i.pid")" && return 0
  mkdir -p "$DIR/spool/node$i"
  # Not `ip netns exec`: it remounts /sys and hides the cgroup mounts that slurmd needs.
  setsid nsenter --net=/run/netns/orch-node$i unshare --mount --uts sh -c \
    "mount --bind '$DIR/hosts' /etc/hosts && mount --bind '$DIR/resolv.conf' /etc/resolv.conf && hostname node$i && exec slurmd -f '$DIR/slurm.conf' -N node$i" \
    </dev/null >>"$DIR/log/slurmd-start.log" 2>&1
}

up() {
  [ "$(id -u)" = 0 ] || { echo "deploy/cluster.sh needs root" >&2; exit 1; }
  install_packages
  mkdir -p "$DIR/log"
  write_configs
  start_munge
  start_mariadb
  export SLURM_CONF=$DIR/slurm.conf
  if ! alive "$(pid_of "$DIR/slurmdbd.pid")"; then
    slurmdbd
    for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  sacctmgr -n list cluster format=cluster | grep -qw $CLUSTER || sacctmgr -i add cluster $CLUSTER >/dev/null
  make_network
  alive "$(pid_of "$DIR/slurmctld.pid")" || slurmctld -f "$DIR/slurm.conf"
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
  for i in $(seq 1 "$NODES"); do start_slurmd "$i"; done
  for _ in $(seq 150); do
    [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c idle)" -ge "$NODES" ] && break
    for n in $(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /down|drain/ {print $1}'); do
      scontrol update nodename="$n" state=resume 2>/dev/null || true
    done
    sleep 0.2
  done
  sinfo -h -N -o '%N %T' | grep -q idle || { log "nodes did not come up; see $DIR/log"; sinfo -N; exit 1; }
  # Warm-up: the first batch job after slurmctld starts waits ~3 s; pay it here, not in a test.
  sbatch -Q --wait -o /dev/null --wrap true >/dev/null 2>&1 || true
  log "up: $NODES node(s), ${GPUS} GPU(s) ${GPU_TYPE:-untyped} per node, SLURM_CONF=$DIR/slurm.conf"
}

kill_pidfile() {
  local pid; pid=$(pid_of "$1")
  if alive "$pid"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

down() {
  [ -d "$DIR" ] || { log "nothing at $DIR"; return 0; }
  for f in "$DIR"/slurmd-node*.pid; do [ -e "$f" ] && kill_pidfile "$f"; done
  kill_pidfile "$DIR/slurmctld.pid"
  kill_pidfile "$DIR/slurmdbd.pid"
  kill_pidfile "$DIR/mysql.pid"
  kill_pidfile "$DIR/munged.pid"
  # Job steps left behind by a killed slurmd live in the node namespaces: stop them too.
  for ns in $(ip netns list 2>/dev/null | awk '/^orch-node/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for _ in $(seq 50); do ip -o link show 2>/dev/null | grep -q "orchv" || break; sleep 0.1; done
  ip link del $BRIDGE 2>/dev/null || true
  rm -rf "$DIR"
  log "down"
}

status() {
  export SLURM_CONF=$DIR/slurm.conf
  for f in slurmctld slurmdbd mysql; do echo "$f: $(alive "$(pid_of "$DIR/$f.pid")" && echo running || echo stopped)"; done
  sinfo -N 2>/dev/null || true
}

case "$CMD" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: deploy/cluster.sh up|down|status [--nodes N] [--cpus C] [--gpus G] [--gpu-type T] [--dir DIR]" >&2; exit 2 ;;
esac
