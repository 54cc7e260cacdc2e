//! The import step: an upstream's `tools/list` entries, filtered, renamed and checked, become
//! compiled tools of the registry.

use rustc_hash::FxHashSet;
use serde_json::{Map, Value, json};

use super::{
    CompiledUpstream, ImportReport, MAX_DESCRIPTOR_BYTES, MAX_UPSTREAM_PATTERNS, MAX_UPSTREAM_TOOLS,
    Namespace, UpstreamCall,
};
use crate::config::compiled::{CompiledHandler, CompiledTool};
use crate::schema::Schema;
use crate::spec::checks::shallow;
use crate::spec::context::{Problems, valid_tool_name};

impl CompiledUpstream {
    /// The annotations of remote tool `remote` that the author gave (`tools.annotations`):
    /// the only ones a policy may trust, since an upstream's own are its claims.
    pub fn authors_annotations(&self, remote: &str) -> Option<&Value> {
        self.annotations.get(remote)
    }
}

impl CompiledUpstream {
    /// The name a tool of this upstream is served under.
    pub fn served_name(&self, remote: &str) -> String {
        self.names.served_name(remote)
    }

    /// The upstream other than this one whose names include `name`, if any.
    fn rival_of(&self, name: &str) -> Option<&Namespace> {
        self.rivals
            .iter()
            .enumerate()
            .find(|(k, ns)| *k != self.at && ns.could_serve(name))
            .map(|(_, ns)| ns)
    }

    /// Compiles the tools of `listed` (an upstream's `tools/list` entries) that this
    /// upstream serves. Names in `taken` (local tools, earlier upstreams) are not served
    /// again, nor names another upstream of the config could serve (the compile step refuses
    /// configs where names can meet; this holds whatever an upstream lists).
    pub fn import(
        &self,
        index: usize,
        listed: &[Value],
        taken: &mut FxHashSet<String>,
    ) -> (Vec<CompiledTool>, ImportReport) {
        let mut tools = Vec::new();
        let mut report = ImportReport::default();
        let mut seen = FxHashSet::default();
        let mut patterns = 0;
        for t in listed {
            let Some(remote) = t.get("name").and_then(Value::as_str) else {
                report.skipped.push("a tool without a name".to_owned());
                continue;
            };
            if !valid_tool_name(remote) {
                report.skipped.push(format!(
                    "`{}`: not a valid tool name",
                    remote.chars().take(64).collect::<String>()
                ));
                continue;
            }
            if !self.names.selected(remote) || !seen.insert(remote) {
                continue;
            }
            if tools.len() >= MAX_UPSTREAM_TOOLS {
                report
                    .skipped
                    .push(format!("`{remote}`: more than {MAX_UPSTREAM_TOOLS} tools"));
                continue;
            }
            let name = match self.served_as(remote, taken) {
                Ok(name) => name,
                Err(why) => {
                    report.skipped.push(why);
                    continue;
                }
            };
            let n = count_patterns(t);
            if patterns + n > MAX_UPSTREAM_PATTERNS {
                report.skipped.push(format!(
                    "`{remote}`: its schemas bring the upstream over {MAX_UPSTREAM_PATTERNS} `pattern`s"
                ));
                continue;
            }
            match self.compile_tool(index, remote, &name, t) {
                Ok(tool) => {
                    patterns += n;
                    taken.insert(name);
                    tools.push(tool);
                }
                Err(why) => report.skipped.push(format!("`{remote}`: {why}")),
            }
        }
        // (Before the upstream's first list, every name would be reported.)
        if !listed.is_empty() {
            self.report_unlisted(&seen, &mut report);
        }
        report.imported = tools.len();
        (tools, report)
    }

    /// The name `remote` is served as, or why it is not served: not a valid name, a name
    /// already `taken`, or one another upstream could serve.
    fn served_as(&self, remote: &str, taken: &FxHashSet<String>) -> Result<String, String> {
        let name = self.served_name(remote);
        if !valid_tool_name(&name) {
            return Err(format!("`{remote}`: `{name}` is not a valid tool name"));
        }
        if taken.contains(&name) {
            return Err(format!(
                "`{remote}`: `{name}` is already served (by a local tool or an earlier upstream)"
            ));
        }
        // Never first come, first served: whether the other upstream listed it yet or not.
        if let Some(rival) = self.rival_of(&name) {
            return Err(format!(
                "`{remote}`: `{name}` is a name upstream `{}` can serve; served by neither",
                rival.upstream
            ));
        }
        Ok(name)
    }

