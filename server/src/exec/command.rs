//! The `exec` handler: runs a program from an argv list (never a shell), with a clean
//! environment, in a process group of its own that is killed whole when the run ends, times
//! out or is cancelled, and with capped output.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::handlers::exec::ExecCall;
use crate::protocol::output::ToolOutput;
use crate::secrets::WithSecrets;
use crate::sys::process;
use crate::template::Budget;

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

/// The argv and stdin of a run, or why the arguments cannot make one.
fn render(spec: &ExecCall, args: &Value) -> Result<(Vec<String>, Option<String>), String> {
    let mut budget = Budget::new();
    let mut argv = Vec::with_capacity(spec.args.len());
    for (i, a) in spec.args.iter().enumerate() {
        let value = a
            .template
            .render_with(args, &mut budget)
            .map_err(|e| e.to_string())?;
        // The value itself is not echoed: it is the caller's and may be long or secret.
        if a.refuse_option && value.starts_with('-') {
            return Err(format!(
                "argument {} would start with `-`, which {} would read as an option; \
                 refused (the tool can put a literal `--` before it, or set allowOptionArguments)",
                i + 1,
                spec.program
            ));
        }
        if value.contains('\0') {
            return Err(format!("argument {} contains a NUL byte", i + 1));
        }
        argv.push(value);
    }
    let stdin = spec
        .stdin
        .as_ref()
        .map(|t| t.render_with(args, &mut budget))
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok((argv, stdin))
}

/// Runs the process of an exec tool.
pub async fn run(spec: &ExecCall, args: &Value, secrets: &Value) -> ToolOutput {
    let (argv, stdin_text) = match render(spec, args) {
        Ok(r) => r,
        Err(e) => return ToolOutput::error(format!("{}: {e}", spec.program)),
    };
    // Env values are literal text and secret references only (checked when compiled).
    let scope = WithSecrets {
        args: &Value::Null,
        secrets,
    };
    let mut env = Vec::with_capacity(spec.env.len());
    for (k, t) in &spec.env {
        match t.render(&scope) {
            Ok(v) if !v.contains('\0') => env.push((k, v)),
            _ => return ToolOutput::error(format!("{}: the value of {k} cannot be set", spec.program)),
        }
    }
    let mut cmd = Command::new(&spec.program);
    cmd.args(&argv)
        .env_clear()
        .env("PATH", PATH)
        .envs(env)
        .stdin(if stdin_text.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Dropping `group` (also when this future is dropped: a cancelled call) kills the
    // whole group; it is declared after `child`, so that happens before tokio reaps the leader.
    let (mut child, group) = match process::spawn(&mut cmd) {
        Ok(c) => c,
        Err(e) => return ToolOutput::error(format!("could not start {}: {e}", spec.program)),
    };
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let cap = spec.max_output_bytes;
    let work = async {
        let output = async {
            let feed = async {
                if let (Some(mut w), Some(text)) = (stdin.take(), stdin_text) {
                    let _ = w.write_all(text.as_bytes()).await;
                }
            };
            let ((), out, err) = tokio::join!(feed, read_capped(stdout, cap), read_capped(stderr, cap));
            if out.1 {
                group.kill();
            }
            (out, err)
        };
        // When the program exits, whatever it left running in the background goes too (it
        // would otherwise hold the output pipes open until the timeout).
        let exit = async {
            let status = child.wait().await;
            group.kill();
            status
        };
        let (((out, over), (err, _)), status) = tokio::join!(output, exit);
        (status, out, over, err)
    };
    let outcome = tokio::time::timeout(spec.timeout, work).await;
    group.kill();
    let (status, out, over, err) = match outcome {
        Ok(x) => x,
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
