#!/usr/bin/env bash
# Builds kubectl-quiver, the `kubectl quiver` plugin, as one static binary (profile
# release-control, as the operator; glibc linked statically: no musl target here) and
# prints its path. It shares the target directory and flags of the operator image's build
# (scripts/images.sh), so after an image build only the plugin's own code is compiled and
# linked.
# Usage: scripts/plugin.sh [DEST_DIR]   (default ~/.cache/quiver/plugin/bin)
# QUIVER_PLATFORM=linux/arm64: the arm64 plugin, cross-built as scripts/images.sh builds the
# arm64 operator (default DEST_DIR ~/.cache/quiver/plugin/bin-arm64).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

platform="${QUIVER_PLATFORM:-linux/amd64}"
triple="$(platform_triple "$platform")"
cross_toolchain "$triple"
if [ "$triple" = "$IMAGE_TRIPLE" ]; then
  dest="${1:-$QUIVER_CACHE/plugin/bin}" dir="$QUIVER_CACHE/target-images"
else
  dest="${1:-$QUIVER_CACHE/plugin/bin-${platform#linux/}}" dir="$QUIVER_CACHE/target-images-${platform#linux/}"
fi
mkdir -p "$dest"
log "kubectl-quiver release build for $platform (static)"
CARGO_TARGET_DIR="$dir" RUSTFLAGS="$IMAGE_RUSTFLAGS" \
  cargo build --profile release-control --locked --target "$triple" -p quiver-operator --bin kubectl-quiver
cp "$dir/$triple/release-control/kubectl-quiver" "$dest/"
"$STRIP" --strip-debug "$dest/kubectl-quiver"
check_static "$dest/kubectl-quiver" "$triple"
echo "$dest/kubectl-quiver"
