//! The console: read-only web pages over the catalog's McpServers for the people who use
//! them. Each user signs in with OpenID Connect ([`oidc`]); the servers shown are those the
//! catalog would show them (Kubernetes reviews of their name and groups, as the API server
//! knows them); tools are listed, and called from a form, with the user's own access token,
//! so each user sees and calls what the server lets that user see and call.
//!
//! Routes: `/` (the servers), `/servers/{namespace}/{name}` (one server: state, tools, who
//! may call what, editor configuration), `/servers/{namespace}/{name}/tools/{tool}` (a tool:
//! schema and a form; `POST` calls it), `/login`, `/callback`, `POST /logout`,
//! `/static/console.css`.

pub mod client;
pub mod form;
pub mod oidc;
pub mod page;
pub mod stats;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::Full;
use serde_json::{Map, Value, json};

use crate::catalog::{Caller, Catalog, entry};
use crate::crd::McpServer;
use crate::plugin::mcp;
use client::Http;
use oidc::{Session, SignIn};
use page::{Outcome, ServerRow, ServerView};

/// The session cookie (`SameSite=Lax`: links from elsewhere open pages signed in).
const SESSION_COOKIE: &str = "quiver_console";
/// The session's same-site cookie (`SameSite=Strict`, the session id again): only a request
/// made from the console's own pages or the address bar carries it, and only such a request
/// sends the user's token to a server.
const SITE_COOKIE: &str = "quiver_console_site";
/// The cookie of a sign-in in progress (its state, PKCE verifier and nonce).
const LOGIN_COOKIE: &str = "quiver_console_login";
/// How long a session cookie lives at most (the session itself ends with its token).
const SESSION_COOKIE_AGE: u64 = 8 * 3600;
/// Requests answered at once.
const CONCURRENT_REQUESTS: usize = 64;
/// Largest form accepted.
const MAX_FORM: usize = 1 << 20;
/// Largest `tools/list` or `tools/call` answer read; also the most a whole listing's pages
/// may add up to.
const MAX_ANSWER: usize = 16 << 20;
/// Pages of `tools/list` followed at most.
const MAX_PAGES: usize = 100;
/// Tools of one listing shown at most.
const MAX_TOOLS: usize = 5000;
/// The longest wait for a server's whole listing.
const LIST_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest wait for a call.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The name the console gives itself to the servers it calls.
const CLIENT_NAME: &str = "quiver-console";

/// Which of a server's URLs the console connects to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The in-cluster Service (the console runs in the cluster).
    Service,
    /// The first URL the catalog lists (its public one; for a console outside the cluster).
    Listed,
}

/// The console's state.
#[derive(Debug)]
pub struct Console {
    catalog: Arc<Catalog>,
    sign_in: SignIn,
    http: Http,
    reach: Reach,
    /// The console's own origin (`scheme://host[:port]`): forms must come from it.
    origin: String,
    secure: bool,
    /// Prometheus, for each server's last hour (none: the pages show no figures).
    prometheus: Option<String>,
}

impl Console {
    /// A console at `public_url` (where browsers reach it) over `catalog`.
    pub fn new(
        catalog: Arc<Catalog>,
        config: oidc::OidcConfig,
        public_url: &str,
        reach: Reach,
        prometheus: Option<String>,
    ) -> Self {
        let base = public_url.trim_end_matches('/');
        let http = Http::new();
        let (origin, secure) = origin_of(base);
        Self {
            catalog,
            sign_in: SignIn::new(config, format!("{base}/callback"), http.clone()),
            http,
            reach,
            origin,
            secure,
            prometheus,
        }
    }

    /// A cookie's name: over https with the `__Host-` prefix, which browsers accept only
    /// from this very host (so a sibling host cannot plant a session or a sign-in).
    fn name(&self, base: &str) -> String {
        if self.secure {
            format!("__Host-{base}")
        } else {
            base.to_owned()
        }
    }

