//! GitHub REST client: JIT runners and runner lists for the scaler, runs,
//! jobs, re-runs and webhook redelivery for the reconciler and OOM retries.
//!
//! Authentication is a personal access token or a GitHub App. With an App,
//! every call made for a scope (repository, organization, enterprise) uses
//! that scope's installation token — found with the App's JWT when no
//! installation id is configured, fetched once and cached until a minute
//! before it expires — and the App's own webhook deliveries use the JWT.
//! Enterprise scopes need a personal access token: GitHub's enterprise
//! runner endpoints refuse installation tokens.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{ACCEPT, HeaderMap, LINK};
use reqwest::{Method, StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use super::ratelimit::{self, Announced, Bucket};
use super::{
    ApiError, CallCounts, ClientOptions, Core, RateBudget, Raw, lenient_time, null_default, seg,
};

/// The default API base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.github.com";

/// The REST API version requested.
const API_VERSION: &str = "2022-11-28";

/// Largest page GitHub serves.
const PER_PAGE: u32 = 100;

/// Bound on the pages one listing follows (10 000 items).
const MAX_PAGES: u32 = 100;

/// An installation token is replaced this long before it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(60);

/// App JWTs: issued this far in the past (clock drift, as GitHub
/// recommends), valid this long after (GitHub allows at most 10 minutes
/// from the time of issue; we stay under), reused until a minute before
/// they expire.
const JWT_BACKDATE: u64 = 60;
const JWT_LIFETIME: u64 = 9 * 60;

/// Why an App client refuses an enterprise scope: GitHub has no
/// `GET /enterprises/{e}/installation`, and enterprise runner endpoints
/// refuse installation tokens.
pub const ENTERPRISE_NEEDS_PAT: &str = "a GitHub App cannot manage enterprise runners (enterprise runner endpoints refuse installation tokens): use a classic personal access token with manage_runners:enterprise";

/// Endpoint kinds, as counted in [`CallCounts`] and named in
/// [`ApiError::Status`].
pub mod endpoint {
    /// `GET /orgs|repos|enterprises/.../installation` (App JWT).
    pub const INSTALLATION: &str = "installation";
    /// `POST /app/installations/{id}/access_tokens` (App JWT).
    pub const ACCESS_TOKEN: &str = "access_token";
    /// `POST .../actions/runners/generate-jitconfig`.
    pub const GENERATE_JITCONFIG: &str = "generate_jitconfig";
    /// `GET .../actions/runners`.
    pub const LIST_RUNNERS: &str = "list_runners";
    /// `GET .../actions/runners/{id}`.
    pub const GET_RUNNER: &str = "get_runner";
    /// `DELETE .../actions/runners/{id}`.
    pub const DELETE_RUNNER: &str = "delete_runner";
    /// `GET .../actions/runners/downloads`.
    pub const LIST_RUNNER_DOWNLOADS: &str = "list_runner_downloads";
    /// `GET /repos/{o}/{r}/actions/runs`.
    pub const LIST_RUNS: &str = "list_runs";
    /// `GET /repos/{o}/{r}/actions/runs/{id}/jobs`.
    pub const LIST_RUN_JOBS: &str = "list_run_jobs";
    /// `GET /repos/{o}/{r}/actions/runs/{id}`.
    pub const GET_RUN: &str = "get_run";
    /// `GET /repos/{o}/{r}/actions/jobs/{id}`.
    pub const GET_JOB: &str = "get_job";
    /// `POST /repos/{o}/{r}/actions/runs/{id}/rerun-failed-jobs`.
    pub const RERUN_FAILED_JOBS: &str = "rerun_failed_jobs";
    /// `POST /repos/{o}/{r}/actions/jobs/{id}/rerun`.
    pub const RERUN_JOB: &str = "rerun_job";
    /// `GET .../hooks/{id}/deliveries`, `GET /app/hook/deliveries`.
    pub const LIST_HOOK_DELIVERIES: &str = "list_hook_deliveries";
    /// `POST .../deliveries/{id}/attempts`.
    pub const REDELIVER: &str = "redeliver";
    /// `GET /rate_limit` (spends no budget).
    pub const RATE_LIMIT: &str = "rate_limit";
    /// `GET /orgs|enterprises/.../actions/runner-groups`.
    pub const LIST_RUNNER_GROUPS: &str = "list_runner_groups";
    /// `GET /orgs/{org}/actions/runner-groups/{id}/repositories`.
    pub const LIST_RUNNER_GROUP_REPOS: &str = "list_runner_group_repos";
    /// `POST .../actions/runners/registration-token` (the first step of a
    /// runner scale-set client's authentication).
    pub const REGISTRATION_TOKEN: &str = "registration_token";

    /// Every kind.
    pub const ALL: &[&str] = &[
        INSTALLATION,
        ACCESS_TOKEN,
        GENERATE_JITCONFIG,
        LIST_RUNNERS,
        GET_RUNNER,
        DELETE_RUNNER,
        LIST_RUNNER_DOWNLOADS,
        LIST_RUNS,
        LIST_RUN_JOBS,
        GET_RUN,
        GET_JOB,
        RERUN_FAILED_JOBS,
        RERUN_JOB,
        LIST_HOOK_DELIVERIES,
        REDELIVER,
        RATE_LIMIT,
        LIST_RUNNER_GROUPS,
        LIST_RUNNER_GROUP_REPOS,
        REGISTRATION_TOKEN,
    ];
}

/// How the client authenticates.
#[derive(Debug, Clone)]
pub enum GitHubAuth {
    /// A personal access token (classic or fine-grained).
    Token(SecretString),
    /// A GitHub App (preferred: short-lived tokens, higher rate limits).
    App {
        /// The App's id.
        app_id: u64,
        /// The App's private key, PEM (PKCS#1 as GitHub issues it, or PKCS#8).
        private_key_pem: SecretString,
        /// The installation to use for every scope; found per scope when
        /// `None`.
        installation_id: Option<u64>,
    },
}

/// Where runners are registered and listed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GitHubScope {
    /// A repository.
    Repo {
        /// Owner (user or organization) login.
        owner: String,
        /// Repository name.
        repo: String,
    },
    /// An organization (login).
    Org(String),
    /// An enterprise (slug).
    Enterprise(String),
}

