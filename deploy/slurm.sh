#!/usr/bin/env bash
# A real Slurm on this one machine, for the portal to submit to: 4 simulated nodes
# (node[1-4]) with 4 simulated GPUs each in partition "gpu", 2 more (node[5-6]) in partition
# "elastic" under Slurm's power saving (they start powered down; deploy/slurm-power.sh powers
# them up and down), accounting through slurmdbd and MariaDB (so sacct works) and slurmrestd on
# 127.0.0.1:6820 with JWT authentication.
#
#   deploy/slurm.sh start     install what is missing, write the configs, start everything, wait
#   deploy/slurm.sh status    exit 0 only if every part answers
#   deploy/slurm.sh stop      cancel all jobs, stop the daemons (reverse order), leave none behind
#   deploy/slurm.sh restart   stop, then start
#
# Needs root and Debian/Ubuntu (apt). No systemd is needed: the daemons are started directly.
# Idempotent: "start" on a running, unchanged cluster only checks it. State lives in
# /var/lib/slurm, logs in /var/log/slurm, pid files in /run/slurm (munged's in /run/munge).
# See docs/slurm.md.
set -euo pipefail

CLUSTER=gpuportal
PARTITION=gpu
NODES=(node1 node2 node3 node4)
NODE_RANGE="node[1-4]"
NODE_PORTS="[17001-17004]"
GPUS_PER_NODE=4
GPU_TYPE=h100
CPUS_PER_NODE=8
MEM_PER_NODE_MB=4000
# Elastic nodes: same shape, powered up and down through Slurm's power saving (docs/slurm.md).
ELASTIC_PARTITION=elastic
ELASTIC_NODES=(node5 node6)
ELASTIC_RANGE="node[5-6]"
ELASTIC_PORTS="[17005-17006]"
# Slurm powers an elastic node down by itself only after it has been idle this long (a year):
# the portal decides. SuspendTime=INFINITE everywhere would switch power saving off altogether.
ELASTIC_SUSPEND_TIME=31536000
RESUME_TIMEOUT_S=30  # a simulated node boots (its slurmd registers) in about 3 s
SUSPEND_TIMEOUT_S=5  # ... and stops within 3 s (slurm-power.sh)
POWER_SOURCE="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/slurm-power.sh"
RESUME_PROGRAM=/usr/local/sbin/slurm-resume
SUSPEND_PROGRAM=/usr/local/sbin/slurm-suspend

CONF_DIR=/etc/slurm
STATE_DIR=/var/lib/slurm
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
FAKEGPU_DIR=$STATE_DIR/fakegpu
JWT_KEY=$STATE_DIR/jwt_hs256.key
FIRST_JOB_ID_FILE=$STATE_DIR/first-job-id # where slurmctld numbers jobs from (see continue_job_ids)
DB_PASS_FILE=$STATE_DIR/slurmdbd.dbpass
DB_NAME=slurm_acct_db
DB_USER=slurm
REST_HOST=127.0.0.1
REST_PORT=6820
REST_USER=slurm
REST_API=v0.0.38
MUNGE_PID=/run/munge/munged.pid
MARIADB_PID=/run/mysqld/mysqld.pid
MARIADB_MARKER=$RUN_DIR/mariadb.started-here # MariaDB was started by this script
ELASTIC_UP=$RUN_DIR/elastic-up                # elastic nodes to power up again after a restart

SLURM_PACKAGES=(munge slurm-wlm slurm-client slurmctld slurmd slurmdbd slurmrestd slurm-wlm-jwt-plugin)
CONFIG_CHANGED=""
CTLD_STARTED="" # slurmctld was started by this run

say() { echo "slurm.sh: $*"; }
die() {
  echo "slurm.sh: $*" >&2
  exit 1
}

usage() {
  echo "usage: $0 start|status|stop|restart" >&2
  exit 2
}

short_host() {
  local name
  name="$(uname -n)"
  echo "${name%%.*}"
}

# ---------------------------------------------------------------- processes

# pid_alive PIDFILE COMM: the pid file names a live process whose command is COMM.
pid_alive() {
  local pid
  [ -s "$1" ] || return 1
  pid="$(head -n 1 "$1" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && running "$pid"
}

# wait_for SECONDS COMMAND...: poll every 0.2 s until COMMAND succeeds or SECONDS have passed.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  while :; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# running PID: the process exists and is not a zombie (an exited daemon stays a zombie until
# its parent, often init, collects it).
running() {
  local state
  state="$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# wait_up SECONDS PIDFILE COMM CHECK...: wait_for CHECK, but give up as soon as the daemon,
# once seen running, has exited.
wait_up() {
  local deadline=$((SECONDS + $1)) pidfile=$2 comm=$3 seen=""
  shift 3
  while :; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if pid_alive "$pidfile" "$comm"; then seen=1; elif [ -n "$seen" ]; then return 1; fi
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# term_pid PID LABEL: SIGTERM, wait up to 20 s, then SIGKILL.
term_pid() {
  local pid=$1 label=$2
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 200; i++)); do
    running "$pid" || return 0
    sleep 0.1
  done
  say "$label (pid $pid) ignored SIGTERM for 20 s; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    running "$pid" || return 0
    sleep 0.1
  done
}

