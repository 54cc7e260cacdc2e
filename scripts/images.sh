#!/usr/bin/env bash
# Builds the Quiver images without pulling anything: static release binaries (fat LTO,
# glibc crt-static) in FROM-scratch images laid out by deploy/images/layout.sh, the same
# layout deploy/images/Dockerfile produces where a registry is reachable.
#   quiver-server:$TAG    /usr/local/bin/quiver-server (jemalloc; QUIVER_ALLOCATOR=system for the system allocator)
#   quiver-operator:$TAG  /usr/local/bin/quiver-operator
# Cargo output is cached in ~/.cache/quiver/target-images so a warm run only relinks what
# changed. Prints the two image names.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

TAG="${QUIVER_IMAGE_TAG:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/quiver/Chart.yaml)}"
DOCKER="${DOCKER:-docker}"
triple=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR="$QUIVER_CACHE/target-images"
export RUSTFLAGS="-C target-feature=+crt-static"
rel="$CARGO_TARGET_DIR/$triple/release"
bins="$QUIVER_CACHE/images/bin"
mkdir -p "$bins"

log "release builds (fat LTO, static) for the images"
cargo build --release --locked --target "$triple" -p quiver-server -p quiver-operator \
  --bin quiver-server --bin quiver-operator
cp "$rel/quiver-server" "$rel/quiver-operator" "$bins/"
for b in quiver-server quiver-operator; do
  strip --strip-debug "$bins/$b"   # keep the symbol table (backtraces), drop the line tables
  if readelf -d "$bins/$b" | grep -q NEEDED; then echo "$b links shared libraries: not fit for a scratch image" >&2; exit 1; fi
done

image() { # name entrypoint ports binaries...
  local name="$1" entry="$2" ports="$3"; shift 3
  local ctx="$QUIVER_CACHE/images/ctx-$name"
  rm -rf "$ctx" && mkdir -p "$ctx"
  deploy/images/layout.sh "$ctx/rootfs" /etc/ssl/certs/ca-certificates.crt "$@"
  cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs /
USER 65532:65532
ENV PATH=/usr/local/bin
EXPOSE $ports
ENTRYPOINT ["$entry"]
DOCKERFILE
  quiet_build "$name:$TAG" "$ctx"
  echo "$name:$TAG"
}
image quiver-server /usr/local/bin/quiver-server "8080 9090" "$bins/quiver-server"
image quiver-operator /usr/local/bin/quiver-operator "8081" "$bins/quiver-operator"
