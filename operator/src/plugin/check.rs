//! `kubectl quiver check -f FILE`: an McpServer manifest checked offline as the API server's
//! schema and the operator would: the CRD's structural schema, then the operator's own
//! render (name, pod template, log level, the ToolSet compiled by the server's compiler) and
//! build. ConfigMaps in the same file serve its `toolsFrom`, and a ServiceAccount in it its
//! `podTemplate.serviceAccountName`; what the file lacks is named as not checked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::CustomResourceExt;
use serde_json::Value;

use super::Failure;
use super::schema;
use crate::build::{self, ApiServer, Defaults};
use crate::crd::McpServer;
use crate::render;

/// Largest manifest read, in bytes.
pub const MAX_FILE_BYTES: usize = 8 << 20;
/// Most documents in one file.
pub const MAX_DOCUMENTS: usize = 256;

/// The outcome for one McpServer of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `McpServer NAME` (or the document's index when it has no name).
    pub subject: String,
    /// Problems, each naming its field; empty: valid.
    pub problems: Vec<String>,
    /// What was not checked, and why.
    pub notes: Vec<String>,
    /// What a valid one serves (`4 tools, config hash ...`).
    pub summary: Option<String>,
}

fn yaml_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.strict_booleans = true;
    options.with_snippet = false;
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = quiver_model::config::MAX_YAML_DEPTH;
    budget.max_reader_input_bytes = Some(MAX_FILE_BYTES);
    budget.max_total_scalar_bytes = MAX_FILE_BYTES;
    budget.max_events = 1_000_000;
    budget.max_nodes = 500_000;
    options.budget = Some(budget);
    options
}

