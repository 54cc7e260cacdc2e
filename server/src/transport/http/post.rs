//! `POST /mcp`: the body read against its cap and deadline, the content headers, version
//! and session checked, the request dispatched, and its outcome written as a response.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::caller::Caller;
use super::mirror::check_mirrored;
use super::reject::{Reject, http_error_close, json_response};
use super::session::{check_session, session_id};
use super::sse::{HeldPass, answer_call};
use super::subscription::listen_stream;
use super::{HttpState, SESSION_HEADER, VERSION_HEADER};
use crate::dispatch::{Ctx, Era, ErrorData, Opens, Outcome, Reply};
use crate::metrics::Refusal;
use crate::protocol;

enum BodyError {
    TooLarge,
    Timeout,
    Broken,
}

/// Reads the whole body within `deadline`, refusing more than `max` bytes.
async fn read_body<B>(body: B, max: usize, deadline: Duration) -> Result<Bytes, BodyError>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let mut collect = std::pin::pin!(Limited::new(body, max).collect());
    // Most bodies arrive with their request's head: read at once, they never arm the
    // deadline's timer (a timer-wheel entry registered and cancelled per request).
    let read = match futures_util::FutureExt::now_or_never(collect.as_mut()) {
        Some(read) => read,
        None => match tokio::time::timeout(deadline, collect).await {
            Err(_) => return Err(BodyError::Timeout),
            Ok(read) => read,
        },
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Broken),
    }
}

fn accepts(headers: &HeaderMap, wanted: &str) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let family = wanted.split('/').next().unwrap_or("");
    accept
        .split(',')
        .map(|part| part.split(';').next().unwrap_or("").trim())
        .any(|t| t == wanted || t == "*/*" || t.strip_suffix("/*") == Some(family))
}

/// The `UnsupportedProtocolVersionError` (-32022, with the supported list) for a request
/// whose `MCP-Protocol-Version` this server does not speak.
fn unsupported_version(headers: &HeaderMap, body: &[u8]) -> Response {
    let requested = headers
        .get(VERSION_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let mut out = Vec::with_capacity(192);
    crate::dispatch::stateless::unsupported(&requested).write(&mut out, protocol::peek_id(body));
    json_response(StatusCode::BAD_REQUEST, out)
}

/// The headers a POST must carry: JSON in, JSON accepted.
fn post_content(headers: &HeaderMap) -> Result<(), Reject> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
        });
    if !is_json {
        return Err(Reject(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json".to_owned(),
        ));
    }
    if !accepts(headers, "application/json") {
        return Err(Reject(
            StatusCode::NOT_ACCEPTABLE,
            "Accept must allow application/json".to_owned(),
        ));
    }
    Ok(())
}

pub(super) async fn post_mcp(State(state): State<Arc<HttpState>>, caller: Caller, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    post(&state, caller, &parts.headers, body).await
}

/// A `POST /mcp` whose caller passed its checks: the rest of the route, for the router's
/// handler above and for the lean path ([`super::lean`]), which hands it hyper's body as is.
pub(super) async fn post<B>(state: &Arc<HttpState>, caller: Caller, headers: &HeaderMap, body: B) -> Response
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let body = match post_body(state, headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (version, stateless, session) = match post_target(state, &caller, headers, &body) {
        Ok(t) => t,
        Err(r) => return *r,
    };
    let pass = state.load.inflight.try_enter();
    // When every slot is taken, notifications and answers to server requests still get in:
    // they need no slot of their own, and they free others (a cancel, the answer a waiting
    // sampling call needs).
    if pass.is_none() && !protocol::is_answer_or_notification(&body) {
        state.server.metrics.refused(Refusal::Inflight);
        return Reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "server overloaded, retry later".to_owned(),
        )
        .for_body(&body);
    }
    let ctx = Ctx {
        session,
        version,
        stream: true,
        era: if stateless {
            Era::Stateless(version)
        } else {
            Era::Handshake
        },
        caller: caller.principal(),
        opens: Opens::Minted,
        client: caller.client,
    };
    let handled = state.server.handle(&body, ctx, version == "2025-03-26");
    // Tracing off, the dispatch future is awaited where it is: handing it to the tracing
    // wrapper would move the whole future twice per request (two copies of it).
    let outcome = if crate::otel::enabled() {
        crate::otel::spans::under_headers(headers, handled).await
    } else {
        handled.await
    };
    match outcome {
        Outcome::Listen(listen) => {
            drop(pass);
            listen_stream(state, listen)
        }
        Outcome::Deferred(d) => {
            // The call holds its place in the in-flight gate until it ends, also when that is
            // after this handler returned (a streamed answer).
            // (Only requests are deferred, and requests always hold a pass; should that ever not
            // hold, the call runs without one rather than the process aborting.)
            let held = pass.map(|p| {
                std::mem::forget(p);
                HeldPass(state.load.clone())
            });
            // Answers in a session of the handshake era can be resumed (when enabled).
            let resume = state
                .resume
                .as_ref()
                .filter(|_| !stateless && !session.is_empty())
                .map(|r| (r, session));
            answer_call(*d, held, resume).await
        }
        Outcome::Accepted => StatusCode::ACCEPTED.into_response(),
        Outcome::Reply(r) => reply_response(state, r),
    }
}

