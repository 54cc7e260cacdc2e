//! What an upstream offers besides tools: its resources, resource templates and prompts,
//! imported when its `resources:` or `prompts:` asks for them.
//!
//! An upstream's resource is served under the upstream's name, `+`, and its own URI
//! (`docs+file:///guide.md` for `file:///guide.md` of upstream `docs`): a valid URI whose
//! scheme names the upstream, so two upstreams' URIs can never meet and a read goes to the
//! upstream that owns the URI. Prompts keep their names (or get `prefix` or `rename`); a
//! name two upstreams list is served by neither, and a local prompt's name wins.

use std::collections::BTreeMap;

use rustc_hash::{FxHashMap, FxHashSet};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    CompiledUpstream, Glob, ImportReport, MAX_DESCRIPTOR_BYTES, MAX_UPSTREAM_TOOLS, Namespace, UpstreamPrompt,
};
use crate::config::compiled::{CompiledPrompt, CompiledResource, CompiledToolSet, ResourceKind, UriPattern};
use crate::spec::checks::shallow;
use crate::spec::context::Problems;

/// Longest URI (or URI template) of an upstream's resource that is served.
pub const MAX_URI: usize = 2048;
/// Longest prompt name (after `prefix`) served.
pub const MAX_PROMPT_NAME: usize = 128;
/// Arguments of one upstream prompt kept.
const MAX_PROMPT_ARGUMENTS: usize = 64;

/// Which of an upstream's resources and resource templates are served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceImportSpec {
    /// The upstream's URIs (or URI templates) to serve, `*` matching any run of
    /// characters; empty serves all. Checked on every read as well as on the lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 2048)))]
    pub include: Vec<String>,
    /// The upstream's URIs not to serve (`*` as in `include`); wins over `include`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 2048)))]
    pub exclude: Vec<String>,
}

/// Which of an upstream's prompts are served, and under which names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PromptImportSpec {
    /// The upstream's prompt names to serve (`*` matches any run of characters); empty
    /// serves all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    pub include: Vec<String>,
    /// The upstream's prompt names not to serve (`*` as in `include`); wins over `include`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 128)))]
    pub exclude: Vec<String>,
    /// Put before every served name that `rename` does not set, e.g. `docs_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The upstream's prompt name to the served name (no prefix added).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rename: BTreeMap<String, String>,
}

/// The compiled `resources:` of an upstream: which URIs it serves.
#[derive(Debug, Clone)]
pub struct UriFilter {
    include: Vec<Glob>,
    exclude: Vec<Glob>,
}

impl UriFilter {
    fn selected(&self, uri: &str) -> bool {
        (self.include.is_empty() || self.include.iter().any(|g| g.matches(uri)))
            && !self.exclude.iter().any(|g| g.matches(uri))
    }
}

/// Free text of a URI, a name or a pattern: 1..=`max` bytes without control characters.
fn text(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len()) && !s.chars().any(char::is_control)
}

