#!/usr/bin/env bash
# Integration tests of the operator on a real local control plane: starts it, installs the
# CRD, runs the operator binary, runs operator/tests/cluster.rs (the `#[ignore = "needs
# cluster"]` tests), and tears everything down. Logs of every component are printed on failure.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

control_plane_session cp

log "installing the CRD"
install_crd

log "starting quiver-operator"
"$ROOT/target/debug/quiver-operator" --admin-listen 127.0.0.1:0 --probe-pods=false > "$STATE/quiver-operator.log" 2>&1 &
BG_PIDS+=($!)

export QUIVER_SERVER_BIN="$ROOT/target/debug/quiver-server"
cargo test -p quiver-operator --locked --test cluster -- --ignored --test-threads=3 --nocapture
