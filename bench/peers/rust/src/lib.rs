//! What the three Rust peers of `bench/wire.py` share: the `--port N` argument, the
//! loopback listener and the serving loop (axum's own `serve`, as each project's examples
//! use it), with a clean exit on SIGTERM or Ctrl-C.

use std::net::{Ipv4Addr, SocketAddr};

/// The port given as `--port N` (the only argument the peers take).
pub fn port() -> u16 {
    let args: Vec<String> = std::env::args().collect();
    match args.as_slice() {
        [_, flag, n] if flag == "--port" => n.parse().unwrap_or_else(|_| usage()),
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: {} --port N", std::env::args().next().unwrap_or_default());
    std::process::exit(2)
}

/// Serves `app` on 127.0.0.1:`--port` until SIGTERM or Ctrl-C.
pub async fn serve(app: axum::Router) {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port()));
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap_or_else(|e| {
        eprintln!("cannot listen on {addr}: {e}");
        std::process::exit(1)
    });
    let stop = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
        eprintln!("server error: {e}");
        std::process::exit(1)
    }
}
