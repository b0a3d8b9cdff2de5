//! `runyard-report`: reads a CI job's usage from its cgroup (v1 or v2) and
//! posts it to ingest's `POST /v1/usage`; `runyard-report run -- CMD` runs a
//! command in a fresh cgroup of its own (optionally with a memory limit) and
//! reports that command's usage.
//!
//! The pieces are pure where they can be — [`read_cgroup_v1`],
//! [`read_cgroup_v2`] and [`read_cgroup`] only read files from the
//! directories they are given, [`locate_cgroup`] only parses
//! `/proc/self/cgroup` and `/proc/self/mountinfo`, [`build_report`] takes the
//! environment as a lookup function and "now" as a value, [`detect_oom`],
//! [`parse_quantity`] and [`parse_cpu`] are plain functions — and [`run`] and
//! [`run_and_report`] wire them to the process: the flags in [`Args`], the
//! cgroup filesystem ([`create_child_group`], [`run_command`]), the clock and
//! the network ([`post`]).

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use secrecy::{ExposeSecret as _, SecretString};

mod cgroup;
mod child;
mod command;
pub mod identity;
mod post;
mod quantity;
mod report;

pub use cgroup::{
    CGROUP_MOUNT, CgroupDirs, CgroupUsage, CgroupVersion, ancestor_memory_limit, locate_cgroup,
    own_cgroup, read_cgroup, read_cgroup_v1, read_cgroup_v2,
};
pub use child::{ChildGroup, create_child_group};
pub use command::{
    CommandRun, EXEC_HELPER_ARG, exec_failure_code, exit_code_of, run_command, stop_then_exec,
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
    #[error(
        "no credential: set RUNYARD_ID_TOKEN (the job's CI identity token), run on GitHub Actions \
         with `permissions: id-token: write`, or pass --token / set RUNYARD_USAGE_TOKEN or \
         RUNYARD_USAGE_TOKEN_FILE"
    )]
    MissingToken,
    /// GitHub Actions would not hand out the job's identity token.
    #[error("cannot get the job's identity token from ACTIONS_ID_TOKEN_REQUEST_URL: {reason}")]
    IdTokenRequest {
        /// Why (never a token).
        reason: String,
    },
    /// The token file can't be read.
    #[error(transparent)]
    TokenFile(#[from] runyard_config::secrets::SecretError),
    /// The report can't be encoded (not expected to happen).
    #[error("cannot encode the report")]
    Encode(#[source] serde_json::Error),
    /// Writing the dry-run report to stdout failed.
    #[error("cannot write the report to stdout")]
    Stdout(#[source] std::io::Error),
    /// `RUNYARD_INGEST_CA_FILE` cannot be used.
    #[error("RUNYARD_INGEST_CA_FILE {path}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
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
    /// No cgroup could be found for this process.
    #[error(
        "cannot find this process's cgroup: neither a mounted cgroup v1 memory hierarchy nor a \
         mounted cgroup v2 hierarchy in /proc/self/cgroup and /proc/self/mountinfo"
    )]
    NoCgroup,
    /// A cgroup file or directory can't be made, written or removed.
    #[error("cannot {action} {path}")]
    Cgroup {
        /// What was being done (`create`, `set the memory limit in`, ...).
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `run`: the command can't be started.
    #[error("cannot start {program:?}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `run`: the command can't be waited for.
    #[error("cannot {action} the command")]
    Command {
        /// What was being done.
        action: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
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

/// `error` and its sources, joined by `: ` (`cannot create /x: Permission
/// denied (os error 13)`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
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
    about = "Report a CI job's memory and CPU usage (cgroup v1 or v2) to runyard ingest",
    long_about = "Report a CI job's memory and CPU usage (cgroup v1 or v2) to runyard ingest.\n\n\
        Run it as a job's last step or from the runner after the job, or wrap the job's \
        command with `runyard-report run [flags] -- CMD ARGS...`. By default it never fails \
        the job: errors are logged as warnings and it exits 0 (with `run`: the command's \
        exit code); pass --fail-on-error to exit 1 instead."
)]
pub struct Args {
    /// `run -- CMD`: run a command in a cgroup of its own and report it.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// cgroup directory of the job: a cgroup v2 group, or a cgroup v1 memory group (CPU time is then read from the same directory) [default: this process's cgroup, from /proc/self/cgroup and /proc/self/mountinfo]
    #[arg(long, global = true, value_name = "PATH")]
    pub cgroup_dir: Option<PathBuf>,

    /// Forge [default: GitLab if GITLAB_CI=true, GitHub if GITHUB_ACTIONS=true]
    #[arg(long, global = true, value_enum)]
    pub forge: Option<Forge>,
    /// Forge host [default: GitLab CI_SERVER_URL/CI_SERVER_HOST; GitHub GITHUB_SERVER_URL or github.com]
    #[arg(long, global = true)]
    pub instance: Option<String>,
    /// Job id [default on GitLab: CI_JOB_ID; required on GitHub, e.g. ${{ job.check_run_id }}]
    #[arg(long, global = true, env = "RUNYARD_JOB_ID")]
    pub job_id: Option<String>,
    /// Attempt number [default: GitHub GITHUB_RUN_ATTEMPT; 1]
    #[arg(long, global = true)]
    pub attempt: Option<u32>,
    /// Git ref [default: GitLab CI_COMMIT_REF_NAME; GitHub GITHUB_REF_NAME]
    #[arg(long = "ref", global = true, value_name = "REF")]
    pub git_ref: Option<String>,
    /// Project path [default: GitLab CI_PROJECT_PATH; GitHub GITHUB_REPOSITORY]
    #[arg(long, global = true)]
    pub project: Option<String>,
    /// Workload attributes `k=v,k=v` (repeatable; `\,` for a literal comma)
    /// [default: GitLab project,job; GitHub repo,workflow,job]
    #[arg(long, global = true, env = "RUNYARD_WORKLOAD", value_name = "K=V,...")]
    pub workload: Vec<String>,

    /// Memory request, bytes or a Kubernetes quantity (4Gi, 4000M)
    #[arg(
        long,
        global = true,
        env = "KUBERNETES_MEMORY_REQUEST",
        value_name = "QUANTITY"
    )]
    pub memory_request_bytes: Option<String>,
    /// Memory limit to report, used only when the cgroup shows none (the limit is not enforced; see `run --memory-limit`)
    #[arg(
        long,
        global = true,
        env = "KUBERNETES_MEMORY_LIMIT",
        value_name = "QUANTITY"
    )]
    pub memory_limit_bytes: Option<String>,
    /// CPU request (1200m, 2, 0.5)
    #[arg(
        long,
        global = true,
        env = "KUBERNETES_CPU_REQUEST",
        value_name = "CPU"
    )]
    pub cpu_request: Option<String>,
    /// Peak memory measured elsewhere (by the runner); overrides the cgroup's peak
    #[arg(long, global = true, value_name = "QUANTITY")]
    pub peak_memory_bytes: Option<String>,
    /// CPU seconds measured elsewhere; overrides the cgroup's CPU time
    #[arg(long, global = true, value_name = "SECONDS")]
    pub cpu_seconds: Option<f64>,
    /// The job is known to have been OOM-killed (e.g. the runner saw OOMKilled)
    #[arg(long, global = true)]
    pub oom_killed: bool,
    /// The job's exit code (137 + peak ≥ 95% of the limit counts as OOM when the cgroup's oom_kill count is unknown); `run` uses CMD's
    #[arg(
        long,
        global = true,
        env = "RUNYARD_JOB_EXIT_CODE",
        value_name = "CODE"
    )]
    pub exit_code: Option<String>,
    /// Wall-clock seconds of the job [default with `run`: CMD's]
    #[arg(long, global = true, value_name = "SECONDS")]
    pub wall_seconds: Option<f64>,
    /// When the job started (RFC 3339); wall_seconds = now - this
    #[arg(long, global = true, env = "CI_JOB_STARTED_AT", value_name = "RFC3339")]
    pub started_at: Option<String>,

    /// Ingest base URL; /v1/usage is appended
    #[arg(long, global = true, env = "RUNYARD_INGEST_URL")]
    pub url: Option<String>,
    /// CA bundle (PEM) to trust besides the public roots, for an https
    /// ingest whose certificate a private CA signed
    #[arg(
        long,
        global = true,
        env = "RUNYARD_INGEST_CA_FILE",
        value_name = "PATH"
    )]
    pub ca_file: Option<PathBuf>,
    /// Usage token (prefer the env variable or a file: flags show in `ps`)
    #[arg(long, global = true, env = "RUNYARD_USAGE_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub token: Option<SecretString>,
    /// File holding the usage token
    #[arg(
        long,
        global = true,
        env = "RUNYARD_USAGE_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub token_file: Option<PathBuf>,
    /// The job's CI identity token (GitLab: an `id_tokens` variable);
    /// preferred to the usage token [default on GitHub Actions: requested
    /// from ACTIONS_ID_TOKEN_REQUEST_URL]
    #[arg(long, global = true, env = "RUNYARD_ID_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub id_token: Option<SecretString>,
    /// Audience of the identity token requested on GitHub Actions (what
    /// ingest's RUNYARD_USAGE_OIDC names for the issuer)
    #[arg(
        long,
        global = true,
        env = "RUNYARD_ID_TOKEN_AUDIENCE",
        default_value = "runyard"
    )]
    pub id_token_audience: String,

    /// Deadline for the whole post, retries included
    #[arg(long, global = true, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Timeout of one request
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// First retry delay (doubles each retry, with jitter)
    #[arg(long, global = true, default_value = "500ms", value_parser = parse_duration)]
    pub retry_min_delay: Duration,
    /// Longest retry delay
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub retry_max_delay: Duration,
    /// Retries after the first attempt
    #[arg(long, global = true, default_value_t = 10)]
    pub max_retries: usize,
    /// Longest wait honoured from a Retry-After header
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub retry_after_cap: Duration,

    /// Print the report as JSON on stdout and post nothing
    #[arg(long, global = true)]
    pub dry_run: bool,
    /// Exit 1 when the report can't be built or posted (default: warn and exit 0)
    #[arg(long, global = true)]
    pub fail_on_error: bool,
}

/// Subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Run CMD in a fresh cgroup of its own, then report its usage; exits with CMD's exit code
    #[command(
        long_about = "Run CMD in a fresh cgroup of its own, then report its usage.\n\n\
            The group is a child of this process's cgroup: on cgroup v2 where that group hands \
            the memory controller down (memory in cgroup.subtree_control), else on cgroup v1 in \
            the memory (and cpuacct) hierarchy. Where no group can be made, CMD runs in this \
            process's cgroup, which is read after CMD ends, and a warning says why.\n\n\
            The report's exit_code is CMD's (128+N when signal N killed it: 137 for an OOM \
            kill), and runyard-report exits with that same code, so a CI step fails as CMD \
            did. With --fail-on-error a report that can't be posted turns a 0 into 1."
    )]
    Run(RunArgs),
}

/// Flags of `run`. The report flags of [`Args`] may also be given after
/// `run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Memory limit to enforce on CMD, bytes or a quantity (64Mi, 4Gi); swap is not allowed on top [default: none, the group only measures]
    #[arg(long, value_name = "QUANTITY", value_parser = parse_memory_limit)]
    pub memory_limit: Option<u64>,
    /// The command to run and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn parse_memory_limit(value: &str) -> Result<u64, Error> {
    match parse_quantity(value)? {
        0 => Err(Error::Quantity {
            input: value.to_owned(),
            reason: "a memory limit must be more than 0 bytes".to_owned(),
        }),
        bytes => Ok(bytes),
    }
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
/// contents read by the services' one `*_FILE` reader (trailing whitespace
/// trimmed, nothing else: [`runyard_config::secrets::read_file`]).
pub fn resolve_token(
    token: Option<&SecretString>,
    token_file: Option<&Path>,
) -> Result<SecretString, Error> {
    if let Some(token) = token {
        return Ok(token.clone());
    }
    let path = token_file.ok_or(Error::MissingToken)?;
    let token = runyard_config::secrets::read_file("RUNYARD_USAGE_TOKEN_FILE", path)?;
    if token.expose_secret().is_empty() {
        return Err(Error::MissingToken);
    }
    Ok(token)
}

