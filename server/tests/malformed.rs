//! Hostile input over a real socket to the real app and accept loop: every case gets its
//! exact HTTP status and JSON-RPC error code, and the server still answers a normal
//! `tools/call` afterwards. Limits are small so the timeouts take well under a second.

mod net;

use std::time::Duration;

use net::{
    PATIENCE, Served, assert_still_serves, closed_by_server, exchange, get, post, post_head, post_with,
    read_reply, serve_app, wait_for,
};
use quiver_server::dispatch::Limits;
use quiver_server::metrics::Refusal;
use quiver_server::transport::http::HttpOptions;
use quiver_server::transport::listen::ConnOptions;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const TOOLS: &str = r#"
tools:
  - {name: add, handler: {builtin: add}}
  - {name: echo, handler: {builtin: echo}}
  - {name: json, handler: {builtin: json}}
  - {name: sleep, handler: {builtin: sleep}}
"#;

const MAX_BODY: usize = 128 << 10;

async fn served(max_connections: usize, header_timeout: Duration) -> Served {
    serve_app(
        TOOLS,
        HttpOptions {
            max_body_bytes: MAX_BODY,
            max_connections,
            body_read_timeout: Duration::from_millis(300),
            ..HttpOptions::default()
        },
        ConnOptions {
            header_read_timeout: header_timeout,
            http2: true,
        },
        Limits {
            max_batch: 4,
            max_response_bytes: 16 << 10,
            ..Limits::default()
        },
    )
    .await
}

