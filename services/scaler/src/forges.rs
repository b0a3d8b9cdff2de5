//! The forge side of a runner: registering it just in time (GitHub JIT
//! config, GitLab runner token), asking whether it is busy, listing and
//! deleting it. One place that knows the pool's forge and scope, and which
//! GitHub credential serves it (enterprise runners need a personal access
//! token; every other scope uses the App when one is configured).
//!
//! A create never fails for a forge's rate limit: each GitHub call it makes,
//! and GitLab's runner registration, waits for its budget however long that
//! takes ([`Forges::wait_out`]), in the order the creates came, and is sent
//! when the budget returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runyard_events::Forge;
use runyard_forge::api::ApiError;
use runyard_forge::api::github::{DeleteRunner, GitHubClient, GitHubScope, RunnerGroup, endpoint};
use runyard_forge::api::gitlab::{GitLabClient, RunnerType};
use secrecy::SecretString;

use crate::config::{PoolConfig, Scope};

/// A registered runner.
#[derive(Debug)]
pub struct Registration {
    /// What the instance is started with (`{jit_config}`).
    pub jit_config: SecretString,
    /// The forge's runner id.
    pub runner_id: u64,
}

/// A runner as the forge lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForgeRunner {
    /// Forge id.
    pub id: u64,
    /// Name (the instance name).
    pub name: String,
    /// Connected.
    pub online: bool,
    /// Running a job (lags on GitHub; GitLab listings do not say, so
    /// `false` there).
    pub busy: bool,
    /// Paused: the forge hands it no new job (GitLab).
    pub paused: bool,
    /// The jobs it runs, when the forge names them (GitLab's runner read).
    pub running_jobs: Vec<u64>,
}

/// What a delete on the forge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unregistered {
    /// Gone (or was never there).
    Gone,
    /// The runner is running a job: it stays. GitLab names the jobs.
    Busy(Vec<u64>),
}

/// The forge clients.
#[derive(Debug, Clone, Default)]
pub struct Forges {
    /// GitHub, when credentials are configured: the App's client when App
    /// credentials are given, else the personal access token's.
    pub github: Option<GitHubClient>,
    /// The personal access token's client, when both a token and App
    /// credentials are given: it serves enterprise pools (GitHub's
    /// enterprise runner endpoints refuse installation tokens).
    pub github_pat: Option<GitHubClient>,
    /// GitLab, when configured.
    pub gitlab: Option<GitLabClient>,
    /// How often a create waiting for a spent GitHub budget reads
    /// `GET /rate_limit` (free) to learn whether it returned.
    pub rate_limit_probe: Duration,
    /// Creates waiting for a spent budget, per endpoint kind.
    pub waiting: Arc<Waiting>,
    /// The runner scale sets of `scale-set` pools, by pool name: their
    /// runners are registered, listed and removed through the scale set.
    pub scale_sets: Arc<HashMap<String, Arc<crate::scaleset::ScaleSet>>>,
}

/// Creates waiting for a forge's rate limit, one queue per endpoint kind
/// (so a spent `core` budget does not hold back JIT configs, which spend
/// `actions_runner_registration`). The first in a queue waits on the clock;
/// the others wait for their turn, so they are served in the order they
/// came when the budget returns.
#[derive(Debug, Default)]
pub struct Waiting {
    queues: Mutex<HashMap<&'static str, Arc<Queue>>>,
}

#[derive(Debug, Default)]
struct Queue {
    turn: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
    /// The forge whose budget it waits for (`github` / `gitlab`).
    forge: std::sync::OnceLock<&'static str>,
    /// When the forge said the budget returns, Unix seconds (0: unknown).
    until: std::sync::atomic::AtomicU64,
}

/// Creates waiting for one forge's spent budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spent {
    /// `github` / `gitlab`.
    pub forge: &'static str,
    /// The endpoint kind they wait on.
    pub endpoint: &'static str,
    /// How many wait.
    pub waiting: usize,
    /// When the budget returns, Unix seconds, if the forge said.
    pub until: Option<u64>,
}

