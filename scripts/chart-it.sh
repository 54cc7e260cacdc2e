#!/usr/bin/env bash
# The Helm chart and the observability stack, checked for real:
#  - helm lint --strict; template tests (tests/chart) with real helm;
#  - the real prometheus-operator (scripts/prometheus-operator.sh) and its CRDs;
#  - `helm template | kubectl apply --dry-run=server` against a real kube-apiserver;
#  - `helm install` into it with the monitoring values docs/observability.md gives
#    kube-prometheus-stack users, then the operator binary running with the chart's own
#    ServiceAccount token (so the chart's RBAC is exactly what it gets) and the chart's
#    arguments reconciles samples;
#  - the ServiceMonitors of McpServers selected by the prometheus-operator's Prometheus
#    objects as their labels say, their jobs scraping the servers' admin port
#    (tests/observability/test_service_monitors.py);
#  - the audit recipe (deploy/otelcol/audit-pipeline.yaml) in a real OpenTelemetry Collector
#    reading a real server's output as the kubelet writes it (tests/observability/test_audit_pipeline.py);
#  - Prometheus (Debian) scraping three quiver-servers and that operator while bounded
#    traffic runs; every dashboard and rule expression must return data
#    (tests/observability/check_queries.py); promtool checks and unit-tests the rules;
#  - helm upgrade to 2 replicas (leader election, RollingUpdate maxUnavailable 0), two
#    elected operators with the chart's token: both Ready, one leads, SIGTERM hands over;
#  - helm uninstall (CRD kept).
# QUIVER_PREVIEWS=DIR also renders dashboard previews from the real results into DIR.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
python_env

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 200); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.05; done; echo "no answer from $1" >&2; return 1; }

BIN="$(target_dir)/debug"
control_plane_session chart

log "dashboards, chart copies and rules are generated from their sources"
"$PY" deploy/grafana/dashboards.py --check
diff -u crds/mcpservers.quiver.dev.yaml charts/quiver/files/crds/mcpservers.quiver.dev.yaml \
  || { echo "charts/quiver/files/crds drifted from crds/: copy it" >&2; exit 1; }

"$PY" charts/quiver/generate_readme.py --check
"$PY" tests/observability/validate_dashboards.py

log "promtool"
command -v promtool >/dev/null || apt_install prometheus
promtool check rules deploy/prometheus/quiver-rules.yaml
(cd tests/observability && promtool test rules quiver-rules.test.yaml)

log "helm lint --strict"
helm lint --strict charts/quiver

log "chart template tests (real helm)"
"$PY" -m pytest -q tests/chart

log "prometheus-operator (built from its Go module) and its CRDs"
mapfile -t promop < <("$ROOT/scripts/prometheus-operator.sh")
# Server-side: the CRDs are too large for the last-applied annotation of a client-side apply.
kubectl apply --server-side -f "${promop[1]}" >/dev/null
established() { [ "$(kubectl get crd "$1" -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" = True ]; }
for crd in servicemonitors prometheuses prometheusrules; do
  for _ in $(seq 1 300); do established "$crd.monitoring.coreos.com" && break; sleep 0.1; done
  established "$crd.monitoring.coreos.com" || { echo "CRD $crd.monitoring.coreos.com not Established after 30 s" >&2; exit 1; }
done
promop_port="$(free_port)"
# The admin kubeconfig: it only writes Secrets, ConfigMaps, Services and StatefulSets (whose
# Prometheus pods kwok pretends to run); the tests read the configuration it generates.
"${promop[0]}" --web.listen-address "127.0.0.1:$promop_port" > "$STATE/prometheus-operator.log" 2>&1 &
promop_pid=$!
BG_PIDS+=($promop_pid)
wait_http "http://127.0.0.1:$promop_port/healthz"

