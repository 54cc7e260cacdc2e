//! `kubectl quiver` (the `kubectl-quiver` binary): list and call an McpServer's tools, read
//! its status from the cluster and its pods, revoke a user's upstream sign-ins, and check a
//! manifest offline with the operator's own render and the server's compiler. The binary's
//! `main` only parses and calls [`run`].

pub mod args;
pub mod check;
pub mod mcp;
pub mod owner;
pub mod pins;
pub mod reach;
pub mod revoke;
pub mod schema;
pub mod status;
pub mod term;

use std::process::ExitCode;

use kube::Client;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use serde_json::{Map, Value, json};

use args::{Cli, Command, Connect, Output};
use reach::Reach;

/// Why a command failed; each kind has its exit code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// A negative answer: problems found, a tool error, not Ready (exit 1). The message is
    /// already printed.
    #[error("{0}")]
    Negative(String),
    /// Flags, arguments or the file (exit 2).
    #[error("{0}")]
    Usage(String),
    /// Kubernetes: kubeconfig, not found, forbidden, unreachable (exit 3).
    #[error("{0}")]
    Kube(String),
    /// The MCP server: HTTP or JSON-RPC errors, a rejected token (exit 4).
    #[error("{0}")]
    Server(String),
}

impl Failure {
    /// The process exit code.
    pub fn code(&self) -> u8 {
        match self {
            Self::Negative(_) => 1,
            Self::Usage(_) => 2,
            Self::Kube(_) => 3,
            Self::Server(_) => 4,
        }
    }
}

/// Runs one command; prints its output and errors.
pub async fn run(cli: Cli) -> ExitCode {
    match dispatch(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Negative(_)) => ExitCode::from(1),
        Err(f) => {
            eprintln!("{}", error_line(&f));
            ExitCode::from(f.code())
        }
    }
}

/// How a failure is printed: `error: MESSAGE` on one line.
fn error_line(f: &Failure) -> String {
    format!("error: {}", term::line(&f.to_string()))
}

/// An API client from the kubeconfig as kubectl reads it, and the namespace to use.
///
/// # Errors
/// [`Failure::Kube`] when no kubeconfig or context can be loaded.
pub async fn client(cli: &Cli) -> Result<(Client, String), Failure> {
    let options = KubeConfigOptions {
        context: cli.context.clone(),
        cluster: None,
        user: None,
    };
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| Failure::Kube(format!("kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .map_err(|e| Failure::Kube(format!("kubeconfig: {e}")))?;
    // No automatic retry of 429/503/504: a tools/call must not be sent twice behind the
    // user's back, and "no endpoints available" should fail at once.
    let mut config = config;
    config.default_retry = false;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| Failure::Kube(format!("API client: {e}")))?;
    Ok((client, ns))
}

async fn dispatch(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Check { file } => {
            let text = if file == "-" {
                let mut s = String::new();
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(std::io::stdin(), check::MAX_FILE_BYTES as u64 + 1),
                    &mut s,
                )
                .map(|_| s)
            } else {
                std::fs::read_to_string(file)
            }
            .map_err(|e| Failure::Usage(format!("{file}: {e}")))?;
            let reports = check::check(&text)?;
            let (out, valid) = check::print(file, &reports);
            print!("{}", term::text(&out));
            if valid {
                Ok(())
            } else {
                Err(Failure::Negative("problems found".to_owned()))
            }
        }
        Command::Approve {
            name,
            tools,
            upstream,
        } => approve_command(&cli, name, tools, upstream.as_deref()).await,
        Command::Status { name, output } => status_command(&cli, name, *output).await,
        Command::Revoke {
            name,
            subject,
            upstream,
            output,
        } => revoke_command(&cli, name, subject, upstream.as_deref(), *output).await,
        Command::Tools { name, conn, output } => {
            let (client, ns) = client(&cli).await?;
            let (mut reach, token) = connect(client, &ns, name, conn).await?;
            let tools = list_tools(&mut reach, token.as_deref()).await;
            reach.close().await;
            let tools = tools?;
            match output {
                Output::Json => println!(
                    "{}",
                    term::json(&serde_json::to_string_pretty(&tools).unwrap_or_default())
                ),
                Output::Text => print!("{}", term::text(&tools_text(&tools))),
            }
            Ok(())
        }
        Command::Call {
            name,
            tool,
            pairs,
            json,
            conn,
            output,
        } => {
            let (client, ns) = client(&cli).await?;
            let (mut reach, token) = connect(client, &ns, name, conn).await?;
            let result = call(&mut reach, token.as_deref(), tool, json.as_deref(), pairs).await;
            reach.close().await;
            let result = result?;
            let (text, is_error) = mcp::call_text(&result)?;
            match output {
                Output::Json => println!(
                    "{}",
                    term::json(&serde_json::to_string_pretty(&result).unwrap_or_default())
                ),
                Output::Text if is_error => eprintln!("{}", term::text(&text)),
                Output::Text => println!("{}", term::text(&text)),
            }
            if is_error {
                Err(Failure::Negative("the tool returned an error".to_owned()))
            } else {
                Ok(())
            }
        }
    }
}

