//! Against a real control plane (scripts/operator-it.sh runs these with `--ignored`, the
//! operator running): `kubectl-quiver` through the real API server's service proxy to a
//! real quiver-server (a Service without selector whose Endpoints name this machine's
//! address), `status` of a real McpServer, a token never sent to a pod that only wears an
//! McpServer's labels, and the operator's state-key Secret: created once, owned, mounted by
//! reference, made again when deleted.

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Endpoints, Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod common;

use common::*;

/// An IPv4 address of this machine that is not loopback (the API server refuses loopback
/// endpoints); found without sending anything.
fn routable_ip() -> String {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.connect("10.255.255.255:9").unwrap();
    let ip = s.local_addr().unwrap().ip();
    assert!(!ip.is_loopback(), "{ip}");
    ip.to_string()
}

/// Runs the plugin; its exit code, stdout and stderr.
fn plugin(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-quiver"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const TOOLS: &str = r#"
tools:
  - {name: add, description: Add two numbers, handler: {builtin: add}}
  - name: tag
    inputSchema:
      type: object
      properties: {n: {type: integer}, on: {type: boolean}, labels: {type: object}, word: {type: string}}
      required: [n, on, labels, word]
      additionalProperties: false
    handler: {template: "{{n}}|{{on}}|{{labels.env}}|{{word}}"}
  - {name: down, handler: {http: {url: "http://127.0.0.1:9/", timeout: 1s}}}
"#;

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_plugin_lists_and_calls_tools_through_the_api_servers_service_proxy() {
    let bin = std::env::var("QUIVER_SERVER_BIN")
        .unwrap_or_else(|_| format!("{}/../target/debug/quiver-server", env!("CARGO_MANIFEST_DIR")));
    with_ns("q-plugin", |ns| async move {
        let dir = std::env::temp_dir().join(format!("kq-it-{}", ns.name));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tools.yaml"), TOOLS).unwrap();
        let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
        let mut server = tokio::process::Command::new(&bin)
            .args([
                "--config",
                &format!("file:{}", dir.join("tools.yaml").display()),
                "--listen",
                &format!("0.0.0.0:{port}"),
                "--admin-listen",
                "off",
            ])
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "local"},
            "spec": {"ports": [{"name": "mcp", "port": 8080, "targetPort": port}]}
        }))
        .unwrap();
        ns.api::<Service>().create(&PostParams::default(), &svc).await.unwrap();
        // The service proxy only dials addresses of Pods: a Pod whose status (left alone by
        // kwok, by its annotation) names this machine's address stands for the server.
        let ip = routable_ip();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "local-0", "annotations": {"kwok.x-k8s.io/status": "custom"}},
            "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "server", "image": "quiver-server"}]}
        }))
        .unwrap();
        ns.api::<Pod>().create(&PostParams::default(), &pod).await.unwrap();
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}]}});
        ns.api::<Pod>()
            .patch_status("local-0", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let ep: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": "local"},
            "subsets": [{
                "addresses": [{"ip": ip, "targetRef": {"kind": "Pod", "name": "local-0", "namespace": ns.name}}],
                "ports": [{"name": "mcp", "port": port}]
            }]
        }))
        .unwrap();
        ns.api::<Endpoints>().create(&PostParams::default(), &ep).await.unwrap();
        let n = ns.name.clone();
        let (code, out, err) = eventually(30, "tools through the service proxy", || {
            let n = n.clone();
            async move { Some(plugin(&["-n", &n, "tools", "local"])).filter(|r| r.0 == 0) }
        })
        .await;
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("add   Add two numbers"), "{out}");
        let call = |args: &[&str]| {
            let mut all = vec!["-n", n.as_str(), "call", "local"];
            all.extend_from_slice(args);
            plugin(&all)
        };
        assert_eq!(call(&["add", "a=40", "b=2"]).1.trim(), "42");
        let (code, out, err) = call(&["tag", "n=7", "on=true", r#"labels={"env":"prod"}"#, "word=007"]);
        assert_eq!((code, out.trim()), (0, "7|true|prod|007"), "{err}");
        let (code, out, _) = call(&["add", "b=2", "--json", r#"{"a": 1}"#, "-o", "json"]);
        assert_eq!(code, 0);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["content"][0]["text"], "3");
        // A tool error: exit 1, its text on stderr.
        let (code, out, err) = call(&["down"]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(!err.is_empty() && out.is_empty(), "{err}");
        // Usage: a value that is not of the property's type, an unknown argument or tool.
        let (code, _, err) = call(&["tag", "n=seven"]);
        assert_eq!(code, 2);
        assert!(err.contains("argument `n`: `seven` is not integer"), "{err}");
        let (code, _, err) = call(&["tag", "size=1"]);
        assert_eq!(code, 2);
        assert!(err.contains("tool `tag` has no argument `size`"), "{err}");
        let (code, _, err) = call(&["nope"]);
        assert_eq!(code, 2);
        assert!(err.contains("no tool `nope` (tools: add, down, tag)"), "{err}");
        // A missing Service is a Kubernetes error naming it.
        let (code, _, err) = plugin(&["-n", &n, "tools", "absent"]);
        assert_eq!(code, 3);
        assert!(err.contains(&format!("Service {n}/absent")) && err.contains("not found"), "{err}");
        let _ = server.kill().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn the_state_key_secret_is_made_once_mounted_by_reference_and_remade_when_deleted() {
    with_ns("q-statekey", |ns| async move {
        ns.apply_yaml(&sample("calculator.yaml")).await;
        ns.wait_condition("calculator", "Ready", "True", 90).await;
        let secrets = ns.api::<Secret>();
        let first = secrets.get("calculator-state-key").await.unwrap();
        let owner = &first.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("McpServer", Some(true)));
        assert_eq!(first.immutable, Some(true));
        let key = first.data.as_ref().unwrap()["key"].0.clone();
        assert_eq!(key.len(), 64);
        assert!(key.iter().all(u8::is_ascii_hexdigit));
        let uid_of = |d: &Deployment| {
            d.spec
                .as_ref()
                .unwrap()
                .template
                .metadata
                .as_ref()
                .unwrap()
                .annotations
                .as_ref()
                .unwrap()["quiver.dev/state-key-uid"]
                .clone()
        };
        let d = ns.api::<Deployment>().get("calculator").await.unwrap();
        assert_eq!(uid_of(&d), first.uid().unwrap());
        let env = serde_json::to_value(
            &d.spec
                .as_ref()
                .unwrap()
                .template
                .spec
                .as_ref()
                .unwrap()
                .containers[0]
                .env,
        )
        .unwrap();
        let key_env = env
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "QUIVER_STATE_KEY")
            .unwrap();
        assert_eq!(
            key_env["valueFrom"]["secretKeyRef"]["name"],
            "calculator-state-key"
        );

        // status: the McpServer and its pods, from the real API server (the kwok pods have
        // no process behind them: each is listed with why its /status is unreadable).
        let (code, out, err) = plugin(&["-n", &ns.name, "status", "calculator"]);
        assert_eq!(code, 0, "Ready: {out}{err}");
        assert!(out.contains("Ready             True"), "{out}");
        for p in ns.api::<Pod>().list(&Default::default()).await.unwrap() {
            assert!(out.contains(&p.name_any()), "{out}");
        }
        let (code, _, err) = plugin(&["-n", &ns.name, "status", "absent"]);
        assert_eq!(code, 3);
        assert!(err.contains("not found"), "{err}");

        // Deleting the Secret rotates the key: a new one, and the pods follow its uid.
        secrets
            .delete("calculator-state-key", &DeleteParams::default())
            .await
            .unwrap();
        let old_uid = first.uid().unwrap();
        let second = eventually(30, "a new state-key Secret", || async {
            secrets
                .get_opt("calculator-state-key")
                .await
                .ok()?
                .filter(|s| s.uid().as_deref() != Some(&old_uid))
        })
        .await;
        assert_ne!(second.data.as_ref().unwrap()["key"].0, key);
        let new_uid = second.uid().unwrap();
        eventually(30, "the pod template names the new Secret", || async {
            let d = ns.api::<Deployment>().get("calculator").await.ok()?;
            (uid_of(&d) == new_uid).then_some(())
        })
        .await;
    })
    .await;
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn a_token_is_never_port_forwarded_to_a_pod_that_only_wears_the_mcpservers_labels() {
    with_ns("q-lookalike", |ns| async move {
        // An McpServer without pods of its own (replicas 0), and its Deployment in place.
        ns.apply_yaml(
            "apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {name: target}\n\
             spec:\n  replicas: 0\n  tools:\n    - {name: add, handler: {builtin: add}}\n",
        )
        .await;
        eventually(60, "the McpServer's Deployment", || async {
            ns.api::<Deployment>().get_opt("target").await.ok()?
        })
        .await;
        // Anyone who may create pods here can make one with the McpServer's labels, Ready.
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "target-0-lookalike",
                "labels": {"app.kubernetes.io/name": "quiver-server", "app.kubernetes.io/instance": "target"},
                "annotations": {"kwok.x-k8s.io/status": "custom"}},
            "spec": {"nodeName": "kwok-node-0", "containers": [{"name": "server", "image": "quiver-server"}]}
        }))
        .unwrap();
        ns.api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let ip = routable_ip();
        let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}]}});
        ns.api::<Pod>()
            .patch_status(
                "target-0-lookalike",
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .unwrap();
        // With a token the plugin port-forwards: it finds no pod the McpServer owns, and
        // says so without dialling the lookalike.
        let (code, out, err) = plugin(&["-n", &ns.name, "tools", "target", "--token", "s3cret-token"]);
        assert_eq!(code, 3, "{out}{err}");
        assert!(err.contains("no ready pod of McpServer"), "{err}");
        assert!(!err.contains("target-0-lookalike"), "{err}");
    })
    .await;
}
