//! `kubectl quiver revoke NAME --subject ISS|SUB [--upstream UPSTREAM]`: forgets the upstream
//! tokens a user got by signing in through an McpServer (`spec.auth.upstreamSignIn`), on
//! every ready pod the McpServer owns, through the API server's pod proxy to each pod's admin
//! port (`DELETE /oauth/tokens`), and reports what each pod removed.

use std::fmt::Write as _;
use std::time::Duration;

use futures_util::{StreamExt, stream};
use kube::Client;
use kube::api::Api;
use serde_json::{Value, json};

use super::Failure;
use super::reach::{api_server_status, kube_failure, owned_pods, read};
use super::term::line;
use crate::build::{ADMIN_PORT, is_dns_label};
use crate::crd::McpServer;

/// Longest subject accepted, in bytes (an issuer URL, `|`, a `sub` claim).
pub const MAX_SUBJECT_BYTES: usize = 2048;
/// Longest wait for one pod's answer, body included.
const POD_TIMEOUT: Duration = Duration::from_secs(10);
/// Pods asked at once.
const AT_ONCE: usize = 8;
/// Most characters of a pod's error answer shown.
const SHOWN: usize = 200;

/// What was asked of the pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `ISSUER|SUBJECT`, as the pods key users' tokens.
    pub subject: String,
    /// One upstream only, or every upstream the user signed in to.
    pub upstream: Option<String>,
}

/// What one pod did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// It answered, with how many upstreams' tokens it removed.
    Removed(u64),
    /// It could not be asked or did not confirm.
    Failed(String),
    /// Not ready: not asked.
    NotAsked,
}

/// The outcome on every pod of the McpServer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revocation {
    /// `NAMESPACE/NAME` of the McpServer.
    pub mcp_server: String,
    /// What was asked.
    pub request: Request,
    /// Whether the tokens are in a Redis every pod shares (then one pod's answer covers all).
    pub shared: bool,
    /// Each pod, by name.
    pub pods: Vec<(String, PodOutcome)>,
}

impl Revocation {
    /// Upstream tokens removed, over every pod.
    pub fn removed(&self) -> u64 {
        self.pods
            .iter()
            .map(|(_, o)| match o {
                PodOutcome::Removed(n) => *n,
                _ => 0,
            })
            .sum()
    }

    /// Whether nothing of the user's can be left: every pod asked confirmed, and a pod not
    /// asked keeps nothing of its own (the tokens are in the shared Redis).
    pub fn complete(&self) -> bool {
        let confirmed = self.pods.iter().any(|(_, o)| matches!(o, PodOutcome::Removed(_)));
        confirmed
            && self.pods.iter().all(|(_, o)| match o {
                PodOutcome::Removed(_) => true,
                PodOutcome::Failed(_) => false,
                PodOutcome::NotAsked => self.shared,
            })
    }
}

/// An upstream name as a ToolSet spells it: 1-63 of `a-z 0-9 -`, starting with a letter,
/// not ending with `-`.
fn upstream_name(n: &str) -> bool {
    (1..=63).contains(&n.len())
        && n.starts_with(|c: char| c.is_ascii_lowercase())
        && !n.ends_with('-')
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Request {
    /// Checks the command line's values.
    ///
    /// # Errors
    /// [`Failure::Usage`] naming what is wrong.
    pub fn new(subject: &str, upstream: Option<&str>) -> Result<Self, Failure> {
        let usage = |m: &str| {
            Failure::Usage(format!(
                "--subject {m}: give ISSUER|SUBJECT, the issuer of the user's access tokens (their `iss`, exactly, e.g. https://login.example.com/realms/corp), `|`, and their `sub` claim"
            ))
        };
        if subject.len() > MAX_SUBJECT_BYTES {
            return Err(usage(&format!("is over {MAX_SUBJECT_BYTES} bytes")));
        }
        if subject.chars().any(char::is_control) {
            return Err(usage("holds a control character"));
        }
        let Some((issuer, sub)) = subject.split_once('|') else {
            return Err(usage("has no `|`"));
        };
        if !(issuer.starts_with("https://") || issuer.starts_with("http://")) {
            return Err(usage("does not start with the issuer's URL"));
        }
        if sub.is_empty() {
            return Err(usage("has nothing after `|`"));
        }
        if let Some(u) = upstream
            && !upstream_name(u)
        {
            return Err(Failure::Usage(format!(
                "--upstream `{}` is not an upstream name (1-63 of a-z 0-9 -, starting with a letter)",
                line(u)
            )));
        }
        Ok(Self {
            subject: subject.to_owned(),
            upstream: upstream.map(str::to_owned),
        })
    }

    /// The pods' admin path: `/oauth/tokens?subject=…[&upstream=…]`, each value
    /// percent-encoded.
    pub fn path(&self) -> String {
        let mut p = format!("/oauth/tokens?subject={}", encode(&self.subject));
        if let Some(u) = &self.upstream {
            let _ = write!(p, "&upstream={}", encode(u));
        }
        p
    }
}

/// `s` with every byte but the unreserved ones (RFC 3986) percent-encoded.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Asks every ready pod of the McpServer `name` to forget what `request` names.
///
/// # Errors
/// [`Failure::Usage`] when the McpServer has no `spec.auth.upstreamSignIn`;
/// [`Failure::Kube`] when it or its pods cannot be read, or none of its pods is ready.
pub async fn revoke(client: &Client, ns: &str, name: &str, request: Request) -> Result<Revocation, Failure> {
    if !is_dns_label(ns) {
        return Err(Failure::Usage(format!("`{}` is not a namespace name", line(ns))));
    }
    let mcp = Api::<McpServer>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| kube_failure(&format!("McpServer {ns}/{name}"), &e))?;
    let Some(sign_in) = mcp.spec.auth.as_ref().and_then(|a| a.upstream_sign_in.as_ref()) else {
        return Err(Failure::Usage(format!(
            "McpServer {ns}/{name} has no spec.auth.upstreamSignIn: no user signs in to upstreams through it"
        )));
    };
    let uid = mcp.metadata.uid.as_deref().unwrap_or_default();
    let owned = owned_pods(client, ns, name, uid).await?;
    if !owned.iter().any(|p| p.ready) {
        return Err(Failure::Kube(format!(
            "no ready pod of McpServer {ns}/{name} owned by its Deployment (kubectl quiver status {name} -n {ns})"
        )));
    }
    let path = request.path();
    let pods = stream::iter(owned)
        .map(|p| {
            let path = &path;
            async move {
                let outcome = if p.ready {
                    ask(client, ns, &p.name, path).await
                } else {
                    PodOutcome::NotAsked
                };
                (p.name, outcome)
            }
        })
        .buffered(AT_ONCE)
        .collect()
        .await;
    Ok(Revocation {
        mcp_server: format!("{ns}/{name}"),
        request,
        shared: sign_in.redis.is_some(),
        pods,
    })
}

