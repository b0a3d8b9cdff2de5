//! A stateful fake of the GitHub REST API, for tests of the scaler, the
//! reconciler and the forge clients: JIT runners at repository,
//! organization and enterprise scope, runner lists (paginated) and deletes
//! with GitHub's lagging `busy` flag, workflow runs and jobs, re-runs,
//! webhook deliveries and redelivery, GitHub App authentication, rate-limit
//! headers and injected rate-limit refusals, and a log of every request.
//!
//! ```no_run
//! # async fn demo() {
//! let gh = runyard_testkit::fake_github::FakeGitHub::start().await;
//! let base_url = gh.url(); // give it to the client under test
//! // ... drive the code under test, then:
//! assert_eq!(gh.count("POST", "/orgs/acme/actions/runners/generate-jitconfig"), 1);
//! # }
//! ```
//!
//! Jobs follow GitHub's lifecycle (`waiting` for an approval, then `queued`;
//! only a queued job starts; a move GitHub never makes panics) and every
//! move sends its `workflow_job` webhook to an outbox ([`hooks`]).
//!
//! Rate limits are per resource, as GitHub counts them: JIT configs and
//! registration tokens spend `actions_runner_registration`, other calls
//! `core`; `GET /rate_limit` spends nothing. Enterprise endpoints refuse
//! installation tokens. Runner groups restrict which repositories' jobs a
//! runner may take; delivery lists page with a `cursor`.
//!
//! Simplifications: each resource's budget is shared by every credential; runner names
//! are unique per scope; a re-run copies the jobs it re-runs with new ids
//! into a new run attempt and keeps the others.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::{Value, json};

mod hooks;
pub use hooks::FakeWebhook;

// ---------------------------------------------------------------------------
// Pieces shared with the GitLab fake.

/// One request a fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Query string (may be empty).
    pub query: String,
    /// Body as text.
    pub body: String,
    /// The `Authorization` (GitHub) or `PRIVATE-TOKEN` (GitLab) header.
    pub credential: Option<String>,
    /// The status the fake answered.
    pub status: u16,
}

/// A running axum server on `127.0.0.1:0`, stopped when dropped.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(router: Router) -> Self {
        #[allow(clippy::unwrap_used)] // test-only code: failing loudly is right
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        #[allow(clippy::unwrap_used)]
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self { addr, task }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Locks a fake's state; a test that panicked while holding it must not
/// hide its own failure behind a poisoned lock.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Seconds since the Unix epoch.
pub(crate) fn epoch_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A rate-limit budget that refills every `window`.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    limit: u64,
    remaining: u64,
    window: Duration,
    /// Unix seconds of the next refill.
    reset: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64, window: Duration) -> Self {
        Self {
            limit,
            remaining: limit,
            window,
            reset: epoch_now() + window.as_secs().max(1),
        }
    }

    fn roll(&mut self) {
        let now = epoch_now();
        if now >= self.reset {
            self.remaining = self.limit;
            self.reset = now + self.window.as_secs().max(1);
        }
    }

    /// Spends one request; `false` when the budget is exhausted.
    pub(crate) fn spend(&mut self) -> bool {
        self.roll();
        if self.remaining == 0 {
            return false;
        }
        self.remaining -= 1;
        true
    }

    pub(crate) fn remaining(&self) -> u64 {
        self.remaining
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    pub(crate) fn reset(&self) -> u64 {
        self.reset
    }

    /// Seconds until the refill (at least 1).
    pub(crate) fn seconds_to_reset(&self) -> u64 {
        self.reset.saturating_sub(epoch_now()).max(1)
    }
}

impl Budget {
    /// Spent until `reset` (Unix seconds): remaining 0 until then.
    fn exhaust_until(&mut self, reset: u64) {
        self.remaining = 0;
        self.reset = reset;
    }

    /// Its reset has come: full again, the next window starts now.
    fn refill_now(&mut self) {
        self.remaining = self.limit;
        self.reset = epoch_now() + self.window.as_secs().max(1);
    }
}

/// Injected refusals: the next `n` requests answer `status` with
/// `Retry-After: retry_after`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fault {
    pub(crate) status: u16,
    pub(crate) retry_after: u64,
}

/// Query pairs, percent-decoded.
pub(crate) fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    out.push(b);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of a query parameter.
pub(crate) fn param<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `page` and `per_page` (default `default_per_page`, at most 100).
pub(crate) fn paging(pairs: &[(String, String)], default_per_page: usize) -> (usize, usize) {
    let per_page = param(pairs, "per_page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_per_page)
        .clamp(1, 100);
    let page = param(pairs, "page")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1usize)
        .max(1);
    (page, per_page)
}

/// A JSON answer.
pub(crate) fn answer(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body.clone())).into_response()
}

/// Random alphanumerics.
pub(crate) fn random_token(len: usize) -> String {
    use rand::distr::{Alphanumeric, SampleString};
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

/// RFC 3339 (whole seconds, UTC) of a system time.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// GitHub App keys for tests.

/// An RSA key pair for a fake GitHub App, generated at run time (no private
/// key is kept in the repository). One per test process, and 1024 bits:
/// finding 2048-bit primes takes seconds in an unoptimized build, and the
/// client's code path does not depend on the key size.
#[derive(Debug)]
pub struct AppKey {
    /// PKCS#1 PEM private key, as GitHub hands out App keys.
    pub private_pem: String,
    /// PKCS#1 PEM public key (what [`FakeGitHub::enable_app`] takes).
    pub public_pem: String,
}

impl AppKey {
    /// The process-wide test key.
    pub fn shared() -> &'static AppKey {
        static KEY: OnceLock<AppKey> = OnceLock::new();
        KEY.get_or_init(|| {
            use rsa::pkcs1::{EncodeRsaPrivateKey, EncodeRsaPublicKey, LineEnding};
            #[allow(clippy::unwrap_used)]
            let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024).unwrap();
            let public = rsa::RsaPublicKey::from(&private);
            #[allow(clippy::unwrap_used)]
            AppKey {
                private_pem: private.to_pkcs1_pem(LineEnding::LF).unwrap().to_string(),
                public_pem: public.to_pkcs1_pem(LineEnding::LF).unwrap(),
            }
        })
    }
}

// ---------------------------------------------------------------------------
// The GitHub fake.

/// What the fake's `encoded_jit_config` holds (base64 of this JSON), so a
/// fake runner process knows which runner it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitInfo {
    /// The registered runner's id.
    pub runner_id: u64,
    /// Its name.
    pub name: String,
    /// Its scope's path prefix (`/orgs/acme`).
    pub scope: String,
}

/// Reads a JIT config the fake issued.
pub fn decode_jit_config(encoded: &str) -> Option<JitInfo> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    Some(JitInfo {
        runner_id: v.get("runner_id")?.as_u64()?,
        name: v.get("name")?.as_str()?.to_owned(),
        scope: v.get("scope")?.as_str()?.to_owned(),
    })
}

/// A runner as the fake holds it (its real state, not the lagged one the
/// API reports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRunner {
    /// Id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Scope path prefix: `/repos/o/r`, `/orgs/o`, `/enterprises/e`.
    pub scope: String,
    /// Labels (defaults first).
    pub labels: Vec<String>,
    /// `online` or `offline`.
    pub status: String,
    /// Whether it really runs a job now.
    pub busy: bool,
    /// The runner group it was registered in.
    pub runner_group_id: u64,
}

/// Names a runner in the test controls: by id or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerKey {
    /// By id.
    Id(u64),
    /// By name (any scope).
    Name(String),
}

impl From<u64> for RunnerKey {
    fn from(id: u64) -> Self {
        Self::Id(id)
    }
}

impl From<&str> for RunnerKey {
    fn from(name: &str) -> Self {
        Self::Name(name.to_owned())
    }
}

impl From<String> for RunnerKey {
    fn from(name: String) -> Self {
        Self::Name(name)
    }
}

/// A workflow job as a test describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeJob {
    /// Job id; 0 lets the fake choose.
    pub id: u64,
    /// Its run (created on first use).
    pub run_id: u64,
    /// Its run attempt.
    pub run_attempt: u32,
    /// `queued`, `in_progress`, `completed`, ...
    pub status: String,
    /// Once completed: `success`, `failure`, ...
    pub conclusion: Option<String>,
    /// Display name.
    pub name: String,
    /// `runs-on` labels.
    pub labels: Vec<String>,
    /// The runner that took it.
    pub runner_name: Option<String>,
    /// Workflow name.
    pub workflow_name: String,
    /// Branch.
    pub head_branch: String,
    /// Commit.
    pub head_sha: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub started_at: Option<String>,
    /// RFC 3339.
    pub completed_at: Option<String>,
}

impl FakeJob {
    /// A queued job of run `run_id`, attempt 1.
    pub fn queued(run_id: u64, name: &str, labels: &[&str]) -> Self {
        Self {
            id: 0,
            run_id,
            run_attempt: 1,
            status: "queued".into(),
            conclusion: None,
            name: name.into(),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            runner_name: None,
            workflow_name: "ci".into(),
            head_branch: "main".into(),
            head_sha: "0123456789abcdef0123456789abcdef01234567".into(),
            created_at: rfc3339(SystemTime::now()),
            started_at: None,
            completed_at: None,
        }
    }
}

