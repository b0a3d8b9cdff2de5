//! `runyard`: the operator's command line (see the crate's `lib.rs` and
//! docs/cli.md).

use std::process::ExitCode;

#[tokio::main]
async fn main() -> ExitCode {
    Box::pin(runyard_cli::run(runyard_cli::stack_env::parse())).await
}
