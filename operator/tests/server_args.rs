//! Every McpServer the API server and the operator accept renders a pod whose arguments
//! quiver-server accepts: a value the CRD admits must never keep a pod from starting.
//!
//! McpServers are generated from the CRD's own schema: starting from one that sets every
//! section the server's flags come from, each constrained field (an integer at its minimum
//! and maximum, each value of an enum, strings sampled from a field's pattern, both
//! booleans) is set in turn, and the result goes through `kubectl quiver check` (the CRD's
//! structural schema and CEL rules, the operator's render and build, then the server's own
//! flag parser over the rendered arguments and environment).

use kube::CustomResourceExt;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use quiver_operator::crd::McpServer;
use quiver_operator::plugin::check::check;
use serde_json::{Value, json};

/// An McpServer with every section that renders a server flag or variable.
const BASE: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: bounds, namespace: team}
spec:
  replicas: 2
  logLevel: info
  server: {name: bounds, version: 1.0.0, pageSize: 100, instructions: "Bounds."}
  tools:
    - {name: add, description: Add two numbers, handler: {builtin: add}}
  allowedOrigins: ["https://app.example"]
  trustedProxies: ["10.0.0.0/8"]
  audit: {onFull: drop, queue: 1024}
  auth:
    oidc:
      issuer: https://idp.example/realms/team
      audience: https://mcp.example/mcp
      resource: https://mcp.example/mcp
      jwksUri: https://idp.example/realms/team/certs
      groupsClaim: groups
      caConfigMap: idp-ca
    tokenExchange:
      clientId: quiver
      clientSecretRef: {name: exchange, key: secret}
      tokenEndpoint: https://idp.example/realms/team/token
    upstreamSignIn:
      url: https://mcp.example
      keysSecretRef: {name: sign-in-keys, key: ring}
      browserClient: {clientId: quiver-browser, clientSecretRef: {name: browser, key: secret}}
      maxUsers: 10000
      maxPerUser: 32
      redis:
        address: redis.infra:6379
        timeout: 500ms
        username: quiver-sign-in
        passwordSecretRef: {name: redis, key: password}
  limitsRedis:
    address: redis.infra:6379
    failMode: Open
    timeout: 50ms
    passwordSecretRef: {name: redis, key: password}
  monitoring: {serviceMonitor: true}
  service: {port: 8080, type: ClusterIP, exposeAdmin: true}
  sessionAffinity: {timeoutSeconds: 600}
  tasks:
    ttl: 1h
    drain: 30s
    perCaller: 10
    anonymousMax: 5
    redis: {address: redis.infra:6379, timeout: 500ms, passwordSecretRef: {name: redis, key: password}}
  toolSearch: {enabled: true, defaultLimit: 5, maxLimit: 20}
  tracing:
    endpoint: http://otel.infra:4318
    samplingRatio: 0.5
    trustClientSampling: authenticated
    serviceName: bounds
    forwardTraceState: true
  tuning: {allocator: jemalloc, profile: balanced, workerThreads: 2}
"#;

/// A constrained field of the schema: its path (`[]` for an array's first item) and the
/// values it is tried with.
struct Field {
    path: Vec<String>,
    values: Vec<Value>,
}

/// Strings `pattern` admits (its anchors dropped: proptest generates whole strings).
fn samples(pattern: &str, n: usize) -> Vec<String> {
    let bare = pattern.trim_start_matches('^').trim_end_matches('$');
    let Ok(strategy) = proptest::string::string_regex(bare) else {
        return Vec::new();
    };
    let mut runner = TestRunner::deterministic();
    (0..n)
        .filter_map(|_| strategy.new_tree(&mut runner).ok().map(|t| t.current()))
        .collect()
}

/// The values a leaf of the schema is tried with; none for an unconstrained one.
fn bounds(schema: &Value) -> Vec<Value> {
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        return e.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("integer" | "number") => ["minimum", "maximum"]
            .iter()
            .filter_map(|k| schema.get(*k).and_then(Value::as_f64))
            .map(|f| {
                if schema["type"] == "integer" {
                    json!(f as i64)
                } else {
                    json!(f)
                }
            })
            .collect(),
        Some("boolean") => vec![json!(true), json!(false)],
        Some("string") => schema
            .get("pattern")
            .and_then(Value::as_str)
            .map(|p| samples(p, 12).into_iter().map(Value::String).collect())
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// Every constrained leaf under `schema`, depth first.
fn fields(schema: &Value, path: &mut Vec<String>, out: &mut Vec<Field>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            path.push(k.clone());
            fields(v, path, out);
            path.pop();
        }
        return;
    }
    if let Some(items) = schema.get("items").filter(|v| v.is_object()) {
        path.push("[]".into());
        fields(items, path, out);
        path.pop();
        return;
    }
    let values = bounds(schema);
    if !values.is_empty() {
        out.push(Field {
            path: path.clone(),
            values,
        });
    }
}

