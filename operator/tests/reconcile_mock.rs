//! Reconcile against a mocked API server (tower-test): the exact requests one reconcile
//! makes, in order, for a valid spec and for an invalid one; warnings emitted once per
//! change; ServiceMonitors removed when turned off; objects of other owners neither patched
//! nor deleted, but reported; one metric outcome per reconcile; and the per-object retry
//! backoff.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::Event;
use kube::{Client, ResourceExt};
use quiver_operator::backoff::Backoff;
use quiver_operator::build::Defaults;
use quiver_operator::crd::McpServer;
use quiver_operator::metrics::Metrics;
use quiver_operator::reconcile::{Context, Memo, Owned, error_policy, reconcile};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

/// Serves expected requests in order, checking method and path, answering with a body.
struct ApiServerVerifier(ApiHandle);

impl ApiServerVerifier {
    async fn expect(
        &mut self,
        method: Method,
        path_prefix: &str,
        respond: impl FnOnce(Value) -> (StatusCode, Value),
    ) -> Value {
        let (req, send) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("expected {method} {path_prefix}"));
        assert_eq!(req.method(), method, "{}", req.uri());
        assert!(
            req.uri().path().starts_with(path_prefix),
            "expected {path_prefix}, got {}",
            req.uri()
        );
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        let (status, out) = respond(body.clone());
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&out).unwrap()))
                .unwrap(),
        );
        body
    }

    /// Like `expect`, answering with a plain-text body (what a missing API group may return).
    async fn expect_text(&mut self, method: Method, path: &str, status: StatusCode, text: &'static str) {
        let (req, send) = self
            .0
            .next_request()
            .await
            .unwrap_or_else(|| panic!("expected {method} {path}"));
        assert_eq!((req.method(), req.uri().path()), (&method, path));
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(text.as_bytes().to_vec()))
                .unwrap(),
        );
    }

    /// Asserts the client sends nothing more (every clone of it must be dropped first).
    async fn expect_no_more(&mut self) {
        if let Some((req, _)) = self.0.next_request().await {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }
}

fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// The McpServer as the API server returns it after a status patch.
fn patched(body: Value) -> (StatusCode, Value) {
    (
        StatusCode::OK,
        json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "calc", "namespace": "ns"}, "spec": {}, "status": body["status"]}),
    )
}

fn forbidden() -> (StatusCode, Value) {
    (
        StatusCode::FORBIDDEN,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403, "message": "forbidden"}),
    )
}

fn echo(body: Value) -> (StatusCode, Value) {
    (StatusCode::OK, body)
}

fn setup() -> (Arc<Context>, ApiServerVerifier) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "ns");
    let ctx = Context {
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
        probe_pods: false,
        backoff: Backoff::default(),
        owned: Owned::default(),
        memo: Memo::default(),
    };
    (Arc::new(ctx), ApiServerVerifier(handle))
}

fn mcp_with(spec: Value, status: Option<Value>) -> Arc<McpServer> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "calc", "namespace": "ns", "uid": "u-1", "generation": 3},
            "spec": spec,
            "status": status,
        }))
        .unwrap(),
    )
}

fn mcp(tools: Value) -> Arc<McpServer> {
    mcp_with(json!({"tools": tools}), None)
}

const ADD: &str = r#"[{"name": "add", "handler": {"builtin": "add"}}]"#;

fn add() -> Value {
    serde_json::from_str(ADD).unwrap()
}

const BASE: &str = "/api/v1/namespaces/ns";
const HPA: &str = "/apis/autoscaling/v2/namespaces/ns/horizontalpodautoscalers/calc";
const PDB: &str = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/calc";
const NP: &str = "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/calc";
const ING: &str = "/apis/networking.k8s.io/v1/namespaces/ns/ingresses/calc";
const SM: &str = "/apis/monitoring.coreos.com/v1/namespaces/ns/servicemonitors/calc";
const ROUTE: &str = "/apis/gateway.networking.k8s.io/v1/namespaces/ns/httproutes/calc";
const STATUS: &str = "/apis/quiver.dev/v1alpha1/namespaces/ns/mcpservers/calc/status";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";

const SA: &str = "/api/v1/namespaces/ns/serviceaccounts/calc";
const ROLE: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/roles/calc-config-reader";
const BINDING: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings/calc-config-reader";
const CM: &str = "/api/v1/namespaces/ns/configmaps/calc-tools";
const DEPLOY: &str = "/apis/apps/v1/namespaces/ns/deployments/calc";
const SVC: &str = "/api/v1/namespaces/ns/services/calc";
const KEY: &str = "/api/v1/namespaces/ns/secrets/calc-state-key";

/// The state-key Secret's metadata, controlled by `owner_uid`.
fn state_key(owner_uid: &str) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
        "metadata": {"name": "calc-state-key", "namespace": "ns", "uid": "key-uid-1",
            "ownerReferences": [{"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "name": "calc", "uid": owner_uid, "controller": true}]}})
}

/// Without watch stores, the ownership check of each always-present child is one GET, in
/// apply order; `answer` says what exists at each path (`None`: nothing).
async fn expect_checks(api: &mut ApiServerVerifier, answer: impl Fn(&str) -> Option<Value>) {
    // The state-key Secret first (metadata only): it exists and is this McpServer's unless
    // `answer` says otherwise.
    api.expect(Method::GET, KEY, |_| {
        (StatusCode::OK, answer(KEY).unwrap_or_else(|| state_key("u-1")))
    })
    .await;
    for path in [SA, ROLE, BINDING, CM, DEPLOY, SVC] {
        api.expect(Method::GET, path, |_| {
            answer(path).map_or_else(not_found, |o| (StatusCode::OK, o))
        })
        .await;
    }
}

/// Nothing of those names exists yet.
async fn expect_free(api: &mut ApiServerVerifier) {
    expect_checks(api, |_| None).await;
}

/// The applies of a valid single-replica spec, up to and including the Service, after the
/// checks that find every name free; returns the applied ConfigMap.
async fn expect_applies(api: &mut ApiServerVerifier) -> Value {
    expect_free(api).await;
    expect_patches(api).await
}

/// The applies alone.
async fn expect_patches(api: &mut ApiServerVerifier) -> Value {
    api.expect(Method::PATCH, &format!("{BASE}/serviceaccounts/calc"), echo)
        .await;
    api.expect(
        Method::PATCH,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/roles/calc-config-reader",
        echo,
    )
    .await;
    api.expect(
        Method::PATCH,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings/calc-config-reader",
        echo,
    )
    .await;
    // After the Role: the pods may read what the new config names by the time they load it.
    let cm = api
        .expect(Method::PATCH, &format!("{BASE}/configmaps/calc-tools"), echo)
        .await;
    let d = api
        .expect(
            Method::PATCH,
            "/apis/apps/v1/namespaces/ns/deployments/calc",
            |mut b| {
                b["metadata"]["generation"] = json!(1);
                b["status"] =
                    json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1});
                (StatusCode::OK, b)
            },
        )
        .await;
    assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u-1");
    api.expect(Method::PATCH, &format!("{BASE}/services/calc"), echo)
        .await;
    cm
}

