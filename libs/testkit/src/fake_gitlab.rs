//! A stateful fake of the GitLab REST API (`/api/v4`), for tests of the
//! scaler, the reconciler and the forge clients: runners created through
//! `POST /user/runners` and deleted, project jobs (get, pending list with
//! `x-next-page` pagination), pipeline creation (variables recorded), job
//! and pipeline retries, `RateLimit-*` headers, injected `429`s and a log of
//! every request.
//!
//! [`FakeGitLab::url`] is the instance's base URL, without `/api/v4`.
//!
//! Runners' processes, their jobs, pausing, listing and deleting them are
//! in [`runners`].

mod runners;
pub use runners::{RunMode, StartError};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

mod flow;
pub use flow::{FakeGlStageJob, FakeGlWebhook};

use crate::fake_github::{
    Budget, Fault, RecordedRequest, Server, answer, lock, query_pairs, random_token, rfc3339,
};

/// A runner created through the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGlRunner {
    /// Id.
    pub id: u64,
    /// Authentication token (`glrt-...`).
    pub token: String,
    /// `instance_type`, `group_type`, `project_type`.
    pub runner_type: String,
    /// For group runners.
    pub group_id: Option<u64>,
    /// For project runners.
    pub project_id: Option<u64>,
    /// Tags.
    pub tag_list: Vec<String>,
    /// Whether it takes untagged jobs.
    pub run_untagged: bool,
    /// Description.
    pub description: String,
}

/// A job as a test describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGlJob {
    /// Job id; 0 lets the fake choose.
    pub id: u64,
    /// Project id (set by [`FakeGitLab::add_job`]).
    pub project_id: u64,
    /// Pipeline id.
    pub pipeline_id: u64,
    /// `pending`, `running`, `success`, `failed`, ...
    pub status: String,
    /// Stage.
    pub stage: String,
    /// Name.
    pub name: String,
    /// Branch or tag.
    pub git_ref: String,
    /// The job's tags.
    pub tag_list: Vec<String>,
    /// Set when failed.
    pub failure_reason: Option<String>,
}

impl FakeGlJob {
    /// A pending job of pipeline `pipeline_id` on `develop`.
    pub fn pending(pipeline_id: u64, name: &str, tags: &[&str]) -> Self {
        Self {
            id: 0,
            project_id: 0,
            pipeline_id,
            status: "pending".into(),
            stage: "build".into(),
            name: name.into(),
            git_ref: "develop".into(),
            tag_list: tags.iter().map(|t| (*t).to_owned()).collect(),
            failure_reason: None,
        }
    }
}

/// A pipeline created through the API (or known from a job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakePipeline {
    /// Id.
    pub id: u64,
    /// Project.
    pub project_id: u64,
    /// Branch or tag.
    pub git_ref: String,
    /// Commit.
    pub sha: String,
    /// The variables it was created with, in order.
    pub variables: Vec<(String, String)>,
    /// Whether it came from `POST /projects/:id/pipeline`.
    pub created_by_api: bool,
}

/// A retry the fake was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakeGlRetry {
    /// `POST /projects/:id/jobs/:job_id/retry`.
    Job {
        /// Project.
        project_id: u64,
        /// The retried job.
        job_id: u64,
        /// The new job.
        new_job_id: u64,
    },
    /// `POST /projects/:id/pipelines/:pipeline_id/retry`.
    Pipeline {
        /// Project.
        project_id: u64,
        /// Pipeline.
        pipeline_id: u64,
    },
}

#[derive(Debug)]
struct GlState {
    token: Option<String>,
    next_runner_id: u64,
    runners: BTreeMap<u64, FakeGlRunner>,
    next_job_id: u64,
    jobs: BTreeMap<u64, FakeGlJob>,
    next_pipeline_id: u64,
    pipelines: BTreeMap<u64, FakePipeline>,
    retries: Vec<FakeGlRetry>,
    pipeline_status: BTreeMap<u64, String>,
    /// Statuses the next `POST`s answer with after doing their work.
    lost_answers: VecDeque<u16>,
    faults: VecDeque<Fault>,
    /// Per-endpoint limits (`"POST /api/v4/user/runners"`): refusals left
    /// and the `Retry-After` each gives.
    throttled: HashMap<String, (u32, u64)>,
    budget: Budget,
    requests: Vec<RecordedRequest>,
    /// Pipelines run as GitLab runs them, and the hooks they sent.
    flow: flow::Flow,
    /// Runners' processes and the jobs they took.
    fleet: runners::Fleet,
}

