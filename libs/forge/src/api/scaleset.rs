//! Client of GitHub's Actions service for runner scale sets: registration
//! (SCALESET.md §1), the service's request conventions (§2), its endpoints
//! E1–E19 (§3) and the message formats (§4).
//!
//! A scale set is a runner group entry on the Actions service that jobs are
//! routed to by label; its listener holds one message session and long-polls
//! a message queue for job events, and asks for one just-in-time runner
//! configuration per runner it starts.
//!
//! Authentication takes three tokens:
//!
//! 1. the scope's GitHub credential (a personal token or an App installation
//!    token, through [`GitHubClient`]) asks for a runner registration token
//!    (§1 step B);
//! 2. the registration token is traded at `{api}/actions/runner-registration`
//!    for the Actions service's URL and an admin token, a JWT (step C). The
//!    admin token is used for every admin endpoint and fetched again (steps
//!    B and C) before a request whenever its `exp` is unknown or less than
//!    60 s away; concurrent callers wait for one refresh;
//! 3. a message session ([`Session`], E9) carries its own
//!    `messageQueueAccessToken` for the queue (E12, E13) and for acquiring
//!    jobs (E14). A `401` there is [`is_token_expired`]: refresh the session
//!    (E10) and try again.
//!
//! Every request is retried on network errors, `429` and `5xx` other than
//! `501` (at most 4 times, `base·2^n` apart with up to 20 % jitter, capped
//! at 30 s, `Retry-After` honoured on `429`/`503`). The long poll (E12) has
//! its own request timeout, at least 70 s, so a short
//! [`ClientOptions::timeout`] does not cut it.
//!
//! The Actions service's errors are `{typeName, message}`; the type name is
//! kept first in [`ApiError::Status`]'s message, where [`exception`] reads
//! it. Tokens and JIT configurations are [`SecretString`]s and reach no error
//! text, log line or `Debug` output.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::github::{GitHubClient, GitHubScope};
use super::{
    ApiError, CallCounts, ClientOptions, Counters, MAX_BODY, Raw, decode, null_default, parse_base,
    seg,
};

/// The `api-version` every Actions-service request carries (§2).
pub const API_VERSION: &str = "6.0-preview";

/// The only top-level message type that carries job messages (§4).
pub const JOB_MESSAGES: &str = "RunnerScaleSetJobMessages";

/// Scale sets, relative to the service URL (§3 `{rss}`).
const SCALE_SETS: &str = "_apis/runtime/runnerscalesets";
/// Runners ("agents") of the scale sets' pool (§3 `{agents}`).
const AGENTS: &str = "_apis/distributedtask/pools/0/agents";
/// Runner groups; the trailing `/` before the query is what the service
/// expects (§3 E1).
const RUNNER_GROUPS: &str = "_apis/runtime/runnergroups/";

/// Transport retries per call (§2).
const MAX_RETRIES: u32 = 4;
/// Default first retry delay (§2).
const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest delay between two tries (§2).
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The admin token is replaced this long before its `exp` (§1).
const ADMIN_TOKEN_MARGIN: Duration = Duration::from_secs(60);
/// The shortest request timeout of the long poll: the service holds a poll
/// up to about 50 s (§3 E12).
pub const MIN_POLL_TIMEOUT: Duration = Duration::from_secs(70);
/// What a service that sends no `sessionId` sends instead (§3 E9).
const NIL_UUID: &str = "00000000-0000-0000-0000-000000000000";

/// Endpoint kinds, as counted in [`CallCounts`] and named in
/// [`ApiError::Status`]. Step B is counted by the [`GitHubClient`]
/// (`registration_token`).
pub mod endpoint {
    /// `POST {api}/actions/runner-registration` (§1 step C).
    pub const RUNNER_REGISTRATION: &str = "runner_registration";
    /// E1 `GET _apis/runtime/runnergroups/?groupName=`.
    pub const GET_RUNNER_GROUP: &str = "get_runner_group";
    /// E2 `GET {rss}?runnerGroupId=&name=`.
    pub const GET_SCALE_SET_BY_NAME: &str = "get_scale_set_by_name";
    /// E3 `GET {rss}/{id}`.
    pub const GET_SCALE_SET: &str = "get_scale_set";
    /// E4 `GET {rss}`.
    pub const LIST_SCALE_SETS: &str = "list_scale_sets";
    /// E5 `POST {rss}`.
    pub const CREATE_SCALE_SET: &str = "create_scale_set";
    /// E6 `PATCH {rss}/{id}`.
    pub const UPDATE_SCALE_SET: &str = "update_scale_set";
    /// E7 `DELETE {rss}/{id}`.
    pub const DELETE_SCALE_SET: &str = "delete_scale_set";
    /// E8 `POST {rss}/{id}/generatejitconfig`.
    pub const SCALE_SET_JIT_CONFIG: &str = "scale_set_jit_config";
    /// E9 `POST {rss}/{id}/sessions`.
    pub const CREATE_SESSION: &str = "create_session";
    /// E10 `PATCH {rss}/{id}/sessions/{sessionId}`.
    pub const REFRESH_SESSION: &str = "refresh_session";
    /// E11 `DELETE {rss}/{id}/sessions/{sessionId}`.
    pub const DELETE_SESSION: &str = "delete_session";
    /// E12 `GET {messageQueueUrl}`.
    pub const GET_MESSAGE: &str = "get_message";
    /// E13 `DELETE {messageQueueUrl}/{messageId}`.
    pub const DELETE_MESSAGE: &str = "delete_message";
    /// E14 `POST {rss}/{id}/acquirejobs`.
    pub const ACQUIRE_JOBS: &str = "acquire_jobs";
    /// E15 `GET {rss}/{id}/acquirablejobs`.
    pub const ACQUIRABLE_JOBS: &str = "acquirable_jobs";
    /// E16 `GET {agents}/{id}`.
    pub const GET_AGENT: &str = "get_agent";
    /// E17 `GET {agents}?agentName=`.
    pub const GET_AGENT_BY_NAME: &str = "get_agent_by_name";
    /// E18 `GET {agents}`.
    pub const LIST_AGENTS: &str = "list_agents";
    /// E19 `DELETE {agents}/{id}`.
    pub const REMOVE_AGENT: &str = "remove_agent";

    /// Every kind.
    pub const ALL: &[&str] = &[
        RUNNER_REGISTRATION,
        GET_RUNNER_GROUP,
        GET_SCALE_SET_BY_NAME,
        GET_SCALE_SET,
        LIST_SCALE_SETS,
        CREATE_SCALE_SET,
        UPDATE_SCALE_SET,
        DELETE_SCALE_SET,
        SCALE_SET_JIT_CONFIG,
        CREATE_SESSION,
        REFRESH_SESSION,
        DELETE_SESSION,
        GET_MESSAGE,
        DELETE_MESSAGE,
        ACQUIRE_JOBS,
        ACQUIRABLE_JOBS,
        GET_AGENT,
        GET_AGENT_BY_NAME,
        LIST_AGENTS,
        REMOVE_AGENT,
    ];

    /// The kinds that authenticate with the session's
    /// `messageQueueAccessToken` (§3: E12, E13, E14).
    pub const SESSION_AUTHENTICATED: &[&str] = &[GET_MESSAGE, DELETE_MESSAGE, ACQUIRE_JOBS];
}

// ---------------------------------------------------------------------------
// Data.

/// A runner group as the Actions service lists it (E1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSetRunnerGroup {
    /// Group id (what a scale set's `runner_group_id` names; the default
    /// group is 1).
    pub id: i64,
    /// Name.
    pub name: String,
    /// Whether it is the scope's default group.
    pub is_default: bool,
}

/// A runner scale set (§3 RunnerScaleSet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerScaleSet {
    /// Scale-set id.
    pub id: i64,
    /// Name (unique within its runner group).
    pub name: String,
    /// The runner group it belongs to.
    pub runner_group_id: i64,
    /// That group's name.
    pub runner_group_name: String,
    /// Label names, the scale set's name normally first.
    pub labels: Vec<String>,
    /// The job and runner counts, when the service sent them.
    pub statistics: Option<Statistics>,
}

/// A scale set to create (E5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewScaleSet {
    /// Name; also the first label.
    pub name: String,
    /// The runner group (1: the default group).
    pub runner_group_id: i64,
    /// Labels jobs may ask for. The name is sent first whether or not it is
    /// listed here; duplicates (ignoring case) and empty ones are dropped.
    /// Labels are fixed at creation: the service ignores them on update.
    pub labels: Vec<String>,
    /// Whether runners must not update themselves.
    pub disable_update: bool,
}

/// A partial update of a scale set (E6): only the fields set are sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScaleSetPatch {
    /// A new name.
    pub name: Option<String>,
    /// Another runner group.
    pub runner_group_id: Option<i64>,
}

/// A just-in-time runner configuration (E8).
#[derive(Debug, Clone)]
pub struct ScaleSetJit {
    /// The runner registered for it (its id is what [`ActionsClient::remove_runner`] takes).
    pub runner: RunnerReference,
    /// What the runner is started with (`ACTIONS_RUNNER_INPUT_JITCONFIG`);
    /// a credential.
    pub encoded_jit_config: SecretString,
}

/// A runner of the scale sets' pool (E8, E16–E18).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerReference {
    /// Runner id.
    pub id: i64,
    /// Runner name.
    pub name: String,
    /// The scale set it belongs to (0 when the service did not say).
    pub runner_scale_set_id: i64,
    /// `online` or `offline`, when sent.
    pub status: Option<String>,
    /// Whether it runs a job, when sent.
    pub busy: Option<bool>,
}

/// A message session of a scale set (E9, E10). Its `Debug` output hides the
/// token.
#[derive(Debug, Clone)]
pub struct Session {
    /// Session id.
    pub session_id: String,
    /// The owner name the session was created with.
    pub owner_name: String,
    /// Where messages are polled (E12) and acknowledged (E13).
    pub message_queue_url: String,
    /// The token of the queue and of acquiring jobs; a credential.
    pub message_queue_access_token: SecretString,
    /// The job and runner counts when the session was created or refreshed.
    pub statistics: Statistics,
    /// The scale set, when the service sent it.
    pub scale_set: Option<RunnerScaleSet>,
}