    fn set_cookie(&self, base: &str, value: &str, max_age: u64, strict: bool) -> HeaderValue {
        let (name, secure) = (self.name(base), if self.secure { "; Secure" } else { "" });
        let same_site = if strict { "Strict" } else { "Lax" };
        HeaderValue::from_str(&format!(
            "{name}={value}; Path=/; Max-Age={max_age}; HttpOnly; SameSite={same_site}{secure}"
        ))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    /// The session the request's cookie names (its access token renewed when due), and
    /// whether the request came from the console's own pages (it carries the same-site
    /// cookie too).
    async fn session(&self, headers: &HeaderMap) -> Option<(String, Session, bool)> {
        let id = cookie(headers, &self.name(SESSION_COOKIE))?;
        // SameSite=Strict keeps the cookie from other sites, but a sibling host of the same
        // site (a tenant's Ingress) still sends it: browsers that say where a request comes
        // from must say this origin, or the address bar.
        let fetched_here = headers
            .get("sec-fetch-site")
            .is_none_or(|v| v == "same-origin" || v == "none");
        let here = fetched_here
            && cookie(headers, &self.name(SITE_COOKIE))
                .is_some_and(|v| constant_eq(v.as_bytes(), id.as_bytes()));
        self.sign_in.live(id).await.map(|s| (id.to_owned(), s, here))
    }
}

/// The origin browsers send for pages of `base` (scheme and host in lower case, no default
/// port), and whether it is https.
fn origin_of(base: &str) -> (String, bool) {
    let Ok(uri) = base.parse::<http::Uri>() else {
        return (String::new(), false);
    };
    let secure = uri.scheme_str().is_some_and(|s| s.eq_ignore_ascii_case("https"));
    let scheme = if secure { "https" } else { "http" };
    let host = uri.host().unwrap_or_default().to_ascii_lowercase();
    match uri.port_u16().filter(|p| *p != if secure { 443 } else { 80 }) {
        Some(port) => (format!("{scheme}://{host}:{port}"), secure),
        None => (format!("{scheme}://{host}"), secure),
    }
}

/// Tenant or provider text as one line of at most `max` characters.
pub fn short(s: &str, max: usize) -> String {
    // Cut first (with room for the spaces one_line folds), so a huge text costs little.
    let head: String = s.chars().take(max.saturating_mul(4)).collect();
    quiver_model::published::cut(&quiver_model::published::one_line(&head), max)
}

/// The value of cookie `name` in the request.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A page with the console's headers: no caching, no framing, no script, no referrer to
/// other sites (a same-origin one, so that browsers send the forms' `Origin`).
fn html(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "same-origin"),
        ],
        body,
    )
        .into_response()
}

fn redirect(to: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, to.to_owned()),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
    )
        .into_response()
}

fn user(s: &Session) -> Option<(&str, &str)> {
    Some((s.shown.as_str(), s.csrf.as_str()))
}

/// The query's pairs.
fn query_pairs(q: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .into_owned()
        .take(256)
        .collect()
}

async fn login(State(c): State<Arc<Console>>) -> Response {
    match c.sign_in.begin().await {
        Ok((pending, url)) => {
            let mut r = redirect(&url);
            r.headers_mut().insert(
                header::SET_COOKIE,
                c.set_cookie(LOGIN_COOKIE, &pending, oidc::SIGN_IN_TTL.as_secs(), false),
            );
            r
        }
        Err(why) => {
            c.catalog.metrics().console_sign_in("unavailable");
            tracing::warn!(%why, "console: sign-in could not begin");
            html(
                StatusCode::SERVICE_UNAVAILABLE,
                page::problem("Sign-in is not available", &why, None),
            )
        }
    }
}

async fn callback(State(c): State<Arc<Console>>, RawQuery(q): RawQuery, h: HeaderMap) -> Response {
    let q = query_pairs(q.as_deref());
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let login = cookie(&h, &c.name(LOGIN_COOKIE));
    if let Some(e) = get("error") {
        c.catalog.metrics().console_sign_in("refused");
        // The provider's words only for this browser's own sign-in: anyone may link here.
        let why = match oidc::began_here(get("state").unwrap_or_default(), login) {
            Ok(_) => format!(
                "The identity provider said: {}",
                short(get("error_description").unwrap_or(e), 200)
            ),
            Err(_) => "The sign-in did not complete.".to_owned(),
        };
        return html(StatusCode::FORBIDDEN, page::problem("Not signed in", &why, None));
    }
    let (Some(state), Some(code)) = (get("state"), get("code")) else {
        return html(
            StatusCode::BAD_REQUEST,
            page::problem("Not signed in", "The provider's answer has no code.", None),
        );
    };
    match c.sign_in.complete(state, login, code).await {
        Ok(id) => {
            c.catalog.metrics().console_sign_in("ok");
            let mut r = redirect("/");
            let hs = r.headers_mut();
            hs.append(
                header::SET_COOKIE,
                c.set_cookie(SESSION_COOKIE, &id, SESSION_COOKIE_AGE, false),
            );
            hs.append(
                header::SET_COOKIE,
                c.set_cookie(SITE_COOKIE, &id, SESSION_COOKIE_AGE, true),
            );
            hs.append(header::SET_COOKIE, c.set_cookie(LOGIN_COOKIE, "", 0, false));
            r
        }
        Err(oidc::Failed::Refused(why)) => {
            c.catalog.metrics().console_sign_in("refused");
            html(StatusCode::FORBIDDEN, page::problem("Not signed in", &why, None))
        }
        Err(oidc::Failed::Unavailable(why)) => {
            c.catalog.metrics().console_sign_in("unavailable");
            tracing::warn!(%why, "console: sign-in could not complete");
            html(
                StatusCode::SERVICE_UNAVAILABLE,
                page::problem("Not signed in", &why, None),
            )
        }
    }
}