/// No HPA, PDB, NetworkPolicy, Ingress, ServiceMonitor or HTTPRoute is wanted and none
/// exists; the ServiceMonitor and HTTPRoute CRDs are absent, and their API groups answer a
/// plain-text 404.
async fn expect_no_optional_children(api: &mut ApiServerVerifier) {
    expect_no_builtin_optional_children(api).await;
    api.expect_text(Method::GET, SM, StatusCode::NOT_FOUND, "404 page not found")
        .await;
    expect_no_route(api).await;
}

/// No HPA, PDB, NetworkPolicy or Ingress is wanted and none exists.
async fn expect_no_builtin_optional_children(api: &mut ApiServerVerifier) {
    api.expect(Method::GET, HPA, |_| not_found()).await;
    api.expect(Method::GET, PDB, |_| not_found()).await;
    api.expect(Method::GET, NP, |_| not_found()).await;
    api.expect(Method::GET, ING, |_| not_found()).await;
}

async fn expect_no_route(api: &mut ApiServerVerifier) {
    api.expect_text(Method::GET, ROUTE, StatusCode::NOT_FOUND, "404 page not found")
        .await;
}

fn condition(status: &Value, type_: &str) -> Value {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
        .clone()
}

/// `quiver_operator_reconciles_total{result=...}` as exposed.
fn reconciles(ctx: &Context, result: &str) -> u64 {
    let text = ctx.metrics.encode();
    let prefix = format!("quiver_operator_reconciles_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_valid_spec_applies_every_child_then_the_status() {
    let (ctx, mut api) = setup();
    let m = mcp(add());
    let name = m.name_any();
    let period = quiver_operator::reconcile::resync(&m);
    let server = tokio::spawn(async move {
        let cm = expect_applies(&mut api).await;
        assert!(
            cm["data"]["tools.yaml"]
                .as_str()
                .unwrap()
                .contains(r#""builtin":"add""#)
        );
        assert_eq!(
            cm["metadata"]["labels"]["app.kubernetes.io/managed-by"], "quiver-operator",
            "the owned-ConfigMap watch selects this label"
        );
        expect_no_optional_children(&mut api).await;
        api.expect(Method::PATCH, STATUS, patched).await
    });
    let action = reconcile(m, ctx.clone()).await.unwrap();
    let status = server.await.unwrap()["status"].clone();
    assert_eq!(status["toolCount"], 1);
    assert_eq!(status["observedGeneration"], 3);
    assert_eq!(status["replicasSummary"], "1/1");
    assert_eq!(condition(&status, "Ready")["status"], "True");
    assert!(
        (Duration::from_secs(240)..=Duration::from_secs(300)).contains(&period),
        "{period:?}"
    );
    assert_eq!(
        action,
        Action::requeue(period),
        "a settled object is re-checked within 4 to 5 minutes, by its own period ({name})"
    );
    assert_eq!((reconciles(&ctx, "ok"), reconciles(&ctx, "invalid_spec")), (1, 0));
}

#[tokio::test]
async fn an_invalid_spec_writes_a_condition_and_an_event_and_touches_no_child() {
    let (ctx, mut api) = setup();
    let m = mcp(json!([{"name": "add", "handler": {"builtin": "nope"}}]));
    let server = tokio::spawn(async move {
        let status = api.expect(Method::PATCH, STATUS, patched).await;
        let event = api.expect(Method::POST, EVENTS, echo).await;
        (status, event)
    });
    let action = reconcile(m, ctx.clone()).await.unwrap();
    let (status, event) = server.await.unwrap();
    let valid = condition(&status["status"], "ConfigValid");
    assert_eq!(valid["status"], "False");
    assert_eq!(valid["reason"], "InvalidToolConfig");
    assert!(
        valid["message"]
            .as_str()
            .unwrap()
            .contains("spec.tools[0].handler.builtin: unknown builtin `nope`")
    );
    assert_eq!(event["reason"], "InvalidToolConfig");
    assert_eq!(event["type"], "Warning");
    assert_eq!(action, Action::await_change(), "waits for a change");
    assert_eq!(
        (
            reconciles(&ctx, "ok"),
            reconciles(&ctx, "invalid_spec"),
            reconciles(&ctx, "error")
        ),
        (0, 1, 0),
        "an invalid spec is counted once, as invalid_spec only"
    );
}

/// A policy whose expression the server's compiler refuses: `ConfigValid=False` naming the
/// field, and no child (the last good ConfigMap) is touched.
#[tokio::test]
async fn an_invalid_policy_expression_is_config_valid_false_naming_the_field() {
    let (ctx, mut api) = setup();
    let m = mcp_with(
        json!({
            "tools": add(),
            "policies": [
                {"name": "fine", "expression": "'sre' in caller.groups"},
                {"name": "typo", "expression": "'sre' in user.groups"},
                {"name": "not-bool", "expression": "caller.groups", "tools": ["add"]},
            ],
        }),
        None,
    );
    let server = tokio::spawn(async move {
        let status = api.expect(Method::PATCH, STATUS, patched).await;
        let event = api.expect(Method::POST, EVENTS, echo).await;
        (status, event)
    });
    let action = reconcile(m, ctx.clone()).await.unwrap();
    let (status, event) = server.await.unwrap();
    let valid = condition(&status["status"], "ConfigValid");
    assert_eq!(valid["status"], "False");
    assert_eq!(valid["reason"], "InvalidToolConfig");
    let message = valid["message"].as_str().unwrap();
    assert!(
        message.contains("spec.policies[1].expression: unknown variable `user`"),
        "{message}"
    );
    assert!(
        message.contains("spec.policies[2].expression: must be a bool expression"),
        "{message}"
    );
    assert!(!message.contains("policies[0]"), "{message}");
    assert_eq!(event["reason"], "InvalidToolConfig");
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn the_unsafe_sysctls_warning_is_emitted_once_per_change_of_the_set() {
    let spec = json!({"tools": add(), "tuning": {"sysctls": {"net.core.somaxconn": "1024"}}});
    // First reconcile: the status records the set and one Warning event is emitted.
    let (ctx, mut api) = setup();
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_optional_children(&mut api).await;
        let status = api.expect(Method::PATCH, STATUS, patched).await;
        let event = api.expect(Method::POST, EVENTS, echo).await;
        (status, event)
    });
    reconcile(mcp_with(spec.clone(), None), ctx).await.unwrap();
    let (status, event) = server.await.unwrap();
    assert_eq!(status["status"]["unsafeSysctls"], json!(["net.core.somaxconn"]));
    assert_eq!(event["reason"], "UnsafeSysctls");
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .starts_with("net.core.somaxconn are not in the kubelet's safe set")
    );

    // The same spec again, now carrying that status: nothing to write, no event.
    let (ctx, mut api) = setup();
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_optional_children(&mut api).await;
        api.expect_no_more().await;
    });
    reconcile(mcp_with(spec.clone(), Some(status["status"].clone())), ctx)
        .await
        .unwrap();
    server.await.unwrap();

    // Another unsafe sysctl changes the set: a new event.
    let mut changed = spec;
    changed["tuning"]["sysctls"]["net.core.rmem_max"] = json!("1048576");
    let (ctx, mut api) = setup();
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_optional_children(&mut api).await;
        let status = api.expect(Method::PATCH, STATUS, patched).await;
        let event = api.expect(Method::POST, EVENTS, echo).await;
        (status, event)
    });
    reconcile(mcp_with(changed, Some(status["status"].clone())), ctx)
        .await
        .unwrap();
    let (status, event) = server.await.unwrap();
    assert_eq!(
        status["status"]["unsafeSysctls"],
        json!(["net.core.rmem_max", "net.core.somaxconn"])
    );
    assert!(
        event["note"]
            .as_str()
            .unwrap()
            .starts_with("net.core.rmem_max, net.core.somaxconn")
    );

    // Fixed: the merge patch must say so explicitly (an omitted list would stay), no event.
    let (ctx, mut api) = setup();
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_optional_children(&mut api).await;
        let status = api.expect(Method::PATCH, STATUS, patched).await;
        api.expect_no_more().await;
        status
    });
    reconcile(
        mcp_with(json!({"tools": add()}), Some(status["status"].clone())),
        ctx,
    )
    .await
    .unwrap();
    let status = server.await.unwrap();
    assert_eq!(status["status"]["unsafeSysctls"], json!([]));
}

