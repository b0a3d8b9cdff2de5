//! A job's story: what runyard knows of the job, the recommendation its
//! runner was sized from, and every event of it on one timeline (its
//! webhooks and polls, the runners requested, made, online, handed it and
//! deleted, its usage reports, the retries and their decisions), oldest
//! first, each with its trace id.

use maud::{Markup, html};
use runyard_insight::JobBrief;
use runyard_insight::story::{JobRef, StoryEvent};
use serde_json::Value;

use super::{Page, PageError, labels};
use crate::Inner;
use crate::view::{self, Nav};

/// `GET /jobs/{forge}/{instance}/{job_id}`.
pub async fn page(
    state: &Inner,
    forge: &str,
    instance: &str,
    job_id: &str,
) -> Result<Page, PageError> {
    if !matches!(forge, "github" | "gitlab") {
        return Err(PageError::BadInput(format!(
            "{forge:?} is not a forge: github or gitlab"
        )));
    }
    let Ok(job_id) = job_id.parse::<i64>() else {
        return Err(PageError::BadInput(format!(
            "{job_id:?} is not a job id (a number)"
        )));
    };
    let job = JobRef {
        forge: forge.to_owned(),
        instance: instance.to_owned(),
        job_id,
    };
    let story = runyard_insight::story::story(&state.db, &job).await?;
    if story.is_empty() {
        return Err(PageError::NotFound(format!(
            "runyard knows no {forge} job {job_id} on {instance}"
        )));
    }
    let now = time::OffsetDateTime::now_utc();
    let name = story
        .job
        .as_ref()
        .and_then(|j| j.name.clone())
        .unwrap_or_else(|| format!("job {job_id}"));
    let given = story
        .events
        .iter()
        .rfind(|e| e.kind == "RunnerRequested" && e.job.as_ref() == Some(&job));
    let t0 = story.events.first().map(|e| e.at);
    let body = html! {
        @if let Some(j) = &story.job { (facts(j, now)) }
        @else { p.notice { "runyard has events naming this job but no webhook or poll of it yet." } }
        @if let Some(e) = given { (recommendation(e)) }
        @if !story.reports.is_empty() {
            p {
                "Workload: "
                @for r in &story.reports {
                    a href=(view::workload_href(&r.workload_key)) { (view::workload_label(&r.workload_key)) }
                    " " span.muted { "(attempt " (r.attempt) ")" } " "
                }
            }
        }
        @if !story.attempts.is_empty() {
            p {
                "Other attempts of this job: "
                @for a in &story.attempts {
                    a href=(view::job_href(&a.forge, &a.instance, a.job_id)) {
                        "#" (a.job_id) @if let Some(n) = a.run_attempt { " (attempt " (n) ")" }
                    }
                    " "
                }
            }
        }
        h2 { "Timeline" }
        @if story.truncated {
            (view::notice(&format!("the first {} events are shown", runyard_insight::story::MAX_EVENTS)))
        }
        ol.timeline #timeline {
            @for e in &story.events {
                (event(e, &job, t0))
            }
        }
    };
    Ok((format!("{name} · {forge} #{job_id}"), Nav::Other, body))
}

fn facts(j: &JobBrief, now: time::OffsetDateTime) -> Markup {
    let wait = match (j.started_at, j.queued_at.or(j.created_at)) {
        (Some(s), Some(q)) => Some((s - q).as_seconds_f64()),
        (None, Some(q)) => Some((now - q).as_seconds_f64()),
        _ => None,
    };
    html! {
        dl.facts {
            dt { "Repository / project" } dd { (j.project.as_deref().unwrap_or("-")) }
            @if let Some(w) = &j.workflow_name { dt { "Workflow" } dd { (w) } }
            @if let Some(s) = &j.stage { dt { "Stage" } dd { (s) } }
            dt { "Labels" } dd { (labels(&j.labels)) }
            dt { "Status" } dd {
                strong { (j.status) }
                @if let Some(f) = &j.forge_status { " " span.muted { "(forge: " (f) ")" } }
                @if let Some(c) = &j.conclusion { " — " (c) }
                @if let Some(r) = &j.failure_reason { " " span.muted { "(" (r) ")" } }
            }
            @if let Some(a) = j.run_attempt { dt { "Attempt" } dd { (a) } }
            @if let Some(p) = j.pipeline_id { dt { "Pipeline / run" } dd { code { (p) } } }
            @if let Some(r) = &j.git_ref { dt { "Ref" } dd { code { (r) } } }
            @if let Some(t) = j.created_at { dt { "Created" } dd { (view::time(t)) } }
            @if let Some(t) = j.queued_at { dt { "Queued" } dd { (view::time(t)) } }
            @if let Some(t) = j.started_at { dt { "Started" } dd { (view::time(t)) } }
            @if let Some(t) = j.completed_at { dt { "Completed" } dd { (view::time(t)) } }
            @if let Some(w) = wait {
                dt { @if j.started_at.is_some() { "Waited for a runner" } @else { "Waiting for" } }
                dd { (view::duration(w)) }
            }
            @if let Some(r) = &j.runner_name { dt { "Runner" } dd { code { (r) } } }
            @if let Some(u) = &j.html_url { dt { "At the forge" } dd { a href=(u) rel="noreferrer" { (u) } } }
        }
    }
}

