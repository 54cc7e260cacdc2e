//! Unit tests of the built children: inline YAML in, objects out.

use serde_json::json;

use super::*;
use crate::render::render;

pub(crate) fn mcp(yaml: &str) -> McpServer {
    let mut m: McpServer = serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
    m.metadata.namespace = Some("ns".into());
    m.metadata.uid = Some("uid-1".into());
    m
}

fn children(yaml: &str) -> Children {
    let m = mcp(yaml);
    let r = render(&m, &vec![None; m.spec.tools_from.len()]).unwrap_or_else(|e| panic!("{e:?}"));
    children_of(&m, &r)
}

/// The children of a rendered McpServer, with test defaults.
pub(crate) fn children_of(m: &McpServer, r: &Rendered) -> Children {
    build(
        m,
        r,
        &Defaults {
            server_image: "quiver-server:test".into(),
            image_pull_policy: "IfNotPresent".into(),
            service_monitors: false,
            service_monitor_labels: Default::default(),
            catalog_prefix: "dev.quiver".into(),
        },
        &ApiServer {
            endpoints: vec![("172.18.0.2".into(), 6443)],
        },
    )
    .unwrap()
}

const BASIC: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  tools:
    - {name: add, handler: {builtin: add}}
"#;

#[test]
fn basic_children_are_owned_and_restricted() {
    let c = children(BASIC);
    let d = serde_json::to_value(&c.deployment).unwrap();
    assert_eq!(d["metadata"]["ownerReferences"][0]["kind"], "McpServer");
    assert_eq!(d["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(d["spec"]["replicas"], 1);
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "calc");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let ctr = &pod["containers"][0];
    assert_eq!(ctr["image"], "quiver-server:test");
    assert_eq!(ctr["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(ctr["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert!(
        ctr["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--config=configmap:ns/calc-tools"))
    );
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
    // A stopping pod keeps serving until it has left the endpoints, within the pod's grace.
    let env = |name: &str| {
        ctr["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(env("QUIVER_SHUTDOWN_DELAY"), Some(json!("5s")));
    assert_eq!(env("QUIVER_SHUTDOWN_GRACE"), Some(json!("20s")));
    // The programs it starts get private directories in a writable scratch space.
    assert_eq!(env("TMPDIR"), Some(json!("/quiver/tmp")));
    // Audit records name the McpServer they come from.
    assert_eq!(env("QUIVER_INSTANCE"), Some(json!("ns/calc")));
    assert!(
        ctr["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/quiver/tmp"
                && m["name"] == "quiver-tmp"
                && m.get("readOnly").is_none())
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let role = serde_json::to_value(&c.role).unwrap();
    assert_eq!(role["rules"][0]["resourceNames"], json!(["calc-tools"]));
    assert_eq!(role["rules"][0]["verbs"], json!(["get", "list", "watch"]));
    assert!(c.hpa.is_none() && c.pdb.is_none());
    // The ConfigMap holds the ToolSet as JSON, one tool per line, which the server reads
    // back to the same tools.
    let tools = &c.config_map.data.as_ref().unwrap()[TOOLS_KEY];
    assert!(
        tools.contains(r#"{"handler":{"builtin":"add"},"name":"add"}"#),
        "{tools}"
    );
    let ts = quiver_model::config::parse("cm", tools).unwrap();
    assert_eq!(
        ts.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["add"]
    );
}

#[test]
fn cpu_pinning_makes_guaranteed_pods_with_pinned_workers() {
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: fast}
spec:
  replicas: 3
  resources: {limits: {cpu: "4", memory: 512Mi}, requests: {cpu: 500m}}
  tuning: {profile: throughput, cpuPinning: true, cpus: 2, perCoreListeners: true, allocator: system, sysctls: {net.ipv4.tcp_fin_timeout: "10"}, unsafeSysctls: {net.core.somaxconn: "4096"}}
  tools: [{name: add, handler: {builtin: add}}]
"#,
    );
    let d = serde_json::to_value(&c.deployment).unwrap();
    let ctr = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        ctr["resources"]["requests"],
        json!({"cpu": "2", "memory": "512Mi"})
    );
    assert_eq!(ctr["resources"]["limits"], ctr["resources"]["requests"]);
    let args = ctr["args"].as_array().unwrap();
    assert!(
        args.contains(&json!("--pin-workers"))
            && args.contains(&json!("--worker-threads=2"))
            && args.contains(&json!("--per-core-listeners")),
        "{args:?}"
    );
    assert_eq!(
        ctr["env"][1],
        json!({"name": "QUIVER_ALLOCATOR", "value": "system"})
    );
    let sysctls = &d["spec"]["template"]["spec"]["securityContext"]["sysctls"];
    assert_eq!(
        sysctls,
        &json!([
            {"name": "net.core.somaxconn", "value": "4096"},
            {"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"},
            {"name": "net.ipv4.tcp_fin_timeout", "value": "10"},
        ])
    );
    assert!(c.pdb.is_some(), "several replicas get a PodDisruptionBudget");
}

#[test]
fn autoscaling_leaves_replicas_to_the_hpa() {
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: auto}
spec:
  autoscaling: {minReplicas: 2, maxReplicas: 5}
  tools: [{name: add, handler: {builtin: add}}]
"#,
    );
    let d = serde_json::to_value(&c.deployment).unwrap();
    assert!(
        d["spec"].get("replicas").is_none(),
        "the HPA owns the replica count"
    );
    let h = serde_json::to_value(c.hpa.unwrap()).unwrap();
    assert_eq!(h["spec"]["scaleTargetRef"]["name"], "auto");
    assert_eq!(
        h["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"],
        70
    );
}

#[test]
fn a_tools_only_change_changes_only_the_config_map() {
    let a = children(BASIC);
    let b = children(&BASIC.replace(
        "{name: add, handler: {builtin: add}}",
        "{name: add, handler: {builtin: add}}\n    - {name: up, handler: {builtin: upper}}",
    ));
    assert_ne!(a.config_map, b.config_map);
    assert_eq!(
        a.deployment, b.deployment,
        "the pod template must not change, so nothing rolls"
    );
    assert_eq!(a.service, b.service);
}

#[test]
fn unsafe_sysctls_under_sysctls_are_flagged() {
    let m = mcp(&BASIC.replace(
        "spec:\n",
        "spec:\n  tuning: {sysctls: {net.core.somaxconn: \"1024\"}}\n",
    ));
    assert_eq!(unsafe_in_safe_list(&m), vec!["net.core.somaxconn".to_owned()]);
}

#[test]
fn every_child_carries_the_label_the_owned_watches_select() {
    let c = children(&BASIC.replace("spec:\n", "spec:\n  monitoring: {serviceMonitor: true}\n"));
    let managed = |labels: &Option<BTreeMap<String, String>>| {
        labels
            .as_ref()
            .and_then(|l| l.get(MANAGED_BY.0))
            .map(String::as_str)
            == Some(MANAGED_BY.1)
    };
    assert!(
        managed(&c.config_map.metadata.labels),
        "the owned-ConfigMap watch selects by it"
    );
    assert!(managed(&c.deployment.metadata.labels));
    assert!(managed(&c.service.metadata.labels));
    let sm = c.service_monitor.expect("monitoring.serviceMonitor builds one");
    assert!(managed(&sm.metadata.labels));
    assert_eq!(sm.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");
    let v = serde_json::to_value(&sm).unwrap();
    assert_eq!(v["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(v["kind"], "ServiceMonitor");
    assert_eq!(
        v["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "calc"
    );
    assert_eq!(v["spec"]["endpoints"][0]["port"], "admin");
    assert!(children(BASIC).service_monitor.is_none());
}

#[test]
fn a_service_monitor_carries_the_default_labels_then_the_mcpservers_own() {
    let spec = BASIC.replace(
        "spec:\n",
        "spec:\n  monitoring: {serviceMonitor: true, serviceMonitorLabels: {team: ml, release: mine}}\n",
    );
    let m = mcp(&spec);
    let r = render(&m, &vec![]).unwrap();
    let defaults = Defaults {
        server_image: "s".into(),
        image_pull_policy: "Never".into(),
        service_monitors: false,
        service_monitor_labels: [
            ("release".to_owned(), "kube-prometheus-stack".to_owned()),
            ("env".to_owned(), "prod".to_owned()),
        ]
        .into_iter()
        .collect(),
        catalog_prefix: "dev.quiver".into(),
    };
    let c = build(&m, &r, &defaults, &ApiServer::default()).unwrap();
    let labels = c.service_monitor.unwrap().metadata.labels.unwrap();
    assert_eq!(labels["release"], "mine", "the McpServer's own value wins");
    assert_eq!(labels["env"], "prod");
    assert_eq!(labels["team"], "ml");
    assert_eq!(labels[MANAGED_BY.0], MANAGED_BY.1, "the operator's labels stay");
    // Only the ServiceMonitor carries them.
    assert!(!c.deployment.metadata.labels.unwrap().contains_key("release"));
}

#[test]
fn service_monitor_labels_that_are_not_labels_or_are_the_operators_are_refused() {
    for (labels, want) in [
        ("{app.kubernetes.io/managed-by: me}", "the operator's"),
        ("{quiver.dev/tools: x}", "the operator's"),
        ("{'bad key': x}", "not a label key"),
        ("{'Example.com/x': y}", "not a label key"),
        ("{release: 'has space'}", "not a label value"),
        ("{release: -x}", "not a label value"),
    ] {
        let spec = BASIC.replace(
            "spec:\n",
            &format!("spec:\n  monitoring: {{serviceMonitorLabels: {labels}}}\n"),
        );
        let problems = crate::build::service_monitor_label_problems(&mcp(&spec));
        assert!(
            problems.len() == 1 && problems[0].contains(want),
            "{labels}: {problems:?}"
        );
    }
    let many: Vec<String> = (0..17).map(|i| format!("k{i}: v")).collect();
    let spec = BASIC.replace(
        "spec:\n",
        &format!(
            "spec:\n  monitoring: {{serviceMonitorLabels: {{{}}}}}\n",
            many.join(", ")
        ),
    );
    assert!(crate::build::service_monitor_label_problems(&mcp(&spec))[0].contains("at most 16"));
    let ok = BASIC.replace(
        "spec:\n",
        "spec:\n  monitoring: {serviceMonitorLabels: {example.com/team: ml-1, release: ''}}\n",
    );
    assert!(crate::build::service_monitor_label_problems(&mcp(&ok)).is_empty());
}

#[test]
fn an_mcpserver_without_uid_is_an_error_not_a_panic() {
    let mut m = mcp(BASIC);
    m.metadata.uid = None;
    let r = render(&m, &vec![]).unwrap();
    let defaults = Defaults {
        server_image: "s".into(),
        image_pull_policy: "Never".into(),
        service_monitors: false,
        service_monitor_labels: Default::default(),
        catalog_prefix: "dev.quiver".into(),
    };
    assert_eq!(
        build(&m, &r, &defaults, &ApiServer::default()).unwrap_err(),
        Unowned
    );
}

#[test]
fn a_ca_bundle_configmap_is_granted_as_a_configmap_not_a_secret() {
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  tools:
    - name: version
      handler: {http: {url: "https://kubernetes.default.svc/version", tls: {caConfigMap: kube-root-ca.crt}}}
    - name: mtls
      handler: {http: {url: "https://api.example/x", tls: {caConfigMap: corp-bundle, clientCertSecret: client-tls}}}
"#,
    );
    let rules = serde_json::to_value(&c.role).unwrap()["rules"].clone();
    assert_eq!(
        rules,
        json!([
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["api-tools", "corp-bundle", "kube-root-ca.crt"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["client-tls"], "verbs": ["get", "list", "watch"]},
        ])
    );
    let m = mcp(r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  tools:
    - name: v
      handler: {http: {url: "https://k/version", tls: {caConfigMap: Not_A_Name, caSecret: also}}}
"#);
    let problems = render(&m, &vec![]).unwrap_err().problems.join("\n");
    assert!(
        problems.contains("tls.caConfigMap: not a ConfigMap name"),
        "{problems}"
    );
    assert!(problems.contains("set one"), "{problems}");
}

#[test]
fn the_role_grants_exactly_the_secrets_the_tools_and_auth_read() {
    let c = children(BASIC);
    let rules = serde_json::to_value(&c.role).unwrap()["rules"].clone();
    assert_eq!(
        rules.as_array().unwrap().len(),
        1,
        "no Secret rule without secrets: {rules}"
    );
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  auth: {bearerTokenSecretRef: {name: clients, key: tokens}}
  tools:
    - name: get
      handler: {http: {url: "https://api.example/x", headers: {Authorization: "Bearer {{secret.api-token.token}}"}}}
    - name: run
      handler: {exec: {command: [/bin/true], env: {K: "{{secret.api-token.other}}{{secret.db.password}}"}}}
"#,
    );
    let rules = serde_json::to_value(&c.role).unwrap()["rules"].clone();
    assert_eq!(
        rules[1],
        json!({"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["api-token", "clients", "db"], "verbs": ["get", "list", "watch"]})
    );
    let d = serde_json::to_value(&c.deployment).unwrap();
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(
        args.as_array().unwrap().contains(&json!("--secrets=kube:ns")),
        "{args}"
    );
    assert!(
        args.as_array()
            .unwrap()
            .contains(&json!("--auth-tokens-secret=clients.tokens")),
        "{args}"
    );
    assert!(!args.to_string().contains("--auth-issuer"));
    let o = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  auth:
    oidc: {issuer: "https://login.example", audience: "https://mcp.example/mcp", jwksUri: "https://login.example/keys", groupsClaim: realm_access.roles, caConfigMap: corp-ca.crt}
  tools: [{name: add, handler: {builtin: add}}]
"#,
    );
    let d = serde_json::to_value(&o.deployment).unwrap();
    let oidc_args = d["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    for a in [
        "--auth-issuer=https://login.example",
        "--auth-audience=https://mcp.example/mcp",
        "--auth-jwks-url=https://login.example/keys",
        "--auth-groups-claim=realm_access.roles",
        "--auth-issuer-ca-configmap=corp-ca.crt",
    ] {
        assert!(
            oidc_args.as_array().unwrap().contains(&json!(a)),
            "{a}: {oidc_args}"
        );
    }
    assert!(!oidc_args.to_string().contains("--auth-tokens-secret"));
    let rules = serde_json::to_value(&o.role).unwrap()["rules"].clone();
    assert_eq!(
        rules[0]["resourceNames"],
        json!(["api-tools", "corp-ca.crt"]),
        "the issuer's CA bundle may be read"
    );
    // Never written into the tools ConfigMap: only the references are.
    let yaml = &c.config_map.data.as_ref().unwrap()["tools.yaml"];
    assert!(yaml.contains("{{secret.api-token.token}}"), "{yaml}");
}

#[test]
fn secret_names_kubernetes_cannot_hold_are_invalid_specs() {
    let m = mcp(r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  tools:
    - {name: get, handler: {http: {url: "https://api.example/x", headers: {A: "{{secret.My_Token.k}}"}}}}
"#);
    let e = render(&m, &Vec::new()).unwrap_err();
    assert_eq!(e.reason, "InvalidToolConfig");
    assert!(
        e.problems[0].contains("`My_Token` is not a Kubernetes Secret name"),
        "{e:?}"
    );
}

#[test]
fn pod_fields_users_expect_reach_the_pod() {
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  tools: [{name: add, handler: {builtin: add}}]
  podTemplate:
    imagePullSecrets: [{name: regcred}]
    serviceAccountName: workload-identity
    env: [{name: HTTPS_PROXY, value: "http://proxy:3128"}, {name: RUST_LOG, value: debug}, {name: QUIVER_ALLOCATOR, value: system}]
    envFrom: [{configMapRef: {name: settings}}]
    volumes: [{name: programs, configMap: {name: scripts, defaultMode: 365}}]
    volumeMounts: [{name: programs, mountPath: /opt/tools, readOnly: true}]
    priorityClassName: high
    topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}]
"#,
    );
    let d = serde_json::to_value(&c.deployment).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(pod["serviceAccountName"], "workload-identity");
    assert_eq!(pod["priorityClassName"], "high");
    assert_eq!(pod["topologySpreadConstraints"][0]["maxSkew"], 1);
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "scripts");
    let ctr = &pod["containers"][0];
    assert_eq!(ctr["volumeMounts"][0]["mountPath"], "/opt/tools");
    assert_eq!(ctr["envFrom"][0]["configMapRef"]["name"], "settings");
    let env = ctr["env"].as_array().unwrap();
    assert_eq!(env[0]["name"], "HTTPS_PROXY");
    // Quiver's own variables come last, so they win over a repeated name; RUST_LOG is the
    // user's (no spec.logLevel).
    let last_log = env.iter().rev().find(|e| e["name"] == "RUST_LOG").unwrap();
    assert_eq!(last_log["value"], "debug");
    let last_alloc = env
        .iter()
        .rev()
        .find(|e| e["name"] == "QUIVER_ALLOCATOR")
        .unwrap();
    assert_eq!(last_alloc["value"], "jemalloc");
    // The Role is bound to the pods' ServiceAccount.
    let rb = serde_json::to_value(&c.role_binding).unwrap();
    assert_eq!(rb["subjects"][0]["name"], "workload-identity");
}

#[test]
fn a_network_policy_opens_the_two_ports_to_the_listed_peers_and_egress_to_dns_the_api_and_the_declared() {
    assert!(children(BASIC).network_policy.is_none(), "none unless asked");
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  tools: [{name: add, handler: {builtin: add}}]
  networkPolicy:
    mcpFrom: [{namespaceSelector: {matchLabels: {team: agents}}}]
    egress: [{to: [{ipBlock: {cidr: 10.1.0.0/16}}], ports: [{port: 443}]}]
"#,
    );
    let p = serde_json::to_value(c.network_policy.unwrap()).unwrap();
    assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "McpServer");
    let spec = &p["spec"];
    assert_eq!(
        spec["podSelector"]["matchLabels"]["app.kubernetes.io/instance"],
        "api"
    );
    assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        spec["ingress"],
        json!([
            {"from": [{"namespaceSelector": {"matchLabels": {"team": "agents"}}}], "ports": [{"protocol": "TCP", "port": 8080}]},
            {"ports": [{"protocol": "TCP", "port": 9090}]},
        ])
    );
    assert_eq!(
        spec["egress"],
        json!([
            {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                     "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
             "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            {"to": [{"ipBlock": {"cidr": "172.18.0.2/32"}}], "ports": [{"protocol": "TCP", "port": 6443}]},
            {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 443}]},
        ])
    );
    // Where DNS runs elsewhere (a node-local cache), the spec names it instead.
    let local = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  tools: [{name: add, handler: {builtin: add}}]
  networkPolicy:
    dnsPeers: [{ipBlock: {cidr: 169.254.20.10/32}}]
