#!/usr/bin/env bash
# Builds kubectl-quiver, the `kubectl quiver` plugin, as one static binary (release profile,
# glibc linked statically: no musl target here) and prints its path. It shares the target
# directory and flags of the operator image's build (scripts/images.sh), so after an image
# build only the plugin's own code is compiled and linked.
# Usage: scripts/plugin.sh [DEST_DIR]   (default ~/.cache/quiver/plugin/bin)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

dest="${1:-$QUIVER_CACHE/plugin/bin}"
dir="$QUIVER_CACHE/target-images"
mkdir -p "$dest"
log "kubectl-quiver release build (static)"
CARGO_TARGET_DIR="$dir" RUSTFLAGS="$IMAGE_RUSTFLAGS" \
  cargo build --release --locked --target "$IMAGE_TRIPLE" -p quiver-operator --bin kubectl-quiver
cp "$dir/$IMAGE_TRIPLE/release/kubectl-quiver" "$dest/"
strip --strip-debug "$dest/kubectl-quiver"
if readelf -d "$dest/kubectl-quiver" | grep -q NEEDED; then
  echo "kubectl-quiver links shared libraries: not a static binary" >&2
  exit 1
fi
echo "$dest/kubectl-quiver"