/// A scale set's job and runner counts (§4). Serialized in snake case;
/// read from the service's camel case.
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all(deserialize = "camelCase"), default)]
pub struct Statistics {
    /// Jobs whose labels match, not yet acquired or assigned.
    pub total_available_jobs: i64,
    /// Jobs acquired by the scale set.
    pub total_acquired_jobs: i64,
    /// Jobs assigned to the scale set, waiting or running (≥ running): what
    /// to scale on.
    pub total_assigned_jobs: i64,
    /// Jobs running.
    pub total_running_jobs: i64,
    /// Runners registered.
    pub total_registered_runners: i64,
    /// Runners running a job.
    pub total_busy_runners: i64,
    /// Runners idle.
    pub total_idle_runners: i64,
}

/// One message of the queue (E12 200).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSetMessage {
    /// Message id: pass it as `last_message_id` of the next poll, and ack it
    /// ([`ActionsClient::delete_message`]).
    pub message_id: i64,
    /// The top-level type; only [`JOB_MESSAGES`] carries jobs (the jobs of
    /// any other type are not read, but the message must still be acked).
    pub message_type: String,
    /// The job messages (at most 50), oldest first.
    pub jobs: Vec<JobMessage>,
    /// The current counts.
    pub statistics: Statistics,
}

/// What a job message reports (§4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobMessageKind {
    /// `JobAvailable`: acquire it (E14) with its `runner_request_id`.
    Available,
    /// `JobAssigned`: the job waits for a runner of the scale set.
    Assigned,
    /// `JobStarted`: a runner (`runner_id`, `runner_name`) took it.
    Started,
    /// `JobCompleted`: finished (`result`); an empty `runner_name` means no
    /// runner ever took it.
    Completed,
    /// Another `messageType`, kept as sent.
    Other(String),
}

/// One job message (§4 job message fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobMessage {
    /// What happened.
    pub kind: JobMessageKind,
    /// The id acquiring takes (may be 0 on newer services: do not key on it
    /// alone).
    pub runner_request_id: i64,
    /// The job's id.
    pub job_id: String,
    /// Repository name (without owner).
    pub repository_name: String,
    /// Repository owner.
    pub owner_name: String,
    /// `owner/repo/.github/workflows/x.yml@ref`.
    pub job_workflow_ref: String,
    /// Display name.
    pub job_display_name: String,
    /// Workflow run id.
    pub workflow_run_id: i64,
    /// Triggering event.
    pub event_name: String,
    /// The job's `runs-on` labels.
    pub request_labels: Vec<String>,
    /// Queued; `None` when zero or absent.
    pub queue_time: Option<OffsetDateTime>,
    /// Assigned to the scale set; `None` when zero or absent.
    pub scale_set_assign_time: Option<OffsetDateTime>,
    /// Assigned to a runner; `None` when zero or absent.
    pub runner_assign_time: Option<OffsetDateTime>,
    /// Finished; `None` when zero or absent.
    pub finish_time: Option<OffsetDateTime>,
    /// The runner (JobStarted, JobCompleted).
    pub runner_id: Option<i64>,
    /// The runner's name as given to E8 (JobStarted, JobCompleted).
    pub runner_name: String,
    /// JobCompleted's result (`succeeded`, `failed`, `canceled`, ...).
    pub result: String,
}

/// A job waiting to be acquired, as E15 lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquirableJob {
    /// The id acquiring takes.
    pub runner_request_id: i64,
    /// The message type (`JobAvailable`).
    pub message_type: String,
    /// Repository name.
    pub repository_name: String,
    /// Repository owner.
    pub owner_name: String,
    /// Workflow reference.
    pub job_workflow_ref: String,
    /// Triggering event.
    pub event_name: String,
    /// `runs-on` labels.
    pub request_labels: Vec<String>,
}

/// Outcome of removing a runner (E19).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoveRunner {
    /// Removed (`204`).
    Removed,
    /// There was no such runner (`404`, `AgentNotFoundException`).
    NotFound,
    /// The runner runs a job (`JobStillRunningException`): try later.
    Busy,
}

/// The kinds of refusal the Actions service names in its `typeName` (§2,
/// §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exception {
    /// `AgentExistsException`: a runner of that name exists (E8).
    RunnerExists,
    /// `AgentNotFoundException`.
    RunnerNotFound,
    /// `JobStillRunningException`: the runner is busy (E19).
    JobStillRunning,
    /// `RunnerScaleSetSessionConflictException` (E9 `409`): another session
    /// is live.
    SessionConflict,
    /// `RunnerScaleSetSessionExpiredException` (E11 `400`).
    SessionExpired,
    /// The session is unknown (E10 `404`): create a new one.
    SessionNotFound,
    /// `RunnerScaleSetNotFoundException` (E3/E9 `404`): the scale set was
    /// deleted on the service's side.
    ScaleSetNotFound,
    /// Any other refusal of the Actions service.
    Other,
}

/// What kind of Actions-service refusal an error is: by `typeName`
/// substring, the status as a fallback. `None` for errors that are not an
/// answer of an [`ActionsClient`] endpoint.
pub fn exception(e: &ApiError) -> Option<Exception> {
    let ApiError::Status {
        status,
        endpoint_kind,
        message,
    } = e
    else {
        return None;
    };
    if !endpoint::ALL.contains(endpoint_kind) {
        return None;
    }
    const BY_NAME: &[(&str, Exception)] = &[
        ("AgentExistsException", Exception::RunnerExists),
        ("AgentNotFoundException", Exception::RunnerNotFound),
        ("JobStillRunningException", Exception::JobStillRunning),
        ("SessionConflictException", Exception::SessionConflict),
        ("SessionExpiredException", Exception::SessionExpired),
        ("SessionNotFoundException", Exception::SessionNotFound),
        ("ScaleSetNotFoundException", Exception::ScaleSetNotFound),
    ];
    if let Some((_, ex)) = BY_NAME.iter().find(|(name, _)| message.contains(name)) {
        return Some(*ex);
    }
    // E10's 404 is a generic `RunnerAdminException` (§5).
    if message.contains("session ID that doesn't exist") {
        return Some(Exception::SessionNotFound);
    }
    Some(match (*endpoint_kind, *status) {
        (endpoint::CREATE_SESSION, 409) => Exception::SessionConflict,
        (endpoint::REFRESH_SESSION, 404) => Exception::SessionNotFound,
        (endpoint::CREATE_SESSION | endpoint::GET_SCALE_SET, 404) => Exception::ScaleSetNotFound,
        (endpoint::GET_AGENT | endpoint::REMOVE_AGENT, 404) => Exception::RunnerNotFound,
        _ => Exception::Other,
    })
}

/// Whether the error means the message-queue token expired (`401` on E12,
/// E13 or E14): refresh the session ([`ActionsClient::refresh_session`]) and
/// try once more (§5 token expiry).
pub fn is_token_expired(e: &ApiError) -> bool {
    matches!(e, ApiError::Status { status: 401, endpoint_kind, .. }
        if endpoint::SESSION_AUTHENTICATED.contains(endpoint_kind))
}

/// Whether trying again later may succeed: [`ApiError::is_transient`], and
/// the answers the service gives during outages (§5): a session without a
/// queue URL, id or statistics (E9, E10) and an empty or unreadable message
/// (E12), which come back as [`ApiError::Decode`].
pub fn is_retryable(e: &ApiError) -> bool {
    e.is_transient()
        || matches!(e, ApiError::Decode { endpoint_kind, .. }
            if [endpoint::CREATE_SESSION, endpoint::REFRESH_SESSION, endpoint::GET_MESSAGE]
                .contains(endpoint_kind))
}

// ---------------------------------------------------------------------------
// The client.

/// Client of the Actions service for one scope's scale sets. Cheap to
/// clone; clones share the admin connection and the call counters.
#[derive(Clone)]
pub struct ActionsClient {
    inner: Arc<Inner>,
    retry_base: Duration,
    poll_timeout: Duration,
}

struct Inner {
    github: GitHubClient,
    scope: GitHubScope,
    config_url: String,
    registration_url: Url,
    http: reqwest::Client,
    counters: Counters,
    /// The longest `Retry-After` slept through before giving up.
    max_retry_wait: Duration,
    /// Held across a refresh, so concurrent callers refresh once.
    admin: tokio::sync::Mutex<Option<AdminConnection>>,
}

/// The result of §1 step C.
struct AdminConnection {
    /// The Actions service URL, its path ending in `/`.
    base: Url,
    token: SecretString,
    /// The token's `exp`; unknown means "refresh before every request".
    expires_at: Option<OffsetDateTime>,
}

impl AdminConnection {
    fn fresh(&self, now: OffsetDateTime) -> bool {
        self.expires_at
            .is_some_and(|exp| exp - now > ADMIN_TOKEN_MARGIN)
    }
}

impl fmt::Debug for ActionsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ActionsClient")
            .field("config_url", &self.inner.config_url)
            .field("scope", &self.inner.scope)
            .field("registration_url", &self.inner.registration_url.as_str())
            .field("retry_base", &self.retry_base)
            .field("poll_timeout", &self.poll_timeout)
            .finish_non_exhaustive()
    }
}

