//! Property test: no McpServer, however odd, panics the operator while it is rendered, built
//! and given a status (release builds abort on panic, which would take down every McpServer
//! of the cluster), and every object built serializes and reads back as the same object.
//!
//! Specs are generated as JSON, field by field: mostly well-typed values at the edges of
//! their types (huge, negative, empty, long, deep, unicode), sometimes any JSON at all. What
//! does not deserialize into `McpServer` is what kube-rs would drop too, so only the rest is
//! fed to render and build.

use k8s_openapi::api::apps::v1::Deployment;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use quiver_operator::build::{Defaults, build};
use quiver_operator::crd::McpServer;
use quiver_operator::reconcile::status_from;
use quiver_operator::render::{Rendered, render};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Strings: short identifiers, template-ish text, numbers with units, long and unicode text.
fn text() -> BoxedStrategy<String> {
    prop_oneof![
        4 => "[a-z][a-z0-9.-]{0,10}",
        2 => "([a-z {}.]|\\{\\{[a-z0-9.]{0,6}\\}\\}){0,24}",
        2 => "[0-9.]{0,30}(ms|s|m|h|)",
        1 => ".{0,64}",
        1 => "[a-z]{1,3}".prop_map(|s| s.repeat(400)),
    ]
    .boxed()
}

fn string_map() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(text(), text(), 0..5).prop_map(|m| json!(m))
}

/// A value for a field: usually `typed`, sometimes any JSON.
fn field(typed: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Value> {
    prop_oneof![100 => typed, 1 => arb_json()].boxed()
}

/// Integers of the field's own type, at its edges and near zero.
fn i32s() -> impl Strategy<Value = Value> {
    prop_oneof![any::<i32>(), -3i32..5, Just(i32::MAX), Just(i32::MIN)].prop_map(Value::from)
}

fn u32s() -> impl Strategy<Value = Value> {
    prop_oneof![any::<u32>(), 0u32..5, Just(u32::MAX)].prop_map(Value::from)
}

fn u64s() -> impl Strategy<Value = Value> {
    prop_oneof![any::<u64>(), 0u64..5, Just(u64::MAX)].prop_map(Value::from)
}

fn quantity() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("4")),
        Just(json!("500m")),
        Just(json!("-1")),
        Just(json!("99999999999999999999999")),
        "[0-9]{1,25}(m|Mi|Gi|k|)".prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn duration() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[0-9]{1,40}(ms|s|m)".prop_map(Value::from),
        "[0-9.]{0,12}(ms|s|m|h|)".prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn handler() -> impl Strategy<Value = Value> {
    let builtin = prop_oneof![
        prop::sample::select(vec![
            "echo", "add", "multiply", "upper", "lower", "length", "sha256", "now", "sleep", "json"
        ])
        .prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    let http = (text(), text(), string_map(), arb_json(), duration(), u64s()).prop_map(
        |(method, url, headers, body, timeout, max)| {
            json!({"http": {"method": method, "url": format!("http://h/{url}"), "headers": headers, "body": body, "timeout": timeout, "maxResponseBytes": max}})
        },
    );
    let exec = (prop::collection::vec(text(), 0..4), string_map(), text(), duration(), u64s()).prop_map(
        |(command, env, stdin, timeout, max)| {
            json!({"exec": {"command": command, "env": env, "stdin": stdin, "timeout": timeout, "maxOutputBytes": max}})
        },
    );
    let pipeline = prop::collection::vec(
        (prop::sample::select(vec!["a", "b", "c", "missing"]), arb_json()),
        0..4,
    )
    .prop_map(|steps| {
        json!({"pipeline": steps.into_iter().map(|(tool, input)| json!({"tool": tool, "input": input})).collect::<Vec<_>>()})
    });
    prop_oneof![
        builtin.prop_map(|b| json!({"builtin": b})),
        text().prop_map(|t| json!({"template": t})),
        http,
        exec,
        pipeline,
    ]
}

fn tool() -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned),
        text()
    ];
    let input = prop::option::of(prop::collection::btree_map(
        text(),
        prop_oneof![
            prop::sample::select(vec![
                "string", "number?", "integer", "boolean", "object", "array?"
            ])
            .prop_map(Value::from),
            arb_json(),
        ],
        0..4,
    ));
    (
        name,
        prop::option::of(text()),
        input,
        prop::option::of(arb_json()),
        prop::option::of(arb_json()),
        handler(),
    )
        .prop_map(
            |(name, description, input, input_schema, output_schema, handler)| {
                let mut t = json!({"name": name, "handler": handler});
                if let Some(d) = description {
                    t["description"] = json!(d);
                }
                if let Some(i) = input {
                    t["input"] = json!(i);
                }
                if let Some(s) = input_schema {
                    t["inputSchema"] = s;
                }
                if let Some(s) = output_schema {
                    t["outputSchema"] = s;
                }
                t
            },
        )
}