/// The bearer credential a report is sent with (see [`identity`]): the
/// given identity token, else one requested from GitHub Actions, else the
/// shared usage token.
async fn credential(
    args: &Args,
    client: &reqwest::Client,
    env: &impl Fn(&str) -> Option<String>,
    policy: &RetryPolicy,
) -> Result<(SecretString, identity::Source), Error> {
    if let Some(token) = &args.id_token {
        return Ok((token.clone(), identity::Source::Given));
    }
    let requested = identity::request_github_token(
        client,
        env,
        &args.id_token_audience,
        policy.request_timeout,
    )
    .await;
    match requested {
        Some(Ok(token)) => Ok((token, identity::Source::Requested)),
        Some(Err(error)) => {
            // A shared token still gets the report in.
            match resolve_token(args.token.as_ref(), args.token_file.as_deref()) {
                Ok(token) => {
                    tracing::warn!(%error, "posting with the usage token instead");
                    Ok((token, identity::Source::Shared))
                }
                Err(_) => Err(error),
            }
        }
        None => resolve_token(args.token.as_ref(), args.token_file.as_deref())
            .map(|t| (t, identity::Source::Shared)),
    }
}

/// What [`run_and_report`] did.
#[derive(Debug)]
pub struct RunOutcome {
    /// The command's exit code (`128 + N` when signal N killed it).
    pub exit_code: i32,
    /// What became of the report.
    pub report: Result<Outcome, Error>,
}

