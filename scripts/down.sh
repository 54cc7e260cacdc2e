#!/usr/bin/env bash
# make down: deletes the kind cluster that make up created (images stay cached).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
export PATH="$QUIVER_CACHE/k8s/v${K8S_VERSION:-1.33.13}/bin:$PATH"
kind_env
if command -v kind >/dev/null && kind get clusters 2>/dev/null | grep -qx "$QUIVER_CLUSTER"; then
  kind delete cluster --name "$QUIVER_CLUSTER" --kubeconfig "$KUBECONFIG"
else
  echo "no kind cluster named $QUIVER_CLUSTER"
fi
# The cluster's registry (deploy/kind/registry.sh), if it had one, and the key pair and helm
# state of its releases (scripts/release-install.sh).
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  "$ROOT/deploy/kind/registry.sh" down "$QUIVER_CLUSTER"
fi
rm -rf "$QUIVER_CACHE/kind/$QUIVER_CLUSTER-cosign" "$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm"
