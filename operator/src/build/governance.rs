//! The server flags, environment and mounts of `limitsRedis`, `tasks` and `audit`, and the
//! checks of their Redis connections (and of `auth.upstreamSignIn.redis`, whose other flags
//! `sign_in.rs` renders).

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, EnvVar, EnvVarSource, KeyToPath, ProjectedVolumeSource, SecretKeySelector,
    SecretProjection, Volume, VolumeMount, VolumeProjection,
};

use crate::crd::{
    AuditOnFull, FailMode, McpServer, RedisConnection, RedisTls, SecretKey, SignInRedis, TasksSpec,
};

/// One of the pod's Redis connections: its flags, password variable and TLS mount.
struct Redis {
    /// Where it is in the spec (for problems).
    at: &'static str,
    /// What its flags start with.
    flag: &'static str,
    /// The variable holding its password.
    password_env: &'static str,
    /// The projected volume of its TLS files, and where the server container mounts it.
    volume: &'static str,
    dir: &'static str,
}

const LIMITS: Redis = Redis {
    at: "spec.limitsRedis",
    flag: "--limits-redis",
    password_env: "QUIVER_LIMITS_REDIS_PASSWORD",
    volume: "quiver-limits-redis-tls",
    dir: "/quiver/redis/limits",
};

const TASKS: Redis = Redis {
    at: "spec.tasks.redis",
    flag: "--tasks-redis",
    password_env: "QUIVER_TASKS_REDIS_PASSWORD",
    volume: "quiver-tasks-redis-tls",
    dir: "/quiver/redis/tasks",
};

const SIGN_IN: Redis = Redis {
    at: "spec.auth.upstreamSignIn.redis",
    flag: "--upstream-sign-in-redis",
    password_env: "QUIVER_UPSTREAM_SIGN_IN_REDIS_PASSWORD",
    volume: "quiver-sign-in-redis-tls",
    dir: "/quiver/redis/sign-in",
};

/// The Redis of `auth.upstreamSignIn`, when set.
fn sign_in_redis(mcp: &McpServer) -> Option<&SignInRedis> {
    mcp.spec.auth.as_ref()?.upstream_sign_in.as_ref()?.redis.as_ref()
}

/// The spec's Redis connections.
fn connections(mcp: &McpServer) -> impl Iterator<Item = (&'static Redis, &RedisConnection)> {
    let limits = mcp.spec.limits_redis.as_ref().map(|r| (&LIMITS, &r.connection));
    let tasks = mcp
        .spec
        .tasks
        .as_ref()
        .and_then(|t| t.redis.as_ref())
        .map(|r| (&TASKS, &r.connection));
    let sign_in = sign_in_redis(mcp).map(|r| (&SIGN_IN, &r.connection));
    limits.into_iter().chain(tasks).chain(sign_in)
}

/// The flags of connection `c` beyond its address: the ACL user and TLS, with the files
/// where [`volumes`] mounts them.
fn connection_args(r: &Redis, c: &RedisConnection) -> Vec<String> {
    let flag = r.flag;
    let mut args = Vec::new();
    args.extend(c.username.as_ref().map(|u| format!("{flag}-username={u}")));
    if let Some(t) = &c.tls {
        args.push(format!("{flag}-tls"));
        args.extend(t.server_name.as_ref().map(|n| format!("{flag}-server-name={n}")));
        if t.ca_secret.is_some() || t.ca_config_map.is_some() {
            args.push(format!("{flag}-ca={}/ca.crt", r.dir));
        }
        if t.client_cert_secret.is_some() {
            args.push(format!("{flag}-client-cert={}/tls.crt", r.dir));
            args.push(format!("{flag}-client-key={}/tls.key", r.dir));
        }
    }
    args
}

