//! Reconcile against a mocked API server (tower-test): the exact requests one reconcile
//! makes, in order, for a valid spec and for an invalid one.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, ResourceExt};
use quiver_operator::build::Defaults;
use quiver_operator::crd::McpServer;
use quiver_operator::metrics::Metrics;
use quiver_operator::reconcile::{Context, reconcile};
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
    };
    (Arc::new(ctx), ApiServerVerifier(handle))
}

fn mcp(tools: Value) -> Arc<McpServer> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "calc", "namespace": "ns", "uid": "u-1", "generation": 3},
            "spec": {"tools": tools},
        }))
        .unwrap(),
    )
}

#[tokio::test]
async fn a_valid_spec_applies_every_child_then_the_status() {
    let (ctx, mut api) = setup();
    let m = mcp(json!([{"name": "add", "handler": {"builtin": "add"}}]));
    let name = m.name_any();
    let server = tokio::spawn(async move {
        let base = "/api/v1/namespaces/ns";
        let cm = api
            .expect(Method::PATCH, &format!("{base}/configmaps/calc-tools"), echo)
            .await;
        assert!(
            cm["data"]["tools.yaml"]
                .as_str()
                .unwrap()
                .contains("builtin: add")
        );
        api.expect(Method::PATCH, &format!("{base}/serviceaccounts/calc"), echo)
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
        let d = api
            .expect(Method::PATCH, "/apis/apps/v1/namespaces/ns/deployments/calc", |mut b| {
                b["metadata"]["generation"] = json!(1);
                b["status"] = json!({"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1});
                (StatusCode::OK, b)
            })
            .await;
        assert_eq!(d["metadata"]["ownerReferences"][0]["uid"], "u-1");
        api.expect(Method::PATCH, &format!("{base}/services/calc"), echo)
            .await;
        api.expect(
            Method::DELETE,
            "/apis/autoscaling/v2/namespaces/ns/horizontalpodautoscalers/calc",
            |_| not_found(),
        )
        .await;
        api.expect(
            Method::DELETE,
            "/apis/policy/v1/namespaces/ns/poddisruptionbudgets/calc",
            |_| not_found(),
        )
        .await;
        api.expect(
            Method::PATCH,
            "/apis/quiver.dev/v1alpha1/namespaces/ns/mcpservers/calc/status",
            patched,
        )
        .await
    });
    let action = reconcile(m, ctx).await.unwrap();
    let status = server.await.unwrap()["status"].clone();
    assert_eq!(status["toolCount"], 1);
    assert_eq!(status["observedGeneration"], 3);
    assert_eq!(status["replicasSummary"], "1/1");
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "True");
    assert!(
        format!("{action:?}").contains("300"),
        "a settled object is re-checked every 5 minutes: {action:?} ({name})"
    );
}

#[tokio::test]
async fn an_invalid_spec_writes_a_condition_and_an_event_and_touches_no_child() {
    let (ctx, mut api) = setup();
    let m = mcp(json!([{"name": "add", "handler": {"builtin": "nope"}}]));
    let server = tokio::spawn(async move {
        let status = api
            .expect(
                Method::PATCH,
                "/apis/quiver.dev/v1alpha1/namespaces/ns/mcpservers/calc/status",
                patched,
            )
            .await;
        let event = api
            .expect(Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events", echo)
            .await;
        (status, event)
    });
    let action = reconcile(m, ctx).await.unwrap();
    let (status, event) = server.await.unwrap();
    let valid = status["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ConfigValid")
        .unwrap()
        .clone();
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
    assert!(
        format!("{action:?}").contains("None"),
        "waits for a change: {action:?}"
    );
}
