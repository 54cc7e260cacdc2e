#!/usr/bin/env bash
# The test command's OpenTelemetry Collectors, built by the collector builder (ocb) from Go
# modules and cached under ~/.cache/quiver/otelcol (keyed by their manifest):
#  - the trace backend (tests/otelcol/builder.yaml): only the OTLP receiver and the file
#    exporter; it is also the backend the audit recipe's test sends logs to;
#  - the node agent of the audit recipe (deploy/otelcol/builder.yaml: filelog receiver,
#    k8sattributes, filter and transform processors, routing connector, OTLP/HTTP exporter,
#    file_storage). Its components are served here at one release only, older than the
#    trace backend's (whose file exporter that release lacks): hence two builds.
#
#   scripts/otelcol.sh build          prints the binary's path (builds it when missing)
#   scripts/otelcol.sh build-agent    the same for the node agent
#   scripts/otelcol.sh start DIR [OUT]  starts it on 127.0.0.1 (OTLP/HTTP on a free port),
#                                     writing what it receives to OUT (default
#                                     DIR/traces.jsonl, one JSON document per line); prints
#                                     "PID ENDPOINT" once the receiver answers
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cache="$QUIVER_CACHE/otelcol"

# ocb_build MANIFEST OCB_VERSION NAME WHAT: the collector MANIFEST describes (its dist.name
# is NAME), built by ocb OCB_VERSION once; prints its path.
ocb_build() {
  local manifest="$1" version="$2" name="$3" what="$4" key bin builder
  key="$(sha256sum "$manifest" | cut -c1-16)"
  bin="$cache/$key/$name"
  # The trace backend's builder stays where earlier runs cached it.
  builder="$cache/bin/builder"
  [ "$version" = v0.161.0 ] || builder="$cache/bin-$version/builder"
  if [ ! -x "$bin" ]; then
    log "building the OpenTelemetry Collector (ocb $version: $what) into $cache/$key"
    mkdir -p "$cache/$key"
    [ -x "$builder" ] || GOBIN="$(dirname "$builder")" go install "go.opentelemetry.io/collector/cmd/builder@$version"
    cp "$manifest" "$cache/$key/builder.yaml"
    (cd "$cache/$key" && CGO_ENABLED=0 "$builder" --config builder.yaml --ldflags="-s -w" >build.log 2>&1) \
      || { tail -40 "$cache/$key/build.log" >&2; exit 1; }
    mv "$cache/$key/build/$name" "$bin"
    rm -rf "$cache/$key/build"
  fi
  echo "$bin"
}

build() { ocb_build "$ROOT/tests/otelcol/builder.yaml" v0.161.0 quiver-otelcol "otlpreceiver + fileexporter"; }
build_agent() {
  ocb_build "$ROOT/deploy/otelcol/builder.yaml" v0.149.0 quiver-otelcol-agent \
    "filelog, k8sattributes, filter, transform, routing, otlphttp, file_storage"
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
  build-agent) build_agent ;;
  start) start "${2:?usage: otelcol.sh start DIR [OUT]}" "${3:-}" ;;
  *) echo "usage: $0 build | build-agent | start DIR [OUT]" >&2; exit 2 ;;
esac
