//! Against a real control plane with the operator binary running (scripts/operator-it.sh):
//! an McpServer named like objects someone else made neither changes nor adopts them, says
//! so (condition and event), leaves them behind when it is deleted (the garbage collector
//! runs), and takes the names over only once they are free.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Service, ServiceAccount};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};
use quiver_operator::crd::McpServer;
use serde_json::{Value, json};

mod common;

use common::*;

const NOTE: &str = "exists and is not owned by this McpServer; refusing to modify it";

fn mcpserver() -> String {
    r#"apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata:
  name: victim
spec:
  tools:
    - name: add
      handler: {builtin: add}"#
        .to_owned()
}

/// The whole object as the API server stores it (resourceVersion included: any write changes it).
async fn snapshot<K>(ns: &TempNs, name: &str) -> Value
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    serde_json::to_value(ns.api::<K>().get(name).await.unwrap()).unwrap()
}

/// ChildConflict events about the McpServer `victim`.
async fn conflict_events(ns: &TempNs) -> Vec<String> {
    let events = ns.api::<Event>().list(&ListParams::default()).await.unwrap();
    events
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ChildConflict"))
        .filter(|e| e.involved_object.name.as_deref() == Some("victim"))
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn an_mcpserver_named_like_foreign_objects_neither_changes_nor_adopts_them() {
    with_ns("q-owner", |ns| async move {
        let n = ns.name.clone();
        // Someone else's Service (its selector sends traffic to their pods) and a ConfigMap
        // that happens to be called like the McpServer's tools.
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "victim", "labels": {"app": "theirs"}},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }))
        .unwrap();
        ns.api::<Service>().create(&PostParams::default(), &svc).await.unwrap();
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "victim-tools"},
            "data": {"settings.yaml": "theirs: true\n"},
        }))
        .unwrap();
        ns.api::<ConfigMap>().create(&PostParams::default(), &cm).await.unwrap();
        let svc_before = snapshot::<Service>(&ns, "victim").await;
        let cm_before = snapshot::<ConfigMap>(&ns, "victim-tools").await;

        ns.apply_yaml(&mcpserver()).await;
        let (reason, message) = ns.wait_condition("victim", "Degraded", "True", 60).await;
        assert_eq!(reason, "ChildConflict", "{message}");
        assert!(message.contains(&format!("Service {n}/victim {NOTE}")), "{message}");
        assert!(message.contains(&format!("ConfigMap {n}/victim-tools {NOTE}")), "{message}");
        let (reason, _) = ns.wait_condition("victim", "Ready", "False", 5).await;
        assert_eq!(reason, "ChildConflict");
        let events = eventually(30, "a ChildConflict event", || async {
            Some(conflict_events(&ns).await).filter(|e| !e.is_empty())
        })
        .await;
        assert!(
            events.iter().any(|m| m.contains(&format!("Service {n}/victim {NOTE}"))
                && m.contains(&format!("ConfigMap {n}/victim-tools {NOTE}"))),
            "one Warning event names both: {events:?}"
        );

        // Untouched to the byte: same selector, data and no owner reference (same resourceVersion).
        assert_eq!(snapshot::<Service>(&ns, "victim").await, svc_before);
        assert_eq!(snapshot::<ConfigMap>(&ns, "victim-tools").await, cm_before);
        assert!(svc_before["metadata"].get("ownerReferences").is_none(), "{svc_before}");
        // The pods would serve their ConfigMap: no Deployment. Its own ServiceAccount it made.
        assert!(ns.api::<Deployment>().get_opt("victim").await.unwrap().is_none());
        let sa = ns.api::<ServiceAccount>().get("victim").await.unwrap();
        assert_eq!(sa.owner_references()[0].kind, "McpServer");

        // Deleting the McpServer collects what it owns and nothing else.
        ns.api::<McpServer>()
            .delete("victim", &DeleteParams::default())
            .await
            .unwrap();
        eventually(60, "its own ServiceAccount garbage-collected", || async {
            ns.api::<ServiceAccount>().get_opt("victim").await.ok()?.is_none().then_some(())
        })
        .await;
        assert_eq!(snapshot::<Service>(&ns, "victim").await, svc_before);
        assert_eq!(snapshot::<ConfigMap>(&ns, "victim-tools").await, cm_before);

        // Again, and this time the names become free: the McpServer makes its own.
        ns.apply_yaml(&mcpserver()).await;
        ns.wait_condition("victim", "Degraded", "True", 60).await;
        ns.api::<Service>()
            .delete("victim", &DeleteParams::default())
            .await
            .unwrap();
        let svc = eventually(120, "the McpServer's own Service", || async {
            let s = ns.api::<Service>().get_opt("victim").await.ok()??;
            (s.owner_references().first()?.kind == "McpServer").then_some(s)
        })
        .await;
        let selector = svc.spec.unwrap().selector.unwrap();
        assert_eq!(selector.get("app.kubernetes.io/instance").map(String::as_str), Some("victim"));
        // Still held back by the ConfigMap, which alone is named now.
        eventually(60, "only the ConfigMap in conflict", || async {
            let (s, r, m) = ns.condition("victim", "Degraded").await?;
            (s == "True" && r == "ChildConflict" && !m.contains("Service ")).then_some(())
        })
        .await;
        assert_eq!(snapshot::<ConfigMap>(&ns, "victim-tools").await, cm_before);
        ns.api::<ConfigMap>()
            .delete("victim-tools", &DeleteParams::default())
            .await
            .unwrap();
        let (reason, _) = ns.wait_condition("victim", "Ready", "True", 180).await;
        assert_eq!(reason, "PodsReady");
        let (reason, _) = ns.wait_condition("victim", "Degraded", "False", 5).await;
        assert_eq!(reason, "AsExpected");
        let cm = ns.api::<ConfigMap>().get("victim-tools").await.unwrap();
        assert_eq!(cm.owner_references()[0].kind, "McpServer");
        assert!(cm.data.unwrap().contains_key("tools.yaml"));
    })
    .await;
}
