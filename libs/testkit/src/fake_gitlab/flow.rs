//! Pipelines as GitLab runs them (REFERENCE: "Job lifecycles"), with the
//! Job Hook and Pipeline Hook each move sends. A pipeline's stages run in
//! order: jobs of later stages stay `created` until every job of the stage
//! before them has finished, then turn `pending`; when a stage fails
//! (a failed job that may not fail), the later stages' jobs are `skipped`
//! and never run. A job in a `resource_group` waits (`waiting_for_resource`)
//! while another job of that group holds it; a delayed job is `scheduled`
//! until its time comes. Only `pending` asks for a runner: a runner can
//! take no other job. Every move appends a delivery, in GitLab's documented
//! payload shape, to an outbox that a test drains with
//! [`FakeGitLab::take_webhooks`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use serde_json::{Value, json};

use super::{FakeGitLab, FakeGlJob, FakePipeline, GlState, sha_for};

/// A job of a pipeline a test runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGlStageJob {
    /// Name.
    pub name: String,
    /// The job's tags.
    pub tags: Vec<String>,
    /// `resource_group:`.
    pub resource_group: Option<String>,
    /// `when: delayed`: `scheduled` until [`FakeGitLab::run_scheduled`].
    pub delayed: bool,
    /// `allow_failure: true`.
    pub allow_failure: bool,
}

impl FakeGlStageJob {
    /// A plain job.
    pub fn new(name: &str, tags: &[&str]) -> Self {
        Self {
            name: name.into(),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            resource_group: None,
            delayed: false,
            allow_failure: false,
        }
    }

    /// In resource group `group`.
    pub fn in_resource_group(mut self, group: &str) -> Self {
        self.resource_group = Some(group.into());
        self
    }

    /// A delayed job.
    pub fn delayed(mut self) -> Self {
        self.delayed = true;
        self
    }

    /// A job that may fail without failing its stage.
    pub fn allowed_to_fail(mut self) -> Self {
        self.allow_failure = true;
        self
    }
}

/// One webhook delivery the fake sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGlWebhook {
    /// `X-Gitlab-Event`: `Job Hook` or `Pipeline Hook`.
    pub event: String,
    /// `X-Gitlab-Event-UUID` (and `Idempotency-Key`).
    pub uuid: String,
    /// For a Job Hook, the job and its `build_status`.
    pub job: Option<(u64, String)>,
    /// The raw JSON body.
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Staged {
    stage: usize,
    spec: FakeGlStageJob,
    created_at: String,
}

/// What the fake knows of pipelines it runs.
#[derive(Debug, Default)]
pub(super) struct Flow {
    /// Pipeline → its stage names.
    stages: BTreeMap<u64, Vec<String>>,
    /// Job → where it sits.
    jobs: BTreeMap<u64, Staged>,
    /// Job → the runner that took it.
    taken_by: BTreeMap<u64, u64>,
    /// Child pipeline → the pipeline that triggered it.
    parents: BTreeMap<u64, u64>,
    /// Projects that refuse pipeline variables
    /// (`ci_pipeline_variables_minimum_override_role = no_one_allowed`).
    pub(super) no_variables: BTreeSet<u64>,
    hooks: Vec<FakeGlWebhook>,
}

