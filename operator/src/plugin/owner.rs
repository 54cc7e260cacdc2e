//! Which pod is an McpServer's own. Labels are not proof: anyone who may create pods in the
//! namespace can give one the McpServer's labels and a Ready condition. A pod the plugin
//! sends a token to must descend from the McpServer through controller references, each
//! naming its owner's uid: McpServer → Deployment → ReplicaSet → Pod.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The controller reference of `meta` when it names an owner of `kind` (in API group
/// `group`) with uid `uid`.
fn controlled_by<'a>(meta: &'a ObjectMeta, group: &str, kind: &str, uid: &str) -> Option<&'a OwnerReference> {
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))?;
    let api_group = controller.api_version.rsplit_once('/').map_or("", |(g, _)| g);
    (!uid.is_empty() && controller.kind == kind && api_group == group && controller.uid == uid)
        .then_some(controller)
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// One pod the McpServer owns, and whether it is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPod {
    /// Pod name.
    pub name: String,
    /// Its Ready condition is true.
    pub ready: bool,
}

/// The pods, not being deleted, that the Deployment of metadata `deployment` runs for the
/// McpServer of uid `mcp_uid`, by name: owned by one of the ReplicaSets of metadata
/// `replica_sets` that the Deployment owns, the Deployment owned by the McpServer. None when
/// the Deployment is not the McpServer's.
pub fn owned_pods(
    mcp_uid: &str,
    deployment: &ObjectMeta,
    replica_sets: &[ObjectMeta],
    pods: &[Pod],
) -> Vec<OwnedPod> {
    if controlled_by(deployment, "quiver.dev", "McpServer", mcp_uid).is_none() {
        return Vec::new();
    }
    let deployment_uid = deployment.uid.as_deref().unwrap_or_default();
    let owned_sets: Vec<&str> = replica_sets
        .iter()
        .filter(|rs| controlled_by(rs, "apps", "Deployment", deployment_uid).is_some())
        .filter_map(|rs| rs.uid.as_deref())
        .filter(|uid| !uid.is_empty())
        .collect();
    let mut owned: Vec<OwnedPod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            owned_sets
                .iter()
                .any(|uid| controlled_by(&p.metadata, "apps", "ReplicaSet", uid).is_some())
        })
        .filter_map(|p| {
            Some(OwnedPod {
                name: p.metadata.name.clone()?,
                ready: is_ready(p),
            })
        })
        .collect();
    owned.sort_by(|a, b| a.name.cmp(&b.name));
    owned
}

