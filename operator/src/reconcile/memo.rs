//! What the operator last applied of each child: a digest of the object it sent and the
//! `resourceVersion` the API server answered with. A later reconcile that would send the same
//! object sends nothing when the child's watch store still shows that version: nobody changed
//! the child since (any write, by anyone, gives it a new version, and its watch event brings a
//! reconcile), so the apply would change nothing. Anything else applies as before: another
//! version or no object in the store, a store that is not current, a different desired object,
//! no record (a new operator process).
//!
//! The table is keyed by McpServer and holds one record per child (kind and name); an McpServer's records
//! go when it is found deleted or its spec turns invalid, so the table holds at most the
//! McpServers the operator serves.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;

use crate::crd::McpServer;

/// One applied child.
#[derive(Debug)]
struct Record {
    kind: &'static str,
    /// Its name: an McpServer may have two children of a kind (the tools and pins
    /// ConfigMaps).
    name: String,
    digest: u64,
    version: String,
}

/// The applied children of one McpServer.
#[derive(Debug, Default)]
struct Entry {
    children: Vec<Record>,
    /// What the status reads of the Deployment as last applied (generation, replicas, status).
    deployment: Option<Deployment>,
}

/// The records of every McpServer.
#[derive(Debug, Default)]
pub struct Memo {
    /// Per-process random keys: a digest cannot be aimed at another object's.
    keys: RandomState,
    table: Mutex<HashMap<ObjectRef<McpServer>, Entry>>,
}

/// Feeds what serde writes into a hasher, so an object is digested without a buffer.
struct Digest<'a, H>(&'a mut H);

impl<H: Hasher> std::io::Write for Digest<'_, H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The parts of an applied Deployment the status is computed from.
fn for_status(d: &Deployment) -> Deployment {
    Deployment {
        metadata: ObjectMeta {
            generation: d.metadata.generation,
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: d.spec.as_ref().and_then(|s| s.replicas),
            ..DeploymentSpec::default()
        }),
        status: d.status.clone(),
    }
}

impl Memo {
    fn table(&self) -> MutexGuard<'_, HashMap<ObjectRef<McpServer>, Entry>> {
        // Plain records: a table left by a panicking holder is still usable.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The digest of `obj` as it would be sent; `None` if it does not serialize (then it is
    /// always applied).
    pub fn digest<T: Serialize + ?Sized>(&self, obj: &T) -> Option<u64> {
        let mut hasher = self.keys.build_hasher();
        serde_json::to_writer(Digest(&mut hasher), obj).ok()?;
        Some(hasher.finish())
    }

    /// Whether the child `kind` named `name` of `owner` was last applied as `digest` and
    /// answered with `version`.
    pub fn unchanged(
        &self,
        owner: &ObjectRef<McpServer>,
        (kind, name): (&str, &str),
        digest: u64,
        version: &str,
    ) -> bool {
        self.table().get(owner).is_some_and(|e| {
            e.children
                .iter()
                .any(|r| r.kind == kind && r.name == name && r.digest == digest && r.version == version)
        })
    }

