//! The fetch against a local HTTP responder that records each request and answers from a
//! script; the registry stays when a fetch fails.

use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::io::AsyncWriteExt;

use super::fetch_documents;
use crate::config::openapi::OpenApiSpec;
use crate::dispatch::Server;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::Reloader;

/// The answers, in order (the last one repeats), and the request heads received.
#[derive(Clone, Default)]
struct Script {
    answers: Arc<Mutex<Vec<Vec<u8>>>>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Script {
    fn answer(&self, raw: Vec<u8>) {
        self.answers.lock().unwrap().push(raw);
    }
    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn ok(body: &str, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A responder on 127.0.0.1 on its own thread and runtime; its base URL.
fn responder(script: &Script) -> String {
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let script = script.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let head = crate::net::read_head(&mut s).await.unwrap_or_default();
                script.seen.lock().unwrap().push(head.to_lowercase());
                let answer = {
                    let mut a = script.answers.lock().unwrap();
                    if a.len() > 1 {
                        a.remove(0)
                    } else {
                        a.first().cloned().unwrap_or_default()
                    }
                };
                if answer.is_empty() {
                    // Never answers: the fetch's time limit ends it.
                    tokio::spawn(async move {
                        let _held = s;
                        std::future::pending::<()>().await;
                    });
                    continue;
                }
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            }
        });
    });
    format!("http://{addr}")
}

/// A document of one operation; its server is a documentation address (a fetched document
/// may not choose this host, and no test calls it).
fn doc(op: &str) -> String {
    json!({"openapi": "3.0.3", "servers": [{"url": "http://192.0.2.1:9"}], "paths": {"/x": {"get": {"operationId": op, "responses": {}}}}}).to_string()
}

fn source(url: &str, fetch: serde_json::Value) -> OpenApiSpec {
    serde_json::from_value(json!({"name": "api", "url": url, "fetch": fetch})).unwrap()
}

