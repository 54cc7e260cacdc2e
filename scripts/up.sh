#!/usr/bin/env bash
# make up: the whole system on a local kind cluster, from nothing.
#   1. a Docker engine (deploy/kind/dockerd.sh starts one if none answers);
#   2. the kind node image: kindest/node where it can be pulled, else built here without a
#      registry (deploy/kind/build-node-image.sh; ~25 min cold, cached afterwards);
#   3. the cluster (deploy/kind/cluster.yaml: static CPU manager on a dedicated worker,
#      unsafe sysctls allowed), the Quiver images built and loaded (scripts/images.sh);
#   4. `helm upgrade --install` of charts/quiver, a sample McpServer, a wait for Ready, and
#      a tool call through `kubectl port-forward` with the official MCP Python client.
# Idempotent: a second run reuses the cluster and upgrades what changed.
# With QUIVER_INSTALL=registry (what scripts/e2e.sh does) step 3 and 4 are instead the path
# a user takes: a real OCI registry beside the cluster (deploy/kind/registry.sh), whose
# nodes pull from it; the release published there by `make release`, its signatures
# verified and the chart installed from oci:// exactly as docs/install.md says
# (scripts/release-install.sh). No `kind load`. The default (local) stays the fast path
# for a quick start: no release tools to build, no signing.
# Env: QUIVER_CLUSTER (default quiver), QUIVER_KIND_NODE_IMAGE (a node image to use),
#      QUIVER_INSTALL (local or registry), QUIVER_RELEASE_VERSION and QUIVER_UPGRADE_VERSION
#      (registry: the version installed, and one more published for the upgrade test).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

"$ROOT/deploy/kind/dockerd.sh"
bin="$("$ROOT/scripts/k8s-binaries.sh" --node)"
export PATH="$bin:$PATH"
kind_env

# A cluster left from before (e.g. its node containers stopped with the machine) that no
# longer answers is replaced rather than reused.
if kind get clusters 2>/dev/null | grep -qx "$QUIVER_CLUSTER" \
   && ! kubectl get --raw /readyz --request-timeout=20s >/dev/null 2>&1; then
  log "kind cluster $QUIVER_CLUSTER does not answer: recreating it"
  kind delete cluster --name "$QUIVER_CLUSTER" --kubeconfig "$KUBECONFIG"
fi
install="${QUIVER_INSTALL:-local}"
certs="$QUIVER_CACHE/kind/$QUIVER_CLUSTER-certs.d"
mkdir -p "$certs"
if [ "$install" = registry ]; then
  log "OCI registry for kind cluster $QUIVER_CLUSTER"
  registry_host="$("$ROOT/deploy/kind/registry.sh" up "$QUIVER_CLUSTER")"
fi
if ! kind get clusters 2>/dev/null | grep -qx "$QUIVER_CLUSTER"; then
  node_image="${QUIVER_KIND_NODE_IMAGE:-}"
  if [ -z "$node_image" ] && timeout 60 docker pull -q "kindest/node:v1.33.1" >/dev/null 2>&1; then
    node_image=kindest/node:v1.33.1
  fi
  if [ -z "$node_image" ]; then
    log "no kindest/node image can be pulled: building the node image here"
    node_image="$("$ROOT/deploy/kind/build-node-image.sh")"
  fi
  host_port="${QUIVER_NODEPORT_HOST_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
  config="$(mktemp)"
  sed -e "s/hostPort: 30080/hostPort: $host_port/" -e "s|hostPath: CERTS_D|hostPath: $certs|" deploy/kind/cluster.yaml > "$config"
  log "creating kind cluster $QUIVER_CLUSTER from $node_image (NodePort 30080 on 127.0.0.1:$host_port)"
  kind create cluster --name "$QUIVER_CLUSTER" --image "$node_image" --config "$config" \
    --kubeconfig "$KUBECONFIG" --wait 5m
  rm -f "$config"
fi
kubectl wait --for=condition=Ready nodes --all --timeout=300s >/dev/null
# kube-proxy on every node before anything relies on Service IPs (a connection to a Service
# IP it has no rule for yet is refused by the network daemon: deploy/kind/images/kindnet).
kubectl -n kube-system rollout status daemonset/kube-proxy --timeout=300s >/dev/null

if [ "$install" = registry ]; then
  "$ROOT/deploy/kind/registry.sh" connect "$QUIVER_CLUSTER"
  QUIVER_CLUSTER="$QUIVER_CLUSTER" "$ROOT/scripts/release-install.sh" "$registry_host" \
    "${QUIVER_RELEASE_VERSION:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' charts/quiver/Chart.yaml)}" ${QUIVER_UPGRADE_VERSION:-}
else
  log "Quiver images"
  # Each image is also tagged with its content ID, and the chart is installed with those tags:
  # after a rebuild the operator and the McpServer pods roll onto the new images.
  tags=()
  while read -r img; do
    id="$(docker image inspect -f '{{.Id}}' "$img" | sed 's/^sha256://' | cut -c1-12)"
    docker tag "$img" "$img-$id"
    tags+=("$img-$id")
  done < <("$ROOT/scripts/images.sh")
  kind load docker-image --name "$QUIVER_CLUSTER" "${tags[@]}"

  log "helm upgrade --install quiver charts/quiver"
  helm upgrade --install quiver charts/quiver -n quiver-system --create-namespace --wait --timeout 5m \
    --set image.tag="${tags[1]#*:}" --set server.image.tag="${tags[0]#*:}" >/dev/null
fi

if [ "${1:-}" = --no-demo ]; then exit 0; fi

log "sample McpServer deploy/samples/calculator.yaml in namespace quiver-demo"
kubectl create namespace quiver-demo --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl apply -n quiver-demo -f deploy/samples/calculator.yaml
wait_condition quiver-demo Ready True 300 calculator
kubectl get qmcp -n quiver-demo

log "calling a tool through kubectl port-forward"
python_env
pf_log="$(mktemp)"
kubectl port-forward -n quiver-demo svc/calculator --address 127.0.0.1 :8080 > "$pf_log" 2>&1 &
pf=$!
trap 'kill $pf 2>/dev/null || true; rm -f "$pf_log"' EXIT
port=""
for _ in $(seq 1 100); do
  port="$(sed -n 's/^Forwarding from 127.0.0.1:\([0-9]*\) .*/\1/p' "$pf_log" | head -1)"
  [ -n "$port" ] && break
  kill -0 $pf 2>/dev/null || { cat "$pf_log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "kubectl port-forward printed no port" >&2; cat "$pf_log" >&2; exit 1; }
"$PY" scripts/mcp_call.py "http://127.0.0.1:$port/mcp" add '{"a": 40, "b": 2}'

cat <<EOF

Quiver is up on kind cluster '$QUIVER_CLUSTER'.
  export KUBECONFIG=$KUBECONFIG
  kubectl get qmcp -A
  kubectl -n quiver-demo port-forward svc/calculator 8080:8080   # then MCP at http://127.0.0.1:8080/mcp
  kubectl -n quiver-demo edit qmcp calculator                    # tool edits reach the pods without a restart
Remove it with: make down
EOF