impl GitHubScope {
    /// A repository scope.
    pub fn repo(owner: impl Into<String>, repo: impl Into<String>) -> Self {
        Self::Repo {
            owner: owner.into(),
            repo: repo.into(),
        }
    }

    /// The REST path prefix: `/repos/o/r`, `/orgs/o`, `/enterprises/e`.
    pub fn path_prefix(&self) -> String {
        match self {
            Self::Repo { owner, repo } => format!("/repos/{}/{}", seg(owner), seg(repo)),
            Self::Org(org) => format!("/orgs/{}", seg(org)),
            Self::Enterprise(e) => format!("/enterprises/{}", seg(e)),
        }
    }
}

impl fmt::Display for GitHubScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Repo { owner, repo } => write!(f, "repo {owner}/{repo}"),
            Self::Org(org) => write!(f, "org {org}"),
            Self::Enterprise(e) => write!(f, "enterprise {e}"),
        }
    }
}

/// A just-in-time runner registration.
#[derive(Debug, Clone)]
pub struct JitRunner {
    /// The runner's id (for get and delete).
    pub runner_id: u64,
    /// The runner's name.
    pub name: String,
    /// The opaque configuration the runner is started with
    /// (`run.sh --jitconfig <it>`); a credential.
    pub encoded_jit_config: SecretString,
}

/// A self-hosted runner as GitHub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GitHubRunner {
    /// Runner id.
    pub id: u64,
    /// Runner name.
    pub name: String,
    /// `online` or `offline`.
    pub status: String,
    /// Whether GitHub believes it runs a job. This flag lags by tens of
    /// seconds: `false` once does not prove the runner idle.
    #[serde(default)]
    pub busy: bool,
    /// Label names.
    #[serde(default, deserialize_with = "label_names")]
    pub labels: Vec<String>,
}

impl GitHubRunner {
    /// `status == "online"`.
    pub fn is_online(&self) -> bool {
        self.status == "online"
    }
}

/// A build of the runner application GitHub offers for download
/// (`GET .../actions/runners/downloads`): what a machine installs its runner
/// from.
#[derive(Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct RunnerDownload {
    /// `linux`, `osx`, `win`.
    pub os: String,
    /// `x64`, `arm64`, `arm`.
    pub architecture: String,
    /// Where the archive is.
    pub download_url: String,
    /// The archive's file name.
    pub filename: String,
    /// A short-lived token the download needs (GitHub Enterprise Server);
    /// a credential.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temp_download_token: Option<String>,
    /// The archive's SHA-256, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256_checksum: Option<String>,
}

impl fmt::Debug for RunnerDownload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerDownload")
            .field("os", &self.os)
            .field("architecture", &self.architecture)
            .field("download_url", &self.download_url)
            .field("filename", &self.filename)
            .field(
                "temp_download_token",
                &self.temp_download_token.as_ref().map(|_| "[redacted]"),
            )
            .field("sha256_checksum", &self.sha256_checksum)
            .finish()
    }
}

/// Outcome of deleting a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteRunner {
    /// Removed.
    Deleted,
    /// There was no such runner (already gone).
    NotFound,
    /// GitHub refused (`422`): the runner is running a job.
    Busy,
}

/// A workflow run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WorkflowRun {
    /// Run id.
    pub id: u64,
    /// Workflow name.
    #[serde(default)]
    pub name: Option<String>,
    /// `queued`, `in_progress`, `completed`, `waiting`, `requested`,
    /// `pending`.
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// `success`, `failure`, `cancelled`, ... once completed.
    #[serde(default)]
    pub conclusion: Option<String>,
    /// Attempt number, from 1.
    #[serde(default = "one")]
    pub run_attempt: u32,
    /// Commit.
    #[serde(default, deserialize_with = "null_default")]
    pub head_sha: String,
    /// Branch.
    #[serde(default)]
    pub head_branch: Option<String>,
    /// Triggering event (`push`, `pull_request`, ...).
    #[serde(default, deserialize_with = "null_default")]
    pub event: String,
    /// Created.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub created_at: Option<OffsetDateTime>,
    /// Last updated.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub updated_at: Option<OffsetDateTime>,
    /// Web page.
    #[serde(default)]
    pub html_url: Option<String>,
}

