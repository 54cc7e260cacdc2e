#!/usr/bin/env bash
# Quick start: builds quiver-server, serves examples/tools.yaml on 127.0.0.1:8080, and
# connects the official Python MCP client, which lists the tools, calls one, and then
# prints the tool list again every time the server announces a change: edit
# examples/tools.yaml in another terminal and watch. Ctrl-C stops everything.
# `--once` (used by the tests) stops after the first call.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
PORT="${QUIVER_PORT:-8080}"
ADMIN="${QUIVER_ADMIN_PORT:-9090}"

bin="$(server_bin)"   # QUIVER_SERVER_BIN, or built here
python_env

log "starting quiver-server on http://127.0.0.1:$PORT/mcp (admin :$ADMIN)"
"$bin" --config file:examples/tools.yaml \
  --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 200); do
  curl -fsS "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "quiver-server exited" >&2; exit 1; }
  sleep 0.05
done

"$PY" "$ROOT/scripts/demo_client.py" "http://127.0.0.1:$PORT/mcp" "$@"
