//! The forge side of a runner: registering it just in time (GitHub JIT
//! config, GitLab runner token), asking whether it is busy, listing and
//! deleting it. One place that knows the pool's forge and scope.

use runyard_forge::api::ApiError;
use runyard_forge::api::github::{DeleteRunner, GitHubClient, GitHubScope};
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
    /// GitHub, when credentials are configured.
    pub github: Option<GitHubClient>,
    /// GitLab, when configured.
    pub gitlab: Option<GitLabClient>,
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
}

fn github_scope(scope: &Scope) -> GitHubScope {
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
    fn github(&self) -> Result<&GitHubClient, ForgeError> {
        self.github
            .as_ref()
            .ok_or(ForgeError::NotConfigured("GitHub"))
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
        let mut labels = pool.labels.clone();
        if pool.forge == "gitlab" {
            let gl = self.gitlab()?;
            let kind = gitlab_type(&pool.scope);
            let runner = patiently(|| gl.create_runner(kind, &labels, false, name)).await?;
            return Ok(Registration {
                jit_config: runner.token,
                runner_id: runner.id,
            });
        }
        labels.push(pool_label(&pool.name));
        let gh = self.github()?;
        let scope = github_scope(&pool.scope);
        let jit = || gh.generate_jitconfig(&scope, name, pool.runner_group_id, &labels, None);
        let first = patiently(jit).await;
        let jit = match first {
            Err(ApiError::Status { status: 409, .. }) => {
                // Left over from a failed attempt: it never ran a job.
                if let Some(old) = patiently(|| gh.list_runners(&scope))
                    .await?
                    .into_iter()
                    .find(|r| r.name == name)
                {
                    patiently(|| gh.delete_runner(&scope, old.id)).await?;
                }
                patiently(jit).await?
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
        if pool.forge == "gitlab" {
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
        let gh = self.github()?;
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
        if pool.forge == "gitlab" {
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
            .github()?
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
        if pool.forge == "gitlab" {
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
            .github()?
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