"#,
    );
    let p = serde_json::to_value(local.network_policy.unwrap()).unwrap();
    assert_eq!(
        p["spec"]["egress"][0],
        json!({"to": [{"ipBlock": {"cidr": "169.254.20.10/32"}}],
               "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]})
    );
}

#[test]
fn the_service_exposes_the_admin_port_only_when_asked_or_scraped_through_it() {
    let names = |c: &Children| -> Vec<String> {
        c.service
            .spec
            .as_ref()
            .unwrap()
            .ports
            .as_ref()
            .unwrap()
            .iter()
            .filter_map(|p| p.name.clone())
            .collect()
    };
    assert_eq!(names(&children(BASIC)), ["mcp"]);
    let asked = BASIC.replace("spec:\n", "spec:\n  service: {exposeAdmin: true}\n");
    assert_eq!(names(&children(&asked)), ["mcp", "admin"]);
    let scraped = BASIC.replace("spec:\n", "spec:\n  monitoring: {serviceMonitor: true}\n");
    assert_eq!(names(&children(&scraped)), ["mcp", "admin"]);
}

#[test]
fn ingress_and_http_route_route_the_mcp_and_metadata_paths_to_the_service() {
    let c = children(BASIC);
    assert!(c.ingress.is_none() && c.http_route.is_none(), "none unless asked");
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  tools: [{name: add, handler: {builtin: add}}]
  service: {port: 80}
  ingress: {host: mcp.example.com, className: nginx, tlsSecretName: mcp-tls, annotations: {a: b}}
  httpRoute: {parentRefs: [{name: gw, namespace: infra, sectionName: https}], hostnames: [mcp.example.com]}
"#,
    );
    let i = serde_json::to_value(c.ingress.unwrap()).unwrap();
    assert_eq!(i["metadata"]["annotations"]["a"], "b");
    assert_eq!(i["metadata"]["ownerReferences"][0]["kind"], "McpServer");
    assert_eq!(i["spec"]["ingressClassName"], "nginx");
    assert_eq!(
        i["spec"]["tls"],
        json!([{"hosts": ["mcp.example.com"], "secretName": "mcp-tls"}])
    );
    let rule = &i["spec"]["rules"][0];
    assert_eq!(rule["host"], "mcp.example.com");
    let paths: Vec<_> = rule["http"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].clone())
        .collect();
    assert_eq!(
        paths,
        [json!("/mcp"), json!("/.well-known/oauth-protected-resource")]
    );
    assert_eq!(
        rule["http"]["paths"][0]["backend"]["service"],
        json!({"name": "calc", "port": {"number": 80}})
    );
    let r = serde_json::to_value(c.http_route.unwrap()).unwrap();
    assert_eq!(r["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(r["kind"], "HTTPRoute");
    assert_eq!(
        r["spec"]["parentRefs"],
        json!([{"name": "gw", "namespace": "infra", "sectionName": "https"}])
    );
    assert_eq!(
        r["spec"]["rules"][0]["backendRefs"],
        json!([{"name": "calc", "port": 80}])
    );
    assert_eq!(
        r["spec"]["rules"][0]["matches"][0],
        json!({"path": {"type": "PathPrefix", "value": "/mcp"}})
    );
}

#[test]
fn security_settings_stay_within_the_restricted_profile() {
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  tools: [{name: add, handler: {builtin: add}}]
  podTemplate:
    security: {runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000, supplementalGroups: [3000], seccompLocalhostProfile: profiles/quiver.json, seLinuxOptions: {level: "s0:c1,c2"}}
"#,
    );
    let d = serde_json::to_value(&c.deployment).unwrap();
    let sc = &d["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(
        (
            sc["runAsUser"].clone(),
            sc["runAsGroup"].clone(),
            sc["fsGroup"].clone()
        ),
        (json!(1000), json!(1000), json!(2000))
    );
    assert_eq!(sc["supplementalGroups"], json!([3000]));
    assert_eq!(
        sc["seccompProfile"],
        json!({"type": "Localhost", "localhostProfile": "profiles/quiver.json"})
    );
    assert_eq!(sc["seLinuxOptions"]["level"], "s0:c1,c2");
    assert_eq!(sc["runAsNonRoot"], true, "cannot be turned off");
    let ctr = &d["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(ctr["allowPrivilegeEscalation"], false);
    assert_eq!(ctr["capabilities"]["drop"], json!(["ALL"]));
    // Root is outside the schema's range (the API server refuses it before the operator sees it).
    let crd = serde_json::to_value(<crate::crd::McpServer as kube::CustomResourceExt>::crd()).unwrap();
    let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["podTemplate"]["properties"]["security"]["properties"];
    assert_eq!(props["runAsUser"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(
        props["supplementalGroups"]["items"]["minimum"].as_f64(),
        Some(1.0)
    );
}

const GATEWAY: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: gw}
spec:
  tools: [{name: add, handler: {builtin: add}}]
  upstreams:
    - name: github
      stdio:
        image: registry.example/github-mcp:1.2
        command: [/usr/local/bin/github-mcp, stdio]
        env: {GITHUB_TOKEN: "{{secret.github.token}}", LOG: warn}
        processes: 2
      tools: {prefix: gh_, include: ["get_*"]}
    - name: docs
      http: {url: "https://docs.example/mcp", headers: {Authorization: "Bearer {{secret.docs.token}}"}}
      tools: {prefix: docs_}
"#;

#[test]
fn an_upstream_image_becomes_a_sidecar_behind_a_socket() {
    let m = mcp(GATEWAY);
    let r = render(&m, &Vec::new()).unwrap();
    // The served ToolSet connects to the sidecar's socket; the command and the Secret stay
    // in the pod spec, the filter in the ConfigMap.
    let ts = quiver_model::config::parse("cm", &r.yaml).unwrap();
    let github = ts.upstreams[0].stdio.as_ref().unwrap();
    assert_eq!(github.socket.as_deref(), Some("/quiver/run/github/bridge.sock"));
    assert!(github.command.is_empty() && github.env.is_empty() && github.image.is_none());
    assert_eq!(github.processes, Some(2));
    assert_eq!(ts.upstreams[0].tools.prefix.as_deref(), Some("gh_"));
    // Only the http upstream's header Secret is read by the server (the sidecar's comes
    // from the kubelet).
    assert_eq!(r.secrets.iter().map(String::as_str).collect::<Vec<_>>(), ["docs"]);

    let c = children(GATEWAY);
    let d = serde_json::to_value(&c.deployment).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let init = &pod["initContainers"][0];
    assert_eq!(init["image"], "quiver-server:test");
    assert_eq!(init["args"], json!(["install", "/quiver/bin"]));
    let server = &pod["containers"][0];
    assert!(
        server["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"] == "/quiver/run/github" && m["readOnly"] == true)
    );
    let side = &pod["containers"][1];
    assert_eq!(side["name"], "upstream-github");
    assert_eq!(side["image"], "registry.example/github-mcp:1.2");
    assert_eq!(side["command"], json!(["/quiver/bin/quiver-server"]));
    assert_eq!(
        side["args"],
        json!([
            "bridge",
            "--socket",
            "/quiver/run/github/bridge.sock",
            "--max-processes",
            "2",
            "--",
            "/usr/local/bin/github-mcp",
            "stdio"
        ])
    );
    let env = side["env"].as_array().unwrap();
    assert_eq!(env[0]["name"], "GITHUB_TOKEN");
    assert_eq!(
        env[0]["valueFrom"]["secretKeyRef"],
        json!({"name": "github", "key": "token", "optional": true})
    );
    assert_eq!(env[1], json!({"name": "LOG", "value": "warn"}));
    assert_eq!(side["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(
        pod["containers"].as_array().unwrap().len(),
        2,
        "one sidecar, for the image upstream only"
    );
    let volumes: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        volumes,
        [
            "quiver-bin",
            "quiver-s-github",
            "quiver-t-github",
            "quiver-tmp",
            "quiver-api-access"
        ]
    );
}

/// The volumes each container of `pod` mounts: (container, volume, read-only).
fn mounts(pod: &serde_json::Value) -> Vec<(String, String, bool)> {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| {
            c["volumeMounts"].as_array().into_iter().flatten().map(move |m| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    m["name"].as_str().unwrap().to_owned(),
                    m["readOnly"] == true,
                )
            })
        })
        .collect()
}

