//! Callers without credentials, end to end through the router: each is counted by its
//! network address (its task bound, its per-caller limits, the pace of its task requests),
//! however many sessions it opens; together they hold at most their own pool of tasks, so
//! that authenticated callers always find places.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::*;
use crate::limits::ClientAddr;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::Reloader;
use crate::spec::access::Principal;

const CONFIG: &str = r#"
tools:
  - {name: job, task: required, handler: {exec: {command: [/bin/echo, job]}}}
  - {name: hello, limits: [{rate: 1/m}], handler: {template: "hi"}}
"#;

fn served(bounds: TaskBounds) -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let server = Server::builder(Registry::new(&metrics), metrics)
        .limits(Limits::default())
        .tasks(bounds, None)
        .build();
    Reloader::new(server.clone())
        .apply(&[("t.yaml".into(), CONFIG.into())])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

fn bounds(per_caller: usize, total: usize, anonymous: usize) -> TaskBounds {
    TaskBounds {
        per_caller,
        total,
        anonymous,
        ..TaskBounds::default()
    }
}

fn addr(ip: &str) -> Option<ClientAddr> {
    Some(ClientAddr::of(
        ip.parse::<IpAddr>().unwrap_or_else(|e| panic!("{ip}: {e}")),
    ))
}

/// A 2026-07-28 request (no session, no credentials) from `ip`.
fn stateless(ip: &str) -> Ctx<'static> {
    Ctx {
        session: "",
        version: "2026-07-28",
        stream: false,
        era: Era::Stateless("2026-07-28"),
        caller: None,
        opens: Opens::Minted,
        client: addr(ip),
    }
}

/// A 2025-11-25 request in `session` (no credentials) from `ip`.
fn in_session(session: &'static str, ip: &str) -> Ctx<'static> {
    Ctx {
        session,
        version: "2025-11-25",
        stream: false,
        era: Era::Handshake,
        caller: None,
        opens: Opens::Given,
        client: addr(ip),
    }
}

fn principal(subject: &str) -> Principal {
    let mut p = Principal::new(std::iter::empty(), std::iter::empty());
    p.subject = subject.into();
    p
}

/// A 2025-11-25 request in `session` of the authenticated `caller`.
fn authenticated<'a>(caller: &'a Principal, session: &'a str) -> Ctx<'a> {
    Ctx {
        session,
        version: "2025-11-25",
        stream: false,
        era: Era::Handshake,
        caller: Some(caller),
        opens: Opens::Given,
        client: None,
    }
}

async fn rpc(s: &Arc<Server>, ctx: Ctx<'_>, method: &str, mut params: Value) -> Value {
    if ctx.session.is_empty() && ctx.era != Era::Handshake {
        params["_meta"] = json!({
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
        });
    }
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}).to_string();
    match s.handle(body.as_bytes(), ctx, false).await {
        Outcome::Reply(r) => serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("{e}")),
        other => panic!("{method}: {other:?}"),
    }
}

/// Asks for a task of `job`: its id, or the refusal's message.
async fn task(s: &Arc<Server>, ctx: Ctx<'_>) -> Result<String, String> {
    let v = rpc(
        s,
        ctx,
        "tools/call",
        json!({"name": "job", "arguments": {}, "task": {}}),
    )
    .await;
    let id = v["result"]["taskId"]
        .as_str()
        .or_else(|| v["result"]["task"]["taskId"].as_str());
    match id {
        Some(id) => Ok(id.to_owned()),
        None => {
            assert_eq!(v["error"]["code"], -32004, "{v}");
            Err(v["error"]["message"].as_str().unwrap_or_default().to_owned())
        }
    }
}

#[tokio::test]
async fn a_sessionless_anonymous_caller_filling_its_bound_leaves_others_theirs() {
    let s = served(bounds(2, 100, 50));
    let a = stateless("198.51.100.1");
    task(&s, a).await.unwrap();
    task(&s, a).await.unwrap();
    let refused = task(&s, a).await.unwrap_err();
    assert!(refused.contains("a caller may hold 2"), "{refused}");
    // Another address: its own bound, untouched by the first caller's.
    let b = stateless("198.51.100.2");
    task(&s, b).await.unwrap();
    task(&s, b).await.unwrap();
    assert!(task(&s, b).await.is_err());
}

