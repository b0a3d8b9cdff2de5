//! `runyard-job-tracker`: projects the event log into Postgres.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use runyard_job_tracker::{App, Config, rebuild};

/// Projects runyard's event log into Postgres, exactly once.
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
    /// Consume the event log (the default).
    Run,
    /// Create the database if needed and run the migrations, then exit.
    Migrate,
    /// Replay the whole stream into a fresh database.
    Rebuild {
        /// Database to build (default `<live>_rebuild`); dropped first.
        #[arg(long)]
        into: Option<String>,
        /// Swap the rebuilt database in for the live one when done.
        #[arg(long)]
        swap: bool,
        /// Events per transaction.
        #[arg(long, default_value_t = 5000)]
        batch_size: usize,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    runyard_telemetry::install_crypto_provider();
    runyard_telemetry::init_tracing().context("starting trace export")?;
    let args = Args::parse();
    let config = Config::load(args.config.as_deref()).context("loading configuration")?;
    match args.command.unwrap_or(Command::Run) {
        Command::Run => {
            let app = App::build(config).await.context("starting job-tracker")?;
            runyard_telemetry::traces::exporting(app.run(runyard_telemetry::shutdown_signal()))
                .await
        }
        Command::Migrate => runyard_store::migrate(&config.database.url)
            .await
            .context("migrating"),
        Command::Rebuild {
            into,
            swap,
            batch_size,
        } => {
            let ns = runyard_events::Namespace::new(config.bus.namespace.clone())?;
            let bus = runyard_bus::Bus::connect(
                &config.bus.nats_url,
                ns,
                "runyard-job-tracker-rebuild",
                false,
            )
            .await?;
            let opts = rebuild::RebuildOptions {
                live_url: config.database.url,
                into,
                swap,
                batch_size,
            };
            let (url, done) = rebuild::rebuild(&bus, &opts).await?;
            tracing::info!(database = %runyard_config::redact::url(&url), applied = done.applied, skipped = done.skipped, through = done.through, "rebuild finished");
            Ok(())
        }
    }
}