fn gib(v: &Value) -> String {
    v.as_f64().map_or("-".into(), view::bytes)
}

fn recommendation(e: &StoryEvent) -> Markup {
    let d = &e.detail;
    let r = &d["recommendation"];
    html! {
        section #recommendation {
            h2 { "Why its runner got " (gib(&d["memory_bytes"])) }
            @if d["allocator_unavailable"].as_bool() == Some(true) {
                p { "The allocator could not be asked: the pool's first flavor, "
                    strong { (d["flavor"].as_str().unwrap_or("-")) } ", was used." }
            } @else if r.is_object() {
                p {
                    "The allocator recommended a limit of " strong { (gib(&r["memory_limit_bytes"])) }
                    " (request " (gib(&r["memory_request_bytes"])) "); flavor "
                    strong { (d["flavor"].as_str().unwrap_or("-")) } " is the smallest that covers it."
                }
                dl.facts {
                    dt { "Basis" } dd { code { (r["statistic"].as_str().unwrap_or("-")) } }
                    dt { "Samples" } dd {
                        (r["samples"].as_u64().unwrap_or(0)) " at the level used, "
                        (r["workload_samples"].as_u64().unwrap_or(0)) " of this exact workload"
                    }
                    dt { "P(OOM) at the limit" } dd {
                        @match r["oom_probability"].as_f64() {
                            Some(p) => { (view::percent(p)) }
                            None => { "not predicted (configured defaults)" }
                        }
                    }
                    @if r["oom_bump"].as_bool() == Some(true) {
                        dt { "OOM bump" } dd { "raised after " (r["retry_count"].as_u64().unwrap_or(0)) " OOM kill(s)" }
                    }
                }
            } @else if let Some(l) = d["recommended_memory_limit_bytes"].as_f64() {
                p { "The allocator recommended a limit of " strong { (view::bytes(l)) } "." }
            }
        }
    }
}

fn other_job(j: &Option<JobRef>, me: &JobRef) -> Option<Markup> {
    let j = j.as_ref().filter(|j| *j != me)?;
    Some(html! {
        " (job " a href=(view::job_href(&j.forge, &j.instance, j.job_id)) { "#" (j.job_id) } ")"
    })
}