#[tokio::test]
async fn invalid_json_and_envelopes_get_exact_errors() {
    let s = served(64, Duration::from_secs(5)).await;
    let cases: [(&[u8], u16, i64); 20] = [
        (b"{not json", 400, -32700),
        (b"", 400, -32700),
        (b"[1, 2", 400, -32700),
        (b"\"just a string\"", 400, -32600),
        (b"42", 400, -32600),
        (b"null", 400, -32600),
        (br#"{"jsonrpc":2,"id":1,"method":"ping"}"#, 200, -32600),
        (br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#, 200, -32600),
        (br#"{"jsonrpc":"2.0","id":1,"method":7}"#, 200, -32600),
        (br#"{"jsonrpc":"2.0","id":1,"method":null}"#, 200, -32600),
        (br#"{"jsonrpc":"2.0","method":7}"#, 400, -32600),
        (br#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#, 400, -32600),
        (br#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#, 400, -32600),
        (br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#, 400, -32600),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#,
            200,
            -32602,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":[]}"#,
            200,
            -32602,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":5}}"#,
            200,
            -32602,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add","arguments":"x"}}"#,
            200,
            -32602,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":9}}"#,
            200,
            -32602,
        ),
        (
            br#"{"jsonrpc":"2.0","id":1,"method":"no/such/method"}"#,
            200,
            -32601,
        ),
    ];
    for (body, status, code) in cases {
        let r = post(s.mcp, body).await;
        assert_eq!(
            r.code(),
            (status, Some(code)),
            "{}",
            String::from_utf8_lossy(body)
        );
        // An error names the request whenever its id could be read (string or number);
        // only then is it a 200, so the client can match it.
        let readable = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("id").filter(|i| i.is_number() || i.is_string()).cloned());
        assert_eq!(
            r.json()["id"],
            readable.clone().unwrap_or_default(),
            "{}",
            String::from_utf8_lossy(body)
        );
        assert_eq!(
            readable.is_some(),
            status == 200,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    // Invalid UTF-8 inside a string is a parse error, never a crash or a lossy guess.
    let r = post(s.mcp, b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"pi\xffng\"}").await;
    assert_eq!(r.code(), (400, Some(-32700)));
    let r = post(
        s.mcp,
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"\xc3\x28\"}}}",
    )
    .await;
    assert_eq!(r.code(), (400, Some(-32700)));
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn huge_ids_and_deep_nesting() {
    let s = served(64, Duration::from_secs(5)).await;
    // A 6,000-digit number and an 8,000-character string are valid ids, echoed verbatim.
    for id in ["9".repeat(6_000), format!("\"{}\"", "i".repeat(8_000))] {
        let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        let r = post(s.mcp, body.as_bytes()).await;
        assert_eq!(r.status, 200);
        let text = String::from_utf8(r.body).unwrap();
        assert!(
            text == format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
            "id not echoed verbatim: {}...",
            &text[..80]
        );
    }
    // 100,000 unclosed `[`: a parse error, no stack overflow.
    let r = post(s.mcp, "[".repeat(100_000).as_bytes()).await;
    assert_eq!(r.code(), (400, Some(-32700)));
    // Closed, as a batch element: not a request object.
    let deep = format!("{}{}", "[".repeat(50_000), "]".repeat(50_000));
    let r = post(s.mcp, deep.as_bytes()).await;
    assert_eq!(r.code(), (400, Some(-32600)));
    // Deep arguments hit serde_json's recursion limit (128): invalid params, not a crash.
    let args = format!("{}1{}", "[".repeat(30_000), "]".repeat(30_000));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"json","arguments":{{"a":{args}}}}}}}"#
    );
    let r = post(s.mcp, body.as_bytes()).await;
    assert_eq!(r.code(), (200, Some(-32602)));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("recursion limit"),
        "{}",
        r.json()
    );
    // Just under the limit is accepted.
    let args = format!("{}1{}", "[".repeat(100), "]".repeat(100));
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{{"name":"json","arguments":{{"a":{args}}}}}}}"#
    );
    let r = post(s.mcp, body.as_bytes()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"]["isError"], false);
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn over_long_bodies_get_413_declared_or_chunked() {
    let s = served(64, Duration::from_secs(5)).await;
    let pad = "x".repeat(MAX_BODY);
    let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"p":"{pad}"}}}}"#);
    let r = post(s.mcp, body.as_bytes()).await;
    assert_eq!(r.code(), (413, Some(-32600)));
    // A Content-Length over the limit is refused before any body byte is read.
    let r = exchange(s.mcp, post_head(1 << 30, "").as_bytes()).await;
    assert_eq!(r.code(), (413, Some(-32600)));
    // Chunked, no length announced: refused once the limit is crossed.
    let head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n";
    let mut raw = head.as_bytes().to_vec();
    for _ in 0..10 {
        raw.extend_from_slice(format!("{:x}\r\n{}\r\n", 20_000, "y".repeat(20_000)).as_bytes());
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let r = exchange(s.mcp, &raw).await;
    assert_eq!(r.code(), (413, Some(-32600)));
    assert!(s.server.metrics.refusals(Refusal::BodyBytes) >= 3);
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn batches_over_the_cap_and_oversized_answers_are_refused() {
    let s = served(64, Duration::from_secs(5)).await;
    let v0326 = "MCP-Protocol-Version: 2025-03-26\r\n";
    let ping = |i: usize| format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#);
    let batch = |n: usize| format!("[{}]", (0..n).map(ping).collect::<Vec<_>>().join(","));
    // The override header comes last, so it wins over post_head's 2025-11-25.
    let post_0326 = |body: String| {
        let mut raw = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Connection: close\r\n{v0326}Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(body.as_bytes());
        raw
    };
    let r = exchange(s.mcp, &post_0326(batch(4))).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json().as_array().map(Vec::len), Some(4));
    let r = exchange(s.mcp, &post_0326(batch(5))).await;
    assert_eq!(r.code(), (400, Some(-32600)));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 4 messages")
    );
    // 10,000 elements: one error, no per-element work.
    let r = exchange(s.mcp, &post_0326(format!("[{}]", vec!["{}"; 10_000].join(",")))).await;
    assert_eq!(r.code(), (400, Some(-32600)));
    // Batches are refused outright in later revisions.
    let r = post(s.mcp, batch(2).as_bytes()).await;
    assert_eq!(r.code(), (400, Some(-32600)));
    // An answer over max_response_bytes (16 KiB) becomes an error with the request's id.
    let big = "z".repeat(20_000);
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":"big","method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{big}"}}}}}}"#
    );
    let r = post(s.mcp, call.as_bytes()).await;
    assert_eq!(r.code(), (200, Some(-32603)));
    assert_eq!(r.json()["id"], "big");
    // Four answers of 6 KB each add up past 16 KiB: the batch gets one error.
    let six = "w".repeat(6_000);
    let item = |i: usize| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{six}"}}}}}}"#
        )
    };
    let body = format!("[{}]", (0..4).map(item).collect::<Vec<_>>().join(","));
    let r = exchange(s.mcp, &post_0326(body)).await;
    assert_eq!(r.code(), (200, Some(-32603)));
    assert!(r.json()["id"].is_null());
    assert_eq!(s.server.metrics.refusals(Refusal::Batch), 2);
    assert_eq!(s.server.metrics.refusals(Refusal::ResponseBytes), 2);
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn transport_refusals_name_the_request_when_its_id_is_readable() {
    let s = served(64, Duration::from_secs(5)).await;
    let ping = br#"{"jsonrpc":"2.0","id":"req-7","method":"ping"}"#;
    // An unknown protocol version is the 2026-07-28 UnsupportedProtocolVersionError (-32022,
    // naming every version spoken), which handshake-era clients read as a 400 too.
    let cases = [
        ("Content-Type: text/plain\r\n", 415, -32600),
        (
            "Content-Type: application/json\r\nAccept: text/html\r\n",
            406,
            -32600,
        ),
        (
            "Content-Type: application/json\r\nMCP-Protocol-Version: 1999-01-01\r\n",
            400,
            -32022,
        ),
        (
            "Content-Type: application/json\r\nMcp-Session-Id: a b\r\n",
            400,
            -32600,
        ),
    ];
    for (headers, status, code) in cases {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n",
            ping.len()
        );
        let mut req = head.into_bytes();
        req.extend_from_slice(ping);
        let r = exchange(s.mcp, &req).await;
        assert_eq!(r.code(), (status, Some(code)), "{headers}");
        assert_eq!(r.json()["id"], "req-7", "{headers}");
        if code == -32022 {
            assert_eq!(r.json()["error"]["data"]["requested"], "1999-01-01");
            assert!(r.json()["error"]["data"]["supported"].as_array().unwrap().len() > 1);
        }
    }
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn ended_sessions_get_404_and_hosts_are_checked() {
    let s = served(64, Duration::from_secs(5)).await;
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let id = net::sid("s-to-end");
    let session = &format!("Mcp-Session-Id: {id}\r\n");
    assert_eq!(post_with(s.mcp, ping, session).await.status, 200);
    let del = &format!(
        "DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nMcp-Session-Id: {id}\r\n\r\n"
    );
    assert_eq!(exchange(s.mcp, del.as_bytes()).await.status, 204);
    let r = post_with(s.mcp, ping, session).await;
    assert_eq!(r.code(), (404, Some(-32600)));
    assert_eq!(r.json()["id"], 1);
    assert_eq!(
        exchange(s.mcp, del.as_bytes()).await.status,
        404,
        "a second DELETE"
    );
    let get = format!(
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAccept: text/event-stream\r\nMcp-Session-Id: {id}\r\n\r\n"
    );
    assert_eq!(exchange(s.mcp, get.as_bytes()).await.status, 404);
    // Other sessions, and requests without one, are not affected.
    assert_eq!(
        post_with(
            s.mcp,
            ping,
            &format!("Mcp-Session-Id: {}\r\n", net::sid("s-other"))
        )
        .await
        .status,
        200
    );
    assert_still_serves(s.mcp).await;

    // Host: with an allow-list (the default on a loopback listener), loopback names and the
    // listed hosts pass; any other Host (a rebinding page's domain) gets 403.
    let strict = serve_app(
        TOOLS,
        HttpOptions {
            allowed_hosts: Some(vec!["mcp.example".into()]),
            ..HttpOptions::default()
        },
        ConnOptions {
            http2: true,
            ..ConnOptions::default()
        },
        Limits::default(),
    )
    .await;
    for (host, status) in [
        ("127.0.0.1:9", 200),
        ("localhost", 200),
        ("[::1]:8080", 200),
        ("mcp.example", 200),
        ("MCP.example:443", 200),
        ("evil.example", 403),
        ("localhost.evil.example", 403),
        ("mcp.example.evil.example", 403),
        // Not `host[:port]`: refused, not guessed at (userinfo once read as `localhost`).
        ("localhost:1@evil.example", 400),
        ("localhost/evil.example", 400),
        ("[::1", 400),
    ] {
        let req = format!(
            "POST /mcp HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            ping.len(),
            std::str::from_utf8(ping).unwrap()
        );
        assert_eq!(
            exchange(strict.mcp, req.as_bytes()).await.status,
            status,
            "{host}"
        );
    }
    // Over HTTP/2 the name comes in `:authority` (no Host header): the same check applies.
    {
        use http_body_util::Full;
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let stream = TcpStream::connect(strict.mcp).await.unwrap();
        let (mut h2, conn) = hyper::client::conn::http2::handshake::<_, _, Full<bytes::Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await
        .expect("h2c handshake");
        tokio::spawn(conn);
        for (authority, status) in [
            ("mcp.example", 200),
            ("localhost:9", 200),
            ("evil.example", 403),
            ("localhost:1@evil.example", 400),
        ] {
            let req = http::Request::post(format!("http://{authority}/mcp"))
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(Full::new(bytes::Bytes::from_static(ping)))
                .unwrap();
            assert!(!req.headers().contains_key("host"));
            let r = h2.send_request(req).await.expect("h2 response");
            assert_eq!(r.status().as_u16(), status, "{authority}");
        }
    }
    // No Host at all (HTTP/1.0 allows that, hyper serves it): with an allow-list in force
    // there is no name to allow, so it is refused; without one it is served.
    let no_host = format!(
        "POST /mcp HTTP/1.0\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{}",
        ping.len(),
        std::str::from_utf8(ping).unwrap()
    );
    let r = exchange(strict.mcp, no_host.as_bytes()).await;
    let body = String::from_utf8_lossy(&r.body);
    assert_eq!(r.status, 400, "{body}");
    assert!(body.contains("Host header is required"), "{body}");
    assert_eq!(exchange(s.mcp, no_host.as_bytes()).await.status, 200);
    // Without an allow-list (a cluster listener), any Host is served.
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: load.ns.svc:8080\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        ping.len(),
        std::str::from_utf8(ping).unwrap()
    );
    assert_eq!(exchange(s.mcp, req.as_bytes()).await.status, 200);
}

