//! The fake's runners as GitLab runs them (REFERENCE.md, "GitLab runners on
//! demand"): a runner registered by `POST /user/runners` is started either
//! as a service (`gitlab-runner run`: takes jobs until stopped) or as
//! `gitlab-runner run-single --max-builds 1` (takes one job, then its
//! process ends and the registration stays until deleted). A test plays the
//! runner's poll with [`FakeGitLab::pick_up`]: a paused runner is handed no
//! job, nor is a single-build runner that already took one.
//!
//! Endpoints: `PUT /runners/:id` (`paused`), `GET /runners/:id`,
//! `GET /runners/:id/jobs?status=`, the listings `GET /runners`,
//! `GET /runners/all`, `GET /groups/:id/runners`, `GET /projects/:id/runners`
//! (`type`, `tag_list`, `paused`, paginated with `X-Next-Page` and `Link`),
//! and `DELETE /runners/:id`, which never refuses: a job the runner is
//! running is killed (failed, `runner_system_failure`) and counted.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{FakeGitLab, FakeGlRunner, GlState, job_json, message};
use crate::fake_github::{answer, paging, param};

/// How a runner's process was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    /// `gitlab-runner run`: a service asking for jobs (one at a time) until
    /// it is stopped.
    Service,
    /// `gitlab-runner run-single --max-builds 1`: one job, then the process
    /// ends.
    SingleBuild,
}

/// What the fake knows of a runner's process and its jobs.
#[derive(Debug, Clone, Default)]
pub(super) struct Life {
    /// How it runs; `None` until started (never contacted GitLab).
    mode: Option<RunMode>,
    /// The process has ended (a single-build runner after its job).
    stopped: bool,
    /// `PUT /runners/:id` `paused`.
    paused: bool,
    /// Jobs it took, ever.
    builds: u32,
}

/// The runner side of the fake's state.
#[derive(Debug, Default)]
pub(super) struct Fleet {
    lives: BTreeMap<u64, Life>,
    /// Which runner took which job.
    job_runner: BTreeMap<u64, u64>,
    /// Projects' groups (for group runners).
    project_group: BTreeMap<u64, u64>,
    /// `DELETE /runners/:id` of a runner running a job.
    deleted_while_running: u32,
    /// Runner ids deleted, in order.
    deleted: Vec<u64>,
}

/// Why a runner could not be started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// No such runner registered.
    NotRegistered,
    /// Its process already runs (or ran, for a single-build runner).
    AlreadyStarted,
}

impl FakeGitLab {
    /// Starts runner `id`'s process in `mode` (it contacts GitLab, so it
    /// shows `online`).
    pub fn start_runner(&self, id: u64, mode: RunMode) -> Result<(), StartError> {
        let mut st = self.st();
        if !st.runners.contains_key(&id) {
            return Err(StartError::NotRegistered);
        }
        let life = st.fleet.lives.entry(id).or_default();
        if life.mode.is_some() {
            return Err(StartError::AlreadyStarted);
        }
        life.mode = Some(mode);
        Ok(())
    }

    /// Runner `id` polls for a job: it takes the oldest pending job it may
    /// run (its scope, its tags covering the job's, untagged jobs only with
    /// `run_untagged`), which turns `running`. `None` when it gets none: not
    /// registered, not started, stopped, paused, already running a job, or
    /// a single-build runner that took its one job.
    pub fn pick_up(&self, id: u64) -> Option<u64> {
        let mut st = self.st();
        let runner = st.runners.get(&id)?.clone();
        let life = st.fleet.lives.get(&id)?.clone();
        let mode = life.mode?;
        if life.stopped || life.paused || running_job(&st, id).is_some() {
            return None;
        }
        if mode == RunMode::SingleBuild && life.builds >= 1 {
            return None;
        }
        let job = st
            .jobs
            .values()
            .filter(|j| j.status == "pending")
            .find(|j| may_run(&st.fleet, &runner, j.project_id, &j.tag_list))?
            .id;
        if let Some(j) = st.jobs.get_mut(&job) {
            j.status = "running".into();
        }
        st.fleet.job_runner.insert(job, id);
        if let Some(life) = st.fleet.lives.get_mut(&id) {
            life.builds += 1;
        }
        Some(job)
    }

