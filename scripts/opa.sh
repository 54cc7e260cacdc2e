#!/usr/bin/env bash
# Open Policy Agent for the guardrail webhook tests (server/tests/webhooks.rs), built from its
# Go module (github.com/open-policy-agent/opa) into ~/.cache/quiver/opa/VERSION; nothing is
# installed system-wide. Prints the binary's path. Cold: about 80 s on two cores (module
# download and build); warm: instant.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version=v1.22.4
dir="$QUIVER_CACHE/opa/$version"
bin="$dir/opa"
if [ ! -x "$bin" ]; then
  log "building Open Policy Agent $version from its Go module into $dir"
  mkdir -p "$dir.tmp"
  CGO_ENABLED=0 GOBIN="$dir.tmp" go install -ldflags="-s -w" "github.com/open-policy-agent/opa@$version" >&2
  "$dir.tmp/opa" version >/dev/null
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
fi
echo "$bin"
