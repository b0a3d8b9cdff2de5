//! `runyard-report`: reads a CI job's usage from cgroup v2 and posts it to
//! ingest's `POST /v1/usage`.
//!
//! The pieces are pure where they can be — [`read_cgroup`] only reads files,
//! [`build_report`] takes the environment as a lookup function and "now" as
//! a value, [`detect_oom`], [`parse_quantity`] and [`parse_cpu`] are plain
//! functions — and [`run`] wires them to the process: the flags in [`Args`],
//! `/proc/self/cgroup`, the clock and the network ([`post`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use secrecy::SecretString;

mod cgroup;
mod post;
mod quantity;
mod report;

pub use cgroup::{
    CGROUP_MOUNT, CgroupUsage, ancestor_memory_limit, cgroup_dir_from_proc, own_cgroup_dir,
    read_cgroup,
};
pub use post::{IngestAnswer, RetryPolicy, USAGE_PATH, http_client, post, usage_url};
pub use quantity::{parse_cpu, parse_duration, parse_quantity};
pub use report::{
    Forge, Report, ReportInputs, build_report, detect_forge, detect_oom, parse_workload,
};

/// Everything that can go wrong while building or posting a report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A memory quantity that isn't one.
    #[error("invalid memory quantity {input:?}: {reason}")]
    Quantity {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A CPU quantity that isn't one.
    #[error("invalid cpu quantity {input:?}: {reason}")]
    Cpu {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A duration flag that isn't one.
    #[error("invalid duration {input:?}: {reason}")]
    Duration {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A workload piece that is not `key=value`.
    #[error("invalid workload pair {pair:?}: expected key=value")]
    WorkloadPair {
        /// The offending piece.
        pair: String,
    },
    /// Some other value that doesn't parse.
    #[error("invalid {field} {value:?}: {reason}")]
    InvalidValue {
        /// The report field or flag.
        field: &'static str,
        /// The text as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither `--forge` nor a CI environment says which forge this is.
    #[error(
        "cannot tell the forge: pass --forge github|gitlab, or run under GitLab CI \
         (GITLAB_CI=true) or GitHub Actions (GITHUB_ACTIONS=true)"
    )]
    UnknownForge,
    /// A required identity field is unknown.
    #[error("missing {what}: {hint}")]
    Missing {
        /// The report field.
        what: &'static str,
        /// How to provide it.
        hint: &'static str,
    },
    /// No ingest URL.
    #[error("no ingest url: pass --url or set RUNYARD_INGEST_URL")]
    MissingUrl,
    /// No usage token.
    #[error("no usage token: pass --token, or set RUNYARD_USAGE_TOKEN or RUNYARD_USAGE_TOKEN_FILE")]
    MissingToken,
    /// The token file can't be read.
    #[error("cannot read token file {path}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The report can't be encoded (not expected to happen).
    #[error("cannot encode the report")]
    Encode(#[source] serde_json::Error),
    /// Writing the dry-run report to stdout failed.
    #[error("cannot write the report to stdout")]
    Stdout(#[source] std::io::Error),
    /// The HTTP client can't be built.
    #[error("cannot build the http client")]
    Client(#[source] reqwest::Error),
    /// Ingest answered with a final (non-retryable) error.
    #[error("ingest rejected the report with status {status}: {body}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// The start of the answer's body (ingest names the bad field).
        body: String,
    },
    /// Ingest kept answering with retryable errors until retries ran out.
    #[error("ingest unavailable after {attempts} attempts, last status {status}: {body}")]
    Unavailable {
        /// The last HTTP status.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The start of the last answer's body.
        body: String,
    },
    /// Ingest could not be reached until retries ran out.
    #[error("cannot reach ingest after {attempts} attempts")]
    Transport {
        /// Attempts made.
        attempts: u32,
        /// The last transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The total deadline passed.
    #[error("gave up after {timeout:?} and {attempts} attempts; last error: {last}")]
    Deadline {
        /// The `--timeout` that passed.
        timeout: Duration,
        /// Attempts made.
        attempts: u32,
        /// The last failure seen.
        last: String,
    },
}

fn parse_secret(value: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(value))
}

/// Command-line flags. Values that come from the forge or from Kubernetes
/// stay strings here and are parsed by [`build_report`], so that a bad value
/// is an ordinary report error, governed by `--fail-on-error`.
#[derive(Debug, Parser)]
#[command(
    name = "runyard-report",
    version,
    about = "Report a CI job's memory and CPU usage (cgroup v2) to runyard ingest",
    long_about = "Report a CI job's memory and CPU usage (cgroup v2) to runyard ingest.\n\n\
        Run it as a job's last step or from the runner after the job. By default it \
        never fails the job: errors are logged as warnings and it exits 0; pass \
        --fail-on-error to exit 1 instead."
)]
pub struct Args {
    /// cgroup v2 directory of the job [default: this process's cgroup, from /proc/self/cgroup]
    #[arg(long, value_name = "PATH")]
    pub cgroup_dir: Option<PathBuf>,

    /// Forge [default: GitLab if GITLAB_CI=true, GitHub if GITHUB_ACTIONS=true]
    #[arg(long, value_enum)]
    pub forge: Option<Forge>,
    /// Forge host [default: GitLab CI_SERVER_URL/CI_SERVER_HOST; GitHub GITHUB_SERVER_URL or github.com]
    #[arg(long)]
    pub instance: Option<String>,
    /// Job id [default on GitLab: CI_JOB_ID; required on GitHub, e.g. ${{ job.check_run_id }}]
    #[arg(long, env = "RUNYARD_JOB_ID")]
    pub job_id: Option<String>,
    /// Attempt number [default: GitHub GITHUB_RUN_ATTEMPT; 1]
    #[arg(long)]
    pub attempt: Option<u32>,
    /// Git ref [default: GitLab CI_COMMIT_REF_NAME; GitHub GITHUB_REF_NAME]
    #[arg(long = "ref", value_name = "REF")]
    pub git_ref: Option<String>,
    /// Project path [default: GitLab CI_PROJECT_PATH; GitHub GITHUB_REPOSITORY]
    #[arg(long)]
    pub project: Option<String>,
    /// Workload attributes `k=v,k=v` (repeatable; `\,` for a literal comma)
    /// [default: GitLab project,job; GitHub repo,workflow,job]
    #[arg(long, env = "RUNYARD_WORKLOAD", value_name = "K=V,...")]
    pub workload: Vec<String>,

    /// Memory request, bytes or a Kubernetes quantity (4Gi, 4000M)
    #[arg(long, env = "KUBERNETES_MEMORY_REQUEST", value_name = "QUANTITY")]
    pub memory_request_bytes: Option<String>,
    /// Memory limit, used only when the cgroup has none (memory.max is `max` or missing)
    #[arg(long, env = "KUBERNETES_MEMORY_LIMIT", value_name = "QUANTITY")]
    pub memory_limit_bytes: Option<String>,
    /// CPU request (1200m, 2, 0.5)
    #[arg(long, env = "KUBERNETES_CPU_REQUEST", value_name = "CPU")]
    pub cpu_request: Option<String>,
    /// Peak memory measured elsewhere (by the runner); overrides memory.peak
    #[arg(long, value_name = "QUANTITY")]
    pub peak_memory_bytes: Option<String>,
    /// CPU seconds measured elsewhere; overrides cpu.stat
    #[arg(long, value_name = "SECONDS")]
    pub cpu_seconds: Option<f64>,
    /// The job is known to have been OOM-killed (e.g. the runner saw OOMKilled)
    #[arg(long)]
    pub oom_killed: bool,
    /// The job's exit code (137 + peak ≥ 95% of the limit counts as OOM when memory.events is missing)
    #[arg(long, env = "RUNYARD_JOB_EXIT_CODE", value_name = "CODE")]
    pub exit_code: Option<String>,
    /// Wall-clock seconds of the job
    #[arg(long, value_name = "SECONDS")]
    pub wall_seconds: Option<f64>,
    /// When the job started (RFC 3339); wall_seconds = now - this
    #[arg(long, env = "CI_JOB_STARTED_AT", value_name = "RFC3339")]
    pub started_at: Option<String>,

    /// Ingest base URL; /v1/usage is appended
    #[arg(long, env = "RUNYARD_INGEST_URL")]
    pub url: Option<String>,
    /// Usage token (prefer the env variable or a file: flags show in `ps`)
    #[arg(long, env = "RUNYARD_USAGE_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub token: Option<SecretString>,
    /// File holding the usage token
    #[arg(long, env = "RUNYARD_USAGE_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// Deadline for the whole post, retries included
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Timeout of one request
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// First retry delay (doubles each retry, with jitter)
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub retry_min_delay: Duration,
    /// Longest retry delay
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub retry_max_delay: Duration,
    /// Retries after the first attempt
    #[arg(long, default_value_t = 10)]
    pub max_retries: usize,
    /// Longest wait honoured from a Retry-After header
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub retry_after_cap: Duration,

    /// Print the report as JSON on stdout and post nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Exit 1 when the report can't be built or posted (default: warn and exit 0)
    #[arg(long)]
    pub fail_on_error: bool,
}

impl Args {
    fn report_inputs(&self) -> ReportInputs {
        ReportInputs {
            forge: self.forge,
            instance: self.instance.clone(),
            job_id: self.job_id.clone(),
            attempt: self.attempt,
            git_ref: self.git_ref.clone(),
            project: self.project.clone(),
            workload: self.workload.clone(),
            memory_request: self.memory_request_bytes.clone(),
            memory_limit: self.memory_limit_bytes.clone(),
            cpu_request: self.cpu_request.clone(),
            peak_memory: self.peak_memory_bytes.clone(),
            cpu_seconds: self.cpu_seconds,
            oom_killed: self.oom_killed,
            exit_code: self.exit_code.clone(),
            wall_seconds: self.wall_seconds,
            started_at: self.started_at.clone(),
        }
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            total_timeout: self.timeout,
            request_timeout: self.request_timeout,
            min_delay: self.retry_min_delay,
            max_delay: self.retry_max_delay,
            max_retries: self.max_retries,
            retry_after_cap: self.retry_after_cap,
        }
    }
}

