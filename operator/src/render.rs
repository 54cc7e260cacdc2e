//! Dereference and validate: the ToolSet an McpServer serves, assembled from its inline
//! tools and its `toolsFrom` ConfigMap keys, checked by the server's own compiler.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ServiceAccount;
use quiver_model::config::{self, ServerInfo, ToolSet};

pub use crate::build::{Rendered, is_dns_label};
use crate::crd::{McpServer, TOOLS_LABEL};
use crate::guard;

/// The most bytes of rendered YAML a ConfigMap can take (Kubernetes caps a ConfigMap's
/// data at 1 MiB; the rest is left for its metadata).
pub const MAX_CONFIGMAP_BYTES: usize = 1_000_000;

/// Why a spec cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Condition reason (CamelCase).
    pub reason: &'static str,
    /// Every problem, located (`spec.tools[2].handler...`, `toolsFrom[0] (ConfigMap a, key b): ...`).
    pub problems: Vec<String>,
}

impl Invalid {
    /// One message for a condition or an event.
    pub fn message(&self) -> String {
        let mut m = self
            .problems
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ");
        if self.problems.len() > 10 {
            m.push_str(&format!("; and {} more", self.problems.len() - 10));
        }
        m
    }
}

/// The content of each `toolsFrom` entry: `Some(text)` or `None` when the ConfigMap or key is missing.
pub type Fetched = Vec<Option<String>>;

/// Assembles and validates the ToolSet of `mcp`.
///
/// # Errors
/// A missing `toolsFrom` source or any problem the server's compiler reports.
pub fn render(mcp: &McpServer, fetched: &Fetched) -> Result<Rendered, Invalid> {
    let name = mcp.metadata.name.clone().unwrap_or_default();
    refuse("InvalidName", guard::name(&name).into_iter().collect())?;
    refuse("ToolsFromMissing", missing(mcp, fetched))?;
    let mut merged = Merged::inline(mcp, &name);
    refuse("InvalidPodTemplate", crate::build::check_pod(mcp))?;
    refuse("InvalidLogLevel", crate::build::log_level_problems(mcp))?;
    refuse("InvalidTrustedProxies", crate::build::trusted_proxy_problems(mcp))?;
    refuse("InvalidRedis", crate::build::redis_problems(mcp))?;
    refuse("InvalidUpstreamSignIn", crate::build::sign_in_problems(mcp))?;
    refuse(
        "InvalidServiceMonitorLabels",
        crate::build::service_monitor_label_problems(mcp),
    )?;
    refuse("InvalidToolConfig", crate::build::check_sidecars(mcp))?;
    refuse("InvalidToolConfig", merged.read(mcp, fetched))?;
    refuse("InvalidToolConfig", guard::timeouts(&merged.ts, &merged.origins))?;
    let compiled = config::compile(&merged.ts).map_err(|e| Invalid {
        reason: "InvalidToolConfig",
        problems: e
            .problems
            .iter()
            .map(|p| {
                locate(
                    &p.to_string(),
                    &[
                        ("tools[", &merged.origins),
                        ("upstreams[", &merged.up_origins),
                        ("policies[", &merged.pol_origins),
                        ("openapi[", &merged.api_origins),
                    ],
                )
            })
            .collect(),
    })?;
    refuse("InvalidToolConfig", bad_secret_names(&compiled.secrets))?;
    refuse(
        "InvalidToolConfig",
        identity_needs(mcp, &compiled, &merged.api_origins, &merged.ts.openapi),
    )?;
    let yaml = write(&merged.ts, &compiled.hash)?;
    Ok(Rendered {
        yaml,
        hash: compiled.hash,
        tool_count: compiled.tools.len(),
        secrets: compiled.secrets,
        upstream_count: compiled.upstreams.len(),
        pinned: compiled.upstreams.iter().any(|u| u.pin.is_on())
            || merged.ts.openapi.iter().any(|s| s.pin.is_on()),
    })
}

