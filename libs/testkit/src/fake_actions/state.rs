//! The fake Actions service's state and the moves a job makes through it:
//! the per-scale-set message queue, statistics, tokens, runners and the
//! JSON shapes the service answers with (SCALESET.md §3, §4).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use super::FakeScaleSetJob;
use super::tokens::{Issued, TokenKind};
use crate::fake_github::{RecordedRequest, random_token, rfc3339};

/// The first message id a fresh fake hands out (ids look like this on
/// github.com).
pub(super) const FIRST_MESSAGE_ID: i64 = 100_000_170;
/// At most this many job messages travel in one queue message.
pub(super) const BATCH: usize = 50;
/// The path prefix of the Actions service (`<root>/tenant/123/`).
pub(super) const TENANT: [&str; 2] = ["tenant", "123"];
/// How the service writes an unset time.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum JobState {
    /// Matches the scale set; waits for an acquire (`JobAvailable` sent).
    Available,
    /// Acquired by the scale set; assigned at the next poll.
    Acquired,
    /// Assigned to the scale set (`JobAssigned` sent); waits for a runner.
    Assigned,
    /// A runner took it (`JobStarted` sent).
    Running,
    /// Taken back from the scale set (`JobCompleted{canceled}` sent); it is
    /// assigned again once a poll has carried that message out.
    Requeued,
    /// Done (`JobCompleted` sent).
    Completed,
}

impl JobState {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Available => "available",
            Self::Acquired => "acquired",
            Self::Assigned => "assigned",
            Self::Running => "running",
            Self::Requeued => "requeued",
            Self::Completed => "completed",
        }
    }
}

/// One workflow job the service routes to a scale set.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) id: String,
    pub(super) request_id: i64,
    pub(super) scale_set_id: i64,
    pub(super) spec: FakeScaleSetJob,
    pub(super) state: JobState,
    pub(super) runner_id: Option<i64>,
    pub(super) runner_name: Option<String>,
    pub(super) times_assigned: u32,
    pub(super) result: String,
    queue_time: SystemTime,
    assign_time: Option<SystemTime>,
    runner_assign_time: Option<SystemTime>,
    finish_time: Option<SystemTime>,
    /// Requeued: the `JobCompleted{canceled}` has gone out in a message.
    requeue_delivered: bool,
}

/// A runner (agent) registered through a JIT config.
#[derive(Debug)]
pub(super) struct Agent {
    pub(super) id: i64,
    pub(super) name: String,
    pub(super) scale_set_id: i64,
    pub(super) online: bool,
    pub(super) busy: bool,
    pub(super) job_id: Option<String>,
    /// It took its one job (an ephemeral runner never takes another).
    pub(super) ran: bool,
    created: SystemTime,
}

/// A label of a scale set: `(name, type)`.
pub(super) type Label = (String, String);

/// A runner scale set and its message queue.
#[derive(Debug)]
pub(super) struct ScaleSet {
    pub(super) id: i64,
    pub(super) name: String,
    pub(super) runner_group_id: i64,
    pub(super) labels: Vec<Label>,
    pub(super) disable_update: bool,
    pub(super) ephemeral: bool,
    pub(super) is_elastic: bool,
    pub(super) max_capacity_seen: Option<i64>,
    /// The live session's id.
    pub(super) session: Option<String>,
    created: SystemTime,
    /// Jobs not completed yet, by runner request id (= oldest first).
    live_jobs: BTreeSet<i64>,
    /// Job messages not yet put in a queue message, oldest first.
    pending: VecDeque<Value>,
    /// Queue messages handed out and not deleted (acked), by id.
    outstanding: BTreeMap<i64, Vec<Value>>,
}

/// A message session of a scale set's listener.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: String,
    pub(super) scale_set_id: i64,
    pub(super) owner_name: String,
    pub(super) token: String,
    /// When its listener last used it (poll, ack, acquire, refresh).
    pub(super) last_used: Instant,
}

/// The whole fake, behind one lock.
#[derive(Debug)]
pub(super) struct AcState {
    /// `http://127.0.0.1:<port>`.
    pub(super) base: String,
    pub(super) secret: Vec<u8>,

