#!/usr/bin/env bash
# The test command's trace backend: an OpenTelemetry Collector with only the OTLP receiver
# and the file exporter, built by the collector builder (ocb) from Go modules and cached
# under ~/.cache/quiver/otelcol (keyed by tests/otelcol/builder.yaml).
#
#   scripts/otelcol.sh build          prints the binary's path (builds it when missing)
#   scripts/otelcol.sh start DIR [OUT]  starts it on 127.0.0.1 (OTLP/HTTP on a free port),
#                                     writing what it receives to OUT (default
#                                     DIR/traces.jsonl, one JSON document per line); prints
#                                     "PID ENDPOINT" once the receiver answers
set -euo pipefail
source "$(dirname "$0")/lib.sh"

OCB_VERSION=v0.161.0
manifest="$ROOT/tests/otelcol/builder.yaml"
cache="$QUIVER_CACHE/otelcol"

build() {
  local key bin
  key="$(sha256sum "$manifest" | cut -c1-16)"
  bin="$cache/$key/quiver-otelcol"
  if [ ! -x "$bin" ]; then
    log "building the OpenTelemetry Collector (ocb $OCB_VERSION: otlpreceiver + fileexporter) into $cache/$key"
    mkdir -p "$cache/$key"
    [ -x "$cache/bin/builder" ] || GOBIN="$cache/bin" go install "go.opentelemetry.io/collector/cmd/builder@$OCB_VERSION"
    cp "$manifest" "$cache/$key/builder.yaml"
    (cd "$cache/$key" && CGO_ENABLED=0 "$cache/bin/builder" --config builder.yaml --ldflags="-s -w" >build.log 2>&1) \
      || { tail -40 "$cache/$key/build.log" >&2; exit 1; }
    mv "$cache/$key/build/quiver-otelcol" "$bin"
    rm -rf "$cache/$key/build"
  fi
  echo "$bin"
}

start() {
  local dir="$1" out="${2:-$1/traces.jsonl}" bin port
  bin="$(build)"
  mkdir -p "$dir"
  port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  cat >"$dir/otelcol.yaml" <<YAML
receivers:
  otlp:
    protocols:
      http: {endpoint: "127.0.0.1:$port"}
exporters:
  file:
    path: "$out"
    flush_interval: 100ms
service:
  telemetry:
    metrics: {level: none}
  pipelines:
    traces: {receivers: [otlp], exporters: [file]}
YAML
  "$bin" --config "file:$dir/otelcol.yaml" >"$dir/otelcol.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do
    # The receiver answers 405 to a GET on the traces path once it listens.
    if curl -s -o /dev/null "http://127.0.0.1:$port/v1/traces"; then
      echo "$pid http://127.0.0.1:$port"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  cat "$dir/otelcol.log" >&2
  kill "$pid" 2>/dev/null || true
  return 1
}

case "${1:-}" in
  build) build ;;
  start) start "${2:?usage: otelcol.sh start DIR [OUT]}" "${3:-}" ;;
  *) echo "usage: $0 build | start DIR" >&2; exit 2 ;;
esac