fn service_monitor(owner_uid: &str) -> Value {
    service_monitor_ref(owner_uid, Some(true))
}

fn service_monitor_ref(owner_uid: &str, controller: Option<bool>) -> Value {
    json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": "calc", "namespace": "ns", "uid": "sm-1", "resourceVersion": "41", "ownerReferences": [
            {"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "name": "calc", "uid": owner_uid, "controller": controller}
        ]},
        "spec": {},
    })
}

#[tokio::test]
async fn a_service_monitor_turned_off_is_deleted_if_the_mcpserver_owns_it() {
    let (ctx, mut api) = setup();
    let spec = json!({"tools": add(), "monitoring": {"serviceMonitor": false}});
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_builtin_optional_children(&mut api).await;
        api.expect(Method::GET, SM, |_| (StatusCode::OK, service_monitor("u-1")))
            .await;
        let delete = api.expect(Method::DELETE, SM, echo).await;
        expect_no_route(&mut api).await;
        api.expect(Method::PATCH, STATUS, patched).await;
        delete
    });
    reconcile(mcp_with(spec.clone(), None), ctx).await.unwrap();
    let delete = server.await.unwrap();
    assert_eq!(
        delete["preconditions"]["uid"], "sm-1",
        "deletes exactly the object it read"
    );
    assert_eq!(
        delete["preconditions"]["resourceVersion"], "41",
        "and only as it read it: an owner reference removed meanwhile keeps the object"
    );

    // One of the same name that another owner made is left alone.
    let (ctx, mut api) = setup();
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_builtin_optional_children(&mut api).await;
        api.expect(Method::GET, SM, |_| {
            (StatusCode::OK, service_monitor("someone-else"))
        })
        .await;
        expect_no_route(&mut api).await;
        api.expect(Method::PATCH, STATUS, patched).await;
        api.expect_no_more().await;
    });
    reconcile(mcp_with(spec.clone(), None), ctx).await.unwrap();
    server.await.unwrap();

    // Nor one that only lists the McpServer as an owner without naming it the controller.
    for controller in [None, Some(false)] {
        let (ctx, mut api) = setup();
        let server = tokio::spawn(async move {
            expect_applies(&mut api).await;
            expect_no_builtin_optional_children(&mut api).await;
            api.expect(Method::GET, SM, |_| {
                (StatusCode::OK, service_monitor_ref("u-1", controller))
            })
            .await;
            expect_no_route(&mut api).await;
            api.expect(Method::PATCH, STATUS, patched).await;
            api.expect_no_more().await;
        });
        reconcile(mcp_with(spec.clone(), None), ctx).await.unwrap();
        server.await.unwrap();
    }
}

