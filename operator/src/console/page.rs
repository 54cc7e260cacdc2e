//! The console's pages, rendered on the server: plain HTML with one stylesheet and no
//! script, so every page works with a keyboard, a screen reader and a strict Content
//! Security Policy. Every text from an McpServer, a tool or a server's answer is escaped.

use std::fmt::Write as _;

use serde_json::Value;

use super::form::{Field, Kind};
use super::stats::{Stats, WINDOW};

/// `s` escaped for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    quiver_model::published::html(s)
}

/// `s` as one path segment of a URL.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A whole page: `title`, the signed-in user's name (with a sign-out button carrying
/// `csrf`), and `body`.
pub fn layout(title: &str, user: Option<(&str, &str)>, body: &str) -> String {
    let who = match user {
        Some((name, csrf)) => format!(
            "<form method=\"post\" action=\"/logout\" class=\"who\"><span>Signed in as <strong>{}</strong></span> \
             <input type=\"hidden\" name=\"csrf\" value=\"{}\"><button type=\"submit\">Sign out</button></form>",
            esc(name),
            esc(csrf)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Quiver console</title><link rel=\"stylesheet\" href=\"/static/console.css\"></head>\
         <body><a class=\"skip\" href=\"#main\">Skip to content</a>\
         <header><nav aria-label=\"Site\"><a href=\"/\" class=\"home\">Quiver console</a></nav>{who}</header>\
         <main id=\"main\">{body}</main></body></html>\n",
        esc(title)
    )
}

/// A page saying what went wrong.
pub fn problem(title: &str, why: &str, user: Option<(&str, &str)>) -> String {
    layout(
        title,
        user,
        &format!(
            "<h1>{}</h1><p role=\"alert\" class=\"error\">{}</p><p><a href=\"/\">Back to the servers</a></p>",
            esc(title),
            esc(why)
        ),
    )
}

/// The page for a request that came from another site to a page that would send the
/// user's token: a link to the same page, which, followed, comes from the console.
pub fn elsewhere(path: &str, user: Option<(&str, &str)>) -> String {
    layout(
        "Continue",
        user,
        &format!(
            "<h1>Continue</h1><p>You followed a link from another site. This page lists and calls tools with your \
             own token, so it opens only from the console itself.</p><p><a href=\"{}\">Open it</a></p>",
            esc(path)
        ),
    )
}

/// One row of the servers' table.
#[derive(Debug, Clone)]
pub struct ServerRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Title or description.
    pub about: String,
    /// Whether it is Ready, and the condition's reason.
    pub ready: Option<(bool, String)>,
    /// Tools it serves (its status).
    pub tools: Option<i32>,
}

fn ready_badge(ready: Option<&(bool, String)>) -> String {
    match ready {
        Some((true, _)) => "<span class=\"ok\">Ready</span>".to_owned(),
        Some((false, reason)) => format!("<span class=\"bad\">Not ready: {}</span>", esc(reason)),
        None => "<span class=\"unknown\">Unknown</span>".to_owned(),
    }
}

/// The first page: the servers the user may see, by namespace.
pub fn overview(rows: &[ServerRow]) -> String {
    let mut body = String::from("<h1>MCP servers</h1>");
    if rows.is_empty() {
        body.push_str(
            "<p>You may not list McpServers in any namespace that has listed ones. \
             Ask your platform team for the <code>list</code> permission on <code>mcpservers</code>.</p>",
        );
        return body;
    }
    let _ = write!(
        body,
        "<p>{} servers you may see.</p><table><caption class=\"sr\">MCP servers</caption><thead><tr>\
         <th scope=\"col\">Namespace</th><th scope=\"col\">Server</th><th scope=\"col\">About</th>\
         <th scope=\"col\">State</th><th scope=\"col\">Tools</th></tr></thead><tbody>",
        rows.len()
    );
    for r in rows {
        let _ = write!(
            body,
            "<tr><td>{ns}</td><th scope=\"row\"><a href=\"/servers/{ns_seg}/{name_seg}\">{name}</a></th>\
             <td>{about}</td><td>{ready}</td><td>{tools}</td></tr>",
            ns = esc(&r.namespace),
            ns_seg = seg(&r.namespace),
            name_seg = seg(&r.name),
            name = esc(&r.name),
            about = esc(&r.about),
            ready = ready_badge(r.ready.as_ref()),
            tools = r.tools.map_or_else(|| "-".to_owned(), |t| t.to_string()),
        );
    }
    body.push_str("</tbody></table>");
    body
}

