//! The MCP port's service ([`Mcp`]): `POST /mcp` answered straight from hyper's request,
//! every other request handed to the router of [`super::app`] unchanged.
//!
//! A `tools/call` is one `POST /mcp`. Through the router it pays, besides the checks and the
//! dispatch it needs, for machinery an endpoint with one hot route does not:
//!
//! - the router: the path looked up in its route table, an empty path-parameter list stored
//!   in the request's extensions (the extensions map allocated for it), the method router;
//! - boxing: the request body boxed into axum's `Body`; the route's, the handler's and the
//!   draining layer's futures each boxed;
//! - the per-request clones of the router and of the state (once per layer and extractor).
//!
//! What stays is what the route does, in its order, through the same functions:
//! [`Caller::check`] (Origin, Host, credentials, the version header), then
//! [`post::post`] (body cap and deadline, content headers, version, session or mirrored
//! headers, the in-flight gate, dispatch, the answer), then `Connection: close` while the
//! server drains ([`close_if_draining`]).

use std::sync::Arc;

use axum::body::{Bytes, HttpBody};
use axum::http::{Method, Request};
use axum::response::Response;
use axum::{BoxError, Router};
use futures_util::future::Either;
use hyper::body::Incoming;

use super::caller::Caller;
use super::{HttpState, close_if_draining, post};
use crate::transport::listen::App;

/// The service of the MCP listener: [`app`](super::app)'s routes, with `POST /mcp` taken
/// off the router.
#[derive(Clone)]
pub struct Mcp {
    state: Arc<HttpState>,
    router: Router,
}

impl Mcp {
    /// The service for `state`, with [`app`](super::app) for every request but `POST /mcp`.
    pub fn new(state: Arc<HttpState>) -> Self {
        let router = super::app(state.clone());
        Self { state, router }
    }
}

/// Whether the router would send `req` to `post::post_mcp`: method POST, path exactly `/mcp`
/// (the query does not matter; `/mcp/` and percent-encoded forms are other paths to it too).
fn is_post_mcp<B>(req: &Request<B>) -> bool {
    req.method() == Method::POST && req.uri().path() == "/mcp"
}

async fn post_mcp<B>(state: Arc<HttpState>, req: Request<B>) -> Response
where
    B: HttpBody<Data = Bytes> + Send,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let mut resp = match Caller::check(&state, &parts.headers).await {
        Ok(caller) => post::post(&state, caller, &parts.headers, body).await,
        Err(refused) => refused,
    };
    close_if_draining(&state, &mut resp);
    resp
}

impl Mcp {
    /// The answer to `req`, whatever its body type (hyper's on a socket, axum's in tests).
    fn respond<B>(&self, req: Request<B>) -> impl Future<Output = Response> + Send + use<B>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        if is_post_mcp(&req) {
            // Boxed: dispatch's future is large, and hyper moves the service's future into
            // its connection state; unboxed, those moves copied tens of KB per request
            // (callgrind: more instructions than the router's boxes and clones cost).
            Either::Left(Box::pin(post_mcp(self.state.clone(), req)))
        } else {
            let routed = tower::ServiceExt::oneshot(self.router.clone(), req);
            Either::Right(async move {
                match routed.await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                }
            })
        }
    }
}