/// Tools: well-formed ones (so that whole specs render) or anything tool-shaped.
fn tools() -> impl Strategy<Value = Value> {
    let well_formed = prop::collection::vec(
        prop::sample::select(vec!["echo", "add", "upper", "now", "sha256"]),
        0..6,
    )
    .prop_map(|builtins| {
        let tools = builtins
            .iter()
            .enumerate()
            .map(|(i, b)| json!({"name": format!("t{i}"), "handler": {"builtin": b}}));
        Value::Array(tools.collect())
    });
    prop_oneof![
        well_formed,
        prop::collection::vec(tool(), 0..6).prop_map(Value::Array),
    ]
}

/// McpServer names: mostly DNS labels, sometimes anything.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![8 => "[a-z]([a-z0-9-]{0,20}[a-z0-9])?", 1 => text()]
}

fn resources_and_prompts() -> impl Strategy<Value = (Value, Value)> {
    let resource = (prop::option::of(text()), prop::option::of(text()), text(), text()).prop_map(
        |(uri, template, name, text)| json!({"uri": uri, "uriTemplate": template, "name": name, "text": text}),
    );
    let prompt = (text(), prop::collection::vec((text(), any::<bool>()), 0..3), prop::collection::vec(text(), 0..3))
        .prop_map(|(name, args, messages)| {
            json!({
                "name": name,
                "arguments": args.into_iter().map(|(n, r)| json!({"name": n, "required": r})).collect::<Vec<_>>(),
                "messages": messages.into_iter().map(|t| json!({"role": "user", "text": t})).collect::<Vec<_>>(),
            })
        });
    (
        prop::collection::vec(resource, 0..3).prop_map(Value::Array),
        prop::collection::vec(prompt, 0..3).prop_map(Value::Array),
    )
}

fn tuning() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["balanced", "latency", "throughput"]),
        any::<bool>(),
        u32s(),
        prop::sample::select(vec!["jemalloc", "system"]),
        u32s(),
        string_map(),
        string_map(),
    )
        .prop_map(
            |(profile, pin, cpus, allocator, workers, sysctls, unsafe_sysctls)| {
                json!({"profile": profile, "cpuPinning": pin, "cpus": cpus, "allocator": allocator,
                   "workerThreads": workers, "sysctls": sysctls, "unsafeSysctls": unsafe_sysctls})
            },
        )
}

