//! The controller: watches McpServers, the children they own (every kind, selected by the
//! `app.kubernetes.io/managed-by=quiver-operator` label, metadata only, kept in stores that
//! answer the reconciler's ownership checks and tell it which applies and deletes it can
//! skip) and the `toolsFrom` ConfigMaps that carry `quiver.dev/tools=true`, and runs
//! reconciles with bounded concurrency. No watch covers every ConfigMap of the cluster.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde::de::DeserializeOwned;

use crate::admin::Health;
use crate::backoff::Backoff;
use crate::build::{self, Defaults, MANAGED_BY};
use crate::crd::{McpServer, TOOLS_LABEL};
use crate::reconcile::{self, Context, Feed, Memo, Owned, Writers, error_policy, reconcile};

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

/// Forgets the backoff and the applied children of an McpServer the controller found deleted
/// (its pending resync or retry ends here), so neither table keeps deleted objects.
pub fn forget_deleted(
    backoff: &Backoff,
    memo: &Memo,
    err: &controller::Error<reconcile::Error, watcher::Error>,
) {
    if let controller::Error::ObjectNotFound(r) = err {
        let mut key = ObjectRef::<McpServer>::new(&r.name);
        key.namespace.clone_from(&r.namespace);
        backoff.reset(&key);
        memo.forget(&key);
    }
}

/// An `Api` over one namespace, or over the cluster.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    namespace.map_or_else(
        || Api::all(client.clone()),
        |ns| Api::namespaced(client.clone(), ns),
    )
}

/// Drops what the ownership checks and owner triggers do not read (managed fields, labels
/// and annotations), so the stores hold little more than names, uids and owner references.
pub fn slim<K>(o: &mut PartialObjectMeta<K>) {
    o.metadata.managed_fields = None;
    o.metadata.annotations = None;
    o.metadata.labels = None;
}

/// Drives a metadata-only watch into `feed` (store and watch state); its items trigger the
/// owners' reconciles. Its errors stay here, in the watch state and its own backoff: the
/// controller backs off every trigger after an error of any one, and the watch of a kind
/// whose CRD is absent fails for as long as it is absent.
fn follow<K>(
    events: impl Stream<Item = Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>> + Send + 'static,
    mut feed: Feed<K>,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Send + Sync,
{
    events
        .default_backoff()
        .modify(slim)
        .map(move |item| {
            feed.observe(&item);
            if let Err(e) = &item {
                tracing::debug!(error = %e, "watch of owned children");
            }
            item
        })
        .filter(|item| std::future::ready(item.is_ok()))
        .touched_objects()
}

/// The metadata-only watch of one owned kind (an `Api` of `PartialObjectMeta` asks for
/// metadata only: never a Secret's value or a ConfigMap's data crosses the wire).
fn owned_stream<K>(
    client: &Client,
    namespace: Option<&str>,
    wc: watcher::Config,
    feed: Feed<K>,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    follow(watcher(api::<PartialObjectMeta<K>>(client, namespace), wc), feed)
}

/// The metadata-only watch of an owned kind whose CRD may be absent: while the API server
/// answers 404 for it, the watch retries with its backoff and its state says so.
fn served_stream(
    client: &Client,
    namespace: Option<&str>,
    wc: watcher::Config,
    resource: &ApiResource,
    feed: Feed<DynamicObject>,
) -> impl Stream<Item = Result<PartialObjectMeta<DynamicObject>, watcher::Error>> + Send + 'static {
    let api = namespace.map_or_else(
        || Api::<PartialObjectMeta<DynamicObject>>::all_with(client.clone(), resource),
        |ns| Api::namespaced_with(client.clone(), ns, resource),
    );
    follow(watcher(api, wc), feed)
}

/// `controller` triggered by every owned kind's watch, each filling its store in `writers`.
fn owning(
    controller: Controller<McpServer>,
    client: &Client,
    namespace: Option<&str>,
    writers: Writers,
) -> Controller<McpServer> {
    let managed = watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1));
    let Writers {
        service_accounts,
        roles,
        role_bindings,
        config_maps,
        deployments,
        services,
        secrets,
        autoscalers,
        disruption_budgets,
        network_policies,
        ingresses,
        service_monitors,
        http_routes,
    } = writers;
    let (sm, route) = (build::service_monitor_resource(), build::http_route_resource());
    controller
        .owns_stream(owned_stream(client, namespace, managed.clone(), deployments))
        .owns_stream(owned_stream(client, namespace, managed.clone(), services))
        // The rendered tools ConfigMaps (drift repair), selected by label.
        .owns_stream(owned_stream(client, namespace, managed.clone(), config_maps))
        .owns_stream(owned_stream(client, namespace, managed.clone(), service_accounts))
        .owns_stream(owned_stream(client, namespace, managed.clone(), roles))
        .owns_stream(owned_stream(client, namespace, managed.clone(), role_bindings))
        // State-key Secrets, metadata only (never a value): one deleted to rotate the key is
        // made again at once.
        .owns_stream(owned_stream(client, namespace, managed.clone(), secrets))
        // The optional children: edited ones are repaired at once, and one turned off is
        // deleted only when its store shows it (no GET to find that none is left).
        .owns_stream(owned_stream(client, namespace, managed.clone(), autoscalers))
        .owns_stream(owned_stream(
            client,
            namespace,
            managed.clone(),
            disruption_budgets,
        ))
        .owns_stream(owned_stream(client, namespace, managed.clone(), network_policies))
        .owns_stream(owned_stream(client, namespace, managed.clone(), ingresses))
        .owns_stream_with(
            served_stream(client, namespace, managed.clone(), &sm, service_monitors),
            sm,
        )
        .owns_stream_with(
            served_stream(client, namespace, managed, &route, http_routes),
            route,
        )
}

