//! Leader election against a mocked API server, on tokio's paused clock: the renew deadline
//! ends leadership before the lease could expire elsewhere (also when the API server hangs),
//! a taken lease ends it at once, a released lease is taken without waiting, a held one only
//! after it went unchanged for a lease duration, and a standby that reaches the API is Ready.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use quiver_operator::admin::Health;
use quiver_operator::leader::{LeaseLock, Lost, Timing};
use serde_json::{Value, json};
use tokio::time::Instant;
use tower_test::mock::{self, Handle};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/quiver-operator";

fn new_lock() -> (LeaseLock, ApiHandle) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(svc, "ns");
    (
        LeaseLock::new(client, "ns", "quiver-operator", "me", Timing::DEFAULT),
        handle,
    )
}

fn lease(holder: Option<&str>, rv: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "quiver-operator", "namespace": "ns", "resourceVersion": rv},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": "2020-01-01T00:00:00.000000Z", "leaseTransitions": 3},
    })
}

/// Answers requests with `answer(method, body)` until the client goes away; returns the
/// request bodies, in order.
async fn serve(
    mut api: ApiHandle,
    answer: impl Fn(&Method, &Value) -> Option<(StatusCode, Value)>,
) -> Vec<(Method, Value)> {
    let mut seen = Vec::new();
    while let Some((req, send)) = api.next_request().await {
        assert!(req.uri().path().starts_with(LEASE), "{}", req.uri());
        let method = req.method().clone();
        let bytes = req.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        seen.push((method.clone(), body.clone()));
        match answer(&method, &body) {
            Some((status, out)) => send.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            ),
            None => std::mem::forget(send), // never answered: a hung API server
        }
    }
    seen
}

fn error() -> (StatusCode, Value) {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "etcd down"}),
    )
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_stops_at_the_renew_deadline() {
    let (lock, api) = new_lock();
    let server = tokio::spawn(serve(api, |_, _| Some(error())));
    let start = Instant::now();
    assert_eq!(lock.hold().await, Lost::RenewDeadline);
    let held = start.elapsed();
    assert!(
        held >= Timing::DEFAULT.renew_deadline && held < Timing::DEFAULT.lease,
        "stops after the renew deadline, before the lease expires: {held:?}"
    );
    drop(lock);
    assert!(server.await.unwrap().len() >= 4, "retried every retry period");
}

#[tokio::test(start_paused = true)]
async fn a_hung_api_server_does_not_keep_a_leader_past_the_renew_deadline() {
    let (lock, api) = new_lock();
    let server = tokio::spawn(serve(api, |_, _| None));
    let start = Instant::now();
    assert_eq!(lock.hold().await, Lost::RenewDeadline);
    let held = start.elapsed();
    assert!(held < Timing::DEFAULT.lease, "{held:?}");
    drop(lock);
    server.abort();
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_by_another_ends_leadership_at_once() {
    let (lock, api) = new_lock();
    let server = tokio::spawn(serve(api, |_, _| {
        Some((StatusCode::OK, lease(Some("other"), "9")))
    }));
    let start = Instant::now();
    assert_eq!(lock.hold().await, Lost::Taken);
    assert_eq!(start.elapsed(), Timing::DEFAULT.retry);
    drop(lock);
    server.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_taken_at_once_and_a_held_one_after_a_lease_unchanged() {
    // Released (no holder): the first attempt takes it.
    let (lock, api) = new_lock();
    let server = tokio::spawn(serve(api, |m, body| {
        Some(match *m {
            Method::GET => (StatusCode::OK, lease(None, "5")),
            _ => (StatusCode::OK, body.clone()),
        })
    }));
    let health = Health::default();
    let start = Instant::now();
    lock.acquire(&health).await;
    assert_eq!(start.elapsed(), Duration::ZERO);
    drop(lock);
    let seen = server.await.unwrap();
    let (method, put) = seen.last().unwrap();
    assert_eq!(method, Method::PUT);
    assert_eq!(put["spec"]["holderIdentity"], "me");
    assert_eq!(put["spec"]["leaseTransitions"], 4);

    // Held by a silent replica whose record never changes: taken a lease duration after it
    // was first seen; meanwhile this standby is Ready (the API answers).
    let (lock, api) = new_lock();
    let server = tokio::spawn(serve(api, |m, body| {
        Some(match *m {
            Method::GET => (StatusCode::OK, lease(Some("other"), "7")),
            _ => (StatusCode::OK, body.clone()),
        })
    }));
    let health = std::sync::Arc::new(Health::default());
    let start = Instant::now();
    let standby = {
        let health = health.clone();
        tokio::spawn(async move {
            lock.acquire(&health).await;
            lock
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(health.ready(), "a standby that reaches the API server is Ready");
    let lock = standby.await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Timing::DEFAULT.lease && waited <= Timing::DEFAULT.lease + Timing::DEFAULT.retry,
        "{waited:?}"
    );
    drop(lock);
    server.await.unwrap();
}

#[tokio::test]
async fn release_clears_the_holder() {
    let (lock, api) = new_lock();
    let server = tokio::spawn(serve(api, |m, body| {
        Some(match *m {
            Method::GET => (StatusCode::OK, lease(Some("me"), "3")),
            _ => (StatusCode::OK, body.clone()),
        })
    }));
    lock.release().await.unwrap();
    drop(lock);
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 2);
    let (method, put) = &seen[1];
    assert_eq!(method, Method::PUT);
    assert!(
        put["spec"].get("holderIdentity").is_none_or(Value::is_null),
        "{put}"
    );
    assert_eq!(put["spec"]["leaseDurationSeconds"], 1);
}
