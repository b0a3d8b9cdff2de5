//! The `workflow_job` webhooks a job's lifecycle sends, and the lifecycle
//! itself as GitHub runs it (REFERENCE: "Job lifecycles"): a job that needs
//! an environment's approval is delivered `waiting`, and `queued` once
//! approved; only a `queued` job can be taken by a runner; a job rejected
//! (or cancelled) while waiting goes straight to `completed` without ever
//! being `queued`. Every transition appends one delivery, in GitHub's
//! documented payload shape, to an outbox that a test drains with
//! [`FakeGitHub::take_webhooks`] and posts where it wants.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::{FakeGitHub, FakeJob, GhState, job_json, rfc3339};

/// One webhook delivery the fake sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeWebhook {
    /// `X-GitHub-Event`.
    pub event: String,
    /// `X-GitHub-Delivery`.
    pub guid: String,
    /// The action (`queued`, `waiting`, `in_progress`, `completed`).
    pub action: String,
    /// The job it is about.
    pub job_id: u64,
    /// The raw JSON body.
    pub body: Vec<u8>,
}

/// Which moves GitHub allows a job to make.
fn allowed(from: &str, to: &str) -> bool {
    matches!(
        (from, to),
        ("waiting", "queued")
            | ("waiting", "completed")
            | ("queued", "in_progress")
            | ("queued", "completed")
            | ("in_progress", "completed")
    ) || from == to && from != "completed"
}

