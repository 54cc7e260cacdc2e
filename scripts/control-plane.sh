#!/usr/bin/env bash
# A real local Kubernetes control plane for integration tests: etcd + kube-apiserver (RBAC,
# CEL admission) + kube-controller-manager (garbage collection, Deployments) +
# kube-scheduler + kwok (fake nodes that turn scheduled pods Running and Ready).
#
#   scripts/control-plane.sh up DIR     start it with one kwok node (32 CPUs, 256Gi, 2000 pods);
#                                       writes DIR/kubeconfig, DIR/env, DIR/*.pid
#   scripts/control-plane.sh down DIR   stop it and remove DIR
#   scripts/control-plane.sh node NAME [CPU [MEMORY [PODS]]]
#                                       one more kwok node (default: the capacity of the first)
#                                       on the control plane of DIR/env (source it first: it sets
#                                       KUBECONFIG); waits until it is Ready and untainted, fails
#                                       after 60 s each
#
# Binaries come from scripts/k8s-binaries.sh (built from Go modules, cached).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

usage="up DIR | down DIR | node NAME [CPU [MEMORY [PODS]]]"
cmd="${1:?$usage}"

# kwok_node NAME CPU MEMORY PODS: a Node that kwok manages (its annotation selects it), then
# waits until it is Ready and the node controller has lifted its not-ready taint (pods that
# race that taint stay Pending). Fails, saying which, when either takes over 60 s.
kwok_node() {
  local name="$1" cpu="$2" mem="$3" pods="$4" deadline ready="" taints="?"
  kubectl apply -f - >/dev/null <<NODE
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations: {node.alpha.kubernetes.io/ttl: "0", kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/hostname: $name, kubernetes.io/os: linux}
status:
  allocatable: {cpu: "$cpu", memory: $mem, pods: "$pods"}
  capacity: {cpu: "$cpu", memory: $mem, pods: "$pods"}
NODE
  deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    ready="$(kubectl get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)"
    [ "$ready" = True ] && break
    sleep 0.1
  done
  if [ "$ready" != True ]; then
    [ -z "${QUIVER_CONTROL_PLANE:-}" ] || { echo "--- kwok.log (last 20 lines)" >&2; tail -20 "$QUIVER_CONTROL_PLANE/logs/kwok.log" >&2 || true; }
    echo "kwok node $name is not Ready after 60 s (Ready=${ready:-none}): is kwok running?" >&2
    return 1
  fi
  deadline=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$deadline" ]; do
    taints="$(kubectl get node "$name" -o jsonpath='{.spec.taints}' 2>/dev/null || echo '?')"
    [ -z "$taints" ] && return 0
    sleep 0.1
  done
  echo "kwok node $name is Ready but still tainted after 60 s: $taints (is kube-controller-manager running?)" >&2
  return 1
}

if [ "$cmd" = node ]; then
  name="${2:?node NAME [CPU [MEMORY [PODS]]]}"
  [ -n "${KUBECONFIG:-}" ] || { echo "node: KUBECONFIG is not set (source the control plane's DIR/env first)" >&2; exit 2; }
  kwok_node "$name" "${3:-32}" "${4:-256Gi}" "${5:-2000}"
  exit 0
fi
case "$cmd" in up|down) ;; *) echo "usage: $0 $usage" >&2; exit 2 ;; esac
dir="${2:?state directory}"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

