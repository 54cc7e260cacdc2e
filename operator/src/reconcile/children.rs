//! Apply the built children of one McpServer, each only where its name is free
//! ([`Holder::free`]): an object of that name the McpServer does not control is reported,
//! never patched, adopted or deleted. Children that depend on a taken one are held back too,
//! where applying them would hand this McpServer's pods, rights or traffic to the other
//! object, or the other object's to it (see docs/operator.md, "Name conflicts").
//!
//! The children are one list ([`list`]), in apply order, each with the kinds it needs to be
//! this McpServer's; [`apply_all`] walks it once. A new child kind is a build function (a
//! field of [`Children`]), a watch store (`stores.rs`, `controller.rs`) and one line in
//! [`list`].
//!
//! What the watch stores know saves requests: a child applied before whose desired object
//! and stored `resourceVersion` are both unchanged is not applied again (`memo.rs`), and a
//! child no longer wanted is deleted only when its store shows it (a GET decides only while the
//! store is not current).

use std::any::Any;

use futures_util::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::Role;
use kube::Client;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::ObjectRef;
use serde::Serialize;
use tracing::Instrument;

use super::memo::Memo;
use super::owned::{self, ChildKind, Holder};
use super::stores::{Seen, Stores, View, WatchState};
use super::{Context, Error, apply};
use crate::build::{self, Children};
use crate::crd::McpServer;

/// Kinds the list refers to in its dependencies, and the children without typed structs.
const SERVICE_ACCOUNT: &str = <ServiceAccount as k8s_openapi::Resource>::KIND;
const ROLE: &str = <Role as k8s_openapi::Resource>::KIND;
const CONFIG_MAP: &str = <ConfigMap as k8s_openapi::Resource>::KIND;
const DEPLOYMENT: &str = <Deployment as k8s_openapi::Resource>::KIND;
const SERVICE: &str = <Service as k8s_openapi::Resource>::KIND;
const SERVICE_MONITOR: &str = "ServiceMonitor";
const HTTP_ROUTE: &str = "HTTPRoute";

/// The children of `c` in apply order; `name` is the McpServer's (the name of the optional
/// children, deleted when turned off).
fn list<'a>(c: &'a Children, name: &str) -> Vec<Child<'a>> {
    let mut list = vec![
        Child::stored(&c.service_account, |s| &s.service_accounts, &[]),
        // The Role first: a ToolSet that names a new Secret reaches the pods only once they
        // may read it. It grants reading the tools ConfigMap: not while that name is another's.
        Child::stored(&c.role, |s| &s.roles, &[CONFIG_MAP]),
        // Bound to another's ServiceAccount, the Role would grant it this McpServer's Secrets;
        // another's Role bound to this ServiceAccount would give the pods its rights.
        Child::stored(&c.role_binding, |s| &s.role_bindings, &[SERVICE_ACCOUNT, ROLE]),
        Child::stored(&c.config_map, |s| &s.config_maps, &[]),
        // The pods neither run as another's ServiceAccount nor serve another's ConfigMap.
        Child::stored(&c.deployment, |s| &s.deployments, &[SERVICE_ACCOUNT, CONFIG_MAP]),
        Child::stored(&c.service, |s| &s.services, &[]),
        // The HPA scales the Deployment of its name: only this McpServer's.
        Child::optional::<HorizontalPodAutoscaler>(c.hpa.as_ref(), name, |s| &s.autoscalers, &[DEPLOYMENT]),
        Child::optional(c.pdb.as_ref(), name, |s| &s.disruption_budgets, &[]),
        Child::optional(c.network_policy.as_ref(), name, |s| &s.network_policies, &[]),
        // Routes lead to the Service of their name: only this McpServer's.
        Child::optional(c.ingress.as_ref(), name, |s| &s.ingresses, &[SERVICE]),
        Child::served(
            (SERVICE_MONITOR, build::service_monitor_resource()),
            c.service_monitor.as_ref(),
            (name, |s| &s.service_monitors),
            (
                "ServiceMonitorUnavailable",
                "monitoring.serviceMonitor is set but the monitoring.coreos.com/v1 ServiceMonitor CRD is not installed",
            ),
            &[],
        ),
        Child::served(
            (HTTP_ROUTE, build::http_route_resource()),
            c.http_route.as_ref(),
            (name, |s| &s.http_routes),
            (
                "HTTPRouteUnavailable",
                "httpRoute is set but the gateway.networking.k8s.io/v1 HTTPRoute CRD is not installed",
            ),
            &[SERVICE],
        ),
    ];
    // Kept when pinning is turned off (the approvals with it); removed with the McpServer.
    if let Some(pins) = &c.pins {
        list.insert(4, Child::stored(pins, |s| &s.config_maps, &[]));
    }
    list
}

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

