//! The two ways from `kubectl quiver` to an McpServer's MCP endpoint: the API server's
//! service proxy (no token: the API server removes the `Authorization` header once it has
//! authenticated the caller, so the McpServer's own token cannot travel through it), or a
//! port-forward to one ready pod the McpServer owns (what carries a token).

use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Client;
use kube::api::{Api, ListParams};

use super::Failure;
use super::mcp::{Answer, Request as McpRequest};
use super::owner::OwnedPod;
use crate::build::{MCP_PORT, selector_string};
use crate::crd::McpServer;

/// Largest answer read, in bytes.
pub const MAX_ANSWER_BYTES: usize = 16 << 20;
/// Longest wait for one answer (above the server's own 5-minute request timeout).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(310);

/// A way to the MCP endpoint of one McpServer.
pub enum Reach {
    /// Through the API server's service proxy.
    Proxy {
        /// The API client.
        client: Client,
        /// The proxy path of the Service's `mcp` port.
        path: String,
    },
    /// Through a port-forward to one pod.
    Forward {
        /// HTTP/1.1 over the forwarded stream.
        sender: SendRequest<Full<Bytes>>,
        /// The port-forward (kept open while in use).
        forwarder: kube::api::Portforwarder,
        /// Which pod.
        pod: String,
    },
}

/// A Kubernetes error as a [`Failure::Kube`], `what` saying what was asked.
pub fn kube_failure(what: &str, e: &kube::Error) -> Failure {
    match e {
        kube::Error::Api(s) if s.code == 404 => Failure::Kube(format!("{what}: not found")),
        kube::Error::Api(s) if s.code == 403 => Failure::Kube(format!("{what}: forbidden: {}", s.message)),
        kube::Error::Api(s) if s.code == 401 => Failure::Kube(format!(
            "{what}: the API server did not accept your kubeconfig's credentials: {}",
            s.message
        )),
        other => Failure::Kube(format!("{what}: {other}")),
    }
}

impl Reach {
    /// The service proxy of the McpServer `name`'s Service.
    ///
    /// # Errors
    /// [`Failure::Kube`] when the Service cannot be read.
    pub async fn proxy(client: Client, ns: &str, name: &str) -> Result<Self, Failure> {
        Api::<Service>::namespaced(client.clone(), ns)
            .get_metadata(name)
            .await
            .map_err(|e| kube_failure(&format!("Service {ns}/{name} of the McpServer"), &e))?;
        Ok(Self::Proxy {
            client,
            path: format!("/api/v1/namespaces/{ns}/services/http:{name}:mcp/proxy/mcp"),
        })
    }

    /// A port-forward to a ready pod of the McpServer `name`: one its Deployment runs
    /// (see [`super::owner`]), never a pod that only carries its labels.
    ///
    /// # Errors
    /// [`Failure::Kube`] when no pod of the McpServer is ready or the port-forward fails.
    pub async fn port_forward(client: Client, ns: &str, name: &str) -> Result<Self, Failure> {
        let pod = owned_ready_pod(&client, ns, name).await?;
        let pods: Api<Pod> = Api::namespaced(client, ns);
        let port = u16::try_from(MCP_PORT).unwrap_or(8080);
        let mut forwarder = pods
            .portforward(&pod, &[port])
            .await
            .map_err(|e| kube_failure(&format!("port-forward to pod {ns}/{pod}"), &e))?;
        let stream = forwarder
            .take_stream(port)
            .ok_or_else(|| Failure::Kube(format!("port-forward to pod {ns}/{pod}: no stream")))?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failure::Server(format!("pod {ns}/{pod}: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self::Forward {
            sender,
            forwarder,
            pod,
        })
    }

    /// Where requests go, for messages.
    pub fn describe(&self) -> String {
        match self {
            Self::Proxy { path, .. } => format!("the API server's service proxy ({path})"),
            Self::Forward { pod, .. } => format!("a port-forward to pod {pod}"),
        }
    }

