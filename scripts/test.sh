#!/usr/bin/env bash
# The test command (README, .ci/run): formatting, lints, unit and integration tests, the
# official MCP SDK clients (Python and TypeScript) and the official conformance suite
# against the real server binary, the
# operator and chart on a real control plane, the e2e suite on a real kind cluster, the
# per-request cost guard (instruction counts of the release server), and a smoke run of the
# quick-start demo. Installs what it needs; caches under ~/.cache/quiver.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

# The workspace's debug builds (clippy, cargo test, the servers the suites run) go to a
# target directory in the cache, not the clone: a clean clone then compiles only what
# changed and the workspace's own crates, not every dependency again. Cargo never deletes
# stale artifacts, so the directory is started afresh once it passes 20 GB.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  export CARGO_TARGET_DIR="$QUIVER_CACHE/target-test"
  if [ -d "$CARGO_TARGET_DIR" ] && [ "$(du -sm "$CARGO_TARGET_DIR" | cut -f1)" -gt 20000 ]; then
    log "$CARGO_TARGET_DIR holds over 20 GB: starting it afresh"
    rm -rf "$CARGO_TARGET_DIR"
  fi
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "layering: no import cycle between modules, no long function without a reason"
"$ROOT/scripts/check-layout.sh"

log "the model crate (what the operator links) has no runtime: no tokio, no hyper"
model_deps="$(cargo tree -p quiver-model -e normal --prefix none --locked)"
if grep -E '^(tokio|hyper|hyper-util|axum) ' <<<"$model_deps"; then
  echo "quiver-model depends on a runtime crate (above); keep the runtime in quiver-server" >&2; exit 1
fi

# Debian's redis-server for the shared rate-limit and shared-task tests (cached; cold: about 4 s).
QUIVER_REDIS_SERVER="$("$ROOT/scripts/redis.sh")"
export QUIVER_REDIS_SERVER

# Open Policy Agent for the guardrail webhook tests (built from its Go module, cached; cold:
# about 80 s).
QUIVER_OPA="$("$ROOT/scripts/opa.sh")"
export QUIVER_OPA

log "OpenID provider of the identity tests (Keycloak from Maven Central, cached; the tests start it)"
"$ROOT/scripts/idp.sh" install

log "cargo test (unit, integration, doc)"
cargo test --workspace --locked

# Every later step runs the binaries cargo test built (the integration tests need them):
# building them again with `-p` would resolve the dependencies' features for that package
# alone and recompile syn and all above it (lib.sh's workspace_build).
export QUIVER_SERVER_BIN="$(target_dir)/debug/quiver-server"

log "crds/ is what crdgen generates"
crdgen="$(target_dir)/debug/crdgen"
"$crdgen" | diff -u crds/mcpservers.quiver.dev.yaml - \
  || { echo "crds/ drifted: run 'cargo run -p quiver-operator --bin crdgen > crds/mcpservers.quiver.dev.yaml'" >&2; exit 1; }
"$crdgen" --reference | diff -u docs/crd-reference.md - \
  || { echo "docs/crd-reference.md drifted: run 'cargo run -p quiver-operator --bin crdgen -- --reference > docs/crd-reference.md'" >&2; exit 1; }

log "trace backend for the tracing tests (OpenTelemetry Collector built by ocb, cached)"
"$ROOT/scripts/otelcol.sh" build >/dev/null
command -v prometheus >/dev/null || apt_install prometheus   # the exemplar test's Prometheus

log "Python MCP SDK client tests"
python_env
node_env   # the TypeScript SDK servers some Python tests front as upstreams
"$PY" -m pytest -q -s --durations=10 tests/sdk/python

log "a real browser (Debian's chromium-headless-shell) signing users in at Keycloak"
QUIVER_CHROMIUM="$("$ROOT/scripts/chromium.sh")"
export QUIVER_CHROMIUM
# The console's browser test needs a control plane: scripts/operator-it.sh runs it.
"$PY" -m pytest -q -s tests/browser --ignore=tests/browser/test_console.py

log "TypeScript MCP SDK client tests"
node_env
(cd tests/sdk/typescript && npm test --silent)

log "official MCP conformance suite (every server scenario) against the real binary"
"$ROOT/scripts/conformance.sh"

log "operator against a real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
"$ROOT/scripts/operator-it.sh"

log "OpenAPI import against a real kube-apiserver (its own core/v1 and apps/v1 documents)"
"$ROOT/scripts/openapi-it.sh"

log "Helm chart, dashboards and alerts against a real API server and a real Prometheus"
"$ROOT/scripts/chart-it.sh"

log "linux/arm64: the cross-built binaries under qemu-user (a real MCP tools/call, the plugin, static aarch64 ELF)"
"$ROOT/scripts/arm64-smoke.sh"

log "release through a real OCI registry (distribution, built from its Go module): the chart, and make release for linux/amd64 and linux/arm64"
"$ROOT/scripts/release-it.sh"

log "end to end on a real kind cluster (node image, make release to a registry beside it, helm install from oci://, tests/e2e)"
"$ROOT/scripts/e2e.sh"

log "per-request cost guard: instructions and allocations per request of the release server under callgrind, against bench/cost-baseline.json"
"$ROOT/scripts/cost-guard.sh"

log "quick-start demo (one-shot)"
"$ROOT/scripts/demo.sh" --once

log "all tests passed"