/// A workflow run: its jobs' repository, attempt and latest jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRun {
    /// Run id.
    pub id: u64,
    /// `owner/repo`.
    pub repo: String,
    /// Current attempt.
    pub run_attempt: u32,
    /// Jobs of the current attempt.
    pub jobs: Vec<u64>,
    /// Commit.
    pub head_sha: String,
    /// Branch.
    pub head_branch: String,
    /// Workflow name.
    pub name: String,
}

/// A webhook in the fake.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FakeHook {
    /// A repository hook.
    Repo {
        /// Owner.
        owner: String,
        /// Repository.
        repo: String,
        /// Hook id.
        hook_id: u64,
    },
    /// An organization hook.
    Org {
        /// Organization.
        org: String,
        /// Hook id.
        hook_id: u64,
    },
    /// The App's own hook.
    App,
}

/// One webhook delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeDelivery {
    /// Numeric id; 0 lets the fake choose.
    pub id: u64,
    /// `X-GitHub-Delivery`.
    pub guid: String,
    /// What the receiver answered (0: no answer).
    pub status_code: u16,
    /// Event.
    pub event: String,
    /// Action.
    pub action: Option<String>,
    /// Whether it was a redelivery.
    pub redelivery: bool,
    /// RFC 3339.
    pub delivered_at: String,
}

impl FakeDelivery {
    /// A `workflow_job` delivery the receiver answered with `status_code`.
    pub fn workflow_job(guid: &str, action: &str, status_code: u16) -> Self {
        Self {
            id: 0,
            guid: guid.into(),
            status_code,
            event: "workflow_job".into(),
            action: Some(action.into()),
            redelivery: false,
            delivered_at: rfc3339(SystemTime::now()),
        }
    }
}

/// A re-run the fake was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeRerun {
    /// `rerun-failed-jobs` of a run.
    FailedJobs {
        /// `owner/repo`.
        repo: String,
        /// Run id.
        run_id: u64,
    },
    /// `jobs/{id}/rerun`.
    Job {
        /// `owner/repo`.
        repo: String,
        /// Job id.
        job_id: u64,
    },
}

#[derive(Debug)]
struct Runner {
    info: FakeRunner,
    /// When `busy` changed, oldest first.
    busy_changes: Vec<(Instant, bool)>,
}

impl Runner {
    /// `busy` as GitHub reports it: the value as it was `lag` ago.
    fn reported_busy(&self, lag: Duration) -> bool {
        if lag.is_zero() {
            return self.info.busy;
        }
        let Some(then) = Instant::now().checked_sub(lag) else {
            return false;
        };
        self.busy_changes
            .iter()
            .rev()
            .find(|(t, _)| *t <= then)
            .is_some_and(|(_, b)| *b)
    }
}

#[derive(Debug)]
struct App {
    app_id: u64,
    key: jsonwebtoken::DecodingKey,
}

#[derive(Debug)]
struct Issued {
    installation: u64,
    expires: SystemTime,
}

#[derive(Debug)]
struct GhState {
    next_runner_id: u64,
    runners: BTreeMap<u64, Runner>,
    default_labels: Vec<String>,
    busy_lag: Duration,
    delete_checks_busy: bool,
    deleted_while_busy: u64,
    busy_refusals: u64,
    link_headers: bool,

    faults: VecDeque<Fault>,
    budget: Budget,

    pat: Option<String>,
    app: Option<App>,
    /// `orgs/x`, `repos/o/r`, `enterprises/e` → installation id.
    installations: HashMap<String, u64>,
    tokens: HashMap<String, Issued>,
    token_ttl: Duration,
    tokens_issued: u64,

    next_job_id: u64,
    runs: BTreeMap<u64, FakeRun>,
    jobs: BTreeMap<u64, (String, FakeJob)>,
    reruns: Vec<FakeRerun>,

    next_delivery_id: u64,
    deliveries: Vec<(FakeHook, FakeDelivery)>,
    redeliveries: Vec<(FakeHook, u64)>,

    requests: Vec<RecordedRequest>,
    runner_downloads: Vec<Value>,
    /// `workflow_job` deliveries sent, oldest first (see [`hooks`]).
    webhooks: Vec<FakeWebhook>,

    /// Budgets of the resources other than `core` (which is `budget`).
    resource_budgets: BTreeMap<String, Budget>,
    /// Runner groups by scope prefix (`/orgs/o`, `/enterprises/e`),
    /// besides the default group every scope has.
    runner_groups: BTreeMap<String, Vec<FakeRunnerGroup>>,
    /// The Actions service whose registration steps this fake answers
    /// ([`FakeGitHub::connect_actions`]).
    actions: Option<crate::fake_actions::ActionsLink>,
}

/// The fake GitHub server. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeGitHub {
    server: Server,
    state: Arc<Mutex<GhState>>,
}

