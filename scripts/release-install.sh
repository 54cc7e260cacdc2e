#!/usr/bin/env bash
# The install path of docs/install.md on a kind cluster whose nodes pull from a local
# registry (deploy/kind/registry.sh), with no `kind load`:
#   scripts/release-install.sh REGISTRY_HOST VERSION [NEXT_VERSION]
# publishes release VERSION (and NEXT_VERSION, for the upgrade test) to
# REGISTRY_HOST/quiver with scripts/release.sh, signed with a key pair made for this
# cluster, then runs the blocks of docs/install.md marked `tested: verify` and
# `tested: install` exactly as written (REGISTRY, VERSION and cosign.pub as the page sets
# them up). Run by scripts/up.sh with QUIVER_INSTALL=registry; KUBECONFIG, PATH (helm,
# kubectl) and QUIVER_CLUSTER come from it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$ROOT/scripts/release-tools.sh"
cd "$ROOT"

host="$1" version="$2" next="${3:-}"
: "${QUIVER_CLUSTER:?QUIVER_CLUSTER must name the kind cluster}"
# The registry speaks plain HTTP on 127.0.0.1 (deploy/kind/registry.sh says why).
export QUIVER_PLAIN_HTTP=1
# The kind nodes are amd64: the e2e releases are amd64 only, which spares the test command a
# second fat-LTO build; scripts/release-it.sh releases both platforms.
export QUIVER_RELEASE_PLATFORMS="${QUIVER_RELEASE_PLATFORMS:-linux/amd64}"
export HELM_CONFIG_HOME="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm/config" \
  HELM_CACHE_HOME="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm/cache" \
  HELM_DATA_HOME="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm/data"
release_tools
export PATH="$(dirname "$COSIGN"):$PATH"

keys="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-cosign"
# The page lists an image's platforms with oras: its commands get one that speaks plain HTTP
# (release-tools.sh; scripts/e2e.sh puts it on the PATH of tests/e2e/test_upgrade.py too).
oras_plain_http "$keys/bin"
export PATH="$keys/bin:$PATH"
if [ ! -f "$keys/cosign.key" ]; then
  mkdir -p "$keys"
  (cd "$keys" && COSIGN_PASSWORD=quiver-test cosign generate-key-pair >/dev/null 2>&1)
fi
export COSIGN_KEY="$keys/cosign.key" COSIGN_PASSWORD=quiver-test

for v in "$version" $next; do
  log "make release VERSION=$v REGISTRY=$host/quiver"
  scripts/release.sh "$v" "$host/quiver" >/dev/null
done
# Reproducible: the same tree published again gives the same image digests.
first="$(grep '/quiver-[a-z]*:' "$QUIVER_CACHE/release/$version/release.txt")"
log "make release VERSION=$version again: the image digests must not change"
scripts/release.sh "$version" "$host/quiver" >/dev/null
again="$(grep '/quiver-[a-z]*:' "$QUIVER_CACHE/release/$version/release.txt")"
[ "$first" = "$again" ] || { printf 'image digests changed between two builds of one tree:\n%s\n%s\n' "$first" "$again" >&2; exit 1; }
echo "reproducible: $(echo $first)"

export REGISTRY="$host/quiver" VERSION="$version"
log "docs/install.md: verify the signatures and the SBOMs"
# cosign verify also tries to refresh Sigstore's public trust root from the internet (and
# goes on without it for a key-based check): send such attempts to a closed port on
# 127.0.0.1 so that no test traffic leaves the machine. The registry itself is loopback,
# which Go never proxies.
(cd "$keys" && HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY=127.0.0.1,localhost bash -euo pipefail -c "$(python3 "$ROOT/scripts/doc-block.py" "$ROOT/docs/install.md" verify)")
log "docs/install.md: helm install from oci://$REGISTRY/charts/quiver"
bash -euo pipefail -c "$(python3 scripts/doc-block.py docs/install.md install)"
