//! The controller's metadata-only watch stores of the children (every kind an McpServer may
//! own, selected by the `app.kubernetes.io/managed-by=quiver-operator` label), and how far
//! each store can be trusted.
//!
//! A store that holds an object answers who controls it without a request. Whether it may
//! also answer that an object is *absent* depends on its watch ([`WatchState`]): once the
//! watch has listed its kind and follows it, a labelled object missing from the store does not
//! exist; while it lists (at start, after an error) nothing is known; when the API server
//! answers 404 for the kind itself (no CRD), no object of it exists. Every object that enters a
//! store brings its owner's reconcile, so an object a store learns of late is still acted on.

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;
use kube::api::DynamicObject;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;

use super::owned::{Holder, holder_of};
use crate::build;

/// A metadata-only store of one child kind (what the controller's watch of it has seen).
pub type MetaStore<K> = Store<PartialObjectMeta<K>>;
/// The writer that fills a [`MetaStore`].
pub type MetaWriter<K> = Writer<PartialObjectMeta<K>>;

/// How far a watch's store reflects the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchState {
    /// Not listed yet, or listing again after an error: an object missing from the store may
    /// exist.
    Listing,
    /// Listed and followed: every labelled object of the kind is in the store.
    Current,
    /// The API server does not serve the kind (its CRD is not installed): none exists.
    Unserved,
}

const LISTING: u8 = 0;
const CURRENT: u8 = 1;
const UNSERVED: u8 = 2;

/// The [`WatchState`] of one watch, shared by the watch (which sets it) and the reconciles
/// (which read it).
#[derive(Debug, Clone, Default)]
pub struct WatchHealth(Arc<AtomicU8>);

impl WatchHealth {
    /// The watch's state now.
    pub fn state(&self) -> WatchState {
        match self.0.load(Ordering::Acquire) {
            CURRENT => WatchState::Current,
            UNSERVED => WatchState::Unserved,
            _ => WatchState::Listing,
        }
    }

    /// Follows one item of the watch, after the store applied it: current once a list
    /// completes, listing again when one starts or an error interrupts the watch, unserved when
    /// the API server answers 404 for the kind.
    pub fn observe<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        let state = match item {
            Ok(watcher::Event::InitDone) => CURRENT,
            Ok(watcher::Event::Init) => LISTING,
            Ok(_) => return,
            Err(e) if not_served(e) => UNSERVED,
            Err(_) => LISTING,
        };
        self.0.store(state, Ordering::Release);
    }

    /// An object of the kind was just written: the kind is served, whatever the watch last
    /// heard, so an unserved state no longer holds (until the watch lists it, nothing is known).
    pub fn served(&self) {
        let _ = self
            .0
            .compare_exchange(UNSERVED, LISTING, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A 404 on listing or watching: the API server does not serve the kind. (By code, not
/// reason: a missing API group may answer a plain-text 404.)
fn not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s.code == 404,
        _ => false,
    }
}

/// What a store says of one child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Who holds the name, when the store has the object; `None`: not in the store.
    pub holder: Option<Holder>,
    /// The stored object's `resourceVersion`.
    pub version: Option<String>,
    /// How far the store can be trusted.
    pub state: WatchState,
}

impl Seen {
    /// Nothing known: no store covers the namespace.
    pub const UNKNOWN: Self = Self {
        holder: None,
        version: None,
        state: WatchState::Listing,
    };
}

/// A child kind's store as the reconciler reads it.
pub trait View: Send + Sync {
    /// The object `ns/name` as the store has it, with the McpServer of `owner_uid` in mind.
    fn seen(&self, ns: &str, name: &str, owner_uid: &str) -> Seen;
    /// The watch's state.
    fn health(&self) -> &WatchHealth;
}

/// The store of one child kind and the state of its watch.
#[derive(Clone)]
pub struct Watched<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// The objects' metadata.
    pub store: MetaStore<K>,
    /// The watch's state.
    pub health: WatchHealth,
    dyntype: K::DynamicType,
}

/// What the controller's watch of one kind feeds: the store's writer and the watch's state.
pub struct Feed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    writer: MetaWriter<K>,
    health: WatchHealth,
}

impl<K> Feed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// Applies one item of the watch to the store, then to the watch's state.
    pub fn observe(&mut self, item: &Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>) {
        if let Ok(event) = item {
            self.writer.apply_watcher_event(event);
        }
        self.health.observe(item);
    }
}