#[tokio::test]
async fn a_service_monitor_without_its_crd_is_a_warning_not_an_error() {
    let (ctx, mut api) = setup();
    let spec = json!({"tools": add(), "monitoring": {"serviceMonitor": true}});
    let server = tokio::spawn(async move {
        expect_applies(&mut api).await;
        expect_no_builtin_optional_children(&mut api).await;
        api.expect_text(Method::GET, SM, StatusCode::NOT_FOUND, "404 page not found")
            .await;
        let sm = api.expect(Method::PATCH, SM, |_| not_found()).await;
        let event = api.expect(Method::POST, EVENTS, echo).await;
        expect_no_route(&mut api).await;
        api.expect(Method::PATCH, STATUS, patched).await;
        (sm, event)
    });
    reconcile(mcp_with(spec, None), ctx).await.unwrap();
    let (sm, event) = server.await.unwrap();
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "admin");
    assert_eq!(sm["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(event["reason"], "ServiceMonitorUnavailable");
}

#[tokio::test]
async fn failures_back_off_per_object_and_a_success_resets_the_schedule() {
    let (ctx, mut api) = setup();
    let m = mcp(add());
    let server = tokio::spawn(async move {
        for _ in 0..3 {
            expect_free(&mut api).await;
            api.expect(Method::PATCH, &format!("{BASE}/serviceaccounts/calc"), |_| {
                forbidden()
            })
            .await;
        }
        expect_applies(&mut api).await;
        expect_no_optional_children(&mut api).await;
        api.expect(Method::PATCH, STATUS, patched).await;
        expect_free(&mut api).await;
        api.expect(Method::PATCH, &format!("{BASE}/serviceaccounts/calc"), |_| {
            forbidden()
        })
        .await;
    });
    let mut delays = Vec::new();
    for _ in 0..3 {
        let err = reconcile(m.clone(), ctx.clone()).await.unwrap_err();
        assert_eq!(err.category(), "forbidden");
        delays.push(error_policy(m.clone(), &err, ctx.clone()));
    }
    let secs = |s| Action::requeue(Duration::from_secs(s));
    assert_eq!(delays, [secs(1), secs(2), secs(4)]);
    // Another object has its own schedule.
    let other = mcp_with(json!({}), None);
    let mut other = (*other).clone();
    other.metadata.name = Some("other".into());
    let err = quiver_operator::reconcile::Error::Unnamed;
    assert_eq!(error_policy(Arc::new(other), &err, ctx.clone()), secs(1));

    reconcile(m.clone(), ctx.clone()).await.unwrap();
    assert_eq!(ctx.backoff.len(), 1, "the success forgot calc; other still fails");
    let err = reconcile(m.clone(), ctx.clone()).await.unwrap_err();
    assert_eq!(
        error_policy(m, &err, ctx.clone()),
        secs(1),
        "the schedule starts over"
    );
    server.await.unwrap();
    assert_eq!(
        (reconciles(&ctx, "error"), reconciles(&ctx, "ok")),
        (4, 1),
        "each reconcile is counted once"
    );
}

/// An object of `kind` named `name` that someone else made: no owner references, or another
/// controller.
fn foreign(api_version: &str, kind: &str, name: &str, controller_uid: Option<&str>) -> Value {
    let refs: Vec<Value> = controller_uid
        .map(|u| json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": u, "controller": true}))
        .into_iter()
        .collect();
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "uid": "theirs", "ownerReferences": refs},
    })
}

const CONFLICT_NOTE: &str = "exists and is not owned by this McpServer; refusing to modify it";

type Seen = Vec<(Method, String, Value)>;

/// Answers every request the reconcile makes until the client is dropped: writes echo their
/// body, GETs answer what `existing` says is at the path (`None`: 404).
async fn record_all(api: &mut ApiServerVerifier, existing: impl Fn(&str) -> Option<Value>) -> Seen {
    let mut seen = Vec::new();
    while let Some((req, send)) = api.0.next_request().await {
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let (status, out) = match method {
            Method::GET => existing(&path).map_or_else(not_found, |o| (StatusCode::OK, o)),
            _ if path == STATUS => patched(body.clone()),
            Method::PATCH if path == DEPLOY => {
                let mut d = body.clone();
                d["metadata"]["generation"] = json!(1);
                d["status"] =
                    json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1});
                (StatusCode::OK, d)
            }
            _ => echo(body.clone()),
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&out).unwrap()))
                .unwrap(),
        );
        seen.push((method, path, body));
    }
    seen
}

/// Runs one reconcile of `m` against an API server on which `existing` answers the GETs;
/// returns its result, every request it made, and the context (for metrics).
async fn reconcile_with(
    m: Arc<McpServer>,
    existing: impl Fn(&str) -> Option<Value> + Send + 'static,
) -> (Result<Action, quiver_operator::reconcile::Error>, Seen, String) {
    let (ctx, mut api) = setup();
    let server = tokio::spawn(async move { record_all(&mut api, existing).await });
    let result = reconcile(m, ctx.clone()).await;
    let metrics = ctx.metrics.encode();
    // Every client clone (the recorder holds one) must go for the server task to end.
    drop(ctx);
    (result, server.await.unwrap(), metrics)
}

fn writes(seen: &Seen) -> Vec<String> {
    seen.iter()
        .filter(|(m, _, _)| *m != Method::GET)
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect()
}

fn status_of(seen: &Seen) -> Value {
    seen.iter()
        .find(|(m, p, _)| *m == Method::PATCH && p == STATUS)
        .map(|(_, _, b)| b["status"].clone())
        .expect("a status patch")
}

fn events(seen: &Seen) -> Vec<Value> {
    seen.iter()
        .filter(|(m, p, _)| *m == Method::POST && p == EVENTS)
        .map(|(_, _, b)| b.clone())
        .collect()
}