/// Counts a caller in a queue for as long as it lives.
struct InQueue<'a>(&'a Queue);

impl<'a> InQueue<'a> {
    fn enter(q: &'a Queue) -> Self {
        q.waiting.fetch_add(1, Ordering::SeqCst);
        Self(q)
    }
}

impl Drop for InQueue<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Waiting {
    fn queue(&self, kind: &'static str) -> Arc<Queue> {
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(kind)
            .or_default()
            .clone()
    }

    /// Creates waiting now, over every queue.
    pub fn len(&self) -> usize {
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
            .map(|q| q.waiting.load(Ordering::SeqCst))
            .sum()
    }

    /// No create is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queues creates wait in now, by endpoint kind.
    pub fn spent(&self) -> Vec<Spent> {
        let queues = self
            .queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut spent: Vec<Spent> = queues
            .iter()
            .filter_map(|(kind, q)| {
                let waiting = q.waiting.load(Ordering::SeqCst);
                (waiting > 0).then(|| Spent {
                    forge: q.forge.get().copied().unwrap_or("github"),
                    endpoint: kind,
                    waiting,
                    until: Some(q.until.load(Ordering::SeqCst)).filter(|u| *u > 0),
                })
            })
            .collect();
        spent.sort_by_key(|s| s.endpoint);
        spent
    }
}

/// A forge call that failed.
#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    /// No client for the pool's forge.
    #[error("no {0} credentials configured")]
    NotConfigured(&'static str),
    /// The API failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A runner scale set refused (or is not usable yet).
    #[error("scale set: {0}")]
    ScaleSet(String),
}

pub(crate) fn github_scope(scope: &Scope) -> GitHubScope {
    if let Some(repo) = &scope.repo {
        let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
        GitHubScope::Repo {
            owner: owner.to_owned(),
            repo: name.to_owned(),
        }
    } else if let Some(org) = &scope.org {
        GitHubScope::Org(org.clone())
    } else {
        GitHubScope::Enterprise(scope.enterprise.clone().unwrap_or_default())
    }
}

fn gitlab_type(scope: &Scope) -> RunnerType {
    match (scope.group_id, scope.project_id) {
        (Some(g), _) => RunnerType::Group(g),
        (_, Some(p)) => RunnerType::Project(p),
        _ => RunnerType::Instance,
    }
}

/// The label every runyard runner carries on GitHub.
pub fn pool_label(pool: &str) -> String {
    format!("runyard-pool={pool}")
}