/// The projected volume of `t`'s files (the CA bundle, the client certificate and key), if
/// it names any.
fn tls_volume(r: &Redis, t: &RedisTls) -> Option<Volume> {
    let items = |pairs: &[&str]| {
        Some(
            pairs
                .iter()
                .map(|k| KeyToPath {
                    key: (*k).to_owned(),
                    path: (*k).to_owned(),
                    mode: None,
                })
                .collect(),
        )
    };
    let secret = |name: &String, keys: &[&str]| VolumeProjection {
        secret: Some(SecretProjection {
            name: name.clone(),
            items: items(keys),
            optional: None,
        }),
        ..VolumeProjection::default()
    };
    let mut sources: Vec<VolumeProjection> = Vec::new();
    sources.extend(t.ca_secret.as_ref().map(|n| secret(n, &["ca.crt"])));
    sources.extend(t.ca_config_map.as_ref().map(|n| VolumeProjection {
        config_map: Some(ConfigMapProjection {
            name: n.clone(),
            items: items(&["ca.crt"]),
            optional: None,
        }),
        ..VolumeProjection::default()
    }));
    sources.extend(
        t.client_cert_secret
            .as_ref()
            .map(|n| secret(n, &["tls.crt", "tls.key"])),
    );
    (!sources.is_empty()).then(|| Volume {
        name: r.volume.to_owned(),
        projected: Some(ProjectedVolumeSource {
            // Read by the server through the pod's fsGroup; no one else.
            default_mode: Some(0o440),
            sources: Some(sources),
        }),
        ..Volume::default()
    })
}

/// The volumes of the Redis connections' TLS files, with their mounts in the server
/// container (the server hides the client keys from the programs it starts).
pub(super) fn volumes(mcp: &McpServer) -> Vec<(Volume, VolumeMount)> {
    connections(mcp)
        .filter_map(|(r, c)| {
            let v = tls_volume(r, c.tls.as_ref()?)?;
            let m = VolumeMount {
                name: r.volume.to_owned(),
                mount_path: r.dir.to_owned(),
                read_only: Some(true),
                ..VolumeMount::default()
            };
            Some((v, m))
        })
        .collect()
}

/// A name the server can check a certificate against: an IP address, or DNS labels.
pub(super) fn certificate_name(n: &str) -> bool {
    n.parse::<std::net::IpAddr>().is_ok()
        || ((1..=253).contains(&n.len())
            && n.trim_end_matches('.').split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            }))
}

/// What keeps the spec's Redis connections from working, each naming its field (the
/// server would refuse to start with them).
pub fn problems(mcp: &McpServer) -> Vec<String> {
    let mut out = Vec::new();
    for (r, c) in connections(mcp) {
        let at = r.at;
        if c.username.is_some() && c.password_secret_ref.is_none() {
            out.push(format!(
                "{at}.username: an ACL user needs its password: set passwordSecretRef"
            ));
        }
        let Some(t) = &c.tls else { continue };
        if t.ca_secret.is_some() && t.ca_config_map.is_some() {
            out.push(format!(
                "{at}.tls: caSecret and caConfigMap both name the CAs to trust: set one"
            ));
        }
        let (field, name) = match &t.server_name {
            Some(n) => ("tls.serverName", n.as_str()),
            None => ("address", c.address.rsplit_once(':').map_or("", |(h, _)| h)),
        };
        if !certificate_name(name) {
            out.push(format!(
                "{at}.{field}: `{name}` is not a DNS name or an IP address to check Redis's certificate against"
            ));
        }
    }
    out
}

/// `--limits-redis*` and `--audit*` for the spec.
pub(super) fn args(mcp: &McpServer) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(r) = &mcp.spec.limits_redis {
        args.push(format!("--limits-redis={}", r.connection.address));
        // Budgets of this McpServer only, in a Redis other McpServers may share.
        args.push(format!(
            "--limits-redis-prefix={}/{}",
            mcp.metadata.namespace.as_deref().unwrap_or_default(),
            mcp.metadata.name.as_deref().unwrap_or_default()
        ));
        args.extend(r.timeout.as_ref().map(|t| format!("--limits-redis-timeout={t}")));
        if r.fail_mode == Some(FailMode::Closed) {
            args.push("--limits-redis-fail=closed".to_owned());
        }
        args.extend(connection_args(&LIMITS, &r.connection));
    }
    if let Some(t) = &mcp.spec.tasks {
        args.extend(task_args(mcp, t));
    }
    if let Some(a) = &mcp.spec.audit {
        // stdout: the container's logs are on stderr, so the runtime keeps the two apart
        // (each line of the container log names its stream).
        args.push("--audit=stdout".to_owned());
        args.extend(a.queue.map(|q| format!("--audit-queue={q}")));
        args.extend(a.on_full.map(|o| {
            let mode = match o {
                AuditOnFull::Drop => "drop",
                AuditOnFull::Refuse => "refuse",
            };
            format!("--audit-on-full={mode}")
        }));
    }
    args
}

