//! `kubectl quiver revoke` against a mocked API server (tower-test): the requests it makes,
//! the pods it asks (owned and ready only), what each answer becomes, and its values checked
//! before anything is sent.

use std::sync::{Arc, Mutex};

use http::{Method, Request as HttpRequest, Response};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock;

use super::*;

const SUBJECT: &str = "https://login.example.com/realms/corp|auth0|42";
/// The subject as the query carries it.
const ENCODED: &str = "https%3A%2F%2Flogin.example.com%2Frealms%2Fcorp%7Cauth0%7C42";

/// An answer of the fake API server: status, content type, body.
type Answer = (u16, &'static str, String);

fn json_answer(v: &Value) -> Answer {
    (200, "application/json", v.to_string())
}

fn mcp_server(sign_in: Option<Value>) -> Value {
    let mut spec =
        json!({"auth": {"oidc": {"issuer": "https://login.example.com/realms/corp", "audience": "quiver"}}});
    if let Some(s) = sign_in {
        spec["auth"]["upstreamSignIn"] = s;
    }
    json!({"apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
        "metadata": {"name": "github", "namespace": "ns", "uid": "mcp-uid"}, "spec": spec})
}

fn sign_in(redis: bool) -> Value {
    let mut s = json!({"url": "https://mcp.example.com",
        "keysSecretRef": {"name": "keys", "key": "ring"},
        "browserClient": {"clientId": "quiver-browser", "clientSecretRef": {"name": "browser", "key": "secret"}}});
    if redis {
        s["redis"] = json!({"address": "redis.infra:6379"});
    }
    s
}

fn controller(api_version: &str, kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": true}])
}

fn pod(name: &str, ready: bool, owners: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "ns", "ownerReferences": owners},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

/// The McpServer's objects: its Deployment and ReplicaSet, two ready pods (`a`, `b`), one
/// not ready (`c`), and a ready lookalike with the same labels and no owner.
fn objects(path: &str, mcp: &Value) -> Option<Answer> {
    let rs = controller("apps/v1", "ReplicaSet", "github-5d8f", "rs-uid");
    Some(json_answer(&match path {
        "/apis/quiver.dev/v1alpha1/namespaces/ns/mcpservers/github" => mcp.clone(),
        "/apis/apps/v1/namespaces/ns/deployments/github" => json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {"name": "github", "uid": "dep-uid",
                "ownerReferences": controller("quiver.dev/v1alpha1", "McpServer", "github", "mcp-uid")}}),
        "/apis/apps/v1/namespaces/ns/replicasets" => json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": {},
            "items": [{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": "github-5d8f", "uid": "rs-uid",
                    "ownerReferences": controller("apps/v1", "Deployment", "github", "dep-uid")}}]}),
        "/api/v1/namespaces/ns/pods" => json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
            "items": [pod("github-0-lookalike", true, json!([])), pod("github-5d8f-a", true, rs.clone()),
                pod("github-5d8f-b", true, rs.clone()), pod("github-5d8f-c", false, rs)]}),
        _ => return None,
    }))
}

/// Runs `revoke` against a fake API server serving the McpServer `mcp` and its objects, the
/// pods' proxied DELETEs answered by `pods` (by pod name). The outcome, and every request
/// (`METHOD URI`).
async fn run(
    mcp: Value,
    request: Request,
    pods: impl Fn(&str) -> Answer + Send + 'static,
) -> (Result<Revocation, Failure>, Vec<String>) {
    let (svc, mut handle) = mock::pair::<HttpRequest<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let server = tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (method, uri) = (req.method().clone(), req.uri().clone());
            log.lock().unwrap().push(format!("{method} {uri}"));
            let prefix = "/api/v1/namespaces/ns/pods/";
            let (status, content_type, body) = match (method, objects(uri.path(), &mcp)) {
                (Method::GET, Some(a)) => a,
                (Method::DELETE, _) if uri.path().starts_with(prefix) => {
                    let pod = uri.path()[prefix.len()..].split(':').next().unwrap().to_owned();
                    pods(&pod)
                }
                _ => (
                    404,
                    "application/json",
                    json!({"kind": "Status", "apiVersion": "v1", "code": 404, "message": "not found"})
                        .to_string(),
                ),
            };
            send.send_response(
                Response::builder()
                    .status(status)
                    .header("content-type", content_type)
                    .body(Body::from(body.into_bytes()))
                    .unwrap(),
            );
        }
    });
    let client = Client::new(svc, "ns");
    let outcome = revoke(&client, "ns", "github", request).await;
    drop(client);
    server.await.unwrap();
    let seen = seen.lock().unwrap().clone();
    (outcome, seen)
}

