//! The outbound HTTP client every part of the server shares (http tools, upstream servers,
//! token endpoints, fetched documents, OpenID discovery): pooled HTTP/1.1 and HTTP/2 over
//! rustls, a pool per TLS setting, and a guarded resolver for servers a fetched document chose.

use bytes::Bytes;
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::handlers::http::TlsRefs;
use quiver_flags::Cidr;

/// The `User-Agent` of every outbound request.
pub(crate) const USER_AGENT: &str = concat!("quiver-server/", env!("CARGO_PKG_VERSION"));

pub(crate) type Pool = Client<HttpsConnector<HttpConnector<Resolver>>, Full<Bytes>>;

/// Which addresses a call may go to, by who chose its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Guard {
    /// The configuration named the server: any address.
    Off,
    /// A document the configuration fetched chose it (an OpenAPI `servers` entry): not this
    /// host, a link-local or a metadata address ([`may_connect`]).
    Document,
    /// A third party's metadata chose it (the authorization server an upstream names, the
    /// endpoints that server's metadata names): not those, not a private or otherwise not
    /// globally reachable address ([`crate::config::egress::is_private`]: the cluster's and
    /// the company's networks), nor one of the networks the client was told to deny
    /// ([`HttpClient::deny_third_parties`]).
    ThirdParty,
}

/// Most networks [`HttpClient::deny_third_parties`] takes.
pub const MAX_DENIED: usize = 64;

impl Guard {
    /// Whether a call guarded so may go to `ip`; `denied`: networks a
    /// [`Guard::ThirdParty`] call may not go to besides the private ones.
    ///
    /// # Errors
    /// What `ip` is that it may not go to.
    pub(crate) fn allows(self, ip: std::net::IpAddr, denied: &[Cidr]) -> Result<(), &'static str> {
        match self {
            Self::Off => Ok(()),
            Self::Document => may_connect(ip),
            Self::ThirdParty if crate::config::egress::is_private(ip) => Err(
                "a private address (the cluster's or the company's network, or a range not reachable on the internet)",
            ),
            Self::ThirdParty
                if denied
                    .iter()
                    .any(|n| n.contains(ip) || n.contains(crate::config::egress::reached(ip))) =>
            {
                Err("in a network this server denies to them (--upstream-sign-in-deny-cidr)")
            }
            Self::ThirdParty => may_connect(ip),
        }
    }

    /// Checks the host of `uri` when it is a literal address: the connector connects to one
    /// without resolving it, so the guarded resolver never sees it. Names pass here (the
    /// resolver checks what they resolve to).
    ///
    /// # Errors
    /// What the address is that the call may not go to.
    pub(crate) fn literal(self, uri: &Uri, denied: &[Cidr]) -> Result<(), &'static str> {
        let host = uri.host().unwrap_or_default();
        match host.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(ip) => self.allows(ip, denied),
            Err(_) => Ok(()),
        }
    }
}

/// Resolves host names for the client. A guarded one keeps only addresses its [`Guard`]
/// allows: a name that resolves only to this host, a link-local or a metadata address (and
/// for [`Guard::ThirdParty`], a private one or one in `denied`) is not connected to.
#[derive(Clone, Debug)]
pub(crate) struct Resolver {
    guard: Guard,
    denied: std::sync::Arc<[Cidr]>,
}

type Resolved = std::io::Result<std::vec::IntoIter<std::net::SocketAddr>>;

impl tower::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<std::net::SocketAddr>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Resolved> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let (guard, denied) = (self.guard, self.denied.clone());
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<std::net::SocketAddr> = tokio::task::spawn_blocking(move || {
                std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), 0)).map(Iterator::collect)
            })
            .await
            .map_err(std::io::Error::other)??;
            if guard == Guard::Off {
                return Ok(addrs.into_iter());
            }
            let kept: Vec<_> = addrs
                .into_iter()
                .filter(|a| guard.allows(a.ip(), &denied).is_ok())
                .collect();
            if kept.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    match guard {
                        Guard::ThirdParty => {
                            "the server an upstream's metadata chose resolves only to addresses it may not \
                             choose (this host, private, link-local, cloud metadata or denied)"
                        }
                        _ => {
                            "the server a fetched document chose resolves only to addresses it may not choose \
                             (this host, link-local or cloud metadata); set `server` or `allowedOrigins`"
                        }
                    },
                ));
            }
            Ok(kept.into_iter())
        })
    }
}

/// Whether a call a fetched document chose may go to `ip`.
pub(crate) fn may_connect(ip: std::net::IpAddr) -> Result<(), &'static str> {
    if let Some(why) = crate::config::egress::refused(ip) {
        return Err(why);
    }
    if crate::config::egress::is_own(ip) {
        return Err("an address of this host");
    }
    Ok(())
}

/// Clients of distinct TLS settings (`tls:` of http tools) kept at once; more empties the cache.
const MAX_TLS_CLIENTS: usize = 32;

