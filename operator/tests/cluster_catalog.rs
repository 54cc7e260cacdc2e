//! Against a real control plane (scripts/operator-it.sh runs this with `--ignored`): the
//! catalog of a standby operator replica (a Lease held by someone else, so it never
//! reconciles) answers the MCP Registry API with what the real API server's TokenReview and
//! SubjectAccessReview allow. Three McpServers in two namespaces; a ServiceAccount of one
//! namespace sees only its servers, a made-up token is refused, a change reaches the list,
//! and a deleted server is listed as `deleted` to clients that sync with `updated_since`.
//!
//! With `QUIVER_CATALOG_SAMPLES` set, the answers are written there for
//! tests/catalog/validate.py to check against the official registry's OpenAPI document and
//! `server.json` schema.

use std::process::Stdio;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, PostParams};
use quiver_operator::crd::McpServer;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

mod common;

use common::*;

fn server(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: quiver.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: {name}}}\nspec:\n  tools:\n    - {{name: echo, handler: {{builtin: echo}}}}\n{extra}"
    )
}

/// A standby replica serving the catalog on `port`.
fn standby(lease_ns: &str, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_quiver-operator"))
        .args([
            "--leader-elect",
            "--probe-pods=false",
            "--admin-listen=127.0.0.1:0",
            &format!("--lease-namespace={lease_ns}"),
            &format!("--catalog-listen=127.0.0.1:{port}"),
            "--catalog-prefix=com.example.mcp",
        ])
        .env("POD_NAME", "catalog-standby")
        .env("RUST_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the quiver-operator binary runs")
}

/// GET `path` of the catalog; the status code, the ETag and the body.
async fn get(port: u16, path: &str, token: Option<&str>, etag: Option<&str>) -> Option<(u16, String, Value)> {
    let mut args = vec![
        "-sS".to_owned(),
        "-m".into(),
        "5".into(),
        "-D".into(),
        "-".into(),
        format!("http://127.0.0.1:{port}{path}"),
    ];
    if let Some(t) = token {
        args.extend(["-H".into(), format!("Authorization: Bearer {t}")]);
    }
    if let Some(e) = etag {
        args.extend(["-H".into(), format!("If-None-Match: {e}")]);
    }
    let out = Command::new("curl").args(&args).output().await.ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    let etag = head
        .lines()
        .find_map(|l| l.strip_prefix("etag: ").or_else(|| l.strip_prefix("ETag: ")))
        .unwrap_or_default()
        .trim()
        .to_owned();
    let body = if body.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).ok()?
    };
    Some((code, etag, body))
}

fn names(list: &Value) -> Vec<String> {
    list["servers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["server"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Saves an answer for the schema check.
fn keep(name: &str, v: &Value) {
    if let Ok(dir) = std::env::var("QUIVER_CATALOG_SAMPLES") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            format!("{dir}/{name}.json"),
            serde_json::to_vec_pretty(v).unwrap(),
        )
        .unwrap();
    }
}

/// A ServiceAccount of `ns` that may list (and only list) McpServers there, and a token of it.
async fn reader(ns: &TempNs) -> String {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "reader"}})).unwrap();
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "mcp-reader"},
        "rules": [{"apiGroups": ["quiver.dev"], "resources": ["mcpservers"], "verbs": ["list"]}],
    }))
    .unwrap();
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "mcp-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mcp-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns.name}],
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    kubectl(&["create", "token", "reader", "-n", &ns.name, "--duration=10m"])
        .trim()
        .to_owned()
}