# What docs/observability.md tells kube-prometheus-stack users to set: the `--set` flags of
# its block marked `tested: kube-prometheus-stack`, read from the page (imageRegistry aside:
# nothing is pulled here), so the page and this check cannot drift apart.
export KPS_RELEASE=kube-prometheus-stack
mapfile -t monitoring_values < <("$PY" scripts/doc-block.py docs/observability.md kube-prometheus-stack | "$PY" -c '
import shlex, sys
words = shlex.split(sys.stdin.read().replace("\\\n", " "))
for i, w in enumerate(words[1:], 1):
    if words[i - 1] == "--set" and not w.startswith("imageRegistry="):
        print("--set"); print(w)
')
printf '%s\n' "${monitoring_values[@]}" | grep -qx "server.serviceMonitorLabels.release=$KPS_RELEASE" \
  || { echo "docs/observability.md's kube-prometheus-stack block sets no server.serviceMonitorLabels.release=$KPS_RELEASE: ${monitoring_values[*]}" >&2; exit 1; }
if printf '%s\n' "${monitoring_values[@]}" | grep -qx "server.serviceMonitor=true"; then
  export QUIVER_DEFAULT_SERVICE_MONITOR=true   # every McpServer gets a ServiceMonitor
fi
# The block installs the dashboards' ConfigMaps where kube-prometheus-stack's Grafana runs.
kubectl create namespace monitoring >/dev/null 2>&1 || true

log "helm template | kubectl apply --dry-run=server"
kubectl create namespace quiver-system >/dev/null
helm template quiver charts/quiver -n quiver-system --kube-version 1.33.13 "${monitoring_values[@]}" | kubectl apply --dry-run=server -f - >/dev/null
echo "every rendered object accepted by the API server (dry run), the ServiceMonitor and PrometheusRule by their real CRDs"

log "helm install (with the monitoring values)"
helm install quiver charts/quiver -n quiver-system "${monitoring_values[@]}" --wait --timeout 3m
kubectl get crd mcpservers.quiver.dev >/dev/null

log "operator with the chart's ServiceAccount token"
token="$(kubectl create token quiver -n quiver-system --duration=1h)"
server="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
ca="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')"
cat > "$STATE/sa.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority: "$ca"}}]
users: [{name: quiver, user: {token: "$token"}}]
contexts: [{name: quiver, context: {cluster: local, user: quiver, namespace: quiver-system}}]
current-context: quiver
KC
op_admin="$(free_port)"
cat_port="$(free_port)"
# The chart's ServiceMonitor and catalog arguments, as its Deployment passes them (the
# catalog on a free local port instead of the chart's).
mapfile -t chart_args < <(kubectl get deploy quiver -n quiver-system -o jsonpath='{range .spec.template.spec.containers[0].args[*]}{@}{"\n"}{end}' \
  | grep -E '^--(default-service-monitor|service-monitor-label|catalog-auth|catalog-prefix|catalog-audience)=')
[ "${#chart_args[@]}" -ge 2 ] || { echo "the chart's Deployment passes no ServiceMonitor arguments" >&2; exit 1; }
KUBECONFIG="$STATE/sa.kubeconfig" POD_NAMESPACE=quiver-system "$BIN/quiver-operator" \
  --admin-listen "127.0.0.1:$op_admin" --catalog-listen "127.0.0.1:$cat_port" --probe-pods=false "${chart_args[@]}" > "$STATE/operator.log" 2>&1 &
op_pid=$!
BG_PIDS+=($op_pid)
wait_http "http://127.0.0.1:$op_admin/readyz"
kubectl create namespace demo >/dev/null
for s in calculator every-handler tuned autoscaled tools-from-configmap authenticated-api; do kubectl apply -n demo -f "deploy/samples/$s.yaml" >/dev/null; done
wait_condition demo Ready True 120 calculator every-handler tuned inventory assistant
wait_condition demo ConfigValid True 60 autoscaled from-configmap
kubectl get qmcp -n demo
if grep -q "forbidden" "$STATE/operator.log"; then echo "the chart's RBAC is missing a permission:" >&2; grep forbidden "$STATE/operator.log" | head -5 >&2; exit 1; fi
# An invalid McpServer, so the operator's invalid-spec series carry data.
kubectl apply -n demo -f - >/dev/null <<'YAML'
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: broken}
spec:
  tools: [{name: x, handler: {builtin: nope}}]