/// A pooled HTTP(S) client shared by every http tool, and one per distinct `tls:` setting.
#[derive(Clone, Debug)]
pub struct HttpClient {
    client: Pool,
    /// The pool of calls whose server a fetched document chose ([`HttpCall::guarded`]).
    guarded: Pool,
    /// The pool of calls whose server a third party's metadata chose ([`Guard::ThirdParty`]).
    third_party: Pool,
    /// By a hash of the PEM material: a rotated Secret makes a new client.
    tls: std::sync::Arc<std::sync::Mutex<rustc_hash::FxHashMap<u64, Pool>>>,
    /// Networks [`Guard::ThirdParty`] calls may not go to besides the private ones.
    denied: std::sync::Arc<[Cidr]>,
}

/// The connector of `guard`: the webpki roots, `https` or plain `http`.
fn connector(guard: Guard, denied: &std::sync::Arc<[Cidr]>) -> HttpsConnector<HttpConnector<Resolver>> {
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .unwrap_or_else(|e| panic!("ring supports rustls' default protocol versions: {e}"))
        .https_or_http()
        .enable_http1()
        .wrap_connector(tcp(guard, denied))
}

fn pool(connector: HttpsConnector<HttpConnector<Resolver>>) -> Pool {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(std::time::Duration::from_secs(60))
        .pool_max_idle_per_host(64)
        .build(connector)
}

fn tcp(guard: Guard, denied: &std::sync::Arc<[Cidr]>) -> HttpConnector<Resolver> {
    let denied = denied.clone();
    let mut http = HttpConnector::new_with_resolver(Resolver { guard, denied });
    http.enforce_http(false);
    http.set_nodelay(true);
    http
}

/// A rustls client config from PEM material (CA certificates, client chain and key).
fn tls_config(tls: &TlsRefs, secrets: &Value) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let roots = match &tls.ca {
        Some(r) => super::trust::roots_from_pem(crate::spec::context::value_in(secrets, r)?, r)?,
        None => super::trust::public_roots(),
    };
    let builder = builder.with_root_certificates(roots);
    match &tls.client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain =
                CertificateDer::pem_slice_iter(crate::spec::context::value_in(secrets, cert)?.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| format!("{cert} is not PEM"))?;
            if chain.is_empty() {
                return Err(format!("{cert} holds no PEM certificate"));
            }
            let private =
                PrivateKeyDer::from_pem_slice(crate::spec::context::value_in(secrets, key)?.as_bytes())
                    .map_err(|_| format!("{key} holds no PEM private key"))?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| format!("{cert} and its key do not make a client certificate: {e}"))
        }
    }
}

impl HttpClient {
    /// A client trusting the webpki root certificates.
    pub fn new() -> Self {
        let denied: std::sync::Arc<[Cidr]> = std::sync::Arc::new([]);
        Self {
            client: pool(connector(Guard::Off, &denied)),
            guarded: pool(connector(Guard::Document, &denied)),
            third_party: pool(connector(Guard::ThirdParty, &denied)),
            tls: std::sync::Arc::default(),
            denied,
        }
    }

    /// This client, its [`Guard::ThirdParty`] calls denied `nets` too (at most
    /// [`MAX_DENIED`]): the cluster's pod and service networks when they are public
    /// addresses, other networks of the company's.
    #[must_use]
    pub fn deny_third_parties(mut self, mut nets: Vec<Cidr>) -> Self {
        nets.truncate(MAX_DENIED);
        self.denied = nets.into();
        self.third_party = pool(connector(Guard::ThirdParty, &self.denied));
        // TLS clients are built again, with the list.
        self.tls = std::sync::Arc::default();
        self
    }

    /// The networks [`Guard::ThirdParty`] calls may not go to besides the private ones.
    pub(crate) fn denied(&self) -> &[Cidr] {
        &self.denied
    }