/// What an apply answered.
struct Written {
    /// The applied object's `resourceVersion`; `None`: not applied (a CRD that is absent).
    version: Option<String>,
    /// The applied object when it is the Deployment (the status reads it).
    deployment: Option<Deployment>,
}

/// A built-in kind, applied as its typed struct.
trait Typed: Sync {
    /// The digest of the object as it is sent.
    fn digest(&self, memo: &Memo) -> Option<u64>;

    /// Applies it.
    fn apply<'a>(&'a self, client: &'a Client, ns: &'a str) -> BoxFuture<'a, Result<Written, Error>>;
}

impl<K: ChildKind + Serialize> Typed for K {
    fn digest(&self, memo: &Memo) -> Option<u64> {
        memo.digest(self)
    }

    fn apply<'a>(&'a self, client: &'a Client, ns: &'a str) -> BoxFuture<'a, Result<Written, Error>> {
        Box::pin(async move {
            let applied = apply::apply(client, ns, self).await?;
            Ok(Written {
                version: applied.meta().resource_version.clone(),
                deployment: (Box::new(applied) as Box<dyn Any>)
                    .downcast::<Deployment>()
                    .ok()
                    .map(|d| *d),
            })
        })
    }
}

/// How a wanted child is written.
enum Write<'a> {
    /// A built-in kind.
    Typed(&'a dyn Typed),
    /// A kind whose CRD may not be installed: then a Warning event (reason, note), not an error.
    Served(&'a DynamicObject, (&'static str, &'static str)),
}

impl Write<'_> {
    fn digest(&self, memo: &Memo) -> Option<u64> {
        match self {
            Self::Typed(obj) => obj.digest(memo),
            Self::Served(obj, _) => memo.digest(*obj),
        }
    }
}

/// The watch store of a child's kind.
type Store = fn(&Stores) -> &dyn View;

/// One entry of the list.
struct Child<'a> {
    kind: &'static str,
    resource: ApiResource,
    /// The object's name (the McpServer's when it is not wanted).
    name: String,
    /// The child, when wanted; `None`: removed if this McpServer controls it.
    write: Option<Write<'a>>,
    /// The watch store of its kind.
    store: Store,
    /// An always-present kind: its name is checked before any child is applied (a child may
    /// need a later one's). The others are checked just before their apply.
    early: bool,
    /// Kinds whose objects must be this McpServer's for this child to be applied: applied
    /// (an earlier child) or free (a later one).
    needs: &'static [&'static str],
}

impl<'a> Child<'a> {
    /// A child every McpServer has.
    fn stored<K: ChildKind + Serialize>(obj: &'a K, store: Store, needs: &'static [&'static str]) -> Self {
        Self {
            kind: <K as k8s_openapi::Resource>::KIND,
            resource: ApiResource::erase::<K>(&()),
            name: obj.meta().name.clone().unwrap_or_default(),
            write: Some(Write::Typed(obj)),
            store,
            early: true,
            needs,
        }
    }

    /// A child of a built-in kind the spec turns on or off.
    fn optional<K: ChildKind + Serialize>(
        obj: Option<&'a K>,
        name: &str,
        store: Store,
        needs: &'static [&'static str],
    ) -> Self {
        Self {
            kind: <K as k8s_openapi::Resource>::KIND,
            resource: ApiResource::erase::<K>(&()),
            name: obj
                .and_then(|o| o.meta().name.clone())
                .unwrap_or_else(|| name.to_owned()),
            write: obj.map(|o| Write::Typed(o as &dyn Typed)),
            store,
            early: false,
            needs,
        }
    }

