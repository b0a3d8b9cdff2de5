//! What the console asks other services, read-only: the scaler's queue
//! (`GET /v1/queue`: why each job has no runner, in the scaler's own
//! terms) and pools (`GET /v1/pools`), and the allocator's current
//! recommendation for a workload (a `Recommend` marked `preview`, which
//! publishes nothing and counts nothing). Every call is bounded by a
//! timeout; a service that does not answer makes its part of a page say
//! so, never the whole page fail.

use std::collections::BTreeMap;
use std::time::Duration;

use runyard_allocator_api::client::Client;
use runyard_allocator_api::{RecommendRequest, Recommendation};
use serde::Deserialize;

/// How long a page waits for another service.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// One job of the scaler's queue (`core::queue::QueuedJob`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QueuedJob {
    /// `github` / `gitlab`.
    pub forge: String,
    /// The forge's host.
    pub instance: String,
    /// The forge's job id.
    pub job_id: i64,
    /// Attempt.
    #[serde(default)]
    pub run_attempt: u32,
    /// Repository / project.
    #[serde(default)]
    pub project: String,
    /// Job name.
    #[serde(default)]
    pub name: String,
    /// Labels.
    #[serde(default)]
    pub labels: Vec<String>,
    /// `queued` or `waiting`.
    pub status: String,
    /// Seconds since it was queued.
    #[serde(default)]
    pub age_seconds: f64,
    /// The pool it waits in.
    pub pool: Option<String>,
    /// Why it has no runner: the scaler's word.
    pub reason: String,
    /// The same in words, with its numbers.
    #[serde(default)]
    pub detail: String,
    /// The runner made for it.
    pub runner: Option<String>,
}

/// The scaler's queue.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Queue {
    /// When the scaler made the view (Unix seconds).
    #[serde(default)]
    pub as_of: f64,
    /// Oldest first.
    pub jobs: Vec<QueuedJob>,
}

/// One pool's numbers (`core::policy::PoolStatus`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct PoolNumbers {
    /// The pool.
    pub name: String,
    /// Runners it should have.
    #[serde(default)]
    pub desired: u32,
    /// Runners alive.
    #[serde(default)]
    pub actual: u32,
    /// Online and waiting for a job.
    #[serde(default)]
    pub idle: u32,
    /// Being created or booting.
    #[serde(default)]
    pub creating: u32,
    /// Running a job.
    #[serde(default)]
    pub busy: u32,
    /// Jobs waiting for it.
    #[serde(default)]
    pub queued: u32,
    /// `max_runners`.
    #[serde(default)]
    pub max_runners: u32,
    /// `min_idle`.
    #[serde(default)]
    pub min_idle: u32,
}

#[derive(Debug, Deserialize)]
struct Pools {
    pools: Vec<PoolNumbers>,
}

/// Why another service's answer is missing.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// The scaler's HTTP API.
#[derive(Debug, Clone)]
pub struct Scaler {
    http: reqwest::Client,
    base: String,
}

impl Scaler {
    /// A client of the scaler at `base` (`http://scaler:8083`).
    pub fn new(http: reqwest::Client, base: &str) -> Self {
        Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<T, Unavailable> {
        let url = format!("{}{path}", self.base);
        let shown = runyard_config::redact::url(&url);
        let answer = self
            .http
            .get(&url)
            .timeout(TIMEOUT)
            .send()
            .await
            .map_err(|e| {
                Unavailable(format!(
                    "the scaler ({shown}) did not answer: {}",
                    e.without_url()
                ))
            })?;
        if !answer.status().is_success() {
            return Err(Unavailable(format!(
                "the scaler ({shown}) answered {}",
                answer.status()
            )));
        }
        answer.json().await.map_err(|e| {
            Unavailable(format!(
                "the scaler's answer ({shown}) is unreadable: {}",
                e.without_url()
            ))
        })
    }

    /// `GET /v1/queue`.
    pub async fn queue(&self) -> Result<Queue, Unavailable> {
        self.get("/v1/queue").await
    }

    /// `GET /v1/pools`: each pool's numbers.
    pub async fn pools(&self) -> Result<Vec<PoolNumbers>, Unavailable> {
        self.get::<Pools>("/v1/pools").await.map(|p| p.pools)
    }
}

/// The allocator, asked for previews only.
#[derive(Debug, Clone)]
pub struct Allocator {
    client: Option<Client>,
}

impl Allocator {
    /// A client of the allocator (`None`: not configured).
    pub fn new(client: Option<Client>) -> Self {
        Self { client }
    }

    /// The recommendation the workload `attributes` would get now, asked
    /// as a preview (no event, no counter).
    pub async fn preview(
        &self,
        attributes: &BTreeMap<String, String>,
    ) -> Result<Recommendation, Unavailable> {
        let Some(client) = &self.client else {
            return Err(Unavailable(
                "no allocator is configured (RUNYARD_ALLOCATOR_URL)".into(),
            ));
        };
        client
            .recommend(
                RecommendRequest {
                    workload: attributes.clone().into_iter().collect(),
                    r#ref: String::new(),
                    retry_of: None,
                    preview: true,
                },
                None,
            )
            .await
            .map_err(|s| Unavailable(format!("the allocator did not answer: {}", s.message())))
    }
}
