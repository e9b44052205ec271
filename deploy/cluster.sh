#!/usr/bin/env bash
# A real SLURM cluster on one machine: slurmctld + slurmdbd (private MariaDB) on the host, and
# N compute nodes, each a network namespace with its own hostname, address and eth0.
#
#   deploy/cluster.sh up   [--nodes N] [--cpus C] [--gpus G] [--gpu-type T] [--profile P] [--dir DIR]
#                          [--login [--login-user NAME] [--login-totp]] [--oci] [--no-accounting]
#                                                                           (idempotent)
#   deploy/cluster.sh down [--dir DIR]                                     (idempotent)
#   deploy/cluster.sh status [--dir DIR]
#   source DIR/env    # exports SLURM_CONF for sbatch, sacct, submitit ...
#   ssh -F DIR/login/ssh_config orch-login sinfo    # with --login: SLURM as from a laptop
#
# Needs root and Debian 12 (it installs slurm-wlm 22.05, munge, slurmdbd and MariaDB itself).
# --no-accounting runs without slurmdbd and MariaDB (AccountingStorageType=accounting_storage/none),
# as small clusters do: sacct answers "Slurm accounting storage is disabled", and only squeue and
# scontrol know a job, until MinJobAge after its end. DIR/accounting records which (slurmdbd or
# none); switching needs `down` first, as switching profiles does.
# Daemons are stopped by the PIDs recorded in DIR only. Fake GPUs are GRES backed by character
# devices (mknod c 1 3), so scheduling and CUDA_VISIBLE_DEVICES binding are real; CUDA is not.
# They are typed (--gpu-type, default a100: Gres=gpu:a100:G), so jobs may ask for
# --gpus-per-node=a100:2 as on a real cluster; untyped requests (--gpus-per-node=2) match them
# too. --gpu-type '' gives untyped GPUs (Gres=gpu:G), which typed requests do not match.
#
# --profile kind (the default) is quick and forgiving, for tests. --profile site configures what
# real sites do and kind does not: tasks bound to their CPUs (task/affinity), no requeue unless
# the job asks (JobRequeue=0), a 'high' partition whose jobs preempt 'debug' jobs (REQUEUE, 30 s
# GraceTime), a 'cancel' and a 'suspend' partition whose jobs 'high' preempts by CANCEL and by
# SUSPEND (PreemptMode=SUSPEND,GANG for the cluster), KillWait 30 s, memory as a consumable
# resource, 2 CPUs per GPU by default (DefCpuPerGPU), a default time limit, associations enforced
# (an account, physics, that root and the login user charge by default; others are refused) and
# TrackWCKey (both left out with --no-accounting), and each node resolving its own name to
# 127.0.1.1 as Debian's /etc/hosts does. DIR/profile records which.
# Switching profiles needs `down` first: plugins change only when the daemons restart.
#
# --login adds a login node, as users reach a real cluster: a namespace 'login' (orch-login,
# 10.77.0.250) running its own sshd (DIR/login/sshd_config, host keys and PID file in DIR/login;
# the host's /etc/ssh and sshd are not used), key authentication only, for one non-root user
# (--login-user, default orchuser, created if missing with its home in /srv/orch-login-home).
# Its sessions have SLURM_CONF set; jobs they submit run as that user on the nodes. The host's
# side is DIR/login/ssh_config (Host orch-login), client_key and known_hosts. `down` removes the
# user and its home only if `up` created them (DIR/login/created-user, created-home).
# --login-totp also asks for a TOTP code after the key (PAM, pam_oath), as clusters with 2FA do;
# the secret is DIR/login/totp_secret (hex) and totp_secret.base32. `up --login` without it
# turns the second factor off again.
#
# --oci sets up SLURM's own OCI containers (srun --container=BUNDLE): installs runc, writes
# DIR/oci.conf next to slurm.conf (runc run/state/kill/delete, state in DIR/oci-state), and builds
# a small bundle at DIR/oci-bundle (config.json from 'runc spec', host network and IPC, /dev/shm
# shared; rootfs: this machine's Debian python3.11 with its standard library and libraries, a marker
# file /orch-oci-marker and an /etc/os-release of its own, ID=orch-oci). A spec's
# container: {runtime: oci, image: DIR/oci-bundle} runs its ranks in it (deploy/README.md).
set -euo pipefail

CMD=${1:-}; shift || true
NODES=2; CPUS=4; GPUS=2; GPU_TYPE=a100; PROFILE=kind; DIR=${ORCH_CLUSTER_DIR:-/var/tmp/orch-cluster}
LOGIN=0; LOGIN_USER=orchuser; LOGIN_USER_SET=0; LOGIN_TOTP=0; OCI=0; ACCOUNTING=1
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --gpu-type) GPU_TYPE=$2; shift 2 ;;
    --profile) PROFILE=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --login) LOGIN=1; shift ;;
    --login-user) LOGIN_USER=$2; LOGIN_USER_SET=1; shift 2 ;;
    --login-totp) LOGIN_TOTP=1; shift ;;
    --oci) OCI=1; shift ;;
    --no-accounting) ACCOUNTING=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
case "$NODES$CPUS$GPUS" in *[!0-9]*|'') echo "--nodes, --cpus and --gpus take whole numbers" >&2; exit 2 ;; esac
# A GRES type as slurm.conf and gres.conf spell it; refused here rather than by slurmctld's log.
[[ -z "$GPU_TYPE" || "$GPU_TYPE" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$ ]] || {
  echo "--gpu-type '$GPU_TYPE': use letters, digits, '_', '.' or '-' (e.g. a100), or '' for untyped GPUs" >&2; exit 2; }
