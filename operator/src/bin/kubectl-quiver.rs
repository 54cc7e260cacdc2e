//! kubectl-quiver: the `kubectl quiver` plugin (tools, call, status, revoke, check). Exit codes:
//! 0 success, 1 a negative answer, 2 usage, 3 Kubernetes, 4 the MCP server.

use std::process::ExitCode;

use clap::Parser;
use quiver_operator::plugin::{self, args::Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt.block_on(plugin::run(cli)),
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            ExitCode::from(1)
        }
    }
}