/// The fake GitLab server. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeGitLab {
    server: Server,
    state: Arc<Mutex<GlState>>,
}

impl FakeGitLab {
    /// Starts a fake on a free loopback port. It accepts any non-empty
    /// `PRIVATE-TOKEN` until [`FakeGitLab::require_token`].
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(GlState {
            token: None,
            next_runner_id: 1,
            runners: BTreeMap::new(),
            next_job_id: 100,
            jobs: BTreeMap::new(),
            next_pipeline_id: 500,
            pipelines: BTreeMap::new(),
            retries: Vec::new(),
            pipeline_status: BTreeMap::new(),
            lost_answers: VecDeque::new(),
            faults: VecDeque::new(),
            throttled: HashMap::new(),
            budget: Budget::new(2000, Duration::from_secs(60)),
            requests: Vec::new(),
            flow: flow::Flow::default(),
            fleet: runners::Fleet::default(),
        }));
        let router = Router::new().fallback(handle).with_state(state.clone());
        Self {
            server: Server::start(router).await,
            state,
        }
    }

    /// The instance base URL (`http://127.0.0.1:<port>`, no `/api/v4`).
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    fn st(&self) -> MutexGuard<'_, GlState> {
        lock(&self.state)
    }

    /// Accepts only this `PRIVATE-TOKEN`.
    pub fn require_token(&self, token: &str) {
        self.st().token = Some(token.to_owned());
    }

    /// Runners currently registered.
    pub fn runners(&self) -> Vec<FakeGlRunner> {
        self.st().runners.values().cloned().collect()
    }

    /// Adds a job to a project (and its pipeline, if new). Returns its id.
    pub fn add_job(&self, project_id: u64, mut job: FakeGlJob) -> u64 {
        let mut st = self.st();
        if job.id == 0 {
            job.id = st.next_job_id;
        }
        st.next_job_id = st.next_job_id.max(job.id + 1);
        st.next_pipeline_id = st.next_pipeline_id.max(job.pipeline_id + 1);
        job.project_id = project_id;
        let pipeline = FakePipeline {
            id: job.pipeline_id,
            project_id,
            git_ref: job.git_ref.clone(),
            sha: sha_for(&job.git_ref),
            variables: Vec::new(),
            created_by_api: false,
        };
        st.pipelines.entry(job.pipeline_id).or_insert(pipeline);
        let id = job.id;
        st.jobs.insert(id, job);
        id
    }

    /// Moves a job to `status` (`failed` with `failure_reason`).
    pub fn set_job_status(&self, job_id: u64, status: &str, failure_reason: Option<&str>) {
        if let Some(job) = self.st().jobs.get_mut(&job_id) {
            job.status = status.to_owned();
            job.failure_reason = failure_reason.map(str::to_owned);
        }
    }

    /// A job as the fake holds it.
    pub fn job(&self, job_id: u64) -> Option<FakeGlJob> {
        self.st().jobs.get(&job_id).cloned()
    }

    /// Pipelines, created through the API or known from jobs.
    pub fn pipelines(&self) -> Vec<FakePipeline> {
        self.st().pipelines.values().cloned().collect()
    }

    /// Retries asked for, in order.
    pub fn retries(&self) -> Vec<FakeGlRetry> {
        self.st().retries.clone()
    }

    /// The next `n` requests answer `429` with `Retry-After:
    /// retry_after_secs`.
    pub fn fail_next(&self, n: u32, retry_after_secs: u64) {
        let mut st = self.st();
        for _ in 0..n {
            st.faults.push_back(Fault {
                status: 429,
                retry_after: retry_after_secs,
            });
        }
    }

    /// The next `n` requests to `method path` (`"POST",
    /// "/api/v4/user/runners"`) answer `429` with `Retry-After:
    /// retry_after_secs`, as one of GitLab's per-endpoint limits does;
    /// other requests go on.
    pub fn throttle(&self, method: &str, path: &str, n: u32, retry_after_secs: u64) {
        self.st().throttled.insert(
            format!("{} {path}", method.to_ascii_uppercase()),
            (n, retry_after_secs),
        );
    }

    /// The next `n` requests answer `status` (`5xx`, `4xx`) without doing
    /// anything.
    pub fn fail_next_with(&self, n: u32, status: u16) {
        let mut st = self.st();
        for _ in 0..n {
            st.faults.push_back(Fault {
                status,
                retry_after: 0,
            });
        }
    }

    /// The next `n` `POST`s do their work, then answer `status` as if the
    /// answer was lost on the way (a proxy's `502` after the write).
    pub fn lose_next_answers(&self, n: u32, status: u16) {
        let mut st = self.st();
        for _ in 0..n {
            st.lost_answers.push_back(status);
        }
    }

    /// Sets a pipeline's status (`running`, `failed`, `success`, ...);
    /// pipelines start `running` (`created` when made through the API).
    pub fn set_pipeline_status(&self, pipeline_id: u64, status: &str) {
        self.st()
            .pipeline_status
            .insert(pipeline_id, status.to_owned());
    }

    /// The budget: `limit` requests per `window` (default 2000 a minute).
    /// Exhausted, requests get `429` with `Retry-After` until the reset.
    pub fn set_rate_limit(&self, limit: u64, window: Duration) {
        self.st().budget = Budget::new(limit, window);
    }

    /// Every request received, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.st().requests.clone()
    }

    /// Requests with this method whose path starts with `path_prefix`
    /// (`/api/v4/...`).
    pub fn count(&self, method: &str, path_prefix: &str) -> usize {
        self.st()
            .requests
            .iter()
            .filter(|r| r.method.eq_ignore_ascii_case(method) && r.path.starts_with(path_prefix))
            .count()
    }
}