impl FakeGitHub {
    /// Starts a fake on a free loopback port. It accepts any bearer token
    /// until [`FakeGitHub::require_token`] or [`FakeGitHub::enable_app`].
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(GhState {
            next_runner_id: 1,
            runners: BTreeMap::new(),
            default_labels: vec!["self-hosted".into(), "Linux".into(), "X64".into()],
            busy_lag: Duration::ZERO,
            delete_checks_busy: true,
            deleted_while_busy: 0,
            busy_refusals: 0,
            link_headers: true,
            faults: VecDeque::new(),
            budget: Budget::new(5000, Duration::from_secs(3600)),
            pat: None,
            app: None,
            installations: HashMap::new(),
            tokens: HashMap::new(),
            token_ttl: Duration::from_secs(3600),
            tokens_issued: 0,
            next_job_id: 1000,
            runs: BTreeMap::new(),
            jobs: BTreeMap::new(),
            reruns: Vec::new(),
            next_delivery_id: 5000,
            deliveries: Vec::new(),
            redeliveries: Vec::new(),
            requests: Vec::new(),
            runner_downloads: default_runner_downloads(),
            webhooks: Vec::new(),
            resource_budgets: BTreeMap::new(),
            runner_groups: BTreeMap::new(),
            actions: None,
        }));
        let router = Router::new().fallback(handle).with_state(state.clone());
        Self {
            server: Server::start(router).await,
            state,
        }
    }

    /// The API base URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    fn st(&self) -> MutexGuard<'_, GhState> {
        lock(&self.state)
    }

    // -- authentication

    /// Accepts only this bearer token (a personal access token).
    pub fn require_token(&self, token: &str) {
        self.st().pat = Some(token.to_owned());
    }

    /// Turns on GitHub App authentication: `/app/...` and installation
    /// look-ups need a JWT from App `app_id` signed with the key whose public
    /// half is `public_key_pem` (RS256, `iat`/`exp` at most 10 minutes
    /// apart); every other endpoint needs an unexpired installation token
    /// of the installation serving its scope.
    pub fn enable_app(&self, app_id: u64, public_key_pem: &str) {
        #[allow(clippy::unwrap_used)]
        let key = jsonwebtoken::DecodingKey::from_rsa_pem(public_key_pem.as_bytes()).unwrap();
        self.st().app = Some(App { app_id, key });
    }

    /// Installs the App on a scope: `orgs/acme`, `repos/acme/app` or
    /// `enterprises/big` (a repository is also served by its owner's
    /// organization installation).
    pub fn add_installation(&self, scope: &str, installation_id: u64) {
        self.st()
            .installations
            .insert(scope.trim_matches('/').to_owned(), installation_id);
    }

    /// How long new installation tokens live (default one hour).
    pub fn set_token_ttl(&self, ttl: Duration) {
        self.st().token_ttl = ttl;
    }

    /// Installation tokens issued so far.
    pub fn tokens_issued(&self) -> u64 {
        self.st().tokens_issued
    }

    /// Invalidates every installation token issued so far (`401` on use).
    pub fn revoke_tokens(&self) {
        self.st().tokens.clear();
    }

    /// Answers the registration steps of the Actions service `actions`
    /// from now on, as github.com's API does: `POST
    /// {orgs/o|repos/o/r|enterprises/e}/actions/runners/registration-token`
    /// (this fake's own credential rules: any token, [`FakeGitHub::require_token`]
    /// or App installation tokens; enterprises refuse those; charged to
    /// `actions_runner_registration`) answers 201 with a registration token
    /// `actions` knows, and `POST /actions/runner-registration`
    /// (`Authorization: RemoteAuth <that token>`, charged to `core`)
    /// answers 201 with `actions`' service URL and an admin token it
    /// issued (honouring its `set_down` and `fail_next_registration`).
    pub fn connect_actions(&self, actions: &crate::fake_actions::FakeActions) {
        self.st().actions = Some(actions.link());
    }

    // -- runners

    /// Registers a runner directly (as if configured by hand), `offline`.
    pub fn add_runner(&self, scope: &str, name: &str, labels: &[&str]) -> u64 {
        let labels: Vec<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        let mut st = self.st();
        create_runner(&mut st, scope, name, &labels, 1)
    }

    /// Every runner, with its real state.
    pub fn runners(&self) -> Vec<FakeRunner> {
        self.st().runners.values().map(|r| r.info.clone()).collect()
    }

    /// One runner, with its real state.
    pub fn runner(&self, key: impl Into<RunnerKey>) -> Option<FakeRunner> {
        let key = key.into();
        let st = self.st();
        find(&st, &key).and_then(|id| st.runners.get(&id).map(|r| r.info.clone()))
    }

    /// Marks a runner `online` (it connected).
    pub fn set_online(&self, key: impl Into<RunnerKey>) {
        self.set_status(key, "online");
    }

    /// Marks a runner `offline`.
    pub fn set_offline(&self, key: impl Into<RunnerKey>) {
        self.set_status(key, "offline");
    }

    fn set_status(&self, key: impl Into<RunnerKey>, status: &str) {
        let key = key.into();
        let mut st = self.st();
        if let Some(id) = find(&st, &key)
            && let Some(r) = st.runners.get_mut(&id)
        {
            r.info.status = status.to_owned();
        }
    }

    /// Sets whether a runner really runs a job. The API reports the change
    /// only after the busy-flag lag.
    pub fn set_busy(&self, key: impl Into<RunnerKey>, busy: bool) {
        let key = key.into();
        let mut st = self.st();
        if let Some(id) = find(&st, &key)
            && let Some(r) = st.runners.get_mut(&id)
        {
            if r.info.busy != busy {
                r.busy_changes.push((Instant::now(), busy));
            }
            r.info.busy = busy;
        }
    }

    /// How stale the reported `busy` flag is (default none). GitHub's lags
    /// by tens of seconds.
    pub fn set_busy_lag(&self, lag: Duration) {
        self.st().busy_lag = lag;
    }

    /// Whether a delete of a runner that really runs a job is refused with
    /// `422` (default, as GitHub does). Turned off, such a delete succeeds
    /// and counts in [`FakeGitHub::deleted_while_busy`]: a model of the
    /// moment a job is handed to a runner just as it is deleted.
    pub fn set_delete_checks_busy(&self, on: bool) {
        self.st().delete_checks_busy = on;
    }

    /// Deletes that succeeded while the runner really ran a job.
    pub fn deleted_while_busy(&self) -> u64 {
        self.st().deleted_while_busy
    }

    /// Deletes refused with `422` because the runner was busy.
    pub fn busy_refusals(&self) -> u64 {
        self.st().busy_refusals
    }

    /// Removes a runner as an ephemeral runner removes itself after its job.
    pub fn remove_runner(&self, key: impl Into<RunnerKey>) {
        let key = key.into();
        let mut st = self.st();
        if let Some(id) = find(&st, &key) {
            st.runners.remove(&id);
        }
    }

    /// The labels every JIT runner gets besides the requested ones
    /// (default `self-hosted`, `Linux`, `X64`).
    pub fn set_default_labels(&self, labels: &[&str]) {
        self.st().default_labels = labels.iter().map(|l| (*l).to_owned()).collect();
    }

    /// Whether listings send `Link` headers (default on); off, a client must
    /// page by `total_count`.
    pub fn set_link_headers(&self, on: bool) {
        self.st().link_headers = on;
    }

    // -- rate limits

    /// The next `n` requests answer `status` (403 or 429) with
    /// `Retry-After: retry_after_secs` and GitHub's secondary-limit message.
    pub fn fail_next(&self, n: u32, status: u16, retry_after_secs: u64) {
        let mut st = self.st();
        for _ in 0..n {
            st.faults.push_back(Fault {
                status,
                retry_after: retry_after_secs,
            });
        }
    }

    /// The primary budget: `limit` requests per `window` (default 5000 per
    /// hour). Exhausted, requests get GitHub's `403` with remaining 0.
    pub fn set_rate_limit(&self, limit: u64, window: Duration) {
        self.st().budget = Budget::new(limit, window);
    }

    // -- runs and jobs

    /// Adds a job (and its run, if new). Returns the job id.
    pub fn add_job(&self, owner: &str, repo: &str, mut job: FakeJob) -> u64 {
        let mut st = self.st();
        if job.id == 0 {
            job.id = st.next_job_id;
        }
        st.next_job_id = st.next_job_id.max(job.id + 1);
        let full = format!("{owner}/{repo}");
        let run = st.runs.entry(job.run_id).or_insert_with(|| FakeRun {
            id: job.run_id,
            repo: full.clone(),
            run_attempt: job.run_attempt,
            jobs: Vec::new(),
            head_sha: job.head_sha.clone(),
            head_branch: job.head_branch.clone(),
            name: job.workflow_name.clone(),
        });
        if job.run_attempt > run.run_attempt {
            run.run_attempt = job.run_attempt;
            run.jobs.clear();
        }
        if job.run_attempt == run.run_attempt && !run.jobs.contains(&job.id) {
            run.jobs.push(job.id);
        }
        let id = job.id;
        if matches!(job.status.as_str(), "queued" | "waiting") {
            st.send(&full, &job, &job.status.clone());
        }
        st.jobs.insert(id, (full, job));
        id
    }

    /// Moves a job to `status` (`in_progress` sets `started_at`, `completed`
    /// sets `completed_at`) and sends its webhook. Panics on a move GitHub
    /// never makes (a `waiting` job cannot start, nothing leaves
    /// `completed`).
    pub fn set_job_status(&self, job_id: u64, status: &str, conclusion: Option<&str>) {
        let mut st = self.st();
        if st.jobs.contains_key(&job_id) {
            st.transition(job_id, status, conclusion);
        }
    }

    /// Assigns a job to a runner (sets `runner_name`).
    pub fn set_job_runner(&self, job_id: u64, runner_name: &str) {
        if let Some((_, job)) = self.st().jobs.get_mut(&job_id) {
            job.runner_name = Some(runner_name.to_owned());
        }
    }

    /// A job as the fake holds it.
    pub fn job(&self, job_id: u64) -> Option<FakeJob> {
        self.st().jobs.get(&job_id).map(|(_, j)| j.clone())
    }

    /// A run as the fake holds it.
    pub fn run(&self, run_id: u64) -> Option<FakeRun> {
        self.st().runs.get(&run_id).cloned()
    }

    /// The re-runs asked for, in order.
    pub fn reruns(&self) -> Vec<FakeRerun> {
        self.st().reruns.clone()
    }

    // -- webhook deliveries

    /// Adds a delivery to a hook's list. Returns its id.
    pub fn add_delivery(&self, hook: FakeHook, mut delivery: FakeDelivery) -> u64 {
        let mut st = self.st();
        if delivery.id == 0 {
            delivery.id = st.next_delivery_id;
        }
        st.next_delivery_id = st.next_delivery_id.max(delivery.id + 1);
        let id = delivery.id;
        st.deliveries.push((hook, delivery));
        id
    }

    /// Redeliveries asked for (hook, delivery id), in order.
    pub fn redeliveries(&self) -> Vec<(FakeHook, u64)> {
        self.st().redeliveries.clone()
    }

    // -- request log

    /// What `GET .../actions/runners/downloads` answers (every scope):
    /// GitHub's objects (`os`, `architecture`, `download_url`, `filename`,
    /// `sha256_checksum`, optionally `temp_download_token`).
    pub fn set_runner_downloads(&self, downloads: Vec<Value>) {
        self.st().runner_downloads = downloads;
    }

    /// The runner downloads served (see [`FakeGitHub::set_runner_downloads`]).
    pub fn runner_downloads(&self) -> Vec<Value> {
        self.st().runner_downloads.clone()
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.st().requests.clone()
    }

    /// Requests with this method whose path starts with `path_prefix`.
    pub fn count(&self, method: &str, path_prefix: &str) -> usize {
        self.st()
            .requests
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path.starts_with(path_prefix))
            .count()
    }
}

fn find(st: &GhState, key: &RunnerKey) -> Option<u64> {
    match key {
        RunnerKey::Id(id) => st.runners.contains_key(id).then_some(*id),
        RunnerKey::Name(name) => st
            .runners
            .values()
            .find(|r| &r.info.name == name)
            .map(|r| r.info.id),
    }
}

fn create_runner(st: &mut GhState, scope: &str, name: &str, labels: &[String], group: u64) -> u64 {
    let id = st.next_runner_id;
    st.next_runner_id += 1;
    let mut all: Vec<String> = Vec::new();
    for l in st.default_labels.iter().chain(labels) {
        if !all.iter().any(|a| a.eq_ignore_ascii_case(l)) {
            all.push(l.clone());
        }
    }
    st.runners.insert(
        id,
        Runner {
            info: FakeRunner {
                id,
                name: name.to_owned(),
                scope: scope.to_owned(),
                labels: all,
                status: "offline".into(),
                busy: false,
                runner_group_id: group,
            },
            busy_changes: Vec::new(),
        },
    );
    id
}

/// Everything a handler needs from one request.
struct Req<'a> {
    method: &'a Method,
    segs: Vec<&'a str>,
    query: Vec<(String, String)>,
    body: &'a [u8],
    bearer: Option<&'a str>,
    /// `Authorization: RemoteAuth <token>` (the Actions registration).
    remote_auth: Option<&'a str>,
    host: String,
}

