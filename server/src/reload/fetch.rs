//! Fetching the `url` of OpenAPI sources when a config is loaded: https (http only when
//! allowed), the CA from a file, Secret or ConfigMap, a bearer token from a file and headers
//! from Secrets, a time limit, at most
//! [`MAX_OPENAPI_BYTES`], redirects refused. The last answer of each URL is kept with its
//! ETag so a refresh sends `If-None-Match` and a `304` reuses it. A fetch that fails is a
//! problem of the config: the reload is refused and the serving registry stays.

use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustc_hash::FxHashMap;

use serde_json::Value;

use crate::config::openapi::{FetchCredentials, FetchSpec, MAX_OPENAPI_BYTES, OpenApiSpec};
use crate::config::{ConfigError, Problem};
use crate::secrets::value_in;

/// Largest CA or token file read, in bytes.
const MAX_CREDENTIAL_FILE: u64 = 1 << 20;
/// URLs whose last answer is kept; more empties the cache.
const MAX_CACHED: usize = 64;

/// The last answer of a URL: its validator and text.
struct Cached {
    etag: Option<String>,
    last_modified: Option<String>,
    text: String,
}

static CACHE: Mutex<Option<FxHashMap<String, Cached>>> = Mutex::new(None);

/// One fetch: its URL, settings, and credentials compiled (the Secrets' values at hand).
struct Fetch<'a> {
    url: String,
    spec: FetchSpec,
    creds: FetchCredentials,
    secrets: &'a Value,
}

/// The Secrets and ConfigMaps the fetches of `specs` read (unchecked settings read none),
/// and the ConfigMap keys that hold documents.
pub fn fetch_refs(specs: &[OpenApiSpec]) -> Vec<crate::config::SecretRef> {
    let fetched = specs
        .iter()
        .filter(|s| s.url.is_some() && s.document.is_none() && s.file.is_none())
        .filter_map(|s| s.fetch.as_ref())
        .flat_map(|f| f.credentials("", &mut Default::default()).refs);
    let kept = specs
        .iter()
        .filter_map(|s| s.config_map.as_ref())
        .map(|c| c.store_ref());
    fetched.chain(kept).collect()
}

/// Puts the document of every source with a `configMap` in `document` (from `secrets`,
/// the store's snapshot, which holds the ConfigMaps the server watches); a key not read
/// (yet) is a problem of the source, and the load is tried again when it arrives.
fn read_config_maps(specs: &mut [OpenApiSpec], secrets: &Value, problems: &mut Vec<Problem>) {
    for (i, s) in specs.iter_mut().enumerate() {
        let Some(cm) = &s.config_map else { continue };
        if s.document.is_some() || s.file.is_some() || s.url.is_some() {
            continue;
        }
        match value_in(secrets, &cm.store_ref()) {
            Ok(text) => {
                s.document = Some(text.to_owned());
                s.config_map = None;
                s.fetched = true;
            }
            Err(_) => problems.push(problem(
                &format!("openapi[{i}].configMap"),
                format!(
                    "ConfigMap `{}` key `{}` is not available (yet): a missing ConfigMap or key, one over 1 MiB, or not text",
                    cm.name, cm.key
                ),
            )),
        }
    }
}

