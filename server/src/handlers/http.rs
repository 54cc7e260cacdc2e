//! The `http` handler: a pooled HTTP/1.1 client (TLS via rustls) with templated URL, headers
//! and JSON body, a timeout and a response size cap.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::ToolOutput;
use crate::config::HttpCall;

/// A pooled HTTP(S) client shared by every http tool.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl HttpClient {
    /// A client trusting the webpki root certificates.
    pub fn new() -> Self {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .unwrap_or_else(|e| panic!("ring supports rustls' default protocol versions: {e}"))
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .build(connector);
        Self { client }
    }

    /// Performs the request of an http tool.
    pub async fn call(&self, spec: &HttpCall, args: &Value) -> ToolOutput {
        let url = spec.url.render_url(args);
        let mut req = Request::builder()
            .method(Method::from_bytes(spec.method.as_bytes()).unwrap_or(Method::GET))
            .uri(&url);
        for (name, value) in &spec.headers {
            let rendered = value.render(args);
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&rendered),
            ) {
                (Ok(n), Ok(v)) => req = req.header(n, v),
                _ => return ToolOutput::error(format!("header `{name}` rendered to an invalid value")),
            }
        }
        let body = match &spec.body {
            Some(t) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(&t.render(args)).unwrap_or_default())
            }
            None => Bytes::new(),
        };
        let req = match req
            .header(
                header::USER_AGENT,
                concat!("quiver-server/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body))
        {
            Ok(r) => r,
            Err(e) => return ToolOutput::error(format!("invalid request to {url}: {e}")),
        };
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("request to {url} failed: {}", error_chain(&e)))?;
            let (parts, body) = resp.into_parts();
            let bytes = Limited::new(body, spec.max_response_bytes)
                .collect()
                .await
                .map_err(|e| format!("reading the response of {url} failed: {e}"))?
                .to_bytes();
            Ok::<_, String>((parts, bytes))
        };
        let (parts, bytes) = match tokio::time::timeout(spec.timeout, exchange).await {
            Err(_) => {
                return ToolOutput::error(format!(
                    "{} {url} timed out after {:?}",
                    spec.method, spec.timeout
                ));
            }
            Ok(Err(e)) => return ToolOutput::error(e),
            Ok(Ok(x)) => x,
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if !parts.status.is_success() {
            return ToolOutput::error(format!("{} {url} answered {}: {text}", spec.method, parts.status));
        }
        let is_json = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json") || ct.contains("+json"));
        let structured = if is_json {
            serde_json::from_slice::<Value>(&bytes)
                .ok()
                .filter(Value::is_object)
        } else {
            None
        };
        ToolOutput {
            text,
            structured,
            is_error: false,
        }
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
