//! What the flow sends and reads: URLs checked before use, form encoding, the redirect's
//! query, and bounded, timed exchanges through the server's shared HTTP client.

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};

use super::{Error, Flow, MAX_ANSWER_BYTES, MAX_URL, Result};
use crate::net::http::{Guard, USER_AGENT, error_chain, redacted};

/// Longest redirect query read.
const MAX_QUERY: usize = 16 << 10;
/// Most parameters in a redirect query.
const MAX_PARAMS: usize = 32;

/// An absolute `http(s)` URL without fragment or user information, at most [`MAX_URL`].
pub(crate) fn parse_url(s: &str) -> Result<Uri, String> {
    if s.is_empty() || s.len() > MAX_URL {
        return Err(format!("a URL of 1 to {MAX_URL} bytes is needed"));
    }
    if s.bytes().any(|b| b.is_ascii_control() || b == b' ' || b == b'#') {
        return Err("a URL must not hold spaces, control characters or a fragment".into());
    }
    let uri: Uri = s.parse().map_err(|_| "not a URL".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("not an http(s) URL".into());
    }
    match uri.authority() {
        Some(a) if a.as_str().contains('@') => Err("a URL must not hold user information".into()),
        Some(a) if !a.host().is_empty() => Ok(uri),
        _ => Err("a URL needs a host".into()),
    }
}

/// Whether `u` names this host by a loopback address or `localhost`.
pub(crate) fn is_loopback(u: &Uri) -> bool {
    let host = u.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// `scheme://authority` in lower case.
pub(super) fn origin(u: &Uri) -> String {
    format!(
        "{}://{}",
        u.scheme_str().unwrap_or_default(),
        u.authority().map(|a| a.as_str()).unwrap_or_default()
    )
    .to_ascii_lowercase()
}

/// A URL as resources are compared: scheme and host in lower case, a bare `/` path dropped.
pub(crate) fn canonical(u: &Uri) -> String {
    let path = match u.path() {
        "/" => "",
        p => p,
    };
    match u.query() {
        Some(q) => format!("{}{path}?{q}", origin(u)),
        None => format!("{}{path}", origin(u)),
    }
}

/// The well-known URL `name` of `u` with its path (and query) after the suffix (RFC 8414
/// section 3.1, RFC 9728 section 3.1); with `appended`, the path before it (OpenID
/// discovery's own form).
pub(super) fn well_known(u: &Uri, name: &str, appended: bool) -> String {
    let path = u.path().trim_end_matches('/');
    let query = u.query().map(|q| format!("?{q}")).unwrap_or_default();
    if appended {
        format!("{}{path}/.well-known/{name}{query}", origin(u))
    } else {
        format!("{}/.well-known/{name}{path}{query}", origin(u))
    }
}

/// Whether `u` may carry what the flow sends: `https`, or `http` when `plain_ok`.
pub(super) fn scheme_ok(u: &Uri, plain_ok: bool) -> bool {
    u.scheme_str() == Some("https") || (plain_ok && u.scheme_str() == Some("http"))
}

/// `application/x-www-form-urlencoded` pairs.
pub(super) fn form(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        out.push_str(&crate::template::percent_encode(k));
        out.push('=');
        out.push_str(&crate::template::percent_encode(v));
    }
    out
}

/// One `application/x-www-form-urlencoded` component decoded (`+` is a space).
fn unform(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()))?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The parameters of a redirect's query, each name at most once (RFC 6749 section 3.1).
pub(crate) fn parse_query(query: &str) -> Result<Vec<(String, String)>, &'static str> {
    let query = query.strip_prefix('?').unwrap_or(query);
    if query.len() > MAX_QUERY {
        return Err("the query is too long");
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        if out.len() == MAX_PARAMS {
            return Err("the query has too many parameters");
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (
            unform(k).ok_or("the query is not well-formed")?,
            unform(v).ok_or("the query is not well-formed")?,
        );
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err("a parameter of the query repeats");
        }
        out.push((k, v));
    }
    Ok(out)
}