# stop_pidfile PIDFILE COMM LABEL
stop_pidfile() {
  if pid_alive "$1" "$2"; then
    say "stopping $3"
    term_pid "$(head -n 1 "$1")" "$3"
  fi
  rm -f "$1"
}

# Run a daemon detached from this script: no terminal, no inherited lock, output to
# $LOG_DIR/startup.log. The daemons fork themselves; a non-zero status is an early failure.
launch() {
  setsid "$@" </dev/null >>"$LOG_DIR/startup.log" 2>&1 9>&-
}

show_log() {
  [ -f "$1" ] || return 0
  echo "---- last lines of $1" >&2
  tail -n 15 "$1" >&2
}

# failed LABEL LOG...: show the logs and stop.
failed() {
  local label=$1 log
  shift
  for log in "$@"; do show_log "$log"; done
  die "$label did not start"
}

# ---------------------------------------------------------------- installation

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

mariadb_answers() { tcp_open 127.0.0.1 3306; }

installed() { [ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null)" = "ii " ]; }

install_packages() {
  local missing=() pkg
  for pkg in "${SLURM_PACKAGES[@]}"; do installed "$pkg" || missing+=("$pkg"); done
  command -v pgrep >/dev/null 2>&1 || missing+=(procps) # minimal images lack it
  # MariaDB: use the one on 127.0.0.1:3306 if it answers, else install the server here.
  if ! mariadb_answers; then
    installed mariadb-server || missing+=(mariadb-server)
  elif ! command -v mysql >/dev/null 2>&1; then
    missing+=(mariadb-client)
  fi
  [ "${#missing[@]}" -eq 0 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install ${missing[*]} by hand"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || say "warning: apt-get update failed; trying the install anyway"
  apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
    "${missing[@]}" >/dev/null
}

# ---------------------------------------------------------------- files

# write_file PATH MODE OWNER CONTENT: rewrite only when the content differs.
write_file() {
  local path=$1 mode=$2 owner=$3 content=$4 tmp
  if [ -f "$path" ] && [ "$(cat "$path")" = "$content" ]; then
    chmod "$mode" "$path"
    chown "$owner" "$path"
    return 0
  fi
  tmp="$(mktemp "$path.XXXXXX")"
  printf '%s\n' "$content" >"$tmp"
  chmod "$mode" "$tmp"
  chown "$owner" "$tmp"
  mv -f "$tmp" "$path"
  CONFIG_CHANGED=1
}

# deploy/slurm-power.sh as Slurm's ResumeProgram and SuspendProgram (slurmctld turns power saving
# off, saying so in its log, unless both are there, root's and not writable by others). Not a
# configuration change: slurmctld runs the file as it is at each power up or down.
install_power_programs() {
  local dest
  [ -r "$POWER_SOURCE" ] || die "$POWER_SOURCE is missing (it is installed as $RESUME_PROGRAM and $SUSPEND_PROGRAM)"
  for dest in "$RESUME_PROGRAM" "$SUSPEND_PROGRAM"; do
    cmp -s "$POWER_SOURCE" "$dest" || install -D -m 0755 -o root -g root "$POWER_SOURCE" "$dest"
    chown root:root "$dest"
    chmod 0755 "$dest"
  done
}

random_hex() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }

prepare_files() {
  local node i
  id -u slurm >/dev/null 2>&1 ||
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin slurm
  mkdir -p "$CONF_DIR" "$STATE_DIR" "$LOG_DIR" "$RUN_DIR" "$STATE_DIR/slurmctld" "$FAKEGPU_DIR"
  chmod 0755 "$STATE_DIR" "$LOG_DIR" "$RUN_DIR" "$FAKEGPU_DIR"
  chmod 0700 "$STATE_DIR/slurmctld"
  for node in "${NODES[@]}" "${ELASTIC_NODES[@]}"; do mkdir -p "$STATE_DIR/slurmd/$node"; done

  # munge: the package makes the key; make one if it is missing.
  if [ ! -s /etc/munge/munge.key ]; then
    say "creating /etc/munge/munge.key"
    mkdir -p /etc/munge
    if command -v mungekey >/dev/null 2>&1; then
      mungekey --create --keyfile=/etc/munge/munge.key
    else
      head -c 1024 /dev/urandom >/etc/munge/munge.key
    fi
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 0755 /run/munge

  # The key slurmctld and slurmdbd sign and check JSON Web Tokens with.
  if [ ! -s "$JWT_KEY" ]; then
    (umask 077 && head -c 32 /dev/urandom >"$JWT_KEY")
  fi
  chown root:root "$JWT_KEY"
  chmod 0600 "$JWT_KEY"

  # The MariaDB password of the slurm database user.
  if [ ! -s "$DB_PASS_FILE" ]; then
    (umask 077 && random_hex 24 >"$DB_PASS_FILE")
  fi
  chmod 0600 "$DB_PASS_FILE"

  # Simulated GPUs: character devices equal to /dev/null (1,3), 4 per node. Slurm only needs a
  # device file per GPU to hand out; nothing runs on them. Where mknod is not allowed, a link
  # to /dev/null does the same.
  for node in "${NODES[@]}" "${ELASTIC_NODES[@]}"; do
    mkdir -p "$FAKEGPU_DIR/$node"
    for ((i = 0; i < GPUS_PER_NODE; i++)); do
      if [ ! -c "$FAKEGPU_DIR/$node/gpu$i" ]; then
        rm -f "$FAKEGPU_DIR/$node/gpu$i"
        mknod -m 666 "$FAKEGPU_DIR/$node/gpu$i" c 1 3 2>/dev/null ||
          ln -s /dev/null "$FAKEGPU_DIR/$node/gpu$i"
      fi
    done
  done
}

write_configs() {
  local host gres_lines node comm_params dbd_comm_params first_job_id=""
  host="$(short_host)"
  [ -s "$FIRST_JOB_ID_FILE" ] && first_job_id="FirstJobId=$(cat "$FIRST_JOB_ID_FILE")"
  # By default the daemons listen on every address (munge still authenticates every message).
  # Where the host name resolves to 127.0.0.1 they can be kept on loopback: they bind to the
  # address their host name resolves to, which would fail, or be another address, elsewhere.
  if [ "$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 {print $1}')" = 127.0.0.1 ]; then
    comm_params="CommunicationParameters=NoCtldInAddrAny,NoInAddrAny"
    dbd_comm_params="CommunicationParameters=NoInAddrAny"
  else
    comm_params="# $host does not resolve to 127.0.0.1: the daemons listen on all addresses"
    dbd_comm_params="$comm_params"
  fi
  write_file "$CONF_DIR/slurm.conf" 0644 root:root "# Written by deploy/slurm.sh; edits are overwritten on the next start.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
SlurmctldPort=6817
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
GresTypes=gpu
EnforcePartLimits=ALL
SchedulerParameters=batch_sched_delay=0,bf_interval=5
MailProg=/bin/true
ReturnToService=2
KillWait=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu,gres/gpumem,gres/gpuutil
JobCompType=jobcomp/none
$first_job_id
$comm_params
SuspendProgram=$SUSPEND_PROGRAM
ResumeProgram=$RESUME_PROGRAM
SuspendTime=INFINITE
SuspendTimeout=$SUSPEND_TIMEOUT_S
ResumeTimeout=$RESUME_TIMEOUT_S
SuspendExcParts=$PARTITION
SlurmctldParameters=power_save_interval=1,power_save_min_interval=0
DebugFlags=Power
NodeName=$NODE_RANGE NodeHostname=$host NodeAddr=127.0.0.1 Port=$NODE_PORTS CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB Gres=gpu:$GPU_TYPE:$GPUS_PER_NODE State=UNKNOWN
NodeName=$ELASTIC_RANGE NodeHostname=$host NodeAddr=127.0.0.1 Port=$ELASTIC_PORTS CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE_MB Gres=gpu:$GPU_TYPE:$GPUS_PER_NODE State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE_RANGE Default=YES MaxTime=INFINITE State=UP
PartitionName=$ELASTIC_PARTITION Nodes=$ELASTIC_RANGE MaxTime=INFINITE State=UP SuspendTime=$ELASTIC_SUSPEND_TIME"

  gres_lines="# Written by deploy/slurm.sh. Simulated GPUs: each File is a stand-in device, not a GPU.
AutoDetect=off"
  for node in "${NODES[@]}" "${ELASTIC_NODES[@]}"; do
    gres_lines+="
NodeName=$node Name=gpu Type=$GPU_TYPE File=$FAKEGPU_DIR/$node/gpu[0-$((GPUS_PER_NODE - 1))]"
  done
  write_file "$CONF_DIR/gres.conf" 0644 root:root "$gres_lines"

  # The nodes deploy/slurm-power.sh may power up and down.
  write_file "$CONF_DIR/slurm-power.conf" 0644 root:root "# Written by deploy/slurm.sh.
ELASTIC_NODES=\"${ELASTIC_NODES[*]}\""

  # slurmd starts a cgroup plugin even with proctrack/linuxproc and task/none. On cgroup v2
  # without systemd (containers, CI), let it manage its cgroup itself instead of failing.
  write_file "$CONF_DIR/cgroup.conf" 0644 root:root "# Written by deploy/slurm.sh.
CgroupPlugin=autodetect
IgnoreSystemdOnFailure=yes"

  write_file "$CONF_DIR/slurmdbd.conf" 0600 root:root "# Written by deploy/slurm.sh; edits are overwritten on the next start.
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=6819
$dbd_comm_params
SlurmUser=root
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=$DB_USER
StoragePass=$(cat "$DB_PASS_FILE")
StorageLoc=$DB_NAME"
}

# ---------------------------------------------------------------- MariaDB

MYSQL=()
pick_mysql_client() {
  # root without a password over TCP (a shared server), else root over the socket (Debian's
  # default: unix_socket authentication for the system's root).
  if mysql --protocol=tcp -h 127.0.0.1 -P 3306 -uroot -e 'SELECT 1' >/dev/null 2>&1; then
    MYSQL=(mysql --protocol=tcp -h 127.0.0.1 -P 3306 -uroot)
  elif mysql -uroot -e 'SELECT 1' >/dev/null 2>&1; then
    MYSQL=(mysql -uroot)
  else
    die "MariaDB answers on 127.0.0.1:3306 but root cannot log in (tried TCP without a password and the socket)"
  fi
}

ensure_mariadb() {
  local pid
  if ! mariadb_answers; then
    command -v mariadbd >/dev/null 2>&1 || die "nothing answers on 127.0.0.1:3306 and mariadbd is not installed"
    if [ ! -d /var/lib/mysql/mysql ]; then
      say "initialising MariaDB in /var/lib/mysql"
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$LOG_DIR/mariadb.log" 2>&1
    fi
    mkdir -p /run/mysqld
    chown mysql:mysql /run/mysqld
    say "starting MariaDB on 127.0.0.1:3306"
    # mariadbd stays in the foreground: run it in the background, in its own session. The
    # marker file records that this script started it, so that "stop" stops it too.
    setsid mariadbd --user=mysql --bind-address=127.0.0.1 --port=3306 \
      --pid-file="$MARIADB_PID" --innodb-lock-wait-timeout=900 \
      </dev/null >>"$LOG_DIR/mariadb.log" 2>&1 9>&- &
    pid=$!
    echo "$pid" >"$MARIADB_MARKER"
    for ((i = 0; i < 600; i++)); do
      mariadb_answers && pid_alive "$MARIADB_PID" mariadbd && break
      running "$pid" || break
      sleep 0.1
    done
    if ! { mariadb_answers && pid_alive "$MARIADB_PID" mariadbd; }; then
      rm -f "$MARIADB_MARKER"
      failed MariaDB "$LOG_DIR/mariadb.log"
    fi
  fi
  pick_mysql_client
  local pass
  pass="$(cat "$DB_PASS_FILE")"
  "${MYSQL[@]}" <<SQL
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$pass';
CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$pass';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$pass';
ALTER USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$pass';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1';
SQL
}

# ---------------------------------------------------------------- checks

munge_ok() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
slurmdbd_ok() { pid_alive "$RUN_DIR/slurmdbd.pid" slurmdbd && tcp_open 127.0.0.1 6819; }
slurmctld_ok() { pid_alive "$RUN_DIR/slurmctld.pid" slurmctld && [[ "$(timeout 10 scontrol ping 2>/dev/null)" == *"is UP"* ]]; }
slurmd_ok() { pid_alive "$RUN_DIR/slurmd-$1.pid" slurmd; }
# node_state NODE: Slurm's State= of NODE (IDLE+POWERED_DOWN, MIXED, ...); '' when it does not answer.
node_state() { timeout 10 scontrol show node -o "$1" 2>/dev/null | sed -n 's/.* State=\([^ ]*\) .*/\1/p'; }
# An elastic node is in order: powered up (its slurmd runs), or powered down or on its way
# up or down in Slurm's eyes.
elastic_ok() { slurmd_ok "$1" || [[ "$(node_state "$1")" =~ POWER(ED_DOWN|ING_DOWN|ING_UP) ]]; }
sacctmgr_ok() { slurmdbd_ok && [[ "$(timeout 15 sacctmgr -n -P list cluster format=cluster 2>/dev/null)" == *"$CLUSTER"* ]]; }
slurmrestd_ok() { pid_alive "$RUN_DIR/slurmrestd.pid" slurmrestd && [ "$(rest_status diag)" = 200 ]; }

# nodes_up [drained]: every node of the partition is up: its slurmd answers and it takes work,
# whatever the controller plans there (plnd, and "-" after a state: the backfill planned a pending
# job on it); with "drained", also one an admin drained (the maintenance tests drain node3 for a
# moment: the cluster still answers). Not down, failed, not responding ("*"), powered off or
# powering ("~#%!").
nodes_up() {
  local states taking='idle|mix|alloc|comp|plnd|resv'
  [ "${1:-}" = drained ] && taking="$taking|drain|drng|maint"
  pid_alive "$RUN_DIR/slurmctld.pid" slurmctld || return 1
  states="$(timeout 10 sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null)" || return 1
  [ "$(grep -cE " ($taking)[-\$@]?\$" <<<"$states")" -eq "${#NODES[@]}" ]
}

# rest_status PATH: HTTP status of GET /slurm/$REST_API/PATH with a fresh root token.
rest_status() {
  local token status=""
  token="$(timeout 10 scontrol token username=root lifespan=60 2>/dev/null)" || return 1
  token="${token#SLURM_JWT=}"
  status="$(
    exec 3<>"/dev/tcp/$REST_HOST/$REST_PORT" || exit 1
    printf 'GET /slurm/%s/%s HTTP/1.1\r\nHost: %s:%s\r\nX-SLURM-USER-NAME: root\r\nX-SLURM-USER-TOKEN: %s\r\nConnection: close\r\n\r\n' \
      "$REST_API" "$1" "$REST_HOST" "$REST_PORT" "$token" >&3
    read -r -t 10 _ code _ <&3 && echo "$code"
  )" 2>/dev/null || true
  echo "$status"
}