/// Whether `uri` starts with a URI scheme and `:`.
fn has_scheme(uri: &str) -> bool {
    let Some((scheme, _)) = uri.split_once(':') else {
        return false;
    };
    scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// Compiles an upstream's `resources:` (at `rp`).
pub(super) fn compile_resources(spec: &ResourceImportSpec, rp: &str, p: &mut Problems) -> UriFilter {
    let globs = |list: &[String], field: &str, p: &mut Problems| -> Vec<Glob> {
        list.iter()
            .enumerate()
            .map(|(j, g)| {
                if !text(g, MAX_URI) {
                    p.push(
                        format!("{rp}.{field}[{j}]"),
                        format!("1-{MAX_URI} characters, no control characters"),
                    );
                }
                Glob::new(g)
            })
            .collect()
    };
    UriFilter {
        include: globs(&spec.include, "include", p),
        exclude: globs(&spec.exclude, "exclude", p),
    }
}

/// Compiles an upstream's `prompts:` (at `pp`) of upstream `upstream`.
pub(super) fn compile_prompts(
    spec: &PromptImportSpec,
    upstream: &str,
    pp: &str,
    p: &mut Problems,
) -> Namespace {
    let prefix = spec.prefix.clone().unwrap_or_default();
    if spec.prefix.is_some()
        && (prefix.is_empty()
            || prefix.len() > super::MAX_PREFIX
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
    {
        p.push(
            format!("{pp}.prefix"),
            format!("1-{} characters of A-Z a-z 0-9 _ - .", super::MAX_PREFIX),
        );
    }
    let mut targets: FxHashMap<&str, &str> = FxHashMap::default();
    for (from, to) in &spec.rename {
        if !text(to, MAX_PROMPT_NAME) {
            p.push(
                format!("{pp}.rename.{from}"),
                format!("1-{MAX_PROMPT_NAME} characters, no control characters"),
            );
        } else if let Some(other) = targets.insert(to, from) {
            p.push(
                format!("{pp}.rename.{from}"),
                format!("`{other}` is renamed to `{to}` too"),
            );
        }
    }
    let globs = |list: &[String], field: &str, p: &mut Problems| -> Vec<Glob> {
        list.iter()
            .enumerate()
            .map(|(j, g)| {
                if !text(g, MAX_PROMPT_NAME) {
                    p.push(
                        format!("{pp}.{field}[{j}]"),
                        format!("1-{MAX_PROMPT_NAME} characters, no control characters"),
                    );
                }
                Glob::new(g)
            })
            .collect()
    };
    Namespace {
        upstream: upstream.to_owned(),
        include: globs(&spec.include, "include", p),
        exclude: globs(&spec.exclude, "exclude", p),
        prefix,
        rename: spec.rename.clone(),
    }
}

/// What one upstream's lists gave: served resources and prompts, and what was not served.
#[derive(Debug, Default)]
pub struct Offered {
    /// Index of the upstream.
    pub upstream: usize,
    /// Its resources and resource templates, as served.
    pub resources: Vec<CompiledResource>,
    /// Its prompts, as served.
    pub prompts: Vec<CompiledPrompt>,
    /// Entries listed but not served, each with why.
    pub skipped: Vec<String>,
}

impl CompiledUpstream {
    /// Whether its resources are imported.
    pub fn imports_resources(&self) -> bool {
        self.resources.is_some()
    }

    /// Whether its prompts are imported.
    pub fn imports_prompts(&self) -> bool {
        self.prompts.is_some()
    }

    /// The URI a resource of this upstream is served as.
    pub fn served_uri(&self, remote: &str) -> String {
        format!("{}+{remote}", self.name)
    }

    /// The upstream's own URI of `served`, when this upstream serves it: the upstream's
    /// name and `+` before a URI its `resources` filter lets through.
    pub fn remote_uri<'u>(&self, served: &'u str) -> Option<&'u str> {
        let filter = self.resources.as_ref()?;
        let remote = served.strip_prefix(self.name.as_str())?.strip_prefix('+')?;
        (has_scheme(remote) && text(remote, MAX_URI) && filter.selected(remote)).then_some(remote)
    }

    /// Compiles what the upstream (at `index`) lists in `resources/list` (`templates`
    /// false) or `resources/templates/list`, as far as its `resources` filter serves it.
    pub fn import_resources(&self, index: usize, listed: &[Value], templates: bool, out: &mut Offered) {
        let Some(filter) = &self.resources else { return };
        let field = if templates { "uriTemplate" } else { "uri" };
        let mut seen = FxHashSet::default();
        for r in listed {
            let Some(uri) = r.get(field).and_then(Value::as_str) else {
                out.skipped.push(format!("a resource without `{field}`"));
                continue;
            };
            if !text(uri, MAX_URI) || !has_scheme(uri) {
                let shown: String = uri.chars().take(64).filter(|c| !c.is_control()).collect();
                out.skipped.push(format!(
                    "resource `{shown}`: not a URI of at most {MAX_URI} bytes"
                ));
                continue;
            }
            if !filter.selected(uri) || !seen.insert(uri) {
                continue;
            }
            if out.resources.len() >= MAX_UPSTREAM_TOOLS {
                out.skipped.push(format!(
                    "resource `{uri}`: more than {MAX_UPSTREAM_TOOLS} resources"
                ));
                continue;
            }
            let served = self.served_uri(uri);
            let pattern = if templates {
                match UriPattern::compile(&served) {
                    Ok(p) => Some(p),
                    Err(why) => {
                        out.skipped.push(format!(
                            "resource template `{uri}`: {why}; only level-1 templates are served"
                        ));
                        continue;
                    }
                }
            } else {
                None
            };
            let mut p = Problems::default();
            let mut d = Map::new();
            d.insert(field.into(), Value::String(served.clone()));
            for f in [
                "name",
                "title",
                "description",
                "mimeType",
                "size",
                "annotations",
                "icons",
            ] {
                if let Some(v) = r.get(f)
                    && shallow(v, f, &mut p)
                {
                    d.insert(f.into(), v.clone());
                }
            }
            if !d.get("name").is_some_and(Value::is_string) {
                // `name` is required in a listing: the upstream's URI stands in.
                d.insert("name".into(), Value::String(uri.to_owned()));
            }
            let descriptor = Value::Object(d);
            let size = crate::template::approx_size(&descriptor);
            if size > MAX_DESCRIPTOR_BYTES {
                out.skipped.push(format!(
                    "resource `{uri}`: its entry is about {size} bytes; at most {MAX_DESCRIPTOR_BYTES}"
                ));
                continue;
            }
            let mime_type = r
                .get("mimeType")
                .and_then(Value::as_str)
                .filter(|m| text(m, 255))
                .unwrap_or_default()
                .to_owned();
            out.resources.push(CompiledResource {
                descriptor,
                mime_type,
                kind: ResourceKind::Upstream {
                    upstream: index,
                    uri: served,
                    pattern,
                },
                values: BTreeMap::new(),
                policies: None,
            });
        }
    }

    /// Compiles what the upstream (at `index`) lists in `prompts/list`, as far as its
    /// `prompts` filter serves it.
    pub fn import_prompts(&self, index: usize, listed: &[Value], out: &mut Offered) {
        let Some(names) = &self.prompts else { return };
        let mut seen = FxHashSet::default();
        for pr in listed {
            let Some(remote) = pr.get("name").and_then(Value::as_str) else {
                out.skipped.push("a prompt without a name".to_owned());
                continue;
            };
            if !text(remote, MAX_PROMPT_NAME) {
                let shown: String = remote.chars().take(64).filter(|c| !c.is_control()).collect();
                out.skipped.push(format!("prompt `{shown}`: not a prompt name"));
                continue;
            }
            if !names.selected(remote) || !seen.insert(remote) {
                continue;
            }
            if out.prompts.len() >= MAX_UPSTREAM_TOOLS {
                out.skipped.push(format!(
                    "prompt `{remote}`: more than {MAX_UPSTREAM_TOOLS} prompts"
                ));
                continue;
            }
            let name = names.served_name(remote);
            if !text(&name, MAX_PROMPT_NAME) {
                out.skipped.push(format!(
                    "prompt `{remote}`: `{name}` is longer than {MAX_PROMPT_NAME} bytes"
                ));
                continue;
            }
            match prompt(index, remote, &name, pr) {
                Ok(p) => out.prompts.push(p),
                Err(why) => out.skipped.push(format!("prompt `{remote}`: {why}")),
            }
        }
    }
}

