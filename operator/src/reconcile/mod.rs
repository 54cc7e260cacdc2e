//! Reconcile an McpServer: dereference → validate → build → apply (server-side apply, one
//! field manager) → status computed from what was applied.

mod apply;
mod children;
mod error;
mod fetch;
mod memo;
mod owned;
mod state_key;
mod status;
mod stores;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::controller::Action;
use kube::runtime::events::{EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use tracing::{Instrument, info_span};

use crate::backoff::Backoff;
use crate::build::{self, Defaults};
use crate::crd::{McpServer, McpServerStatus};
use crate::metrics::{Metrics, Outcome};
use crate::render::{self, Invalid, Rendered};

use children::Applied;
use fetch::Dereferenced;

pub use children::Conflict;
pub use error::{Error, Stage};
pub use memo::Memo;
pub use owned::{Holder, controlled_by};
pub use status::{CHILD_CONFLICT, set_condition, status_from, warnings};
pub use stores::{
    Feed, MetaStore, MetaWriter, Owned, Seen, Stores, View, WatchHealth, WatchState, Watched, Writers, stores,
};

/// Field manager of every server-side apply.
pub const MANAGER: &str = "quiver-operator";
/// How often a settled McpServer is re-checked (drift of unwatched objects, unlabelled
/// `toolsFrom` ConfigMaps), at most; each one's interval is shortened by its own
/// [`RESYNC_SPREAD`] share.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How far apart the resync periods of McpServers are spread: each one's period is
/// `RESYNC` minus a fixed share of this, chosen by its uid. With one period for all, 1,000
/// McpServers created (or started on) together came back together every `RESYNC`, as
/// bursts of API requests (141 per second measured at 1,000); with periods that differ,
/// they come back spread over this window at first and over the whole period within a few
/// resyncs.
const RESYNC_SPREAD: Duration = Duration::from_secs(60);
/// How often an McpServer whose pods are still loading a new config is re-checked.
const CONVERGE_POLL: Duration = Duration::from_secs(10);
/// How often an McpServer with upstreams is looked at again (their health is polled).
const UPSTREAM_POLL: Duration = Duration::from_secs(30);

/// What the controller shares across reconciles.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Operator defaults.
    pub defaults: Defaults,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Ask ready pods which config they serve (needs pod-network access: in-cluster only).
    pub probe_pods: bool,
    /// Retry delays of failing McpServers.
    pub backoff: Backoff,
    /// The watch stores of owned children, checked before a child is applied.
    pub owned: Owned,
    /// What was last applied of each child, to skip applies that would change nothing.
    pub memo: Memo,
}

/// One reconcile, in a span `reconcile` carrying the object's namespace, name and generation
/// (with child spans per stage: `fetch`, `render`, `owner`/`apply`/`delete` with the child's
/// kind, `probe`, `status`).
///
/// # Errors
/// Transient API failures; [`error_policy`] retries them with per-object backoff.
pub async fn reconcile(mcp: Arc<McpServer>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = Instant::now();
    let _running = ctx.metrics.start();
    let span = info_span!(
        "reconcile",
        namespace = mcp.metadata.namespace.as_deref(),
        name = mcp.metadata.name.as_deref(),
        generation = mcp.metadata.generation,
        // Filled on failure: exported traces show the stage and category of the error.
        otel.status_code = tracing::field::Empty,
        error.stage = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let result = reconcile_inner(&mcp, &ctx).instrument(span.clone()).await;
    let outcome = match &result {
        Ok((outcome, _)) => *outcome,
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.stage", e.stage().as_str());
            span.record("error.type", e.category());
            Outcome::Error {
                category: e.category(),
                stage: e.stage().as_str(),
                kind: e.kind(),
            }
        }
    };
    ctx.metrics
        .observe(start.elapsed(), outcome, sampled_trace(&span));
    if result.is_ok() {
        ctx.backoff.reset(&ObjectRef::from_obj(&*mcp));
    }
    result.map(|(_, action)| action)
}

/// The trace id of `span` when it is exported and sampled (tracing on); `None` otherwise.
fn sampled_trace(span: &tracing::Span) -> Option<opentelemetry::trace::TraceId> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = span.context();
    let span = cx.span();
    let sc = span.span_context();
    (sc.is_valid() && sc.is_sampled()).then(|| sc.trace_id())
}