/// Fetches the document of every source with a `url` (in parallel) and puts it in
/// `document`, clearing `url` and `fetch`; the shortest `fetch.refresh` of them is returned.
/// `secrets` is what `{{secret.NAME.KEY}}` reads (the store's snapshot).
///
/// # Errors
/// Every source whose fetch failed, named `openapi[i].url`.
pub fn fetch_documents(specs: &mut [OpenApiSpec], secrets: &Value) -> Result<Option<Duration>, ConfigError> {
    let mut problems = Vec::new();
    read_config_maps(specs, secrets, &mut problems);
    let wanted: Vec<(usize, Fetch<'_>)> = specs
        .iter()
        .enumerate()
        .filter(|(_, s)| s.document.is_none() && s.file.is_none())
        .filter_map(|(i, s)| {
            let spec = s.fetch.clone().unwrap_or_default();
            let creds = spec.credentials("", &mut Default::default());
            Some((
                i,
                Fetch {
                    url: s.url.clone()?,
                    spec,
                    creds,
                    secrets,
                },
            ))
        })
        .collect();
    let refresh = wanted.iter().filter_map(|(_, f)| f.spec.refresh()).min();
    if wanted.is_empty() {
        return if problems.is_empty() {
            Ok(refresh)
        } else {
            Err(error(problems))
        };
    }
    // A thread of its own with its own runtime: loading runs on a blocking thread of the
    // server's runtime, in `check`, or in a test, and must not block a runtime worker.
    let results = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(rt.block_on(futures_util::future::join_all(
                    wanted.iter().map(|(_, f)| fetch(f)),
                )))
            })
            .join()
            .unwrap_or_else(|_| Err("the fetch thread failed".to_owned()))
    });
    let results = results.map_err(|e| error(vec![problem("openapi", e)]))?;
    for ((i, _), r) in wanted.iter().zip(results) {
        match r {
            Ok(text) => {
                // Compiled like an inline document from here on (the settings were used).
                specs[*i].document = Some(text);
                specs[*i].fetched_from = specs[*i].url.clone();
                specs[*i].fetched = true;
                specs[*i].url = None;
                specs[*i].fetch = None;
            }
            Err(e) => problems.push(problem(&format!("openapi[{i}].url"), e)),
        }
    }
    if problems.is_empty() {
        Ok(refresh)
    } else {
        Err(error(problems))
    }
}

fn problem(path: &str, message: String) -> Problem {
    Problem {
        path: path.to_owned(),
        message,
    }
}

fn error(problems: Vec<Problem>) -> ConfigError {
    ConfigError { problems }
}

/// A URL as messages show it: without its query (it may hold a key).
fn shown(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or(url)
}

/// Reads a small file (a CA bundle or a token).
fn read_small(path: &str, what: &str) -> Result<String, String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CREDENTIAL_FILE + 1).read_to_string(&mut text))
        .map_err(|e| format!("the {what} file `{path}` could not be read: {}", e.kind()))?;
    if text.len() as u64 > MAX_CREDENTIAL_FILE {
        return Err(format!(
            "the {what} file `{path}` is over {MAX_CREDENTIAL_FILE} bytes"
        ));
    }
    Ok(text)
}

/// The TLS settings: the CA file's, Secret's or ConfigMap's certificates, or the public roots.
fn tls_config(f: &Fetch<'_>) -> Result<rustls::ClientConfig, String> {
    use crate::net::trust::{public_roots, roots_from_pem};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let roots = match (&f.spec.ca_file, &f.creds.ca) {
        (Some(path), _) => roots_from_pem(&read_small(path, "CA")?, &format_args!("the CA file `{path}`"))?,
        (None, Some(r)) => roots_from_pem(value_in(f.secrets, r)?, r)?,
        (None, None) => public_roots(),
    };
    Ok(builder.with_root_certificates(roots).with_no_client_auth())
}

