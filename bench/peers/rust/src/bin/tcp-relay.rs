//! The floor of any proxy: each accepted connection gets its own connection to the
//! upstream, and bytes are copied both ways as they arrive. Nothing is parsed, checked,
//! pooled or timed out. `bench/wire.py` puts it in front of the rmcp peer so that what a
//! hop through quiver-server costs can be read against what a hop costs at all: the
//! second loopback TCP exchange, its syscalls, wake-ups and task polls.
//!
//!   tcp-relay --port N --to HOST:PORT

use std::net::{Ipv4Addr, SocketAddr};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (port, to) = match args.as_slice() {
        [_, p, n, t, addr] if p == "--port" && t == "--to" => match n.parse::<u16>() {
            Ok(n) => (n, addr.clone()),
            Err(_) => usage(),
        },
        _ => usage(),
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap_or_else(|e| {
        eprintln!("cannot listen on {addr}: {e}");
        std::process::exit(1)
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    loop {
        let (mut client, _) = tokio::select! {
            _ = term.recv() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("accept: {e}");
                    continue;
                }
            },
        };
        let to = to.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let Ok(mut upstream) = tokio::net::TcpStream::connect(&to).await else {
                eprintln!("cannot connect to {to}");
                return;
            };
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
    }
}

fn usage() -> ! {
    eprintln!("usage: tcp-relay --port N --to HOST:PORT");
    std::process::exit(2)
}