/// An empty store of a kind and the feed that fills it.
fn watched<K>(dyntype: K::DynamicType) -> (Watched<K>, Feed<K>)
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    let writer = MetaWriter::<K>::new(dyntype.clone());
    let health = WatchHealth::default();
    (
        Watched {
            store: writer.as_reader(),
            health: health.clone(),
            dyntype,
        },
        Feed { writer, health },
    )
}

impl<K> Watched<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    /// The metadata of `ns/name`, if the store has it.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<PartialObjectMeta<K>>> {
        self.store
            .get(&ObjectRef::new_with(name, self.dyntype.clone()).within(ns))
    }
}

impl<K> View for Watched<K>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    fn seen(&self, ns: &str, name: &str, owner_uid: &str) -> Seen {
        let meta = self.get(ns, name);
        Seen {
            holder: meta.as_ref().map(|m| holder_of(&m.metadata, owner_uid)),
            version: meta.and_then(|m| m.metadata.resource_version.clone()),
            state: self.health.state(),
        }
    }

    fn health(&self) -> &WatchHealth {
        &self.health
    }
}

/// The watch stores of every child kind, for one watched scope (the cluster or one
/// namespace).
#[derive(Clone)]
pub struct Stores {
    /// Which namespace these stores cover (`None`: every namespace).
    pub namespace: Option<String>,
    /// ServiceAccounts labelled as the operator's.
    pub service_accounts: Watched<ServiceAccount>,
    /// Roles labelled as the operator's.
    pub roles: Watched<Role>,
    /// RoleBindings labelled as the operator's.
    pub role_bindings: Watched<RoleBinding>,
    /// ConfigMaps labelled as the operator's.
    pub config_maps: Watched<ConfigMap>,
    /// Deployments labelled as the operator's.
    pub deployments: Watched<Deployment>,
    /// Services labelled as the operator's.
    pub services: Watched<Service>,
    /// Secrets labelled as the operator's (the state keys; metadata only, never a value).
    pub secrets: Watched<Secret>,
    /// HorizontalPodAutoscalers labelled as the operator's.
    pub autoscalers: Watched<HorizontalPodAutoscaler>,
    /// PodDisruptionBudgets labelled as the operator's.
    pub disruption_budgets: Watched<PodDisruptionBudget>,
    /// NetworkPolicies labelled as the operator's.
    pub network_policies: Watched<NetworkPolicy>,
    /// Ingresses labelled as the operator's.
    pub ingresses: Watched<Ingress>,
    /// ServiceMonitors labelled as the operator's (their CRD may be absent).
    pub service_monitors: Watched<DynamicObject>,
    /// HTTPRoutes labelled as the operator's (their CRD may be absent).
    pub http_routes: Watched<DynamicObject>,
}

/// The feeds of one scope's [`Stores`], driven by the controller's watches.
pub struct Writers {
    /// See [`Stores::service_accounts`].
    pub service_accounts: Feed<ServiceAccount>,
    /// See [`Stores::roles`].
    pub roles: Feed<Role>,
    /// See [`Stores::role_bindings`].
    pub role_bindings: Feed<RoleBinding>,
    /// See [`Stores::config_maps`].
    pub config_maps: Feed<ConfigMap>,
    /// See [`Stores::deployments`].
    pub deployments: Feed<Deployment>,
    /// See [`Stores::services`].
    pub services: Feed<Service>,
    /// See [`Stores::secrets`].
    pub secrets: Feed<Secret>,
    /// See [`Stores::autoscalers`].
    pub autoscalers: Feed<HorizontalPodAutoscaler>,
    /// See [`Stores::disruption_budgets`].
    pub disruption_budgets: Feed<PodDisruptionBudget>,
    /// See [`Stores::network_policies`].
    pub network_policies: Feed<NetworkPolicy>,
    /// See [`Stores::ingresses`].
    pub ingresses: Feed<Ingress>,
    /// See [`Stores::service_monitors`].
    pub service_monitors: Feed<DynamicObject>,
    /// See [`Stores::http_routes`].
    pub http_routes: Feed<DynamicObject>,
}

/// Empty stores for `namespace` (or the cluster) and the feeds that fill them.
pub fn stores(namespace: Option<String>) -> (Stores, Writers) {
    let (service_accounts, sa) = watched(());
    let (roles, r) = watched(());
    let (role_bindings, rb) = watched(());
    let (config_maps, cm) = watched(());
    let (deployments, d) = watched(());
    let (services, s) = watched(());
    let (secrets, sec) = watched(());
    let (autoscalers, hpa) = watched(());
    let (disruption_budgets, pdb) = watched(());
    let (network_policies, np) = watched(());
    let (ingresses, ing) = watched(());
    let (service_monitors, sm) = watched(build::service_monitor_resource());
    let (http_routes, route) = watched(build::http_route_resource());
    (
        Stores {
            namespace,
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
        },
        Writers {
            service_accounts: sa,
            roles: r,
            role_bindings: rb,
            config_maps: cm,
            deployments: d,
            services: s,
            secrets: sec,
            autoscalers: hpa,
            disruption_budgets: pdb,
            network_policies: np,
            ingresses: ing,
            service_monitors: sm,
            http_routes: route,
        },
    )
}