    /// The client of a `tls:` setting with the Secrets' current values (built on first use
    /// of these values).
    fn tls_client(&self, tls: &TlsRefs, secrets: &Value, guard: Guard) -> Result<Pool, String> {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        tls.hash(&mut h);
        guard.hash(&mut h);
        for r in tls.ca.iter().chain(tls.client.iter().flat_map(|(c, k)| [c, k])) {
            crate::spec::context::value_in(secrets, r)?.hash(&mut h);
        }
        let key = h.finish();
        if let Some(c) = self.tls.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(c);
        }
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(tls, secrets)?)
            .https_only()
            .enable_http1()
            .wrap_connector(tcp(guard, &self.denied));
        let client = pool(connector);
        if let Ok(mut m) = self.tls.lock() {
            if m.len() >= MAX_TLS_CLIENTS {
                m.clear();
            }
            m.insert(key, client.clone());
        }
        Ok(client)
    }

    /// The pool for a `tls:` setting (the shared one without).
    pub(crate) fn client_for(
        &self,
        tls: Option<&TlsRefs>,
        secrets: &Value,
        guard: Guard,
    ) -> Result<Pool, String> {
        match (tls, guard) {
            (None, Guard::Off) => Ok(self.client.clone()),
            (None, Guard::Document) => Ok(self.guarded.clone()),
            (None, Guard::ThirdParty) => Ok(self.third_party.clone()),
            (Some(t), _) => self.tls_client(t, secrets, guard),
        }
    }

    /// Sends `req` through the pool of `tls` and returns the response, its body unread
    /// (the caller bounds what it reads). No time limit: the caller sets one.
    ///
    /// # Errors
    /// The TLS settings are unusable, or the request failed.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
        tls: Option<&TlsRefs>,
        secrets: &Value,
    ) -> Result<http::Response<hyper::body::Incoming>, String> {
        // The URL as errors show it is only written when there is an error.
        let uri = req.uri().clone();
        let client = self
            .client_for(tls, secrets, Guard::Off)
            .map_err(|e| format!("TLS settings of {}: {e}", redacted(&uri)))?;
        client
            .request(req)
            .await
            .map_err(|e| format!("request to {} failed: {}", redacted(&uri), error_chain(&e)))
    }

    /// GETs a JSON document (e.g. an issuer's metadata or key set), within `timeout` and
    /// at most `max` bytes.
    ///
    /// # Errors
    /// The request failed, answered other than 2xx, or the body is not JSON.
    pub async fn get_json(
        &self,
        url: &str,
        timeout: std::time::Duration,
        max: usize,
        tls: Option<(&TlsRefs, &Value)>,
    ) -> Result<Value, String> {
        let client = match tls {
            None => self.client.clone(),
            Some((t, secrets)) => self.tls_client(t, secrets, Guard::Off)?,
        };
        let uri: Uri = url.parse().map_err(|_| format!("`{url}` is not a URL"))?;
        let shown = redacted(&uri);
        let req = Request::builder()
            .uri(uri)
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, USER_AGENT)
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("{shown}: {e}"))?;
        let exchange = async {
            let resp = client
                .request(req)
                .await
                .map_err(|e| format!("GET {shown} failed: {}", error_chain(&e)))?;
            if !resp.status().is_success() {
                return Err(format!("GET {shown} answered {}", resp.status()));
            }
            let bytes = Limited::new(resp.into_body(), max)
                .collect()
                .await
                .map_err(|e| format!("reading {shown}: {e}"))?
                .to_bytes();
            serde_json::from_slice(&bytes).map_err(|e| format!("{shown} is not JSON: {e}"))
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| Err(format!("GET {shown} timed out after {timeout:?}")))
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

/// A URL as messages show it: scheme, host, port and path (no userinfo, query or fragment).
pub(crate) fn redacted(uri: &Uri) -> String {
    let host = uri
        .authority()
        .map_or("", |a| a.as_str().rsplit_once('@').map_or(a.as_str(), |(_, h)| h));
    let mut s = format!("{}://{host}{}", uri.scheme_str().unwrap_or("http"), uri.path());
    if uri.query().is_some() {
        s.push_str("?…");
    }
    s
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn third_parties_are_denied_the_networks_named_in_every_spelling_and_configured_servers_are_not() {
        let denied: Vec<Cidr> = ["11.0.0.0/8", "2600:1f00::/24"]
            .into_iter()
            .map(|n| n.parse().unwrap())
            .collect();
        for ip in [
            "11.1.2.3",
            "::ffff:11.1.2.3",
            "::11.1.2.3",
            "64:ff9b::b01:203",
            "2002:b01:203::1",
            "2600:1f00::5",
        ] {
            let ip = ip.parse().unwrap();
            let e = Guard::ThirdParty.allows(ip, &denied).unwrap_err();
            assert!(e.contains("--upstream-sign-in-deny-cidr"), "{ip}: {e}");
            assert_eq!(
                Guard::ThirdParty.allows(ip, &[]),
                Ok(()),
                "{ip}: not denied without the list"
            );
            assert_eq!(
                Guard::Off.allows(ip, &denied),
                Ok(()),
                "{ip}: the configuration's choice"
            );
        }
        assert_eq!(
            Guard::ThirdParty.allows("12.0.0.1".parse().unwrap(), &denied),
            Ok(())
        );
        let uri: Uri = "http://11.0.0.9:8080/as".parse().unwrap();
        assert!(Guard::ThirdParty.literal(&uri, &denied).is_err());
        let client = HttpClient::new().deny_third_parties(vec!["0.0.0.0/0".parse().unwrap(); MAX_DENIED + 1]);
        assert_eq!(client.denied().len(), MAX_DENIED);
        // The special-purpose ranges clusters use for pods and services are private to every
        // third party, listed or not.
        for ip in ["198.18.0.10", "240.1.2.3", "192.0.0.8", "64:ff9b:1::a00:1"] {
            let e = Guard::ThirdParty.allows(ip.parse().unwrap(), &[]).unwrap_err();
            assert!(e.starts_with("a private address"), "{ip}: {e}");
        }
    }
}
