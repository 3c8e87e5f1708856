#!/usr/bin/env bash
# Runs the embedded portal: SQLite, a filesystem broker, the local backend. Ctrl-C stops it.
# PORTAL_PORT (8000) and PORTAL_DATA_DIR (./var) change where it listens and keeps its data.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_venv
ensure_node_modules
ensure_bubblewrap
cd "$ROOT"

# Resource limits and disk quotas (docs/security.md): each workload held by a cgroup to the CPU,
# memory and processes it asked for, each workspace's directory a disk of its quota's size. As root
# the portal enforces both, and refuses to start user code where it cannot. An ordinary user can
# rarely create cgroups and cannot mount: there, unless the setting says otherwise, this run goes
# without, says so here, and every page of the portal says so too.
# enforce_or_opt_out SETTING "what goes without" "how root gets it" "how a user gets it" CHECK...
enforce_or_opt_out() {
  local setting=$1 without=$2 root_fix=$3 user_fix=$4 why
  shift 4
  [ -z "${!setting:-}" ] || return 0
  why="$("$@" 2>&1)" && return 0
  if [ "$(id -u)" = 0 ]; then
    echo "GPU Portal will not start user code: $without: $why." >&2
    echo "$root_fix, or, on a single-user workstation only, set $setting=off." >&2
    exit 1
  fi
  echo "WARNING: $without: $why." >&2
  echo "  $setting=off is set for this run (a single-user workstation only). $user_fix (docs/security.md)." >&2
  export "$setting=off"
}
enforce_or_opt_out PORTAL_RESOURCE_LIMITS "workloads would run without CPU, memory or process limits" \
  "Mount the cgroup file system read-write (a container needs its own cgroup namespace, or --privileged)" \
  "To enforce the limits, run deploy/run.sh as root, or give the portal a delegated cgroup" \
  "$VENV/bin/python" -m workers.backends.cgroups "${PORTAL_CGROUP_ROOT:-/sys/fs/cgroup}"
enforce_or_opt_out PORTAL_DISK_QUOTA "workspaces would write without a disk quota" \
  "Give it loop devices (a container needs --privileged, or /dev/loop-control and /dev/loop*)" \
  "To enforce the quotas, run deploy/run.sh as root" \
  "$VENV/bin/python" -m workers.backends.diskquota
exec "$VENV/bin/python" -m portal.embedded "$@"