#[tokio::test]
async fn a_foreign_service_is_neither_patched_nor_adopted_and_is_reported() {
    // Their Service is unowned, or controlled by something else; the McpServer also wants an
    // Ingress and an HTTPRoute, which would lead to that Service.
    for controller in [None, Some("their-deployment")] {
        let spec = json!({"tools": add(), "ingress": {"host": "calc.example.com"}, "httpRoute": {"parentRefs": [{"name": "gw"}]}});
        let (result, seen, metrics) = reconcile_with(mcp_with(spec, None), move |path| {
            (path == SVC).then(|| foreign("v1", "Service", "calc", controller))
        })
        .await;
        let w = writes(&seen);
        assert!(
            !w.iter().any(|r| r.ends_with(SVC)),
            "the Service is not touched: {w:?}"
        );
        assert!(
            !seen.iter().any(|(_, p, _)| p == ING || p == ROUTE),
            "no route to their Service, not even looked up: {w:?}"
        );
        // Children that do not depend on the Service are applied.
        for path in [SA, ROLE, BINDING, CM, DEPLOY] {
            assert!(w.contains(&format!("PATCH {path}")), "{path} applied: {w:?}");
        }
        let status = status_of(&seen);
        for type_ in ["Ready", "Degraded"] {
            let c = condition(&status, type_);
            assert_eq!(c["reason"], "ChildConflict", "{type_}");
            let message = c["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("Service ns/calc {CONFLICT_NOTE}")),
                "{c}"
            );
        }
        assert_eq!(condition(&status, "Ready")["status"], "False");
        assert_eq!(condition(&status, "Degraded")["status"], "True");
        let ev = events(&seen);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0]["type"], "Warning");
        assert_eq!(ev[0]["reason"], "ChildConflict");
        assert_eq!(ev[0]["note"], format!("Service ns/calc {CONFLICT_NOTE}"));
        let err = result.unwrap_err();
        assert_eq!(
            err.category(),
            "not_owned",
            "retried with backoff, counted by a bounded label"
        );
        assert_eq!(err.to_string(), format!("Service ns/calc {CONFLICT_NOTE}"));
        assert!(
            metrics.contains("quiver_operator_reconcile_errors_total{category=\"not_owned\"} 1"),
            "{metrics}"
        );
    }
}

#[tokio::test]
async fn a_foreign_service_account_holds_back_the_binding_and_the_pods() {
    // An McpServer named like a ServiceAccount (e.g. `default`): binding its Secret-reading
    // Role to that account, or running its pods as it, would be the takeover.
    let spec = json!({"tools": add(), "autoscaling": {"minReplicas": 1, "maxReplicas": 3}});
    let (result, seen, _) = reconcile_with(mcp_with(spec, None), |path| {
        (path == SA).then(|| foreign("v1", "ServiceAccount", "calc", None))
    })
    .await;
    let w = writes(&seen);
    for held in [SA, BINDING, DEPLOY, HPA] {
        assert!(!w.iter().any(|r| r.ends_with(held)), "{held} not written: {w:?}");
    }
    for applied in [ROLE, CM, SVC, PDB] {
        assert!(
            w.contains(&format!("PATCH {applied}")),
            "{applied} applied: {w:?}"
        );
    }
    assert!(
        matches!(
            result,
            Err(quiver_operator::reconcile::Error::NotOwned {
                kind: "ServiceAccount",
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(
        events(&seen)[0]["note"],
        format!("ServiceAccount ns/calc {CONFLICT_NOTE}")
    );
    let status = status_of(&seen);
    assert_eq!(condition(&status, "Ready")["reason"], "ChildConflict");
    assert_eq!(status["observedGeneration"], 3);
}

#[tokio::test]
async fn a_foreign_tools_config_map_is_neither_written_nor_granted_to_the_pods() {
    let (result, seen, _) = reconcile_with(mcp(add()), |path| {
        (path == CM).then(|| foreign("v1", "ConfigMap", "calc-tools", None))
    })
    .await;
    let w = writes(&seen);
    // The Role would grant reading it, the pods would serve it.
    for held in [CM, ROLE, BINDING, DEPLOY] {
        assert!(!w.iter().any(|r| r.ends_with(held)), "{held} not written: {w:?}");
    }
    for applied in [SA, SVC] {
        assert!(
            w.contains(&format!("PATCH {applied}")),
            "{applied} applied: {w:?}"
        );
    }
    assert!(result.is_err());
    assert_eq!(
        events(&seen)[0]["note"],
        format!("ConfigMap ns/calc-tools {CONFLICT_NOTE}")
    );
}

#[tokio::test]
async fn every_foreign_child_is_named_and_the_same_conflicts_again_write_nothing() {
    let spec =
        json!({"tools": add(), "autoscaling": {"minReplicas": 1, "maxReplicas": 3}, "networkPolicy": {}});
    let taken = |path: &str| match path {
        SVC => Some(foreign("v1", "Service", "calc", None)),
        NP => Some(foreign("networking.k8s.io/v1", "NetworkPolicy", "calc", None)),
        PDB => Some(foreign("policy/v1", "PodDisruptionBudget", "calc", Some("x"))),
        _ => None,
    };
    let (_, seen, _) = reconcile_with(mcp_with(spec.clone(), None), taken).await;
    let w = writes(&seen);
    for held in [SVC, NP, PDB] {
        assert!(!w.iter().any(|r| r.ends_with(held)), "{held} not written: {w:?}");
    }
    assert!(
        w.contains(&format!("PATCH {HPA}")),
        "the HPA of this Deployment is applied: {w:?}"
    );
    let notes: Vec<String> = events(&seen)
        .iter()
        .map(|e| e["note"].as_str().unwrap().to_owned())
        .collect();
    // One event naming them all (the recorder would fold several of one reason into one).
    assert_eq!(
        notes,
        [format!(
            "Service ns/calc {CONFLICT_NOTE}; PodDisruptionBudget ns/calc {CONFLICT_NOTE}; NetworkPolicy ns/calc {CONFLICT_NOTE}"
        )]
    );
    // The next look (after the backoff) finds the same: no status write, no event, retried.
    let status = status_of(&seen);
    let (result, seen, _) = reconcile_with(mcp_with(spec, Some(status)), taken).await;
    assert!(result.is_err());
    assert!(
        !seen.iter().any(|(m, p, _)| *m == Method::PATCH && p == STATUS),
        "status unchanged"
    );
    assert!(events(&seen).is_empty(), "no repeated events");
}

#[tokio::test]
async fn once_the_foreign_object_is_gone_the_mcpserver_recovers() {
    let (_, seen, _) = reconcile_with(mcp(add()), |path| {
        (path == SVC).then(|| foreign("v1", "Service", "calc", None))
    })
    .await;
    let conflicted = status_of(&seen);
    let m = mcp_with(json!({"tools": add()}), Some(conflicted));
    let period = quiver_operator::reconcile::resync(&m);
    let (result, seen, _) = reconcile_with(m, |_| None).await;
    assert_eq!(result.unwrap(), Action::requeue(period));
    assert!(writes(&seen).contains(&format!("PATCH {SVC}")));
    let status = status_of(&seen);
    assert_eq!(condition(&status, "Degraded")["reason"], "AsExpected");
    assert_eq!(condition(&status, "Ready")["reason"], "PodsReady");
}

/// The watch stores of namespace `ns` holding, for each always-present child, the metadata
/// `meta(kind, name)` returns.
fn filled_stores(meta: impl Fn(&str, &str) -> Value) -> Owned {
    use quiver_operator::reconcile::Feed;
    fn put<K>(w: &mut Feed<K>, v: Value)
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        w.observe(&Ok(Event::Apply(serde_json::from_value(v).unwrap())));
    }
    let (stores, mut w) = quiver_operator::reconcile::stores(Some("ns".into()));
    put(&mut w.service_accounts, meta("ServiceAccount", "calc"));
    put(&mut w.roles, meta("Role", "calc-config-reader"));
    put(&mut w.role_bindings, meta("RoleBinding", "calc-config-reader"));
    put(&mut w.config_maps, meta("ConfigMap", "calc-tools"));
    put(&mut w.deployments, meta("Deployment", "calc"));
    put(&mut w.services, meta("Service", "calc"));
    put(&mut w.secrets, meta("Secret", "calc-state-key"));
    Owned::new(vec![stores])
}

fn ours(kind: &str, name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("{kind}-1"), "ownerReferences": [
        {"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer", "name": "calc", "uid": "u-1", "controller": true}
    ]}})
}

