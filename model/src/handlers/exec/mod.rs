//! The `exec` handler: a program run directly from an argv list (never through a shell),
//! each argument a template that stays exactly one argument, in a process group of its own
//! with a time limit and output caps.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::spec::checks::{byte_cap, duration, valid_env_name};
use crate::spec::context::{
    Cx, Names, SECRET_ROOT, SecretRef, check_secret_template, check_template, template,
};
use crate::template::{Authored, Template};

/// An exec handler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecHandler {
    /// Program and arguments. The program (first element) is a literal path; each argument
    /// is a template and always stays exactly one argument.
    pub command: Vec<String>,
    /// Environment of the process (values are literal). Nothing else is inherited but `PATH`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Template written to the process's standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Time limit, after which the process is killed (default 10s, at most 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Largest output kept from stdout (and separately stderr), in bytes (default 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// Let callers pass options: by default an argument that starts with a substituted value
    /// and comes before a literal `--` is refused when its value starts with `-`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_option_arguments: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A compiled exec handler.
#[derive(Debug)]
pub struct ExecCall {
    /// Program path.
    pub program: String,
    /// Arguments, one template each.
    pub args: Vec<ExecArg>,
    /// Environment: literal text and `{{secret.NAME.KEY}}` references.
    pub env: Vec<(String, Template)>,
    /// Standard input template.
    pub stdin: Option<Template>,
    /// Time limit.
    pub timeout: Duration,
    /// Output cap per stream.
    pub max_output_bytes: usize,
    /// Secret values the environment uses (redacted from what the call returns).
    pub secrets: Vec<SecretRef>,
}

/// One argument of an exec handler.
#[derive(Debug)]
pub struct ExecArg {
    /// Its template.
    pub template: Template,
    /// A value that starts with `-` is refused: the template starts with a substituted
    /// value, no literal `--` comes before it, and the tool does not set
    /// `allowOptionArguments` (so a caller cannot slip in an option such as
    /// `--files0-from=/etc/passwd`).
    pub refuse_option: bool,
}

/// Compiles an `exec` spec.
pub fn compile(e: &ExecHandler, cx: &mut Cx<'_>) -> ExecCall {
    let ep = cx.at.clone();
    let (names, p) = (cx.names, &mut *cx.p);
    let program = e.command.first().cloned().unwrap_or_default();
    if program.is_empty() {
        p.push(format!("{ep}.command"), "must name a program");
    } else if program.contains("{{") {
        p.push(
            format!("{ep}.command[0]"),
            "the program must be literal, not a template",
        );
    } else if !program.starts_with('/') {
        p.push(
            format!("{ep}.command[0]"),
            "must be an absolute path (no PATH lookup, no shell)",
        );
    }
    let mut args = Vec::new();
    let mut after_options = false;
    for (j, a) in e.command.iter().enumerate().skip(1) {
        if let Some(t) = template(Authored::new(a), &format!("{ep}.command[{j}]"), p) {
            check_template(&t, names, &format!("{ep}.command[{j}]"), p);
            args.push(ExecArg {
                refuse_option: t.starts_with_variable() && !after_options && !e.allow_option_arguments,
                template: t,
            });
        }
        // Programs read what follows `--` as operands, never as options.
        after_options |= a == "--";
    }
    let stdin = e.stdin.as_ref().and_then(|s| {
        let t = template(Authored::new(s), &format!("{ep}.stdin"), p)?;
        check_template(&t, names, &format!("{ep}.stdin"), p);
        Some(t)
    });
    let mut secrets = Vec::new();
    let mut env = Vec::new();
    for (k, v) in &e.env {
        let at = format!("{ep}.env.{k}");
        if !valid_env_name(k) {
            p.push(&at, "not a valid environment variable name");
        }
        let Some(t) = template(Authored::new(v), &at, p) else {
            continue;
        };
        if t.roots().any(|(root, _)| root != SECRET_ROOT) {
            p.push(
                &at,
                "env values are literal text and `{{secret.NAME.KEY}}` references only",
            );
        }
        check_secret_template(
            &t,
            &Names {
                props: None,
                steps: None,
            },
            &at,
            p,
            &mut secrets,
        );
        env.push((k.clone(), t));
    }
    ExecCall {
        program,
        args,
        env,
        secrets,
        stdin,
        timeout: duration(e.timeout.as_ref(), &format!("{ep}.timeout"), p),
        max_output_bytes: byte_cap(e.max_output_bytes, &format!("{ep}.maxOutputBytes"), p),
    }
}
