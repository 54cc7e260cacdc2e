#!/usr/bin/env bash
# Integration tests of the operator on a real local control plane: starts it, installs the
# CRD, runs operator/tests/cluster_leader.rs (operator replicas with leader election, before
# any other operator runs), then the operator binary and operator/tests/cluster.rs (the
# `#[ignore = "needs cluster"]` tests), and tears everything down. Logs of every component
# are printed on failure. Binaries come from cargo's target directory (CARGO_TARGET_DIR).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

workspace_build
BIN="$(target_dir)/debug"

control_plane_session cp

log "tool search recall over the apiserver's own OpenAPI (core/v1, apps/v1)"
cargo test --workspace --locked --test kube_search -- --ignored --nocapture

log "installing the CRD"
install_crd

log "operator replicas with leader election (rolling update, crash)"
cargo test --workspace --locked --test cluster_leader -- --ignored --nocapture

log "starting quiver-operator"
"$BIN/quiver-operator" --admin-listen 127.0.0.1:0 --probe-pods=false > "$STATE/quiver-operator.log" 2>&1 &
BG_PIDS+=($!)

export QUIVER_SERVER_BIN="$BIN/quiver-server"
cargo test --workspace --locked --test cluster -- --ignored --test-threads=3 --nocapture
cargo test --workspace --locked --test cluster_restricted -- --ignored --test-threads=2 --nocapture
cargo test --workspace --locked --test cluster_ownership -- --ignored --nocapture
cargo test --workspace --locked --test cluster_plugin -- --ignored --nocapture

log "the catalog (MCP Registry API) of a standby replica under real TokenReviews and SubjectAccessReviews, its answers checked against the official registry's OpenAPI document and server.json schema"
export QUIVER_CATALOG_SAMPLES="$STATE/catalog"
cargo test --workspace --locked --test cluster_catalog -- --ignored --nocapture
python_env
"$PY" tests/catalog/validate.py "$QUIVER_CATALOG_SAMPLES"

log "the console in a real browser (Chromium): users sign in at Keycloak with PKCE, see their namespace's servers only, call a tool through its form with their own token, see a refusal, and the server's last hour from a real Prometheus"
command -v prometheus >/dev/null || apt_install prometheus
QUIVER_OPERATOR_BIN="$BIN/quiver-operator" QUIVER_SERVER_BIN="$BIN/quiver-server" \
  "$PY" -m pytest -q -s tests/browser/test_console.py
