#!/usr/bin/env bash
# The real prometheus-operator (what kube-prometheus-stack runs) and its config reloader,
# built from their Go module and cached under ~/.cache/quiver/prometheus-operator/VERSION; a
# warm run does nothing. Its go.mod replaces its own API and client modules with local
# directories, so `go install module@version` refuses it: a small wrapper module requires it
# (and those two modules at the same version) and builds cmd/operator and
# cmd/prometheus-config-reloader, as scripts/k8s-binaries.sh does for Kubernetes.
# With --prometheus, also the Prometheus server this operator release is built against
# (github.com/prometheus/prometheus v0.3XY.Z is Prometheus v3.XY.Z), in the same wrapper
# module, with Kubernetes service discovery only (Prometheus's remove_all_sd and
# enable_kubernetes_sd build tags; the other mechanisms' SDKs would double the build).
#
#   scripts/prometheus-operator.sh        prints three lines: the operator binary, the
#                                         directory of its monitoring.coreos.com CRDs (in
#                                         the module source, Go module cache), and the
#                                         config reloader binary
#   scripts/prometheus-operator.sh --prometheus
#                                         and two more: the Prometheus binary and its
#                                         version (v3.XY.Z)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# The newest release the Go module proxy serves here (later ones answer 403).
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.90.1}"
MOD=github.com/prometheus-operator/prometheus-operator
dir="$QUIVER_CACHE/prometheus-operator/$PROMETHEUS_OPERATOR_VERSION"
bin="$dir/bin/prometheus-operator"
reloader="$dir/bin/prometheus-config-reloader"
ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}"

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
    -ldflags "$ldflags" -o "$bin" "$MOD/cmd/operator")
fi
if [ ! -x "$reloader" ]; then
  log "building prometheus-config-reloader $PROMETHEUS_OPERATOR_VERSION (once; cached in $dir)"
  (cd "$dir/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath \
    -ldflags "$ldflags" -o "$reloader" "$MOD/cmd/prometheus-config-reloader")
fi

crds="$(cd "$dir/src" && GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' "$MOD")/example/prometheus-operator-crd"
[ -f "$crds/monitoring.coreos.com_servicemonitors.yaml" ] \
  || { echo "no ServiceMonitor CRD under $crds" >&2; exit 1; }
echo "$bin"
echo "$crds"
echo "$reloader"
[ "${1:-}" = --prometheus ] || exit 0

PROM=github.com/prometheus/prometheus
prom_mod="$(cd "$dir/src" && GOFLAGS=-mod=mod go list -m -f '{{.Version}}' "$PROM")"
# v0.310.0 -> v3.10.0
prom_version="$(sed -E 's/^v0\.([0-9])([0-9]{2})\.([0-9]+)$/v\1.\2.\3/; s/\.0([0-9])\./.\1./' <<<"$prom_mod")"
[[ "$prom_version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "cannot read a Prometheus version from $PROM $prom_mod" >&2; exit 1; }
prom="$dir/bin/prometheus-$prom_version"
if [ ! -x "$prom" ]; then
  log "building Prometheus $prom_version ($PROM $prom_mod) with Kubernetes service discovery (once; cached in $dir)"
  (cd "$dir/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=${prom_version#v}" \
    -o "$prom" "$PROM/cmd/prometheus")
fi
echo "$prom"
echo "$prom_version"
