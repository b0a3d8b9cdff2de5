//! `runyard`: the operator's command line (see the crate's `lib.rs` and
//! docs/cli.md).

use std::process::ExitCode;

use clap::Parser as _;

#[tokio::main]
async fn main() -> ExitCode {
    Box::pin(runyard_cli::run(runyard_cli::Cli::parse())).await
}
