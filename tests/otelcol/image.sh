#!/usr/bin/env bash
# The test trace backend as an image for kind: quiver-e2e/otelcol:dev, FROM scratch, the
# collector of builder.yaml (scripts/otelcol.sh build) with a config that receives OTLP/HTTP
# on :4318 and writes every batch of spans as one JSON line to its stdout, so a test reads
# what it received with `kubectl logs`. No pulls (the classic builder, like
# tests/e2e/upstream-go/build.sh). Idempotent; prints the image name.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../../scripts/lib.sh"

IMAGE="${OTELCOL_IMAGE:-quiver-e2e/otelcol:dev}"
bin="$("$ROOT/scripts/otelcol.sh" build)"
ctx="$QUIVER_CACHE/otelcol/image-ctx"
"$ROOT/deploy/kind/dockerd.sh"
rm -rf "$ctx" && mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/etc/otelcol"
cp "$bin" "$ctx/rootfs/usr/local/bin/otelcol"
cat > "$ctx/rootfs/etc/otelcol/config.yaml" <<'YAML'
receivers:
  otlp:
    protocols:
      http: {endpoint: "0.0.0.0:4318"}
exporters:
  file:
    path: /dev/stdout
    flush_interval: 100ms
service:
  telemetry:
    metrics: {level: none}
    logs: {level: warn}
  pipelines:
    traces: {receivers: [otlp], exporters: [file]}
YAML
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs /
USER 65532:65532
EXPOSE 4318
ENTRYPOINT ["/usr/local/bin/otelcol", "--config", "file:/etc/otelcol/config.yaml"]
DOCKERFILE
log "building image $IMAGE"
quiet_build "$IMAGE" "$ctx"
echo "$IMAGE"
