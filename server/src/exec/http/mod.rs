//! The `http` handler: a pooled HTTP/1.1 client (TLS via rustls) with templated URL, headers
//! and JSON body, a timeout and a response size cap.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

mod args;
pub(crate) mod auth;
pub(crate) mod trust;

use self::args as from_args;
use self::auth::AuthRun as _;
use crate::exec::output::ToolOutput;
use crate::handlers::content::to_base64;
use crate::handlers::http::project::Projection;
use crate::handlers::http::{HttpCall, TlsRefs};
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

/// The `User-Agent` of every outbound request.
pub(crate) const USER_AGENT: &str = concat!("quiver-server/", env!("CARGO_PKG_VERSION"));

type Pool = Client<HttpsConnector<HttpConnector<Resolver>>, Full<Bytes>>;

/// Resolves host names for the client. A guarded one (a fetched document chose the server)
/// keeps only addresses such a document may choose ([`crate::config::egress`]): a name that
/// resolves to this host, a link-local or a metadata address is not connected to.
#[derive(Clone, Copy, Debug)]
struct Resolver {
    guarded: bool,
}

type Resolved = std::io::Result<std::vec::IntoIter<std::net::SocketAddr>>;

impl tower::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<std::net::SocketAddr>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Resolved> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let guarded = self.guarded;
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<std::net::SocketAddr> = tokio::task::spawn_blocking(move || {
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), 0)).map(Iterator::collect)
            })
            .await
            .map_err(std::io::Error::other)??;
            if !guarded {
                return Ok(addrs.into_iter());
            }
            let kept: Vec<_> = addrs
                .into_iter()
                .filter(|a| may_connect(a.ip()).is_ok())
                .collect();
            if kept.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "the server a fetched document chose resolves only to addresses it may not choose \
                     (this host, link-local or cloud metadata); set `server` or `allowedOrigins`",
                ));
            }
            Ok(kept.into_iter())
        })
    }
}

/// Whether a call a fetched document chose may go to `ip`.
fn may_connect(ip: std::net::IpAddr) -> Result<(), &'static str> {
    if let Some(why) = crate::config::egress::refused(ip) {
        return Err(why);
    }
    if crate::config::egress::is_own(ip) {
        return Err("an address of this host");
    }
    Ok(())
}

/// Clients of distinct TLS settings (`tls:` of http tools) kept at once; more empties the cache.
const MAX_TLS_CLIENTS: usize = 32;

/// A pooled HTTP(S) client shared by every http tool, and one per distinct `tls:` setting.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Pool,
    /// The pool of calls whose server a fetched document chose ([`HttpCall::guarded`]).
    guarded: Pool,
    /// By a hash of the PEM material: a rotated Secret makes a new client.
    tls: std::sync::Arc<std::sync::Mutex<rustc_hash::FxHashMap<u64, Pool>>>,
}

fn pool(connector: HttpsConnector<HttpConnector<Resolver>>) -> Pool {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .pool_max_idle_per_host(64)
        .build(connector)
}

fn tcp(guarded: bool) -> HttpConnector<Resolver> {
    let mut http = HttpConnector::new_with_resolver(Resolver { guarded });
    http.enforce_http(false);
    http.set_nodelay(true);
    http
}

/// A rustls client config from PEM material (CA certificates, client chain and key).
fn tls_config(tls: &TlsRefs, secrets: &Value) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let roots = match &tls.ca {
        Some(r) => trust::roots_from_pem(crate::secrets::value_in(secrets, r)?, r)?,
        None => trust::public_roots(),
    };
    let builder = builder.with_root_certificates(roots);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(crate::secrets::value_in(secrets, cert)?.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| format!("{cert} is not PEM"))?;
            if chain.is_empty() {
                return Err(format!("{cert} holds no PEM certificate"));
            }
            let private = PrivateKeyDer::from_pem_slice(crate::secrets::value_in(secrets, key)?.as_bytes())
                .map_err(|_| format!("{key} holds no PEM private key"))?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| format!("{cert} and its key do not make a client certificate: {e}"))
        }
    }
}

impl HttpClient {
    /// A client trusting the webpki root certificates.
    pub fn new() -> Self {
        let connector = |guarded| {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .unwrap_or_else(|e| panic!("ring supports rustls' default protocol versions: {e}"))
                .https_or_http()
                .enable_http1()
                .wrap_connector(tcp(guarded))
        };
        Self {
            client: pool(connector(false)),
            guarded: pool(connector(true)),
            tls: std::sync::Arc::default(),
        }
    }