async fn handle(
    State(state): State<Arc<Mutex<GhState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bearer = credential.as_deref().and_then(|v| {
        v.strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("token "))
    });
    let host = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let path = uri.path().to_owned();
    let req = Req {
        method: &method,
        segs: path.split('/').filter(|s| !s.is_empty()).collect(),
        query: query_pairs(uri.query().unwrap_or("")),
        body: &body,
        bearer,
        remote_auth: credential
            .as_deref()
            .and_then(|v| v.strip_prefix("RemoteAuth ")),
        host,
    };
    let mut st = lock(&state);
    let mut response = route(&mut st, &req);
    let resource = resource_of(&req.segs, req.method);
    let b = budget_of(&mut st, resource).clone();
    let h = response.headers_mut();
    for (name, value) in [
        ("x-ratelimit-limit", b.limit()),
        ("x-ratelimit-remaining", b.remaining()),
        ("x-ratelimit-reset", b.reset()),
        ("x-ratelimit-used", b.limit() - b.remaining()),
    ] {
        h.insert(name, HeaderValue::from(value));
    }
    h.insert("x-ratelimit-resource", HeaderValue::from_static(resource));
    st.requests.push(RecordedRequest {
        method: method.to_string(),
        path,
        query: uri.query().unwrap_or("").to_owned(),
        body: String::from_utf8_lossy(&body).into_owned(),
        credential,
        status: response.status().as_u16(),
    });
    response
}

fn message(status: u16, text: &str) -> Response {
    answer(
        status,
        &json!({"message": text, "documentation_url": "https://docs.github.com/rest"}),
    )
}

fn route(st: &mut GhState, req: &Req<'_>) -> Response {
    if let Some(fault) = st.faults.pop_front() {
        let mut r = message(
            fault.status,
            "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
        );
        r.headers_mut()
            .insert("retry-after", HeaderValue::from(fault.retry_after));
        return r;
    }
    let app_route = matches!(req.segs.first(), Some(&"app"))
        || matches!(req.segs.last(), Some(&"installation"));
    // Step C of the Actions registration carries its own credential.
    let actions_registration = st.actions.is_some()
        && req.method == Method::POST
        && req.segs.as_slice() == ["actions", "runner-registration"];
    let authorized = if actions_registration {
        Ok(())
    } else if app_route {
        check_jwt(st, req.bearer)
    } else {
        check_token(st, req)
    };
    if let Err((status, text)) = authorized {
        return message(status, text);
    }
    if let Some(refused) = enterprise_refusal(st, req) {
        return refused;
    }
    if req.segs.as_slice() == ["rate_limit"] && req.method == Method::GET {
        // Not charged to any budget, as on GitHub.
        return rate_limit_answer(st);
    }
    let resource = resource_of(&req.segs, req.method);
    if !budget_of(st, resource).spend() {
        return message(
            403,
            "API rate limit exceeded for installation. Check out the documentation for more details.",
        );
    }
    let segs = req.segs.as_slice();
    let m = req.method;
    match segs {
        ["app", "installations", id, "access_tokens"] if m == Method::POST => access_token(st, id),
        ["orgs", _, "installation"]
        | ["repos", _, _, "installation"]
        | ["enterprises", _, "installation"]
            if m == Method::GET =>
        {
            match installation_of(st, segs) {
                Some(id) => answer(
                    200,
                    &json!({"id": id, "app_id": st.app.as_ref().map(|a| a.app_id)}),
                ),
                None => message(404, "Not Found"),
            }
        }
        ["app", "hook", "deliveries"] if m == Method::GET => {
            list_deliveries(st, &FakeHook::App, req)
        }
        ["app", "hook", "deliveries", id, "attempts"] if m == Method::POST => {
            redeliver(st, FakeHook::App, id)
        }
        [.., "hooks", _, "deliveries"] | [.., "hooks", _, "deliveries", _, "attempts"] => {
            hook_route(st, req)
        }
        [.., "actions", "runners", "generate-jitconfig"] if m == Method::POST => {
            match scope_of(&segs[..segs.len() - 3]) {
                Some(scope) => generate_jitconfig(st, &scope, req.body),
                None => message(404, "Not Found"),
            }
        }
        ["actions", "runner-registration"] if m == Method::POST => match &st.actions {
            Some(link) => {
                let (status, body) = link.runner_registration(req.remote_auth, req.body);
                answer(status, &body)
            }
            None => message(404, "Not Found"),
        },
        [.., "actions", "runners", "registration-token"] if m == Method::POST => {
            match (scope_of(&segs[..segs.len() - 3]), &st.actions) {
                (Some(_), Some(link)) => {
                    let (token, expires_at) = link.issue_registration_token();
                    answer(201, &json!({"token": token, "expires_at": expires_at}))
                }
                _ => message(404, "Not Found"),
            }
        }
        [.., "actions", "runners", "downloads"] if m == Method::GET => {
            match scope_of(&segs[..segs.len() - 3]) {
                Some(_) => answer(200, &Value::Array(st.runner_downloads.clone())),
                None => message(404, "Not Found"),
            }
        }
        [.., "actions", "runners"] if m == Method::GET => match scope_of(&segs[..segs.len() - 2]) {
            Some(scope) => list_runners(st, &scope, req),
            None => message(404, "Not Found"),
        },
        [.., "actions", "runners", id] => match (scope_of(&segs[..segs.len() - 3]), id.parse()) {
            (Some(scope), Ok(id)) if m == Method::GET => get_runner(st, &scope, id),
            (Some(scope), Ok(id)) if m == Method::DELETE => delete_runner(st, &scope, id),
            _ => message(404, "Not Found"),
        },
        [.., "actions", "runner-groups"] | [.., "actions", "runner-groups", _, "repositories"]
            if m == Method::GET =>
        {
            runner_groups_route(st, req)
        }
        ["repos", o, r, "actions", rest @ ..] => actions(st, &format!("{o}/{r}"), rest, req),
        _ => message(404, "Not Found"),
    }
}

/// Runner builds as GitHub lists them (the checksums are made up).
fn default_runner_downloads() -> Vec<Value> {
    const VERSION: &str = "2.328.0";
    [
        ("linux", "x64", "tar.gz"),
        ("linux", "arm64", "tar.gz"),
        ("linux", "arm", "tar.gz"),
        ("osx", "x64", "tar.gz"),
        ("osx", "arm64", "tar.gz"),
        ("win", "x64", "zip"),
        ("win", "arm64", "zip"),
    ]
    .iter()
    .enumerate()
    .map(|(i, (os, arch, ext))| {
        let filename = format!("actions-runner-{os}-{arch}-{VERSION}.{ext}");
        json!({
            "os": os,
            "architecture": arch,
            "download_url": format!("https://github.com/actions/runner/releases/download/v{VERSION}/{filename}"),
            "filename": filename,
            "sha256_checksum": format!("{:064x}", i + 1),
        })
    })
    .collect()
}

/// `/repos/o/r`, `/orgs/o`, `/enterprises/e` from leading segments.
fn scope_of(segs: &[&str]) -> Option<String> {
    match segs {
        ["repos", o, r] => Some(format!("/repos/{o}/{r}")),
        ["orgs", o] => Some(format!("/orgs/{o}")),
        ["enterprises", e] => Some(format!("/enterprises/{e}")),
        _ => None,
    }
}

/// The installation serving the scope a path starts with.
fn installation_of(st: &GhState, segs: &[&str]) -> Option<u64> {
    match segs {
        ["repos", o, r, ..] => st
            .installations
            .get(&format!("repos/{o}/{r}"))
            .or_else(|| st.installations.get(&format!("orgs/{o}")))
            .copied(),
        ["orgs", o, ..] => st.installations.get(&format!("orgs/{o}")).copied(),
        ["enterprises", e, ..] => st.installations.get(&format!("enterprises/{e}")).copied(),
        _ => None,
    }
}