    pub(super) pat: Option<String>,
    pub(super) admin_ttl: Duration,
    pub(super) session_ttl: Duration,
    pub(super) poll_hold: Duration,
    pub(super) down: bool,
    pub(super) bom: bool,
    pub(super) fail_registration: VecDeque<u16>,
    pub(super) faults: VecDeque<u16>,
    /// Acknowledgements answered 204 but not kept (lost on the way).
    pub(super) lost_acks: u32,
    /// A poll gets the oldest un-acknowledged message whatever
    /// `lastMessageId` says.
    pub(super) redeliver_unacked: bool,
    pub(super) empty_next_message: bool,
    pub(super) empty_next_queue_url: bool,
    pub(super) acquire_required: bool,
    pub(super) keep_completed_runners: bool,
    pub(super) remove_checks_busy: bool,
    /// A session unused this long is ended by the service.
    pub(super) stale_after: Option<Duration>,

    pub(super) registration_tokens: HashMap<String, SystemTime>,
    pub(super) tokens: HashMap<String, Issued>,
    pub(super) registrations: Vec<String>,

    pub(super) groups: BTreeMap<i64, String>,
    next_group_id: i64,
    pub(super) scale_sets: BTreeMap<i64, ScaleSet>,
    next_scale_set_id: i64,
    pub(super) sessions: HashMap<String, Session>,
    pub(super) jobs: BTreeMap<i64, Job>,
    job_ids: HashMap<String, i64>,
    next_request_id: i64,
    pub(super) agents: BTreeMap<i64, Agent>,
    next_agent_id: i64,
    next_message_id: i64,

    pub(super) removed_while_busy: u64,
    pub(super) busy_refusals: u64,
    pub(super) jit_configs_issued: u64,
    pub(super) sessions_created: u64,
    pub(super) session_conflicts: u64,
    pub(super) acks: u64,
    /// Job id → when a message first handed out its `JobAssigned`.
    pub(super) assigned_delivered: HashMap<String, SystemTime>,
    pub(super) admin_tokens_issued: u64,
    pub(super) registration_tokens_issued: u64,

    pub(super) requests: Vec<RecordedRequest>,
}

/// The seven counters of a scale set's `statistics`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Stats {
    available: i64,
    acquired: i64,
    assigned: i64,
    running: i64,
    registered: i64,
    busy: i64,
    idle: i64,
}

impl Stats {
    pub(super) fn to_json(self) -> Value {
        json!({
            "totalAvailableJobs": self.available,
            "totalAcquiredJobs": self.acquired,
            "totalAssignedJobs": self.assigned,
            "totalRunningJobs": self.running,
            "totalRegisteredRunners": self.registered,
            "totalBusyRunners": self.busy,
            "totalIdleRunners": self.idle,
        })
    }
}

/// RFC 3339 of a time, or the zero time.
fn ts(t: Option<SystemTime>) -> String {
    t.map_or_else(|| ZERO_TIME.to_owned(), rfc3339)
}

impl AcState {
    pub(super) fn new() -> Self {
        let mut groups = BTreeMap::new();
        groups.insert(1, "Default".to_owned());
        Self {
            base: String::new(),
            secret: random_token(48).into_bytes(),
            pat: None,
            admin_ttl: Duration::from_secs(3600),
            session_ttl: Duration::from_secs(3600),
            poll_hold: Duration::from_secs(1),
            down: false,
            bom: false,
            fail_registration: VecDeque::new(),
            faults: VecDeque::new(),
            lost_acks: 0,
            redeliver_unacked: false,
            empty_next_message: false,
            empty_next_queue_url: false,
            acquire_required: true,
            keep_completed_runners: false,
            remove_checks_busy: true,
            stale_after: None,
            registration_tokens: HashMap::new(),
            tokens: HashMap::new(),
            registrations: Vec::new(),
            groups,
            next_group_id: 2,
            scale_sets: BTreeMap::new(),
            next_scale_set_id: 1,
            sessions: HashMap::new(),
            jobs: BTreeMap::new(),
            job_ids: HashMap::new(),
            next_request_id: 4711,
            agents: BTreeMap::new(),
            next_agent_id: 1,
            next_message_id: FIRST_MESSAGE_ID,
            removed_while_busy: 0,
            busy_refusals: 0,
            jit_configs_issued: 0,
            sessions_created: 0,
            session_conflicts: 0,
            acks: 0,
            assigned_delivered: HashMap::new(),
            admin_tokens_issued: 0,
            registration_tokens_issued: 0,
            requests: Vec::new(),
        }
    }