/// How a request authenticates.
#[derive(Clone, Copy)]
enum Auth<'a> {
    /// `Authorization: Bearer <token>`.
    Bearer(&'a SecretString),
    /// `Authorization: RemoteAuth <registration token>` (§1 step C).
    RemoteAuth(&'a SecretString),
}

/// One request, as tried (and retried) by [`ActionsClient::send`].
struct Call<'a> {
    ep: &'static str,
    method: Method,
    url: Url,
    auth: Auth<'a>,
    body: Option<Vec<u8>>,
    headers: Vec<(&'static str, String)>,
    /// Overrides the client's timeout (the long poll).
    timeout: Option<Duration>,
    /// Also retry `401`/`403` (§1 step C).
    retry_auth: bool,
}

impl ActionsClient {
    /// A client for the scale sets of `scope`.
    ///
    /// `github` asks for the registration token with the scope's credential
    /// (a personal token or the App installation token of `scope`);
    /// `config_url` is what the registration names, e.g.
    /// `https://github.com/acme` (organization), `.../acme/app` (repository)
    /// or `.../enterprises/x`; `api_url` is the REST base the registration
    /// exchange goes to (`https://api.github.com`,
    /// `https://HOST/api/v3`). Every request but the long poll is bounded by
    /// `options.timeout`; the long poll by at least [`MIN_POLL_TIMEOUT`].
    pub fn new(
        github: GitHubClient,
        scope: GitHubScope,
        config_url: &str,
        api_url: &str,
        options: &ClientOptions,
    ) -> Result<Self, ApiError> {
        let config = Url::parse(config_url.trim())
            .map_err(|e| ApiError::Config(format!("config url is not a URL: {e}")))?;
        if !matches!(config.scheme(), "http" | "https") {
            return Err(ApiError::Config("config url must be http or https".into()));
        }
        if !config.username().is_empty() || config.password().is_some() {
            return Err(ApiError::Config(
                "config url must not carry credentials".into(),
            ));
        }
        let api = parse_base(api_url)?;
        let registration_url = Url::parse(&format!(
            "{}/actions/runner-registration",
            api.as_str().trim_end_matches('/')
        ))
        .map_err(|e| ApiError::Config(format!("bad api url: {e}")))?;
        // reqwest needs a process-wide rustls provider; binaries install
        // ring at start, this covers tests and tools that do not.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout)
            .user_agent(options.user_agent.clone())
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                // The Authorization header would travel with a redirect:
                // follow only within the origin first asked.
                let same_origin = attempt
                    .previous()
                    .first()
                    .is_some_and(|first| first.origin() == attempt.url().origin());
                if attempt.previous().len() < 5 && same_origin {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()
            .map_err(|e| {
                ApiError::Config(format!("building the HTTP client: {}", e.without_url()))
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                github,
                scope,
                config_url: config_url.trim().to_owned(),
                registration_url,
                http,
                counters: Counters::new(endpoint::ALL),
                max_retry_wait: options.max_rate_limit_wait,
                admin: tokio::sync::Mutex::new(None),
            }),
            retry_base: DEFAULT_RETRY_BASE,
            poll_timeout: options.timeout.max(MIN_POLL_TIMEOUT),
        })
    }

    /// The same client with another first retry delay (default 1 s; the
    /// n-th retry waits `base·2^n`, at most 30 s). Tests use milliseconds.
    #[must_use]
    pub fn with_retry_base(mut self, base: Duration) -> Self {
        self.retry_base = base;
        self
    }

    /// The same client with another long-poll (E12) request timeout; never
    /// below [`MIN_POLL_TIMEOUT`].
    #[must_use]
    pub fn with_poll_timeout(mut self, timeout: Duration) -> Self {
        self.poll_timeout = timeout.max(MIN_POLL_TIMEOUT);
        self
    }

    /// Requests sent so far, per endpoint kind ([`endpoint`]); retries
    /// count as requests.
    pub fn calls(&self) -> CallCounts {
        self.inner.counters.snapshot()
    }

    /// Runs the registration (§1 steps B and C) now, whether or not the
    /// admin token is still fresh: a start-up or doctor check that the
    /// credential, the scope and the service work together.
    pub async fn connect(&self) -> Result<(), ApiError> {
        let mut admin = self.inner.admin.lock().await;
        *admin = Some(self.register().await?);
        Ok(())
    }

    /// E1: the runner group called `name`; `None` when there is none.
    pub async fn runner_group_by_name(
        &self,
        name: &str,
    ) -> Result<Option<ScaleSetRunnerGroup>, ApiError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Group {
            #[serde(default)]
            id: i64,
            #[serde(default, deserialize_with = "null_default")]
            name: String,
            #[serde(default, deserialize_with = "null_default")]
            is_default_group: bool,
        }
        let ep = endpoint::GET_RUNNER_GROUP;
        let raw = self
            .admin_call(ep, Method::GET, RUNNER_GROUPS, &[("groupName", name)], None)
            .await?;
        let list: List<Group> = ok(raw, ep)?.json(ep, false)?;
        Ok(single(list, ep)?.map(|g| ScaleSetRunnerGroup {
            id: g.id,
            name: g.name,
            is_default: g.is_default_group,
        }))
    }

    /// E2: the scale set called `name` in a runner group; `None` when there
    /// is none.
    pub async fn scale_set_by_name(
        &self,
        runner_group_id: i64,
        name: &str,
    ) -> Result<Option<RunnerScaleSet>, ApiError> {
        let ep = endpoint::GET_SCALE_SET_BY_NAME;
        let gid = runner_group_id.to_string();
        let raw = self
            .admin_call(
                ep,
                Method::GET,
                SCALE_SETS,
                &[("runnerGroupId", &gid), ("name", name)],
                None,
            )
            .await?;
        let list: List<WireScaleSet> = ok(raw, ep)?.json(ep, false)?;
        Ok(single(list, ep)?.map(WireScaleSet::into_scale_set))
    }

    /// E3: a scale set by id; `None` when the service has none (`404`: also
    /// when it deleted an inactive one).
    pub async fn scale_set(&self, id: i64) -> Result<Option<RunnerScaleSet>, ApiError> {
        let ep = endpoint::GET_SCALE_SET;
        let raw = self
            .admin_call(ep, Method::GET, &format!("{SCALE_SETS}/{id}"), &[], None)
            .await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let set: WireScaleSet = ok(raw, ep)?.json(ep, false)?;
        Ok(Some(set.into_scale_set()))
    }

    /// E4: every scale set of the scope.
    pub async fn list_scale_sets(&self) -> Result<Vec<RunnerScaleSet>, ApiError> {
        let ep = endpoint::LIST_SCALE_SETS;
        let raw = self
            .admin_call(ep, Method::GET, SCALE_SETS, &[], None)
            .await?;
        let list: List<WireScaleSet> = ok(raw, ep)?.json(ep, false)?;
        Ok(list
            .value
            .into_iter()
            .map(WireScaleSet::into_scale_set)
            .collect())
    }

    /// E5: creates a scale set of ephemeral, elastic runners, its name as
    /// the first label (§3 E5, §5 multi-label scale sets). A duplicate name
    /// in the group is refused (a `400`, §3).
    pub async fn create_scale_set(&self, new: &NewScaleSet) -> Result<RunnerScaleSet, ApiError> {
        let ep = endpoint::CREATE_SCALE_SET;
        let body = create_body(new)?;
        let raw = self
            .admin_call(ep, Method::POST, SCALE_SETS, &[], Some(body))
            .await?;
        let set: WireScaleSet = ok(raw, ep)?.json(ep, false)?;
        Ok(set.into_scale_set())
    }

    /// E6: renames a scale set or moves it to another runner group (labels
    /// cannot be changed after creation).
    pub async fn update_scale_set(
        &self,
        id: i64,
        patch: &ScaleSetPatch,
    ) -> Result<RunnerScaleSet, ApiError> {
        let ep = endpoint::UPDATE_SCALE_SET;
        let mut body = serde_json::Map::new();
        if let Some(name) = &patch.name {
            body.insert("name".into(), json!(name));
        }
        if let Some(gid) = patch.runner_group_id {
            body.insert("runnerGroupId".into(), json!(gid));
        }
        let raw = self
            .admin_call(
                ep,
                Method::PATCH,
                &format!("{SCALE_SETS}/{id}"),
                &[],
                Some(Value::Object(body)),
            )
            .await?;
        let set: WireScaleSet = ok(raw, ep)?.json(ep, false)?;
        Ok(set.into_scale_set())
    }

    /// E7: deletes a scale set (`204`; one already gone, `404`, counts as
    /// deleted).
    pub async fn delete_scale_set(&self, id: i64) -> Result<(), ApiError> {
        let ep = endpoint::DELETE_SCALE_SET;
        let raw = self
            .admin_call(ep, Method::DELETE, &format!("{SCALE_SETS}/{id}"), &[], None)
            .await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        ok(raw, ep).map(drop)
    }

    /// E8: registers a just-in-time runner called `name` (unique) in a scale
    /// set. A taken name is an error whose [`exception`] is
    /// [`Exception::RunnerExists`].
    pub async fn generate_jit_config(
        &self,
        scale_set_id: i64,
        name: &str,
        work_folder: &str,
    ) -> Result<ScaleSetJit, ApiError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Answer {
            runner: WireRunner,
            #[serde(rename = "encodedJITConfig", default)]
            encoded_jit_config: String,
        }
        let ep = endpoint::SCALE_SET_JIT_CONFIG;
        let body = json!({ "name": name, "workFolder": work_folder });
        let raw = self
            .admin_call(
                ep,
                Method::POST,
                &format!("{SCALE_SETS}/{scale_set_id}/generatejitconfig"),
                &[],
                Some(body),
            )
            .await?;
        let answer: Answer = ok(raw, ep)?.json(ep, true)?;
        if answer.encoded_jit_config.is_empty() {
            return Err(ApiError::Decode {
                endpoint_kind: ep,
                detail: "empty encodedJITConfig".into(),
            });
        }
        Ok(ScaleSetJit {
            runner: answer.runner.into_reference(),
            encoded_jit_config: SecretString::from(answer.encoded_jit_config),
        })
    }

    /// E9: opens the scale set's message session. A live session elsewhere
    /// is an error whose [`exception`] is [`Exception::SessionConflict`]
    /// (`409`); a scale set the service deleted, [`Exception::ScaleSetNotFound`].
    /// A session without an id, statistics or queue URL (seen during
    /// outages) is an [`ApiError::Decode`] that [`is_retryable`]; such a
    /// session, when it has an id, is closed (E11) first, so the retry is
    /// not refused with `409`.
    pub async fn create_session(
        &self,
        scale_set_id: i64,
        owner: &str,
    ) -> Result<Session, ApiError> {
        let ep = endpoint::CREATE_SESSION;
        let raw = self
            .admin_call(
                ep,
                Method::POST,
                &format!("{SCALE_SETS}/{scale_set_id}/sessions"),
                &[],
                Some(json!({ "ownerName": owner })),
            )
            .await?;
        let wire = ok(raw, ep)?.json::<WireSession>(ep, true)?;
        let session_id = wire.session_id.clone();
        match wire.into_session(ep) {
            Ok(session) => Ok(session),
            Err(e) => {
                // A session the service opened but described unusably would
                // answer every retry with 409 until it expires: close it.
                if !session_id.is_empty()
                    && session_id != NIL_UUID
                    && let Err(close) = self.delete_session(scale_set_id, &session_id).await
                {
                    tracing::warn!(error = %close, "closing an unusable session failed");
                }
                Err(e)
            }
        }
    }

    /// E10: refreshes a session: the answer is the whole session anew, with
    /// a fresh token; replace the one held. An unknown session is an error
    /// whose [`exception`] is [`Exception::SessionNotFound`]: create a new
    /// one.
    pub async fn refresh_session(
        &self,
        scale_set_id: i64,
        session_id: &str,
    ) -> Result<Session, ApiError> {
        let ep = endpoint::REFRESH_SESSION;
        let raw = self
            .admin_call(
                ep,
                Method::PATCH,
                &format!(
                    "{SCALE_SETS}/{scale_set_id}/sessions/{}",
                    path_segment(session_id)?
                ),
                &[],
                None,
            )
            .await?;
        ok(raw, ep)?.json::<WireSession>(ep, true)?.into_session(ep)
    }

    /// E11: closes a session (`204`). One the service already dropped
    /// (`400` session expired, or `404`) counts as closed.
    pub async fn delete_session(
        &self,
        scale_set_id: i64,
        session_id: &str,
    ) -> Result<(), ApiError> {
        let ep = endpoint::DELETE_SESSION;
        let raw = self
            .admin_call(
                ep,
                Method::DELETE,
                &format!(
                    "{SCALE_SETS}/{scale_set_id}/sessions/{}",
                    path_segment(session_id)?
                ),
                &[],
                None,
            )
            .await?;
        if raw.status.is_success() || raw.status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        let err = status_error(&raw, ep);
        if raw.status == StatusCode::BAD_REQUEST
            && exception(&err) == Some(Exception::SessionExpired)
        {
            return Ok(());
        }
        Err(err)
    }

    /// E12: the next message after `last_message_id` (0: the first one
    /// there is), waiting for one up to the service's long-poll hold
    /// (~50 s); `None` when none came (`202`). `max_capacity` is how many
    /// runners the scale set may still have (`X-ScaleSetMaxCapacity`), so
    /// the service does not assign more than it can take.
    ///
    /// A `401` is [`is_token_expired`]; an empty `200` is a retryable
    /// [`ApiError::Decode`]. Messages of a type other than [`JOB_MESSAGES`]
    /// come back without jobs, to be acked all the same.
    pub async fn get_message(
        &self,
        session: &Session,
        last_message_id: i64,
        max_capacity: u32,
    ) -> Result<Option<ScaleSetMessage>, ApiError> {
        let ep = endpoint::GET_MESSAGE;
        let mut url = queue_url(&session.message_queue_url, ep)?;
        if last_message_id > 0 {
            url.query_pairs_mut()
                .append_pair("lastMessageId", &last_message_id.to_string());
        }
        let raw = self
            .send(Call {
                ep,
                method: Method::GET,
                url,
                auth: Auth::Bearer(&session.message_queue_access_token),
                body: None,
                headers: vec![
                    (
                        "accept",
                        format!("application/json; api-version={API_VERSION}"),
                    ),
                    ("x-scalesetmaxcapacity", max_capacity.to_string()),
                ],
                timeout: Some(self.poll_timeout),
                retry_auth: false,
            })
            .await?;
        match raw.status.as_u16() {
            // 204 is not documented for the queue (§3 E12); it can only
            // mean "nothing".
            202 | 204 => Ok(None),
            200 => parse_message(&raw.body).map(Some),
            _ => Err(status_error(&raw, ep)),
        }
    }

    /// E13: acknowledges a message, so it is not delivered again. A `401` is
    /// [`is_token_expired`].
    pub async fn delete_message(&self, session: &Session, message_id: i64) -> Result<(), ApiError> {
        let ep = endpoint::DELETE_MESSAGE;
        let mut url = queue_url(&session.message_queue_url, ep)?;
        url.path_segments_mut()
            .map_err(|()| decode_error(ep, "messageQueueUrl cannot take a path"))?
            .pop_if_empty()
            .push(&message_id.to_string());
        let raw = self
            .send(Call {
                ep,
                method: Method::DELETE,
                url,
                auth: Auth::Bearer(&session.message_queue_access_token),
                body: None,
                headers: Vec::new(),
                timeout: None,
                retry_auth: false,
            })
            .await?;
        ok(raw, ep).map(drop)
    }

    /// E14: acquires jobs a `JobAvailable` offered, by `runner_request_id`;
    /// returns the ids acquired (an id missing from the answer was not, e.g.
    /// another scale set took it). Authenticates with the session's token:
    /// a `401` is [`is_token_expired`]. No ids: nothing is sent.
    pub async fn acquire_jobs(
        &self,
        scale_set_id: i64,
        session: &Session,
        runner_request_ids: &[i64],
    ) -> Result<Vec<i64>, ApiError> {
        if runner_request_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ep = endpoint::ACQUIRE_JOBS;
        // Built like an admin request (its base URL, api-version), with the
        // session's token.
        let (base, _) = self.admin().await?;
        let url = service_url(
            &base,
            &format!("{SCALE_SETS}/{scale_set_id}/acquirejobs"),
            &[],
        )?;
        let raw = self
            .send(Call {
                ep,
                method: Method::POST,
                url,
                auth: Auth::Bearer(&session.message_queue_access_token),
                body: Some(to_body(&json!(runner_request_ids))?),
                headers: Vec::new(),
                timeout: None,
                retry_auth: false,
            })
            .await?;
        let list: List<i64> = ok(raw, ep)?.json(ep, false)?;
        Ok(list.value)
    }

    /// E15: the jobs waiting to be acquired (`204`: none).
    pub async fn acquirable_jobs(&self, scale_set_id: i64) -> Result<Vec<AcquirableJob>, ApiError> {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Wire {
            #[serde(deserialize_with = "null_default")]
            runner_request_id: i64,
            #[serde(deserialize_with = "null_default")]
            message_type: String,
            #[serde(deserialize_with = "null_default")]
            repository_name: String,
            #[serde(deserialize_with = "null_default")]
            owner_name: String,
            #[serde(deserialize_with = "null_default")]
            job_workflow_ref: String,
            #[serde(deserialize_with = "null_default")]
            event_name: String,
            #[serde(deserialize_with = "null_default")]
            request_labels: Vec<String>,
        }
        let ep = endpoint::ACQUIRABLE_JOBS;
        let raw = self
            .admin_call(
                ep,
                Method::GET,
                &format!("{SCALE_SETS}/{scale_set_id}/acquirablejobs"),
                &[],
                None,
            )
            .await?;
        if raw.status == StatusCode::NO_CONTENT {
            return Ok(Vec::new());
        }
        let list: List<Wire> = ok(raw, ep)?.json(ep, false)?;
        Ok(list
            .value
            .into_iter()
            .map(|j| AcquirableJob {
                runner_request_id: j.runner_request_id,
                message_type: j.message_type,
                repository_name: j.repository_name,
                owner_name: j.owner_name,
                job_workflow_ref: j.job_workflow_ref,
                event_name: j.event_name,
                request_labels: j.request_labels,
            })
            .collect())
    }

    /// E16: a runner by id; `None` when there is none.
    pub async fn runner(&self, id: i64) -> Result<Option<RunnerReference>, ApiError> {
        let ep = endpoint::GET_AGENT;
        let raw = self
            .admin_call(ep, Method::GET, &format!("{AGENTS}/{id}"), &[], None)
            .await?;
        if raw.status.is_success() {
            let r: WireRunner = ok(raw, ep)?.json(ep, false)?;
            return Ok(Some(r.into_reference()));
        }
        let err = status_error(&raw, ep);
        if exception(&err) == Some(Exception::RunnerNotFound) {
            return Ok(None);
        }
        Err(err)
    }

    /// E17: a runner by name; `None` when there is none.
    pub async fn runner_by_name(&self, name: &str) -> Result<Option<RunnerReference>, ApiError> {
        let ep = endpoint::GET_AGENT_BY_NAME;
        let raw = self
            .admin_call(ep, Method::GET, AGENTS, &[("agentName", name)], None)
            .await?;
        let list: List<WireRunner> = ok(raw, ep)?.json(ep, false)?;
        Ok(single(list, ep)?.map(WireRunner::into_reference))
    }

    /// E18: every runner of the pool (all scale sets of the scope).
    pub async fn list_runners(&self) -> Result<Vec<RunnerReference>, ApiError> {
        let ep = endpoint::LIST_AGENTS;
        let raw = self.admin_call(ep, Method::GET, AGENTS, &[], None).await?;
        let list: List<WireRunner> = ok(raw, ep)?.json(ep, false)?;
        Ok(list
            .value
            .into_iter()
            .map(WireRunner::into_reference)
            .collect())
    }

    /// E19: removes a runner. A runner running a job is not removed
    /// ([`RemoveRunner::Busy`]); a missing one is [`RemoveRunner::NotFound`].
    pub async fn remove_runner(&self, id: i64) -> Result<RemoveRunner, ApiError> {
        let ep = endpoint::REMOVE_AGENT;
        let raw = self
            .admin_call(ep, Method::DELETE, &format!("{AGENTS}/{id}"), &[], None)
            .await?;
        if raw.status.is_success() {
            return Ok(RemoveRunner::Removed);
        }
        let err = status_error(&raw, ep);
        match exception(&err) {
            Some(Exception::RunnerNotFound) => Ok(RemoveRunner::NotFound),
            Some(Exception::JobStillRunning) => Ok(RemoveRunner::Busy),
            _ => Err(err),
        }
    }

    // -----------------------------------------------------------------------
    // Machinery.

    /// The Actions service URL and a fresh admin token: the held ones, or
    /// new ones from the registration (§1) when the token's expiry is
    /// unknown or less than 60 s away.
    async fn admin(&self) -> Result<(Url, SecretString), ApiError> {
        let mut admin = self.inner.admin.lock().await;
        if let Some(a) = admin.as_ref()
            && a.fresh(OffsetDateTime::now_utc())
        {
            return Ok((a.base.clone(), a.token.clone()));
        }
        let a = self.register().await?;
        let out = (a.base.clone(), a.token.clone());
        *admin = Some(a);
        Ok(out)
    }

    /// Forgets the admin token `used` if it is still the one held (the
    /// service refused it).
    async fn drop_admin(&self, used: &SecretString) {
        let mut admin = self.inner.admin.lock().await;
        if admin
            .as_ref()
            .is_some_and(|a| a.token.expose_secret() == used.expose_secret())
        {
            *admin = None;
        }
    }

    /// §1 steps B and C.
    async fn register(&self) -> Result<AdminConnection, ApiError> {
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default, deserialize_with = "null_default")]
            url: String,
            #[serde(default, deserialize_with = "null_default")]
            token: String,
        }
        let registration = self
            .inner
            .github
            .registration_token(&self.inner.scope)
            .await?;
        let ep = endpoint::RUNNER_REGISTRATION;
        let body = json!({ "url": self.inner.config_url, "runner_event": "register" });
        let raw = self
            .send(Call {
                ep,
                method: Method::POST,
                url: self.inner.registration_url.clone(),
                auth: Auth::RemoteAuth(&registration),
                body: Some(to_body(&body)?),
                headers: Vec::new(),
                timeout: None,
                retry_auth: true,
            })
            .await?;
        let answer: Answer = ok(raw, ep)?.json(ep, true)?;
        if answer.url.is_empty() || answer.token.is_empty() {
            return Err(decode_error(ep, "no Actions service url or token"));
        }
        let base = service_base(&answer.url)
            .ok_or_else(|| decode_error(ep, "the Actions service url is not an http(s) URL"))?;
        let expires_at = jwt_expiry(&answer.token);
        if expires_at.is_none() {
            tracing::warn!(
                "admin token without a readable expiry; it is renewed before every request"
            );
        }
        tracing::debug!(service = %base, "connected to the actions service");
        Ok(AdminConnection {
            base,
            token: SecretString::from(answer.token),
            expires_at,
        })
    }

    /// An admin request (§2): `path` (relative, no leading `/`) and `query`
    /// under the service URL with `api-version`, the admin token as Bearer.
    /// A `401` drops the admin token and tries once more with a new one.
    async fn admin_call(
        &self,
        ep: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<Value>,
    ) -> Result<Raw, ApiError> {
        let body = body.as_ref().map(to_body).transpose()?;
        let mut renewed = false;
        loop {
            let (base, token) = self.admin().await?;
            let url = service_url(&base, path, query)?;
            let raw = self
                .send(Call {
                    ep,
                    method: method.clone(),
                    url,
                    auth: Auth::Bearer(&token),
                    body: body.clone(),
                    headers: Vec::new(),
                    timeout: None,
                    retry_auth: false,
                })
                .await?;
            if raw.status == StatusCode::UNAUTHORIZED && !renewed {
                tracing::info!(endpoint = ep, "admin token refused; registering again");
                self.drop_admin(&token).await;
                renewed = true;
                continue;
            }
            return Ok(raw);
        }
    }

    /// Sends one request, retrying network errors, `429` and `5xx` but
    /// `501` (and `401`/`403` when asked) up to [`MAX_RETRIES`] times (§2).
    /// A `429` that is still refused comes back as
    /// [`ApiError::RateLimited`]; every other answer as [`Raw`], its BOM
    /// stripped.
    async fn send(&self, call: Call<'_>) -> Result<Raw, ApiError> {
        let (scheme, token) = match call.auth {
            Auth::Bearer(t) => ("Bearer", t),
            Auth::RemoteAuth(t) => ("RemoteAuth", t),
        };
        let mut authorization =
            HeaderValue::from_str(&format!("{scheme} {}", token.expose_secret()))
                .map_err(|_| ApiError::Auth("a token is not a valid header value".into()))?;
        authorization.set_sensitive(true);
        let mut attempt = 0;
        loop {
            let mut request = self
                .inner
                .http
                .request(call.method.clone(), call.url.clone())
                .header(AUTHORIZATION, authorization.clone())
                .header(CONTENT_TYPE, "application/json");
            for (name, value) in &call.headers {
                request = request.header(*name, value);
            }
            if let Some(timeout) = call.timeout {
                request = request.timeout(timeout);
            }
            if let Some(body) = &call.body {
                request = request.body(body.clone());
            }
            self.inner.counters.count(call.ep);
            let outcome = read(request, call.ep).await;
            if let Ok(raw) = &outcome
                && raw.status == StatusCode::TOO_MANY_REQUESTS
            {
                self.inner
                    .counters
                    .rate_limited
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            let pause = backoff(self.retry_base, attempt);
            let delay = match &outcome {
                Err(ApiError::Transport { .. }) => Some(pause),
                Err(_) => None,
                Ok(raw) => retry_delay(raw, call.retry_auth, pause),
            };
            match delay {
                Some(delay) if attempt < MAX_RETRIES && delay <= self.inner.max_retry_wait => {
                    match &outcome {
                        Ok(raw) => tracing::warn!(
                            endpoint = call.ep,
                            attempt,
                            status = raw.status.as_u16(),
                            delay_ms = delay.as_millis() as u64,
                            "actions service call failed, retrying"
                        ),
                        Err(e) => tracing::warn!(
                            endpoint = call.ep,
                            attempt,
                            error = %e,
                            delay_ms = delay.as_millis() as u64,
                            "actions service call failed, retrying"
                        ),
                    }
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                _ => {
                    let raw = outcome?;
                    if raw.status == StatusCode::TOO_MANY_REQUESTS {
                        return Err(ApiError::RateLimited {
                            retry_after: retry_after(&raw.headers).unwrap_or(pause),
                        });
                    }
                    return Ok(raw);
                }
            }
        }
    }
}

/// Sends a request and reads at most [`MAX_BODY`] bytes of the answer,
/// without a leading UTF-8 BOM (§2).
async fn read(request: reqwest::RequestBuilder, ep: &'static str) -> Result<Raw, ApiError> {
    let transport = |e: reqwest::Error| ApiError::Transport {
        endpoint_kind: ep,
        source: e.without_url(),
    };
    let mut response = request.send().await.map_err(transport)?;
    let status = response.status();
    let headers = response.headers().clone();
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(decode_error(ep, "answer larger than the body limit"));
        }
        body.extend_from_slice(&chunk);
    }
    strip_bom(&mut body);
    Ok(Raw {
        status,
        headers,
        body,
    })
}