/// dereference -> validate (render) -> build -> apply -> status.
async fn reconcile_inner(mcp: &McpServer, ctx: &Context) -> Result<(Outcome, Action), Error> {
    let (Some(ns), Some(name), Some(uid)) = (
        mcp.metadata.namespace.clone(),
        mcp.metadata.name.clone(),
        mcp.metadata.uid.clone(),
    ) else {
        return Err(Error::Unnamed);
    };
    let client = &ctx.client;
    let (Dereferenced { fetched, unwatched }, named_sa) = async {
        let sources = fetch::tools_from(client, &ns, mcp).await?;
        Ok::<_, Error>((sources, fetch::named_service_account(client, &ns, mcp).await?))
    }
    .instrument(info_span!("fetch"))
    .await?;
    let valid = info_span!("render").in_scope(|| {
        render::render(mcp, &fetched)
            .and_then(|r| render::service_account(mcp, named_sa.as_ref()).map(|()| r))
    });
    let rendered = match valid {
        Ok(r) => r,
        Err(invalid) => return invalid_spec(mcp, ctx, &ns, &name, &invalid, unwatched).await,
    };
    let api_server = if mcp.spec.network_policy.is_some() {
        fetch::api_server(client)
            .instrument(info_span!("fetch", kind = "EndpointSlice"))
            .await
    } else {
        build::ApiServer::default()
    };
    let mut children =
        info_span!("render").in_scope(|| build::build(mcp, &rendered, &ctx.defaults, &api_server))?;
    let refused = build::server_args_problems(&children.deployment);
    if !refused.is_empty() {
        let invalid = Invalid {
            reason: "InvalidServerArgs",
            problems: refused,
        };
        return invalid_spec(mcp, ctx, &ns, &name, &invalid, unwatched).await;
    }
    let key = state_key::ensure(ctx, &ns, mcp, &name, &uid)
        .instrument(info_span!("apply", kind = "Secret"))
        .await?;
    let key_taken = match key {
        state_key::StateKey::Mounted { name: secret, uid } => {
            build::with_state_key(&mut children.deployment, &secret, &uid);
            None
        }
        state_key::StateKey::Taken(c) => Some(c),
    };
    let Applied {
        deployment,
        mut conflicts,
    } = children::apply_all(ctx, mcp, &ns, &name, &uid, &children).await?;
    conflicts.extend(key_taken);
    let (mut status, upstream_down) = observe(mcp, ctx, &ns, &name, &rendered, deployment.as_ref()).await?;
    let mut events = status::events(mcp, &ns, unwatched, &conflicts, upstream_down, &mut status);
    let records = if rendered.pinned {
        fetch::pins(&ctx.client, &ns, &name)
            .instrument(info_span!("fetch", kind = "ConfigMap"))
            .await
    } else {
        None
    };
    events.extend(status::pins(
        &mut status,
        &name,
        rendered.pinned,
        records.as_ref(),
        mcp.metadata.generation,
    ));
    write_status(mcp, ctx, &ns, &name, &status, events).await?;
    // Nothing changes the other object's ownership in a way the watches would see (it may not
    // carry the label they select): look again with the per-object backoff.
    if let Some(c) = conflicts.into_iter().next() {
        return Err(Error::NotOwned {
            kind: c.kind,
            namespace: ns,
            name: c.name,
        });
    }
    Ok((
        Outcome::Ok,
        next_look(mcp, ctx, &status, upstream_down, &rendered),
    ))
}