    /// A child the spec turns on or off, of a kind whose CRD may not be installed.
    fn served(
        (kind, resource): (&'static str, ApiResource),
        obj: Option<&'a DynamicObject>,
        (name, store): (&str, Store),
        unavailable: (&'static str, &'static str),
        needs: &'static [&'static str],
    ) -> Self {
        Self {
            kind,
            resource,
            name: obj
                .and_then(|o| o.metadata.name.clone())
                .unwrap_or_else(|| name.to_owned()),
            write: obj.map(|o| Write::Served(o, unavailable)),
            store,
            early: false,
            needs,
        }
    }
}

/// Where a child stands during [`apply_all`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not looked at yet (its name is checked just before its apply).
    Unchecked,
    /// Its name is free; not applied yet.
    Free,
    /// An object of another owner holds its name.
    Taken,
    /// Held back: a kind it needs is not this McpServer's.
    HeldBack,
    /// Applied.
    Applied,
    /// Not wanted: removed if it was this McpServer's.
    Removed,
}

/// One reconcile's walk over the list.
struct Walk<'a> {
    ctx: &'a Context,
    mcp: &'a McpServer,
    /// The McpServer's key in the memo of applied children.
    owner: ObjectRef<McpServer>,
    ns: &'a str,
    uid: &'a str,
    states: Vec<State>,
    conflicts: Vec<Conflict>,
    deployment: Option<Deployment>,
}