YAML
wait_condition demo ConfigValid False 60 broken

log "ServiceMonitors selected by the real prometheus-operator (tests/observability/test_service_monitors.py)"
"$PY" -m pytest -q -p no:cacheprovider tests/observability/test_service_monitors.py
kill "$promop_pid"; wait "$promop_pid" 2>/dev/null || true

log "audit records and logs through deploy/otelcol/audit-pipeline.yaml (tests/observability/test_audit_pipeline.py)"
"$ROOT/scripts/otelcol.sh" build >/dev/null
"$ROOT/scripts/otelcol.sh" build-agent >/dev/null
QUIVER_SERVER_BIN="$BIN/quiver-server" "$PY" -m pytest -q -p no:cacheprovider tests/observability/test_audit_pipeline.py
if grep -q "forbidden" "$STATE/operator.log"; then echo "the chart's RBAC is missing a permission:" >&2; grep forbidden "$STATE/operator.log" | head -5 >&2; exit 1; fi

log "quiver-servers and Prometheus"
mkdir -p "$STATE/servers"
targets=()
urls=()
for i in 0 1 2; do
  cp tests/observability/tools.yaml "$STATE/servers/tools-$i.yaml"
  # An upstream MCP server for the upstream panels: quiver-server itself over stdio.
  cat >> "$STATE/servers/tools-$i.yaml" <<YAML
upstreams:
  - name: inner
    stdio: {command: ["$BIN/quiver-server", --stdio, --admin-listen, "off", --config, "file:$ROOT/tests/observability/tools.yaml"]}
    tools: {prefix: inner_, include: [add, greet]}
    pin: warn
YAML
  port="$(free_port)"; admin="$(free_port)"
  "$BIN/quiver-server" --config "file:$STATE/servers/tools-$i.yaml" --listen "127.0.0.1:$port" \
    --admin-listen "127.0.0.1:$admin" > "$STATE/server-$i.log" 2>&1 &
  BG_PIDS+=($!)
  wait_http "http://127.0.0.1:$admin/readyz"
  urls+=("http://127.0.0.1:$port/mcp")
  targets+=("$admin")
done
# Each server's upstream connected and its tools imported before the traffic starts.
for a in "${targets[@]}"; do
  for _ in $(seq 1 150); do
    curl -fsS "http://127.0.0.1:$a/status" | grep -q '"state":"ready"' && break
    sleep 0.1
  done
  curl -fsS "http://127.0.0.1:$a/status" | grep -q '"state":"ready"' || { echo "upstream of admin port $a not ready" >&2; exit 1; }
done
prom_port="$(free_port)"
cat > "$STATE/prometheus.yml" <<PROM
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$ROOT/deploy/prometheus/quiver-rules.yaml"]
scrape_configs:
  - job_name: quiver-server
    static_configs:
      - {targets: ["127.0.0.1:${targets[0]}"], labels: {namespace: demo, service: calculator, pod: calculator-0}}
      - {targets: ["127.0.0.1:${targets[1]}"], labels: {namespace: demo, service: calculator, pod: calculator-1}}
      - {targets: ["127.0.0.1:${targets[2]}"], labels: {namespace: shop, service: catalog, pod: catalog-0}}
  - job_name: quiver-operator
    static_configs:
      - {targets: ["127.0.0.1:$op_admin"], labels: {namespace: quiver-system, pod: quiver-operator-0}}
PROM
promtool check config "$STATE/prometheus.yml" >/dev/null
prometheus --config.file "$STATE/prometheus.yml" --storage.tsdb.path "$STATE/tsdb" \
  --web.listen-address "127.0.0.1:$prom_port" > "$STATE/prometheus.log" 2>&1 &
