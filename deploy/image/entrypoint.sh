#!/usr/bin/env bash
# The portal image's entrypoint: one process of the portal per container, named by the first argument
# (docs/install.md, deploy/helm/gpuportal). Each replaces this shell (exec), so it receives the pod's signals.
#   web                the web process: gunicorn with uvicorn workers (portal/gunicorn_conf.py)
#   worker ARGS...     a Celery worker; ARGS: its queue and pool (-Q provision -n provision@%h --pool=threads)
#   scheduler [ARGS]   the scheduler loop (manage.py run_scheduler)
#   proxy              the notebook proxy (configurable-http-proxy), from PROXY_PORT, PROXY_API_PORT,
#                      PROXY_DEFAULT_TARGET and CONFIGPROXY_AUTH_TOKEN
#   migrate            manage.py migrate
#   manage ARGS...     any manage.py command
set -euo pipefail
APP="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${PORTAL_VENV:-/opt/venv}"
PY="$VENV/bin/python"
cd "$APP"

command="${1:-web}"
[ $# -gt 0 ] && shift
case "$command" in
  web)
    exec "$PY" -m gunicorn -c python:portal.gunicorn_conf portal.asgi:application "$@"
    ;;
  worker)
    exec "$PY" -m celery -A portal worker --loglevel=INFO "$@"
    ;;
  scheduler)
    exec "$PY" manage.py run_scheduler "$@"
    ;;
  proxy)
    : "${CONFIGPROXY_AUTH_TOKEN:?the proxy's API token}" "${PROXY_DEFAULT_TARGET:?the web process's URL}"
    exec "$APP/node_modules/.bin/configurable-http-proxy" \
      --ip 0.0.0.0 --port "${PROXY_PORT:-8000}" --api-ip 0.0.0.0 --api-port "${PROXY_API_PORT:-8001}" \
      --default-target "$PROXY_DEFAULT_TARGET" --host-routing --log-level warn "$@"
    ;;
  migrate)
    exec "$PY" manage.py migrate --no-input "$@"
    ;;
  manage)
    exec "$PY" manage.py "$@"
    ;;
  *)
    echo "unknown process: $command (web, worker, scheduler, proxy, migrate, manage)" >&2
    exit 2
    ;;
esac