#[tokio::test]
async fn invalid_session_ids_are_rejected() {
    let s = served(64, Duration::from_secs(5)).await;
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    for bad in ["", " ", "a b", "\t", &"s".repeat(129)] {
        let r = post_with(s.mcp, ping, &format!("Mcp-Session-Id: {bad}\r\n")).await;
        assert_eq!(r.code(), (400, Some(-32600)), "{bad:?}");
        let del = format!(
            "DELETE /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nMcp-Session-Id: {bad}\r\n\r\n"
        );
        assert_eq!(exchange(s.mcp, del.as_bytes()).await.status, 400, "{bad:?}");
    }
    // Well-formed but not issued by the server (to this caller): an unknown session.
    let r = post_with(s.mcp, ping, "Mcp-Session-Id: ok-session_1.~\r\n").await;
    assert_eq!(r.code(), (404, Some(-32600)));
    let r = post_with(s.mcp, ping, &format!("Mcp-Session-Id: {}\r\n", net::sid("ok"))).await;
    assert_eq!(r.status, 200);
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn slowloris_headers_are_cut_off_and_slow_bodies_get_408() {
    let s = served(64, Duration::from_millis(300)).await;
    // Half a request head, then silence: the connection is closed (hyper sends nothing).
    let mut c = TcpStream::connect(s.mcp).await.unwrap();
    c.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        .await
        .unwrap();
    let got = closed_by_server(&mut c).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    // A request head over 64 KiB is refused with 431.
    let mut c = TcpStream::connect(s.mcp).await.unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: {}\r\n\r\n",
        "p".repeat(70_000)
    );
    let _ = c.write_all(head.as_bytes()).await;
    let got = closed_by_server(&mut c).await;
    assert!(
        got.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // A connection that never sends a byte is closed too (the idle keep-alive case).
    let mut idle = TcpStream::connect(s.mcp).await.unwrap();
    assert!(closed_by_server(&mut idle).await.is_empty());
    // Complete headers, a few body bytes, then silence: 408 with a JSON-RPC error.
    let mut c = TcpStream::connect(s.mcp).await.unwrap();
    let mut raw = post_head(100, "").into_bytes();
    raw.extend_from_slice(br#"{"jsonrpc":"#);
    c.write_all(&raw).await.unwrap();
    let r = read_reply(&mut c).await;
    assert_eq!(r.code(), (408, Some(-32600)));
    assert!(r.headers.contains("connection: close"), "{}", r.headers);
    assert_eq!(s.server.metrics.refusals(Refusal::BodyTimeout), 1);
    // A kept-alive connection is closed after being idle past the header timeout.
    let mut c = TcpStream::connect(s.mcp).await.unwrap();
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let mut raw = post_head(ping.len(), "")
        .replace("Connection: close\r\n", "")
        .into_bytes();
    raw.extend_from_slice(ping);
    c.write_all(&raw).await.unwrap();
    let got = closed_by_server(&mut c).await;
    let r = net::parse(&got);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"], serde_json::json!({}));
    assert_still_serves(s.mcp).await;
}

#[tokio::test]
async fn idle_connections_up_to_the_cap_fail_readiness_not_the_admin_port() {
    const CAP: usize = 8;
    // A long header timeout: the idle connections stay until the test closes them.
    let s = served(CAP, PATIENCE * 3).await;
    assert_eq!(get(s.admin, "/readyz").await.status, 200);
    let mut idle = Vec::new();
    for _ in 0..CAP {
        idle.push(TcpStream::connect(s.mcp).await.unwrap());
    }
    wait_for("every idle connection accepted", || {
        s.load.connections.open() == CAP
    })
    .await;
    // The admin port still answers, and readiness reports the saturation.
    let r = get(s.admin, "/readyz").await;
    assert_eq!(r.status, 503);
    assert_eq!(String::from_utf8_lossy(&r.body), "connection limit reached");
    assert_eq!(get(s.admin, "/healthz").await.status, 200);
    let metrics = String::from_utf8(get(s.admin, "/metrics").await.body).unwrap();
    assert!(
        metrics.contains(&format!("quiver_open_connections {CAP}")),
        "{metrics}"
    );
    assert_eq!(s.server.metrics.refusals(Refusal::Connections), 0);
    // One more client waits, unserved (the accept loop counts it and pauses); it is served
    // once an idle connection goes away.
    let addr = s.mcp;
    let waiting = tokio::spawn(async move { assert_still_serves(addr).await });
    wait_for("the client over the cap is counted", || {
        s.server.metrics.refusals(Refusal::Connections) == 1
    })
    .await;
    assert!(!waiting.is_finished(), "served over the cap");
    drop(idle.pop());
    tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("the waiting client is served after a slot frees")
        .unwrap();
    drop(idle);
    wait_for("every connection closed", || s.load.connections.open() == 0).await;
    assert_eq!(get(s.admin, "/readyz").await.status, 200);
    assert_still_serves(s.mcp).await;
}

/// HTTP/2 with prior knowledge (h2c): concurrent streams on one connection are served like
/// HTTP/1.1 requests, with the same limits; a client that opens with a partial preface and
/// goes silent is cut off like a slow HTTP/1.1 head.
#[tokio::test]
async fn h2c_multiplexes_requests_under_the_same_limits() {
    use http_body_util::{BodyExt, Full};
    use hyper::client::conn::http2;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    let s = served(64, Duration::from_millis(300)).await;
    let stream = TcpStream::connect(s.mcp).await.unwrap();
    let (sender, conn) =
        http2::handshake::<_, _, Full<bytes::Bytes>>(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    tokio::spawn(conn);
    let request = |body: String| {
        http::Request::post(format!("http://{}/mcp", s.mcp))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .body(Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    // 32 calls in flight at once on the one connection, each answered with its own sum.
    let calls = (0..32).map(|i| {
        let mut sender = sender.clone();
        let req = request(format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"add","arguments":{{"a":{i},"b":1000}}}}}}"#
        ));
        async move {
            let r = sender.send_request(req).await.expect("h2 response");
            assert_eq!(r.version(), http::Version::HTTP_2);
            let status = r.status().as_u16();
            let body = r.into_body().collect().await.unwrap().to_bytes();
            (i, status, serde_json::from_slice::<serde_json::Value>(&body).unwrap())
        }
    });
    for (i, status, reply) in futures_util::future::join_all(calls).await {
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["id"], i);
        assert_eq!(
            reply["result"]["structuredContent"]["result"],
            i + 1000,
            "{reply}"
        );
    }
    // The body limit holds on HTTP/2 too: 413 with a JSON-RPC error.
    let mut sender2 = sender.clone();
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"ping","params":{{"pad":"{}"}}}}"#,
        "x".repeat(MAX_BODY)
    );
    let r = sender2.send_request(request(big)).await.expect("h2 response");
    assert_eq!(r.status().as_u16(), 413);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"]["code"],
        -32600
    );
    // A call that outlasts the header timeout is not cut off: the connection is busy.
    let mut slow = sender.clone();
    let r = slow
        .send_request(request(
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":1000}}}"#.into(),
        ))
        .await
        .expect("a long call on HTTP/2 is answered");
    assert_eq!(r.status().as_u16(), 200);
    let body = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"],
        9
    );
    // A partial preface, then silence: closed once the header timeout passes. ("P" could
    // still be either protocol: nothing is sent. After "PRI" the server has spoken HTTP/2,
    // its SETTINGS frame and a GOAWAY, but never HTTP/1.)
    let mut c = TcpStream::connect(s.mcp).await.unwrap();
    c.write_all(b"P").await.unwrap();
    assert!(closed_by_server(&mut c).await.is_empty());
    let mut c = TcpStream::connect(s.mcp).await.unwrap();
    c.write_all(b"PRI * HT").await.unwrap();
    assert!(!closed_by_server(&mut c).await.starts_with(b"HTTP/"));
    // An HTTP/2 connection left idle after its requests is closed.
    let stream = TcpStream::connect(s.mcp).await.unwrap();
    let (mut idle, conn) =
        http2::handshake::<_, _, Full<bytes::Bytes>>(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    let conn = tokio::spawn(conn);
    let r = idle
        .send_request(request(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.into()))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(r);
    tokio::time::timeout(PATIENCE, conn)
        .await
        .expect("the idle connection is closed")
        .unwrap()
        .ok();
    assert_still_serves(s.mcp).await;
}