/// A stable fake commit for a ref.
fn sha_for(git_ref: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(git_ref.as_bytes()))[..40].to_owned()
}

async fn handle(
    State(state): State<Arc<Mutex<GlState>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let credential = headers
        .get("private-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let host = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_owned();
    let path = uri.path().to_owned();
    let query = query_pairs(uri.query().unwrap_or(""));
    let mut st = lock(&state);
    let mut response = route(
        &mut st,
        &method,
        &path,
        &query,
        &body,
        credential.as_deref(),
        &host,
    );
    if method == Method::POST
        && response.status().is_success()
        && let Some(status) = st.lost_answers.pop_front()
    {
        response = message(status, "502 Bad Gateway");
    }
    let b = &st.budget;
    let h = response.headers_mut();
    h.insert("ratelimit-limit", HeaderValue::from(b.limit()));
    h.insert("ratelimit-remaining", HeaderValue::from(b.remaining()));
    h.insert("ratelimit-reset", HeaderValue::from(b.reset()));
    h.insert(
        "ratelimit-observed",
        HeaderValue::from(b.limit() - b.remaining()),
    );
    st.requests.push(RecordedRequest {
        method: method.to_string(),
        path,
        query: uri.query().unwrap_or("").to_owned(),
        body: String::from_utf8_lossy(&body).into_owned(),
        credential,
        status: response.status().as_u16(),
    });
    response
}

fn message(status: u16, text: &str) -> Response {
    answer(status, &json!({"message": text}))
}

fn too_many(retry_after: u64) -> Response {
    let mut r = (StatusCode::TOO_MANY_REQUESTS, "Retry later\n").into_response();
    r.headers_mut()
        .insert("retry-after", HeaderValue::from(retry_after));
    r
}

fn route(
    st: &mut GlState,
    method: &Method,
    path: &str,
    query: &[(String, String)],
    body: &[u8],
    token: Option<&str>,
    host: &str,
) -> Response {
    if let Some(fault) = st.faults.pop_front() {
        if fault.status != 429 {
            return message(fault.status, "injected failure");
        }
        return too_many(fault.retry_after);
    }
    match (token, &st.token) {
        (None | Some(""), _) => return message(401, "401 Unauthorized"),
        (Some(t), Some(required)) if t != required => return message(401, "401 Unauthorized"),
        _ => {}
    }
    if !st.budget.spend() {
        return too_many(st.budget.seconds_to_reset());
    }
    if let Some((left, retry_after)) = st.throttled.get_mut(&format!("{method} {path}"))
        && *left > 0
    {
        *left -= 1;
        return too_many(*retry_after);
    }
    let Some(rest) = path.strip_prefix("/api/v4/") else {
        return message(404, "404 Not Found");
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let num = |s: &str| s.parse::<u64>().ok();
    let m = method;
    if let Some(r) = runners::route(st, m, &segs, path, query, body, host) {
        return r;
    }
    match segs.as_slice() {
        ["user", "runners"] if m == Method::POST => create_runner(st, body),
        ["projects", p, "jobs"] if m == Method::GET => match num(p) {
            Some(p) => list_jobs(st, p, path, query, host),
            None => message(404, "404 Project Not Found"),
        },
        ["projects", p, "jobs", j] if m == Method::GET => match (num(p), num(j)) {
            (Some(p), Some(j)) => match st.jobs.get(&j).filter(|job| job.project_id == p) {
                Some(job) => answer(200, &job_json(st, job)),
                None => message(404, "404 Job Not Found"),
            },
            _ => message(404, "404 Not Found"),
        },
        ["projects", p, "jobs", j, "retry"] if m == Method::POST => match (num(p), num(j)) {
            (Some(p), Some(j)) => retry_job(st, p, j),
            _ => message(404, "404 Not Found"),
        },
        ["projects", p, "pipeline"] if m == Method::POST => match num(p) {
            Some(p) => create_pipeline(st, p, body),
            None => message(404, "404 Project Not Found"),
        },
        ["projects", p, "pipelines"] if m == Method::GET => match num(p) {
            Some(p) => list_pipelines(st, p, query),
            None => message(404, "404 Project Not Found"),
        },
        ["projects", p, "pipelines", id] if m == Method::GET => match (num(p), num(id)) {
            (Some(p), Some(id)) => match st.pipelines.get(&id).filter(|x| x.project_id == p) {
                Some(pipeline) => answer(200, &pipeline_json(pipeline, &status_of(st, pipeline))),
                None => message(404, "404 Not found"),
            },
            _ => message(404, "404 Not Found"),
        },
        ["projects", p, "pipelines", id, "variables"] if m == Method::GET => {
            match (num(p), num(id)) {
                (Some(p), Some(id)) => match st.pipelines.get(&id).filter(|x| x.project_id == p) {
                    Some(pipeline) => answer(
                        200,
                        &Value::Array(
                            pipeline
                                .variables
                                .iter()
                                .map(|(k, v)| json!({"key": k, "value": v, "variable_type": "env_var"}))
                                .collect(),
                        ),
                    ),
                    None => message(404, "404 Not found"),
                },
                _ => message(404, "404 Not Found"),
            }
        }
        ["projects", p, "pipelines", id, "retry"] if m == Method::POST => match (num(p), num(id)) {
            (Some(p), Some(id)) => retry_pipeline(st, p, id),
            _ => message(404, "404 Not Found"),
        },
        _ => message(404, "404 Not Found"),
    }
}

fn create_runner(st: &mut GlState, body: &[u8]) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return answer(400, &json!({"error": "body is not JSON"}));
    };
    let runner_type = v
        .get("runner_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let group_id = v.get("group_id").and_then(Value::as_u64);
    let project_id = v.get("project_id").and_then(Value::as_u64);
    let ok = match runner_type.as_str() {
        "instance_type" => true,
        "group_type" => group_id.is_some(),
        "project_type" => project_id.is_some(),
        _ => false,
    };
    if !ok {
        return answer(
            400,
            &json!({"error": "runner_type is missing, does not have a valid value, or lacks its group_id/project_id"}),
        );
    }
    let tag_list: Vec<String> = match v.get("tag_list") {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(Value::String(s)) => s
            .split(',')
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .collect(),
        _ => Vec::new(),
    };
    let id = st.next_runner_id;
    st.next_runner_id += 1;
    let token = format!("glrt-{}", random_token(20));
    st.runners.insert(
        id,
        FakeGlRunner {
            id,
            token: token.clone(),
            runner_type,
            group_id,
            project_id,
            tag_list,
            run_untagged: v
                .get("run_untagged")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            description: v
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        },
    );
    answer(
        201,
        &json!({"id": id, "token": token, "token_expires_at": null}),
    )
}

fn job_json(st: &GlState, job: &FakeGlJob) -> Value {
    let sha = st
        .pipelines
        .get(&job.pipeline_id)
        .map_or_else(|| sha_for(&job.git_ref), |p| p.sha.clone());
    let finished = matches!(job.status.as_str(), "success" | "failed" | "canceled");
    json!({
        "id": job.id,
        "status": job.status,
        "stage": job.stage,
        "name": job.name,
        "ref": job.git_ref,
        "tag": false,
        "tag_list": job.tag_list,
        "allow_failure": false,
        "created_at": rfc3339(SystemTime::now()),
        "started_at": null,
        "finished_at": if finished { Value::String(rfc3339(SystemTime::now())) } else { Value::Null },
        "failure_reason": job.failure_reason,
        "pipeline": {"id": job.pipeline_id, "project_id": job.project_id, "ref": job.git_ref, "sha": sha, "status": "running"},
        "runner": null,
        "web_url": format!("https://gitlab.example.com/p/{}/-/jobs/{}", job.project_id, job.id),
    })
}

fn list_jobs(
    st: &GlState,
    project_id: u64,
    path: &str,
    query: &[(String, String)],
    host: &str,
) -> Response {
    let scopes: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "scope[]" || k == "scope")
        .map(|(_, v)| v.as_str())
        .collect();
    let all: Vec<Value> = st
        .jobs
        .values()
        .rev()
        .filter(|j| j.project_id == project_id)
        .filter(|j| scopes.is_empty() || scopes.contains(&j.status.as_str()))
        .map(|j| job_json(st, j))
        .collect();
    runners::paged(all, path, query, host)
}

