//! The `http` handler's run step: the request of a call built from the compiled templates,
//! the arguments, the Secrets and the caller's credential, sent through the shared
//! [`HttpClient`], and its answer turned into the tool result.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

mod args;
pub(crate) mod auth;

use self::args as from_args;
use self::auth::AuthRun as _;
use crate::handlers::content::to_base64;
use crate::handlers::http::HttpCall;
use crate::handlers::http::project::Projection;
use crate::net::http::{Guard, HttpClient, USER_AGENT, error_chain, redacted};
use crate::protocol::output::ToolOutput;
use crate::spec::checks::{has_dot_segment, path_of};
use crate::spec::context::{CALLER_ROOT, SECRET_ROOT};

/// What a call adds to an http tool's request beyond its arguments and Secrets.
#[derive(Debug, Clone, Copy)]
pub struct Outbound<'a> {
    /// The `Authorization` of the tool's `identity` (`None`: the tool's own headers only).
    pub authorization: Option<&'a HeaderValue>,
    /// The caller's claims, `{{caller.CLAIM}}` (`Null` without a token).
    pub caller: &'a Value,
}

/// What an http tool's templates see: the arguments, the Secrets under `secret` and the
/// caller's claims under `caller` (neither of which an argument can shadow).
struct RequestScope<'a> {
    args: &'a Value,
    secrets: &'a Value,
    caller: &'a Value,
}

impl crate::template::Scope for RequestScope<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        match name {
            SECRET_ROOT => Some(self.secrets),
            CALLER_ROOT => Some(self.caller),
            _ => self.args.get(name),
        }
    }
}

/// Characters of an imported operation's error answer kept in the tool error.
const MAX_ERROR_CHARS: usize = 2048;

/// Performs the request of an http tool through the shared client.
pub async fn call(
    client: &HttpClient,
    spec: &HttpCall,
    args: &Value,
    secrets: &Value,
    outbound: &Outbound<'_>,
) -> ToolOutput {
    call_with(client, spec, args, secrets, outbound, false).await
}