/// The first (by name) ready pod of [`owned_pods`]. `None` when there is none, or the
/// Deployment is not the McpServer's.
pub fn chosen_pod(
    mcp_uid: &str,
    deployment: &ObjectMeta,
    replica_sets: &[ObjectMeta],
    pods: &[Pod],
) -> Option<String> {
    owned_pods(mcp_uid, deployment, replica_sets, pods)
        .into_iter()
        .find(|p| p.ready)
        .map(|p| p.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const LABELS: &str =
        r#"{"app.kubernetes.io/name": "quiver-server", "app.kubernetes.io/instance": "calc"}"#;

    fn labels() -> Value {
        serde_json::from_str(LABELS).unwrap()
    }

    fn owner(api_version: &str, kind: &str, name: &str, uid: &str, controller: bool) -> Value {
        json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": controller})
    }

    fn deployment(owners: Vec<Value>) -> ObjectMeta {
        serde_json::from_value(json!(
            {"name": "calc", "uid": "dep-uid", "labels": labels(), "ownerReferences": owners}
        ))
        .unwrap()
    }

    fn replica_set(name: &str, uid: &str, owners: Vec<Value>) -> ObjectMeta {
        serde_json::from_value(json!(
            {"name": name, "uid": uid, "labels": labels(), "ownerReferences": owners}
        ))
        .unwrap()
    }

    fn pod(name: &str, owners: Vec<Value>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels(), "ownerReferences": owners},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    fn ours() -> ObjectMeta {
        deployment(vec![owner(
            "quiver.dev/v1alpha1",
            "McpServer",
            "calc",
            "mcp-uid",
            true,
        )])
    }

    fn sets() -> Vec<ObjectMeta> {
        vec![
            replica_set(
                "calc-5d8f",
                "rs-uid",
                vec![owner("apps/v1", "Deployment", "calc", "dep-uid", true)],
            ),
            // Same labels, owned by someone else's Deployment.
            replica_set(
                "calc-evil",
                "evil-rs-uid",
                vec![owner("apps/v1", "Deployment", "calc", "other-dep-uid", true)],
            ),
        ]
    }

    fn by_rs(name: &str, uid: &str) -> Vec<Value> {
        vec![owner("apps/v1", "ReplicaSet", name, uid, true)]
    }

    #[test]
    fn a_lookalike_pod_listed_first_is_never_chosen() {
        let pods = vec![
            // Same labels, ready, listed (and named) first: no owner at all.
            pod("calc-0-lookalike", Vec::new()),
            // An owner reference that names the real ReplicaSet but is not a controller's.
            pod(
                "calc-1-not-controller",
                vec![owner("apps/v1", "ReplicaSet", "calc-5d8f", "rs-uid", false)],
            ),
            // The right name with a foreign uid.
            pod("calc-2-foreign-uid", by_rs("calc-5d8f", "other-uid")),
            // A ReplicaSet of the same labels that is not the Deployment's.
            pod("calc-3-foreign-rs", by_rs("calc-evil", "evil-rs-uid")),
            // A controller of another kind with the ReplicaSet's uid.
            pod(
                "calc-4-other-kind",
                vec![owner("apps/v1", "StatefulSet", "calc-5d8f", "rs-uid", true)],
            ),
            pod("calc-5d8f-real", by_rs("calc-5d8f", "rs-uid")),
        ];
        assert_eq!(
            chosen_pod("mcp-uid", &ours(), &sets(), &pods).as_deref(),
            Some("calc-5d8f-real")
        );
        // Without the real pod: nothing, rather than a lookalike.
        assert_eq!(chosen_pod("mcp-uid", &ours(), &sets(), &pods[..5]), None);
        let names: Vec<String> = owned_pods("mcp-uid", &ours(), &sets(), &pods)
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["calc-5d8f-real"]);
    }

    #[test]
    fn the_deployment_must_be_the_mcpservers() {
        let pods = vec![pod("calc-5d8f-real", by_rs("calc-5d8f", "rs-uid"))];
        assert!(chosen_pod("mcp-uid", &ours(), &sets(), &pods).is_some());
        for owners in [
            Vec::new(),
            // Another McpServer of the same name (deleted and made again): another uid.
            vec![owner("quiver.dev/v1alpha1", "McpServer", "calc", "old-uid", true)],
            // Not a controller reference.
            vec![owner(
                "quiver.dev/v1alpha1",
                "McpServer",
                "calc",
                "mcp-uid",
                false,
            )],
            // Another group's kind of the same name.
            vec![owner("example.com/v1", "McpServer", "calc", "mcp-uid", true)],
        ] {
            assert_eq!(
                chosen_pod("mcp-uid", &deployment(owners.clone()), &sets(), &pods),
                None,
                "{owners:?}"
            );
        }
        // An McpServer without a uid owns nothing.
        assert_eq!(chosen_pod("", &ours(), &sets(), &pods), None);
    }

    #[test]
    fn of_the_owned_pods_a_ready_one_not_being_deleted_is_chosen_by_name() {
        let mut deleting = pod("calc-5d8f-a", by_rs("calc-5d8f", "rs-uid"));
        deleting.metadata.deletion_timestamp = serde_json::from_value(json!("2026-01-01T00:00:00Z")).unwrap();
        let mut unready = pod("calc-5d8f-b", by_rs("calc-5d8f", "rs-uid"));
        unready.status = None;
        let pods = vec![
            pod("calc-5d8f-d", by_rs("calc-5d8f", "rs-uid")),
            deleting,
            unready,
            pod("calc-5d8f-c", by_rs("calc-5d8f", "rs-uid")),
        ];
        assert_eq!(
            chosen_pod("mcp-uid", &ours(), &sets(), &pods).as_deref(),
            Some("calc-5d8f-c")
        );
        // Every owned pod not being deleted, ready or not, by name.
        let ready = |name: &str, ready| OwnedPod {
            name: name.to_owned(),
            ready,
        };
        assert_eq!(
            owned_pods("mcp-uid", &ours(), &sets(), &pods),
            [
                ready("calc-5d8f-b", false),
                ready("calc-5d8f-c", true),
                ready("calc-5d8f-d", true)
            ]
        );
    }
}
