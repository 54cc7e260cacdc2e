//! The controller: watches McpServers, the children they own (selected by the
//! `app.kubernetes.io/managed-by=quiver-operator` label) and the `toolsFrom` ConfigMaps that
//! carry `quiver.dev/tools=true`, and runs reconciles with bounded concurrency. No watch
//! covers every ConfigMap of the cluster.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::admin::Health;
use crate::backoff::Backoff;
use crate::build::{Defaults, MANAGED_BY};
use crate::crd::{McpServer, TOOLS_LABEL};
use crate::reconcile::{self, Context, error_policy, reconcile};

/// The McpServers in the ConfigMap's namespace that read it through `toolsFrom`.
pub fn referencing(mcps: &[Arc<McpServer>], cm: &ConfigMap) -> Vec<ObjectRef<McpServer>> {
    let ns = cm.namespace();
    let name = cm.name_any();
    mcps.iter()
        .filter(|m| m.namespace() == ns)
        .filter(|m| {
            m.spec
                .tools_from
                .iter()
                .any(|t| t.config_map_key_ref.name == name)
        })
        .map(|m| ObjectRef::from_obj(&**m))
        .collect()
}

/// Forgets the backoff of an McpServer the controller found deleted (a pending retry of a
/// failing object ends here), so the table does not keep deleted objects.
pub fn forget_deleted(backoff: &Backoff, err: &controller::Error<reconcile::Error, watcher::Error>) {
    if let controller::Error::ObjectNotFound(r) = err {
        let mut key = ObjectRef::<McpServer>::new(&r.name);
        key.namespace.clone_from(&r.namespace);
        backoff.reset(&key);
    }
}

/// Runs the controller until SIGTERM/SIGINT.
pub async fn run(
    client: Client,
    defaults: Defaults,
    concurrency: u16,
    probe_pods: bool,
    health: Arc<Health>,
) {
    let mcps: Api<McpServer> = Api::all(client.clone());
    let managed = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let tools = watcher::Config::default().labels(&format!("{}={}", TOOLS_LABEL.0, TOOLS_LABEL.1));
    let controller = Controller::new(mcps, watcher::Config::default());
    let store = controller.store();
    let _ = health.store.set(store.clone());
    // Ready once the McpServer watch has listed (also with zero McpServers). The store's
    // readiness is a oneshot that wakes only one of several concurrent waiters (the controller
    // waits on it too), so re-poll it instead of awaiting it once.
    let (listed, flag) = (store.clone(), health.clone());
    tokio::spawn(async move {
        loop {
            match tokio::time::timeout(std::time::Duration::from_millis(250), listed.wait_until_ready()).await
            {
                Ok(Ok(())) => break flag.listed.store(true, Ordering::Release),
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    });
    let ctx = Arc::new(Context {
        client: client.clone(),
        defaults,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "quiver-operator".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        metrics: health.metrics.clone(),
        probe_pods,
        backoff: Backoff::default(),
    });
    let results_ctx = ctx.clone();
    controller
        .owns(Api::<Deployment>::all(client.clone()), managed.clone())
        .owns(Api::<Service>::all(client.clone()), managed.clone())
        // The rendered tools ConfigMaps (drift repair), selected by label.
        .owns(Api::<ConfigMap>::all(client.clone()), managed)
        // toolsFrom sources that opted in with the label: their edits propagate at once.
        .watches(
            Api::<ConfigMap>::all(client.clone()),
            tools,
            move |cm: ConfigMap| referencing(&store.state(), &cm),
        )
        .with_config(controller::Config::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = &res {
                forget_deleted(&results_ctx.backoff, e);
                tracing::debug!(error = %e, "reconcile result");
            }
            async {}
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mcp(ns: &str, name: &str, from: &[&str]) -> Arc<McpServer> {
        let refs: Vec<_> = from
            .iter()
            .map(|n| json!({"configMapKeyRef": {"name": n, "key": "tools.yaml"}}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"toolsFrom": refs},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_config_map_maps_to_the_mcpservers_of_its_namespace_that_read_it() {
        let all = [
            mcp("a", "one", &["shared"]),
            mcp("a", "two", &["other", "shared"]),
            mcp("a", "three", &["other"]),
            mcp("b", "four", &["shared"]),
        ];
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "shared", "namespace": "a"}})).unwrap();
        let names: Vec<String> = referencing(&all, &cm).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["one", "two"]);
    }

    #[test]
    fn a_deleted_object_leaves_the_backoff_table() {
        let backoff = Backoff::default();
        let gone = ObjectRef::<McpServer>::new("gone").within("ns");
        backoff.fail(gone.clone());
        backoff.fail(ObjectRef::new("kept").within("ns"));
        forget_deleted(
            &backoff,
            &controller::Error::ObjectNotFound(Box::new(gone.clone().erase())),
        );
        assert_eq!(backoff.len(), 1);
        assert_eq!(
            backoff.fail(gone),
            std::time::Duration::from_secs(1),
            "gone was forgotten"
        );
    }
}