fn retry_job(st: &mut GlState, project_id: u64, job_id: u64) -> Response {
    let Some(job) = st
        .jobs
        .get(&job_id)
        .filter(|j| j.project_id == project_id)
        .cloned()
    else {
        return message(404, "404 Job Not Found");
    };
    if !matches!(job.status.as_str(), "failed" | "canceled" | "success") {
        return message(403, "403 Forbidden - Job is not retryable");
    }
    let new_id = st.next_job_id;
    st.next_job_id += 1;
    let copy = FakeGlJob {
        id: new_id,
        status: "pending".into(),
        failure_reason: None,
        ..job
    };
    st.jobs.insert(new_id, copy.clone());
    st.retries.push(FakeGlRetry::Job {
        project_id,
        job_id,
        new_job_id: new_id,
    });
    answer(201, &job_json(st, &copy))
}

fn pipeline_json(p: &FakePipeline, status: &str) -> Value {
    json!({
        "id": p.id,
        "iid": p.id,
        "project_id": p.project_id,
        "sha": p.sha,
        "ref": p.git_ref,
        "status": status,
        "source": "api",
        "web_url": format!("https://gitlab.example.com/p/{}/-/pipelines/{}", p.project_id, p.id),
    })
}

fn status_of(st: &GlState, p: &FakePipeline) -> String {
    st.pipeline_status.get(&p.id).cloned().unwrap_or_else(|| {
        if p.created_by_api {
            "created".into()
        } else {
            "running".into()
        }
    })
}

