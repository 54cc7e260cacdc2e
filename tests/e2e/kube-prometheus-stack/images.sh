#!/usr/bin/env bash
# The images of tests/e2e/test_kube_prometheus_stack.py, for `kind load`: prometheus-operator,
# prometheus-config-reloader and the Prometheus server that operator release is built against,
# each FROM scratch with the static binary scripts/prometheus-operator.sh builds from the Go
# modules (cached there). No pulls (the classic builder, like tests/e2e/upstream-go/build.sh).
# Starts dockerd when none answers. Idempotent; prints three image names (operator, reloader,
# Prometheus), each tagged with its upstream version, so the Prometheus object's `version`
# can name the version its image runs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../../../scripts/lib.sh"

mapfile -t built < <("$ROOT/scripts/prometheus-operator.sh" --prometheus)
operator="${built[0]}" reloader="${built[2]}" prometheus="${built[3]}" prom_version="${built[4]}"
version="$("$operator" --version 2>&1 | sed -n 's/.*version \([0-9][0-9.]*\).*/v\1/p' | head -1)"
[ -n "$version" ] || { echo "cannot read the version of $operator" >&2; exit 1; }
for b in "$operator" "$reloader" "$prometheus"; do check_static "$b" "$IMAGE_TRIPLE"; done

"$ROOT/deploy/kind/dockerd.sh"
ctx="$QUIVER_CACHE/prometheus-operator/image-ctx"

# image NAME BINARY PATH-IN-IMAGE [WORKDIR]: FROM scratch, the binary as the entrypoint, user
# nobody (as the upstream images); WORKDIR is created.
image() {
  local name="$1" bin="$2" path="$3" workdir="${4:-/}"
  rm -rf "$ctx" && mkdir -p "$ctx/rootfs$(dirname "$path")"
  cp "$bin" "$ctx/rootfs$path"
  cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY rootfs /
WORKDIR $workdir
USER 65534:65534
ENTRYPOINT ["$path"]
DOCKERFILE
  log "building image $name"
  quiet_build "$name" "$ctx"
  echo "$name"
}

image "quiver-e2e/prometheus-operator:$version" "$operator" /bin/operator
# The operator starts this container with the command /bin/prometheus-config-reloader.
image "quiver-e2e/prometheus-config-reloader:$version" "$reloader" /bin/prometheus-config-reloader
# The operator mounts the TSDB volume at /prometheus and passes only arguments.
image "quiver-e2e/prometheus:$prom_version" "$prometheus" /bin/prometheus /prometheus
rm -rf "$ctx"
