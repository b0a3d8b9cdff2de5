//! `runyard-ingest`: webhooks and usage reports into durable JetStream events.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;

/// Every delivery allocates a few hundred small objects (JSON members,
/// header maps, events) across the runtime's threads; mimalloc's per-thread
/// free lists keep that cheap under load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Verifies and normalizes GitHub/GitLab webhooks and usage reports into
/// events on the NATS JetStream event log.
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
    let config =
        runyard_ingest::Config::load(args.config.as_deref()).context("loading configuration")?;
    let app = runyard_ingest::App::build(config)
        .await
        .context("starting ingest")?;
    runyard_telemetry::traces::exporting(app.run(runyard_telemetry::shutdown_signal())).await
}
