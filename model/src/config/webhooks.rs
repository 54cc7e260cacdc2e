//! Guardrail webhooks (`webhooks:`): services asked about a tool call before it runs (its
//! arguments) or before its result leaves the server (its result), which allow it, refuse
//! it, or (mutating ones) rewrite it. Their YAML shape and compiled form; the server makes
//! the requests (`server/src/exec/hooks.rs`).
//!
//! The request and answer follow Open Policy Agent's Data API, so OPA (or any service
//! answering the same shape) serves as a webhook without an adapter: Quiver POSTs
//! `{"input": {...}}` and reads `{"result": {"allowed": .., "reason": .., "arguments": ..,
//! "result": ..}}`.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::handlers::http::{TlsRefs, TlsSpec, compile_tls};
use crate::spec::context::{Problems, SecretRef, valid_secret_part};

/// Most webhooks of one ToolSet.
pub const MAX_WEBHOOKS: usize = 16;
/// Default and largest time a webhook has to answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
const MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// Default and largest request and answer body, in bytes.
pub const DEFAULT_MAX_BYTES: usize = 1 << 20;
const MAX_MAX_BYTES: u64 = 16 << 20;

/// Whether a webhook only decides, or may also rewrite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HookType {
    /// Allows or refuses.
    #[default]
    Validating,
    /// Allows (with the arguments or the result it returns instead) or refuses.
    Mutating,
}

/// What a webhook is asked about.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// A call's arguments, before the tool runs.
    #[default]
    Arguments,
    /// A call's result, before it is sent.
    Result,
}

/// What happens to a call when its webhook cannot be reached, times out, or answers
/// something other than a decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FailurePolicy {
    /// The call is refused (arguments) or its result withheld (result).
    #[default]
    Fail,
    /// The call goes on as if the webhook had allowed it unchanged (counted as a failure).
    Ignore,
}

/// A Secret key, `{name: NAME, key: KEY}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in it.
    pub key: String,
}

/// A guardrail webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookSpec {
    /// Its name, which refusals, metrics and the audit trail use (1-63 characters of a-z, 0-9
    /// and `-`).
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Where the request goes: an `https` URL (an `http` one only to `127.0.0.1` or `[::1]`,
    /// a policy agent in the pod's network), e.g. OPA's
    /// `https://opa.guard.svc:8181/v1/data/mcp/arguments`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// `validating` (default: allows or refuses) or `mutating` (may also return the
    /// arguments or the result to use instead, which must still fit the tool's schemas).
    #[serde(default, rename = "type")]
    pub kind: HookType,
    /// `arguments` (default: before the tool runs) or `result` (before the result is sent).
    #[serde(default)]
    pub on: Phase,
    /// Tools it applies to, by name; a name ending in `*` matches every tool whose name
    /// starts with the rest. With neither `tools` nor `upstreams`, every tool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 129)))]
    pub tools: Vec<String>,
    /// Upstreams whose imported tools it applies to, by the upstream's `name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub upstreams: Vec<String>,
    /// `Fail` (default: the call is refused, or its result withheld, when the webhook does
    /// not decide) or `Ignore` (the call goes on unchanged).
    #[serde(default)]
    pub failure_policy: FailurePolicy,
    /// Time the webhook has to answer (default `2s`, at most `30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Largest request and answer body, in bytes (default 1 MiB, at most 16 MiB). A call
    /// whose request would be larger is handled as a failure of the webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = 16777216))]
    pub max_bytes: Option<u64>,
    /// The CA to trust for the webhook's server, and a client certificate to present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// A Secret key whose value signs each request: the header `X-Quiver-Signature:
    /// t=UNIX_SECONDS,v1=HEX`, HMAC-SHA256 over `UNIX_SECONDS.BODY`, so the webhook can check
    /// that a request comes from this server and is fresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hmac_secret: Option<SecretKeyRef>,
}