all_ok() {
  local node
  munge_ok && slurmdbd_ok && slurmctld_ok || return 1
  for node in "${NODES[@]}"; do slurmd_ok "$node" || return 1; done
  for node in "${ELASTIC_NODES[@]}"; do elastic_ok "$node" || return 1; done
  nodes_up && sacctmgr_ok && slurmrestd_ok
}

# ---------------------------------------------------------------- start

start_munge() {
  munge_ok && pid_alive "$MUNGE_PID" munged && return 0
  say "starting munged"
  if ! { launch setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged && wait_for 10 munge_ok; }; then
    failed munged "$LOG_DIR/startup.log" /var/log/munge/munged.log
  fi
}

start_slurmdbd() {
  slurmdbd_ok && return 0
  say "starting slurmdbd"
  # The first start creates the accounting tables: allow it time.
  if ! { launch /usr/sbin/slurmdbd && wait_up 90 "$RUN_DIR/slurmdbd.pid" slurmdbd timeout 10 sacctmgr -n list cluster; }; then
    failed slurmdbd "$LOG_DIR/startup.log" "$LOG_DIR/slurmdbd.log"
  fi
  if ! sacctmgr_ok; then
    say "registering cluster $CLUSTER in the accounting database"
    timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null
  fi
}

# slurmctld started without its saved state numbers jobs from FirstJobId again, while the
# accounting database keeps the jobs of the cluster it had before: `sacct -j ID` would answer for
# an older job with the same id. Such a start numbers on from the highest id accounting holds.
continue_job_ids() {
  local highest
  [ -e "$STATE_DIR/slurmctld/job_state" ] && return 0
  pid_alive "$RUN_DIR/slurmctld.pid" slurmctld && return 0
  highest="$("${MYSQL[@]}" -N -B -e "SELECT COALESCE(MAX(id_job), 0) FROM $DB_NAME.${CLUSTER}_job_table" 2>/dev/null)" ||
    return 0 # no table yet: the first cluster of this name
  [[ "$highest" =~ ^[0-9]+$ ]] && [ "$highest" -gt 0 ] || return 0
  [ -s "$FIRST_JOB_ID_FILE" ] && [ "$(cat "$FIRST_JOB_ID_FILE")" -gt "$highest" ] && return 0
  say "slurmctld has no saved state: numbering jobs from $((highest + 1)), after those accounting holds"
  echo $((highest + 1)) >"$FIRST_JOB_ID_FILE"
  write_configs
}