/// What the server page shows of a server.
#[derive(Debug, Clone, Default)]
pub struct ServerView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Title or description.
    pub about: String,
    /// Its conditions: type, status, reason, message.
    pub conditions: Vec<[String; 4]>,
    /// The URL clients connect to.
    pub url: String,
    /// Whether clients need a token.
    pub needs_token: bool,
    /// Who may call what, from its spec: `(tool, requirement)`.
    pub rules: Vec<(String, String)>,
}

/// A tool as listed to the user.
#[derive(Debug, Clone)]
pub struct ToolRow {
    /// Name.
    pub name: String,
    /// Title, else empty.
    pub title: String,
    /// Description.
    pub description: String,
    /// Hints set to true (`readOnlyHint`, ...), by their short names.
    pub hints: Vec<String>,
}

/// A tool of the listing `tools/list` gave.
pub fn tool_row(t: &Value) -> Option<ToolRow> {
    let name = t["name"].as_str()?.to_owned();
    let hints = [
        "readOnlyHint",
        "destructiveHint",
        "idempotentHint",
        "openWorldHint",
    ]
    .iter()
    .filter(|h| t["annotations"][**h].as_bool() == Some(true))
    .map(|h| h.trim_end_matches("Hint").to_owned())
    .collect();
    Some(ToolRow {
        name,
        title: t["title"]
            .as_str()
            .or_else(|| t["annotations"]["title"].as_str())
            .unwrap_or_default()
            .to_owned(),
        description: t["description"].as_str().unwrap_or_default().to_owned(),
        hints,
    })
}

fn conditions_table(v: &ServerView) -> String {
    if v.conditions.is_empty() {
        return "<p>The operator has not reported on this server yet.</p>".to_owned();
    }
    let mut out = String::from(
        "<table><caption>Conditions</caption><thead><tr><th scope=\"col\">Condition</th>\
         <th scope=\"col\">Status</th><th scope=\"col\">Reason</th><th scope=\"col\">Message</th></tr></thead><tbody>",
    );
    for [t, s, r, m] in &v.conditions {
        let _ = write!(
            out,
            "<tr><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(t),
            esc(s),
            esc(r),
            esc(m)
        );
    }
    out.push_str("</tbody></table>");
    out
}

/// The configuration snippets of "add to your editor".
pub fn editor_snippets(name: &str, url: &str, needs_token: bool) -> Vec<(&'static str, String)> {
    let key = name.to_owned();
    let headers = if needs_token {
        ",\n      \"headers\": {\"Authorization\": \"Bearer ${input:token}\"}"
    } else {
        ""
    };
    let inputs = if needs_token {
        "\n  \"inputs\": [{\"id\": \"token\", \"type\": \"promptString\", \"description\": \"Access token\", \"password\": true}],"
    } else {
        ""
    };
    let vscode = format!(
        "{{{inputs}\n  \"servers\": {{\n    {k}: {{\n      \"type\": \"http\",\n      \"url\": {u}{headers}\n    }}\n  }}\n}}",
        k = Value::String(key.clone()),
        u = Value::String(url.to_owned()),
    );
    let claude_header = if needs_token {
        " --header \"Authorization: Bearer $TOKEN\""
    } else {
        ""
    };
    let claude = format!(
        "claude mcp add --transport http {} {}{claude_header}",
        sh(&key),
        sh(url)
    );
    let auth_py = if needs_token {
        "\n# with a token: httpx.AsyncClient(headers={\"Authorization\": f\"Bearer {token}\"})"
    } else {
        ""
    };
    let python = format!(
        "from mcp import ClientSession\nfrom mcp.client.streamable_http import streamablehttp_client\n\n\
         async with streamablehttp_client({u}) as (read, write, _):\n    async with ClientSession(read, write) as s:\n        \
         await s.initialize()\n        print(await s.list_tools()){auth_py}",
        u = Value::String(url.to_owned())
    );
    let ts = format!(
        "import {{ Client }} from \"@modelcontextprotocol/sdk/client/index.js\";\n\
         import {{ StreamableHTTPClientTransport }} from \"@modelcontextprotocol/sdk/client/streamableHttp.js\";\n\n\
         const client = new Client({{ name: \"my-app\", version: \"1.0.0\" }});\n\
         await client.connect(new StreamableHTTPClientTransport(new URL({u}){opts}));\n\
         console.log(await client.listTools());",
        u = Value::String(url.to_owned()),
        opts = if needs_token {
            ", { requestInit: { headers: { Authorization: `Bearer ${token}` } } }"
        } else {
            ""
        }
    );
    vec![
        ("VS Code (.vscode/mcp.json)", vscode),
        ("Claude Code", claude),
        ("Python SDK", python),
        ("TypeScript SDK", ts),
    ]
}

