//! Asks each ready server pod which config it has loaded and which upstreams it reaches
//! (`GET :9090/status`: `configHash`, `upstreams`), to report `status.configLoadedReplicas`
//! and the `UpstreamsReady` condition. Plain HTTP/1.0 over a
//! TCP stream with a short timeout: this runs inside the cluster network, next to the pods.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use quiver_model::redact::untrusted;

use crate::build;

const TIMEOUT: Duration = Duration::from_millis(500);
const MAX_BODY: u64 = 1024 * 1024;
/// Longest upstream name copied from a pod's `/status`, in characters.
const MAX_NAME_CHARS: usize = 63;
/// Longest reason copied from a pod's `/status`, in characters.
const MAX_REASON_CHARS: usize = 300;

/// What one pod's `/status` says.
#[derive(Debug, Clone, Default, PartialEq)]
struct PodStatus {
    hash: Option<String>,
    /// Upstreams that are not connected: name and why.
    down: Vec<(String, String)>,
    /// The protocol revision each connected upstream is spoken to in: name and version.
    revisions: Vec<(String, String)>,
}

/// Whether `v` looks like a protocol revision (`2025-11-25`): what a pod says is copied
/// into the status only then.
fn revision(v: &str) -> bool {
    v.len() == 10 && v.bytes().all(|b| b.is_ascii_digit() || b == b'-')
}

fn parse_status(v: &serde_json::Value) -> PodStatus {
    let down = v["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|u| u["state"].as_str() != Some("ready"))
        .filter_map(|u| {
            // Copied into a condition and an event that anyone who may read McpServers or
            // events sees: whatever the pod (or an upstream through it) says is redacted,
            // bounded and kept to one line.
            let name = untrusted(u["name"].as_str()?, &[], MAX_NAME_CHARS);
            let why = untrusted(
                u["error"].as_str().or(u["state"].as_str()).unwrap_or("unknown"),
                &[],
                MAX_REASON_CHARS,
            );
            Some((name, why))
        })
        .collect();
    let revisions = v["upstreams"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| {
            let version = u["protocolVersion"].as_str().filter(|v| revision(v))?;
            let name = untrusted(u["name"].as_str()?, &[], MAX_NAME_CHARS);
            Some((name, version.to_owned()))
        })
        .collect();
    PodStatus {
        hash: v["configHash"].as_str().map(str::to_owned),
        down,
        revisions,
    }
}

async fn pod_status(ip: &str) -> Option<PodStatus> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect((ip, build::ADMIN_PORT as u16))
            .await
            .ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: quiver\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.take(MAX_BODY).read_to_end(&mut buf).await.ok()?;
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        let v: serde_json::Value = serde_json::from_slice(&buf[split + 4..]).ok()?;
        Some(parse_status(&v))
    };
    tokio::time::timeout(TIMEOUT, fetch).await.ok().flatten()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// What the ready pods of an McpServer report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodsReport {
    /// Ready pods that report the config hash asked about.
    pub loaded: i32,
    /// Ready pods that answered.
    pub answered: i32,
    /// Each upstream some pod reports down: its name, on how many pods, and one reason.
    pub upstreams_down: Vec<(String, i32, String)>,
    /// Each connected upstream's protocol revision: its name, and the revisions the pods
    /// report (two during a change), joined by `, `.
    pub upstream_revisions: Vec<(String, String)>,
}

fn summarize(statuses: &[Option<PodStatus>], hash: &str) -> PodsReport {
    let mut r = PodsReport::default();
    let mut down: std::collections::BTreeMap<String, (i32, String)> = std::collections::BTreeMap::new();
    let mut revisions: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for s in statuses.iter().flatten() {
        r.answered += 1;
        if s.hash.as_deref() == Some(hash) {
            r.loaded += 1;
        }
        for (name, version) in &s.revisions {
            revisions.entry(name.clone()).or_default().insert(version.clone());
        }
        for (name, why) in &s.down {
            let e = down.entry(name.clone()).or_insert_with(|| (0, why.clone()));
            e.0 += 1;
        }
    }
    r.upstreams_down = down.into_iter().map(|(n, (c, w))| (n, c, w)).collect();
    r.upstream_revisions = revisions
        .into_iter()
        .map(|(n, v)| (n, v.into_iter().collect::<Vec<_>>().join(", ")))
        .collect();
    r
}

