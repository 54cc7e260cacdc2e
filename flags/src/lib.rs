//! `quiver-server`'s command line, apart from the server: the flags with their defaults,
//! environment variables and value types. The server parses its command line with it; the
//! operator and `kubectl quiver check` run the same parser over the arguments and
//! environment they render for a pod, so that a value the McpServer accepts and the server
//! refuses is reported on the McpServer instead of crashing its pods.

pub mod cli;
pub mod values;

use clap::{CommandFactory, FromArgMatches};

pub use self::cli::{AdminListen, Cli, Command, ServeArgs, is_registry_name};
pub use self::values::{
    AuditSink, ChildIsolation, Cidr, DEFAULT_AUDIT_QUEUE, DEFAULT_MAX_LIMIT_KEYS, FailMode, Instance,
    MAX_AUDIT_QUEUE, OnFull, SecretSource, Source, parse_ref,
};

/// Values clap reads as `false` for a flag without a value set through its environment
/// variable (its `FalseyValueParser`).
const FALSEY: [&str; 7] = ["", "0", "n", "no", "f", "false", "off"];

/// Parses a server container's arguments (after the program name) and its environment
/// variables with literal values, exactly as `quiver-server` parses them at start, and
/// nothing else: this process's own environment is not read.
///
/// # Errors
/// The server's own message for the first value it refuses, or a subcommand where serving
/// was meant.
pub fn parse_serve<'a>(
    args: &[String],
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<ServeArgs, String> {
    let command = Cli::command();
    let mut argv = vec!["quiver-server".to_owned()];
    argv.extend(args.iter().cloned());
    for (name, value) in env {
        let Some(arg) = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name))
        else {
            continue;
        };
        let Some(long) = arg.get_long() else { continue };
        if arg.get_action().takes_values() {
            argv.push(format!("--{long}={value}"));
        } else if !FALSEY.contains(&value.to_ascii_lowercase().as_str()) {
            argv.push(format!("--{long}"));
        }
    }
    // Hermetic: the environment of the process running the check is not the pod's.
    let command = command.mut_args(|a| a.env(None));
    let matches = command
        .try_get_matches_from(argv)
        .map_err(|e| e.render().to_string().trim_end().to_owned())?;
    let cli = Cli::from_arg_matches(&matches).map_err(|e| e.to_string().trim_end().to_owned())?;
    match cli.command {
        None => Ok(cli.serve),
        Some(_) => Err("the arguments name a subcommand, not serving".to_owned()),
    }
}

#[cfg(test)]
mod tests;
