//! The catalog: the MCP Registry API (v0.1) over the cluster's McpServers, served by every
//! operator replica (leader or not) from its own watch of McpServers.
//!
//! - `GET /v0.1/servers`: the servers the caller may see, one page (`cursor`, `limit`,
//!   `search`, `updated_since`, `version`, `include_deleted`), sorted by name;
//! - `GET /v0.1/servers/{serverName}/versions` and `.../versions/{version|latest}`;
//! - the same under `/namespaces/{namespace}`, a registry of one namespace.
//!
//! Each answer carries an ETag of its body and answers a matching `If-None-Match` with 304,
//! so a client polling the catalog pays for a change only. Deleted McpServers stay listed
//! as `deleted` for a day (the last [`TOMBSTONES`]), for clients that sync with
//! `updated_since`.

pub mod access;
pub mod entry;
pub mod list;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{StreamExt, stream};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use quiver_model::published;

pub use access::{Access, Caller, Denied, Review};
pub use entry::Entry;

use crate::crd::McpServer;
use crate::metrics::Metrics;

/// Deleted servers remembered at most.
pub const TOMBSTONES: usize = 1024;
/// Deleted servers remembered at most per namespace, so that one tenant's churn cannot push
/// out the others'.
pub const TOMBSTONES_PER_NAMESPACE: usize = 64;
/// Requests answered at once (more wait for a place).
const CONCURRENT_REQUESTS: usize = 64;
/// The longest one request may take, reviews included; then 503.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long a deleted server stays listed as `deleted`.
const TOMBSTONE_AGE: SignedDuration = SignedDuration::from_hours(24);
/// Namespaces reviewed at once for one request.
const PARALLEL_REVIEWS: usize = 8;

/// The catalog's state.
pub struct Catalog {
    prefix: String,
    access: Access,
    stores: Vec<Store<McpServer>>,
    deleted: Mutex<VecDeque<Entry>>,
    /// Built entries by McpServer uid, with the resourceVersion they were built from.
    rendered: Mutex<HashMap<String, (String, Arc<Entry>)>>,
    metrics: Arc<Metrics>,
    /// Per store: whether its watch has listed (until then the catalog answers 503, not an
    /// empty list).
    synced: Vec<AtomicBool>,
    /// Per store: what it held when its watch began listing again, to find the servers
    /// deleted while the watch was away (no delete event tells of those).
    relisting: Vec<Mutex<Vec<Arc<McpServer>>>>,
    /// Uids of the McpServers listed now: one that stops being listed leaves a tombstone,
    /// as one deleted does.
    listed: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("prefix", &self.prefix)
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

/// What one request asked for.
enum Ask {
    List,
    Versions(String),
    Version(String, String),
}

impl Catalog {
    /// A catalog over `stores` (kept up to date by their writers).
    pub fn new(prefix: String, access: Access, stores: Vec<Store<McpServer>>, metrics: Arc<Metrics>) -> Self {
        let synced = stores.iter().map(|_| AtomicBool::new(true)).collect();
        let relisting = stores.iter().map(|_| Mutex::default()).collect();
        let listed = stores
            .iter()
            .flat_map(Store::state)
            .filter(|m| entry::listed(m))
            .filter_map(|m| m.metadata.uid.clone())
            .collect();
        Self {
            prefix,
            access,
            stores,
            deleted: Mutex::new(VecDeque::new()),
            rendered: Mutex::new(HashMap::new()),
            metrics,
            synced,
            relisting,
            listed: Mutex::new(listed),
        }
    }

    /// Starts watches of McpServers (one per namespace of `namespaces`, or one for the
    /// cluster) feeding a new catalog; the watches run as long as the runtime.
    pub fn watch(
        client: &Client,
        namespaces: &[String],
        prefix: String,
        access: Access,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let apis: Vec<Api<McpServer>> = if namespaces.is_empty() {
            vec![Api::all(client.clone())]
        } else {
            namespaces
                .iter()
                .map(|n| Api::namespaced(client.clone(), n))
                .collect()
        };
        let mut writers = Vec::with_capacity(apis.len());
        let mut stores = Vec::with_capacity(apis.len());
        for _ in &apis {
            let (s, w) = reflector::store();
            stores.push(s);
            writers.push(w);
        }
        let catalog = Arc::new(Self::new(prefix, access, stores, metrics));
        for s in &catalog.synced {
            s.store(false, Ordering::Release);
        }
        for (i, (api, writer)) in apis.into_iter().zip(writers).enumerate() {
            let c = catalog.clone();
            let events =
                reflector::reflector(writer, watcher(api, watcher::Config::default()).default_backoff());
            tokio::spawn(events.for_each(move |e| {
                match e {
                    Ok(e) => c.observe(i, &e, Timestamp::now()),
                    Err(e) => tracing::warn!(error = %e, "catalog: McpServer watch failed; retrying"),
                }
                std::future::ready(())
            }));
        }
        catalog
    }