#[tokio::test]
async fn an_anonymous_caller_cannot_escape_its_bound_with_sessions_or_neighbouring_addresses() {
    let s = served(bounds(2, 100, 50));
    task(&s, stateless("2001:db8:1:2::10")).await.unwrap();
    task(&s, in_session("session-one", "2001:db8:1:2::10"))
        .await
        .unwrap();
    // Opening more sessions, or moving to another address of the same /64, gains nothing;
    // nor does an IPv4 client seen on an IPv6 socket.
    for ctx in [
        in_session("session-two", "2001:db8:1:2::10"),
        in_session("session-three", "2001:db8:1:2::10"),
        stateless("2001:db8:1:2::ffff"),
        stateless("2001:db8:1:2:8000::1"),
    ] {
        let refused = task(&s, ctx).await.unwrap_err();
        assert!(refused.contains("a caller may hold 2"), "{refused}");
    }
    task(&s, stateless("192.0.2.1")).await.unwrap();
    task(&s, stateless("::ffff:192.0.2.1")).await.unwrap();
    assert!(task(&s, in_session("session-four", "192.0.2.1")).await.is_err());
    // Another /64 is another caller.
    task(&s, stateless("2001:db8:1:3::10")).await.unwrap();
}

#[tokio::test]
async fn anonymous_floods_leave_authenticated_callers_their_tasks() {
    let s = served(bounds(2, 10, 4));
    let sessions: Vec<String> = (0..8).map(|i| format!("flood-{i}")).collect();
    let mut created = 0;
    let mut pooled = 0;
    for (i, session) in sessions.iter().enumerate() {
        let ctx = Ctx {
            session,
            ..in_session("", &format!("203.0.113.{i}"))
        };
        for _ in 0..2 {
            match task(&s, ctx).await {
                Ok(_) => created += 1,
                Err(why) => {
                    assert!(why.contains("without credentials"), "{why}");
                    pooled += 1;
                }
            }
        }
    }
    assert_eq!((created, pooled), (4, 12));
    // Authenticated callers still find their places, each its own bound.
    let (alice, bob) = (principal("alice"), principal("bob"));
    for p in [&alice, &bob] {
        task(&s, authenticated(p, "")).await.unwrap();
        task(&s, authenticated(p, "")).await.unwrap();
        let refused = task(&s, authenticated(p, "")).await.unwrap_err();
        assert!(refused.contains("a caller may hold 2"), "{refused}");
    }
}

#[tokio::test]
async fn per_caller_limits_count_an_anonymous_caller_by_its_address() {
    let s = served(TaskBounds::default());
    let call = |ctx| {
        let s = s.clone();
        async move {
            let v = rpc(&s, ctx, "tools/call", json!({"name": "hello", "arguments": {}})).await;
            v["error"]["code"].as_i64().unwrap_or(0)
        }
    };
    assert_eq!(call(stateless("198.51.100.7")).await, 0);
    assert_eq!(call(stateless("198.51.100.7")).await, -32004);
    // A session of its own does not give the same address another budget.
    assert_eq!(call(in_session("fresh", "198.51.100.7")).await, -32004);
    // Another address, and an authenticated caller, have theirs.
    assert_eq!(call(stateless("198.51.100.8")).await, 0);
    let alice = principal("alice");
    assert_eq!(call(authenticated(&alice, "")).await, 0);
    assert_eq!(call(authenticated(&alice, "")).await, -32004);
}

#[tokio::test]
async fn task_requests_of_sessionless_anonymous_callers_are_paced_per_address() {
    let s = served(TaskBounds::default());
    let get = |ctx| {
        let s = s.clone();
        async move {
            let v = rpc(&s, ctx, "tasks/get", json!({"taskId": "0".repeat(32)})).await;
            v["error"]["code"].as_i64().unwrap_or(0)
        }
    };
    let a = stateless("198.51.100.9");
    // The burst is answered (an unknown task); sooner or later the caller is told to slow
    // down (the budget refills at 20 a second: a caller this fast outruns it).
    let mut answered = 0;
    loop {
        match get(a).await {
            -32602 => answered += 1,
            -32004 => break,
            other => panic!("{other}"),
        }
        assert!(answered < 10_000, "never paced");
    }
    assert!(answered >= super::tasks::polls::BURST as usize, "{answered}");
    // Another address is not held back.
    assert_eq!(get(stateless("198.51.100.10")).await, -32602);
}
