#!/usr/bin/env bash
# The chart's release path through a real OCI registry: the CNCF distribution registry
# (built from its Go module, cached in ~/.cache/quiver/registry) on 127.0.0.1, two releases
# pushed by scripts/release-chart.sh, and each installed the way docs/install.md says
# (`helm show chart` / `helm template` of oci://…, with the registry stamped as the chart's
# imageRegistry). Needs go and helm (scripts/k8s-binaries.sh builds helm).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${QUIVER_CACHE:-$HOME/.cache/quiver}"
REGISTRY_VERSION=v3.0.0
HELM="${HELM:-$(command -v helm || ls "$CACHE"/k8s/*/bin/helm 2>/dev/null | head -1)}"
[ -x "$HELM" ] || { echo "no helm: run scripts/k8s-binaries.sh" >&2; exit 1; }
export HELM

bin="$CACHE/registry/$REGISTRY_VERSION/registry"
if [ ! -x "$bin" ]; then
  echo "building the distribution registry $REGISTRY_VERSION from its Go module" >&2
  GOBIN="$(dirname "$bin")" CGO_ENABLED=0 GOFLAGS=-trimpath \
    go install "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
fi

work="$(mktemp -d)"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
cat > "$work/config.yml" <<YAML
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $work/data}, delete: {enabled: true}}
http: {addr: "127.0.0.1:$port"}
YAML
"$bin" serve "$work/config.yml" > "$work/registry.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null || { cat "$work/registry.log" >&2; exit 1; }
registry="127.0.0.1:$port/quiver"
export HELM_REGISTRY_CONFIG="$work/helm-registry.json" HELM_CACHE_HOME="$work/helm-cache"

fail() { echo "FAIL: $*" >&2; exit 1; }

# A bad version or registry is refused before anything is pushed.
QUIVER_PLAIN_HTTP=1 "$ROOT/scripts/release-chart.sh" v1 "$registry" 2>/dev/null && fail "version v1 accepted"
QUIVER_PLAIN_HTTP=1 "$ROOT/scripts/release-chart.sh" 1.0.0 "https://$registry" 2>/dev/null && fail "a URL accepted as registry"

for version in 0.1.0-rc.1 0.1.0-rc.2; do
  ref="$(QUIVER_PLAIN_HTTP=1 "$ROOT/scripts/release-chart.sh" "$version" "$registry")"
  [ "$ref" = "oci://$registry/charts/quiver:$version" ] || fail "release printed '$ref'"
  chart="$("$HELM" show chart "oci://$registry/charts/quiver" --version "$version" --plain-http)"
  grep -qx "version: $version" <<<"$chart" || fail "pulled chart is not $version: $chart"
  grep -qx "appVersion: $version" <<<"$chart" || fail "pulled chart's appVersion is not $version"
  rendered="$("$HELM" template quiver "oci://$registry/charts/quiver" --version "$version" --plain-http \
    -n quiver-system --kube-version 1.33.13)"
  grep -q "image: \"$registry/quiver-operator:$version\"" <<<"$rendered" || fail "operator image of $version"
  grep -q -- "--server-image=$registry/quiver-server:$version" <<<"$rendered" || fail "server image of $version"
  echo "ok: $ref installs the images $registry/quiver-{operator,server}:$version"
done
# Both versions stay pullable (what `helm upgrade --version` and a rollback need).
tags="$(curl -fsS "http://127.0.0.1:$port/v2/quiver/charts/quiver/tags/list")"
for v in 0.1.0-rc.1 0.1.0-rc.2; do grep -q "\"$v\"" <<<"$tags" || fail "tag $v missing: $tags"; done

# scripts/oci-image.py (what `make release` lays images out with): the same tree gives the
# same digest whatever its files' times and the umask they were made under, one changed
# byte gives another, and the annotations reach the manifest and the config's labels.
oci="$work/oci"
mkdir -p "$oci"
deploy_layout() { "$ROOT/deploy/images/layout.sh" "$1" /etc/ssl/certs/ca-certificates.crt "$(type -P true)"; }
oci_image() {
  python3 "$ROOT/scripts/oci-image.py" --rootfs "$1" --out "$2" --tag 1.0.0 --created 1700000000 \
    --entrypoint /usr/local/bin/true --port 8080 --annotation org.opencontainers.image.version=1.0.0
}
deploy_layout "$oci/a"
(umask 077 && deploy_layout "$oci/b")
touch -d @86400 "$oci/b/etc/passwd" "$oci/b/usr/local/bin"
d1="$(oci_image "$oci/a" "$oci/la")" d2="$(oci_image "$oci/b" "$oci/lb")"
[ "$d1" = "$d2" ] || fail "one tree, two digests: $d1 $d2"
echo x >> "$oci/b/etc/group"
[ "$(oci_image "$oci/b" "$oci/lc")" != "$d1" ] || fail "a changed file kept the digest"
python3 - "$oci/la" "$d1" <<'PY' || fail "annotations or labels missing"
import json, sys
layout, digest = sys.argv[1], sys.argv[2]
blob = lambda d: json.load(open(f"{layout}/blobs/sha256/{d.split(':')[1]}"))
manifest = blob(digest)
config = blob(manifest["config"]["digest"])
assert manifest["annotations"]["org.opencontainers.image.version"] == "1.0.0", manifest
assert config["config"]["Labels"]["org.opencontainers.image.version"] == "1.0.0", config
assert config["created"] == "2023-11-14T22:13:20Z" and config["config"]["User"] == "65532:65532", config
PY
source "$ROOT/scripts/lib.sh"
source "$ROOT/scripts/release-tools.sh"
ORAS="$(go_tool oras oras.land/oras/cmd/oras "$ORAS_VERSION")"
"$ORAS" cp --from-oci-layout --to-plain-http "$oci/la:1.0.0" "127.0.0.1:$port/quiver/layout-test:1.0.0" >/dev/null
[ "$("$ORAS" resolve --plain-http "127.0.0.1:$port/quiver/layout-test:1.0.0")" = "$d1" ] || fail "pushed digest differs"
echo "ok: oci-image.py is reproducible ($d1), annotated, and pushes unchanged"
echo "release path through a real OCI registry: ok"
