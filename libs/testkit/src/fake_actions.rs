//! A stateful fake of GitHub's Actions service for runner scale sets (the
//! "broker" API of SCALESET.md), for tests of the scale-set client and the
//! scaler: the registration steps (registration token, then
//! `POST /actions/runner-registration` for the service URL and an admin
//! JWT), runner groups, scale sets, message sessions, the long-polled
//! message queue with acknowledgement and redelivery, job acquisition, JIT
//! runner configs and the runner (agent) list, and a log of every request.
//!
//! ```no_run
//! # async fn demo() {
//! use runyard_testkit::fake_actions::{FakeActions, FakeScaleSetJob};
//! let actions = FakeActions::start().await;
//! let api_url = actions.github_url(); // the REST base: steps B and C
//! // ... the client under test creates scale set 1 and a session, then:
//! let job = actions.queue_job(1, FakeScaleSetJob::new("acme/app", "build", 7, &["ry"]));
//! // JobAvailable → acquire → JobAssigned → (a runner connects) JobStarted
//! actions.complete_job(&job, "succeeded"); // JobCompleted
//! # }
//! ```
//!
//! A job's life: `available` (a `JobAvailable` message; it waits for an
//! acquire, E14, unless [`FakeActions::set_acquire_required`] is off, when
//! it is assigned at once) → `acquired` → `assigned` at the next poll of the
//! queue (`JobAssigned`) → `running` when an idle online runner of the set
//! takes the oldest assigned job (`JobStarted`; the runner is busy) →
//! `completed` ([`FakeActions::complete_job`]: `JobCompleted`, and the
//! ephemeral runner deregisters). [`FakeActions::unassign`] models
//! reassignment: `JobCompleted{canceled, runnerName:""}`, the job
//! `requeued`, then assigned again (`JobAssigned`) at the first poll after
//! the one that carried the cancellation out.
//!
//! The queue: every state change appends a job message to its scale set's
//! queue. A `GET` returns the oldest un-deleted queue message whose id is
//! above `lastMessageId`, else a new one made of up to 50 pending job
//! messages (ids increase from 100000170), else it holds up to the poll
//! hold (default 1 s) and answers `202`; a change wakes a held poll at
//! once. An undeleted message is redelivered to every poll with a lower
//! `lastMessageId`. Every message carries the statistics of the moment it
//! is served; its `body` is a JSON string holding the array.
//!
//! Choices where SCALESET.md says UNCONFIRMED: `AgentExistsException` is
//! 409, `JobStillRunningException` 400, a duplicate scale-set name 400
//! (`RunnerScaleSetExistsException`); a stale session holds its 409 until
//! it is deleted, [`FakeActions::expire_sessions`] or, when set,
//! [`FakeActions::set_session_stale_after`]; acquire answers the
//! ids of the set's jobs now acquired (already acquired ones too) and
//! refuses the admin token (401); E12 never answers 204; an old
//! `messageQueueAccessToken` keeps working after a refresh until it
//! expires; `totalAcquiredJobs` counts acquired, not yet assigned jobs,
//! `totalAssignedJobs` assigned and running ones, `totalIdleRunners` online
//! runners without a job; runner names are unique across the service and
//! compared without case.

mod routes;
mod state;
mod tokens;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::Router;
use base64::Engine as _;
use serde_json::Value;
use tokio::sync::Notify;

use crate::fake_github::{RecordedRequest, Server, lock};
use state::AcState;

/// A workflow job as a test queues it for a scale set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeScaleSetJob {
    /// Repository owner (`ownerName`).
    pub owner: String,
    /// Repository name (`repositoryName`).
    pub repo: String,
    /// `jobWorkflowRef`.
    pub workflow_ref: String,
    /// `jobDisplayName`.
    pub display_name: String,
    /// `workflowRunId`.
    pub run_id: i64,
    /// The job's `runs-on` labels (`requestLabels`).
    pub labels: Vec<String>,
    /// `eventName`.
    pub event_name: String,
}