fn with_stores(owned: Owned) -> (Arc<Context>, ApiServerVerifier) {
    let (ctx, api) = setup();
    let mut ctx = Arc::into_inner(ctx).unwrap();
    ctx.owned = owned;
    (Arc::new(ctx), api)
}

#[tokio::test]
async fn children_the_watch_stores_show_as_ours_cost_no_get() {
    let (ctx, mut api) = with_stores(filled_stores(ours));
    let server = tokio::spawn(async move {
        // Straight to the applies: no ownership GET.
        expect_patches(&mut api).await;
        expect_no_optional_children(&mut api).await;
        api.expect(Method::PATCH, STATUS, patched).await;
    });
    reconcile(mcp(add()), ctx).await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn a_labelled_object_of_another_owner_in_the_stores_is_a_conflict_without_a_get() {
    let (ctx, mut api) = with_stores(filled_stores(|kind, name| {
        if kind == "Service" {
            foreign("v1", "Service", name, Some("another-mcpserver"))
        } else {
            ours(kind, name)
        }
    }));
    let server =
        tokio::spawn(async move {
            let seen = record_all(&mut api, |_| None).await;
            assert!(
                !seen.iter().any(|(m, p, _)| *m == Method::GET
                    && [SA, ROLE, BINDING, CM, DEPLOY, SVC].contains(&p.as_str())),
                "answered from the stores"
            );
            seen
        });
    let err = reconcile(mcp(add()), ctx).await.unwrap_err();
    let seen = server.await.unwrap();
    assert_eq!(err.category(), "not_owned");
    assert!(!writes(&seen).iter().any(|r| r.ends_with(SVC)));
    assert_eq!(events(&seen)[0]["reason"], "ChildConflict");
}

/// The body of the one write `method path` in `seen`.
fn only_write<'a>(seen: &'a Seen, method: &Method, path: &str) -> Vec<&'a Value> {
    seen.iter()
        .filter(|(m, p, _)| m == method && p == path)
        .map(|(_, _, b)| b)
        .collect()
}

fn state_key_env(deployment: &Value) -> Option<&Value> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "QUIVER_STATE_KEY")
}

#[tokio::test]
async fn a_missing_state_key_secret_is_created_random_owned_and_mounted() {
    let mut keys = Vec::new();
    for _ in 0..2 {
        let (result, seen, _) = reconcile_with(mcp(add()), |_| None).await;
        result.unwrap();
        let created = only_write(&seen, &Method::POST, &format!("{BASE}/secrets"));
        assert_eq!(created.len(), 1, "created once");
        let secret = created[0];
        assert_eq!(secret["metadata"]["name"], "calc-state-key");
        assert_eq!(secret["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(secret["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(secret["immutable"], true);
        // 32 random bytes, hex-encoded (64 characters: base64 of them is 88).
        let data = secret["data"]["key"].as_str().unwrap().to_owned();
        assert_eq!(data.len(), 88, "{data}");
        keys.push(data);
        let d = only_write(&seen, &Method::PATCH, DEPLOY);
        let env = state_key_env(d[0]).expect("the server reads the key");
        assert_eq!(env["valueFrom"]["secretKeyRef"]["name"], "calc-state-key");
        assert_eq!(env["valueFrom"]["secretKeyRef"]["key"], "key");
        assert!(env.get("value").is_none(), "never the value itself");
        // Before the Deployment: the pods never wait for a missing Secret.
        let order: Vec<_> = writes(&seen);
        let at = |w: &str| order.iter().position(|x| x == w).unwrap();
        assert!(at(&format!("POST {BASE}/secrets")) < at(&format!("PATCH {DEPLOY}")));
    }
    assert_ne!(keys[0], keys[1], "each key is drawn at random");
}

#[tokio::test]
async fn an_existing_state_key_is_read_by_metadata_and_its_uid_rolls_the_pods() {
    let (result, seen, _) = reconcile_with(mcp(add()), |p| (p == KEY).then(|| state_key("u-1"))).await;
    result.unwrap();
    assert!(only_write(&seen, &Method::POST, &format!("{BASE}/secrets")).is_empty());
    assert!(
        !writes(&seen).iter().any(|w| w.contains("/secrets/")),
        "never patched"
    );
    let d = only_write(&seen, &Method::PATCH, DEPLOY);
    assert_eq!(
        d[0]["spec"]["template"]["metadata"]["annotations"]["quiver.dev/state-key-uid"],
        "key-uid-1"
    );
    assert!(state_key_env(d[0]).is_some());
}

#[tokio::test]
async fn a_state_key_secret_of_another_owner_is_a_conflict_and_not_mounted() {
    let (result, seen, _) = reconcile_with(mcp(add()), |p| {
        (p == KEY).then(|| foreign("v1", "Secret", "calc-state-key", None))
    })
    .await;
    assert_eq!(result.unwrap_err().category(), "not_owned");
    assert!(!writes(&seen).iter().any(|w| w.contains("/secrets")));
    let d = only_write(&seen, &Method::PATCH, DEPLOY);
    assert!(state_key_env(d[0]).is_none(), "each pod draws its own key");
    assert!(
        events(&seen)[0]["note"]
            .as_str()
            .unwrap()
            .contains("Secret ns/calc-state-key")
    );
}

// At rest: an apply that would change nothing is not sent, and the watch stores say which
// optional children are left to delete.

/// Every request a reconcile made, each with what the API server answered.
type Log = Arc<std::sync::Mutex<Seen>>;

/// An API server that answers GETs with what `existing` says is at the path (`None`: 404) and
/// writes with their body under a new `resourceVersion`, as the real one does (the Deployment
/// also with a rolled-out status). Each request is logged before it is answered, so all of a
/// finished reconcile's requests are in the log.
fn versioning(
    mut api: ApiServerVerifier,
    existing: impl Fn(&str) -> Option<Value> + Send + 'static,
) -> (Log, tokio::task::JoinHandle<()>) {
    let log = Log::default();
    let kept = log.clone();
    let task = tokio::spawn(async move {
        let mut version = 100;
        while let Some((req, send)) = api.0.next_request().await {
            let (method, path) = (req.method().clone(), req.uri().path().to_owned());
            let body = req.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (status, out) = match method {
                Method::GET => existing(&path).map_or_else(not_found, |o| (StatusCode::OK, o)),
                _ if path == STATUS => patched(body),
                _ => {
                    version += 1;
                    let mut o = body;
                    o["metadata"]["resourceVersion"] = json!(version.to_string());
                    if path == DEPLOY {
                        o["metadata"]["generation"] = json!(1);
                        o["status"] = json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1});
                    }
                    (StatusCode::OK, o)
                }
            };
            kept.lock().unwrap().push((method, path, out.clone()));
            send.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            );
        }
    });
    (log, task)
}

