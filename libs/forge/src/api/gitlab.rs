//! GitLab REST client (`/api/v4`): runners created through the API for
//! ephemeral `run-single` runners (and read, paused, listed and deleted),
//! jobs for the reconciler, pipelines and retries for OOM retries.
//! Authenticates with `PRIVATE-TOKEN`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use time::OffsetDateTime;

use super::ratelimit::Bucket;
use super::{ApiError, CallCounts, ClientOptions, Core, Raw, lenient_time, null_default, seg};

/// Largest page GitLab serves.
const PER_PAGE: u32 = 100;

/// Bound on the pages one listing follows (10 000 items).
const MAX_PAGES: u32 = 100;

/// Endpoint kinds, as counted in [`CallCounts`] and named in
/// [`ApiError::Status`].
pub mod endpoint {
    /// `POST /user/runners`.
    pub const CREATE_RUNNER: &str = "gitlab_create_runner";
    /// `DELETE /runners/:id`.
    pub const DELETE_RUNNER: &str = "gitlab_delete_runner";
    /// `GET /runners/:id`.
    pub const GET_RUNNER: &str = "gitlab_get_runner";
    /// `PUT /runners/:id` (`paused`).
    pub const PAUSE_RUNNER: &str = "gitlab_pause_runner";
    /// `GET /runners/:id/jobs?status=running`.
    pub const RUNNER_JOBS: &str = "gitlab_runner_jobs";
    /// `GET /runners/all`, `/groups/:id/runners`, `/projects/:id/runners`.
    pub const LIST_RUNNERS: &str = "gitlab_list_runners";
    /// `GET /projects/:id/jobs/:job_id`.
    pub const GET_JOB: &str = "gitlab_get_job";
    /// `GET /projects/:id/jobs?scope[]=pending`.
    pub const LIST_PENDING_JOBS: &str = "gitlab_list_pending_jobs";
    /// `POST /projects/:id/pipeline`.
    pub const CREATE_PIPELINE: &str = "gitlab_create_pipeline";
    /// `POST /projects/:id/jobs/:job_id/retry`.
    pub const RETRY_JOB: &str = "gitlab_retry_job";
    /// `POST /projects/:id/pipelines/:pipeline_id/retry`.
    pub const RETRY_PIPELINE: &str = "gitlab_retry_pipeline";
    /// `GET /projects/:id/pipelines/:pipeline_id`.
    pub const GET_PIPELINE: &str = "gitlab_get_pipeline";
    /// `GET /projects/:id/pipelines?ref=...&source=...`.
    pub const LIST_PIPELINES: &str = "gitlab_list_pipelines";
    /// `GET /projects/:id/pipelines/:pipeline_id/variables`.
    pub const PIPELINE_VARIABLES: &str = "gitlab_pipeline_variables";

    /// Every kind.
    pub const ALL: &[&str] = &[
        CREATE_RUNNER,
        DELETE_RUNNER,
        GET_RUNNER,
        PAUSE_RUNNER,
        RUNNER_JOBS,
        LIST_RUNNERS,
        GET_JOB,
        LIST_PENDING_JOBS,
        CREATE_PIPELINE,
        RETRY_JOB,
        RETRY_PIPELINE,
        GET_PIPELINE,
        LIST_PIPELINES,
        PIPELINE_VARIABLES,
    ];
}

/// Where a runner is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunnerType {
    /// Instance-wide (needs an administrator's token).
    Instance,
    /// A group, by id.
    Group(u64),
    /// A project, by id.
    Project(u64),
}

/// A runner created through the API.
#[derive(Debug, Clone)]
pub struct GitLabRunner {
    /// Runner id (for delete).
    pub id: u64,
    /// The runner authentication token (`glrt-...`), a credential.
    pub token: SecretString,
    /// When the token expires, if it does.
    pub token_expires_at: Option<OffsetDateTime>,
}