/// HTTP/2 is opt-in (`--http2`): without it an HTTP/2 client gets no HTTP/2 service, and
/// HTTP/1.1 on the same port is unaffected.
#[tokio::test]
async fn h2c_is_off_unless_asked_for() {
    use http_body_util::Full;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let s = serve_app(
        TOOLS,
        HttpOptions::default(),
        ConnOptions::default(),
        Limits::default(),
    )
    .await;
    let stream = TcpStream::connect(s.mcp).await.unwrap();
    let served = async {
        let (mut h2, conn) = hyper::client::conn::http2::handshake::<_, _, Full<bytes::Bytes>>(
            TokioExecutor::new(),
            TokioIo::new(stream),
        )
        .await
        .ok()?;
        tokio::spawn(conn);
        let req = http::Request::post(format!("http://{}/mcp", s.mcp))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from_static(
                br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            )))
            .unwrap();
        h2.send_request(req).await.ok()
    };
    let got = tokio::time::timeout(net::PATIENCE, served)
        .await
        .expect("the server answers or closes");
    assert!(got.is_none(), "HTTP/2 was served without --http2: {got:?}");
    assert_still_serves(s.mcp).await;
}

/// A 2026-07-28 `tools/call` of `route` with `args`, and raw header lines (the
/// `Mcp-Param-*` ones) as a client sends them; bytes outside ASCII go through as they are.
async fn call_route(addr: std::net::SocketAddr, args: &str, params: &[u8]) -> net::Reply {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{{"name":"route","arguments":{args},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
    );
    let mut raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: tools/call\r\nMcp-Name: route\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(params);
    raw.extend_from_slice(b"\r\n");
    raw.extend_from_slice(body.as_bytes());
    exchange(addr, &raw).await
}

/// Arguments marked `x-mcp-header` must be mirrored into `Mcp-Param-*` headers that decode
/// to exactly the argument: every way a header can be wrong or missing is `-32020` (HTTP
/// 400) before the tool runs, and conforming encodings are served.
#[tokio::test]
async fn param_headers_must_mirror_the_arguments() {
    let s = serve_app(
        r#"
tools:
  - name: route
    inputSchema:
      type: object
      properties:
        region: {type: string, x-mcp-header: Region}
        n: {type: integer, x-mcp-header: N}
        fast: {type: boolean, x-mcp-header: Fast}
        note: {type: string}
    handler: {template: "region={{region}}"}
"#,
        HttpOptions::default(),
        ConnOptions::default(),
        Limits::default(),
    )
    .await;
    let ok: [(&str, &[u8], &str); 7] = [
        (
            r#"{"region":"eu-west"}"#,
            b"mcp-param-region: eu-west\r\n",
            "region=eu-west",
        ),
        // Surrounding blanks are not part of an HTTP field value.
        (r#"{"region":"eu"}"#, b"MCP-PARAM-REGION: \t eu \r\n", "region=eu"),
        // UTF-8 as Base64: "Zürich".
        (
            r#"{"region":"Zürich"}"#,
            b"Mcp-Param-Region: =?base64?WsO8cmljaA==?=\r\n",
            "region=Zürich",
        ),
        // Without the closing `?=` the value is literal.
        (
            r#"{"region":"=?base64?SGk="}"#,
            b"Mcp-Param-Region: =?base64?SGk=\r\n",
            "region==?base64?SGk=",
        ),
        (r#"{"region":""}"#, b"Mcp-Param-Region: \r\n", "region="),
        (
            r#"{"region":"x","n":-12,"fast":false,"note":"not mirrored"}"#,
            b"Mcp-Param-Region: x\r\nMcp-Param-N: -12\r\nMcp-Param-Fast: false\r\n",
            "region=x",
        ),
        // An absent optional argument has no header.
        (
            r#"{"region":"x","note":"n"}"#,
            b"Mcp-Param-Region: x\r\n",
            "region=x",
        ),
    ];
    for (args, headers, text) in ok {
        let r = call_route(s.mcp, args, headers).await;
        assert_eq!(r.status, 200, "{args}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["result"]["content"][0]["text"], text, "{args}");
    }
    let bad: [(&str, &[u8], &str); 11] = [
        (r#"{"region":"eu"}"#, b"", "header is required"),
        (
            r#"{"region":"eu"}"#,
            b"Mcp-Param-Region: us\r\n",
            "does not match the argument `region`",
        ),
        (
            r#"{"region":"eu"}"#,
            b"Mcp-Param-Region: EU\r\n",
            "does not match",
        ),
        (
            r#"{}"#,
            b"Mcp-Param-Region: eu\r\n",
            "the arguments carry no `region`",
        ),
        (
            r#"{"region":"Hello"}"#,
            b"Mcp-Param-Region: =?base64?SGVsbG8?=\r\n",
            "not a valid header value",
        ),
        (
            r#"{"region":"Hello"}"#,
            b"Mcp-Param-Region: =?base64?SGVs!!!bG8=?=\r\n",
            "not a valid header value",
        ),
        // Base64 of bytes that are not UTF-8.
        (
            r#"{"region":"x"}"#,
            b"Mcp-Param-Region: =?base64?/w==?=\r\n",
            "not a valid header value",
        ),
        // Bytes outside visible ASCII sent raw instead of as Base64.
        (
            r#"{"region":"Zürich"}"#,
            b"Mcp-Param-Region: Z\xc3\xbcrich\r\n",
            "not a valid header value",
        ),
        (
            r#"{"region":"eu"}"#,
            b"Mcp-Param-Region: eu\r\nMcp-Param-Region: eu\r\n",
            "sent more than once",
        ),
        (
            r#"{"region":"x","n":3}"#,
            b"Mcp-Param-Region: x\r\nMcp-Param-N: 03\r\n",
            "argument `n`",
        ),
        (
            r#"{"region":"x","fast":true}"#,
            b"Mcp-Param-Region: x\r\nMcp-Param-Fast: True\r\n",
            "argument `fast`",
        ),
    ];
    for (args, headers, needle) in bad {
        let r = call_route(s.mcp, args, headers).await;
        assert_eq!(
            r.code(),
            (400, Some(-32020)),
            "{args} {:?}",
            String::from_utf8_lossy(headers)
        );
        let message = r.json()["error"]["message"].as_str().unwrap_or("").to_owned();
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
        assert_eq!(r.json()["id"], 9);
    }
    // The headers belong to 2026-07-28: an older revision's call needs none.
    let handshake = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"route","arguments":{"region":"eu"}}}"#;
    assert_eq!(
        post(s.mcp, handshake).await.json()["result"]["content"][0]["text"],
        "region=eu"
    );
}

/// The ids of the SSE events in a raw response, in order.
fn event_ids(raw: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(raw)
        .lines()
        .filter_map(|l| l.strip_prefix("id: ").map(str::to_owned))
        .collect()
}

/// `GET /mcp` of session `id` resuming after `last`.
async fn resume_get(addr: std::net::SocketAddr, id: &str, last: &[u8]) -> net::Reply {
    let mut raw = format!(
        "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nAccept: text/event-stream\r\n\
         MCP-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: {id}\r\nLast-Event-ID: "
    )
    .into_bytes();
    raw.extend_from_slice(last);
    raw.extend_from_slice(b"\r\n\r\n");
    exchange(addr, &raw).await
}

/// A call that outlives the poll interval is answered by a stream the server ends after a
/// priming event (id, retry); the client polls the rest with `Last-Event-ID` until the
/// result arrives. Ids that are malformed, unknown, another session's or expired are
/// refused with a clear error, and the buffers they named are gone.
#[tokio::test]
async fn answer_streams_resume_from_last_event_id_and_refuse_bad_ids() {
    use quiver_server::transport::resume::ResumeOptions;
    let s = serve_app(
        TOOLS,
        HttpOptions {
            resume: Some(ResumeOptions {
                ttl: Duration::from_millis(300),
                ..ResumeOptions::with_poll(Duration::from_millis(150))
            }),
            ..HttpOptions::default()
        },
        ConnOptions::default(),
        Limits::default(),
    )
    .await;
    let id = net::sid("s-resume");
    let session = &format!("Mcp-Session-Id: {id}\r\n");
    let call =
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":500}}}"#;
    let r = post_with(s.mcp, call, session).await;
    assert_eq!(r.status, 200);
    assert!(
        r.headers.contains("content-type: text/event-stream"),
        "{}",
        r.headers
    );
    let text = String::from_utf8_lossy(&r.body).into_owned();
    let ids = event_ids(&r.body);
    assert_eq!(ids.len(), 1, "only the priming event before the interval: {text}");
    assert!(
        ids[0].ends_with("-0") && text.contains("retry: 100\n") && !text.contains("\"result\""),
        "{text}"
    );

    // Poll until the result comes, each time after the last id seen.
    let mut last = ids[0].clone();
    let deadline = std::time::Instant::now() + net::PATIENCE;
    let result = loop {
        assert!(std::time::Instant::now() < deadline, "no result by polling");
        let r = resume_get(s.mcp, &id, last.as_bytes()).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let body = String::from_utf8_lossy(&r.body).into_owned();
        if let Some(l) = event_ids(&r.body).pop() {
            last = l;
        }
        if body.contains("\"result\"") {
            break body;
        }
    };
    assert!(result.contains(r#""id":4"#), "{result}");
    assert!(
        last.ends_with("-1"),
        "the result is the first event after priming: {last}"
    );
    // The buffer can be read again from the start while it lives.
    let again = resume_get(s.mcp, &id, ids[0].as_bytes()).await;
    assert!(String::from_utf8_lossy(&again.body).contains("\"result\""));

    let other = net::sid("s-other-resume");
    let stream = ids[0].split('-').next().unwrap_or("").to_owned();
    let cases: [(&String, &[u8], u16, &str); 5] = [
        (&id, b"garbage", 400, "not an event id"),
        (&id, b"\xff\xfe", 400, "not an event id"),
        (&id, b"18446744073709551616-0", 400, "not an event id"),
        (&id, b"987654-0", 404, "names no stream of this session"),
        (&other, ids[0].as_bytes(), 404, "names no stream of this session"),
    ];
    for (who, last_id, status, needle) in cases {
        let r = resume_get(s.mcp, who, last_id).await;
        assert_eq!(r.code(), (status, Some(-32600)), "{last_id:?}");
        let m = r.json()["error"]["message"].as_str().unwrap_or("").to_owned();
        assert!(m.contains(needle), "{needle:?} not in {m:?}");
    }
    // Unread past its ttl, the buffer expires: answers opened after that sweep it away (a
    // resume would count as a read, so none is tried until then).
    let unread_since = std::time::Instant::now();
    let longer_call =
        br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"sleep","arguments":{"ms":200}}}"#;
    loop {
        assert_eq!(post_with(s.mcp, longer_call, session).await.status, 200);
        if unread_since.elapsed() > Duration::from_millis(500) {
            break;
        }
    }
    let r = resume_get(s.mcp, &id, format!("{stream}-0").as_bytes()).await;
    assert_eq!(r.code(), (404, Some(-32600)));
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("expired")
    );
    assert_still_serves(s.mcp).await;
}

/// Hostile and broken OpenAPI documents, each with what its refusal must say.
fn hostile_openapi() -> Vec<(&'static str, String, &'static str)> {
    use serde_json::{Map, Value, json};
    let with_paths = |paths: Value, schemas: Value| {
        json!({"openapi": "3.1.0", "servers": [{"url": "http://127.0.0.1:9"}], "paths": paths, "components": {"schemas": schemas}}).to_string()
    };
    let body = |schema: Value| json!({"/x": {"post": {"operationId": "op", "requestBody": {"required": true, "content": {"application/json": {"schema": schema}}}, "responses": {}}}});
    let (mut fan, mut props, mut chain) = (Map::new(), Map::new(), Map::new());
    for i in 0..300 {
        fan.insert(format!("S{i}"), json!({"type": "string"}));
        props.insert(
            format!("p{i}"),
            json!({"$ref": format!("#/components/schemas/S{i}")}),
        );
    }
    for i in 0..40 {
        chain.insert(format!("C{i}"), json!({"type": "object", "properties": {"n": {"$ref": format!("#/components/schemas/C{}", i + 1)}}}));
    }
    chain.insert("C40".into(), json!({"type": "string"}));
    let many_ops: Map<String, Value> = (0..=quiver_server::config::openapi::MAX_OPERATIONS)
        .map(|i| (format!("/p{i}"), json!({"get": {"responses": {}}})))
        .collect();
    let laughs = "openapi: 3.0.0\na: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]\n";
    vec![
        (
            "json nested past the parser",
            format!(
                "{{\"openapi\": \"3.0.0\", \"paths\": {}{}}}",
                "[".repeat(200),
                "]".repeat(200)
            ),
            "not JSON",
        ),
        (
            "objects nested 65 deep",
            format!("{}1{}", "{\"a\":".repeat(65), "}".repeat(65)),
            "levels are accepted",
        ),
        ("yaml alias bomb", laughs.to_owned(), "not YAML"),
        (
            "over 16 MiB",
            format!("{{\"openapi\": \"3.0.0\", \"x\": \"{}\"}}", "a".repeat(16 << 20)),
            "over 16777216 bytes",
        ),
        (
            "unknown version",
            json!({"openapi": "4.0.0"}).to_string(),
            "only versions 3.0 and 3.1",
        ),
        (
            "not openapi",
            json!({"info": {}}).to_string(),
            "not an OpenAPI document",
        ),
        (
            "too many operations",
            json!({"openapi": "3.1.0", "paths": many_ops}).to_string(),
            "operations; at most",
        ),
        (
            "cyclic schemas",
            with_paths(
                body(json!({"$ref": "#/components/schemas/A"})),
                json!({"A": {"type": "object", "properties": {"b": {"$ref": "#/components/schemas/B"}}}, "B": {"anyOf": [{"$ref": "#/components/schemas/A"}]}}),
            ),
            "refers to itself",
        ),
        (
            "schema fan-out",
            with_paths(
                body(json!({"type": "object", "properties": props})),
                Value::Object(fan),
            ),
            "more than 256 component schemas",
        ),
        (
            "schema chain too deep",
            with_paths(
                body(json!({"$ref": "#/components/schemas/C0"})),
                Value::Object(chain),
            ),
            "nest more than",
        ),
        (
            "remote reference",
            with_paths(body(json!({"$ref": "https://evil.example/s.json"})), json!({})),
            "only references to component schemas",
        ),
        (
            "dangling schema reference",
            with_paths(body(json!({"$ref": "#/components/schemas/Nope"})), json!({})),
            "names no component schema",
        ),
        (
            "dangling parameter reference",
            with_paths(
                json!({"/x": {"get": {"operationId": "op", "parameters": [{"$ref": "#/components/parameters/none"}]}}}),
                json!({}),
            ),
            "points at nothing",
        ),
        (
            "path parameter with a dot",
            with_paths(
                json!({"/x/{a.b}": {"get": {"operationId": "op", "parameters": [{"name": "a.b", "in": "path"}]}}}),
                json!({}),
            ),
            "only names of",
        ),
        (
            "multipart body",
            with_paths(
                json!({"/x": {"post": {"operationId": "op", "requestBody": {"required": true, "content": {"multipart/form-data": {}}}}}}),
                json!({}),
            ),
            "only JSON and form bodies",
        ),
        (
            "relative server",
            json!({"openapi": "3.1.0", "servers": [{"url": "/relative"}], "paths": {}}).to_string(),
            "set `server`",
        ),
    ]
}

/// The hostile OpenAPI corpus through the real load path (config text naming a document
/// file, read, parsed and compiled by the Reloader as a ConfigMap edit would be): each is
/// refused with a problem naming the source and what is wrong, the tools imported from the
/// last good document keep serving, and the server still answers calls.
#[tokio::test]
async fn hostile_openapi_documents_are_refused_and_the_serving_tools_stay() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    let doc = serde_json::json!({"openapi": "3.0.3", "servers": [{"url": "http://127.0.0.1:9"}], "paths": {"/items": {"get": {"operationId": "listItems", "responses": {}}}}});
    std::fs::write(&good, doc.to_string()).unwrap();
    let config = |path: &std::path::Path| {
        format!(
            "{TOOLS}openapi:\n  - {{name: store, file: '{}'}}\n",
            path.display()
        )
    };
    let s = serve_app(
        &config(&good),
        HttpOptions::default(),
        ConnOptions::default(),
        Limits::default(),
    )
    .await;
    let reloader = quiver_server::reload::Reloader::new(s.server.clone());
    let generation = s.server.registry.load_full().generation;
    let serves_list_items = || {
        s.server
            .registry
            .load_full()
            .tools
            .iter()
            .any(|t| t.def.name == "listItems")
    };
    assert!(serves_list_items());
    let cases = hostile_openapi();
    assert_eq!(cases.len(), 16);
    for (i, (what, text, wanted)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("hostile-{i}.doc"));
        std::fs::write(&path, text).unwrap();
        let e = reloader
            .apply(&[("tools.yaml".into(), config(&path))])
            .expect_err(what)
            .to_string();
        assert!(
            e.contains("openapi[0]") && e.contains(wanted),
            "{what}: wanted {wanted:?} in {e}"
        );
        assert!(
            e.len() < 4096,
            "{what}: the refusal quotes the document ({} bytes): {e}",
            e.len()
        );
        assert_eq!(s.server.registry.load_full().generation, generation, "{what}");
        assert!(serves_list_items(), "{what}");
        assert_still_serves(s.mcp).await;
    }
    // The same documents inline in the config text are refused alike (one case suffices:
    // the parse is shared).
    let inline = format!("{TOOLS}openapi:\n  - {{name: store, document: '{{\"openapi\": \"4.0.0\"}}'}}\n");
    let e = reloader
        .apply(&[("tools.yaml".into(), inline)])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("openapi[0].document") && e.contains("only versions 3.0 and 3.1"),
        "{e}"
    );
    assert!(serves_list_items());
}

