//! Asks each ready server pod which config it has loaded (`GET :9090/status`, the
//! `configHash` field), to report `status.configLoadedReplicas`. Plain HTTP/1.0 over a
//! TCP stream with a short timeout: this runs inside the cluster network, next to the pods.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::build;

const TIMEOUT: Duration = Duration::from_millis(500);
const MAX_BODY: u64 = 64 * 1024;

async fn loaded_hash(ip: &str) -> Option<String> {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect((ip, build::ADMIN_PORT as u16))
            .await
            .ok()?;
        s.write_all(b"GET /status HTTP/1.0\r\nHost: quiver\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.take(MAX_BODY).read_to_end(&mut buf).await.ok()?;
        let split = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        let v: serde_json::Value = serde_json::from_slice(&buf[split + 4..]).ok()?;
        v["configHash"].as_str().map(str::to_owned)
    };
    tokio::time::timeout(TIMEOUT, fetch).await.ok().flatten()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Ready pods of `name` that report `hash`.
///
/// # Errors
/// Listing the pods failed.
pub async fn config_loaded(
    client: &kube::Client,
    ns: &str,
    name: &str,
    hash: &str,
) -> Result<i32, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&build::selector_string(name)))
        .await?;
    let ips: Vec<String> = list
        .items
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let hashes = futures_util::future::join_all(ips.iter().map(|ip| loaded_hash(ip))).await;
    let loaded = hashes.iter().filter(|h| h.as_deref() == Some(hash)).count();
    Ok(i32::try_from(loaded).unwrap_or(i32::MAX))
}
