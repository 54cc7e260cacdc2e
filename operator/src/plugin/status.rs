//! `kubectl quiver status`: the McpServer's status (conditions, hash, replicas, warnings) and,
//! for each pod, what its admin `/status` reports (through the API server's pod proxy): the
//! config hash and generation it serves, its upstreams' health and its last reload.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use super::Failure;
use super::reach::{kube_failure, read};
use super::term::line;
use crate::build::{ADMIN_PORT, selector_string};
use crate::crd::McpServer;

/// What one pod reports.
#[derive(Debug, Clone, PartialEq)]
pub struct PodReport {
    /// Pod name.
    pub name: String,
    /// Its Ready condition.
    pub ready: bool,
    /// Its admin `/status`, or why it could not be read.
    pub status: Result<Value, String>,
}

/// Reads the McpServer and its pods' `/status`.
///
/// # Errors
/// [`Failure::Kube`] when the McpServer or its pods cannot be read.
pub async fn gather(client: &Client, ns: &str, name: &str) -> Result<(McpServer, Vec<PodReport>), Failure> {
    let mcp = Api::<McpServer>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| kube_failure(&format!("McpServer {ns}/{name}"), &e))?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&selector_string(name)))
        .await
        .map_err(|e| kube_failure(&format!("pods of McpServer {ns}/{name}"), &e))?;
    let mut reports = Vec::new();
    for pod in pods.items {
        let Some(pod_name) = pod.metadata.name.clone() else {
            continue;
        };
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let status = if running {
            admin_status(client, ns, &pod_name).await
        } else {
            Err(format!(
                "not running ({})",
                pod.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("unknown")
            ))
        };
        reports.push(PodReport {
            name: pod_name,
            ready,
            status,
        });
    }
    reports.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((mcp, reports))
}

