//! `runyard-report`: post this CI job's usage to runyard ingest.

use std::process::ExitCode;

use clap::Parser as _;
use runyard_report::{Args, run};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    // Logs go to stderr: stdout is reserved for the `--dry-run` report.
    runyard_telemetry::init_tracing();
    runyard_telemetry::install_crypto_provider();

    match run(&args, |key| std::env::var(key).ok()).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            let error = format!("{:#}", anyhow::Error::from(error));
            if args.fail_on_error {
                tracing::error!(%error, "usage report failed");
                ExitCode::FAILURE
            } else {
                // A reporter must never fail the CI job it measures.
                tracing::warn!(%error, "usage report failed; exiting 0 (see --fail-on-error)");
                ExitCode::SUCCESS
            }
        }
    }
}
