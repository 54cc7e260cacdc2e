//! TLS and ACL users of the Redis client against a real redis-server (Debian's, built with
//! TLS: `QUIVER_REDIS_SERVER`, else scripts/redis.sh) with throwaway certificates made by the
//! openssl command: a trusted CA, another CA, a server certificate for `localhost` and
//! `127.0.0.1`, a client certificate.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::*;
use crate::net::resp::{Client, Endpoint, Options, Reply};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the openssl command");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Throwaway certificates (EC P-256, valid one day) in a temporary directory.
pub(crate) struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (key, crt, subj) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=quiver test {ca}"),
            );
            let mut args = vec![
                "req", "-x509", "-days", "1", "-subj", &subj, "-keyout", &key, "-out", &crt,
            ];
            args.extend(ec);
            openssl(d, &args);
        }
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        std::fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (n, (leaf, serial)) in [("server", "1001"), ("client", "1002")].into_iter().enumerate() {
            let (key, csr, crt, ext) = (
                format!("{leaf}.key"),
                format!("{leaf}.csr"),
                format!("{leaf}.crt"),
                format!("{leaf}.ext"),
            );
            let subj = format!("/CN=quiver-{leaf}-{n}");
            let mut args = vec!["req", "-new", "-subj", &subj, "-keyout", &key, "-out", &csr];
            args.extend(ec);
            openssl(d, &args);
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-set_serial",
                    serial,
                    "-days",
                    "1",
                    "-extfile",
                    &ext,
                    "-out",
                    &crt,
                ],
            );
        }
        Self { dir }
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Client TLS settings trusting `ca` (`ca.crt` or `other-ca.crt`), with the client
    /// certificate or not.
    pub(crate) fn tls(&self, addr: &str, ca: &str, client: bool) -> Tls {
        Tls::load(
            addr,
            &TlsFiles {
                ca: Some(self.path(ca)),
                server_name: None,
                client_cert: client.then(|| self.path("client.crt")),
                client_key: client.then(|| self.path("client.key")),
            },
        )
        .unwrap()
    }
}

/// A redis-server speaking TLS only, on loopback, client certificates optional (verified
/// against the trusted CA when presented).
pub(crate) struct TlsRedis {
    child: std::process::Child,
    pub(crate) port: u16,
    pub(crate) pki: Pki,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn redis_binary() -> String {
    std::env::var("QUIVER_REDIS_SERVER").unwrap_or_else(|_| {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/redis.sh");
        let out = Command::new(script).output().expect("scripts/redis.sh");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_owned()
    })
}

impl TlsRedis {
    pub(crate) async fn start() -> Self {
        let pki = Pki::new();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let p = |n: &str| pki.path(n).to_string_lossy().into_owned();
        let child = Command::new(redis_binary())
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                &p("server.crt"),
                "--tls-key-file",
                &p("server.key"),
            ])
            .args([
                "--tls-ca-cert-file",
                &p("ca.crt"),
                "--tls-auth-clients",
                "optional",
            ])
            .args(["--save", "", "--appendonly", "no"])
            .current_dir(pki.dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        let r = Self { child, port, pki };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("redis-server did not start");
    }

    pub(crate) fn addr(&self) -> String {
        format!("localhost:{}", self.port)
    }

    /// An endpoint as `user` (`None`: the default user, no password) trusting `ca`.
    pub(crate) fn endpoint(&self, ca: &str, client: bool, user: Option<(&str, &str)>) -> Endpoint {
        Endpoint {
            addr: self.addr(),
            username: user.map(|(u, _)| u.to_owned()),
            password: user.map(|(_, p)| p.to_owned()),
            tls: Some(std::sync::Arc::new(self.pki.tls(&self.addr(), ca, client))),
        }
    }

    /// Runs `args` as the default user (every command), over TLS with the client certificate.
    pub(crate) async fn admin(&self, args: &[&str]) -> Reply {
        let c = client(self.endpoint("ca.crt", true, None), Duration::from_secs(5));
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        c.call(&args).await.unwrap()
    }
}

fn client(endpoint: Endpoint, timeout: Duration) -> Client {
    Client::new(Options {
        endpoint,
        timeout,
        max_connections: 2,
        max_reply: 4096,
    })
}

#[test]
fn the_certificate_is_checked_for_the_host_of_the_address() {
    assert_eq!(host_of("redis.infra.svc:6379"), "redis.infra.svc");
    assert_eq!(host_of("10.0.0.7:6380"), "10.0.0.7");
    assert_eq!(host_of("[fd00::7]:6380"), "fd00::7");
    assert_eq!(host_of("nohost"), "nohost");
}