/// A runner as GitLab shows it (`GET /runners/:id` and the listings).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunnerInfo {
    /// Runner id.
    pub id: u64,
    /// Description (runyard's: the instance name).
    #[serde(default, deserialize_with = "null_default")]
    pub description: String,
    /// Paused (GitLab 14.8 and later).
    #[serde(default)]
    pub paused: Option<bool>,
    /// Not paused (what older GitLab says instead of `paused`).
    #[serde(default)]
    pub active: Option<bool>,
    /// Contacted GitLab lately.
    #[serde(default, deserialize_with = "null_default")]
    pub online: bool,
    /// `online`, `offline`, `stale`, `never_contacted`.
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// `instance_type`, `group_type`, `project_type`.
    #[serde(default, deserialize_with = "null_default")]
    pub runner_type: String,
}

impl RunnerInfo {
    /// Whether GitLab hands it no new job.
    pub fn is_paused(&self) -> bool {
        self.paused.unwrap_or(false) || self.active == Some(false)
    }
}

/// A CI job.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GitLabJob {
    /// Job (build) id.
    pub id: u64,
    /// `created`, `pending`, `running`, `success`, `failed`, `canceled`,
    /// `skipped`, `manual`, ...
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// Stage.
    #[serde(default, deserialize_with = "null_default")]
    pub stage: String,
    /// Job name.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// Branch or tag.
    #[serde(rename = "ref", default, deserialize_with = "null_default")]
    pub git_ref: String,
    /// Whether `ref` is a tag.
    #[serde(default, deserialize_with = "null_default")]
    pub tag: bool,
    /// The job's `tags:` (what a runner must carry).
    #[serde(default, deserialize_with = "null_default")]
    pub tag_list: Vec<String>,
    /// Its pipeline's id.
    #[serde(default, rename = "pipeline", deserialize_with = "pipeline_id")]
    pub pipeline_id: Option<u64>,
    /// Created.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub created_at: Option<OffsetDateTime>,
    /// Started.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub started_at: Option<OffsetDateTime>,
    /// Finished.
    #[serde(default, deserialize_with = "lenient_time::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// Why it failed, once it did.
    #[serde(default)]
    pub failure_reason: Option<String>,
    /// Whether a failure is allowed.
    #[serde(default, deserialize_with = "null_default")]
    pub allow_failure: bool,
    /// The runner that took it, once one did.
    #[serde(default)]
    pub runner: Option<JobRunner>,
    /// Web page.
    #[serde(default)]
    pub web_url: Option<String>,
}

/// The runner a job ran on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobRunner {
    /// Runner id.
    pub id: u64,
    /// Runner description.
    #[serde(default)]
    pub description: Option<String>,
}

/// A pipeline.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct GitLabPipeline {
    /// Pipeline id.
    pub id: u64,
    /// Commit it runs.
    #[serde(default, deserialize_with = "null_default")]
    pub sha: String,
    /// Branch or tag.
    #[serde(rename = "ref", default, deserialize_with = "null_default")]
    pub git_ref: String,
    /// Status.
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// Web page.
    #[serde(default, deserialize_with = "null_default")]
    pub web_url: String,
}

/// A job's `pipeline: {id, ...}` as its id.
fn pipeline_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    struct P {
        id: u64,
    }
    Ok(Option::<P>::deserialize(d)?.map(|p| p.id))
}

/// GitLab REST client. Cheap to clone; clones share the rate-limit state and
/// the call counters.
#[derive(Clone)]
pub struct GitLabClient {
    inner: Arc<Inner>,
}

struct Inner {
    core: Core,
    token: SecretString,
}

impl fmt::Debug for GitLabClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitLabClient")
            .field("base_url", &self.inner.core.base().as_str())
            .finish_non_exhaustive()
    }
}

impl GitLabClient {
    /// A client for the instance at `base_url` (`https://gitlab.example.com`,
    /// without `/api/v4`), each request bounded by `timeout`.
    pub fn new(base_url: &str, token: SecretString, timeout: Duration) -> Result<Self, ApiError> {
        Self::with_options(base_url, token, &ClientOptions::new(timeout))
    }

    /// A client with every option spelled out.
    pub fn with_options(
        base_url: &str,
        token: SecretString,
        options: &ClientOptions,
    ) -> Result<Self, ApiError> {
        let core = Core::new(base_url, options, endpoint::ALL)?;
        Ok(Self {
            inner: Arc::new(Inner { core, token }),
        })
    }

