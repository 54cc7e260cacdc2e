#!/usr/bin/env bash
# make pgo: regenerates the PGO profile of quiver-server, deploy/images/pgo/quiver-server.profdata,
# which scripts/images.sh (and deploy/images/Dockerfile) build the image's binary with.
#   1. an instrumented build (-Cprofile-generate), with the image build's exact settings
#      (release profile: fat LTO, one codegen unit; static glibc; same target triple);
#   2. bench/pgo_workload.py drives it through the real HTTP path: every handler kind,
#      every method, sessionful and stateless, error paths, admin endpoints, a reload every
#      200 ms;
#   3. llvm-profdata-22 merges the raw profiles (Debian's llvm-22: the LLVM major version
#      of rustc 1.95; installed when missing).
# Commit the new profile with the change that needed it. A stale profile never breaks the
# build: functions whose code changed since are just built without profile data.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

SECONDS_OF_TRAINING="${QUIVER_PGO_SECONDS:-30}"
profdata_tool=llvm-profdata-22
command -v "$profdata_tool" >/dev/null || { log "installing llvm-22 (Debian) for $profdata_tool"; apt_install llvm-22; }

raw="$QUIVER_CACHE/pgo/raw"
rm -rf "$raw" && mkdir -p "$raw"
export CARGO_TARGET_DIR="$QUIVER_CACHE/target-pgo-generate"
log "instrumented release build of quiver-server (-Cprofile-generate)"
RUSTFLAGS="$IMAGE_RUSTFLAGS -Cprofile-generate=$raw" \
  cargo build --release --locked --target "$IMAGE_TRIPLE" -p quiver-server --bin quiver-server

log "training run: bench/pgo_workload.py for ${SECONDS_OF_TRAINING} s"
python3 bench/pgo_workload.py --quiver "$CARGO_TARGET_DIR/$IMAGE_TRIPLE/release/quiver-server" --seconds "$SECONDS_OF_TRAINING"
ls "$raw"/*.profraw >/dev/null 2>&1 || { echo "the training run wrote no profile into $raw" >&2; exit 1; }

mkdir -p "$(dirname "$PGO_PROFILE")"
# --sparse: only functions that ran (a tenth of the size; the rest carry no information).
"$profdata_tool" merge --sparse --output "$PGO_PROFILE" "$raw"/*.profraw
log "wrote $PGO_PROFILE ($(du -h "$PGO_PROFILE" | cut -f1)): $("$profdata_tool" show "$PGO_PROFILE" | grep -m1 'Total functions')"