/// Whether a form came from the console's own pages: its Origin (when the browser sends
/// one) and its token.
fn same_site(c: &Console, h: &HeaderMap, s: &Session, form: &[(String, String)]) -> bool {
    let origin_ok = h
        .get(header::ORIGIN)
        .is_none_or(|o| o.to_str().is_ok_and(|o| o == c.origin));
    let token_ok = form
        .iter()
        .any(|(k, v)| k == "csrf" && constant_eq(v.as_bytes(), s.csrf.as_bytes()));
    origin_ok && token_ok
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn logout(State(c): State<Arc<Console>>, h: HeaderMap, body: Bytes) -> Response {
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().take(16).collect();
    if let Some((id, s, _)) = c.session(&h).await {
        if !same_site(&c, &h, &s, &form) {
            return html(
                StatusCode::FORBIDDEN,
                page::problem(
                    "Not signed out",
                    "The form did not come from this console.",
                    user(&s),
                ),
            );
        }
        c.sign_in.end(&id);
    }
    let mut r = html(
        StatusCode::OK,
        page::layout(
            "Signed out",
            None,
            "<h1>Signed out</h1><p><a href=\"/login\">Sign in again</a></p>",
        ),
    );
    let hs = r.headers_mut();
    hs.append(header::SET_COOKIE, c.set_cookie(SESSION_COOKIE, "", 0, false));
    hs.append(header::SET_COOKIE, c.set_cookie(SITE_COOKIE, "", 0, true));
    r
}

fn caller(s: &Session) -> Caller {
    Caller::user(s.username.clone(), s.groups.clone())
}

fn starting() -> Response {
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        page::problem(
            "Starting",
            "The console is listing McpServers: reload in a moment.",
            None,
        ),
    )
}

async fn overview(State(c): State<Arc<Console>>, h: HeaderMap) -> Response {
    let Some((_, s, _)) = c.session(&h).await else {
        return redirect("/login");
    };
    if !c.catalog.synced() {
        return starting();
    }
    let servers = match c.catalog.servers(&caller(&s), None).await {
        Ok(v) => v,
        Err(d) => {
            return html(
                StatusCode::SERVICE_UNAVAILABLE,
                page::problem("Servers unavailable", &d.to_string(), user(&s)),
            );
        }
    };
    let rows: Vec<ServerRow> = servers.iter().map(|m| row(m)).collect();
    html(
        StatusCode::OK,
        page::layout("MCP servers", user(&s), &page::overview(&rows)),
    )
}

fn about(m: &McpServer) -> String {
    let info = m.spec.server.as_ref();
    m.spec
        .catalog
        .as_ref()
        .and_then(|c| c.description.clone())
        .or_else(|| info.and_then(|i| i.title.clone()))
        .map(|t| short(&t, 200))
        .unwrap_or_default()
}

fn row(m: &McpServer) -> ServerRow {
    let ready = m.status.as_ref().and_then(|st| {
        st.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status == "True", c.reason.clone()))
    });
    ServerRow {
        namespace: m.metadata.namespace.clone().unwrap_or_default(),
        name: m.metadata.name.clone().unwrap_or_default(),
        about: about(m),
        ready,
        tools: m.status.as_ref().and_then(|s| s.tool_count),
    }
}