fn gitlab_time(t: SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn finished(status: &str) -> bool {
    matches!(status, "success" | "failed" | "canceled" | "skipped")
}

/// Which moves GitLab makes.
fn allowed(from: &str, to: &str) -> bool {
    match from {
        "created" => matches!(
            to,
            "pending" | "waiting_for_resource" | "scheduled" | "skipped" | "canceled"
        ),
        "waiting_for_resource" | "scheduled" | "preparing" | "manual" => {
            matches!(to, "pending" | "canceled" | "skipped")
        }
        "pending" => matches!(to, "running" | "canceled" | "failed"),
        "running" => matches!(to, "success" | "failed" | "canceled"),
        _ => false,
    }
}

impl GlState {
    fn project_path(project_id: u64) -> String {
        format!("ci/project-{project_id}")
    }

    /// The Job Hook of a job, as GitLab's webhook documentation shows it.
    fn job_hook(&self, job: &FakeGlJob) -> Value {
        let staged = self.flow.jobs.get(&job.id);
        let sha = self
            .pipelines
            .get(&job.pipeline_id)
            .map_or_else(|| sha_for(&job.git_ref), |p| p.sha.clone());
        let path = Self::project_path(job.project_id);
        let web = format!("https://gitlab.example.com/{path}");
        let now = gitlab_time(SystemTime::now());
        let running = job.status == "running";
        let runner = self
            .flow
            .taken_by
            .get(&job.id)
            .and_then(|id| self.runners.get(id))
            .filter(|_| job.status != "created" && job.status != "pending");
        json!({
            "object_kind": "build",
            "type": "build",
            "ref": job.git_ref,
            "tag": false,
            "before_sha": "0000000000000000000000000000000000000000",
            "sha": sha,
            "retries_count": 0,
            "build_id": job.id,
            "build_name": job.name,
            "build_stage": job.stage,
            "build_status": job.status,
            "build_created_at": staged.map_or_else(|| now.clone(), |s| s.created_at.clone()),
            "build_started_at": if running || finished(&job.status) && job.status != "skipped" { json!(now) } else { Value::Null },
            "build_finished_at": if finished(&job.status) { json!(now) } else { Value::Null },
            "build_duration": null,
            "build_queued_duration": null,
            "build_allow_failure": staged.is_some_and(|s| s.spec.allow_failure),
            "build_failure_reason": job.failure_reason,
            "pipeline_id": job.pipeline_id,
            "runner": runner.map_or(Value::Null, |r| json!({
                "id": r.id, "description": r.description, "active": true,
                "runner_type": r.runner_type, "is_shared": r.runner_type == "instance_type",
                "tags": r.tag_list
            })),
            "project_id": job.project_id,
            "project_name": format!("CI / project-{}", job.project_id),
            "user": {"id": 31, "name": "Ada Lovelace", "username": "ada"},
            "commit": {"id": job.pipeline_id, "sha": sha, "status": "running"},
            "repository": {
                "name": format!("project-{}", job.project_id),
                "url": format!("git@gitlab.example.com:{path}.git"),
                "homepage": web,
                "git_http_url": format!("{web}.git"),
                "visibility_level": 20
            },
            "project": {
                "id": job.project_id,
                "web_url": web,
                "path_with_namespace": path,
                "default_branch": "develop"
            },
            "environment": null
        })
    }

    fn send_job(&mut self, job_id: u64) {
        let Some(job) = self.jobs.get(&job_id).cloned() else {
            return;
        };
        let body = self.job_hook(&job);
        self.flow.hooks.push(FakeGlWebhook {
            event: "Job Hook".into(),
            uuid: uuid::Uuid::new_v4().to_string(),
            job: Some((job_id, job.status.clone())),
            body: serde_json::to_vec(&body).unwrap_or_default(),
        });
    }

    fn send_pipeline(&mut self, pipeline_id: u64) {
        let builds: Vec<Value> = self
            .jobs
            .values()
            .filter(|j| j.pipeline_id == pipeline_id)
            .map(|j| {
                json!({
                    "id": j.id, "stage": j.stage, "name": j.name, "status": j.status,
                    "created_at": self.flow.jobs.get(&j.id).map(|s| s.created_at.clone()),
                    "started_at": null, "finished_at": null, "duration": null,
                    "queued_duration": null, "failure_reason": j.failure_reason,
                    "allow_failure": self.flow.jobs.get(&j.id).is_some_and(|s| s.spec.allow_failure),
                    "runner": null
                })
            })
            .collect();
        let Some(p) = self.pipelines.get(&pipeline_id).cloned() else {
            return;
        };
        let status = self.flow_pipeline_status(pipeline_id);
        let path = Self::project_path(p.project_id);
        let parent = self.flow.parents.get(&pipeline_id).copied();
        let mut body = json!({
            "object_kind": "pipeline",
            "object_attributes": {
                "id": p.id, "iid": p.id, "ref": p.git_ref, "tag": false, "sha": p.sha,
                "source": if parent.is_some() { "parent_pipeline" } else { "push" },
                "status": status, "stages": self.flow.stages.get(&pipeline_id),
                "created_at": gitlab_time(SystemTime::now()), "finished_at": null, "duration": null
            },
            "project": {
                "id": p.project_id,
                "path_with_namespace": path,
                "web_url": format!("https://gitlab.example.com/{path}")
            },
            "builds": builds
        });
        if let Some(parent) = parent {
            body["source_pipeline"] = json!({
                "project": {
                    "id": p.project_id,
                    "web_url": format!("https://gitlab.example.com/{path}"),
                    "path_with_namespace": path
                },
                "job_id": null,
                "pipeline_id": parent
            });
        }
        self.flow.hooks.push(FakeGlWebhook {
            event: "Pipeline Hook".into(),
            uuid: uuid::Uuid::new_v4().to_string(),
            job: None,
            body: serde_json::to_vec(&body).unwrap_or_default(),
        });
    }

    fn flow_pipeline_status(&self, pipeline_id: u64) -> &'static str {
        let statuses: Vec<&str> = self
            .jobs
            .values()
            .filter(|j| j.pipeline_id == pipeline_id)
            .map(|j| j.status.as_str())
            .collect();
        let failed = self.jobs.values().any(|j| {
            j.pipeline_id == pipeline_id
                && j.status == "failed"
                && !self
                    .flow
                    .jobs
                    .get(&j.id)
                    .is_some_and(|s| s.spec.allow_failure)
        });
        if statuses.iter().all(|s| finished(s)) {
            if failed { "failed" } else { "success" }
        } else if statuses.contains(&"running") {
            "running"
        } else {
            "pending"
        }
    }

    /// Moves a job, checking the move is one GitLab makes, and sends its
    /// Job Hook. Panics on a move GitLab never makes.
    fn move_job(&mut self, job_id: u64, to: &str, failure_reason: Option<&str>) {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            panic!("no job {job_id} in the fake");
        };
        assert!(
            allowed(&job.status, to),
            "job {job_id}: GitLab never moves a job from {} to {to}",
            job.status
        );
        job.status = to.to_owned();
        job.failure_reason = failure_reason.map(str::to_owned);
        self.send_job(job_id);
    }

    /// A job of a stage that may start now: `pending`, unless its resource
    /// group is held (`waiting_for_resource`) or it is delayed.
    fn release(&mut self, job_id: u64) {
        let Some(staged) = self.flow.jobs.get(&job_id).cloned() else {
            return;
        };
        let to = if staged.spec.delayed {
            "scheduled"
        } else if staged
            .spec
            .resource_group
            .as_deref()
            .is_some_and(|g| self.group_held(g, job_id))
        {
            "waiting_for_resource"
        } else {
            "pending"
        };
        self.move_job(job_id, to, None);
    }

    fn group_held(&self, group: &str, except: u64) -> bool {
        self.flow.jobs.iter().any(|(id, s)| {
            *id != except
                && s.spec.resource_group.as_deref() == Some(group)
                && self
                    .jobs
                    .get(id)
                    .is_some_and(|j| matches!(j.status.as_str(), "pending" | "running"))
        })
    }

    /// After `job_id` finished: hand its resource group on, and start the
    /// next stage when its own is done (or skip the rest when it failed).
    fn advance(&mut self, job_id: u64) {
        let Some(staged) = self.flow.jobs.get(&job_id).cloned() else {
            return;
        };
        let pipeline_id = self.jobs.get(&job_id).map_or(0, |j| j.pipeline_id);
        if let Some(group) = &staged.spec.resource_group
            && !self.group_held(group, job_id)
            && let Some(next) = self
                .flow
                .jobs
                .iter()
                .find(|(id, s)| {
                    s.spec.resource_group.as_deref() == Some(group)
                        && self
                            .jobs
                            .get(id)
                            .is_some_and(|j| j.status == "waiting_for_resource")
                })
                .map(|(id, _)| *id)
        {
            self.move_job(next, "pending", None);
        }
        let of_stage = |st: &Self, stage: usize| -> Vec<u64> {
            st.flow
                .jobs
                .iter()
                .filter(|(id, s)| {
                    s.stage == stage
                        && st
                            .jobs
                            .get(id)
                            .is_some_and(|j| j.pipeline_id == pipeline_id)
                })
                .map(|(id, _)| *id)
                .collect()
        };
        let mine = of_stage(self, staged.stage);
        if !mine
            .iter()
            .all(|id| self.jobs.get(id).is_some_and(|j| finished(&j.status)))
        {
            return;
        }
        let stage_failed = mine.iter().any(|id| {
            self.jobs.get(id).is_some_and(|j| j.status == "failed")
                && !self.flow.jobs.get(id).is_some_and(|s| s.spec.allow_failure)
        });
        let stages = self.flow.stages.get(&pipeline_id).map_or(0, Vec::len);
        if stage_failed {
            for later in staged.stage + 1..stages {
                for id in of_stage(self, later) {
                    if self.jobs.get(&id).is_some_and(|j| j.status == "created") {
                        self.move_job(id, "skipped", None);
                    }
                }
            }
        } else if staged.stage + 1 < stages {
            for id in of_stage(self, staged.stage + 1) {
                self.release(id);
            }
        }
        self.send_pipeline(pipeline_id);
    }
}

