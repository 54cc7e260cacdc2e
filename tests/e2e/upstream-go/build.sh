#!/usr/bin/env bash
# Builds go-mcp (main.go here, on the official MCP Go SDK) as a static binary and the
# image quiver-e2e/go-mcp:dev: FROM scratch, the binary at /usr/local/bin/go-mcp as the
# entrypoint, user 65532. No pulls (the classic builder, like scripts/images.sh). The
# binary and the build context live in ~/.cache/quiver/upstream-go; Go's module and build
# caches are Go's defaults (outside the clone), as in scripts/k8s-binaries.sh. Starts
# dockerd when none answers (deploy/kind/dockerd.sh). Idempotent; prints the image name.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../../../scripts/lib.sh"

IMAGE="${GO_MCP_IMAGE:-quiver-e2e/go-mcp:dev}"
DOCKER="${DOCKER:-docker}"
out="$QUIVER_CACHE/upstream-go"
ctx="$out/ctx"
mkdir -p "$out"

log "building go-mcp (static, CGO_ENABLED=0)"
(cd "$here" && GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$out/go-mcp" .)
if readelf -d "$out/go-mcp" 2>/dev/null | grep -q NEEDED; then
  echo "go-mcp links shared libraries: not fit for a scratch image" >&2
  exit 1
fi

"$ROOT/deploy/kind/dockerd.sh"
rm -rf "$ctx" && mkdir -p "$ctx/rootfs/usr/local/bin"
cp "$out/go-mcp" "$ctx/rootfs/usr/local/bin/go-mcp"
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs /
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/go-mcp"]
DOCKERFILE
log "building image $IMAGE"
quiet_build "$IMAGE" "$ctx"
echo "$IMAGE"