start_slurmctld() {
  slurmctld_ok && return 0
  say "starting slurmctld"
  CTLD_STARTED=1
  if ! { launch /usr/sbin/slurmctld && wait_up 60 "$RUN_DIR/slurmctld.pid" slurmctld slurmctld_ok; }; then
    failed slurmctld "$LOG_DIR/startup.log" "$LOG_DIR/slurmctld.log"
  fi
}

start_slurmds() {
  local node
  for node in "${NODES[@]}"; do
    slurmd_ok "$node" && continue
    say "starting slurmd for $node"
    launch /usr/sbin/slurmd -N "$node" ||
      failed "slurmd for $node" "$LOG_DIR/startup.log" "$LOG_DIR/slurmd-$node.log"
  done
  for node in "${NODES[@]}"; do
    wait_for 30 slurmd_ok "$node" ||
      failed "slurmd for $node" "$LOG_DIR/startup.log" "$LOG_DIR/slurmd-$node.log"
  done
}

# Bring the elastic nodes to a power state Slurm knows: one that was up before a restart
# (listed in $ELASTIC_UP) or that Slurm is powering up gets its slurmd back; any other without a
# slurmd is powered down through Slurm, which runs the SuspendProgram and has it POWERED_DOWN
# after SuspendTimeout. So they start powered down: new nodes, and those a stop ended. Slurm
# powers down only a node it has seen (IDLE or DOWN): a new one (UNKNOWN) is booted once for
# that, and powered down as soon as it registers.
#
# Slurm learns a node's GPU devices only from its slurmd's registration, and a restarted
# slurmctld has forgotten them: a job it then powered a node up for would get its GPUs counted
# but no devices (no CUDA_VISIBLE_DEVICES). So after slurmctld starts, a node it has powered
# down (and not DOWN) is powered up once through Slurm and down again.
start_elastic() {
  local node state boot=() cycle=()
  for node in "${ELASTIC_NODES[@]}"; do
    slurmd_ok "$node" && continue
    state="$(node_state "$node")"
    if grep -qx "$node" "$ELASTIC_UP" 2>/dev/null || [[ "$state" == *POWERING_UP* ]]; then
      say "starting slurmd for $node (powered up)"
      boot+=("$node")
    elif [[ "$state" == *POWERED_DOWN* && "$state" != DOWN* && -n "$CTLD_STARTED" ]]; then
      cycle+=("$node")
    elif [[ ! "$state" =~ POWER(ED|ING)_DOWN ]]; then
      say "powering down $node (partition $ELASTIC_PARTITION; was ${state:-unknown})"
      scontrol_nodes "$node" POWER_DOWN
      [[ "$state" != UNKNOWN* ]] || boot+=("$node")
    fi
  done
  rm -f "$ELASTIC_UP"
  if [ "${#boot[@]}" -gt 0 ]; then
    "$RESUME_PROGRAM" "$(join_nodes "${boot[@]}")" 9>&- ||
      say "warning: slurmd did not start for all of ${boot[*]} (see $LOG_DIR/power.log)"
  fi
  [ "${#cycle[@]}" -gt 0 ] || return 0
  say "powering ${cycle[*]} up and down again (for slurmctld to learn their GPUs)"
  scontrol_nodes "$(join_nodes "${cycle[@]}")" POWER_UP
  boot=()
  for node in "${cycle[@]}"; do
    # One that does not come up is DOWN in Slurm (reason ResumeTimeout reached), not in the way.
    if wait_for "$((RESUME_TIMEOUT_S + 5))" powered_up "$node"; then boot+=("$node"); else
      say "warning: $node did not power up (see $LOG_DIR/power.log and sinfo -R)"
    fi
  done
  [ "${#boot[@]}" -eq 0 ] || scontrol_nodes "$(join_nodes "${boot[@]}")" POWER_DOWN
}