/// Runs the controller until SIGTERM/SIGINT: over the whole cluster when `namespaces` is
/// empty, else one controller per listed namespace (what a namespace-scoped install's Roles
/// allow). They share one context, so backoff, metrics and events are the operator's.
pub async fn run(
    client: Client,
    defaults: Defaults,
    concurrency: u16,
    probe_pods: bool,
    health: Arc<Health>,
    namespaces: &[String],
) {
    let scopes: Vec<Option<&str>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    };
    let (stores, writers): (Vec<_>, Vec<_>) = scopes
        .iter()
        .map(|ns| reconcile::stores(ns.map(str::to_owned)))
        .unzip();
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
        owned: Owned::new(stores),
        memo: Memo::default(),
    });
    let remaining = Arc::new(std::sync::atomic::AtomicUsize::new(scopes.len()));
    futures_util::future::join_all(scopes.into_iter().zip(writers).map(|(ns, writers)| {
        run_scope(
            client.clone(),
            ns,
            writers,
            ctx.clone(),
            concurrency,
            health.clone(),
            remaining.clone(),
        )
    }))
    .await;
}

async fn run_scope(
    client: Client,
    namespace: Option<&str>,
    writers: Writers,
    ctx: Arc<Context>,
    concurrency: u16,
    health: Arc<Health>,
    remaining: Arc<std::sync::atomic::AtomicUsize>,
) {
    let tools = watcher::Config::default().labels(&format!("{}={}", TOOLS_LABEL.0, TOOLS_LABEL.1));
    let controller = Controller::new(api::<McpServer>(&client, namespace), watcher::Config::default());
    let store = controller.store();
    if let Ok(mut stores) = health.stores.lock() {
        stores.push(store.clone());
    }
    // Ready once every McpServer watch has listed (also with zero McpServers). The store's
    // readiness is a oneshot that wakes only one of several concurrent waiters (the controller
    // waits on it too), so re-poll it instead of awaiting it once.
    let (listed, flag) = (store.clone(), health.clone());
    tokio::spawn(async move {
        loop {
            match tokio::time::timeout(std::time::Duration::from_millis(250), listed.wait_until_ready()).await
            {
                Ok(Ok(())) => {
                    if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        flag.listed.store(true, Ordering::Release);
                    }
                    break;
                }
                Ok(Err(_)) => break,
                Err(_) => {}
            }
        }
    });
    let results_ctx = ctx.clone();
    owning(controller, &client, namespace, writers)
        // toolsFrom sources that opted in with the label: their edits propagate at once.
        .watches(
            api::<ConfigMap>(&client, namespace),
            tools,
            move |cm: ConfigMap| referencing(&store.state(), &cm),
        )
        .with_config(controller::Config::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| {
            if let Err(e) = &res {
                forget_deleted(&results_ctx.backoff, &results_ctx.memo, e);
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

    /// The watch of a kind whose CRD is absent fails until it is installed: its errors go to
    /// its state, never to the controller (which would back off every trigger after one).
    #[tokio::test(start_paused = true)]
    async fn a_failing_watch_reports_to_its_state_not_to_the_controller() {
        use crate::reconcile::WatchState;
        let (stores, writers) = reconcile::stores(None);
        let status = kube::core::Status {
            code: 404,
            ..kube::core::Status::default()
        };
        let route: PartialObjectMeta<DynamicObject> = serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "calc", "namespace": "ns", "resourceVersion": "5",
                "ownerReferences": [{"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "name": "calc", "uid": "u", "controller": true}]},
        }))
        .unwrap();
        let events = futures_util::stream::iter([
            Err(watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
                status,
            )))),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(route)),
            Ok(watcher::Event::InitDone),
        ]);
        let mut out = std::pin::pin!(follow(events, writers.http_routes));
        let first = out.next().await.expect("the listed route");
        assert_eq!(first.unwrap().metadata.name.as_deref(), Some("calc"));
        assert_eq!(stores.http_routes.health.state(), WatchState::Listing);
        assert!(out.next().await.is_none(), "the error is not passed on");
        assert_eq!(stores.http_routes.health.state(), WatchState::Current);
        assert!(stores.http_routes.get("ns", "calc").is_some());
    }

    #[test]
    fn a_deleted_object_leaves_the_backoff_table_and_the_memo() {
        let backoff = Backoff::default();
        let memo = Memo::default();
        let gone = ObjectRef::<McpServer>::new("gone").within("ns");
        let kept = ObjectRef::<McpServer>::new("kept").within("ns");
        backoff.fail(gone.clone());
        backoff.fail(kept.clone());
        memo.record(&gone, ("ConfigMap", "x"), 1, "7".into());
        memo.record(&kept, ("ConfigMap", "x"), 1, "7".into());
        forget_deleted(
            &backoff,
            &memo,
            &controller::Error::ObjectNotFound(Box::new(gone.clone().erase())),
        );
        assert_eq!(backoff.len(), 1);
        assert_eq!(memo.len(), 1);
        assert!(memo.unchanged(&kept, ("ConfigMap", "x"), 1, "7"), "kept is kept");
        assert_eq!(
            backoff.fail(gone),
            std::time::Duration::from_secs(1),
            "gone was forgotten"
        );
    }
}
