#!/usr/bin/env bash
# The portal image's build steps, one per argument, run by deploy/image/Containerfile from the image's
# /app and by tests/deploy/test_image.py from the repository (against the suite's own virtualenv), so
# that what the image runs is what CI runs.
#   python  the virtualenv ($PORTAL_VENV) with the pinned requirements.txt
#   node    the pinned Node packages the portal runs (the notebook proxy) and serves (the pages' scripts)
#   static  collectstatic into $STATIC_ROOT (hashed, compressed names: whitenoise serves them)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${PORTAL_VENV:-/opt/venv}"
cd "$ROOT"

for step in "$@"; do
  case "$step" in
    python)
      [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
      "$VENV/bin/python" -m pip install --no-cache-dir --disable-pip-version-check --no-input -r requirements.txt
      ;;
    node)
      npm ci --omit=dev --no-audit --no-fund --loglevel=error
      ;;
    static)
      : "${STATIC_ROOT:?set STATIC_ROOT to where the static files go}"
      # Settings need a data directory and a key to import; neither is kept.
      data="$(mktemp -d)"
      PORTAL_ENV=embedded PORTAL_DATA_DIR="$data" SECRET_KEY="build-only-$(head -c 48 /dev/urandom | base64)" \
        "$VENV/bin/python" manage.py collectstatic --no-input -v 0
      rm -rf "$data"
      ;;
    *)
      echo "unknown build step: $step (python, node, static)" >&2
      exit 2
      ;;
  esac
done
