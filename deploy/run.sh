#!/usr/bin/env bash
# Runs the embedded portal: SQLite, a filesystem broker, the local backend. Ctrl-C stops it.
# PORTAL_PORT (8000) and PORTAL_DATA_DIR (./var) change where it listens and keeps its data.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_venv
ensure_node_modules
ensure_bubblewrap
cd "$ROOT"
exec "$VENV/bin/python" -m portal.embedded "$@"
