//! Search: a job by its id (`4711`, `gitlab:gitlab.example.com:4711`), a
//! runner by its name, a repository's or project's jobs, the workloads of
//! a package, repository or project. One job found goes straight to its
//! story.

use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use runyard_insight::search::{Term, search};

use super::{Page, PageError, labels};
use crate::Inner;
use crate::view::{self, Nav};

/// What `GET /search` answers: a page, or a redirect to the one job found.
#[derive(Debug)]
pub enum Answer {
    /// The results.
    Page(Page),
    /// Exactly one job matched.
    Go(String),
}

impl Answer {
    /// A redirect as a response (a page is rendered by the caller).
    pub fn redirect(href: &str) -> Response {
        Redirect::to(href).into_response()
    }
}

/// `GET /search?q=`.
pub async fn page(state: &Inner, q: Option<&str>) -> Result<Answer, PageError> {
    let q = q.unwrap_or_default();
    let Some(term) = Term::parse(q) else {
        return Err(PageError::BadInput(
            "q: type a job id, a repository or project, a runner name or a package (at most 512 bytes)".into(),
        ));
    };
    let found = search(&state.db, &term).await?;
    if found.jobs.len() == 1 && found.runner.is_none() && found.workloads.is_empty() {
        let j = &found.jobs[0];
        return Ok(Answer::Go(view::job_href(&j.forge, &j.instance, j.job_id)));
    }
    if found.jobs.is_empty()
        && found.workloads.is_empty()
        && let Some(r) = &found.runner
        && let Some(j) = &r.job
    {
        return Ok(Answer::Go(view::job_href(&j.forge, &j.instance, j.job_id)));
    }
    let body = html! {
        @if found.is_empty() {
            p { "Nothing matches " code { (q.trim()) } ": no job with that id, no runner of that name, "
                "no repository or project with jobs, no workload of that package, repository or project." }
        }
        @if let Some(r) = &found.runner {
            h2 { "Runner" }
            p {
                code { (r.name) } " of pool " a href=(format!("/pools#pool-{}", view::encode(&r.pool))) { (r.pool) }
                ", " (r.state)
                @if let Some(j) = &r.job { ", job " a href=(view::job_href(&j.forge, &j.instance, j.job_id)) { "#" (j.job_id) } }
            }
        }
        @if !found.jobs.is_empty() {
            h2 { "Jobs" }
            table #jobs {
                thead { tr { th { "Job" } th { "Forge" } th { "Repository / project" } th { "Labels" } th { "Status" } th { "First seen" } } }
                tbody {
                    @for j in &found.jobs {
                        tr {
                            td { a href=(view::job_href(&j.forge, &j.instance, j.job_id)) { (j.name.as_deref().unwrap_or("job")) } " " span.muted.mono { "#" (j.job_id) } }
                            td { (j.forge) " " span.muted { (j.instance) } }
                            td { (j.project.as_deref().unwrap_or("-")) }
                            td { (labels(&j.labels)) }
                            td { (j.status) @if let Some(c) = &j.conclusion { " — " (c) } }
                            td { (view::time(j.first_seen_at)) }
                        }
                    }
                }
            }
        }
        @if !found.workloads.is_empty() {
            h2 { "Workloads" }
            table #workloads {
                thead { tr { th { "Workload" } th.num { "Samples" } th { "Last report" } } }
                tbody {
                    @for w in &found.workloads {
                        tr {
                            td { a href=(view::workload_href(&w.key)) { (view::workload_label(&w.key)) } }
                            td.num { (w.samples) }
                            td { (view::time(w.last_at)) }
                        }
                    }
                }
            }
        }
    };
    Ok(Answer::Page((
        format!("Search: {}", q.trim()),
        Nav::Other,
        body,
    )))
}