down() {
  for p in "$dir"/*.pid; do
    [ -f "$p" ] || continue
    kill "$(cat "$p")" 2>/dev/null || true
  done
  for p in "$dir"/*.pid; do
    [ -f "$p" ] || continue
    for _ in $(seq 1 50); do kill -0 "$(cat "$p")" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$(cat "$p")" 2>/dev/null || true
  done
  rm -rf "$dir"
}

if [ "$cmd" = down ]; then down; exit 0; fi

bin="$("$ROOT/scripts/k8s-binaries.sh" | tail -1)"
mkdir -p "$dir/pki" "$dir/logs"
pki="$dir/pki"

log "certificates"
cert() { # name subject [san]
  local n="$1" subj="$2" san="${3:-}"
  openssl req -newkey rsa:2048 -nodes -keyout "$pki/$n.key" -subj "$subj" -out "$pki/$n.csr" 2>/dev/null
  if [ -n "$san" ]; then printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > "$pki/$n.ext"; else printf 'extendedKeyUsage=clientAuth\n' > "$pki/$n.ext"; fi
  openssl x509 -req -in "$pki/$n.csr" -CA "$pki/${4:-ca}.crt" -CAkey "$pki/${4:-ca}.key" -CAcreateserial -days 2 -extfile "$pki/$n.ext" -out "$pki/$n.crt" 2>/dev/null
}
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -subj "/CN=quiver-test-ca" -days 2 -out "$pki/ca.crt" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/front-proxy-ca.key" -subj "/CN=front-proxy-ca" -days 2 -out "$pki/front-proxy-ca.crt" 2>/dev/null
cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=quiver-admin"
cert front-proxy-client "/CN=front-proxy-client" "" front-proxy-ca
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null

ETCD_PORT="$(free_port)"; ETCD_PEER="$(free_port)"; API_PORT="$(free_port)"; SCHED_PORT="$(free_port)"; CM_PORT="$(free_port)"
KWOK_PORT="$(free_port)"

cat > "$dir/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$pki/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$pki/admin.crt", client-key: "$pki/admin.key"}}]
contexts: [{name: local, context: {cluster: local, user: admin, namespace: default}}]
current-context: local
KC

start() { # name args...
  local n="$1"; shift
  "$@" > "$dir/logs/$n.log" 2>&1 &
  echo $! > "$dir/$n.pid"
}

log "etcd on 127.0.0.1:$ETCD_PORT"
start etcd etcd --data-dir "$dir/etcd" --name quiver-test \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "quiver-test=http://127.0.0.1:$ETCD_PEER" --quota-backend-bytes 4294967296 --unsafe-no-fsync

log "kube-apiserver on 127.0.0.1:$API_PORT"
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$ETCD_PORT" --bind-address 127.0.0.1 --secure-port "$API_PORT" \
  --advertise-address 127.0.0.1 --endpoint-reconciler-type none \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
  --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.96.0.0/16 \
  --authorization-mode Node,RBAC --allow-privileged \
  --requestheader-client-ca-file "$pki/front-proxy-ca.crt" --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$pki/front-proxy-client.crt" --proxy-client-key-file "$pki/front-proxy-client.key"

K="$bin/kubectl --kubeconfig $dir/kubeconfig"
for i in $(seq 1 300); do
  $K get --raw /readyz >/dev/null 2>&1 && break
  kill -0 "$(cat "$dir/kube-apiserver.pid")" 2>/dev/null || { tail -30 "$dir/logs/kube-apiserver.log"; exit 1; }
  sleep 0.1
done
$K get --raw /readyz >/dev/null

log "kube-controller-manager and kube-scheduler"
# The fake node's liveness is not under test: a long grace period keeps a starved kwok
# (2 busy cores in CI) from having its node marked NotReady and its pods unready mid-test.
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$dir/kubeconfig" \
  --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$CM_PORT" --leader-elect=false --use-service-account-credentials \
  --root-ca-file "$pki/ca.crt" --service-account-private-key-file "$pki/sa.key" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --controllers '*,-nodeipam,-cloud-node-lifecycle' --concurrent-gc-syncs 10 \
  --node-monitor-grace-period 10m
start kube-scheduler "$bin/kube-scheduler" --kubeconfig "$dir/kubeconfig" \
  --authentication-kubeconfig "$dir/kubeconfig" --authorization-kubeconfig "$dir/kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false

log "kwok fake node"
stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION:-v0.8.0}/kustomize/stage"
stage_args=()
for s in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
         pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  [ -f "$stages/$s" ] || { echo "kwok stage $stages/$s missing (is kwok ${KWOK_VERSION:-v0.8.0} in the Go module cache?)" >&2; exit 1; }
  stage_args+=(--config "$stages/$s")
done
start kwok "$bin/kwok" --kubeconfig "$dir/kubeconfig" --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
  --manage-nodes-with-label-selector= --disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom \
  --cidr=10.244.0.0/16 --node-ip=127.0.0.1 --server-address "127.0.0.1:$KWOK_PORT" "${stage_args[@]}"
KUBECONFIG="$dir/kubeconfig" PATH="$bin:$PATH" QUIVER_CONTROL_PLANE="$dir" kwok_node kwok-node-0 32 256Gi 2000

cat > "$dir/env" <<ENV
export KUBECONFIG="$dir/kubeconfig"
export QUIVER_CONTROL_PLANE="$dir"
export QUIVER_TEST_CLUSTER=1
export PATH="$bin:\$PATH"
ENV
log "control plane up: KUBECONFIG=$dir/kubeconfig"