/// A job of a workflow run.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WorkflowJob {
    /// Job id (`workflow_job.id` in webhooks).
    pub id: u64,
    /// Run id.
    pub run_id: u64,
    /// Attempt of the run this job belongs to.
    #[serde(default = "one")]
    pub run_attempt: u32,
    /// `queued`, `in_progress`, `completed`, `waiting`, ...
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// Set once completed.
    #[serde(default)]
    pub conclusion: Option<String>,
    /// Display name (matrix values included).
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// `runs-on` labels.
    #[serde(default, deserialize_with = "null_default")]
    pub labels: Vec<String>,
    /// The runner that took it, once one did.
    #[serde(default)]
    pub runner_id: Option<u64>,
    /// The runner that took it, once one did.
    #[serde(default)]
    pub runner_name: Option<String>,
    /// Workflow name.
    #[serde(default)]
    pub workflow_name: Option<String>,
    /// Branch.
    #[serde(default)]
    pub head_branch: Option<String>,
    /// Commit.
    #[serde(default, deserialize_with = "null_default")]
    pub head_sha: String,
    /// Queued.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub created_at: Option<OffsetDateTime>,
    /// Started.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub started_at: Option<OffsetDateTime>,
    /// Finished.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub completed_at: Option<OffsetDateTime>,
    /// Web page.
    #[serde(default)]
    pub html_url: Option<String>,
}

/// A webhook whose deliveries can be listed and redelivered.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HookRef {
    /// A repository webhook.
    Repo {
        /// Owner login.
        owner: String,
        /// Repository name.
        repo: String,
        /// Hook id.
        hook_id: u64,
    },
    /// An organization webhook.
    Org {
        /// Organization login.
        org: String,
        /// Hook id.
        hook_id: u64,
    },
    /// The GitHub App's own webhook (needs App credentials: its endpoints
    /// take the App's JWT, not an installation token).
    App,
}

impl HookRef {
    fn deliveries_path(&self) -> String {
        match self {
            Self::Repo {
                owner,
                repo,
                hook_id,
            } => format!(
                "/repos/{}/{}/hooks/{hook_id}/deliveries",
                seg(owner),
                seg(repo)
            ),
            Self::Org { org, hook_id } => format!("/orgs/{}/hooks/{hook_id}/deliveries", seg(org)),
            Self::App => "/app/hook/deliveries".to_owned(),
        }
    }

    fn target(&self) -> Target {
        match self {
            Self::Repo { owner, repo, .. } => Target::Scope(GitHubScope::repo(owner, repo)),
            Self::Org { org, .. } => Target::Scope(GitHubScope::Org(org.clone())),
            Self::App => Target::AppJwt,
        }
    }
}

/// One delivery of a webhook.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HookDelivery {
    /// Numeric id (what redelivery takes).
    pub id: u64,
    /// The `X-GitHub-Delivery` GUID (kept across redeliveries).
    #[serde(default, deserialize_with = "null_default")]
    pub guid: String,
    /// HTTP status our endpoint answered (0 when it did not answer).
    #[serde(default, deserialize_with = "null_default")]
    pub status_code: u16,
    /// GitHub's summary (`OK`, `Invalid HTTP Response: 503`, ...).
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// When it was delivered.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub delivered_at: Option<OffsetDateTime>,
    /// Whether this was itself a redelivery.
    #[serde(default, deserialize_with = "null_default")]
    pub redelivery: bool,
    /// Event (`workflow_job`, ...).
    #[serde(default, deserialize_with = "null_default")]
    pub event: String,
    /// Action (`queued`, ...).
    #[serde(default)]
    pub action: Option<String>,
    /// Seconds the delivery took.
    #[serde(default)]
    pub duration: Option<f64>,
    /// App installation, for an App's hook.
    #[serde(default)]
    pub installation_id: Option<u64>,
    /// Repository, when any.
    #[serde(default)]
    pub repository_id: Option<u64>,
}

impl HookDelivery {
    /// Whether our endpoint did not accept it (no 2xx answer).
    pub fn failed(&self) -> bool {
        !(200..300).contains(&self.status_code)
    }
}

/// One page of a webhook's deliveries, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryPage {
    /// The deliveries.
    pub deliveries: Vec<HookDelivery>,
    /// The `cursor` of the next (older) page, from the `Link` header's
    /// `rel="next"`; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// A runner group of an organization or enterprise.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunnerGroup {
    /// Group id (what `runner_group_id` names).
    pub id: u64,
    /// Name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// `all`, `selected` (only the repositories listed for it) or
    /// `private`.
    #[serde(default, deserialize_with = "null_default")]
    pub visibility: String,
    /// The scope's default group.
    #[serde(default, deserialize_with = "null_default")]
    pub default: bool,
}

fn one() -> u32 {
    1
}

/// Runner labels come as `[{id, name, type}]`.
fn label_names<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    struct Label {
        name: String,
    }
    let labels: Option<Vec<Label>> = Option::deserialize(d)?;
    Ok(labels
        .unwrap_or_default()
        .into_iter()
        .map(|l| l.name)
        .collect())
}

/// GitHub REST client. Cheap to clone; clones share the token cache, the
/// rate-limit state and the call counters.
#[derive(Clone)]
pub struct GitHubClient {
    inner: Arc<Inner>,
}

struct Inner {
    core: Core,
    creds: Creds,
}

enum Creds {
    Token(SecretString),
    App(Box<AppAuth>),
}

struct AppAuth {
    app_id: u64,
    key: jsonwebtoken::EncodingKey,
    fixed_installation: Option<u64>,
    jwt: Mutex<Option<Cached>>,
    installations: Mutex<HashMap<GitHubScope, u64>>,
    /// Held across a token fetch, so concurrent callers fetch once.
    tokens: tokio::sync::Mutex<HashMap<u64, Cached>>,
}

/// A credential and when to stop using it.
#[derive(Clone)]
struct Cached {
    secret: SecretString,
    refresh_at: Instant,
}