impl FakeScaleSetJob {
    /// A `push` job of `owner/repo`'s `ci.yml` on `main`.
    pub fn new(owner_repo: &str, display_name: &str, run_id: i64, labels: &[&str]) -> Self {
        let (owner, repo) = owner_repo.split_once('/').unwrap_or((owner_repo, ""));
        Self {
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            workflow_ref: format!("{owner}/{repo}/.github/workflows/ci.yml@refs/heads/main"),
            display_name: display_name.to_owned(),
            run_id,
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            event_name: "push".to_owned(),
        }
    }
}

/// A scale set as the fake holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeScaleSet {
    /// Id.
    pub id: i64,
    /// Name.
    pub name: String,
    /// Its runner group.
    pub runner_group_id: i64,
    /// Label names, as created (updates leave them alone).
    pub labels: Vec<String>,
    /// Live sessions (0 or 1).
    pub sessions: usize,
    /// The last `X-ScaleSetMaxCapacity` a message poll sent.
    pub max_capacity_seen: Option<i64>,
}

/// A job as the fake holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeActionsJob {
    /// `jobId`.
    pub job_id: String,
    /// `runnerRequestId`.
    pub runner_request_id: i64,
    /// The scale set it was routed to.
    pub scale_set_id: i64,
    /// `available`, `acquired`, `assigned`, `running`, `requeued` (taken
    /// back, to be assigned again) or `completed`.
    pub state: String,
    /// The runner that took it.
    pub runner_name: Option<String>,
    /// How many times it was assigned to the scale set.
    pub times_assigned: u32,
}

/// A runner (agent) as the fake holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeAgent {
    /// Id (`runner.id` of the JIT config answer).
    pub id: i64,
    /// Name.
    pub name: String,
    /// Its scale set.
    pub scale_set_id: i64,
    /// Its process connected.
    pub online: bool,
    /// It runs a job.
    pub busy: bool,
    /// The job it runs (or ran, while the service reported it completed
    /// early).
    pub job_id: Option<String>,
}

/// Reads the runner id and name from a JIT config the fake issued
/// (`encodedJITConfig`): base64 of a JSON object whose `.runner` entry is
/// base64 of a JSON document naming the runner.
pub fn decode_scale_set_jit(encoded: &str) -> Option<(i64, String)> {
    let engine = &base64::engine::general_purpose::STANDARD;
    let files: Value = serde_json::from_slice(&engine.decode(encoded.trim()).ok()?).ok()?;
    let runner = engine.decode(files.get(".runner")?.as_str()?).ok()?;
    let runner: Value = serde_json::from_slice(&runner).ok()?;
    Some((
        runner.get("agentId")?.as_i64()?,
        runner.get("agentName")?.as_str()?.to_owned(),
    ))
}

/// What the server tasks and the test share.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<AcState>,
    /// Woken on every change a held poll may be waiting for.
    notify: Notify,
}

/// A handle on a [`FakeActions`]'s state for [`crate::fake_github::FakeGitHub`]
/// (`connect_actions`): it issues registration and admin tokens from it.
#[derive(Debug, Clone)]
pub(crate) struct ActionsLink(Arc<Shared>);

impl ActionsLink {
    /// Step B: a registration token and its `expires_at`.
    pub(crate) fn issue_registration_token(&self) -> (String, String) {
        lock(&self.0.state).issue_registration_token()
    }

    /// Step C (`RemoteAuth <registration token>`): status and JSON body.
    /// Honours [`FakeActions::set_down`] and
    /// [`FakeActions::fail_next_registration`].
    pub(crate) fn runner_registration(
        &self,
        remote_auth: Option<&str>,
        body: &[u8],
    ) -> (u16, Value) {
        let mut st = lock(&self.0.state);
        if st.down {
            return (503, serde_json::json!({"message": "Service Unavailable"}));
        }
        st.runner_registration(remote_auth, body)
    }
}

/// The fake Actions service. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeActions {
    server: Server,
    shared: Arc<Shared>,
}

impl FakeActions {
    /// Starts a fake on a free loopback port, with runner group 1
    /// `Default`.
    pub async fn start() -> Self {
        let shared = Arc::new(Shared {
            state: Mutex::new(AcState::new()),
            notify: Notify::new(),
        });
        let router = Router::new()
            .fallback(routes::handle)
            .with_state(shared.clone());
        let server = Server::start(router).await;
        lock(&shared.state).base = format!("http://{}", server.addr);
        Self { server, shared }
    }

