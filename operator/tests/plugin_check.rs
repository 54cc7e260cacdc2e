//! `kubectl-quiver` as a user runs it, without a cluster: `check -f` on every sample and on
//! manifests with each class of problem (schema, CEL rule, ToolSet, toolsFrom document, log
//! level, YAML), and the exit codes of usage and Kubernetes errors.

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn plugin(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kubectl-quiver"))
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or_default().as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn check(manifest: &str) -> (i32, String) {
    let out = plugin(&["check", "-f", "-"], Some(manifest));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap(), text)
}

/// Every sample a user may copy checks valid with nothing left unchecked: no problem and no
/// note (a `toolsFrom` ConfigMap or a ServiceAccount the file lacks, sysctls outside the safe
/// set), one `valid` line per McpServer of the file.
#[test]
fn every_sample_checks_valid_without_findings() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/samples");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut servers = 0;
    for path in &files {
        let out = plugin(&["check", "-f", path.to_str().unwrap()], None);
        let text = String::from_utf8_lossy(&out.stdout);
        let shown = format!(
            "{}: {text}{}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{shown}");
        let yaml = std::fs::read_to_string(path).unwrap();
        let want = yaml.lines().filter(|l| *l == "kind: McpServer").count();
        let valid = text.lines().filter(|l| l.contains(": valid (")).count();
        assert!(
            want > 0 && valid == want,
            "{want} McpServer(s), {valid} valid: {shown}"
        );
        let findings: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains(": valid (") && !l.starts_with("(the API server's admission"))
            .collect();
        assert!(findings.is_empty(), "findings {findings:?} in {shown}");
        servers += valid;
    }
    assert!(
        files.len() >= 18 && servers >= 20,
        "{} samples, {servers} McpServers",
        files.len()
    );
}

const HEAD: &str = "apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: calc}\n";

#[test]
fn each_class_of_problem_names_its_field_and_exits_1() {
    for (spec, want) in [
        ("spec: {replicas: 5000}", "spec.replicas: must be at most 1000"),
        ("spec: {replica: 2}", "spec.replica: unknown field"),
        (
            "spec: {tuning: {profile: fastest}}",
            "spec.tuning.profile: must be one of",
        ),
        (
            "spec: {replicas: 2, autoscaling: {minReplicas: 1, maxReplicas: 3}}",
            "spec: set either replicas or autoscaling, not both",
        ),
        (
            "spec: {tools: [{name: greet, input: {name: string}, handler: {template: 'Hi {{nmae}}'}}]}",
            "spec.tools[0].handler.template",
        ),
        (
            "spec: {logLevel: 'debug,quiver=loud'}",
            "spec.logLevel: directive",
        ),
        ("spec: {logLevel: 'info;rm'}", "spec.logLevel: must match"),
        (
            "spec: {sessionAffinity: {timeoutSeconds: 0}}",
            "spec.sessionAffinity.timeoutSeconds: must be at least 1",
        ),
        (
            "spec: {tasks: {redis: {address: 'redis:6379', username: quiver}}}",
            "spec.tasks.redis.username: an ACL user needs its password",
        ),
        (
            "spec: {limitsRedis: {address: 'redis:6379', tls: {caSecret: a, caConfigMap: b}}}",
            "spec.limitsRedis.tls: caSecret and caConfigMap both name the CAs to trust",
        ),
        (
            "spec: {auth: {oidc: {issuer: 'https://idp.example', audience: q}, upstreamSignIn: {url: 'http://mcp.example.com', keysSecretRef: {name: k, key: ring}, browserClient: {clientId: q, clientSecretRef: {name: c, key: s}}}}}",
            "spec.auth.upstreamSignIn.url: `http://mcp.example.com` is http to a host that is not loopback",
        ),
        (
            "spec: {auth: {upstreamSignIn: {url: 'https://mcp.example.com', keysSecretRef: {name: k, key: ring}, browserClient: {clientId: q, clientSecretRef: {name: c, key: s}}}}}",
            "spec.auth.upstreamSignIn: needs spec.auth.oidc",
        ),
        (
            "spec: {auth: {oidc: {issuer: 'https://idp.example', audience: q}, upstreamSignIn: {url: 'https://mcp.example.com/team', keysSecretRef: {name: k, key: ring}, browserClient: {clientId: q, clientSecretRef: {name: c, key: s}}}}}",
            "spec.auth.upstreamSignIn.url: must match",
        ),
    ] {
        let (code, text) = check(&format!("{HEAD}{spec}\n"));
        assert_eq!(code, 1, "{spec}: {text}");
        assert!(text.contains("McpServer calc: "), "{text}");
        assert!(text.contains(want), "{spec}: want {want:?} in {text}");
    }
    let (code, text) =
        check("apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: Bad_Name}\nspec: {}\n");
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("(InvalidName)"), "{text}");
}

#[test]
fn tools_from_config_maps_in_the_file_are_checked_and_others_named() {
    let manifest = format!(
        "{HEAD}spec:\n  toolsFrom:\n    - configMapKeyRef: {{name: elsewhere, key: tools.yaml}}\n    - configMapKeyRef: {{name: shared, key: tools.yaml}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: shared}}\ndata:\n  tools.yaml: |\n    tools:\n      - {{name: up, handler: {{builtin: nope}}}}\n"
    );
    let (code, text) = check(&manifest);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("spec.toolsFrom[1] (ConfigMap shared, key tools.yaml) tools[0]"),
        "{text}"
    );
    let good = manifest.replace("builtin: nope", "builtin: upper");
    let (code, text) = check(&good);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("valid (1 tool(s)"), "{text}");
    assert!(
        text.contains("note: spec.toolsFrom[0]: ConfigMap elsewhere is not in the file"),
        "{text}"
    );
}

#[test]
fn usage_and_kubernetes_errors_have_their_own_exit_codes() {
    let (code, text) = check("{a: [1, 2\n");
    assert_eq!(code, 1, "unreadable YAML is a problem of the file: {text}");
    assert!(text.contains("not YAML"), "{text}");
    let (code, text) = check("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n");
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("no McpServer"), "{text}");
    let out = plugin(&["check", "-f", "/nonexistent/m.yaml"], None);
    assert_eq!(out.status.code(), Some(2));
    let out = plugin(&["call", "calc"], None);
    assert_eq!(out.status.code(), Some(2), "a tool is required");
    // A kubeconfig whose API server does not answer.
    let dir = std::env::temp_dir().join(format!("kq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u, namespace: team}}]\ncurrent-context: x\n",
    )
    .unwrap();
    for args in [
        vec!["status", "calc"],
        vec!["tools", "calc"],
        vec!["call", "calc", "add", "a=1", "--via", "port-forward"],
    ] {
        let mut all = vec!["--kubeconfig", kc.to_str().unwrap()];
        all.extend(args.iter().copied());
        let out = plugin(&all, None);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains("calc"), "names the object: {err}");
    }
    let out = plugin(
        &[
            "--kubeconfig",
            kc.to_str().unwrap(),
            "--context",
            "nope",
            "status",
            "calc",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubeconfig"));
    std::fs::remove_dir_all(&dir).unwrap();
}