/// Whose credential a request needs.
#[derive(Debug, Clone)]
enum Target {
    /// A call made for a repository, organization or enterprise.
    Scope(GitHubScope),
    /// The App itself (its JWT).
    AppJwt,
}

impl fmt::Debug for GitHubClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auth = match &self.inner.creds {
            Creds::Token(_) => "token".to_owned(),
            Creds::App(app) => format!("app {}", app.app_id),
        };
        f.debug_struct("GitHubClient")
            .field("base_url", &self.inner.core.base().as_str())
            .field("auth", &auth)
            .finish_non_exhaustive()
    }
}

impl GitHubClient {
    /// A client for `base_url` (`https://api.github.com`, or
    /// `https://ghe.example.com/api/v3`), each request bounded by `timeout`.
    pub fn new(base_url: &str, auth: GitHubAuth, timeout: Duration) -> Result<Self, ApiError> {
        Self::with_options(base_url, auth, &ClientOptions::new(timeout))
    }

    /// A client with every option spelled out.
    pub fn with_options(
        base_url: &str,
        auth: GitHubAuth,
        options: &ClientOptions,
    ) -> Result<Self, ApiError> {
        let core = Core::new(base_url, options, endpoint::ALL)?;
        let creds = match auth {
            GitHubAuth::Token(t) => Creds::Token(t),
            GitHubAuth::App {
                app_id,
                private_key_pem,
                installation_id,
            } => {
                let key = jsonwebtoken::EncodingKey::from_rsa_pem(
                    private_key_pem.expose_secret().as_bytes(),
                )
                // The key error says what kind of problem it is, never the key.
                .map_err(|e| {
                    ApiError::Auth(format!("the GitHub App private key is unusable: {e}"))
                })?;
                Creds::App(Box::new(AppAuth {
                    app_id,
                    key,
                    fixed_installation: installation_id,
                    jwt: Mutex::new(None),
                    installations: Mutex::new(HashMap::new()),
                    tokens: tokio::sync::Mutex::new(HashMap::new()),
                }))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner { core, creds }),
        })
    }

    /// Requests sent so far, per endpoint kind ([`endpoint`]).
    pub fn calls(&self) -> CallCounts {
        self.inner.core.calls()
    }

    /// The lowest rate-limit budget GitHub last announced for any credential
    /// this client uses (counted down locally for requests sent since), when
    /// known.
    pub fn rate_limit_remaining(&self) -> Option<u64> {
        self.inner.core.rate_limit_remaining()
    }

    /// Every rate-limit budget GitHub announced to this client, per
    /// credential and resource.
    pub fn rate_budgets(&self) -> Vec<RateBudget> {
        self.inner.core.rate_budgets()
    }

    /// Reads `GET /rate_limit` with `scope`'s credential and records every
    /// resource's budget. GitHub does not charge this call to any budget,
    /// so it may be made while one is exhausted, to learn when (or whether
    /// already) it came back.
    pub async fn refresh_rate_limits(&self, scope: &GitHubScope) -> Result<(), ApiError> {
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            resources: std::collections::BTreeMap<String, Announced>,
        }
        let ep = endpoint::RATE_LIMIT;
        let (credential, bucket) = self.credential(&Target::Scope(scope.clone())).await?;
        let core = &self.inner.core;
        let request = core
            .http
            .get(core.url("/rate_limit")?)
            .bearer_auth(credential.expose_secret())
            .header(ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", API_VERSION);
        let raw = core.execute_free(bucket, ep, request).await?.success(ep)?;
        let answer: Answer = raw.json(ep, false)?;
        core.limiter().observe_all(bucket, &answer.resources);
        Ok(())
    }

    /// The runner groups of an organization or enterprise (all pages).
    pub async fn list_runner_groups(
        &self,
        scope: &GitHubScope,
    ) -> Result<Vec<RunnerGroup>, ApiError> {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            total_count: Option<u64>,
            #[serde(default)]
            runner_groups: Vec<RunnerGroup>,
        }
        let path = format!("{}/actions/runner-groups", scope.path_prefix());
        self.paginate(
            &Target::Scope(scope.clone()),
            endpoint::LIST_RUNNER_GROUPS,
            &path,
            "",
            |p: Page| (p.runner_groups, p.total_count),
        )
        .await
    }

    /// The repositories (`owner/name`) an organization's runner group with
    /// `visibility: selected` admits (all pages).
    pub async fn list_runner_group_repos(
        &self,
        org: &str,
        group_id: u64,
    ) -> Result<Vec<String>, ApiError> {
        #[derive(Deserialize)]
        struct Repo {
            full_name: String,
        }
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            total_count: Option<u64>,
            #[serde(default)]
            repositories: Vec<Repo>,
        }
        let scope = GitHubScope::Org(org.to_owned());
        let path = format!(
            "{}/actions/runner-groups/{group_id}/repositories",
            scope.path_prefix()
        );
        let repos = self
            .paginate(
                &Target::Scope(scope),
                endpoint::LIST_RUNNER_GROUP_REPOS,
                &path,
                "",
                |p: Page| (p.repositories, p.total_count),
            )
            .await?;
        Ok(repos.into_iter().map(|r| r.full_name).collect())
    }

    /// Registers a just-in-time runner (`201`). A runner of the same name in
    /// the scope is a `409` [`ApiError::Status`].
    pub async fn generate_jitconfig(
        &self,
        scope: &GitHubScope,
        name: &str,
        runner_group_id: u64,
        labels: &[String],
        work_folder: Option<&str>,
    ) -> Result<JitRunner, ApiError> {
        #[derive(Deserialize)]
        struct Answer {
            runner: RunnerRef,
            encoded_jit_config: String,
        }
        #[derive(Deserialize)]
        struct RunnerRef {
            id: u64,
            name: String,
        }
        let ep = endpoint::GENERATE_JITCONFIG;
        let body = serde_json::json!({
            "name": name,
            "runner_group_id": runner_group_id,
            "labels": labels,
            "work_folder": work_folder.unwrap_or("_work"),
        });
        let path = format!("{}/actions/runners/generate-jitconfig", scope.path_prefix());
        let raw = self
            .send(
                &Target::Scope(scope.clone()),
                ep,
                Method::POST,
                &path,
                Some(body),
            )
            .await?
            .success(ep)?;
        let a: Answer = raw.json(ep, true)?;
        Ok(JitRunner {
            runner_id: a.runner.id,
            name: a.runner.name,
            encoded_jit_config: SecretString::from(a.encoded_jit_config),
        })
    }

    /// A runner registration token for `scope` (`201 {token, expires_at}`),
    /// asked for with the scope's credential. The runner scale-set client
    /// trades it for its Actions-service connection (SCALESET.md §1 step B).
    /// GitHub documents a lifetime of an hour; the token is a credential.
    pub async fn registration_token(&self, scope: &GitHubScope) -> Result<SecretString, ApiError> {
        #[derive(Deserialize)]
        struct Answer {
            token: String,
        }
        let ep = endpoint::REGISTRATION_TOKEN;
        let path = format!("{}/actions/runners/registration-token", scope.path_prefix());
        let raw = self
            .send(&Target::Scope(scope.clone()), ep, Method::POST, &path, None)
            .await?;
        if raw.status != StatusCode::CREATED {
            if raw.status.is_success() {
                // Another 2xx may still carry a token: keep its body out of
                // the error.
                return Err(ApiError::Status {
                    status: raw.status.as_u16(),
                    endpoint_kind: ep,
                    message: "expected 201 Created".into(),
                });
            }
            return Err(raw.into_error(ep));
        }
        // Tolerate a UTF-8 BOM, as the scale-set client does with every
        // answer of the Actions service (SCALESET.md §2).
        let body = raw
            .body
            .strip_prefix(b"\xEF\xBB\xBF".as_slice())
            .unwrap_or(&raw.body);
        let answer: Answer = super::decode(body, ep, true)?;
        if answer.token.is_empty() {
            return Err(ApiError::Decode {
                endpoint_kind: ep,
                detail: "empty registration token".into(),
            });
        }
        Ok(SecretString::from(answer.token))
    }

    /// Every self-hosted runner registered at `scope` (all pages).
    pub async fn list_runners(&self, scope: &GitHubScope) -> Result<Vec<GitHubRunner>, ApiError> {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            total_count: Option<u64>,
            #[serde(default)]
            runners: Vec<GitHubRunner>,
        }
        let path = format!("{}/actions/runners", scope.path_prefix());
        self.paginate(
            &Target::Scope(scope.clone()),
            endpoint::LIST_RUNNERS,
            &path,
            "",
            |p: Page| (p.runners, p.total_count),
        )
        .await
    }

    /// The runner application builds `scope`'s runners may install (with
    /// their checksums, and on GitHub Enterprise Server a temporary download
    /// token each).
    pub async fn list_runner_downloads(
        &self,
        scope: &GitHubScope,
    ) -> Result<Vec<RunnerDownload>, ApiError> {
        let ep = endpoint::LIST_RUNNER_DOWNLOADS;
        let path = format!("{}/actions/runners/downloads", scope.path_prefix());
        // The answer may hold download tokens: no serde detail in errors.
        self.send(&Target::Scope(scope.clone()), ep, Method::GET, &path, None)
            .await?
            .success(ep)?
            .json(ep, true)
    }

    /// One runner, `None` when there is none with that id at `scope`.
    pub async fn get_runner(
        &self,
        scope: &GitHubScope,
        runner_id: u64,
    ) -> Result<Option<GitHubRunner>, ApiError> {
        let ep = endpoint::GET_RUNNER;
        let path = format!("{}/actions/runners/{runner_id}", scope.path_prefix());
        let raw = self
            .send(&Target::Scope(scope.clone()), ep, Method::GET, &path, None)
            .await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        raw.success(ep)?.json(ep, false).map(Some)
    }

    /// Removes a runner. A runner running a job is not removed
    /// ([`DeleteRunner::Busy`], GitHub's `422`); a missing one is
    /// [`DeleteRunner::NotFound`].
    pub async fn delete_runner(
        &self,
        scope: &GitHubScope,
        runner_id: u64,
    ) -> Result<DeleteRunner, ApiError> {
        let ep = endpoint::DELETE_RUNNER;
        let path = format!("{}/actions/runners/{runner_id}", scope.path_prefix());
        let raw = self
            .send(
                &Target::Scope(scope.clone()),
                ep,
                Method::DELETE,
                &path,
                None,
            )
            .await?;
        match raw.status.as_u16() {
            200..=299 => Ok(DeleteRunner::Deleted),
            404 => Ok(DeleteRunner::NotFound),
            422 => Ok(DeleteRunner::Busy),
            _ => Err(raw.into_error(ep)),
        }
    }

    /// Workflow runs of a repository with `status` (`queued`,
    /// `in_progress`, ...), all pages up to 10 000 runs.
    pub async fn list_runs(
        &self,
        owner: &str,
        repo: &str,
        status: &str,
    ) -> Result<Vec<WorkflowRun>, ApiError> {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            total_count: Option<u64>,
            #[serde(default)]
            workflow_runs: Vec<WorkflowRun>,
        }
        let scope = GitHubScope::repo(owner, repo);
        let path = format!("{}/actions/runs", scope.path_prefix());
        let query = format!("&status={}", seg(status));
        self.paginate(
            &Target::Scope(scope),
            endpoint::LIST_RUNS,
            &path,
            &query,
            |p: Page| (p.workflow_runs, p.total_count),
        )
        .await
    }

    /// The jobs of a run's latest attempt (`filter=latest`), all pages.
    pub async fn list_run_jobs(
        &self,
        owner: &str,
        repo: &str,
        run_id: u64,
    ) -> Result<Vec<WorkflowJob>, ApiError> {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            total_count: Option<u64>,
            #[serde(default)]
            jobs: Vec<WorkflowJob>,
        }
        let scope = GitHubScope::repo(owner, repo);
        let path = format!("{}/actions/runs/{run_id}/jobs", scope.path_prefix());
        self.paginate(
            &Target::Scope(scope),
            endpoint::LIST_RUN_JOBS,
            &path,
            "&filter=latest",
            |p: Page| (p.jobs, p.total_count),
        )
        .await
    }

    /// One workflow run (a missing one is a `404` [`ApiError::Status`]).
    pub async fn get_run(
        &self,
        owner: &str,
        repo: &str,
        run_id: u64,
    ) -> Result<WorkflowRun, ApiError> {
        let scope = GitHubScope::repo(owner, repo);
        let path = format!("{}/actions/runs/{run_id}", scope.path_prefix());
        self.get_json(&Target::Scope(scope), endpoint::GET_RUN, &path)
            .await
    }

    /// One job (a missing one is a `404` [`ApiError::Status`]).
    pub async fn get_job(
        &self,
        owner: &str,
        repo: &str,
        job_id: u64,
    ) -> Result<WorkflowJob, ApiError> {
        let scope = GitHubScope::repo(owner, repo);
        let path = format!("{}/actions/jobs/{job_id}", scope.path_prefix());
        self.get_json(&Target::Scope(scope), endpoint::GET_JOB, &path)
            .await
    }

    /// Re-runs the failed jobs of a completed run (a new run attempt).
    /// GitHub refuses (`403`) while the run is still in progress.
    pub async fn rerun_failed_jobs(
        &self,
        owner: &str,
        repo: &str,
        run_id: u64,
    ) -> Result<(), ApiError> {
        let scope = GitHubScope::repo(owner, repo);
        let path = format!(
            "{}/actions/runs/{run_id}/rerun-failed-jobs",
            scope.path_prefix()
        );
        self.post_empty(&Target::Scope(scope), endpoint::RERUN_FAILED_JOBS, &path)
            .await
    }

    /// Re-runs one job and the jobs that depend on it (a new run attempt).
    pub async fn rerun_job(&self, owner: &str, repo: &str, job_id: u64) -> Result<(), ApiError> {
        let scope = GitHubScope::repo(owner, repo);
        let path = format!("{}/actions/jobs/{job_id}/rerun", scope.path_prefix());
        self.post_empty(&Target::Scope(scope), endpoint::RERUN_JOB, &path)
            .await
    }

    /// The newest deliveries of a webhook (one page of up to `per_page`,
    /// at most 100), newest first.
    pub async fn list_hook_deliveries(
        &self,
        hook: &HookRef,
        per_page: u32,
    ) -> Result<Vec<HookDelivery>, ApiError> {
        let path = format!(
            "{}?per_page={}",
            hook.deliveries_path(),
            per_page.clamp(1, PER_PAGE)
        );
        self.get_json(&hook.target(), endpoint::LIST_HOOK_DELIVERIES, &path)
            .await
    }

    /// One page of a webhook's deliveries (up to `per_page`, at most 100),
    /// newest first: the first page without `cursor`, older ones with the
    /// [`DeliveryPage::next_cursor`] of the page before.
    pub async fn list_hook_deliveries_page(
        &self,
        hook: &HookRef,
        per_page: u32,
        cursor: Option<&str>,
    ) -> Result<DeliveryPage, ApiError> {
        let ep = endpoint::LIST_HOOK_DELIVERIES;
        let mut path = format!(
            "{}?per_page={}",
            hook.deliveries_path(),
            per_page.clamp(1, PER_PAGE)
        );
        if let Some(cursor) = cursor {
            path.push_str("&cursor=");
            path.push_str(&seg(cursor));
        }
        let raw = self
            .send(&hook.target(), ep, Method::GET, &path, None)
            .await?
            .success(ep)?;
        let deliveries = raw.json(ep, false)?;
        let next_cursor = next_link(&raw.headers).and_then(|url| {
            url.query_pairs()
                .find(|(k, _)| k == "cursor")
                .map(|(_, v)| v.into_owned())
        });
        Ok(DeliveryPage {
            deliveries,
            next_cursor,
        })
    }

    /// Asks GitHub to deliver a delivery again (by its numeric id, not the
    /// GUID).
    pub async fn redeliver(&self, hook: &HookRef, delivery_id: u64) -> Result<(), ApiError> {
        let path = format!("{}/{delivery_id}/attempts", hook.deliveries_path());
        self.post_empty(&hook.target(), endpoint::REDELIVER, &path)
            .await
    }

    async fn get_json<T: DeserializeOwned>(
        &self,
        target: &Target,
        ep: &'static str,
        path: &str,
    ) -> Result<T, ApiError> {
        self.send(target, ep, Method::GET, path, None)
            .await?
            .success(ep)?
            .json(ep, false)
    }

    async fn post_empty(
        &self,
        target: &Target,
        ep: &'static str,
        path: &str,
    ) -> Result<(), ApiError> {
        self.send(target, ep, Method::POST, path, None)
            .await?
            .success(ep)
            .map(drop)
    }

    /// Follows a listing page by page: `Link: rel="next"` when GitHub sends
    /// it (and it stays on our origin), else page numbers while pages come
    /// back full and `total_count` says there is more.
    async fn paginate<P: DeserializeOwned, T>(
        &self,
        target: &Target,
        ep: &'static str,
        path: &str,
        extra_query: &str,
        items: impl Fn(P) -> (Vec<T>, Option<u64>),
    ) -> Result<Vec<T>, ApiError> {
        let page_url = |page: u32| {
            self.inner.core.url(&format!(
                "{path}?per_page={PER_PAGE}&page={page}{extra_query}"
            ))
        };
        let mut url = page_url(1)?;
        let mut out = Vec::new();
        for page in 1..=MAX_PAGES {
            let raw = self
                .send_url(target, ep, Method::GET, url, None)
                .await?
                .success(ep)?;
            let (batch, total) = items(raw.json::<P>(ep, false)?);
            let full = batch.len() >= PER_PAGE as usize;
            out.extend(batch);
            let more_by_count = full && total.is_none_or(|t| (out.len() as u64) < t);
            url = match next_link(&raw.headers) {
                Some(next) if self.inner.core.same_origin(&next) => next,
                Some(_) | None if more_by_count => page_url(page + 1)?,
                _ => return Ok(out),
            };
        }
        tracing::warn!(
            endpoint = ep,
            pages = MAX_PAGES,
            "listing cut at the page bound"
        );
        Ok(out)
    }

    async fn send(
        &self,
        target: &Target,
        ep: &'static str,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Raw, ApiError> {
        let url = self.inner.core.url(path)?;
        self.send_url(target, ep, method, url, body).await
    }

    /// One request with the right credential. An installation token GitHub
    /// no longer accepts (`401`: revoked, or expired early) is dropped and
    /// the request sent once more with a fresh one.
    async fn send_url(
        &self,
        target: &Target,
        ep: &'static str,
        method: Method,
        url: Url,
        body: Option<serde_json::Value>,
    ) -> Result<Raw, ApiError> {
        let mut retried = false;
        loop {
            let (credential, bucket) = self.credential(target).await?;
            let raw = self
                .raw_request(
                    bucket,
                    ep,
                    method.clone(),
                    url.clone(),
                    &credential,
                    body.as_ref(),
                )
                .await?;
            if raw.status == StatusCode::UNAUTHORIZED
                && !retried
                && let (Bucket::Installation(id), Creds::App(app)) = (bucket, &self.inner.creds)
            {
                app.tokens.lock().await.remove(&id);
                retried = true;
                continue;
            }
            return Ok(raw);
        }
    }

    async fn raw_request(
        &self,
        bucket: Bucket,
        ep: &'static str,
        method: Method,
        url: Url,
        credential: &SecretString,
        body: Option<&serde_json::Value>,
    ) -> Result<Raw, ApiError> {
        let core = &self.inner.core;
        let mut request = core
            .http
            .request(method, url)
            .bearer_auth(credential.expose_secret())
            .header(ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", API_VERSION);
        if let Some(body) = body {
            request = request.json(body);
        }
        core.execute(bucket, ep, ratelimit::default_resource(ep), request)
            .await
    }

    /// The credential for `target` and the rate-limit bucket it spends.
    async fn credential(&self, target: &Target) -> Result<(SecretString, Bucket), ApiError> {
        match (&self.inner.creds, target) {
            (Creds::Token(t), Target::Scope(_)) => Ok((t.clone(), Bucket::Token)),
            (Creds::Token(_), Target::AppJwt) => Err(ApiError::Auth(
                "a GitHub App's own webhook needs GitHub App credentials, not a token".into(),
            )),
            (Creds::App(app), Target::AppJwt) => Ok((app.jwt()?, Bucket::AppJwt)),
            (Creds::App(_), Target::Scope(GitHubScope::Enterprise(_))) => {
                Err(ApiError::Auth(ENTERPRISE_NEEDS_PAT.into()))
            }
            (Creds::App(app), Target::Scope(scope)) => {
                let id = self.installation_for(app, scope).await?;
                Ok((
                    self.installation_token(app, id).await?,
                    Bucket::Installation(id),
                ))
            }
        }
    }

    /// The installation serving `scope`: the configured one, else looked up
    /// once with the App's JWT.
    async fn installation_for(&self, app: &AppAuth, scope: &GitHubScope) -> Result<u64, ApiError> {
        if let Some(id) = app.fixed_installation {
            return Ok(id);
        }
        if let Some(id) = lock(&app.installations).get(scope) {
            return Ok(*id);
        }
        #[derive(Deserialize)]
        struct Installation {
            id: u64,
        }
        let ep = endpoint::INSTALLATION;
        let url = self
            .inner
            .core
            .url(&format!("{}/installation", scope.path_prefix()))?;
        let jwt = app.jwt()?;
        let raw = self
            .raw_request(Bucket::AppJwt, ep, Method::GET, url, &jwt, None)
            .await?
            .success(ep)?;
        let id = raw.json::<Installation>(ep, false)?.id;
        lock(&app.installations).insert(scope.clone(), id);
        Ok(id)
    }

    /// A cached installation token, or a new one.
    async fn installation_token(&self, app: &AppAuth, id: u64) -> Result<SecretString, ApiError> {
        let mut tokens = app.tokens.lock().await;
        if let Some(c) = tokens.get(&id)
            && Instant::now() < c.refresh_at
        {
            return Ok(c.secret.clone());
        }
        #[derive(Deserialize)]
        struct Answer {
            token: String,
            #[serde(default)]
            expires_at: Option<String>,
        }
        let ep = endpoint::ACCESS_TOKEN;
        let url = self
            .inner
            .core
            .url(&format!("/app/installations/{id}/access_tokens"))?;
        let jwt = app.jwt()?;
        let raw = self
            .raw_request(Bucket::AppJwt, ep, Method::POST, url, &jwt, None)
            .await?
            .success(ep)?;
        let answer: Answer = raw.json(ep, true)?;
        // GitHub's tokens live an hour; assume so if the expiry is unreadable.
        let valid_for = answer
            .expires_at
            .as_deref()
            .and_then(crate::timestamps::parse)
            .map_or(Duration::from_secs(3600), |at| {
                (at - OffsetDateTime::now_utc())
                    .try_into()
                    .unwrap_or(Duration::ZERO)
            });
        let cached = Cached {
            secret: SecretString::from(answer.token),
            refresh_at: Instant::now() + valid_for.saturating_sub(TOKEN_MARGIN),
        };
        let secret = cached.secret.clone();
        tokens.insert(id, cached);
        Ok(secret)
    }
}

