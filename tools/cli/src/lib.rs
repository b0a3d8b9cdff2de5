//! `runyard`: the operator's command line.
//!
//! - `runyard doctor` checks NATS, Postgres, every service, the
//!   allocator's gRPC and the scaler's scale-set pools' Actions service
//!   connections, and says what is wrong and how to fix it;
//! - `runyard events tail` prints (and follows) the event log, decoded;
//! - `runyard jobs`, `runyard runners` read the Postgres projection,
//!   `runyard pools` the scaler's `GET /v1/pools`, `runyard recommend`
//!   asks the allocator over gRPC, `runyard savings` sums up what runyard
//!   did over a window;
//! - `runyard replay DIR` signs and sends fixture deliveries to ingest,
//!   `runyard rebuild` rebuilds the projection from the event log;
//! - `runyard provider check` runs a scaler provider through its calls.
//!
//! Every service address is a flag with a loopback default and a
//! `RUNYARD_*` fallback; a stack `scripts/dev.sh up` started is found
//! from the file it writes ([`stack_env`]). Tables for people, `--json` for scripts. Exit
//! codes: [`EXIT_OK`], [`EXIT_FAILED`], [`EXIT_USAGE`] (docs/cli.md).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub mod check;
pub mod doctor;
pub mod events;
pub mod query;
pub mod rebuild;
pub mod replay;
pub mod savings;
pub mod stack_env;

/// Everything asked for was done or every check passed.
pub const EXIT_OK: u8 = 0;
/// A check or an operation failed (a service down, a failed delivery, ...).
pub const EXIT_FAILED: u8 = 1;
/// The command line or the configuration is wrong; nothing was done.
pub const EXIT_USAGE: u8 = 2;

/// runyard's command line.
#[derive(Parser, Debug)]
#[command(name = "runyard", version, about = "runyard's operator command line")]
pub struct Cli {
    /// Where the services are.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Service addresses and output format, shared by every subcommand.
#[derive(Args, Clone)]
pub struct Global {
    /// NATS server.
    #[arg(
        long,
        global = true,
        env = "RUNYARD_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// Namespace: subject prefix, stream names (`<NS>_EVENTS`), controller id.
    #[arg(
        long,
        global = true,
        env = "RUNYARD_NAMESPACE",
        default_value = "runyard"
    )]
    pub namespace: String,
    /// The projection's Postgres database.
    #[arg(
        long,
        global = true,
        env = "RUNYARD_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/runyard",
        hide_env_values = true
    )]
    pub database_url: String,
    /// The allocator's gRPC endpoint.
    #[arg(
        long,
        global = true,
        env = "RUNYARD_ALLOCATOR_URL",
        default_value = "http://127.0.0.1:50051"
    )]
    pub allocator_url: String,
    /// Bearer token sent to the allocator.
    #[arg(
        long,
        global = true,
        env = "RUNYARD_ALLOCATOR_CLIENT_TOKEN",
        hide_env_values = true
    )]
    pub allocator_token: Option<String>,
    /// CA bundle (PEM) the allocator's certificate is checked against for
    /// an `https://` URL, instead of the public roots; the HTTP calls to
    /// every service trust it too.
    #[arg(long, global = true, env = "RUNYARD_ALLOCATOR_CA_FILE")]
    pub allocator_ca_file: Option<String>,
    /// Client certificate (PEM) presented to an allocator that wants one
    /// (mTLS), and to the other services over https; with
    /// `--allocator-client-key`.
    #[arg(long, global = true, env = "RUNYARD_ALLOCATOR_CLIENT_CERT")]
    pub allocator_client_cert: Option<String>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "RUNYARD_ALLOCATOR_CLIENT_KEY")]
    pub allocator_client_key: Option<String>,
    /// ingest's HTTP base URL.
    #[arg(
        long,
        global = true,
        env = "RUNYARD_INGEST_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub ingest_url: String,
    /// job-tracker's HTTP base URL (`/readyz`).
    #[arg(
        long,
        global = true,
        env = "RUNYARD_TRACKER_URL",
        default_value = "http://127.0.0.1:8082"
    )]
    pub tracker_url: String,
    /// The allocator's HTTP base URL (`/readyz`, gantry endpoint).
    #[arg(
        long,
        global = true,
        env = "RUNYARD_ALLOCATOR_HTTP_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub allocator_http_url: String,
    /// The scaler's HTTP base URL (`/readyz`, `/v1/pools`).
    #[arg(
        long,
        global = true,
        env = "RUNYARD_SCALER_URL",
        default_value = "http://127.0.0.1:8083"
    )]
    pub scaler_url: String,
    /// The console's HTTP base URL (`/readyz`): `runyard doctor` checks it
    /// when it is given (the console is optional).
    #[arg(long, global = true, env = "RUNYARD_CONSOLE_URL")]
    pub console_url: Option<String>,
    /// Seconds each network call may take.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 5)]
    pub timeout: u64,
    /// Print JSON for scripts instead of text for people.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Every field, URLs with their credentials redacted ([`redact`]) and the