/// `s` as one shell word: as it is when it holds only characters no shell reads, else in
/// single quotes (a URL from a spec is never run by whoever pastes the line).
pub fn sh(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:@%+=,".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A number of calls, short.
fn count(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// A latency in seconds, in the unit that reads best.
fn latency(s: f64) -> String {
    if s < 0.001 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn tools_table(body: &mut String, base: &str, tools: &[ToolRow], figures: Option<&Stats>) {
    let extra = if figures.is_some() {
        format!(
            "<th scope=\"col\">Calls ({WINDOW})</th><th scope=\"col\">Errors</th><th scope=\"col\">p95</th>"
        )
    } else {
        String::new()
    };
    let _ = write!(
        body,
        "<table><caption class=\"sr\">Tools</caption><thead><tr><th scope=\"col\">Tool</th>\
         <th scope=\"col\">Description</th><th scope=\"col\">Hints</th>{extra}</tr></thead><tbody>"
    );
    for t in tools {
        let title = if t.title.is_empty() {
            String::new()
        } else {
            format!("<br><span class=\"sub\">{}</span>", esc(&t.title))
        };
        let _ = write!(
            body,
            "<tr><th scope=\"row\"><a href=\"{base}/tools/{}\">{}</a>{title}</th><td>{}</td><td>{}</td>",
            seg(&t.name),
            esc(&t.name),
            esc(&quiver_model::published::cut(&t.description, 300)),
            esc(&t.hints.join(", ")),
        );
        if let Some(f) = figures {
            match f.tools.get(&t.name) {
                Some(s) => {
                    let errors = if s.errors > 0.0 {
                        format!(
                            "<span class=\"bad\">{} ({:.0}%)</span>",
                            count(s.errors),
                            100.0 * s.errors / s.calls.max(1.0)
                        )
                    } else {
                        "0".to_owned()
                    };
                    let _ = write!(
                        body,
                        "<td class=\"num\">{}</td><td class=\"num\">{errors}</td><td class=\"num\">{}</td>",
                        count(s.calls),
                        s.p95.map_or_else(|| "-".to_owned(), latency)
                    );
                }
                None => {
                    body.push_str("<td class=\"num\">0</td><td class=\"num\">-</td><td class=\"num\">-</td>")
                }
            }
        }
        body.push_str("</tr>");
    }
    body.push_str("</tbody></table>");
}

/// The last hour's refusals and upstreams, from Prometheus.
fn last_hour(body: &mut String, figures: Option<Result<&Stats, &str>>) {
    let _ = write!(body, "<h2 id=\"health\">The last hour</h2>");
    let f = match figures {
        None => {
            body.push_str(
                "<p>Per-tool calls, errors and latency, refusals and upstream health appear here when \
                 the console is given Prometheus (<code>--console-prometheus</code>).</p>",
            );
            return;
        }
        Some(Err(why)) => {
            let _ = write!(
                body,
                "<p role=\"status\" class=\"error\">No figures: {}</p>",
                esc(why)
            );
            return;
        }
        Some(Ok(f)) => f,
    };
    if f.refusals.is_empty() {
        body.push_str("<p>No call was refused.</p>");
    } else {
        body.push_str(
            "<table><caption>Calls refused</caption><thead><tr><th scope=\"col\">Why</th>\
             <th scope=\"col\">Calls</th></tr></thead><tbody>",
        );
        for (why, n) in &f.refusals {
            let _ = write!(
                body,
                "<tr><th scope=\"row\">{}</th><td class=\"num\">{}</td></tr>",
                esc(why),
                count(*n)
            );
        }
        body.push_str("</tbody></table>");
    }
    if !f.upstreams.is_empty() {
        body.push_str(
            "<table><caption>Upstreams</caption><thead><tr><th scope=\"col\">Upstream</th>\
             <th scope=\"col\">State</th><th scope=\"col\">Failed calls</th></tr></thead><tbody>",
        );
        for (name, u) in &f.upstreams {
            let state = match u.up {
                Some(true) => "<span class=\"ok\">Connected</span>",
                Some(false) => "<span class=\"bad\">Down on a pod</span>",
                None => "<span class=\"unknown\">Not reported</span>",
            };
            let errors = if u.errors.is_empty() {
                "0".to_owned()
            } else {
                u.errors
                    .iter()
                    .map(|(k, n)| format!("{} {}", count(*n), esc(k)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = write!(
                body,
                "<tr><th scope=\"row\">{}</th><td>{state}</td><td>{errors}</td></tr>",
                esc(name)
            );
        }
        body.push_str("</tbody></table>");
    }
}

/// The page of one server: its state, tools, who may call what, its last hour, and how to
/// connect.
pub fn server_page(
    v: &ServerView,
    tools: Result<&[ToolRow], &str>,
    figures: Option<Result<&Stats, &str>>,
) -> String {
    let base = format!("/servers/{}/{}", seg(&v.namespace), seg(&v.name));
    let mut body = format!(
        "<p class=\"crumbs\"><a href=\"/\">Servers</a> / {}</p><h1>{}</h1><p>{}</p>{}",
        esc(&v.namespace),
        esc(&v.name),
        esc(&v.about),
        conditions_table(v)
    );
    if let Some([_, _, reason, message]) = v
        .conditions
        .iter()
        .find(|[t, s, _, _]| t == "ToolDefinitionsApproved" && s == "False")
    {
        let _ = write!(
            body,
            "<section role=\"status\" class=\"result error\"><h2 id=\"pending\">Definition changes await approval</h2>\
             <p>{}: {}</p></section>",
            esc(reason),
            esc(message)
        );
    }
    last_hour(&mut body, figures);
    body.push_str("<h2 id=\"access\">Who may call what</h2>");
    if v.rules.is_empty() {
        body.push_str("<p>No tool of this server's own list asks for scopes, groups or a policy: every caller the server lets in may call them.</p>");
    } else {
        body.push_str("<table><caption class=\"sr\">Access rules</caption><thead><tr><th scope=\"col\">Tools</th><th scope=\"col\">Who may call</th></tr></thead><tbody>");
        for (tool, rule) in &v.rules {
            let _ = write!(
                body,
                "<tr><th scope=\"row\">{}</th><td>{}</td></tr>",
                esc(tool),
                esc(rule)
            );
        }
        body.push_str("</tbody></table>");
    }
    let _ = write!(
        body,
        "<h2 id=\"editor\">Add to your editor</h2><p>Clients connect to <code>{}</code>{}.</p>",
        esc(&v.url),
        if v.needs_token {
            " with an access token"
        } else {
            ""
        }
    );
    for (label, text) in editor_snippets(&v.name, &v.url, v.needs_token) {
        let _ = write!(
            body,
            "<h3>{}</h3><pre tabindex=\"0\"><code>{}</code></pre>",
            esc(label),
            esc(&text)
        );
    }
    // The longest part last: a server may list thousands of tools.
    body.push_str("<h2 id=\"tools\">Tools you may call</h2>");
    match tools {
        Err(why) => {
            let _ = write!(
                body,
                "<p role=\"alert\" class=\"error\">The server did not list its tools: {}</p>",
                esc(why)
            );
        }
        Ok([]) => body.push_str("<p>The server lists no tool you may call.</p>"),
        Ok(tools) => tools_table(&mut body, &base, tools, figures.and_then(Result::ok)),
    }
    body
}

fn field_html(f: &Field, value: Option<&str>) -> String {
    let id = format!("arg-{}", seg(&f.name));
    let name = esc(&f.name);
    let req = if f.required {
        " required aria-required=\"true\""
    } else {
        ""
    };
    let label = format!(
        "<label for=\"{id}\">{name}{}</label>{}",
        if f.required {
            " <span class=\"req\">(required)</span>"
        } else {
            ""
        },
        if f.description.is_empty() {
            String::new()
        } else {
            format!(
                "<span class=\"hint\" id=\"{id}-hint\">{}</span>",
                esc(&f.description)
            )
        }
    );
    let described = if f.description.is_empty() {
        String::new()
    } else {
        format!(" aria-describedby=\"{id}-hint\"")
    };
    let v = esc(value.unwrap_or_default());
    let input = match &f.kind {
        Kind::Text => {
            format!("<input type=\"text\" id=\"{id}\" name=\"{name}\" value=\"{v}\"{req}{described}>")
        }
        Kind::Integer => format!(
            "<input type=\"number\" step=\"1\" id=\"{id}\" name=\"{name}\" value=\"{v}\"{req}{described}>"
        ),
        Kind::Number => format!(
            "<input type=\"number\" step=\"any\" id=\"{id}\" name=\"{name}\" value=\"{v}\"{req}{described}>"
        ),
        Kind::Boolean => format!(
            "<input type=\"checkbox\" id=\"{id}\" name=\"{name}\"{}{described}>",
            if value.is_some() { " checked" } else { "" }
        ),
        Kind::Choice(choices) => {
            let mut s = format!("<select id=\"{id}\" name=\"{name}\"{req}{described}>");
            if !f.required {
                s.push_str("<option value=\"\">(none)</option>");
            }
            for c in choices {
                let shown = serde_json::from_str::<Value>(c)
                    .ok()
                    .and_then(|x| x.as_str().map(str::to_owned))
                    .unwrap_or_else(|| c.clone());
                let sel = if value == Some(c.as_str()) {
                    " selected"
                } else {
                    ""
                };
                let _ = write!(s, "<option value=\"{}\"{sel}>{}</option>", esc(c), esc(&shown));
            }
            s.push_str("</select>");
            s
        }
        Kind::Json => format!(
            "<textarea id=\"{id}\" name=\"{name}\" rows=\"3\"{req}{described}>{v}</textarea><span class=\"hint\">JSON</span>"
        ),
    };
    format!("<div class=\"field\">{label}{input}</div>")
}

/// What a call gave, for the tool page.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The tool's result: its text, and whether the tool flagged an error.
    Result(String, bool),
    /// The call was refused or failed before the tool ran.
    Refused(String),
}

/// The page of one tool: its description, schema, and the "try it" form (with the last
/// call's outcome, and the values sent).
#[allow(clippy::too_many_arguments)]
pub fn tool_page(
    v: &ServerView,
    tool: &Value,
    fields: &[Field],
    csrf: &str,
    sent: &[(String, String)],
    outcome: Option<&Outcome>,
) -> String {
    let name = tool["name"].as_str().unwrap_or_default();
    let base = format!("/servers/{}/{}", seg(&v.namespace), seg(&v.name));
    let mut body = format!(
        "<p class=\"crumbs\"><a href=\"/\">Servers</a> / {} / <a href=\"{base}\">{}</a></p><h1>{}</h1><p>{}</p>",
        esc(&v.namespace),
        esc(&v.name),
        esc(name),
        esc(tool["description"].as_str().unwrap_or_default())
    );
    if let Some(a) = tool.get("annotations").filter(|a| a.is_object()) {
        let _ = write!(
            body,
            "<h2>Annotations</h2><pre tabindex=\"0\"><code>{}</code></pre>",
            esc(&pretty(a))
        );
    }
    let _ = write!(
        body,
        "<h2>Input schema</h2><pre tabindex=\"0\"><code>{}</code></pre>",
        esc(&pretty(&tool["inputSchema"]))
    );
    let _ = write!(
        body,
        "<h2 id=\"try\">Try it</h2><p>The call is made with your own access token, as any client of yours would make it.</p>\
         <form method=\"post\" action=\"{base}/tools/{}\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        seg(name),
        esc(csrf)
    );
    for f in fields {
        let value = sent.iter().find(|(k, _)| *k == f.name).map(|(_, v)| v.as_str());
        body.push_str(&field_html(f, value));
    }
    body.push_str("<button type=\"submit\">Call</button></form>");
    match outcome {
        Some(Outcome::Result(text, false)) => {
            let _ = write!(
                body,
                "<section aria-live=\"polite\" class=\"result\" id=\"result\"><h2>Result</h2><pre tabindex=\"0\"><code>{}</code></pre></section>",
                esc(text)
            );
        }
        Some(Outcome::Result(text, true)) => {
            let _ = write!(
                body,
                "<section aria-live=\"polite\" class=\"result error\" id=\"result\"><h2>The tool reported an error</h2><pre tabindex=\"0\"><code>{}</code></pre></section>",
                esc(text)
            );
        }
        Some(Outcome::Refused(why)) => {
            let _ = write!(
                body,
                "<section role=\"alert\" class=\"result error\" id=\"result\"><h2>Refused</h2><p>{}</p></section>",
                esc(why)
            );
        }
        None => {}
    }
    body
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// The stylesheet (contrast of at least 4.5:1 for text, visible focus).
pub const CSS: &str = include_str!("console.css");

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_is_escaped_everywhere_it_lands() {
        let evil = "<script>alert(1)</script>\"'&";
        let rows = [ServerRow {
            namespace: "team-a".into(),
            name: evil.into(),
            about: evil.into(),
            ready: Some((false, evil.into())),
            tools: Some(3),
        }];
        let html = overview(&rows);
        assert!(!html.contains("<script>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
        assert!(html.contains("/servers/team-a/%3Cscript%3Ealert%281%29%3C%2Fscript%3E%22%27%26"));
        let v = ServerView {
            namespace: "a".into(),
            name: "b".into(),
            url: "http://x/mcp\"><script>".into(),
            rules: vec![(evil.into(), evil.into())],
            ..ServerView::default()
        };
        let tools = [ToolRow {
            name: evil.into(),
            title: evil.into(),
            description: evil.into(),
            hints: vec![],
        }];
        let html = server_page(&v, Ok(&tools), Some(Err(evil)));
        assert!(!html.contains("<script>"), "{html}");
        let tool = json!({"name": evil, "description": evil, "inputSchema": {"type": "object", "properties": {evil: {"type": "string", "description": evil}}}});
        let f = super::super::form::fields(&tool["inputSchema"]);
        let html = tool_page(
            &v,
            &tool,
            &f,
            evil,
            &[(evil.into(), evil.into())],
            Some(&Outcome::Refused(evil.into())),
        );
        assert!(!html.contains("<script>"), "{html}");
        assert!(!layout(evil, Some((evil, evil)), "").contains("<script>"));
    }

    #[test]
    fn figures_fill_the_tool_columns_and_the_last_hour() {
        use super::super::stats::{ToolStats, UpstreamHealth};
        let mut f = Stats::default();
        f.tools.insert(
            "greet".into(),
            ToolStats {
                calls: 12.0,
                errors: 3.0,
                p95: Some(0.0042),
            },
        );
        f.refusals.push(("forbidden".into(), 4.0));
        f.upstreams.insert(
            "<up>".into(),
            UpstreamHealth {
                up: Some(false),
                errors: vec![("timeout".into(), 2.0)],
            },
        );
        let tools = [
            ToolRow {
                name: "greet".into(),
                title: String::new(),
                description: String::new(),
                hints: vec![],
            },
            ToolRow {
                name: "quiet".into(),
                title: String::new(),
                description: String::new(),
                hints: vec![],
            },
        ];
        let html = server_page(&ServerView::default(), Ok(&tools), Some(Ok(&f)));
        assert!(html.contains("<th scope=\"col\">Calls (1h)</th>"), "{html}");
        assert!(html.contains("<td class=\"num\">12</td><td class=\"num\"><span class=\"bad\">3 (25%)</span></td><td class=\"num\">4.2 ms</td>"), "{html}");
        assert!(
            html.contains("quiet</a></th><td></td><td></td><td class=\"num\">0</td>"),
            "{html}"
        );
        assert!(html.contains("<tr><th scope=\"row\">forbidden</th><td class=\"num\">4</td></tr>"));
        assert!(
            html.contains(
                "&lt;up&gt;</th><td><span class=\"bad\">Down on a pod</span></td><td>2 timeout</td>"
            ),
            "{html}"
        );
        let without = server_page(&ServerView::default(), Ok(&tools), None);
        assert!(!without.contains("Calls (1h)") && without.contains("--console-prometheus"));
        let pending = ServerView {
            conditions: vec![[
                "ToolDefinitionsApproved".into(),
                "False".into(),
                "AwaitingApproval".into(),
                "2 tools changed".into(),
            ]],
            ..ServerView::default()
        };
        assert!(server_page(&pending, Ok(&[]), None).contains("Definition changes await approval"));
    }

    #[test]
    fn every_field_has_a_label_tied_to_it() {
        let schema = json!({"type": "object", "required": ["a"], "properties": {
            "a": {"type": "string", "description": "first"}, "b": {"type": "boolean"},
            "c": {"enum": ["x", "y"]}, "d": {"type": "object"}}});
        let f = super::super::form::fields(&schema);
        let html = tool_page(
            &ServerView::default(),
            &json!({"name": "t", "inputSchema": schema}),
            &f,
            "k",
            &[],
            None,
        );
        for n in ["a", "b", "c", "d"] {
            assert!(html.contains(&format!("<label for=\"arg-{n}\">")), "{n}: {html}");
            assert!(html.contains(&format!("id=\"arg-{n}\"")), "{n}");
        }
        assert!(html.contains("aria-describedby=\"arg-a-hint\""));
        assert!(html.contains("required aria-required=\"true\""));
    }

    #[test]
    fn snippets_name_the_url_and_ask_for_a_token_when_one_is_needed() {
        let s = editor_snippets("weather", "https://mcp.example.com/mcp", true);
        let vscode: Value = serde_json::from_str(&s[0].1).unwrap();
        assert_eq!(vscode["servers"]["weather"]["url"], "https://mcp.example.com/mcp");
        assert_eq!(vscode["servers"]["weather"]["type"], "http");
        assert!(
            vscode["servers"]["weather"]["headers"]["Authorization"]
                .as_str()
                .unwrap()
                .contains("${input:token}")
        );
        assert_eq!(
            s[1].1,
            "claude mcp add --transport http weather https://mcp.example.com/mcp --header \"Authorization: Bearer $TOKEN\""
        );
        let evil = editor_snippets("w", "http://w/mcp?a=1&b=$(id)'`x`", false);
        assert_eq!(
            evil[1].1,
            "claude mcp add --transport http w 'http://w/mcp?a=1&b=$(id)'\\''`x`'"
        );
        let open: Value = serde_json::from_str(&editor_snippets("w", "http://w/mcp", false)[0].1).unwrap();
        assert!(open["servers"]["w"].get("headers").is_none());
        assert!(open.get("inputs").is_none());
    }
}
