//! Writes to the API server: server-side apply of children (one field manager), removal of
//! children that are no longer wanted, status patches and events.

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;

use super::owned::{ChildKind, controlled_by};
use super::{Context, Error, MANAGER};
use crate::crd::{McpServer, McpServerStatus};

/// Server-side applies `obj`, forced, as [`MANAGER`]. Only for a child whose name is free
/// ([`super::owned::Holder::free`]): forcing takes every field it sets from other managers.
///
/// # Errors
/// [`Error::Apply`] naming the object when the patch fails.
pub async fn apply<K>(client: &Client, ns: &str, obj: &K) -> Result<K, Error>
where
    K: ChildKind + Serialize,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let name = obj.meta().name.clone().unwrap_or_default();
    match api
        .patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(obj))
        .await
    {
        Ok(applied) => Ok(applied),
        Err(source) => Err(Error::Apply {
            kind: <K as k8s_openapi::Resource>::KIND,
            name,
            source,
        }),
    }
}

/// Deletes `name` if it exists and this McpServer (`owner_uid`) is its controller; an object
/// of that name the McpServer does not control is left alone. A missing object, or a missing
/// API (an absent CRD answers 404 too), is not an error.
///
/// # Errors
/// [`Error::Delete`] naming the object when the GET or the DELETE fails.
pub async fn delete_owned(
    api: &Api<DynamicObject>,
    kind: &'static str,
    name: &str,
    owner_uid: &str,
) -> Result<(), Error> {
    let failed = |verb, source| Error::Delete {
        verb,
        kind,
        name: name.to_owned(),
        source,
    };
    // By code, not reason: a missing API group may answer a plain-text 404.
    let meta = match api.get_metadata(name).await {
        Ok(meta) => meta,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(e) => return Err(failed("get", e)),
    };
    if !controlled_by(&meta.metadata, owner_uid) {
        return Ok(());
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            // The object as it was read: if its owner references changed since (a user took
            // it over), the DELETE fails its precondition and the next reconcile looks again.
            uid: meta.metadata.uid.clone(),
            resource_version: meta.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone meanwhile, or replaced by another object of the same name (precondition).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(failed("delete", e)),
    }
}

/// Applies a child whose CRD may be absent (ServiceMonitor, HTTPRoute); a missing CRD is a
/// Warning event (`reason`, `note`), not an error. Returns the applied object's
/// `resourceVersion`; `None` when the CRD is missing.
///
/// # Errors
/// [`Error::Apply`] naming the object when the patch fails otherwise.
pub async fn apply_served(
    ctx: &Context,
    mcp: &McpServer,
    api: &Api<DynamicObject>,
    kind: &'static str,
    obj: &DynamicObject,
    (reason, note): (&str, &str),
) -> Result<Option<String>, Error> {
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
    {
        Ok(applied) => Ok(applied.metadata.resource_version),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            publish(ctx, mcp, EventType::Warning, reason, note.to_owned()).await;
            Ok(None)
        }
        Err(source) => Err(Error::Apply {
            kind,
            name: obj.name_any(),
            source,
        }),
    }
}

/// Merge-patches the status subresource.
pub async fn patch_status(
    client: &Client,
    ns: &str,
    name: &str,
    status: &McpServerStatus,
) -> Result<(), Error> {
    let api: Api<McpServer> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .map_err(Error::Status)?;
    Ok(())
}

/// Publishes an event about `mcp`; failures are logged, not returned.
pub async fn publish(ctx: &Context, mcp: &McpServer, type_: EventType, reason: &str, note: String) {
    let note: String = note.chars().take(1000).collect();
    let ev = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &mcp.object_ref(&())).await {
        tracing::warn!(error = %e, "could not publish event");
    }
}