/// One upstream prompt (`remote`, served as `name`) from its `prompts/list` entry.
fn prompt(index: usize, remote: &str, name: &str, entry: &Value) -> Result<CompiledPrompt, String> {
    let mut p = Problems::default();
    let mut d = Map::new();
    d.insert("name".into(), Value::String(name.to_owned()));
    for f in ["title", "description", "icons"] {
        if let Some(v) = entry.get(f)
            && shallow(v, f, &mut p)
        {
            d.insert(f.into(), v.clone());
        }
    }
    let (mut required, mut arguments, mut listed) = (Vec::new(), Vec::new(), Vec::new());
    if let Some(args) = entry.get("arguments") {
        let Some(args) = args.as_array().filter(|a| a.len() <= MAX_PROMPT_ARGUMENTS) else {
            return Err(format!(
                "`arguments` is not a list of at most {MAX_PROMPT_ARGUMENTS}"
            ));
        };
        for a in args {
            let Some(n) = a
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| text(n, MAX_PROMPT_NAME))
            else {
                return Err("an argument without a valid name".into());
            };
            let mut kept = Map::new();
            kept.insert("name".into(), Value::String(n.to_owned()));
            for f in ["title", "description", "required"] {
                if let Some(v) = a.get(f)
                    && shallow(v, f, &mut p)
                {
                    kept.insert(f.into(), v.clone());
                }
            }
            if a.get("required").and_then(Value::as_bool) == Some(true) {
                required.push(n.to_owned());
            }
            arguments.push(n.to_owned());
            listed.push(Value::Object(kept));
        }
        d.insert("arguments".into(), Value::Array(listed));
    }
    let descriptor = Value::Object(d);
    let size = crate::template::approx_size(&descriptor);
    if size > MAX_DESCRIPTOR_BYTES {
        return Err(format!(
            "its entry is about {size} bytes; at most {MAX_DESCRIPTOR_BYTES}"
        ));
    }
    Ok(CompiledPrompt {
        name: name.to_owned(),
        description: descriptor
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_owned),
        descriptor,
        required,
        arguments,
        messages: Vec::new(),
        values: BTreeMap::new(),
        ask: Vec::new(),
        policies: None,
        upstream: Some(UpstreamPrompt {
            upstream: index,
            remote: remote.to_owned(),
        }),
    })
}