/// allocator token as `***`: a printed command line shows no secret.
impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured, so a new field cannot be left out unseen.
        let Self {
            nats_url,
            namespace,
            database_url,
            allocator_url,
            allocator_token,
            allocator_ca_file,
            allocator_client_cert,
            allocator_client_key,
            ingest_url,
            tracker_url,
            allocator_http_url,
            scaler_url,
            console_url,
            timeout,
            json,
        } = self;
        f.debug_struct("Global")
            .field("nats_url", &redact(nats_url))
            .field("namespace", namespace)
            .field("database_url", &redact(database_url))
            .field("allocator_url", &redact(allocator_url))
            .field("allocator_token", &allocator_token.as_ref().map(|_| "***"))
            .field("allocator_ca_file", allocator_ca_file)
            .field("allocator_client_cert", allocator_client_cert)
            .field("allocator_client_key", allocator_client_key)
            .field("ingest_url", &redact(ingest_url))
            .field("tracker_url", &redact(tracker_url))
            .field("allocator_http_url", &redact(allocator_http_url))
            .field("scaler_url", &redact(scaler_url))
            .field("console_url", &console_url.as_deref().map(redact))
            .field("timeout", timeout)
            .field("json", json)
            .finish()
    }
}

impl Global {
    /// An address given empty (an empty `RUNYARD_*` variable counts as
    /// given) is a configuration error, named.
    fn check(&self) -> Result<(), Failure> {
        for (value, flag, env) in [
            (&self.nats_url, "--nats-url", "RUNYARD_NATS_URL"),
            (&self.namespace, "--namespace", "RUNYARD_NAMESPACE"),
            (&self.database_url, "--database-url", "RUNYARD_DATABASE_URL"),
            (
                &self.allocator_url,
                "--allocator-url",
                "RUNYARD_ALLOCATOR_URL",
            ),
            (&self.ingest_url, "--ingest-url", "RUNYARD_INGEST_URL"),
            (&self.tracker_url, "--tracker-url", "RUNYARD_TRACKER_URL"),
            (
                &self.allocator_http_url,
                "--allocator-http-url",
                "RUNYARD_ALLOCATOR_HTTP_URL",
            ),
            (&self.scaler_url, "--scaler-url", "RUNYARD_SCALER_URL"),
        ] {
            if value.trim().is_empty() {
                return Err(Failure::Usage(format!(
                    "{flag} is empty (is {env} set to an empty value?)"
                )));
            }
        }
        Ok(())
    }

    /// A NATS client named `name`, logged in as the environment says
    /// (`RUNYARD_NATS_USER` and `RUNYARD_NATS_PASSWORD`, the URL's
    /// userinfo, `RUNYARD_NATS_CREDS`, ...: [`runyard_bus::NatsAccess`]),
    /// the way the services connect. The error names the server with its
    /// credentials redacted.
    pub async fn nats_client(&self, name: &str) -> Result<async_nats::Client, String> {
        let access = runyard_bus::NatsAccess::from_env();
        let (opts, addrs) = runyard_bus::connect_options(&self.nats_url, name, &access)
            .await
            .map_err(|e| e.to_string())?;
        opts.connection_timeout(self.timeout())
            .connect(addrs)
            .await
            .map_err(|e| format!("connecting to NATS at {}: {e}", redact(&self.nats_url)))
    }