join_nodes() {
  local IFS=,
  echo "$*"
}

# scontrol_nodes NODES STATE: scontrol update NodeName=NODES State=STATE, or stop.
scontrol_nodes() {
  timeout 10 scontrol update NodeName="$1" State="$2" >/dev/null || die "Slurm did not set $1 to $2"
}

# powered_up NODE: slurmd runs and Slurm has the node up (no power flag left).
powered_up() { slurmd_ok "$1" && [[ ! "$(node_state "$1")" =~ POWER|NOT_RESPONDING|UNKNOWN ]]; }

start_slurmrestd() {
  pid_alive "$RUN_DIR/slurmrestd.pid" slurmrestd && return 0
  say "starting slurmrestd on $REST_HOST:$REST_PORT (as user $REST_USER)"
  # slurmrestd refuses to run as root or as SlurmUser. SLURM_JWT=daemon: it passes each
  # client's token (X-SLURM-USER-TOKEN) on to slurmctld instead of using one of its own.
  # setsid does not fork here (a background job is no group leader), so $! is slurmrestd's pid.
  SLURM_JWT=daemon setsid setpriv --reuid="$REST_USER" --regid="$REST_USER" --init-groups \
    /usr/sbin/slurmrestd -a rest_auth/jwt "$REST_HOST:$REST_PORT" \
    </dev/null >>"$LOG_DIR/slurmrestd.log" 2>&1 9>&- &
  echo "$!" >"$RUN_DIR/slurmrestd.pid"
  wait_for 30 tcp_open "$REST_HOST" "$REST_PORT" || failed slurmrestd "$LOG_DIR/slurmrestd.log"
}