async fn admin_status(client: &Client, ns: &str, pod: &str) -> Result<Value, String> {
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:{ADMIN_PORT}/proxy/status");
    let request = http::Request::get(path)
        .body(kube::client::Body::empty())
        .map_err(|e| e.to_string())?;
    // The whole exchange, body included: a pod that trickles its answer does not hang us.
    let answer = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let response = client.send(request).await.map_err(|e| e.to_string())?;
        read(response).await.map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| "no answer within 10s".to_owned())??;
    if answer.status != 200 {
        return Err(format!(
            "admin /status answered {}: {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    serde_json::from_slice(&answer.body).map_err(|e| format!("admin /status is not JSON: {e}"))
}

/// Whether the McpServer is Ready.
pub fn is_ready(mcp: &McpServer) -> bool {
    mcp.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// The JSON form: the McpServer's status and each pod's report.
pub fn as_json(mcp: &McpServer, pods: &[PodReport]) -> Value {
    json!({
        "namespace": mcp.metadata.namespace,
        "name": mcp.metadata.name,
        "generation": mcp.metadata.generation,
        "status": mcp.status,
        "pods": pods.iter().map(|p| match &p.status {
            Ok(s) => json!({"name": p.name, "ready": p.ready, "status": s}),
            Err(e) => json!({"name": p.name, "ready": p.ready, "error": e}),
        }).collect::<Vec<_>>(),
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn ago(unix: Option<u64>, now: u64) -> String {
    match unix {
        Some(t) if t > 0 => {
            let s = now.saturating_sub(t);
            match s {
                0..120 => format!("{s}s ago"),
                120..7200 => format!("{}m ago", s / 60),
                _ => format!("{}h ago", s / 3600),
            }
        }
        _ => "never".to_owned(),
    }
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

/// The text form, for people (`now`: seconds since the epoch, for "ago").
// Long: one straight walk over the status, a section after another.
pub fn as_text(mcp: &McpServer, pods: &[PodReport], now_unix: Option<u64>) -> String {
    let now = now_unix.unwrap_or_else(now);
    let mut out = String::new();
    let status = mcp.status.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "McpServer {}/{}  generation {} (observed {})",
        line(mcp.metadata.namespace.as_deref().unwrap_or_default()),
        line(mcp.metadata.name.as_deref().unwrap_or_default()),
        mcp.metadata.generation.unwrap_or_default(),
        status
            .observed_generation
            .map_or_else(|| "none".to_owned(), |g| g.to_string()),
    );
    let _ = writeln!(
        out,
        "Replicas {}  Tools {}  Endpoint {}",
        line(status.replicas_summary.as_deref().unwrap_or("-")),
        status
            .tool_count
            .map_or_else(|| "-".to_owned(), |t| t.to_string()),
        line(status.endpoint.as_deref().unwrap_or("-")),
    );
    let hash = status.config_hash.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "Config hash {}  loaded by {} ready pod(s)",
        line(if hash.is_empty() { "-" } else { short(&hash) }),
        status
            .config_loaded_replicas
            .map_or_else(|| "?".to_owned(), |n| n.to_string()),
    );
    let _ = writeln!(
        out,
        "\nCONDITION         STATUS   REASON                     MESSAGE"
    );
    for c in &status.conditions {
        let _ = writeln!(
            out,
            "{:<17} {:<8} {:<26} {}",
            line(&c.type_),
            line(&c.status),
            line(&c.reason),
            line(&c.message)
        );
    }
    if !status.unsafe_sysctls.is_empty() {
        let _ = writeln!(
            out,
            "\nWarning: unsafe sysctls: {}",
            line(&status.unsafe_sysctls.join(", "))
        );
    }
    if !status.unwatched_config_maps.is_empty() {
        let _ = writeln!(
            out,
            "\nWarning: toolsFrom ConfigMaps without the quiver.dev/tools=true label (re-read every 5 minutes): {}",
            line(&status.unwatched_config_maps.join(", "))
        );
    }
    let _ = writeln!(
        out,
        "\nPOD                                 READY  CONFIG HASH          GEN  TOOLS  LAST RELOAD"
    );
    if pods.is_empty() {
        let _ = writeln!(out, "(no pods)");
    }
    for p in pods {
        let s = match &p.status {
            Ok(s) => s,
            Err(e) => {
                let _ = writeln!(out, "{:<35} {:<6} ({})", line(&p.name), p.ready, line(e));
                continue;
            }
        };
        let pod_hash = s.get("configHash").and_then(Value::as_str).unwrap_or_default();
        let mark = if hash.is_empty() {
            ""
        } else if pod_hash == hash {
            " current"
        } else {
            " STALE"
        };
        let reload = &s["lastReload"];
        let _ = writeln!(
            out,
            "{:<35} {:<6} {:<20} {:<4} {:<6} {} {}",
            line(&p.name),
            p.ready,
            format!("{}{mark}", line(short(pod_hash))),
            s.get("generation").and_then(Value::as_u64).unwrap_or_default(),
            s.get("tools").and_then(Value::as_u64).unwrap_or_default(),
            line(reload.get("result").and_then(Value::as_str).unwrap_or("-")),
            ago(reload.get("atUnix").and_then(Value::as_u64), now),
        );
        for problem in reload
            .get("problems")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let _ = writeln!(
                out,
                "    reload problem: {}",
                line(problem.as_str().unwrap_or_default())
            );
        }
        for u in s.get("upstreams").and_then(Value::as_array).into_iter().flatten() {
            let field = |k: &str| line(u.get(k).and_then(Value::as_str).unwrap_or_default()).into_owned();
            let mut text = format!(
                "    upstream {} ({}): {}, {} tools imported",
                field("name"),
                field("transport"),
                field("state"),
                u.get("imported").and_then(Value::as_u64).unwrap_or_default()
            );
            if let Some(e) = u.get("error").and_then(Value::as_str) {
                let _ = write!(text, "; error: {}", line(e));
            } else if let Some(e) = u.get("lastError").and_then(Value::as_str) {
                let _ = write!(
                    text,
                    "; last error {}: {}",
                    ago(u.get("lastErrorUnix").and_then(Value::as_u64), now),
                    line(e)
                );
            }
            let _ = writeln!(out, "{text}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_shows_conditions_pods_hashes_upstreams_and_reload_problems() {
        let mcp: McpServer = serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "calc", "namespace": "demo", "generation": 4},
            "spec": {},
            "status": {"observedGeneration": 4, "replicasSummary": "1/2", "toolCount": 3,
                "configHash": "0123456789abcdef", "configLoadedReplicas": 1,
                "endpoint": "http://calc.demo.svc:8080/mcp",
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "Progressing", "message": "1 of 2 pods ready", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "UpstreamsReady", "status": "False", "reason": "UpstreamDown", "message": "weather", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                ],
                "unsafeSysctls": ["net.core.somaxconn"], "unwatchedConfigMaps": []}
        }))
        .unwrap();
        let pods = vec![
            PodReport {
                name: "calc-a".into(),
                ready: true,
                status: Ok(
                    json!({"configHash": "0123456789abcdef", "generation": 2, "tools": 3,
                    "lastReload": {"result": "invalid", "atUnix": 1000, "problems": ["tools[0].handler: unknown builtin"]},
                    "upstreams": [{"name": "weather", "transport": "http", "state": "down", "imported": 0, "error": "connect refused"}]}),
                ),
            },
            PodReport {
                name: "calc-b".into(),
                ready: false,
                status: Ok(
                    json!({"configHash": "ffffffffffff0000", "generation": 1, "tools": 2,
                    "lastReload": {"result": "success", "atUnix": 970}}),
                ),
            },
            PodReport {
                name: "calc-c".into(),
                ready: false,
                status: Err("not running (Pending)".into()),
            },
        ];
        let text = as_text(&mcp, &pods, Some(1030));
        for want in [
            "McpServer demo/calc  generation 4 (observed 4)",
            "Replicas 1/2  Tools 3  Endpoint http://calc.demo.svc:8080/mcp",
            "Config hash 0123456789ab  loaded by 1 ready pod(s)",
            "UpstreamsReady    False    UpstreamDown               weather",
            "Warning: unsafe sysctls: net.core.somaxconn",
            "0123456789ab current",
            "ffffffffffff STALE",
            "invalid 30s ago",
            "success 60s ago",
            "    reload problem: tools[0].handler: unknown builtin",
            "    upstream weather (http): down, 0 tools imported; error: connect refused",
            "calc-c                              false  (not running (Pending))",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        assert!(!is_ready(&mcp));
        let j = as_json(&mcp, &pods);
        assert_eq!(j["pods"][0]["status"]["tools"], 3);
        assert_eq!(j["pods"][2]["error"], "not running (Pending)");
        assert_eq!(j["status"]["configHash"], "0123456789abcdef");
    }

    #[test]
    fn fields_from_the_status_and_the_pods_cannot_forge_lines() {
        let evil = "x\nFORGED\u{2028}FORGED\r\u{b}\u{c}\u{85}\u{2029}FORGED\u{61c}\u{fffa}";
        let mcp: McpServer = serde_json::from_value(json!({
            "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
            "metadata": {"name": "calc", "namespace": "demo", "generation": 1},
            "spec": {},
            "status": {"replicasSummary": evil, "endpoint": evil, "configHash": evil,
                "conditions": [{"type": evil, "status": evil, "reason": evil, "message": evil,
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "unsafeSysctls": [evil], "unwatchedConfigMaps": [evil]}
        }))
        .unwrap();
        let pods = vec![
            PodReport {
                name: evil.into(),
                ready: true,
                status: Ok(
                    json!({"configHash": evil, "lastReload": {"result": evil, "problems": [evil]},
                    "upstreams": [{"name": evil, "transport": evil, "state": evil, "error": evil},
                                  {"name": evil, "lastError": evil}]}),
                ),
            },
            PodReport {
                name: evil.into(),
                ready: false,
                status: Err(evil.into()),
            },
        ];
        let printed = super::super::term::text(&as_text(&mcp, &pods, Some(0))).into_owned();
        for l in printed.lines() {
            assert!(
                !l.trim_start().starts_with("FORGED"),
                "a forged line {l:?} in\n{printed}"
            );
        }
        assert!(
            !printed.contains([
                '\r', '\u{b}', '\u{c}', '\u{85}', '\u{2028}', '\u{2029}', '\u{61c}', '\u{fffa}'
            ]),
            "{printed}"
        );
    }
}