/// `doc` with `value` at `path`, when every parent of the leaf is there already (a field
/// of a section the base leaves out is not tried: its siblings' requirements are unknown).
fn with(doc: &Value, path: &[String], value: &Value) -> Option<Value> {
    let mut out = doc.clone();
    let mut at = &mut out;
    let (leaf, parents) = path.split_last()?;
    for p in parents {
        at = if p == "[]" {
            at.as_array_mut()?.first_mut()?
        } else {
            at.get_mut(p)?
        };
    }
    if leaf == "[]" {
        *at.as_array_mut()?.first_mut()? = value.clone();
    } else {
        at.as_object_mut()?.insert(leaf.clone(), value.clone());
    }
    Some(out)
}

#[test]
fn every_accepted_mcpserver_renders_arguments_the_server_accepts() {
    let crd = serde_json::to_value(McpServer::crd()).unwrap();
    let spec_schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let base: Value = serde_saphyr::from_str(BASE).unwrap();
    let report = |doc: &Value| {
        let text = serde_json::to_string(doc).unwrap();
        let reports = check(&text).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(reports.len(), 1);
        reports.into_iter().next().unwrap()
    };
    let clean = report(&base);
    assert!(
        clean.problems.is_empty(),
        "the base is refused: {:?}",
        clean.problems
    );

    let mut all = Vec::new();
    fields(spec_schema, &mut vec!["spec".to_owned()], &mut all);
    // Fields whose pattern admits far more than they mean: their edges, by hand.
    for (path, values) in [
        (
            "spec.trustedProxies.[]",
            json!([
                "0.0.0.0/0",
                "::/0",
                "255.255.255.255/32",
                "fd00::/8",
                "10.1.2.3",
                "::ffff:10.0.0.0/104"
            ]),
        ),
        (
            "spec.logLevel",
            json!(["trace", "warn,quiver_server=debug", "off"]),
        ),
        (
            "spec.auth.oidc.groupsClaim",
            json!(["realm_access.roles", "https://example.com/groups"]),
        ),
        (
            "spec.auth.upstreamSignIn.url",
            json!([
                "https://mcp.example.com/",
                "https://mcp.example.com:8443",
                "https://[2001:db8::1]:443",
                "http://127.0.0.1:8080",
                "http://localhost",
                "http://[::1]:65535/"
            ]),
        ),
    ] {
        let field = all.iter_mut().find(|f| f.path.join(".") == path).unwrap();
        field.values.extend(values.as_array().unwrap().iter().cloned());
    }
    let (mut tried, mut accepted, mut untried) = (0, 0, Vec::new());
    for field in &all {
        let mut field_accepted = 0;
        for value in &field.values {
            let Some(doc) = with(&base, &field.path, value) else {
                continue;
            };
            tried += 1;
            let r = report(&doc);
            let refused: Vec<&String> = r
                .problems
                .iter()
                .filter(|p| p.contains("InvalidServerArgs"))
                .collect();
            assert!(
                refused.is_empty(),
                "{} = {value}: accepted by the CRD and the operator, refused by the server: {refused:?}",
                field.path.join(".")
            );
            if r.problems.is_empty() {
                field_accepted += 1;
            }
        }
        accepted += field_accepted;
        if field_accepted == 0 {
            untried.push(field.path.join("."));
        }
    }
    // Not vacuous: the fields that become flags are among those tried and accepted.
    for must in [
        "spec.tasks.ttl",
        "spec.tasks.drain",
        "spec.tasks.perCaller",
        "spec.tasks.anonymousMax",
        "spec.tasks.redis.timeout",
        "spec.limitsRedis.timeout",
        "spec.limitsRedis.failMode",
        "spec.audit.queue",
        "spec.audit.onFull",
        "spec.tuning.workerThreads",
        "spec.tracing.samplingRatio",
        "spec.tracing.trustClientSampling",
        "spec.trustedProxies.[]",
        "spec.auth.oidc.groupsClaim",
        "spec.auth.upstreamSignIn.url",
        "spec.auth.upstreamSignIn.maxUsers",
        "spec.auth.upstreamSignIn.maxPerUser",
        "spec.auth.upstreamSignIn.browserClient.clientId",
        "spec.auth.upstreamSignIn.redis.timeout",
        "spec.auth.upstreamSignIn.redis.username",
    ] {
        assert!(
            all.iter().any(|f| f.path.join(".") == must) && !untried.iter().any(|u| u == must),
            "{must} was not tried with an accepted value (untried: {untried:?})"
        );
    }
    assert!(
        tried > 100 && accepted > tried / 2,
        "tried {tried}, accepted {accepted}"
    );
}

/// The documented maximum of every duration field at once, with the rest of the base.
#[test]
fn every_duration_at_its_maximum_renders_arguments_the_server_accepts() {
    let mut doc: Value = serde_saphyr::from_str(BASE).unwrap();
    doc["spec"]["tasks"]["ttl"] = json!("24h");
    doc["spec"]["tasks"]["drain"] = json!("60m");
    doc["spec"]["tasks"]["redis"]["timeout"] = json!("5s");
    doc["spec"]["limitsRedis"]["timeout"] = json!("5s");
    doc["spec"]["auth"]["upstreamSignIn"]["redis"]["timeout"] = json!("5s");
    let reports = check(&serde_json::to_string(&doc).unwrap()).unwrap();
    assert_eq!(reports[0].problems, Vec::<String>::new());
}
