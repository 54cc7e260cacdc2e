//! TLS for the Redis client ([`super::resp`]): the settings read once at start from files (the
//! CAs to trust, the name to verify, a client certificate), and the stream a connection runs
//! on, plain TCP or TLS over it.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Largest PEM file read (a CA bundle of a few hundred certificates fits).
const MAX_PEM: u64 = 1 << 20;

/// Where the TLS material of one Redis is, as the flags name it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA certificates trusted instead of the public roots.
    pub ca: Option<PathBuf>,
    /// The name the server's certificate must carry, instead of the address's host.
    pub server_name: Option<String>,
    /// PEM certificate chain presented to the server (with `client_key`).
    pub client_cert: Option<PathBuf>,
    /// PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
}

/// How connections to one Redis are secured: its rustls configuration and the name its
/// certificate is checked against.
#[derive(Clone)]
pub struct Tls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The host of `host:port` (`[v6]:port` too): what the server's certificate must name.
pub fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("the {what} file `{shown}`: {e}"))?;
    let mut out = Vec::new();
    file.take(MAX_PEM + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("the {what} file `{shown}`: {e}"))?;
    if out.len() as u64 > MAX_PEM {
        return Err(format!("the {what} file `{shown}` is over {MAX_PEM} bytes"));
    }
    Ok(out)
}

impl Tls {
    /// The TLS settings for the Redis at `addr` from `files`, read now.
    ///
    /// # Errors
    /// A file that cannot be read or holds no usable PEM (named by its path, never its
    /// content), a client certificate without its key or the other way round, or a server
    /// name that is neither a DNS name nor an IP address.
    pub fn load(addr: &str, files: &TlsFiles) -> Result<Self, String> {
        let host = files.server_name.as_deref().unwrap_or_else(|| host_of(addr));
        let name = ServerName::try_from(host.to_owned()).map_err(|_| {
            format!("`{host}` is not a DNS name or an IP address to check the certificate of Redis against")
        })?;
        let roots = match &files.ca {
            Some(path) => {
                let pem = read_pem(path, "CA")?;
                let pem = String::from_utf8(pem)
                    .map_err(|_| format!("the CA file `{}` is not PEM", path.display()))?;
                super::trust::roots_from_pem(&pem, &format_args!("the CA file `{}`", path.display()))?
            }
            None => super::trust::public_roots(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let config = match (&files.client_cert, &files.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let shown = cert.display();
                let chain = CertificateDer::pem_slice_iter(&read_pem(cert, "client certificate")?)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| format!("the client certificate file `{shown}` is not PEM"))?;
                if chain.is_empty() {
                    return Err(format!(
                        "the client certificate file `{shown}` holds no PEM certificate"
                    ));
                }
                let private = PrivateKeyDer::from_pem_slice(&read_pem(key, "client key")?).map_err(|_| {
                    format!("the client key file `{}` holds no PEM private key", key.display())
                })?;
                builder.with_client_auth_cert(chain, private).map_err(|e| {
                    format!("the client certificate `{shown}` and its key do not go together: {e}")
                })?
            }
            (Some(_), None) => return Err("a client certificate needs its key".to_owned()),
            (None, Some(_)) => return Err("a client key needs its certificate".to_owned()),
        };
        Ok(Self {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }

    /// The TLS handshake over `tcp`; the caller bounds it in time.
    ///
    /// # Errors
    /// The handshake failed: the certificate is not trusted or does not name the server, the
    /// server wants a client certificate, or the peer does not speak TLS.
    pub(super) async fn connect(&self, tcp: TcpStream) -> io::Result<Stream> {
        match self.connector.connect(self.name.clone(), tcp).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s))),
            // rustls's words name the cause (an unknown issuer, a name mismatch, an alert);
            // they hold no key material.
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("redis: TLS handshake failed: {e}"),
            )),
        }
    }
}

/// A connection's stream: plain TCP, or TLS over it (boxed: a plain one stays small).
#[derive(Debug)]
pub enum Stream {
    /// No TLS.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
#[path = "resp_tls_tests.rs"]
pub(crate) mod tests;