/// `--upstream-sign-in-redis*` for `auth.upstreamSignIn.redis`, when set.
pub(super) fn sign_in_redis_args(mcp: &McpServer) -> Vec<String> {
    let Some(r) = sign_in_redis(mcp) else {
        return Vec::new();
    };
    let mut args = vec![
        format!("--upstream-sign-in-redis={}", r.connection.address),
        // This McpServer's users' tokens only, in a Redis other McpServers may share.
        format!(
            "--upstream-sign-in-redis-prefix={}/{}/",
            mcp.metadata.namespace.as_deref().unwrap_or_default(),
            mcp.metadata.name.as_deref().unwrap_or_default()
        ),
    ];
    args.extend(
        r.timeout
            .as_ref()
            .map(|v| format!("--upstream-sign-in-redis-timeout={v}")),
    );
    args.extend(connection_args(&SIGN_IN, &r.connection));
    args
}

/// `--tasks-*` for `tasks`.
fn task_args(mcp: &McpServer, t: &TasksSpec) -> Vec<String> {
    let mut args = Vec::new();
    args.extend(t.ttl.as_ref().map(|v| format!("--tasks-ttl={v}")));
    args.extend(t.per_caller.map(|v| format!("--tasks-per-caller={v}")));
    args.extend(t.anonymous_max.map(|v| format!("--tasks-anonymous-max={v}")));
    if let Some(r) = &t.redis {
        args.push(format!("--tasks-redis={}", r.connection.address));
        // The tasks of this McpServer only, in a Redis other McpServers may share.
        args.push(format!(
            "--tasks-redis-prefix={}/{}/",
            mcp.metadata.namespace.as_deref().unwrap_or_default(),
            mcp.metadata.name.as_deref().unwrap_or_default()
        ));
        args.extend(r.timeout.as_ref().map(|v| format!("--tasks-redis-timeout={v}")));
        args.extend(t.drain.as_ref().map(|v| format!("--tasks-drain={v}")));
        args.extend(connection_args(&TASKS, &r.connection));
    }
    args
}

/// The pod's `terminationGracePeriodSeconds`: `base`, or the tasks' drain and room to
/// record the end of those still running.
pub(super) fn termination_grace(mcp: &McpServer, base: i64) -> i64 {
    let t = mcp.spec.tasks.as_ref().filter(|t| t.redis.is_some());
    t.and_then(TasksSpec::drain_seconds)
        .map_or(base, |d| base.max(d + 10))
}

/// The Redis passwords, from their Secret keys, when they are named.
pub(super) fn env(mcp: &McpServer) -> impl Iterator<Item = EnvVar> {
    connections(mcp).filter_map(|(r, c)| {
        c.password_secret_ref
            .as_ref()
            .map(|s| secret_env(r.password_env, s))
    })
}

fn secret_env(name: &str, r: &SecretKey) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: r.name.clone(),
                key: r.key.clone(),
                optional: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::build::tests::{children_of, mcp};
    use crate::render::render;

    const GOVERNED: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  limits: [{rate: 100/s, per: all}]
  limitsRedis: {address: "redis.infra.svc:6379", passwordSecretRef: {name: redis, key: password}, timeout: 80ms, failMode: Closed}
  audit: {queue: 1024, onFull: refuse}
  tools:
    - {name: add, limits: [{rate: 5/s, shared: true}], audit: {arguments: true}, handler: {builtin: add}}