    /// Job `job_id` ends with `status` (`success`, `failed`, `canceled`).
    /// A single-build runner's process ends with it (its registration
    /// stays).
    pub fn finish_job(&self, job_id: u64, status: &str) {
        let mut st = self.st();
        if let Some(job) = st.jobs.get_mut(&job_id) {
            job.status = status.to_owned();
        }
        if let Some(&runner) = st.fleet.job_runner.get(&job_id)
            && let Some(life) = st.fleet.lives.get_mut(&runner)
            && life.mode == Some(RunMode::SingleBuild)
        {
            life.stopped = true;
        }
    }

    /// The runner that took `job_id`, if one did.
    pub fn runner_of(&self, job_id: u64) -> Option<u64> {
        self.st().fleet.job_runner.get(&job_id).copied()
    }

    /// Whether runner `id` is paused.
    pub fn paused(&self, id: u64) -> bool {
        self.st().fleet.lives.get(&id).is_some_and(|l| l.paused)
    }

    /// Whether runner `id`'s process has ended.
    pub fn stopped(&self, id: u64) -> bool {
        self.st().fleet.lives.get(&id).is_some_and(|l| l.stopped)
    }

    /// Puts `project_id` in `group_id` (its group runners may run the
    /// project's jobs, and the group's listing shows its project runners).
    pub fn set_project_group(&self, project_id: u64, group_id: u64) {
        self.st().fleet.project_group.insert(project_id, group_id);
    }

    /// Registers a runner directly (as another tool, or an interrupted
    /// create, would have); returns its id.
    pub fn add_runner(
        &self,
        runner_type: &str,
        scope_id: Option<u64>,
        description: &str,
        tags: &[&str],
    ) -> u64 {
        let mut st = self.st();
        let id = st.next_runner_id;
        st.next_runner_id += 1;
        let (group_id, project_id) = match runner_type {
            "group_type" => (scope_id, None),
            "project_type" => (None, scope_id),
            _ => (None, None),
        };
        st.runners.insert(
            id,
            FakeGlRunner {
                id,
                token: format!("glrt-{}", crate::fake_github::random_token(20)),
                runner_type: runner_type.to_owned(),
                group_id,
                project_id,
                tag_list: tags.iter().map(|t| (*t).to_owned()).collect(),
                run_untagged: false,
                description: description.to_owned(),
            },
        );
        id
    }

    /// How many `DELETE /runners/:id` hit a runner running a job (each
    /// killed that job).
    pub fn deleted_while_running(&self) -> u32 {
        self.st().fleet.deleted_while_running
    }

    /// Runner ids deleted, in order.
    pub fn deleted_runners(&self) -> Vec<u64> {
        self.st().fleet.deleted.clone()
    }
}

/// The job runner `id` is running, if any.
fn running_job(st: &GlState, id: u64) -> Option<u64> {
    st.fleet
        .job_runner
        .iter()
        .filter(|(_, r)| **r == id)
        .map(|(j, _)| *j)
        .find(|j| st.jobs.get(j).is_some_and(|j| j.status == "running"))
}

/// Whether `runner` may run a job of `project_id` tagged `tags`.
fn may_run(fleet: &Fleet, runner: &FakeGlRunner, project_id: u64, tags: &[String]) -> bool {
    let in_scope = match runner.runner_type.as_str() {
        "instance_type" => true,
        "group_type" => fleet.project_group.get(&project_id).copied() == runner.group_id,
        "project_type" => runner.project_id == Some(project_id),
        _ => false,
    };
    let tagged = if tags.is_empty() {
        runner.run_untagged
    } else {
        tags.iter().all(|t| runner.tag_list.contains(t))
    };
    in_scope && tagged
}

/// GitLab's runner status: `online` once its process has contacted the
/// instance (and for a while after it ended), `never_contacted` before.
fn status(life: Option<&Life>) -> &'static str {
    match life.and_then(|l| l.mode) {
        Some(_) => "online",
        None => "never_contacted",
    }
}

/// A runner as the listings show it (no `tag_list`, as in GitLab).
fn brief(st: &GlState, r: &FakeGlRunner) -> Value {
    let life = st.fleet.lives.get(&r.id);
    let paused = life.is_some_and(|l| l.paused);
    json!({
        "id": r.id,
        "description": r.description,
        "ip_address": null,
        "active": !paused,
        "paused": paused,
        "is_shared": r.runner_type == "instance_type",
        "runner_type": r.runner_type,
        "name": null,
        "online": status(life) == "online",
        "status": status(life),
    })
}

