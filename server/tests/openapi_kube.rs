//! OpenAPI import against a real kube-apiserver (`scripts/control-plane.sh`; run by
//! `scripts/openapi-it.sh` with `--ignored`): the server's own OpenAPI v3 documents of core/v1
//! and apps/v1 become tools, called through quiver-server with a ServiceAccount token and the
//! cluster CA from Secrets.

mod real_binary;

use std::path::Path;
use std::process::Command;

use real_binary::{Proc, http, start_http_env};
use serde_json::{Value, json};

fn kubectl(args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl on PATH");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn write_secret(root: &Path, name: &str, key: &str, value: &str) {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(key), value).unwrap();
}

fn rpc(p: &Proc, method: &str, params: Value) -> Value {
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let resp = http(p.mcp, "POST", "/mcp", &req.to_string()).expect("an answer");
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str::<Value>(body).unwrap_or_else(|e| panic!("{e}: {resp}"))["result"].clone()
}

fn call(p: &Proc, tool: &str, args: Value) -> Value {
    rpc(p, "tools/call", json!({"name": tool, "arguments": args}))
}

/// The API server's URL and CA file, from the kubeconfig of the control plane.
fn cluster() -> (String, String) {
    let server = kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let ca = kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority}",
    ]);
    (server, std::fs::read_to_string(ca).expect("the cluster CA file"))
}

/// Namespace `ns`, made anew (an older one is deleted without waiting), with a
/// ServiceAccount `caller` bound to the ClusterRole `role` in it.
fn fresh_namespace_with_caller(ns: &str, role: &str) {
    let _ = Command::new("kubectl")
        .args(["delete", "namespace", ns, "--wait=false"])
        .output();
    kubectl(&["create", "namespace", ns]);
    kubectl(&["-n", ns, "create", "serviceaccount", "caller"]);
    kubectl(&[
        "-n",
        ns,
        "create",
        "rolebinding",
        &format!("caller-{role}"),
        &format!("--clusterrole={role}"),
        &format!("--serviceaccount={ns}:caller"),
    ]);
}