/// What [`run`] did.
#[derive(Debug)]
pub enum Outcome {
    /// `--dry-run`: the report was printed, not posted.
    Printed(Report),
    /// Ingest accepted the report.
    Accepted(IngestAnswer),
}

/// The usage token: `--token` / `RUNYARD_USAGE_TOKEN`, else the file's
/// contents with trailing whitespace (the newline) trimmed.
pub fn resolve_token(
    token: Option<&SecretString>,
    token_file: Option<&Path>,
) -> Result<SecretString, Error> {
    if let Some(token) = token {
        return Ok(token.clone());
    }
    let path = token_file.ok_or(Error::MissingToken)?;
    let contents = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
        path: path.to_owned(),
        source,
    })?;
    let token = contents.trim_end();
    if token.is_empty() {
        return Err(Error::MissingToken);
    }
    Ok(SecretString::from(token))
}

/// Reads the cgroup, builds the report and posts it (or prints it with
/// `--dry-run`). `env` looks up the CI variables that have no flag of their
/// own (`CI_JOB_ID`, `GITHUB_RUN_ATTEMPT`, ...).
pub async fn run(args: &Args, env: impl Fn(&str) -> Option<String>) -> Result<Outcome, Error> {
    let cgroup_dir = match &args.cgroup_dir {
        Some(dir) => Some(dir.clone()),
        None => own_cgroup_dir(),
    };
    let usage = match &cgroup_dir {
        Some(dir) => {
            let mut usage = read_cgroup(dir);
            if usage.memory_limit_bytes.is_none() {
                usage.memory_limit_bytes = ancestor_memory_limit(dir, Path::new(CGROUP_MOUNT));
            }
            tracing::info!(
                dir = %dir.display(),
                peak_memory_bytes = usage.peak_memory_bytes,
                memory_limit_bytes = usage.memory_limit_bytes,
                oom_kills = usage.oom_kills,
                cpu_usage_usec = usage.cpu_usage_usec,
                "read cgroup"
            );
            usage
        }
        None => {
            tracing::warn!("no cgroup v2 directory found; reporting without cgroup data");
            CgroupUsage::default()
        }
    };

    let report = build_report(
        &args.report_inputs(),
        &usage,
        env,
        time::OffsetDateTime::now_utc(),
    )?;

    if args.dry_run {
        let json = serde_json::to_string_pretty(&report).map_err(Error::Encode)?;
        writeln!(std::io::stdout().lock(), "{json}").map_err(Error::Stdout)?;
        return Ok(Outcome::Printed(report));
    }

    // Ingest requires the peak: without it the report can't train anything,
    // and sending 0 would teach the allocator that the job needs nothing.
    if report.peak_memory_bytes.is_none() {
        return Err(Error::Missing {
            what: "peak_memory_bytes",
            hint: "memory.peak is not readable in the cgroup (cgroup v2 has it from Linux 5.19); \
                   pass --cgroup-dir, or --peak-memory-bytes if the runner measured it",
        });
    }
    let url = usage_url(args.url.as_deref().ok_or(Error::MissingUrl)?)?;
    let token = resolve_token(args.token.as_ref(), args.token_file.as_deref())?;
    let policy = args.retry_policy();
    let client = http_client(&policy)?;
    let answer = post(&client, &url, &token, &report, &policy).await?;
    tracing::info!(
        event_id = answer.event_id.as_deref().unwrap_or("unknown"),
        duplicate = answer.duplicate,
        job_id = report.job_id,
        oom_killed = report.oom_killed,
        "usage report accepted"
    );
    Ok(Outcome::Accepted(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse() {
        let args = Args::try_parse_from([
            "runyard-report",
            "--forge",
            "gitlab",
            "--workload",
            "package=zlib",
            "--workload",
            "version=1.3",
            "--retry-min-delay",
            "10ms",
            "--dry-run",
        ])
        .expect("valid flags");
        assert_eq!(args.forge, Some(Forge::Gitlab));
        assert_eq!(args.workload, ["package=zlib", "version=1.3"]);
        assert_eq!(args.retry_min_delay, Duration::from_millis(10));
        assert_eq!(args.timeout, Duration::from_secs(60));
        assert!(args.dry_run && !args.fail_on_error);
    }

    #[test]
    fn token_never_debug_printed() {
        let args = Args::try_parse_from(["runyard-report", "--token", "hunter2"]).expect("flags");
        assert!(!format!("{args:?}").contains("hunter2"));
    }

    #[test]
    fn token_from_file_is_trimmed() {
        use secrecy::ExposeSecret as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").expect("write token");
        let token = resolve_token(None, Some(&path)).expect("token");
        assert_eq!(token.expose_secret(), "s3cret");
        let flag = SecretString::from("flag");
        let token = resolve_token(Some(&flag), Some(&path)).expect("token");
        assert_eq!(token.expose_secret(), "flag");
        assert!(matches!(
            resolve_token(None, None),
            Err(Error::MissingToken)
        ));
        std::fs::write(&path, "\n").expect("write token");
        assert!(matches!(
            resolve_token(None, Some(&path)),
            Err(Error::MissingToken)
        ));
        assert!(matches!(
            resolve_token(None, Some(&dir.path().join("missing"))),
            Err(Error::TokenFile { .. })
        ));
    }
}