impl AppAuth {
    /// The App's JWT, signed anew when the cached one is within a minute of
    /// expiring.
    fn jwt(&self) -> Result<SecretString, ApiError> {
        let mut cached = lock(&self.jwt);
        if let Some(c) = cached.as_ref()
            && Instant::now() < c.refresh_at
        {
            return Ok(c.secret.clone());
        }
        #[derive(serde::Serialize)]
        struct Claims {
            iat: u64,
            exp: u64,
            /// The numeric App id: every GitHub version accepts it (client
            /// ids as strings only newer ones).
            iss: u64,
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| ApiError::Auth("the system clock is before 1970".into()))?
            .as_secs();
        let claims = Claims {
            iat: now.saturating_sub(JWT_BACKDATE),
            exp: now + JWT_LIFETIME,
            iss: self.app_id,
        };
        let token = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            &self.key,
        )
        .map_err(|e| ApiError::Auth(format!("signing the GitHub App JWT failed: {e}")))?;
        let c = Cached {
            secret: SecretString::from(token),
            refresh_at: Instant::now() + Duration::from_secs(JWT_LIFETIME) - TOKEN_MARGIN,
        };
        let secret = c.secret.clone();
        *cached = Some(c);
        Ok(secret)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Only caches behind these locks; a panic cannot leave them half-written.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The `rel="next"` target of a `Link` header.
fn next_link(headers: &HeaderMap) -> Option<Url> {
    let link = headers.get(LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        let is_next = params
            .split(';')
            .any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        if !is_next {
            return None;
        }
        let target = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        Url::parse(target).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn link_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            LINK,
            HeaderValue::from_static(
                "<https://api.github.com/orgs/a/actions/runners?per_page=100&page=2>; rel=\"next\", \
                 <https://api.github.com/orgs/a/actions/runners?per_page=100&page=3>; rel=\"last\"",
            ),
        );
        assert_eq!(
            next_link(&h).map(|u| u.to_string()).as_deref(),
            Some("https://api.github.com/orgs/a/actions/runners?per_page=100&page=2")
        );
        h.insert(
            LINK,
            HeaderValue::from_static("<https://api.github.com/x?page=1>; rel=\"prev\""),
        );
        assert_eq!(next_link(&h), None);
    }

