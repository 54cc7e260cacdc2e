#!/usr/bin/env bash
# The end-to-end suite on a real kind cluster (tests/e2e): brings the system up with
# scripts/up.sh on a cluster of its own (quiver-e2e, so a `make up` cluster is left alone)
# the way a user installs it: release VERSION (the chart's appVersion) and the next patch
# version published to a real OCI registry beside the cluster, signatures verified, the
# chart installed from oci:// as docs/install.md says, every image pulled by the nodes from
# the registry (no `kind load`). Then runs the suite with the official MCP Python SDK; its
# last test upgrades to the next version under load (tests/e2e/test_upgrade.py). Deletes
# the cluster and its registry afterwards (QUIVER_KEEP_CLUSTER=1 keeps them). A machine
# where dockerd cannot start fails here: the suite never skips.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
export QUIVER_CLUSTER="${QUIVER_E2E_CLUSTER:-quiver-e2e}"

# tests/e2e/test_governance.py: Keycloak (Maven Central, on the machine's JDK) and Debian's
# redis-server, both cached under ~/.cache/quiver; the test starts them on this machine,
# listening on the kind network's gateway address.
governance_deps() {
  "$ROOT/scripts/idp.sh" install
  QUIVER_REDIS_SERVER="$("$ROOT/scripts/redis.sh")"
  export QUIVER_REDIS_SERVER
}

# tests/e2e/test_tracing.py: the test command's OpenTelemetry Collector as an image in the
# cluster (tests/otelcol/image.sh), loaded into the nodes.
otelcol_image() {
  local image
  image="$("$ROOT/tests/otelcol/image.sh" | tail -n 1)"
  kind load docker-image --name "$QUIVER_CLUSTER" "$image"
}

# tests/e2e/test_kube_prometheus_stack.py: prometheus-operator, its config reloader and
# Prometheus as images built here (tests/e2e/kube-prometheus-stack/images.sh), loaded into
# the nodes, and the operator's monitoring.coreos.com CRDs.
prometheus_stack_images() {
  local images crds
  mapfile -t images < <("$ROOT/tests/e2e/kube-prometheus-stack/images.sh")
  crds="$("$ROOT/scripts/prometheus-operator.sh" | sed -n 2p)"
  kind load docker-image --name "$QUIVER_CLUSTER" "${images[@]}"
  export QUIVER_E2E_PROMETHEUS_OPERATOR_IMAGE="${images[0]}" \
    QUIVER_E2E_PROMETHEUS_CONFIG_RELOADER_IMAGE="${images[1]}" \
    QUIVER_E2E_PROMETHEUS_IMAGE="${images[2]}" \
    QUIVER_E2E_PROMETHEUS_OPERATOR_CRDS="$crds"
}

cleanup() {
  [ "${QUIVER_KEEP_CLUSTER:-0}" = 1 ] || "$ROOT/scripts/down.sh" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# Start from a new cluster (one left by an interrupted run is not trusted), unless asked to
# keep it between runs while iterating.
[ "${QUIVER_KEEP_CLUSTER:-0}" = 1 ] || "$ROOT/scripts/down.sh" >/dev/null
# kubectl finds the plugin on PATH as kubectl-quiver (tests/e2e/test_plugin.py).
plugin="$("$ROOT/scripts/plugin.sh" | tail -n 1)"
export PATH="$(dirname "$plugin"):$PATH"
# QUIVER_E2E_INSTALL=local: the quick-start path instead (images `kind load`ed, the chart
# from the clone), without the release and upgrade tests; for finding out whether a failure
# is in the release path or elsewhere.
if [ "${QUIVER_E2E_INSTALL:-registry}" = local ]; then
  "$ROOT/scripts/up.sh"
  export PATH="$QUIVER_CACHE/k8s/v${K8S_VERSION:-1.33.13}/bin:$PATH"
  kind_env
  python_env
  go_image="$("$ROOT/tests/e2e/upstream-go/build.sh" | tail -n 1)"
  kind load docker-image --name "$QUIVER_CLUSTER" "$go_image"
  otelcol_image
  prometheus_stack_images
  governance_deps
  log "e2e suite on kind cluster $QUIVER_CLUSTER (local install)"
  "$PY" -m pytest -q -s -p no:cacheprovider --durations=20 tests/e2e --ignore tests/e2e/test_upgrade.py "$@"
  exit 0
fi
version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/quiver/Chart.yaml)"
next="$(python3 -c 'import sys; a, b, c = sys.argv[1].split("-")[0].split("."); print(f"{a}.{b}.{int(c) + 1}")' "$version")"
QUIVER_INSTALL=registry QUIVER_RELEASE_VERSION="$version" QUIVER_UPGRADE_VERSION="$next" "$ROOT/scripts/up.sh"
export PATH="$QUIVER_CACHE/k8s/v${K8S_VERSION:-1.33.13}/bin:$PATH"
kind_env
python_env
source "$ROOT/scripts/release-tools.sh"
release_tools
host="$("$ROOT/deploy/kind/registry.sh" up "$QUIVER_CLUSTER")"
# What tests/e2e/test_upgrade.py needs to upgrade as docs/install.md says.
export PATH="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-cosign/bin:$(dirname "$COSIGN"):$PATH" QUIVER_RELEASE_REGISTRY="$host/quiver" \
  QUIVER_RELEASE_VERSION="$version" QUIVER_UPGRADE_VERSION="$next" \
  QUIVER_COSIGN_PUB="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-cosign/cosign.pub" \
  HELM_CONFIG_HOME="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm/config" \
  HELM_CACHE_HOME="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm/cache" \
  HELM_DATA_HOME="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-helm/data"
log "upstream MCP server image for the suite (tests/e2e/upstream-go, official Go SDK), pushed to $host"
go_image="$("$ROOT/tests/e2e/upstream-go/build.sh" | tail -n 1)"
export QUIVER_E2E_GO_MCP_IMAGE="$host/$go_image"
docker tag "$go_image" "$QUIVER_E2E_GO_MCP_IMAGE"
docker push "$QUIVER_E2E_GO_MCP_IMAGE" >/dev/null
otelcol_image
prometheus_stack_images
governance_deps
log "e2e suite on kind cluster $QUIVER_CLUSTER"
"$PY" -m pytest -q -s -p no:cacheprovider --durations=20 tests/e2e "$@"
