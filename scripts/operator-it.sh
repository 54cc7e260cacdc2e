#!/usr/bin/env bash
# Integration tests of the operator on a real local control plane: starts it, installs the
# CRD, runs the operator binary, runs operator/tests/cluster.rs (the `#[ignore = "needs
# cluster"]` tests), and tears everything down. Logs of every component are printed on failure.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

state="$(mktemp -d "${TMPDIR:-/tmp}/quiver-cp.XXXXXX")"
op_pid=""
cleanup() {
  status=$?
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null || true
  if [ "$status" != 0 ]; then
    for f in "$state"/logs/*.log; do [ -f "$f" ] && { echo "--- $(basename "$f") (last 40 lines)"; tail -40 "$f"; }; done
  fi
  "$ROOT/scripts/control-plane.sh" down "$state" || true
  exit "$status"
}
trap cleanup EXIT

"$ROOT/scripts/control-plane.sh" up "$state"
source "$state/env"

log "installing the CRD"
install_crd

log "starting quiver-operator"
"$ROOT/target/debug/quiver-operator" --admin-listen 127.0.0.1:0 --probe-pods=false > "$state/logs/quiver-operator.log" 2>&1 &
op_pid=$!

export QUIVER_SERVER_BIN="$ROOT/target/debug/quiver-server"
cargo test -p quiver-operator --locked --test cluster -- --ignored --test-threads=3 --nocapture