    /// The per-call timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout.max(1))
    }

    /// The namespace, checked.
    pub fn ns(&self) -> Result<runyard_events::Namespace, Failure> {
        runyard_events::Namespace::new(self.namespace.clone())
            .map_err(|e| Failure::Usage(format!("namespace {:?}: {e}", self.namespace)))
    }

    /// The TLS files (`--allocator-ca-file`, `--allocator-client-cert`,
    /// `--allocator-client-key`), checked; an empty value is unset.
    pub fn tls(&self) -> Result<runyard_tls::ClientFiles, Failure> {
        runyard_tls::ClientFiles::new(
            self.allocator_ca_file.as_deref().map(std::path::Path::new),
            self.allocator_client_cert
                .as_deref()
                .map(std::path::Path::new),
            self.allocator_client_key
                .as_deref()
                .map(std::path::Path::new),
        )
        .map_err(|e| Failure::Usage(format!("{e:#}")))
    }

    /// An HTTP client with the per-call timeout, trusting the CA file and
    /// presenting the client certificate when they are given (https URLs).
    pub fn http(&self) -> Result<reqwest::Client, Failure> {
        let builder = reqwest::Client::builder()
            .timeout(self.timeout())
            .connect_timeout(self.timeout());
        self.tls()?
            .http(builder)
            .map_err(|e| Failure::Usage(format!("{e:#}")))?
            .build()
            .map_err(|e| Failure::Failed(format!("building the HTTP client: {e}")))
    }

    /// The allocator's gRPC endpoint with the per-call timeout; an
    /// `https://` URL with the TLS files' CA (else the public roots) and
    /// client certificate.
    pub fn allocator_endpoint(&self) -> Result<tonic::transport::Endpoint, Failure> {
        let url = redact(&self.allocator_url);
        let endpoint = tonic::transport::Endpoint::from_shared(self.allocator_url.clone())
            .map_err(|e| {
                Failure::Usage(format!(
                    "--allocator-url {url}: {e} (give it as http://host:port or https://host:port)"
                ))
            })?
            .connect_timeout(self.timeout())
            .timeout(self.timeout());
        let files = self.tls()?;
        if files.is_empty() || !self.allocator_url.starts_with("https://") {
            return Ok(endpoint);
        }
        let tls = files.grpc().map_err(|e| Failure::Usage(format!("{e:#}")))?;
        endpoint
            .tls_config(tls)
            .map_err(|e| Failure::Usage(format!("--allocator-url {url}: {e}")))
    }
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Checks NATS, Postgres, each service's /readyz, the allocator's gRPC
    /// and, given the scaler's file, its scale-set pools' Actions service
    /// connections, and says what is wrong with the fix. Exit 0: all good;
    /// 1: something failed.
    Doctor(doctor::DoctorArgs),
    /// The event log.
    Events {
        /// What to do with it.
        #[command(subcommand)]
        command: EventsCommand,
    },
    /// Jobs in the projection (newest first).
    Jobs(query::JobsArgs),
    /// Runners in the projection.
    Runners(query::RunnersArgs),
    /// The scaler's pools (desired, actual, idle, ...), and the sessions of
    /// the scale-set pools.
    Pools,
    /// Every job waiting for a runner, oldest first, and why it has none
    /// yet (the scaler's `GET /v1/queue`).
    Queue,
    /// Asks the allocator for a workload's CPU and memory.
    Recommend(query::RecommendArgs),
    /// What runyard did over a window: memory reserved, used and before,
    /// first-attempt OOM rate, retries, runner minutes, queue waits.
    Savings(savings::SavingsArgs),
    /// Signs and sends the fixture deliveries of a directory to ingest.
    Replay(replay::ReplayArgs),
    /// Rebuilds the projection from the event log into a fresh database
    /// (the job-tracker's own rebuild), optionally swapping it in.
    Rebuild(rebuild::RebuildArgs),
    /// Providers of the scaler's configuration.
    Provider {
        /// What to do with it.
        #[command(subcommand)]
        command: ProviderCommand,
    },
}

/// `runyard events ...`.
#[derive(Subcommand, Debug)]
pub enum EventsCommand {
    /// Prints the events of the log, protobuf-decoded, oldest first.
    Tail(events::TailArgs),
}

/// `runyard provider ...`.
#[derive(Subcommand, Debug)]
pub enum ProviderCommand {
    /// Runs a provider through create, get, list, delete, delete again and
    /// list against its real backend, as the scaler would call it. The
    /// instance (`ry-check-<hex>`) gets a placeholder JIT config, so no
    /// runner registers; it is deleted at the end. Exit 0: every step
    /// passed; 1: a step failed; 2: usage or configuration error.
    Check(CheckArgs),
}

/// `runyard provider check`.
#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// The provider's name (`[providers.<name>]` in the scaler's file).
    pub provider: String,
    /// The scaler's pools-and-providers file.
    #[arg(long, env = "RUNYARD_SCALER_CONFIG")]
    pub config: PathBuf,
    /// The namespace the controller id is derived from (the global
    /// `--namespace`).
    #[arg(skip)]
    pub namespace: String,
    /// The pool whose id, image, flavor, extra specs and OS the instance
    /// gets (default: the first pool using the provider, else a pool named
    /// `runyard-check` with none of them).
    #[arg(long)]
    pub pool: Option<String>,
    /// Image instead of the pool's.
    #[arg(long)]
    pub image: Option<String>,
    /// Flavor name instead of the pool's smallest.
    #[arg(long)]
    pub flavor: Option<String>,
    /// How long the last listing waits for the deleted instance to
    /// disappear (for backends that delete asynchronously).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub wait_gone: u64,
    /// JSON report (the global `--json`).
    #[arg(skip)]
    pub json: bool,
}