/// `kubectl quiver approve`: prints each tool approved; nothing to approve is a negative
/// answer (exit 1).
async fn approve_command(
    cli: &Cli,
    name: &str,
    tools: &[String],
    upstream: Option<&str>,
) -> Result<(), Failure> {
    let (client, ns) = client(cli).await?;
    match pins::approve(&client, &ns, name, upstream, tools).await {
        Ok(done) => {
            for t in done {
                println!("approved {}", term::line(&t));
            }
            Ok(())
        }
        Err(Failure::Negative(why)) => {
            eprintln!("{}", term::line(&why));
            Err(Failure::Negative(why))
        }
        Err(e) => Err(e),
    }
}

/// `kubectl quiver status`: the McpServer, its pods and the tool definitions awaiting
/// approval; not Ready is a negative answer (exit 1).
async fn status_command(cli: &Cli, name: &str, output: Output) -> Result<(), Failure> {
    let (client, ns) = client(cli).await?;
    let (mcp, pods) = status::gather(&client, &ns, name).await?;
    // Who may read the McpServer but not its pins ConfigMap still gets the status.
    let pinned = match pins::read(&client, &ns, name).await {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => {
            eprintln!(
                "note: pinned tool definitions not shown: {}",
                term::line(&e.to_string())
            );
            Default::default()
        }
    };
    match output {
        Output::Json => {
            let mut v = status::as_json(&mcp, &pods);
            if let Some(o) = v.as_object_mut() {
                o.insert("pins".into(), serde_json::to_value(&pinned).unwrap_or_default());
            }
            println!(
                "{}",
                term::json(&serde_json::to_string_pretty(&v).unwrap_or_default())
            );
        }
        Output::Text => {
            print!("{}", term::text(&status::as_text(&mcp, &pods, None)));
            let pending = pins::pending_text(&pinned);
            if !pending.is_empty() {
                print!(
                    "Tool definitions awaiting approval (kubectl quiver approve {name} [TOOL...]):\n{}",
                    term::text(&pending)
                );
            }
        }
    }
    if status::is_ready(&mcp) {
        Ok(())
    } else {
        Err(Failure::Negative("not Ready".to_owned()))
    }
}

/// `kubectl quiver revoke`: prints what each pod removed; an incomplete revocation is a
/// failure of the MCP server (exit 4).
async fn revoke_command(
    cli: &Cli,
    name: &str,
    subject: &str,
    upstream: Option<&str>,
    output: Output,
) -> Result<(), Failure> {
    let request = revoke::Request::new(subject, upstream)?;
    let (client, ns) = client(cli).await?;
    let r = revoke::revoke(&client, &ns, name, request).await?;
    match output {
        Output::Json => println!(
            "{}",
            term::json(&serde_json::to_string_pretty(&revoke::as_json(&r)).unwrap_or_default())
        ),
        Output::Text => print!("{}", term::text(&revoke::as_text(&r))),
    }
    if r.complete() {
        Ok(())
    } else {
        Err(Failure::Server(format!(
            "the revocation on McpServer {ns}/{name} is incomplete: a pod did not confirm it (above); run it again"
        )))
    }
}

async fn connect(
    client: Client,
    ns: &str,
    name: &str,
    conn: &Connect,
) -> Result<(Reach, Option<String>), Failure> {
    let token = conn.bearer()?;
    let reach = if conn.port_forward(token.is_some())? {
        Reach::port_forward(client, ns, name).await?
    } else {
        Reach::proxy(client, ns, name).await?
    };
    Ok((reach, token))
}