impl FakeGitLab {
    /// Runs a pipeline of `stages` (name, jobs) on `git_ref` of
    /// `project_id`: the first stage's jobs are released (`pending`,
    /// `waiting_for_resource` or `scheduled`), the others are `created`.
    /// Sends the Pipeline Hook, then each job's Job Hook. Returns the
    /// pipeline id and the job ids, stage by stage.
    pub fn run_pipeline(
        &self,
        project_id: u64,
        git_ref: &str,
        stages: &[(&str, Vec<FakeGlStageJob>)],
    ) -> (u64, Vec<u64>) {
        let mut st = self.st();
        let pipeline_id = st.next_pipeline_id;
        st.next_pipeline_id += 1;
        st.pipelines.insert(
            pipeline_id,
            FakePipeline {
                id: pipeline_id,
                project_id,
                git_ref: git_ref.into(),
                sha: sha_for(git_ref),
                variables: Vec::new(),
                created_by_api: false,
            },
        );
        st.flow.stages.insert(
            pipeline_id,
            stages.iter().map(|(n, _)| (*n).to_owned()).collect(),
        );
        let created_at = gitlab_time(SystemTime::now());
        let mut ids = Vec::new();
        for (stage, (stage_name, jobs)) in stages.iter().enumerate() {
            for spec in jobs {
                let id = st.next_job_id;
                st.next_job_id += 1;
                st.jobs.insert(
                    id,
                    FakeGlJob {
                        id,
                        project_id,
                        pipeline_id,
                        status: "created".into(),
                        stage: (*stage_name).to_owned(),
                        name: spec.name.clone(),
                        git_ref: git_ref.into(),
                        tag_list: spec.tags.clone(),
                        failure_reason: None,
                    },
                );
                st.flow.jobs.insert(
                    id,
                    Staged {
                        stage,
                        spec: spec.clone(),
                        created_at: created_at.clone(),
                    },
                );
                ids.push(id);
            }
        }
        st.send_pipeline(pipeline_id);
        for &id in &ids {
            st.send_job(id);
        }
        let first: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| st.flow.jobs.get(id).is_some_and(|s| s.stage == 0))
            .collect();
        for id in first {
            st.release(id);
        }
        (pipeline_id, ids)
    }

    /// A trigger job of pipeline `parent` starts a child pipeline (a Spack
    /// stack's): [`FakeGitLab::run_pipeline`] whose Pipeline Hooks say
    /// `source: parent_pipeline` and name the parent in `source_pipeline`.
    /// GitLab creates no child pipeline through the API: a retry of its
    /// jobs goes through the parent.
    pub fn run_child_pipeline(
        &self,
        project_id: u64,
        parent: u64,
        git_ref: &str,
        stages: &[(&str, Vec<FakeGlStageJob>)],
    ) -> (u64, Vec<u64>) {
        let next = self.st().next_pipeline_id;
        self.st().flow.parents.insert(next, parent);
        let made = self.run_pipeline(project_id, git_ref, stages);
        debug_assert_eq!(made.0, next);
        made
    }

    /// Runner `runner_id` takes a job: the job must be `pending`, the
    /// runner registered; the job's hooks name it from now on.
    pub fn start_pipeline_job(&self, job_id: u64, runner_id: u64) {
        let mut st = self.st();
        let status = st.jobs.get(&job_id).map(|j| j.status.clone());
        assert_eq!(
            status.as_deref(),
            Some("pending"),
            "job {job_id}: a runner only takes a pending job"
        );
        assert!(
            st.runners.contains_key(&runner_id),
            "runner {runner_id} is not registered"
        );
        st.flow.taken_by.insert(job_id, runner_id);
        st.move_job(job_id, "running", None);
    }

    /// How many jobs runner `runner_id` has taken.
    pub fn runner_jobs(&self, runner_id: u64) -> usize {
        self.st()
            .flow
            .taken_by
            .values()
            .filter(|r| **r == runner_id)
            .count()
    }

    /// A running job ends (`success`, or `failed` with its reason); the
    /// pipeline moves on as GitLab's would.
    pub fn finish_pipeline_job(&self, job_id: u64, status: &str, failure_reason: Option<&str>) {
        let mut st = self.st();
        st.move_job(job_id, status, failure_reason);
        st.advance(job_id);
    }

    /// A delayed job's time has come: `scheduled` → `pending`.
    pub fn run_scheduled(&self, job_id: u64) {
        self.st().move_job(job_id, "pending", None);
    }

    /// A job is cancelled from whatever it waited in.
    pub fn cancel_pipeline_job(&self, job_id: u64) {
        let mut st = self.st();
        st.move_job(job_id, "canceled", None);
        st.advance(job_id);
    }

    /// Project `project_id` lets no one set pipeline variables, GitLab.com's
    /// default for new projects: `POST /projects/:id/pipeline` with
    /// `variables` answers 400 "Insufficient permissions to set pipeline
    /// variables"; without them it succeeds.
    pub fn refuse_pipeline_variables(&self, project_id: u64) {
        self.st().flow.no_variables.insert(project_id);
    }

    /// The webhooks sent since the last call, in the order GitLab sent them.
    pub fn take_webhooks(&self) -> Vec<FakeGlWebhook> {
        std::mem::take(&mut self.st().flow.hooks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runner registered the way a scaler registers one.
    async fn runner(gl: &FakeGitLab) -> u64 {
        runyard_telemetry::install_crypto_provider();
        let r: Value = reqwest::Client::new()
            .post(format!("{}/api/v4/user/runners", gl.url()))
            .header("PRIVATE-TOKEN", "glpat-test")
            .json(&json!({"runner_type": "project_type", "project_id": 42, "tag_list": ["x"], "description": "ry-test"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["id"].as_u64().unwrap()
    }

    fn statuses(gl: &FakeGitLab, ids: &[u64]) -> Vec<String> {
        ids.iter()
            .map(|id| gl.job(*id).map(|j| j.status).unwrap_or_default())
            .collect()
    }

    fn job_hooks(hooks: &[FakeGlWebhook]) -> Vec<(u64, String)> {
        hooks.iter().filter_map(|h| h.job.clone()).collect()
    }

    #[tokio::test]
    async fn later_stages_stay_created_until_the_stage_before_them_finishes() {
        let gl = FakeGitLab::start().await;
        let (_, ids) = gl.run_pipeline(
            42,
            "develop",
            &[
                (
                    "build",
                    vec![
                        FakeGlStageJob::new("a", &["x"]),
                        FakeGlStageJob::new("b", &["x"]),
                    ],
                ),
                ("test", vec![FakeGlStageJob::new("c", &["x"])]),
            ],
        );
        assert_eq!(statuses(&gl, &ids), ["pending", "pending", "created"]);
        let hooks = gl.take_webhooks();
        assert_eq!(hooks[0].event, "Pipeline Hook");
        assert_eq!(
            job_hooks(&hooks),
            [
                (ids[0], "created".into()),
                (ids[1], "created".into()),
                (ids[2], "created".into()),
                (ids[0], "pending".into()),
                (ids[1], "pending".into()),
            ]
        );
        gl.start_pipeline_job(ids[0], runner(&gl).await);
        gl.finish_pipeline_job(ids[0], "success", None);
        assert_eq!(
            statuses(&gl, &ids)[2],
            "created",
            "its stage is not done while b runs"
        );
        gl.start_pipeline_job(ids[1], runner(&gl).await);
        gl.finish_pipeline_job(ids[1], "success", None);
        assert_eq!(statuses(&gl, &ids)[2], "pending");
        let body: Value = serde_json::from_slice(
            &gl.take_webhooks()
                .last()
                .map(|h| h.body.clone())
                .unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(body["object_kind"], "pipeline");
    }

    #[tokio::test]
    async fn a_failed_stage_skips_the_later_ones() {
        let gl = FakeGitLab::start().await;
        let (_, ids) = gl.run_pipeline(
            42,
            "develop",
            &[
                (
                    "build",
                    vec![
                        FakeGlStageJob::new("a", &["x"]),
                        FakeGlStageJob::new("lint", &["x"]).allowed_to_fail(),
                    ],
                ),
                ("test", vec![FakeGlStageJob::new("c", &["x"])]),
                ("deploy", vec![FakeGlStageJob::new("d", &["x"])]),
            ],
        );
        gl.start_pipeline_job(ids[1], runner(&gl).await);
        gl.finish_pipeline_job(ids[1], "failed", Some("script_failure"));
        assert_eq!(
            statuses(&gl, &ids)[2],
            "created",
            "allowed to fail, and a still runs"
        );
        gl.start_pipeline_job(ids[0], runner(&gl).await);
        gl.finish_pipeline_job(ids[0], "failed", Some("script_failure"));
        assert_eq!(statuses(&gl, &ids)[2..], ["skipped", "skipped"]);
    }

    #[tokio::test]
    async fn a_resource_group_holds_its_second_job_until_the_first_is_done() {
        let gl = FakeGitLab::start().await;
        let (_, first) = gl.run_pipeline(
            42,
            "develop",
            &[(
                "deploy",
                vec![FakeGlStageJob::new("deploy", &["x"]).in_resource_group("prod")],
            )],
        );
        let (_, second) = gl.run_pipeline(
            42,
            "develop",
            &[(
                "deploy",
                vec![FakeGlStageJob::new("deploy", &["x"]).in_resource_group("prod")],
            )],
        );
        assert_eq!(
            statuses(&gl, &[first[0], second[0]]),
            ["pending", "waiting_for_resource"]
        );
        gl.start_pipeline_job(first[0], runner(&gl).await);
        gl.finish_pipeline_job(first[0], "success", None);
        assert_eq!(statuses(&gl, &second), ["pending"]);
    }

    #[tokio::test]
    async fn a_delayed_job_is_scheduled_until_its_time() {
        let gl = FakeGitLab::start().await;
        let (_, ids) = gl.run_pipeline(
            42,
            "develop",
            &[(
                "later",
                vec![FakeGlStageJob::new("nightly", &["x"]).delayed()],
            )],
        );
        assert_eq!(statuses(&gl, &ids), ["scheduled"]);
        gl.run_scheduled(ids[0]);
        assert_eq!(statuses(&gl, &ids), ["pending"]);
    }

    #[tokio::test]
    #[should_panic(expected = "a runner only takes a pending job")]
    async fn no_runner_takes_a_created_job() {
        let gl = FakeGitLab::start().await;
        let (_, ids) = gl.run_pipeline(
            42,
            "develop",
            &[
                ("build", vec![FakeGlStageJob::new("a", &["x"])]),
                ("test", vec![FakeGlStageJob::new("c", &["x"])]),
            ],
        );
        gl.start_pipeline_job(ids[1], runner(&gl).await);
    }

    #[tokio::test]
    async fn a_project_that_refuses_pipeline_variables_takes_a_pipeline_without_them() {
        runyard_telemetry::install_crypto_provider();
        let gl = FakeGitLab::start().await;
        gl.refuse_pipeline_variables(42);
        let post = async |body: Value| {
            let r = reqwest::Client::new()
                .post(format!("{}/api/v4/projects/42/pipeline", gl.url()))
                .header("PRIVATE-TOKEN", "glpat-test")
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or_default(),
            )
        };
        let with = json!({"ref": "develop", "variables": [{"key": "A", "value": "1"}]});
        let (status, body) = post(with).await;
        assert_eq!(status, 400);
        assert!(
            body.to_string()
                .contains("Insufficient permissions to set pipeline variables")
        );
        assert!(
            gl.pipelines().iter().all(|p| !p.created_by_api),
            "nothing made"
        );
        let (status, _) = post(json!({"ref": "develop"})).await;
        assert_eq!(status, 201);
        assert_eq!(
            gl.pipelines().iter().filter(|p| p.created_by_api).count(),
            1
        );
    }

    #[tokio::test]
    async fn a_child_pipeline_s_hooks_name_its_parent() {
        let gl = FakeGitLab::start().await;
        let (parent, _) = gl.run_pipeline(
            42,
            "develop",
            &[("generate", vec![FakeGlStageJob::new("g", &["x"])])],
        );
        let (child, _) = gl.run_child_pipeline(
            42,
            parent,
            "develop",
            &[("build", vec![FakeGlStageJob::new("b", &["x"])])],
        );
        let hooks = gl.take_webhooks();
        let pipeline_hook = |id: u64| -> Value {
            hooks
                .iter()
                .filter(|h| h.event == "Pipeline Hook")
                .map(|h| serde_json::from_slice::<Value>(&h.body).unwrap_or_default())
                .find(|v| v["object_attributes"]["id"] == id)
                .unwrap_or_default()
        };
        let c = pipeline_hook(child);
        assert_eq!(c["object_attributes"]["source"], "parent_pipeline");
        assert_eq!(c["source_pipeline"]["pipeline_id"], parent);
        let p = pipeline_hook(parent);
        assert_eq!(p["object_attributes"]["source"], "push");
        assert_eq!(p["source_pipeline"], Value::Null);
    }

    #[test]
    fn moves_gitlab_never_makes_are_refused() {
        assert!(allowed("created", "pending"));
        assert!(allowed("waiting_for_resource", "pending"));
        assert!(allowed("scheduled", "pending"));
        assert!(!allowed("created", "running"));
        assert!(!allowed("success", "pending"));
        assert!(!allowed("running", "pending"));
    }
}
