#!/usr/bin/env bash
# Operator at scale on a real control plane with kwok nodes: creates N McpServers (default
# 1000), measures the time until every one is reconciled (status.observedGeneration current,
# ConfigValid=True), the latency of a tools edit reaching its ConfigMap with N objects
# present, the operator's reconcile-duration histogram and its resident memory.
#   scripts/operator-scale.sh [N]        (uses the release quiver-operator of cargo's target directory)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
N="${1:-1000}"

log "building quiver-operator (release)"
cargo build --release -p quiver-operator --locked --quiet

control_plane_session scale
# One kwok node holds 2000 pods; add more for larger N.
install_crd
admin_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$(target_dir)/release/quiver-operator" --admin-listen "127.0.0.1:$admin_port" --concurrency 16 --probe-pods=false > "$STATE/operator.log" 2>&1 &
op_pid=$!
BG_PIDS+=($op_pid)
kubectl create namespace scale >/dev/null

log "creating $N McpServers"
python3 - "$N" > "$STATE/mcps.yaml" <<'PY'
import sys
n = int(sys.argv[1])
for i in range(n):
    print(f"""---
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {{name: s{i:05d}, namespace: scale}}
spec:
  tools:
    - {{name: add, handler: {{builtin: add}}}}
    - {{name: greet, input: {{name: string}}, handler: {{template: "Hello {{{{name}}}} from {i}"}}}}""")
PY
start=$(date +%s.%N)
kubectl apply --server-side -f "$STATE/mcps.yaml" >/dev/null
created=$(date +%s.%N)
reconciled() {
  kubectl get qmcp -n scale -o json | python3 -c '
import json,sys
items = json.load(sys.stdin)["items"]
ok = sum(1 for m in items if (m.get("status") or {}).get("observedGeneration") == m["metadata"]["generation"]
         and any(c["type"] == "ConfigValid" and c["status"] == "True" for c in (m.get("status") or {}).get("conditions", [])))
print(ok)'
}
for _ in $(seq 1 600); do
  n="$(reconciled)"
  [ "$n" -ge "$N" ] && break
  sleep 1
done
done_at=$(date +%s.%N)
[ "$(reconciled)" -ge "$N" ] || { echo "only $(reconciled)/$N reconciled within 10 min" >&2; exit 1; }
rss_kb="$(awk '/VmRSS/ {print $2}' /proc/$op_pid/status)"

log "tools-edit latency with $N McpServers present (10 samples)"
lat=()
for i in $(seq 1 10); do
  name="s$(printf %05d $((i * 7)))"
  t0=$(date +%s%N)
  kubectl patch qmcp "$name" -n scale --type merge -p "{\"spec\":{\"tools\":[{\"name\":\"add\",\"handler\":{\"builtin\":\"add\"}},{\"name\":\"edit$i\",\"handler\":{\"builtin\":\"echo\"}}]}}" >/dev/null
  for _ in $(seq 1 300); do
    kubectl get cm "$name-tools" -n scale -o jsonpath='{.data.tools\.yaml}' | grep -q "edit$i" && break
    sleep 0.02
  done
  lat+=($(( ($(date +%s%N) - t0) / 1000000 )))
done
sorted="$(printf '%s\n' "${lat[@]}" | sort -n | tr '\n' ' ')"
metrics="$(curl -fsS "http://127.0.0.1:$admin_port/metrics")"
python3 - "$metrics" <<'PY' > "$STATE/hist.txt"
import sys
b = []
for line in sys.argv[1].splitlines():
    if line.startswith("quiver_operator_reconcile_duration_seconds_bucket"):
        le = line.split('le="')[1].split('"')[0]
        b.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if line.startswith("quiver_operator_reconcile_duration_seconds_count"):
        total = float(line.rsplit(" ", 1)[1])
def q(p):
    for le, c in b:
        if c >= p * total:
            return le
print(f"reconciles: {int(total)}; reconcile duration p50 <= {q(0.5)*1000:g} ms, p90 <= {q(0.9)*1000:g} ms, p99 <= {q(0.99)*1000:g} ms (histogram bucket bounds)")
PY
echo
echo "McpServers:                       $N"
printf 'create -> all reconciled:         %.1f s (kubectl apply took %.1f s)\n' "$(echo "$done_at - $start" | bc)" "$(echo "$created - $start" | bc)"
echo "operator RSS after settling:      $((rss_kb / 1024)) MiB"
echo "tools edit -> ConfigMap (ms):     $sorted"
cat "$STATE/hist.txt"