/// The spec cannot be served: the condition and events say why; looked at again only when
/// something it reads may have changed unseen.
async fn invalid_spec(
    mcp: &McpServer,
    ctx: &Context,
    ns: &str,
    name: &str,
    invalid: &Invalid,
    unwatched: Vec<String>,
) -> Result<(Outcome, Action), Error> {
    // Its children are left as they are and no longer looked after: their records go (an
    // invalid McpServer deleted while it waits for a change would otherwise keep them).
    ctx.memo.forget(&ObjectRef::new(name).within(ns));
    report_invalid(mcp, ctx, ns, name, invalid, unwatched).await?;
    // Nothing to retry until the spec or a watched ConfigMap changes; specs reading
    // ConfigMaps are re-read anyway, as those may be unlabelled (unwatched) or not exist yet;
    // so is a named ServiceAccount (not watched), whose owner may consent later.
    let action = if mcp.spec.tools_from.is_empty() && build::named_service_account(mcp).is_none() {
        Action::await_change()
    } else {
        Action::requeue(resync(mcp))
    };
    Ok((Outcome::InvalidSpec, action))
}

/// The status computed from the applied Deployment and, when pods are probed, from what they
/// report; true when an upstream is down.
async fn observe(
    mcp: &McpServer,
    ctx: &Context,
    ns: &str,
    name: &str,
    rendered: &Rendered,
    deployment: Option<&Deployment>,
) -> Result<(McpServerStatus, bool), Error> {
    let mut status = match deployment {
        Some(d) => status_from(mcp, rendered, d, ns, name),
        None => {
            let mut s = mcp.status.clone().unwrap_or_default();
            s.observed_generation = mcp.metadata.generation;
            s
        }
    };
    let mut upstream_down = false;
    if ctx.probe_pods && deployment.is_some() {
        let report = crate::probe::probe(&ctx.client, ns, name, &rendered.hash)
            .instrument(info_span!("probe"))
            .await
            .map_err(Error::Probe)?;
        status.config_loaded_replicas = Some(report.loaded);
        status.upstream_revisions = report
            .upstream_revisions
            .iter()
            .map(|(name, version)| crate::crd::UpstreamRevision {
                name: name.clone(),
                protocol_version: version.clone(),
            })
            .collect();
        upstream_down = status::upstreams(
            &mut status,
            rendered.upstream_count,
            &report,
            mcp.metadata.generation,
        );
    }
    Ok((status, upstream_down))
}