/// Reads the cgroup, builds the report and posts it (or prints it with
/// `--dry-run`). `env` looks up the CI variables that have no flag of their
/// own (`CI_JOB_ID`, `GITHUB_RUN_ATTEMPT`, ...).
pub async fn run(args: &Args, env: impl Fn(&str) -> Option<String>) -> Result<Outcome, Error> {
    let usage = read_usage(args.cgroup_dir.as_deref());
    deliver(args, &args.report_inputs(), &usage, env).await
}

/// `runyard-report run`: runs the command in a cgroup of its own
/// ([`run_command`]), then reports its usage with its exit code and, unless
/// `--wall-seconds` says otherwise, its wall-clock time. An error means the
/// command could not be started or waited for; a report that fails is in
/// [`RunOutcome::report`].
pub async fn run_and_report(
    args: &Args,
    run: &RunArgs,
    env: impl Fn(&str) -> Option<String>,
) -> Result<RunOutcome, Error> {
    let command = run_command(&run.command, run.memory_limit).await?;
    let inputs = ReportInputs {
        exit_code: Some(command.exit_code.to_string()),
        wall_seconds: args.wall_seconds.or(Some(command.wall_seconds)),
        ..args.report_inputs()
    };
    let report = deliver(args, &inputs, &command.usage, env).await;
    Ok(RunOutcome {
        exit_code: command.exit_code,
        report,
    })
}

/// The usage in `--cgroup-dir`, else in this process's cgroup.
fn read_usage(cgroup_dir: Option<&Path>) -> CgroupUsage {
    let dirs = match cgroup_dir {
        Some(dir) => Some(CgroupDirs::from_dir(dir)),
        None => own_cgroup(),
    };
    let Some(dirs) = dirs else {
        tracing::warn!("no cgroup found; reporting without cgroup data");
        return CgroupUsage::default();
    };
    let usage = read_cgroup(&dirs);
    tracing::info!(
        dir = %dirs.memory.display(),
        version = %dirs.version,
        peak_memory_bytes = usage.peak_memory_bytes,
        memory_limit_bytes = usage.memory_limit_bytes,
        oom_kills = usage.oom_kills,
        cpu_usage_usec = usage.cpu_usage_usec,
        "read cgroup"
    );
    usage
}