    /// The client of a `tls:` setting with the Secrets' current values (built on first use
    /// of these values).
    fn tls_client(&self, tls: &TlsRefs, secrets: &Value, guarded: bool) -> Result<Pool, String> {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        tls.hash(&mut h);
        guarded.hash(&mut h);
        for r in tls.ca.iter().chain(tls.client.iter().flat_map(|(c, k)| [c, k])) {
            crate::secrets::value_in(secrets, r)?.hash(&mut h);
        }
        let key = h.finish();
        if let Some(c) = self.tls.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(tls, secrets)?)
            .https_only()
            .enable_http1()
            .wrap_connector(tcp(guarded));
        let client = pool(connector);
        if let Ok(mut m) = self.tls.lock() {
            if m.len() >= MAX_TLS_CLIENTS {
                m.clear();
            }
            m.insert(key, client.clone());
        }
        Ok(client)
    }

    /// The pool for a `tls:` setting (the shared one without).
    fn client_for(&self, tls: Option<&TlsRefs>, secrets: &Value, guarded: bool) -> Result<Pool, String> {
        match tls {
            None if guarded => Ok(self.guarded.clone()),
            None => Ok(self.client.clone()),
            Some(t) => self.tls_client(t, secrets, guarded),
        }
    }

    /// Sends `req` through the pool of `tls` and returns the response, its body unread
    /// (the caller bounds what it reads). No time limit: the caller sets one.
    ///
    /// # Errors
    /// The TLS settings are unusable, or the request failed.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
        tls: Option<&TlsRefs>,
        secrets: &Value,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        // The URL as errors show it is only written when there is an error.
        let uri = req.uri().clone();
        let client = self
            .client_for(tls, secrets, false)
            .map_err(|e| format!("TLS settings of {}: {e}", redacted(&uri)))?;
        client
            .request(req)
            .await
            .map_err(|e| format!("request to {} failed: {}", redacted(&uri), error_chain(&e)))
    }

    /// GETs a JSON document (e.g. an issuer's metadata or key set), within `timeout` and
    /// at most `max` bytes.
    ///
    /// # Errors
    /// The request failed, answered other than 2xx, or the body is not JSON.
    pub async fn get_json(
        &self,
        url: &str,
        timeout: std::time::Duration,
        max: usize,
        tls: Option<(&TlsRefs, &Value)>,
    ) -> Result<Value, String> {
        let client = match tls {
            None => self.client.clone(),
            Some((t, secrets)) => self.tls_client(t, secrets, false)?,
        };
        let uri: Uri = url.parse().map_err(|_| format!("`{url}` is not a URL"))?;
        let shown = redacted(&uri);
        let req = Request::builder()
            .uri(uri)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, USER_AGENT)
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("{shown}: {e}"))?;
        let exchange = async {
            let resp = client
                .request(req)
                .await
                .map_err(|e| format!("GET {shown} failed: {}", error_chain(&e)))?;
            if !resp.status().is_success() {
                return Err(format!("GET {shown} answered {}", resp.status()));
            }
            let bytes = Limited::new(resp.into_body(), max)
                .collect()
                .await
                .map_err(|e| format!("reading {shown}: {e}"))?
                .to_bytes();
            serde_json::from_slice(&bytes).map_err(|e| format!("{shown} is not JSON: {e}"))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("GET {shown} timed out after {timeout:?}")))
    }

    /// Performs the request of an http tool.
    pub async fn call(
        &self,
        spec: &HttpCall,
        args: &Value,
        secrets: &Value,
        outbound: &Outbound<'_>,
    ) -> ToolOutput {
        self.call_with(spec, args, secrets, outbound, false).await
    }

    /// [`Self::call`]; `retried`: this is the one repeat of a call whose OAuth2 token the
    /// API refused (401), with a fresh token.
    // Long: one request from start to answer (template parts, argument parts, tracing, timeout);
    // each step is a few lines that share the builder.
    async fn call_with(
        &self,
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
            None if spec.args.is_some() => {
                match spec.args.as_deref().and_then(|p| from_args::body(p, args)) {
                    Some((b, content_type)) => {
                        req = req.header(header::CONTENT_TYPE, content_type);
                        b
                    }
                    None => Bytes::new(),
                }
            }
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
            match auth.authorization(self, secrets, spec.timeout).await {
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
        let client = match self.client_for(spec.tls.as_ref(), secrets, spec.guarded) {
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
            let resp = client
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
            return Box::pin(self.call_with(spec, args, secrets, outbound, true)).await;
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
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
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
        && let Some(ip) = uri
            .host()
            .and_then(|h| h.trim_start_matches('[').trim_end_matches(']').parse().ok())
        && let Err(why) = may_connect(ip)
    {
        return Err(format!(
            "the server a fetched document chose is {why}; refused (set `server` or `allowedOrigins`)"
        ));
    }
    Ok(uri)
}

/// A URL as messages show it: scheme, host, port and path (no userinfo, query or fragment).
fn redacted(uri: &Uri) -> String {
    let host = uri
        .authority()
        .map_or("", |a| a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h));
    let mut s = format!("{}://{host}{}", uri.scheme_str().unwrap_or("http"), uri.path());
    if uri.query().is_some() {
        s.push_str("?…");
    }
    s
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
