//! Serving options of the pods and the Service: the server's log filter (`spec.logLevel`),
//! client-IP session affinity (`spec.sessionAffinity`), the `requestState` key the replicas
//! share (a Secret per McpServer), and whether a ServiceMonitor is wanted.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ClientIPConfig, EnvVar, EnvVarSource, Secret, SecretKeySelector, ServiceSpec, SessionAffinityConfig,
};
use kube::Resource;

use super::{Defaults, Unowned, meta};
use crate::crd::McpServer;

/// The environment variable the server reads its `requestState` key from.
pub const STATE_KEY_ENV: &str = "QUIVER_STATE_KEY";
/// Key of the key in the state-key Secret.
pub const STATE_KEY_KEY: &str = "key";
/// Pod-template annotation holding the state-key Secret's uid: a new Secret (deleted, then
/// made again by the operator) changes it and so rolls the pods onto the new key.
pub const STATE_KEY_ANNOTATION: &str = "quiver.dev/state-key-uid";
/// Random bytes of a state key (written hex-encoded: the server reads it as text).
pub const STATE_KEY_BYTES: usize = 32;
/// Seconds a client stays on its pod with `sessionAffinity` and no `timeoutSeconds` (the
/// Service's own default).
pub const DEFAULT_AFFINITY_SECONDS: i32 = 10_800;
/// The longest `spec.logLevel`.
pub const MAX_LOG_LEVEL: usize = 256;
/// The server's log filter when neither `spec.logLevel` nor `podTemplate.env` sets one.
const DEFAULT_LOG_LEVEL: &str = "info";

/// Name of an McpServer's state-key Secret.
pub fn state_key_secret_name(server: &str) -> String {
    format!("{server}-state-key")
}

/// Most networks `spec.trustedProxies` may list (the server's bound).
pub const MAX_TRUSTED_PROXIES: usize = 64;

/// Problems of `spec.trustedProxies`: each must be an address or `ADDRESS/BITS` the server
/// reads (the schema's pattern lets through some it does not, e.g. `1.2.3/8` or `::/200`).
pub fn trusted_proxy_problems(mcp: &McpServer) -> Vec<String> {
    let nets = &mcp.spec.trusted_proxies;
    if nets.len() > MAX_TRUSTED_PROXIES {
        return vec![format!(
            "spec.trustedProxies: at most {MAX_TRUSTED_PROXIES} networks"
        )];
    }
    nets.iter()
        .enumerate()
        .filter(|(_, n)| n.parse::<quiver_flags::Cidr>().is_err())
        .map(|(i, n)| {
            let shown: String = n.chars().take(64).collect();
            format!("spec.trustedProxies[{i}]: `{shown}` is not an address or ADDRESS/BITS (e.g. 10.0.0.0/8, fd00::/8)")
        })
        .collect()
}

/// Problems of `spec.logLevel` (the schema bounds it too; objects stored before are checked here).
pub fn log_level_problems(mcp: &McpServer) -> Vec<String> {
    let Some(level) = mcp.spec.log_level.as_deref() else {
        return Vec::new();
    };
    let field = "spec.logLevel";
    if level.is_empty() || level.len() > MAX_LOG_LEVEL {
        return vec![format!("{field}: must be 1 to {MAX_LOG_LEVEL} characters")];
    }
    if let Some(c) = level
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '=' | ',' | '.' | '-')))
    {
        return vec![format!(
            "{field}: {c:?} is not allowed (letters, digits and _ : = , . - only: a level or target=level directives)"
        )];
    }
    level
        .split(',')
        .filter(|d| !d.is_empty())
        .filter_map(|d| {
            let lvl = d.rsplit_once('=').map_or(d, |(_, l)| l);
            let known = ["off", "error", "warn", "info", "debug", "trace"]
                .iter()
                .any(|k| k.eq_ignore_ascii_case(lvl));
            // A bare word that is not a level is a target (enables everything in it): allowed.
            (d.contains('=') && !known).then(|| {
                format!("{field}: directive {d:?} has no level (off, error, warn, info, debug or trace)")
            })
        })
        .collect()
}

/// `RUST_LOG` of the server container: `spec.logLevel`, else nothing when `podTemplate.env`
/// sets it (the user's stands), else `info`.
pub(super) fn rust_log(mcp: &McpServer) -> Option<EnvVar> {
    let value = match mcp.spec.log_level.as_deref() {
        Some(level) => level,
        None => {
            let user_sets = mcp
                .spec
                .pod_template
                .as_ref()
                .is_some_and(|o| o.env.iter().any(|e| e.name == "RUST_LOG"));
            if user_sets {
                return None;
            }
            DEFAULT_LOG_LEVEL
        }
    };
    Some(EnvVar {
        name: "RUST_LOG".to_owned(),
        value: Some(value.to_owned()),
        value_from: None,
    })
}