/// Why a command did not succeed.
#[derive(Debug)]
pub enum Failure {
    /// Wrong flags or configuration (exit 2); nothing was done.
    Usage(String),
    /// The operation failed (exit 1).
    Failed(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Self::Usage(_) => EXIT_USAGE,
            Self::Failed(_) => EXIT_FAILED,
        }
    }

    fn message(&self) -> &str {
        match self {
            Self::Usage(m) | Self::Failed(m) => m,
        }
    }
}

/// Runs the command line; returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    runyard_telemetry::install_crypto_provider();
    let global = cli.global;
    if let Err(failure) = global.check() {
        return fail(&global, "runyard", &failure);
    }
    let (name, result) = match cli.command {
        Command::Provider {
            command: ProviderCommand::Check(mut args),
        } => {
            args.json = global.json;
            args.namespace = global.namespace.clone();
            return check::run(&args).await;
        }
        Command::Doctor(args) => ("runyard doctor", doctor::run(&global, &args).await),
        Command::Events {
            command: EventsCommand::Tail(args),
        } => ("runyard events tail", events::tail(&global, &args).await),
        Command::Jobs(args) => ("runyard jobs", query::jobs(&global, &args).await),
        Command::Runners(args) => ("runyard runners", query::runners(&global, &args).await),
        Command::Pools => ("runyard pools", query::pools(&global).await),
        Command::Queue => ("runyard queue", query::queue(&global).await),
        Command::Savings(args) => ("runyard savings", savings::savings(&global, &args).await),
        Command::Recommend(args) => ("runyard recommend", query::recommend(&global, &args).await),
        Command::Replay(args) => ("runyard replay", replay::run(&global, &args).await),
        Command::Rebuild(args) => (
            "runyard rebuild",
            Box::pin(rebuild::run(&global, &args)).await,
        ),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => fail(&global, name, &failure),
    }
}

/// Reports a failure (stderr, and a JSON object on stdout with `--json`)
/// and gives its exit code.
fn fail(global: &Global, name: &str, failure: &Failure) -> ExitCode {
    if global.json {
        out(&format!(
            "{}\n",
            serde_json::json!({"error": failure.message(), "exit_code": failure.code()})
        ));
    }
    eprintln!("{name}: {}", failure.message());
    ExitCode::from(failure.code())
}

/// Writes to stdout; a closed stdout (`| head`) is not an error worth
/// failing a command over.
pub fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}

/// Prints a value as pretty JSON on stdout.
pub fn out_json(value: &serde_json::Value) {
    let text = serde_json::to_string_pretty(value)
        .unwrap_or_else(|e| format!("{{\"error\": \"encoding the output: {e}\"}}"));
    out(&format!("{text}\n"));
}

/// A table for people: upper-case headers, no borders (like `kubectl get`).
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(headers.iter().map(|h| h.to_uppercase()));
    for row in rows {
        t.add_row(row);
    }
    // Trailing blanks of the last column serve nobody.
    let mut s: String = t
        .to_string()
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l).trim_end()))
        .collect();
    if s.is_empty() {
        s.push('\n');
    }
    s
}

/// A progress bar on stderr when it is a terminal and the output is for
/// people; hidden otherwise (scripts, `--json`, pipes).
pub fn progress(len: u64, json: bool, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal as _;
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} {msg} ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_prefix(what.to_owned());
    bar
}

/// An error with its causes, `outer: inner: innermost` (transport errors
/// say little on their own).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// A URL, or a list of NATS URLs, with any password or token in it
/// replaced by `***`, for messages.
pub use runyard_config::redact::urls as redact;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_secret() {
        use clap::Parser as _;
        let secret = "a1f0c9d27be84e53a1f0c9d27be84e53";
        let nats = format!("nats://cli:{secret}@nats:4222");
        let db = format!("postgres://runyard:{secret}@db:5432/runyard");
        let cli = Cli::try_parse_from([
            "runyard",
            "--nats-url",
            &nats,
            "--database-url",
            &db,
            "--allocator-token",
            secret,
            "replay",
            "deliveries",
            "--github-secret",
            secret,
            "--gitlab-token",
            secret,
            "--usage-token",
            secret,
        ])
        .unwrap();
        let Command::Replay(args) = &cli.command else {
            panic!("{:?}", cli.command)
        };
        assert_eq!(args.usage_token.as_deref(), Some(secret));
        for shown in [
            format!("{cli:?}"),
            format!("{args:?}"),
            format!("{:?}", cli.global),
        ] {
            assert!(!shown.contains(secret), "{shown}");
        }
        let shown = format!("{cli:?}");
        assert!(shown.contains("nats://cli:***@nats:4222"), "{shown}");
        assert!(shown.contains("usage_token: Some(\"***\")"), "{shown}");
        assert!(shown.contains("deliveries"), "{shown}");
    }
}