/// A compiled webhook.
#[derive(Debug)]
pub struct Webhook {
    /// Its name.
    pub name: Box<str>,
    /// Its URL.
    pub url: http_uri::Checked,
    /// Validating or mutating.
    pub kind: HookType,
    /// What it is asked about.
    pub on: Phase,
    /// What a call does when it does not decide.
    pub failure_policy: FailurePolicy,
    /// Time it has to answer.
    pub timeout: Duration,
    /// Largest request and answer body.
    pub max_bytes: usize,
    /// TLS material, when set.
    pub tls: Option<TlsRefs>,
    /// The signing key, when set.
    pub hmac: Option<SecretRef>,
    /// Every Secret value it reads (TLS, signing key).
    pub secrets: Vec<SecretRef>,
    tools: Vec<String>,
    upstreams: Vec<String>,
}

impl Webhook {
    /// Whether it applies to the tool `name`, imported from `upstream` (empty: a tool of the
    /// ToolSet's own).
    pub fn picks(&self, name: &str, upstream: &str) -> bool {
        if self.tools.is_empty() && self.upstreams.is_empty() {
            return true;
        }
        let by_name = self.tools.iter().any(|t| match t.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => t == name,
        });
        by_name || (!upstream.is_empty() && self.upstreams.iter().any(|u| u == upstream))
    }
}

/// The webhooks a tool's calls go through, in declared order, by phase.
#[derive(Debug, Default)]
pub struct ToolHooks {
    /// Asked about the arguments.
    pub arguments: Box<[Arc<Webhook>]>,
    /// Asked about the result.
    pub result: Box<[Arc<Webhook>]>,
}

/// The compiled `webhooks` of a ToolSet.
#[derive(Debug, Default)]
pub struct WebhookSet {
    /// Every webhook, in declared order.
    pub hooks: Vec<Arc<Webhook>>,
}

impl WebhookSet {
    /// The webhooks of the tool `name` (imported from `upstream`, or empty); `None` when none
    /// applies, and its calls pay nothing.
    pub fn for_tool(&self, name: &str, upstream: &str) -> Option<Box<ToolHooks>> {
        let pick = |on: Phase| -> Box<[Arc<Webhook>]> {
            self.hooks
                .iter()
                .filter(|h| h.on == on && h.picks(name, upstream))
                .cloned()
                .collect()
        };
        let hooks = ToolHooks {
            arguments: pick(Phase::Arguments),
            result: pick(Phase::Result),
        };
        (!hooks.arguments.is_empty() || !hooks.result.is_empty()).then(|| Box::new(hooks))
    }

    /// Every Secret value the webhooks read.
    pub fn secrets(&self) -> impl Iterator<Item = &SecretRef> {
        self.hooks.iter().flat_map(|h| &h.secrets)
    }
}

/// A webhook URL, checked at load.
pub mod http_uri {
    /// An `https` URL, or an `http` one to a loopback address.
    #[derive(Debug, Clone)]
    pub struct Checked(pub(super) String);

    impl Checked {
        /// The URL.
        pub fn as_str(&self) -> &str {
            &self.0
        }
    }