impl App for Mcp {
    fn answer(&self, req: Request<Incoming>) -> impl Future<Output = Response> + Send + use<> {
        self.respond(req)
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::header;
    use http_body_util::BodyExt;

    use super::*;

    #[test]
    fn only_post_to_exactly_mcp_takes_the_lean_path() {
        let req = |method: Method, uri: &str| Request::builder().method(method).uri(uri).body(()).unwrap();
        assert!(is_post_mcp(&req(Method::POST, "/mcp")));
        assert!(is_post_mcp(&req(Method::POST, "/mcp?x=1")));
        assert!(is_post_mcp(&req(Method::POST, "http://mcp.example/mcp")));
        for (method, uri) in [
            (Method::GET, "/mcp"),
            (Method::DELETE, "/mcp"),
            (Method::PUT, "/mcp"),
            (Method::POST, "/mcp/"),
            (Method::POST, "/%6Dcp"),
            (Method::POST, "/MCP"),
            (Method::POST, "/"),
            (Method::POST, "/.well-known/oauth-protected-resource"),
        ] {
            assert!(!is_post_mcp(&req(method.clone(), uri)), "{method} {uri}");
        }
    }

    fn state(auth: bool) -> Arc<HttpState> {
        super::super::test_state(auth, |o| {
            o.allowed_hosts = Some(vec!["mcp.example".into()]);
            o.max_body_bytes = 256;
        })
    }

    /// A request to `POST /mcp` that passes every check, with `edit` applied.
    fn request(
        method: &str,
        path: &str,
        body: &str,
        edit: impl Fn(&mut axum::http::HeaderMap),
    ) -> Request<Body> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::from(body.to_owned()))
            .unwrap();
        let h = req.headers_mut();
        h.insert(header::HOST, "mcp.example".parse().unwrap());
        h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
        h.insert(
            header::ACCEPT,
            "application/json, text/event-stream".parse().unwrap(),
        );
        h.insert(super::super::VERSION_HEADER, "2025-11-25".parse().unwrap());
        edit(h);
        req
    }

    /// Status, headers (sorted) and body of a response, and the length hyper would send as
    /// `Content-Length`. The router writes that header itself; without it (the lean path)
    /// hyper writes it from the body's exact size, so the header is checked and set aside.
    async fn seen(resp: Response) -> (u16, Vec<(String, Vec<u8>)>, Vec<u8>, Option<u64>) {
        let (mut parts, body) = resp.into_parts();
        let exact = body.size_hint().exact();
        if let Some(declared) = parts.headers.remove(header::CONTENT_LENGTH) {
            assert_eq!(Some(declared.to_str().unwrap().parse().unwrap()), exact);
        }
        let mut headers: Vec<_> = parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        headers.sort();
        let body = body.collect().await.unwrap().to_bytes().to_vec();
        (parts.status.as_u16(), headers, body, exact)
    }

    type Edit = fn(&mut axum::http::HeaderMap);

    /// Every refusal and answer of `POST /mcp` (and a request the router keeps) comes out of
    /// the lean path byte for byte as out of the router, on one shared state.
    #[tokio::test]
    async fn the_lean_path_answers_exactly_as_the_router() {
        let ping = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
        let call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"nope"}}"#;
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let big = format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"ping","pad":"{}"}}"#,
            "x".repeat(300)
        );
        // (method, path, body, edit, status; 0: not checked), the first four refused before
        // credentials are read (a 401 in the server that authenticates all others).
        let before_auth: Vec<(&str, &str, &str, Edit, u16)> = vec![
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(header::HOST, "evil.example".parse().unwrap())),
                403,
            ),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(header::HOST, "a:1@b".parse().unwrap())),
                400,
            ),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(header::ORIGIN, "http://evil.example".parse().unwrap())),
                403,
            ),
            ("DELETE", "/mcp", "", |_| {}, 0),
            ("POST", "/mcp/", ping, |_| {}, 404),
        ];
        let after_auth: Vec<(&str, &str, &str, Edit, u16)> = vec![
            ("POST", "/mcp", ping, |_| {}, 200),
            ("POST", "/mcp?q=1", call, |_| {}, 200),
            ("POST", "/mcp", note, |_| {}, 202),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.remove(header::CONTENT_TYPE)),
                415,
            ),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(header::ACCEPT, "text/html".parse().unwrap())),
                406,
            ),
            ("POST", "/mcp", &big, |_| {}, 413),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(header::CONTENT_LENGTH, "100000".parse().unwrap())),
                413,
            ),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(super::super::VERSION_HEADER, "1999-01-01".parse().unwrap())),
                400,
            ),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(super::super::SESSION_HEADER, "".parse().unwrap())),
                400,
            ),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(super::super::SESSION_HEADER, "made-up".parse().unwrap())),
                404,
            ),
            ("POST", "/mcp", "{", |_| {}, 400),
            (
                "POST",
                "/mcp",
                ping,
                |h| drop(h.insert(super::super::VERSION_HEADER, "2026-07-28".parse().unwrap())),
                400,
            ),
        ];
        for auth in [false, true] {
            for draining in [false, true] {
                let state = state(auth);
                if draining {
                    state.load.start_draining();
                }
                let (lean, router) = (Mcp::new(state.clone()), super::super::app(state));
                let cases = before_auth
                    .iter()
                    .map(|c| (c, c.4))
                    .chain(after_auth.iter().map(|c| (c, if auth { 401 } else { c.4 })));
                for ((method, path, body, edit, _), want) in cases {
                    let a = seen(lean.respond(request(method, path, body, edit)).await).await;
                    let b = tower::ServiceExt::oneshot(router.clone(), request(method, path, body, edit));
                    let b = seen(b.await.unwrap()).await;
                    let what = format!("{method} {path} {body:.20} auth {auth} draining {draining}");
                    assert_eq!(a, b, "{what}");
                    if want != 0 {
                        assert_eq!(a.0, want, "{what}: {}", String::from_utf8_lossy(&a.2));
                    }
                    let closes = a.1.iter().any(|(k, v)| k == "connection" && v == b"close");
                    if *path == "/mcp" && want != 413 {
                        assert_eq!(closes, draining, "{what}");
                    }
                }
            }
        }
    }
}