BG_PIDS+=($!)
wait_http "http://127.0.0.1:$prom_port/-/ready"
for _ in $(seq 1 100); do
  up="$(curl -fsS "http://127.0.0.1:$prom_port/api/v1/query?query=sum(up)" | "$PY" -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')"
  [ "$up" = 4 ] && break
  sleep 0.2
done
[ "$up" = 4 ] || { echo "Prometheus scrapes $up/4 targets" >&2; exit 1; }
since="$(date +%s)"

log "the catalog through the chart's review grants (TokenReview, SubjectAccessReview)"
catalog_token="$(kubectl create token quiver -n quiver-system --duration=10m)"
catalog_list() { curl -fsS -H "Authorization: Bearer $catalog_token" "http://127.0.0.1:$cat_port/v0.1/servers?limit=100"; }
listed="$(catalog_list)"
grep -q '"dev.quiver.demo/calculator"' <<<"$listed" \
  || { echo "the catalog does not list demo/calculator with the operator's own token: $listed" >&2; exit 1; }

log "bounded traffic (30 s)"
# Catalog requests beside the MCP traffic (60, paced over the same 30 s), so its panels
# have data too.
( for _ in $(seq 1 60); do catalog_list >/dev/null; sleep 0.5; done ) &
catalog_traffic=$!
"$PY" tests/observability/drive_traffic.py --seconds 30 --config "$STATE/servers/tools-0.yaml" "${urls[@]}" 2>&1 | tee "$STATE/failure.txt"
wait "$catalog_traffic"
# Wait until every target has been scraped after the traffic ended, so its last samples are in.
done_at="$(date +%s)"
for _ in $(seq 1 150); do
  last="$(curl -fsS "http://127.0.0.1:$prom_port/api/v1/query?query=min(timestamp(up))" | "$PY" -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(int(float(r[0]["value"][1])) if r else 0)')"
  [ "$last" -gt "$done_at" ] && break
  sleep 0.1
done
[ "$last" -gt "$done_at" ] || { echo "Prometheus did not scrape every target after the traffic ended" >&2; exit 1; }
preview_args=()
[ -n "${QUIVER_PREVIEWS:-}" ] && preview_args=(--previews "$QUIVER_PREVIEWS" --since "$since")
"$PY" tests/observability/check_queries.py --prometheus "http://127.0.0.1:$prom_port" "${preview_args[@]}" 2>&1 | tee "$STATE/failure.txt"

log "helm upgrade (2 replicas: leader election, a rolling update that waits for Ready)"
helm upgrade quiver charts/quiver -n quiver-system --set replicaCount=2 --wait --timeout 3m
kubectl get role quiver-leader-election -n quiver-system >/dev/null
kubectl get deploy quiver -n quiver-system -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- --leader-elect
strategy="$(kubectl get deploy quiver -n quiver-system -o jsonpath='{.spec.strategy.type} {.spec.strategy.rollingUpdate.maxUnavailable} {.spec.strategy.rollingUpdate.maxSurge} {.spec.template.spec.containers[0].readinessProbe.httpGet.path}')"
[ "$strategy" = "RollingUpdate 0 1 /readyz" ] || { echo "2-replica Deployment: strategy/readiness '$strategy'" >&2; exit 1; }

log "two elected operators with the chart's ServiceAccount (Lease RBAC, standby Ready, handover)"
# kwok marks the chart's pods Ready without running them, so the replicas run here, with the
# chart's token. The single operator above stops first: it is not elected.
kill "$op_pid"; wait "$op_pid" 2>/dev/null || true
leader_gauge() { curl -fsS "http://127.0.0.1:$1/metrics" | awk '$1 == "quiver_operator_leader" {print $2}'; }
ready() { curl -fsS -o /dev/null "http://127.0.0.1:$1/readyz" 2>/dev/null; }
ports=(); pids=()
for r in a b; do
  port="$(free_port)"
  KUBECONFIG="$STATE/sa.kubeconfig" POD_NAMESPACE=quiver-system POD_NAME="replica-$r" "$BIN/quiver-operator" \
    --admin-listen "127.0.0.1:$port" --probe-pods=false --leader-elect \
    --lease-duration-seconds 4 --renew-deadline-seconds 3 --retry-period-seconds 1 > "$STATE/replica-$r.log" 2>&1 &
  pids+=($!); BG_PIDS+=($!); ports+=("$port")
