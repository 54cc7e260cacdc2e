//! MCP over stdio: newline-delimited JSON-RPC on stdin/stdout. Requests run concurrently
//! (a slow tool does not hold up `ping` or `notifications/cancelled`); one writer task
//! serializes responses and `list_changed` notifications onto stdout.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::dispatch::{Ctx, Server};

/// Serves stdin/stdout until stdin closes.
///
/// # Errors
/// Reading stdin or writing stdout failed.
pub async fn serve(server: Arc<Server>) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        let mut out = tokio::io::stdout();
        while let Some(mut line) = rx.recv().await {
            line.push(b'\n');
            out.write_all(&line).await?;
            out.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let mut events = server.subscribe();
    let event_tx = tx.clone();
    let forward = tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(m) => {
                    if event_tx.send(m.as_bytes().to_vec()).await.is_err() {
                        break;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            }
        }
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(line) = lines.next_line().await? {
        if line.trim().is_empty() {
            continue;
        }
        let server = server.clone();
        let tx = tx.clone();
        tasks.spawn(async move {
            let ctx = Ctx {
                session: "stdio",
                version: crate::protocol::LATEST_VERSION,
            };
            let handled = server.handle(line.as_bytes(), ctx, true).await;
            if let Some(body) = handled.body {
                // A cancelled request gets no response on stdio (the client has moved on).
                if !is_cancelled_error(&body) {
                    let _ = tx.send(body).await;
                }
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    forward.abort();
    drop(tx);
    writer.await.map_err(std::io::Error::other)?
}

fn is_cancelled_error(body: &[u8]) -> bool {
    let needle = format!("\"code\":{}", crate::protocol::REQUEST_CANCELLED);
    body.len() < 200 && body.windows(needle.len()).any(|w| w == needle.as_bytes())
}
