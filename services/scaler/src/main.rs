//! `runyard-scaler`: keeps pools of CI runners at the size the queue needs.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use runyard_scaler::{App, Config, simulate};

/// Keeps pools of CI runners at the size the queue needs.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// TOML file with the service settings; environment variables override
    /// it. Pools and providers come from `RUNYARD_SCALER_CONFIG`.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Scale runners (the default).
    Run,
    /// Run the scaling policy in virtual time against garm's and ARC's and
    /// compare queue wait and runner-minutes.
    Simulate(simulate::SimulateArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(Command::Simulate(sim)) = &args.command {
        let report = simulate::run(sim)?;
        writeln!(std::io::stdout().lock(), "{report}").context("writing the report")?;
        return Ok(());
    }
    runyard_telemetry::install_crypto_provider();
    runyard_telemetry::init_tracing().context("starting trace export")?;
    let config = Config::load(args.config.as_deref()).context("loading configuration")?;
    let app = App::build(config, None).await.context("starting scaler")?;
    runyard_telemetry::traces::exporting(app.run(runyard_telemetry::shutdown_signal())).await
}