/// `GET /runners/:id`: the brief fields plus tags and scope.
fn details(st: &GlState, r: &FakeGlRunner) -> Value {
    let mut v = brief(st, r);
    if let Some(o) = v.as_object_mut() {
        o.insert("tag_list".into(), json!(r.tag_list));
        o.insert("run_untagged".into(), json!(r.run_untagged));
        o.insert("locked".into(), json!(false));
        o.insert(
            "groups".into(),
            json!(
                r.group_id
                    .map(|g| vec![json!({"id": g})])
                    .unwrap_or_default()
            ),
        );
        o.insert(
            "projects".into(),
            json!(
                r.project_id
                    .map(|p| vec![json!({"id": p})])
                    .unwrap_or_default()
            ),
        );
    }
    v
}

/// Routes the runner endpoints; `None` for any other request.
pub(super) fn route(
    st: &mut GlState,
    m: &Method,
    segs: &[&str],
    path: &str,
    query: &[(String, String)],
    body: &[u8],
    host: &str,
) -> Option<Response> {
    let num = |s: &str| s.parse::<u64>().ok();
    Some(match segs {
        ["runners"] if m == Method::GET => list(st, Listing::Owned, path, query, host),
        ["runners", "all"] if m == Method::GET => list(st, Listing::All, path, query, host),
        ["groups", g, "runners"] if m == Method::GET => match num(g) {
            Some(g) => list(st, Listing::Group(g), path, query, host),
            None => message(404, "404 Group Not Found"),
        },
        ["projects", p, "runners"] if m == Method::GET => match num(p) {
            Some(p) => list(st, Listing::Project(p), path, query, host),
            None => message(404, "404 Project Not Found"),
        },
        ["runners", id] if m == Method::GET => match num(id).and_then(|id| st.runners.get(&id)) {
            Some(r) => answer(200, &details(st, r)),
            None => message(404, "404 Runner Not Found"),
        },
        ["runners", id] if m == Method::PUT => match num(id) {
            Some(id) if st.runners.contains_key(&id) => update(st, id, query, body),
            _ => message(404, "404 Runner Not Found"),
        },
        ["runners", id] if m == Method::DELETE => match num(id) {
            Some(id) if st.runners.contains_key(&id) => {
                delete(st, id);
                StatusCode::NO_CONTENT.into_response()
            }
            _ => message(404, "404 Runner Not Found"),
        },
        ["runners", id, "jobs"] if m == Method::GET => match num(id) {
            Some(id) if st.runners.contains_key(&id) => jobs(st, id, path, query, host),
            _ => message(404, "404 Runner Not Found"),
        },
        _ => return None,
    })
}

/// `PUT /runners/:id`: `paused` (or the older `active`), from a JSON body
/// or the query; a value that is not a boolean is a `400`.
fn update(st: &mut GlState, id: u64, query: &[(String, String)], body: &[u8]) -> Response {
    let from_body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => Some(v),
            Err(_) => return answer(400, &json!({"error": "body is not JSON"})),
        }
    };
    let field = |name: &str| -> Result<Option<bool>, ()> {
        if let Some(v) = from_body.as_ref().and_then(|b| b.get(name)) {
            return v.as_bool().map(Some).ok_or(());
        }
        match param(query, name) {
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(_) => Err(()),
            None => Ok(None),
        }
    };
    let paused = match (field("paused"), field("active")) {
        (Ok(Some(p)), _) => Some(p),
        (Ok(None), Ok(Some(active))) => Some(!active),
        (Ok(None), Ok(None)) => None,
        _ => return answer(400, &json!({"error": "paused is invalid"})),
    };
    if let Some(paused) = paused {
        st.fleet.lives.entry(id).or_default().paused = paused;
    }
    match st.runners.get(&id) {
        Some(r) => answer(200, &details(st, r)),
        None => message(404, "404 Runner Not Found"),
    }
}