/// A POST's body, read whole against the size cap and the body deadline. No in-flight place
/// is held while it arrives: a slow body costs a connection slot for at most the body
/// timeout, never dispatch capacity. It is read before the header checks so that their
/// errors can name the request's id.
async fn post_body<B>(state: &HttpState, headers: &HeaderMap, body: B) -> Result<Bytes, Response>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<axum::BoxError>,
{
    let max = state.options.max_body_bytes;
    let too_large = || {
        state.server.metrics.refused(Refusal::BodyBytes);
        http_error_close(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body exceeds {max} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match read_body(body, max, state.options.body_read_timeout).await {
        Ok(b) => Ok(b),
        Err(BodyError::TooLarge) => Err(too_large()),
        Err(BodyError::Timeout) => {
            state.server.metrics.refused(Refusal::BodyTimeout);
            Err(http_error_close(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the request body did not arrive within {} s",
                    state.options.body_read_timeout.as_secs_f64()
                ),
            ))
        }
        Err(BodyError::Broken) => Err(http_error_close(
            StatusCode::BAD_REQUEST,
            "the request body could not be read",
        )),
    }
}

/// What a POST is addressed to: its content headers checked, the revision it speaks
/// (whether stateless) and its session, which must be the caller's (2026-07-28 has none:
/// its `Mcp-Session-Id` is ignored, and its mirrored headers must match the body).
fn post_target<'h>(
    state: &HttpState,
    caller: &Caller,
    headers: &'h HeaderMap,
    body: &[u8],
) -> Result<(&'static str, bool, &'h str), Box<Response>> {
    post_content(headers).map_err(|r| Box::new(r.for_body(body)))?;
    let Ok((version, stateless)) = caller.version else {
        return Err(Box::new(unsupported_version(headers, body)));
    };
    let session = session_id(headers).map_err(|r| Box::new(r.for_body(body)))?;
    if stateless {
        check_mirrored(state, headers, body)?;
        return Ok((version, stateless, ""));
    }
    check_session(state, session, caller.principal()).map_err(|r| Box::new(r.for_body(body)))?;
    Ok((version, stateless, session))
}