/// [`call`]; `retried`: this is the one repeat of a call whose OAuth2 token the
/// API refused (401), with a fresh token.
// Long: one request from start to answer (template parts, argument parts, tracing, timeout);
// each step is a few lines that share the builder.
async fn call_with(
    client: &HttpClient,
    spec: &HttpCall,
    args: &Value,
    secrets: &Value,
    outbound: &Outbound<'_>,
    retried: bool,
) -> ToolOutput {
    let scope = RequestScope {
        args,
        secrets,
        caller: outbound.caller,
    };
    let uri = match target(spec, &scope, args) {
        Ok(u) => u,
        Err(e) => return ToolOutput::error(e),
    };
    // Errors name the URL without its query, fragment or userinfo: they may hold secrets.
    let url = redacted(&uri);
    let mut req = Request::builder()
        .method(Method::from_bytes(spec.method.as_bytes()).unwrap_or(Method::GET))
        .uri(uri);
    for (name, value) in &spec.headers {
        let rendered = match value.render(&scope) {
            Ok(r) => r,
            Err(e) => return ToolOutput::error(format!("header `{name}`: {e}")),
        };
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&rendered),
        ) {
            (Ok(n), Ok(v)) => req = req.header(n, v),
            _ => return ToolOutput::error(format!("header `{name}` rendered to an invalid value")),
        }
    }
    if let Some(parts) = &spec.args {
        match from_args::headers(parts, args) {
            Ok(h) => {
                for (n, v) in h {
                    req = add_header(req, n, v);
                }
            }
            Err(e) => return ToolOutput::error(e),
        }
    }
    let body = match &spec.body {
        None if spec.args.is_some() => match spec.args.as_deref().and_then(|p| from_args::body(p, args)) {
            Some((b, content_type)) => {
                req = req.header(header::CONTENT_TYPE, content_type);
                b
            }
            None => Bytes::new(),
        },
        Some(t) => {
            req = req.header(header::CONTENT_TYPE, "application/json");
            match t.render(&scope) {
                Ok(v) => Bytes::from(serde_json::to_vec(&v).unwrap_or_default()),
                Err(e) => return ToolOutput::error(format!("the request body: {e}")),
            }
        }
        None => Bytes::new(),
    };
    let mut built = None;
    if let Some(auth) = &spec.auth {
        match auth.authorization(client, secrets, spec.timeout).await {
            Ok(v) => {
                req = req.header(header::AUTHORIZATION, v.clone());
                built = Some(v);
            }
            Err(e) => return ToolOutput::error(e),
        }
    }
    if let Some(a) = outbound.authorization {
        req = req.header(header::AUTHORIZATION, a.clone());
    }
    let req = match req.header(header::USER_AGENT, USER_AGENT).body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => return ToolOutput::error(format!("invalid request to {url}: {e}")),
    };
    let guard = if spec.guarded { Guard::Document } else { Guard::Off };
    let pool = match client.client_for(spec.tls.as_ref(), secrets, guard) {
        Ok(c) => c,
        Err(e) => return ToolOutput::error(format!("TLS settings of {url}: {e}")),
    };
    // Tracing on: a client span, whose context the request carries on.
    let mut req = req;
    let span = crate::otel::spans::http_client(&spec.method, req.uri(), || spec.url.shape());
    if let Some(cx) = &span {
        crate::otel::propagate::inject_headers(cx, req.headers_mut());
    }
    let exchange = async {
        let resp = pool
            .request(req)
            .await
            .map_err(|e| format!("request to {url} failed: {}", error_chain(&e)))?;
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, spec.max_response_bytes)
            .collect()
            .await
            .map_err(|e| format!("reading the response of {url} failed: {e}"))?
            .to_bytes();
        Ok::<_, String>((parts, bytes))
    };
    let outcome = tokio::time::timeout(spec.timeout, exchange).await;
    if let Some(cx) = &span {
        let status = match &outcome {
            Ok(Ok((p, _))) => Ok(p.status.as_u16()),
            Ok(Err(_)) => Err("request_failed"),
            Err(_) => Err("timeout"),
        };
        crate::otel::spans::end_http(cx, status);
    }
    let (parts, bytes) = match outcome {
        Err(_) => {
            return ToolOutput::error(format!(
                "{} {url} timed out after {:?}",
                spec.method, spec.timeout
            ));
        }
        Ok(Err(e)) => return ToolOutput::error(e),
        Ok(Ok(x)) => x,
    };
    if parts.status == http::StatusCode::UNAUTHORIZED
        && !retried
        && let Some(auth) = &spec.auth
        && auth.refused().await
    {
        return Box::pin(call_with(client, spec, args, secrets, outbound, true)).await;
    }
    let mut out = if parts.status.is_success() {
        answer(&parts.headers, &bytes, spec.project.as_deref())
    } else {
        let mut text = String::from_utf8_lossy(&bytes);
        // An imported operation's error answer is cut short: an API's error page is not
        // worth a model's context.
        if spec.args.is_some()
            && let Some((cut, _)) = text.char_indices().nth(MAX_ERROR_CHARS)
        {
            text = format!("{}…", &text[..cut]).into();
        }
        ToolOutput::error(format!("{} {url} answered {}: {text}", spec.method, parts.status))
    };
    // A credential built for the call (basic's base64, an OAuth2 token) is redacted like
    // the Secrets it is made of: an API that echoes the request does not hand it over.
    if let Some(v) = built.as_ref().and_then(|v| v.to_str().ok()) {
        let token = v.split_once(' ').map_or(v, |(_, t)| t);
        crate::identity::redact(&mut out, &[token]);
    }
    out
}

