//! The `http` handler: an HTTP request whose URL, headers and JSON body are templates over
//! the arguments (and Secrets), sent by a pooled HTTP/1.1 client (TLS via rustls) with a
//! timeout and a response size cap.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::checks::{
    byte_cap, duration, has_dot_segment, header_name_problem, literal_origin, path_of, shallow,
};
use crate::spec::context::{
    CONFIG_MAP_PREFIX, Cx, Problems, SecretRef, check_request_template, template, valid_config_map_name,
    valid_secret_part,
};
use crate::spec::identity::{Identity, IdentitySpec};
use crate::spec::json_field;
use crate::template::{Authored, JsonTemplate, Template};

pub mod auth;
pub mod project;

/// An HTTP handler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpHandler {
    /// HTTP method (GET, POST, PUT, PATCH, DELETE, HEAD). Default GET.
    #[serde(default = "default_method")]
    pub method: String,
    /// URL template (`http` or `https`); substituted values are percent-encoded.
    pub url: String,
    /// Request headers; values are templates.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// JSON body template: strings are templates; a string that is exactly `{{arg}}` keeps
    /// the argument's JSON type. Sent as `application/json`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "json_field::optional"
    )]
    #[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
    pub body: Option<Value>,
    /// Request timeout, e.g. `500ms`, `2s` (default 10s, at most 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Largest response body accepted, in bytes (default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// TLS towards a server of a private CA, optionally with a client certificate (mTLS).
    /// Needs an `https` URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// Which credential the request carries as `Authorization: Bearer ...`: the server's own
    /// (`headers`, the default), the caller's token (`forward`, only when addressed to
    /// `audience`) or one exchanged for it (`exchange`). See docs/governance.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Box<IdentitySpec>>,
    /// Keep only these fields of a JSON answer (for the model's text and the structured
    /// content), e.g. `[items[].metadata.name, items[].status.phase]`: names joined by `.`,
    /// `[]` for every element of an array. See docs/toolset.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub project: Vec<String>,
}

/// TLS settings of an http tool, read from Secrets (like `{{secret...}}`: rotated values are
/// used by the next call).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsSpec {
    /// Secret whose `ca.crt` key holds the PEM certificates of the CAs to trust for this
    /// tool's server, instead of the public roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret: Option<String>,
    /// ConfigMap whose `ca.crt` key holds the PEM certificates of the CAs to trust instead
    /// of the public roots: a CA bundle is not a secret (e.g. `kube-root-ca.crt`, which
    /// every namespace has, for services signed by the cluster CA, or a trust-manager
    /// Bundle's target). Exclusive with `caSecret`; read like it, so an edit applies to the
    /// next call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_config_map: Option<String>,
    /// A `kubernetes.io/tls` Secret (keys `tls.crt`, `tls.key`, PEM) whose certificate the
    /// tool presents to the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_secret: Option<String>,
}

fn default_method() -> String {
    "GET".to_owned()
}

/// A compiled HTTP handler.
#[derive(Debug)]
pub struct HttpCall {
    /// Upper-case method.
    pub method: String,
    /// URL template (values percent-encoded unless filtered `raw`).
    pub url: Template,
    /// `scheme://authority` of every URL this tool requests: literal in the template.
    pub origin: String,
    /// Header name and value template.
    pub headers: Vec<(String, Template)>,
    /// JSON body template.
    pub body: Option<JsonTemplate>,
    /// Request timeout.
    pub timeout: Duration,
    /// Response size cap.
    pub max_response_bytes: usize,
    /// Secret values the request uses (redacted from what the call returns).
    pub secrets: Vec<SecretRef>,
    /// TLS from Secrets, when the tool sets `tls`.
    pub tls: Option<TlsRefs>,
    /// The caller's credential the request carries (`None`: the server's own).
    pub identity: Option<Identity>,
    /// Top-level names of the caller's claims the templates use (`{{caller.NAME...}}`).
    pub claims: Vec<Box<str>>,
    /// Request parts taken from the arguments as they are (an imported OpenAPI operation's
    /// query, header and cookie parameters and body); `None` for a hand-written tool.
    pub args: Option<Box<ArgParts>>,
    /// A credential built per call (an imported operation's basic or OAuth2 scheme).
    pub auth: Option<Box<auth::Auth>>,
    /// The fields of a JSON answer kept (`None`: all of it).
    pub project: Option<std::sync::Arc<project::Projection>>,
    /// The server was chosen by a fetched document, not the author: its host must not
    /// resolve to a loopback, link-local or unspecified address, or one of this host's own
    /// ([`crate::config::egress`]).
    pub guarded: bool,
}