/// Whether `name` is an instance name of `pool`: `ry-<pool>-` and the 10
/// hex digits of [`runyard_events::instance_name`] (so pool `a` does not
/// claim pool `a-b`'s runners).
pub fn is_instance_of(name: &str, pool: &str) -> bool {
    name.strip_prefix("ry-")
        .and_then(|n| n.strip_prefix(pool))
        .and_then(|n| n.strip_prefix('-'))
        .is_some_and(|h| h.len() == 10 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The queue of GitLab runner registrations waiting for a budget.
const GITLAB_CREATE_RUNNER: &str = "gitlab_create_runner";

/// Rate-limited calls wait and go again this many times before the error
/// counts (a rate limit is the forge asking for patience, not a failure).
const RATE_LIMIT_PATIENCE: u32 = 8;

/// Runs `call`, waiting out rate limits (at most a minute each).
async fn patiently<T, F, Fut>(mut call: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let mut waited = 0;
    loop {
        match call().await {
            Err(ApiError::RateLimited { retry_after }) if waited < RATE_LIMIT_PATIENCE => {
                waited += 1;
                let jitter = retry_after.mul_f64(rand::random::<f64>() * 0.2);
                tracing::warn!(
                    wait_ms = (retry_after + jitter).as_millis() as u64,
                    "forge rate limit; waiting"
                );
                tokio::time::sleep((retry_after + jitter).min(std::time::Duration::from_secs(60)))
                    .await;
            }
            other => return other,
        }
    }
}

impl Forges {
    /// The GitHub client serving `scope`: the personal access token's for
    /// an enterprise when both kinds of credentials are given, else the one
    /// configured.
    pub fn github_for(&self, scope: &Scope) -> Result<&GitHubClient, ForgeError> {
        let pat = self
            .github_pat
            .as_ref()
            .filter(|_| scope.enterprise.is_some());
        pat.or(self.github.as_ref())
            .ok_or(ForgeError::NotConfigured("GitHub"))
    }

    /// Runs a GitHub call a create makes, waiting out GitHub's rate limit
    /// for as long as it takes: a spent budget is not a failed attempt.
    /// Calls that find others already waiting on the same endpoint kind
    /// queue behind them, so creates are served in the order they came.
    /// The first in the queue sleeps until the budget's reset, reading
    /// `GET /rate_limit` (which costs nothing) every
    /// [`Forges::rate_limit_probe`] meanwhile to learn of its return.
    pub async fn wait_out<T, F, Fut>(
        &self,
        github: &GitHubClient,
        scope: &GitHubScope,
        kind: &'static str,
        call: F,
    ) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        self.in_line("github", kind, call, || async move {
            if let Err(error) = github.refresh_rate_limits(scope).await {
                tracing::debug!(%error, "reading the rate limits failed");
            }
        })
        .await
    }

    /// [`Forges::wait_out`] for GitLab, which has no free endpoint that
    /// tells a budget's return: the first in the queue sends the call again
    /// when `Retry-After` (or its `RateLimit-Reset`) has passed, at least
    /// every [`Forges::rate_limit_probe`].
    async fn gitlab_wait_out<T, F, Fut>(&self, kind: &'static str, call: F) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        self.in_line("gitlab", kind, call, || std::future::ready(()))
            .await
    }

    /// Sends `call`; when it is rate limited, or others already wait on
    /// `kind`, waits in `kind`'s queue and sends it again until the answer
    /// is not a rate limit. `probe` runs after a nap shorter than the
    /// announced wait, to learn early whether the budget returned.
    async fn in_line<T, F, Fut, P, PFut>(
        &self,
        forge: &'static str,
        kind: &'static str,
        mut call: F,
        probe: P,
    ) -> Result<T, ApiError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
        P: Fn() -> PFut,
        PFut: Future<Output = ()>,
    {
        let queue = self.waiting.queue(kind);
        let _ = queue.forge.set(forge);
        if queue.waiting.load(Ordering::SeqCst) == 0 {
            match call().await {
                Err(ApiError::RateLimited { .. }) => {}
                other => return other,
            }
        }
        let _in_queue = InQueue::enter(&queue);
        let _turn = queue.turn.lock().await;
        let every = if self.rate_limit_probe.is_zero() {
            Duration::from_secs(60)
        } else {
            self.rate_limit_probe
        };
        loop {
            match call().await {
                Err(ApiError::RateLimited { retry_after }) => {
                    // Never a busy loop: a reset dated in the past of our
                    // clock reads as "retry after 0".
                    let floor = every.min(Duration::from_secs(1));
                    let nap = retry_after.clamp(floor, every);
                    let unix = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap_or_default();
                    queue
                        .until
                        .store((unix + retry_after).as_secs(), Ordering::SeqCst);
                    tracing::info!(
                        endpoint = kind,
                        retry_after_s = retry_after.as_secs(),
                        waiting = queue.waiting.load(Ordering::SeqCst),
                        "forge budget spent; the create waits for it"
                    );
                    tokio::time::sleep(nap).await;
                    if retry_after > nap {
                        probe().await;
                    }
                }
                other => return other,
            }
        }
    }

    fn gitlab(&self) -> Result<&GitLabClient, ForgeError> {
        self.gitlab
            .as_ref()
            .ok_or(ForgeError::NotConfigured("GitLab"))
    }

    /// Registers runner `name` for `pool`. On GitHub a runner of that name
    /// left by an earlier attempt is removed first (JIT names are unique).
    pub async fn register(
        &self,
        pool: &PoolConfig,
        name: &str,
    ) -> Result<Registration, ForgeError> {
        if let Some(set) = self.scale_sets.get(&pool.name) {
            return set.register(name).await;
        }
        let mut labels = pool.labels.clone();
        if pool.forge == Forge::Gitlab {
            let gl = self.gitlab()?;
            let kind = gitlab_type(&pool.scope);
            let runner = self
                .gitlab_wait_out(GITLAB_CREATE_RUNNER, || {
                    gl.create_runner(kind, &labels, false, name)
                })
                .await?;
            return Ok(Registration {
                jit_config: runner.token,
                runner_id: runner.id,
            });
        }
        labels.push(pool_label(&pool.name));
        let gh = self.github_for(&pool.scope)?;
        let scope = github_scope(&pool.scope);
        let jit = || gh.generate_jitconfig(&scope, name, pool.runner_group_id, &labels, None);
        let first = self
            .wait_out(gh, &scope, endpoint::GENERATE_JITCONFIG, jit)
            .await;
        let jit = match first {
            Err(ApiError::Status { status: 409, .. }) => {
                // Left over from a failed attempt: it never ran a job.
                let listed = self
                    .wait_out(gh, &scope, endpoint::LIST_RUNNERS, || {
                        gh.list_runners(&scope)
                    })
                    .await?;
                if let Some(old) = listed.into_iter().find(|r| r.name == name) {
                    self.wait_out(gh, &scope, endpoint::DELETE_RUNNER, || {
                        gh.delete_runner(&scope, old.id)
                    })
                    .await?;
                }
                self.wait_out(gh, &scope, endpoint::GENERATE_JITCONFIG, jit)
                    .await?
            }
            other => other?,
        };
        Ok(Registration {
            jit_config: jit.encoded_jit_config,
            runner_id: jit.runner_id,
        })
    }

    /// Removes a runner from the forge; `Busy` when it runs a job.
    ///
    /// GitHub refuses to delete a busy runner (422). GitLab deletes any
    /// runner, killing the job it runs, so a GitLab runner is paused first
    /// (GitLab hands a paused runner no new job), then asked for its
    /// running jobs, and deleted only when it runs none; otherwise it stays
    /// (paused) and is `Busy`, to go once its job is done.
    pub async fn unregister(
        &self,
        pool: &PoolConfig,
        runner_id: u64,
    ) -> Result<Unregistered, ForgeError> {
        if let Some(set) = self.scale_sets.get(&pool.name) {
            return set.unregister(runner_id).await;
        }
        if pool.forge == Forge::Gitlab {
            let gl = self.gitlab()?;
            if !patiently(|| gl.pause_runner(runner_id)).await? {
                return Ok(Unregistered::Gone);
            }
            match patiently(|| gl.running_jobs(runner_id)).await? {
                None => return Ok(Unregistered::Gone),
                Some(jobs) if !jobs.is_empty() => {
                    tracing::info!(
                        runner_id,
                        job_id = jobs[0].id,
                        running = jobs.len(),
                        "gitlab runner busy; paused, not deleted"
                    );
                    return Ok(Unregistered::Busy(jobs.iter().map(|j| j.id).collect()));
                }
                Some(_) => {}
            }
            patiently(|| gl.delete_runner(runner_id)).await?;
            return Ok(Unregistered::Gone);
        }
        let scope = github_scope(&pool.scope);
        let gh = self.github_for(&pool.scope)?;
        Ok(
            match patiently(|| gh.delete_runner(&scope, runner_id)).await? {
                DeleteRunner::Busy => Unregistered::Busy(Vec::new()),
                DeleteRunner::Deleted | DeleteRunner::NotFound => Unregistered::Gone,
            },
        )
    }

    /// One runner's state; `None` when the forge no longer has it.
    pub async fn runner(
        &self,
        pool: &PoolConfig,
        runner_id: u64,
    ) -> Result<Option<ForgeRunner>, ForgeError> {
        if let Some(set) = self.scale_sets.get(&pool.name) {
            return set.runner(runner_id).await;
        }
        if pool.forge == Forge::Gitlab {
            // GitLab's runner says whether it exists, is online and paused;
            // its running jobs whether it is busy.
            let gl = self.gitlab()?;
            let Some(info) = patiently(|| gl.get_runner(runner_id)).await? else {
                return Ok(None);
            };
            let Some(running) = patiently(|| gl.running_jobs(runner_id)).await? else {
                return Ok(None);
            };
            return Ok(Some(ForgeRunner {
                id: info.id,
                paused: info.is_paused(),
                name: info.description,
                online: info.online,
                busy: !running.is_empty(),
                running_jobs: running.iter().map(|j| j.id).collect(),
            }));
        }
        let scope = github_scope(&pool.scope);
        Ok(self
            .github_for(&pool.scope)?
            .get_runner(&scope, runner_id)
            .await?
            .map(|r| ForgeRunner {
                id: r.id,
                name: r.name,
                online: r.status == "online",
                busy: r.busy,
                paused: false,
                running_jobs: Vec::new(),
            }))
    }

    /// The pool's runners on the forge. GitHub: those carrying the pool's
    /// label. GitLab: those of the pool's scope carrying its tags whose
    /// description is one of the pool's instance names
    /// (`ry-<pool>-<10 hex>`); a listing does not say whether a runner is
    /// busy (`busy` is false: a removal asks for its jobs).
    pub async fn list(&self, pool: &PoolConfig) -> Result<Vec<ForgeRunner>, ForgeError> {
        if let Some(set) = self.scale_sets.get(&pool.name) {
            return set.list().await;
        }
        if pool.forge == Forge::Gitlab {
            let gl = self.gitlab()?;
            let kind = gitlab_type(&pool.scope);
            return Ok(patiently(|| gl.list_runners(kind, &pool.labels))
                .await?
                .into_iter()
                .filter(|r| is_instance_of(&r.description, &pool.name))
                .map(|r| ForgeRunner {
                    id: r.id,
                    paused: r.is_paused(),
                    name: r.description,
                    online: r.online,
                    busy: false,
                    running_jobs: Vec::new(),
                })
                .collect());
        }
        let label = pool_label(&pool.name);
        let scope = github_scope(&pool.scope);
        Ok(self
            .github_for(&pool.scope)?
            .list_runners(&scope)
            .await?
            .into_iter()
            .filter(|r| r.labels.contains(&label))
            .map(|r| ForgeRunner {
                id: r.id,
                name: r.name,
                online: r.status == "online",
                busy: r.busy,
                paused: false,
                running_jobs: Vec::new(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names_are_told_from_other_runners() {
        let name = runyard_events::instance_name("gl-docker", "gitlab.gl_example_com.7.1");
        assert!(is_instance_of(&name, "gl-docker"));
        assert!(!is_instance_of(&name, "gl"), "another pool's prefix");
        assert!(!is_instance_of("ry-gl-docker-0123", "gl-docker"));
        assert!(!is_instance_of("ry-gl-docker-0123456789x", "gl-docker"));
        assert!(!is_instance_of("ry-gl-docker-ABCDEF0123", "gl-docker"));
        assert!(!is_instance_of("k8s-runner-large-a", "gl-docker"));
        assert!(!is_instance_of("gl-docker-0123456789", "gl-docker"));
    }
}

/// A pool whose runner group GitHub says cannot serve it.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The group is not among the scope's runner groups.
    #[error(
        "pool {pool:?}: runner_group_id {group} is not a runner group of {scope} (its groups: {known}); a JIT config for it would be refused"
    )]
    Missing {
        /// Pool name.
        pool: String,
        /// The configured group id.
        group: u64,
        /// Where it was looked for.
        scope: String,
        /// The groups there, `id name` each.
        known: String,
    },
    /// The group admits selected repositories only, not the pool's.
    #[error(
        "pool {pool:?}: runner group {group} ({name}) admits only selected repositories and {repo} is not one of them; its runners would never get that repository's jobs (allow the repository in the group, or pick another group)"
    )]
    RepoNotAdmitted {
        /// Pool name.
        pool: String,
        /// Group id.
        group: u64,
        /// Group name.
        name: String,
        /// The pool's repository.
        repo: String,
    },
}

impl Forges {
    /// Checks each GitHub pool's `runner_group_id` against the runner
    /// groups of its organization or enterprise (a repository pool: its
    /// owner's organization), and for a repository pool whose group admits
    /// selected repositories only, that its repository is one of them.
    ///
    /// A group GitHub does not have, or one that shuts out the pool's
    /// repository, is an error: its runners could never take a job. An org
    /// or enterprise pool whose group admits selected repositories only is
    /// logged (which repositories send it jobs is not known here). When the
    /// groups cannot be read (no permission, the forge down, a user-owned
    /// repository, which has no groups) the check is skipped with a warning:
    /// the start does not depend on it.
    ///
    /// Returns, for each organization pool whose group admits selected
    /// repositories only, those repositories (lower-cased): jobs of any
    /// other repository never reach its runners, so the policy does not
    /// send them there.
    pub async fn check_runner_groups(
        &self,
        pools: &[PoolConfig],
    ) -> Result<HashMap<String, Vec<String>>, GroupError> {
        let mut admitted: HashMap<String, Vec<String>> = HashMap::new();
        let mut groups: HashMap<GitHubScope, Option<Vec<RunnerGroup>>> = HashMap::new();
        // Scale-set pools name their group by name and the scale set is
        // made in it: the service applies the group's rules itself.
        for pool in pools
            .iter()
            .filter(|p| p.forge != Forge::Gitlab && p.scale_set().is_none())
        {
            let Ok(gh) = self.github_for(&pool.scope) else {
                continue;
            };
            let (owner_scope, repo) = match github_scope(&pool.scope) {
                GitHubScope::Repo { owner, repo } => (
                    GitHubScope::Org(owner.clone()),
                    Some(format!("{owner}/{repo}")),
                ),
                other => (other, None),
            };
            if !groups.contains_key(&owner_scope) {
                let listed = match gh.list_runner_groups(&owner_scope).await {
                    Ok(list) => Some(list),
                    Err(error) => {
                        tracing::warn!(pool = %pool.name, scope = %owner_scope, %error, "could not read the runner groups; the pool's runner_group_id is not checked");
                        None
                    }
                };
                groups.insert(owner_scope.clone(), listed);
            }
            let Some(Some(list)) = groups.get(&owner_scope) else {
                continue;
            };
            let Some(group) = list.iter().find(|g| g.id == pool.runner_group_id) else {
                return Err(GroupError::Missing {
                    pool: pool.name.clone(),
                    group: pool.runner_group_id,
                    scope: owner_scope.to_string(),
                    known: list
                        .iter()
                        .map(|g| format!("{} {}", g.id, g.name))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            if group.visibility != "selected" {
                continue;
            }
            let (Some(repo), GitHubScope::Org(org)) = (&repo, &owner_scope) else {
                if let GitHubScope::Org(org) = &owner_scope {
                    match gh.list_runner_group_repos(org, group.id).await {
                        Ok(repos) => {
                            tracing::info!(pool = %pool.name, group = group.id, group_name = %group.name, repositories = repos.len(), "the pool's runner group admits selected repositories only: jobs of other repositories go to other pools");
                            admitted.insert(
                                pool.name.clone(),
                                repos.iter().map(|r| r.to_ascii_lowercase()).collect(),
                            );
                        }
                        Err(error) => {
                            tracing::warn!(pool = %pool.name, group = group.id, %error, "could not read the runner group's repositories: jobs of repositories it does not admit may get runners that never run them");
                        }
                    }
                } else {
                    tracing::warn!(pool = %pool.name, group = group.id, group_name = %group.name, "the pool's runner group admits selected repositories only: jobs of other repositories never reach its runners");
                }
                continue;
            };
            match gh.list_runner_group_repos(org, group.id).await {
                Ok(repos) if !repos.iter().any(|r| r.eq_ignore_ascii_case(repo)) => {
                    return Err(GroupError::RepoNotAdmitted {
                        pool: pool.name.clone(),
                        group: group.id,
                        name: group.name.clone(),
                        repo: repo.clone(),
                    });
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(pool = %pool.name, group = group.id, %error, "could not read the runner group's repositories; not checked");
                }
            }
        }
        Ok(admitted)
    }
}