    /// `http://127.0.0.1:<port>/tenant/123/`.
    pub(super) fn service_url(&self) -> String {
        format!("{}/{}/{}/", self.base, TENANT[0], TENANT[1])
    }

    fn rss_url(&self, id: i64) -> String {
        format!("{}_apis/runtime/runnerscalesets/{id}", self.service_url())
    }

    // -- runner groups and scale sets

    pub(super) fn add_group(&mut self, name: &str) -> i64 {
        let id = self.next_group_id;
        self.next_group_id += 1;
        self.groups.insert(id, name.to_owned());
        id
    }

    pub(super) fn group_json(&self, id: i64, name: &str) -> Value {
        let size = self
            .agents
            .values()
            .filter(|a| {
                self.scale_sets
                    .get(&a.scale_set_id)
                    .is_some_and(|s| s.runner_group_id == id)
            })
            .count();
        json!({"id": id, "name": name, "size": size, "isDefaultGroup": id == 1})
    }

    pub(super) fn find_scale_set(&self, group: i64, name: &str, except: i64) -> Option<i64> {
        self.scale_sets
            .values()
            .find(|s| {
                s.id != except && s.runner_group_id == group && s.name.eq_ignore_ascii_case(name)
            })
            .map(|s| s.id)
    }

    pub(super) fn create_scale_set(
        &mut self,
        name: &str,
        runner_group_id: i64,
        labels: Vec<Label>,
        settings: (bool, bool, bool),
    ) -> i64 {
        let id = self.next_scale_set_id;
        self.next_scale_set_id += 1;
        let (ephemeral, is_elastic, disable_update) = settings;
        self.scale_sets.insert(
            id,
            ScaleSet {
                id,
                name: name.to_owned(),
                runner_group_id,
                labels,
                disable_update,
                ephemeral,
                is_elastic,
                max_capacity_seen: None,
                session: None,
                created: SystemTime::now(),
                live_jobs: BTreeSet::new(),
                pending: VecDeque::new(),
                outstanding: BTreeMap::new(),
            },
        );
        id
    }

    /// The scale set and its live session go (E7, or the service's
    /// garbage collection).
    pub(super) fn remove_scale_set(&mut self, id: i64) -> bool {
        let Some(ss) = self.scale_sets.remove(&id) else {
            return false;
        };
        if let Some(sid) = ss.session {
            self.drop_session(&sid);
        }
        true
    }

    pub(super) fn scale_set_json(&self, ss: &ScaleSet) -> Value {
        let labels: Vec<Value> = ss
            .labels
            .iter()
            .map(|(name, kind)| json!({"type": kind, "name": name}))
            .collect();
        let url = self.rss_url(ss.id);
        json!({
            "id": ss.id,
            "name": ss.name,
            "runnerGroupId": ss.runner_group_id,
            "runnerGroupName": self.groups.get(&ss.runner_group_id).cloned().unwrap_or_default(),
            "labels": labels,
            "RunnerSetting": {
                "ephemeral": ss.ephemeral,
                "isElastic": ss.is_elastic,
                "disableUpdate": ss.disable_update,
            },
            "createdOn": rfc3339(ss.created),
            "runnerJitConfigUrl": format!("{url}/generatejitconfig"),
            "getAcquirableJobsUrl": format!("{url}/acquirablejobs"),
            "acquireJobsUrl": format!("{url}/acquirejobs"),
            "enabled": true,
            "statistics": self.stats(ss.id).to_json(),
        })
    }

    // -- sessions