/// Drops a leading UTF-8 BOM (§2), which JSON parsers refuse.
fn strip_bom(body: &mut Vec<u8>) {
    if body.starts_with(BOM) {
        body.drain(..BOM.len());
    }
}

/// The UTF-8 byte order mark some answers start with.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// How long to wait before retrying this answer, if it is retried at all
/// (§2): `429` and `503` after their `Retry-After` (else the backoff),
/// other `5xx` but `501` after the backoff, `401`/`403` too when
/// `retry_auth`.
fn retry_delay(raw: &Raw, retry_auth: bool, backoff: Duration) -> Option<Duration> {
    match raw.status.as_u16() {
        429 | 503 => Some(retry_after(&raw.headers).unwrap_or(backoff)),
        501 => None,
        500..=599 => Some(backoff),
        401 | 403 if retry_auth => Some(backoff),
        _ => None,
    }
}

/// `Retry-After` in seconds.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

/// The delay before retry `attempt` (from 0): `base·2^attempt` plus up to
/// 20 % jitter, at most [`MAX_BACKOFF`].
fn backoff(base: Duration, attempt: u32) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16));
    // Jitter from the clock's nanoseconds: enough to spread listeners that
    // failed together, without a random-number generator.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = exp.mul_f64(f64::from(nanos % 200) / 1000.0);
    exp.saturating_add(jitter).min(MAX_BACKOFF)
}