    /// Requests sent so far, per endpoint kind ([`endpoint`]).
    pub fn calls(&self) -> CallCounts {
        self.inner.core.calls()
    }

    /// The rate-limit budget GitLab last announced (`RateLimit-Remaining`,
    /// counted down locally since), when it announces one.
    pub fn rate_limit_remaining(&self) -> Option<u64> {
        self.inner.core.rate_limit_remaining()
    }

    /// Creates a runner (`POST /user/runners`) and returns its id and
    /// authentication token.
    pub async fn create_runner(
        &self,
        runner_type: RunnerType,
        tag_list: &[String],
        run_untagged: bool,
        description: &str,
    ) -> Result<GitLabRunner, ApiError> {
        #[derive(Deserialize)]
        struct Answer {
            id: u64,
            token: String,
            #[serde(default, deserialize_with = "lenient_time::option")]
            token_expires_at: Option<OffsetDateTime>,
        }
        let mut body = serde_json::json!({
            "tag_list": tag_list,
            "run_untagged": run_untagged,
            "description": description,
        });
        let fields = match runner_type {
            RunnerType::Instance => vec![("runner_type", serde_json::json!("instance_type"))],
            RunnerType::Group(id) => vec![
                ("runner_type", serde_json::json!("group_type")),
                ("group_id", serde_json::json!(id)),
            ],
            RunnerType::Project(id) => vec![
                ("runner_type", serde_json::json!("project_type")),
                ("project_id", serde_json::json!(id)),
            ],
        };
        if let Some(obj) = body.as_object_mut() {
            for (k, v) in fields {
                obj.insert(k.to_owned(), v);
            }
        }
        let ep = endpoint::CREATE_RUNNER;
        let raw = self
            .send(ep, Method::POST, "/user/runners", Some(body))
            .await?
            .success(ep)?;
        let a: Answer = raw.json(ep, true)?;
        Ok(GitLabRunner {
            id: a.id,
            token: SecretString::from(a.token),
            token_expires_at: a.token_expires_at,
        })
    }

    /// Deletes a runner; one that does not exist (`404`) counts as deleted.
    pub async fn delete_runner(&self, runner_id: u64) -> Result<(), ApiError> {
        let ep = endpoint::DELETE_RUNNER;
        let raw = self
            .send(ep, Method::DELETE, &format!("/runners/{runner_id}"), None)
            .await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        raw.success(ep).map(drop)
    }

    /// One job of a project (with its `tag_list`).
    pub async fn get_job(&self, project_id: u64, job_id: u64) -> Result<GitLabJob, ApiError> {
        self.get_json(
            endpoint::GET_JOB,
            &format!("/projects/{project_id}/jobs/{job_id}"),
        )
        .await
    }

    /// The project's pending jobs, all pages (`x-next-page`).
    pub async fn list_pending_jobs(&self, project_id: u64) -> Result<Vec<GitLabJob>, ApiError> {
        self.all_pages(
            endpoint::LIST_PENDING_JOBS,
            &format!("/projects/{project_id}/jobs?scope%5B%5D=pending"),
        )
        .await
    }

    /// One runner; `None` when GitLab has none of that id.
    pub async fn get_runner(&self, runner_id: u64) -> Result<Option<RunnerInfo>, ApiError> {
        let ep = endpoint::GET_RUNNER;
        let raw = self
            .send(ep, Method::GET, &format!("/runners/{runner_id}"), None)
            .await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        raw.success(ep)?.json(ep, false).map(Some)
    }

    /// Pauses a runner (`PUT /runners/:id` with `paused: true`): GitLab
    /// hands it no new job from then on. False when the runner is gone.
    pub async fn pause_runner(&self, runner_id: u64) -> Result<bool, ApiError> {
        let ep = endpoint::PAUSE_RUNNER;
        let raw = self
            .send(
                ep,
                Method::PUT,
                &format!("/runners/{runner_id}"),
                Some(serde_json::json!({"paused": true})),
            )
            .await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        raw.success(ep).map(|_| true)
    }