/// Why a request was refused: status and message.
type Refusal = (u16, &'static str);

fn check_jwt(st: &GhState, bearer: Option<&str>) -> Result<(), Refusal> {
    let Some(app) = st.app.as_ref() else {
        return Err((401, "A JSON web token could not be decoded"));
    };
    let Some(jwt) = bearer else {
        return Err((401, "A JSON web token could not be decoded"));
    };
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    // `iss` may be a number (the App id) or a string (a client id), which
    // the library's own claim check does not allow: checked below.
    validation.set_required_spec_claims(&["exp"]);
    validation.leeway = 0;
    let claims = jsonwebtoken::decode::<Value>(jwt, &app.key, &validation)
        .map_err(|_| (401, "A JSON web token could not be decoded"))?
        .claims;
    let iss_ok = match claims.get("iss") {
        Some(Value::String(s)) => s == &app.app_id.to_string(),
        Some(Value::Number(n)) => n.as_u64() == Some(app.app_id),
        _ => false,
    };
    let iat = claims
        .get("iat")
        .and_then(Value::as_u64)
        .unwrap_or(u64::MAX);
    let exp = claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
    let now = epoch_now();
    if !iss_ok {
        return Err((401, "'Issuer' claim ('iss') must be an Integer"));
    }
    if iat > now + 1 || exp > now + 600 || exp <= iat {
        return Err((
            401,
            "'Expiration time' claim ('exp') is too far in the future",
        ));
    }
    Ok(())
}

fn check_token(st: &mut GhState, req: &Req<'_>) -> Result<(), Refusal> {
    let Some(token) = req.bearer.filter(|t| !t.is_empty()) else {
        return Err((401, "Requires authentication"));
    };
    let is_pat = st.pat.as_deref() == Some(token);
    if st.app.is_some() && !is_pat {
        let now = SystemTime::now();
        let Some(issued) = st.tokens.get(token).filter(|i| i.expires > now) else {
            return Err((401, "Bad credentials"));
        };
        if let Some(needed) = installation_of(st, &req.segs)
            && needed != issued.installation
        {
            return Err((403, "Resource not accessible by integration"));
        }
        return Ok(());
    }
    match &st.pat {
        Some(pat) if pat != token => Err((401, "Bad credentials")),
        _ => Ok(()),
    }
}

fn access_token(st: &mut GhState, id: &str) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return message(404, "Not Found");
    };
    if !st.installations.values().any(|i| *i == id) {
        return message(404, "Not Found");
    }
    let token = format!("ghs_{}", random_token(36));
    let expires = SystemTime::now() + st.token_ttl;
    st.tokens.insert(
        token.clone(),
        Issued {
            installation: id,
            expires,
        },
    );
    st.tokens_issued += 1;
    answer(
        201,
        &json!({
            "token": token,
            "expires_at": rfc3339(expires),
            "permissions": {"administration": "write", "actions": "write"},
            "repository_selection": "all",
        }),
    )
}

fn runner_json(r: &Runner, lag: Duration) -> Value {
    let labels: Vec<Value> = r
        .info
        .labels
        .iter()
        .enumerate()
        .map(|(i, l)| json!({"id": i + 1, "name": l, "type": if i < 3 { "read-only" } else { "custom" }}))
        .collect();
    json!({
        "id": r.info.id,
        "name": r.info.name,
        "os": "Linux",
        "status": r.info.status,
        "busy": r.reported_busy(lag),
        "ephemeral": true,
        "runner_group_id": r.info.runner_group_id,
        "labels": labels,
    })
}

fn generate_jitconfig(st: &mut GhState, scope: &str, body: &[u8]) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return message(400, "Problems parsing JSON");
    };
    let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
    let group = v.get("runner_group_id").and_then(Value::as_u64);
    let labels: Option<Vec<String>> = v.get("labels").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    });
    let (Some(group), Some(labels)) = (group, labels) else {
        return message(
            422,
            "Invalid request. runner_group_id and labels are required.",
        );
    };
    if name.is_empty() || labels.is_empty() || labels.len() > 100 {
        return message(
            422,
            "Invalid request. name and at least one label are required.",
        );
    }
    if st
        .runners
        .values()
        .any(|r| r.info.scope == scope && r.info.name == name)
    {
        return message(
            409,
            &format!("Already exists - A runner with the name {name} already exists."),
        );
    }
    let id = create_runner(st, scope, name, &labels, group);
    let config = json!({"runner_id": id, "name": name, "scope": scope});
    let encoded = base64::engine::general_purpose::STANDARD.encode(config.to_string());
    let runner = st.runners.get(&id).map(|r| runner_json(r, st.busy_lag));
    answer(
        201,
        &json!({"runner": runner, "encoded_jit_config": encoded}),
    )
}

/// One page of `items` and the `Link` header for it.
fn page_of(
    items: Vec<Value>,
    req: &Req<'_>,
    link_headers: bool,
    default_per_page: usize,
) -> (Vec<Value>, Option<HeaderValue>) {
    let (page, per_page) = paging(&req.query, default_per_page);
    let total = items.len();
    let pages = total.div_ceil(per_page).max(1);
    let slice: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let link = (link_headers && page < pages).then(|| {
        let path = format!("/{}", req.segs.join("/"));
        let others: String = req
            .query
            .iter()
            .filter(|(k, _)| k != "page" && k != "per_page")
            .map(|(k, v)| format!("&{k}={v}"))
            .collect();
        let url = |p: usize| {
            format!(
                "http://{}{path}?per_page={per_page}&page={p}{others}",
                req.host
            )
        };
        let value = format!(
            "<{}>; rel=\"next\", <{}>; rel=\"last\"",
            url(page + 1),
            url(pages)
        );
        HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static(""))
    });
    (slice, link)
}

fn with_link(mut r: Response, link: Option<HeaderValue>) -> Response {
    if let Some(link) = link {
        r.headers_mut().insert("link", link);
    }
    r
}

fn list_runners(st: &GhState, scope: &str, req: &Req<'_>) -> Response {
    let all: Vec<Value> = st
        .runners
        .values()
        .filter(|r| r.info.scope == scope)
        .map(|r| runner_json(r, st.busy_lag))
        .collect();
    let total = all.len();
    let (runners, link) = page_of(all, req, st.link_headers, 30);
    with_link(
        answer(200, &json!({"total_count": total, "runners": runners})),
        link,
    )
}

fn get_runner(st: &GhState, scope: &str, id: u64) -> Response {
    match st.runners.get(&id).filter(|r| r.info.scope == scope) {
        Some(r) => answer(200, &runner_json(r, st.busy_lag)),
        None => message(404, "Not Found"),
    }
}

fn delete_runner(st: &mut GhState, scope: &str, id: u64) -> Response {
    let Some(r) = st.runners.get(&id).filter(|r| r.info.scope == scope) else {
        return message(404, "Not Found");
    };
    if r.info.busy {
        if st.delete_checks_busy {
            st.busy_refusals += 1;
            return message(
                422,
                &format!(
                    "Bad request - Runner \"{}\" is still running a job\"",
                    r.info.name
                ),
            );
        }
        st.deleted_while_busy += 1;
    }
    st.runners.remove(&id);
    StatusCode::NO_CONTENT.into_response()
}

/// A run's status and conclusion, from the jobs of its current attempt.
fn run_status(st: &GhState, run: &FakeRun) -> (&'static str, Option<&'static str>) {
    let jobs: Vec<&FakeJob> = run
        .jobs
        .iter()
        .filter_map(|id| st.jobs.get(id).map(|(_, j)| j))
        .collect();
    if jobs.is_empty() || jobs.iter().all(|j| j.status == "queued") {
        return ("queued", None);
    }
    // Held for an approval, nothing running yet.
    if jobs.iter().any(|j| j.status == "waiting")
        && jobs
            .iter()
            .all(|j| matches!(j.status.as_str(), "queued" | "waiting"))
    {
        return ("waiting", None);
    }
    if jobs.iter().all(|j| j.status == "completed") {
        let concluded = |c: &str| jobs.iter().any(|j| j.conclusion.as_deref() == Some(c));
        let conclusion = if concluded("failure") || concluded("timed_out") {
            "failure"
        } else if concluded("cancelled") {
            "cancelled"
        } else {
            "success"
        };
        return ("completed", Some(conclusion));
    }
    ("in_progress", None)
}

fn run_json(st: &GhState, run: &FakeRun) -> Value {
    let (status, conclusion) = run_status(st, run);
    json!({
        "id": run.id,
        "name": run.name,
        "status": status,
        "conclusion": conclusion,
        "run_attempt": run.run_attempt,
        "head_sha": run.head_sha,
        "head_branch": run.head_branch,
        "event": "push",
        "created_at": rfc3339(SystemTime::now()),
        "updated_at": rfc3339(SystemTime::now()),
        "html_url": format!("https://github.com/{}/actions/runs/{}", run.repo, run.id),
    })
}

fn job_json(repo: &str, job: &FakeJob) -> Value {
    json!({
        "id": job.id,
        "run_id": job.run_id,
        "run_attempt": job.run_attempt,
        "status": job.status,
        "conclusion": job.conclusion,
        "name": job.name,
        "labels": job.labels,
        "runner_name": job.runner_name,
        "workflow_name": job.workflow_name,
        "head_branch": job.head_branch,
        "head_sha": job.head_sha,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "completed_at": job.completed_at,
        "html_url": format!("https://github.com/{repo}/actions/runs/{}/job/{}", job.run_id, job.id),
        "steps": [],
    })
}