/// Tools and upstreams whose `identity` the server's auth cannot serve: acting as the caller
/// needs OIDC (a validated access token to pass on), exchanging needs the exchange client,
/// and a user's own sign-in (`user`) needs `auth.upstreamSignIn`.
fn identity_needs(
    mcp: &McpServer,
    compiled: &config::CompiledToolSet,
    api_origins: &[String],
    openapi: &[config::openapi::OpenApiSpec],
) -> Vec<String> {
    use quiver_model::spec::identity::IdentityMode;
    let auth = mcp.spec.auth.as_ref();
    let (oidc, exchange, sign_in) = (
        auth.is_some_and(|a| a.oidc.is_some()),
        auth.is_some_and(|a| a.token_exchange.is_some()),
        auth.is_some_and(|a| a.upstream_sign_in.is_some()),
    );
    let tools = compiled.tools.iter().filter_map(|t| match &t.handler {
        config::CompiledHandler::Http(h) => h
            .identity
            .as_ref()
            .map(|i| (format!("tool `{}`", t.name), i.mode)),
        _ => None,
    });
    let upstreams = compiled.upstreams.iter().filter_map(|u| {
        u.identity
            .as_ref()
            .map(|i| (format!("upstream `{}`", u.name), i.mode))
    });
    // A fetched source's tools are compiled in the pods: its `identity` is checked here.
    let sources = openapi.iter().zip(api_origins).filter_map(|(s, at)| {
        s.identity
            .as_ref()
            .filter(|_| s.url.is_some())
            .map(|i| (at.clone(), i.mode))
    });
    let upstreams = upstreams.chain(sources);
    // The token endpoint receives callers' tokens: only the issuer's own host may.
    let endpoint = auth.and_then(|a| {
        let e = a.token_exchange.as_ref()?.token_endpoint.as_ref()?;
        let issuer = &a.oidc.as_ref()?.issuer;
        (!quiver_model::spec::identity::same_origin(e, issuer)).then(|| {
            format!(
                "spec.auth.tokenExchange.tokenEndpoint: must be on the issuer's origin ({issuer}), or left out to use the issuer's discovered token_endpoint"
            )
        })
    });
    endpoint
        .into_iter()
        .chain(tools.chain(upstreams).filter_map(|(what, mode)| {
            if !oidc {
                Some(format!(
                    "{what}: identity.mode `{}` acts as the caller and needs spec.auth.oidc (only validated access tokens are passed on)",
                    mode.as_str()
                ))
            } else if mode == IdentityMode::Exchange && !exchange {
                Some(format!(
                    "{what}: identity.mode `exchange` needs spec.auth.tokenExchange (this server's client at the issuer)"
                ))
            } else if mode == IdentityMode::User && !sign_in {
                Some(format!(
                    "{what}: identity.mode `user` needs spec.auth.upstreamSignIn (where users sign in to the upstream and their tokens are kept)"
                ))
            } else {
                None
            }
        }))
        .collect()
}

/// `Err` with `reason` when there are `problems`.
fn refuse(reason: &'static str, problems: Vec<String>) -> Result<(), Invalid> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Invalid { reason, problems })
    }
}

/// The `toolsFrom` entries whose ConfigMap or key is missing.
fn missing(mcp: &McpServer, fetched: &Fetched) -> Vec<String> {
    mcp.spec
        .tools_from
        .iter()
        .zip(fetched)
        .enumerate()
        .filter(|(_, (_, f))| f.is_none())
        .map(|(i, (t, _))| {
            format!(
                "spec.toolsFrom[{i}]: ConfigMap {} has no key {} (a ConfigMap labelled {}={} is read as soon as it changes, others within 5 minutes)",
                t.config_map_key_ref.name, t.config_map_key_ref.key, TOOLS_LABEL.0, TOOLS_LABEL.1
            )
        })
        .collect()
}

