//! `runyard-console`: read-only web pages over runyard's projection.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use runyard_console::{App, Config};

/// Serves the runyard console.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// TOML configuration file; environment variables override it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    runyard_telemetry::init_tracing().context("starting trace export")?;
    let args = Args::parse();
    let config = Config::load(args.config.as_deref()).context("loading configuration")?;
    let app = App::build(config).await.context("starting the console")?;
    runyard_telemetry::traces::exporting(app.run(runyard_telemetry::shutdown_signal())).await
}
