//! Apply the built children of one McpServer, each only where its name is free
//! ([`Holder::free`]): an object of that name the McpServer does not control is reported,
//! never patched, adopted or deleted. Children that depend on a taken one are held back too,
//! where applying them would hand this McpServer's pods, rights or traffic to the other
//! object, or the other object's to it (see docs/operator.md, "Name conflicts").

use std::fmt::Debug;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use serde::Serialize;

use super::owned::{self, ChildKind, Holder, MetaStore, Stores};
use super::{Context, Error, MANAGER, apply};
use crate::build::{self, Children};
use crate::crd::McpServer;

/// Kinds of the children without typed structs.
const SERVICE_MONITOR: &str = "ServiceMonitor";
const HTTP_ROUTE: &str = "HTTPRoute";

/// A child the McpServer would apply whose name an object it does not control holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Kind of the object.
    pub kind: &'static str,
    /// Its name.
    pub name: String,
}

/// What [`apply_all`] did.
pub struct Applied {
    /// The Deployment as applied; `None` when it was held back.
    pub deployment: Option<Deployment>,
    /// The names taken by objects of other owners, in apply order.
    pub conflicts: Vec<Conflict>,
}

/// The ownership checks of one reconcile.
struct Names<'a> {
    client: &'a Client,
    scope: Option<&'a Stores>,
    ns: &'a str,
    uid: &'a str,
    conflicts: Vec<Conflict>,
}

impl Names<'_> {
    /// Whether `obj`'s name is free for this McpServer, answered by the watch store `store`
    /// picks from this scope's (a GET when the store lacks the object, or without stores);
    /// a taken name is recorded as a conflict.
    async fn free<K>(&mut self, store: Option<fn(&Stores) -> &MetaStore<K>>, obj: &K) -> Result<bool, Error>
    where
        K: ChildKind,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        let store = self.scope.zip(store).map(|(s, pick)| pick(s));
        let free = owned::holder(self.client, store, self.ns, &name, self.uid)
            .await?
            .free();
        if !free {
            self.taken(<K as k8s_openapi::Resource>::KIND, name);
        }
        Ok(free)
    }

    fn taken(&mut self, kind: &'static str, name: String) {
        self.conflicts.push(Conflict { kind, name });
    }

    /// An optional child of kind `K` named like the McpServer: applied when wanted, `allowed`
    /// and its name is free; deleted when not wanted, if the McpServer controls it.
    async fn optional<K>(&mut self, name: &str, wanted: Option<&K>, allowed: bool) -> Result<(), Error>
    where
        K: ChildKind + Serialize,
    {
        match wanted {
            Some(obj) => {
                if allowed && self.free(None, obj).await? {
                    apply::apply(self.client, self.ns, obj).await?;
                }
                Ok(())
            }
            None => {
                let api = apply::dynamic::<K>(self.client, self.ns);
                apply::delete_owned(&api, <K as k8s_openapi::Resource>::KIND, name, self.uid).await
            }
        }
    }
}