# Wait for the 4 nodes to be up. A node drained by an earlier, different configuration is
# resumed once (ReturnToService=2 only returns nodes that were DOWN for not responding).
wait_nodes() {
  local bad
  wait_for 15 nodes_up && return 0
  bad="$(sinfo -h -N -p "$PARTITION" -o '%N %t' 2>/dev/null | awk '$2 ~ /^(drain|drng|drained|down|fail)$/ {print $1}' | paste -sd, -)"
  if [ -n "$bad" ]; then
    say "resuming nodes $bad"
    scontrol update NodeName="$bad" State=RESUME >/dev/null 2>&1 || true
  fi
  wait_for 45 nodes_up && return 0
  sinfo -N -p "$PARTITION" -o '%N %t %E' >&2 || true
  show_log "$LOG_DIR/slurmctld.log"
  die "the nodes did not come up"
}

summary() {
  echo "Slurm is up: cluster $CLUSTER, partition $PARTITION, ${#NODES[@]} nodes ($NODE_RANGE) x $GPUS_PER_NODE simulated GPUs (gpu:$GPU_TYPE); partition $ELASTIC_PARTITION, ${#ELASTIC_NODES[@]} more ($ELASTIC_RANGE) under power saving; REST http://$REST_HOST:$REST_PORT/slurm/$REST_API/ with headers X-SLURM-USER-NAME and X-SLURM-USER-TOKEN (token: scontrol token username=root lifespan=3600); logs $LOG_DIR; stop with deploy/slurm.sh stop"
}