/// `DELETE /runners/:id`: gone at once; a job it runs is killed.
fn delete(st: &mut GlState, id: u64) {
    st.runners.remove(&id);
    st.fleet.lives.remove(&id);
    st.fleet.deleted.push(id);
    if let Some(job) = running_job(st, id) {
        st.fleet.deleted_while_running += 1;
        if let Some(j) = st.jobs.get_mut(&job) {
            j.status = "failed".into();
            j.failure_reason = Some("runner_system_failure".into());
        }
    }
}

/// Which runners a listing shows.
#[derive(Debug, Clone, Copy)]
enum Listing {
    /// `GET /runners`: the user's own (group and project runners).
    Owned,
    /// `GET /runners/all`: every runner (administrators).
    All,
    /// `GET /groups/:id/runners`: the group's and its projects'.
    Group(u64),
    /// `GET /projects/:id/runners`: the project's, its group's and the
    /// instance's.
    Project(u64),
}

fn list(
    st: &GlState,
    listing: Listing,
    path: &str,
    query: &[(String, String)],
    host: &str,
) -> Response {
    let kind = param(query, "type");
    if kind.is_some_and(|k| !matches!(k, "instance_type" | "group_type" | "project_type")) {
        return answer(400, &json!({"error": "type does not have a valid value"}));
    }
    let tags: BTreeSet<&str> = param(query, "tag_list")
        .map(|t| {
            t.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let paused = match param(query, "paused") {
        None => None,
        Some("true") => Some(true),
        Some("false") => Some(false),
        Some(_) => return answer(400, &json!({"error": "paused is invalid"})),
    };
    let fleet = &st.fleet;
    let shown = |r: &FakeGlRunner| match listing {
        Listing::All => true,
        Listing::Owned => r.runner_type != "instance_type",
        Listing::Group(g) => {
            r.group_id == Some(g)
                || r.project_id
                    .is_some_and(|p| fleet.project_group.get(&p) == Some(&g))
        }
        Listing::Project(p) => {
            r.runner_type == "instance_type"
                || r.project_id == Some(p)
                || (r.group_id.is_some() && fleet.project_group.get(&p).copied() == r.group_id)
        }
    };
    let items: Vec<Value> = st
        .runners
        .values()
        .filter(|r| shown(r))
        .filter(|r| kind.is_none_or(|k| r.runner_type == k))
        .filter(|r| tags.iter().all(|t| r.tag_list.iter().any(|x| x == t)))
        .filter(|r| paused.is_none_or(|p| fleet.lives.get(&r.id).is_some_and(|l| l.paused) == p))
        .map(|r| brief(st, r))
        .collect();
    paged(items, path, query, host)
}

/// `GET /runners/:id/jobs`: its jobs, newest first, by `status` when given.
fn jobs(st: &GlState, id: u64, path: &str, query: &[(String, String)], host: &str) -> Response {
    let wanted = param(query, "status");
    if wanted.is_some_and(|s| !matches!(s, "running" | "success" | "failed" | "canceled")) {
        return answer(400, &json!({"error": "status does not have a valid value"}));
    }
    let runner = st.runners.get(&id).map(|r| brief(st, r));
    let items: Vec<Value> = st
        .fleet
        .job_runner
        .iter()
        .rev()
        .filter(|(_, r)| **r == id)
        .filter_map(|(j, _)| st.jobs.get(j))
        .filter(|j| wanted.is_none_or(|s| j.status == s))
        .map(|j| {
            let mut v = job_json(st, j);
            if let Some(o) = v.as_object_mut() {
                o.insert("runner".into(), runner.clone().unwrap_or(Value::Null));
            }
            v
        })
        .collect();
    paged(items, path, query, host)
}

/// One page of `items` with GitLab's pagination headers (`x-next-page` and
/// a `Link: rel="next"` keeping the other query parameters).
pub(super) fn paged(
    items: Vec<Value>,
    path: &str,
    query: &[(String, String)],
    host: &str,
) -> Response {
    let (page, per_page) = paging(query, 20);
    let total = items.len();
    let pages = total.div_ceil(per_page).max(1);
    let body: Vec<Value> = items
        .into_iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .collect();
    let mut r = answer(200, &Value::Array(body));
    let h = r.headers_mut();
    let next = if page < pages {
        (page + 1).to_string()
    } else {
        String::new()
    };
    for (name, value) in [
        ("x-page", page.to_string()),
        ("x-per-page", per_page.to_string()),
        ("x-total", total.to_string()),
        ("x-total-pages", pages.to_string()),
        ("x-next-page", next),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(name, v);
        }
    }
    if page < pages {
        let others: String = query
            .iter()
            .filter(|(k, _)| k != "page" && k != "per_page")
            .map(|(k, v)| format!("&{}={v}", k.replace('[', "%5B").replace(']', "%5D")))
            .collect();
        let link = format!(
            "<http://{host}{path}?page={}&per_page={per_page}{others}>; rel=\"next\"",
            page + 1
        );
        if let Ok(v) = HeaderValue::from_str(&link) {
            h.insert("link", v);
        }
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::fake_gitlab::FakeGlJob;

    struct Api {
        gl: FakeGitLab,
        http: reqwest::Client,
    }

    impl Api {
        async fn new() -> Self {
            runyard_telemetry::install_crypto_provider();
            Self {
                gl: FakeGitLab::start().await,
                http: reqwest::Client::new(),
            }
        }

        async fn call(
            &self,
            method: reqwest::Method,
            path: &str,
            body: Option<Value>,
        ) -> reqwest::Response {
            let mut req = self
                .http
                .request(method, format!("{}/api/v4{path}", self.gl.url()))
                .header("PRIVATE-TOKEN", "glpat-x");
            if let Some(b) = body {
                req = req.json(&b);
            }
            req.send().await.unwrap()
        }

        async fn json(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
            let r = self.call(method, path, body).await;
            assert!(r.status().is_success(), "{path}: {}", r.status());
            r.json().await.unwrap()
        }

        /// `POST /user/runners` for project 34 with `tags`.
        async fn register(&self, description: &str, tags: &[&str]) -> u64 {
            let v = self
                .json(
                    reqwest::Method::POST,
                    "/user/runners",
                    Some(json!({"runner_type": "project_type", "project_id": 34,
                        "tag_list": tags, "run_untagged": false, "description": description})),
                )
                .await;
            v["id"].as_u64().unwrap()
        }
    }

    fn job(gl: &FakeGitLab, tags: &[&str]) -> u64 {
        gl.add_job(34, FakeGlJob::pending(7, "build", tags))
    }

    #[tokio::test]
    async fn a_service_runner_keeps_taking_jobs_a_single_build_one_takes_one() {
        let api = Api::new().await;
        let gl = &api.gl;
        let service = api.register("svc", &["docker"]).await;
        let single = api.register("one", &["docker"]).await;
        let (a, b, c) = (
            job(gl, &["docker"]),
            job(gl, &["docker"]),
            job(gl, &["docker"]),
        );
        assert_eq!(gl.pick_up(service), None, "not started: no job");
        gl.start_runner(service, RunMode::Service).unwrap();
        gl.start_runner(single, RunMode::SingleBuild).unwrap();
        assert_eq!(
            gl.start_runner(single, RunMode::Service),
            Err(StartError::AlreadyStarted)
        );
        assert_eq!(gl.pick_up(service), Some(a));
        assert_eq!(gl.pick_up(service), None, "one job at a time");
        assert_eq!(gl.job(a).unwrap().status, "running");
        assert_eq!(gl.pick_up(single), Some(b));
        gl.finish_job(a, "success");
        gl.finish_job(b, "success");
        assert_eq!(
            gl.pick_up(single),
            None,
            "a single-build runner takes one job"
        );
        assert!(gl.stopped(single) && !gl.stopped(service));
        assert_eq!(gl.pick_up(service), Some(c), "a service takes the next one");
        // The single-build runner's registration stays until deleted.
        assert!(gl.runners().iter().any(|r| r.id == single));
        assert_eq!(gl.runner_of(c), Some(service));
    }

    #[tokio::test]
    async fn a_paused_runner_is_handed_no_job() {
        let api = Api::new().await;
        let gl = &api.gl;
        let id = api.register("r", &["docker"]).await;
        let a = job(gl, &["docker"]);
        gl.start_runner(id, RunMode::Service).unwrap();
        let v = api
            .json(
                reqwest::Method::PUT,
                &format!("/runners/{id}"),
                Some(json!({"paused": true})),
            )
            .await;
        assert_eq!(
            (v["paused"].clone(), v["active"].clone()),
            (json!(true), json!(false))
        );
        assert!(gl.paused(id));
        assert_eq!(gl.pick_up(id), None);
        assert_eq!(gl.job(a).unwrap().status, "pending");
        // Bad input changes nothing.
        let r = api
            .call(
                reqwest::Method::PUT,
                &format!("/runners/{id}"),
                Some(json!({"paused": "no"})),
            )
            .await;
        assert_eq!(r.status(), 400);
        assert!(gl.paused(id));
        let r = api
            .call(
                reqwest::Method::PUT,
                "/runners/999",
                Some(json!({"paused": true})),
            )
            .await;
        assert_eq!(r.status(), 404);
        api.json(
            reqwest::Method::PUT,
            &format!("/runners/{id}"),
            Some(json!({"paused": false})),
        )
        .await;
        assert_eq!(gl.pick_up(id), Some(a));
    }

    #[tokio::test]
    async fn jobs_go_to_runners_whose_scope_and_tags_cover_them() {
        let api = Api::new().await;
        let gl = &api.gl;
        let small = api.register("s", &["docker"]).await;
        let other_project = gl.add_runner("project_type", Some(99), "p", &["docker", "gpu"]);
        let group = gl.add_runner("group_type", Some(5), "g", &["docker", "gpu"]);
        let untagged = job(gl, &[]);
        let gpu = job(gl, &["docker", "gpu"]);
        for r in [small, other_project, group] {
            gl.start_runner(r, RunMode::Service).unwrap();
        }
        assert_eq!(
            gl.pick_up(small),
            None,
            "neither: untagged and not run_untagged; gpu not covered"
        );
        assert_eq!(gl.pick_up(other_project), None, "another project's runner");
        assert_eq!(gl.pick_up(group), None, "project 34 is in no group");
        gl.set_project_group(34, 5);
        assert_eq!(gl.pick_up(group), Some(gpu));
        assert_eq!(gl.job(untagged).unwrap().status, "pending");
    }

    #[tokio::test]
    async fn a_runner_and_its_running_jobs_are_read() {
        let api = Api::new().await;
        let gl = &api.gl;
        let id = api.register("ry-a-0123456789", &["docker"]).await;
        let v = api
            .json(reqwest::Method::GET, &format!("/runners/{id}"), None)
            .await;
        assert_eq!(v["status"], "never_contacted");
        assert_eq!(v["online"], false);
        assert_eq!(v["tag_list"], json!(["docker"]));
        assert_eq!(v["description"], "ry-a-0123456789");
        gl.start_runner(id, RunMode::SingleBuild).unwrap();
        let a = job(gl, &["docker"]);
        gl.pick_up(id).unwrap();
        let v = api
            .json(reqwest::Method::GET, &format!("/runners/{id}"), None)
            .await;
        assert_eq!(
            (v["status"].clone(), v["paused"].clone()),
            (json!("online"), json!(false))
        );
        let running = api
            .json(
                reqwest::Method::GET,
                &format!("/runners/{id}/jobs?status=running"),
                None,
            )
            .await;
        assert_eq!(running.as_array().unwrap().len(), 1);
        assert_eq!(running[0]["id"], a);
        assert_eq!(running[0]["runner"]["id"], id);
        gl.finish_job(a, "success");
        let running = api
            .json(
                reqwest::Method::GET,
                &format!("/runners/{id}/jobs?status=running"),
                None,
            )
            .await;
        assert_eq!(running, json!([]));
        let done = api
            .json(
                reqwest::Method::GET,
                &format!("/runners/{id}/jobs?status=success"),
                None,
            )
            .await;
        assert_eq!(done[0]["id"], a);
        // Still online after its process ended: GitLab goes by the last
        // contact.
        let v = api
            .json(reqwest::Method::GET, &format!("/runners/{id}"), None)
            .await;
        assert_eq!(v["status"], "online");
        let r = api
            .call(
                reqwest::Method::GET,
                &format!("/runners/{id}/jobs?status=bogus"),
                None,
            )
            .await;
        assert_eq!(r.status(), 400);
        let r = api.call(reqwest::Method::GET, "/runners/999", None).await;
        assert_eq!(r.status(), 404);
    }

    #[tokio::test]
    async fn listings_filter_by_scope_type_tags_and_page_like_gitlab() {
        let api = Api::new().await;
        let gl = &api.gl;
        for n in 0..5 {
            api.register(&format!("mine-{n}"), &["docker", "linux"])
                .await;
        }
        let other_tags = api.register("other", &["gpu"]).await;
        let shared = gl.add_runner("instance_type", None, "shared", &["docker", "linux"]);
        let group = gl.add_runner("group_type", Some(5), "grp", &["docker", "linux"]);
        gl.set_project_group(34, 5);
        let ids = |v: &Value| -> Vec<u64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_u64().unwrap())
                .collect()
        };
        let r = api
            .call(
                reqwest::Method::GET,
                "/projects/34/runners?type=project_type&tag_list=docker,linux&per_page=2",
                None,
            )
            .await;
        let h = r.headers().clone();
        assert_eq!(h["x-next-page"], "2");
        assert_eq!(h["x-total"], "5");
        let link = h["link"].to_str().unwrap().to_owned();
        assert!(
            link.contains("page=2&per_page=2") && link.ends_with("rel=\"next\""),
            "{link}"
        );
        let first: Value = r.json().await.unwrap();
        assert_eq!(first.as_array().unwrap().len(), 2);
        assert!(first[0].get("tag_list").is_none(), "listings carry no tags");
        let r = api
            .call(
                reqwest::Method::GET,
                "/projects/34/runners?type=project_type&tag_list=docker,linux&per_page=2&page=3",
                None,
            )
            .await;
        assert_eq!(r.headers()["x-next-page"], "");
        assert!(r.headers().get("link").is_none());
        assert_eq!(
            r.json::<Value>().await.unwrap().as_array().unwrap().len(),
            1
        );
        // The project sees the instance's and its group's runners too.
        let all = api
            .json(
                reqwest::Method::GET,
                "/projects/34/runners?per_page=100",
                None,
            )
            .await;
        assert_eq!(ids(&all).len(), 8);
        let g = api
            .json(
                reqwest::Method::GET,
                "/groups/5/runners?type=group_type",
                None,
            )
            .await;
        assert_eq!(ids(&g), [group]);
        let owned = api
            .json(reqwest::Method::GET, "/runners?tag_list=gpu", None)
            .await;
        assert_eq!(ids(&owned), [other_tags]);
        let inst = api
            .json(
                reqwest::Method::GET,
                "/runners/all?type=instance_type",
                None,
            )
            .await;
        assert_eq!(ids(&inst), [shared]);
        let owned = api
            .json(reqwest::Method::GET, "/runners?type=instance_type", None)
            .await;
        assert_eq!(owned, json!([]), "instance runners are nobody's own");
        let r = api
            .call(reqwest::Method::GET, "/runners?type=shared", None)
            .await;
        assert_eq!(r.status(), 400);
    }

    #[tokio::test]
    async fn a_delete_never_refuses_and_kills_the_running_job() {
        let api = Api::new().await;
        let gl = &api.gl;
        let busy = api.register("busy", &["docker"]).await;
        let idle = api.register("idle", &["docker"]).await;
        gl.start_runner(busy, RunMode::Service).unwrap();
        let a = job(gl, &["docker"]);
        gl.pick_up(busy).unwrap();
        let r = api
            .call(reqwest::Method::DELETE, &format!("/runners/{idle}"), None)
            .await;
        assert_eq!(r.status(), 204);
        assert_eq!(gl.deleted_while_running(), 0);
        let r = api
            .call(reqwest::Method::DELETE, &format!("/runners/{busy}"), None)
            .await;
        assert_eq!(r.status(), 204, "no busy answer");
        assert_eq!(gl.deleted_while_running(), 1);
        let killed = gl.job(a).unwrap();
        assert_eq!(killed.status, "failed");
        assert_eq!(
            killed.failure_reason.as_deref(),
            Some("runner_system_failure")
        );
        assert!(gl.runners().is_empty());
        assert_eq!(gl.deleted_runners(), [idle, busy]);
        let r = api
            .call(reqwest::Method::DELETE, &format!("/runners/{busy}"), None)
            .await;
        assert_eq!(r.status(), 404);
        assert_eq!(gl.pick_up(busy), None, "a deleted runner gets no job");
    }
}