/// Writes `status` when it changed (transition times only move when a condition changes),
/// then publishes `events` as Warnings.
async fn write_status(
    mcp: &McpServer,
    ctx: &Context,
    ns: &str,
    name: &str,
    status: &McpServerStatus,
    events: Vec<(&'static str, String)>,
) -> Result<(), Error> {
    if mcp.status.as_ref() != Some(status) {
        apply::patch_status(&ctx.client, ns, name, status)
            .instrument(info_span!("status"))
            .await?;
    }
    for (reason, note) in events {
        apply::publish(ctx, mcp, EventType::Warning, reason, note).await;
    }
    Ok(())
}

/// The resync interval of `mcp`: [`RESYNC`] less a share of [`RESYNC_SPREAD`] that depends
/// only on its uid (else its namespace and name), so it is the same at every look and from
/// one operator to the next, and different McpServers spread evenly over the window.
pub fn resync(mcp: &McpServer) -> Duration {
    let key = mcp.metadata.uid.as_deref().map_or_else(
        || format!("{}/{}", mcp.namespace().unwrap_or_default(), mcp.name_any()),
        str::to_owned,
    );
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let spread = u64::try_from(RESYNC_SPREAD.as_millis()).unwrap_or(u64::MAX);
    RESYNC - Duration::from_millis(hash % spread)
}

/// When a reconciled McpServer is looked at again.
fn next_look(
    mcp: &McpServer,
    ctx: &Context,
    status: &McpServerStatus,
    upstream_down: bool,
    rendered: &Rendered,
) -> Action {
    // Deployment status changes arrive through the owned-Deployment watch, so an unready
    // object needs no fast polling (1,000 of them at 5 s flooded the API server in the scale
    // test). Pods loading a new config are not watched: poll those briefly.
    let converged = !ctx.probe_pods || status.config_loaded_replicas >= Some(status.ready_replicas);
    // A down upstream is not watched either: look again until it is back.
    Action::requeue(match (converged, upstream_down) {
        (false, _) => CONVERGE_POLL,
        (true, true) => UPSTREAM_POLL,
        // Upstream health is not watched: look again within UPSTREAM_POLL.
        (true, false) if rendered.upstream_count > 0 => UPSTREAM_POLL,
        (true, false) => resync(mcp),
    })
}

async fn report_invalid(
    mcp: &McpServer,
    ctx: &Context,
    ns: &str,
    name: &str,
    invalid: &Invalid,
    unwatched: Vec<String>,
) -> Result<(), Error> {
    let message = invalid.message();
    let mut status = mcp.status.clone().unwrap_or_default();
    status.observed_generation = mcp.metadata.generation;
    set_condition(
        &mut status.conditions,
        "ConfigValid",
        false,
        invalid.reason,
        &format!("{message} (the last valid tools keep serving)"),
        mcp.metadata.generation,
    );
    set_condition(
        &mut status.conditions,
        "Degraded",
        true,
        invalid.reason,
        "the spec's tools are invalid; serving the last valid config, if any",
        mcp.metadata.generation,
    );
    let events = warnings(mcp, unwatched, &mut status);
    // The same problems as last time (a re-read of an unchanged spec): no write, no event.
    if mcp.status.as_ref() == Some(&status) {
        return Ok(());
    }
    apply::patch_status(&ctx.client, ns, name, &status)
        .instrument(info_span!("status"))
        .await?;
    apply::publish(ctx, mcp, EventType::Warning, invalid.reason, message).await;
    for (reason, note) in events {
        apply::publish(ctx, mcp, EventType::Warning, reason, note).await;
    }
    Ok(())
}

/// Error policy: retry the object after its next backoff delay (1 s doubling to 5 min; a
/// success resets it), so persistent failures of many objects do not flood the API server.
pub fn error_policy(mcp: Arc<McpServer>, err: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.fail(ObjectRef::from_obj(&*mcp));
    tracing::warn!(
        namespace = mcp.metadata.namespace.as_deref(),
        mcpserver = %mcp.name_any(),
        stage = %err.stage(),
        kind = err.kind(),
        category = err.category(),
        error = %err,
        retry_in = ?delay,
        "reconcile failed"
    );
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resyncs fall within `RESYNC - RESYNC_SPREAD ..= RESYNC`, the same for one object at
    /// every look, and a thousand objects fill the window evenly: no tenth of it holds more
    /// than twice its share.
    #[test]
    fn resyncs_are_spread_over_the_window_and_stable_per_object() {
        let with_uid = |uid: &str| {
            let mut m = McpServer::new("calc", serde_json::from_value(json!({})).unwrap());
            m.metadata.namespace = Some("ns".into());
            m.metadata.uid = Some(uid.into());
            m
        };
        let mut buckets = [0_u32; 10];
        for i in 0..1000 {
            let m = with_uid(&format!("0b8f2c1e-5d1a-4c7e-9a3b-{i:012}"));
            let r = resync(&m);
            assert!(r <= RESYNC && r > RESYNC - RESYNC_SPREAD, "{r:?}");
            assert_eq!(r, resync(&m.clone()));
            let offset = (RESYNC - r).as_millis() * 10 / RESYNC_SPREAD.as_millis();
            buckets[usize::try_from(offset).unwrap()] += 1;
        }
        assert!(buckets.iter().all(|&b| (50..=200).contains(&b)), "{buckets:?}");
        // Without a uid (an object built offline), its namespace and name decide.
        let mut m = with_uid("x");
        m.metadata.uid = None;
        assert_eq!(resync(&m), resync(&m.clone()));
    }
    use http::{Method, Request, Response, StatusCode};
    use http_body_util::BodyExt;
    use kube::client::Body;
    use kube::runtime::events::Reporter;
    use serde_json::{Value, json};

    fn answer(status: StatusCode, v: &Value) -> Response<Body> {
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(v).unwrap()))
            .unwrap()
    }

    /// One reconcile against a mocked API server on which nothing exists but what `existing`
    /// names, writes succeed, and the request `fail` answers 403; returns the error and the
    /// metrics.
    async fn failing_at(
        spec: Value,
        probe_pods: bool,
        fail: (Method, &'static str),
        existing: fn(&str) -> Option<Value>,
    ) -> (Error, String) {
        let (result, metrics) = run(spec, probe_pods, fail, existing).await;
        (result.unwrap_err(), metrics)
    }

    /// The reconciles of these tests run one at a time. `tracing` decides once per call site,
    /// when it is first reached, whether any subscriber wants it; a reconcile on another
    /// thread reaching a span for the first time while the span test installs its
    /// subscriber can settle that call site as unwanted.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// One reconcile against a mocked API server (see [`failing_at`]); its result and the
    /// metrics.
    async fn run(
        spec: Value,
        probe_pods: bool,
        fail: (Method, &'static str),
        existing: fn(&str) -> Option<Value>,
    ) -> (Result<Action, Error>, String) {
        let _one = ONE_AT_A_TIME.lock().await;
        // Call sites first reached before this thread's subscriber existed are asked again.
        tracing::callsite::rebuild_interest_cache();
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let (method, path) = (req.method().clone(), req.uri().path().to_owned());
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
                send.send_response(if (method.clone(), path.as_str()) == (fail.0.clone(), fail.1) {
                    answer(
                        StatusCode::FORBIDDEN,
                        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden"}),
                    )
                } else if method == Method::GET {
                    existing(&path).map_or_else(
                        || answer(StatusCode::NOT_FOUND, &not_found),
                        |o| answer(StatusCode::OK, &o),
                    )
                } else if path.ends_with("/status") {
                    answer(StatusCode::OK, &json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "calc"}, "spec": {}}))
                } else {
                    answer(StatusCode::OK, &body)
                });
            }
        });
        let client = Client::new(svc, "ns");
        let ctx = Arc::new(Context {
            client: client.clone(),
            defaults: Defaults {
                server_image: "quiver-server:test".into(),
                image_pull_policy: "IfNotPresent".into(),
                service_monitors: false,
                service_monitor_labels: Default::default(),
                catalog_prefix: "dev.quiver".into(),
            },
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "quiver-operator".into(),
                    instance: None,
                },
            ),
            metrics: Arc::new(Metrics::default()),
            probe_pods,
            backoff: Backoff::default(),
            owned: Owned::default(),
            memo: Memo::default(),
        });
        let mcp: McpServer = serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "calc", "namespace": "ns", "uid": "u-1", "generation": 3},
            "spec": spec,
        }))
        .unwrap();
        let result = reconcile(Arc::new(mcp), ctx.clone()).await;
        let metrics = ctx.metrics.encode();
        drop(ctx);
        server.await.unwrap();
        (result, metrics)
    }

    /// A span opened: its name, its fields and its parent's name.
    type Opened = (String, String, Option<String>);

    /// Records every span opened.
    #[derive(Clone, Default)]
    struct Spans(Arc<std::sync::Mutex<Vec<Opened>>>);

    impl<S> tracing_subscriber::Layer<S> for Spans
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            id: &tracing::span::Id,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Vec::new();
            attrs.record(&mut |f: &tracing::field::Field, v: &dyn std::fmt::Debug| {
                fields.push(format!("{}={v:?}", f.name()));
            });
            let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| p.name().to_owned());
            self.0
                .lock()
                .unwrap()
                .push((attrs.metadata().name().to_owned(), fields.join(" "), parent));
        }
    }

    #[tokio::test]
    async fn a_reconcile_runs_in_a_span_naming_the_object_with_a_child_span_per_stage() {
        use tracing_subscriber::layer::SubscriberExt;
        let spans = Spans::default();
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
        let spec = json!({"tools": [{"name": "add", "handler": {"builtin": "add"}}]});
        let (result, _) = run(spec, false, (Method::PATCH, "/none"), |_| None).await;
        result.unwrap();
        let seen = spans.0.lock().unwrap().clone();
        let (root, children) = seen.split_first().expect("spans");
        assert_eq!(
            root,
            &(
                "reconcile".to_owned(),
                "namespace=\"ns\" name=\"calc\" generation=3".to_owned(),
                None
            )
        );
        assert!(
            children
                .iter()
                .all(|(_, _, parent)| parent.as_deref() == Some("reconcile")),
            "{seen:?}"
        );
        for (name, fields) in [
            ("fetch", ""),
            ("render", ""),
            ("owner", "kind=\"ServiceAccount\""),
            ("owner", "kind=\"Service\""),
            ("apply", "kind=\"Role\""),
            ("apply", "kind=\"Deployment\""),
            ("delete", "kind=\"HorizontalPodAutoscaler\""),
            ("delete", "kind=\"HTTPRoute\""),
            ("status", ""),
        ] {
            assert!(
                children.iter().any(|(n, f, _)| n == name && f == fields),
                "{name} {fields} in {seen:?}"
            );
        }
    }

    /// Spans exported through the OpenTelemetry bridge, kept in memory.
    #[derive(Debug, Clone, Default)]
    struct Exported(Arc<std::sync::Mutex<Vec<opentelemetry_sdk::trace::SpanData>>>);

    impl opentelemetry_sdk::trace::SpanExporter for Exported {
        fn export(
            &self,
            batch: Vec<opentelemetry_sdk::trace::SpanData>,
        ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
            self.0.lock().unwrap().extend(batch);
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn an_exported_reconcile_records_the_stage_of_its_error() {
        use opentelemetry::trace::{Status, TracerProvider as _};
        use tracing_subscriber::layer::SubscriberExt;
        let exported = Exported::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(exported.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let _guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        let spec = json!({"tools": [{"name": "add", "handler": {"builtin": "add"}}]});
        let deployment = "/apis/apps/v1/namespaces/ns/deployments/calc";
        let (result, _) = run(spec, false, (Method::PATCH, deployment), |_| None).await;
        assert!(result.is_err());
        let spans = exported.0.lock().unwrap().clone();
        let root = spans
            .iter()
            .find(|s| s.name == "reconcile")
            .expect("a reconcile span");
        let attr = |k: &str| {
            root.attributes
                .iter()
                .find(|kv| kv.key.as_str() == k)
                .map(|kv| kv.value.to_string())
        };
        assert_eq!(attr("name").as_deref(), Some("calc"));
        assert_eq!(attr("generation").as_deref(), Some("3"));
        assert_eq!(attr("error.stage").as_deref(), Some("apply"));
        assert!(attr("error.type").is_some());
        assert!(matches!(root.status, Status::Error { .. }), "{:?}", root.status);
        let apply = spans
            .iter()
            .find(|s| s.name == "apply" && s.attributes.iter().any(|kv| kv.value.to_string() == "Deployment"))
            .expect("an apply span for the Deployment");
        assert_eq!(apply.parent_span_id, root.span_context.span_id());
    }

    /// The buckets of the reconcile duration in an OpenMetrics text: their count and the
    /// trace id of their exemplar, if they have one.
    fn duration_buckets(text: &str) -> Vec<(u64, Option<String>)> {
        assert!(text.ends_with("# EOF\n"), "not OpenMetrics: {text}");
        text.lines()
            .filter_map(|l| l.strip_prefix("quiver_operator_reconcile_duration_seconds_bucket{"))
            .map(|l| {
                let (sample, exemplar) = l.split_once(" # ").map_or((l, None), |(s, e)| (s, Some(e)));
                let count = sample.rsplit(' ').next().and_then(|c| c.parse().ok());
                let trace = exemplar.map(|e| {
                    let id = e.strip_prefix("{trace_id=\"").and_then(|e| e.split_once("\"} "));
                    let (id, rest) = id.unwrap_or_else(|| panic!("exemplar {e}"));
                    // The observed value and when it was observed.
                    let mut rest = rest.split(' ').map(str::parse::<f64>);
                    assert!(
                        matches!(
                            (rest.next(), rest.next(), rest.next()),
                            (Some(Ok(_)), Some(Ok(_)), None)
                        ),
                        "{e}"
                    );
                    id.to_owned()
                });
                (count.unwrap_or_else(|| panic!("sample {l}")), trace)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_sampled_reconcile_leaves_its_trace_id_on_its_duration_bucket() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;
        let spec = json!({"tools": [{"name": "add", "handler": {"builtin": "add"}}]});
        // Tracing off (spans, but none exported): no exemplar.
        let spans = Spans::default();
        let off = tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
        let (result, text) = run(spec.clone(), false, (Method::PATCH, "/none"), |_| None).await;
        drop(off);
        result.unwrap();
        assert!(
            spans
                .0
                .lock()
                .unwrap()
                .iter()
                .any(|(name, ..)| name == "reconcile")
        );
        let buckets = duration_buckets(&text);
        assert_eq!(buckets.len(), 14, "{text}");
        assert!(buckets.iter().all(|(_, trace)| trace.is_none()), "{text}");
        // Tracing on: the bucket the reconcile landed in names its trace.
        let exported = Exported::default();
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_simple_exporter(exported.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        let _on = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        let (result, text) = run(spec, false, (Method::PATCH, "/none"), |_| None).await;
        result.unwrap();
        let trace = exported
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name == "reconcile")
            .map(|s| s.span_context.trace_id().to_string())
            .expect("a reconcile span");
        let buckets = duration_buckets(&text);
        let landed = buckets
            .iter()
            .position(|(count, _)| *count == 1)
            .expect("a bucket counts it");
        let with_exemplar: Vec<usize> = (0..buckets.len()).filter(|i| buckets[*i].1.is_some()).collect();
        assert_eq!(with_exemplar, [landed], "{text}");
        assert_eq!(buckets[landed].1.as_deref(), Some(trace.as_str()), "{text}");
    }

    fn ours(path: &str) -> Option<Value> {
        path.ends_with("/horizontalpodautoscalers/calc").then(|| {
            json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "calc", "namespace": "ns", "uid": "h",
                "ownerReferences": [{"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "name": "calc", "uid": "u-1", "controller": true}]}})
        })
    }

    /// A spec, whether pods are probed, the request that fails, what exists, and the stage and
    /// kind the error names.
    type Case = (
        Value,
        bool,
        (Method, &'static str),
        fn(&str) -> Option<Value>,
        Stage,
        &'static str,
    );

    #[tokio::test]
    async fn a_failed_call_names_its_stage_and_kind_in_the_error_and_the_metrics() {
        let tools = json!([{"name": "add", "handler": {"builtin": "add"}}]);
        let from =
            json!({"tools": tools, "toolsFrom": [{"configMapKeyRef": {"name": "src", "key": "t.yaml"}}]});
        let deployment = "/apis/apps/v1/namespaces/ns/deployments/calc";
        let cases: [Case; 6] = [
            (
                from,
                false,
                (Method::GET, "/api/v1/namespaces/ns/configmaps/src"),
                |_| None,
                Stage::Fetch,
                "ConfigMap",
            ),
            (
                json!({"tools": tools}),
                false,
                (Method::GET, "/api/v1/namespaces/ns/serviceaccounts/calc"),
                |_| None,
                Stage::Owner,
                "ServiceAccount",
            ),
            (
                json!({"tools": tools}),
                false,
                (Method::PATCH, deployment),
                |_| None,
                Stage::Apply,
                "Deployment",
            ),
            (
                json!({"tools": tools}),
                false,
                (
                    Method::DELETE,
                    "/apis/autoscaling/v2/namespaces/ns/horizontalpodautoscalers/calc",
                ),
                ours,
                Stage::Delete,
                "HorizontalPodAutoscaler",
            ),
            (
                json!({"tools": tools}),
                false,
                (
                    Method::PATCH,
                    "/apis/quiver.dev/v1alpha1/namespaces/ns/mcpservers/calc/status",
                ),
                |_| None,
                Stage::Status,
                "McpServer",
            ),
            (
                json!({"tools": tools}),
                true,
                (Method::GET, "/api/v1/namespaces/ns/pods"),
                |_| None,
                Stage::Probe,
                "Pod",
            ),
        ];
        for (spec, probe, fail, existing, stage, kind) in cases {
            let (err, metrics) = failing_at(spec, probe, fail.clone(), existing).await;
            assert_eq!(
                (err.stage(), err.kind(), err.category()),
                (stage, kind, "forbidden"),
                "{fail:?}: {err}"
            );
            let series = format!(
                "quiver_operator_reconcile_stage_errors_total{{stage=\"{stage}\",kind=\"{kind}\"}} 1"
            );
            assert!(metrics.contains(&series), "{series} in {metrics}");
            assert!(metrics.contains("quiver_operator_reconcile_errors_total{category=\"forbidden\"} 1"));
        }
    }
}