fn actions(st: &mut GhState, repo: &str, rest: &[&str], req: &Req<'_>) -> Response {
    let m = req.method;
    match rest {
        ["runs"] if m == Method::GET => {
            let status = param(&req.query, "status");
            let runs: Vec<Value> = st
                .runs
                .values()
                .filter(|r| r.repo == repo)
                .filter(|r| status.is_none_or(|s| run_status(st, r).0 == s))
                .map(|r| run_json(st, r))
                .rev()
                .collect();
            let total = runs.len();
            let (page, link) = page_of(runs, req, st.link_headers, 30);
            with_link(
                answer(200, &json!({"total_count": total, "workflow_runs": page})),
                link,
            )
        }
        ["runs", id] if m == Method::GET => match run_in(st, repo, id) {
            Some(run) => answer(200, &run_json(st, run)),
            None => message(404, "Not Found"),
        },
        ["runs", id, "jobs"] if m == Method::GET => {
            let Some(run) = run_in(st, repo, id) else {
                return message(404, "Not Found");
            };
            let all = param(&req.query, "filter") == Some("all");
            let jobs: Vec<Value> = st
                .jobs
                .values()
                .filter(|(_, j)| j.run_id == run.id && (all || run.jobs.contains(&j.id)))
                .map(|(r, j)| job_json(r, j))
                .collect();
            let total = jobs.len();
            let (page, link) = page_of(jobs, req, st.link_headers, 30);
            with_link(
                answer(200, &json!({"total_count": total, "jobs": page})),
                link,
            )
        }
        ["jobs", id] if m == Method::GET => {
            match id
                .parse::<u64>()
                .ok()
                .and_then(|id| st.jobs.get(&id))
                .filter(|(r, _)| r == repo)
            {
                Some((r, j)) => answer(200, &job_json(r, j)),
                None => message(404, "Not Found"),
            }
        }
        ["runs", id, "rerun-failed-jobs"] if m == Method::POST => {
            let Some(run) = run_in(st, repo, id).cloned() else {
                return message(404, "Not Found");
            };
            if run_status(st, &run).0 != "completed" {
                return message(403, "This workflow run is not completed yet.");
            }
            let failed = |j: &FakeJob| {
                matches!(
                    j.conclusion.as_deref(),
                    Some("failure" | "cancelled" | "timed_out")
                )
            };
            new_attempt(st, &run, failed);
            st.reruns.push(FakeRerun::FailedJobs {
                repo: repo.to_owned(),
                run_id: run.id,
            });
            answer(201, &json!({}))
        }
        ["jobs", id, "rerun"] if m == Method::POST => {
            let Some(job_id) = id
                .parse::<u64>()
                .ok()
                .filter(|id| st.jobs.get(id).is_some_and(|(r, _)| r == repo))
            else {
                return message(404, "Not Found");
            };
            let run_id = st.jobs.get(&job_id).map_or(0, |(_, j)| j.run_id);
            let Some(run) = st.runs.get(&run_id).cloned() else {
                return message(404, "Not Found");
            };
            if run_status(st, &run).0 != "completed" {
                return message(403, "This workflow run is not completed yet.");
            }
            new_attempt(st, &run, |j| j.id == job_id);
            st.reruns.push(FakeRerun::Job {
                repo: repo.to_owned(),
                job_id,
            });
            answer(201, &json!({}))
        }
        _ => message(404, "Not Found"),
    }
}

fn run_in<'a>(st: &'a GhState, repo: &str, id: &str) -> Option<&'a FakeRun> {
    id.parse::<u64>()
        .ok()
        .and_then(|id| st.runs.get(&id))
        .filter(|r| r.repo == repo)
}

/// Starts a new attempt of `run`: jobs matching `rerun` are copied with new
/// ids as queued, the others carried over.
fn new_attempt(st: &mut GhState, run: &FakeRun, rerun: impl Fn(&FakeJob) -> bool) {
    let attempt = run.run_attempt + 1;
    let mut latest = Vec::new();
    for id in &run.jobs {
        let Some((repo, job)) = st.jobs.get(id).cloned() else {
            continue;
        };
        if rerun(&job) {
            let new_id = st.next_job_id;
            st.next_job_id += 1;
            let copy = FakeJob {
                id: new_id,
                run_attempt: attempt,
                status: "queued".into(),
                conclusion: None,
                runner_name: None,
                created_at: rfc3339(SystemTime::now()),
                started_at: None,
                completed_at: None,
                ..job
            };
            st.jobs.insert(new_id, (repo, copy));
            latest.push(new_id);
        } else {
            latest.push(*id);
        }
    }
    if let Some(r) = st.runs.get_mut(&run.id) {
        r.run_attempt = attempt;
        r.jobs = latest;
    }
}

fn hook_route(st: &mut GhState, req: &Req<'_>) -> Response {
    let segs = req.segs.as_slice();
    let (hook, rest) = match segs {
        ["repos", o, r, "hooks", id, rest @ ..] => (
            id.parse().ok().map(|hook_id| FakeHook::Repo {
                owner: (*o).to_owned(),
                repo: (*r).to_owned(),
                hook_id,
            }),
            rest,
        ),
        ["orgs", o, "hooks", id, rest @ ..] => (
            id.parse().ok().map(|hook_id| FakeHook::Org {
                org: (*o).to_owned(),
                hook_id,
            }),
            rest,
        ),
        _ => (None, &[][..]),
    };
    let Some(hook) = hook else {
        return message(404, "Not Found");
    };
    match rest {
        ["deliveries"] if req.method == Method::GET => list_deliveries(st, &hook, req),
        ["deliveries", id, "attempts"] if req.method == Method::POST => redeliver(st, hook, id),
        _ => message(404, "Not Found"),
    }
}

fn list_deliveries(st: &GhState, hook: &FakeHook, req: &Req<'_>) -> Response {
    let (_, per_page) = paging(&req.query, 30);
    let cursor = param(&req.query, "cursor").map(str::to_owned);
    let (page, next) = delivery_page(st, hook, per_page, cursor.as_deref());
    let items: Vec<Value> = page
        .into_iter()
        .map(|(_, d)| {
            json!({
                "id": d.id,
                "guid": d.guid,
                "delivered_at": d.delivered_at,
                "redelivery": d.redelivery,
                "duration": 0.27,
                "status": if (200..300).contains(&d.status_code) { "OK".to_owned() } else { format!("Invalid HTTP Response: {}", d.status_code) },
                "status_code": d.status_code,
                "event": d.event,
                "action": d.action,
                "installation_id": null,
                "repository_id": null,
            })
        })
        .collect();
    let link = next.and_then(|cursor| {
        let path = format!("/{}", req.segs.join("/"));
        let value = format!(
            "<http://{}{path}?per_page={per_page}&cursor={cursor}>; rel=\"next\"",
            req.host
        );
        HeaderValue::from_str(&value).ok()
    });
    with_link(answer(200, &Value::Array(items)), link)
}

fn redeliver(st: &mut GhState, hook: FakeHook, id: &str) -> Response {
    let Some(original) = id.parse::<u64>().ok().and_then(|id| {
        st.deliveries
            .iter()
            .find(|(h, d)| *h == hook && d.id == id)
            .map(|(_, d)| d.clone())
    }) else {
        return message(404, "Not Found");
    };
    st.redeliveries.push((hook.clone(), original.id));
    let new_id = st.next_delivery_id;
    st.next_delivery_id += 1;
    st.deliveries.push((
        hook,
        FakeDelivery {
            id: new_id,
            status_code: 202,
            redelivery: true,
            delivered_at: rfc3339(SystemTime::now()),
            ..original
        },
    ));
    answer(202, &json!({}))
}

// ---------------------------------------------------------------------------
// Per-resource rate limits, runner groups, delivery cursors and enterprise
// credentials, as REFERENCE.md describes GitHub.

/// The budget GitHub charges a request to (`x-ratelimit-resource`):
/// registering a runner (JIT config, registration and remove tokens)
/// spends `actions_runner_registration`, every other REST call `core`.
fn resource_of(segs: &[&str], method: &Method) -> &'static str {
    match segs {
        [
            ..,
            "actions",
            "runners",
            "generate-jitconfig" | "registration-token" | "remove-token",
        ] if method == Method::POST => "actions_runner_registration",
        _ => "core",
    }
}

/// The default budget of a resource other than `core`.
fn new_resource_budget(resource: &str) -> Budget {
    let limit = if resource == "actions_runner_registration" {
        10_000
    } else {
        5000
    };
    Budget::new(limit, Duration::from_secs(3600))
}

fn budget_of<'a>(st: &'a mut GhState, resource: &str) -> &'a mut Budget {
    if resource == "core" {
        return &mut st.budget;
    }
    st.resource_budgets
        .entry(resource.to_owned())
        .or_insert_with(|| new_resource_budget(resource))
}

fn budget_json(b: &Budget) -> Value {
    json!({
        "limit": b.limit(),
        "remaining": b.remaining(),
        "used": b.limit() - b.remaining(),
        "reset": b.reset(),
    })
}

/// `GET /rate_limit`: every resource's budget; not charged itself.
fn rate_limit_answer(st: &mut GhState) -> Response {
    budget_of(st, "actions_runner_registration");
    st.budget.spend_nothing();
    let mut resources = serde_json::Map::new();
    resources.insert("core".into(), budget_json(&st.budget));
    for (name, b) in &mut st.resource_budgets {
        b.spend_nothing();
        resources.insert(name.clone(), budget_json(b));
    }
    answer(
        200,
        &json!({"resources": resources, "rate": budget_json(&st.budget)}),
    )
}

impl Budget {
    /// Rolls the window over if its reset has passed, spending nothing.
    fn spend_nothing(&mut self) {
        self.roll();
    }
}

/// Enterprise endpoints take no installation token (only a classic PAT),
/// and there is no `GET /enterprises/{e}/installation`.
fn enterprise_refusal(st: &GhState, req: &Req<'_>) -> Option<Response> {
    match req.segs.as_slice() {
        ["enterprises", _, "installation"] => Some(message(404, "Not Found")),
        ["enterprises", ..] if req.bearer.is_some_and(|t| st.tokens.contains_key(t)) => {
            Some(message(403, "Resource not accessible by integration"))
        }
        _ => None,
    }
}