case "$PROFILE" in kind|site) ;; *) echo "--profile '$PROFILE': use kind (the default) or site" >&2; exit 2 ;; esac
[ "$PROFILE" = kind ] || [ "$CPUS" -ge 1 ] || { echo "--profile site needs --cpus 1 or more" >&2; exit 2; }
[ "$LOGIN_USER_SET" = 0 ] || [ "$LOGIN" = 1 ] || { echo "--login-user goes with --login" >&2; exit 2; }
[ "$LOGIN_TOTP" = 0 ] || [ "$LOGIN" = 1 ] || { echo "--login-totp goes with --login" >&2; exit 2; }
# A plain user name, as useradd takes it; never root: the point is a user without privileges.
[[ "$LOGIN_USER" =~ ^[a-z_][a-z0-9_-]{0,31}$ && "$LOGIN_USER" != root ]] || {
  echo "--login-user '$LOGIN_USER': use a lower-case user name other than root (e.g. orchuser)" >&2; exit 2; }
BRIDGE=orchbr0; NET=10.77.0; CTL_ADDR=$NET.1; CLUSTER=orch; DB_PORT=3307
# The site profile's account: with associations enforced, a job must charge an account its user has
# an association with; root and the login user get one here, as their default. And their default
# wckey (TrackWCKey): a job without --wckey is booked to it.
SITE_ACCOUNT=physics; SITE_WCKEY=physics
# The login node: its namespace, its address (above any node's, NET.(10+i)) and its user's home,
# on the shared filesystem but outside /tmp and /var/tmp, which the orchestrator treats as
# node-local (as a site's /home is shared).
LOGIN_NS=orch-login; LOGIN_ADDR=$NET.250; LOGIN_HOME_BASE=/srv/orch-login-home
[ "$LOGIN" = 0 ] || [ "$NODES" -lt 240 ] || { echo "--login needs --nodes 239 or fewer (it takes $LOGIN_ADDR)" >&2; exit 2; }
REAL_MEMORY=8000  # MB per node, as slurm.conf declares it (SlurmdParameters=config_overrides)
NODE_LOCAL=/mnt/orch-node-local  # site: each node's own scratch folder (a tmpfs per node)
log() { echo "[cluster] $*" >&2; }
alive() { [ -n "${1:-}" ] && [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat")" != Z ]; }
pid_of() { [ -s "$1" ] && cat "$1" || true; }

# The slurm.conf values where the profiles differ; what each mimics is said where it is set.
if [ "$PROFILE" = site ]; then
  # Tasks pinned to the CPUs SLURM allocated (sched_setaffinity), as at nearly every site; srun's
  # --cpu-bind works and SLURM_CPU_BIND* are set. No TaskPluginParam: SLURM's auto binding (a
  # step whose tasks x cpus-per-task equals its allocated cores gets one core per task).
  TASK_PLUGIN=task/affinity
  # Memory is a consumable resource: --mem is checked against RealMemory, and a job that gives
  # none gets DefMemPerCPU per CPU (set below), so a whole-node job still fits.
  SELECT_PARAMS=CR_Core_Memory
  # Per-step CPU and memory accounting from /proc (sstat, sacct MaxRSS), as sites collect it.
  ACCT_GATHER=jobacct_gather/linux
  # SIGTERM, then SIGKILL 30 s later (the SLURM default), at the time limit, scancel, preemption.
  KILL_WAIT=30
  # A finished job leaves slurmctld's memory (scontrol show job) after 300 s (the default);
  # after that only sacct knows it.
  MIN_JOB_AGE=300
  # A batch job is requeued (scontrol requeue, node failure, preemption) only if it asked for
  # --requeue, as at sites that turn the default off.
  JOB_REQUEUE=0
  # A node an admin (or a health check) set DOWN stays down until someone resumes it (SLURM's
  # default); only a node DOWN for not responding returns when its slurmd registers again.
  RETURN_TO_SERVICE=1
else
  TASK_PLUGIN=task/none; SELECT_PARAMS=CR_Core; ACCT_GATHER=jobacct_gather/none
  KILL_WAIT=5; MIN_JOB_AGE=600; JOB_REQUEUE=1; RETURN_TO_SERVICE=2
fi

install_packages() {
  local need=() bins=(slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge ip:iproute2 nsenter:util-linux)
  [ "$ACCOUNTING" = 0 ] || bins+=(slurmdbd:slurmdbd mariadbd:mariadb-server)
  [ "$LOGIN" = 0 ] || bins+=(sshd:openssh-server ssh:openssh-client ssh-keygen:openssh-client useradd:passwd)
  [ "$OCI" = 0 ] || bins+=(runc:runc)
  for bin in "${bins[@]}"; do
    command -v "${bin%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${bin%%:*}" ] || need+=("${bin##*:}")
  done
  # A PAM module has no command to look for: ask dpkg.
  if [ "$LOGIN_TOTP" = 1 ] && ! dpkg-query -W -f='${Status}' libpam-oath 2>/dev/null | grep -q 'ok installed'; then
    need+=(libpam-oath)
  fi
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

# Under site, node i's /etc/hosts as Debian writes it: its own name on 127.0.1.1, so that
# gethostbyname(gethostname()) is a loopback address there, as on a real node; the other nodes and
# the controller by their real addresses. SLURM does not resolve these names: slurmctld reaches
# a node at its NodeAddr, and slurmd knows its NodeName from -N.
write_node_hosts() {
  local i=$1 host=$2 j
  {
    echo "127.0.0.1 localhost"
    echo "127.0.1.1 node$i"
    echo "$CTL_ADDR $host"
    for j in $(seq 1 "$NODES"); do [ "$j" = "$i" ] || echo "$NET.$((10 + j)) node$j"; done
    if login_wanted; then echo "$LOGIN_ADDR login"; fi
  } > "$DIR/hosts-node$i"
}

# Whether this cluster has a login node: asked for now, or set up by an earlier `up --login`
# (so that an `up` without --login, which rewrites the hosts files, keeps the name 'login').
login_wanted() { [ "$LOGIN" = 1 ] || [ -d "$DIR/login" ]; }

