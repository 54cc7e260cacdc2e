"""Template tests of charts/quiver with real helm: render with the values that change the
output and assert on the objects. Run by scripts/chart-it.sh (needs `helm` on PATH)."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "quiver"
# `helm template` without a cluster assumes an old Kubernetes when helm is built from source.
KUBE_VERSION = "1.33.13"


def render(*sets, namespace="quiver-system"):
    args = ["helm", "template", "quiver", str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return found


def test_defaults_install_crd_operator_rbac_and_dashboards():
    docs = render()
    crd = find(docs, "CustomResourceDefinition")[0]
    assert crd["metadata"]["name"] == "mcpservers.quiver.dev"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    dep = find(docs, "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "quiver-operator:0.1.0"
    assert "--server-image=quiver-server:0.1.0" in c["args"]
    assert "--leader-elect" not in c["args"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    rules = find(docs, "ClusterRole", "quiver")[0]["rules"]
    verbs = {(g, r): set(rule["verbs"]) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]}
    assert verbs[("quiver.dev", "mcpservers/status")] == {"patch"}
    assert verbs[("apps", "deployments")] == {"get", "list", "watch", "create", "patch"}, "get: the owner check of a child missing from the watch"
    assert "delete" not in verbs[("", "configmaps")], "the operator never deletes ConfigMaps"
    assert verbs[("", "secrets")] == {"get", "list", "watch", "create"}, "grant pods their Secrets; create the state keys; never patch or delete"
    # The optional children: watched (so a disabled one needs no GET to find none is left),
    # applied, checked and deleted when no longer wanted.
    for optional in [("autoscaling", "horizontalpodautoscalers"), ("policy", "poddisruptionbudgets"),
                     ("networking.k8s.io", "networkpolicies"), ("networking.k8s.io", "ingresses"),
                     ("gateway.networking.k8s.io", "httproutes"), ("monitoring.coreos.com", "servicemonitors")]:
        assert verbs[optional] == {"get", "list", "watch", "create", "patch", "delete"}, optional
    assert verbs[("discovery.k8s.io", "endpointslices")] == {"get"}
    assert not any("*" in v for v in verbs.values()), "no wildcard verbs"
    assert not find(docs, "Role"), "no leader-election Role with one replica"
    assert dep["spec"]["strategy"] == {"type": "Recreate"}, "two unelected operators never overlap"
    dashboards = find(docs, "ConfigMap")
    assert sorted(d["metadata"]["name"] for d in dashboards) == ["quiver-dashboard-quiver-dispatch", "quiver-dashboard-quiver-operator"]
    for d in dashboards:
        assert d["metadata"]["labels"]["grafana_dashboard"] == "1"
        (body,) = d["data"].values()
        assert json.loads(body)["panels"], "the dashboard JSON survives templating"
    assert not find(docs, "ServiceMonitor") and not find(docs, "PrometheusRule")


def test_replicas_turn_on_leader_election():
    docs = render("replicaCount=2")
    assert "--leader-elect" in find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    role = find(docs, "Role")[0]
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]
    assert find(docs, "RoleBinding")
    dep = find(docs, "Deployment")[0]
    # Standbys are Ready, so a surge pod can become Ready while the old leader still runs.
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert dep["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_optional_objects_and_overrides():
    docs = render("crds.enabled=false", "dashboards.enabled=false", "metrics.serviceMonitor.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom", "prometheusRules.enabled=true",
                  "image.tag=9.9.9", "server.image.repository=registry.example/quiver-server", "operator.probePods=false",
                  "server.serviceMonitor=true")
    assert not find(docs, "CustomResourceDefinition")
    assert not find(docs, "ConfigMap")
    sm = find(docs, "ServiceMonitor")[0]
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "admin"
    pr = find(docs, "PrometheusRule")[0]
    assert {g["name"] for g in pr["spec"]["groups"]} == {"quiver.recording", "quiver.alerts"}
    c = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "quiver-operator:9.9.9"
    assert "--server-image=registry.example/quiver-server:0.1.0" in c["args"]
    assert "--probe-pods=false" in c["args"]
    assert "--default-service-monitor=true" in c["args"], "the McpServers' ServiceMonitor default"
    assert "--default-service-monitor=false" in find(render(), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_alerts_can_wait_longer_or_shorter_or_be_left_out():
    rules_file = yaml.safe_load((CHART / "files" / "prometheus" / "quiver-rules.yaml").read_text())

    def alerts(*sets):
        pr = find(render("prometheusRules.enabled=true", *sets), "PrometheusRule")[0]
        return {r["alert"]: r for g in pr["spec"]["groups"] for r in g["rules"] if "alert" in r}

    stock = alerts()
    # The rules file as it is, once parsed and written again by the template.
    assert stock == {r["alert"]: r for g in rules_file["groups"] for r in g["rules"] if "alert" in r}
    tuned = alerts("prometheusRules.for.QuiverToolDefinitionsAwaitingApproval=0s",
                   "prometheusRules.disabled={QuiverUpstreamDown}")
    assert tuned["QuiverToolDefinitionsAwaitingApproval"]["for"] == "0s"
    assert "QuiverUpstreamDown" not in tuned
    assert {k: v for k, v in tuned.items() if k != "QuiverToolDefinitionsAwaitingApproval"} == \
        {k: v for k, v in stock.items() if k not in ("QuiverToolDefinitionsAwaitingApproval", "QuiverUpstreamDown")}
    # A misspelt alert is an error, not a silent no-op.
    bad = subprocess.run(["helm", "template", "quiver", str(CHART), "--kube-version", KUBE_VERSION,
                          "--set", "prometheusRules.enabled=true", "--set", "prometheusRules.for.QuiverUpstreamDwn=1m"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "QuiverUpstreamDwn, which is not one of Quiver's alerts" in bad.stderr, bad.stderr


def test_mcp_servers_service_monitors_get_the_labels_a_prometheus_selects_by():
    args = find(render("server.serviceMonitorLabels.release=kube-prometheus-stack", "server.serviceMonitorLabels.team=ml"),
                "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--service-monitor-label=release=kube-prometheus-stack" in args
    assert "--service-monitor-label=team=ml" in args
    plain = find(render(), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--service-monitor-label") for a in plain)


def test_a_namespace_scoped_install_has_roles_in_the_watched_namespaces_and_nothing_cluster_wide():
    cluster = render()
    docs = render("operator.watchNamespaces={team-a,team-b}")
    # Only the catalog's reviews are cluster-wide: TokenReviews and SubjectAccessReviews are
    # cluster-scoped requests no Role can grant.
    assert [r["metadata"]["name"] for r in find(docs, "ClusterRole")] == ["quiver-catalog"]
    assert [b["metadata"]["name"] for b in find(docs, "ClusterRoleBinding")] == ["quiver-catalog"]
    no_catalog = render("operator.watchNamespaces={team-a,team-b}", "catalog.enabled=false")
    assert not find(no_catalog, "ClusterRole") and not find(no_catalog, "ClusterRoleBinding")
    roles = {r["metadata"]["namespace"]: r for r in find(docs, "Role")}
    assert sorted(roles) == ["team-a", "team-b"]
    assert roles["team-a"]["rules"] == find(cluster, "ClusterRole", "quiver")[0]["rules"], "the same rules, namespaced"
    bindings = find(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"]["kind"] == "Role"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "quiver", "namespace": "quiver-system"}]
    args = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--watch-namespaces=team-a,team-b" in args
    assert not any(a.startswith("--watch-namespaces") for a in find(cluster, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"])


def test_crd_keep_can_be_turned_off():
    crd = find(render("crds.keep=false"), "CustomResourceDefinition")[0]
    assert "annotations" not in crd["metadata"] or "helm.sh/resource-policy" not in crd["metadata"]["annotations"]


@pytest.mark.parametrize("bad", ["unknownKey=1", "image.colour=red", "replicaCount=-1", "image.pullPolicy=Sometimes", "operator.watchNamespaces={Bad_NS}",
                                 "server.serviceMonitorLabels.release=" + "x" * 64])
def test_schema_rejects_unknown_and_invalid_values(bad):
    r = subprocess.run(["helm", "template", "quiver", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad], capture_output=True, text=True)
    assert r.returncode != 0, f"{bad} was accepted"
    assert "values don't meet the specifications of the schema" in r.stderr, r.stderr


def test_image_registry_names_where_both_images_come_from():
    c = find(render("imageRegistry=registry.example.com:5000/team/"), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example.com:5000/team/quiver-operator:0.1.0"
    assert "--server-image=registry.example.com:5000/team/quiver-server:0.1.0" in c["args"]
    c = find(render("imageRegistry=127.0.0.1:5001", "image.tag=2.0.0", "server.image.tag=2.0.1"), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "127.0.0.1:5001/quiver-operator:2.0.0"
    assert "--server-image=127.0.0.1:5001/quiver-server:2.0.1" in c["args"]


@pytest.mark.parametrize("bad", ["imageRegistry=https://registry.example.com", "imageRegistry=reg istry", "imageRegistry=registry.example.com/Team"])
def test_schema_rejects_a_registry_that_is_not_a_host_and_path(bad):
    r = subprocess.run(["helm", "template", "quiver", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad], capture_output=True, text=True)
    assert r.returncode != 0, f"{bad} was accepted"


def test_the_catalog_has_its_port_service_and_only_the_review_grants_it_needs():
    docs = render()
    c = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--catalog-listen=0.0.0.0:8082" in c["args"]
    assert "--catalog-auth=kubernetes" in c["args"]
    assert "--catalog-prefix=dev.quiver" in c["args"]
    assert {"name": "catalog", "containerPort": 8082, "protocol": "TCP"} in c["ports"]
    svc = find(docs, "Service", "quiver-catalog")[0]
    assert svc["spec"]["ports"] == [{"name": "catalog", "port": 8082, "targetPort": "catalog", "protocol": "TCP"}]
    rules = find(docs, "ClusterRole", "quiver-catalog")[0]["rules"]
    assert rules == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    open_catalog = render("catalog.auth=none", "catalog.namePrefix=com.example.mcp", "catalog.audiences={a,b}")
    c = find(open_catalog, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--catalog-auth=none" in c["args"] and "--catalog-prefix=com.example.mcp" in c["args"]
    assert "--catalog-audience=a" in c["args"] and "--catalog-audience=b" in c["args"]
    assert not find(open_catalog, "ClusterRole", "quiver-catalog"), "no reviews, no grant"
    off = render("catalog.enabled=false")
    assert not find(off, "Service", "quiver-catalog")
    assert not any(a.startswith("--catalog") for a in find(off, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"])
    with pytest.raises(subprocess.CalledProcessError):
        render("catalog.namePrefix=not_a_domain")


def test_the_console_is_off_by_default_and_when_on_has_its_service_sign_in_and_review_grant():
    assert not find(render(), "Service", "quiver-console")
    docs = render("catalog.enabled=false", "console.enabled=true", "console.url=https://console.example.com",
                  "console.issuer=https://id.example.com/realms/c", "console.usernameClaim=preferred_username")
    c = find(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    for a in ["--console-listen=0.0.0.0:8083", "--console-url=https://console.example.com",
              "--console-issuer=https://id.example.com/realms/c", "--console-client-id=quiver-console",
              "--console-username-claim=preferred_username", "--console-groups-prefix=oidc:",
              "--catalog-auth=kubernetes"]:
        assert a in c["args"], (a, c["args"])
    assert not any(a.startswith("--catalog-listen") for a in c["args"]), "the catalog itself stays off"
    assert not any(a.startswith("--console-prometheus") for a in c["args"]), "no figures unless asked"
    with_prom = render("console.enabled=true", "console.url=https://c", "console.issuer=https://id",
                       "console.prometheus=http://prometheus-operated.monitoring:9090")
    assert "--console-prometheus=http://prometheus-operated.monitoring:9090" in \
        find(with_prom, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"name": "console", "containerPort": 8083, "protocol": "TCP"} in c["ports"]
    svc = find(docs, "Service", "quiver-console")[0]
    assert svc["spec"]["sessionAffinity"] == "ClientIP"
    assert svc["spec"]["ports"] == [{"name": "console", "port": 8083, "targetPort": "console", "protocol": "TCP"}]
    assert find(docs, "ClusterRole", "quiver-catalog"), "the console's reviews need the grant"
    for missing in (["console.enabled=true", "console.issuer=https://id"], ["console.enabled=true", "console.url=https://c"]):
        with pytest.raises(subprocess.CalledProcessError):
            render(*missing)
