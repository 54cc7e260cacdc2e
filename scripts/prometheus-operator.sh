#!/usr/bin/env bash
# The real prometheus-operator (what kube-prometheus-stack runs), built from its Go module
# and cached under ~/.cache/quiver/prometheus-operator/VERSION; a warm run does nothing.
# Its go.mod replaces its own API and client modules with local directories, so
# `go install module@version` refuses it: a small wrapper module requires it (and those two
# modules at the same version) and builds cmd/operator, as scripts/k8s-binaries.sh does for
# Kubernetes.
#
#   scripts/prometheus-operator.sh        prints two lines: the operator binary, and the
#                                         directory of its monitoring.coreos.com CRDs (in
#                                         the module source, Go module cache)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# The newest release the Go module proxy serves here (later ones answer 403).
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.90.1}"
MOD=github.com/prometheus-operator/prometheus-operator
dir="$QUIVER_CACHE/prometheus-operator/$PROMETHEUS_OPERATOR_VERSION"
bin="$dir/bin/prometheus-operator"

if [ ! -x "$bin" ]; then
  log "building prometheus-operator $PROMETHEUS_OPERATOR_VERSION from its Go module (once; cached in $dir)"
  mkdir -p "$dir/src" "$dir/bin"
  cat > "$dir/src/go.mod" <<MOD
module quiver.dev/promopbuild

go 1.25.0

require (
	$MOD $PROMETHEUS_OPERATOR_VERSION
	$MOD/pkg/apis/monitoring $PROMETHEUS_OPERATOR_VERSION
	$MOD/pkg/client $PROMETHEUS_OPERATOR_VERSION
)
MOD
  (cd "$dir/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}" \
    -o "$bin" "$MOD/cmd/operator")
fi

crds="$(cd "$dir/src" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$MOD")/example/prometheus-operator-crd"
[ -f "$crds/monitoring.coreos.com_servicemonitors.yaml" ] \
  || { echo "no ServiceMonitor CRD under $crds" >&2; exit 1; }
echo "$bin"
echo "$crds"