/// Who may call what, from the server's spec: its tools' `access` and `policy`, its
/// upstreams' `tools.access` and its policies.
pub fn rules(m: &McpServer) -> Vec<(String, String)> {
    let access = |a: &quiver_model::spec::access::AccessSpec| {
        let mut parts = Vec::new();
        if !a.scopes.is_empty() {
            parts.push(format!("scopes {}", a.scopes.join(" and ")));
        }
        if !a.groups.is_empty() {
            parts.push(format!("a member of {}", a.groups.join(" or ")));
        }
        parts.join(", ")
    };
    let mut out = Vec::new();
    for t in &m.spec.tools {
        let mut parts: Vec<String> = t.access.iter().map(access).filter(|s| !s.is_empty()).collect();
        if let Some(p) = &t.policy {
            parts.push(format!("when {}", short(p, 200)));
        }
        if !parts.is_empty() {
            out.push((t.name.clone(), format!("callers with {}", parts.join("; "))));
        }
    }
    for u in &m.spec.upstreams {
        if let Some(a) = u.tools.access.as_ref().map(access).filter(|s| !s.is_empty()) {
            out.push((
                format!("every tool of upstream {}", u.name),
                format!("callers with {a}"),
            ));
        }
    }
    for p in &m.spec.policies {
        let on = if p.tools.is_empty() && p.upstreams.is_empty() {
            "every tool".to_owned()
        } else {
            p.tools
                .iter()
                .cloned()
                .chain(p.upstreams.iter().map(|u| format!("upstream {u}")))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push((
            on,
            format!("policy {}: when {}", p.name, short(&p.expression, 200)),
        ));
    }
    out
}

fn view(c: &Console, m: &McpServer) -> (ServerView, String) {
    let urls = entry::urls(m);
    let connect = match c.reach {
        Reach::Service => urls.last(),
        Reach::Listed => urls.first(),
    }
    .cloned()
    .unwrap_or_default();
    let conditions = m
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|k| {
                    [
                        k.type_.clone(),
                        k.status.clone(),
                        k.reason.clone(),
                        quiver_model::published::cut(&k.message, 300),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    let auth = m.spec.auth.as_ref();
    let v = ServerView {
        namespace: m.metadata.namespace.clone().unwrap_or_default(),
        name: m.metadata.name.clone().unwrap_or_default(),
        about: about(m),
        conditions,
        url: urls.first().cloned().unwrap_or_default(),
        needs_token: auth.is_some_and(|a| a.oidc.is_some() || a.bearer_token_secret_ref.is_some()),
        rules: rules(m),
    };
    (v, connect)
}

/// The server `ns/name` if the user may see it.
async fn find(c: &Console, s: &Session, ns: &str, name: &str) -> Result<Arc<McpServer>, Response> {
    if !c.catalog.synced() {
        return Err(starting());
    }
    let servers = c.catalog.servers(&caller(s), Some(ns)).await.map_err(|d| {
        html(
            StatusCode::SERVICE_UNAVAILABLE,
            page::problem("Servers unavailable", &d.to_string(), user(s)),
        )
    })?;
    servers
        .into_iter()
        .find(|m| m.metadata.name.as_deref() == Some(name))
        .ok_or_else(|| {
            html(
                StatusCode::NOT_FOUND,
                page::problem(
                    "No such server",
                    "There is no server of that name you may see.",
                    user(s),
                ),
            )
        })
}

impl Console {
    /// The user's token for `m`: only when `m` checks tokens of the console's own issuer, for
    /// an audience the token names. A server that checks none, another issuer's or another
    /// audience has no use for it and does not get it.
    /// A listed URL (chosen by whoever edits the McpServer) gets it over https only (or on
    /// this machine's loopback address).
    fn token_for<'s>(&self, m: &McpServer, s: &'s Session, url: &str) -> Option<&'s str> {
        let oidc = m.spec.auth.as_ref()?.oidc.as_ref()?;
        // Its issuer is ours, and its audience is one the token names (when the token says).
        let ours = oidc.issuer.trim_end_matches('/') == self.sign_in.config.issuer.trim_end_matches('/')
            && s.audiences.as_ref().is_none_or(|a| a.contains(&oidc.audience));
        let safe = self.reach == Reach::Service || oidc::secure_or_loopback(url);
        (ours && safe).then_some(s.access_token.as_str())
    }

    /// One MCP request to `url`, with the user's token when there is one; the result and
    /// the size of the answer, or why there is none.
    async fn rpc(
        &self,
        url: &str,
        token: Option<&str>,
        req: &mcp::Request,
        max: usize,
        timeout: Duration,
    ) -> Result<(Value, usize), String> {
        let mut b = http::Request::post(url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(token) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        for (k, v) in &req.headers {
            b = b.header(*k, v);
        }
        let r = b
            .body(Full::new(Bytes::from(req.body.clone())))
            .map_err(|e| e.to_string())?;
        let reply = self.http.send(r, max, timeout).await?;
        let size = reply.body.len();
        let answer = mcp::Answer {
            status: reply.status,
            content_type: reply.content_type,
            body: reply.body.to_vec(),
        };
        mcp::result(&answer, 1)
            .map(|v| (v, size))
            .map_err(|f| f.to_string())
    }

    /// Every tool the user may call at `url` (pages followed), within one time limit and
    /// one size limit for the whole listing.
    async fn tools(&self, url: &str, token: Option<&str>) -> Result<Vec<Value>, String> {
        let deadline = tokio::time::Instant::now() + LIST_TIMEOUT;
        let (mut out, mut left) = (Vec::new(), MAX_ANSWER);
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut params = Map::new();
            if let Some(c) = &cursor {
                params.insert("cursor".into(), Value::String(c.clone()));
            }
            let req = mcp::request_as(CLIENT_NAME, 1, "tools/list", params, None);
            let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
            if wait.is_zero() || left == 0 {
                break;
            }
            let (r, size) = self.rpc(url, token, &req, left, wait).await?;
            left = left.saturating_sub(size);
            let room = MAX_TOOLS.saturating_sub(out.len());
            out.extend(r["tools"].as_array().into_iter().flatten().take(room).cloned());
            match r["nextCursor"].as_str() {
                Some(c) if !c.is_empty() && out.len() < MAX_TOOLS => cursor = Some(c.to_owned()),
                _ => return Ok(out),
            }
        }
        Ok(out)
    }
}

async fn server(
    State(c): State<Arc<Console>>,
    Path((ns, name)): Path<(String, String)>,
    h: HeaderMap,
) -> Response {
    let Some((_, s, here)) = c.session(&h).await else {
        return redirect("/login");
    };
    if !here {
        let path = format!("/servers/{}/{}", page::seg(&ns), page::seg(&name));
        return html(StatusCode::OK, page::elsewhere(&path, user(&s)));
    }
    let m = match find(&c, &s, &ns, &name).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let (v, connect) = view(&c, &m);
    let figures = async {
        match &c.prometheus {
            Some(p) => Some(stats::fetch(&c.http, p, &v.namespace, &v.name).await),
            None => None,
        }
    };
    let (tools, figures) = tokio::join!(c.tools(&connect, c.token_for(&m, &s, &connect)), figures);
    if let Some(Err(why)) = &figures {
        tracing::debug!(%why, "console: no figures from Prometheus");
    }
    let rows: Result<Vec<page::ToolRow>, String> =
        tools.map(|t| t.iter().filter_map(page::tool_row).collect());
    let figures = figures.as_ref().map(|f| f.as_ref().map_err(String::as_str));
    let body = page::server_page(&v, rows.as_deref().map_err(String::as_str), figures);
    html(StatusCode::OK, page::layout(&name, user(&s), &body))
}

/// The tool `name` as the user's listing gives it, else as the spec declares it (a tool
/// the user may not call; the form is still shown, and the server's refusal with it).
async fn tool_of(
    c: &Console,
    m: &McpServer,
    connect: &str,
    s: &Session,
    name: &str,
) -> Result<(Value, Option<String>), String> {
    let listed = c.tools(connect, c.token_for(m, s, connect)).await?;
    if let Some(t) = listed.into_iter().find(|t| t["name"].as_str() == Some(name)) {
        return Ok((t, None));
    }
    let declared = m
        .spec
        .tools
        .iter()
        .find(|t| t.name == name)
        .ok_or("there is no tool of that name you may see")?;
    let schema = declared
        .input_schema
        .clone()
        .unwrap_or_else(|| json!({"type": "object"}));
    let rule = rules(m).into_iter().find(|(t, _)| t == name).map_or_else(
        || "The server does not list this tool to you.".to_owned(),
        |(_, r)| format!("The server does not list this tool to you: it is for {r}."),
    );
    Ok((
        json!({"name": name, "description": declared.description.clone().unwrap_or_default(), "inputSchema": schema}),
        Some(rule),
    ))
}

async fn tool_page(
    c: &Console,
    s: &Session,
    ns: &str,
    name: &str,
    tool: &str,
    sent: Option<Vec<(String, String)>>,
) -> Response {
    let m = match find(c, s, ns, name).await {
        Ok(m) => m,
        Err(r) => return r,
    };
    let (v, connect) = view(c, &m);
    let (t, hidden) = match tool_of(c, &m, &connect, s, tool).await {
        Ok(t) => t,
        Err(why) => {
            return html(
                StatusCode::NOT_FOUND,
                page::problem("No such tool", &why, user(s)),
            );
        }
    };
    let fields = form::fields(&t["inputSchema"]);
    let outcome = match &sent {
        None => hidden.map(Outcome::Refused),
        Some(values) => Some(match form::arguments(&fields, values) {
            Err(why) => {
                c.catalog.metrics().console_call("invalid");
                Outcome::Refused(format!("Not sent: {why}"))
            }
            Ok(args) => {
                let mut params = Map::new();
                params.insert("name".into(), Value::String(tool.to_owned()));
                params.insert("arguments".into(), Value::Object(args));
                let req = mcp::request_as(CLIENT_NAME, 1, "tools/call", params, Some(tool));
                let token = c.token_for(&m, s, &connect);
                let outcome = match c.rpc(&connect, token, &req, MAX_ANSWER, CALL_TIMEOUT).await {
                    Ok((r, _)) => match mcp::call_text(&r) {
                        Ok((text, is_error)) => Outcome::Result(text, is_error),
                        Err(f) => Outcome::Refused(f.to_string()),
                    },
                    Err(why) => Outcome::Refused(why),
                };
                c.catalog.metrics().console_call(match &outcome {
                    Outcome::Result(_, false) => "ok",
                    Outcome::Result(_, true) => "tool_error",
                    Outcome::Refused(_) => "refused",
                });
                outcome
            }
        }),
    };
    let body = page::tool_page(
        &v,
        &t,
        &fields,
        &s.csrf,
        sent.as_deref().unwrap_or_default(),
        outcome.as_ref(),
    );
    html(StatusCode::OK, page::layout(tool, user(s), &body))
}

async fn tool_get(
    State(c): State<Arc<Console>>,
    Path((ns, name, tool)): Path<(String, String, String)>,
    h: HeaderMap,
) -> Response {
    let Some((_, s, here)) = c.session(&h).await else {
        return redirect("/login");
    };
    if !here {
        let path = format!(
            "/servers/{}/{}/tools/{}",
            page::seg(&ns),
            page::seg(&name),
            page::seg(&tool)
        );
        return html(StatusCode::OK, page::elsewhere(&path, user(&s)));
    }
    tool_page(&c, &s, &ns, &name, &tool, None).await
}

async fn tool_post(
    State(c): State<Arc<Console>>,
    Path((ns, name, tool)): Path<(String, String, String)>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((_, s, _)) = c.session(&h).await else {
        return redirect("/login");
    };
    let values: Vec<(String, String)> = form_urlencoded::parse(&body)
        .into_owned()
        .take(form::MAX_FIELDS + 1)
        .collect();
    if !same_site(&c, &h, &s, &values) {
        return html(
            StatusCode::FORBIDDEN,
            page::problem("Not called", "The form did not come from this console.", user(&s)),
        );
    }
    let values = values.into_iter().filter(|(k, _)| k != "csrf").collect();
    tool_page(&c, &s, &ns, &name, &tool, Some(values)).await
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        page::CSS,
    )
        .into_response()
}

/// The console's router.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/login", get(login))
        .route("/callback", get(callback))
        .route("/logout", post(logout))
        .route("/static/console.css", get(css))
        .route("/servers/{namespace}/{name}", get(server))
        .route(
            "/servers/{namespace}/{name}/tools/{tool}",
            get(tool_get).post(tool_post),
        )
        .fallback(|| async {
            html(
                StatusCode::NOT_FOUND,
                page::problem("Not found", "There is no page here.", None),
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM))
        .layer(tower::limit::ConcurrencyLimitLayer::new(CONCURRENT_REQUESTS))
        .with_state(console)
}

#[cfg(test)]
mod tests;