fn fetched(url: &str, fetch: serde_json::Value) -> Result<String, String> {
    let mut specs = vec![source(url, fetch)];
    match fetch_documents(&mut specs, &serde_json::Value::Null) {
        Ok(_) => Ok(specs[0].document.clone().unwrap()),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_document_is_fetched_with_the_token_and_revalidated_with_its_etag() {
    let script = Script::default();
    script.answer(ok(&doc("first"), "etag: \"v1\"\r\n"));
    script.answer(b"HTTP/1.1 304 Not Modified\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec());
    let base = responder(&script);
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "abc.def\n").unwrap();
    let url = format!("{base}/openapi/v3/api/v1?timeout=32s");
    let settings = json!({"allowHttp": true, "tokenFile": token, "timeout": "5s", "refresh": "30s"});
    let mut specs = vec![source(&url, settings.clone())];
    let refresh = fetch_documents(&mut specs, &serde_json::Value::Null).unwrap();
    assert_eq!(refresh, Some(std::time::Duration::from_secs(30)));
    assert_eq!(specs[0].document.as_deref(), Some(doc("first").as_str()));
    assert_eq!(specs[0].url, None);
    // The second fetch sends the ETag and gets the kept text back from a 304.
    assert_eq!(fetched(&url, settings).unwrap(), doc("first"));
    let seen = script.seen();
    assert!(
        seen[0].starts_with("get /openapi/v3/api/v1?timeout=32s http/1.1"),
        "{seen:?}"
    );
    assert!(seen[0].contains("authorization: bearer abc.def\r\n"), "{seen:?}");
    assert!(!seen[0].contains("if-none-match"), "{seen:?}");
    assert!(seen[1].contains("if-none-match: \"v1\"\r\n"), "{seen:?}");
}

#[test]
fn bad_answers_and_settings_are_refused_naming_the_source() {
    let script = Script::default();
    script.answer(b"HTTP/1.1 302 Found\r\nlocation: http://127.0.0.1:1/elsewhere\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec());
    script.answer(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec());
    script.answer(
        format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            17 << 20
        )
        .into_bytes(),
    );
    let mut big = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_vec();
    big.extend(std::iter::repeat_n(b' ', (16 << 20) + 10));
    script.answer(big);
    script.answer(Vec::new());
    let base = responder(&script);
    let http = json!({"allowHttp": true, "timeout": "20s"});
    let cases = [
        (http.clone(), "redirects are not followed"),
        (http.clone(), "answered 404 Not Found"),
        (http.clone(), "the document is over 16777216 bytes"),
        (http.clone(), "the document is over 16777216 bytes"),
        (
            json!({"allowHttp": true, "timeout": "300ms"}),
            "timed out after 300ms",
        ),
        (json!({}), "must be an `https` URL"),
        (
            json!({"allowHttp": true, "tokenFile": "/nonexistent/token"}),
            "the token file `/nonexistent/token` could not be read",
        ),
    ];
    for (settings, wanted) in cases {
        let e = fetched(&format!("{base}/doc"), settings).unwrap_err();
        assert!(
            e.contains("openapi[0].url") && e.contains(wanted),
            "wanted {wanted:?} in {e}"
        );
    }
    let e = fetched("https://127.0.0.1:1/doc", json!({"caFile": "/etc/hostname"})).unwrap_err();
    assert!(e.contains("holds no PEM certificate"), "{e}");
}

#[test]
fn a_failed_fetch_keeps_the_serving_tools_and_a_changed_document_swaps_them() {
    let script = Script::default();
    script.answer(ok(&doc("first"), ""));
    script.answer(
        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
    );
    script.answer(ok(&doc("second"), ""));
    let base = responder(&script);
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    let reloader = Reloader::new(server.clone());
    let config = format!("openapi:\n  - {{name: api, url: '{base}/doc', fetch: {{allowHttp: true}}}}\n");
    reloader
        .apply(&[("t.yaml".into(), config)])
        .unwrap_or_else(|e| panic!("{e}"));
    let names = || -> Vec<String> {
        server
            .registry
            .load_full()
            .tools
            .iter()
            .map(|t| t.def.name.clone())
            .collect()
    };
    assert_eq!(names(), ["first"]);
    let e = reloader.refresh().unwrap_err().to_string();
    assert!(e.contains("openapi[0].url") && e.contains("500"), "{e}");
    assert_eq!(names(), ["first"]);
    reloader.refresh().unwrap();
    assert_eq!(names(), ["second"]);
}

#[test]
fn sources_refused_for_a_failed_fetch_are_tried_again() {
    let script = Script::default();
    script.answer(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_vec(),
    );
    script.answer(ok(&doc("later"), ""));
    let base = responder(&script);
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    let reloader = Reloader::new(server.clone());
    let config = format!("openapi:\n  - {{name: api, url: '{base}/doc', fetch: {{allowHttp: true}}}}\n");
    assert!(reloader.apply(&[("t.yaml".into(), config)]).is_err());
    assert!(!server.registry.is_ready());
    assert!(matches!(reloader.retry_unfetched(), Some(Ok(_))));
    assert!(server.registry.is_ready());
    assert_eq!(server.registry.load_full().tools[0].def.name, "later");
    // Nothing is left to try; an invalid config is not retried.
    assert!(reloader.retry_unfetched().is_none());
    assert!(
        reloader
            .apply(&[("t.yaml".into(), "tools: [{name: 'bad name'}]".into())])
            .is_err()
    );
    assert!(reloader.retry_unfetched().is_none());
}

#[test]
fn a_fetch_waits_for_the_secrets_its_headers_and_ca_read() {
    use crate::secrets::Presence;
    let script = Script::default();
    script.answer(ok(&doc("keyed"), ""));
    let base = responder(&script);
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    let secrets = server.exec.secrets.clone();
    secrets.set_has_source();
    let reloader = Reloader::new(server.clone());
    let config = format!(
        "openapi:\n  - {{name: api, url: '{base}/doc', fetch: {{allowHttp: true, headers: {{X-Api-Key: 'k-{{{{secret.docs.key}}}}'}}}}}}\n"
    );
    // The Secret is not read yet: the fetch is refused, and the store now wants it.
    let e = reloader
        .apply(&[("t.yaml".into(), config)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("openapi[0].url") && e.contains("secret `docs` key `key`") && e.contains("not available"),
        "{e}"
    );
    assert!(script.seen().is_empty(), "nothing is sent without the Secret");
    assert!(secrets.wanted().borrow().contains("docs"));
    secrets.set(
        "docs",
        Some(vec![("key".into(), b"s3cret".to_vec())]),
        Presence::Loaded,
    );
    assert!(matches!(reloader.retry_unfetched(), Some(Ok(_))));
    assert_eq!(server.registry.load_full().tools[0].def.name, "keyed");
    assert!(
        script.seen()[0].contains("x-api-key: k-s3cret\r\n"),
        "{:?}",
        script.seen()
    );
    // Still wanted once serving: a refresh reads it again.
    assert!(secrets.wanted().borrow().contains("docs"));

    // A CA Secret that holds no certificate is named (never shown).
    let mut specs = vec![source("https://127.0.0.1:1/doc", json!({"caSecret": "docs"}))];
    let values = json!({"docs": {"ca.crt": "not a certificate"}});
    let e = fetch_documents(&mut specs, &values).unwrap_err().to_string();
    assert!(
        e.contains("secret `docs` key `ca.crt` holds no PEM certificate"),
        "{e}"
    );
    assert!(!e.contains("not a certificate"), "{e}");
}

/// A document kept in a ConfigMap: the server waits for the key, serves its operations as
/// soon as the ConfigMap arrives, and swaps them when it is edited; a broken edit keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_in_a_config_map_is_served_when_it_arrives_and_follows_its_edits() {
    use crate::secrets::Presence;
    let metrics = Metrics::new("test", "system");
    let server = Server::new(Registry::new(&metrics), metrics);
    let secrets = server.exec.secrets.clone();
    secrets.set_has_source();
    let reloader = Reloader::new(server.clone());
    reloader.follow_openapi();
    let config = "openapi:\n  - {name: api, configMap: {name: api-doc, key: openapi.json}}\n";
    let e = reloader
        .apply(&[("t.yaml".into(), config.into())])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("openapi[0].configMap")
            && e.contains("ConfigMap `api-doc` key `openapi.json` is not available"),
        "{e}"
    );
    assert!(
        secrets.wanted().borrow().contains("configmap:api-doc"),
        "the server watches it"
    );
    let names = || -> Vec<String> {
        let r = server.registry.load_full();
        r.tools.iter().map(|t| t.def.name.clone()).collect()
    };
    let set = |text: String| {
        let keys = vec![("openapi.json".to_owned(), text.into_bytes())];
        secrets.set("configmap:api-doc", Some(keys), Presence::Loaded);
    };
    let until = |want: &'static str| async move {
        for _ in 0..500 {
            if names() == [want] {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("{want} not served: {:?}", names());
    };
    // Arrives: served at once (not after the 10 s retry).
    set(doc("first"));
    until("first").await;
    // Edited: swapped.
    set(doc("second"));
    until("second").await;
    // A broken edit keeps what serves.
    set("{not json".into());
    assert!(reloader.refresh().is_err());
    assert_eq!(names(), ["second"]);
}