/// The `workflow_job` payload of a job, as GitHub's webhook documentation
/// shows it: the job with its runner fields (null until a runner took it),
/// the repository, its organization and the sender.
pub(super) fn workflow_job_body(repo: &str, job: &FakeJob, action: &str) -> Vec<u8> {
    let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
    let mut j = job_json(repo, job);
    let running = job.runner_name.is_some();
    if let Value::Object(m) = &mut j {
        m.insert("status".into(), json!(action));
        m.insert(
            "run_url".into(),
            json!(format!(
                "https://api.github.com/repos/{repo}/actions/runs/{}",
                job.run_id
            )),
        );
        m.insert(
            "url".into(),
            json!(format!(
                "https://api.github.com/repos/{repo}/actions/jobs/{}",
                job.id
            )),
        );
        m.insert("node_id".into(), json!(format!("CR_{}", job.id)));
        // GitHub fills `started_at` with the creation time until it starts.
        if job.started_at.is_none() {
            m.insert("started_at".into(), json!(job.created_at));
        }
        m.insert(
            "runner_id".into(),
            if running {
                json!(job.id % 97 + 1)
            } else {
                Value::Null
            },
        );
        m.insert(
            "runner_group_id".into(),
            if running { json!(1) } else { Value::Null },
        );
        m.insert(
            "runner_group_name".into(),
            if running {
                json!("Default")
            } else {
                Value::Null
            },
        );
    }
    let body = json!({
        "action": action,
        "workflow_job": j,
        "repository": {
            "id": 376_034_443u64,
            "name": name,
            "full_name": repo,
            "private": true,
            "owner": {"login": owner, "type": "Organization"},
            "html_url": format!("https://github.com/{repo}"),
            "url": format!("https://api.github.com/repos/{repo}"),
        },
        "organization": {"login": owner, "id": 33_435_682u64},
        "sender": {"login": "octocat", "id": 21_031_067u64, "type": "User"},
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

impl GhState {
    /// Moves a job, checking the move is one GitHub makes, and sends its
    /// webhook. Panics on a move GitHub never makes: a fake that accepted
    /// one would prove nothing.
    pub(super) fn transition(&mut self, job_id: u64, to: &str, conclusion: Option<&str>) {
        let Some((repo, job)) = self.jobs.get_mut(&job_id) else {
            panic!("no job {job_id} in the fake");
        };
        assert!(
            allowed(&job.status, to),
            "job {job_id}: GitHub never moves a job from {} to {to}",
            job.status
        );
        job.status = to.to_owned();
        job.conclusion = conclusion.map(str::to_owned);
        let now = rfc3339(SystemTime::now());
        match to {
            "in_progress" => job.started_at = Some(now),
            "completed" => {
                job.started_at.get_or_insert_with(|| now.clone());
                job.completed_at = Some(now);
            }
            _ => {}
        }
        let (repo, job) = (repo.clone(), job.clone());
        self.send(&repo, &job, to);
    }

    pub(super) fn send(&mut self, repo: &str, job: &FakeJob, action: &str) {
        self.webhooks.push(FakeWebhook {
            event: "workflow_job".into(),
            guid: uuid::Uuid::new_v4().to_string(),
            action: action.to_owned(),
            job_id: job.id,
            body: workflow_job_body(repo, job, action),
        });
    }
}

impl FakeGitHub {
    /// Adds a job of a deployment whose environment needs an approval (or
    /// that waits on a concurrency group): it is `waiting` and no runner can
    /// take it until [`FakeGitHub::approve`]. Returns its id.
    pub fn add_waiting_job(&self, owner: &str, repo: &str, mut job: FakeJob) -> u64 {
        job.status = "waiting".into();
        self.add_job(owner, repo, job)
    }

    /// A reviewer approves a waiting job's deployment: it is `queued`.
    pub fn approve(&self, job_id: u64) {
        self.st().transition(job_id, "queued", None);
    }

    /// A reviewer rejects a waiting job's deployment: it completes
    /// (`failure`) without ever being queued.
    pub fn reject(&self, job_id: u64) {
        self.st().transition(job_id, "completed", Some("failure"));
    }

    /// A runner takes a job: it must be `queued`; `in_progress` names the
    /// runner.
    pub fn start_job(&self, job_id: u64, runner_name: &str) {
        let mut st = self.st();
        if let Some((_, job)) = st.jobs.get_mut(&job_id) {
            assert_eq!(
                job.status, "queued",
                "job {job_id}: only a queued job can be taken by a runner"
            );
            job.runner_name = Some(runner_name.to_owned());
        }
        st.transition(job_id, "in_progress", None);
    }

    /// The webhooks sent since the last call, in the order GitHub sent them.
    pub fn take_webhooks(&self) -> Vec<FakeWebhook> {
        std::mem::take(&mut self.st().webhooks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action_and_status(hook: &FakeWebhook) -> (String, String, Value, Value) {
        let v: Value = serde_json::from_slice(&hook.body).unwrap_or_default();
        (
            v["action"].as_str().unwrap_or_default().to_owned(),
            v["workflow_job"]["status"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            v["workflow_job"]["runner_name"].clone(),
            v["workflow_job"]["conclusion"].clone(),
        )
    }

    #[tokio::test]
    async fn an_approved_deployment_waits_then_queues_then_runs() {
        let gh = FakeGitHub::start().await;
        let id = gh.add_waiting_job("acme", "app", FakeJob::queued(7, "deploy", &["linux"]));
        gh.approve(id);
        gh.start_job(id, "ry-1");
        gh.set_job_status(id, "completed", Some("success"));
        let hooks = gh.take_webhooks();
        let seen: Vec<_> = hooks.iter().map(action_and_status).collect();
        assert_eq!(
            seen.iter().map(|s| s.0.as_str()).collect::<Vec<_>>(),
            ["waiting", "queued", "in_progress", "completed"]
        );
        assert!(seen.iter().all(|s| s.0 == s.1), "status follows the action");
        assert_eq!(seen[1].2, Value::Null, "no runner while queued");
        assert_eq!(seen[2].2, json!("ry-1"));
        assert_eq!(seen[3].3, json!("success"));
        // Every delivery has its own GUID.
        let mut guids: Vec<_> = hooks.iter().map(|h| h.guid.clone()).collect();
        guids.dedup();
        assert_eq!(guids.len(), 4);
        assert!(gh.take_webhooks().is_empty(), "drained");
    }

    #[tokio::test]
    async fn a_rejected_deployment_completes_without_being_queued() {
        let gh = FakeGitHub::start().await;
        let id = gh.add_waiting_job("acme", "app", FakeJob::queued(7, "deploy", &["linux"]));
        gh.reject(id);
        let seen: Vec<_> = gh.take_webhooks().iter().map(action_and_status).collect();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            (seen[1].0.as_str(), &seen[1].3),
            ("completed", &json!("failure"))
        );
        assert_eq!(gh.job(id).map(|j| j.status), Some("completed".into()));
    }

    #[tokio::test]
    #[should_panic(expected = "only a queued job can be taken")]
    async fn no_runner_takes_a_waiting_job() {
        let gh = FakeGitHub::start().await;
        let id = gh.add_waiting_job("acme", "app", FakeJob::queued(7, "deploy", &["linux"]));
        gh.start_job(id, "ry-1");
    }

    #[tokio::test]
    async fn a_waiting_job_s_run_is_waiting() {
        let gh = FakeGitHub::start().await;
        let id = gh.add_waiting_job("acme", "app", FakeJob::queued(7, "deploy", &["linux"]));
        runyard_telemetry::install_crypto_provider();
        let url = format!("{}/repos/acme/app/actions/runs/7", gh.url());
        let run = async || -> Value {
            let client = reqwest::Client::new();
            let r = client.get(&url).bearer_auth("t").send().await.unwrap();
            r.json().await.unwrap()
        };
        assert_eq!(run().await["status"], "waiting");
        gh.approve(id);
        assert_eq!(run().await["status"], "queued");
    }

    #[test]
    fn moves_github_never_makes_are_refused() {
        assert!(allowed("waiting", "queued"));
        assert!(allowed("waiting", "completed"));
        assert!(!allowed("waiting", "in_progress"));
        assert!(!allowed("completed", "queued"));
        assert!(!allowed("in_progress", "queued"));
    }
}