/// Sends the DELETE to one pod's admin port through the API server's pod proxy.
async fn ask(client: &Client, ns: &str, pod: &str, path: &str) -> PodOutcome {
    let uri = format!("/api/v1/namespaces/{ns}/pods/{pod}:{ADMIN_PORT}/proxy{path}");
    let request = match http::Request::delete(uri).body(kube::client::Body::empty()) {
        Ok(r) => r,
        Err(e) => return PodOutcome::Failed(format!("cannot build the request: {e}")),
    };
    let answer = tokio::time::timeout(POD_TIMEOUT, async {
        let response = client.send(request).await.map_err(|e| e.to_string())?;
        read(response).await.map_err(|e| e.to_string())
    })
    .await;
    let answer = match answer {
        Err(_) => return PodOutcome::Failed(format!("no answer within {}s", POD_TIMEOUT.as_secs())),
        Ok(Err(e)) => return PodOutcome::Failed(e),
        Ok(Ok(a)) => a,
    };
    if let Some(message) = api_server_status(&answer) {
        return PodOutcome::Failed(format!(
            "the API server's pod proxy answered {}: {message}",
            answer.status
        ));
    }
    let text = || {
        String::from_utf8_lossy(&answer.body)
            .chars()
            .take(SHOWN)
            .collect::<String>()
    };
    match answer.status {
        200 => match serde_json::from_slice::<Value>(&answer.body)
            .ok()
            .and_then(|v| v.get("removed")?.as_u64())
        {
            Some(n) => PodOutcome::Removed(n),
            None => PodOutcome::Failed(format!(
                "answered 200 without a count of removed tokens: {}",
                text()
            )),
        },
        404 | 405 => PodOutcome::Failed(format!(
            "its admin port does not serve DELETE /oauth/tokens ({}): upstream sign-in is off in this pod, or its quiver-server is older than the plugin",
            answer.status
        )),
        status => PodOutcome::Failed(format!("answered {status}: {}", text())),
    }
}

/// The text form: one line per pod, then the total.
pub fn as_text(r: &Revocation) -> String {
    let width = r
        .pods
        .iter()
        .map(|(n, _)| line(n).chars().count())
        .max()
        .unwrap_or(3)
        .clamp(3, 63);
    let mut out = format!("{:<width$}  REMOVED\n", "POD");
    for (name, outcome) in &r.pods {
        let what = match outcome {
            PodOutcome::Removed(n) => n.to_string(),
            PodOutcome::Failed(e) => format!("error: {}", line(e)),
            PodOutcome::NotAsked if r.shared => {
                "not ready: not asked (its tokens are in the shared Redis)".to_owned()
            }
            PodOutcome::NotAsked => {
                "not ready: not asked; tokens it keeps in memory stay until it is asked again or restarts"
                    .to_owned()
            }
        };
        let _ = writeln!(out, "{:<width$}  {what}", line(name));
    }
    let upstream = r.request.upstream.as_deref().map_or_else(
        || "every upstream".to_owned(),
        |u| format!("upstream {}", line(u)),
    );
    let _ = writeln!(
        out,
        "{} upstream token(s) of {} removed from McpServer {} ({upstream}){}",
        r.removed(),
        line(&r.request.subject),
        line(&r.mcp_server),
        if r.complete() {
            ""
        } else {
            "; INCOMPLETE: run it again"
        },
    );
    out
}

/// The JSON form.
pub fn as_json(r: &Revocation) -> Value {
    json!({
        "mcpServer": r.mcp_server,
        "subject": r.request.subject,
        "upstream": r.request.upstream,
        "shared": r.shared,
        "removed": r.removed(),
        "complete": r.complete(),
        "pods": r.pods.iter().map(|(name, o)| match o {
            PodOutcome::Removed(n) => json!({"name": name, "removed": n}),
            PodOutcome::Failed(e) => json!({"name": name, "error": e}),
            PodOutcome::NotAsked => json!({"name": name, "asked": false, "ready": false}),
        }).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
#[path = "revoke_tests.rs"]
mod tests;