fn pod_template() -> impl Strategy<Value = Value> {
    let toleration = (text(), text(), any::<i64>()).prop_map(|(key, effect, secs)| {
        json!({"key": key, "operator": "Exists", "effect": effect, "tolerationSeconds": secs})
    });
    // Volumes of every kind the API knows (most of them outside the restricted profile),
    // sometimes two sources in one, mounted at paths around Quiver's own.
    let kind = prop::sample::select(vec![
        json!({"configMap": {"name": "c"}}),
        json!({"secret": {"secretName": "s"}}),
        json!({"emptyDir": {}}),
        json!({"projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}),
        json!({"downwardAPI": {"items": []}}),
        json!({"persistentVolumeClaim": {"claimName": "p"}}),
        json!({"ephemeral": {}}),
        json!({"csi": {"driver": "d"}}),
        json!({"hostPath": {"path": "/proc"}}),
        json!({"nfs": {"server": "n", "path": "/"}}),
        json!({"iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}),
        json!({"gitRepo": {"repository": "r"}}),
    ]);
    let volume_name = prop::sample::select(vec!["a", "b", "quiver-api-access", "quiver-run"]);
    let volume = (
        volume_name.clone(),
        kind.clone(),
        prop::option::weighted(0.1, kind),
    )
        .prop_map(|(name, k, extra)| {
            let mut v = k;
            if let Some(Value::Object(e)) = extra {
                v.as_object_mut().unwrap().extend(e);
            }
            v["name"] = json!(name);
            v
        });
    let path = prop::sample::select(vec![
        "/data",
        "/var/run/secrets/kubernetes.io/serviceaccount",
        "/var/run/secrets",
        "/run/secrets/kubernetes.io/serviceaccount/token",
        "/quiver/run",
        "/a/../var/run/secrets/kubernetes.io",
        "relative",
        "/",
    ]);
    let propagation = prop::option::weighted(
        0.2,
        prop::sample::select(vec!["None", "HostToContainer", "Bidirectional"]),
    );
    let mount = (volume_name, path, propagation)
        .prop_map(|(name, path, p)| json!({"name": name, "mountPath": path, "mountPropagation": p}));
    let selinux = prop::option::weighted(
        0.3,
        (
            prop::sample::select(vec![
                "container_t",
                "container_kvm_t",
                "spc_t",
                "unconfined_t",
                "",
            ]),
            prop::option::of(Just("system_u")),
        ),
    )
    .prop_map(|s| {
        s.map(|(t, user)| json!({"type": t, "user": user, "role": user.map(|_| "system_r"), "level": "s0"}))
    });
    let apparmor = prop::option::weighted(
        0.2,
        prop::sample::select(vec!["runtime/default", "unconfined", "localhost/p"]),
    );
    let sa = prop::option::weighted(0.2, prop::sample::select(vec!["default", "privileged"]));
    (
        (string_map(), prop::collection::vec(toleration, 0..3), string_map(), string_map()),
        (
            prop::option::weighted(0.5, prop::collection::vec(volume, 0..4)),
            prop::collection::vec(mount, 0..3),
            selinux,
            apparmor,
            sa,
        ),
    )
        .prop_map(
            |((node_selector, tolerations, labels, mut annotations), (volumes, mounts, selinux, apparmor, sa))| {
                let mounts = if volumes.is_some() { json!(mounts) } else { json!([]) };
                if let (Some(profile), Value::Object(a)) = (apparmor, &mut annotations) {
                    a.insert("container.apparmor.security.beta.kubernetes.io/server".into(), json!(profile));
                }
                json!({"nodeSelector": node_selector, "tolerations": tolerations, "labels": labels, "annotations": annotations,
                   "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
                   "volumes": volumes.unwrap_or_default(), "volumeMounts": mounts,
                   "security": {"seLinuxOptions": selinux}, "serviceAccountName": sa})
            },
        )
}

/// What a rendered spec's pods must hold whatever the spec says: the restricted Pod Security
/// profile's volume kinds and SELinux options, AppArmor at most the default or a node
/// profile, and a ServiceAccount token in the server container alone.
fn assert_confined(d: &Deployment) {
    const KINDS: [&str; 8] = [
        "configMap",
        "secret",
        "emptyDir",
        "projected",
        "downwardAPI",
        "persistentVolumeClaim",
        "ephemeral",
        "csi",
    ];
    let d = serde_json::to_value(d).unwrap();
    let template = &d["spec"]["template"];
    let pod = &template["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    for v in pod["volumes"].as_array().unwrap() {
        let keys: Vec<&String> = v.as_object().unwrap().keys().filter(|k| *k != "name").collect();
        assert!(keys.len() == 1 && KINDS.contains(&keys[0].as_str()), "{v}");
    }
    if let Some(se) = pod["securityContext"].get("seLinuxOptions") {
        assert!(se.get("user").is_none() && se.get("role").is_none(), "{se}");
        if let Some(t) = se.get("type") {
            assert!(
                quiver_operator::crd::SELINUX_TYPES.contains(&t.as_str().unwrap()),
                "{se}"
            );
        }
    }
    for (k, v) in template["metadata"]["annotations"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if k.starts_with("container.apparmor") {
            assert!(
                v == "runtime/default" || v.as_str().unwrap().starts_with("localhost/"),
                "{k}: {v}"
            );
        }
    }
    let all = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .chain(pod["initContainers"].as_array().into_iter().flatten());
    for (i, c) in all.enumerate() {
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let path = m["mountPath"].as_str().unwrap();
            let token = m["name"] == "quiver-api-access";
            assert_eq!(
                token,
                i == 0 && path == "/var/run/secrets/kubernetes.io/serviceaccount",
                "{c}"
            );
            assert!(
                token
                    || !(path.contains("/secrets/kubernetes.io")
                        || "/var/run/secrets".starts_with(path)
                        || path.contains("..")),
                "{m}"
            );
            assert!(m.get("mountPropagation").is_none_or(|p| p == "None"), "{m}");
        }
    }
}

/// Upstreams: stdio (in the container, or from an image: a sidecar), http, or junk.
fn upstreams() -> impl Strategy<Value = Value> {
    let stdio = (prop::option::weighted(0.6, text()), prop::collection::vec(text(), 0..3), string_map(), prop::option::of(u32s()))
        .prop_map(|(image, command, env, processes)| json!({"stdio": {"image": image, "command": command, "env": env, "processes": processes}}));
    let http =
        (text(), string_map()).prop_map(|(url, headers)| json!({"http": {"url": url, "headers": headers}}));
    let import = (
        prop::option::of(text()),
        prop::collection::vec(text(), 0..3),
        string_map(),
    )
        .prop_map(
            |(prefix, include, rename)| json!({"prefix": prefix, "include": include, "rename": rename}),
        );
    let upstream = (name(), prop_oneof![stdio, http], import, prop::option::of(text())).prop_map(
        |(name, mut kind, tools, timeout)| {
            kind["name"] = json!(name);
            kind["tools"] = tools;
            kind["timeout"] = json!(timeout);
            kind
        },
    );
    prop::collection::vec(upstream, 0..4).prop_map(Value::Array)
}

/// Every field of the spec, each optional.
fn spec() -> impl Strategy<Value = Value> {
    let names = prop::collection::vec((text(), text()), 0..4).prop_map(|refs| {
        Value::Array(
            refs.into_iter()
                .map(|(name, key)| json!({"configMapKeyRef": {"name": name, "key": key}}))
                .collect(),
        )
    });
    let resources = (quantity(), quantity(), quantity())
        .prop_map(|(cpu, mem, req)| json!({"limits": {"cpu": cpu, "memory": mem}, "requests": {"cpu": req}}));
    let autoscaling = (i32s(), i32s(), prop::option::of(i32s())).prop_map(
        |(min, max, target)| json!({"minReplicas": min, "maxReplicas": max, "targetCpuUtilization": target}),
    );
    let service = (i32s(), text()).prop_map(|(port, type_)| json!({"port": port, "type": type_}));
    let server = (text(), text(), prop::option::of(text()), prop::option::of(u32s()))
        .prop_map(|(name, version, instructions, page)| json!({"name": name, "version": version, "instructions": instructions, "pageSize": page}));
    let first = (
        prop::option::of(field(i32s())),
        prop::option::of(field(text().prop_map(Value::from))),
        prop::option::of(field(text().prop_map(Value::from))),
        prop::option::weighted(0.2, field(server)),
        prop::option::of(field(tools())),
        prop::option::weighted(0.3, field(names)),
        prop::option::weighted(0.2, resources_and_prompts()),
    );
    let second = (
        prop::option::of(field(resources)),
        prop::option::of(field(pod_template())),
        prop::option::of(field(tuning())),
        prop::option::of(field(autoscaling)),
        prop::option::of(field(service)),
        prop::option::of(field(prop::collection::vec(text(), 0..3).prop_map(|v| json!(v)))),
        prop::option::of(field(any::<bool>().prop_map(|b| json!({"serviceMonitor": b})))),
        prop::option::weighted(0.3, field(upstreams())),
        prop::option::of(field(text().prop_map(Value::from))),
        prop::option::of(field(any::<i32>().prop_map(|t| json!({"timeoutSeconds": t})))),
    );
    (first, second).prop_map(|(a, b)| {
        let mut spec = Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                spec.insert(k.to_owned(), v);
            }
        };
        put("replicas", a.0);
        put("image", a.1);
        put("imagePullPolicy", a.2);
        put("server", a.3);
        put("tools", a.4);
        put("toolsFrom", a.5);
        if let Some((resources, prompts)) = a.6 {
            put("mcpResources", Some(resources));
            put("prompts", Some(prompts));
        }
        put("resources", b.0);
        put("podTemplate", b.1);
        put("tuning", b.2);
        put("autoscaling", b.3);
        put("service", b.4);
        put("allowedOrigins", b.5);
        put("monitoring", b.6);
        put("upstreams", b.7);
        put("logLevel", b.8);
        put("sessionAffinity", b.9);
        Value::Object(spec)
    })
}

/// Content of `toolsFrom` keys: ToolSet documents (JSON is YAML), junk, or missing.
fn fetched() -> impl Strategy<Value = Vec<Option<String>>> {
    let doc = prop_oneof![
        tools().prop_map(|t| json!({"tools": t}).to_string()),
        text(),
        Just(
            "tools: [{name: x, handler: {http: {url: 'http://h', timeout: 100000000000000000000000s}}}]"
                .to_owned()
        ),
    ];
    prop::collection::vec(prop::option::of(doc), 4)
}

fn round_trips<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(obj: &T) {
    let v = serde_json::to_value(obj).expect("a built object serializes");
    serde_json::to_string(&v).expect("and prints as JSON");
    let back: T = serde_json::from_value(v).expect("and reads back");
    assert_eq!(&back, obj, "reads back as the same object");
}

/// What one generated case exercised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reached {
    /// Not an McpServer (kube-rs would not deliver it).
    NotDeserialized,
    /// Render refused it (an invalid spec); build still ran.
    Invalid,
    /// Render accepted it and build ran.
    Rendered,
}

