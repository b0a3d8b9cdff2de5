//! `runyard-allocator`: CPU and memory recommendations for CI jobs.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use runyard_allocator::{App, Config, simulate};

/// Every request allocates a little (maps, strings, events); mimalloc's
/// per-thread free lists keep that cheap under load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Recommends CPU and memory for CI jobs from the history of the same
/// workload (gRPC and gantry-compatible HTTP).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// TOML configuration file; environment variables override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve recommendations (the default).
    Run,
    /// Replay a job trace through the model and gantry's rule and compare.
    Simulate(Box<simulate::SimulateArgs>),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    runyard_telemetry::init_tracing().context("starting trace export")?;
    let args = Args::parse();
    match args.command.unwrap_or(Command::Run) {
        Command::Run => {
            let config = Config::load(args.config.as_deref()).context("loading configuration")?;
            let app = App::build(config).await.context("starting allocator")?;
            runyard_telemetry::traces::exporting(app.run(runyard_telemetry::shutdown_signal()))
                .await
        }
        Command::Simulate(sim) => simulate::run(&sim),
    }
}
