#!/usr/bin/env bash
# Slurm's ResumeProgram and SuspendProgram for the simulated elastic nodes of deploy/slurm.sh
# (partition "elastic"). Powering a simulated node up starts its slurmd (`slurmd -N nodeK`, as
# deploy/slurm.sh starts the others); powering it down stops that slurmd by its pid file.
#
# deploy/slurm.sh installs this file twice, as /usr/local/sbin/slurm-resume and
# /usr/local/sbin/slurm-suspend: slurmctld runs a program with one argument, a host list
# (node[5-6]), so the name it is called by says what to do. By hand:
#
#   slurm-power.sh resume|suspend HOSTLIST
#
# Only the nodes named in /etc/slurm/slurm-power.conf (written by deploy/slurm.sh) are touched:
# powering down node1 by mistake must not stop a node of partition gpu.
#
# For tests only: while the file /run/slurm/power-fail-NODE exists, a resume of NODE fails (its
# slurmd is not started and the program exits 1), so Slurm marks NODE DOWN once ResumeTimeout
# has passed, as it would a machine that did not boot.
#
# Output goes to /var/log/slurm/power.log. Exit status 0 when every node was done.
set -uo pipefail
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

CONF=/etc/slurm/slurm-power.conf
RUN_DIR=/run/slurm
LOG=/var/log/slurm/power.log
SLURMD=/usr/sbin/slurmd
SCONTROL=/usr/bin/scontrol
STOP_WAIT_S=3
BOOT_DELAY_S=2

log() { echo "$(date -u +%FT%TZ) $action $*" >>"$LOG"; }

# slurmd_pid NODE: the pid of NODE's running slurmd, from its pid file ('' when none runs).
slurmd_pid() {
  local pid
  pid="$(head -n 1 "$RUN_DIR/slurmd-$1.pid" 2>/dev/null)" || return 0
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmd ] || return 0
  [ "$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null)" != Z ] || return 0
  echo "$pid"
}

# A powered-up node must look freshly booted: slurmctld takes the registration of a node it is
# powering up only when the node's boot time (now minus the uptime slurmd reports, both in
# whole seconds, the uptime rounded up) is not before the power-up request. Every simulated node
# shares this machine's uptime, so slurmd runs in a new time namespace whose boot time is now
# (Linux 5.6 or later, root), started BOOT_DELAY_S after the request (see the main loop) so
# that the roundings cannot put its boot time before it.
start_slurmd() {
  local node=$1 offset
  offset="-$(awk '{print int($1)}' /proc/uptime)"
  if unshare --time --boottime "$offset" true 2>/dev/null; then
    setsid unshare --time --boottime "$offset" "$SLURMD" -N "$node" </dev/null >>"$LOG" 2>&1
  else
    log "$node: no time namespace here (unshare --time): slurmctld will not see it boot"
    setsid "$SLURMD" -N "$node" </dev/null >>"$LOG" 2>&1
  fi
}

resume_node() {
  local node=$1
  if [ -e "$RUN_DIR/power-fail-$node" ]; then
    log "$node: $RUN_DIR/power-fail-$node exists: not starting its slurmd (a failed boot, for tests)"
    return 1
  fi
  # A slurmd left from an earlier, failed power up would report the old boot time: boot afresh.
  [ -z "$(slurmd_pid "$node")" ] || suspend_node "$node"
  mkdir -p "/var/lib/slurm/slurmd/$node"
  # slurmd forks itself; no terminal, no inherited descriptors (slurmctld waits for this
  # program's output to close).
  if start_slurmd "$node"; then
    log "$node: slurmd started"
  else
    log "$node: slurmd did not start"
    return 1
  fi
}

suspend_node() {
  local node=$1 pid
  pid="$(slurmd_pid "$node")"
  if [ -z "$pid" ]; then
    log "$node: no slurmd runs"
    rm -f "$RUN_DIR/slurmd-$node.pid"
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null
  for ((i = 0; i < STOP_WAIT_S * 10; i++)); do
    [ -n "$(slurmd_pid "$node")" ] || break
    sleep 0.1
  done
  if [ -n "$(slurmd_pid "$node")" ]; then
    log "$node: slurmd (pid $pid) ignored SIGTERM for $STOP_WAIT_S s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$RUN_DIR/slurmd-$node.pid"
  log "$node: slurmd (pid $pid) stopped"
}

case "$(basename "$0")" in
  slurm-resume) action=resume ;;
  slurm-suspend) action=suspend ;;
  *)
    action="${1:-}"
    shift || true
    ;;
esac
if [[ "$action" != resume && "$action" != suspend ]] || [ "$#" -ne 1 ]; then
  echo "usage: $0 resume|suspend HOSTLIST (or called as slurm-resume / slurm-suspend HOSTLIST)" >&2
  exit 2
fi
mkdir -p "$(dirname "$LOG")" "$RUN_DIR"

managed=""
# shellcheck source=/dev/null # written by deploy/slurm.sh: ELASTIC_NODES="node5 node6"
[ -r "$CONF" ] && . "$CONF" && managed=" ${ELASTIC_NODES:-} "

nodes="$("$SCONTROL" show hostnames "$1" 2>>"$LOG")" || {
  log "cannot expand host list $1"
  exit 1
}
rc=0
# The boot delay (see start_slurmd), once for all the nodes.
[ "$action" != resume ] || sleep "$BOOT_DELAY_S"
for node in $nodes; do
  if [[ "$managed" != *" $node "* ]]; then
    log "$node: not an elastic node (not in $CONF): left alone"
    rc=1
    continue
  fi
  "${action}_node" "$node" || rc=1
done
exit "$rc"