#[test]
fn upstream_sidecars_share_no_writable_volume_and_each_socket_is_theirs_and_the_servers_alone() {
    let three = GATEWAY.replace(
        "    - name: docs\n",
        "    - name: fs\n      stdio: {image: registry.example/fs-mcp:1, command: [fs-mcp]}\n      tools: {prefix: fs_}\n    - name: fs-2\n      stdio: {image: registry.example/fs-mcp:1, command: [fs-mcp], processes: 3}\n      tools: {prefix: other_}\n    - name: docs\n",
    );
    let c = children(&three);
    let d = serde_json::to_value(&c.deployment).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let all = mounts(pod);
    let sidecars: Vec<&str> = pod["containers"].as_array().unwrap()[1..]
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(sidecars, ["upstream-github", "upstream-fs", "upstream-fs-2"]);
    assert!(
        pod.get("shareProcessNamespace").is_none(),
        "containers must not see each other's processes"
    );
    // No volume is writable in one sidecar and mounted in another container at all.
    for (ctr, vol, ro) in &all {
        if ctr == "server" || *ro {
            continue;
        }
        let others: Vec<&(String, String, bool)> =
            all.iter().filter(|(c, v, _)| c != ctr && v == vol).collect();
        assert!(
            others.iter().all(|(c, _, ro)| c == "server" && *ro),
            "{ctr} writes {vol}, which {others:?} also mount"
        );
    }
    // Each upstream's socket volume: written by its sidecar, read by the server, nobody else.
    for name in ["github", "fs", "fs-2"] {
        let vol = format!("quiver-s-{name}");
        let mut users: Vec<(&str, bool)> = all
            .iter()
            .filter(|(_, v, _)| *v == vol)
            .map(|(c, _, ro)| (c.as_str(), *ro))
            .collect();
        users.sort_unstable();
        let sidecar = format!("upstream-{name}");
        assert_eq!(users, [("server", true), (sidecar.as_str(), false)], "{vol}");
        let side = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == sidecar.as_str())
            .unwrap();
        let dir = format!("/quiver/run/{name}");
        assert!(
            side["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == vol.as_str() && m["mountPath"] == dir.as_str())
        );
        assert_eq!(side["args"][2], format!("{dir}/bridge.sock"));
        // And its own /tmp.
        assert!(
            side["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == format!("quiver-t-{name}").as_str() && m["mountPath"] == "/tmp")
        );
    }
    // The socket directories of two upstreams never meet, whatever their names: names that
    // cannot name a directory and volumes as they are, are refused, never rewritten.
    for bad in ["Git_Hub", "a.b", "../x", "a/b", ""] {
        let m = mcp(&three.replace("name: fs-2", &format!("name: \"{bad}\"")));
        let e = render(&m, &Vec::new()).unwrap_err();
        assert!(
            e.problems.iter().any(|p| p.starts_with("spec.upstreams[2].name")),
            "{bad}: {e:?}"
        );
    }
    // Authors cannot name a volume like Quiver's.
    let problems = pod_problems(&with_pod_template(
        "{volumes: [{name: quiver-s-github, emptyDir: {}}]}",
    ));
    assert!(
        problems.iter().any(|p| p.contains("is a volume Quiver adds")),
        "{problems:?}"
    );
}

#[test]
fn a_filter_change_leaves_the_pod_template_alone() {
    let before = children(GATEWAY);
    let after = children(&GATEWAY.replace(
        "include: [\"get_*\"]",
        "include: [\"list_*\"], exclude: [list_secrets]",
    ));
    assert_eq!(
        before.deployment.spec, after.deployment.spec,
        "no restart for a tools change"
    );
    assert_ne!(before.config_map.data, after.config_map.data);
}

#[test]
fn bad_upstream_images_are_refused_with_their_paths() {
    for (change, wanted) in [
        (
            "command: [/usr/local/bin/github-mcp, stdio]",
            "spec.upstreams[0].stdio.command",
        ),
        ("LOG: warn", "spec.upstreams[0].stdio.env.LOG: in a sidecar"),
        ("name: github", "spec.upstreams[0].name: at most 54 characters"),
    ] {
        let replacement = match wanted {
            w if w.ends_with(".command") => "command: []".to_owned(),
            w if w.contains("env.LOG") => "LOG: \"level {{secret.a.b}}\"".to_owned(),
            _ => format!("name: {}", "g".repeat(60)),
        };
        let m = mcp(&GATEWAY.replace(change, &replacement));
        let e = render(&m, &Vec::new()).unwrap_err();
        assert!(
            e.problems.iter().any(|p| p.starts_with(wanted)),
            "{wanted}: {e:?}"
        );
    }
    // A plain ToolSet (toolsFrom) cannot add containers.
    let m = mcp(&format!(
        "{}\n  toolsFrom: [{{configMapKeyRef: {{name: more, key: t.yaml}}}}]\n",
        BASIC.trim_end()
    ));
    let e = render(
        &m,
        &vec![Some(
            "upstreams: [{name: x, stdio: {image: evil:1, command: [sh]}}]".into(),
        )],
    )
    .unwrap_err();
    assert!(
        e.problems
            .iter()
            .any(|p| p.contains("upstreams[0].stdio.image: only an McpServer's spec.upstreams")),
        "{e:?}"
    );
}

/// The problems `render` reports for `yaml`, or none.
fn pod_problems(yaml: &str) -> Vec<String> {
    let m = mcp(yaml);
    match render(&m, &vec![None; m.spec.tools_from.len()]) {
        Ok(_) => Vec::new(),
        Err(e) => {
            assert_eq!(e.reason, "InvalidPodTemplate", "{:?}", e.problems);
            e.problems
        }
    }
}

fn with_pod_template(template: &str) -> String {
    format!(
        "apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: calc}}\nspec:\n  tools: [{{name: add, handler: {{builtin: add}}}}]\n  podTemplate: {template}\n"
    )
}

#[test]
fn only_the_server_container_gets_a_bounded_service_account_token() {
    let c = children(GATEWAY);
    let sa = serde_json::to_value(&c.service_account).unwrap();
    assert_eq!(sa["automountServiceAccountToken"], false);
    let d = serde_json::to_value(&c.deployment).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    let token: Vec<&serde_json::Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["name"] == "quiver-api-access")
        .collect();
    assert_eq!(token.len(), 1);
    let sources = token[0]["projected"]["sources"].as_array().unwrap();
    let expiry = sources[0]["serviceAccountToken"]["expirationSeconds"]
        .as_i64()
        .unwrap();
    assert!((600..=3600).contains(&expiry), "a bounded token: {expiry}");
    assert_eq!(sources[0]["serviceAccountToken"]["path"], "token");
    assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
    assert_eq!(sources[1]["configMap"]["items"][0]["path"], "ca.crt");
    assert_eq!(
        sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let mounts_token = |c: &serde_json::Value| {
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "quiver-api-access")
    };
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers[0]["name"], "server");
    let server_mount = containers[0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "quiver-api-access")
        .unwrap();
    assert_eq!(
        server_mount["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    assert_eq!(server_mount["readOnly"], true);
    assert!(containers.len() > 1, "the gateway has a sidecar");
    for c in containers[1..]
        .iter()
        .chain(pod["initContainers"].as_array().unwrap())
    {
        assert!(!mounts_token(c), "{} gets no token", c["name"]);
    }
    // The same for a server without sidecars.
    let basic = serde_json::to_value(&children(BASIC).deployment).unwrap();
    let pod = &basic["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(mounts_token(&pod["containers"][0]));
}

#[test]
fn pod_template_escapes_from_the_restricted_profile_are_invalid_specs() {
    // Each line: a podTemplate and a part of the problem it must produce.
    let cases = [
        // Kinds the schema does not know are dropped on reading, leaving no source.
        (
            "{volumes: [{name: host, hostPath: {path: /proc}}]}",
            "spec.podTemplate.volumes[0]: set exactly one of",
        ),
        (
            "{volumes: [{name: n, nfs: {server: a, path: /}}]}",
            "spec.podTemplate.volumes[0]: set exactly one of",
        ),
        (
            "{volumes: [{name: two, emptyDir: {}, secret: {secretName: s}}]}",
            "spec.podTemplate.volumes[0]: set exactly one of",
        ),
        (
            "{volumes: [{name: quiver-api-access, emptyDir: {}}]}",
            "`quiver-api-access` is a volume Quiver adds",
        ),
        (
            "{volumes: [{name: a, emptyDir: {}}, {name: a, emptyDir: {}}]}",
            "`a` is used twice",
        ),
        (
            "{security: {seLinuxOptions: {type: spc_t}}}",
            "seLinuxOptions.type: `spc_t` is outside",
        ),
        (
            "{security: {seLinuxOptions: {type: unconfined_t, user: system_u}}}",
            "`unconfined_t` is outside",
        ),
        (
            "{annotations: {container.apparmor.security.beta.kubernetes.io/server: unconfined}}",
            "annotations.container.apparmor.security.beta.kubernetes.io/server",
        ),
        (
            "{annotations: {seccomp.security.alpha.kubernetes.io/pod: unconfined}}",
            "annotations.seccomp.security.alpha.kubernetes.io/pod",
        ),
        ("{priorityClassName: system-node-critical}", "priorityClassName"),
    ];
    for (template, want) in cases {
        let problems = pod_problems(&with_pod_template(template));
        assert!(
            problems.iter().any(|p| p.contains(want)),
            "{template}: {problems:?}"
        );
    }
    // Mounts over the token (directly, above it, through /run or with dots) or with propagation.
    for path in [
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "/var/run/secrets",
        "/run/secrets/kubernetes.io/serviceaccount",
        "//var/./run/secrets/kubernetes.io/serviceaccount/",
        "/quiver/run",
        "/",
    ] {
        let problems = pod_problems(&with_pod_template(&format!(
            "{{volumes: [{{name: v, emptyDir: {{}}}}], volumeMounts: [{{name: v, mountPath: \"{path}\"}}]}}"
        )));
        assert!(
            problems.iter().any(|p| p.contains("would cover")),
            "{path}: {problems:?}"
        );
    }
    for (mount, want) in [
        ("{name: v, mountPath: /data/../var/run/secrets}", "without `..`"),
        ("{name: v, mountPath: data}", "an absolute path"),
        (
            "{name: v, mountPath: /data, mountPropagation: Bidirectional}",
            "mountPropagation",
        ),
        ("{name: other, mountPath: /data}", "no volume `other`"),
        (
            "{name: v, mountPath: /data, subPath: ../../etc}",
            "subPath: a relative path",
        ),
        (
            "{name: v, mountPath: /data, subPathExpr: \"$(POD)/../..\"}",
            "subPathExpr: a relative path",
        ),
        (
            "{name: v, mountPath: /data, subPath: /etc}",
            "subPath: a relative path",
        ),
    ] {
        let problems = pod_problems(&with_pod_template(&format!(
            "{{volumes: [{{name: v, emptyDir: {{}}}}], volumeMounts: [{mount}]}}"
        )));
        assert!(problems.iter().any(|p| p.contains(want)), "{mount}: {problems:?}");
    }
    // Snippet annotations of the Ingress.
    let snippet = format!(
        "{BASIC}  ingress: {{host: h.example, annotations: {{nginx.ingress.kubernetes.io/configuration-snippet: \"more_set_headers x\", nginx.ingress.kubernetes.io/rewrite-target: /}}}}\n"
    );
    let problems = pod_problems(&snippet);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("configuration-snippet"), "{problems:?}");
    // What the profile allows stays valid, and only those fields reach the pod.
    let fine = with_pod_template(
        "{volumes: [{name: a, configMap: {name: c}}, {name: b, secret: {secretName: s}}, {name: c, emptyDir: {}}, {name: d, projected: {sources: [{configMap: {name: c}}]}}, {name: e, downwardAPI: {items: [{path: l, fieldRef: {fieldPath: metadata.labels}}]}}, {name: f, persistentVolumeClaim: {claimName: p}}, {name: g, ephemeral: {volumeClaimTemplate: {spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}}}, {name: h, csi: {driver: d.example}}], volumeMounts: [{name: a, mountPath: /var/run/app}, {name: b, mountPath: /run/secrets/app, mountPropagation: None}], annotations: {container.apparmor.security.beta.kubernetes.io/server: runtime/default}, priorityClassName: high, security: {seLinuxOptions: {type: container_t, level: \"s0:c1\", user: system_u, role: system_r}}}",
    );
    assert_eq!(pod_problems(&fine), Vec::<String>::new());
    let d = serde_json::to_value(&children(&fine).deployment).unwrap();
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(
        pod["volumes"].as_array().unwrap().len(),
        10,
        "8 of the spec, the children's scratch space and the token"
    );
    assert_eq!(
        pod["securityContext"]["seLinuxOptions"],
        json!({"type": "container_t", "level": "s0:c1"}),
        "no user or role"
    );
}

#[test]
fn the_schema_refuses_what_the_restricted_profile_refuses() {
    let crd = serde_json::to_value(<crate::crd::McpServer as kube::CustomResourceExt>::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let tpl = &spec["podTemplate"]["properties"];
    let volume = &tpl["volumes"]["items"];
    let kinds: Vec<&str> = volume["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        kinds,
        [
            "configMap",
            "csi",
            "downwardAPI",
            "emptyDir",
            "ephemeral",
            "name",
            "persistentVolumeClaim",
            "projected",
            "secret"
        ]
    );
    assert!(
        volume["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("size() == 1")
    );
    let se = &tpl["security"]["properties"]["seLinuxOptions"]["properties"];
    assert_eq!(se["type"]["enum"], json!(crate::crd::SELINUX_TYPES));
    assert!(se.get("user").is_none() && se.get("role").is_none());
    assert!(
        tpl["annotations"]["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("apparmor")
    );
    assert!(
        tpl["volumeMounts"]["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("mountPropagation")
    );
    assert!(
        spec["ingress"]["properties"]["annotations"]["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .unwrap()
            .contains("snippet")
    );
}

#[test]
fn ingress_annotations_that_inject_raw_configuration_are_refused_for_every_vendor() {
    use super::confine::raw_config_annotation;
    let refused = [
        // ingress-nginx
        "nginx.ingress.kubernetes.io/configuration-snippet",
        "nginx.ingress.kubernetes.io/server-snippet",
        "nginx.ingress.kubernetes.io/auth-snippet",
        "nginx.ingress.kubernetes.io/stream-snippet",
        "nginx.ingress.kubernetes.io/modsecurity-snippet",
        "ingress.kubernetes.io/configuration-snippet",
        // NGINX Inc's controller (plural), in any case
        "nginx.org/server-snippets",
        "nginx.org/location-snippets",
        "NGINX.org/Location-Snippets",
        // HAProxy Technologies' controller
        "haproxy.org/backend-config-snippet",
        "haproxy.org/frontend-config-snippet",
        "haproxy.org/global-config-snippet",
        // haproxy-ingress raw configuration sections, old and new prefix
        "haproxy-ingress.github.io/config-backend",
        "haproxy-ingress.github.io/config-defaults",
        "haproxy-ingress.github.io/config-frontend",
        "haproxy-ingress.github.io/config-global",
        "haproxy-ingress.github.io/config-sections",
        "haproxy-ingress.github.io/config-tcp-service",
        "ingress.kubernetes.io/config-backend",
        // any vendor, no prefix
        "haproxy.router.openshift.io/backend-config",
        "example.com/raw-config-override",
        "config-backend",
        "server-snippet",
    ];
    let allowed = [
        "nginx.ingress.kubernetes.io/rewrite-target",
        "nginx.ingress.kubernetes.io/proxy-body-size",
        "nginx.org/lb-method",
        "haproxy.org/timeout-server",
        "haproxy.router.openshift.io/timeout",
        "cert-manager.io/cluster-issuer",
        "kubernetes.io/ingress.class",
        "traefik.ingress.kubernetes.io/router.entrypoints",
        "example.com/configured",
    ];
    for k in refused {
        assert!(raw_config_annotation(k), "{k} must be refused");
        let problems = pod_problems(&format!(
            "{BASIC}  ingress: {{host: h.example, annotations: {{\"{k}\": x, nginx.ingress.kubernetes.io/rewrite-target: /}}}}\n"
        ));
        assert_eq!(problems.len(), 1, "{k}: {problems:?}");
        assert!(problems[0].contains(k), "{k}: {problems:?}");
    }
    for k in allowed {
        assert!(!raw_config_annotation(k), "{k} must be allowed");
    }
    // The schema refuses the same class: its rule tests the same fragments, in lower case.
    let rule = crate::crd::RAW_CONFIG_ANNOTATIONS;
    for fragment in [
        "k.lowerAscii().contains('snippet')",
        "k.lowerAscii().startsWith('config-')",
        "k.lowerAscii().contains('/config-')",
        "k.lowerAscii().contains('-config-')",
        "k.lowerAscii().endsWith('-config')",
    ] {
        assert!(rule.contains(fragment), "{fragment} missing from {rule}");
    }
}

#[test]
fn a_named_service_account_needs_its_owners_consent() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let m = mcp(&with_pod_template("{serviceAccountName: shared}"));
    let sa = |annotation: Option<&str>| -> ServiceAccount {
        serde_json::from_value(json!({
            "metadata": {"name": "shared", "annotations": annotation.map(|a| json!({"quiver.dev/allowed-mcpservers": a}))}
        }))
        .unwrap()
    };
    let refused = |s: Option<&ServiceAccount>| crate::render::service_account(&m, s).unwrap_err();
    let e = refused(None);
    assert_eq!(e.reason, "ServiceAccountNotAllowed");
    assert!(
        e.problems[0].contains("ServiceAccount shared does not exist"),
        "{e:?}"
    );
    for denied in [
        None,
        Some(""),
        Some("other"),
        Some("calc-2, calcx"),
        Some("other,*x"),
    ] {
        let e = refused(Some(&sa(denied)));
        assert!(
            e.problems[0].contains("quiver.dev/allowed-mcpservers"),
            "{denied:?}: {e:?}"
        );
    }
    for allowed in ["calc", "other, calc", "*"] {
        assert!(
            crate::render::service_account(&m, Some(&sa(Some(allowed)))).is_ok(),
            "{allowed}"
        );
    }
    // Without a named ServiceAccount there is nothing to consent to.
    assert!(crate::render::service_account(&mcp(BASIC), None).is_ok());
    // The Role is bound to the operator's own ServiceAccount unless one is named.
    let rb = serde_json::to_value(&children(BASIC).role_binding).unwrap();
    assert_eq!(
        rb["subjects"],
        json!([{"kind": "ServiceAccount", "name": "calc", "namespace": "ns"}])
    );
}

#[test]
fn a_service_account_token_the_author_mounts_is_hidden_from_the_servers_children() {
    let yaml = with_pod_template(
        "{volumes: [{name: tok, projected: {sources: [{serviceAccountToken: {path: token, audience: vault}}]}}, {name: both, projected: {sources: [{configMap: {name: c}}, {serviceAccountToken: {path: t}}]}}, {name: cfg, projected: {sources: [{configMap: {name: c}}]}}, {name: sec, secret: {secretName: s}}], volumeMounts: [{name: tok, mountPath: /var/run/vault}, {name: both, mountPath: /etc/mixed}, {name: cfg, mountPath: /etc/cfg}, {name: sec, mountPath: /etc/sec}]}",
    );
    let d = serde_json::to_value(&children(&yaml).deployment).unwrap();
    let args: Vec<&str> = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix("--hide-from-children="))
        .collect();
    assert_eq!(args, ["/var/run/vault", "/etc/mixed"], "token mounts only");
    // The server reads the list split at commas: a token mounted at a path with one is refused.
    let comma = with_pod_template(
        "{volumes: [{name: tok, projected: {sources: [{serviceAccountToken: {path: token}}]}}], volumeMounts: [{name: tok, mountPath: \"/var/run/a,b\"}]}",
    );
    let problems = pod_problems(&comma);
    assert!(problems.iter().any(|p| p.contains("without `,`")), "{problems:?}");
}

#[test]
fn token_exchange_reaches_the_pods_by_reference_and_identity_needs_its_auth() {
    let c = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: api}
spec:
  auth:
    oidc: {issuer: "https://login.example", audience: quiver}
    tokenExchange: {clientId: quiver, clientSecretRef: {name: quiver-client, key: secret}, tokenEndpoint: "https://login.example/token"}
  tools:
    - {name: notes, handler: {http: {url: "https://notes.example/api", identity: {mode: exchange, audience: notes}}}}
"#,
    );
    let d = serde_json::to_value(&c.deployment).unwrap();
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    for a in [
        "--token-exchange-client-id=quiver",
        "--token-exchange-client-secret=quiver-client.secret",
        "--token-exchange-endpoint=https://login.example/token",
    ] {
        assert!(args.as_array().unwrap().contains(&json!(a)), "{a}: {args}");
    }
    // The secret's value is read through the API by name, never put in the pod spec.
    let container = d["spec"]["template"]["spec"]["containers"][0].to_string();
    assert!(!container.contains("secretKeyRef"), "{container}");
    let rules = serde_json::to_value(&c.role).unwrap()["rules"].clone();
    assert_eq!(rules[1]["resourceNames"], json!(["quiver-client"]), "{rules}");

    // Acting as the caller needs OIDC; exchanging needs the exchange client too.
    for (auth, want) in [
        (
            "",
            "tool `notes`: identity.mode `exchange` acts as the caller and needs spec.auth.oidc",
        ),
        (
            "auth: {oidc: {issuer: \"https://login.example\", audience: quiver}}",
            "tool `notes`: identity.mode `exchange` needs spec.auth.tokenExchange",
        ),
        // The token endpoint receives callers' tokens: the issuer's host only.
        (
            "auth: {oidc: {issuer: \"https://login.example/realms/corp\", audience: quiver}, tokenExchange: {clientId: quiver, clientSecretRef: {name: c, key: s}, tokenEndpoint: \"https://collector.example/token\"}}",
            "spec.auth.tokenExchange.tokenEndpoint: must be on the issuer's origin",
        ),
    ] {
        let m = mcp(&format!(
            r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {{name: api}}
spec:
  {auth}
  tools:
    - {{name: notes, handler: {{http: {{url: "https://notes.example/api", identity: {{mode: exchange, audience: notes}}}}}}}}
"#
        ));
        let e = render(&m, &Vec::new()).unwrap_err();
        assert_eq!(e.reason, "InvalidToolConfig");
        assert!(e.message().contains(want), "{}", e.message());
    }
}

#[test]
fn a_users_own_sign_in_needs_the_servers_upstream_sign_in() {
    let with = |auth: &str| {
        mcp(&format!(
            r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {{name: api}}
spec:
  {auth}
  upstreams:
    - {{name: gh, http: {{url: "https://api.githubcopilot.com/mcp/"}}, identity: {{mode: user}}}}
"#
        ))
    };
    for (auth, want) in [
        (
            "",
            "upstream `gh`: identity.mode `user` acts as the caller and needs spec.auth.oidc",
        ),
        (
            "auth: {oidc: {issuer: \"https://login.example\", audience: quiver}}",
            "upstream `gh`: identity.mode `user` needs spec.auth.upstreamSignIn",
        ),
    ] {
        let e = render(&with(auth), &Vec::new()).unwrap_err();
        assert_eq!(e.reason, "InvalidToolConfig", "{}", e.message());
        assert!(e.message().contains(want), "{}", e.message());
    }
    let signed = with(
        "auth: {oidc: {issuer: \"https://login.example\", audience: quiver}, upstreamSignIn: {url: \"https://mcp.example.com\", keysSecretRef: {name: k, key: ring}, browserClient: {clientId: quiver-browser, clientSecretRef: {name: b, key: secret}}}}",
    );
    render(&signed, &Vec::new()).unwrap();
}

#[test]
fn tracing_becomes_the_servers_otel_variables() {
    let env_of = |yaml: &str| -> Vec<serde_json::Value> {
        let c = children(yaml);
        let d = serde_json::to_value(&c.deployment).unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .clone()
    };
    let off = env_of(BASIC);
    assert!(
        off.iter()
            .all(|e| !e["name"].as_str().unwrap().contains("OTLP") && e["name"] != "OTEL_SERVICE_NAME")
    );
    let on = env_of(&format!(
        "{BASIC}  tracing:\n    endpoint: http://otel-collector.obs:4318\n    samplingRatio: 0.25\n    headersSecretRef: {{name: otlp, key: headers}}\n"
    ));
    let get = |name: &str| on.iter().find(|e| e["name"] == name).cloned();
    assert_eq!(
        get("QUIVER_OTLP_ENDPOINT").unwrap()["value"],
        "http://otel-collector.obs:4318"
    );
    assert_eq!(get("QUIVER_TRACE_SAMPLE_RATIO").unwrap()["value"], "0.25");
    assert_eq!(get("OTEL_SERVICE_NAME").unwrap()["value"], "calc");
    assert_eq!(
        get("OTEL_RESOURCE_ATTRIBUTES").unwrap()["value"],
        "k8s.namespace.name=ns,quiver.mcpserver=calc"
    );
    let headers = get("OTEL_EXPORTER_OTLP_HEADERS").unwrap();
    assert_eq!(
        headers["valueFrom"]["secretKeyRef"],
        json!({"name": "otlp", "key": "headers", "optional": false})
    );
    assert!(headers.get("value").is_none_or(serde_json::Value::is_null));
}

#[test]
fn tracing_says_whose_sampled_flag_is_trusted_and_whether_tracestate_travels() {
    let env_of = |yaml: &str| -> Vec<serde_json::Value> {
        let c = children(yaml);
        let d = serde_json::to_value(&c.deployment).unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .clone()
    };
    let get = |env: &[serde_json::Value], name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap().to_owned())
    };
    // Unset: the server's defaults (authenticated callers, no tracestate).
    let defaults = env_of(&format!(
        "{BASIC}  tracing:\n    endpoint: http://otel-collector.obs:4318\n"
    ));
    assert_eq!(get(&defaults, "QUIVER_TRACE_TRUST_CLIENT_SAMPLING"), None);
    assert_eq!(get(&defaults, "QUIVER_TRACE_FORWARD_TRACESTATE"), None);
    for (trust, forward) in [("never", false), ("authenticated", true), ("always", true)] {
        let env = env_of(&format!(
            "{BASIC}  tracing:\n    endpoint: http://otel-collector.obs:4318\n    trustClientSampling: {trust}\n    forwardTraceState: {forward}\n"
        ));
        assert_eq!(
            get(&env, "QUIVER_TRACE_TRUST_CLIENT_SAMPLING").as_deref(),
            Some(trust)
        );
        assert_eq!(
            get(&env, "QUIVER_TRACE_FORWARD_TRACESTATE").as_deref(),
            Some(if forward { "true" } else { "false" })
        );
    }
}

