# The tools of a release (sourced by scripts/release.sh and the tests), each built once from
# its registry into ~/.cache/quiver/release-tools/NAME-VERSION and then reused:
#   cosign           signs images, SBOM attestations and the chart   (Go module, sigstore)
#   oras             pushes the OCI image layouts, resolves digests  (Go module, oras.land)
#   cargo-cyclonedx  the CycloneDX SBOM of each binary's crates      (crates.io)
#   registry         the CNCF distribution registry for the tests    (Go module; in ~/.cache/quiver/registry)
# Cold build times on this 2-core machine are in docs/contributing.md.
COSIGN_VERSION=v2.6.5
ORAS_VERSION=v1.3.6
CYCLONEDX_VERSION=0.5.9
REGISTRY_VERSION=v3.0.0
RELEASE_TOOLS="$QUIVER_CACHE/release-tools"

# go_tool NAME MODULE/cmd/PATH VERSION [DIR]: a static build of a Go command; prints its path.
go_tool() {
  local name="$1" pkg="$2" version="$3" dir="${4:-$RELEASE_TOOLS/$1-$3}"
  if [ ! -x "$dir/$name" ]; then
    log "building $name $version from its Go module (once; cached in $dir)"
    GOBIN="$dir" CGO_ENABLED=0 GOFLAGS=-trimpath go install "$pkg@$version" >&2
  fi
  echo "$dir/$name"
}

# release_tools: sets COSIGN, ORAS, CARGO_CYCLONEDX and REGISTRY_BIN.
release_tools() {
  COSIGN="$(go_tool cosign github.com/sigstore/cosign/v2/cmd/cosign "$COSIGN_VERSION")"
  ORAS="$(go_tool oras oras.land/oras/cmd/oras "$ORAS_VERSION")"
  REGISTRY_BIN="$(go_tool registry github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_VERSION" \
    "$QUIVER_CACHE/registry/$REGISTRY_VERSION")"
  local root="$RELEASE_TOOLS/cargo-cyclonedx-$CYCLONEDX_VERSION"
  CARGO_CYCLONEDX="$root/bin/cargo-cyclonedx"
  if [ ! -x "$CARGO_CYCLONEDX" ]; then
    log "building cargo-cyclonedx $CYCLONEDX_VERSION from crates.io (once; cached in $root)"
    CARGO_TARGET_DIR="$RELEASE_TOOLS/cargo-target" cargo install --locked --quiet \
      --root "$root" cargo-cyclonedx --version "$CYCLONEDX_VERSION" >&2
    rm -rf "$RELEASE_TOOLS/cargo-target"
  fi
  export COSIGN ORAS CARGO_CYCLONEDX REGISTRY_BIN
}

# oras_plain_http DIR: writes DIR/oras, the release's oras always given --plain-http, for the
# docs' commands run as written against the tests' registries on 127.0.0.1 (oras assumes
# plain HTTP only for a registry named localhost; cosign, helm and docker do for loopback).
oras_plain_http() {
  mkdir -p "$1"
  printf '#!/bin/sh\nexec %q "$@" --plain-http\n' "$ORAS" > "$1/oras"
  chmod +x "$1/oras"
}