    /// The metrics it counts in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether every watch has listed McpServers once (until then nothing is shown).
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::Acquire))
    }

    /// Follows one event of store `i`'s watch at `at`, after its store has taken it: a
    /// deleted server, one no longer listed, and one deleted while the watch was away (gone
    /// from the store when it has listed again) each leave a tombstone.
    pub fn observe(&self, i: usize, event: &watcher::Event<McpServer>, at: Timestamp) {
        let Some(store) = self.stores.get(i) else { return };
        match event {
            watcher::Event::Delete(m) => {
                self.listed_now(m, false);
                self.forget(m, at);
            }
            watcher::Event::Apply(m) | watcher::Event::InitApply(m) => {
                if !self.listed_now(m, entry::listed(m)) {
                    self.bury(m, at);
                }
            }
            watcher::Event::Init => {
                if let Ok(mut r) = self.relisting[i].lock() {
                    *r = store.state();
                }
            }
            watcher::Event::InitDone => {
                let before = self.relisting[i]
                    .lock()
                    .map(|mut r| std::mem::take(&mut *r))
                    .unwrap_or_default();
                let now: HashSet<String> = store
                    .state()
                    .iter()
                    .filter_map(|m| m.metadata.uid.clone())
                    .collect();
                for m in before
                    .iter()
                    .filter(|m| m.metadata.uid.as_ref().is_some_and(|u| !now.contains(u)))
                {
                    self.listed_now(m, false);
                    self.forget(m, at);
                }
                self.synced[i].store(true, Ordering::Release);
            }
        }
    }

    /// Records whether `mcp` is listed now; false when it was listed and is no longer.
    fn listed_now(&self, mcp: &McpServer, listed: bool) -> bool {
        let Some(uid) = &mcp.metadata.uid else { return true };
        let Ok(mut l) = self.listed.lock() else {
            return true;
        };
        if listed {
            l.insert(uid.clone());
            true
        } else {
            !l.remove(uid)
        }
    }

    /// Records that `mcp` was deleted at `at`.
    /// Unlisted servers leave none (they were never shown).
    pub fn forget(&self, mcp: &McpServer, at: Timestamp) {
        if entry::listed(mcp) {
            self.bury(mcp, at);
        }
    }

    /// Leaves a tombstone of `mcp`, gone from the catalog at `at`.
    fn bury(&self, mcp: &McpServer, at: Timestamp) {
        let Some(e) = entry::entry(mcp, &self.prefix, Some(at), at) else {
            return;
        };
        let Ok(mut d) = self.deleted.lock() else { return };
        d.retain(|x| x.name != e.name && at.duration_since(x.updated) < TOMBSTONE_AGE);
        let same_ns = d.iter().filter(|x| x.namespace == e.namespace).count();
        if same_ns >= TOMBSTONES_PER_NAMESPACE {
            if let Some(i) = d.iter().position(|x| x.namespace == e.namespace) {
                d.remove(i);
            }
        } else if d.len() >= TOMBSTONES {
            d.pop_front();
        }
        d.push_back(e);
    }

    /// The listed McpServers of `namespace` (of every namespace watched: `None`).
    fn live(&self, namespace: Option<&str>) -> Vec<Arc<McpServer>> {
        self.stores
            .iter()
            .flat_map(Store::state)
            .filter(|m| namespace.is_none_or(|n| m.metadata.namespace.as_deref() == Some(n)))
            .filter(|m| entry::listed(m))
            .collect()
    }

    /// The entries `caller` may see (of `namespace` only, when given), sorted by name, one
    /// per name (a live server hides the tombstone of a deleted one of the same name).
    ///
    /// # Errors
    /// [`Denied`] when a review could not be made.
    pub async fn visible(&self, caller: &Caller, namespace: Option<&str>) -> Result<Vec<Arc<Entry>>, Denied> {
        let live = self.live(namespace);
        let now = Timestamp::now();
        let dead: Vec<Entry> = self
            .deleted
            .lock()
            .map(|d| {
                d.iter()
                    .filter(|e| namespace.is_none_or(|n| e.namespace == n))
                    .filter(|e| now.duration_since(e.updated) < TOMBSTONE_AGE)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let names = live
            .iter()
            .filter_map(|m| m.metadata.namespace.clone())
            .chain(dead.iter().map(|e| e.namespace.clone()))
            .collect();
        let Some((everywhere, allowed)) = self.allowed(caller, namespace, names).await? else {
            return Ok(Vec::new());
        };
        let may = |ns: &str| everywhere || allowed.get(ns).copied().unwrap_or(false);
        let mut by_name: BTreeMap<String, Arc<Entry>> = BTreeMap::new();
        for e in dead.into_iter().filter(|e| may(&e.namespace)) {
            by_name.insert(e.name.clone(), Arc::new(e));
        }
        // Entries are looked at for the servers the caller may see only: the work of a
        // request does not grow with what the caller cannot see.
        let seen: Vec<&McpServer> = live
            .iter()
            .map(|m| &**m)
            .filter(|m| m.metadata.namespace.as_deref().is_some_and(&may))
            .collect();
        for e in self.entries(&seen, now) {
            by_name.insert(e.name.clone(), e);
        }
        Ok(by_name.into_values().collect())
    }

    /// The listed McpServers `caller` may see (of `namespace` only, when given), sorted by
    /// namespace and name: what the console shows.
    ///
    /// # Errors
    /// [`Denied`] when a review could not be made.
    pub async fn servers(
        &self,
        caller: &Caller,
        namespace: Option<&str>,
    ) -> Result<Vec<Arc<McpServer>>, Denied> {
        let mut live = self.live(namespace);
        let names = live.iter().filter_map(|m| m.metadata.namespace.clone()).collect();
        let Some((everywhere, allowed)) = self.allowed(caller, namespace, names).await? else {
            return Ok(Vec::new());
        };
        live.retain(|m| {
            everywhere
                || m.metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|n| allowed.get(n).copied().unwrap_or(false))
        });
        live.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(live)
    }

    /// Whether `caller` may list McpServers everywhere, and else in which of `names` (the
    /// namespaces looked at); `None` when it may not in the one `namespace` asked about.
    async fn allowed(
        &self,
        caller: &Caller,
        namespace: Option<&str>,
        mut names: Vec<String>,
    ) -> Result<Option<(bool, HashMap<String, bool>)>, Denied> {
        if self.access.may_list(caller, namespace).await? {
            return Ok(Some((true, HashMap::new())));
        }
        if namespace.is_some() {
            return Ok(None);
        }
        names.sort_unstable();
        names.dedup();
        let access = &self.access;
        let answers: Vec<(String, Result<bool, Denied>)> = stream::iter(names)
            .map(|n: String| async move {
                let a = access.may_list(caller, Some(&n)).await;
                (n, a)
            })
            .buffer_unordered(PARALLEL_REVIEWS)
            .collect()
            .await;
        let mut allowed = HashMap::with_capacity(answers.len());
        for (n, a) in answers {
            allowed.insert(n, a?);
        }
        Ok(Some((false, allowed)))
    }

    /// The entries of `servers`, each built once per version of its McpServer (the cache
    /// is keyed by uid and checked against the resourceVersion) and dropped with it.
    fn entries(&self, servers: &[&McpServer], now: Timestamp) -> Vec<Arc<Entry>> {
        let Ok(mut cache) = self.rendered.lock() else {
            return servers
                .iter()
                .filter_map(|m| entry::entry(m, &self.prefix, None, now).map(Arc::new))
                .collect();
        };
        let mut out = Vec::with_capacity(servers.len());
        for m in servers {
            let (Some(uid), Some(version)) =
                (m.metadata.uid.as_deref(), m.metadata.resource_version.as_deref())
            else {
                out.extend(entry::entry(m, &self.prefix, None, now).map(Arc::new));
                continue;
            };
            match cache.get(uid) {
                Some((v, e)) if v == version => out.push(e.clone()),
                _ => {
                    if let Some(e) = entry::entry(m, &self.prefix, None, now).map(Arc::new) {
                        cache.insert(uid.to_owned(), (version.to_owned(), e.clone()));
                        out.push(e);
                    }
                }
            }
        }
        // Deleted servers' entries go once the cache outgrows the stores.
        let live: usize = self.stores.iter().map(|s| s.state().len()).sum();
        if cache.len() > 2 * live + 64 {
            let uids: std::collections::HashSet<String> = self
                .stores
                .iter()
                .flat_map(Store::state)
                .filter_map(|m| m.metadata.uid.clone())
                .collect();
            cache.retain(|uid, _| uids.contains(uid));
        }
        out
    }

    async fn answer(&self, namespace: Option<&str>, ask: Ask, query: &str, headers: &HeaderMap) -> Response {
        if namespace.is_some_and(|n| !is_namespace(n)) {
            return error(StatusCode::NOT_FOUND, "not found");
        }
        let q = match list::parse(query) {
            Ok(q) => q,
            Err(why) => return error(StatusCode::BAD_REQUEST, &why),
        };
        // Who asks comes first: a caller without a valid token learns nothing, not even
        // whether this replica has listed McpServers yet.
        let caller = match self
            .access
            .caller(headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()))
            .await
        {
            Ok(c) => c,
            Err(d) => return denied(&d),
        };
        if !self.synced() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the catalog is starting: McpServers are being listed",
            );
        }
        let entries = match self.visible(&caller, namespace).await {
            Ok(e) => e,
            Err(d) => return denied(&d),
        };
        let refs: Vec<&Entry> = entries.iter().map(|e| &**e).collect();
        let body = match ask {
            Ask::List => {
                let (items, next) = list::page(&refs, &q);
                list::render(&items, next.as_deref())
            }
            Ask::Versions(name) => {
                let items: Vec<&Entry> = refs
                    .iter()
                    .copied()
                    .filter(|e| e.name == name && (q.include_deleted || e.status != entry::Status::Deleted))
                    .collect();
                if items.is_empty() {
                    return error(StatusCode::NOT_FOUND, "Server not found");
                }
                list::render(&items, None)
            }
            Ask::Version(name, version) => {
                let found = refs.iter().find(|e| {
                    e.name == name
                        && (version == "latest" || version == e.version)
                        && (q.include_deleted || e.status != entry::Status::Deleted)
                });
                match found {
                    Some(e) => serde_json::to_vec(&e.json).unwrap_or_default(),
                    None => return error(StatusCode::NOT_FOUND, "Server not found"),
                }
            }
        };
        tagged(body, headers)
    }
}