/// Client-IP affinity on the Service, when `spec.sessionAffinity` is set.
pub(super) fn affinity(mcp: &McpServer, spec: &mut ServiceSpec) {
    if let Some(a) = &mcp.spec.session_affinity {
        spec.session_affinity = Some("ClientIP".to_owned());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(a.timeout_seconds.unwrap_or(DEFAULT_AFFINITY_SECONDS)),
            }),
        });
    }
}

/// Whether the McpServer gets a ServiceMonitor: its own `monitoring.serviceMonitor`, else
/// the operator's default.
pub fn wants_service_monitor(mcp: &McpServer, defaults: &Defaults) -> bool {
    mcp.spec
        .monitoring
        .as_ref()
        .and_then(|m| m.service_monitor)
        .unwrap_or(defaults.service_monitors)
}

/// The state-key Secret to create for `mcp`, holding `random` hex-encoded. Created once and
/// never applied again: the operator does not keep the key, so it cannot rewrite it.
///
/// # Errors
/// [`Unowned`] when the McpServer has no name or uid.
pub fn state_key_secret(mcp: &McpServer, random: &[u8; STATE_KEY_BYTES]) -> Result<Secret, Unowned> {
    let owner = mcp.controller_owner_ref(&()).ok_or(Unowned)?;
    let name = mcp.metadata.name.as_deref().ok_or(Unowned)?;
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Secret {
        metadata: meta(mcp, state_key_secret_name(name), &owner),
        type_: Some("Opaque".to_owned()),
        data: Some(BTreeMap::from([(
            STATE_KEY_KEY.to_owned(),
            ByteString(hex.into_bytes()),
        )])),
        immutable: Some(true),
        ..Secret::default()
    })
}

