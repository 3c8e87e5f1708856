#!/usr/bin/env bash
# Runs the embedded portal: SQLite, a filesystem broker, the local backend. Ctrl-C stops it.
# PORTAL_PORT (8000) and PORTAL_DATA_DIR (./var) change where it listens and keeps its data.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_venv
ensure_node_modules
ensure_bubblewrap
cd "$ROOT"

# Resource limits (docs/security.md): each workload held by a cgroup to the CPU, memory and processes
# it asked for. As root the portal enforces them, and refuses to start user code where it cannot. An
# ordinary user can rarely create cgroups: there, unless PORTAL_RESOURCE_LIMITS says otherwise, this
# run goes without limits, says so here, and every page of the portal says so too.
if [ -z "${PORTAL_RESOURCE_LIMITS:-}" ] && ! why="$("$VENV/bin/python" -m workers.backends.cgroups "${PORTAL_CGROUP_ROOT:-/sys/fs/cgroup}" 2>&1)"; then
  if [ "$(id -u)" = 0 ]; then
    echo "GPU Portal will not start user code without resource limits: $why." >&2
    echo "Mount the cgroup file system read-write (a container needs its own cgroup namespace, or" >&2
    echo "--privileged), or, on a single-user workstation only, set PORTAL_RESOURCE_LIMITS=off." >&2
    exit 1
  fi
  echo "WARNING: workloads will run without CPU, memory or process limits: $why." >&2
  echo "  PORTAL_RESOURCE_LIMITS=off is set for this run (a single-user workstation only). To enforce" >&2
  echo "  the limits, run deploy/run.sh as root, or give the portal a delegated cgroup (docs/security.md)." >&2
  export PORTAL_RESOURCE_LIMITS=off
fi
# Disk quotas (docs/security.md): each workspace's directory a disk of its quota's size, which the
# portal mounts: as root it enforces them, and refuses to start user code where it cannot mount. An
# ordinary user cannot: there, unless PORTAL_DISK_QUOTA says otherwise, this run goes without them,
# says so here, and every page of the portal says so too.
if [ -z "${PORTAL_DISK_QUOTA:-}" ] && ! why="$("$VENV/bin/python" -m workers.backends.diskquota 2>&1)"; then
  if [ "$(id -u)" = 0 ]; then
    echo "GPU Portal will not start user code without disk quotas: $why." >&2
    echo "Give it loop devices (a container needs --privileged, or /dev/loop-control and /dev/loop*)," >&2
    echo "or, on a single-user workstation only, set PORTAL_DISK_QUOTA=off." >&2
    exit 1
  fi
  echo "WARNING: workspaces will write without a disk quota: $why." >&2
  echo "  PORTAL_DISK_QUOTA=off is set for this run (a single-user workstation only). To enforce the" >&2
  echo "  quotas, run deploy/run.sh as root (docs/security.md)." >&2
  export PORTAL_DISK_QUOTA=off
fi
exec "$VENV/bin/python" -m portal.embedded "$@"
