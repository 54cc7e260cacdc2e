#!/usr/bin/env bash
# make release VERSION=X.Y.Z REGISTRY=host[:port][/path]: one release of Quiver, pushed to
# REGISTRY and signed, for linux/amd64 and linux/arm64.
#   1. per platform, quiver-server (fat LTO; PGO on amd64) and quiver-operator (fat LTO),
#      static, built as scripts/images.sh builds them (arm64 cross-built), and the
#      kubectl-quiver plugin as scripts/plugin.sh builds it;
#   2. one image per binary and platform, written as an OCI image layout by
#      scripts/oci-image.py: fixed file order, owners and times (SOURCE_DATE_EPOCH, default
#      the last commit's time), so the same tree gives the same digest; annotated (and
#      labelled) with org.opencontainers.image.{version,revision,source,created,title,licenses};
#      the platforms' images gathered into one image index per binary;
#   3. both indexes pushed with oras as REGISTRY/quiver-server:VERSION, REGISTRY/quiver-operator:VERSION;
#   4. a CycloneDX SBOM per image and platform (cargo-cyclonedx for that platform's target:
#      the crates linked into its binary, plus the CA bundle), attached to that platform's
#      image as a signed cosign attestation;
#   5. each index signed with cosign, with each platform's image (cosign sign --recursive;
#      key COSIGN_KEY, password COSIGN_PASSWORD);
#   6. the plugin binaries, kubectl-quiver-linux-ARCH, with their SHA256SUMS, pushed as one
#      OCI artifact REGISTRY/kubectl-quiver:VERSION, and signed;
#   7. the chart packaged with version and appVersion VERSION and imageRegistry REGISTRY
#      (scripts/release-chart.sh), pushed as oci://REGISTRY/charts/quiver:VERSION, and signed.
# Writes the references with their digests to $QUIVER_CACHE/release/VERSION/release.txt
# (and prints it); the SBOMs, layouts and plugin binaries are kept beside it.
# Env: COSIGN_KEY (required; `cosign generate-key-pair` makes one), COSIGN_PASSWORD,
#      QUIVER_PLAIN_HTTP=1 for a registry without TLS, SOURCE_DATE_EPOCH, HELM,
#      QUIVER_COSIGN_TLOG=1 to also record the signatures in the public transparency log,
#      QUIVER_RELEASE_PLATFORMS (default "linux/amd64 linux/arm64"): the platforms to build,
#      QUIVER_RELEASE_BINS_AMD64 / _ARM64: a directory with that platform's three static
#      binaries to release instead of building them (the tests use their cheaper builds).
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
platforms=()
wanted="${QUIVER_RELEASE_PLATFORMS:-$RELEASE_PLATFORMS}"
for p in ${wanted//,/ }; do
  platform_triple "$p" >/dev/null || exit 2
  [[ " ${platforms[*]} " != *" $p "* ]] || { echo "QUIVER_RELEASE_PLATFORMS names $p twice" >&2; exit 2; }
  platforms+=("$p")
done
[ "${#platforms[@]}" -gt 0 ] || { echo "QUIVER_RELEASE_PLATFORMS names no platform" >&2; exit 2; }
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

# The directory of each platform's binaries: quiver-server, quiver-operator, kubectl-quiver.
declare -A bins
for p in "${platforms[@]}"; do
  arch="${p#linux/}" triple="$(platform_triple "$p")"
  given="QUIVER_RELEASE_BINS_${arch^^}"
  if [ -n "${!given:-}" ]; then
    bins[$p]="$(realpath -- "${!given}")"
    log "$p: the binaries in ${bins[$p]} ($given)"
  else
    bins[$p]="$(QUIVER_PLATFORM="$p" "$ROOT/scripts/images.sh" --binaries)"
    QUIVER_PLATFORM="$p" "$ROOT/scripts/plugin.sh" "${bins[$p]}" >/dev/null
  fi
  for b in quiver-server quiver-operator kubectl-quiver; do check_static "${bins[$p]}/$b" "$triple"; done
done

# sboms: cargo-cyclonedx's SBOMs of every binary's crates, for each platform's target, in
# $out/sbom-raw/ARCH/. It writes next to each Cargo.toml: run it on a copy of the tracked files.
sboms() {
  local work="$out/sbom-work" p f
  rm -rf "$work" && mkdir -p "$work"
  git ls-files -z | xargs -0 cp --parents -t "$work"
  for p in "${platforms[@]}"; do
    (cd "$work" && SOURCE_DATE_EPOCH="$epoch" "$CARGO_CYCLONEDX" cyclonedx --quiet --format json \
      --spec-version 1.5 --target "$(platform_triple "$p")" --no-build-deps --describe binaries >&2)
    mkdir -p "$out/sbom-raw/${p#linux/}"
    while read -r f; do mv "$f" "$out/sbom-raw/${p#linux/}/"; done < <(find "$work" -name '*_bin.cdx.json')
  done
  rm -rf "$work"
}

# sbom PACKAGE PLATFORM IMAGE_REF: the SBOM of one binary's crates for PLATFORM, with the
# image's CA bundle added and the document's time and serial number fixed, in
# $out/PACKAGE-ARCH.cdx.json.
sbom() {
  local pkg="$1" platform="$2" ref="$3"
  local bom="$out/sbom-raw/${platform#linux/}/${pkg}_bin.cdx.json"
  [ -f "$bom" ] || { echo "cargo-cyclonedx wrote no SBOM for $pkg ($platform)" >&2; ls -R "$out/sbom-raw" >&2; exit 1; }
  python3 - "$bom" "$out/$pkg-${platform#linux/}.cdx.json" "$created" "$ref" "$platform" \
    "$(dpkg-query -W -f='${Version}' ca-certificates 2>/dev/null || echo unknown)" <<'PY'
import json, sys, uuid
src, dst, created, ref, platform, ca = sys.argv[1:]
bom = json.load(open(src))
bom["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, ref)}"
bom.setdefault("metadata", {})["timestamp"] = created
bom["metadata"].setdefault("properties", []).append({"name": "quiver:platform", "value": platform})
bom.setdefault("components", []).append({
    "type": "data", "bom-ref": "ca-certificates", "name": "ca-certificates", "version": ca,
    "description": "/etc/ssl/certs/ca-certificates.crt, from the Debian package of this version",
    "purl": f"pkg:deb/debian/ca-certificates@{ca}",
})
json.dump(bom, open(dst, "w"), indent=1, sort_keys=True)
PY
}

# image NAME ENTRYPOINT PORTS: lays out and writes one image per platform and an index over
# them; pushes the index, attests each platform's image with its SBOM, signs them all.
image() {
  local name="$1" entry="$2" ports="$3" p arch port_args=() images=() annotations variant
  for p in $ports; do port_args+=(--port "$p"); done
  annotations=(--annotation "org.opencontainers.image.title=$name"
    --annotation "org.opencontainers.image.version=$version"
    --annotation "org.opencontainers.image.revision=$revision"
    --annotation "org.opencontainers.image.source=$source_url"
    --annotation "org.opencontainers.image.created=$created"
    --annotation "org.opencontainers.image.licenses=Apache-2.0")
  declare -A digests
  for p in "${platforms[@]}"; do
    arch="${p#linux/}" variant=()
    [ "$arch" != arm64 ] || variant=(--variant v8)
    deploy/images/layout.sh "$out/$name.rootfs" /etc/ssl/certs/ca-certificates.crt "${bins[$p]}/$name"
    digests[$p]="$(python3 scripts/oci-image.py --rootfs "$out/$name.rootfs" --out "$out/$name-$arch.oci" \
      --tag "$version" --created "$epoch" --entrypoint "$entry" "${port_args[@]}" \
      --arch "$arch" "${variant[@]}" \
      --env PATH=/usr/local/bin "${annotations[@]}")"
    images+=(--image "$out/$name-$arch.oci")
    rm -rf "$out/$name.rootfs"
  done
  local digest
  digest="$(python3 scripts/oci-image.py index --out "$out/$name.oci" --tag "$version" "${images[@]}" "${annotations[@]}")"
  for p in "${platforms[@]}"; do rm -rf "$out/$name-${p#linux/}.oci"; done
  local ref="$registry/$name"
  log "pushing $ref:$version ($digest: ${platforms[*]})"
  "$ORAS" cp --from-oci-layout "${oras_flags[@]/--plain-http/--to-plain-http}" "$out/$name.oci:$version" "$ref:$version" >&2
  local pushed
  pushed="$("$ORAS" resolve "${oras_flags[@]}" "$ref:$version")"
  [ "$pushed" = "$digest" ] || { echo "$ref:$version is $pushed in the registry, $digest here" >&2; exit 1; }
  echo "$ref:$version@$digest" >> "$out/release.txt"
  for p in "${platforms[@]}"; do
    log "SBOM of $name for $p, attached to ${digests[$p]} as a signed attestation"
    sbom "$name" "$p" "$ref@${digests[$p]}"
    "$COSIGN" attest --yes --key "$COSIGN_KEY" "${cosign_flags[@]}" --type cyclonedx \
      --predicate "$out/$name-${p#linux/}.cdx.json" "$ref@${digests[$p]}" >&2
    echo "  $p $ref@${digests[$p]}" >> "$out/release.txt"
  done
  log "signing $ref@$digest and its platforms' images"
  "$COSIGN" sign --yes --recursive --key "$COSIGN_KEY" "${cosign_flags[@]}" "$ref@$digest" >&2
}

# plugin: kubectl-quiver-linux-ARCH of every platform and their SHA256SUMS, in $out/plugin,
# pushed as one OCI artifact with fixed annotations (so the same binaries give the same
# digest), and signed.
plugin() {
  local dir="$out/plugin" ref="$registry/kubectl-quiver" p files=()
  mkdir -p "$dir"
  for p in "${platforms[@]}"; do
    cp "${bins[$p]}/kubectl-quiver" "$dir/kubectl-quiver-linux-${p#linux/}"
    files+=("kubectl-quiver-linux-${p#linux/}:application/octet-stream")
  done
  (cd "$dir" && sha256sum kubectl-quiver-linux-* > SHA256SUMS)
  log "pushing $ref:$version (kubectl-quiver for ${platforms[*]}, SHA256SUMS)"
  (cd "$dir" && "$ORAS" push "${oras_flags[@]}" "$ref:$version" "${files[@]}" SHA256SUMS:text/plain \
    --artifact-type application/vnd.quiver.kubectl-plugin.v1 \
    --annotation "org.opencontainers.image.created=$created" \
    --annotation "org.opencontainers.image.version=$version" \
    --annotation "org.opencontainers.image.revision=$revision" \
    --annotation "org.opencontainers.image.source=$source_url" \
    --export-manifest "$out/plugin.manifest.json" >&2)
  local digest pushed
  digest="sha256:$(sha256sum < "$out/plugin.manifest.json" | cut -d' ' -f1)"
  pushed="$("$ORAS" resolve "${oras_flags[@]}" "$ref:$version")"
  [ "$pushed" = "$digest" ] || { echo "$ref:$version is $pushed in the registry, $digest here" >&2; exit 1; }
  "$COSIGN" sign --yes --key "$COSIGN_KEY" "${cosign_flags[@]}" "$ref@$digest" >&2
  echo "$ref:$version@$digest" >> "$out/release.txt"
}

log "SBOMs for ${platforms[*]}"
sboms
image quiver-server /usr/local/bin/quiver-server "8080 9090"
image quiver-operator /usr/local/bin/quiver-operator "8081"
plugin
rm -rf "$out/sbom-raw"

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
