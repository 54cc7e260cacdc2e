#!/usr/bin/env bash
# Builds the Quiver images without pulling anything: static release binaries (glibc
# crt-static; the server with fat LTO and PGO, see scripts/pgo.sh; the operator with the
# profile release-control, thin LTO) in FROM-scratch images laid out by
# deploy/images/layout.sh, the same layout deploy/images/Dockerfile produces where a
# registry is reachable.
#   quiver-server:$TAG    /usr/local/bin/quiver-server (jemalloc; QUIVER_ALLOCATOR=system for the system allocator)
#   quiver-operator:$TAG  /usr/local/bin/quiver-operator
# Cargo output is cached in ~/.cache/quiver/target-images* so a warm run only relinks what
# changed. Prints the two image names (with --binaries: only builds the binaries).
# QUIVER_PLATFORM=linux/arm64 (with --binaries only): the binaries for arm64, cross-built
# (lib.sh's cross_toolchain) without PGO, whose profile is trained on amd64; in
# ~/.cache/quiver/target-images-arm64, copied to ~/.cache/quiver/images/bin-arm64.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

TAG="${QUIVER_IMAGE_TAG:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/quiver/Chart.yaml)}"
DOCKER="${DOCKER:-docker}"
platform="${QUIVER_PLATFORM:-linux/amd64}"
triple="$(platform_triple "$platform")"
cross_toolchain "$triple"
if [ "$triple" = "$IMAGE_TRIPLE" ]; then
  bins="$QUIVER_CACHE/images/bin" server_dir="$QUIVER_CACHE/target-images-server" operator_dir="$QUIVER_CACHE/target-images"
else
  [ "${1:-}" = --binaries ] || { echo "$platform: only --binaries (scripts/release.sh makes its images)" >&2; exit 2; }
  # No PGO here, so one target directory serves both binaries (same flags).
  bins="$QUIVER_CACHE/images/bin-${platform#linux/}" server_dir="$QUIVER_CACHE/target-images-${platform#linux/}"
  operator_dir="$server_dir"
fi
bins="${QUIVER_IMAGE_BINS:-$bins}"   # QUIVER_IMAGE_BINS: where the stripped binaries go
mkdir -p "$bins" "$QUIVER_CACHE/images"

# release_build TARGET_DIR RUSTFLAGS PACKAGE [PROFILE]: a static build of one binary with
# PROFILE (default release), copied to $bins. Each flag set has its own target directory:
# sharing one would rebuild every dependency whenever the other binary is built.
release_build() {
  local dir="$1" flags="$2" pkg="$3" profile="${4:-release}"
  CARGO_TARGET_DIR="$dir" RUSTFLAGS="$flags" cargo build --profile "$profile" --locked --target "$triple" -p "$pkg" --bin "$pkg"
  cp "$dir/$triple/$profile/$pkg" "$bins/"
}

# quiver-server with PGO (scripts/pgo.sh makes the profile; QUIVER_PGO=0 builds without).
# Functions changed since the profile was made are built without profile data, silently
# (-no-pgo-warn-mismatch); a profile this rustc cannot read at all is reported and the
# build is done again without it, so a stale profile never fails the image.
# The profile is used from a copy named by its content: the flags (and so Cargo's cache)
# change exactly when the profile does, wherever the clone is.
server_flags="$IMAGE_RUSTFLAGS"
if [ "${QUIVER_PGO:-1}" != 0 ] && [ -f "$PGO_PROFILE" ] && [ "$triple" = "$IMAGE_TRIPLE" ]; then
  profile="$QUIVER_CACHE/pgo/quiver-server-$(sha256sum "$PGO_PROFILE" | cut -c1-16).profdata"
  [ -f "$profile" ] || { mkdir -p "$(dirname "$profile")" && cp "$PGO_PROFILE" "$profile"; }
  server_flags="$IMAGE_RUSTFLAGS -Cprofile-use=$profile -Cllvm-args=-no-pgo-warn-mismatch"
fi
pgo_note=""
pgo="none"
[ "$server_flags" = "$IMAGE_RUSTFLAGS" ] || { pgo_note=", PGO"; pgo="profile sha256 $(sha256sum "$PGO_PROFILE" | cut -c1-16)"; }
log "quiver-server release build for $platform (fat LTO, static$pgo_note)"
server_log="$QUIVER_CACHE/images/server-build-${platform#linux/}.log"
if ! release_build "$server_dir" "$server_flags" quiver-server 2> >(tee "$server_log" >&2); then
  if [ "$server_flags" != "$IMAGE_RUSTFLAGS" ] && grep -qiE 'profile|pgo' "$server_log"; then
    log "the PGO profile could not be used (see above): building quiver-server without it"
    release_build "$QUIVER_CACHE/target-images-server-nopgo" "$IMAGE_RUSTFLAGS" quiver-server
    pgo="none (the profile could not be used)"
  else
    exit 1
  fi
fi
# How the server binary was built, beside it: the per-request cost guard (bench/guard.py)
# compares it with its baseline's, since the PGO profile alone moves the instruction count.
printf '{"pgo": "%s"}\n' "$pgo" > "$bins/quiver-server.build.json"
log "quiver-operator release build for $platform (profile release-control: thin LTO, static)"
release_build "$operator_dir" "$IMAGE_RUSTFLAGS" quiver-operator release-control
for b in quiver-server quiver-operator; do
  "$STRIP" --strip-debug "$bins/$b"   # keep the symbol table (backtraces), drop the line tables
  check_static "$bins/$b" "$triple"
done
# --binaries: stop here and print the directory holding the two binaries (scripts/release.sh
# lays out its own images from them).
if [ "${1:-}" = --binaries ]; then echo "$bins"; exit 0; fi

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