"#;

    #[test]
    fn limits_reach_the_toolset_and_redis_and_audit_reach_the_pod() {
        let m = mcp(GOVERNED);
        let r = render(&m, &Vec::new()).unwrap();
        let ts: quiver_model::config::ToolSet = serde_saphyr::from_str(&r.yaml).unwrap();
        assert_eq!(ts.limits[0].rate.as_deref(), Some("100/s"));
        assert!(ts.tools[0].limits[0].shared && ts.tools[0].audit.as_ref().unwrap().arguments);
        let c = children_of(&m, &r);
        let d = serde_json::to_value(&c.deployment).unwrap();
        let ctr = &d["spec"]["template"]["spec"]["containers"][0];
        let args: Vec<&str> = ctr["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for a in [
            "--limits-redis=redis.infra.svc:6379",
            "--limits-redis-prefix=ns/calc",
            "--limits-redis-timeout=80ms",
            "--limits-redis-fail=closed",
            "--audit=stdout",
            "--audit-queue=1024",
            "--audit-on-full=refuse",
        ] {
            assert!(args.contains(&a), "{a} in {args:?}");
        }
        let env = ctr["env"].as_array().unwrap();
        let pw = env
            .iter()
            .find(|e| e["name"] == "QUIVER_LIMITS_REDIS_PASSWORD")
            .unwrap();
        assert_eq!(
            pw["valueFrom"]["secretKeyRef"],
            json!({"name": "redis", "key": "password"})
        );
        assert!(pw.get("value").is_none());
    }

    #[test]
    fn without_them_the_pod_has_no_governance_flags() {
        let mut m = mcp(GOVERNED);
        m.spec.limits_redis = None;
        m.spec.audit = None;
        let r = render(&m, &Vec::new()).unwrap();
        let d = serde_json::to_value(&children_of(&m, &r).deployment).unwrap();
        let args = d["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(
            !args.contains("--limits-redis") && !args.contains("--audit"),
            "{args}"
        );
    }

    #[test]
    fn shared_tasks_reach_the_pod_and_their_drain_fits_in_its_grace_period() {
        let with = |tasks: &str| {
            let m = mcp(&GOVERNED.replace(
                "  audit: {queue: 1024, onFull: refuse}\n",
                &format!("  tasks: {tasks}\n"),
            ));
            let r = render(&m, &Vec::new()).unwrap();
            serde_json::to_value(&children_of(&m, &r).deployment).unwrap()["spec"]["template"]["spec"].clone()
        };
        let pod = with(
            "{redis: {address: \"redis.infra.svc:6379\", passwordSecretRef: {name: tr, key: pw}, timeout: 2s}, drain: 3m, ttl: 30m, perCaller: 8, anonymousMax: 100}",
        );
        let ctr = &pod["containers"][0];
        let args: Vec<&str> = ctr["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for a in [
            "--tasks-redis=redis.infra.svc:6379",
            "--tasks-redis-prefix=ns/calc/",
            "--tasks-redis-timeout=2s",
            "--tasks-drain=3m",
            "--tasks-ttl=30m",
            "--tasks-per-caller=8",
            "--tasks-anonymous-max=100",
        ] {
            assert!(args.contains(&a), "{a} in {args:?}");
        }
        let env = ctr["env"].as_array().unwrap();
        let pw = env
            .iter()
            .find(|e| e["name"] == "QUIVER_TASKS_REDIS_PASSWORD")
            .unwrap();
        assert_eq!(
            pw["valueFrom"]["secretKeyRef"],
            json!({"name": "tr", "key": "pw"})
        );
        assert!(env.iter().any(|e| e["name"] == "QUIVER_LIMITS_REDIS_PASSWORD"));
        assert_eq!(pod["terminationGracePeriodSeconds"], 190);
        // A short drain keeps the default grace period; without Redis there is no drain.
        assert_eq!(
            with("{redis: {address: \"r:6379\"}, drain: 5s}")["terminationGracePeriodSeconds"],
            30
        );
        let local = with("{drain: 10m, ttl: 1h}");
        assert_eq!(local["terminationGracePeriodSeconds"], 30);
        let args = local["containers"][0]["args"].to_string();
        assert!(
            args.contains("--tasks-ttl=1h")
                && !args.contains("--tasks-drain")
                && !args.contains("--tasks-redis"),
            "{args}"
        );
    }

    #[test]
    fn the_audit_full_queue_mode_reaches_the_pod_only_when_set() {
        let args_of = |audit: &str| {
            let m = mcp(&GOVERNED.replace(
                "  audit: {queue: 1024, onFull: refuse}\n",
                &format!("  audit: {audit}\n"),
            ));
            let r = render(&m, &Vec::new()).unwrap();
            let d = serde_json::to_value(&children_of(&m, &r).deployment).unwrap();
            d["spec"]["template"]["spec"]["containers"][0]["args"].to_string()
        };
        assert!(args_of("{onFull: refuse}").contains("\"--audit-on-full=refuse\""));
        assert!(args_of("{onFull: drop}").contains("\"--audit-on-full=drop\""));
        let default = args_of("{}");
        assert!(
            default.contains("--audit=stdout") && !default.contains("--audit-on-full"),
            "{default}"
        );
        // Anything else is refused by the schema's enum: the type has no other value.
        assert!(serde_json::from_value::<crate::crd::AuditOnFull>(json!("block")).is_err());
        assert!(serde_json::from_value::<crate::crd::AuditOnFull>(json!("Refuse")).is_err());
    }

    const REDIS_TLS: &str = r#"
