//! `runyard`: the operator's command line.
//!
//! `runyard provider check <provider> --config <scaler.toml>` runs a
//! provider configured for the scaler through the calls the scaler makes
//! (create, get, list, delete, delete again, list) against its real
//! backend, with an instance that registers no runner, and says whether
//! it behaves as runyard needs. Exit codes: 0 every step passed, 1 a step
//! failed, 2 a usage or configuration error.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod check;

/// runyard's command line.
#[derive(Parser, Debug)]
#[command(name = "runyard", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Providers of the scaler's configuration.
    Provider {
        #[command(subcommand)]
        command: ProviderCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ProviderCommand {
    /// Runs a provider through create, get, list, delete, delete again and
    /// list against its real backend, as the scaler would call it. The
    /// instance (`ry-check-<hex>`) gets a placeholder JIT config, so no
    /// runner registers; it is deleted at the end. Exit 0: every step
    /// passed; 1: a step failed; 2: usage or configuration error.
    Check(CheckArgs),
}

/// `runyard provider check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The provider's name (`[providers.<name>]` in the scaler's file).
    pub provider: String,
    /// The scaler's pools-and-providers file.
    #[arg(long, env = "RUNYARD_SCALER_CONFIG")]
    pub config: PathBuf,
    /// The namespace the controller id is derived from (as the scaler's
    /// `RUNYARD_NAMESPACE`).
    #[arg(long, env = "RUNYARD_NAMESPACE", default_value = "runyard")]
    pub namespace: String,
    /// The pool whose id, image, flavor, extra specs and OS the instance
    /// gets (default: the first pool using the provider, else a pool named
    /// `runyard-check` with none of them).
    #[arg(long)]
    pub pool: Option<String>,
    /// Image instead of the pool's.
    #[arg(long)]
    pub image: Option<String>,
    /// Flavor name instead of the pool's smallest.
    #[arg(long)]
    pub flavor: Option<String>,
    /// How long the last listing waits for the deleted instance to
    /// disappear (for backends that delete asynchronously).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub wait_gone: u64,
    /// Print a machine-readable JSON report on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Provider {
            command: ProviderCommand::Check(args),
        } => check::run(&args).await,
    }
}

/// Writes to stdout; a closed stdout (`| head`) is not an error worth
/// failing a check over.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}