/// The answer if 2xx, else its [`ApiError::Status`].
fn ok(raw: Raw, ep: &'static str) -> Result<Raw, ApiError> {
    if raw.status.is_success() {
        Ok(raw)
    } else {
        Err(status_error(&raw, ep))
    }
}

/// [`ApiError::Status`] for an answer, its message starting with the
/// service's `typeName`; logs the service's diagnostic ids.
fn status_error(raw: &Raw, ep: &'static str) -> ApiError {
    let header = |name: &str| {
        raw.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    tracing::debug!(
        endpoint = ep,
        status = raw.status.as_u16(),
        activity_id = header("activityid"),
        github_request_id = header("x-github-request-id"),
        "actions service refused the request"
    );
    ApiError::Status {
        status: raw.status.as_u16(),
        endpoint_kind: ep,
        message: error_message(&raw.body),
    }
}

/// The message of an error answer: `"{typeName}: {message}"` for the
/// service's JSON errors, the text otherwise; shortened, control characters
/// dropped.
fn error_message(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            let field = |k: &str| v.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
            match (field("typeName"), field("message")) {
                (Some(t), Some(m)) => format!("{t}: {m}"),
                (Some(t), None) => t.to_owned(),
                (None, Some(m)) => m.to_owned(),
                (None, None) => v.to_string(),
            }
        }
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    super::shortened(&text)
}

fn decode_error(ep: &'static str, detail: &str) -> ApiError {
    ApiError::Decode {
        endpoint_kind: ep,
        detail: detail.to_owned(),
    }
}

fn to_body(v: &Value) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::Config(format!("encoding a request: {e}")))
}

