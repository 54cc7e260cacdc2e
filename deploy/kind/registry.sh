#!/usr/bin/env bash
# A real OCI registry for a kind cluster, so that its nodes pull images the way a cluster's
# nodes pull from any registry (no `kind load`):
#   deploy/kind/registry.sh up CLUSTER     start (or keep) it; prints host:port
#   deploy/kind/registry.sh connect CLUSTER  attach it to the kind network (after the cluster exists)
#   deploy/kind/registry.sh down CLUSTER   remove it (and its storage)
# The registry is the CNCF distribution registry (built from its Go module by
# scripts/release-tools.sh), in a FROM-scratch container named CLUSTER-registry, listening
# on port 5000 of the docker network "kind" and published on 127.0.0.1 of the host only.
# From the host (pushes, helm, cosign) it is 127.0.0.1:PORT; in the nodes containerd maps
# that same name to https://CLUSTER-registry:5000 through the hosts.toml written to
# $QUIVER_CACHE/kind/CLUSTER-certs.d, which deploy/kind/cluster.yaml mounts at
# /etc/containerd/certs.d on every node. So an image reference means the same thing to
# both, as a registry's name does on a real cluster.
# It serves TLS with a certificate of a CA made for it (valid for 127.0.0.1 and the
# container's name), so helm, oras and cosign run exactly as against any registry, with
# no --plain-http: point SSL_CERT_FILE at $QUIVER_CACHE/kind/CLUSTER-registry-tls/bundle.crt
# (the system's CAs and this one; Go programs read it).
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
source "$ROOT/scripts/release-tools.sh"

cmd="${1:?usage: registry.sh up|connect|down CLUSTER}" cluster="${2:?usage: registry.sh up|connect|down CLUSTER}"
name="$cluster-registry"
certs="$QUIVER_CACHE/kind/$cluster-certs.d"
tls="$QUIVER_CACHE/kind/$cluster-registry-tls"
DOCKER="${DOCKER:-docker}"

port_of() { "$DOCKER" port "$name" 5000/tcp 2>/dev/null | sed -n 's/^127\.0\.0\.1:\([0-9]*\)$/\1/p' | head -1; }

case "$cmd" in
up)
  if [ -z "$("$DOCKER" ps -q --filter "name=^$name\$")" ]; then
    "$DOCKER" rm -f "$name" >/dev/null 2>&1 || true
    bin="$(go_tool registry github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_VERSION" "$QUIVER_CACHE/registry/$REGISTRY_VERSION")"
    image="quiver.dev/registry:$REGISTRY_VERSION-tls"
    if ! "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
      ctx="$(mktemp -d)"
      cp "$bin" "$ctx/registry"
      cat > "$ctx/config.yml" <<'YAML'
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: /var/lib/registry}, delete: {enabled: true}}
http: {addr: ":5000", tls: {certificate: /certs/tls.crt, key: /certs/tls.key}}
YAML
      printf 'FROM scratch\nCOPY registry /bin/registry\nCOPY config.yml /etc/distribution/config.yml\nEXPOSE 5000\nENTRYPOINT ["/bin/registry", "serve", "/etc/distribution/config.yml"]\n' > "$ctx/Dockerfile"
      quiet_build "$image" "$ctx"
      rm -rf "$ctx"
    fi
    # A fixed port per cluster would collide between clusters; the free one is kept for
    # the container's life (and so for the cluster's, whose nodes name it).
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    # A CA of its own and a server certificate for both of the registry's names.
    rm -rf "$tls" && mkdir -p "$tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
      -subj "/CN=quiver test registry CA" -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
      -keyout "$tls/tls.key" -out "$tls/tls.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:%s,DNS:localhost\nextendedKeyUsage=serverAuth\n' "$name" > "$tls/ext"
    openssl x509 -req -in "$tls/tls.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
      -days 30 -extfile "$tls/ext" -out "$tls/tls.crt" 2>/dev/null
    chmod 0644 "$tls/tls.key"
    cat /etc/ssl/certs/ca-certificates.crt "$tls/ca.crt" > "$tls/bundle.crt"
    "$DOCKER" run -d --name "$name" --restart unless-stopped -p "127.0.0.1:$port:5000" \
      -v "$tls:/certs:ro" "$image" >/dev/null
  fi
  port="$(port_of)"
  [ -n "$port" ] || { echo "registry container $name publishes no port on 127.0.0.1" >&2; exit 1; }
  for _ in $(seq 1 100); do curl -fsS --cacert "$tls/ca.crt" "https://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS --cacert "$tls/ca.crt" "https://127.0.0.1:$port/v2/" >/dev/null || { "$DOCKER" logs "$name" >&2; exit 1; }
  # The directory itself is bind-mounted into the nodes of a running cluster: keep it, renew its contents.
  mkdir -p "$certs" && find "$certs" -mindepth 1 -delete && mkdir -p "$certs/127.0.0.1:$port"
  cp "$tls/ca.crt" "$certs/127.0.0.1:$port/ca.crt"
  cat > "$certs/127.0.0.1:$port/hosts.toml" <<TOML
# 127.0.0.1:$port is the registry's name on the host; the nodes reach it by its container name.
server = "https://127.0.0.1:$port"
[host."https://$name:5000"]
  capabilities = ["pull", "resolve"]
  ca = "/etc/containerd/certs.d/127.0.0.1:$port/ca.crt"
TOML
  echo "127.0.0.1:$port"
  ;;
connect)
  "$DOCKER" network inspect kind -f '{{range .Containers}}{{.Name}} {{end}}' | tr ' ' '\n' | grep -qx "$name" \
    || "$DOCKER" network connect kind "$name"
  ;;
down)
  "$DOCKER" rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$certs" "$tls"
  ;;
*) echo "usage: registry.sh up|connect|down CLUSTER" >&2; exit 2 ;;
esac