/// A JSON body with its ETag, or 304 when the client holds it already.
fn tagged(body: Vec<u8>, headers: &HeaderMap) -> Response {
    let tag = published::etag(&body);
    let values = headers.get_all(header::IF_NONE_MATCH);
    let held = published::held(values.iter().filter_map(|v| v.to_str().ok()), &tag);
    let common = [
        (header::ETAG, tag),
        (header::CACHE_CONTROL, "private, no-cache".to_owned()),
        (header::VARY, "Authorization".to_owned()),
    ];
    if held {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        StatusCode::OK,
        common,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Whether `n` can be a namespace's name (a DNS label): anything else is not looked up.
fn is_namespace(n: &str) -> bool {
    (1..=63).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
        && !n.ends_with('-')
}

fn error(code: StatusCode, why: &str) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        serde_json::json!({"error": why}).to_string(),
    )
        .into_response()
}

fn denied(d: &Denied) -> Response {
    match d {
        Denied::Unauthenticated => {
            let mut r = error(StatusCode::UNAUTHORIZED, &d.to_string());
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        }
        Denied::Unavailable(_) => error(StatusCode::SERVICE_UNAVAILABLE, &d.to_string()),
    }
}

/// The route's parameters: `namespace`, `server`, `version`, whichever it has.
type Params = Path<HashMap<String, String>>;

