//! A scale-set job's twin on GitHub's REST side: the `workflow_job` id its
//! webhook, its usage report (`job.check_run_id`) and a re-run name, with
//! the workflow's name and the run attempt.
//!
//! The message names the job by the service's own id; what links it to the
//! REST job is the run (`workflowRunId`), the display name
//! (`jobDisplayName` = `workflow_job.name`, matrix values included) and,
//! once it started, the runner (`runnerName` = `workflow_job.runner_name`).
//! One `GET /repos/{o}/{r}/actions/runs/{id}/jobs?filter=latest` per run
//! and message answers every job of that run in the message; a job seen
//! once keeps its twin. When GitHub cannot say (no REST credential for the
//! repository, a refusal, a timeout, no single match) the job keeps its
//! scale-set identity ([`super::convert::job_id_of`]) and is served all
//! the same: resolution never delays a runner for longer than its timeout.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use runyard_forge::api::github::{GitHubClient, WorkflowJob};
use runyard_forge::api::scaleset::{JobMessage, JobMessageKind, ScaleSetMessage};

/// The most twins kept (jobs leave when they complete).
const MAX_KNOWN: usize = 100_000;

/// A scale-set job as the REST API knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twin {
    /// `workflow_job.id`.
    pub job_id: u64,
    /// The workflow's `name:`.
    pub workflow_name: String,
    /// The run attempt.
    pub run_attempt: u32,
}

/// Finds and remembers twins.
#[derive(Debug)]
pub struct Resolver {
    github: Option<GitHubClient>,
    timeout: Duration,
    known: Mutex<HashMap<String, Twin>>,
    /// Repositories whose runs could not be read, warned about once.
    warned: Mutex<HashSet<String>>,
}

/// States of a REST job that has not reached a runner yet.
fn waiting_for_runner(status: &str) -> bool {
    matches!(status, "queued" | "waiting" | "pending" | "requested")
}

impl Resolver {
    /// A resolver asking `github` (none: every job keeps its scale-set id),
    /// each listing bounded by `timeout`.
    pub fn new(github: Option<GitHubClient>, timeout: Duration) -> Self {
        Self {
            github,
            timeout,
            known: Mutex::new(HashMap::new()),
            warned: Mutex::new(HashSet::new()),
        }
    }

    /// Says once per repository that its jobs keep the service's ids (a
    /// missing permission would otherwise log at every message).
    fn cannot_read(&self, repo: &str, run: u64, why: &str) {
        let first = self
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(repo.to_owned());
        if first {
            tracing::warn!(
                repo,
                run,
                why,
                "cannot read the repository's workflow runs (the credential needs \"Actions: read\"): its scale-set jobs keep the service's ids, so their webhooks, usage reports and re-runs are not linked to them"
            );
        } else {
            tracing::debug!(repo, run, why, "cannot read the run's jobs");
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, Twin>> {
        self.known
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The twins of the message's jobs, by scale-set job id (those GitHub
    /// could name).
    pub async fn resolve(&self, message: &ScaleSetMessage) -> HashMap<String, Twin> {
        let mut out = HashMap::new();
        let mut wanted: BTreeMap<(String, String, u64), Vec<&JobMessage>> = BTreeMap::new();
        {
            let known = self.known();
            for job in &message.jobs {
                if matches!(
                    job.kind,
                    JobMessageKind::Available | JobMessageKind::Other(_)
                ) {
                    continue;
                }
                if let Some(t) = known.get(&job.job_id) {
                    out.insert(job.job_id.clone(), t.clone());
                    continue;
                }
                let Ok(run) = u64::try_from(job.workflow_run_id) else {
                    continue;
                };
                wanted
                    .entry((job.owner_name.clone(), job.repository_name.clone(), run))
                    .or_default()
                    .push(job);
            }
        }
        let Some(github) = &self.github else {
            return out;
        };
        for ((owner, repo, run), jobs) in wanted {
            let listed =
                match tokio::time::timeout(self.timeout, github.list_run_jobs(&owner, &repo, run))
                    .await
                {
                    Ok(Ok(listed)) => listed,
                    Ok(Err(error)) => {
                        self.cannot_read(&format!("{owner}/{repo}"), run, &error.to_string());
                        continue;
                    }
                    Err(_) => {
                        self.cannot_read(&format!("{owner}/{repo}"), run, "timed out");
                        continue;
                    }
                };
            let mut known = self.known();
            let mut taken: HashSet<u64> = known.values().map(|t| t.job_id).collect();
            for job in jobs {
                let Some(rest) = pick(&listed, job, &taken) else {
                    continue;
                };
                let twin = Twin {
                    job_id: rest.id,
                    workflow_name: rest.workflow_name.clone().unwrap_or_default(),
                    run_attempt: rest.run_attempt.max(1),
                };
                taken.insert(rest.id);
                if known.len() >= MAX_KNOWN {
                    known.clear();
                }
                known.insert(job.job_id.clone(), twin.clone());
                out.insert(job.job_id.clone(), twin);
            }
        }
        out
    }

    /// Forgets the jobs of a message that completed on a runner.
    pub fn done(&self, message: &ScaleSetMessage) {
        let mut known = self.known();
        for job in &message.jobs {
            if matches!(job.kind, JobMessageKind::Completed) && !job.runner_name.is_empty() {
                known.remove(&job.job_id);
            }
        }
    }
}

/// The REST job a job message is: by its runner once it has one, else the
/// one job of its name still waiting for a runner (the lowest id first when
/// a run repeats a name), never one another message already claimed.
fn pick<'a>(
    listed: &'a [WorkflowJob],
    job: &JobMessage,
    taken: &HashSet<u64>,
) -> Option<&'a WorkflowJob> {
    let named = || {
        listed
            .iter()
            .filter(|w| w.name == job.job_display_name && !taken.contains(&w.id))
    };
    if !job.runner_name.is_empty()
        && let Some(w) = named().find(|w| w.runner_name.as_deref() == Some(&job.runner_name))
    {
        return Some(w);
    }
    let mut waiting: Vec<&WorkflowJob> = named()
        .filter(|w| matches!(job.kind, JobMessageKind::Assigned) == waiting_for_runner(&w.status))
        .collect();
    waiting.sort_by_key(|w| w.id);
    waiting.first().copied()
}