    /// A new session of scale set `ss_id` (which has none).
    pub(super) fn create_session(&mut self, ss_id: i64, owner: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let token = self.issue_token(TokenKind::Session(id.clone()), self.session_ttl);
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                scale_set_id: ss_id,
                owner_name: owner.to_owned(),
                token,
                last_used: Instant::now(),
            },
        );
        if let Some(ss) = self.scale_sets.get_mut(&ss_id) {
            ss.session = Some(id.clone());
        }
        self.sessions_created += 1;
        id
    }

    /// A fresh `messageQueueAccessToken` for the session.
    pub(super) fn rotate_session(&mut self, sid: &str) {
        let token = self.issue_token(TokenKind::Session(sid.to_owned()), self.session_ttl);
        if let Some(s) = self.sessions.get_mut(sid) {
            s.token = token;
        }
    }

    /// Its listener used the session just now.
    pub(super) fn touch_session(&mut self, sid: &str) {
        if let Some(s) = self.sessions.get_mut(sid) {
            s.last_used = Instant::now();
        }
    }

    /// Ends the sessions unused for longer than `stale_after`, as the
    /// service ends those of listeners that died without deleting them.
    pub(super) fn reap_stale_sessions(&mut self) {
        let Some(after) = self.stale_after else {
            return;
        };
        let stale: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.last_used.elapsed() > after)
            .map(|s| s.id.clone())
            .collect();
        for sid in stale {
            self.drop_session(&sid);
        }
    }

    /// The session ends; its tokens stop working.
    pub(super) fn drop_session(&mut self, sid: &str) {
        if let Some(s) = self.sessions.remove(sid)
            && let Some(ss) = self.scale_sets.get_mut(&s.scale_set_id)
            && ss.session.as_deref() == Some(sid)
        {
            ss.session = None;
        }
        self.tokens
            .retain(|_, i| !matches!(&i.kind, TokenKind::Session(s) if s == sid));
    }

    pub(super) fn session_json(&self, sid: &str) -> Value {
        let Some(s) = self.sessions.get(sid) else {
            return Value::Null;
        };
        let scale_set = self
            .scale_sets
            .get(&s.scale_set_id)
            .map_or(Value::Null, |ss| self.scale_set_json(ss));
        let queue_url = if self.empty_next_queue_url {
            String::new()
        } else {
            format!(
                "{}_apis/queue/{}/message?sessionId={}",
                self.service_url(),
                s.id,
                s.id
            )
        };
        json!({
            "sessionId": s.id,
            "ownerName": s.owner_name,
            "runnerScaleSet": scale_set,
            "messageQueueUrl": queue_url,
            "messageQueueAccessToken": s.token,
            "statistics": self.stats(s.scale_set_id).to_json(),
        })
    }

    // -- statistics

    pub(super) fn stats(&self, ss_id: i64) -> Stats {
        let mut st = Stats::default();
        if let Some(ss) = self.scale_sets.get(&ss_id) {
            for job in ss.live_jobs.iter().filter_map(|r| self.jobs.get(r)) {
                match job.state {
                    JobState::Available => st.available += 1,
                    JobState::Acquired => st.acquired += 1,
                    JobState::Assigned => st.assigned += 1,
                    JobState::Running => {
                        st.assigned += 1;
                        st.running += 1;
                    }
                    JobState::Requeued | JobState::Completed => {}
                }
            }
        }
        for a in self.agents.values().filter(|a| a.scale_set_id == ss_id) {
            st.registered += 1;
            if a.busy {
                st.busy += 1;
            } else if a.online {
                st.idle += 1;
            }
        }
        st
    }

    // -- jobs and their messages

    pub(super) fn job_by_id(&self, job_id: &str) -> Option<i64> {
        self.job_ids.get(job_id).copied()
    }

    fn job_message(&self, job: &Job, kind: &str) -> Value {
        let spec = &job.spec;
        let mut m = json!({
            "messageType": kind,
            "runnerRequestId": job.request_id,
            "jobId": job.id,
            "repositoryName": spec.repo,
            "ownerName": spec.owner,
            "jobWorkflowRef": spec.workflow_ref,
            "jobDisplayName": spec.display_name,
            "workflowRunId": spec.run_id,
            "eventName": spec.event_name,
            "requestLabels": spec.labels,
            "queueTime": ts(Some(job.queue_time)),
            "scaleSetAssignTime": ts(job.assign_time),
            "runnerAssignTime": ts(job.runner_assign_time),
            "finishTime": ts(job.finish_time),
        });
        match kind {
            "JobAvailable" => {
                m["acquireJobUrl"] = json!(format!(
                    "{}/acquirejobs?api-version=6.0-preview",
                    self.rss_url(job.scale_set_id)
                ));
            }
            "JobStarted" | "JobCompleted" => {
                m["runnerId"] = json!(job.runner_id.unwrap_or(0));
                m["runnerName"] = json!(job.runner_name.clone().unwrap_or_default());
                if kind == "JobCompleted" {
                    m["result"] = json!(job.result);
                }
            }
            _ => {}
        }
        m
    }

    /// Appends a job message for `job`'s scale set (lost if the set is
    /// gone).
    fn send(&mut self, request_id: i64, kind: &str) {
        let Some(job) = self.jobs.get(&request_id) else {
            return;
        };
        let msg = self.job_message(job, kind);
        if let Some(ss) = self.scale_sets.get_mut(&job.scale_set_id) {
            ss.pending.push_back(msg);
        }
    }

    /// A new job for scale set `ss_id`; `None` when there is no such set.
    pub(super) fn queue_job(&mut self, ss_id: i64, spec: FakeScaleSetJob) -> Option<String> {
        let ss = self.scale_sets.get_mut(&ss_id)?;
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        ss.live_jobs.insert(request_id);
        let id = uuid::Uuid::new_v4().to_string();
        self.job_ids.insert(id.clone(), request_id);
        self.jobs.insert(
            request_id,
            Job {
                id: id.clone(),
                request_id,
                scale_set_id: ss_id,
                spec,
                state: JobState::Available,
                runner_id: None,
                runner_name: None,
                times_assigned: 0,
                result: String::new(),
                queue_time: SystemTime::now(),
                assign_time: None,
                runner_assign_time: None,
                finish_time: None,
                requeue_delivered: false,
            },
        );
        if self.acquire_required {
            self.send(request_id, "JobAvailable");
        } else {
            self.assign(request_id);
            self.dispatch(ss_id);
        }
        Some(id)
    }

    /// The job is assigned to its scale set (again).
    fn assign(&mut self, request_id: i64) {
        let Some(job) = self.jobs.get_mut(&request_id) else {
            return;
        };
        job.state = JobState::Assigned;
        job.times_assigned += 1;
        job.assign_time = Some(SystemTime::now());
        job.runner_id = None;
        job.runner_name = None;
        job.runner_assign_time = None;
        job.finish_time = None;
        job.result.clear();
        self.send(request_id, "JobAssigned");
    }

    /// E14: the ids of `ss_id`'s jobs that are (now) acquired by it.
    pub(super) fn acquire(&mut self, ss_id: i64, ids: &[i64]) -> Vec<i64> {
        let mut acquired = Vec::new();
        for id in ids {
            let Some(job) = self.jobs.get_mut(id).filter(|j| j.scale_set_id == ss_id) else {
                continue;
            };
            match job.state {
                JobState::Available => {
                    job.state = JobState::Acquired;
                    acquired.push(*id);
                }
                // Asked again (a retry after a token refresh): still ours.
                JobState::Acquired => acquired.push(*id),
                _ => {}
            }
        }
        acquired
    }

    /// What a poll of `ss_id`'s queue moves on: acquired jobs and requeued
    /// ones whose cancellation went out are assigned, and idle runners
    /// take assigned jobs.
    fn advance(&mut self, ss_id: i64) {
        let Some(ss) = self.scale_sets.get(&ss_id) else {
            return;
        };
        let due: Vec<i64> = ss
            .live_jobs
            .iter()
            .filter(|r| {
                self.jobs.get(r).is_some_and(|j| {
                    j.state == JobState::Acquired
                        || (j.state == JobState::Requeued && j.requeue_delivered)
                })
            })
            .copied()
            .collect();
        for r in due {
            self.assign(r);
        }
        self.dispatch(ss_id);
    }

    /// Idle online runners of the set take its oldest assigned jobs.
    pub(super) fn dispatch(&mut self, ss_id: i64) {
        let Some(ss) = self.scale_sets.get(&ss_id) else {
            return;
        };
        let mut waiting = ss
            .live_jobs
            .iter()
            .filter(|r| {
                self.jobs
                    .get(r)
                    .is_some_and(|j| j.state == JobState::Assigned)
            })
            .copied()
            .collect::<VecDeque<i64>>();
        if waiting.is_empty() {
            return;
        }
        let idle: Vec<i64> = self
            .agents
            .values()
            .filter(|a| a.scale_set_id == ss_id && a.online && !a.busy && !a.ran)
            .map(|a| a.id)
            .collect();
        for agent_id in idle {
            let Some(request_id) = waiting.pop_front() else {
                break;
            };
            self.start(request_id, agent_id);
        }
    }

    fn start(&mut self, request_id: i64, agent_id: i64) {
        let (Some(job), Some(agent)) = (
            self.jobs.get_mut(&request_id),
            self.agents.get_mut(&agent_id),
        ) else {
            return;
        };
        agent.busy = true;
        agent.ran = true;
        agent.job_id = Some(job.id.clone());
        job.state = JobState::Running;
        job.runner_id = Some(agent.id);
        job.runner_name = Some(agent.name.clone());
        job.runner_assign_time = Some(SystemTime::now());
        self.send(request_id, "JobStarted");
    }

    /// `JobCompleted{result}`; the job's runner finishes too unless
    /// `keep_running` (the service reporting completion early).
    pub(super) fn complete(&mut self, request_id: i64, result: &str, keep_running: bool) {
        let Some(job) = self.jobs.get_mut(&request_id) else {
            return;
        };
        if job.state == JobState::Completed {
            return;
        }
        job.state = JobState::Completed;
        job.result = result.to_owned();
        job.finish_time = Some(SystemTime::now());
        let (ss_id, runner) = (job.scale_set_id, job.runner_id);
        self.send(request_id, "JobCompleted");
        if let Some(ss) = self.scale_sets.get_mut(&ss_id) {
            ss.live_jobs.remove(&request_id);
        }
        if !keep_running && let Some(agent_id) = runner {
            self.release_runner(agent_id);
        }
    }

    /// The runner's process ends after its job: it deregisters, as an
    /// ephemeral runner does, or (kept) stays listed, offline.
    pub(super) fn release_runner(&mut self, agent_id: i64) {
        if self.keep_completed_runners {
            if let Some(a) = self.agents.get_mut(&agent_id) {
                a.busy = false;
                a.online = false;
                a.job_id = None;
            }
        } else {
            self.agents.remove(&agent_id);
        }
    }

    /// Reassignment: `JobCompleted{canceled, runnerName:""}` now, assigned
    /// again after a poll carried that out. Only a job no runner took.
    pub(super) fn unassign(&mut self, request_id: i64) {
        let Some(job) = self.jobs.get_mut(&request_id) else {
            return;
        };
        if !matches!(job.state, JobState::Acquired | JobState::Assigned) {
            return;
        }
        job.state = JobState::Requeued;
        job.requeue_delivered = false;
        job.result = "canceled".to_owned();
        job.runner_id = None;
        job.runner_name = None;
        job.finish_time = Some(SystemTime::now());
        self.send(request_id, "JobCompleted");
    }

    // -- the queue

    /// The message a poll with `last` gets: the oldest un-deleted message
    /// with a higher id, else a new one of up to [`BATCH`] pending job
    /// messages; `None` when there is nothing.
    pub(super) fn next_message(&mut self, ss_id: i64, last: i64) -> Option<Value> {
        self.advance(ss_id);
        let from = if self.redeliver_unacked {
            i64::MIN
        } else {
            last.saturating_add(1)
        };
        let ss = self.scale_sets.get_mut(&ss_id)?;
        let found = ss.outstanding.range(from..).next().map(|(id, _)| *id);
        let id = match found {
            Some(id) => id,
            None if !ss.pending.is_empty() => {
                let n = ss.pending.len().min(BATCH);
                let batch: Vec<Value> = ss.pending.drain(..n).collect();
                for m in &batch {
                    if m["messageType"] == "JobCompleted"
                        && let Some(job) = m["runnerRequestId"]
                            .as_i64()
                            .and_then(|r| self.jobs.get_mut(&r))
                        && job.state == JobState::Requeued
                    {
                        job.requeue_delivered = true;
                    }
                }
                let id = self.next_message_id;
                self.next_message_id += 1;
                ss.outstanding.insert(id, batch);
                id
            }
            None => return None,
        };
        let ss = self.scale_sets.get(&ss_id)?;
        let jobs = ss.outstanding.get(&id)?;
        let now = SystemTime::now();
        for m in jobs.iter().filter(|m| m["messageType"] == "JobAssigned") {
            if let Some(job) = m["jobId"].as_str() {
                self.assigned_delivered.entry(job.to_owned()).or_insert(now);
            }
        }
        let body = serde_json::to_string(jobs).unwrap_or_default();
        Some(json!({
            "messageId": id,
            "messageType": "RunnerScaleSetJobMessages",
            "body": body,
            "statistics": self.stats(ss_id).to_json(),
        }))
    }

    /// E13: whether an outstanding message went.
    pub(super) fn ack(&mut self, ss_id: i64, message_id: i64) -> bool {
        if self.lost_acks > 0
            && self
                .scale_sets
                .get(&ss_id)
                .is_some_and(|ss| ss.outstanding.contains_key(&message_id))
        {
            self.lost_acks -= 1;
            return true;
        }
        let gone = self
            .scale_sets
            .get_mut(&ss_id)
            .and_then(|ss| ss.outstanding.remove(&message_id))
            .is_some();
        if gone {
            self.acks += 1;
        }
        gone
    }

    /// E15's items: the set's jobs waiting for an acquire.
    pub(super) fn acquirable(&self, ss_id: i64) -> Vec<Value> {
        let Some(ss) = self.scale_sets.get(&ss_id) else {
            return Vec::new();
        };
        ss.live_jobs
            .iter()
            .filter_map(|r| self.jobs.get(r))
            .filter(|j| j.state == JobState::Available)
            .map(|j| {
                let m = self.job_message(j, "JobAvailable");
                json!({
                    "acquireJobUrl": m["acquireJobUrl"],
                    "messageType": "JobAvailable",
                    "runnerRequestId": j.request_id,
                    "repositoryName": j.spec.repo,
                    "ownerName": j.spec.owner,
                    "jobWorkflowRef": j.spec.workflow_ref,
                    "eventName": j.spec.event_name,
                    "requestLabels": j.spec.labels,
                })
            })
            .collect()
    }

    // -- runners

    pub(super) fn agent_by_name(&self, name: &str) -> Option<i64> {
        self.agents
            .values()
            .find(|a| a.name.eq_ignore_ascii_case(name))
            .map(|a| a.id)
    }

    /// E8: registers a runner of the set; `(runner id, encoded config)`.
    pub(super) fn register_agent(
        &mut self,
        ss_id: i64,
        name: &str,
        work_folder: &str,
    ) -> (i64, String) {
        let id = self.next_agent_id;
        self.next_agent_id += 1;
        self.agents.insert(
            id,
            Agent {
                id,
                name: name.to_owned(),
                scale_set_id: ss_id,
                online: false,
                busy: false,
                job_id: None,
                ran: false,
                created: SystemTime::now(),
            },
        );
        self.jit_configs_issued += 1;
        let disable_update = self
            .scale_sets
            .get(&ss_id)
            .is_some_and(|s| s.disable_update);
        (
            id,
            self.encode_jit(id, name, ss_id, work_folder, disable_update),
        )
    }

    pub(super) fn agent_json(&self, a: &Agent) -> Value {
        let ss = self.scale_sets.get(&a.scale_set_id);
        let group = ss.map_or(0, |s| s.runner_group_id);
        let labels: Vec<Value> = ss
            .map(|s| {
                s.labels
                    .iter()
                    .map(|(name, kind)| json!({"type": kind, "name": name}))
                    .collect()
            })
            .unwrap_or_default();
        json!({
            "id": a.id,
            "name": a.name,
            "runnerScaleSetId": a.scale_set_id,
            "os": "Linux",
            "createdOn": rfc3339(a.created),
            "runnerGroupId": group,
            "runnerGroupName": self.groups.get(&group).cloned().unwrap_or_default(),
            "version": "2.330.0",
            "enabled": true,
            "ephemeral": true,
            "status": if a.online { "online" } else { "offline" },
            "disableUpdate": ss.is_some_and(|s| s.disable_update),
            "provisioningState": "Provisioned",
            "busy": a.busy,
            "labels": labels,
        })
    }

    /// A runner process connected: it may take a job at once. `false` when
    /// there is no such runner or its one job is behind it.
    pub(super) fn runner_online(&mut self, agent_id: i64) -> bool {
        let Some(a) = self.agents.get_mut(&agent_id).filter(|a| !a.ran) else {
            return false;
        };
        a.online = true;
        let ss_id = a.scale_set_id;
        self.dispatch(ss_id);
        true
    }
}