/// Adds a header of an argument; a cookie joins the `Cookie` a template set (a security
/// scheme's), as a request carries one `Cookie` header.
fn add_header(mut req: http::request::Builder, n: HeaderName, v: HeaderValue) -> http::request::Builder {
    if n == header::COOKIE
        && let Some(m) = req.headers_mut()
        && let Some(first) = m.get(&n)
    {
        let mut joined = Vec::with_capacity(first.len() + 2 + v.len());
        joined.extend_from_slice(first.as_bytes());
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(v.as_bytes());
        if let Ok(j) = HeaderValue::from_bytes(&joined) {
            m.insert(n, j);
        }
        return req;
    }
    req.header(n, v)
}

/// The tool result of a successful answer: an image or audio block for media, structured
/// content for a JSON object, and the text; with `project`, of the fields it keeps of a
/// JSON answer (whatever its content type says).
fn answer(headers: &http::HeaderMap, bytes: &Bytes, project: Option<&Projection>) -> ToolOutput {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    // An image or audio answer becomes an image or audio block (base64), with the text
    // a pipeline step sees describing it.
    if let Some(kind) = ["image", "audio"]
        .into_iter()
        .find(|k| mime.strip_prefix(k).is_some_and(|r| r.starts_with('/')))
    {
        let block = serde_json::json!({"type": kind, "data": to_base64(bytes), "mimeType": mime});
        return ToolOutput {
            text: format!("[{kind} {mime}, {} bytes]", bytes.len()),
            structured: None,
            content: Some(vec![block]),
            is_error: false,
        };
    }
    if let Some(kept) = project.and_then(|pj| pj.apply(serde_json::from_slice(bytes).ok()?)) {
        return ToolOutput {
            text: serde_json::to_string(&kept).unwrap_or_default(),
            structured: Some(kept).filter(Value::is_object),
            content: None,
            is_error: false,
        };
    }
    let text = String::from_utf8_lossy(bytes).into_owned();
    let is_json = mime == "application/json" || mime.ends_with("+json");
    let structured = if is_json {
        serde_json::from_slice::<Value>(bytes)
            .ok()
            .filter(Value::is_object)
    } else {
        None
    };
    ToolOutput {
        text,
        structured,
        content: None,
        is_error: false,
    }
}

/// Renders the URL of a call and checks that values changed only its path, query and
/// fragment: the server called is the tool's literal `scheme://authority`, and no value made
/// a `.` or `..` path segment (which would walk up the path the tool declares).
fn target(spec: &HttpCall, scope: &RequestScope<'_>, args: &Value) -> Result<Uri, String> {
    let mut url = spec.url.render_url(scope).map_err(|e| format!("the URL: {e}"))?;
    if let Some(parts) = &spec.args {
        let mut query = String::new();
        from_args::query(parts, args, &mut query);
        if !query.is_empty() {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&query);
        }
        if url.len() > crate::template::MAX_RENDERED_BYTES {
            return Err("the arguments make a URL too long to send".to_owned());
        }
    }
    let uri: Uri = url
        .parse()
        .map_err(|_| "the arguments make an invalid URL".to_owned())?;
    let origin_ok = uri
        .scheme_str()
        .zip(uri.authority())
        .is_some_and(|(scheme, authority)| {
            spec.origin
                .strip_prefix(scheme)
                .and_then(|rest| rest.strip_prefix("://"))
                .is_some_and(|a| a.eq_ignore_ascii_case(authority.as_str()))
        });
    if !origin_ok {
        return Err("the arguments change the server this tool calls; refused".to_owned());
    }
    if has_dot_segment(path_of(url.get(spec.origin.len()..).unwrap_or_default())) {
        return Err("the arguments make a `.` or `..` URL path segment; refused".to_owned());
    }
    // A literal address is connected to without resolving: checked here instead.
    if spec.guarded
        && let Err(why) = Guard::Document.literal(&uri, &[])
    {
        return Err(format!(
            "the server a fetched document chose is {why}; refused (set `server` or `allowedOrigins`)"
        ));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests;
