#!/usr/bin/env bash
# The release path through a real OCI registry: the CNCF distribution registry (built from
# its Go module, cached in ~/.cache/quiver/registry) on 127.0.0.1.
#   - two chart releases pushed by scripts/release-chart.sh, each installed the way
#     docs/install.md says (`helm show chart` / `helm template` of oci://…, with the registry
#     stamped as the chart's imageRegistry);
#   - scripts/oci-image.py: reproducible single-platform images and image indexes;
#   - `make release` for linux/amd64 and linux/arm64 (scripts/release.sh): an image index
#     per image with both platforms' manifests, every platform's SBOM attestation, the
#     signatures of the indexes and of each platform's image, the plugin artifact with both
#     binaries and their checksums. The arm64 binaries are scripts/arm64-smoke.sh's cheaper
#     build (no fat LTO; the e2e release is amd64 only); the amd64 ones are the release
#     build scripts/e2e.sh uses too, so the test command builds them once.
# Needs go and helm (scripts/k8s-binaries.sh builds helm).
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

# An index over two platforms' images: one digest for the same images, whatever order their
# blobs were written in; each manifest carries its platform; one platform twice is refused.
python3 "$ROOT/scripts/oci-image.py" --rootfs "$oci/a" --out "$oci/arm" --tag 1.0.0 --created 1700000000 \
  --entrypoint /usr/local/bin/true --arch arm64 --variant v8 >/dev/null
i1="$(python3 "$ROOT/scripts/oci-image.py" index --out "$oci/i1" --tag 1.0.0 --image "$oci/la" --image "$oci/arm" --annotation k=v)"
i2="$(python3 "$ROOT/scripts/oci-image.py" index --out "$oci/i2" --tag 1.0.0 --image "$oci/la" --image "$oci/arm" --annotation k=v)"
[ "$i1" = "$i2" ] || fail "one pair of images, two index digests: $i1 $i2"
python3 "$ROOT/scripts/oci-image.py" index --out "$oci/i3" --tag 1.0.0 --image "$oci/la" --image "$oci/lb" 2>/dev/null \
  && fail "an index with two linux/amd64 images was written"
python3 - "$oci/i1" "$i1" <<'PY' || fail "index platforms"
import json, sys
layout, digest = sys.argv[1], sys.argv[2]
blob = lambda d: json.load(open(f"{layout}/blobs/sha256/{d.split(':')[1]}"))
index = blob(digest)
assert index["mediaType"] == "application/vnd.oci.image.index.v1+json" and index["annotations"] == {"k": "v"}, index
platforms = [(m["platform"]["architecture"], m["platform"].get("variant")) for m in index["manifests"]]
assert platforms == [("amd64", None), ("arm64", "v8")], platforms
for m in index["manifests"]:
    config = blob(blob(m["digest"])["config"]["digest"])
    assert (config["architecture"], config.get("variant")) == (m["platform"]["architecture"], m["platform"].get("variant")), config
PY
"$ORAS" cp --from-oci-layout --to-plain-http "$oci/i1:1.0.0" "127.0.0.1:$port/quiver/index-test:1.0.0" >/dev/null
[ "$("$ORAS" resolve --plain-http "127.0.0.1:$port/quiver/index-test:1.0.0")" = "$i1" ] || fail "pushed index digest differs"
echo "ok: oci-image.py index is reproducible ($i1), with each image's platform"

# make release for linux/amd64 and linux/arm64 into this registry, signed with a key pair
# made here; then what a user pulls is checked with the user's tools.
release_tools
export PATH="$(dirname "$COSIGN"):$PATH"
(cd "$work" && COSIGN_PASSWORD=quiver-test cosign generate-key-pair >/dev/null 2>&1)
arm64="$("$ROOT/scripts/arm64-smoke.sh" --binaries | tail -n 1)"
rv=0.0.0-it
QUIVER_PLAIN_HTTP=1 COSIGN_KEY="$work/cosign.key" COSIGN_PASSWORD=quiver-test \
  QUIVER_RELEASE_PLATFORMS="linux/amd64 linux/arm64" QUIVER_RELEASE_BINS_ARM64="$arm64" \
  "$ROOT/scripts/release.sh" "$rv" "$registry" > "$work/release.txt"
# cosign verify also tries to refresh Sigstore's trust root from the internet: send that to a
# closed loopback port (as scripts/release-install.sh does).
export HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY=127.0.0.1,localhost
verify() { cosign verify --key "$work/cosign.pub" --insecure-ignore-tlog=true "$1" >/dev/null 2>&1 || fail "signature of $1"; }
for name in quiver-server quiver-operator; do
  ref="$registry/$name"
  index="$("$ORAS" resolve --plain-http "$ref:$rv")"
  grep -qx "$ref:$rv@$index" "$work/release.txt" || fail "release.txt lacks $ref:$rv@$index"
  verify "$ref:$rv"
  platforms="$("$ORAS" manifest fetch --plain-http "$ref:$rv" | python3 -c '