/// The request of a fetch: the token, the headers, and the cached answer's validators.
fn request(f: &Fetch<'_>) -> Result<Request<Empty<Bytes>>, String> {
    let url = f.url.as_str();
    let uri: http::Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
    let mut req = Request::get(uri)
        .header(header::ACCEPT, "application/json, application/yaml;q=0.9")
        .header(header::USER_AGENT, crate::net::http::USER_AGENT);
    let scope = crate::secrets::WithSecrets {
        args: &Value::Null,
        secrets: f.secrets,
    };
    for (name, t) in &f.creds.headers {
        let value = t
            .render(&scope)
            .map_err(|_| format!("fetch.headers.{name} is too large"))?;
        let value = http::HeaderValue::from_str(&value)
            .map_err(|_| format!("fetch.headers.{name} holds characters a header cannot"))?;
        req = req.header(name.as_str(), value);
    }
    if let Some(path) = &f.spec.token_file {
        let token = read_small(path, "token")?;
        let value = http::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| format!("the token file `{path}` holds characters a header cannot"))?;
        req = req.header(header::AUTHORIZATION, value);
    }
    if let Ok(cache) = CACHE.lock()
        && let Some(c) = cache.as_ref().and_then(|m| m.get(url))
    {
        if let Some(v) = c
            .etag
            .as_deref()
            .and_then(|e| http::HeaderValue::from_str(e).ok())
        {
            req = req.header(header::IF_NONE_MATCH, v);
        }
        if let Some(v) = c
            .last_modified
            .as_deref()
            .and_then(|e| http::HeaderValue::from_str(e).ok())
        {
            req = req.header(header::IF_MODIFIED_SINCE, v);
        }
    }
    req.body(Empty::new()).map_err(|e| e.to_string())
}

/// Fetches one document within its time limit.
async fn fetch(f: &Fetch<'_>) -> Result<String, String> {
    let timeout = f.spec.timeout();
    tokio::time::timeout(timeout, exchange(f))
        .await
        .unwrap_or_else(|_| Err(format!("GET {} timed out after {timeout:?}", shown(&f.url))))
}

async fn exchange(f: &Fetch<'_>) -> Result<String, String> {
    let url = f.url.as_str();
    let https = url.starts_with("https://");
    let plain = f.spec.allow_http && url.starts_with("http://");
    if !(https || plain) {
        return Err("must be an `https` URL".to_owned());
    }
    // A fetch waits for its Secrets: the reload is retried until the store has read them.
    if let Some(r) = f.creds.refs.iter().find(|r| value_in(f.secrets, r).is_err()) {
        return Err(format!("{r}, which the fetch reads, is not available (yet)"));
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls_config(f)?);
    let connector = if https {
        builder.https_only()
    } else {
        builder.https_or_http()
    }
    .enable_http1()
    .wrap_connector(tcp);
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connector);
    let resp = client
        .request(request(f)?)
        .await
        .map_err(|e| format!("GET {} failed: {}", shown(url), chain(&e)))?;
    let status = resp.status();
    if status == StatusCode::NOT_MODIFIED
        && let Some(text) = CACHE
            .lock()
            .ok()
            .and_then(|c| c.as_ref()?.get(url).map(|c| c.text.clone()))
    {
        return Ok(text);
    }
    if status.is_redirection() {
        return Err(format!(
            "GET {} answered {status}: redirects are not followed; set `url` to the final location",
            shown(url)
        ));
    }
    if !status.is_success() {
        return Err(format!("GET {} answered {status}", shown(url)));
    }
    let validator = |h: header::HeaderName| {
        resp.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 256)
            .map(str::to_owned)
    };
    let (etag, last_modified) = (validator(header::ETAG), validator(header::LAST_MODIFIED));
    if resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_OPENAPI_BYTES as u64)
    {
        return Err(format!(
            "GET {}: the document is over {MAX_OPENAPI_BYTES} bytes",
            shown(url)
        ));
    }
    let body = Limited::new(resp.into_body(), MAX_OPENAPI_BYTES)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                format!(
                    "GET {}: the document is over {MAX_OPENAPI_BYTES} bytes",
                    shown(url)
                )
            } else {
                format!("GET {}: reading the document: {e}", shown(url))
            }
        })?
        .to_bytes();
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| format!("GET {}: the document is not UTF-8", shown(url)))?;
    if (etag.is_some() || last_modified.is_some())
        && let Ok(mut cache) = CACHE.lock()
    {
        let map = cache.get_or_insert_with(FxHashMap::default);
        if map.len() >= MAX_CACHED && !map.contains_key(url) {
            map.clear();
        }
        map.insert(
            url.to_owned(),
            Cached {
                etag,
                last_modified,
                text: text.clone(),
            },
        );
    }
    Ok(text)
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
#[path = "fetch_tests.rs"]
mod tests;
