//! Whose a child is: before any child is applied or deleted, the operator checks that no
//! object of that kind and name exists, or that the one that exists names this McpServer as
//! its controller (`ownerReferences` entry with `controller: true` and the McpServer's uid).
//! An object of another owner is never patched, adopted or deleted.
//!
//! A child in the controller's metadata-only watch stores (`stores.rs`) is answered from
//! there (no API call); one missing from its store (not yet created, not labelled
//! `app.kubernetes.io/managed-by=quiver-operator`, or a store still listing) costs one
//! metadata GET before it is applied.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
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

/// Who holds an object with `meta`, for the McpServer of `owner_uid`.
pub fn holder_of(meta: &ObjectMeta, owner_uid: &str) -> Holder {
    if controlled_by(meta, owner_uid) {
        Holder::Ours
    } else {
        Holder::Foreign
    }
}

/// A namespaced child kind whose holder can be checked and which can be applied: what
/// the child list of `children.rs` needs of a kind.
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
}