# The site profile's own slurm.conf lines: preemption, and the limits where kind is kinder.
site_conf() {
  cat <<EOF
# --- profile site: as real sites do (deploy/cluster.sh up --profile site) ---
# Preemption by partition: a pending job of 'high' (PriorityTier=2) that needs resources held by
# 'debug' jobs (PriorityTier=1) preempts them, as a site's scavenger/low-priority partition.
PreemptType=preempt/partition_prio
# The cluster default: SUSPEND with GANG, which slurm.conf(5) requires at the cluster level for any
# partition that suspends (the gang scheduler resumes a suspended job once its preemptor ends).
# Every partition names its own mode below, so no job gets this default: debug REQUEUE, cancel
# CANCEL, suspend SUSPEND, high OFF. With OverSubscribe=NO (the default) GANG time-slices nothing.
PreemptMode=SUSPEND,GANG
# A job's time limit is hard (the default): at the limit, SIGTERM, then SIGKILL after KillWait.
OverTimeLimit=0
# Steps still alive 60 s after SIGKILL drain their node (the default), as an unkillable process
# (stuck in D state on a dead filesystem) does at a site.
UnkillableStepTimeout=60
# Jobs that give no --mem get this much memory per allocated CPU (RealMemory / CPUs).
DefMemPerCPU=$((REAL_MEMORY / CPUS))
# A job that gives neither --cpus-per-task nor --cpus-per-gpu gets 2 CPUs per allocated GPU.
DefCpuPerGPU=2
EOF
  if [ "$ACCOUNTING" = 1 ]; then
    cat <<EOF
# A job must charge an account its user has an association with (sacctmgr): sbatch refuses any
# other with "Invalid account or account/partition combination specified"; a job that names none
# charges the user's default account ($SITE_ACCOUNT for root and the login user, set by 'up').
AccountingStorageEnforce=associations
# Jobs are booked to a workload characterization key: --wckey, else the user's default wckey
# ($SITE_WCKEY for root and the login user), else '*'. Not enforced (no 'wckeys' above): a job with
# a wckey the user does not have is booked to it anyway, never refused.
TrackWCKey=yes
EOF
  else
    echo "# --no-accounting: no associations to enforce and no wckeys to track (they live in slurmdbd)."
  fi
}

# Partitions. kind: one, no time limit. site: the same nodes in four partitions; a job without
# --time gets one hour (so --signal@margin fires as it would at a site) and none may ask for more
# than a day. debug's jobs are preempted with a 30 s GraceTime: their srun tasks get SIGCONT and
# SIGTERM at once (the batch shell does not, and --signal is not sent unless
# SlurmctldParameters=preempt_send_user_signal), then, at the end of the grace time (checked every
# 30 s), the whole job gets SIGCONT and SIGTERM, and SIGKILL KillWait later. high's jobs are not
# preempted. A preempted debug job that asked for --requeue is requeued (the run is PREEMPTED in
# sacct; the job pends ~120 s, Reason=BeginTime, Restarts+1); one that did not (JobRequeue=0) is
# cancelled and ends PREEMPTED. cancel's jobs are preempted as debug's, but cancelled even with
# --requeue (they end PREEMPTED), as a site's scavenger partition. suspend's jobs are suspended (SIGTSTP, then SIGSTOP)
# while high's job runs and resumed (SIGCONT) when it ends; a suspended job keeps its memory, so
# the preemptor must fit in what is left (DefMemPerCPU gives a whole-node job all of it: ask --mem).
write_partitions() {
  if [ "$PROFILE" = site ]; then
    local limits="DefaultTime=01:00:00 MaxTime=1-00:00:00 State=UP"
    echo "PartitionName=debug Nodes=ALL Default=YES $limits PriorityTier=1 PreemptMode=REQUEUE GraceTime=30"
    echo "PartitionName=high Nodes=ALL Default=NO $limits PriorityTier=2 PreemptMode=OFF"
    echo "PartitionName=cancel Nodes=ALL Default=NO $limits PriorityTier=1 PreemptMode=CANCEL GraceTime=30"
    echo "PartitionName=suspend Nodes=ALL Default=NO $limits PriorityTier=1 PreemptMode=SUSPEND"
  else
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  fi
}