    /// The jobs a runner is running (the first page, up to 100: enough to
    /// tell busy from idle); `None` when the runner is gone.
    pub async fn running_jobs(&self, runner_id: u64) -> Result<Option<Vec<GitLabJob>>, ApiError> {
        let ep = endpoint::RUNNER_JOBS;
        let path = format!("/runners/{runner_id}/jobs?status=running&per_page={PER_PAGE}");
        let raw = self.send(ep, Method::GET, &path, None).await?;
        if raw.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        raw.success(ep)?.json(ep, false).map(Some)
    }

    /// The runners of a scope carrying every tag of `tag_list`, all pages:
    /// `GET /runners/all` (instance runners, an administrator's token),
    /// `/groups/:id/runners` or `/projects/:id/runners`, each narrowed to
    /// the scope's own `type`.
    pub async fn list_runners(
        &self,
        scope: RunnerType,
        tag_list: &[String],
    ) -> Result<Vec<RunnerInfo>, ApiError> {
        let base = match scope {
            RunnerType::Instance => "/runners/all?type=instance_type".to_owned(),
            RunnerType::Group(id) => format!("/groups/{id}/runners?type=group_type"),
            RunnerType::Project(id) => format!("/projects/{id}/runners?type=project_type"),
        };
        let tags: Vec<String> = tag_list.iter().map(|t| seg(t)).collect();
        let path = if tags.is_empty() {
            base
        } else {
            format!("{base}&tag_list={}", tags.join(","))
        };
        self.all_pages(endpoint::LIST_RUNNERS, &path).await
    }