/// Request parts built from argument values rather than templates: a parameter whose
/// argument is absent is left out of the request, and arrays follow the parameter's style.
#[derive(Debug, Default)]
pub struct ArgParts {
    /// Query, header and cookie parameters, in this order.
    pub params: Vec<ArgParam>,
    /// The argument sent as the request body, and its encoding.
    pub body: Option<(Box<str>, BodyEncoding)>,
}

/// One parameter of a request, read from the argument of the same name.
#[derive(Debug, Clone)]
pub struct ArgParam {
    /// The argument (and the parameter's name in the request).
    pub name: Box<str>,
    /// Where it goes.
    pub place: ParamPlace,
    /// How an array is written: repeated (`a=1&a=2`, exploded) or joined by this separator.
    pub explode: bool,
    /// The separator of a non-exploded array (`,`, ` ` or `|`).
    pub separator: char,
}

/// Where a parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamPlace {
    /// The URL's query.
    Query,
    /// A request header.
    Header,
    /// A `Cookie` header pair.
    Cookie,
}

/// How a body argument is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEncoding {
    /// `application/json`.
    Json,
    /// `application/x-www-form-urlencoded` of an object's fields.
    Form,
}

/// Where an http tool's TLS material is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TlsRefs {
    /// PEM CA certificates trusted instead of the public roots.
    pub ca: Option<SecretRef>,
    /// PEM certificate chain and private key presented to the server.
    pub client: Option<(SecretRef, SecretRef)>,
}

/// Compiles an `http` spec: the author's URL, header and body text are templates.
pub fn compile(h: &HttpHandler, cx: &mut Cx<'_>) -> HttpCall {
    let hp = cx.at.clone();
    let p = &mut *cx.p;
    let url = template(Authored::new(&h.url), &format!("{hp}.url"), p);
    let mut headers = Vec::with_capacity(h.headers.len());
    for (k, v) in &h.headers {
        if let Some(t) = template(Authored::new(v), &format!("{hp}.headers.{k}"), p) {
            headers.push((k.clone(), t));
        }
    }
    let body = h.body.as_ref().and_then(|b| {
        if !shallow(b, &format!("{hp}.body"), p) {
            return None;
        }
        JsonTemplate::compile(Authored::json(b))
            .map_err(|e| p.push(format!("{hp}.body"), e))
            .ok()
    });
    let parts = RequestParts {
        method: &h.method,
        url,
        headers,
        body,
        timeout: h.timeout.as_ref(),
        max_response_bytes: h.max_response_bytes,
        tls: h.tls.as_ref(),
        identity: h.identity.as_deref(),
        project: &h.project,
    };
    assemble(parts, cx)
}

/// The parts of a request with their templates compiled: from the author's text
/// ([`compile`]), or assembled from an imported document's text, which is literal.
pub struct RequestParts<'a> {
    /// The method as written (any case).
    pub method: &'a str,
    /// The URL (`None`: it did not compile, a problem already reported).
    pub url: Option<Template>,
    /// Header names and value templates.
    pub headers: Vec<(String, Template)>,
    /// The JSON body.
    pub body: Option<JsonTemplate>,
    /// `timeout` as written.
    pub timeout: Option<&'a String>,
    /// `maxResponseBytes`.
    pub max_response_bytes: Option<u64>,
    /// `tls`.
    pub tls: Option<&'a TlsSpec>,
    /// `identity`.
    pub identity: Option<&'a IdentitySpec>,
    /// `project`.
    pub project: &'a [String],
}