write_configs() {
  local host; host=$(hostname)
  mkdir -p "$DIR"/{state,spool,log,dev}
  echo "$PROFILE" > "$DIR/profile"
  if [ "$ACCOUNTING" = 1 ]; then echo slurmdbd > "$DIR/accounting"; else echo none > "$DIR/accounting"; fi
  for i in $(seq 0 $((GPUS - 1))); do [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 1 3; done
  {
    echo "127.0.0.1 localhost"
    echo "$CTL_ADDR $host"
    for i in $(seq 1 "$NODES"); do echo "$NET.$((10 + i)) node$i"; done
    if login_wanted; then echo "$LOGIN_ADDR login"; fi
  } > "$DIR/hosts"
  if [ "$PROFILE" = site ]; then
    for i in $(seq 1 "$NODES"); do write_node_hosts "$i" "$host"; done
    # The login node as Debian writes its /etc/hosts, like the nodes': its own name on 127.0.1.1.
    if login_wanted; then
      { echo "127.0.0.1 localhost"; echo "127.0.1.1 login"; echo "$CTL_ADDR $host"
        for i in $(seq 1 "$NODES"); do echo "$NET.$((10 + i)) node$i"; done; } > "$DIR/hosts-login"
    fi
  fi
  # Nodes resolve names from the hosts file only. The host's DNS server is unreachable from a
  # namespace, and each reverse lookup (c10d does them) would otherwise wait 5 s for a timeout.
  echo "nameserver 127.0.0.1" > "$DIR/resolv.conf"
  [ "$ACCOUNTING" = 0 ] || write_slurmdbd_conf
  local gres="" typed="" storage
  [ -n "$GPU_TYPE" ] && typed="$GPU_TYPE:"
  [ "$GPUS" -gt 0 ] && gres="Gres=gpu:$typed$GPUS"
  # AccountingStorageHost is slurmdbd's address on the bridge (it listens on every address), not
  # localhost: sacct and sacctmgr on the login node and the nodes reach it as on a real cluster.
  # Without accounting, slurmctld alone knows a job: until MinJobAge after its end (squeue -t all).
  if [ "$ACCOUNTING" = 1 ]; then
    storage="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_ADDR"
  else
    storage="AccountingStorageType=accounting_storage/none"
  fi
  cat > "$DIR/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$host($CTL_ADDR)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=$TASK_PLUGIN
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=$SELECT_PARAMS
SlurmdParameters=config_overrides
ReturnToService=$RETURN_TO_SERVICE
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
$storage
JobAcctGatherType=$ACCT_GATHER
GresTypes=gpu
SlurmdTimeout=10
MessageTimeout=10
KillWait=$KILL_WAIT
MinJobAge=$MIN_JOB_AGE
InactiveLimit=0
MaxArraySize=1001
JobRequeue=$JOB_REQUEUE
EOF
  if [ "$PROFILE" = site ]; then site_conf >> "$DIR/slurm.conf"; fi
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=node$i NodeAddr=$NET.$((10 + i)) NodeHostname=node$i CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$REAL_MEMORY $gres State=UNKNOWN" >> "$DIR/slurm.conf"
  done
  write_partitions >> "$DIR/slurm.conf"
  # gres.conf is the same under both profiles. No Cores=: every node is one socket, so every core
  # is as close to every GPU, which is what leaving Cores out says (gres.conf(5)).
  if [ "$GPUS" -gt 0 ]; then
    { echo "AutoDetect=off"
      echo "NodeName=node[1-$NODES] Name=gpu${GPU_TYPE:+ Type=$GPU_TYPE} File=$DIR/dev/nvidia[0-$((GPUS - 1))]"; } > "$DIR/gres.conf"
  else
    echo "AutoDetect=off" > "$DIR/gres.conf"
  fi
  echo "export SLURM_CONF=$DIR/slurm.conf" > "$DIR/env"
}

# slurmdbd's configuration: its private MariaDB on DB_PORT (not written with --no-accounting).
write_slurmdbd_conf() {
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
}

# A namespace NS with an eth0 at ADDR on the bridge, through the veth pair orchvSUFFIX (host
# side) / orchpSUFFIX.
make_netns() {
  local ns=$1 suffix=$2 addr=$3
  ip netns list | grep -qw "$ns" || ip netns add "$ns"
  if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
    ip link del "orchv$suffix" 2>/dev/null || true
    ip link add "orchv$suffix" type veth peer name "orchp$suffix"
    ip link set "orchp$suffix" netns "$ns"
    ip -n "$ns" link set "orchp$suffix" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip link set "orchv$suffix" master $BRIDGE
    ip link set "orchv$suffix" up
  fi
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route replace default via $CTL_ADDR
}

make_network() {
  ip link show $BRIDGE >/dev/null 2>&1 || { ip link add $BRIDGE type bridge; ip addr add $CTL_ADDR/24 dev $BRIDGE; }
  ip link set $BRIDGE up
  for i in $(seq 1 "$NODES"); do make_netns "orch-node$i" "$i" "$NET.$((10 + i))"; done
}

start_slurmd() {
  local i=$1 hosts=$DIR/hosts scratch=""
  # Under site, node-local scratch as sites have it (/tmp on a local disk, /local, $TMPDIR): a
  # tmpfs of its own on every node at NODE_LOCAL (the same path, different contents per node).
  if [ "$PROFILE" = site ]; then
    hosts=$DIR/hosts-node$i
    mkdir -p "$NODE_LOCAL"
    scratch="mount -t tmpfs -o size=256m,mode=1777 orch-node-local '$NODE_LOCAL' && "
  fi
  alive "$(pid_of "$DIR/slurmd-node$i.pid")" && return 0
  mkdir -p "$DIR/spool/node$i"
  # Not `ip netns exec`: it remounts /sys and hides the cgroup mounts that slurmd needs. The
  # mount namespace is private, so the node's own mounts never reach the host.
  setsid nsenter --net=/run/netns/orch-node$i unshare --mount --uts sh -c \
    "${scratch}mount --bind '$hosts' /etc/hosts && mount --bind '$DIR/resolv.conf' /etc/resolv.conf && hostname node$i && exec slurmd -f '$DIR/slurm.conf' -N node$i" \
    </dev/null >>"$DIR/log/slurmd-start.log" 2>&1
}

# Nodes idle, each counted once: under site every node is listed once per partition.
idle_nodes() { sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /idle/ && !seen[$1]++' | wc -l; }

# ---- OCI containers (--oci) ----

# oci.conf, which SLURM reads next to slurm.conf: each task is one 'runc run' of the bundle that
# slurmstepd derives from the step's (its config.json with the task's args and environment). The
# container id is unique per node, job, step and task. crun 1.8 refuses this machine's hybrid
# cgroup v1/v2 layout ("cgroups in hybrid mode not supported"); runc 1.1 runs.
write_oci_conf() {
  local runc="runc --root=$DIR/oci-state" id="%n.%u.%j.%s.%t"
  mkdir -p "$DIR/oci-state"
  cat > "$DIR/oci.conf" <<EOF
# SLURM's OCI support (deploy/cluster.sh up --oci): srun --container=BUNDLE runs each task in runc.
RunTimeQuery="$runc state $id"
RunTimeKill="$runc kill -a $id"
RunTimeDelete="$runc delete --force $id"
RunTimeRun="$runc run $id -b %b"
EOF
}

# A small bundle at DIR/oci-bundle, built from this machine (no registry needed): the Debian
# python3.11, its standard library and the libraries it and its extension modules link, a marker
# file and an os-release of its own (so a job can tell it runs inside). config.json is runc's
# default with the host's network, IPC and hostname (DDP ranks reach each other as on the node) and
# the node's /dev/shm bound in (NCCL's shared memory between a node's ranks).
build_oci_bundle() {
  local b=$DIR/oci-bundle py=/usr/bin/python3.11 lib
  [ -s "$b/config.json" ] && [ -x "$b/rootfs$py" ] && return 0
  [ -x "$py" ] || { log "--oci builds its bundle from $py: install python3.11"; exit 1; }
  log "building the OCI bundle $b"
  rm -rf "$b.new"; mkdir -p "$b.new/rootfs"/{usr/bin,usr/lib,etc,tmp,proc,sys,dev}
  cp -a "$py" "$b.new/rootfs/usr/bin/"; ln -s python3.11 "$b.new/rootfs/usr/bin/python3"
  cp -a /usr/lib/python3.11 "$b.new/rootfs/usr/lib/"
  for lib in $( { ldd "$py"; for so in /usr/lib/python3.11/lib-dynload/*.so; do ldd "$so"; done; } | grep -o '/[^ ]*' | sort -u); do
    mkdir -p "$b.new/rootfs$(dirname "$lib")"; cp -L "$lib" "$b.new/rootfs$lib"
  done
  echo "this file exists only inside the OCI bundle built by deploy/cluster.sh up --oci" > "$b.new/rootfs/orch-oci-marker"
  printf 'ID=orch-oci\nNAME="orchestrator OCI test rootfs (deploy/cluster.sh)"\n' > "$b.new/rootfs/etc/os-release"
  (cd "$b.new" && runc spec)
  "$py" - "$b.new/config.json" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    c = json.load(f)
c["process"]["terminal"] = False
c["process"]["args"] = ["/usr/bin/python3", "-c", "print('orch-oci bundle')"]
c["root"]["readonly"] = False
c.pop("hostname", None)
c["linux"]["namespaces"] = [n for n in c["linux"]["namespaces"] if n["type"] not in ("network", "ipc", "uts")]
c["mounts"] = [m for m in c["mounts"] if m["destination"] != "/dev/shm"]
c["mounts"].append({"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "rw"]})
with open(path, "w") as f:
    json.dump(c, f, indent=1)
PY
  rm -rf "$b"; mv "$b.new" "$b"
}

up_oci() {
  write_oci_conf
  build_oci_bundle
}

# ---- The login node (--login) ----

# The login user: created if missing, with its home on the shared filesystem outside the
# node-local prefixes, as a site's /home. What was created is recorded in DIR/login, so that
# `down` removes that and nothing else. Its password is '*' (no password matches it), not
# useradd's '!': sshd without PAM refuses an account locked with '!', even for a key.
ensure_login_user() {
  local d=$DIR/login home
  if ! id -u "$LOGIN_USER" >/dev/null 2>&1; then
    home=$LOGIN_HOME_BASE/$LOGIN_USER
    [ ! -e "$home" ] || {
      echo "$home exists but user $LOGIN_USER does not: remove $home or pick another --login-user" >&2; exit 2; }
    if [ ! -d "$LOGIN_HOME_BASE" ]; then
      mkdir -p "$LOGIN_HOME_BASE"
      echo "$LOGIN_HOME_BASE" > "$d/created-home-base"
    fi
    log "creating user $LOGIN_USER (home $home)"
    useradd --create-home --home-dir "$home" --shell /bin/bash --password '*' \
      --comment "login node user (deploy/cluster.sh)" "$LOGIN_USER"
    echo "$LOGIN_USER" > "$d/created-user"
    echo "$home" > "$d/created-home"
  fi
  home=$(getent passwd "$LOGIN_USER" | cut -d: -f6)
  case "$home" in
    /tmp|/tmp/*|/var/tmp|/var/tmp/*|/dev/shm|/dev/shm/*) log "warning: $LOGIN_USER's home $home is node-local for the orchestrator" ;;
  esac
  case "$(getent shadow "$LOGIN_USER" | cut -d: -f2)" in
    '!'*) log "warning: $LOGIN_USER's password is locked ('!'): the login node's sshd (no PAM) refuses it; 'usermod -p \* $LOGIN_USER' allows keys" ;;
  esac
  echo "$LOGIN_USER" > "$d/user"
  echo "$home" > "$d/home"
}

# DIR/login: the login node's host key and sshd_config, the host side's client key, known_hosts
# and ssh_config. Keys are made once, so known_hosts and authorized keys stay valid across `up`s.
LOGIN_CONFIG_CHANGED=0
write_login_files() {
  local d=$DIR/login
  [ -s "$d/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "login host key (deploy/cluster.sh)" -f "$d/ssh_host_ed25519_key"
  [ -s "$d/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C "orch-login client (deploy/cluster.sh)" -f "$d/client_key"
  install -m 644 "$d/client_key.pub" "$d/authorized_keys"
  echo "orch-login,login,$LOGIN_ADDR $(cut -d' ' -f1,2 "$d/ssh_host_ed25519_key.pub")" > "$d/known_hosts"
  write_login_pam
  local auth
  if [ "$LOGIN_TOTP" = 1 ]; then
    auth="# --login-totp: the key, then a TOTP code through PAM (pam_oath, DIR/login/pam-sshd, which is
# /etc/pam.d/sshd in the namespace), as clusters with 2FA ask for it. Commands sent through an open
# ControlMaster ask for neither; a new connection with BatchMode=yes is refused.
UsePAM yes
KbdInteractiveAuthentication yes
AuthenticationMethods publickey,keyboard-interactive:pam"
  else
    auth="KbdInteractiveAuthentication no
# No PAM stack: the host's /etc/pam.d/sshd is not used either.
UsePAM no"
  fi
  cat > "$d/sshd_config.new" <<EOF
# The login node's sshd (deploy/cluster.sh up --login): started as 'sshd -f' this file in the
# $LOGIN_NS namespace; the host's /etc/ssh is not read. What each setting mimics is said above it.
# Port 22 on the node's own address, as a login node (the namespace has only lo and eth0).
Port 22
AddressFamily inet
ListenAddress 0.0.0.0
HostKey $d/ssh_host_ed25519_key
PidFile $d/sshd.pid
# Keys, as most sites require from outside: no passwords, no root; keyboard-interactive only
# for --login-totp's code (below).
PubkeyAuthentication yes
AuthorizedKeysFile $d/authorized_keys
PasswordAuthentication no
PermitRootLogin no
AllowUsers $LOGIN_USER
$auth
# DIR may lie under /var/tmp, which is world-writable: StrictModes would refuse the keys file.
StrictModes no
# Every session, 'ssh login cmd' included (it reads no ~/.profile), finds the cluster, as on a
# site's login node where slurm.conf is at its default path.
SetEnv SLURM_CONF=$DIR/slurm.conf
# Multiplexed sessions per connection (ControlMaster): OpenSSH's default, as at most sites.
MaxSessions 10
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp internal-sftp
LogLevel VERBOSE
EOF
  if cmp -s "$d/sshd_config.new" "$d/sshd_config"; then
    rm -f "$d/sshd_config.new"
  else
    mv "$d/sshd_config.new" "$d/sshd_config"
    LOGIN_CONFIG_CHANGED=1
  fi
  cat > "$d/ssh_config" <<EOF
# The host's way to the login node (deploy/cluster.sh up --login), as a laptop's ~/.ssh/config:
#   ssh -F $d/ssh_config orch-login sinfo
#   ssh -F $d/ssh_config -M -S SOCK -fN orch-login       # a ControlMaster
#   ssh -F $d/ssh_config -S SOCK -o BatchMode=yes orch-login squeue
#   ssh -F $d/ssh_config -S SOCK -O exit orch-login      # closes it
Host orch-login
  HostName $LOGIN_ADDR
  Port 22
  User $LOGIN_USER
  IdentityFile $d/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $d/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  ConnectTimeout 10
EOF
  chmod 644 "$d/ssh_config" "$d/known_hosts" "$d/sshd_config"
}

# --login-totp's PAM stack and secret. DIR/login/pam-sshd is bound over /etc/pam.d/sshd in the
# login namespace only (the host's file is untouched), so it is rewritten in place, never
# replaced: a bind mount keeps the file it was made with. Without --login-totp sshd uses no PAM.
# pam_oath keeps the last code used in users.oath and refuses it again (replay).
write_login_pam() {
  local d=$DIR/login secret
  if [ "$LOGIN_TOTP" = 1 ]; then
    if [ ! -s "$d/totp_secret" ]; then
      (umask 077; head -c 20 /dev/urandom > "$d/totp.key"
       od -An -tx1 "$d/totp.key" | tr -d ' \n' > "$d/totp_secret"; base32 "$d/totp.key" > "$d/totp_secret.base32")
      rm -f "$d/totp.key"
    fi
    secret=$(cat "$d/totp_secret")
    # HOTP/T30/6: TOTP, 30 s steps, 6 digits (RFC 6238's defaults, what authenticator apps use).
    if [ "$(awk '{print $1, $2, $4}' "$d/users.oath" 2>/dev/null)" != "HOTP/T30/6 $LOGIN_USER $secret" ]; then
      (umask 077; echo "HOTP/T30/6 $LOGIN_USER - $secret" > "$d/users.oath")
    fi
  fi
  cat > "$d/pam-sshd" <<EOF
# The login node's /etc/pam.d/sshd (deploy/cluster.sh, bound in the $LOGIN_NS namespace only).
# Used with --login-totp: the TOTP code is the only PAM auth (the key came first, in sshd).
auth     required pam_oath.so usersfile=$d/users.oath window=2 digits=6
account  required pam_unix.so
session  required pam_permit.so
password required pam_deny.so
EOF
}

# sshd in its namespace, entered as start_slurmd enters a node's (its own hosts file, hostname
# 'login', and with its own /etc/pam.d/sshd); it daemonizes and writes DIR/login/sshd.pid. A
# running one re-reads a changed config.
start_login_sshd() {
  local d=$DIR/login hosts=$DIR/hosts pid
  if [ "$PROFILE" = site ]; then hosts=$DIR/hosts-login; fi
  # sshd's privilege separation directory is compiled in; Debian's init script creates it at boot.
  [ -d /run/sshd ] || install -d -m 755 /run/sshd
  # openssh-server installs /etc/pam.d/sshd: the mount point for the login node's own.
  [ -f /etc/pam.d/sshd ] || { log "/etc/pam.d/sshd is missing: reinstall openssh-server"; exit 1; }
  /usr/sbin/sshd -t -f "$d/sshd_config" || { log "sshd refuses $d/sshd_config"; exit 1; }
  pid=$(pid_of "$d/sshd.pid")
  if alive "$pid"; then
    # sshd re-executes itself on SIGHUP, with the same arguments and in the same namespaces.
    if [ "$LOGIN_CONFIG_CHANGED" = 1 ]; then log "login: sshd re-reads its config"; kill -HUP "$pid"; fi
    return 0
  fi
  rm -f "$d/sshd.pid"
  setsid nsenter --net="/run/netns/$LOGIN_NS" unshare --mount --uts sh -c \
    "mount --bind '$hosts' /etc/hosts && mount --bind '$DIR/resolv.conf' /etc/resolv.conf && mount --bind '$d/pam-sshd' /etc/pam.d/sshd && hostname login && exec /usr/sbin/sshd -f '$d/sshd_config' -E '$DIR/log/sshd-login.log'" \
    </dev/null >>"$DIR/log/sshd-login-start.log" 2>&1
  for _ in $(seq 50); do alive "$(pid_of "$d/sshd.pid")" && return 0; sleep 0.1; done
  log "the login node's sshd did not start; see $DIR/log/sshd-login.log and sshd-login-start.log"; exit 1
}

# From the host, as a user would: key login, known host key, SLURM_CONF set, sinfo and sacct
# answer. With --login-totp no code is spent here (pam_oath refuses a code twice): the key must
# be accepted and the code asked for, and the user's SLURM commands are run in the namespace.
check_login() {
  local out=""
  if [ "$LOGIN_TOTP" = 1 ]; then check_login_totp; return; fi
  for _ in $(seq 10); do
    # The escaped \$(...) and \$SLURM_CONF are expanded by the login node's shell, login_sacct here.
    out=$(timeout 30 ssh -F "$DIR/login/ssh_config" -o BatchMode=yes orch-login \
          "echo \"\$(hostname) \$(id -un) \$SLURM_CONF\"; sinfo -h -o %P >/dev/null && $(login_sacct)echo login-ok" 2>&1) || true
    [[ "$out" == *login-ok* ]] && break
    sleep 0.5
  done
  [[ "$out" == *login-ok* ]] || { log "ssh to the login node failed: $out (see $DIR/log/sshd-login.log)"; exit 1; }
  log "login: ${out%%$'\n'*}; ssh -F $DIR/login/ssh_config orch-login"
}

# The login check's sacct (with accounting only: without it sacct answers that it is disabled).
login_sacct() { if [ "$ACCOUNTING" = 1 ]; then echo "sacct -n -X >/dev/null && "; fi; }

check_login_totp() {
  local out=""
  for _ in $(seq 10); do
    out=$(timeout 30 ssh -v -F "$DIR/login/ssh_config" -o BatchMode=yes orch-login true 2>&1) || true
    [[ "$out" == *"partial success"*"Permission denied (keyboard-interactive)"* ]] && break
    sleep 0.5
  done
  [[ "$out" == *"partial success"*"Permission denied (keyboard-interactive)"* ]] || {
    log "the login node does not ask for a code after the key: $(echo "$out" | tail -3)"; exit 1; }
  nsenter --net="/run/netns/$LOGIN_NS" runuser -u "$LOGIN_USER" -- env SLURM_CONF="$DIR/slurm.conf" \
    sh -c "sinfo -h -o %P >/dev/null && $(login_sacct)true" || { log "sinfo or sacct fail for $LOGIN_USER on the login node"; exit 1; }
  log "login: $LOGIN_USER with key + TOTP code; ssh -F $DIR/login/ssh_config orch-login (code: oathtool --totp \$(cat $DIR/login/totp_secret))"
}

up_login() {
  mkdir -p "$DIR/login"
  ensure_login_user
  # Under site with accounting, the login user's jobs must charge an account it is associated with.
  if [ "$PROFILE" = site ] && [ "$ACCOUNTING" = 1 ]; then add_association "$LOGIN_USER"; fi
  make_netns "$LOGIN_NS" l "$LOGIN_ADDR"
  write_login_files
  start_login_sshd
  check_login
}

# The user and home `up` created (DIR/login/created-*), once nothing of the user runs any more.
remove_login_user() {
  local d=$DIR/login user home base
  user=$(cat "$d/created-user" 2>/dev/null || true)
  home=$(cat "$d/created-home" 2>/dev/null || true)
  base=$(cat "$d/created-home-base" 2>/dev/null || true)
  if [ -n "$user" ] && id -u "$user" >/dev/null 2>&1; then
    # The user's private node-local folders (orchestrator.core.node_local: orch-u<uid>, theirs
    # alone) go with the user: the nodes share this machine's /dev/shm and temp dir.
    local uid f; uid=$(id -u "$user")
    for f in "/dev/shm/orch-u$uid" "${TMPDIR:-/tmp}/orch-u$uid"; do
      if [ -d "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %u "$f")" = "$uid" ]; then rm -rf -- "$f"; fi
    done
    # userdel refuses while a process of the user lives; the ones just killed may take a moment.
    for _ in $(seq 50); do userdel "$user" 2>/dev/null && break; sleep 0.1; done
    if id -u "$user" >/dev/null 2>&1; then
      log "user $user is still in use, left in place with its home: run 'userdel -r $user' when it is not"; return 0
    fi
  fi
  case "$home" in
    "") ;;
    "$LOGIN_HOME_BASE"/?*) rm -rf -- "$home" ;;
    *) log "not removing $home: not under $LOGIN_HOME_BASE" ;;
  esac
  [ -z "$base" ] || rmdir "$base" 2>/dev/null || true
}

up() {
  [ "$(id -u)" = 0 ] || { echo "deploy/cluster.sh needs root" >&2; exit 1; }
  if [ -f "$DIR/slurm.conf" ] && [ -d "$DIR/state" ] && ! alive "$(pid_of "$DIR/slurmctld.pid")"; then
    # What a cluster that no longer runs left (a machine restarted, a run killed before 'down'):
    # slurmctld would recover its jobs from DIR/state and start with its nodes still allocated to
    # them (sinfo: mix, never idle). Start from nothing instead.
    log "$DIR holds a cluster that is not running: clearing it first"
    down
  fi
  local was; was=$(cat "$DIR/profile" 2>/dev/null || echo kind)
  if [ "$was" != "$PROFILE" ] && alive "$(pid_of "$DIR/slurmctld.pid")"; then
    echo "the cluster at $DIR is up with --profile $was; run 'deploy/cluster.sh down --dir $DIR' first" >&2; exit 2
  fi
  was=$(cat "$DIR/accounting" 2>/dev/null || echo slurmdbd)
  if [ "$was" != "$(accounting_word)" ] && alive "$(pid_of "$DIR/slurmctld.pid")"; then
    echo "the cluster at $DIR is up with accounting '$was' (DIR/accounting); AccountingStorageType changes only" \
         "when slurmctld starts: run 'deploy/cluster.sh down --dir $DIR' first" >&2; exit 2
  fi
  was=$(cat "$DIR/login/user" 2>/dev/null || true)
  if [ "$LOGIN" = 1 ] && [ -n "$was" ] && [ "$was" != "$LOGIN_USER" ]; then
    echo "the login node at $DIR is for user $was; run 'deploy/cluster.sh down --dir $DIR' first" >&2; exit 2
  fi
  install_packages
  mkdir -p "$DIR/log"
  write_configs
  start_munge
  export SLURM_CONF=$DIR/slurm.conf
  make_network  # before slurmdbd is asked anything: AccountingStorageHost is on the bridge
  if [ "$ACCOUNTING" = 1 ]; then start_accounting; fi
  alive "$(pid_of "$DIR/slurmctld.pid")" || slurmctld -f "$DIR/slurm.conf"
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
  for i in $(seq 1 "$NODES"); do start_slurmd "$i"; done
  for _ in $(seq 150); do
    [ "$(idle_nodes)" -ge "$NODES" ] && break
    for n in $(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /down|drain/ && !seen[$1]++ {print $1}'); do
      scontrol update nodename="$n" state=resume 2>/dev/null || true
    done
    sleep 0.2
  done
  sinfo -h -N -o '%N %T' | grep -q idle || { log "nodes did not come up; see $DIR/log"; sinfo -N; squeue; exit 1; }
  # Warm-up: the first batch job after slurmctld starts waits ~3 s; pay it here, not in a test.
  # Watched with squeue every 0.1 s (at most 15 s): sbatch --wait looks at 2 s, 3 s... (10 s here).
  local warm
  warm=$(sbatch --parsable -Q -o /dev/null --wrap true 2>/dev/null || true)
  for _ in $(seq 150); do
    [ -n "$warm" ] && [ -n "$(squeue -h -j "${warm%%;*}" -o %T 2>/dev/null)" ] || break
    sleep 0.1
  done
  if [ "$OCI" = 1 ]; then up_oci; fi
  if [ "$LOGIN" = 1 ]; then up_login; fi
  log "up: $NODES node(s), ${GPUS} GPU(s) ${GPU_TYPE:-untyped} per node, profile $PROFILE, accounting $(accounting_word), SLURM_CONF=$DIR/slurm.conf"
}

# What DIR/accounting says: slurmdbd (accounting on) or none (--no-accounting).
accounting_word() { if [ "$ACCOUNTING" = 1 ]; then echo slurmdbd; else echo none; fi; }

# MariaDB, slurmdbd and the cluster in its database; under site, the account every job charges and
# root's association with it (the login user's is made with the user, in up_login). Before
# slurmctld starts, so that it loads the associations it enforces from the start.
start_accounting() {
  start_mariadb
  if ! alive "$(pid_of "$DIR/slurmdbd.pid")"; then
    slurmdbd
    for _ in $(seq 100); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.2; done
  fi
  sacctmgr -n list cluster format=cluster | grep -qw $CLUSTER || sacctmgr -i add cluster $CLUSTER >/dev/null
  if [ "$PROFILE" = site ]; then
    sacctmgr -n -P list account "$SITE_ACCOUNT" format=account | grep -qx "$SITE_ACCOUNT" ||
      sacctmgr -i add account "$SITE_ACCOUNT" description="the site profile's required account" \
        organization=orch >/dev/null
    add_association root
  fi
}

# USER may charge SITE_ACCOUNT, and does when a job names no account (its default account); its
# jobs without --wckey are booked to its default wckey, SITE_WCKEY. Idempotent. slurmctld learns of
# both from slurmdbd at once (or when it starts).
# Why a default wckey: without one, TrackWCKey books such jobs to '*', which slurmdbd then creates
# for the user as it records the job; a job cancelled seconds after submission (a dependency that
# can never be met) was then recorded with the cancel as its start (sacct Start) in 11 of 14 runs.
add_association() {
  local user=$1
  sacctmgr -n -P list assoc user="$user" account="$SITE_ACCOUNT" format=user | grep -qx "$user" ||
    sacctmgr -i add user "$user" account="$SITE_ACCOUNT" defaultaccount="$SITE_ACCOUNT" >/dev/null
  sacctmgr -n -P list user "$user" format=defaultaccount | grep -qx "$SITE_ACCOUNT" ||
    sacctmgr -i modify user where name="$user" set defaultaccount="$SITE_ACCOUNT" >/dev/null
  sacctmgr -n -P list user "$user" format=defaultwckey | grep -qx "$SITE_WCKEY" ||
    sacctmgr -i add user "$user" wckeys="$SITE_WCKEY" defaultwckey="$SITE_WCKEY" >/dev/null
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
  # The login node first: no new sessions or submissions while the rest goes down.
  kill_pidfile "$DIR/login/sshd.pid"
  for f in "$DIR"/slurmd-node*.pid; do [ -e "$f" ] && kill_pidfile "$f"; done
  kill_pidfile "$DIR/slurmctld.pid"
  kill_pidfile "$DIR/slurmdbd.pid"
  kill_pidfile "$DIR/mysql.pid"
  kill_pidfile "$DIR/munged.pid"
  # Job steps left behind by a killed slurmd live in the node namespaces, and SSH sessions in
  # the login node's: stop them too.
  for ns in $(ip netns list 2>/dev/null | awk '/^orch-(node|login)/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  remove_login_user
  for _ in $(seq 50); do ip -o link show 2>/dev/null | grep -q "orchv" || break; sleep 0.1; done
  ip link del $BRIDGE 2>/dev/null || true
  rm -rf "$DIR"
  log "down"
}

status() {
  export SLURM_CONF=$DIR/slurm.conf
  echo "slurmctld: $(alive "$(pid_of "$DIR/slurmctld.pid")" && echo running || echo stopped)"
  if [ "$(cat "$DIR/accounting" 2>/dev/null)" = none ]; then
    echo "accounting: off (--no-accounting: AccountingStorageType=accounting_storage/none, no slurmdbd or MariaDB;" \
         "sacct answers 'Slurm accounting storage is disabled', squeue knows a job until MinJobAge after its end)"
  else
    for f in slurmdbd mysql; do echo "$f: $(alive "$(pid_of "$DIR/$f.pid")" && echo running || echo stopped)"; done
    echo "accounting: on (slurmdbd)"
  fi
  if [ -d "$DIR/login" ]; then
    if alive "$(pid_of "$DIR/login/sshd.pid")"; then
      local auth=key
      if grep -q '^AuthenticationMethods publickey,keyboard-interactive' "$DIR/login/sshd_config"; then auth="key + TOTP"; fi
      echo "login: running ($LOGIN_NS, $LOGIN_ADDR, user $(cat "$DIR/login/user" 2>/dev/null), $auth): ssh -F $DIR/login/ssh_config orch-login"
    else
      echo "login: stopped"
    fi
  fi
  sinfo -N 2>/dev/null || true
}

case "$CMD" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: deploy/cluster.sh up|down|status [--nodes N] [--cpus C] [--gpus G] [--gpu-type T] [--profile kind|site] [--dir DIR] [--login [--login-user NAME] [--login-totp]] [--oci] [--no-accounting]" >&2; exit 2 ;;
esac