/// The ToolSet merged from the spec and its `toolsFrom` documents, with where each tool and
/// upstream came from (to name it in problems).
struct Merged {
    ts: ToolSet,
    origins: Vec<String>,
    up_origins: Vec<String>,
    pol_origins: Vec<String>,
    api_origins: Vec<String>,
}

impl Merged {
    /// The spec's own tools, resources, prompts and upstreams.
    fn inline(mcp: &McpServer, name: &str) -> Self {
        let spec = &mcp.spec;
        let ts = ToolSet {
            server: spec.server.clone().unwrap_or_else(|| ServerInfo {
                name: name.to_owned(),
                ..ServerInfo::default()
            }),
            tools: spec.tools.clone(),
            resources: spec.mcp_resources.clone(),
            prompts: spec.prompts.clone(),
            upstreams: spec.upstreams.iter().map(crate::build::served_upstream).collect(),
            openapi: spec.openapi.clone(),
            policies: spec.policies.clone(),
            limits: spec.limits.clone(),
            tool_search: spec.tool_search.clone(),
            result_guards: spec.result_guards.clone(),
            webhooks: spec.webhooks.clone(),
            ..ToolSet::default()
        };
        let origins = (0..ts.tools.len()).map(|i| format!("spec.tools[{i}]")).collect();
        let up_origins = (0..ts.upstreams.len())
            .map(|i| format!("spec.upstreams[{i}]"))
            .collect();
        let pol_origins = (0..ts.policies.len())
            .map(|i| format!("spec.policies[{i}]"))
            .collect();
        let api_origins = (0..ts.openapi.len())
            .map(|i| format!("spec.openapi[{i}]"))
            .collect();
        Self {
            ts,
            origins,
            up_origins,
            pol_origins,
            api_origins,
        }
    }

    /// Adds the `toolsFrom` documents; returns their parse problems.
    fn read(&mut self, mcp: &McpServer, fetched: &Fetched) -> Vec<String> {
        let mut problems = Vec::new();
        for (i, (from, text)) in mcp.spec.tools_from.iter().zip(fetched).enumerate() {
            let r = &from.config_map_key_ref;
            let label = format!("spec.toolsFrom[{i}] (ConfigMap {}, key {})", r.name, r.key);
            match config::parse(&label, text.as_deref().unwrap_or_default()) {
                Ok(doc) => {
                    let ts = &mut self.ts;
                    self.origins
                        .extend((0..doc.tools.len()).map(|j| format!("{label} tools[{j}]")));
                    ts.tools.extend(doc.tools);
                    ts.resources.extend(doc.resources);
                    ts.prompts.extend(doc.prompts);
                    self.up_origins
                        .extend((0..doc.upstreams.len()).map(|j| format!("{label} upstreams[{j}]")));
                    ts.upstreams.extend(doc.upstreams);
                    self.api_origins
                        .extend((0..doc.openapi.len()).map(|j| format!("{label} openapi[{j}]")));
                    ts.openapi.extend(doc.openapi);
                    self.pol_origins
                        .extend((0..doc.policies.len()).map(|j| format!("{label} policies[{j}]")));
                    ts.policies.extend(doc.policies);
                    ts.limits.extend(doc.limits);
                    ts.webhooks.extend(doc.webhooks);
                    if ts.tool_search.is_none() {
                        ts.tool_search = doc.tool_search;
                    }
                    if ts.result_guards.is_none() {
                        ts.result_guards = doc.result_guards;
                    }
                }
                Err(e) => problems.extend(e.problems.iter().map(ToString::to_string)),
            }
        }
        problems
    }
}

/// The Secrets the tools read whose names no Secret can have.
fn bad_secret_names(secrets: &BTreeSet<String>) -> Vec<String> {
    secrets
        .iter()
        // ConfigMaps (CA bundles) were checked as such by compile.
        .filter(|n| !n.starts_with(config::CONFIG_MAP_PREFIX) && !is_dns_label(n))
        .map(|n| {
            format!("`{{{{secret.{n}...}}}}`: `{n}` is not a Kubernetes Secret name (lower-case letters, digits and `-`)")
        })
        .collect()
}

