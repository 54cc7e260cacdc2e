//! The `exec` handler: runs a program from an argv list (never a shell), with a clean
//! environment, a time limit after which it is killed, and capped output.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::ToolOutput;
use crate::config::ExecCall;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Reads at most `cap` bytes; true in the second slot when there was more.
async fn read_capped(r: Option<impl AsyncRead + Unpin>, cap: usize) -> (Vec<u8>, bool) {
    let Some(r) = r else { return (Vec::new(), false) };
    let mut buf = Vec::new();
    let _ = r.take(cap as u64 + 1).read_to_end(&mut buf).await;
    let over = buf.len() > cap;
    buf.truncate(cap);
    (buf, over)
}

/// Runs the process of an exec tool.
pub async fn run(spec: &ExecCall, args: &Value) -> ToolOutput {
    let mut budget = crate::template::Budget::new();
    let rendered = spec
        .args
        .iter()
        .map(|t| t.render_with(args, &mut budget))
        .collect();
    let stdin_text = spec
        .stdin
        .as_ref()
        .map(|t| t.render_with(args, &mut budget))
        .transpose();
    let (argv, stdin_text): (Vec<String>, _) = match (rendered, stdin_text) {
        (Ok(a), Ok(s)) => (a, s),
        (Err(e), _) | (_, Err(e)) => return ToolOutput::error(format!("{}: {e}", spec.program)),
    };
    let mut cmd = Command::new(&spec.program);
    cmd.args(&argv)
        .env_clear()
        .env("PATH", PATH)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ToolOutput::error(format!("could not start {}: {e}", spec.program)),
    };
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let cap = spec.max_output_bytes;
    let work = async {
        let feed = async {
            if let (Some(mut w), Some(text)) = (stdin.take(), stdin_text) {
                let _ = w.write_all(text.as_bytes()).await;
            }
        };
        let ((), (out, out_over), (err, _)) =
            tokio::join!(feed, read_capped(stdout, cap), read_capped(stderr, cap));
        if out_over {
            let _ = child.start_kill();
        }
        let status = child.wait().await;
        (status, out, out_over, err)
    };
    let (status, out, over, err) = match tokio::time::timeout(spec.timeout, work).await {
        Ok(x) => x,
        // Dropping `work` drops the child, which kills it (kill_on_drop).
        Err(_) => {
            return ToolOutput::error(format!(
                "{} timed out after {:?} and was killed",
                spec.program, spec.timeout
            ));
        }
    };
    let stdout = String::from_utf8_lossy(&out).into_owned();
    if over {
        return ToolOutput::error(format!(
            "{} wrote more than {cap} bytes and was stopped; first {cap} bytes:\n{stdout}",
            spec.program
        ));
    }
    match status {
        Ok(s) if s.success() => ToolOutput::text(stdout),
        Ok(s) => {
            let code = s
                .code()
                .map_or_else(|| "a signal".to_owned(), |c| format!("status {c}"));
            ToolOutput::error(format!(
                "{} exited with {code}: {}{}",
                spec.program,
                String::from_utf8_lossy(&err),
                stdout
            ))
        }
        Err(e) => ToolOutput::error(format!("waiting for {} failed: {e}", spec.program)),
    }
}