#[test]
fn unusable_tls_files_are_named_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hunter2-not-a-certificate").unwrap();
    let load = |files: TlsFiles| Tls::load("r:6379", &files).unwrap_err();
    let e = load(TlsFiles {
        ca: Some(junk.clone()),
        ..TlsFiles::default()
    });
    assert!(
        e.contains("junk.pem` holds no PEM certificate") && !e.contains("hunter2"),
        "{e}"
    );
    let e = load(TlsFiles {
        ca: Some(dir.path().join("absent.pem")),
        ..TlsFiles::default()
    });
    assert!(e.starts_with("the CA file `") && e.contains("absent.pem"), "{e}");
    let e = load(TlsFiles {
        client_cert: Some(junk.clone()),
        client_key: Some(junk.clone()),
        ..TlsFiles::default()
    });
    assert!(
        e.contains("holds no PEM certificate") && !e.contains("hunter2"),
        "{e}"
    );
    let e = load(TlsFiles {
        client_key: Some(junk),
        ..TlsFiles::default()
    });
    assert_eq!(e, "a client key needs its certificate");
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'a'; (MAX_PEM + 1) as usize]).unwrap();
    let e = load(TlsFiles {
        ca: Some(big),
        ..TlsFiles::default()
    });
    assert!(e.contains("is over"), "{e}");
    // No file at all: the public roots, the address's host or the name given.
    assert!(Tls::load("10.1.2.3:6379", &TlsFiles::default()).is_ok());
    let t = Tls::load(
        "10.1.2.3:6379",
        &TlsFiles {
            server_name: Some("cache.example".into()),
            ..TlsFiles::default()
        },
    )
    .unwrap();
    assert!(format!("{t:?}").contains("cache.example"));
}

#[tokio::test]
async fn tls_with_the_right_ca_answers_and_another_ca_is_refused() {
    let r = TlsRedis::start().await;
    let ok = client(r.endpoint("ca.crt", false, None), Duration::from_secs(5));
    assert_eq!(ok.call(&[b"PING"]).await.unwrap(), Reply::Status("PONG".into()));
    // The pooled connection is used again.
    assert_eq!(ok.call(&[b"PING"]).await.unwrap(), Reply::Status("PONG".into()));

    let wrong = client(r.endpoint("other-ca.crt", false, None), Duration::from_secs(5));
    let e = wrong.call(&[b"PING"]).await.unwrap_err();
    assert!(
        e.to_string().contains("TLS handshake failed") && e.to_string().contains("UnknownIssuer"),
        "{e}"
    );

    // The certificate names localhost and 127.0.0.1, not another name given for it.
    let mut misnamed = r.endpoint("ca.crt", false, None);
    misnamed.tls = Some(std::sync::Arc::new(
        Tls::load(
            &r.addr(),
            &TlsFiles {
                ca: Some(r.pki.path("ca.crt")),
                server_name: Some("redis.elsewhere".into()),
                ..TlsFiles::default()
            },
        )
        .unwrap(),
    ));
    let e = client(misnamed, Duration::from_secs(5))
        .call(&[b"PING"])
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("not valid for name \"redis.elsewhere\""),
        "{e}"
    );

    // Plain TCP to a TLS port gets no answer it can read.
    let plain = client(Endpoint::plain(r.addr()), Duration::from_millis(500));
    assert!(plain.call(&[b"PING"]).await.is_err());
}

#[tokio::test]
async fn a_required_client_certificate_is_presented() {
    let r = TlsRedis::start().await;
    assert_eq!(
        r.admin(&["CONFIG", "SET", "tls-auth-clients", "yes"]).await,
        Reply::Status("OK".into())
    );
    let with = client(r.endpoint("ca.crt", true, None), Duration::from_secs(5));
    assert_eq!(with.call(&[b"PING"]).await.unwrap(), Reply::Status("PONG".into()));
    // Without one, Redis ends the handshake (TLS 1.3: the client learns it on its first read).
    let without = client(r.endpoint("ca.crt", false, None), Duration::from_secs(5));
    let e = without.call(&[b"PING"]).await.unwrap_err();
    assert_ne!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
}

#[tokio::test]
async fn an_acl_user_authenticates_with_its_name_and_a_wrong_password_is_refused() {
    let r = TlsRedis::start().await;
    let set = r
        .admin(&[
            "ACL",
            "SETUSER",
            "quiver",
            "on",
            ">right-pw",
            "~quiver:*",
            "resetchannels",
            "-@all",
            "+get",
            "+set",
        ])
        .await;
    assert_eq!(set, Reply::Status("OK".into()));
    let user = client(
        r.endpoint("ca.crt", false, Some(("quiver", "right-pw"))),
        Duration::from_secs(5),
    );
    assert_eq!(
        user.call(&[b"SET", b"quiver:k", b"v"]).await.unwrap(),
        Reply::Status("OK".into())
    );
    assert_eq!(
        user.call(&[b"GET", b"quiver:k"]).await.unwrap(),
        Reply::Bulk(b"v".to_vec())
    );
    // Authenticated as that user: its ACL applies.
    match user.call(&[b"GET", b"other:k"]).await.unwrap() {
        Reply::Error(e) => assert!(e.starts_with("NOPERM"), "{e}"),
        other => panic!("{other:?}"),
    }

    let wrong = client(
        r.endpoint("ca.crt", false, Some(("quiver", "wrong-pw"))),
        Duration::from_secs(5),
    );
    let e = wrong.call(&[b"PING"]).await.unwrap_err().to_string();
    assert!(e.starts_with("redis: AUTH refused: WRONGPASS"), "{e}");
    assert!(!e.contains("wrong-pw"), "{e}");
}

#[tokio::test]
async fn a_listener_that_never_answers_the_handshake_is_a_timeout() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        // Accepts, reads the ClientHello, never answers.
        let (s, _) = l.accept().await.unwrap();
        std::future::pending::<()>().await;
        drop(s);
    });
    let tls = Tls::load(&addr, &TlsFiles::default()).unwrap();
    let c = client(
        Endpoint {
            tls: Some(std::sync::Arc::new(tls)),
            ..Endpoint::plain(addr)
        },
        Duration::from_millis(200),
    );
    let e = c.call(&[b"PING"]).await.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    held.abort();
}