/// One event as a sentence.
fn event(e: &StoryEvent, me: &JobRef, t0: Option<time::OffsetDateTime>) -> Markup {
    let d = &e.detail;
    let s = |k: &str| d[k].as_str().unwrap_or_default().to_owned();
    let bad = matches!(
        e.kind.as_str(),
        "RunnerFailed" | "RetryRefused" | "JobUnserved"
    ) || (e.kind == "UsageReported" && d["oom_killed"].as_bool() == Some(true));
    let runner = e.runner.as_deref().map(|r| html! { code { (r) } });
    let what: Markup = match e.kind.as_str() {
        "JobObserved" => html! {
            (s("via")) ": " strong { (s("status")) }
            @if !s("forge_status").is_empty() && s("forge_status") != s("status") {
                " (" (s("forge_status")) ")"
            }
            @if s("status") == "completed" { " — " (s("conclusion")) }
            @if !s("failure_reason").is_empty() { " (" (s("failure_reason")) ")" }
            @if !s("runner_name").is_empty() { " on " code { (s("runner_name")) } }
        },
        "PipelineObserved" => {
            html! { "pipeline " (s("status")) " (" (d["jobs"].as_u64().unwrap_or(0)) " jobs)" }
        }
        "RunnerRequested" => html! {
            "runner " (runner.clone().unwrap_or_default()) " requested in pool " (s("pool"))
            ": flavor " strong { (s("flavor")) } " (" (gib(&d["memory_bytes"])) ", " (d["cpus"].as_u64().unwrap_or(0)) " CPUs)"
            @if let Some(l) = d["recommendation"]["memory_limit_bytes"].as_f64().or(d["recommended_memory_limit_bytes"].as_f64()) {
                " for the allocator's " (view::bytes(l)) " limit"
                @if let Some(p) = d["recommendation"]["oom_probability"].as_f64() { ", P(OOM) " (view::percent(p)) }
            }
            @if d["allocator_unavailable"].as_bool() == Some(true) { " (the allocator could not be asked)" }
            @if s("reason") == "min_idle" { " to keep the pool's idle minimum" }
            (other_job(&e.job, me).unwrap_or_default())
        },
        "RunnerCreated" => html! {
            "runner " (runner.clone().unwrap_or_default()) " made by the provider (attempt "
            (d["attempt"].as_u64().unwrap_or(0)) ", " (s("status")) ")"
        },
        "RunnerOnline" => {
            html! { "runner " (runner.clone().unwrap_or_default()) " online (" (s("source")) ")" }
        }
        "RunnerAssigned" => html! {
            "runner " (runner.clone().unwrap_or_default()) " took "
            @match other_job(&e.job, me) { Some(m) => { "another job" (m) } None => { "this job" } }
        },
        "RunnerFailed" => html! {
            "runner " (runner.clone().unwrap_or_default()) ": create attempt " (d["attempt"].as_u64().unwrap_or(0))
            " failed (" (s("reason")) "): " (s("error"))
            @if d["given_up"].as_bool() == Some(true) { " — runyard gave up" }
        },
        "RunnerDeleted" => {
            html! { "runner " (runner.clone().unwrap_or_default()) " deleted (" (s("reason")) ")" }
        }
        "UsageReported" => html! {
            "usage report, attempt " (d["attempt"].as_u64().unwrap_or(0)) ": peak " strong { (gib(&d["peak_memory_bytes"])) }
            @if d["memory_limit_bytes"].is_number() { " of a " (gib(&d["memory_limit_bytes"])) " limit" }
            @if d["oom_killed"].as_bool() == Some(true) { " — " strong { "OOM-killed" } }
            @if let Some(c) = d["exit_code"].as_i64() { ", exit code " (c) }
            @if let Some(w) = d["wall_seconds"].as_f64() { ", ran " (view::duration(w)) }
        },
        "RetryRequested" => html! {
            "OOM retry requested (" (s("strategy")) ", " (s("unit")) "): killed at "
            (gib(&d["memory_limit_bytes"])) " with a " (gib(&d["peak_memory_bytes"])) " peak, OOM streak "
            (d["oom_streak"].as_u64().unwrap_or(0))
        },
        "RetryIssued" => html! {
            "OOM retry issued (" (s("strategy")) ")"
            @if d["new_pipeline_id"].as_u64().is_some_and(|p| p > 0) { ": new pipeline " code { (d["new_pipeline_id"]) } }
            @if d["new_run_attempt"].as_u64().is_some_and(|a| a > 0) { ": run attempt " (d["new_run_attempt"]) }
            @if let Some(ids) = d["new_job_ids"].as_array() {
                @for id in ids {
                    @if let Some(id) = id.as_i64() {
                        " " a href=(view::job_href(&me.forge, &me.instance, id)) { "#" (id) }
                    }
                }
            }
            @if d["adopted"].as_bool() == Some(true) { " (found already done at the forge)" }
        },
        "RetryRefused" => {
            html! { "OOM retry refused: " strong { (s("reason")) } " — " (s("detail")) }
        }
        "JobUnserved" => {
            html! { "runyard will not serve it: " strong { (s("reason")) } " — " (s("detail")) }
        }
        other => html! { (other) },
    };
    html! {
        li class=[bad.then_some("bad")] data-kind=(e.kind) data-trace=(e.trace_id.as_deref().unwrap_or_default()) {
            span.at title=(view::time(e.at)) {
                (view::time(e.at))
                @if let Some(t0) = t0 { " (+" (view::duration((e.at - t0).as_seconds_f64())) ")" }
            }
            span.kind { (e.kind) }
            (what)
            @if let Some(t) = &e.trace_id { span.trace { "trace " code { (t) } } }
        }
    }
}