/// Checks the parts of a request (method, origin, names the templates read, TLS, identity)
/// and makes the call, reporting problems at `cx.at`.
pub fn assemble(r: RequestParts<'_>, cx: &mut Cx<'_>) -> HttpCall {
    let hp = cx.at.clone();
    let (names, p) = (cx.names, &mut *cx.p);
    let method = r.method.to_ascii_uppercase();
    if !["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"].contains(&method.as_str()) {
        p.push(
            format!("{hp}.method"),
            format!("`{}` is not one of GET, POST, PUT, PATCH, DELETE, HEAD", r.method),
        );
    }
    let mut origin = String::new();
    let mut secrets = Vec::new();
    let mut claims = Vec::new();
    if let Some(u) = &r.url {
        check_request_template(u, names, &format!("{hp}.url"), p, &mut secrets, &mut claims);
        match literal_origin(u) {
            Ok(o) => origin = o,
            Err(e) => p.push(format!("{hp}.url"), e),
        }
        if u.literal_prefix().len() > origin.len()
            && has_dot_segment(path_of(&u.literal_prefix()[origin.len()..]))
        {
            p.push(format!("{hp}.url"), "the path has a `.` or `..` segment");
        }
    }
    for (k, t) in &r.headers {
        if let Some(why) = header_name_problem(k, &[]) {
            p.push(format!("{hp}.headers.{k}"), why);
        }
        check_request_template(
            t,
            names,
            &format!("{hp}.headers.{k}"),
            p,
            &mut secrets,
            &mut claims,
        );
    }
    if let Some(jt) = &r.body {
        for t in jt.templates() {
            check_request_template(t, names, &format!("{hp}.body"), p, &mut secrets, &mut claims);
        }
    }
    let tls = r
        .tls
        .map(|t| compile_tls(t, &format!("{hp}.tls"), &origin, p, &mut secrets));
    if r.body.is_some() && matches!(method.as_str(), "GET" | "HEAD") {
        p.push(format!("{hp}.body"), format!("{method} requests carry no body"));
    }
    let identity = r.identity.and_then(|i| {
        // Up to the first placeholder: what of the URL is known before a call.
        let literal = r.url.as_ref().map_or("", Template::literal_prefix);
        crate::spec::identity::compile(i, &format!("{hp}.identity"), literal, p)
    });
    if identity.is_some()
        && let Some((k, _)) = r
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    {
        p.push(
            format!("{hp}.headers.{k}"),
            "`identity` sets the Authorization header of this tool's requests; remove this header",
        );
    }
    let project = project::compile(r.project, &format!("{hp}.project"), p).map(std::sync::Arc::new);
    HttpCall {
        project,
        identity,
        claims,
        timeout: duration(r.timeout, &format!("{hp}.timeout"), p),
        max_response_bytes: byte_cap(r.max_response_bytes, &format!("{hp}.maxResponseBytes"), p),
        method,
        url: r.url.unwrap_or_else(Template::empty),
        origin,
        headers: r.headers,
        body: r.body,
        secrets,
        tls,
        args: None,
        auth: None,
        guarded: false,
    }
}

/// Compiles `tls:` (of an http tool or upstream at `at`), adding its Secret values to
/// `secrets`; `origin` is the literal `scheme://authority` of the URL (empty if unknown).
pub fn compile_tls(
    t: &TlsSpec,
    at: &str,
    origin: &str,
    p: &mut Problems,
    secrets: &mut Vec<SecretRef>,
) -> TlsRefs {
    if !origin.is_empty() && !origin.starts_with("https://") {
        p.push(at, "needs an https url");
    }
    if t.ca_secret.is_none() && t.ca_config_map.is_none() && t.client_cert_secret.is_none() {
        p.push(at, "set caSecret or caConfigMap, clientCertSecret, or both");
    }
    if t.ca_secret.is_some() && t.ca_config_map.is_some() {
        p.push(at, "caSecret and caConfigMap both name the CAs to trust: set one");
    }
    if let Some(n) = &t.ca_config_map
        && !valid_config_map_name(n)
    {
        p.push(
            format!("{at}.caConfigMap"),
            "not a ConfigMap name (1-253 lower-case letters, digits, `-` and `.`)",
        );
    }
    let mut named = |field: &str, name: &Option<String>, key: &str| {
        let n = name.as_ref()?;
        if !valid_secret_part(n) {
            p.push(
                format!("{at}.{field}"),
                "not a Secret name (letters, digits, `-`, `_`)",
            );
        }
        let r = SecretRef {
            name: n.clone(),
            key: key.to_owned(),
        };
        if !secrets.contains(&r) {
            secrets.push(r.clone());
        }
        Some(r)
    };
    let ca = named("caSecret", &t.ca_secret, "ca.crt");
    let cert = named("clientCertSecret", &t.client_cert_secret, "tls.crt");
    let key = named("clientCertSecret", &t.client_cert_secret, "tls.key");
    // A ConfigMap's CAs go through the same store, under a name no Secret can have.
    let ca = ca.or_else(|| {
        let r = SecretRef {
            name: format!("{}{}", CONFIG_MAP_PREFIX, t.ca_config_map.as_ref()?),
            key: "ca.crt".to_owned(),
        };
        if !secrets.contains(&r) {
            secrets.push(r.clone());
        }
        Some(r)
    });
    TlsRefs {
        ca,
        client: cert.zip(key),
    }
}