fn request(upstream: Option<&str>) -> Request {
    Request::new(SUBJECT, upstream).unwrap()
}

#[tokio::test]
async fn every_ready_owned_pod_is_asked_through_the_pod_proxy_and_reports_its_count() {
    let (r, seen) = run(mcp_server(Some(sign_in(false))), request(Some("github")), |pod| {
        json_answer(&json!({"removed": if pod == "github-5d8f-a" { 2 } else { 1 }}))
    })
    .await;
    let r = r.unwrap();
    let deletes: Vec<&String> = seen.iter().filter(|s| s.starts_with("DELETE")).collect();
    let want = |pod: &str| {
        format!(
            "DELETE /api/v1/namespaces/ns/pods/{pod}:9090/proxy/oauth/tokens?subject={ENCODED}&upstream=github"
        )
    };
    assert_eq!(
        deletes,
        [&want("github-5d8f-a"), &want("github-5d8f-b")],
        "{seen:?}"
    );
    // The lookalike and the pod that is not ready are never sent anything.
    assert!(
        !seen
            .iter()
            .any(|s| s.contains("lookalike") || s.contains("5d8f-c:")),
        "{seen:?}"
    );
    assert_eq!(
        r.pods,
        [
            ("github-5d8f-a".to_owned(), PodOutcome::Removed(2)),
            ("github-5d8f-b".to_owned(), PodOutcome::Removed(1)),
            ("github-5d8f-c".to_owned(), PodOutcome::NotAsked),
        ]
    );
    assert_eq!(r.removed(), 3);
    // In memory, the pod not asked may still hold the user's tokens.
    assert!(!r.complete());
    let text = as_text(&r);
    assert!(text.contains("github-5d8f-a  2\n"), "{text}");
    assert!(
        text.contains("github-5d8f-c  not ready: not asked; tokens it keeps in memory stay"),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "3 upstream token(s) of {SUBJECT} removed from McpServer ns/github (upstream github); INCOMPLETE: run it again\n"
        )),
        "{text}"
    );
    let j = as_json(&r);
    assert_eq!(
        (&j["removed"], &j["complete"], &j["pods"][2]),
        (
            &json!(3),
            &json!(false),
            &json!({"name": "github-5d8f-c", "asked": false, "ready": false})
        )
    );
}

#[tokio::test]
async fn with_redis_one_pods_answer_covers_those_not_asked() {
    let (r, seen) = run(mcp_server(Some(sign_in(true))), request(None), |pod| {
        json_answer(&json!({"removed": if pod == "github-5d8f-a" { 4 } else { 0 }}))
    })
    .await;
    let r = r.unwrap();
    assert!(r.complete() && r.shared, "{r:?}");
    assert_eq!(r.removed(), 4);
    // No upstream: every upstream the user signed in to.
    assert!(
        seen.iter()
            .any(|s| s.ends_with(&format!("/proxy/oauth/tokens?subject={ENCODED}"))),
        "{seen:?}"
    );
    let text = as_text(&r);
    assert!(
        text.contains("(every upstream)\n") && !text.contains("INCOMPLETE"),
        "{text}"
    );
}

