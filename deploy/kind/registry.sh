#!/usr/bin/env bash
# A real OCI registry for a kind cluster, so that its nodes pull images the way a cluster's
# nodes pull from any registry (no `kind load`):
#   deploy/kind/registry.sh up CLUSTER     start (or keep) it; prints host:port
#   deploy/kind/registry.sh connect CLUSTER  attach it to the kind network (after the cluster exists)
#   deploy/kind/registry.sh down CLUSTER   remove it (and its storage)
# The registry is the CNCF distribution registry (built from its Go module by
# scripts/release-tools.sh), two FROM-scratch containers over one storage volume:
# CLUSTER-registry-push, published on 127.0.0.1 of the host only and on no docker network
# the cluster can reach, takes pushes; CLUSTER-registry, read-only, listens on port 5000 of
# the docker network "kind" for the nodes. So a pod (which can reach the kind network
# through its node) can pull but never replace an image the nodes will run.
# From the host (pushes, helm, cosign) it is 127.0.0.1:PORT; in the nodes containerd maps
# that same name to http://CLUSTER-registry:5000 through the hosts.toml written to
# $QUIVER_CACHE/kind/CLUSTER-certs.d, which deploy/kind/cluster.yaml mounts at
# /etc/containerd/certs.d on every node. So an image reference means the same thing to
# both, as a registry's name does on a real cluster.
# Plain HTTP: helm speaks HTTP to any loopback registry whatever it is told (it cannot use
# a TLS one on 127.0.0.1), cosign falls back to HTTP for loopback addresses, docker treats
# 127.0.0.0/8 as an insecure registry, and oras takes --plain-http (QUIVER_PLAIN_HTTP=1 for
# scripts/release.sh). So the commands of docs/install.md run here exactly as written.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
source "$ROOT/scripts/release-tools.sh"

cmd="${1:?usage: registry.sh up|connect|down CLUSTER}" cluster="${2:?usage: registry.sh up|connect|down CLUSTER}"
name="$cluster-registry"
push="$cluster-registry-push"
volume="$cluster-registry-data"
image="quiver.dev/registry:$REGISTRY_VERSION-ro"
certs="$QUIVER_CACHE/kind/$cluster-certs.d"
DOCKER="${DOCKER:-docker}"

port_of() { "$DOCKER" port "$push" 5000/tcp 2>/dev/null | sed -n 's/^127\.0\.0\.1:\([0-9]*\)$/\1/p' | head -1; }

case "$cmd" in
up)
  if [ -z "$("$DOCKER" ps -q --filter "name=^$push\$")" ]; then
    "$DOCKER" rm -f "$push" >/dev/null 2>&1 || true
    bin="$(go_tool registry github.com/distribution/distribution/v3/cmd/registry "$REGISTRY_VERSION" "$QUIVER_CACHE/registry/$REGISTRY_VERSION")"
    if ! "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
      ctx="$(mktemp -d)"
      cp "$bin" "$ctx/registry"
      cat > "$ctx/push.yml" <<'YAML'
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: /var/lib/registry}, delete: {enabled: true}}
http: {addr: ":5000"}
YAML
      cat > "$ctx/pull.yml" <<'YAML'
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: /var/lib/registry}, maintenance: {readonly: {enabled: true}}}
http: {addr: ":5000"}
YAML
      printf 'FROM scratch\nCOPY registry /bin/registry\nCOPY push.yml pull.yml /etc/distribution/\nEXPOSE 5000\nENTRYPOINT ["/bin/registry", "serve"]\nCMD ["/etc/distribution/push.yml"]\n' > "$ctx/Dockerfile"
      quiet_build "$image" "$ctx"
      rm -rf "$ctx"
    fi
    # A fixed port per cluster would collide between clusters; the free one is kept for
    # the container's life (and so for the cluster's, whose nodes name it).
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    "$DOCKER" run -d --name "$push" --restart unless-stopped -p "127.0.0.1:$port:5000" \
      -v "$volume:/var/lib/registry" "$image" >/dev/null
  fi
  port="$(port_of)"
  [ -n "$port" ] || { echo "registry container $name publishes no port on 127.0.0.1" >&2; exit 1; }
  for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null || { "$DOCKER" logs "$push" >&2; exit 1; }
  # The directory itself is bind-mounted into the nodes of a running cluster: keep it, and
  # rewrite its contents only when the registry's port changed.
  hosts="$certs/127.0.0.1:$port/hosts.toml"
  if [ ! -f "$hosts" ]; then
    mkdir -p "$certs" && find "$certs" -mindepth 1 -delete && mkdir -p "$(dirname "$hosts")"
    cat > "$hosts" <<TOML
# 127.0.0.1:$port is the registry's name on the host; the nodes reach it by its container name.
server = "http://127.0.0.1:$port"
[host."http://$name:5000"]
  capabilities = ["pull", "resolve"]
TOML
  fi
  echo "127.0.0.1:$port"
  ;;
connect)
  # The nodes' side: read-only over the same storage, on the kind network only.
  if [ -z "$("$DOCKER" ps -q --filter "name=^$name\$")" ]; then
    "$DOCKER" rm -f "$name" >/dev/null 2>&1 || true
    "$DOCKER" run -d --name "$name" --restart unless-stopped --network kind \
      -v "$volume:/var/lib/registry" "$image" /etc/distribution/pull.yml >/dev/null
  fi
  ;;
down)
  "$DOCKER" rm -f "$name" "$push" >/dev/null 2>&1 || true
  "$DOCKER" volume rm "$volume" >/dev/null 2>&1 || true
  rm -rf "$certs"
  ;;
*) echo "usage: registry.sh up|connect|down CLUSTER" >&2; exit 2 ;;
esac
