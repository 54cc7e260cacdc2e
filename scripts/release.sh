#!/usr/bin/env bash
# make release VERSION=X.Y.Z REGISTRY=host[:port][/path]: one release of Quiver, pushed to
# REGISTRY and signed.
#   1. quiver-server (fat LTO, PGO) and quiver-operator (fat LTO), static, built as
#      scripts/images.sh builds them;
#   2. one image each, written as an OCI image layout by scripts/oci-image.py: fixed file
#      order, owners and times (SOURCE_DATE_EPOCH, default the last commit's time), so the
#      same tree gives the same digest; annotated (and labelled) with
#      org.opencontainers.image.{version,revision,source,created,title,licenses};
#   3. both pushed with oras as REGISTRY/quiver-server:VERSION, REGISTRY/quiver-operator:VERSION;
#   4. a CycloneDX SBOM per image (cargo-cyclonedx: the crates linked into its binary, plus
#      the CA bundle), attached to the image as a signed cosign attestation;
#   5. each image signed with cosign (key COSIGN_KEY, password COSIGN_PASSWORD);
#   6. the chart packaged with version and appVersion VERSION and imageRegistry REGISTRY
#      (scripts/release-chart.sh), pushed as oci://REGISTRY/charts/quiver:VERSION, and signed.
# Writes the references with their digests to $QUIVER_CACHE/release/VERSION/release.txt
# (and prints it); the SBOMs and layouts are kept beside it.
# Env: COSIGN_KEY (required; `cosign generate-key-pair` makes one), COSIGN_PASSWORD,
#      QUIVER_PLAIN_HTTP=1 for a registry without TLS, SOURCE_DATE_EPOCH, HELM,
#      QUIVER_COSIGN_TLOG=1 to also record the signatures in the public transparency log.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
source "$ROOT/scripts/release-tools.sh"
[ -z "${COSIGN_KEY:-}" ] || COSIGN_KEY="$(realpath -- "$COSIGN_KEY")"
cd "$ROOT"