/// The requests logged since the last call, as `METHOD path`.
fn requests(log: &Log) -> Vec<String> {
    std::mem::take(&mut *log.lock().unwrap())
        .into_iter()
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect()
}

/// `ours(kind, name)` at `version`.
fn ours_at(kind: &str, name: &str, version: &str) -> Value {
    let mut o = ours(kind, name);
    o["metadata"]["resourceVersion"] = json!(version);
    o
}

/// A watch event for one object's metadata, as its watch delivers it.
fn event<K>(feed: &mut quiver_operator::reconcile::Feed<K>, e: Event<Value>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let meta = |v: Value| serde_json::from_value(v).unwrap();
    feed.observe(&Ok(match e {
        Event::Apply(v) => Event::Apply(meta(v)),
        Event::Delete(v) => Event::Delete(meta(v)),
        Event::InitApply(v) => Event::InitApply(meta(v)),
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
    }));
}

/// A completed list of `objects`: the store is current.
fn listed<K>(feed: &mut quiver_operator::reconcile::Feed<K>, objects: Vec<Value>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    event(feed, Event::Init);
    for o in objects {
        event(feed, Event::InitApply(o));
    }
    event(feed, Event::InitDone);
}

/// The watch of a kind the API server answers 404 for (its CRD is not installed).
fn not_served(feed: &mut quiver_operator::reconcile::Feed<kube::api::DynamicObject>) {
    let status = kube::core::Status {
        code: 404,
        ..kube::core::Status::default()
    };
    feed.observe(&Err(kube::runtime::watcher::Error::InitialListFailed(
        kube::Error::Api(Box::new(status)),
    )));
}

/// Stores of namespace `ns`, every watch listed: the always-present children and the
/// state-key Secret exist as this McpServer's at version 1, `hpa` is the only optional child,
/// and the ServiceMonitor and HTTPRoute CRDs are not installed.
fn current_stores(hpa: Option<Value>) -> (Owned, quiver_operator::reconcile::Writers) {
    let (stores, mut w) = quiver_operator::reconcile::stores(Some("ns".into()));
    listed(
        &mut w.service_accounts,
        vec![ours_at("ServiceAccount", "calc", "1")],
    );
    listed(&mut w.roles, vec![ours_at("Role", "calc-config-reader", "1")]);
    listed(
        &mut w.role_bindings,
        vec![ours_at("RoleBinding", "calc-config-reader", "1")],
    );
    listed(&mut w.config_maps, vec![ours_at("ConfigMap", "calc-tools", "1")]);
    listed(&mut w.deployments, vec![ours_at("Deployment", "calc", "1")]);
    listed(&mut w.services, vec![ours_at("Service", "calc", "1")]);
    listed(&mut w.secrets, vec![ours_at("Secret", "calc-state-key", "1")]);
    listed(&mut w.autoscalers, hpa.into_iter().collect());
    listed(&mut w.disruption_budgets, vec![]);
    listed(&mut w.network_policies, vec![]);
    listed(&mut w.ingresses, vec![]);
    not_served(&mut w.service_monitors);
    not_served(&mut w.http_routes);
    (Owned::new(vec![stores]), w)
}

/// What the watches deliver after the writes in `log`: each applied child at the version its
/// apply answered with.
fn watch_the_writes(w: &mut quiver_operator::reconcile::Writers, log: &Log) {
    for (method, path, answer) in log.lock().unwrap().iter() {
        if *method != Method::PATCH {
            continue;
        }
        let e = Event::Apply(answer.clone());
        match path.as_str() {
            SA => event(&mut w.service_accounts, e),
            ROLE => event(&mut w.roles, e),
            BINDING => event(&mut w.role_bindings, e),
            CM => event(&mut w.config_maps, e),
            DEPLOY => event(&mut w.deployments, e),
            SVC => event(&mut w.services, e),
            _ => {}
        }
    }
}

