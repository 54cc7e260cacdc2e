#!/usr/bin/env bash
# Runs the official MCP server conformance suite (@modelcontextprotocol/conformance, every
# scenario: active and pending) against the real quiver-server binary serving
# tests/conformance/toolset.yaml over Streamable HTTP on 127.0.0.1.
#
# A scenario listed in tests/conformance/expected-failures.yaml may fail; any other failure,
# and any listed scenario that now passes (a stale entry), fails this script. The suite
# needs Node 22+; it comes from npm (the `node` package) with the suite, pinned by
# tests/conformance/package-lock.json. Results go to $(target_dir)/conformance.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
DIR="$ROOT/tests/conformance"

if [ ! -x "$DIR/node_modules/node/bin/node" ] || [ ! -d "$DIR/node_modules/@modelcontextprotocol/conformance" ]; then
  log "installing the conformance suite and Node 22 from npm (tests/conformance)"
  (cd "$DIR" && npm ci --no-audit --no-fund --loglevel=error --cache "$QUIVER_CACHE/npm")
fi
NODE="$DIR/node_modules/node/bin/node"
SUITE="$DIR/node_modules/@modelcontextprotocol/conformance/dist/index.js"

BIN="${QUIVER_SERVER_BIN:-}"
if [ -z "$BIN" ]; then
  cargo build -p quiver-server --locked --quiet
  BIN="$(target_dir)/debug/quiver-server"
fi
OUT="$(target_dir)/conformance"
rm -rf "$OUT" && mkdir -p "$OUT"

read -r PORT ADMIN < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
"$BIN" --config "file:$DIR/toolset.yaml" --listen "127.0.0.1:$PORT" \
  --admin-listen "127.0.0.1:$ADMIN" >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 400); do
  curl -fsS "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "quiver-server exited:" >&2; cat "$OUT/server.log" >&2; exit 1; }
  sleep 0.05
done

log "MCP conformance suite $("$NODE" "$SUITE" --version 2>/dev/null || true) (Node $("$NODE" --version)), all server scenarios"
status=0
"$NODE" "$SUITE" server --url "http://127.0.0.1:$PORT/mcp" --suite all \
  --expected-failures "$DIR/expected-failures.yaml" -o "$OUT/results" >"$OUT/suite.log" 2>&1 || status=$?
sed -n '/=== SUMMARY ===/,$p' "$OUT/suite.log"
if [ "$status" != 0 ]; then
  echo "conformance: unexpected results (exit $status); full log in $OUT/suite.log, server log in $OUT/server.log" >&2
  exit "$status"
fi
# The suite must have run: a summary with at least one passed check and no failed one
# outside the expected list.
grep -Eq '^Total: [1-9][0-9]* passed' "$OUT/suite.log" \
  || { echo "conformance: no summary in $OUT/suite.log" >&2; exit 1; }
