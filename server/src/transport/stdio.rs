//! MCP over stdio: newline-delimited JSON-RPC on stdin/stdout. Requests run concurrently
//! (a slow tool does not hold up `ping` or `notifications/cancelled`), at most
//! `max_inflight` at once: at that many, reading pauses until one finishes. A line longer than
//! `max_line_bytes` is skipped and answered with `-32600`. One writer task serializes
//! responses and `list_changed` notifications onto stdout.

use std::sync::Arc;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::dispatch::{Ctx, Era, Opens, Outcome, Server};
use crate::peer::Peer;

/// The one session of a stdio server.
const SESSION: &str = "stdio";

/// Every stdio message's context: one session, the latest revision, streamed calls; each
/// message is read in the era it shows (a `_meta` protocol version means 2026-07-28).
const CTX: Ctx<'static> = Ctx {
    session: SESSION,
    version: crate::protocol::LATEST_VERSION,
    stream: true,
    era: Era::Detect,
    caller: None,
    opens: Opens::Given,
    client: None,
};
use crate::metrics::Refusal;
use crate::protocol::{self, INVALID_REQUEST};

/// Limits of the stdio transport.
#[derive(Debug, Clone, Copy)]
pub struct StdioOptions {
    /// Longest line (one JSON-RPC message or batch) read, newline excluded.
    pub max_line_bytes: usize,
    /// Requests handled at once.
    pub max_inflight: usize,
}

impl Default for StdioOptions {
    fn default() -> Self {
        Self {
            max_line_bytes: 4 << 20,
            max_inflight: 4096,
        }
    }
}

/// Serves stdin/stdout until stdin closes or `stop` is cancelled, then waits for the
/// requests in flight (bound that wait from outside).
///
/// # Errors
/// Reading stdin or writing stdout failed.
pub async fn serve(
    server: Arc<Server>,
    options: StdioOptions,
    stop: CancellationToken,
) -> std::io::Result<()> {
    serve_io(server, tokio::io::stdin(), tokio::io::stdout(), options, stop).await
}

