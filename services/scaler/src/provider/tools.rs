//! The runner application builds GitHub offers a scope's runners (the
//! bootstrap JSON's `tools`), read from GitHub at most once an hour per
//! scope and shared by every create.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use runyard_forge::api::ApiError;
use runyard_forge::api::github::{GitHubClient, GitHubScope, RunnerDownload};

use crate::config::Scope;

/// How long a list is used before it is read again.
pub const TOOLS_TTL: Duration = Duration::from_secs(3600);

/// After a failed read, how long the list held (if any) is used before the
/// next try.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(60);

/// Runner downloads per GitHub scope.
#[derive(Debug)]
pub struct ToolsCache {
    ttl: Duration,
    entries: tokio::sync::Mutex<HashMap<GitHubScope, (Instant, Vec<RunnerDownload>)>>,
}

impl Default for ToolsCache {
    fn default() -> Self {
        Self::new(TOOLS_TTL)
    }
}

impl ToolsCache {
    /// A cache keeping lists `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// `scope`'s runner downloads: cached, else read from GitHub. When
    /// GitHub fails, a list read earlier is used (and read again a minute
    /// later); without one the error is returned. Creates asking at once
    /// wait for one read.
    pub async fn get(
        &self,
        github: &GitHubClient,
        scope: &GitHubScope,
    ) -> Result<Vec<RunnerDownload>, ApiError> {
        let mut entries = self.entries.lock().await;
        if let Some((read_at, list)) = entries.get(scope)
            && read_at.elapsed() < self.ttl
        {
            return Ok(list.clone());
        }
        match github.list_runner_downloads(scope).await {
            Ok(list) => {
                entries.insert(scope.clone(), (Instant::now(), list.clone()));
                Ok(list)
            }
            Err(error) => match entries.get_mut(scope) {
                Some((read_at, list)) => {
                    tracing::warn!(%error, %scope, "reading the runner downloads failed; using the list read before");
                    let retry = Instant::now()
                        .checked_sub(self.ttl.saturating_sub(RETRY_AFTER_FAILURE))
                        .unwrap_or_else(Instant::now);
                    *read_at = retry;
                    Ok(list.clone())
                }
                None => Err(error),
            },
        }
    }
}

/// The GitHub scope of a pool's `scope` (`None` for a GitLab scope).
pub fn github_scope(scope: &Scope) -> Option<GitHubScope> {
    if let Some(repo) = &scope.repo {
        let (owner, name) = repo.split_once('/')?;
        Some(GitHubScope::repo(owner, name))
    } else if let Some(org) = &scope.org {
        Some(GitHubScope::Org(org.clone()))
    } else {
        scope.enterprise.clone().map(GitHubScope::Enterprise)
    }
}