/// The stores of every watched scope. Without any (tests, or a kind the operator does not
/// watch) every check is a GET.
#[derive(Clone, Default)]
pub struct Owned {
    scopes: Vec<Stores>,
}

impl Owned {
    /// Stores of the given scopes.
    pub fn new(scopes: Vec<Stores>) -> Self {
        Self { scopes }
    }

    /// The stores that cover namespace `ns`.
    pub fn scope(&self, ns: &str) -> Option<&Stores> {
        self.scopes
            .iter()
            .find(|s| s.namespace.as_deref().is_none_or(|n| n == ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::core::{Status, TypeMeta};

    fn meta(name: &str, version: &str) -> PartialObjectMeta<ConfigMap> {
        PartialObjectMeta {
            types: Some(TypeMeta::default()),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            ..Status::default()
        }))
    }

    #[test]
    fn a_store_answers_for_the_namespaces_it_covers() {
        let owned = Owned::new(vec![stores(Some("a".into())).0, stores(Some("b".into())).0]);
        assert_eq!(owned.scope("b").and_then(|s| s.namespace.as_deref()), Some("b"));
        assert!(owned.scope("c").is_none());
        let cluster = Owned::new(vec![stores(None).0]);
        assert!(cluster.scope("anything").is_some());
        assert!(Owned::default().scope("a").is_none());
    }

    /// A store vouches for absence only between a completed list and the next error or list.
    #[test]
    fn a_watch_is_current_from_a_completed_list_to_the_next_error() {
        let (w, mut feed) = watched::<ConfigMap>(());
        assert_eq!(w.seen("ns", "a", "u"), Seen::UNKNOWN, "nothing listed yet");
        feed.observe(&Ok(watcher::Event::Init));
        feed.observe(&Ok(watcher::Event::InitApply(meta("a", "7"))));
        assert_eq!(w.health.state(), WatchState::Listing);
        assert!(
            w.get("ns", "a").is_none(),
            "a list in progress is not the store yet"
        );
        feed.observe(&Ok(watcher::Event::InitDone));
        let seen = w.seen("ns", "a", "u");
        assert_eq!(
            (seen.holder, seen.version.as_deref(), seen.state),
            (Some(Holder::Foreign), Some("7"), WatchState::Current)
        );
        feed.observe(&Ok(watcher::Event::Apply(meta("a", "8"))));
        assert_eq!(w.seen("ns", "a", "u").version.as_deref(), Some("8"));
        feed.observe(&Err(watcher::Error::WatchFailed(api_error(500))));
        assert_eq!(
            w.health.state(),
            WatchState::Listing,
            "events may have been missed"
        );
        assert_eq!(
            w.seen("ns", "a", "u").version.as_deref(),
            Some("8"),
            "kept, not trusted"
        );
        feed.observe(&Ok(watcher::Event::Init));
        feed.observe(&Ok(watcher::Event::InitDone));
        assert_eq!(w.seen("ns", "a", "u").holder, None, "relisted: it is gone");
        assert_eq!(w.health.state(), WatchState::Current);
    }

    #[test]
    fn a_kind_the_api_server_does_not_serve_is_unserved_until_one_is_written() {
        let (w, mut feed) = watched::<DynamicObject>(build::http_route_resource());
        feed.observe(&Err(watcher::Error::InitialListFailed(api_error(404))));
        assert_eq!(w.health.state(), WatchState::Unserved);
        feed.observe(&Err(watcher::Error::InitialListFailed(api_error(403))));
        assert_eq!(w.health.state(), WatchState::Listing, "forbidden says nothing");
        feed.observe(&Err(watcher::Error::WatchStartFailed(api_error(404))));
        assert_eq!(w.health.state(), WatchState::Unserved);
        w.health.served();
        assert_eq!(w.health.state(), WatchState::Listing, "written: served after all");
        feed.observe(&Ok(watcher::Event::Init));
        feed.observe(&Ok(watcher::Event::InitDone));
        w.health.served();
        assert_eq!(
            w.health.state(),
            WatchState::Current,
            "a current watch stays current"
        );
    }
}