/// A runner group of an organization or enterprise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeRunnerGroup {
    /// Id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// `all`, `selected` or `private`.
    pub visibility: String,
    /// With `selected`: the repositories (`owner/name`) it admits.
    pub repositories: Vec<String>,
}

impl FakeRunnerGroup {
    /// The group every organization and enterprise has: id 1, `Default`,
    /// open to all repositories.
    pub fn default_group() -> Self {
        Self {
            id: 1,
            name: "Default".into(),
            visibility: "all".into(),
            repositories: Vec::new(),
        }
    }

    /// A group open to the listed repositories only.
    pub fn selected(id: u64, name: &str, repositories: &[&str]) -> Self {
        Self {
            id,
            name: name.into(),
            visibility: "selected".into(),
            repositories: repositories.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    fn admits(&self, repo: &str) -> bool {
        self.visibility == "all" || self.repositories.iter().any(|r| r == repo)
    }
}

fn groups_of(st: &GhState, scope: &str) -> Vec<FakeRunnerGroup> {
    st.runner_groups
        .get(scope)
        .cloned()
        .unwrap_or_else(|| vec![FakeRunnerGroup::default_group()])
}

fn runner_groups_route(st: &GhState, req: &Req<'_>) -> Response {
    let segs = req.segs.as_slice();
    let (scope, rest) = match segs {
        [
            "orgs" | "enterprises",
            _,
            "actions",
            "runner-groups",
            rest @ ..,
        ] => (format!("/{}/{}", segs[0], segs[1]), rest),
        _ => return message(404, "Not Found"),
    };
    let groups = groups_of(st, &scope);
    match rest {
        [] => {
            let all: Vec<Value> = groups
                .iter()
                .map(|g| {
                    json!({
                        "id": g.id,
                        "name": g.name,
                        "visibility": g.visibility,
                        "default": g.id == 1,
                        "inherited": false,
                        "allows_public_repositories": false,
                        "restricted_to_workflows": false,
                    })
                })
                .collect();
            let total = all.len();
            let (page, link) = page_of(all, req, st.link_headers, 30);
            with_link(
                answer(200, &json!({"total_count": total, "runner_groups": page})),
                link,
            )
        }
        [id, "repositories"] if segs[0] == "orgs" => {
            let Some(group) = id
                .parse::<u64>()
                .ok()
                .and_then(|id| groups.iter().find(|g| g.id == id))
            else {
                return message(404, "Not Found");
            };
            let repos: Vec<Value> = group
                .repositories
                .iter()
                .map(|r| json!({"full_name": r, "name": r.split('/').nth(1)}))
                .collect();
            let total = repos.len();
            let (page, link) = page_of(repos, req, st.link_headers, 30);
            with_link(
                answer(200, &json!({"total_count": total, "repositories": page})),
                link,
            )
        }
        _ => message(404, "Not Found"),
    }
}

/// One page of a hook's deliveries, newest first, after `cursor` (opaque
/// to clients: here the id of the last delivery of the page before), and
/// the cursor of the next page when there is one.
fn delivery_page<'a>(
    st: &'a GhState,
    hook: &FakeHook,
    per_page: usize,
    cursor: Option<&str>,
) -> (Vec<&'a (FakeHook, FakeDelivery)>, Option<String>) {
    let after = cursor
        .and_then(|c| c.strip_prefix("v1_"))
        .and_then(|id| id.parse::<u64>().ok());
    let mut newest_first = st.deliveries.iter().rev().filter(|(h, _)| h == hook);
    if let Some(after) = after {
        for (_, d) in newest_first.by_ref() {
            if d.id == after {
                break;
            }
        }
    }
    let mut rest = newest_first.peekable();
    let page: Vec<_> = rest.by_ref().take(per_page).collect();
    let next = match (rest.peek(), page.last()) {
        (Some(_), Some((_, last))) => Some(format!("v1_{}", last.id)),
        _ => None,
    };
    (page, next)
}

impl FakeGitHub {
    // -- per-resource rate limits

    /// Spends `resource`'s budget (`core`, `actions_runner_registration`,
    /// ...) until `reset_in` from now: until then every request charged to
    /// it answers `403` with `x-ratelimit-remaining: 0`.
    pub fn exhaust_rate_limit(&self, resource: &str, reset_in: Duration) {
        let reset = epoch_now() + reset_in.as_secs().max(1);
        budget_of(&mut self.st(), resource).exhaust_until(reset);
    }

    /// Moves time to `resource`'s reset: the budget is full again and a
    /// new window starts.
    pub fn advance_to_reset(&self, resource: &str) {
        budget_of(&mut self.st(), resource).refill_now();
    }

    /// `resource`'s budget: limit, remaining and reset (Unix seconds).
    pub fn rate_limit(&self, resource: &str) -> (u64, u64, u64) {
        let mut st = self.st();
        let b = budget_of(&mut st, resource);
        (b.limit(), b.remaining(), b.reset())
    }

    /// `resource`'s budget: `limit` requests per `window`.
    pub fn set_resource_rate_limit(&self, resource: &str, limit: u64, window: Duration) {
        *budget_of(&mut self.st(), resource) = Budget::new(limit, window);
    }

    // -- runner groups

    /// Adds a runner group to an organization (`/orgs/o`) or enterprise
    /// (`/enterprises/e`) beside its default group.
    pub fn add_runner_group(&self, scope: &str, group: FakeRunnerGroup) {
        let mut st = self.st();
        let groups = st
            .runner_groups
            .entry(scope.to_owned())
            .or_insert_with(|| vec![FakeRunnerGroup::default_group()]);
        groups.retain(|g| g.id != group.id);
        groups.push(group);
    }

    /// Whether the runner may take a job of repository `repo`
    /// (`owner/name`): its group must admit the repository. A runner
    /// registered at repository level takes only that repository's jobs.
    pub fn may_take(&self, runner: impl Into<RunnerKey>, repo: &str) -> bool {
        let st = self.st();
        let Some(r) = find(&st, &runner.into()).and_then(|id| st.runners.get(&id)) else {
            return false;
        };
        if let Some(own) = r.info.scope.strip_prefix("/repos/") {
            return own == repo;
        }
        groups_of(&st, &r.info.scope)
            .iter()
            .find(|g| g.id == r.info.runner_group_id)
            .is_some_and(|g| g.admits(repo))
    }