/// Builds the report and posts it, or prints it with `--dry-run`.
async fn deliver(
    args: &Args,
    inputs: &ReportInputs,
    usage: &CgroupUsage,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Outcome, Error> {
    let report = build_report(inputs, usage, &env, time::OffsetDateTime::now_utc())?;

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
            hint: "the cgroup shows no peak (memory.peak on cgroup v2, from Linux 5.19; \
                   memory.max_usage_in_bytes on cgroup v1); pass --cgroup-dir, or \
                   --peak-memory-bytes if the runner measured it",
        });
    }
    let url = usage_url(args.url.as_deref().ok_or(Error::MissingUrl)?)?;
    let policy = args.retry_policy();
    let client = http_client(&policy, args.ca_file.as_deref())?;
    let (token, source) = credential(args, &client, &env, &policy).await?;
    tracing::info!(credential = source.as_str(), "posting the usage report");
    let answer = match post(&client, &url, &token, &report, &policy).await {
        // An ingest that does not take identity tokens (no
        // RUNYARD_USAGE_OIDC) refuses the one GitHub handed out: the shared
        // token, when there is one, is what it takes.
        Err(Error::Rejected { status: 401, .. })
            if source == identity::Source::Requested
                && (args.token.is_some() || args.token_file.is_some()) =>
        {
            tracing::warn!("ingest refused the job's identity token; posting with the usage token");
            let shared = resolve_token(args.token.as_ref(), args.token_file.as_deref())?;
            post(&client, &url, &shared, &report, &policy).await?
        }
        other => other?,
    };
    tracing::info!(
        event_id = answer.event_id.as_deref().unwrap_or("unknown"),
        duplicate = answer.duplicate,
        job_id = report.job_id,
        oom_killed = report.oom_killed,
        cgroup = report.cgroup.map(|version| version.to_string()),
        "usage report accepted"
    );
    Ok(Outcome::Accepted(answer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let args =
            Args::try_parse_from(["runyard-report", "--token", secret, "--id-token", secret])
                .unwrap();
        let shown = format!("{args:?}");
        assert!(!shown.contains(secret), "{shown}");
        assert!(shown.contains("token: Some("), "{shown}");
    }

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
    fn run_takes_report_flags_before_and_after_it() {
        let args = Args::try_parse_from([
            "runyard-report",
            "--forge",
            "gitlab",
            "run",
            "--memory-limit",
            "64Mi",
            "--job-id",
            "4711",
            "--dry-run",
            "--",
            "python3",
            "-c",
            "print('--forge github')",
        ])
        .expect("valid flags");
        let Some(Command::Run(run)) = &args.command else {
            panic!("not run: {args:?}");
        };
        assert_eq!(run.memory_limit, Some(64 << 20));
        assert_eq!(run.command, ["python3", "-c", "print('--forge github')"]);
        assert_eq!(args.forge, Some(Forge::Gitlab));
        assert_eq!(args.job_id.as_deref(), Some("4711"));
        assert!(args.dry_run);

        let args = Args::try_parse_from(["runyard-report", "run", "--", "true"]).expect("flags");
        let Some(Command::Run(run)) = &args.command else {
            panic!("not run: {args:?}");
        };
        assert_eq!(run.memory_limit, None, "no limit unless asked");
    }

    #[test]
    fn run_needs_a_command_and_a_real_limit() {
        assert!(Args::try_parse_from(["runyard-report", "run"]).is_err());
        assert!(Args::try_parse_from(["runyard-report", "run", "--"]).is_err());
        for limit in ["0", "lots", "-1"] {
            let flag = format!("--memory-limit={limit}");
            let err = Args::try_parse_from(["runyard-report", "run", &flag, "--", "true"])
                .expect_err(limit);
            assert!(err.to_string().contains("--memory-limit"), "{err}");
        }
        // Without `run` there is nothing to limit.
        assert!(Args::try_parse_from(["runyard-report", "--memory-limit", "1Gi"]).is_err());
    }

    #[test]
    fn error_chain_names_the_cause() {
        let error = Error::Cgroup {
            action: "create",
            path: PathBuf::from("/sys/fs/cgroup/memory/runyard-1"),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert_eq!(
            error_chain(&error),
            "cannot create /sys/fs/cgroup/memory/runyard-1: permission denied"
        );
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
            Err(Error::TokenFile(_))
        ));
    }
}
