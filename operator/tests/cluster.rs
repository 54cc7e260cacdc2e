//! Against a real control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok
//! fake nodes) with the operator binary running: `scripts/test.sh` starts them and runs
//! these with `--ignored`. Each test works in its own namespace and prints the namespace's
//! events and McpServers when it fails.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use quiver_operator::crd::McpServer;
use serde_json::{Value, json};

mod common;

use common::*;

#[tokio::test]
#[ignore = "needs cluster"]
async fn sample_becomes_ready_with_all_children_and_printer_columns() {
    with_ns("q-sample", |ns| async move {
        ns.apply_yaml(&sample("calculator.yaml")).await;
        let (reason, msg) = ns.wait_condition("calculator", "Ready", "True", 90).await;
        assert_eq!((reason.as_str(), msg.as_str()), ("PodsReady", "2/2 pods ready"));
        let (_, valid) = ns.wait_condition("calculator", "ConfigValid", "True", 5).await;
        assert!(valid.starts_with("4 tools"), "{valid}");
        ns.api::<ConfigMap>().get("calculator-tools").await.unwrap();
        ns.api::<ServiceAccount>().get("calculator").await.unwrap();
        ns.api::<Role>().get("calculator-config-reader").await.unwrap();
        ns.api::<RoleBinding>()
            .get("calculator-config-reader")
            .await
            .unwrap();
        ns.api::<Service>().get("calculator").await.unwrap();
        ns.api::<PodDisruptionBudget>().get("calculator").await.unwrap();
        let d = ns.api::<Deployment>().get("calculator").await.unwrap();
        assert_eq!(d.owner_references()[0].kind, "McpServer");
        let m = ns.mcp("calculator").await;
        let s = m.status.unwrap();
        assert_eq!(
            s.endpoint.as_deref(),
            Some(format!("http://calculator.{}.svc:8080/mcp", ns.name).as_str())
        );
        assert_eq!(s.observed_generation, m.metadata.generation);
        let table = kubectl(&["get", "qmcp", "-n", &ns.name]);
        println!("{table}");
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(header, ["NAME", "READY", "REPLICAS", "TOOLS", "ENDPOINT", "AGE"]);
        let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(&row[..4], ["calculator", "True", "2/2", "4"]);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_pods_may_read_exactly_the_secrets_their_tools_and_auth_name() {
    with_ns("q-secrets", |ns| async move {
        ns.apply_yaml(&sample("authenticated-api.yaml")).await;
        ns.wait_condition("assistant", "ConfigValid", "True", 60).await;
        let secret_names = |role: Role| -> Option<Vec<String>> {
            role.rules?
                .into_iter()
                .find(|r| r.resources.as_deref() == Some(&["secrets".to_owned()]))?
                .resource_names
        };
        let role = ns.api::<Role>().get("assistant-config-reader").await.unwrap();
        assert_eq!(
            secret_names(role),
            Some(vec!["assistant-clients".to_owned(), "inventory-credentials".to_owned()])
        );
        let cm = ns.api::<ConfigMap>().get("assistant-tools").await.unwrap();
        let tools = &cm.data.unwrap()["tools.yaml"];
        assert!(tools.contains("{{secret.inventory-credentials.token}}") && !tools.contains("inventory-example-token"));
        let d = ns.api::<Deployment>().get("assistant").await.unwrap();
        let args = d.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
        assert!(args.contains(&"--auth-tokens-secret=assistant-clients.tokens".to_owned()), "{args:?}");

        // The real API server accepted both NetworkPolicies as built.
        let np = ns.api::<NetworkPolicy>().get("inventory").await.unwrap();
        let spec = serde_json::to_value(np.spec.unwrap()).unwrap();
        assert_eq!(spec["ingress"][0]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"], "assistant");
        let np = ns.api::<NetworkPolicy>().get("assistant").await.unwrap();
        let egress = serde_json::to_value(np.spec.unwrap().egress.unwrap()).unwrap();
        assert_eq!(egress[2]["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"], "inventory");
        // This control plane runs without an endpoint reconciler, so there is no
        // `default/kubernetes` EndpointSlice: the API-server rule falls back to its ports
        // (on kind, tests/e2e checks the address rule).
        assert_eq!(
            egress[1],
            json!({"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}),
            "{egress}"
        );

        // A tool that names another Secret widens the Role; dropping auth, the upstream and
        // the tools narrows it.
        // The sample's policy names `restock`, which this patch drops: drop the policy too.
        let patch = json!({"spec": {"auth": null, "networkPolicy": null, "upstreams": null, "policies": null, "tools": [{"name": "get", "handler": {"http": {"url": "http://x/", "headers": {"K": "{{secret.other.k}}"}}}}]}});
        ns.api::<McpServer>().patch("assistant", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        eventually(30, "the Role names only `other`", || async {
            let role = ns.api::<Role>().get("assistant-config-reader").await.ok()?;
            (secret_names(role)? == ["other"]).then_some(())
        })
        .await;
        let patch = json!({"spec": {"tools": [{"name": "add", "handler": {"builtin": "add"}}]}});
        ns.api::<McpServer>().patch("assistant", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        eventually(30, "the Role grants no Secret", || async {
            let role = ns.api::<Role>().get("assistant-config-reader").await.ok()?;
            secret_names(role).is_none().then_some(())
        })
        .await;
        eventually(30, "the NetworkPolicy removed with networkPolicy", || async {
            ns.api::<NetworkPolicy>().get_opt("assistant").await.ok()?.is_none().then_some(())
        })
        .await;
        let listed = kubectl(&["get", "quiver", "-n", &ns.name, "-o", "name"]);
        assert!(listed.contains("mcpserver.quiver.dev/assistant") && listed.contains("mcpserver.quiver.dev/inventory"), "{listed}");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn tools_only_changes_update_the_config_map_without_rolling() {
    with_ns("q-tools", |ns| async move {
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "Ready", "True", 90).await;
        let before = ns.api::<Deployment>().get("calculator").await.unwrap();
        let hash_before = ns.mcp("calculator").await.status.unwrap().config_hash.unwrap();
        let patch = json!({"spec": {"tools": [{"name": "add", "handler": {"builtin": "add"}}, {"name": "shout", "handler": {"builtin": "upper"}}]}});
        ns.api::<McpServer>().patch("calculator", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let cm = eventually(30, "ConfigMap with the new tool", || async {
            let cm = ns.api::<ConfigMap>().get("calculator-tools").await.ok()?;
            cm.data.as_ref()?.get("tools.yaml")?.contains("shout").then_some(cm)
        })
        .await;
        assert!(!cm.data.unwrap()["tools.yaml"].contains("explain"));
        let status = eventually(30, "status with the new hash", || async {
            ns.mcp("calculator").await.status.filter(|s| s.config_hash.as_deref() != Some(&hash_before) && s.tool_count == Some(2))
        })
        .await;
        assert_eq!(status.tool_count, Some(2));
        let after = ns.api::<Deployment>().get("calculator").await.unwrap();
        assert_eq!(after.metadata.generation, before.metadata.generation, "a tools-only change must not roll the Deployment");

        // An image change does roll it.
        let patch = json!({"spec": {"image": "quiver-server:other"}});
        ns.api::<McpServer>().patch("calculator", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        eventually(30, "Deployment rolled", || async {
            let d = ns.api::<Deployment>().get("calculator").await.ok()?;
            (d.metadata.generation > before.metadata.generation).then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn invalid_tools_are_refused_naming_the_field_and_the_last_good_config_stays() {
    with_ns("q-invalid", |ns| async move {
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "ConfigValid", "True", 60).await;
        let good = ns.api::<ConfigMap>().get("calculator-tools").await.unwrap().data;
        let patch = json!({"spec": {"tools": [{"name": "add", "handler": {"builtin": "addd"}}]}});
        ns.api::<McpServer>()
            .patch("calculator", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let (reason, message) = ns.wait_condition("calculator", "ConfigValid", "False", 30).await;
        assert_eq!(reason, "InvalidToolConfig");
        assert!(
            message.contains("spec.tools[0].handler.builtin: unknown builtin `addd`"),
            "{message}"
        );
        assert_eq!(
            ns.api::<ConfigMap>().get("calculator-tools").await.unwrap().data,
            good,
            "the last good ConfigMap stays"
        );
        let events: Api<Event> = ns.api();
        eventually(30, "InvalidToolConfig event", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("InvalidToolConfig"))
        })
        .await;

        // A missing toolsFrom ConfigMap is refused the same way, and creating it heals the object.
        ns.apply_yaml(
            sample("tools-from-configmap.yaml")
                .split(
                    "
---
",
                )
                .nth(1)
                .unwrap(),
        )
        .await;
        let (reason, message) = ns
            .wait_condition("from-configmap", "ConfigValid", "False", 30)
            .await;
        assert_eq!(reason, "ToolsFromMissing");
        assert!(message.contains("shared-tools"), "{message}");
        ns.apply_yaml(
            sample("tools-from-configmap.yaml")
                .split("\n---\n")
                .next()
                .unwrap(),
        )
        .await;
        let (_, message) = ns
            .wait_condition("from-configmap", "ConfigValid", "True", 30)
            .await;
        assert!(message.starts_with("3 tools"), "{message}");
        // An edit of the referenced ConfigMap propagates.
        let patch = json!({"data": {"tools.yaml": "tools:\n  - {name: only, handler: {builtin: now}}\n"}});
        ns.api::<ConfigMap>()
            .patch("shared-tools", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        eventually(30, "rendered ConfigMap follows toolsFrom", || async {
            let cm = ns.api::<ConfigMap>().get("from-configmap-tools").await.ok()?;
            cm.data?
                .get("tools.yaml")?
                .contains(r#""name":"only""#)
                .then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn cel_rules_reject_bad_specs_at_admission() {
    with_ns("q-cel", |ns| async move {
        let api = ns.api::<McpServer>();
        let oidc = json!({"issuer": "https://login.example.com/realms/corp", "audience": "quiver"});
        let sign_in = |url: &str| json!({"url": url, "keysSecretRef": {"name": "keys", "key": "ring"},
            "browserClient": {"clientId": "quiver-browser", "clientSecretRef": {"name": "browser", "key": "secret"}}});
        let cases = [
            (json!({"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 3}}), "set either replicas or autoscaling, not both"),
            (json!({"tools": [{"name": "a", "handler": {"builtin": "add"}}, {"name": "a", "handler": {"builtin": "echo"}}]}), "Duplicate value"),
            (json!({"tuning": {"cpuPinning": true}}), "cpuPinning needs cpus"),
            (json!({"tuning": {"cpuPinning": true, "cpus": 0}}), "should be greater than or equal to 1"),
            (json!({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}), "minReplicas must not exceed maxReplicas"),
            (json!({"podTemplate": {"security": {"runAsUser": 0}}}), "should be greater than or equal to 1"),
            (json!({"auth": {"bearerTokenSecretRef": {"name": "Not_A_Secret", "key": "tokens"}}}), "should match"),
            (json!({"auth": {"upstreamSignIn": sign_in("https://mcp.example.com")}}), "upstreamSignIn needs oidc"),
            (json!({"auth": {"oidc": oidc.clone(), "upstreamSignIn": sign_in("http://mcp.example.com")}}), "url must be https (http only for a loopback host"),
            (json!({"auth": {"oidc": oidc.clone(), "upstreamSignIn": sign_in("http://127.0.0.1.evil.example")}}), "url must be https"),
            (json!({"auth": {"oidc": oidc.clone(), "upstreamSignIn": sign_in("https://mcp.example.com/team")}}), "should match"),
        ];
        for (i, (spec, expected)) in cases.into_iter().enumerate() {
            let obj: McpServer = serde_json::from_value(json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": format!("bad-{i}")}, "spec": spec})).unwrap_or_else(|e| {
                // Values the Rust types cannot even represent go through a raw request.
                panic!("case {i} must deserialize for the typed client: {e}")
            });
            let err = api.create(&PostParams::default(), &obj).await.expect_err("the API server must refuse it");
            let msg = err.to_string();
            assert!(msg.contains(expected), "case {i}: {msg}");
        }
        // A pinned spec with whole CPUs is accepted, and so is sign-in with oidc at an https
        // URL or an http one to a loopback host.
        let ok: McpServer = serde_json::from_value(json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "pinned"}, "spec": {"tuning": {"cpuPinning": true, "cpus": 2}}})).unwrap();
        api.create(&PostParams::default(), &ok).await.unwrap();
        for (i, url) in ["https://mcp.example.com", "http://127.0.0.1:8080/", "http://[::1]:8080", "http://localhost"].into_iter().enumerate() {
            let ok: McpServer = serde_json::from_value(json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": format!("sign-in-{i}")}, "spec": {"auth": {"oidc": oidc.clone(), "upstreamSignIn": sign_in(url)}}})).unwrap();
            api.create(&PostParams::default(), &ok).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn drift_is_repaired_scale_works_and_deletion_collects_children() {
    with_ns("q-drift", |ns| async move {
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "Ready", "True", 90).await;
        // Someone deletes the tools ConfigMap and scales the Deployment by hand.
        ns.api::<ConfigMap>()
            .delete("calculator-tools", &DeleteParams::default())
            .await
            .unwrap();
        let scale = json!({"spec": {"replicas": 5}});
        ns.api::<Deployment>()
            .patch("calculator", &PatchParams::default(), &Patch::Merge(&scale))
            .await
            .unwrap();
        eventually(30, "ConfigMap recreated", || async {
            ns.api::<ConfigMap>().get_opt("calculator-tools").await.ok()?
        })
        .await;
        eventually(30, "replicas restored", || async {
            let d = ns.api::<Deployment>().get("calculator").await.ok()?;
            (d.spec?.replicas == Some(2)).then_some(())
        })
        .await;

        // The scale subresource (kubectl scale) drives the Deployment.
        kubectl(&["scale", "qmcp/calculator", "-n", &ns.name, "--replicas=3"]);
        eventually(30, "Deployment at 3", || async {
            let d = ns.api::<Deployment>().get("calculator").await.ok()?;
            (d.spec?.replicas == Some(3)).then_some(())
        })
        .await;
        eventually(60, "Ready with 3/3 pods", || async {
            ns.condition("calculator", "Ready")
                .await
                .filter(|c| c.0 == "True" && c.2 == "3/3 pods ready")
        })
        .await;

        // Autoscaling creates an HPA.
        let patch = json!({"spec": {"replicas": null, "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}});
        ns.api::<McpServer>()
            .patch("calculator", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let hpas: Api<k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler> = ns.api();
        eventually(30, "HPA", || async { hpas.get_opt("calculator").await.ok()? }).await;

        // Deleting the McpServer garbage-collects every child.
        ns.api::<McpServer>()
            .delete("calculator", &DeleteParams::default())
            .await
            .unwrap();
        eventually(60, "children collected", || async {
            let d = ns.api::<Deployment>().get_opt("calculator").await.ok()?;
            let c = ns.api::<ConfigMap>().get_opt("calculator-tools").await.ok()?;
            let s = ns.api::<Service>().get_opt("calculator").await.ok()?;
            (d.is_none() && c.is_none() && s.is_none()).then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn server_configmap_source_picks_up_edits() {
    let bin = std::env::var("QUIVER_SERVER_BIN")
        .unwrap_or_else(|_| format!("{}/../target/debug/quiver-server", env!("CARGO_MANIFEST_DIR")));
    with_ns("q-cmsrc", |ns| async move {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "tools"}, "data": {"tools.yaml": "tools:\n  - {name: a, handler: {builtin: add}}\n"}})).unwrap();
        ns.api::<ConfigMap>().create(&PostParams::default(), &cm).await.unwrap();
        let admin = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = tokio::process::Command::new(&bin)
            .args(["--config", &format!("configmap:{}/tools", ns.name), "--listen", &format!("127.0.0.1:{mcp}"), "--admin-listen", &format!("127.0.0.1:{admin}")])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let status = |port: u16| async move {
            let out = tokio::process::Command::new("curl").args(["-fsS", &format!("http://127.0.0.1:{port}/status")]).output().await.ok()?;
            serde_json::from_slice::<Value>(&out.stdout).ok()
        };
        let first = eventually(30, "server loaded the ConfigMap", || async { status(admin).await.filter(|s| s["ready"] == true) }).await;
        assert_eq!(first["tools"], 1);
        let start = Instant::now();
        let patch = json!({"data": {"tools.yaml": "tools:\n  - {name: a, handler: {builtin: add}}\n  - {name: b, handler: {builtin: echo}}\n"}});
        ns.api::<ConfigMap>().patch("tools", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let next = eventually(10, "server reloaded", || async { status(admin).await.filter(|s| s["tools"] == 2) }).await;
        println!("ConfigMap edit -> quiver-server serving the new tools (kube watch): {} ms", start.elapsed().as_millis());
        assert_eq!(next["generation"], 2);
        // An invalid edit is rejected and the server keeps serving generation 2.
        let patch = json!({"data": {"tools.yaml": "tools:\n  - {name: a, handler: {builtin: nope}}\n"}});
        ns.api::<ConfigMap>().patch("tools", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let bad = eventually(10, "invalid config reported", || async { status(admin).await.filter(|s| s["lastReload"]["result"] == "invalid") }).await;
        assert_eq!(bad["generation"], 2);
        let _ = child.kill().await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn leader_election_hands_over_after_the_lease_expires() {
    use k8s_openapi::api::coordination::v1::Lease;
    use quiver_operator::leader::{LeaseLock, Timing};
    with_ns("q-lease", |ns| async move {
        let timing = Timing {
            lease: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1500),
            retry: Duration::from_millis(300),
        };
        let a = LeaseLock::new(
            ns.client.clone(),
            &ns.name,
            "quiver-operator",
            "replica-a",
            timing,
        );
        let b = LeaseLock::new(
            ns.client.clone(),
            &ns.name,
            "quiver-operator",
            "replica-b",
            timing,
        );
        let health = quiver_operator::admin::Health::default();
        assert!(a.try_acquire_or_renew().await.unwrap(), "a takes the free lease");
        assert!(
            !b.try_acquire_or_renew().await.unwrap(),
            "b cannot take a held lease"
        );
        assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");
        // a stops renewing (crashed); b takes over once the lease has expired.
        let start = Instant::now();
        tokio::time::timeout(Duration::from_secs(10), b.acquire(&health))
            .await
            .expect("b acquires after expiry");
        assert!(
            start.elapsed() >= Duration::from_millis(1500),
            "not before the lease expired: {:?}",
            start.elapsed()
        );
        let lease = ns
            .api::<Lease>()
            .get("quiver-operator")
            .await
            .unwrap()
            .spec
            .unwrap();
        assert_eq!(lease.holder_identity.as_deref(), Some("replica-b"));
        assert_eq!(lease.lease_transitions, Some(1));
        assert!(!a.try_acquire_or_renew().await.unwrap(), "a has lost it");
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn unlabelled_tools_from_config_maps_work_with_a_warning_and_labelled_ones_propagate() {
    with_ns("q-toolsfrom", |ns| async move {
        // The sample without the watch label.
        let yaml =
            sample("tools-from-configmap.yaml").replace("  labels: {quiver.dev/tools: \"true\"}\n", "");
        assert!(
            !yaml.contains("quiver.dev/tools"),
            "the sample's label was removed"
        );
        ns.apply_yaml(&yaml).await;
        let (_, message) = ns
            .wait_condition("from-configmap", "ConfigValid", "True", 30)
            .await;
        assert!(
            message.starts_with("3 tools"),
            "an unlabelled ConfigMap is still read: {message}"
        );
        let status = eventually(30, "status.unwatchedConfigMaps", || async {
            ns.mcp("from-configmap")
                .await
                .status
                .filter(|s| !s.unwatched_config_maps.is_empty())
        })
        .await;
        assert_eq!(status.unwatched_config_maps, ["shared-tools"]);
        let events: Api<Event> = ns.api();
        let warning = eventually(30, "ToolsFromNotWatched event", || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("ToolsFromNotWatched"))
        })
        .await;
        assert!(
            warning
                .message
                .unwrap_or_default()
                .contains("shared-tools lack the label quiver.dev/tools=true")
        );

        // Labelling it: the warning list clears and edits propagate at once.
        let label = json!({"metadata": {"labels": {"quiver.dev/tools": "true"}}});
        ns.api::<ConfigMap>()
            .patch("shared-tools", &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
        eventually(30, "status.unwatchedConfigMaps cleared", || async {
            ns.mcp("from-configmap")
                .await
                .status
                .filter(|s| s.unwatched_config_maps.is_empty())
        })
        .await;
        let patch =
            json!({"data": {"tools.yaml": "tools:\n  - {name: labelled, handler: {builtin: now}}\n"}});
        ns.api::<ConfigMap>()
            .patch("shared-tools", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        eventually(
            20,
            "the edit of a labelled ConfigMap reaches the rendered one",
            || async {
                let cm = ns.api::<ConfigMap>().get("from-configmap-tools").await.ok()?;
                cm.data?
                    .get("tools.yaml")?
                    .contains(r#""name":"labelled""#)
                    .then_some(())
            },
        )
        .await;
        let warnings = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ToolsFromNotWatched"))
            .map(|e| e.series.and_then(|s| s.count).unwrap_or(1))
            .sum::<i32>();
        assert_eq!(warnings, 1, "the warning is emitted once, not on every reconcile");
    })
    .await;
}

/// A minimal `monitoring.coreos.com/v1` ServiceMonitor CRD, created unless one exists.
async fn ensure_service_monitor_crd(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com", "scope": "Namespaced",
            "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor", "listKind": "ServiceMonitorList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap();
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("ServiceMonitor CRD: {e}"),
    }
    eventually(30, "ServiceMonitor CRD Established", || async {
        let c = crds.get("servicemonitors.monitoring.coreos.com").await.ok()?;
        c.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_service_monitor_follows_monitoring_on_and_off() {
    use kube::api::DynamicObject;
    with_ns("q-monitor", |ns| async move {
        ensure_service_monitor_crd(&ns.client).await;
        let ar = quiver_operator::build::service_monitor_resource();
        let monitors: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &ar);
        // One of the same name that the McpServer does not own must survive.
        let foreign = DynamicObject::new("other", &ar).data(json!({"spec": {}}));
        monitors.create(&PostParams::default(), &foreign).await.unwrap();
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "ConfigValid", "True", 60).await;
        let on = json!({"spec": {"monitoring": {"serviceMonitor": true}}});
        ns.api::<McpServer>()
            .patch("calculator", &PatchParams::default(), &Patch::Merge(&on))
            .await
            .unwrap();
        let sm = eventually(30, "ServiceMonitor created", || async {
            monitors.get_opt("calculator").await.ok()?
        })
        .await;
        assert_eq!(sm.owner_references()[0].kind, "McpServer");
        let off = json!({"spec": {"monitoring": {"serviceMonitor": false}}});
        ns.api::<McpServer>()
            .patch("calculator", &PatchParams::default(), &Patch::Merge(&off))
            .await
            .unwrap();
        eventually(30, "ServiceMonitor deleted when turned off", || async {
            monitors.get_opt("calculator").await.ok()?.is_none().then_some(())
        })
        .await;
        assert!(
            monitors.get_opt("other").await.unwrap().is_some(),
            "a foreign ServiceMonitor stays"
        );
    })
    .await;
}

/// An McpServer whose schema nests deeper than serde_json reads (128 levels) is accepted by
/// the API server. It must not stop the operator from reading the list of McpServers (kube-rs
/// reads a list as one document): that McpServer gets a condition, the others reconcile.
#[tokio::test]
#[ignore = "needs cluster"]
async fn a_schema_nested_deeper_than_json_readers_allow_stalls_nothing() {
    with_ns("q-deep", |ns| async move {
        let mut deep = json!(1);
        for _ in 0..200 {
            deep = Value::Array(vec![deep]);
        }
        let obj = json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "deep", "namespace": ns.name},
            "spec": {"tools": [{"name": "a", "handler": {"builtin": "json"},
                "inputSchema": {"type": "object", "properties": {"a": {"default": deep}}}}]},
        });
        // kubectl (Go) writes it; kube-rs could not read the created object back.
        let mut kubectl = std::process::Command::new("kubectl")
            .args(["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("kubectl on PATH");
        std::io::Write::write_all(&mut kubectl.stdin.take().unwrap(), obj.to_string().as_bytes()).unwrap();
        assert!(
            kubectl.wait().unwrap().success(),
            "the API server accepts the object"
        );
        let (reason, message) = ns.wait_condition("deep", "ConfigValid", "False", 60).await;
        assert_eq!(reason, "InvalidToolConfig");
        assert!(
            message.contains("spec.tools[0].inputSchema: nests 204 deep; at most 32"),
            "{message}"
        );
        // The operator still lists, watches and reconciles the rest.
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "ConfigValid", "True", 60).await;
    })
    .await;
}