# Slurm looks addresses up with AI_ADDRCONFIG and IPv4 only: with no IPv4 address besides
# 127.0.0.0/8 (a machine without any network), even "127.0.0.1" does not resolve.
has_ipv4_address() {
  [ -r /proc/net/fib_trie ] || return 0 # cannot tell: let Slurm try
  [ -n "$(awk '/\/32 host LOCAL/ && prev !~ /^127\./ {print prev} {prev = $2}' /proc/net/fib_trie 2>/dev/null)" ]
}

cmd_start() {
  local t0=$SECONDS
  has_ipv4_address ||
    die "this machine has no IPv4 address besides 127.0.0.0/8; Slurm cannot resolve even 127.0.0.1 then (add one, e.g. ip addr add 10.200.0.1/32 dev lo)"
  install_packages
  prepare_files
  install_power_programs
  write_configs
  if [ -z "$CONFIG_CHANGED" ] && all_ok; then
    summary
    return 0
  fi
  if [ -n "$CONFIG_CHANGED" ] && { pid_alive "$RUN_DIR/slurmctld.pid" slurmctld || pid_alive "$RUN_DIR/slurmdbd.pid" slurmdbd; }; then
    say "the configuration changed: restarting the Slurm daemons (jobs are kept)"
    stop_daemons
  fi
  sweep_strays slurmrestd slurmd slurmctld slurmdbd munged
  ensure_mariadb
  start_munge
  start_slurmdbd
  continue_job_ids
  start_slurmctld
  start_slurmds
  start_slurmrestd
  wait_nodes
  start_elastic
  wait_for 30 sacctmgr_ok || die "sacctmgr does not list cluster $CLUSTER"
  wait_for 30 slurmrestd_ok || {
    show_log "$LOG_DIR/slurmrestd.log"
    die "slurmrestd does not answer GET /slurm/$REST_API/diag"
  }
  say "ready in $((SECONDS - t0)) s"
  summary
}

# ---------------------------------------------------------------- status

cmd_status() {
  local bad=0 node
  check() {
    local label=$1
    shift
    if "$@"; then echo "ok    $label"; else
      echo "FAIL  $label"
      bad=1
    fi
  }
  check "MariaDB on 127.0.0.1:3306" mariadb_answers
  check "munged" munge_ok
  check "slurmdbd on 127.0.0.1:6819" slurmdbd_ok
  check "slurmctld (scontrol ping)" slurmctld_ok
  for node in "${NODES[@]}"; do check "slurmd $node" slurmd_ok "$node"; done
  for node in "${ELASTIC_NODES[@]}"; do
    if slurmd_ok "$node"; then echo "ok    slurmd $node (powered up)"; else check "$node powered down or powering (scontrol show node)" elastic_ok "$node"; fi
  done
  check "nodes up in partition $PARTITION (sinfo)" nodes_up drained
  check "accounting (sacctmgr lists $CLUSTER)" sacctmgr_ok
  check "slurmrestd http://$REST_HOST:$REST_PORT (GET /slurm/$REST_API/diag with a JWT)" slurmrestd_ok
  return "$bad"
}

# ---------------------------------------------------------------- stop