#[tokio::test]
#[ignore = "needs cluster"]
async fn each_namespace_sees_only_its_servers_in_the_catalog_of_a_standby_replica() {
    with_ns("q-cat-a", |a| async move {
        let b = TempNs::new("q-cat-b").await;
        // Held by someone else for an hour: the replica below stays on standby.
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some("quiver-operator".into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("someone-else".into()),
                lease_duration_seconds: Some(3600),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..Default::default()
            }),
        };
        a.api::<Lease>().create(&PostParams::default(), &lease).await.unwrap();
        a.apply_yaml(&server(
            "weather",
            "  server: {version: 2.1.0, title: Weather}\n  catalog: {description: Forecasts for any city, websiteUrl: \"https://docs.example.com/weather\"}\n  ingress: {host: weather.example.com, tlsSecretName: weather-tls}\n",
        ))
        .await;
        a.apply_yaml(&server(
            "files",
            "  auth: {oidc: {issuer: \"https://id.example.com/realms/a\", audience: files}}\n",
        ))
        .await;
        b.apply_yaml(&server("search", "  catalog: {deprecated: use search2}\n")).await;
        let token_a = reader(&a).await;
        let token_b = reader(&b).await;

        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let _replica = standby(&a.name, port);
        let prefix = "com.example.mcp";
        let (weather, files, search) = (
            format!("{prefix}.{}/weather", a.name),
            format!("{prefix}.{}/files", a.name),
            format!("{prefix}.{}/search", b.name),
        );

        // No token, or one the API server does not know: 401 before anything is listed.
        let (code, _, body) = eventually(60, "the catalog answers", || get(port, "/v0.1/servers", None, None)).await;
        assert_eq!(code, 401, "{body}");
        let (code, _, _) = get(port, "/v0.1/servers", Some("made-up-token"), None).await.unwrap();
        assert_eq!(code, 401);

        // A's reader sees exactly A's two servers, whatever else the cluster runs. The
        // operator may still be writing their status (each write is a new entry, a new
        // ETag): once it is done, an unchanged list is not sent again.
        let list = eventually(60, "A's servers listed, and not sent again unchanged", || async {
            let (code, etag, v) = get(port, "/v0.1/servers", Some(&token_a), None).await?;
            if code != 200 || names(&v).len() != 2 {
                return None;
            }
            let (again, _, _) = get(port, "/v0.1/servers", Some(&token_a), Some(&etag)).await?;
            (again == 304).then_some(v)
        })
        .await;
        let v = list;
        assert_eq!(names(&v), [files.clone(), weather.clone()]);
        keep("list-a", &v);
        let w = &v["servers"][1];
        assert_eq!(w["server"]["version"], "2.1.0");
        assert_eq!(w["server"]["description"], "Forecasts for any city");
        assert_eq!(w["server"]["remotes"][0]["url"], "https://weather.example.com/mcp");
        assert_eq!(w["_meta"]["dev.quiver/catalog"]["namespace"], a.name.as_str());
        let f = &v["servers"][0];
        assert_eq!(f["server"]["remotes"][0]["headers"][0]["name"], "Authorization");
        assert_eq!(f["_meta"]["dev.quiver/catalog"]["auth"]["issuer"], "https://id.example.com/realms/a");

        // B's reader sees B's one; neither sees the other's through any path.
        let (_, _, v) = get(port, "/v0.1/servers", Some(&token_b), None).await.unwrap();
        assert_eq!(names(&v), [search.as_str()]);
        assert_eq!(v["servers"][0]["_meta"]["io.modelcontextprotocol.registry/official"]["status"], "deprecated");
        keep("list-b", &v);
        let enc = |n: &str| n.replace('/', "%2F");
        let (code, _, v) = get(port, &format!("/v0.1/servers/{}/versions/latest", enc(&weather)), Some(&token_a), None)
            .await
            .unwrap();
        assert_eq!(code, 200);
        keep("server-weather", &v);
        let (code, _, v) = get(port, &format!("/v0.1/servers/{}/versions", enc(&weather)), Some(&token_a), None)
            .await
            .unwrap();
        assert_eq!(code, 200);
        keep("versions-weather", &v);
        let (code, _, _) = get(port, &format!("/v0.1/servers/{}/versions/latest", enc(&weather)), Some(&token_b), None)
            .await
            .unwrap();
        assert_eq!(code, 404, "B's reader cannot read A's server");
        let (code, _, v) = get(port, &format!("/namespaces/{}/v0.1/servers", a.name), Some(&token_b), None)
            .await
            .unwrap();
        assert_eq!((code, names(&v)), (200, vec![]), "nor list A's namespace");
        let (_, _, v) = get(port, &format!("/namespaces/{}/v0.1/servers?limit=1", a.name), Some(&token_a), None)
            .await
            .unwrap();
        assert_eq!(names(&v), [files.as_str()]);
        assert!(v["metadata"]["nextCursor"].is_string());
        keep("page-a", &v);

        // A new server reaches the list; a deleted one is listed as deleted to a syncing client.
        let before = k8s_openapi::jiff::Timestamp::now();
        a.apply_yaml(&server("notes", "")).await;
        eventually(60, "the new server listed", || async {
            let (_, _, v) = get(port, "/v0.1/servers", Some(&token_a), None).await?;
            (names(&v).len() == 3).then_some(())
        })
        .await;
        a.api::<McpServer>().delete("notes", &DeleteParams::default()).await.unwrap();
        let since = format!("/v0.1/servers?updated_since={before}");
        let v = eventually(90, "the deleted server listed as deleted", || async {
            let (_, _, v) = get(port, &since, Some(&token_a), None).await?;
            let deleted = v["servers"].as_array()?.iter().any(|s| {
                s["server"]["name"].as_str().is_some_and(|n| n.ends_with("/notes"))
                    && s["_meta"]["io.modelcontextprotocol.registry/official"]["status"] == "deleted"
            });
            deleted.then_some(v)
        })
        .await;
        keep("sync-a", &v);
        let (_, _, v) = get(port, "/v0.1/servers", Some(&token_a), None).await.unwrap();
        assert_eq!(names(&v), [files, weather], "deleted servers are not listed by default");
        let _ = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(b.client.clone())
            .delete(&b.name, &DeleteParams::default())
            .await;
    })
    .await;
}