#[tokio::test]
async fn a_pod_that_does_not_confirm_is_reported_and_leaves_it_incomplete() {
    let evil = "x\nFORGED\u{1b}[31m\u{202e}";
    for (answer, want) in [
        (
            (503, "application/json", json!({"kind": "Status", "apiVersion": "v1", "code": 503, "message": "error trying to reach service: dial tcp 10.0.0.9:9090: connect: connection refused"}).to_string()),
            "the API server's pod proxy answered 503: error trying to reach service",
        ),
        ((404, "text/plain", "Not Found".to_owned()), "its admin port does not serve DELETE /oauth/tokens (404)"),
        ((200, "application/json", json!({"removed": "all"}).to_string()), "answered 200 without a count of removed tokens"),
        ((500, "text/plain", format!("{evil}{}", "y".repeat(5000))), "answered 500: x\nFORGED"),
    ] {
        let a = answer.clone();
        let (r, _) = run(mcp_server(Some(sign_in(true))), request(None), move |pod| {
            if pod == "github-5d8f-b" { a.clone() } else { json_answer(&json!({"removed": 1})) }
        })
        .await;
        let r = r.unwrap();
        let PodOutcome::Failed(e) = &r.pods[1].1 else {
            panic!("{r:?}")
        };
        assert!(e.starts_with(want), "{e}");
        assert!(e.chars().count() < 400, "a pod's answer is cut: {e}");
        assert!(!r.complete());
        // What a pod says cannot forge lines or escape sequences on the terminal.
        let printed = super::super::term::text(&as_text(&r)).into_owned();
        assert!(
            printed.lines().all(|l| !l.starts_with("FORGED")) && !printed.contains(['\u{1b}', '\u{202e}']),
            "{printed}"
        );
    }
}

#[tokio::test]
async fn an_mcpserver_without_sign_in_or_without_a_ready_pod_is_a_clear_error() {
    let (r, seen) = run(mcp_server(None), request(None), |_| {
        json_answer(&json!({"removed": 0}))
    })
    .await;
    assert_eq!(
        r.unwrap_err(),
        Failure::Usage(
            "McpServer ns/github has no spec.auth.upstreamSignIn: no user signs in to upstreams through it"
                .into()
        )
    );
    assert_eq!(seen.len(), 1, "nothing asked but the McpServer: {seen:?}");

    // Its uid changed (deleted and made again): the pods are the old one's, none is ready.
    let mut other = mcp_server(Some(sign_in(false)));
    other["metadata"]["uid"] = json!("new-uid");
    let (r, seen) = run(other, request(None), |_| json_answer(&json!({"removed": 0}))).await;
    match r.unwrap_err() {
        Failure::Kube(m) => assert!(m.starts_with("no ready pod of McpServer ns/github"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!seen.iter().any(|s| s.starts_with("DELETE")), "{seen:?}");
}

#[test]
fn values_are_checked_before_anything_is_sent() {
    for (subject, upstream, want) in [
        ("alice", None, "--subject has no `|`"),
        (
            "corp|alice",
            None,
            "--subject does not start with the issuer's URL",
        ),
        (
            "https://login.example.com|",
            None,
            "--subject has nothing after `|`",
        ),
        (
            "https://login.example.com|al\nice",
            None,
            "--subject holds a control character",
        ),
        (
            &format!("https://login.example.com|{}", "a".repeat(MAX_SUBJECT_BYTES)),
            None,
            "--subject is over 2048 bytes",
        ),
        (
            SUBJECT,
            Some("GitHub"),
            "--upstream `GitHub` is not an upstream name",
        ),
        (SUBJECT, Some("-x"), "is not an upstream name"),
        (SUBJECT, Some("x-"), "is not an upstream name"),
        (SUBJECT, Some("a&b=c"), "is not an upstream name"),
    ] {
        match Request::new(subject, upstream) {
            Err(Failure::Usage(m)) => assert!(m.starts_with(want) || m.contains(want), "{m}"),
            other => panic!("{subject:?} {upstream:?}: {other:?}"),
        }
    }
    let r = Request::new("https://login.example.com/realms/corp|ü ñ&x=1#", Some("git-hub2")).unwrap();
    assert_eq!(
        r.path(),
        "/oauth/tokens?subject=https%3A%2F%2Flogin.example.com%2Frealms%2Fcorp%7C%C3%BC%20%C3%B1%26x%3D1%23&upstream=git-hub2"
    );
}