    #[test]
    fn scopes() {
        assert_eq!(
            GitHubScope::repo("acme", "app").path_prefix(),
            "/repos/acme/app"
        );
        assert_eq!(GitHubScope::Org("acme".into()).path_prefix(), "/orgs/acme");
        assert_eq!(
            GitHubScope::Enterprise("big co".into()).path_prefix(),
            "/enterprises/big%20co"
        );
    }

    #[test]
    fn runner_json() {
        let r: GitHubRunner = serde_json::from_str(
            r#"{"id":7,"name":"ry-a","os":"linux","status":"online","busy":true,
                "labels":[{"id":1,"name":"self-hosted","type":"read-only"},{"id":2,"name":"x64","type":"custom"}]}"#,
        )
        .expect("runner");
        assert!(r.is_online() && r.busy);
        assert_eq!(r.labels, ["self-hosted", "x64"]);
    }

    #[test]
    fn bad_keys_are_auth_errors_without_the_key() {
        let pem =
            "-----BEGIN RSA PRIVATE KEY-----\nTOPSECRETMATERIAL\n-----END RSA PRIVATE KEY-----\n";
        let err = GitHubClient::new(
            DEFAULT_BASE_URL,
            GitHubAuth::App {
                app_id: 1,
                private_key_pem: SecretString::from(pem),
                installation_id: None,
            },
            Duration::from_secs(5),
        )
        .expect_err("not a key");
        assert!(matches!(err, ApiError::Auth(_)));
        assert!(!err.to_string().contains("TOPSECRET"), "{err}");
    }
}