usage() { echo "usage: $0 VERSION REGISTRY   (e.g. $0 0.2.0 registry.example.com/quiver)" >&2; exit 2; }
[ $# -eq 2 ] || usage
version="$1" registry="${2%/}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] \
  || { echo "VERSION must be SemVer without build metadata (e.g. 0.2.0), not '$version'" >&2; exit 2; }
[[ "$registry" =~ ^[^/:@[:space:]]+(:[0-9]+)?(/[a-z0-9._/-]*)?$ ]] \
  || { echo "REGISTRY must be host[:port][/path], not '$registry'" >&2; exit 2; }
[ -n "${COSIGN_KEY:-}" ] && [ -f "$COSIGN_KEY" ] \
  || { echo "COSIGN_KEY must name a cosign private key (make one with: cosign generate-key-pair)" >&2; exit 2; }
export COSIGN_PASSWORD="${COSIGN_PASSWORD-}"
HELM="${HELM:-$(command -v helm || ls "$QUIVER_CACHE"/k8s/*/bin/helm 2>/dev/null | head -1)}"
[ -x "$HELM" ] || { echo "no helm: run scripts/k8s-binaries.sh" >&2; exit 1; }
export HELM

epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
revision="$(git rev-parse HEAD)"
git diff --quiet HEAD -- . 2>/dev/null || revision="$revision-dirty"
source_url="$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml)"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
out="$QUIVER_CACHE/release/$version"
rm -rf "$out" && mkdir -p "$out"

oras_flags=() cosign_flags=(--tlog-upload=false) helm_flags=()
if [ "${QUIVER_PLAIN_HTTP:-0}" = 1 ]; then
  oras_flags+=(--plain-http) cosign_flags+=(--allow-http-registry) helm_flags+=(--plain-http)
fi
[ "${QUIVER_COSIGN_TLOG:-0}" = 1 ] && cosign_flags=("${cosign_flags[@]:1}")

release_tools
bins="$("$ROOT/scripts/images.sh" --binaries)"

# sbom PACKAGE IMAGE_REF: the CycloneDX SBOM of one binary's crates for the image target,
# with the image's CA bundle added and the document's time and serial number fixed.
sbom() {
  local pkg="$1" ref="$2" work="$out/sbom-work"
  rm -rf "$work" && mkdir -p "$work"
  # cargo-cyclonedx writes next to each Cargo.toml: run it on a copy of the tracked files.
  git ls-files -z | xargs -0 cp --parents -t "$work"
  (cd "$work" && SOURCE_DATE_EPOCH="$epoch" "$CARGO_CYCLONEDX" cyclonedx --quiet --format json \
    --spec-version 1.5 --target "$IMAGE_TRIPLE" --no-build-deps --describe binaries >&2)
  local bom
  bom="$(find "$work" -name "${pkg}_bin.cdx.json" | head -1)"
  [ -n "$bom" ] || { echo "cargo-cyclonedx wrote no SBOM for $pkg" >&2; find "$work" -name '*.cdx.json' >&2; exit 1; }
  python3 - "$bom" "$out/$pkg.cdx.json" "$created" "$ref" "$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null || echo unknown)" <<'PY'
import json, sys, uuid
src, dst, created, ref, ca = sys.argv[1:]
bom = json.load(open(src))
bom["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, ref)}"
bom.setdefault("metadata", {})["timestamp"] = created
bom.setdefault("components", []).append({
    "type": "data", "bom-ref": "ca-certificates", "name": "ca-certificates", "version": ca,
    "description": "/etc/ssl/certs/ca-certificates.crt, from the Debian package of this version",
    "purl": f"pkg:deb/debian/ca-certificates@{ca}",
})
json.dump(bom, open(dst, "w"), indent=1, sort_keys=True)
PY
  rm -rf "$work"
}

# image NAME ENTRYPOINT PORTS: lays out, writes, pushes, attests and signs one image.
image() {
  local name="$1" entry="$2" ports="$3" p port_args=()
  for p in $ports; do port_args+=(--port "$p"); done
  deploy/images/layout.sh "$out/$name.rootfs" /etc/ssl/certs/ca-certificates.crt "$bins/$name"
  local digest
  digest="$(python3 scripts/oci-image.py --rootfs "$out/$name.rootfs" --out "$out/$name.oci" \
    --tag "$version" --created "$epoch" --entrypoint "$entry" "${port_args[@]}" \
    --env PATH=/usr/local/bin \
    --annotation "org.opencontainers.image.title=$name" \
    --annotation "org.opencontainers.image.version=$version" \
    --annotation "org.opencontainers.image.revision=$revision" \
    --annotation "org.opencontainers.image.source=$source_url" \
    --annotation "org.opencontainers.image.created=$created" \
    --annotation "org.opencontainers.image.licenses=Apache-2.0")"
  rm -rf "$out/$name.rootfs"
  local ref="$registry/$name"
  log "pushing $ref:$version ($digest)"
  "$ORAS" cp --from-oci-layout "${oras_flags[@]/--plain-http/--to-plain-http}" "$out/$name.oci:$version" "$ref:$version" >&2
  local pushed
  pushed="$("$ORAS" resolve "${oras_flags[@]}" "$ref:$version")"
  [ "$pushed" = "$digest" ] || { echo "$ref:$version is $pushed in the registry, $digest here" >&2; exit 1; }
  log "SBOM of $name, attached as a signed attestation; signature"
  sbom "$name" "$ref@$digest"
  "$COSIGN" attest --yes --key "$COSIGN_KEY" "${cosign_flags[@]}" --type cyclonedx \
    --predicate "$out/$name.cdx.json" "$ref@$digest" >&2
  "$COSIGN" sign --yes --key "$COSIGN_KEY" "${cosign_flags[@]}" "$ref@$digest" >&2
  echo "$ref:$version@$digest" >> "$out/release.txt"
}

image quiver-server /usr/local/bin/quiver-server "8080 9090"
image quiver-operator /usr/local/bin/quiver-operator "8081"

log "chart quiver $version"
chart="$(QUIVER_PLAIN_HTTP="${QUIVER_PLAIN_HTTP:-0}" QUIVER_CHART_DIGEST_OUT="$out/chart.digest" \
  scripts/release-chart.sh "$version" "$registry")"
chart_digest="$(cat "$out/chart.digest")"
# Sign only if the registry still holds what helm pushed (as for the images).
pushed="$("$ORAS" resolve "${oras_flags[@]}" "${chart#oci://}")"
[ "$pushed" = "$chart_digest" ] || { echo "$chart is $pushed in the registry, $chart_digest here" >&2; exit 1; }
"$COSIGN" sign --yes --key "$COSIGN_KEY" "${cosign_flags[@]}" "${chart#oci://}@$chart_digest" >&2
echo "$chart@$chart_digest" >> "$out/release.txt"
cat "$out/release.txt"
