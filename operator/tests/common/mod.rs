//! Helpers of the real-cluster tests: a client from KUBECONFIG, bounded polling, a temporary
//! namespace per test that is dumped when the test fails.

// Each test binary uses a different subset.
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use quiver_operator::crd::McpServer;
use serde_json::{Value, json};

const CLUSTER: &str = "needs a control plane: run scripts/test.sh (or KUBECONFIG + a running operator)";

pub async fn client() -> Client {
    Client::try_default()
        .await
        .unwrap_or_else(|e| panic!("{CLUSTER}: {e}"))
}

/// Polls `f` until it yields `Some`, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub struct TempNs {
    pub client: Client,
    pub name: String,
}

impl TempNs {
    pub async fn new(prefix: &str) -> Self {
        let client = client().await;
        let name = format!("{prefix}-{}", std::process::id() % 100_000);
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let api: Api<Namespace> = Api::all(client.clone());
        let _ = api.delete(&name, &DeleteParams::default()).await;
        eventually(60, "old namespace gone", || async {
            api.get_opt(&name).await.ok().flatten().is_none().then_some(())
        })
        .await;
        api.create(&PostParams::default(), &ns).await.unwrap();
        Self { client, name }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    pub async fn apply_yaml(&self, yaml: &str) {
        for doc in yaml.split("\n---\n") {
            let v: Value = serde_saphyr::from_str(doc).unwrap();
            let mut obj: kube::api::DynamicObject = serde_json::from_value(v.clone()).unwrap();
            obj.metadata.namespace = Some(self.name.clone());
            let gvk = kube::api::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
            let (ar, _) = kube::discovery::pinned_kind(&self.client, &gvk).await.unwrap();
            let api: Api<kube::api::DynamicObject> =
                Api::namespaced_with(self.client.clone(), &self.name, &ar);
            api.patch(
                &obj.name_any(),
                &PatchParams::apply("quiver-tests").force(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap();
        }
    }

    pub async fn mcp(&self, name: &str) -> McpServer {
        self.api::<McpServer>().get(name).await.unwrap()
    }

    pub async fn condition(&self, name: &str, type_: &str) -> Option<(String, String, String)> {
        let m = self.api::<McpServer>().get_opt(name).await.ok()??;
        let c = m.status?.conditions.into_iter().find(|c| c.type_ == type_)?;
        Some((c.status, c.reason, c.message))
    }

    pub async fn wait_condition(&self, name: &str, type_: &str, status: &str, secs: u64) -> (String, String) {
        eventually(secs, &format!("{name} {type_}={status}"), || async {
            self.condition(name, type_)
                .await
                .filter(|c| c.0 == status)
                .map(|c| (c.1, c.2))
        })
        .await
    }

    pub async fn dump(&self) {
        let events: Api<Event> = self.api();
        if let Ok(list) = events.list(&ListParams::default()).await {
            for e in list {
                eprintln!(
                    "event {} {}: {}",
                    e.reason.unwrap_or_default(),
                    e.involved_object.name.unwrap_or_default(),
                    e.message.unwrap_or_default()
                );
            }
        }
        if let Ok(list) = self.api::<McpServer>().list(&ListParams::default()).await {
            for m in list {
                eprintln!(
                    "mcpserver {}: {}",
                    m.name_any(),
                    serde_json::to_string(&m.status).unwrap_or_default()
                );
            }
        }
    }
}

/// Runs a test body in a fresh namespace; dumps state if it panics; deletes the namespace.
pub async fn with_ns<F, Fut>(prefix: &str, body: F)
where
    F: FnOnce(TempNs) -> Fut,
    Fut: Future<Output = ()>,
{
    let ns = TempNs::new(prefix).await;
    let (client, name) = (ns.client.clone(), ns.name.clone());
    let dump = TempNs {
        client: client.clone(),
        name: name.clone(),
    };
    let result = futures_util::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(body(ns))).await;
    if result.is_err() {
        dump.dump().await;
    }
    let _ = Api::<Namespace>::all(client)
        .delete(&name, &DeleteParams::default())
        .await;
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

pub fn sample(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../deploy/samples/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

pub fn kubectl(args: &[&str]) -> String {
    let out = std::process::Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl on PATH");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