/// Applies (or, for optional children turned off, deletes) every child whose name is free
/// and whose dependencies are this McpServer's.
///
/// # Errors
/// An API call failed ([`Error::Child`] names it). Taken names are not errors here: they are
/// returned in [`Applied::conflicts`].
pub async fn apply_all(
    ctx: &Context,
    mcp: &McpServer,
    ns: &str,
    name: &str,
    uid: &str,
    children: &Children,
) -> Result<Applied, Error> {
    let client = &ctx.client;
    let mut names = Names {
        client,
        scope: ctx.owned.scope(ns),
        ns,
        uid,
        conflicts: Vec::new(),
    };
    let sa_free = names
        .free(Some(|s| &s.service_accounts), &children.service_account)
        .await?;
    let role_free = names.free(Some(|s| &s.roles), &children.role).await?;
    let binding_free = names
        .free(Some(|s| &s.role_bindings), &children.role_binding)
        .await?;
    let cm_free = names.free(Some(|s| &s.config_maps), &children.config_map).await?;
    let deployment_free = names.free(Some(|s| &s.deployments), &children.deployment).await?;
    let service_free = names.free(Some(|s| &s.services), &children.service).await?;

    if sa_free {
        apply::apply(client, ns, &children.service_account).await?;
    }
    // The Role first: a ToolSet that names a new Secret reaches the pods only once they
    // may read it. It grants reading the tools ConfigMap: not while that name is another's.
    let role_applied = role_free && cm_free;
    if role_applied {
        apply::apply(client, ns, &children.role).await?;
    }
    // Bound to another's ServiceAccount, the Role would grant it this McpServer's Secrets;
    // another's Role bound to this ServiceAccount would give the pods its rights.
    if binding_free && sa_free && role_applied {
        apply::apply(client, ns, &children.role_binding).await?;
    }
    if cm_free {
        apply::apply(client, ns, &children.config_map).await?;
    }
    // The pods neither run as another's ServiceAccount nor serve another's ConfigMap.
    let deployment = if deployment_free && sa_free && cm_free {
        Some(apply::apply(client, ns, &children.deployment).await?)
    } else {
        None
    };
    if service_free {
        apply::apply(client, ns, &children.service).await?;
    }
    // The HPA scales the Deployment of its name: only this McpServer's.
    names
        .optional(name, children.hpa.as_ref(), deployment.is_some())
        .await?;
    names.optional(name, children.pdb.as_ref(), true).await?;
    names
        .optional(name, children.network_policy.as_ref(), true)
        .await?;
    // Routes lead to the Service of their name: only this McpServer's.
    names
        .optional(name, children.ingress.as_ref(), service_free)
        .await?;

    let monitors: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &build::service_monitor_resource());
    match &children.service_monitor {
        Some(sm) => {
            if owned::holder_dyn(&monitors, SERVICE_MONITOR, name, uid).await? == Holder::Foreign {
                names.taken(SERVICE_MONITOR, name.to_owned());
            } else {
                apply_if_served(
                    ctx,
                    mcp,
                    &monitors,
                    SERVICE_MONITOR,
                    sm,
                    "ServiceMonitorUnavailable",
                    "monitoring.serviceMonitor is set but the monitoring.coreos.com/v1 ServiceMonitor CRD is not installed",
                )
                .await?;
            }
        }
        None => apply::delete_owned(&monitors, SERVICE_MONITOR, name, uid).await?,
    }
    let routes: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &build::http_route_resource());
    match &children.http_route {
        Some(_) if !service_free => {}
        Some(r) => {
            if owned::holder_dyn(&routes, HTTP_ROUTE, name, uid).await? == Holder::Foreign {
                names.taken(HTTP_ROUTE, name.to_owned());
            } else {
                apply_if_served(
                    ctx,
                    mcp,
                    &routes,
                    HTTP_ROUTE,
                    r,
                    "HTTPRouteUnavailable",
                    "httpRoute is set but the gateway.networking.k8s.io/v1 HTTPRoute CRD is not installed",
                )
                .await?;
            }
        }
        None => apply::delete_owned(&routes, HTTP_ROUTE, name, uid).await?,
    }
    Ok(Applied {
        deployment,
        conflicts: names.conflicts,
    })
}

/// Applies a child whose CRD may be absent (ServiceMonitor, HTTPRoute); a missing CRD is a
/// Warning event, not an error.
async fn apply_if_served(
    ctx: &Context,
    mcp: &McpServer,
    api: &Api<DynamicObject>,
    kind: &'static str,
    obj: &DynamicObject,
    reason: &str,
    note: &str,
) -> Result<(), Error> {
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(obj),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            apply::publish(ctx, mcp, EventType::Warning, reason, note.to_owned()).await;
            Ok(())
        }
        Err(source) => Err(Error::Child {
            verb: "apply",
            kind,
            name: obj.name_any(),
            source,
        }),
    }
}