/// The document of `ts` for the ConfigMap, checked to fit and to read back to `hash`.
fn write(ts: &ToolSet, hash: &str) -> Result<String, Invalid> {
    // JSON (which is YAML): the pods read it several times faster than YAML text.
    let yaml = config::write_document(ts).map_err(|e| Invalid {
        reason: "RenderFailed",
        problems: vec![e.to_string()],
    })?;
    if yaml.len() > MAX_CONFIGMAP_BYTES {
        return Err(Invalid {
            reason: "ToolConfigTooLarge",
            problems: vec![format!(
                "the ToolSet renders to {} bytes; a ConfigMap holds at most {MAX_CONFIGMAP_BYTES}",
                yaml.len()
            )],
        });
    }
    // The pods read this document back with the server's own parser: check here that it
    // reads back to the same ToolSet, so what the operator accepts is what the pods serve.
    let served = config::parse("ConfigMap", &yaml).and_then(|ts| config::compile(&ts));
    if served.as_ref().map(|c| c.hash.as_str()) != Ok(hash) {
        return Err(Invalid {
            reason: "RenderFailed",
            problems: vec![match served {
                Err(e) => format!("the rendered ToolSet does not read back: {e}"),
                Ok(_) => "the rendered ToolSet reads back as a different ToolSet".to_owned(),
            }],
        });
    }
    Ok(yaml)
}

/// Checks that the ServiceAccount the spec names (`sa`, as read; `None` when absent) lets
/// this McpServer run as it.
///
/// # Errors
/// `ServiceAccountNotAllowed` when it does not exist or its owner has not consented.
pub fn service_account(mcp: &McpServer, sa: Option<&ServiceAccount>) -> Result<(), Invalid> {
    crate::build::service_account_consent(mcp, sa).map_err(|problem| Invalid {
        reason: "ServiceAccountNotAllowed",
        problems: vec![problem],
    })
}

/// Rewrites `tools[N]...` (`upstreams[`, `policies[`, `openapi[`; merged index) into its origin; `resources[`/`prompts[` into `spec.`.
fn locate(problem: &str, lists: &[(&str, &Vec<String>)]) -> String {
    for (prefix, origins) in lists {
        if let Some(rest) = problem.strip_prefix(prefix)
            && let Some((n, tail)) = rest.split_once(']')
            && let Some(origin) = n.parse::<usize>().ok().and_then(|i| origins.get(i))
        {
            return format!("{origin}{tail}");
        }
    }
    if let Some(rest) = problem.strip_prefix("resources[") {
        return format!("spec.mcpResources[{rest}");
    }
    if problem.starts_with("prompts[") || problem.starts_with("server.") || problem.starts_with("toolSearch")
    {
        return format!("spec.{problem}");
    }
    problem.to_owned()
}

