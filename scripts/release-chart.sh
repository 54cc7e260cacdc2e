#!/usr/bin/env bash
# Publishes the Helm chart as an OCI artifact, stamped for one release:
#   scripts/release-chart.sh VERSION REGISTRY
# packages charts/quiver with version and appVersion VERSION and `imageRegistry: REGISTRY`
# as its default (so `helm install` pulls both images from REGISTRY with no --set), and
# pushes it to oci://REGISTRY/charts/quiver:VERSION. Prints that reference.
# The images quiver-server:VERSION and quiver-operator:VERSION must be pushed to REGISTRY
# separately (docs/install.md: `docker build` + `docker push`, or scripts/images.sh with
# QUIVER_IMAGE_TAG=VERSION, then `docker tag` and `docker push`).
# Env: HELM (default helm), QUIVER_PLAIN_HTTP=1 for a registry without TLS (a local one).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
HELM="${HELM:-helm}"

[ $# -eq 2 ] || { echo "usage: $0 VERSION REGISTRY" >&2; exit 2; }
version="$1" registry="${2%/}"
# SemVer 2 (what Helm requires of a chart version), without a leading v.
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$ ]] \
  || { echo "VERSION must be SemVer (e.g. 0.2.0), not '$version'" >&2; exit 2; }
[[ "$registry" =~ ^[^/:@[:space:]]+(:[0-9]+)?(/[a-z0-9._/-]*)?$ ]] \
  || { echo "REGISTRY must be host[:port][/path], not '$registry'" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$ROOT/charts/quiver" "$work/quiver"
# The one value a user would otherwise set; the schema still checks it.
sed -i "s|^imageRegistry: \"\"$|imageRegistry: \"$registry\"|" "$work/quiver/values.yaml"
grep -q "^imageRegistry: \"$registry\"$" "$work/quiver/values.yaml" \
  || { echo "values.yaml has no top-level 'imageRegistry: \"\"' line to stamp" >&2; exit 1; }
"$HELM" lint --strict "$work/quiver" >/dev/null
"$HELM" package "$work/quiver" --version "$version" --app-version "$version" -d "$work" >/dev/null
flags=()
[ "${QUIVER_PLAIN_HTTP:-0}" = 1 ] && flags+=(--plain-http)
pushed="$("$HELM" push "$work/quiver-$version.tgz" "oci://$registry/charts" "${flags[@]}" 2>&1)"
printf '%s\n' "$pushed" >&2
# The digest of the manifest helm made here, not what the registry says now: what gets
# signed is what was built (QUIVER_CHART_DIGEST_OUT names a file to write it to).
digest="$(sed -n 's/^Digest: \(sha256:[0-9a-f]\{64\}\)$/\1/p' <<<"$pushed")"
[ -n "$digest" ] || { echo "helm push printed no digest" >&2; exit 1; }
[ -z "${QUIVER_CHART_DIGEST_OUT:-}" ] || echo "$digest" > "$QUIVER_CHART_DIGEST_OUT"
echo "oci://$registry/charts/quiver:$version"
