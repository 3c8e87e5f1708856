#!/usr/bin/env bash
# Runs the whole test suite against real PostgreSQL and Redis (started here if they are not
# running), plus lint, types, migrations and the production settings check.
# Extra arguments go to pytest, e.g. deploy/test.sh -k scheduler.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$ROOT/deploy/services.sh"
ensure_venv
ensure_node_modules
ensure_bubblewrap
ensure_postgres
ensure_redis
ensure_chromium
ensure_prometheus
ensure_inference_env
ensure_helm
cd "$ROOT"
# A real Slurm (4 simulated nodes x 4 GPUs) for the Slurm backend's tests; see docs/slurm.md.
bash deploy/slurm.sh start

export DATABASE_URL="${TEST_DATABASE_URL:-postgres://gpuportal:gpuportal@127.0.0.1:5432/gpuportal}"
export REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:6379/15}"
# No connection pool in the test processes: tests' own threads take connections they never give
# back. The pool is tested where it runs, in the web process (tests/test_connection_pool.py).
export DATABASE_POOL_MAX="${DATABASE_POOL_MAX:-0}"
if [ -z "${PORTAL_DATA_DIR:-}" ]; then
  # Deleted at the end: the block of workspace uids it held is then released by the next portal.
  PORTAL_DATA_DIR="$(mktemp -d /tmp/gpuportal-test.XXXXXX)"
  trap 'rm -rf "$PORTAL_DATA_DIR" || true' EXIT
fi
export PORTAL_DATA_DIR
PY="$VENV/bin/python"

echo "== lint and types"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy"

echo "== migrations are up to date"
"$PY" manage.py makemigrations --check --dry-run

echo "== production settings pass the deployment checks"
PORTAL_ENV=production SECRET_KEY="$(head -c 48 /dev/urandom | base64)" ALLOWED_HOSTS=portal.example.org \
  PORTAL_NOTEBOOK_DOMAIN=nb.example.org "$PY" manage.py check --deploy --fail-level WARNING

echo "== tests"
"$PY" -m pytest -n 2 --ignore=tests/browser -m "not pressure" "$@"

echo "== attack tests (each times another tenant's API while a workload attacks: nothing else runs meanwhile)"
"$PY" -m pytest -s -m pressure tests/security "$@" || [ $? -eq 5 ]  # 5: an argument selected none of them

echo "== browser tests (Chromium against live portals; two test processes of their own)"
"$PY" -m pytest -n 2 tests/browser
