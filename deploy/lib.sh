# Shared by run.sh and test.sh: a virtualenv with the pinned requirements, reused while
# requirements.txt is unchanged.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PORTAL_VENV:-$ROOT/.venv}"

find_python() {
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "GPU Portal needs Python 3.11 or later." >&2
  return 1
}

ensure_venv() {
  local python stamp want
  python="$(find_python)" || return 1
  if [ ! -x "$VENV/bin/python" ]; then
    echo "Creating the virtualenv in $VENV..."
    if ! "$python" -m venv "$VENV" 2>/dev/null; then
      # Debian and Ubuntu ship venv separately.
      if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        rm -rf "$VENV"; "$python" -m venv "$VENV"
      else
        echo "Cannot create a virtualenv: install python3-venv (sudo apt-get install python3-venv)." >&2
        return 1
      fi
    fi
  fi
  stamp="$VENV/.requirements.sha256"
  want="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "Installing the pinned requirements..."
    # From the repository root: requirements.txt names the SDK by its relative path (-e ./sdk).
    (cd "$ROOT" && "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r requirements.txt)
    echo "$want" > "$stamp"
  fi
}

# The pinned Node packages of package-lock.json (the notebook proxy, the pages' scripts) in
# node_modules/, reinstalled when the lock file changes.
ensure_node_modules() {
  local stamp want
  if ! command -v npm >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
      echo "Installing Node.js and npm..."
      apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
    else
      echo "GPU Portal needs Node.js and npm (sudo apt-get install nodejs npm)." >&2
      return 1
    fi
  fi
  stamp="$ROOT/node_modules/.package-lock.sha256"
  want="$(sha256sum "$ROOT/package-lock.json" | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "Installing the pinned Node packages..."
    (cd "$ROOT" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" > "$stamp"
  fi
}

# bubblewrap, the sandbox every workload runs in (docs/security.md). Without it the portal refuses
# to start user code, unless PORTAL_SANDBOX=off opts out (a single-user workstation only).
ensure_bubblewrap() {
  if command -v bwrap >/dev/null 2>&1 || [ "${PORTAL_SANDBOX:-bwrap}" = off ]; then return 0; fi
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "Installing bubblewrap (the workloads' sandbox)..."
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
  else
    echo "GPU Portal runs every workload in a bubblewrap sandbox: install it (sudo apt-get install bubblewrap)," >&2
    echo "or, on a single-user workstation only, set PORTAL_SANDBOX=off to run workloads unsandboxed." >&2
    return 1
  fi
}