fn list_pipelines(st: &GlState, project_id: u64, query: &[(String, String)]) -> Response {
    let param = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let per_page = param("per_page")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(20)
        .clamp(1, 100);
    let list: Vec<Value> = st
        .pipelines
        .values()
        .rev()
        .filter(|p| p.project_id == project_id)
        .filter(|p| param("ref").is_none_or(|r| r == p.git_ref))
        .filter(|p| param("source").is_none_or(|s| (s == "api") == p.created_by_api))
        .take(per_page)
        .map(|p| pipeline_json(p, &status_of(st, p)))
        .collect();
    answer(200, &Value::Array(list))
}

fn create_pipeline(st: &mut GlState, project_id: u64, body: &[u8]) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return answer(400, &json!({"error": "body is not JSON"}));
    };
    let Some(git_ref) = v
        .get("ref")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    else {
        return answer(400, &json!({"error": "ref is missing"}));
    };
    let variables: Vec<(String, String)> = v
        .get("variables")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|kv| {
                    Some((
                        kv.get("key")?.as_str()?.to_owned(),
                        kv.get("value")?.as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    if !variables.is_empty() && st.flow.no_variables.contains(&project_id) {
        return answer(
            400,
            &json!({"message": {"base": ["Insufficient permissions to set pipeline variables"]}}),
        );
    }
    let id = st.next_pipeline_id;
    st.next_pipeline_id += 1;
    let p = FakePipeline {
        id,
        project_id,
        git_ref: git_ref.to_owned(),
        sha: sha_for(git_ref),
        variables,
        created_by_api: true,
    };
    let body = pipeline_json(&p, "created");
    st.pipelines.insert(id, p);
    answer(201, &body)
}

fn retry_pipeline(st: &mut GlState, project_id: u64, pipeline_id: u64) -> Response {
    let Some(p) = st
        .pipelines
        .get(&pipeline_id)
        .filter(|p| p.project_id == project_id)
        .cloned()
    else {
        return message(404, "404 Not Found");
    };
    let failed: Vec<FakeGlJob> = st
        .jobs
        .values()
        .filter(|j| {
            j.pipeline_id == pipeline_id && matches!(j.status.as_str(), "failed" | "canceled")
        })
        .cloned()
        .collect();
    for job in failed {
        let new_id = st.next_job_id;
        st.next_job_id += 1;
        st.jobs.insert(
            new_id,
            FakeGlJob {
                id: new_id,
                status: "pending".into(),
                failure_reason: None,
                ..job
            },
        );
    }
    st.retries.push(FakeGlRetry::Pipeline {
        project_id,
        pipeline_id,
    });
    answer(201, &pipeline_json(&p, "running"))
}