/// An answer as an HTTP response: its status, the headers of its error's typed data (the
/// scope challenge of a forbidden call, the `Retry-After` of a rate-limited one), the id of
/// the session it opened.
fn reply_response(state: &HttpState, r: Reply) -> Response {
    let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::OK);
    let mut resp = json_response(status, r.body);
    match &r.error {
        Some(ErrorData::Forbidden(f)) => {
            if let Some(scopes) = f.scope_challenge().filter(|s| !s.is_empty())
                && let Some(auth) = &state.options.auth
            {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    auth.scope_challenge(state.options.allowed_hosts.as_deref(), &scopes),
                );
            }
        }
        Some(ErrorData::RateLimited(l)) => {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(l.retry_after_secs()));
        }
        Some(ErrorData::Json(_)) | None => {}
    }
    if let Some(id) = r.session
        && let Ok(v) = HeaderValue::from_str(&id)
    {
        resp.headers_mut().insert(SESSION_HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use serde_json::value::RawValue;

    use super::*;
    use crate::config::governance::{Limit, Scope};
    use crate::dispatch::{Limiter, RpcError};
    use crate::spec::access::Denial;

    /// A transport that authenticates its clients (`auth`) or not.
    fn state(auth: bool) -> Arc<HttpState> {
        super::super::test_state(auth, |_| {})
    }

    /// The response to request 7 that `e` comes to with `status`, as dispatch answers it,
    /// checked byte for byte against the error written with `data` as JSON: the status, the
    /// named header's value (if any) and whether the response has any other header.
    async fn answered(
        state: &HttpState,
        e: RpcError,
        status: u16,
        data: serde_json::Value,
        header: header::HeaderName,
    ) -> Option<String> {
        let id = RawValue::from_string("7".into()).unwrap();
        let mut want = Vec::new();
        protocol::write_error(&mut want, Some(&id), e.code, &e.message, Some(&data));
        let resp = reply_response(state, Reply::failed(e, Some(&id), status, Vec::new()));
        assert_eq!(resp.status().as_u16(), status);
        let (parts, body) = resp.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&body), String::from_utf8_lossy(&want));
        let others: Vec<_> = parts
            .headers
            .keys()
            .filter(|k| **k != header && **k != header::CONTENT_TYPE)
            .collect();
        assert!(others.is_empty(), "{others:?}");
        parts.headers.get(&header).map(|v| v.to_str().unwrap().to_owned())
    }

    #[tokio::test]
    async fn a_call_a_limit_refused_says_when_to_retry_in_its_data_and_retry_after() {
        let limit = Arc::new(Limit {
            scope: Scope::Tool,
            name: "deploy".into(),
            at: "tools[0].limits[0]".into(),
            rate: None,
            concurrency: Some(1),
            per_caller: true,
            shared: false,
        });
        let e = RpcError::rate_limited(
            "limited",
            59_001,
            Limiter::Limit {
                limit,
                kind: "concurrency",
            },
        );
        let data = json!({
            "retryAfterMs": 59_001,
            "retryAfter": 60,
            "limit": {"scope": "tool", "name": "deploy", "kind": "concurrency", "perCaller": true},
        });
        let got = answered(&state(false), e, 429, data, header::RETRY_AFTER).await;
        assert_eq!(got.as_deref(), Some("60"));
    }

    #[tokio::test]
    async fn a_task_request_over_budget_says_when_to_retry() {
        let e = RpcError::rate_limited("limited", 1, Limiter::TaskRequests);
        let data = json!({"retryAfterMs": 1, "retryAfter": 1});
        let got = answered(&state(false), e, 429, data, header::RETRY_AFTER).await;
        assert_eq!(got.as_deref(), Some("1"));
    }

    #[tokio::test]
    async fn a_call_refused_for_a_full_audit_queue_says_so_and_when_to_retry() {
        let e = RpcError::rate_limited("full", 2500, Limiter::AuditQueue);
        let data = json!({"retryAfterMs": 2500, "retryAfter": 3, "audit": "queue_full"});
        let got = answered(&state(false), e, 429, data, header::RETRY_AFTER).await;
        assert_eq!(got.as_deref(), Some("3"));
    }

    #[tokio::test]
    async fn a_forbidden_call_challenges_for_scopes_only_when_scopes_would_help() {
        let denial = |missing: &[&str], groups: Option<&[&str]>| Denial {
            missing_scopes: missing.iter().map(|&s| s.into()).collect(),
            required_scopes: vec!["read".into(), "deploy:write".into()],
            not_in_groups: groups.map(|g| g.iter().map(|&s| s.into()).collect()),
            anonymous: false,
        };
        let data = |missing: &[&str], groups: Option<&[&str]>| {
            json!({
                "tool": "deploy",
                "missingScopes": missing,
                "requiredScopes": ["read", "deploy:write"],
                "allowedGroups": groups,
            })
        };
        let auth = state(true);
        let cases = [
            // A missing scope: the challenge asks for every scope the tool requires.
            (&auth, &["deploy:write"][..], None, true),
            // Only the groups are wrong: no scope would help.
            (&auth, &[][..], Some(&["ops"][..]), false),
            // A server that does not authenticate its clients has no challenge to make.
            (&state(false), &["deploy:write"][..], None, false),
        ];
        for (state, missing, groups, challenged) in cases {
            let e = RpcError::forbidden("no", "deploy", denial(missing, groups));
            let got = answered(state, e, 403, data(missing, groups), header::WWW_AUTHENTICATE).await;
            let want = challenged
                .then_some("Bearer realm=\"mcp\", error=\"insufficient_scope\", scope=\"read deploy:write\"");
            assert_eq!(got.as_deref(), want, "{missing:?} {groups:?}");
        }
    }

    /// Data only the client reads (a policy's refusal, say) adds no header.
    #[tokio::test]
    async fn json_data_adds_no_header() {
        let data = json!({"tool": "deploy", "policy": "weekdays"});
        let e = RpcError::new(protocol::FORBIDDEN, "no").with_data(data.clone());
        let got = answered(&state(true), e, 403, data, header::WWW_AUTHENTICATE).await;
        assert_eq!(got, None);
    }
}
