//! The queue: every job queued or waiting, oldest first, with its pool and
//! why it has no runner yet, in the scaler's words (`GET /v1/queue`). The
//! projection adds what the scaler does not keep (the stage, the forge's
//! status word, when runyard first heard of it); a job the projection
//! holds and the scaler does not is listed as not in its view.

use std::collections::HashMap;

use maud::html;
use runyard_insight::JobBrief;

use super::{Page, PageError, labels, reason_label};
use crate::Inner;
use crate::upstream::QueuedJob;
use crate::view::{self, Nav};

/// Most rows one page lists (the oldest): a page of thousands helps nobody.
const MAX_ROWS: usize = 1000;

/// One row: the scaler's entry and the projection's row, either or both.
struct Row<'a> {
    scaler: Option<&'a QueuedJob>,
    job: Option<&'a JobBrief>,
}

/// `GET /queue`.
pub async fn page(state: &Inner) -> Result<Page, PageError> {
    let now = time::OffsetDateTime::now_utc();
    let (queue, waiting) = tokio::join!(
        state.scaler.queue(),
        runyard_insight::jobs::waiting(&state.db)
    );
    let waiting = waiting?;
    let (scaled, unreachable) = match &queue {
        Ok(q) => (q.jobs.as_slice(), None),
        Err(e) => (&[][..], Some(e.to_string())),
    };
    let known: HashMap<(&str, &str, i64), &JobBrief> = waiting
        .iter()
        .map(|j| ((j.forge.as_str(), j.instance.as_str(), j.job_id), j))
        .collect();
    let mut rows: Vec<Row<'_>> = scaled
        .iter()
        .map(|q| Row {
            scaler: Some(q),
            job: known
                .get(&(q.forge.as_str(), q.instance.as_str(), q.job_id))
                .copied(),
        })
        .collect();
    let in_view: std::collections::HashSet<(&str, &str, i64)> = scaled
        .iter()
        .map(|q| (q.forge.as_str(), q.instance.as_str(), q.job_id))
        .collect();
    rows.extend(
        waiting
            .iter()
            .filter(|j| !in_view.contains(&(j.forge.as_str(), j.instance.as_str(), j.job_id)))
            .map(|j| Row {
                scaler: None,
                job: Some(j),
            }),
    );
    let total = rows.len();
    rows.truncate(MAX_ROWS);
    let held = rows
        .iter()
        .filter(|r| {
            r.scaler.map_or_else(
                || r.job.is_some_and(|j| j.status == "waiting"),
                |q| q.status == "waiting",
            )
        })
        .count();
    let body = html! {
        @if let Some(e) = &unreachable {
            (view::notice(&format!("{e}: the reasons below are missing; the jobs come from the projection")))
        }
        p.muted {
            (total) " jobs wait for a runner"
            @if total > rows.len() { " (the oldest " (rows.len()) " shown)" }
            ": " (rows.len() - held) " queued, " (held) " held back by their forge."
            @if let Ok(q) = &queue {
                @if let Ok(t) = time::OffsetDateTime::from_unix_timestamp(q.as_of as i64) {
                    " The scaler's view: " (view::when(t, now)) "."
                }
            }
        }
        @if rows.is_empty() {
            p { "Nothing waits." }
        } @else {
            table #queue {
                thead { tr {
                    th.num { "Waiting" } th { "Forge" } th { "Repository / project" } th { "Job" }
                    th { "Labels" } th { "Pool" } th { "Why it has no runner yet" }
                } }
                tbody {
                    @for r in &rows { (row(r, now)) }
                }
            }
        }
    };
    Ok(("Queue".into(), Nav::Queue, body))
}

fn row(r: &Row<'_>, now: time::OffsetDateTime) -> maud::Markup {
    let (forge, instance, job_id) = match (r.scaler, r.job) {
        (Some(q), _) => (q.forge.as_str(), q.instance.as_str(), q.job_id),
        (None, Some(j)) => (j.forge.as_str(), j.instance.as_str(), j.job_id),
        (None, None) => ("", "", 0),
    };
    let project = r
        .scaler
        .map(|q| q.project.as_str())
        .filter(|p| !p.is_empty())
        .or_else(|| r.job.and_then(|j| j.project.as_deref()))
        .unwrap_or_default();
    let name = r
        .scaler
        .map(|q| q.name.as_str())
        .filter(|n| !n.is_empty())
        .or_else(|| r.job.and_then(|j| j.name.as_deref()))
        .unwrap_or_default();
    let tags: Vec<String> = match (r.scaler, r.job) {
        (Some(q), _) if !q.labels.is_empty() => q.labels.clone(),
        (_, Some(j)) => j.labels.clone(),
        _ => Vec::new(),
    };
    let age = match (r.scaler, r.job) {
        (Some(q), _) => Some(q.age_seconds),
        (None, Some(j)) => j
            .queued_at
            .or(j.created_at)
            .map(|t| (now - t).as_seconds_f64()),
        _ => None,
    };
    let (reason, detail) = match r.scaler {
        Some(q) => (q.reason.as_str(), q.detail.clone()),
        None => (
            "scaler_unknown",
            "the scaler has not seen it (it is catching up, or could not be asked)".to_owned(),
        ),
    };
    let pool = r.scaler.and_then(|q| q.pool.as_deref());
    let stage = r.job.and_then(|j| j.stage.as_deref());
    html! {
        tr data-reason=(reason) data-job=(job_id) {
            td.num { @if let Some(a) = age { (view::duration(a)) } @else { (view::dash()) } }
            td { (forge) }
            td { (project) }
            td {
                a href=(view::job_href(forge, instance, job_id)) { (name) }
                " " span.muted.mono { "#" (job_id) }
                @if let Some(s) = stage { br; span.muted { "stage " (s) } }
            }
            td { (labels(&tags)) }
            td {
                @match pool {
                    Some(p) => { a href=(format!("/pools#pool-{}", view::encode(p))) { (p) } }
                    None => { (view::dash()) }
                }
            }
            td {
                span class=(format!("tag {reason}")) { (reason_label(reason)) }
                " " (detail)
                @if let Some(runner) = r.scaler.and_then(|q| q.runner.as_deref()) {
                    " " span.muted { "(runner " code { (runner) } ")" }
                }
            }
        }
    }
}