    /// Every page of a listing (`path` has a query already), following
    /// `x-next-page` up to [`MAX_PAGES`].
    async fn all_pages<T: DeserializeOwned>(
        &self,
        ep: &'static str,
        path: &str,
    ) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        let mut page = 1u32;
        for _ in 0..MAX_PAGES {
            let path = format!("{path}&per_page={PER_PAGE}&page={page}");
            let raw = self.send(ep, Method::GET, &path, None).await?.success(ep)?;
            let batch: Vec<T> = raw.json(ep, false)?;
            let next = raw
                .headers
                .get("x-next-page")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u32>().ok());
            let empty = batch.is_empty();
            out.extend(batch);
            match next {
                Some(n) if n > page && !empty => page = n,
                _ => return Ok(out),
            }
        }
        tracing::warn!(
            endpoint = ep,
            pages = MAX_PAGES,
            "listing cut at the page bound"
        );
        Ok(out)
    }

    /// Creates a pipeline for `git_ref` (at its current head) with
    /// `variables` (`env_var` type).
    pub async fn create_pipeline(
        &self,
        project_id: u64,
        git_ref: &str,
        variables: &[(String, String)],
    ) -> Result<GitLabPipeline, ApiError> {
        let variables: Vec<_> = variables
            .iter()
            .map(|(k, v)| serde_json::json!({"key": k, "value": v, "variable_type": "env_var"}))
            .collect();
        let body = serde_json::json!({"ref": git_ref, "variables": variables});
        let ep = endpoint::CREATE_PIPELINE;
        self.send(
            ep,
            Method::POST,
            &format!("/projects/{project_id}/pipeline"),
            Some(body),
        )
        .await?
        .success(ep)?
        .json(ep, false)
    }

    /// One pipeline (a missing one is a `404` [`ApiError::Status`]).
    pub async fn get_pipeline(
        &self,
        project_id: u64,
        pipeline_id: u64,
    ) -> Result<GitLabPipeline, ApiError> {
        self.get_json(
            endpoint::GET_PIPELINE,
            &format!("/projects/{project_id}/pipelines/{pipeline_id}"),
        )
        .await
    }

    /// The newest pipelines (one page of up to 100, newest first) of
    /// `git_ref` started by `source` (`api`, `push`, ...).
    pub async fn list_pipelines(
        &self,
        project_id: u64,
        git_ref: &str,
        source: &str,
        per_page: u32,
    ) -> Result<Vec<GitLabPipeline>, ApiError> {
        let path = format!(
            "/projects/{project_id}/pipelines?ref={}&source={}&order_by=id&sort=desc&per_page={}",
            seg(git_ref),
            seg(source),
            per_page.clamp(1, 100)
        );
        self.get_json(endpoint::LIST_PIPELINES, &path).await
    }

    /// The variables a pipeline was created with, as `(key, value)`.
    pub async fn pipeline_variables(
        &self,
        project_id: u64,
        pipeline_id: u64,
    ) -> Result<Vec<(String, String)>, ApiError> {
        #[derive(Deserialize)]
        struct Variable {
            key: String,
            #[serde(default, deserialize_with = "null_default")]
            value: String,
        }
        let vars: Vec<Variable> = self
            .get_json(
                endpoint::PIPELINE_VARIABLES,
                &format!("/projects/{project_id}/pipelines/{pipeline_id}/variables"),
            )
            .await?;
        Ok(vars.into_iter().map(|v| (v.key, v.value)).collect())
    }

    /// Retries one job; returns the new job.
    pub async fn retry_job(&self, project_id: u64, job_id: u64) -> Result<GitLabJob, ApiError> {
        let ep = endpoint::RETRY_JOB;
        self.send(
            ep,
            Method::POST,
            &format!("/projects/{project_id}/jobs/{job_id}/retry"),
            None,
        )
        .await?
        .success(ep)?
        .json(ep, false)
    }

    /// Retries the failed and canceled jobs of a pipeline.
    pub async fn retry_pipeline(
        &self,
        project_id: u64,
        pipeline_id: u64,
    ) -> Result<GitLabPipeline, ApiError> {
        let ep = endpoint::RETRY_PIPELINE;
        self.send(
            ep,
            Method::POST,
            &format!("/projects/{project_id}/pipelines/{pipeline_id}/retry"),
            None,
        )
        .await?
        .success(ep)?
        .json(ep, false)
    }

    async fn get_json<T: DeserializeOwned>(
        &self,
        ep: &'static str,
        path: &str,
    ) -> Result<T, ApiError> {
        self.send(ep, Method::GET, path, None)
            .await?
            .success(ep)?
            .json(ep, false)
    }

    async fn send(
        &self,
        ep: &'static str,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Raw, ApiError> {
        let core = &self.inner.core;
        let url = core.url(&format!("/api/v4{path}"))?;
        let mut token = reqwest::header::HeaderValue::from_str(self.inner.token.expose_secret())
            .map_err(|_| ApiError::Auth("the GitLab token is not a valid header value".into()))?;
        token.set_sensitive(true);
        let mut request = core
            .http
            .request(method, url)
            .header("PRIVATE-TOKEN", token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        core.execute(Bucket::Token, ep, super::ratelimit::UNNAMED, request)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_json() {
        let j: GitLabJob = serde_json::from_str(
            r#"{"id":8,"status":"pending","stage":"build","name":"py-torch","ref":"develop","tag":false,
                "tag_list":["spack","large"],"pipeline":{"id":77,"project_id":3,"ref":"develop","sha":"ab","status":"running"},
                "created_at":"2024-01-01T12:00:00.123Z","started_at":null,"finished_at":null,
                "failure_reason":null,"allow_failure":false,"runner":null,"web_url":"https://gl/x/-/jobs/8"}"#,
        )
        .expect("job");
        assert_eq!(j.pipeline_id, Some(77));
        assert_eq!(j.git_ref, "develop");
        assert_eq!(j.tag_list, ["spack", "large"]);
        assert!(j.created_at.is_some() && j.started_at.is_none());
    }

    #[test]
    fn bad_token_is_an_auth_error_without_the_token() {
        let client = GitLabClient::new(
            "http://127.0.0.1:9",
            SecretString::from("glpat-secret\nvalue"),
            Duration::from_secs(1),
        )
        .expect("client");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let err = rt
            .block_on(client.delete_runner(1))
            .expect_err("invalid header");
        assert!(matches!(err, ApiError::Auth(_)));
        assert!(!err.to_string().contains("glpat"), "{err}");
    }
}