#[tokio::test]
async fn core_task_methods_refuse_forged_ids_bad_cursors_and_hostile_params() {
    use serde_json::json;
    let s = served(64, Duration::from_secs(5)).await;
    let in_session = &format!(
        "MCP-Protocol-Version: 2025-11-25\r\nMcp-Session-Id: {}\r\n",
        net::sid("s-tasks")
    );
    let rpc = |method: &str, params: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": 5, "method": method, "params": params}).to_string()
    };
    let huge = "f".repeat(100_000);
    for method in ["tasks/get", "tasks/cancel", "tasks/result"] {
        for id in [
            json!("0".repeat(32)),
            json!(huge),
            json!(5),
            json!(null),
            json!({"a": 1}),
            json!("\u{0}"),
        ] {
            let r = post_with(s.mcp, rpc(method, json!({"taskId": id})).as_bytes(), in_session).await;
            assert_eq!(r.code(), (200, Some(-32602)), "{method}");
            assert_eq!(r.json()["id"], 5);
        }
        let r = post_with(s.mcp, rpc(method, json!([huge])).as_bytes(), in_session).await;
        assert_eq!(r.code(), (200, Some(-32602)), "{method}");
    }
    for cursor in [
        json!("x"),
        json!("tasks-18446744073709551615"),
        json!("tasks-1e3"),
        json!(huge),
        json!(7),
    ] {
        let r = post_with(
            s.mcp,
            rpc("tasks/list", json!({"cursor": cursor})).as_bytes(),
            in_session,
        )
        .await;
        assert_eq!(r.code(), (200, Some(-32602)), "{cursor}");
    }
    let r = post_with(s.mcp, rpc("tasks/list", json!({})).as_bytes(), in_session).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["result"]["tasks"], json!([]));
    // Without a session nor credentials, callers are not told apart: no list.
    let sessionless = "MCP-Protocol-Version: 2025-11-25\r\n";
    let r = post_with(s.mcp, rpc("tasks/list", json!({})).as_bytes(), sessionless).await;
    assert_eq!(r.code(), (200, Some(-32600)));
    // A builtin never runs as a task, whatever `task` holds.
    for task in [json!({}), json!(huge), json!({"ttl": 1e300})] {
        let call = rpc(
            "tools/call",
            json!({"name": "add", "arguments": {"a": 1, "b": 2}, "task": task}),
        );
        let r = post_with(s.mcp, call.as_bytes(), in_session).await;
        assert_eq!(r.code(), (200, Some(-32601)));
    }
    assert_still_serves(s.mcp).await;
}
