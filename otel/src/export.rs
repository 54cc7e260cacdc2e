//! The export side: the tracer provider, a bounded queue that drops (and counts) spans when
//! full instead of blocking a request, and the OTLP/HTTP exporter on the server's own hyper
//! client, run as one task on the server's Tokio runtime.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::Context;
use opentelemetry_http::{HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};

use super::config::Resolved;

/// Spans sent in one export request at most (and at most the queue's bound: a hung
/// collector holds one batch and a full queue, never more).
const MAX_BATCH: usize = 512;
/// How long a finished span waits for companions before it is sent.
const BATCH_DELAY: Duration = Duration::from_millis(500);
/// Time one export request (connect, send, answer) may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of a collector's answer read at most.
const MAX_ANSWER: usize = 64 << 10;

/// The provider: the sampler, the resource, and the queue feeding the exporter task.
pub(super) fn provider(
    cfg: &Resolved,
    dropped: Counter,
    service: &'static str,
) -> anyhow::Result<(SdkTracerProvider, Flusher)> {
    let resource = resource(service);
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(Client::new())
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(cfg.endpoint.to_string())
        .build()
        .map_err(|e| anyhow::anyhow!("the OTLP exporter: {e}"))?;
    exporter.set_resource(&resource);
    let (tx, rx) = mpsc::channel(cfg.queue);
    tokio::spawn(export_loop(exporter, rx, cfg.queue.min(MAX_BATCH)));
    let flusher = Flusher(tx.clone());
    let mut b = SdkTracerProvider::builder()
        .with_span_processor(Queue { tx, dropped })
        .with_id_generator(super::sample::Ids)
        .with_resource(resource);
    if let Some(r) = cfg.ratio {
        b = b.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r))));
    }
    Ok((b.build(), flusher))
}

/// `service.name` is `service` unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES name
/// one; `service.version` is this build's.
fn resource(service: &'static str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let b = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if named {
        b.build()
    } else {
        b.with_service_name(service).build()
    }
}

/// What the queue carries.
enum Item {
    Span(Box<SpanData>),
    /// Export what is queued, then answer.
    Flush(oneshot::Sender<()>),
}

/// The span processor: hands each finished span to the export task, or drops it (counted)
/// when the queue is full. Never blocks, never allocates beyond the span itself.
#[derive(Debug)]
struct Queue {
    tx: mpsc::Sender<Item>,
    dropped: Counter,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.tx.try_send(Item::Span(Box::new(span))).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Exports what is queued (at exit), waiting at most `timeout`.
pub(super) async fn flush(tx: &Flusher, timeout: Duration) {
    let (done, wait) = oneshot::channel();
    if tx.0.send(Item::Flush(done)).await.is_ok() {
        let _ = tokio::time::timeout(timeout, wait).await;
    }
}

/// A way to ask the export task to export what it holds.
#[derive(Debug)]
pub(super) struct Flusher(mpsc::Sender<Item>);

/// Batches spans (up to `max`, or what arrived within [`BATCH_DELAY`] of the first)
/// and exports each batch; an export that fails is logged and its spans are gone.
async fn export_loop(exporter: opentelemetry_otlp::SpanExporter, mut rx: mpsc::Receiver<Item>, max: usize) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(max);
    let mut failures = 0u64;
    loop {
        let mut flushed = None;
        match rx.recv().await {
            None => break,
            Some(Item::Span(s)) => batch.push(*s),
            Some(Item::Flush(done)) => flushed = Some(done),
        }
        let until = tokio::time::Instant::now() + BATCH_DELAY;
        while flushed.is_none() && batch.len() < max {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(Item::Span(s))) => batch.push(*s),
                Ok(Some(Item::Flush(done))) => flushed = Some(done),
                Ok(None) | Err(_) => break,
            }
        }
        if !batch.is_empty() {
            let spans = std::mem::replace(&mut batch, Vec::with_capacity(max));
            let n = spans.len();
            if let Err(e) = exporter.export(spans).await {
                failures += 1;
                // The first failure, then one in a hundred: a collector that is down must
                // not flood the log.
                if failures % 100 == 1 {
                    tracing::warn!(spans = n, failures, "exporting spans failed: {e}");
                }
            }
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}

/// The exporter's HTTP client: hyper with rustls (the webpki roots), bounded in time and
/// in the bytes of the answer it reads.
#[derive(Debug)]
struct Client(hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>);

impl Client {
    fn new() -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(EXPORT_TIMEOUT));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .unwrap_or_else(|e| panic!("ring supports rustls' default protocol versions: {e}"))
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        Self(
            hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(2)
                .build(connector),
        )
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let exchange = async {
            let resp = self
                .0
                .request(Request::from_parts(parts, Full::new(body)))
                .await?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        tokio::time::timeout(EXPORT_TIMEOUT, exchange)
            .await
            .map_err(|_| HttpError::from("the OTLP export timed out"))?
    }
}

impl opentelemetry_http::HttpClient for Client {
    fn send_bytes<'a, 'b>(
        &'a self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'b>>
    where
        'a: 'b,
        Self: 'b,
    {
        Box::pin(self.send(request))
    }
}
