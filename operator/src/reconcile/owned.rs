//! Whose a child is: before any child is applied or deleted, the operator checks that no
//! object of that kind and name exists, or that the one that exists names this McpServer as
//! its controller (`ownerReferences` entry with `controller: true` and the McpServer's uid).
//! An object of another owner is never patched, adopted or deleted.
//!
//! The always-present kinds are answered from the controller's metadata-only watch stores
//! (no API call); an object missing from its store (not yet created, not labelled
//! `app.kubernetes.io/managed-by=quiver-operator`, or a store still listing) and the optional
//! kinds cost one metadata GET.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::Error;

/// Who holds the name of a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// No object of that kind and name exists.
    Absent,
    /// It exists and this McpServer is its controller.
    Ours,
    /// It exists and this McpServer is not its controller: leave it alone.
    Foreign,
}

impl Holder {
    /// Whether the operator may apply (create or update) the child.
    pub fn free(self) -> bool {
        self != Self::Foreign
    }
}

/// Whether `meta` names the McpServer with `owner_uid` as its controller.
pub fn controlled_by(meta: &ObjectMeta, owner_uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

fn holder_of(meta: &ObjectMeta, owner_uid: &str) -> Holder {
    if controlled_by(meta, owner_uid) {
        Holder::Ours
    } else {
        Holder::Foreign
    }
}

/// A metadata-only store of one child kind (what the controller's watch of it has seen).
pub type MetaStore<K> = Store<PartialObjectMeta<K>>;
/// The writer that fills a [`MetaStore`].
pub type MetaWriter<K> = reflector::store::Writer<PartialObjectMeta<K>>;

/// The watch stores of the always-present child kinds, for one watched scope (the cluster or
/// one namespace).
#[derive(Clone)]
pub struct Stores {
    /// Which namespace these stores cover (`None`: every namespace).
    pub namespace: Option<String>,
    /// ServiceAccounts labelled as the operator's.
    pub service_accounts: MetaStore<ServiceAccount>,
    /// Roles labelled as the operator's.
    pub roles: MetaStore<Role>,
    /// RoleBindings labelled as the operator's.
    pub role_bindings: MetaStore<RoleBinding>,
    /// ConfigMaps labelled as the operator's.
    pub config_maps: MetaStore<ConfigMap>,
    /// Deployments labelled as the operator's.
    pub deployments: MetaStore<Deployment>,
    /// Services labelled as the operator's.
    pub services: MetaStore<Service>,
    /// Secrets labelled as the operator's (the state keys; metadata only, never a value).
    pub secrets: MetaStore<Secret>,
}

/// The writers of one scope's [`Stores`], driven by the controller's watches.
pub struct Writers {
    /// See [`Stores::service_accounts`].
    pub service_accounts: MetaWriter<ServiceAccount>,
    /// See [`Stores::roles`].
    pub roles: MetaWriter<Role>,
    /// See [`Stores::role_bindings`].
    pub role_bindings: MetaWriter<RoleBinding>,
    /// See [`Stores::config_maps`].
    pub config_maps: MetaWriter<ConfigMap>,
    /// See [`Stores::deployments`].
    pub deployments: MetaWriter<Deployment>,
    /// See [`Stores::services`].
    pub services: MetaWriter<Service>,
    /// See [`Stores::secrets`].
    pub secrets: MetaWriter<Secret>,
}

/// Empty stores for `namespace` (or the cluster) and the writers that fill them.
pub fn stores(namespace: Option<String>) -> (Stores, Writers) {
    let (service_accounts, sa) = reflector::store();
    let (roles, r) = reflector::store();
    let (role_bindings, rb) = reflector::store();
    let (config_maps, cm) = reflector::store();
    let (deployments, d) = reflector::store();
    let (services, s) = reflector::store();
    let (secrets, sec) = reflector::store();
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
        },
        Writers {
            service_accounts: sa,
            roles: r,
            role_bindings: rb,
            config_maps: cm,
            deployments: d,
            services: s,
            secrets: sec,
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

/// A namespaced child kind whose holder can be checked and which can be applied: what
/// [`in_store`] and the child list of `children.rs` need of a kind.
pub trait ChildKind:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + k8s_openapi::Resource
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> ChildKind for K where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static
{
}

/// Who holds `ns/name` of kind `K`, as the watch store has it; `None` when the store lacks
/// the object (ask the API server: [`holder_dyn`]).
pub fn in_store<K>(store: &MetaStore<K>, ns: &str, name: &str, owner_uid: &str) -> Option<Holder>
where
    K: ChildKind,
{
    store
        .get(&ObjectRef::new(name).within(ns))
        .map(|meta| holder_of(&meta.metadata, owner_uid))
}

/// A namespaced `Api` of the resource `resource` as dynamic objects (ownership checks and
/// deletes of every child kind).
pub fn dynamic(client: &Client, ns: &str, resource: &ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, resource)
}

/// Who holds `name` in `api` (one metadata GET). A missing object, or a missing API (an
/// absent CRD answers a plain-text 404), is [`Holder::Absent`].
///
/// # Errors
/// The GET failed (other than 404).
pub async fn holder_dyn(
    api: &Api<DynamicObject>,
    kind: &'static str,
    name: &str,
    owner_uid: &str,
) -> Result<Holder, Error> {
    match api.get_metadata(name).await {
        Ok(meta) => Ok(holder_of(&meta.metadata, owner_uid)),
        // By code, not reason: a missing API group may answer a plain-text 404.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Holder::Absent),
        Err(source) => Err(Error::Owner {
            kind,
            name: name.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(refs: &[(&str, Option<bool>)]) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(
                refs.iter()
                    .map(|(uid, controller)| OwnerReference {
                        api_version: "quiver.dev/v1alpha1".into(),
                        kind: "McpServer".into(),
                        name: "x".into(),
                        uid: (*uid).into(),
                        controller: *controller,
                        block_owner_deletion: None,
                    })
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn only_a_controller_reference_with_the_uid_makes_a_child_ours() {
        assert!(controlled_by(&meta(&[("u", Some(true))]), "u"));
        assert!(controlled_by(&meta(&[("o", None), ("u", Some(true))]), "u"));
        // A plain owner reference (garbage collection only) or another controller is not.
        assert!(!controlled_by(&meta(&[("u", None)]), "u"));
        assert!(!controlled_by(&meta(&[("u", Some(false))]), "u"));
        assert!(!controlled_by(&meta(&[("o", Some(true))]), "u"));
        assert!(!controlled_by(&ObjectMeta::default(), "u"));
        assert!(!controlled_by(&meta(&[]), ""));
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
}