    /// GitHub hands `job_id` to `runner`, if the runner's group lets it
    /// take jobs of the job's repository; `false` (and nothing changes)
    /// otherwise: such a runner never gets that job.
    pub fn assign_job(&self, job_id: u64, runner: &str) -> bool {
        let Some(repo) = self.st().jobs.get(&job_id).map(|(r, _)| r.clone()) else {
            return false;
        };
        if !self.may_take(runner, &repo) {
            return false;
        }
        self.set_job_runner(job_id, runner);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries() {
        let q = query_pairs("scope%5B%5D=pending&per_page=100&x=a+b&bad=%zz&end=%4");
        assert_eq!(param(&q, "scope[]"), Some("pending"));
        assert_eq!(param(&q, "x"), Some("a b"));
        assert_eq!(param(&q, "bad"), Some("%zz"));
        assert_eq!(param(&q, "end"), Some("%4"));
        assert_eq!(paging(&q, 20), (1, 100));
    }

    #[test]
    fn jit_configs_round_trip() {
        let encoded = base64::engine::general_purpose::STANDARD
            .encode(r#"{"runner_id":3,"name":"ry-x","scope":"/orgs/a"}"#);
        assert_eq!(
            decode_jit_config(&encoded),
            Some(JitInfo {
                runner_id: 3,
                name: "ry-x".into(),
                scope: "/orgs/a".into()
            })
        );
        assert_eq!(decode_jit_config("!!"), None);
    }

    // Each test below pins the fake to a fact of REFERENCE.md ("More GitHub
    // facts that bite", "GitHub REST endpoints runyard uses").

    async fn call(
        gh: &FakeGitHub,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        runyard_telemetry::install_crypto_provider();
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", gh.url()))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.expect("fake answers")
    }

    fn header(r: &reqwest::Response, name: &str) -> String {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }

    fn jit_body(name: &str, group: u64) -> Value {
        json!({"name": name, "runner_group_id": group, "labels": ["self-hosted"], "work_folder": "_work"})
    }

    #[tokio::test]
    async fn rate_limits_are_per_resource_and_return_only_at_their_reset() {
        let gh = FakeGitHub::start().await;
        let jit = "/orgs/acme/actions/runners/generate-jitconfig";
        gh.exhaust_rate_limit("actions_runner_registration", Duration::from_secs(3600));

        let refused = call(&gh, Method::POST, jit, "t", Some(jit_body("a", 1))).await;
        assert_eq!(refused.status(), 403);
        assert_eq!(header(&refused, "x-ratelimit-remaining"), "0");
        assert_eq!(
            header(&refused, "x-ratelimit-resource"),
            "actions_runner_registration"
        );
        let reset: u64 = header(&refused, "x-ratelimit-reset")
            .parse()
            .expect("reset");
        assert!(reset >= epoch_now() + 3590, "reset {reset} is an hour away");
        assert!(!header(&refused, "x-ratelimit-limit").is_empty());
        assert!(!header(&refused, "x-ratelimit-used").is_empty());

        // core is another budget: untouched.
        let listed = call(&gh, Method::GET, "/orgs/acme/actions/runners", "t", None).await;
        assert_eq!(listed.status(), 200);
        assert_eq!(header(&listed, "x-ratelimit-resource"), "core");
        assert_ne!(header(&listed, "x-ratelimit-remaining"), "0");

        // GET /rate_limit reports both and is not charged.
        let (_, core_before, _) = gh.rate_limit("core");
        let limits: Value = call(&gh, Method::GET, "/rate_limit", "t", None)
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(
            limits["resources"]["actions_runner_registration"]["remaining"],
            0
        );
        assert_eq!(
            limits["resources"]["actions_runner_registration"]["reset"],
            reset
        );
        assert_eq!(limits["resources"]["core"]["remaining"], core_before);
        assert_eq!(gh.rate_limit("core").1, core_before);

        // Still refused before the reset; served once it comes.
        let again = call(&gh, Method::POST, jit, "t", Some(jit_body("a", 1))).await;
        assert_eq!(again.status(), 403);
        gh.advance_to_reset("actions_runner_registration");
        let (limit, remaining, next_reset) = gh.rate_limit("actions_runner_registration");
        assert_eq!(remaining, limit);
        assert!(next_reset > epoch_now());
        let served = call(&gh, Method::POST, jit, "t", Some(jit_body("a", 1))).await;
        assert_eq!(served.status(), 201);

        // And the other way round: core spent, registration still served.
        gh.exhaust_rate_limit("core", Duration::from_secs(3600));
        let listed = call(&gh, Method::GET, "/orgs/acme/actions/runners", "t", None).await;
        assert_eq!(listed.status(), 403);
        assert_eq!(header(&listed, "x-ratelimit-resource"), "core");
        let served = call(&gh, Method::POST, jit, "t", Some(jit_body("b", 1))).await;
        assert_eq!(served.status(), 201);
    }

    #[tokio::test]
    async fn secondary_limits_answer_with_retry_after() {
        let gh = FakeGitHub::start().await;
        gh.fail_next(1, 429, 7);
        gh.fail_next(1, 403, 3);
        let first = call(&gh, Method::GET, "/orgs/acme/actions/runners", "t", None).await;
        assert_eq!(first.status(), 429);
        assert_eq!(header(&first, "retry-after"), "7");
        let second = call(&gh, Method::GET, "/orgs/acme/actions/runners", "t", None).await;
        assert_eq!(second.status(), 403);
        assert_eq!(header(&second, "retry-after"), "3");
        let third = call(&gh, Method::GET, "/orgs/acme/actions/runners", "t", None).await;
        assert_eq!(third.status(), 200);
    }

    #[tokio::test]
    async fn runner_groups_restrict_which_repositories_jobs_a_runner_takes() {
        let gh = FakeGitHub::start().await;
        gh.add_runner_group(
            "/orgs/acme",
            FakeRunnerGroup::selected(7, "secure", &["acme/vault"]),
        );
        let groups: Value = call(
            &gh,
            Method::GET,
            "/orgs/acme/actions/runner-groups",
            "t",
            None,
        )
        .await
        .json()
        .await
        .expect("json");
        assert_eq!(groups["total_count"], 2);
        assert_eq!(groups["runner_groups"][0]["id"], 1);
        assert_eq!(groups["runner_groups"][0]["visibility"], "all");
        assert_eq!(groups["runner_groups"][1]["id"], 7);
        assert_eq!(groups["runner_groups"][1]["name"], "secure");
        assert_eq!(groups["runner_groups"][1]["visibility"], "selected");
        let repos: Value = call(
            &gh,
            Method::GET,
            "/orgs/acme/actions/runner-groups/7/repositories",
            "t",
            None,
        )
        .await
        .json()
        .await
        .expect("json");
        assert_eq!(repos["total_count"], 1);
        assert_eq!(repos["repositories"][0]["full_name"], "acme/vault");
        let missing = call(
            &gh,
            Method::GET,
            "/orgs/acme/actions/runner-groups/99/repositories",
            "t",
            None,
        )
        .await;
        assert_eq!(missing.status(), 404);

        let jit = "/orgs/acme/actions/runners/generate-jitconfig";
        for (name, group) in [("in-secure", 7), ("in-default", 1)] {
            let r = call(&gh, Method::POST, jit, "t", Some(jit_body(name, group))).await;
            assert_eq!(r.status(), 201);
        }
        let app_job = gh.add_job("acme", "app", FakeJob::queued(1, "build", &["self-hosted"]));
        let vault_job = gh.add_job(
            "acme",
            "vault",
            FakeJob::queued(2, "build", &["self-hosted"]),
        );
        assert!(
            !gh.assign_job(app_job, "in-secure"),
            "acme/app may not use group 7"
        );
        assert_eq!(gh.job(app_job).and_then(|j| j.runner_name), None);
        assert!(gh.assign_job(vault_job, "in-secure"));
        assert!(gh.assign_job(app_job, "in-default"));
        assert_eq!(
            gh.job(app_job).and_then(|j| j.runner_name).as_deref(),
            Some("in-default")
        );
    }

    #[tokio::test]
    async fn deliveries_page_newest_first_with_a_cursor() {
        let gh = FakeGitHub::start().await;
        let hook = FakeHook::Org {
            org: "acme".into(),
            hook_id: 9,
        };
        let ids: Vec<u64> = (0..250)
            .map(|i| {
                gh.add_delivery(
                    hook.clone(),
                    FakeDelivery::workflow_job(&format!("g{i}"), "queued", 502),
                )
            })
            .collect();
        let mut path = "/orgs/acme/hooks/9/deliveries?per_page=100".to_owned();
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let r = call(&gh, Method::GET, &path, "t", None).await;
            assert_eq!(r.status(), 200);
            let link = header(&r, "link");
            let page: Vec<Value> = r.json().await.expect("json");
            pages += 1;
            seen.extend(page.iter().map(|d| d["id"].as_u64().expect("id")));
            if link.is_empty() {
                break;
            }
            assert!(link.ends_with("; rel=\"next\""), "{link}");
            let next = link
                .trim_start_matches('<')
                .split('>')
                .next()
                .expect("url")
                .to_owned();
            assert!(next.contains("cursor="), "{next}");
            assert!(next.contains("per_page=100"), "{next}");
            path = next.trim_start_matches(&gh.url()).to_owned();
        }
        assert_eq!(pages, 3);
        let newest_first: Vec<u64> = ids.iter().rev().copied().collect();
        assert_eq!(seen, newest_first);
    }

    fn app_jwt(app_id: u64) -> String {
        let now = epoch_now();
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(AppKey::shared().private_pem.as_bytes())
            .expect("key");
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &json!({"iat": now - 30, "exp": now + 300, "iss": app_id}),
            &key,
        )
        .expect("jwt")
    }

    #[tokio::test]
    async fn enterprise_endpoints_refuse_installation_tokens_and_take_a_pat() {
        let gh = FakeGitHub::start().await;
        gh.enable_app(12, &AppKey::shared().public_pem);
        gh.add_installation("orgs/acme", 34);
        gh.add_installation("enterprises/big", 35);
        gh.require_token("ghp_classic");
        let jwt = app_jwt(12);
        let none = call(
            &gh,
            Method::GET,
            "/enterprises/big/installation",
            &jwt,
            None,
        )
        .await;
        assert_eq!(
            none.status(),
            404,
            "there is no enterprise installation look-up"
        );
        let token: Value = call(
            &gh,
            Method::POST,
            "/app/installations/35/access_tokens",
            &jwt,
            None,
        )
        .await
        .json()
        .await
        .expect("json");
        let token = token["token"].as_str().expect("token").to_owned();
        let jit = "/enterprises/big/actions/runners/generate-jitconfig";
        let refused = call(&gh, Method::POST, jit, &token, Some(jit_body("e", 1))).await;
        assert_eq!(refused.status(), 403);
        let msg: Value = refused.json().await.expect("json");
        assert_eq!(msg["message"], "Resource not accessible by integration");
        let listed = call(
            &gh,
            Method::GET,
            "/enterprises/big/actions/runners",
            &token,
            None,
        )
        .await;
        assert_eq!(listed.status(), 403);
        let served = call(
            &gh,
            Method::POST,
            jit,
            "ghp_classic",
            Some(jit_body("e", 1)),
        )
        .await;
        assert_eq!(served.status(), 201);
        // The PAT and installation tokens both still work for an org.
        let org_token: Value = call(
            &gh,
            Method::POST,
            "/app/installations/34/access_tokens",
            &jwt,
            None,
        )
        .await
        .json()
        .await
        .expect("json");
        let org_token = org_token["token"].as_str().expect("token").to_owned();
        for t in [org_token.as_str(), "ghp_classic"] {
            let r = call(&gh, Method::GET, "/orgs/acme/actions/runners", t, None).await;
            assert_eq!(r.status(), 200);
        }
    }
}