/// Adds what the upstreams offer to `compiled` (after its own resources and prompts, which
/// win any URI or name), and returns per upstream what was not served. A prompt name that
/// two upstreams list is served by neither, whichever listed it first.
pub fn add(compiled: &mut CompiledToolSet, offered: Vec<Offered>) -> Vec<(usize, ImportReport)> {
    let local_uris: FxHashSet<String> = compiled
        .resources
        .iter()
        .map(|r| r.declared_uri().to_owned())
        .collect();
    let local_prompts: FxHashSet<String> = compiled.prompts.iter().map(|p| p.name.clone()).collect();
    let mut owners: FxHashMap<String, usize> = FxHashMap::default();
    for o in &offered {
        for p in &o.prompts {
            *owners.entry(p.name.clone()).or_default() += 1;
        }
    }
    let mut reports = Vec::with_capacity(offered.len());
    for mut o in offered {
        let upstream = compiled.upstreams[o.upstream].name.clone();
        o.resources.retain(|r| {
            let uri = r.declared_uri();
            if local_uris.contains(uri) {
                o.skipped.push(format!(
                    "resource `{uri}`: a resource of this ToolSet has the URI"
                ));
                return false;
            }
            true
        });
        o.prompts.retain(|p| {
            if local_prompts.contains(&p.name) {
                o.skipped.push(format!(
                    "prompt `{}`: a prompt of this ToolSet has the name",
                    p.name
                ));
                false
            } else if owners.get(&p.name).copied().unwrap_or(0) > 1 {
                o.skipped.push(format!(
                    "prompt `{}`: another upstream lists a prompt served under this name; served by neither",
                    p.name
                ));
                false
            } else {
                true
            }
        });
        let set = &compiled.policies;
        for r in &mut o.resources {
            r.policies = set.for_upstream_resource(&upstream, r.declared_uri());
        }
        for p in &mut o.prompts {
            p.policies = set.for_upstream_prompt(&upstream, &p.name);
        }
        let report = ImportReport {
            resources: o.resources.len(),
            prompts: o.prompts.len(),
            skipped: o.skipped,
            ..ImportReport::default()
        };
        compiled.resources.extend(o.resources);
        compiled.prompts.extend(o.prompts);
        reports.push((o.upstream, report));
    }
    reports
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::{compile, parse};

    const TWO: &str = r#"
resources: [{uri: "file:///local.md", name: local, text: x}]
prompts: [{name: mine, messages: [{role: user, text: x}]}]
upstreams:
  - {name: a, stdio: {command: [a]}, tools: {prefix: a_}, resources: {exclude: ["file:///secret*"]}, prompts: {}}
  - {name: b, stdio: {command: [b]}, tools: {prefix: b_}, resources: {}, prompts: {rename: {other: b-other}}}
"#;

    fn offered(
        c: &CompiledToolSet,
        i: usize,
        resources: &[Value],
        templates: &[Value],
        prompts: &[Value],
    ) -> Offered {
        let mut out = Offered {
            upstream: i,
            ..Offered::default()
        };
        c.upstreams[i].import_resources(i, resources, false, &mut out);
        c.upstreams[i].import_resources(i, templates, true, &mut out);
        c.upstreams[i].import_prompts(i, prompts, &mut out);
        out
    }

    #[test]
    fn two_upstreams_listing_the_same_uris_and_names_are_kept_apart() {
        let mut c = compile(&parse("t", TWO).unwrap()).unwrap();
        let same = [
            json!({"uri": "file:///guide.md", "name": "guide"}),
            json!({"uri": "file:///secret.txt", "name": "secret"}),
        ];
        let templates = [json!({"uriTemplate": "book://{t}", "name": "book"})];
        let prompts = [
            json!({"name": "summarize", "arguments": [{"name": "text", "required": true}, {"name": "style"}]}),
            json!({"name": "mine"}),
            json!({"name": "other"}),
        ];
        let a = offered(&c, 0, &same, &templates, &prompts);
        let b = offered(&c, 1, &same, &templates, &prompts[..1]);
        let reports = add(&mut c, vec![a, b]);
        let uris: Vec<&str> = c.resources.iter().map(CompiledResource::declared_uri).collect();
        assert_eq!(
            uris,
            [
                "file:///local.md",
                "a+file:///guide.md",
                "a+book://{t}",
                "b+file:///guide.md",
                "b+file:///secret.txt",
                "b+book://{t}"
            ]
        );
        assert!(c.resources[2].is_template() && !c.resources[1].is_template());
        // `summarize` of both: served by neither; `mine` is the ToolSet's own; a's `other`
        // keeps its name, b would have renamed it.
        let names: Vec<&str> = c.prompts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["mine", "other"]);
        let (_, ra) = &reports[0];
        assert_eq!((ra.resources, ra.prompts), (2, 1));
        assert!(
            ra.skipped
                .iter()
                .any(|s| s.contains("`summarize`") && s.contains("served by neither")),
            "{ra:?}"
        );
        assert!(
            ra.skipped
                .iter()
                .any(|s| s.contains("`mine`: a prompt of this ToolSet")),
            "{ra:?}"
        );
        let other = c.prompts[1].upstream.as_ref().unwrap();
        assert_eq!((other.upstream, other.remote.as_str()), (0, "other"));
        // Reads are routed by the URI, the filter checked again.
        assert_eq!(
            c.upstreams[0].remote_uri("a+file:///guide.md"),
            Some("file:///guide.md")
        );
        assert_eq!(
            c.upstreams[0].remote_uri("a+file:///unlisted"),
            Some("file:///unlisted")
        );
        for no in [
            "a+file:///secret.txt",
            "b+file:///guide.md",
            "a+",
            "a+no scheme",
            "afile:///x",
            "a+1x:y",
        ] {
            assert_eq!(c.upstreams[0].remote_uri(no), None, "{no}");
        }
    }

    #[test]
    fn hostile_entries_are_skipped_with_reasons_never_served() {
        let c = compile(&parse("t", TWO).unwrap()).unwrap();
        let long = "x".repeat(MAX_URI);
        let resources = [
            json!({"name": "no uri"}),
            json!({"uri": 7}),
            json!({"uri": "no-scheme"}),
            json!({"uri": "file:///a\nb"}),
            json!({"uri": format!("file:///{long}")}),
            json!({"uri": "file:///big", "description": "d".repeat(MAX_DESCRIPTOR_BYTES)}),
            json!({"uri": "file:///ok"}),
            json!({"uri": "file:///ok", "name": "twice"}),
        ];
        let prompts = [
            json!({"title": "no name"}),
            json!({"name": "bad\u{0}name"}),
            json!({"name": "args", "arguments": "x"}),
            json!({"name": "args2", "arguments": [{"description": "no name"}]}),
            json!({"name": "many", "arguments": (0..100).map(|i| json!({"name": format!("a{i}")})).collect::<Vec<_>>()}),
            json!({"name": "fine"}),
        ];
        let o = offered(&c, 1, &resources, &[], &prompts);
        assert_eq!(o.resources.len(), 1, "{:?}", o.skipped);
        // A listing without a name gets the upstream's URI as its name.
        assert_eq!(
            o.resources[0].descriptor,
            json!({"uri": "b+file:///ok", "name": "file:///ok"})
        );
        assert_eq!(
            o.prompts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            ["fine"]
        );
        assert_eq!(o.skipped.len(), 6 + 5, "{:?}", o.skipped);
        assert!(
            o.skipped.iter().all(|s| !s.contains('\n') && !s.contains('\0')),
            "{:?}",
            o.skipped
        );
    }

    #[test]
    fn specs_are_checked_and_identity_refused() {
        let problems = |yaml: &str| -> Vec<String> {
            compile(&parse("t", yaml).unwrap())
                .err()
                .map(|e| e.problems.iter().map(ToString::to_string).collect())
                .unwrap_or_default()
        };
        let p = problems(
            "upstreams: [{name: a, stdio: {command: [a]}, resources: {include: [\"\"]}, prompts: {prefix: \"bad prefix\", rename: {x: y, z: y}}}]",
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("upstreams[0].resources.include[0]")),
            "{p:?}"
        );
        assert!(
            p.iter().any(|x| x.starts_with("upstreams[0].prompts.prefix")),
            "{p:?}"
        );
        assert!(p.iter().any(|x| x.contains("renamed to `y` too")), "{p:?}");
        let p = problems(
            "upstreams: [{name: a, http: {url: \"https://a.example/mcp\"}, identity: {mode: forward, audience: \"https://a.example/mcp\"}, prompts: {}}]",
        );
        assert!(
            p.iter()
                .any(|x| x.starts_with("upstreams[0].identity") && x.contains("server's own credential")),
            "{p:?}"
        );
        let p = problems("upstreams: [{name: a, stdio: {command: [a]}, revision: \"2026-07-28\"}]");
        assert!(p.iter().any(|x| x.starts_with("upstreams[0].revision")), "{p:?}");
        assert!(
            problems("upstreams: [{name: a, http: {url: \"http://a/mcp\"}, revision: \"2026-07-28\"}]")
                .is_empty()
        );
        // A policy may name an upstream's resources and prompts before they are listed.
        let p = problems(
            "upstreams: [{name: a, stdio: {command: [a]}, resources: {}, prompts: {}}]\npolicies: [{name: p, expression: \"true\", resources: [\"a+file:///x\"], prompts: [later]}]",
        );
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn an_upstream_template_matches_only_what_it_could_expand_to() {
        let c = compile(&parse("t", TWO).unwrap()).unwrap();
        let mut o = Offered::default();
        let listed = [
            json!({"uriTemplate": "file:///{path}"}),
            json!({"uriTemplate": "file:///{+path}"}),
            json!({"uriTemplate": "book://{t}/ch/{n}"}),
        ];
        c.upstreams[1].import_resources(1, &listed, true, &mut o);
        // `{+path}` (level 2) is not served: it could not be matched safely.
        assert_eq!(o.resources.len(), 2, "{:?}", o.skipped);
        assert!(o.skipped[0].contains("level-1"), "{:?}", o.skipped);
        let ResourceKind::Upstream { pattern: Some(p), .. } = &o.resources[0].kind else {
            panic!("a template");
        };
        assert_eq!(
            p.matches_segments("b+file:///notes.md"),
            Some(json!({"path": "notes.md"}))
        );
        assert_eq!(
            p.matches_segments("b+file:///a%20b"),
            Some(json!({"path": "a b"}))
        );
        for walks in [
            "b+file:///../etc/passwd",
            "b+file:///a/b",
            "b+file:///..",
            "b+file:///%2e%2e",
            "b+file:///..%2Fx",
            "b+file:///a%5Cb",
            "b+file:///a%0Ab",
        ] {
            assert_eq!(p.matches_segments(walks), None, "{walks}");
        }
        let ResourceKind::Upstream { pattern: Some(p), .. } = &o.resources[1].kind else {
            panic!("a template");
        };
        assert_eq!(
            p.matches_segments("b+book://dune/ch/3"),
            Some(json!({"t": "dune", "n": "3"}))
        );
        assert_eq!(p.matches_segments("b+book://a/b/ch/3"), None);
    }
}