#[tokio::test]
async fn an_unchanged_mcpserver_is_not_applied_again_and_every_change_is() {
    let (owned, mut feeds) = current_stores(None);
    let (ctx, api) = with_stores(owned);
    let (log, server) = versioning(api, |_| None);
    let spec = json!({"tools": add()});

    // The first reconcile of this operator applies every child (it has no record of them),
    // and asks for nothing: the stores answer who owns each child, and that no optional one
    // is left to delete (no GET of an HPA, PDB, NetworkPolicy, Ingress, ServiceMonitor or
    // HTTPRoute).
    reconcile(mcp_with(spec.clone(), None), ctx.clone())
        .await
        .unwrap();
    let status = log
        .lock()
        .unwrap()
        .iter()
        .find(|(_, p, _)| p == STATUS)
        .unwrap()
        .2["status"]
        .clone();
    watch_the_writes(&mut feeds, &log);
    let patches = |paths: &[&str]| paths.iter().map(|p| format!("PATCH {p}")).collect::<Vec<_>>();
    assert_eq!(
        requests(&log),
        patches(&[SA, ROLE, BINDING, CM, DEPLOY, SVC, STATUS])
    );

    // (a) The same McpServer again (its resync): nothing changed, nothing is sent.
    let settled = || mcp_with(spec.clone(), Some(status.clone()));
    reconcile(settled(), ctx.clone()).await.unwrap();
    assert_eq!(requests(&log), Vec::<String>::new());

    // (b) The Deployment written by someone else (a new version in its store): re-applied,
    // and only it.
    event(
        &mut feeds.deployments,
        Event::Apply(ours_at("Deployment", "calc", "500")),
    );
    reconcile(settled(), ctx.clone()).await.unwrap();
    watch_the_writes(&mut feeds, &log);
    assert_eq!(requests(&log), patches(&[DEPLOY]));

    // (c) The ConfigMap deleted: gone from its store, so its owner is asked and it is made
    // again.
    event(
        &mut feeds.config_maps,
        Event::Delete(ours_at("ConfigMap", "calc-tools", "102")),
    );
    reconcile(settled(), ctx.clone()).await.unwrap();
    watch_the_writes(&mut feeds, &log);
    assert_eq!(requests(&log), [format!("GET {CM}"), format!("PATCH {CM}")]);
    reconcile(settled(), ctx.clone()).await.unwrap();
    assert_eq!(requests(&log), Vec::<String>::new(), "settled again");

    // (d) A spec change: what it changes is applied (a tools change is the ConfigMap only),
    // and the status says so.
    let two = json!({"tools": [
        {"name": "add", "handler": {"builtin": "add"}},
        {"name": "greet", "handler": {"template": "hi"}},
    ]});
    reconcile(mcp_with(two, Some(status.clone())), ctx.clone())
        .await
        .unwrap();
    assert_eq!(requests(&log), patches(&[CM, STATUS]));

    // An invalid spec leaves the children alone and drops their records.
    assert_eq!(ctx.memo.len(), 1);
    let invalid = json!({"tools": [{"name": "add", "handler": {"builtin": "nope"}}]});
    reconcile(mcp_with(invalid, Some(status.clone())), ctx.clone())
        .await
        .unwrap();
    assert!(ctx.memo.is_empty());
    assert!(
        !requests(&log)
            .iter()
            .any(|r| r.starts_with("PATCH") && r != &format!("PATCH {STATUS}")),
        "no child written"
    );

    drop(ctx);
    server.await.unwrap();
}

#[tokio::test]
async fn a_child_turned_off_is_looked_up_only_when_its_store_shows_it_or_is_not_current() {
    let hpa = ours_at("HorizontalPodAutoscaler", "calc", "3");
    let (owned, mut feeds) = current_stores(Some(hpa.clone()));
    let (ctx, api) = with_stores(owned);
    let found = hpa.clone();
    let (log, server) = versioning(api, move |path| (path == HPA).then(|| found.clone()));
    let spec = json!({"tools": add()});
    let others = [PDB, NP, ING, SM, ROUTE];
    let looked_up = |r: &Vec<String>, path: &str| r.contains(&format!("GET {path}"));

    // The store shows this McpServer's HPA, no longer wanted: it is deleted (read first, to
    // delete exactly what was read). The other kinds' stores show none: no request.
    reconcile(mcp_with(spec.clone(), None), ctx.clone())
        .await
        .unwrap();
    let r = requests(&log);
    assert!(
        looked_up(&r, HPA) && r.contains(&format!("DELETE {HPA}")),
        "{r:?}"
    );
    assert!(!others.iter().any(|p| r.iter().any(|x| x.ends_with(p))), "{r:?}");

    // The HPA watch failed (events may have been missed): until it lists again, one GET
    // decides, as without a store.
    feeds
        .autoscalers
        .observe(&Err(kube::runtime::watcher::Error::WatchFailed(
            kube::Error::Api(Box::new(kube::core::Status {
                code: 500,
                ..kube::core::Status::default()
            })),
        )));
    event(&mut feeds.autoscalers, Event::Delete(hpa));
    reconcile(mcp_with(spec.clone(), None), ctx.clone())
        .await
        .unwrap();
    assert!(looked_up(&requests(&log), HPA));
    listed(&mut feeds.autoscalers, vec![]);
    reconcile(mcp_with(spec.clone(), None), ctx.clone())
        .await
        .unwrap();
    assert!(!looked_up(&requests(&log), HPA), "listed again: none left");

    // The HTTPRoute CRD counted as absent until the operator writes one: then it is served,
    // and once turned off, the route is looked up until its watch lists the kind.
    let routed = json!({"tools": add(), "httpRoute": {"parentRefs": [{"name": "gw"}]}});
    reconcile(mcp_with(routed, None), ctx.clone()).await.unwrap();
    assert!(requests(&log).contains(&format!("PATCH {ROUTE}")));
    reconcile(mcp_with(spec.clone(), None), ctx.clone())
        .await
        .unwrap();
    let r = requests(&log);
    assert!(looked_up(&r, ROUTE), "{r:?}");
    assert!(
        !looked_up(&r, SM),
        "the ServiceMonitor CRD is still absent: {r:?}"
    );

    drop(ctx);
    server.await.unwrap();
}