#[test]
fn the_server_parses_the_arguments_rendered_for_its_container_and_refusals_are_reported() {
    let c = children(BASIC);
    assert_eq!(server_args_problems(&c.deployment), Vec::<String>::new());
    // A value the server refuses, as an argument and as a literal variable: reported with
    // the flag's name. A variable from a Secret is not read (its value is not known).
    for (args, env) in [
        (vec!["--tasks-ttl=2d".to_owned()], None),
        (Vec::new(), Some(("QUIVER_LIMITS_REDIS_FAIL", "sometimes"))),
    ] {
        let mut c = children(BASIC);
        let pod = c
            .deployment
            .spec
            .as_mut()
            .unwrap()
            .template
            .spec
            .as_mut()
            .unwrap();
        pod.containers[0].args.get_or_insert_default().extend(args);
        if let Some((name, value)) = env {
            pod.containers[0]
                .env
                .get_or_insert_default()
                .push(k8s_openapi::api::core::v1::EnvVar {
                    name: name.into(),
                    value: Some(value.into()),
                    value_from: None,
                });
        }
        let problems = server_args_problems(&c.deployment);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].contains("--tasks-ttl") || problems[0].contains("--limits-redis-fail"),
            "{problems:?}"
        );
    }
}

#[test]
fn a_pinned_upstream_gets_a_pins_config_map_the_pods_may_update_and_nothing_more() {
    let unpinned = children(GATEWAY);
    assert!(unpinned.pins.is_none());
    let pinned = children(&GATEWAY.replace(
        "      tools: {prefix: docs_}",
        "      tools: {prefix: docs_}\n      pin: enforce",
    ));
    let cm = serde_json::to_value(pinned.pins.as_ref().expect("a pins ConfigMap")).unwrap();
    assert_eq!(cm["metadata"]["name"], "gw-pins");
    assert_eq!(cm["metadata"]["ownerReferences"][0]["kind"], "McpServer");
    // Metadata only: the records are the pods' (an apply never overwrites them).
    assert!(cm.get("data").is_none(), "{cm}");
    let rules = serde_json::to_value(&pinned.role.rules).unwrap();
    let rule = rules
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resourceNames"] == json!(["gw-pins"]))
        .expect("a rule for the pins ConfigMap");
    assert_eq!(rule["verbs"], json!(["get", "list", "watch", "update"]));
    // No other rule may update anything.
    let updating = rules
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["verbs"].as_array().unwrap().contains(&json!("update")))
        .count();
    assert_eq!(updating, 1, "{rules}");
    let d = serde_json::to_value(&pinned.deployment).unwrap();
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .clone();
    assert!(args.contains(&json!("--pins=configmap:ns/gw-pins")), "{args:?}");
    let plain = serde_json::to_value(&unpinned.deployment).unwrap();
    let plain_args = plain["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        !plain_args
            .iter()
            .any(|a| a.as_str().unwrap().starts_with("--pins"))
    );
    assert!(server_args_problems(&pinned.deployment).is_empty());
    // An OpenAPI source that pins its operations keeps its record in the same ConfigMap.
    let api = children(
        r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: gw}