/// The service URL of a step C answer, its path ending in `/` so paths join
/// under it.
fn service_base(url: &str) -> Option<Url> {
    let mut url = Url::parse(url.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
        return None;
    }
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Some(url)
}

/// `path` under the service URL, keeping its path prefix
/// (`.../tenant/123/` + `_apis/x` = `.../tenant/123/_apis/x`), with `query`
/// (values percent-encoded) after the base URL's own query and
/// `api-version` added unless present (§2).
fn service_url(base: &Url, path: &str, query: &[(&str, &str)]) -> Result<Url, ApiError> {
    let mut url = base.clone();
    url.path_segments_mut()
        .map_err(|()| ApiError::Config("the Actions service URL cannot take a path".into()))?
        .pop_if_empty()
        .extend(path.split('/'));
    let mut parts: Vec<String> = url
        .query()
        .filter(|q| !q.is_empty())
        .map(str::to_owned)
        .into_iter()
        .collect();
    parts.extend(query.iter().map(|(k, v)| format!("{k}={}", seg(v))));
    let has_version = base.query_pairs().any(|(k, _)| k == "api-version")
        || query.iter().any(|(k, _)| *k == "api-version");
    if !has_version {
        parts.push(format!("api-version={API_VERSION}"));
    }
    url.set_query(Some(&parts.join("&")));
    Ok(url)
}

/// A value from the service used as one path segment (a session id): it
/// must not hold a `/`; other reserved characters are percent-encoded when
/// the URL is built.
fn path_segment(s: &str) -> Result<&str, ApiError> {
    if s.is_empty() || s.contains('/') {
        return Err(ApiError::Config(format!("not a usable id: {s:?}")));
    }
    Ok(s)
}

/// The session's queue URL, as given (its query kept).
fn queue_url(message_queue_url: &str, ep: &'static str) -> Result<Url, ApiError> {
    let url = Url::parse(message_queue_url)
        .map_err(|_| decode_error(ep, "messageQueueUrl is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(decode_error(ep, "messageQueueUrl is not http(s)"));
    }
    Ok(url)
}

/// The `exp` of a JWT, read without checking its signature (§1: only to
/// know when to renew it).
fn jwt_expiry(token: &str) -> Option<OffsetDateTime> {
    #[derive(Deserialize)]
    struct Claims {
        exp: Option<serde_json::Number>,
    }
    let payload = token.split('.').nth(1)?.trim_end_matches('=');
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(payload))
        .ok()?;
    let exp = serde_json::from_slice::<Claims>(&bytes).ok()?.exp?;
    // A fractional `exp` is rounded down.
    let secs = exp.as_i64().or_else(|| exp.as_f64().map(|f| f as i64))?;
    OffsetDateTime::from_unix_timestamp(secs).ok()
}

/// The E5 body: ephemeral, elastic runners; labels `System`, the name first
/// (§3 E5).
fn create_body(new: &NewScaleSet) -> Result<Value, ApiError> {
    let name = new.name.trim();
    if name.is_empty() {
        return Err(ApiError::Config("a scale set needs a name".into()));
    }
    let mut labels: Vec<&str> = vec![name];
    for l in &new.labels {
        let l = l.trim();
        if !l.is_empty() && !labels.iter().any(|x| x.eq_ignore_ascii_case(l)) {
            labels.push(l);
        }
    }
    let labels: Vec<Value> = labels
        .into_iter()
        .map(|l| json!({ "type": "System", "name": l }))
        .collect();
    Ok(json!({
        "name": name,
        "runnerGroupId": new.runner_group_id,
        "labels": labels,
        "RunnerSetting": {
            "ephemeral": true,
            "isElastic": true,
            "disableUpdate": new.disable_update,
        },
    }))
}

// ---------------------------------------------------------------------------
// Wire formats.

/// `{"count": n, "value": [..]}`.
#[derive(Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
struct List<T> {
    #[serde(default, deserialize_with = "null_default")]
    count: i64,
    #[serde(default, deserialize_with = "null_default")]
    value: Vec<T>,
}

/// The one item of a list answer that names one thing; `None` when empty,
/// an error when there are several.
fn single<T>(list: List<T>, ep: &'static str) -> Result<Option<T>, ApiError> {
    if list.count > 1 || list.value.len() > 1 {
        return Err(decode_error(ep, "more than one match"));
    }
    Ok(list.value.into_iter().next())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireScaleSet {
    #[serde(default)]
    id: i64,
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default)]
    runner_group_id: i64,
    #[serde(default, deserialize_with = "null_default")]
    runner_group_name: String,
    #[serde(default, deserialize_with = "null_default")]
    labels: Vec<WireLabel>,
    #[serde(default)]
    statistics: Option<Statistics>,
}

#[derive(Deserialize)]
struct WireLabel {
    #[serde(default, deserialize_with = "null_default")]
    name: String,
}