    /// Records that the child `kind` named `name` of `owner` was applied as `digest` and is now at
    /// `version`.
    pub fn record(
        &self,
        owner: &ObjectRef<McpServer>,
        (kind, name): (&'static str, &str),
        digest: u64,
        version: String,
    ) {
        let mut table = self.table();
        let entry = table.entry(owner.clone()).or_default();
        match entry
            .children
            .iter_mut()
            .find(|r| r.kind == kind && r.name == name)
        {
            Some(r) => {
                r.digest = digest;
                r.version = version;
            }
            None => entry.children.push(Record {
                kind,
                name: name.to_owned(),
                digest,
                version,
            }),
        }
    }

    /// Records the Deployment as the API server answered the apply of `owner`'s.
    pub fn record_deployment(&self, owner: &ObjectRef<McpServer>, applied: &Deployment) {
        self.table().entry(owner.clone()).or_default().deployment = Some(for_status(applied));
    }

    /// The Deployment of `owner` as last applied (what the status reads of it).
    pub fn deployment(&self, owner: &ObjectRef<McpServer>) -> Option<Deployment> {
        self.table().get(owner).and_then(|e| e.deployment.clone())
    }

    /// Drops the record of the child `kind` of `owner` (its apply failed or it is removed).
    pub fn forget_child(&self, owner: &ObjectRef<McpServer>, (kind, name): (&str, &str)) {
        if let Some(e) = self.table().get_mut(owner) {
            e.children.retain(|r| r.kind != kind || r.name != name);
        }
    }

    /// Drops every record of `owner`.
    pub fn forget(&self, owner: &ObjectRef<McpServer>) {
        self.table().remove(owner);
    }

    /// How many McpServers have records.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether no McpServer has records.
    pub fn is_empty(&self) -> bool {
        self.table().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;

    fn owner(name: &str) -> ObjectRef<McpServer> {
        ObjectRef::new(name).within("ns")
    }

    fn config_map(value: &str) -> ConfigMap {
        ConfigMap {
            data: Some(BTreeMap::from([("k".to_owned(), value.to_owned())])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_the_same_object_at_the_answered_version_is_unchanged() {
        let memo = Memo::default();
        let (a, b) = (owner("a"), owner("b"));
        let sent = memo.digest(&config_map("1")).unwrap();
        assert_eq!(memo.digest(&config_map("1")), Some(sent), "stable");
        assert!(!memo.unchanged(&a, ("ConfigMap", "x"), sent, "7"), "no record");
        memo.record(&a, ("ConfigMap", "x"), sent, "7".into());
        assert!(memo.unchanged(&a, ("ConfigMap", "x"), sent, "7"));
        assert!(
            !memo.unchanged(&a, ("ConfigMap", "x"), sent, "8"),
            "written since"
        );
        let other = memo.digest(&config_map("2")).unwrap();
        assert_ne!(other, sent);
        assert!(
            !memo.unchanged(&a, ("ConfigMap", "x"), other, "7"),
            "a different object"
        );
        assert!(!memo.unchanged(&a, ("Service", "x"), sent, "7"), "another kind");
        assert!(
            !memo.unchanged(&b, ("ConfigMap", "x"), sent, "7"),
            "another McpServer"
        );
        memo.record(&a, ("ConfigMap", "x"), other, "9".into());
        assert!(memo.unchanged(&a, ("ConfigMap", "x"), other, "9"), "replaced");
        assert!(!memo.unchanged(&a, ("ConfigMap", "x"), sent, "7"));
        // Another child of the same kind has a record of its own.
        memo.record(&a, ("ConfigMap", "y"), sent, "3".into());
        assert!(
            memo.unchanged(&a, ("ConfigMap", "x"), other, "9"),
            "the other ConfigMap's record is kept"
        );
        assert!(memo.unchanged(&a, ("ConfigMap", "y"), sent, "3"));
        memo.forget_child(&a, ("ConfigMap", "x"));
        assert!(memo.unchanged(&a, ("ConfigMap", "y"), sent, "3"));
        assert!(!memo.unchanged(&a, ("ConfigMap", "x"), other, "9"));
    }

    #[test]
    fn a_forgotten_mcpserver_leaves_the_table() {
        let memo = Memo::default();
        let d = Deployment {
            metadata: ObjectMeta {
                generation: Some(4),
                name: Some("a".into()),
                ..ObjectMeta::default()
            },
            status: Some(DeploymentStatus {
                ready_replicas: Some(2),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        memo.record(&owner("a"), ("Deployment", "x"), 1, "7".into());
        memo.record_deployment(&owner("a"), &d);
        memo.record(&owner("b"), ("Deployment", "x"), 1, "7".into());
        assert_eq!(memo.len(), 2);
        let kept = memo.deployment(&owner("a")).unwrap();
        assert_eq!(kept.metadata.generation, Some(4));
        assert_eq!(kept.status, d.status);
        assert_eq!(kept.metadata.name, None, "only what the status reads");
        memo.forget(&owner("a"));
        assert_eq!(memo.len(), 1);
        assert!(memo.deployment(&owner("a")).is_none());
        memo.forget(&owner("b"));
        assert!(memo.is_empty());
    }
}