/// Checks every McpServer in `text`.
///
/// # Errors
/// [`Failure::Usage`] when the file is too large or holds no McpServer.
pub fn check(text: &str) -> Result<Vec<Report>, Failure> {
    if text.len() > MAX_FILE_BYTES {
        return Err(Failure::Usage(format!(
            "the file is larger than {MAX_FILE_BYTES} bytes"
        )));
    }
    let docs: Vec<Value> = match serde_saphyr::from_multiple_with_options::<Value>(text, yaml_options()) {
        Ok(d) => d,
        Err(e) => {
            return Ok(vec![Report {
                subject: "the file".to_owned(),
                problems: vec![format!("not YAML: {e}")],
                notes: Vec::new(),
                summary: None,
            }]);
        }
    };
    if docs.len() > MAX_DOCUMENTS {
        return Err(Failure::Usage(format!("more than {MAX_DOCUMENTS} documents")));
    }
    let kind = |d: &Value| {
        d.get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let named = |d: &Value| {
        d.pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let config_maps: BTreeMap<String, ConfigMap> = docs
        .iter()
        .filter(|d| kind(d) == "ConfigMap")
        .filter_map(|d| serde_json::from_value::<ConfigMap>(d.clone()).ok())
        .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
        .collect();
    let accounts: BTreeMap<String, ServiceAccount> = docs
        .iter()
        .filter(|d| kind(d) == "ServiceAccount")
        .filter_map(|d| serde_json::from_value::<ServiceAccount>(d.clone()).ok())
        .map(|s| (s.metadata.name.clone().unwrap_or_default(), s))
        .collect();
    let reports: Vec<Report> = docs
        .iter()
        .enumerate()
        .filter(|(_, d)| kind(d) == "McpServer")
        .map(|(i, d)| {
            let name = named(d);
            let subject = if name.is_empty() {
                format!("McpServer (document {})", i + 1)
            } else {
                format!("McpServer {name}")
            };
            one(d, subject, &config_maps, &accounts)
        })
        .collect();
    if reports.is_empty() {
        return Err(Failure::Usage(
            "the file holds no McpServer (kind: McpServer)".to_owned(),
        ));
    }
    Ok(reports)
}

fn one(
    doc: &Value,
    subject: String,
    config_maps: &BTreeMap<String, ConfigMap>,
    accounts: &BTreeMap<String, ServiceAccount>,
) -> Report {
    let mut report = Report {
        subject,
        problems: Vec::new(),
        notes: Vec::new(),
        summary: None,
    };
    let mut mcp = match typed(doc) {
        Ok(m) => m,
        Err(problems) => {
            report.problems = problems;
            return report;
        }
    };
    mcp.metadata.namespace.get_or_insert_with(|| "default".to_owned());
    mcp.metadata.uid = Some("offline-check".to_owned());
    // toolsFrom entries the file cannot serve read as empty documents (keeping the others'
    // indexes), and are named.
    let mut fetched = Vec::new();
    for (i, from) in mcp.spec.tools_from.iter().enumerate() {
        let r = &from.config_map_key_ref;
        match config_maps.get(&r.name) {
            Some(cm) => fetched.push(render::key_of(cm.data.as_ref(), &r.key)),
            None => {
                fetched.push(Some("tools: []\n".to_owned()));
                report.notes.push(format!(
                    "spec.toolsFrom[{i}]: ConfigMap {} is not in the file; its tools are not checked (add it to the file to check them)",
                    r.name
                ));
            }
        }
    }
    let rendered = match render::render(&mcp, &fetched) {
        Ok(r) => r,
        Err(invalid) => {
            report.problems = invalid
                .problems
                .iter()
                .map(|p| format!("{p} ({})", invalid.reason))
                .collect();
            return report;
        }
    };
    if let Some(sa) = build::named_service_account(&mcp) {
        match accounts.get(sa) {
            Some(account) => {
                if let Err(invalid) = render::service_account(&mcp, Some(account)) {
                    report.problems.extend(invalid.problems);
                }
            }
            None => report.notes.push(format!(
                "spec.podTemplate.serviceAccountName: ServiceAccount {sa} is not in the file; its owner's consent is not checked"
            )),
        }
    }
    let defaults = Defaults {
        server_image: "quiver-server".to_owned(),
        image_pull_policy: "IfNotPresent".to_owned(),
        service_monitors: false,
        service_monitor_labels: Default::default(),
        catalog_prefix: "dev.quiver".into(),
    };
    match build::build(&mcp, &rendered, &defaults, &ApiServer::default()) {
        Ok(children) => report.problems.extend(
            build::server_args_problems(&children.deployment)
                .into_iter()
                .map(|p| format!("{p} (InvalidServerArgs)")),
        ),
        Err(e) => report.problems.push(e.to_string()),
    }
    let unsafe_keys: Vec<&String> = mcp
        .spec
        .tuning
        .iter()
        .flat_map(|t| t.sysctls.keys())
        .filter(|k| !build::SAFE_SYSCTLS.contains(&k.as_str()))
        .collect();
    if !unsafe_keys.is_empty() {
        report.notes.push(format!(
            "spec.tuning.sysctls: outside the kubelet's safe set (nodes must allow them, the namespace must not enforce baseline or restricted): {}",
            unsafe_keys.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    report.summary = Some(format!(
        "{} tool(s), {} upstream(s), config hash {}",
        rendered.tool_count,
        rendered.upstream_count,
        rendered.hash.get(..12).unwrap_or(&rendered.hash)
    ));
    report
}

/// The document as an McpServer: the CRD's structural schema, then the typed read and the
/// whole-field CEL rules; the problems of the first step that finds any.
fn typed(doc: &Value) -> Result<McpServer, Vec<String>> {
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    if api_version != "quiver.dev/v1alpha1" {
        return Err(vec![format!(
            "apiVersion: must be quiver.dev/v1alpha1, not {api_version:?}"
        )]);
    }
    let crd_schema = McpServer::crd()
        .spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or(Value::Null);
    // The root schema covers spec and status; the API server itself checks apiVersion,
    // kind and metadata (the name is checked by the render).
    let mut body = doc.clone();
    if let Some(m) = body.as_object_mut() {
        for k in ["apiVersion", "kind", "metadata"] {
            m.remove(k);
        }
    }
    let mut problems = schema::problems(&crd_schema, &body, "");
    if doc.pointer("/metadata/name").and_then(Value::as_str).is_none() {
        problems.push("metadata.name: required".to_owned());
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let mcp: McpServer = serde_json::from_value(doc.clone()).map_err(|e| vec![format!("spec: {e}")])?;
    let problems = cel_rules(&mcp);
    if problems.is_empty() {
        Ok(mcp)
    } else {
        Err(problems)
    }
}

/// The schema's CEL rules over whole fields (the API server evaluates them; the pod-template
/// ones are also the operator's own checks, run by the render).
fn cel_rules(mcp: &McpServer) -> Vec<String> {
    let spec = &mcp.spec;
    let mut problems = Vec::new();
    if spec.replicas.is_some() && spec.autoscaling.is_some() {
        problems.push("spec: set either replicas or autoscaling, not both".to_owned());
    }
    if let Some(t) = &spec.tuning
        && t.cpu_pinning == Some(true)
        && t.cpus.is_none()
    {
        problems.push(
            "spec.tuning.cpus: cpuPinning needs cpus: the whole number of exclusive CPUs each pod gets"
                .to_owned(),
        );
    }
    if let Some(a) = &spec.autoscaling
        && a.min_replicas > a.max_replicas
    {
        problems.push("spec.autoscaling: minReplicas must not exceed maxReplicas".to_owned());
    }
    problems
}

/// The reports for people; `true` when every McpServer is valid.
pub fn print(file: &str, reports: &[Report]) -> (String, bool) {
    use super::term::line;
    use std::fmt::Write as _;
    let file = line(file);
    let mut out = String::new();
    let mut valid = true;
    for r in reports {
        if r.problems.is_empty() {
            let _ = writeln!(
                out,
                "{file}: {}: valid ({})",
                line(&r.subject),
                line(r.summary.as_deref().unwrap_or_default())
            );
        } else {
            valid = false;
            let n = r.problems.len();
            let _ = writeln!(
                out,
                "{file}: {}: {n} problem{}",
                line(&r.subject),
                if n == 1 { "" } else { "s" }
            );
            for p in &r.problems {
                let _ = writeln!(out, "  {}", line(p));
            }
        }
        for note in &r.notes {
            let _ = writeln!(out, "  note: {}", line(note));
        }
    }
    if valid {
        let _ = writeln!(
            out,
            "(the API server's admission and the cluster's state are not checked offline: kubectl apply --dry-run=server -f {file})"
        );
    }
    (out, valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_and_notes_cannot_forge_lines() {
        let evil = "x\nFORGED\u{2028}FORGED\r\u{85}FORGED";
        let reports = vec![
            Report {
                subject: format!("McpServer {evil}"),
                problems: vec![evil.to_owned()],
                notes: vec![evil.to_owned()],
                summary: None,
            },
            Report {
                subject: evil.to_owned(),
                problems: Vec::new(),
                notes: Vec::new(),
                summary: Some(evil.to_owned()),
            },
        ];
        let (out, valid) = print(evil, &reports);
        assert!(!valid);
        let printed = super::super::term::text(&out).into_owned();
        for l in printed.lines() {
            assert!(
                !l.trim_start().starts_with("FORGED"),
                "a forged line {l:?} in\n{printed}"
            );
        }
        assert_eq!(printed.lines().count(), 4, "{printed}");
    }
}