    /// Reports the names `tools` renames, describes or annotates that the upstream did not
    /// list (or the filter left out).
    fn report_unlisted(&self, seen: &FxHashSet<&str>, report: &mut ImportReport) {
        for from in self
            .names
            .rename
            .keys()
            .chain(self.descriptions.keys())
            .chain(self.annotations.keys())
            .chain(self.tasks.keys())
        {
            if !seen.contains(from.as_str()) {
                report.skipped.push(format!(
                    "`{from}` (named in `tools`): not listed by the upstream, or filtered out"
                ));
            }
        }
    }

    fn compile_tool(
        &self,
        index: usize,
        remote: &str,
        name: &str,
        t: &Value,
    ) -> Result<CompiledTool, String> {
        let mut p = Problems::default();
        let schema = match t.get("inputSchema") {
            None => json!({"type": "object"}),
            Some(s) if shallow(s, "inputSchema", &mut p) => s.clone(),
            Some(_) => return Err(p.first_message()),
        };
        // Listed as the upstream wrote it; checked where quiver-server can (the upstream
        // checks the rest).
        let input = Schema::compile(&crate::schema::enforceable(&schema))
            .map_err(|e| format!("inputSchema: {}", e.join("; ")))?;
        let output = match t.get("outputSchema") {
            Some(s) if shallow(s, "outputSchema", &mut p) => Some(Box::new(
                Schema::compile(&crate::schema::enforceable(s))
                    .map_err(|e| format!("outputSchema: {}", e.join("; ")))?,
            )),
            Some(_) => return Err(p.first_message()),
            None => None,
        };
        let mut d = Map::new();
        d.insert("name".into(), Value::String(name.to_owned()));
        for field in ["title", "description", "annotations", "icons"] {
            if let Some(v) = t.get(field)
                && shallow(v, field, &mut p)
            {
                d.insert(field.into(), v.clone());
            }
        }
        if let Some(text) = self.descriptions.get(remote) {
            d.insert("description".into(), Value::String(text.clone()));
        }
        if let Some(a) = self.annotations.get(remote) {
            d.insert("annotations".into(), a.clone());
        }
        d.insert("inputSchema".into(), schema);
        if let Some(o) = t.get("outputSchema") {
            d.insert("outputSchema".into(), o.clone());
        }
        let descriptor = Value::Object(d);
        let size = crate::template::approx_size(&descriptor);
        if size > MAX_DESCRIPTOR_BYTES {
            return Err(format!(
                "its descriptor is about {size} bytes; at most {MAX_DESCRIPTOR_BYTES}"
            ));
        }
        Ok(CompiledTool {
            name: name.to_owned(),
            descriptor,
            input,
            output,
            handler: CompiledHandler::Upstream(UpstreamCall {
                upstream: index,
                remote: remote.to_owned(),
                task: t.pointer("/execution/taskSupport").and_then(Value::as_str) == Some("required"),
            }),
            access: self.access.clone(),
            task: self.task_of(remote, t),
            governance: crate::config::governance::ToolGovernance {
                limits: self.limits.clone(),
                audit_arguments: None,
                result_guard: self.result_guard.clone(),
            },
        })
    }
}

impl CompiledUpstream {
    /// Whether a served tool runs as a task: as `tools.tasks` sets it, else as the upstream
    /// lists it (`execution.taskSupport`: `forbidden` and `required` are kept), else
    /// `optional` (a call crosses the network, like an http tool's). Quiver's own call of
    /// the upstream is a plain `tools/call` either way.
    fn task_of(&self, remote: &str, t: &Value) -> crate::config::TaskSupport {
        use crate::config::TaskSupport;
        if let Some(set) = self.tasks.get(remote) {
            return *set;
        }
        match t.pointer("/execution/taskSupport").and_then(Value::as_str) {
            Some("forbidden") => TaskSupport::Forbidden,
            Some("required") => TaskSupport::Required,
            _ => TaskSupport::Optional,
        }
    }
}

/// Regular expressions a tool's schemas would compile (`pattern`, `patternProperties`).
fn count_patterns(t: &Value) -> usize {
    let mut n = 0;
    let mut stack: Vec<&Value> = ["inputSchema", "outputSchema"]
        .iter()
        .filter_map(|k| t.get(k))
        .collect();
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                n += usize::from(o.get("pattern").is_some_and(Value::is_string));
                n += o
                    .get("patternProperties")
                    .and_then(Value::as_object)
                    .map_or(0, Map::len);
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    n
}