impl WireScaleSet {
    fn into_scale_set(self) -> RunnerScaleSet {
        RunnerScaleSet {
            id: self.id,
            name: self.name,
            runner_group_id: self.runner_group_id,
            runner_group_name: self.runner_group_name,
            labels: self.labels.into_iter().map(|l| l.name).collect(),
            statistics: self.statistics,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRunner {
    #[serde(default)]
    id: i64,
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default, deserialize_with = "null_default")]
    runner_scale_set_id: i64,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    busy: Option<bool>,
}

impl WireRunner {
    fn into_reference(self) -> RunnerReference {
        RunnerReference {
            id: self.id,
            name: self.name,
            runner_scale_set_id: self.runner_scale_set_id,
            status: self.status,
            busy: self.busy,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSession {
    #[serde(default, deserialize_with = "null_default")]
    session_id: String,
    #[serde(default, deserialize_with = "null_default")]
    owner_name: String,
    #[serde(default)]
    runner_scale_set: Option<WireScaleSet>,
    #[serde(default, deserialize_with = "null_default")]
    message_queue_url: String,
    #[serde(default, deserialize_with = "null_default")]
    message_queue_access_token: String,
    #[serde(default)]
    statistics: Option<Statistics>,
}

impl WireSession {
    /// The session, if it has what polling needs (§3 E9, §5: outages have
    /// produced sessions without a queue URL).
    fn into_session(self, ep: &'static str) -> Result<Session, ApiError> {
        if self.session_id.is_empty() || self.session_id == NIL_UUID {
            return Err(decode_error(ep, "session without a sessionId (retryable)"));
        }
        let Some(statistics) = self.statistics else {
            return Err(decode_error(ep, "session without statistics (retryable)"));
        };
        if self.message_queue_url.is_empty() {
            return Err(decode_error(
                ep,
                "session without a messageQueueUrl (retryable)",
            ));
        }
        if self.message_queue_access_token.is_empty() {
            return Err(decode_error(
                ep,
                "session without a messageQueueAccessToken (retryable)",
            ));
        }
        Ok(Session {
            session_id: self.session_id,
            owner_name: self.owner_name,
            message_queue_url: self.message_queue_url,
            message_queue_access_token: SecretString::from(self.message_queue_access_token),
            statistics,
            scale_set: self.runner_scale_set.map(WireScaleSet::into_scale_set),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMessage {
    #[serde(default, deserialize_with = "null_default")]
    message_id: i64,
    #[serde(default, deserialize_with = "null_default")]
    message_type: String,
    /// A JSON string holding the array of job messages (double-encoded),
    /// possibly empty.
    #[serde(default)]
    body: Value,
    #[serde(default)]
    statistics: Option<Statistics>,
}

/// Parses an E12 `200` body (§4).
fn parse_message(body: &[u8]) -> Result<ScaleSetMessage, ApiError> {
    let ep = endpoint::GET_MESSAGE;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(decode_error(ep, "empty message (retryable)"));
    }
    let wire: WireMessage = decode(body, ep, false)?;
    let statistics = wire.statistics.unwrap_or_default();
    if wire.message_type != JOB_MESSAGES {
        tracing::warn!(
            message_id = wire.message_id,
            message_type = wire.message_type.as_str(),
            "message of an unknown type; its content is ignored"
        );
        return Ok(ScaleSetMessage {
            message_id: wire.message_id,
            message_type: wire.message_type,
            jobs: Vec::new(),
            statistics,
        });
    }
    let items: Vec<Value> = match wire.body {
        Value::Null => Vec::new(),
        Value::String(s) if s.trim().is_empty() => Vec::new(),
        Value::String(s) => decode(s.as_bytes(), ep, false)?,
        // Tolerated: a body sent as the array itself.
        Value::Array(items) => items,
        _ => {
            return Err(decode_error(
                ep,
                "message body is neither a string nor an array",
            ));
        }
    };
    let mut jobs = Vec::with_capacity(items.len());
    for (index, item) in items.into_iter().enumerate() {
        match serde_json::from_value::<WireJob>(item) {
            Ok(job) => jobs.push(job.into_job()),
            Err(e) => tracing::warn!(
                message_id = wire.message_id,
                index,
                error = %e,
                "unreadable job message skipped"
            ),
        }
    }
    Ok(ScaleSetMessage {
        message_id: wire.message_id,
        message_type: wire.message_type,
        jobs,
        statistics,
    })
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct WireJob {
    #[serde(deserialize_with = "null_default")]
    message_type: String,
    #[serde(deserialize_with = "null_default")]
    runner_request_id: i64,
    #[serde(deserialize_with = "string_or_number")]
    job_id: String,
    #[serde(deserialize_with = "null_default")]
    repository_name: String,
    #[serde(deserialize_with = "null_default")]
    owner_name: String,
    #[serde(deserialize_with = "null_default")]
    job_workflow_ref: String,
    #[serde(deserialize_with = "null_default")]
    job_display_name: String,
    #[serde(deserialize_with = "null_default")]
    workflow_run_id: i64,
    #[serde(deserialize_with = "null_default")]
    event_name: String,
    #[serde(deserialize_with = "null_default")]
    request_labels: Vec<String>,
    #[serde(deserialize_with = "nonzero_time")]
    queue_time: Option<OffsetDateTime>,
    #[serde(deserialize_with = "nonzero_time")]
    scale_set_assign_time: Option<OffsetDateTime>,
    #[serde(deserialize_with = "nonzero_time")]
    runner_assign_time: Option<OffsetDateTime>,
    #[serde(deserialize_with = "nonzero_time")]
    finish_time: Option<OffsetDateTime>,
    runner_id: Option<i64>,
    #[serde(deserialize_with = "null_default")]
    runner_name: String,
    #[serde(deserialize_with = "null_default")]
    result: String,
}

impl WireJob {
    fn into_job(self) -> JobMessage {
        let kind = match self.message_type.as_str() {
            "JobAvailable" => JobMessageKind::Available,
            "JobAssigned" => JobMessageKind::Assigned,
            "JobStarted" => JobMessageKind::Started,
            "JobCompleted" => JobMessageKind::Completed,
            _ => JobMessageKind::Other(self.message_type),
        };
        JobMessage {
            kind,
            runner_request_id: self.runner_request_id,
            job_id: self.job_id,
            repository_name: self.repository_name,
            owner_name: self.owner_name,
            job_workflow_ref: self.job_workflow_ref,
            job_display_name: self.job_display_name,
            workflow_run_id: self.workflow_run_id,
            event_name: self.event_name,
            request_labels: self.request_labels,
            queue_time: self.queue_time,
            scale_set_assign_time: self.scale_set_assign_time,
            runner_assign_time: self.runner_assign_time,
            finish_time: self.finish_time,
            // 0 names no runner.
            runner_id: self.runner_id.filter(|id| *id != 0),
            runner_name: self.runner_name,
            result: self.result,
        }
    }
}

/// A job id: a string (§4), or a number from a service that sends one.
fn string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(match Option::<Value>::deserialize(d)? {
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    })
}

/// An RFC 3339 time; zero (`0001-01-01T00:00:00Z`, or the Unix epoch),
/// absent or unreadable times are `None` (§4).
fn nonzero_time<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OffsetDateTime>, D::Error> {
    let s = Option::<String>::deserialize(d)?;
    Ok(s.as_deref()
        .and_then(crate::timestamps::parse)
        .filter(|t| *t > OffsetDateTime::UNIX_EPOCH))
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn base() -> Url {
        service_base("http://127.0.0.1:9/tenant/123/").expect("base")
    }

    #[test]
    fn urls_keep_the_base_path_and_add_the_api_version() {
        let url = service_url(&base(), "_apis/runtime/runnerscalesets/7", &[]).expect("url");
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:9/tenant/123/_apis/runtime/runnerscalesets/7?api-version=6.0-preview"
        );
        // A base without the trailing slash joins the same way.
        let bare = service_base("https://broker.example/rest").expect("base");
        assert_eq!(
            service_url(&bare, "_apis/x", &[]).expect("url").as_str(),
            "https://broker.example/rest/_apis/x?api-version=6.0-preview"
        );
        // E1 keeps its `/` before the query.
        let url = service_url(&base(), RUNNER_GROUPS, &[("groupName", "Default")]).expect("url");
        assert_eq!(
            url.as_str(),
            "http://127.0.0.1:9/tenant/123/_apis/runtime/runnergroups/?groupName=Default&api-version=6.0-preview"
        );
    }

    #[test]
    fn urls_keep_a_given_api_version_and_the_base_query() {
        let url = service_url(&base(), "_apis/x", &[("api-version", "7.0")]).expect("url");
        assert_eq!(url.query(), Some("api-version=7.0"));
        let with_query = service_base("http://h/t/?tenant=a").expect("base");
        let url = service_url(&with_query, "_apis/x", &[("name", "n")]).expect("url");
        assert_eq!(url.path(), "/t/_apis/x");
        assert_eq!(url.query(), Some("tenant=a&name=n&api-version=6.0-preview"));
    }

    #[test]
    fn query_values_are_percent_encoded() {
        let url = service_url(
            &base(),
            SCALE_SETS,
            &[("runnerGroupId", "1"), ("name", "a b&c=d/é?")],
        )
        .expect("url");
        assert_eq!(
            url.query(),
            Some("runnerGroupId=1&name=a%20b%26c%3Dd%2F%C3%A9%3F&api-version=6.0-preview")
        );
        let pairs: Vec<(String, String)> = url.query_pairs().into_owned().collect();
        assert_eq!(pairs[1], ("name".into(), "a b&c=d/é?".into()));
    }

    #[test]
    fn bases_must_be_http() {
        assert!(service_base("ftp://h/x").is_none());
        assert!(service_base("not a url").is_none());
        assert_eq!(service_base("http://h/a/b").expect("base").path(), "/a/b/");
    }

    fn jwt(payload: &str) -> String {
        let enc = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.sig",
            enc(r#"{"alg":"RS256","typ":"JWT"}"#),
            enc(payload)
        )
    }

    #[test]
    fn jwt_expiry_is_read_unverified() {
        assert_eq!(
            jwt_expiry(&jwt(r#"{"exp":1767225600,"iss":"x"}"#)),
            Some(datetime!(2026-01-01 00:00:00 UTC))
        );
        assert_eq!(
            jwt_expiry(&jwt(r#"{"exp":1767225600.7}"#)),
            Some(datetime!(2026-01-01 00:00:00 UTC))
        );
        // Padded base64url still reads.
        let padded = format!(
            "h.{}.s",
            base64::engine::general_purpose::URL_SAFE.encode(r#"{"exp":1767225600,"a":"b?>"}"#)
        );
        assert_eq!(
            jwt_expiry(&padded),
            Some(datetime!(2026-01-01 00:00:00 UTC))
        );
        assert_eq!(jwt_expiry(&jwt(r#"{"iss":"x"}"#)), None);
        assert_eq!(jwt_expiry("opaque-token"), None);
        assert_eq!(jwt_expiry("a.!!!.c"), None);
    }

    #[test]
    fn admin_tokens_are_renewed_a_minute_early() {
        let now = datetime!(2026-01-01 12:00:00 UTC);
        let conn = |exp: Option<OffsetDateTime>| AdminConnection {
            base: base(),
            token: SecretString::from("t"),
            expires_at: exp,
        };
        assert!(conn(Some(now + Duration::from_secs(120))).fresh(now));
        assert!(!conn(Some(now + Duration::from_secs(59))).fresh(now));
        assert!(!conn(Some(now - Duration::from_secs(1))).fresh(now));
        assert!(!conn(None).fresh(now));
    }

    fn message(body: &str) -> Vec<u8> {
        json!({
            "messageId": 100000171_i64,
            "messageType": JOB_MESSAGES,
            "body": body,
            "statistics": {"totalAvailableJobs": 1, "totalAssignedJobs": 2, "totalRunningJobs": 1,
                           "totalRegisteredRunners": 3, "totalBusyRunners": 1, "totalIdleRunners": 2},
        })
        .to_string()
        .into_bytes()
    }

    #[test]
    fn double_encoded_bodies_parse() {
        let jobs = r#"[{"messageType":"JobAssigned","runnerRequestId":4711,"jobId":"8d2f","repositoryName":"app","ownerName":"acme",
            "jobWorkflowRef":"acme/app/.github/workflows/ci.yml@refs/heads/main","jobDisplayName":"build","workflowRunId":99,
            "eventName":"push","requestLabels":["runyard-linux"],"queueTime":"2026-05-01T10:00:00Z",
            "scaleSetAssignTime":"2026-05-01T10:00:01Z","runnerAssignTime":"0001-01-01T00:00:00Z","finishTime":"0001-01-01T00:00:00Z"},
            {"messageType":"JobStarted","runnerRequestId":4711,"jobId":"8d2f","runnerId":12,"runnerName":"ry-1"},
            {"messageType":"JobCompleted","jobId":"8d2f","result":"succeeded","runnerId":12,"runnerName":"ry-1",
             "finishTime":"2026-05-01T10:05:00.5Z"},
            {"messageType":"JobAvailable","runnerRequestId":9007199254740993,"jobId":"x","acquireJobUrl":"http://a"},
            {"messageType":"JobRevoked","jobId":"y"}]"#;
        let m = parse_message(&message(jobs)).expect("message");
        assert_eq!(m.message_id, 100000171);
        assert_eq!(m.statistics.total_assigned_jobs, 2);
        assert_eq!(m.statistics.total_idle_runners, 2);
        assert_eq!(m.jobs.len(), 5);
        let a = &m.jobs[0];
        assert_eq!(a.kind, JobMessageKind::Assigned);
        assert_eq!(a.runner_request_id, 4711);
        assert_eq!(a.job_id, "8d2f");
        assert_eq!(
            (a.owner_name.as_str(), a.repository_name.as_str()),
            ("acme", "app")
        );
        assert_eq!(a.workflow_run_id, 99);
        assert_eq!(a.request_labels, ["runyard-linux"]);
        assert_eq!(a.queue_time, Some(datetime!(2026-05-01 10:00:00 UTC)));
        assert_eq!(
            a.scale_set_assign_time,
            Some(datetime!(2026-05-01 10:00:01 UTC))
        );
        assert_eq!(a.runner_assign_time, None, "zero time");
        assert_eq!(a.finish_time, None, "zero time");
        assert_eq!(a.runner_id, None);
        assert_eq!(m.jobs[1].kind, JobMessageKind::Started);
        assert_eq!(m.jobs[1].runner_id, Some(12));
        assert_eq!(m.jobs[1].runner_name, "ry-1");
        assert_eq!(m.jobs[1].queue_time, None, "absent time");
        assert_eq!(m.jobs[2].kind, JobMessageKind::Completed);
        assert_eq!(m.jobs[2].result, "succeeded");
        assert_eq!(
            m.jobs[2].finish_time,
            Some(datetime!(2026-05-01 10:05:00.5 UTC))
        );
        assert_eq!(m.jobs[3].kind, JobMessageKind::Available);
        assert_eq!(
            m.jobs[3].runner_request_id, 9_007_199_254_740_993,
            "i64 ids"
        );
        assert_eq!(m.jobs[4].kind, JobMessageKind::Other("JobRevoked".into()));
    }

    #[test]
    fn empty_and_odd_messages() {
        let m = parse_message(&message("")).expect("empty body string");
        assert!(m.jobs.is_empty());
        assert_eq!(m.statistics.total_busy_runners, 1);
        // An empty 200 is retryable.
        let err = parse_message(b"").expect_err("empty");
        assert!(is_retryable(&err), "{err}");
        assert!(parse_message(b" \n").is_err());
        // Another top-level type: no jobs read, still a message to ack.
        let other = json!({"messageId": 5, "messageType": "RunnerScaleSetUpdated",
                           "body": "[{\"messageType\":\"JobAssigned\"}]"})
        .to_string();
        let m = parse_message(other.as_bytes()).expect("other type");
        assert_eq!(m.message_id, 5);
        assert_eq!(m.message_type, "RunnerScaleSetUpdated");
        assert!(m.jobs.is_empty());
        assert_eq!(m.statistics, Statistics::default());
        // Numeric job ids and unreadable entries.
        let m = parse_message(&message(
            r#"[{"messageType":"JobAssigned","jobId":42},{"messageType":"JobStarted","runnerId":"x"}]"#,
        ))
        .expect("lenient");
        assert_eq!(m.jobs.len(), 1);
        assert_eq!(m.jobs[0].job_id, "42");
        // A body that is not an array is an error.
        assert!(parse_message(&message("{")).is_err());
    }

    #[test]
    fn bom_is_stripped_before_parsing() {
        let mut body = BOM.to_vec();
        body.extend(message("[]"));
        assert!(
            serde_json::from_slice::<Value>(&body).is_err(),
            "a BOM breaks JSON"
        );
        strip_bom(&mut body);
        assert_eq!(parse_message(&body).expect("parsed").message_id, 100000171);
        // Only a leading one, only once.
        let mut plain = b"{}".to_vec();
        strip_bom(&mut plain);
        assert_eq!(plain, b"{}");
        let mut twice = [BOM, BOM, b"{}"].concat();
        strip_bom(&mut twice);
        assert_eq!(twice, [BOM, b"{}"].concat());
        let mut err = [BOM, br#"{"typeName":"AgentExistsException","message":"x"}"#].concat();
        strip_bom(&mut err);
        assert_eq!(error_message(&err), "AgentExistsException: x");
    }

    fn status(status: u16, ep: &'static str, body: &str) -> ApiError {
        ApiError::Status {
            status,
            endpoint_kind: ep,
            message: error_message(body.as_bytes()),
        }
    }

    #[test]
    fn errors_keep_the_type_name_first() {
        let long = "x".repeat(1000);
        let body = json!({"typeName": "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException, GitHub.Actions.Runtime.WebApi",
                          "message": long})
        .to_string();
        let e = status(409, endpoint::CREATE_SESSION, &body);
        let ApiError::Status { message, .. } = &e else {
            panic!("status");
        };
        assert!(
            message.starts_with(
                "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException"
            )
        );
        assert!(message.chars().count() <= crate::api::MAX_MESSAGE + 1);
        assert_eq!(exception(&e), Some(Exception::SessionConflict));
        assert_eq!(
            error_message(b"GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException: The actions runner scaleset x already has an active session\n"),
            "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionConflictException: The actions runner scaleset x already has an active session"
        );
        assert_eq!(error_message(br#"{"message":"nope"}"#), "nope");
    }

    #[test]
    fn exceptions_by_type_name_then_status() {
        let ty = |t: &str| json!({"typeName": t, "message": "m"}).to_string();
        let cases = [
            (
                status(
                    400,
                    endpoint::SCALE_SET_JIT_CONFIG,
                    &ty("GitHub.DistributedTask.WebApi.AgentExistsException"),
                ),
                Exception::RunnerExists,
            ),
            (
                status(404, endpoint::REMOVE_AGENT, &ty("AgentNotFoundException")),
                Exception::RunnerNotFound,
            ),
            (
                status(
                    400,
                    endpoint::REMOVE_AGENT,
                    &ty("GitHub.DistributedTask.WebApi.JobStillRunningException"),
                ),
                Exception::JobStillRunning,
            ),
            (
                status(
                    400,
                    endpoint::DELETE_SESSION,
                    &ty("RunnerScaleSetSessionExpiredException"),
                ),
                Exception::SessionExpired,
            ),
            (
                status(
                    404,
                    endpoint::CREATE_SESSION,
                    &ty("RunnerScaleSetNotFoundException"),
                ),
                Exception::ScaleSetNotFound,
            ),
            (
                status(404, endpoint::REFRESH_SESSION, &ty("RunnerAdminException")),
                Exception::SessionNotFound,
            ),
            (
                status(
                    404,
                    endpoint::REFRESH_SESSION,
                    "runner referenced a session ID that doesn't exist in redis",
                ),
                Exception::SessionNotFound,
            ),
            (
                status(409, endpoint::CREATE_SESSION, ""),
                Exception::SessionConflict,
            ),
            (
                status(404, endpoint::GET_SCALE_SET, ""),
                Exception::ScaleSetNotFound,
            ),
            (status(500, endpoint::LIST_AGENTS, "boom"), Exception::Other),
        ];
        for (e, want) in cases {
            assert_eq!(exception(&e), Some(want), "{e}");
        }
        assert_eq!(exception(&status(404, "get_runner", "")), None, "not ours");
        assert_eq!(exception(&decode_error(endpoint::GET_MESSAGE, "x")), None);
    }

    #[test]
    fn token_expiry_is_a_401_of_the_session_endpoints() {
        for ep in [
            endpoint::GET_MESSAGE,
            endpoint::DELETE_MESSAGE,
            endpoint::ACQUIRE_JOBS,
        ] {
            assert!(is_token_expired(&status(401, ep, "")), "{ep}");
            assert!(!is_token_expired(&status(403, ep, "")), "{ep}");
        }
        assert!(!is_token_expired(&status(
            401,
            endpoint::CREATE_SESSION,
            ""
        )));
    }

    #[test]
    fn retries_follow_the_policy() {
        let raw = |code: u16, retry_after: Option<&'static str>| {
            let mut headers = HeaderMap::new();
            if let Some(v) = retry_after {
                headers.insert(RETRY_AFTER, HeaderValue::from_static(v));
            }
            Raw {
                status: StatusCode::from_u16(code).expect("status"),
                headers,
                body: Vec::new(),
            }
        };
        let b = Duration::from_millis(10);
        assert_eq!(retry_delay(&raw(500, None), false, b), Some(b));
        assert_eq!(retry_delay(&raw(502, Some("3")), false, b), Some(b));
        assert_eq!(
            retry_delay(&raw(503, Some("3")), false, b),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_delay(&raw(429, Some("2")), false, b),
            Some(Duration::from_secs(2))
        );
        assert_eq!(retry_delay(&raw(429, None), false, b), Some(b));
        assert_eq!(retry_delay(&raw(501, None), false, b), None);
        assert_eq!(retry_delay(&raw(404, None), true, b), None);
        assert_eq!(retry_delay(&raw(401, None), false, b), None);
        assert_eq!(retry_delay(&raw(401, None), true, b), Some(b));
        assert_eq!(retry_delay(&raw(403, None), true, b), Some(b));
        let base = Duration::from_secs(1);
        for n in 0..4 {
            let d = backoff(base, n);
            assert!(
                d >= base * 2u32.pow(n) && d <= (base * 2u32.pow(n)).mul_f64(1.2),
                "{d:?}"
            );
        }
        assert_eq!(backoff(base, 5), MAX_BACKOFF);
        assert_eq!(backoff(base, 40), MAX_BACKOFF);
    }

    #[test]
    fn create_bodies() {
        let body = create_body(&NewScaleSet {
            name: "ry-linux".into(),
            runner_group_id: 1,
            labels: vec![
                "gpu".into(),
                "RY-LINUX".into(),
                String::new(),
                "gpu".into(),
                "x64".into(),
            ],
            disable_update: true,
        })
        .expect("body");
        assert_eq!(
            body,
            json!({"name": "ry-linux", "runnerGroupId": 1,
                   "labels": [{"type":"System","name":"ry-linux"},{"type":"System","name":"gpu"},{"type":"System","name":"x64"}],
                   "RunnerSetting": {"ephemeral": true, "isElastic": true, "disableUpdate": true}})
        );
        assert!(create_body(&NewScaleSet::default()).is_err());
    }

    #[test]
    fn sessions_need_what_polling_needs() {
        let good = json!({"sessionId": "5b3c", "ownerName": "host", "messageQueueUrl": "http://q/x?sessionId=5b3c",
                          "messageQueueAccessToken": "tok-secret", "statistics": {"totalAssignedJobs": 4},
                          "runnerScaleSet": {"id": 7, "name": "ry", "runnerGroupId": 1, "runnerGroupName": "Default",
                                             "labels": [{"type":"System","name":"ry"}], "RunnerSetting": {"disableUpdate": false}}});
        let parse = |v: &Value| {
            decode::<WireSession>(v.to_string().as_bytes(), endpoint::CREATE_SESSION, true)
                .and_then(|w| w.into_session(endpoint::CREATE_SESSION))
        };
        let s = parse(&good).expect("session");
        assert_eq!(s.statistics.total_assigned_jobs, 4);
        assert_eq!(
            s.scale_set.as_ref().map(|x| x.labels.clone()),
            Some(vec!["ry".to_owned()])
        );
        assert!(!format!("{s:?}").contains("tok-secret"));
        for (key, value) in [
            ("sessionId", json!("")),
            ("sessionId", json!(NIL_UUID)),
            ("statistics", Value::Null),
            ("messageQueueUrl", json!("")),
            ("messageQueueAccessToken", Value::Null),
        ] {
            let mut bad = good.clone();
            bad[key] = value;
            let err = parse(&bad).expect_err(key);
            assert!(is_retryable(&err), "{key}: {err}");
            assert!(!err.to_string().contains("tok-secret"));
        }
    }
}
