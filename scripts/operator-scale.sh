#!/usr/bin/env bash
# Operator at scale on a real control plane with a kwok node: N McpServers (default 1000, a
# mix of inline tools and shared ToolSets), measured by scripts/operator_scale.py: create ->
# every one reconciled, edit -> rendered ConfigMap and -> status (p50/p99, through watches),
# a shared ToolSet edit -> every reader re-rendered, API requests per second at rest (the
# operator's share of apiserver_request_total), operator CPU and RSS at rest, and the
# operator's reconcile-duration histogram.
#   scripts/operator-scale.sh [N] [driver options: --edits 20 --rest 60 --window 30 ...]
# Uses the release quiver-operator of cargo's target directory. Long: not in the test command.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
N="${1:-1000}"
shift || true

log "building quiver-operator (release)"
cargo build --release -p quiver-operator --locked --quiet

control_plane_session scale
# The control plane's kwok node has 32 CPUs: room for 320 server pods of 100m. A second one
# holds the rest, so that every Deployment can become ready (a pending pod would keep the
# scheduler retrying and the Deployments' status changing: not the operator at rest).
"$ROOT/scripts/control-plane.sh" node kwok-node-1 1000 4Ti 5000
install_crd
admin_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$(target_dir)/release/quiver-operator" --admin-listen "127.0.0.1:$admin_port" --concurrency 16 --probe-pods=false > "$STATE/operator.log" 2>&1 &
op_pid=$!
BG_PIDS+=($op_pid)
for _ in $(seq 1 300); do
  curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

log "measuring with $N McpServers"
pki="$STATE/cp/pki"
python3 "$ROOT/scripts/operator_scale.py" --server "$(kubectl config view -o jsonpath='{.clusters[0].cluster.server}')" \
  --ca "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  --admin-port "$admin_port" --pid "$op_pid" --n "$N" "$@"

curl -fsS "http://127.0.0.1:$admin_port/metrics" | python3 -c '
import sys
buckets, total = {}, 0.0
for line in sys.stdin:
    if line.startswith("quiver_operator_reconcile_duration_seconds_bucket"):
        le = line.split("le=\"")[1].split("\"")[0]
        le = float("inf") if le == "+Inf" else float(le)
        buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    elif line.startswith("quiver_operator_reconcile_duration_seconds_count"):
        total += float(line.rsplit(" ", 1)[1])
b = sorted(buckets.items())
def q(p):
    return next((le for le, c in b if c >= p * total), float("inf")) * 1000
print(f"reconcile duration (whole run, {int(total)} reconciles; histogram bucket bounds): "
      f"p50 <= {q(0.5):g} ms, p90 <= {q(0.9):g} ms, p99 <= {q(0.99):g} ms")'