/// The keys of a ConfigMap's data, for looking up `toolsFrom` sources.
pub fn key_of(data: Option<&BTreeMap<String, String>>, key: &str) -> Option<String> {
    data.and_then(|d| d.get(key)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_model::config::compile;

    fn mcp(yaml: &str) -> McpServer {
        serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn problems_name_their_origin() {
        let m = mcp(r#"
metadata: {name: x}
spec:
  tools:
    - {name: ok, handler: {builtin: add}}
  toolsFrom:
    - configMapKeyRef: {name: shared, key: tools.yaml}
"#);
        let from = "tools:\n  - {name: bad, handler: {builtin: nope}}\n";
        let err = render(&m, &vec![Some(from.to_owned())]).unwrap_err();
        assert_eq!(err.reason, "InvalidToolConfig");
        assert!(err.problems[0].starts_with("spec.toolsFrom[0] (ConfigMap shared, key tools.yaml) tools[0].handler.builtin: unknown builtin `nope`"), "{:?}", err.problems);
        let inline = mcp(
            "metadata: {name: x}\nspec:\n  tools:\n    - {name: ok, handler: {builtin: add}}\n    - {name: g, input: {n: string}, handler: {template: \"{{nn}}\"}}\n",
        );
        let err = render(&inline, &vec![]).unwrap_err();
        assert!(
            err.problems[0].starts_with("spec.tools[1].handler.template: template uses `nn`"),
            "{:?}",
            err.problems
        );
    }

    #[test]
    fn tool_search_renders_into_the_toolset_and_its_problems_name_the_spec() {
        let m = mcp(
            "metadata: {name: x}\nspec:\n  tools:\n    - {name: a, handler: {builtin: add}}\n  toolSearch: {coreTools: [a], maxLimit: 10}\n",
        );
        let served = config::parse("ConfigMap", &render(&m, &vec![]).unwrap().yaml).unwrap();
        let s = served.tool_search.expect("rendered");
        assert_eq!((s.core_tools, s.max_limit), (vec!["a".to_owned()], Some(10)));
        let bad = mcp("metadata: {name: x}\nspec:\n  toolSearch: {coreTools: [gone]}\n");
        let err = render(&bad, &vec![]).unwrap_err();
        assert_eq!(
            err.problems,
            ["spec.toolSearch.coreTools[0]: no tool is named `gone`"]
        );
        // From a `toolsFrom` document when the spec sets none.
        let from =
            mcp("metadata: {name: x}\nspec:\n  toolsFrom:\n    - configMapKeyRef: {name: s, key: k}\n");
        let doc = "tools: [{name: b, handler: {builtin: add}}]\ntoolSearch: {coreTools: [b]}\n";
        let served = config::parse(
            "ConfigMap",
            &render(&from, &vec![Some(doc.to_owned())]).unwrap().yaml,
        )
        .unwrap();
        assert_eq!(
            served.tool_search.map(|s| s.core_tools),
            Some(vec!["b".to_owned()])
        );
    }

    #[test]
    fn openapi_sources_render_and_their_problems_name_the_spec() {
        let kube = "{name: core, url: 'https://kubernetes.default.svc/openapi/v3/api/v1', fetch: {caFile: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt, tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token, refresh: 10m}, operations: {methods: [get]}}";
        let m = mcp(&format!(
            "metadata: {{name: x}}\nspec:\n  openapi:\n    - {kube}\n  toolSearch: {{coreTools: [readCoreV1Namespace]}}\n"
        ));
        let served = config::parse("ConfigMap", &render(&m, &vec![]).unwrap().yaml).unwrap();
        assert_eq!(served.openapi, m.spec.openapi);
        let bad = |source: &str| {
            render(
                &mcp(&format!(
                    "metadata: {{name: x}}\nspec:\n  openapi:\n    - {source}\n"
                )),
                &vec![],
            )
            .unwrap_err()
            .problems
        };
        assert_eq!(
            bad("{name: core, url: 'http://kubernetes.default.svc/openapi/v3/api/v1'}"),
            ["spec.openapi[0].url: an `http` URL needs `fetch.allowHttp: true`"]
        );
        assert_eq!(
            bad("{name: core, url: 'https://h/d', fetch: {refresh: 1s}}"),
            ["spec.openapi[0].fetch.refresh: `1s` is not a duration between 10s and 24h"]
        );
        // Passing on the caller's token needs validated tokens (spec.auth.oidc).
        let forward = bad(
            "{name: core, url: 'https://h/d', server: 'https://h', identity: {mode: forward, audience: 'https://h'}}",
        );
        assert!(
            forward.len() == 1
                && forward[0].starts_with(
                    "spec.openapi[0]: identity.mode `forward` acts as the caller and needs spec.auth.oidc"
                ),
            "{forward:?}"
        );
        // From a toolsFrom document, named by its ConfigMap.
        let from =
            mcp("metadata: {name: x}\nspec:\n  toolsFrom:\n    - configMapKeyRef: {name: s, key: k}\n");
        let err = render(
            &from,
            &vec![Some("openapi: [{name: a, url: 'ftp://h/d'}]\n".to_owned())],
        )
        .unwrap_err();
        assert_eq!(
            err.problems,
            ["spec.toolsFrom[0] (ConfigMap s, key k) openapi[0].url: must be an `https` URL"]
        );
    }

    #[test]
    fn policies_render_into_the_toolset_and_their_problems_name_their_origin() {
        let m = mcp(r#"
metadata: {name: x}
spec:
  tools:
    - {name: restart, input: {namespace: string}, policy: "args.namespace != 'prod'", handler: {template: ok}}
  policies:
    - {name: sre, expression: "'sre' in caller.groups", tools: [restart]}
  toolsFrom:
    - configMapKeyRef: {name: shared, key: tools.yaml}
"#);
        let from = "policies:\n  - {name: shared, expression: \"caller.subject != ''\"}\n";
        let ok = render(&m, &vec![Some(from.to_owned())]).unwrap();
        let served = config::parse("ConfigMap", &ok.yaml).unwrap();
        let names: Vec<&str> = served.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["sre", "shared"]);
        assert_eq!(
            served.tools[0].policy.as_deref(),
            Some("args.namespace != 'prod'")
        );

        let bad_from = "policies:\n  - {name: shared, expression: \"caller.nope\"}\n";
        let err = render(&m, &vec![Some(bad_from.to_owned())]).unwrap_err();
        assert_eq!(
            err.problems,
            [
                "spec.toolsFrom[0] (ConfigMap shared, key tools.yaml) policies[0].expression: unknown field `caller.nope` (subject, issuer, clientId, claims, groups, scopes)"
            ]
        );
        let inline = mcp(
            "metadata: {name: x}\nspec:\n  tools:\n    - {name: t, policy: 'size(caller)', handler: {template: ok}}\n  policies:\n    - {name: p, expression: 'true', upstreams: [gone]}\n",
        );
        let err = render(&inline, &vec![]).unwrap_err();
        assert_eq!(err.problems.len(), 2, "{:?}", err.problems);
        assert!(
            err.problems[0].starts_with("spec.policies[0].upstreams[0]: no upstream"),
            "{:?}",
            err.problems
        );
        assert!(
            err.problems[1].starts_with("spec.tools[0].policy: size() of caller"),
            "{:?}",
            err.problems
        );
    }

    #[test]
    fn missing_sources_are_reported() {
        let m = mcp(
            "metadata: {name: x}\nspec:\n  toolsFrom:\n    - configMapKeyRef: {name: gone, key: t.yaml}\n",
        );
        let err = render(&m, &vec![None]).unwrap_err();
        assert_eq!(err.reason, "ToolsFromMissing");
        assert!(err.problems[0].contains("ConfigMap gone has no key t.yaml"));
    }

    #[test]
    fn rendered_yaml_round_trips_to_the_same_hash_the_server_computes() {
        let m = mcp(r#"
metadata: {name: x}
spec:
  server: {name: srv, instructions: "multi\nline"}
  tools:
    - {name: add, handler: {builtin: add}}
    - name: w
      input: {city: string, n: "integer?"}
      handler: {http: {method: POST, url: "http://h/{{city}}", body: {n: "{{n}}", f: 1.5, t: true}, timeout: 2s}}
  prompts: [{name: p, messages: [{role: user, text: hi}]}]
"#);
        let r = render(&m, &vec![]).unwrap();
        let reparsed = quiver_model::config::parse("cm", &r.yaml).unwrap();
        assert_eq!(compile(&reparsed).unwrap().hash, r.hash, "{}", r.yaml);
        assert_eq!(r.tool_count, 2);
    }

    #[test]
    fn hostile_tools_from_documents_are_refused_not_crashing() {
        let m = mcp("metadata: {name: x}\nspec:\n  toolsFrom:\n    - configMapKeyRef: {name: a, key: b}\n");
        let deep_flow = format!(
            "tools: [{{name: a, handler: {{builtin: echo}}, inputSchema: {}{}}}]",
            "[".repeat(200_000),
            "]".repeat(200_000)
        );
        let mut deep_block = String::from("tools:\n- name: a\n  handler: {builtin: echo}\n  inputSchema:\n");
        for i in 0..5_000 {
            deep_block.push_str(&" ".repeat(4 + i));
            deep_block.push_str("- \n");
        }
        // "Billion laughs": aliases that would expand to 10^10 nodes inside a free-form schema.
        let mut laughs = String::from(
            "tools:\n- name: a\n  handler: {builtin: echo}\n  inputSchema:\n    a: &a [x, x, x, x, x, x, x, x, x, x]\n",
        );
        for (prev, next) in ('a'..='i').zip('b'..='j') {
            let refs = vec![format!("*{prev}"); 10].join(", ");
            laughs.push_str(&format!("    {next}: &{next} [{refs}]\n"));
        }
        for doc in [deep_flow, deep_block, laughs] {
            let err = render(&m, &vec![Some(doc)]).unwrap_err();
            assert_eq!(err.reason, "InvalidToolConfig");
            assert!(
                err.problems[0].starts_with("spec.toolsFrom[0] (ConfigMap a, key b)"),
                "{:?}",
                err.problems
            );
        }
    }

    #[test]
    fn what_renders_is_what_the_pods_will_read_back() {
        // Too large for a ConfigMap: refused with its own reason, not a failed apply.
        let big = format!(
            "metadata: {{name: x}}\nspec:\n  tools:\n    - {{name: a, handler: {{template: \"{}\"}}}}\n",
            "t".repeat(MAX_CONFIGMAP_BYTES)
        );
        let err = render(&mcp(&big), &vec![]).unwrap_err();
        assert_eq!(err.reason, "ToolConfigTooLarge", "{:?}", err.problems);
        // A schema nested deeper than the server accepts is refused here too (the pods
        // would refuse the ConfigMap and keep serving stale tools).
        let deep = format!(
            "metadata: {{name: x}}\nspec:\n  tools:\n    - {{name: a, handler: {{builtin: json}}, inputSchema: {{type: object, properties: {{a: {{default: {}1{}}}}}}}}}\n",
            "[".repeat(40),
            "]".repeat(40)
        );
        let err = render(&mcp(&deep), &vec![]).unwrap_err();
        assert!(err.problems[0].contains("nests"), "{:?}", err.problems);
    }

    #[test]
    fn a_schema_too_deep_for_json_readers_is_a_problem_of_its_tool_not_of_the_list() {
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let list = format!(
            r#"{{"items": [
                {{"metadata": {{"name": "deep"}}, "spec": {{"tools": [{{"name": "a", "handler": {{"builtin": "json"}}, "inputSchema": {{"type": "object", "default": {deep}}}}}]}}}},
                {{"metadata": {{"name": "fine"}}, "spec": {{"tools": [{{"name": "a", "handler": {{"builtin": "now"}}}}]}}}}
            ]}}"#
        );
        #[derive(serde::Deserialize)]
        struct List {
            items: Vec<McpServer>,
        }
        let list: List = serde_json::from_str(&list).expect("the list reads despite the deep schema");
        let err = render(&list.items[0], &vec![]).unwrap_err();
        assert_eq!(err.reason, "InvalidToolConfig");
        assert_eq!(
            err.problems,
            ["spec.tools[0].inputSchema: nests 302 deep; at most 32 levels are accepted"]
        );
        assert!(render(&list.items[1], &vec![]).is_ok());
    }
}