/// Gives the server container `QUIVER_STATE_KEY` from the Secret `secret`, and the pod
/// template the Secret's uid (a new Secret rolls the pods).
pub fn with_state_key(deployment: &mut Deployment, secret: &str, uid: &str) {
    let Some(template) = deployment.spec.as_mut().map(|s| &mut s.template) else {
        return;
    };
    template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(STATE_KEY_ANNOTATION.to_owned(), uid.to_owned());
    let Some(server) = template
        .spec
        .as_mut()
        .and_then(|p| p.containers.iter_mut().find(|c| c.name == "server"))
    else {
        return;
    };
    let env = server.env.get_or_insert_with(Vec::new);
    env.retain(|e| e.name != STATE_KEY_ENV);
    env.push(EnvVar {
        name: STATE_KEY_ENV.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: STATE_KEY_KEY.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::mcp;
    use super::super::{ApiServer, Children, build};
    use super::*;
    use crate::render::render;

    fn defaults(service_monitors: bool) -> Defaults {
        Defaults {
            server_image: "quiver-server:test".into(),
            image_pull_policy: "IfNotPresent".into(),
            service_monitors,
            service_monitor_labels: Default::default(),
            catalog_prefix: "dev.quiver".into(),
        }
    }

    fn built(spec: &str, service_monitors: bool) -> Children {
        let m = mcp(&format!(
            "apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: calc}}\nspec:\n  tools: [{{name: add, handler: {{builtin: add}}}}]\n{spec}"
        ));
        let r = render(&m, &Vec::new()).unwrap_or_else(|e| panic!("{e:?}"));
        build(&m, &r, &defaults(service_monitors), &ApiServer::default()).unwrap()
    }

    fn rust_logs(c: &Children) -> Vec<String> {
        let d = serde_json::to_value(&c.deployment).unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "RUST_LOG")
            .map(|e| e["value"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_log_level_is_the_specs_else_the_users_env_else_info() {
        assert_eq!(rust_logs(&built("", false)), ["info"]);
        assert_eq!(
            rust_logs(&built("  logLevel: info,quiver_server::upstream=debug\n", false)),
            ["info,quiver_server::upstream=debug"]
        );
        // A RUST_LOG of the user's own is no longer overridden.
        let env = "  podTemplate: {env: [{name: RUST_LOG, value: debug}]}\n";
        assert_eq!(rust_logs(&built(env, false)), ["debug"]);
        // With both, logLevel is last, so it wins.
        let both = built(&format!("{env}  logLevel: warn\n"), false);
        assert_eq!(rust_logs(&both), ["debug", "warn"]);
    }

    fn args(c: &Children) -> Vec<String> {
        let d = serde_json::to_value(&c.deployment).unwrap();
        d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn trusted_proxies_reach_the_pod_and_bad_ones_are_refused_naming_the_field() {
        let c = built("  trustedProxies: [10.0.0.0/8, \"fd00::/8\", 192.0.2.7]\n", false);
        let a = args(&c);
        assert!(
            a.contains(&"--trusted-proxies=10.0.0.0/8,fd00::/8,192.0.2.7".to_owned()),
            "{a:?}"
        );
        assert!(
            !args(&built("", false))
                .iter()
                .any(|a| a.starts_with("--trusted-proxies"))
        );
        for (bad, at) in [
            ("10.0.0/8", 0),
            ("10.0.0.0/33", 0),
            ("::/129", 0),
            ("1.2.3.4,5.6.7.8", 0),
        ] {
            let mut m =
                mcp("apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: calc}\nspec: {}\n");
            m.spec.trusted_proxies = vec![bad.to_owned()];
            let invalid = render(&m, &Vec::new()).unwrap_err();
            assert_eq!(invalid.reason, "InvalidTrustedProxies", "{bad}");
            assert!(
                invalid.problems[0].starts_with(&format!("spec.trustedProxies[{at}]: ")),
                "{invalid:?}"
            );
        }
        let mut m =
            mcp("apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: calc}\nspec: {}\n");
        m.spec.trusted_proxies = vec!["10.0.0.0/8".to_owned(); MAX_TRUSTED_PROXIES + 1];
        assert_eq!(
            render(&m, &Vec::new()).unwrap_err().reason,
            "InvalidTrustedProxies"
        );
    }

    #[test]
    fn a_bad_log_level_is_refused_naming_the_field() {
        for (level, why) in [
            ("debug,quiver=loud", "has no level"),
            ("info,[span]=debug", "is not allowed"),
            ("info $(reboot)", "is not allowed"),
            ("info\ndebug", "is not allowed"),
        ] {
            let mut m =
                mcp("apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: calc}\nspec: {}\n");
            m.spec.log_level = Some(level.to_owned());
            let invalid = render(&m, &Vec::new()).unwrap_err();
            assert_eq!(invalid.reason, "InvalidLogLevel", "{level}");
            assert!(invalid.problems[0].starts_with("spec.logLevel: "), "{invalid:?}");
            assert!(invalid.problems[0].contains(why), "{invalid:?}");
        }
        let mut m =
            mcp("apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: calc}\nspec: {}\n");
        m.spec.log_level = Some("a".repeat(MAX_LOG_LEVEL + 1));
        assert!(log_level_problems(&m)[0].contains("1 to 256 characters"));
        for ok in [
            "debug",
            "TRACE",
            "quiver_server",
            "warn,quiver_server::transport=trace,hyper=off",
        ] {
            m.spec.log_level = Some(ok.to_owned());
            assert!(log_level_problems(&m).is_empty(), "{ok}");
        }
    }

    #[test]
    fn session_affinity_is_client_ip_with_a_timeout() {
        let s = built("", false).service.spec.unwrap();
        assert_eq!((s.session_affinity, s.session_affinity_config), (None, None));
        let s = built("  sessionAffinity: {}\n", false).service.spec.unwrap();
        assert_eq!(s.session_affinity.as_deref(), Some("ClientIP"));
        let timeout = |s: &ServiceSpec| {
            s.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
        };
        assert_eq!(timeout(&s), Some(DEFAULT_AFFINITY_SECONDS));
        let s = built("  sessionAffinity: {timeoutSeconds: 600}\n", false)
            .service
            .spec
            .unwrap();
        assert_eq!(timeout(&s), Some(600));
    }

    #[test]
    fn the_operators_service_monitor_default_applies_when_the_spec_says_nothing() {
        assert!(built("", false).service_monitor.is_none());
        let on = built("", true);
        assert!(on.service_monitor.is_some(), "the chart-wide default");
        let ports = on.service.spec.unwrap().ports.unwrap();
        assert!(
            ports.iter().any(|p| p.name.as_deref() == Some("admin")),
            "scraped through the Service"
        );
        assert!(
            built("  monitoring: {serviceMonitor: false}\n", true)
                .service_monitor
                .is_none(),
            "an McpServer's own choice wins"
        );
        assert!(
            built("  monitoring: {serviceMonitor: true}\n", false)
                .service_monitor
                .is_some()
        );
        assert!(built("  monitoring: {}\n", true).service_monitor.is_some());
    }

    #[test]
    fn the_state_key_is_a_secret_reference_never_a_value() {
        let m = mcp("apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: calc}\nspec: {}\n");
        let s = state_key_secret(&m, &[0xab; STATE_KEY_BYTES]).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("calc-state-key"));
        assert_eq!(s.data.unwrap()["key"].0, "ab".repeat(32).into_bytes());
        let mut d = built("", false).deployment;
        with_state_key(&mut d, "calc-state-key", "uid-9");
        with_state_key(&mut d, "calc-state-key", "uid-9");
        let v = serde_json::to_value(&d).unwrap();
        let env: Vec<_> = v["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == STATE_KEY_ENV)
            .collect();
        assert_eq!(env.len(), 1, "once, even applied twice");
        assert_eq!(env[0]["valueFrom"]["secretKeyRef"]["name"], "calc-state-key");
        assert_eq!(
            v["spec"]["template"]["metadata"]["annotations"][STATE_KEY_ANNOTATION],
            "uid-9"
        );
    }
}
