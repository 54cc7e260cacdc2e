//! The server flags and environment of `limitsRedis`, `tasks` and `audit`.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

use crate::crd::{AuditOnFull, FailMode, McpServer, SecretKey, TasksSpec};

/// `--limits-redis*` and `--audit*` for the spec.
pub(super) fn args(mcp: &McpServer) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(r) = &mcp.spec.limits_redis {
        args.push(format!("--limits-redis={}", r.address));
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

/// `--tasks-*` for `tasks`.
fn task_args(mcp: &McpServer, t: &TasksSpec) -> Vec<String> {
    let mut args = Vec::new();
    args.extend(t.ttl.as_ref().map(|v| format!("--tasks-ttl={v}")));
    args.extend(t.per_caller.map(|v| format!("--tasks-per-caller={v}")));
    args.extend(t.anonymous_max.map(|v| format!("--tasks-anonymous-max={v}")));
    if let Some(r) = &t.redis {
        args.push(format!("--tasks-redis={}", r.address));
        // The tasks of this McpServer only, in a Redis other McpServers may share.
        args.push(format!(
            "--tasks-redis-prefix={}/{}/",
            mcp.metadata.namespace.as_deref().unwrap_or_default(),
            mcp.metadata.name.as_deref().unwrap_or_default()
        ));
        args.extend(r.timeout.as_ref().map(|v| format!("--tasks-redis-timeout={v}")));
        args.extend(t.drain.as_ref().map(|v| format!("--tasks-drain={v}")));
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
    let limits = mcp
        .spec
        .limits_redis
        .as_ref()
        .and_then(|r| r.password_secret_ref.as_ref());
    let tasks = mcp
        .spec
        .tasks
        .as_ref()
        .and_then(|t| t.redis.as_ref()?.password_secret_ref.as_ref());
    [
        limits.map(|r| secret_env("QUIVER_LIMITS_REDIS_PASSWORD", r)),
        tasks.map(|r| secret_env("QUIVER_TASKS_REDIS_PASSWORD", r)),
    ]
    .into_iter()
    .flatten()
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

    #[test]
    fn an_invalid_limit_is_a_config_problem_naming_its_field() {
        let m = mcp(&GOVERNED.replace("rate: 5/s", "rate: 5/week"));
        let e = render(&m, &Vec::new()).unwrap_err();
        assert!(format!("{e:?}").contains("tools[0].limits[0].rate"), "{e:?}");
    }
}
