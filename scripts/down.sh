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