/// The error codes of OAuth (RFC 6749 sections 4.1.2.1 and 5.2) and OpenID Connect (Core
/// section 3.1.2.6) that an authorization server answers with.
const ERROR_CODES: [&str; 17] = [
    "invalid_request",
    "unauthorized_client",
    "access_denied",
    "unsupported_response_type",
    "invalid_scope",
    "server_error",
    "temporarily_unavailable",
    "invalid_client",
    "invalid_grant",
    "unsupported_grant_type",
    "interaction_required",
    "login_required",
    "account_selection_required",
    "consent_required",
    "invalid_request_uri",
    "invalid_request_object",
    "registration_not_supported",
];

/// `code` when it is one of the known OAuth and OpenID error codes, else a fixed phrase: what
/// a page shows of an error a redirect (anyone's link) or a server named. Nothing else of it
/// (never its `error_description`) is shown on this server's pages.
pub(crate) fn known_error(code: &str) -> &'static str {
    ERROR_CODES
        .into_iter()
        .find(|c| *c == code)
        .unwrap_or("an error code OAuth does not define")
}

/// What a server said in an OAuth error answer (`error`, `error_description`), or in the
/// redirect's parameters: cut short, with nothing of `known` (what Quiver sent) and no
/// credential-shaped word left in it. For logs and errors, not for pages ([`known_error`]).
pub(super) fn said(error: Option<&str>, description: Option<&str>, known: &[&str]) -> String {
    let known: Vec<&str> = known.iter().copied().filter(|k| !k.is_empty()).collect();
    // Redacted whole (the input is bounded), then cut: a value cut first would not match.
    let word = |s: &str| {
        let mut s = s.to_owned();
        crate::redact::replace_known(&mut s, &known);
        crate::redact::untrusted(&s, &[], super::MAX_DESCRIPTION)
    };
    match (error.map(word), description.map(word)) {
        (Some(e), Some(d)) => format!("{e}: {d}"),
        (Some(e), None) => e,
        _ => "no OAuth error in the answer".to_owned(),
    }
}

/// [`said`] of a JSON error answer.
pub(super) fn said_json(body: &[u8], known: &[&str]) -> String {
    let doc: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let get = |k: &str| doc.get(k).and_then(serde_json::Value::as_str);
    said(get("error"), get("error_description"), known)
}

/// A status and a body read whole (at most [`MAX_ANSWER_BYTES`]).
#[derive(Debug)]
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) body: Bytes,
}

impl Flow {
    /// How a call to `u` is guarded: a document chose it unless it is on an origin the
    /// configuration named (`trusted`), and then it goes only to public addresses.
    pub(super) fn guard(&self, u: &Uri, trusted: &[String]) -> Guard {
        let named = trusted.iter().any(|t| *t == origin(u));
        if self.cfg.guard_discovered && !named {
            Guard::ThirdParty
        } else {
            Guard::Off
        }
    }