spec:
  openapi:
    - name: items
      configMap: {name: items-api, key: openapi.json}
      server: https://items.example
      pin: warn
"#,
    );
    assert_eq!(
        api.pins.as_ref().and_then(|c| c.metadata.name.as_deref()),
        Some("gw-pins")
    );
}

#[test]
fn a_server_card_is_off_by_default_and_names_only_public_urls() {
    let args = |extra: &str| -> Vec<String> {
        let c = children(&format!("{BASIC}{extra}"));
        let d = serde_json::to_value(&c.deployment).unwrap();
        assert_eq!(
            server_args_problems(&c.deployment),
            Vec::<String>::new(),
            "{extra}"
        );
        d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .filter(|a| a.starts_with("--server-card"))
            .map(str::to_owned)
            .collect()
    };
    assert!(args("").is_empty());
    assert!(
        args("  catalog: {description: Sums}\n").is_empty(),
        "a catalog entry alone serves no card"
    );
    assert_eq!(
        args(
            "  catalog: {serverCard: true, description: Sums and more, websiteUrl: \"https://docs.example.com\"}\n  ingress: {host: calc.example.com, tlsSecretName: tls}\n"
        ),
        [
            "--server-card-name=dev.quiver.ns/calc",
            "--server-card-description=Sums and more",
            "--server-card-website-url=https://docs.example.com",
            "--server-card-url=https://calc.example.com/mcp",
        ]
    );
    // Without a public URL the card names no endpoint: the in-cluster one stays out.
    assert_eq!(
        args("  catalog: {serverCard: true}\n"),
        ["--server-card-name=dev.quiver.ns/calc"]
    );
    assert_eq!(
        args(
            "  catalog: {serverCard: true, url: \"https://tools.example.com/calc/mcp\"}\n  httpRoute: {parentRefs: [{name: gw}], hostnames: [calc.example.org]}\n"
        ),
        [
            "--server-card-name=dev.quiver.ns/calc",
            "--server-card-url=https://tools.example.com/calc/mcp"
        ]
    );
    // Text a card may not hold is left out rather than crash the pod.
    assert_eq!(
        args("  catalog: {serverCard: true, description: \"two\\nlines\"}\n"),
        ["--server-card-name=dev.quiver.ns/calc"]
    );
}
