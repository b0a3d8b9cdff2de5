//! `runyard-report`: post this CI job's usage to runyard ingest, or run a
//! command in a cgroup of its own and post that command's usage.

use std::ffi::OsStr;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};
use runyard_report::{
    Args, Command, EXEC_HELPER_ARG, Error, error_chain, exec_failure_code, run, run_and_report,
    stop_then_exec,
};

fn main() -> ExitCode {
    // `run` starts a copy of this binary that stops itself until it has been
    // moved into the command's cgroup, then becomes the command. It must not
    // do anything else first: no flags, no logging, no runtime.
    let mut argv = std::env::args_os().skip(1);
    if argv.next().as_deref() == Some(OsStr::new(EXEC_HELPER_ARG)) {
        return ExitCode::from(stop_then_exec(&argv.collect::<Vec<_>>()));
    }

    let args = Args::parse();
    if matches!(args.command, Some(Command::Run(_))) && args.cgroup_dir.is_some() {
        Args::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--cgroup-dir cannot be used with `run`: the command gets a cgroup of its own",
            )
            .exit();
    }
    // Logs go to stderr: stdout is reserved for the `--dry-run` report.
    if let Err(error) = runyard_telemetry::init_tracing() {
        tracing::warn!(%error, "traces are not exported");
    }
    runyard_telemetry::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let env = |key: &str| std::env::var(key).ok();

    let Some(Command::Run(run_args)) = &args.command else {
        return match runtime.block_on(run(&args, env)) {
            Ok(_) => ExitCode::SUCCESS,
            Err(error) => report_failed(&args, &error, "exiting 0"),
        };
    };
    match runtime.block_on(run_and_report(&args, run_args, env)) {
        Ok(outcome) => {
            let report_failed = match &outcome.report {
                Ok(_) => false,
                Err(error) => {
                    report_failed(&args, error, "exiting with the command's code")
                        != ExitCode::SUCCESS
                }
            };
            // The step fails as the command did; a failed report only turns
            // a success into a failure, and only with --fail-on-error.
            let code = match outcome.exit_code {
                0 if report_failed => 1,
                code => code,
            };
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "cannot run the command");
            match &error {
                Error::Spawn { source, .. } => ExitCode::from(exec_failure_code(source)),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

/// Logs a failed report and says how to exit: 1 with `--fail-on-error`,
/// else 0, because a reporter must never fail the CI job it measures.
/// `lenient` says what happens without `--fail-on-error`.
fn report_failed(args: &Args, error: &Error, lenient: &str) -> ExitCode {
    let error = error_chain(error);
    if args.fail_on_error {
        tracing::error!(%error, "usage report failed");
        ExitCode::FAILURE
    } else {
        tracing::warn!(%error, "usage report failed; {lenient} (see --fail-on-error)");
        ExitCode::SUCCESS
    }
}