    /// POSTs `req` (with `token` as a bearer token) and reads the answer.
    ///
    /// # Errors
    /// [`Failure::Kube`] when the API server refuses or cannot proxy, [`Failure::Server`]
    /// when the pod cannot be reached or the answer is too large or too late.
    pub async fn post(&mut self, req: &McpRequest, token: Option<&str>) -> Result<Answer, Failure> {
        let mut builder = Request::post(match self {
            Self::Proxy { path, .. } => path.as_str(),
            Self::Forward { .. } => "/mcp",
        })
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, text/event-stream");
        if matches!(self, Self::Forward { .. }) {
            builder = builder.header(header::HOST, "localhost");
        }
        for (k, v) in &req.headers {
            builder = builder.header(*k, v.as_str());
        }
        if let Some(t) = token {
            builder = builder.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let bad = |e: http::Error| Failure::Usage(format!("cannot build the request: {e}"));
        let answer = async {
            match self {
                Self::Proxy { client, .. } => {
                    let request = builder
                        .body(kube::client::Body::from(req.body.clone()))
                        .map_err(bad)?;
                    let response = client
                        .send(request)
                        .await
                        .map_err(|e| Failure::Kube(format!("the API server's service proxy: {e}")))?;
                    let proxied = read(response).await?;
                    refused_by_api_server(&proxied)?;
                    Ok(proxied)
                }
                Self::Forward { sender, pod, .. } => {
                    let request = builder
                        .body(Full::new(Bytes::from(req.body.clone())))
                        .map_err(bad)?;
                    sender
                        .ready()
                        .await
                        .map_err(|e| Failure::Server(format!("pod {pod}: {e}")))?;
                    let response = sender
                        .send_request(request)
                        .await
                        .map_err(|e| Failure::Server(format!("pod {pod}: {e}")))?;
                    read(response).await
                }
            }
        };
        tokio::time::timeout(ANSWER_TIMEOUT, answer)
            .await
            .map_err(|_| Failure::Server(format!("no answer within {}s", ANSWER_TIMEOUT.as_secs())))?
    }

    /// Ends a port-forward.
    pub async fn close(self) {
        if let Self::Forward {
            sender, forwarder, ..
        } = self
        {
            drop(sender);
            forwarder.abort();
        }
    }
}

/// The name of a ready pod of the McpServer `name`, found down its owner chain: the
/// McpServer's uid, its Deployment (of the same name), that Deployment's ReplicaSets, their pods.
async fn owned_ready_pod(client: &Client, ns: &str, name: &str) -> Result<String, Failure> {
    let mcp = Api::<McpServer>::namespaced(client.clone(), ns)
        .get_metadata(name)
        .await
        .map_err(|e| kube_failure(&format!("McpServer {ns}/{name}"), &e))?;
    let uid = mcp.metadata.uid.as_deref().unwrap_or_default();
    owned_pods(client, ns, name, uid)
        .await?
        .into_iter()
        .find(|p| p.ready)
        .map(|p| p.name)
        .ok_or_else(|| {
            Failure::Kube(format!(
                "no ready pod of McpServer {ns}/{name} owned by its Deployment (kubectl quiver status {name} -n {ns})"
            ))
        })
}

/// The pods of the McpServer `name` (of uid `uid`), not being deleted, found down its owner
/// chain: its Deployment (of the same name), that Deployment's ReplicaSets, their pods.
///
/// # Errors
/// [`Failure::Kube`] when one of them cannot be read.
pub(super) async fn owned_pods(
    client: &Client,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<Vec<OwnedPod>, Failure> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), ns)
        .get_metadata(name)
        .await
        .map_err(|e| kube_failure(&format!("Deployment {ns}/{name} of the McpServer"), &e))?;
    let labels = ListParams::default().labels(&selector_string(name));
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list_metadata(&labels)
        .await
        .map_err(|e| kube_failure(&format!("ReplicaSets of McpServer {ns}/{name}"), &e))?;
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&labels)
        .await
        .map_err(|e| kube_failure(&format!("pods of McpServer {ns}/{name}"), &e))?;
    let replica_sets: Vec<_> = replica_sets.items.into_iter().map(|rs| rs.metadata).collect();
    Ok(super::owner::owned_pods(
        uid,
        &deployment.metadata,
        &replica_sets,
        &pods.items,
    ))
}

pub(super) async fn read<B>(response: http::Response<B>) -> Result<Answer, Failure>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|e| {
            Failure::Server(format!(
                "reading the answer (at most {MAX_ANSWER_BYTES} bytes): {e}"
            ))
        })?
        .to_bytes()
        .to_vec();
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// The message of a `Status` the API server wrote itself instead of proxying (no ready
/// endpoints, the pod unreachable, forbidden), if `a` is one.
pub(super) fn api_server_status(a: &Answer) -> Option<String> {
    if (200..300).contains(&a.status) || !a.content_type.starts_with("application/json") {
        return None;
    }
    let v = serde_json::from_slice::<serde_json::Value>(&a.body).ok()?;
    if v.get("kind").and_then(|k| k.as_str()) != Some("Status") || v.get("apiVersion").is_none() {
        return None;
    }
    Some(
        v.get("message")
            .and_then(|m| m.as_str())
            .unwrap_or("refused")
            .to_owned(),
    )
}

/// A `Status` the API server wrote itself (it could not proxy: no ready endpoints, forbidden).
fn refused_by_api_server(a: &Answer) -> Result<(), Failure> {
    match api_server_status(a) {
        None => Ok(()),
        Some(message) => Err(Failure::Kube(format!(
            "the API server's service proxy answered {}: {message}",
            a.status
        ))),
    }
}
