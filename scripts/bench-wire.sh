#!/usr/bin/env bash
# make bench-wire: builds quiver-server and every peer, installs oha, then runs
# bench/wire.py (same echo tool everywhere, each server pinned to CPU 1, oha on CPU 0) and
# writes its table into docs/performance.md. Arguments are passed to bench/wire.py, e.g.
#   scripts/bench-wire.sh --connections 16 --only quiver axum-fixed --seconds 2
# QUIVER_BIN / QUIVER_PGO_BIN: measure these binaries instead of building target/release
# (QUIVER_PGO_BIN adds a "quiver-pgo" row; scripts/images.sh leaves its PGO build in
# ~/.cache/quiver/images/bin/quiver-server). QUIVER_BENCH_WRITE=0: print only.
# `--baseline PATH` measures another build (say the previous commit's) side by side, as
# rows "baseline" and "baseline→rmcp". QUIVER_BENCH_TRACING=1 adds tracing rows (below).
# ToolHive's vMCP fronts the same rmcp peer as quiver→rmcp and the TCP relay (vmcp→rmcp).
# Everything installed goes under ~/.cache/quiver; nothing is written into the clone but
# the table.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

[ "$(nproc)" -ge 2 ] || { echo "bench-wire needs 2 CPUs (server on CPU 1, load generator on CPU 0)" >&2; exit 1; }

OHA_VERSION=1.16.0
oha="$QUIVER_CACHE/tools/bin/oha"
if [ ! -x "$oha" ] || ! "$oha" --version | grep -q " $OHA_VERSION\$"; then
  log "installing oha $OHA_VERSION (crates.io) into $QUIVER_CACHE/tools"
  CARGO_TARGET_DIR="$QUIVER_CACHE/tools/oha-target" cargo install --locked --quiet oha --version "$OHA_VERSION" --root "$QUIVER_CACHE/tools"
fi

quiver="${QUIVER_BIN:-}"
if [ -z "$quiver" ]; then
  log "quiver-server, release build (fat LTO)"
  cargo build --release --locked -p quiver-server --bin quiver-server
  quiver="$(target_dir)/release/quiver-server"
fi

log "Rust peers: rmcp, the axum ceilings and the TCP relay (bench/peers/rust, release, fat LTO)"
peers_target="$QUIVER_CACHE/target-bench"
CARGO_TARGET_DIR="$peers_target" cargo build --release --locked --quiet --manifest-path bench/peers/rust/Cargo.toml

log "Go SDK peer (tests/e2e/upstream-go)"
go_mcp="$QUIVER_CACHE/upstream-go/go-mcp"
mkdir -p "$(dirname "$go_mcp")"
(cd tests/e2e/upstream-go && GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath -o "$go_mcp" .)

# ToolHive's vMCP (the vmcp→rmcp row). v0.47.0 is the newest release that builds from the Go
# module proxy here: every later one (v0.55.1 ... v0.63.0) needs Go 1.27 and modules the
# proxy does not serve (github.com/jwx-go/jwkfetch/v4, github.com/stacklok/toolhive-core/
# redisconn, github.com/getsentry/sentry-go/otel/otlp, a golang.org/x/exp/jsonrpc2 snapshot).
TOOLHIVE_VERSION=v0.47.0
vmcp="$QUIVER_CACHE/peers/toolhive-$TOOLHIVE_VERSION/vmcp"
if [ ! -x "$vmcp" ]; then
  log "ToolHive vmcp $TOOLHIVE_VERSION (Go module; once, cached in $(dirname "$vmcp"))"
  GOBIN="$(dirname "$vmcp")" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
    "github.com/stacklok/toolhive/cmd/vmcp@$TOOLHIVE_VERSION"
fi
gateways=(--vmcp "$vmcp")

log "TypeScript SDK peers (npm, from their lockfiles)"
node="$ROOT/tests/conformance/node_modules/node/bin/node"   # Node 22, installed by scripts/conformance.sh
if [ ! -x "$node" ]; then
  (cd tests/conformance && npm ci --no-audit --no-fund --loglevel=error --cache "$QUIVER_CACHE/npm")
fi
for d in bench/peers/typescript-v1 bench/peers/typescript-v2; do
  if [ -f "$d/package-lock.json" ] && [ ! -d "$d/node_modules" ]; then
    (cd "$d" && npm ci --no-audit --no-fund --loglevel=error --cache "$QUIVER_CACHE/npm")
  fi
done

python_env

write=(--write docs/performance.md)
[ "${QUIVER_BENCH_WRITE:-1}" = 0 ] && write=()
pgo=()
[ -n "${QUIVER_PGO_BIN:-}" ] && pgo=(--quiver-pgo "$QUIVER_PGO_BIN")

# QUIVER_BENCH_TRACING=1: rows with tracing on (1% and 100% sampled), exporting to a real
# OpenTelemetry Collector (scripts/otelcol.sh) on the load generator's CPU.
tracing=()
if [ "${QUIVER_BENCH_TRACING:-0}" = 1 ]; then
  otel_dir="$(mktemp -d)"
  read -r otel_pid otel_endpoint < <(taskset -c 0 "$ROOT/scripts/otelcol.sh" start "$otel_dir" /dev/null)
  trap 'kill "$otel_pid" 2>/dev/null || true; rm -rf "$otel_dir"' EXIT
  tracing=(--otlp-endpoint "$otel_endpoint")
fi

log "measuring (bench/wire.py)"
"$PY" bench/wire.py --quiver "$quiver" "${pgo[@]}" "${tracing[@]}" "${gateways[@]}" --peers "$peers_target/release" --go-mcp "$go_mcp" \
  --node "$node" --python "$PY" --oha "$oha" "${write[@]}" "$@"