/// Asks the ready pods of `name` which config they serve and which upstreams they reach.
///
/// # Errors
/// Listing the pods failed.
pub async fn probe(
    client: &kube::Client,
    ns: &str,
    name: &str,
    hash: &str,
) -> Result<PodsReport, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&build::selector_string(name)))
        .await?;
    let ips: Vec<String> = list
        .items
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let statuses = futures_util::future::join_all(ips.iter().map(|ip| pod_status(ip))).await;
    Ok(summarize(&statuses, hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pods_reports_count_hashes_and_down_upstreams() {
        let a = parse_status(&json!({"configHash": "h1", "upstreams": [
            {"name": "github", "state": "down", "error": "not available: connection refused"},
            {"name": "docs", "state": "ready", "error": null},
        ]}));
        let b = parse_status(
            &json!({"configHash": "h1", "upstreams": [{"name": "github", "state": "starting"}]}),
        );
        let c = parse_status(&json!({"configHash": "h0", "upstreams": [
            {"name": "docs", "state": "ready", "protocolVersion": "2026-07-28"},
            {"name": "evil", "state": "ready", "protocolVersion": "2026-07-28\nUpstreamsReady=True"},
        ]}));
        let r = summarize(&[Some(a.clone()), Some(b), Some(c), None], "h1");
        assert_eq!((r.loaded, r.answered), (2, 3));
        // A version that is not one is never copied; `a` says none for `docs`.
        assert_eq!(
            r.upstream_revisions,
            vec![("docs".to_owned(), "2026-07-28".to_owned())]
        );
        // Pods that speak to it in different revisions (a change under way): both shown.
        let old = parse_status(
            &json!({"upstreams": [{"name": "docs", "state": "ready", "protocolVersion": "2025-06-18"}]}),
        );
        let new = parse_status(
            &json!({"upstreams": [{"name": "docs", "state": "ready", "protocolVersion": "2026-07-28"}]}),
        );
        let both = summarize(&[Some(old), Some(new)], "h1");
        assert_eq!(
            both.upstream_revisions,
            vec![("docs".to_owned(), "2025-06-18, 2026-07-28".to_owned())]
        );
        assert_eq!(
            r.upstreams_down,
            vec![(
                "github".to_owned(),
                2,
                "not available: connection refused".to_owned()
            )]
        );
        let hostile = parse_status(
            &json!({"configHash": 7, "upstreams": [{"name": "x".repeat(1000), "state": "down", "error": "e".repeat(100_000)}, 5, {"state": "down"}]}),
        );
        assert_eq!(hostile.hash, None);
        assert_eq!(hostile.down.len(), 1);
        assert_eq!(
            (
                hostile.down[0].0.chars().count(),
                hostile.down[0].1.chars().count()
            ),
            (MAX_NAME_CHARS + 1, MAX_REASON_CHARS + 1)
        );
    }

    #[test]
    fn reasons_are_redacted_and_one_line() {
        let forged = parse_status(&json!({"upstreams": [{
            "name": "gh\nforged",
            "state": "down",
            "error": "initialize: error -32001: invalid credentials: Bearer ghp_0123456789abcdefABCDEF\nUpstreamsReady=True \u{202e}x",
        }]}));
        let (name, why) = &forged.down[0];
        assert_eq!(name, "gh forged");
        assert!(
            !why.contains("ghp_") && why.contains("Bearer [redacted]"),
            "{why}"
        );
        assert!(!why.contains('\n') && !why.contains('\u{202e}'), "{why}");
    }
}