async fn serve(
    c: &Catalog,
    p: &HashMap<String, String>,
    ask: Ask,
    query: Option<String>,
    headers: &HeaderMap,
) -> Response {
    let started = Instant::now();
    let answer = c.answer(
        p.get("namespace").map(String::as_str),
        ask,
        query.as_deref().unwrap_or_default(),
        headers,
    );
    let r = tokio::time::timeout(REQUEST_TIMEOUT, answer)
        .await
        .unwrap_or_else(|_| {
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the catalog did not answer in time",
            )
        });
    c.metrics.catalog_request(r.status().as_u16(), started.elapsed());
    r
}

async fn servers(
    State(c): State<Arc<Catalog>>,
    Path(p): Params,
    RawQuery(q): RawQuery,
    h: HeaderMap,
) -> Response {
    serve(&c, &p, Ask::List, q, &h).await
}

async fn versions(
    State(c): State<Arc<Catalog>>,
    Path(p): Params,
    RawQuery(q): RawQuery,
    h: HeaderMap,
) -> Response {
    let name = p.get("server").cloned().unwrap_or_default();
    serve(&c, &p, Ask::Versions(name), q, &h).await
}

async fn version(
    State(c): State<Arc<Catalog>>,
    Path(p): Params,
    RawQuery(q): RawQuery,
    h: HeaderMap,
) -> Response {
    let name = p.get("server").cloned().unwrap_or_default();
    let v = p.get("version").cloned().unwrap_or_default();
    serve(&c, &p, Ask::Version(name, v), q, &h).await
}

/// The catalog's router.
pub fn router(catalog: Arc<Catalog>) -> Router {
    let api = |prefix: &str, r: Router<Arc<Catalog>>| {
        r.route(&format!("{prefix}/v0.1/servers"), get(servers))
            .route(
                &format!("{prefix}/v0.1/servers/{{server}}/versions"),
                get(versions),
            )
            .route(
                &format!("{prefix}/v0.1/servers/{{server}}/versions/{{version}}"),
                get(version),
            )
    };
    let r = api("", Router::new());
    api("/namespaces/{namespace}", r)
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not found") })
        .layer(tower::limit::ConcurrencyLimitLayer::new(CONCURRENT_REQUESTS))
        .with_state(catalog)
}

#[cfg(test)]
mod tests;