    fn st(&self) -> MutexGuard<'_, AcState> {
        lock(&self.shared.state)
    }

    /// Runs a change and wakes held polls.
    fn change<T>(&self, f: impl FnOnce(&mut AcState) -> T) -> T {
        let out = f(&mut self.st());
        self.shared.notify.notify_waiters();
        out
    }

    pub(crate) fn link(&self) -> ActionsLink {
        ActionsLink(self.shared.clone())
    }

    /// The root (`http://127.0.0.1:<port>`): the REST registration steps
    /// B and C.
    pub fn github_url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// The Actions service URL step C hands out:
    /// `http://127.0.0.1:<port>/tenant/123/`.
    pub fn service_url(&self) -> String {
        self.st().service_url()
    }

    // -- tokens

    /// Step B accepts only this bearer token (default: any non-empty one).
    pub fn require_token(&self, token: &str) {
        self.st().pat = Some(token.to_owned());
    }

    /// How long admin tokens issued from now on live (default 1 h).
    pub fn set_admin_token_ttl(&self, ttl: Duration) {
        self.st().admin_ttl = ttl;
    }

    /// How long `messageQueueAccessToken`s issued from now on live
    /// (default 1 h).
    pub fn set_session_token_ttl(&self, ttl: Duration) {
        self.st().session_ttl = ttl;
    }

    /// Every current `messageQueueAccessToken` answers 401 from now on.
    pub fn expire_session_tokens(&self) {
        self.change(|st| st.expire_tokens(false));
    }

    /// Every current admin token answers 401 from now on.
    pub fn expire_admin_tokens(&self) {
        self.change(|st| st.expire_tokens(true));
    }

    /// The next `/actions/runner-registration` answers `status` (once; call
    /// again to queue more).
    pub fn fail_next_registration(&self, status: u16) {
        self.st().fail_registration.push_back(status);
    }

    /// The config URLs step C was called with, in order.
    pub fn registrations(&self) -> Vec<String> {
        self.st().registrations.clone()
    }

    /// Admin tokens issued (step C answers).
    pub fn admin_tokens_issued(&self) -> u64 {
        self.st().admin_tokens_issued
    }

    /// Registration tokens issued (step B answers, here or through a
    /// connected [`crate::fake_github::FakeGitHub`]).
    pub fn registration_tokens_issued(&self) -> u64 {
        self.st().registration_tokens_issued
    }

    // -- behaviour

    /// How long a message `GET` holds before `202` (default 1 s).
    pub fn set_poll_hold(&self, d: Duration) {
        self.st().poll_hold = d;
    }

    /// While down, every request (the REST steps too) answers 503.
    pub fn set_down(&self, down: bool) {
        self.change(|st| st.down = down);
    }

    /// Prefix every JSON answer with a UTF-8 byte-order mark.
    pub fn set_bom(&self, on: bool) {
        self.st().bom = on;
    }

    /// The next `n` requests to the service (under `/tenant/123/`) answer
    /// `status` (a 429 or 5xx, to exercise transport retries).
    pub fn fail_next(&self, n: u32, status: u16) {
        let mut st = self.st();
        for _ in 0..n {
            st.faults.push_back(status);
        }
    }

    /// The next message `GET` answers 200 with an empty body, as the
    /// service has during outages.
    pub fn empty_next_message(&self) {
        self.st().empty_next_message = true;
    }

    /// The next session created answers with an empty `messageQueueUrl`,
    /// as the service has during outages (the session exists).
    pub fn empty_queue_url_next_session(&self) {
        self.st().empty_next_queue_url = true;
    }

    /// The next `n` acknowledgements (E13) of outstanding messages answer
    /// `204` but are lost: the messages stay un-acknowledged.
    pub fn lose_next_acks(&self, n: u32) {
        self.st().lost_acks += n;
    }

    /// Whether a poll gets the oldest un-acknowledged message even when its
    /// `lastMessageId` is past it (default off): the service redelivering
    /// what it never saw acknowledged.
    pub fn set_redeliver_unacked(&self, on: bool) {
        self.st().redeliver_unacked = on;
    }

    /// Whether a job needs an acquire (E14) after `JobAvailable` (default
    /// on, as GHES); off, jobs arrive as `JobAssigned` directly.
    pub fn set_acquire_required(&self, on: bool) {
        self.st().acquire_required = on;
    }

    /// Whether a runner stays listed (offline) after its job instead of
    /// deregistering (default off: ephemeral runners leave).
    pub fn set_keep_completed_runners(&self, on: bool) {
        self.st().keep_completed_runners = on;
    }

    /// Whether E19 refuses a busy runner with `JobStillRunningException`
    /// (default on). Off, such a removal succeeds and counts in
    /// [`FakeActions::removed_while_busy`].
    pub fn set_remove_checks_busy(&self, on: bool) {
        self.st().remove_checks_busy = on;
    }

    // -- groups and scale sets

    /// Adds a runner group; returns its id (group 1 `Default` exists).
    pub fn add_runner_group(&self, name: &str) -> i64 {
        self.st().add_group(name)
    }

    /// Every scale set.
    pub fn scale_sets(&self) -> Vec<FakeScaleSet> {
        self.st()
            .scale_sets
            .values()
            .map(|s| FakeScaleSet {
                id: s.id,
                name: s.name.clone(),
                runner_group_id: s.runner_group_id,
                labels: s.labels.iter().map(|(n, _)| n.clone()).collect(),
                sessions: usize::from(s.session.is_some()),
                max_capacity_seen: s.max_capacity_seen,
            })
            .collect()
    }

    /// Deletes a scale set as the service's garbage collection does: its
    /// session ends, and E3, E9 and the rest answer 404
    /// `RunnerScaleSetNotFoundException`.
    pub fn delete_scale_set_server_side(&self, id: i64) {
        self.change(|st| st.remove_scale_set(id));
    }

    /// Ends every live session server-side, as the service does with a
    /// stale one at last: E10 answers 404, E11 400, a new E9 succeeds.
    pub fn expire_sessions(&self) {
        self.change(|st| {
            let ids: Vec<String> = st.sessions.keys().cloned().collect();
            for sid in ids {
                st.drop_session(&sid);
            }
        });
    }

    /// Ends a session its listener has not used (polled, acknowledged,
    /// acquired or refreshed) for longer than `d`, as the service ends the
    /// session of a listener that died without deleting it (default:
    /// never; a stale session answers 409 until deleted). Choose `d` above
    /// the poll hold.
    pub fn set_session_stale_after(&self, d: Duration) {
        self.st().stale_after = Some(d);
    }

    /// The statistics object the set's messages would carry now.
    pub fn statistics(&self, scale_set_id: i64) -> Value {
        self.st().stats(scale_set_id).to_json()
    }

    // -- jobs

    /// Routes a new job to the scale set; returns its `jobId`. Panics when
    /// there is no such scale set.
    pub fn queue_job(&self, scale_set_id: i64, job: FakeScaleSetJob) -> String {
        let id = self.change(|st| st.queue_job(scale_set_id, job));
        id.unwrap_or_else(|| panic!("queue_job: there is no scale set {scale_set_id}"))
    }

    /// The job ends with `result`: `JobCompleted{result, runnerName}` (an
    /// empty `runnerName` when no runner had it), and its runner finishes
    /// and deregisters. On a job reported completed early, the runner
    /// finishes ([`FakeActions::finish_job`]).
    pub fn complete_job(&self, job_id: &str, result: &str) {
        self.change(|st| {
            let Some(r) = st.job_by_id(job_id) else {
                return;
            };
            if st.jobs[&r].state == state::JobState::Completed {
                finish(st, job_id);
            } else {
                st.complete(r, result, false);
            }
        });
    }

    /// The service reports `JobCompleted{succeeded}` while the job keeps
    /// running: its runner stays busy (E19 refuses it) until
    /// [`FakeActions::finish_job`].
    pub fn send_completed_early(&self, job_id: &str) {
        self.change(|st| {
            if let Some(r) = st.job_by_id(job_id)
                && st.jobs[&r].state == state::JobState::Running
            {
                st.complete(r, "succeeded", true);
            }
        });
    }

    /// The runner running the job really finishes: no longer busy, it
    /// deregisters. A job still running completes (`succeeded`) first.
    pub fn finish_job(&self, job_id: &str) {
        self.change(|st| {
            if let Some(r) = st.job_by_id(job_id)
                && st.jobs[&r].state == state::JobState::Running
            {
                st.complete(r, "succeeded", false);
            } else {
                finish(st, job_id);
            }
        });
    }

    /// Reassignment of an acquired or assigned job no runner took:
    /// `JobCompleted{canceled, runnerName:""}` now, then (after a poll
    /// carried that out) `JobAssigned` again. Other jobs are left alone.
    pub fn unassign(&self, job_id: &str) {
        self.change(|st| {
            if let Some(r) = st.job_by_id(job_id) {
                st.unassign(r);
            }
        });
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Vec<FakeActionsJob> {
        self.st()
            .jobs
            .values()
            .map(|j| FakeActionsJob {
                job_id: j.id.clone(),
                runner_request_id: j.request_id,
                scale_set_id: j.scale_set_id,
                state: j.state.as_str().to_owned(),
                runner_name: j.runner_name.clone(),
                times_assigned: j.times_assigned,
            })
            .collect()
    }

    // -- runners

    /// A runner started with its JIT config connected: online, and if idle
    /// it takes the oldest assigned job of its set at once. `false` when
    /// there is no such runner (or its one job is behind it).
    pub fn runner_online(&self, name: &str) -> bool {
        self.change(|st| {
            st.agent_by_name(name)
                .is_some_and(|id| st.runner_online(id))
        })
    }

    /// [`FakeActions::runner_online`] for the runner the config was issued
    /// to.
    pub fn runner_online_by_jit(&self, encoded_jit_config: &str) -> bool {
        let Some((id, name)) = decode_scale_set_jit(encoded_jit_config) else {
            return false;
        };
        self.change(|st| st.agents.get(&id).is_some_and(|a| a.name == name) && st.runner_online(id))
    }

    /// Every registered runner.
    pub fn runners(&self) -> Vec<FakeAgent> {
        self.st()
            .agents
            .values()
            .map(|a| FakeAgent {
                id: a.id,
                name: a.name.clone(),
                scale_set_id: a.scale_set_id,
                online: a.online,
                busy: a.busy,
                job_id: a.job_id.clone(),
            })
            .collect()
    }

    // -- counters and the request log

    /// Busy runners removed (only with [`FakeActions::set_remove_checks_busy`] off).
    pub fn removed_while_busy(&self) -> u64 {
        self.st().removed_while_busy
    }

    /// Removals refused with `JobStillRunningException`.
    pub fn busy_refusals(&self) -> u64 {
        self.st().busy_refusals
    }

    /// JIT configs issued (E8 answers).
    pub fn jit_configs_issued(&self) -> u64 {
        self.st().jit_configs_issued
    }

    /// Sessions created (E9 answers 200).
    pub fn sessions_created(&self) -> u64 {
        self.st().sessions_created
    }

    /// E9 answered 409.
    pub fn session_conflicts(&self) -> u64 {
        self.st().session_conflicts
    }

    /// Queue messages deleted (a repeated delete is not counted again).
    pub fn acks(&self) -> u64 {
        self.st().acks
    }

    /// When a message `GET` first answered with the job's `JobAssigned`
    /// (taken as the answer is made, before it is sent; a redelivery or a
    /// later assignment of the same job does not move it). `None` until
    /// then.
    pub fn assigned_delivered_at(&self, job_id: &str) -> Option<SystemTime> {
        self.st().assigned_delivered.get(job_id).copied()
    }

    /// Every request received, in the order they were answered (a held
    /// poll is logged when it ends).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.st().requests.clone()
    }

    /// Requests with this method whose path (without the query) starts
    /// with `path_prefix`.
    pub fn count(&self, method: &str, path_prefix: &str) -> usize {
        self.st()
            .requests
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path.starts_with(path_prefix))
            .count()
    }
}

/// The runner holding `job_id` finishes.
fn finish(st: &mut AcState, job_id: &str) {
    if let Some(agent_id) = st
        .agents
        .values()
        .find(|a| a.job_id.as_deref() == Some(job_id))
        .map(|a| a.id)
    {
        st.release_runner(agent_id);
    }
}