    /// Sends `req` and reads the answer within the flow's timeout.
    ///
    /// # Errors
    /// [`Error::Discovery`]: a guarded call to a literal address it may not go to;
    /// [`Error::Unreachable`]: no answer in time, an unreadable or oversized one.
    pub(super) async fn exchange(&self, req: Request<Full<Bytes>>, guard: Guard) -> Result<Answer> {
        let shown = redacted(req.uri());
        // The connector does not resolve a literal address: the resolver's guard would not
        // see it.
        if let Err(why) = guard.literal(req.uri(), self.http.denied()) {
            return Err(Error::Discovery(format!(
                "{shown} is {why}: a server an upstream's metadata chose is not called there \
                 (name the authorization server in `identity.issuer` if it is meant to be there)"
            )));
        }
        let pool = self
            .http
            .client_for(None, &serde_json::Value::Null, guard)
            .map_err(Error::Unreachable)?;
        let work = async {
            let resp = pool
                .request(req)
                .await
                .map_err(|e| Error::Unreachable(format!("{shown}: {}", error_chain(&e))))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|_| {
                    Error::Unreachable(format!(
                        "{shown}: the answer is unreadable or larger than {MAX_ANSWER_BYTES} bytes"
                    ))
                })?
                .to_bytes();
            Ok(Answer { status, body })
        };
        let limit = self.cfg.timeout;
        tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
            Err(Error::Unreachable(format!(
                "{shown} did not answer within {limit:?}"
            )))
        })
    }

    /// GETs `u` asking for JSON.
    pub(super) async fn get(&self, u: &Uri, guard: Guard) -> Result<Answer> {
        let req = Request::builder()
            .uri(u.clone())
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, USER_AGENT)
            .body(Full::new(Bytes::new()))
            .map_err(|_| Error::Config(format!("{} is not a usable URL", redacted(u))))?;
        self.exchange(req, guard).await
    }

    /// POSTs `body` of `content_type` to `u`, with an `Authorization` value when given.
    pub(super) async fn post(
        &self,
        u: &Uri,
        content_type: &'static str,
        body: String,
        authorization: Option<String>,
        guard: Guard,
    ) -> Result<Answer> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(u.clone())
            .header(header::CONTENT_TYPE, content_type)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, USER_AGENT);
        if let Some(a) = authorization {
            req = req.header(header::AUTHORIZATION, a);
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| Error::Config(format!("{} is not a usable URL", redacted(u))))?;
        self.exchange(req, guard).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_well_known_urls_built_as_the_rfcs_say() {
        for bad in [
            "",
            "/relative",
            "ftp://h/x",
            "https://user:pw@h/x",
            "https://h/x#frag",
            "https://h/ x",
            "https:///x",
            "javascript:alert(1)",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
        assert!(parse_url(&format!("https://h/{}", "a".repeat(MAX_URL))).is_err());
        let u = parse_url("https://AS.Example:8443/tenant/1/").unwrap();
        assert_eq!(
            well_known(&u, "oauth-authorization-server", false),
            "https://as.example:8443/.well-known/oauth-authorization-server/tenant/1"
        );
        assert_eq!(
            well_known(&u, "openid-configuration", true),
            "https://as.example:8443/tenant/1/.well-known/openid-configuration"
        );
        let root = parse_url("https://as.example").unwrap();
        assert_eq!(
            well_known(&root, "oauth-authorization-server", false),
            "https://as.example/.well-known/oauth-authorization-server"
        );
        let q = parse_url("https://r.example/mcp?x=1").unwrap();
        assert_eq!(
            well_known(&q, "oauth-protected-resource", false),
            "https://r.example/.well-known/oauth-protected-resource/mcp?x=1"
        );
        assert_eq!(
            canonical(&parse_url("HTTPS://R.example/").unwrap()),
            "https://r.example"
        );
        assert_eq!(
            canonical(&parse_url("https://r.example/MCP").unwrap()),
            "https://r.example/MCP"
        );
        assert!(is_loopback(&parse_url("http://127.0.0.1:9/cb").unwrap()));
        assert!(is_loopback(&parse_url("http://[::1]:9/cb").unwrap()));
        assert!(is_loopback(&parse_url("http://LocalHost/cb").unwrap()));
        assert!(!is_loopback(
            &parse_url("http://127.0.0.1.evil.example/cb").unwrap()
        ));
    }

    #[test]
    fn redirect_queries_are_decoded_bounded_and_refused_when_a_name_repeats() {
        assert_eq!(
            parse_query("?code=a%2Fb+c&state=s&empty").unwrap(),
            vec![
                ("code".into(), "a/b c".into()),
                ("state".into(), "s".into()),
                ("empty".into(), String::new())
            ]
        );
        assert!(parse_query("code=1&code=2").is_err());
        assert!(parse_query("code=%zz").is_err());
        assert!(parse_query("code=%ff").is_err());
        assert!(parse_query("code=%2").is_err());
        assert!(parse_query("code=%+1").is_err());
        assert!(parse_query("code=%é").is_err());
        assert!(parse_query(&"a=1&".repeat(MAX_QUERY)).is_err());
        let many: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=1")).collect();
        assert!(parse_query(&many.join("&")).is_err());
        assert_eq!(form(&[("a b", "x&y=z/é")]), "a%20b=x%26y%3Dz%2F%C3%A9");
    }
}