/// Every tool (following `nextCursor`).
async fn list_tools(reach: &mut Reach, token: Option<&str>) -> Result<Vec<Value>, Failure> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    let mut total = 0usize;
    for page in 0..mcp::MAX_PAGES {
        let mut params = Map::new();
        if let Some(c) = cursor.take() {
            params.insert("cursor".to_owned(), Value::String(c));
        }
        let id = u64::try_from(page).unwrap_or_default() + 1;
        let answer = reach
            .post(&mcp::request(id, "tools/list", params, None), token)
            .await?;
        let result = mcp::result(&answer, id).map_err(|e| via(reach, e))?;
        total += answer.body.len();
        if total > mcp::MAX_LISTING_BYTES {
            return Err(Failure::Server(format!(
                "the tool listing is over {} MiB; refused",
                mcp::MAX_LISTING_BYTES >> 20
            )));
        }
        tools.extend(
            result
                .get("tools")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        );
        match result.get("nextCursor").and_then(Value::as_str) {
            Some(c) if !c.is_empty() => cursor = Some(c.to_owned()),
            _ => return Ok(tools),
        }
    }
    Err(Failure::Server(format!(
        "more than {} pages of tools",
        mcp::MAX_PAGES
    )))
}

/// Names the way a server error came, so "HTTP 503" says through what.
fn via(reach: &Reach, e: Failure) -> Failure {
    match e {
        Failure::Server(m) => Failure::Server(format!("{m} (through {})", reach.describe())),
        other => other,
    }
}

async fn call(
    reach: &mut Reach,
    token: Option<&str>,
    tool: &str,
    json: Option<&str>,
    pairs: &[String],
) -> Result<Value, Failure> {
    let tools = list_tools(reach, token).await?;
    let Some(found) = tools
        .iter()
        .find(|t| t.get("name").and_then(Value::as_str) == Some(tool))
    else {
        let mut names: Vec<&str> = tools
            .iter()
            .filter_map(|t| t.get("name").and_then(Value::as_str))
            .collect();
        names.sort_unstable();
        return Err(Failure::Usage(format!(
            "no tool `{tool}` (tools: {})",
            if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            }
        )));
    };
    let schema = found.get("inputSchema").cloned().unwrap_or_else(|| json!({}));
    let arguments = args::arguments(tool, &schema, json, pairs)?;
    let mut params = Map::new();
    params.insert("name".to_owned(), Value::String(tool.to_owned()));
    params.insert("arguments".to_owned(), Value::Object(arguments));
    let id = 1_000_000;
    let answer = reach
        .post(&mcp::request(id, "tools/call", params, Some(tool)), token)
        .await?;
    mcp::result(&answer, id).map_err(|e| via(reach, e))
}

/// `NAME  DESCRIPTION` lines.
pub fn tools_text(tools: &[Value]) -> String {
    let width = tools
        .iter()
        .filter_map(|t| t.get("name").and_then(Value::as_str))
        .map(|n| term::line(n).chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 48);
    let mut out = format!("{:<width$}  DESCRIPTION\n", "NAME");
    for t in tools {
        let name = term::line(t.get("name").and_then(Value::as_str).unwrap_or_default());
        let description = t
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .split(['\n', '\r'])
            .next()
            .unwrap_or_default();
        let description = term::line(description);
        out.push_str(&format!("{name:<width$}  {description}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVIL: &str = "x\nFORGED\u{2028}FORGED\r\u{85}FORGED\u{202e}";

    fn no_forged_line(printed: &str) {
        for l in printed.lines() {
            assert!(
                !l.trim_start().starts_with("FORGED"),
                "a forged line {l:?} in\n{printed}"
            );
        }
        assert!(
            !printed.contains(['\r', '\u{85}', '\u{2028}', '\u{202e}']),
            "{printed}"
        );
    }

    #[test]
    fn a_tool_listing_has_one_line_per_tool() {
        let tools = vec![
            json!({"name": EVIL, "description": EVIL}),
            json!({"name": "add", "description": "Adds\nmore"}),
        ];
        let printed = term::text(&tools_text(&tools)).into_owned();
        no_forged_line(&printed);
        assert_eq!(printed.lines().count(), 3, "{printed}");
        assert!(
            printed
                .lines()
                .any(|l| l.starts_with("add") && l.ends_with("Adds")),
            "{printed}"
        );
    }

    #[test]
    fn an_error_is_one_line() {
        for f in [
            Failure::Server(format!("Unknown tool: {EVIL}")),
            Failure::Kube(EVIL.to_owned()),
            Failure::Usage(EVIL.to_owned()),
        ] {
            let printed = error_line(&f);
            no_forged_line(&printed);
            assert_eq!(printed.lines().count(), 1, "{printed}");
            assert!(printed.starts_with("error: "));
        }
    }
}