impl Walk<'_> {
    /// What the watch store of `child`'s kind says of it.
    fn seen(&self, child: &Child<'_>) -> Seen {
        self.ctx.owned.scope(self.ns).map_or(Seen::UNKNOWN, |s| {
            (child.store)(s).seen(self.ns, &child.name, self.uid)
        })
    }

    /// Who holds `child`'s name: the watch store's copy when it has one, else one GET. A
    /// taken name is recorded as a conflict.
    async fn check(&mut self, child: &Child<'_>) -> Result<State, Error> {
        let holder = match self.seen(child).holder {
            Some(h) => h,
            None => {
                let api = owned::dynamic(&self.ctx.client, self.ns, &child.resource);
                owned::holder_dyn(&api, child.kind, &child.name, self.uid).await?
            }
        };
        if holder.free() {
            return Ok(State::Free);
        }
        self.conflicts.push(Conflict {
            kind: child.kind,
            name: child.name.clone(),
        });
        Ok(State::Taken)
    }

    /// Whether every child of each kind `child` needs is (or will be) this McpServer's (the
    /// Role grants reading the tools ConfigMap and updating the pins ConfigMap: neither may
    /// be another's).
    fn needs_met(&self, list: &[Child<'_>], child: &Child<'_>) -> bool {
        child.needs.iter().all(|kind| {
            let mut of_kind = list
                .iter()
                .enumerate()
                .filter(|(_, c)| c.kind == *kind)
                .peekable();
            of_kind.peek().is_some()
                && of_kind
                    .all(|(i, c)| c.write.is_none() || matches!(self.states[i], State::Free | State::Applied))
        })
    }

    /// Removes `child`, no longer wanted, if this McpServer controls it. A current store that
    /// does not show it as this McpServer's, or a kind the API server does not serve, means
    /// there is nothing to remove; otherwise one GET decides.
    async fn remove(&self, child: &Child<'_>) -> Result<State, Error> {
        let seen = self.seen(child);
        let gone = match seen.state {
            WatchState::Current => seen.holder != Some(Holder::Ours),
            WatchState::Unserved => true,
            WatchState::Listing => false,
        };
        if !gone {
            let api = owned::dynamic(&self.ctx.client, self.ns, &child.resource);
            apply::delete_owned(&api, child.kind, &child.name, self.uid)
                .instrument(tracing::info_span!("delete", kind = child.kind))
                .await?;
        }
        self.ctx.memo.forget_child(&self.owner, (child.kind, &child.name));
        Ok(State::Removed)
    }

    /// Whether `child` was applied as `digest` before and its store shows it unwritten since
    /// (then the Deployment as then applied is the status's).
    fn unchanged(&mut self, child: &Child<'_>, digest: Option<u64>) -> bool {
        let seen = self.seen(child);
        let (Some(digest), Some(version), WatchState::Current, Some(Holder::Ours)) =
            (digest, seen.version, seen.state, seen.holder)
        else {
            return false;
        };
        if !self
            .ctx
            .memo
            .unchanged(&self.owner, (child.kind, &child.name), digest, &version)
        {
            return false;
        }
        if child.kind != DEPLOYMENT {
            return true;
        }
        self.deployment = self.ctx.memo.deployment(&self.owner);
        self.deployment.is_some()
    }

    /// Applies `write`, the object of `child`, and records what the API server answered.
    async fn write(
        &mut self,
        child: &Child<'_>,
        write: &Write<'_>,
        digest: Option<u64>,
    ) -> Result<(), Error> {
        let span = tracing::info_span!("apply", kind = child.kind);
        // Forgotten first: a failed apply may still have changed the object.
        self.ctx.memo.forget_child(&self.owner, (child.kind, &child.name));
        let written = match write {
            Write::Typed(obj) => obj.apply(&self.ctx.client, self.ns).instrument(span).await?,
            Write::Served(obj, unavailable) => {
                let api = owned::dynamic(&self.ctx.client, self.ns, &child.resource);
                let version = apply::apply_served(self.ctx, self.mcp, &api, child.kind, obj, *unavailable)
                    .instrument(span)
                    .await?;
                if version.is_some() {
                    // The kind is served now, whatever its watch last heard.
                    if let Some(s) = self.ctx.owned.scope(self.ns) {
                        (child.store)(s).health().served();
                    }
                }
                Written {
                    version,
                    deployment: None,
                }
            }
        };
        if let Some(d) = &written.deployment {
            self.ctx.memo.record_deployment(&self.owner, d);
        }
        if let (Some(digest), Some(version)) = (digest, written.version) {
            self.ctx
                .memo
                .record(&self.owner, (child.kind, &child.name), digest, version);
        }
        if written.deployment.is_some() {
            self.deployment = written.deployment;
        }
        Ok(())
    }

    /// Applies or removes `list[i]`.
    async fn step(&mut self, list: &[Child<'_>], i: usize) -> Result<State, Error> {
        let child = &list[i];
        let Some(write) = &child.write else {
            return self.remove(child).await;
        };
        if self.states[i] == State::Taken {
            return Ok(State::Taken);
        }
        if !self.needs_met(list, child) {
            return Ok(State::HeldBack);
        }
        if self.states[i] == State::Unchecked {
            let checked = self
                .check(child)
                .instrument(tracing::info_span!("owner", kind = child.kind))
                .await?;
            if checked == State::Taken {
                return Ok(State::Taken);
            }
        }
        let digest = write.digest(&self.ctx.memo);
        if !self.unchanged(child, digest) {
            self.write(child, write, digest).await?;
        }
        Ok(State::Applied)
    }
}

/// Applies (or, for optional children turned off, deletes) every child whose name is free
/// and whose dependencies are this McpServer's: first the names of the always-present kinds
/// are checked, then the list is walked in order.
///
/// # Errors
/// An API call failed (the error names the stage, kind and object). Taken names are not
/// errors here: they are returned in [`Applied::conflicts`].
pub async fn apply_all(
    ctx: &Context,
    mcp: &McpServer,
    ns: &str,
    name: &str,
    uid: &str,
    children: &Children,
) -> Result<Applied, Error> {
    let list = list(children, name);
    let mut walk = Walk {
        ctx,
        mcp,
        owner: ObjectRef::new(name).within(ns),
        ns,
        uid,
        states: vec![State::Unchecked; list.len()],
        conflicts: Vec::new(),
        deployment: None,
    };
    for (i, child) in list.iter().enumerate() {
        if child.early {
            walk.states[i] = walk
                .check(child)
                .instrument(tracing::info_span!("owner", kind = child.kind))
                .await?;
        }
    }
    for i in 0..list.len() {
        walk.states[i] = walk.step(&list, i).await?;
    }
    Ok(Applied {
        deployment: walk.deployment,
        conflicts: walk.conflicts,
    })
}
