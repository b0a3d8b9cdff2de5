//! `runyard-scaler`: keeps pools of CI runners at the size the queue needs.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use runyard_scaler::{App, Config};

/// Keeps pools of CI runners at the size the queue needs.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// TOML file with the service settings; environment variables override
    /// it. Pools and providers come from `RUNYARD_SCALER_CONFIG`.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    runyard_telemetry::init_tracing();
    let args = Args::parse();
    let config = Config::load(args.config.as_deref()).context("loading configuration")?;
    let app = App::build(config, None).await.context("starting scaler")?;
    app.run(runyard_telemetry::shutdown_signal()).await
}
