#!/usr/bin/env bash
# Runs the official MCP server conformance suite (@modelcontextprotocol/conformance) against
# the real quiver-server binary serving tests/conformance/toolset.yaml over Streamable HTTP
# on 127.0.0.1, once per protocol revision: `--requirements 2025-11-25` (the handshake era)
# and `--requirements 2026-07-28` (stateless). Each requirement set is what the suite's
# authors froze as required for that revision, plus, unscored, what is optional (extensions
# such as tasks) or pending: every scenario of both revisions runs.
#
# The suite itself judges only the required scenarios. This script then reads every
# scenario's checks (scored or not) and fails when any check fails (FAILURE or WARNING, as
# the suite counts them) in a scenario not listed in tests/conformance/expected-failures.yaml,
# when a listed scenario passes (the list must not go stale), or when an entry gives no
# reason (a `# reason` comment on its line). The suite needs Node 22+; it comes from npm (the
# `node` package) with the suite, pinned by tests/conformance/package-lock.json. Results go
# to $(target_dir)/conformance.
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

BIN="$(server_bin)"
OUT="$(target_dir)/conformance"
rm -rf "$OUT" && mkdir -p "$OUT"

read -r PORT ADMIN < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
# Served from a directory of its own, which is also the server's working directory: the
# suite's list-changed hooks are tools that add files beside it (see toolset.yaml).
mkdir -p "$OUT/toolset"
cp "$DIR/toolset.yaml" "$OUT/toolset/"
# --sse-poll-after: answers still running after 1 s end their stream and are polled with
# Last-Event-ID (the suite's test_reconnection tool runs 1.5 s). --tasks-max-result-bytes:
# protocol_error_job's task fails on its result's size (see toolset.yaml).
(cd "$OUT/toolset" && exec "$BIN" --config "file:$OUT/toolset" --listen "127.0.0.1:$PORT" \
  --admin-listen "127.0.0.1:$ADMIN" --sse-poll-after 1s --tasks-max-result-bytes 65536) >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 400); do
  curl -fsS "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break
  kill -0 $SERVER 2>/dev/null || { echo "quiver-server exited:" >&2; cat "$OUT/server.log" >&2; exit 1; }
  sleep 0.05
done

status=0
for revision in 2025-11-25 2026-07-28; do
  log "MCP conformance suite $("$NODE" "$SUITE" --version 2>/dev/null || true) (Node $("$NODE" --version)), requirements of $revision"
  rc=0
  "$NODE" "$SUITE" server --url "http://127.0.0.1:$PORT/mcp" --requirements "$revision" \
    --expected-failures "$DIR/expected-failures.yaml" -o "$OUT/results-$revision" >"$OUT/suite-$revision.log" 2>&1 || rc=$?
  sed -n '/=== SUMMARY ===/,$p' "$OUT/suite-$revision.log"
  if [ "$rc" != 0 ]; then
    echo "conformance ($revision): unexpected results (exit $rc); full log in $OUT/suite-$revision.log, server log in $OUT/server.log" >&2
    status=$rc
  fi
  # The suite must have run: a summary with at least one passed check.
  grep -Eq '^Total: [1-9][0-9]* passed' "$OUT/suite-$revision.log" \
    || { echo "conformance ($revision): no summary in $OUT/suite-$revision.log" >&2; status=1; }
  python3 "$ROOT/scripts/conformance_checks.py" "$DIR/expected-failures.yaml" "$revision" \
    "$OUT/results-$revision" || status=1
done
exit "$status"