import json, sys
index = json.load(sys.stdin)
assert index["mediaType"] == "application/vnd.oci.image.index.v1+json", index
for m in index["manifests"]:
    print(m["platform"]["os"] + "/" + m["platform"]["architecture"], m["digest"])')"
  [ "$(cut -d' ' -f1 <<<"$platforms" | xargs)" = "linux/amd64 linux/arm64" ] || fail "$ref:$rv platforms: $platforms"
  while read -r platform digest; do
    # Each platform's image holds that platform's static binary (the arm64 one is the binary given).
    manifest="$("$ORAS" manifest fetch --plain-http "$ref@$digest")"
    layer="$(python3 -c 'import json, sys; print(json.load(sys.stdin)["layers"][0]["digest"])' <<<"$manifest")"
    "$ORAS" blob fetch --plain-http --output "$work/layer.tgz" "$ref@$layer"
    rm -rf "$work/layer" && mkdir "$work/layer" && tar -xzf "$work/layer.tgz" -C "$work/layer"
    check_static "$work/layer/usr/local/bin/$name" "$(platform_triple "$platform")" || fail "$name for $platform"
    [ "$platform" != linux/arm64 ] || cmp -s "$work/layer/usr/local/bin/$name" "$arm64/$name" \
      || fail "$ref@$digest does not hold $arm64/$name"
    verify "$ref@$digest"
    cosign verify-attestation --key "$work/cosign.pub" --insecure-ignore-tlog=true --type cyclonedx \
      "$ref@$digest" 2>/dev/null > "$work/att.json" || fail "SBOM attestation of $ref@$digest ($platform)"
    python3 - "$work/att.json" "$digest" "$platform" "$(platform_triple "$platform")" <<'PY' || fail "SBOM of $ref@$digest ($platform)"
import base64, json, sys
att, digest, platform, triple = sys.argv[1:]
statement = json.loads(base64.b64decode(json.loads(open(att).readline())["payload"]))
assert "sha256:" + statement["subject"][0]["digest"]["sha256"] == digest, statement["subject"]
bom = statement["predicate"]
props = {p["name"]: p["value"] for p in bom["metadata"].get("properties", [])}
assert props.get("quiver:platform") == platform and props.get("cdx:rustc:sbom:target:triple") == triple, props
assert len(bom["components"]) > 10, len(bom["components"])
PY
    grep -qx "  $platform $ref@$digest" "$work/release.txt" || fail "release.txt lacks $platform $ref@$digest"
    echo "ok: $ref:$rv $platform $digest: static binary, signed, SBOM attested"
  done <<<"$platforms"
done
# The user's commands, as written: install.md's `verify` block over both platforms (the e2e
# suite runs it on its amd64-only releases), and kubectl-plugin.md's `plugin` block, which
# fetches the signed plugin artifact and checks its checksums.
mkdir -p "$work/user" && cp "$work/cosign.pub" "$work/user/"
oras_plain_http "$work/bin"
doc_block() {
  (cd "$work/user" && PATH="$work/bin:$PATH" REGISTRY="$registry" VERSION="$rv" \
    bash -euo pipefail -c "$(python3 "$ROOT/scripts/doc-block.py" "$ROOT/docs/$1" "$2")" > "$work/block.log" 2>&1) \
    || { cat "$work/block.log" >&2; fail "docs/$1's $2 block"; }
}
doc_block install.md verify
for name in quiver-server quiver-operator; do
  for arch in amd64 arm64; do
    grep -qx "$registry/$name $arch: [0-9]* components" "$work/block.log" \
      || { cat "$work/block.log" >&2; fail "install.md's verify block printed no SBOM of $name for $arch"; }
  done
done
echo "ok: docs/install.md's verify block: both platforms' signatures and SBOMs"
doc_block kubectl-plugin.md plugin
plugin="$work/user/kubectl-quiver"
[ "$(ls "$plugin" | xargs)" = "SHA256SUMS kubectl-quiver-linux-amd64 kubectl-quiver-linux-arm64" ] \
  || fail "plugin artifact holds: $(ls "$plugin" | xargs)"
check_static "$plugin/kubectl-quiver-linux-amd64" x86_64-unknown-linux-gnu || fail "amd64 plugin"
cmp -s "$plugin/kubectl-quiver-linux-arm64" "$arm64/kubectl-quiver" || fail "arm64 plugin is not $arm64/kubectl-quiver"
echo "ok: $registry/kubectl-quiver:$rv: both plugin binaries, checksums, signed (docs/kubectl-plugin.md)"
rm -rf "$QUIVER_CACHE/release/$rv"
echo "release path through a real OCI registry: ok"