#[test]
#[ignore = "needs cluster"]
fn kube_apiserver_operations_are_called_through_quiver() {
    let ns = "q-openapi";
    fresh_namespace_with_caller(ns, "edit");
    let token = kubectl(&["-n", ns, "create", "token", "caller"]);
    let (server, ca) = cluster();
    let dir = tempfile::tempdir().unwrap();
    write_secret(dir.path(), "kube", "token", token.trim());
    write_secret(dir.path(), "kube-ca", "ca.crt", &ca);
    let core = dir.path().join("core.json");
    std::fs::write(&core, kubectl(&["get", "--raw", "/openapi/v3/api/v1"])).unwrap();
    let apps = dir.path().join("apps.json");
    std::fs::write(&apps, kubectl(&["get", "--raw", "/openapi/v3/apis/apps/v1"])).unwrap();
    let tools = format!(
        r#"openapi:
  - name: core
    file: {core}
    server: {server}
    headers: {{Authorization: "Bearer {{{{secret.kube.token}}}}"}}
    tls: {{caSecret: kube-ca}}
    tools:
      include: [listCoreV1NamespacedConfigMap, createCoreV1NamespacedConfigMap, readCoreV1NamespacedConfigMap, deleteCoreV1NamespacedConfigMap, listCoreV1NamespacedPod, readCoreV1Namespace]
  - name: apps
    file: {apps}
    server: {server}
    headers: {{Authorization: "Bearer {{{{secret.kube.token}}}}"}}
    tls: {{caSecret: kube-ca}}
    operations: {{methods: [get], paths: ["/apis/apps/v1/namespaces/{{namespace}}/deployments*"]}}
"#,
        core = core.display(),
        apps = apps.display(),
    );
    let source = format!("--secrets=dir:{}", dir.path().display());
    let p = start_http_env(&tools, &[&source], &[]);

    let listed = rpc(&p, "tools/list", json!({}));
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "createCoreV1NamespacedConfigMap",
            "deleteCoreV1NamespacedConfigMap",
            "listAppsV1NamespacedDeployment",
            "listCoreV1NamespacedConfigMap",
            "listCoreV1NamespacedPod",
            "readAppsV1NamespacedDeployment",
            // `*` crosses `/`: the subresources match the glob too.
            "readAppsV1NamespacedDeploymentScale",
            "readAppsV1NamespacedDeploymentStatus",
            "readCoreV1Namespace",
            "readCoreV1NamespacedConfigMap",
        ]
    );
    let list_pods = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "listCoreV1NamespacedPod")
        .unwrap();
    assert_eq!(list_pods["annotations"]["readOnlyHint"], true);
    assert!(
        list_pods["inputSchema"]["properties"]["labelSelector"].is_object(),
        "{list_pods}"
    );
    assert_eq!(list_pods["inputSchema"]["required"], json!(["namespace"]));

    // Create through a JSON body, read back (structured), list with a label selector, delete.
    let created = call(
        &p,
        "createCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "body": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "from-quiver", "labels": {"made-by": "quiver"}}, "data": {"k": "a value/with ?&= characters"}}}),
    );
    assert_eq!(created["isError"], false, "{created}");
    let read = call(
        &p,
        "readCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "name": "from-quiver"}),
    );
    assert_eq!(read["isError"], false, "{read}");
    assert_eq!(
        read["structuredContent"]["data"]["k"], "a value/with ?&= characters",
        "{read}"
    );
    let listed = call(
        &p,
        "listCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "labelSelector": "made-by=quiver", "limit": 5}),
    );
    assert_eq!(listed["isError"], false, "{listed}");
    let items = listed["structuredContent"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    let none = call(
        &p,
        "listCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "labelSelector": "made-by=nobody"}),
    );
    assert_eq!(none["structuredContent"]["items"], json!([]), "{none}");

    // The apiserver's refusal is a tool error with its status; RBAC applies to the token.
    let missing = call(
        &p,
        "readCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "name": "absent"}),
    );
    assert_eq!(missing["isError"], true);
    assert!(
        missing["content"][0]["text"].as_str().unwrap().contains("404"),
        "{missing}"
    );
    let forbidden = call(&p, "readCoreV1Namespace", json!({"name": "kube-system"}));
    assert_eq!(forbidden["isError"], true);
    assert!(
        forbidden["content"][0]["text"].as_str().unwrap().contains("403"),
        "{forbidden}"
    );
    // A path parameter cannot walk elsewhere: it is percent-encoded into one segment.
    let walked = call(
        &p,
        "readCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "name": "../../secrets/x"}),
    );
    assert_eq!(walked["isError"], true, "{walked}");

    let deployments = call(&p, "listAppsV1NamespacedDeployment", json!({"namespace": ns}));
    assert_eq!(deployments["isError"], false, "{deployments}");
    assert_eq!(deployments["structuredContent"]["kind"], "DeploymentList");

    let deleted = call(
        &p,
        "deleteCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "name": "from-quiver"}),
    );
    assert_eq!(deleted["isError"], false, "{deleted}");
    let gone = call(
        &p,
        "readCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "name": "from-quiver"}),
    );
    assert_eq!(gone["isError"], true);
    kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// A `url` source: quiver-server fetches the apiserver's own OpenAPI v3 documents itself,
/// trusting the cluster CA from a file and presenting a ServiceAccount token from a file
/// (as in a pod), then calls the imported operations with a token from a Secret.
#[test]
#[ignore = "needs cluster"]
fn url_sources_are_fetched_from_the_apiserver_with_its_ca_and_a_token() {
    let ns = "q-openapi-url";
    fresh_namespace_with_caller(ns, "view");
    kubectl(&["-n", ns, "create", "serviceaccount", "fetcher"]);
    let (server, ca) = cluster();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca).unwrap();
    // The fetcher's token may read /openapi/* (system:discovery) and nothing else.
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, kubectl(&["-n", ns, "create", "token", "fetcher"])).unwrap();
    let secrets = dir.path().join("secrets");
    write_secret(
        &secrets,
        "kube",
        "token",
        kubectl(&["-n", ns, "create", "token", "caller"]).trim(),
    );
    write_secret(&secrets, "kube-ca", "ca.crt", &ca);
    kubectl(&["-n", ns, "create", "configmap", "seen", "--from-literal=k=v"]);
    let source = |name: &str, path: &str, filter: &str| {
        format!(
            "  - name: {name}\n    url: {server}{path}\n    fetch: {{caFile: {}, tokenFile: {}, timeout: 20s}}\n    server: {server}\n    headers: {{Authorization: \"Bearer {{{{secret.kube.token}}}}\"}}\n    tls: {{caSecret: kube-ca}}\n    {filter}\n",
            ca_file.display(),
            token_file.display()
        )
    };
    let tools = format!(
        "openapi:\n{}{}",
        source(
            "core",
            "/openapi/v3/api/v1",
            "tools: {include: [listCoreV1NamespacedConfigMap, readCoreV1NamespacedConfigMap]}"
        ),
        source(
            "apps",
            "/openapi/v3/apis/apps/v1",
            "operations: {methods: [get], paths: [\"/apis/apps/v1/namespaces/{namespace}/deployments\"]}"
        ),
    );
    let p = start_http_env(&tools, &[&format!("--secrets=dir:{}", secrets.display())], &[]);
    let listed = rpc(&p, "tools/list", json!({}));
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "listAppsV1NamespacedDeployment",
            "listCoreV1NamespacedConfigMap",
            "readCoreV1NamespacedConfigMap"
        ]
    );
    let read = call(
        &p,
        "readCoreV1NamespacedConfigMap",
        json!({"namespace": ns, "name": "seen"}),
    );
    assert_eq!(read["structuredContent"]["data"]["k"], "v", "{read}");
    let listed = call(&p, "listAppsV1NamespacedDeployment", json!({"namespace": ns}));
    assert_eq!(listed["structuredContent"]["kind"], "DeploymentList", "{listed}");

    // Without the CA file the fetch fails TLS: `check` refuses the config, naming the source.
    let no_ca = dir.path().join("no-ca.yaml");
    std::fs::write(
        &no_ca,
        format!(
            "openapi:\n  - name: core\n    url: {server}/openapi/v3/api/v1\n    fetch: {{tokenFile: {}}}\n",
            token_file.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_quiver-server"))
        .args(["check", "--config", &format!("file:{}", no_ca.display())])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("openapi[0].url") && err.contains("failed"), "{err}");
    kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// The operations the importer refuses, excluded: the writes whose body is a pod template
/// (its schema expands past the bound of 10,000 subschemas), the persistent volume writes
/// (descriptor over 64 KiB) and the proxy operations that declare `path` both in the path
/// and in the query.
const CORE_EXCLUDED: &str = "connectCoreV1*ProxyWithPath, createCoreV1NamespacedPod, replaceCoreV1NamespacedPod, replaceCoreV1NamespacedPodEphemeralcontainers, replaceCoreV1NamespacedPodResize, replaceCoreV1NamespacedPodStatus, createCoreV1NamespacedPodTemplate, replaceCoreV1NamespacedPodTemplate, createCoreV1NamespacedReplicationController, replaceCoreV1NamespacedReplicationController, replaceCoreV1NamespacedReplicationControllerStatus, createCoreV1PersistentVolume, replaceCoreV1PersistentVolume, replaceCoreV1PersistentVolumeStatus";
const APPS_EXCLUDED: &str = "createAppsV1NamespacedDaemonSet, replaceAppsV1NamespacedDaemonSet, replaceAppsV1NamespacedDaemonSetStatus, createAppsV1NamespacedDeployment, replaceAppsV1NamespacedDeployment, replaceAppsV1NamespacedDeploymentStatus, createAppsV1NamespacedReplicaSet, replaceAppsV1NamespacedReplicaSet, replaceAppsV1NamespacedReplicaSetStatus, createAppsV1NamespacedStatefulSet, replaceAppsV1NamespacedStatefulSet, replaceAppsV1NamespacedStatefulSetStatus";

/// Every other core/v1 and apps/v1 operation imported by the real importer from `url` sources,
/// with tool search on: `find_tools` through quiver-server finds the labeled queries of
/// tests/search/kube-queries.yaml with recall@5 >= 0.9 (what the kind test checks too).
#[test]
#[ignore = "needs cluster"]
fn every_operation_imports_and_find_tools_finds_them() {
    #[derive(serde::Deserialize)]
    struct Labeled {
        query: String,
        expect: Vec<String>,
    }
    let (server, ca) = cluster();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca).unwrap();
    let token_file = dir.path().join("token");
    kubectl(&["create", "serviceaccount", "q-openapi-fetcher"]);
    std::fs::write(&token_file, kubectl(&["create", "token", "q-openapi-fetcher"])).unwrap();
    let source = |name: &str, path: &str, exclude: &str| {
        format!(
            "  - {{name: {name}, url: '{server}{path}', fetch: {{caFile: '{}', tokenFile: '{}'}}, server: '{server}', tools: {{exclude: [{exclude}]}}}}\n",
            ca_file.display(),
            token_file.display()
        )
    };
    let tools = format!(
        "openapi:\n{}{}toolSearch: {{maxLimit: 50}}\n",
        source("core", "/openapi/v3/api/v1", CORE_EXCLUDED),
        source("apps", "/openapi/v3/apis/apps/v1", APPS_EXCLUDED)
    );
    let p = start_http_env(&tools, &[], &[]);
    let listed = rpc(&p, "tools/list", json!({}));
    assert_eq!(
        listed["tools"].as_array().unwrap().len(),
        1,
        "only find_tools is listed"
    );
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/search/kube-queries.yaml"
    ))
    .unwrap();
    let labeled: Vec<Labeled> = serde_saphyr::from_str(&text).unwrap();
    assert!(labeled.len() >= 50);
    let mut found = 0;
    for l in &labeled {
        let r = call(&p, "find_tools", json!({"query": l.query, "limit": 5}));
        let names: Vec<&str> = r["structuredContent"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        if names.iter().any(|n| l.expect.iter().any(|e| e == n)) {
            found += 1;
        } else {
            println!("missed: {:?} -> {names:?}", l.query);
        }
    }
    let recall = f64::from(found) / labeled.len() as f64;
    println!(
        "find_tools through quiver-server: {} queries, recall@5 {recall:.3}",
        labeled.len()
    );
    // A found tool is callable by name though not listed.
    let pods = call(&p, "listCoreV1NamespacedPod", json!({"namespace": "default"}));
    assert!(pods.get("content").is_some(), "{pods}");
    let _ = Command::new("kubectl")
        .args(["delete", "serviceaccount", "q-openapi-fetcher"])
        .output();
    assert!(recall >= 0.9, "recall@5 {recall:.3} < 0.9");
}
