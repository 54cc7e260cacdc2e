#!/usr/bin/env bash
# Builds the Kubernetes control-plane binaries from Go modules (no release downloads exist
# here): kube-apiserver, kube-controller-manager, kube-scheduler and kubectl at
# $K8S_VERSION, plus kwok (fake nodes); with --node also kubelet, kubeadm,
# kube-proxy and kind. Installs etcd from Debian. Cached by version under
# ~/.cache/quiver/k8s; a warm run does nothing. Also helm. Prints the bin directory.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

K8S_VERSION="${K8S_VERSION:-1.33.13}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.16.3}"
STAGING=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
  cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
  cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms
  kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
  mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller)
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
# --node: also what a kind node image holds (kubelet, kubeadm, kube-proxy) and kind itself.
KIND_VERSION="${KIND_VERSION:-v0.27.0}"
[ "${1:-}" = --node ] && BINS+=(kubelet kubeadm kube-proxy)

dir="$QUIVER_CACHE/k8s/v$K8S_VERSION"
bin="$dir/bin"
mkdir -p "$bin"

if ! command -v etcd >/dev/null 2>&1; then
  log "installing etcd (Debian etcd-server)"
  apt_install etcd-server
fi

missing=0
for b in "${BINS[@]}"; do [ -x "$bin/$b" ] || missing=1; done
if [ "$missing" = 1 ]; then
  log "building Kubernetes v$K8S_VERSION binaries from Go modules (cold: ~10 min on 2 cores)"
  src="$dir/src"
  mkdir -p "$src"
  {
    echo "module quiver.dev/k8sbuild"
    echo
    echo "go 1.24"
    echo
    echo "require k8s.io/kubernetes v$K8S_VERSION"
    echo
    echo "replace ("
    for m in "${STAGING[@]}"; do echo "	k8s.io/$m => k8s.io/$m v0.${K8S_VERSION#1.}"; done
    echo ")"
  } > "$src/go.mod"
  now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$now"
  done
  pkgs=()
  for b in "${BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/" "${pkgs[@]}")
fi

if [ ! -x "$bin/helm" ]; then
  log "building helm $HELM_VERSION"
  GOBIN="$bin" CGO_ENABLED=0 go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

if [ "${1:-}" = --node ] && [ ! -x "$bin/kind" ]; then
  log "building kind $KIND_VERSION"
  GOBIN="$bin" CGO_ENABLED=0 go install "sigs.k8s.io/kind@$KIND_VERSION"
fi

if [ ! -x "$bin/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$bin" CGO_ENABLED=0 go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
echo "$bin"