/// [`serve`] over any reader and writer.
///
/// # Errors
/// Reading `input` or writing `output` failed.
pub async fn serve_io<R, W>(
    server: Arc<Server>,
    input: R,
    mut output: W,
    options: StdioOptions,
    stop: CancellationToken,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(256);
    let writer = tokio::spawn(async move {
        while let Some(mut line) = rx.recv().await {
            line.push(b'\n');
            output.write_all(&line).await?;
            output.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    });
    let forward = tokio::spawn(forward_events(server.clone(), tx.clone()));
    let slots = Arc::new(Semaphore::new(options.max_inflight.max(1)));
    let mut reader = BufReader::new(input);
    let mut tasks = tokio::task::JoinSet::new();
    let mut read_error = None;
    loop {
        let mut line = Vec::new();
        let read = tokio::select! {
            r = read_line(&mut reader, &mut line, options.max_line_bytes) => r,
            () = stop.cancelled() => break,
        };
        match read {
            Err(e) => {
                read_error = Some(e);
                break;
            }
            Ok(Line::Eof) => break,
            Ok(Line::TooLong(n)) => {
                server.metrics.refused(Refusal::BodyBytes);
                let msg = format!(
                    "Invalid request: message of {n} bytes exceeds the limit of {} bytes",
                    options.max_line_bytes
                );
                let _ = tx
                    .send(protocol::error_response(None, INVALID_REQUEST, &msg))
                    .await;
                continue;
            }
            Ok(Line::Message) => {}
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // At `max_inflight` requests this waits, and stdin is not read meanwhile; except for
        // notifications and answers to server requests, handled here at once (the answer a
        // sampling call holding a slot waits for must not wait for that slot).
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(_) if protocol::is_answer_or_notification(&line) => {
                server.handle(&line, CTX, false).await;
                continue;
            }
            Err(_) => tokio::select! {
                s = slots.clone().acquire_owned() => match s {
                    Ok(s) => s,
                    Err(_) => break,
                },
                () = stop.cancelled() => break,
            },
        };
        let server = server.clone();
        let tx = tx.clone();
        let stop_listen = stop.clone();
        tasks.spawn(async move {
            let _slot = slot;
            carry_out(&server, &line, &tx, &stop_listen).await;
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    forward.abort();
    drop(tx);
    writer.await.map_err(std::io::Error::other)??;
    read_error.map_or(Ok(()), Err)
}

/// Unsolicited notifications (`list_changed`, resource updates) onto stdout. Only a client
/// that initialized (the handshake era) gets them; a 2026-07-28 client asks with
/// `subscriptions/listen`.
async fn forward_events(server: Arc<Server>, tx: mpsc::Sender<Vec<u8>>) {
    let mut events = server.subscribe();
    loop {
        match events.recv().await {
            Ok(m) if m.is_for(SESSION) && server.sessions.caps(SESSION).is_some() => {
                if tx.send(m.message.as_bytes().to_vec()).await.is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
        }
    }
}

/// Handles one line and carries out what dispatch decided.
async fn carry_out(server: &Arc<Server>, line: &[u8], tx: &mpsc::Sender<Vec<u8>>, stop: &CancellationToken) {
    match server.handle(line, CTX, true).await {
        Outcome::Deferred(d) => {
            // Progress, log messages and requests to the client go straight to stdout.
            let peer = Peer::from_sender(tx.clone());
            // A cancelled call gets no response (`None`).
            if let Some(r) = d.run(Some(&peer)).await {
                let _ = tx.send(r.body).await;
            }
        }
        Outcome::Listen(listen) => serve_listen(tx, listen, server, stop).await,
        Outcome::Reply(r) => {
            // A cancelled request gets no response on stdio (the client has moved on).
            if !is_cancelled_error(&r.body) {
                let _ = tx.send(r.body).await;
            }
        }
        Outcome::Accepted => {}
    }
}

/// Tagged notifications on the shared stdout until `notifications/cancelled` names the
/// listen's id or the server stops; the listen's response ends it.
async fn serve_listen(
    tx: &mpsc::Sender<Vec<u8>>,
    listen: crate::dispatch::Listen,
    server: &Server,
    stop: &CancellationToken,
) {
    let token = listen.cancellation();
    let mut events = server.subscribe();
    if tx.send(listen.acknowledgement()).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = stop.cancelled() => {
                let _ = tx.send(listen.closing()).await;
                return;
            }
            e = events.recv() => match e {
                Ok(e) => {
                    if let Some(m) = listen.wants(&e) && tx.send(m).await.is_err() {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line is in the buffer (newline removed).
    Message,
    /// A line of this many bytes was over the limit and skipped.
    TooLong(usize),
    /// End of input.
    Eof,
}

/// Reads one `\n`-terminated line into `buf`, keeping at most `max` bytes: a longer line is
/// consumed and dropped without being buffered. A final line without a newline counts.
async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buf.clear();
    let mut total = 0usize;
    let mut over = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(match (total, over) {
                (0, _) => Line::Eof,
                (n, true) => Line::TooLong(n),
                _ => Line::Message,
            });
        }
        let newline = avail.iter().position(|b| *b == b'\n');
        let chunk = &avail[..newline.unwrap_or(avail.len())];
        total = total.saturating_add(chunk.len());
        if !over {
            if buf.len() + chunk.len() > max {
                over = true;
                buf.clear();
                buf.shrink_to_fit();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = newline.map_or(avail.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            return Ok(if over { Line::TooLong(total) } else { Line::Message });
        }
    }
}

fn is_cancelled_error(body: &[u8]) -> bool {
    let needle = format!("\"code\":{}", crate::protocol::REQUEST_CANCELLED);
    body.len() < 200 && body.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_are_bounded_and_over_long_ones_skipped() {
        let input: &[u8] = b"short\n0123456789abcdef\n\nlast";
        let mut r = BufReader::with_capacity(4, input);
        let mut buf = Vec::new();
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Message);
        assert_eq!(buf, b"short");
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::TooLong(16));
        assert!(buf.is_empty());
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Message);
        assert_eq!(buf, b"");
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Message);
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut r, &mut buf, 8).await.unwrap(), Line::Eof);
    }
}