    /// Checks `url`: absolute, `https` (or `http` to the IP literals `127.0.0.1`, `[::1]`),
    /// with a host of plain characters, no user or password, no fragment.
    pub fn check(url: &str) -> Result<Checked, String> {
        let (scheme, rest) = url.split_once("://").ok_or("not an absolute URL")?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.is_empty() {
            return Err("names no host".into());
        }
        if authority.contains('@') {
            return Err("may not carry a user or password (use hmacSecret or tls.clientCertSecret)".into());
        }
        if url.contains('#')
            || url
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '\\')
        {
            return Err("may not have a fragment, spaces, backslashes or control characters".into());
        }
        let host_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']');
        if !authority.chars().all(host_chars) {
            return Err(
                "its host and port may hold only letters, digits, `.`, `-`, `:` and IPv6 brackets".into(),
            );
        }
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        match scheme.to_ascii_lowercase().as_str() {
            "https" => Ok(Checked(url.to_owned())),
            // An IP literal: a name (`localhost`) is whatever the resolver says it is.
            "http" if host == "127.0.0.1" || (host == "::1" && authority.starts_with("[::1]")) => {
                let port_ok = authority
                    .rsplit_once(if host == "::1" { "]" } else { ":" })
                    .is_none_or(|(_, p)| {
                        p.is_empty() || p.trim_start_matches(':').bytes().all(|b| b.is_ascii_digit())
                    });
                if port_ok {
                    Ok(Checked(url.to_owned()))
                } else {
                    Err("its port is not a number".into())
                }
            }
            "http" => Err("must be https (http only to 127.0.0.1 or [::1]: a sidecar in the pod)".into()),
            _ => Err("must be https".into()),
        }
    }
}

/// Compiles `webhooks` (at `webhooks`).
pub fn compile(specs: &[WebhookSpec], p: &mut Problems) -> WebhookSet {
    if specs.len() > MAX_WEBHOOKS {
        p.push("webhooks", format!("at most {MAX_WEBHOOKS} webhooks"));
        return WebhookSet::default();
    }
    let mut hooks = Vec::with_capacity(specs.len());
    let mut names = std::collections::BTreeSet::new();
    for (i, s) in specs.iter().enumerate() {
        let at = format!("webhooks[{i}]");
        if let Some(h) = compile_one(s, &at, p) {
            if !names.insert(s.name.clone()) {
                p.push(
                    format!("{at}.name"),
                    format!("`{}` is the name of an earlier webhook", s.name),
                );
            }
            hooks.push(Arc::new(h));
        }
    }
    WebhookSet { hooks }
}