apiVersion: quiver.dev/v1alpha1
kind: McpServer
metadata: {name: calc}
spec:
  limitsRedis:
    address: "cache.example.com:6380"
    username: quiver-limits
    passwordSecretRef: {name: redis, key: password}
    tls: {caConfigMap: redis-ca, clientCertSecret: redis-client}
  tasks:
    redis:
      address: "10.0.0.7:6380"
      username: quiver-tasks
      passwordSecretRef: {name: tr, key: pw}
      tls: {caSecret: redis-tls, serverName: redis.infra.svc}
  tools:
    - {name: add, limits: [{rate: 5/s, shared: true}], handler: {builtin: add}}
"#;

    fn pod_of(yaml: &str) -> Value {
        let m = mcp(yaml);
        let r = render(&m, &Vec::new()).unwrap_or_else(|e| panic!("{e:?}"));
        serde_json::to_value(&children_of(&m, &r).deployment).unwrap()["spec"]["template"]["spec"].clone()
    }

    #[test]
    fn redis_acl_users_and_tls_reach_the_pod_with_their_files_mounted_in_the_server_only() {
        let pod = pod_of(REDIS_TLS);
        let ctr = &pod["containers"][0];
        let args: Vec<&str> = ctr["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for a in [
            "--limits-redis=cache.example.com:6380",
            "--limits-redis-username=quiver-limits",
            "--limits-redis-tls",
            "--limits-redis-ca=/quiver/redis/limits/ca.crt",
            "--limits-redis-client-cert=/quiver/redis/limits/tls.crt",
            "--limits-redis-client-key=/quiver/redis/limits/tls.key",
            "--tasks-redis=10.0.0.7:6380",
            "--tasks-redis-username=quiver-tasks",
            "--tasks-redis-tls",
            "--tasks-redis-server-name=redis.infra.svc",
            "--tasks-redis-ca=/quiver/redis/tasks/ca.crt",
        ] {
            assert!(args.contains(&a), "{a} in {args:?}");
        }
        let joined = args.join(" ");
        assert!(
            !joined.contains("--limits-redis-server-name") && !joined.contains("--tasks-redis-client-"),
            "{joined}"
        );
        // The passwords stay in their Secrets.
        let env = ctr["env"].as_array().unwrap();
        for (name, secret) in [
            (
                "QUIVER_LIMITS_REDIS_PASSWORD",
                json!({"name": "redis", "key": "password"}),
            ),
            ("QUIVER_TASKS_REDIS_PASSWORD", json!({"name": "tr", "key": "pw"})),
        ] {
            let e = env.iter().find(|e| e["name"] == name).unwrap();
            assert_eq!(e["valueFrom"]["secretKeyRef"], secret);
        }
        // One projected volume per Redis: its CA bundle and client certificate, readable by
        // the pod's group alone.
        let volume = |name: &str| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("volume {name}"))["projected"]
                .clone()
        };
        let limits = volume("quiver-limits-redis-tls");
        assert_eq!(limits["defaultMode"], 0o440);
        assert_eq!(
            limits["sources"],
            json!([
                {"configMap": {"name": "redis-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"secret": {"name": "redis-client", "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}},
            ])
        );
        assert_eq!(
            volume("quiver-tasks-redis-tls")["sources"],
            json!([{"secret": {"name": "redis-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}])
        );
        let mounts = ctr["volumeMounts"].as_array().unwrap();
        for (name, dir) in [
            ("quiver-limits-redis-tls", "/quiver/redis/limits"),
            ("quiver-tasks-redis-tls", "/quiver/redis/tasks"),
        ] {
            let m = mounts.iter().find(|m| m["name"] == name).unwrap();
            assert_eq!((&m["mountPath"], &m["readOnly"]), (&json!(dir), &json!(true)));
        }

        // `tls: {}`: TLS with the public roots, nothing to mount; no user, no username flag.
        let public = pod_of(
            &REDIS_TLS
                .replace(
                    "tls: {caSecret: redis-tls, serverName: redis.infra.svc}",
                    "tls: {}",
                )
                .replace("      username: quiver-tasks\n", ""),
        );
        let args = public["containers"][0]["args"].to_string();
        assert!(
            args.contains("\"--tasks-redis-tls\"")
                && !args.contains("--tasks-redis-ca")
                && !args.contains("--tasks-redis-username"),
            "{args}"
        );
        assert!(!public["volumes"].to_string().contains("quiver-tasks-redis-tls"));
        // Without tls: plain TCP, as before.
        let plain = pod_of(GOVERNED);
        let args = plain["containers"][0]["args"].to_string();
        assert!(!args.contains("-tls") && !args.contains("-username"), "{args}");
        assert!(!plain["volumes"].to_string().contains("redis"));
    }

    #[test]
    fn redis_connections_the_server_would_refuse_are_invalid_specs_naming_their_field() {
        let invalid = |from: &str, to: &str| {
            let m = mcp(&REDIS_TLS.replace(from, to));
            let e = render(&m, &Vec::new()).unwrap_err();
            assert_eq!(e.reason, "InvalidRedis", "{e:?}");
            e.message()
        };
        let e = invalid("      passwordSecretRef: {name: tr, key: pw}\n", "");
        assert_eq!(
            e,
            "spec.tasks.redis.username: an ACL user needs its password: set passwordSecretRef"
        );
        let e = invalid(
            "tls: {caConfigMap: redis-ca,",
            "tls: {caSecret: s, caConfigMap: redis-ca,",
        );
        assert!(
            e.starts_with("spec.limitsRedis.tls: caSecret and caConfigMap both name"),
            "{e}"
        );
        let e = invalid("cache.example.com:6380", "-cache.example:6380");
        assert!(
            e.starts_with("spec.limitsRedis.address: `-cache.example` is not a DNS name"),
            "{e}"
        );
        let e = invalid("serverName: redis.infra.svc", "serverName: redis..svc");
        assert!(
            e.starts_with("spec.tasks.redis.tls.serverName: `redis..svc`"),
            "{e}"
        );
        // Without TLS there is no certificate: the address's host is not checked.
        let m = mcp(&REDIS_TLS
            .replace(
                "cache.example.com:6380\"\n    username: quiver-limits",
                "-plain:6379\"",
            )
            .replace(
                "    tls: {caConfigMap: redis-ca, clientCertSecret: redis-client}\n",
                "",
            ));
        render(&m, &Vec::new()).unwrap_or_else(|e| panic!("{e:?}"));
    }

    #[test]
    fn an_invalid_limit_is_a_config_problem_naming_its_field() {
        let m = mcp(&GOVERNED.replace("rate: 5/s", "rate: 5/week"));
        let e = render(&m, &Vec::new()).unwrap_err();
        assert!(format!("{e:?}").contains("tools[0].limits[0].rate"), "{e:?}");
    }
}