done
leader=""
for _ in $(seq 1 300); do
  if ready "${ports[0]}" && ready "${ports[1]}"; then
    g0="$(leader_gauge "${ports[0]}")"; g1="$(leader_gauge "${ports[1]}")"
    [ "$g0$g1" = 10 ] && leader=0 && break
    [ "$g0$g1" = 01 ] && leader=1 && break
  fi
  sleep 0.1
done
[ -n "$leader" ] || { echo "want both replicas Ready and one leader" >&2; exit 1; }
standby=$((1 - leader))
echo "replica $leader leads, replica $standby stands by, both Ready"
kill -TERM "${pids[$leader]}"
for _ in $(seq 1 150); do [ "$(leader_gauge "${ports[$standby]}")" = 1 ] && break; sleep 0.1; done
[ "$(leader_gauge "${ports[$standby]}")" = 1 ] || { echo "the standby did not take over within 15 s of SIGTERM" >&2; exit 1; }
echo "the standby took over after SIGTERM"
if grep -q "forbidden" "$STATE"/replica-*.log; then echo "the chart's leader-election RBAC is missing a permission:" >&2; grep forbidden "$STATE"/replica-*.log | head -5 >&2; exit 1; fi

log "namespace-scoped install: Roles in the watched namespace, nothing cluster-wide but the catalog's review grants, the operator reconciles there"
kill "${pids[$standby]}"; wait "${pids[$standby]}" 2>/dev/null || true
kubectl create namespace scoped >/dev/null
helm upgrade quiver charts/quiver -n quiver-system --set replicaCount=1 --set 'operator.watchNamespaces={scoped}' --wait --timeout 3m
! kubectl get clusterrole quiver >/dev/null 2>&1 || { echo "a namespace-scoped install left a ClusterRole" >&2; exit 1; }
kubectl get role quiver -n scoped >/dev/null
kubectl get deploy quiver -n quiver-system -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q -- --watch-namespaces=scoped
token="$(kubectl create token quiver -n quiver-system --duration=1h)"
sed -i "s|token: \".*\"|token: \"$token\"|" "$STATE/sa.kubeconfig"
port="$(free_port)"
KUBECONFIG="$STATE/sa.kubeconfig" POD_NAMESPACE=quiver-system "$BIN/quiver-operator" \
  --admin-listen "127.0.0.1:$port" --probe-pods=false --watch-namespaces=scoped > "$STATE/scoped.log" 2>&1 &
scoped_pid=$!; BG_PIDS+=($scoped_pid)
wait_http "http://127.0.0.1:$port/readyz"
kubectl apply -n scoped -f deploy/samples/authenticated-api.yaml >/dev/null
wait_condition scoped Ready True 120 inventory assistant
kubectl get networkpolicy,role -n scoped >/dev/null
if grep -q "forbidden" "$STATE/scoped.log"; then echo "the namespace-scoped Roles are missing a permission:" >&2; grep forbidden "$STATE/scoped.log" | head -5 >&2; exit 1; fi
kill "$scoped_pid"; wait "$scoped_pid" 2>/dev/null || true
echo "namespace-scoped operator reconciled with Roles only"

log "helm uninstall (the CRD and the McpServers stay)"
helm uninstall quiver -n quiver-system --wait
kubectl get crd mcpservers.quiver.dev >/dev/null
kubectl get qmcp calculator -n demo >/dev/null
! kubectl get clusterrole quiver >/dev/null 2>&1
echo "chart checks passed"
