#!/usr/bin/env bash
# The end-to-end suite on a real kind cluster (tests/e2e): brings the system up with
# scripts/up.sh on a cluster of its own (quiver-e2e, so a `make up` cluster is left alone),
# runs the suite with the official MCP Python SDK, and deletes the cluster afterwards
# (QUIVER_KEEP_CLUSTER=1 keeps it). A machine where dockerd cannot start fails here: the
# suite never skips.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
export QUIVER_CLUSTER="${QUIVER_E2E_CLUSTER:-quiver-e2e}"

cleanup() {
  [ "${QUIVER_KEEP_CLUSTER:-0}" = 1 ] || "$ROOT/scripts/down.sh" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# Start from a new cluster (one left by an interrupted run is not trusted), unless asked to
# keep it between runs while iterating.
[ "${QUIVER_KEEP_CLUSTER:-0}" = 1 ] || "$ROOT/scripts/down.sh" >/dev/null
"$ROOT/scripts/up.sh"
export PATH="$QUIVER_CACHE/k8s/v${K8S_VERSION:-1.33.13}/bin:$PATH"
kind_env
python_env
# kubectl finds the plugin on PATH as kubectl-quiver (tests/e2e/test_plugin.py).
plugin="$("$ROOT/scripts/plugin.sh" | tail -n 1)"
export PATH="$(dirname "$plugin"):$PATH"
log "upstream MCP server image for the suite (tests/e2e/upstream-go, official Go SDK)"
go_image="$("$ROOT/tests/e2e/upstream-go/build.sh" | tail -n 1)"
kind load docker-image --name "$QUIVER_CLUSTER" "$go_image"
log "e2e suite on kind cluster $QUIVER_CLUSTER"
"$PY" -m pytest -q -s -p no:cacheprovider tests/e2e "$@"