fn compile_one(s: &WebhookSpec, at: &str, p: &mut Problems) -> Option<Webhook> {
    let before = p.0.len();
    let name_ok = (1..=63).contains(&s.name.len())
        && s.name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.name.starts_with('-');
    if !name_ok {
        p.push(format!("{at}.name"), "1-63 characters of a-z, 0-9 and `-`");
    }
    let url = http_uri::check(&s.url)
        .map_err(|e| p.push(format!("{at}.url"), e))
        .ok();
    let timeout = match s.timeout.as_deref().map(crate::spec::checks::parse_duration) {
        None => DEFAULT_TIMEOUT,
        Some(Ok(d)) if !d.is_zero() && d <= MAX_TIMEOUT => d,
        Some(Ok(_)) => {
            p.push(format!("{at}.timeout"), "more than 0, at most 30s");
            DEFAULT_TIMEOUT
        }
        Some(Err(e)) => {
            p.push(format!("{at}.timeout"), e);
            DEFAULT_TIMEOUT
        }
    };
    let max_bytes = match s.max_bytes {
        None => DEFAULT_MAX_BYTES,
        Some(n) if (1024..=MAX_MAX_BYTES).contains(&n) => usize::try_from(n).unwrap_or(DEFAULT_MAX_BYTES),
        Some(_) => {
            p.push(format!("{at}.maxBytes"), "1024 to 16777216");
            DEFAULT_MAX_BYTES
        }
    };
    for (field, list, max) in [("tools", &s.tools, 129), ("upstreams", &s.upstreams, 63)] {
        if list.len() > 64 || list.iter().any(|t| t.is_empty() || t.len() > max) {
            p.push(
                format!("{at}.{field}"),
                format!("at most 64 entries of 1-{max} characters"),
            );
        }
    }
    let mut secrets = Vec::new();
    let origin = url.as_ref().map_or("", |u| u.as_str());
    let tls = s
        .tls
        .as_ref()
        .map(|t| compile_tls(t, &format!("{at}.tls"), origin, p, &mut secrets));
    let hmac = s.hmac_secret.as_ref().and_then(|r| {
        if !valid_secret_part(&r.name) || !valid_secret_part(&r.key) {
            p.push(
                format!("{at}.hmacSecret"),
                "a Secret name and key (letters, digits, `-`, `_`)",
            );
            return None;
        }
        let r = SecretRef {
            name: r.name.clone(),
            key: r.key.clone(),
        };
        secrets.push(r.clone());
        Some(r)
    });
    if p.0.len() != before {
        return None;
    }
    Some(Webhook {
        name: s.name.as_str().into(),
        url: url?,
        kind: s.kind,
        on: s.on,
        failure_policy: s.failure_policy,
        timeout,
        max_bytes,
        tls,
        hmac,
        secrets,
        tools: s.tools.clone(),
        upstreams: s.upstreams.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compiled(yaml: &str) -> Result<WebhookSet, Vec<String>> {
        let specs: Vec<WebhookSpec> = serde_saphyr::from_str(yaml).expect("specs");
        let mut p = Problems(Vec::new());
        let set = compile(&specs, &mut p);
        if p.0.is_empty() {
            Ok(set)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn urls_must_be_https_or_loopback_and_carry_no_credentials() {
        assert!(compiled("[{name: a, url: 'https://opa.guard.svc:8181/v1/data/mcp'}]").is_ok());
        assert!(compiled("[{name: a, url: 'http://127.0.0.1:8181/v1/data/mcp'}]").is_ok());
        for bad in [
            "http://opa.guard.svc/v1",
            "https://user:pw@opa/v1",
            "ftp://x/y",
            "opa/v1",
            "https:///v1",
            "https://opa/v1#x",
            "http://localhost:8181/v1",
            "http://127.0.0.1:80\\.evil.com/",
            "http://127.0.0.1.evil.com/",
            "http://[::1]evil.com/",
            "https://opa%2eevil/v1",
        ] {
            let e = compiled(&format!("[{{name: a, url: '{bad}'}}]")).expect_err(bad);
            assert!(e.iter().any(|e| e.contains("webhooks[0].url")), "{bad}: {e:?}");
        }
    }

    #[test]
    fn bounds_names_and_selection() {
        let e = compiled("[{name: A_b, url: 'https://x/', timeout: 90s, maxBytes: 10}]").unwrap_err();
        assert!(e.iter().any(|e| e.contains(".name")), "{e:?}");
        assert!(e.iter().any(|e| e.contains(".timeout")), "{e:?}");
        assert!(e.iter().any(|e| e.contains(".maxBytes")), "{e:?}");
        let e = compiled("[{name: a, url: 'https://x/'}, {name: a, url: 'https://y/'}]").unwrap_err();
        assert!(e.iter().any(|e| e.contains("earlier webhook")), "{e:?}");
        let set = compiled(
            "[{name: all, url: 'https://x/'}, {name: gh, url: 'https://x/', on: result, tools: ['deploy*'], upstreams: [github]}]",
        )
        .unwrap();
        let hooks = set.for_tool("gh_search", "github").expect("hooks");
        assert_eq!((hooks.arguments.len(), hooks.result.len()), (1, 1));
        let hooks = set.for_tool("deploy_app", "").expect("hooks");
        assert_eq!(hooks.result[0].name.as_ref(), "gh");
        let hooks = set.for_tool("other", "").expect("the catch-all");
        assert!(hooks.result.is_empty());
        assert!(WebhookSet::default().for_tool("x", "").is_none());
    }

    #[test]
    fn tls_and_signing_keys_are_secrets() {
        let set = compiled(
            "[{name: a, url: 'https://x/', tls: {caSecret: guard-ca, clientCertSecret: guard-client}, hmacSecret: {name: guard-keys, key: hmac}}]",
        )
        .unwrap();
        let names: Vec<&str> = set.secrets().map(|s| s.name.as_str()).collect();
        assert!(
            names.contains(&"guard-keys") && names.contains(&"guard-client"),
            "{names:?}"
        );
    }
}