fn check(name: String, spec: Value, fetched: Vec<Option<String>>) -> Reached {
    let obj = json!({
        "apiVersion": "quiver.dev/v1alpha1", "kind": "McpServer",
        "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "generation": 1},
        "spec": spec,
    });
    let Ok(mcp) = serde_json::from_value::<McpServer>(obj) else {
        return Reached::NotDeserialized;
    };
    let fetched: Vec<Option<String>> = (0..mcp.spec.tools_from.len())
        .map(|i| fetched.get(i % fetched.len()).cloned().flatten())
        .collect();
    let defaults = Defaults {
        server_image: "quiver-server:t".into(),
        image_pull_policy: "IfNotPresent".into(),
        service_monitors: false,
        service_monitor_labels: Default::default(),
        catalog_prefix: "dev.quiver".into(),
    };
    // Build does not depend on the tools being valid: try it with whatever render gave.
    let (rendered, reached) = match render(&mcp, &fetched) {
        Ok(r) => (r, Reached::Rendered),
        Err(invalid) => {
            assert!(!invalid.problems.is_empty(), "an invalid spec names its problems");
            assert!(!invalid.message().is_empty());
            let r = Rendered {
                yaml: String::new(),
                hash: "0".into(),
                tool_count: 0,
                secrets: Default::default(),
                upstream_count: 0,
                pinned: false,
            };
            (r, Reached::Invalid)
        }
    };
    let c = build(
        &mcp,
        &rendered,
        &defaults,
        &quiver_operator::build::ApiServer::default(),
    )
    .expect("an McpServer with name and uid is buildable");
    round_trips(&c.config_map);
    round_trips(&c.service_account);
    // The pods' Role names what it grants: an empty resourceNames list would grant every
    // object of its kind in the namespace.
    for rule in c.role.rules.iter().flatten() {
        assert!(
            rule.resource_names.as_ref().is_some_and(|n| !n.is_empty()),
            "{rule:?}"
        );
    }
    round_trips(&c.role);
    round_trips(&c.role_binding);
    round_trips(&c.deployment);
    if reached == Reached::Rendered {
        assert_confined(&c.deployment);
    }
    round_trips(&c.service);
    if let Some(h) = &c.hpa {
        round_trips(h);
    }
    if let Some(p) = &c.pdb {
        round_trips(p);
    }
    if let Some(sm) = &c.service_monitor {
        serde_json::to_string(sm).expect("the ServiceMonitor serializes");
    }
    let name = mcp.metadata.name.as_deref().unwrap_or_default();
    let status = status_from(&mcp, &rendered, &c.deployment, "ns", name);
    serde_json::to_string(&status).expect("the status serializes");
    // The same object next to a Deployment status at the edges of its types.
    let mut d: Deployment = c.deployment.clone();
    d.status = serde_json::from_value(json!({"replicas": i32::MAX, "readyReplicas": -1, "updatedReplicas": i32::MIN, "observedGeneration": i64::MAX})).ok();
    assert!(d.status.is_some());
    serde_json::to_string(&status_from(&mcp, &rendered, &d, "ns", name)).expect("the status serializes");
    reached
}

#[test]
fn no_spec_panics_render_build_or_status() {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(512);
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        ..ProptestConfig::default()
    });
    let counts = std::cell::RefCell::new([0u32; 3]);
    runner
        .run(&(name(), spec(), fetched()), |(name, spec, fetched)| {
            let reached = check(name, spec, fetched);
            counts.borrow_mut()[reached as usize] += 1;
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // The generator must keep reaching render and build, or the test proves nothing.
    let [skipped, invalid, rendered] = counts.into_inner();
    println!("{cases} cases: {skipped} not McpServers, {invalid} invalid specs, {rendered} rendered");
    assert!(
        skipped * 2 < cases,
        "most cases must deserialize: {skipped}/{cases} did not"
    );
    assert!(
        rendered * 10 >= cases,
        "at least a tenth must render: {rendered}/{cases}"
    );
    assert!(
        invalid * 10 >= cases,
        "at least a tenth must be refused: {invalid}/{cases}"
    );
}