DAEMONS='munged|slurmctld|slurmscriptd|slurmd|slurmdbd|slurmrestd|slurmstepd'
no_daemons_listed() { ! pgrep -x "$DAEMONS" >/dev/null; }

# No job is listed and no job step process is left.
no_jobs() { [ -z "$(timeout 10 squeue -h -o %A 2>/dev/null)" ] && ! pgrep -x slurmstepd >/dev/null; }

cancel_jobs() {
  local jobs
  slurmctld_ok || return 0
  jobs="$(timeout 10 squeue -h -o %A 2>/dev/null | sort -u | paste -sd' ' -)" || return 0
  [ -n "$jobs" ] || return 0
  say "cancelling jobs: $jobs"
  # shellcheck disable=SC2086 # one argument per job id
  scancel $jobs 2>/dev/null || true
  # The jobs end within KillWait (5 s); wait for them to leave the queue and their steps to end.
  wait_for 30 no_jobs || say "warning: jobs still listed after 30 s"
}

# Stop the daemons; the elastic nodes that were powered up are listed in $ELASTIC_UP, for a
# restart to power them up again ("stop" removes the list: they start powered down).
stop_daemons() {
  local node up=()
  stop_pidfile "$RUN_DIR/slurmrestd.pid" slurmrestd slurmrestd
  for node in "${ELASTIC_NODES[@]}"; do slurmd_ok "$node" && up+=("$node"); done
  [ "${#up[@]}" -eq 0 ] || printf '%s\n' "${up[@]}" >"$ELASTIC_UP"
  for node in "${NODES[@]}"; do stop_pidfile "$RUN_DIR/slurmd-$node.pid" slurmd "slurmd $node"; done
  # An elastic node is stopped as it is powered down: SIGTERM, SIGKILL after 3 s.
  if [ "${#up[@]}" -gt 0 ]; then
    say "stopping slurmd ${up[*]}"
    "$SUSPEND_PROGRAM" "$(join_nodes "${up[@]}")" 9>&- || true
  fi
  stop_pidfile "$RUN_DIR/slurmctld.pid" slurmctld slurmctld
  stop_pidfile "$RUN_DIR/slurmdbd.pid" slurmdbd slurmdbd
}

# The pids our pid files name (live ones only).
known_pids() {
  local f
  for f in "$RUN_DIR"/*.pid "$MUNGE_PID"; do
    [ -s "$f" ] && head -n 1 "$f"
  done 2>/dev/null || true
}

# sweep_strays PROG...: stop processes of these programs that no pid file of ours names (left
# by an earlier, interrupted try; they would hold the ports). Matched by their exact
# executable, never by a name pattern.
sweep_strays() {
  local prog pid known
  known=" $(known_pids | paste -sd' ' -) "
  for prog in "$@"; do
    for pid in $(pgrep -x "$prog" || true); do
      [[ "$known" == *" $pid "* ]] && continue
      # Debian installs some daemons through alternatives (/usr/sbin/slurmd -> slurmd-wlm).
      if [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "/usr/sbin/$prog")" ]; then
        say "stopping stray $prog (pid $pid, no pid file)"
        term_pid "$pid" "$prog"
      fi
    done
  done
}

cmd_stop() {
  cancel_jobs
  stop_daemons
  rm -f "$ELASTIC_UP"
  stop_pidfile "$MUNGE_PID" munged munged
  sweep_strays slurmrestd slurmstepd slurmd slurmctld slurmdbd munged
  if [ -f "$MARIADB_MARKER" ]; then
    stop_pidfile "$MARIADB_PID" mariadbd "MariaDB (started by this script)"
    rm -f "$MARIADB_MARKER"
  fi
  # Exited daemons are collected by init; give it a moment so that none is listed afterwards.
  if ! wait_for 5 no_daemons_listed; then
    ps -o pid,stat,args -p "$(pgrep -d, -x "$DAEMONS")" >&2 || true
    if pgrep -x "$DAEMONS" | while read -r pid; do running "$pid" && exit 1; done; then
      say "warning: exited daemons not yet collected by init (zombies)"
    else
      die "some Slurm or munge processes are still running"
    fi
  fi
  say "stopped"
}

# ---------------------------------------------------------------- main

[ "$#" -eq 1 ] || usage
case "$1" in start | status | stop | restart) ;; *) usage ;; esac
[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts system daemons)"
if [ "$1" != status ]; then
  # One start/stop at a time. Every daemon is started with fd 9 closed so none keeps the lock.
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/slurm.sh.lock"
  flock -w 300 9 || die "another deploy/slurm.sh is still running"
fi

case "$1" in
  start) cmd_start ;;
  status) cmd_status ;;
  stop) cmd_stop ;;
  restart)
    cmd_stop
    cmd_start
    ;;
esac
