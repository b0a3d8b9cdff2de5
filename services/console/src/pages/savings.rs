//! What runyard saved over a chosen window, per project and in total:
//! memory reserved versus used and versus the size jobs had before, the
//! first-attempt OOM rate against the target, retries and how many
//! succeeded, runner minutes paid and idle, queue waits. Each figure says
//! how it was computed; `runyard savings --since <window>` and the
//! `runyard_savings_*` series give the same numbers.

use std::sync::Arc;

use maud::{Markup, html};
use runyard_insight::savings::{Figures, Savings};

use super::{Page, PageError};
use crate::view::{self, Nav};
use crate::{Inner, kept};

/// The windows offered.
const WINDOWS: [&str; 5] = ["1d", "7d", "30d", "90d", "365d"];

/// The window shown unless another is asked for (`30d`).
pub const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// `GET /savings?since=30d`.
pub async fn page(state: &Arc<Inner>, since: Option<&str>) -> Result<Page, PageError> {
    let since = since
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("30d");
    let window = runyard_insight::parse_duration(since)
        .map_err(|e| PageError::BadInput(format!("since: {e}")))?;
    if window.is_zero() || window.as_secs() > 3 * 366 * 86_400 {
        return Err(PageError::BadInput(format!(
            "since: {since:?} is not a window from 1s to 3 years"
        )));
    }
    let kept::Answer { savings, kept } = kept::savings(state, window).await?;
    let now = time::OffsetDateTime::now_utc();
    let body = html! {
        form.inline method="get" action="/savings" {
            label for="since" { "Over the last" }
            select #since name="since" {
                @for w in WINDOWS { option value=(w) selected[w == since] { (w) } }
                @if !WINDOWS.contains(&since) { option value=(since) selected { (since) } }
            }
            button type="submit" { "Show" }
        }
        @if let Some((at, took)) = kept {
            p.muted #computed {
                "Computed " (view::when(at, now)) ": these sums take "
                (format!("{:.1} s", took.as_secs_f64())) " on this site, so they are computed again at most once a minute."
            }
        }
        (cards(&savings.total))
        table #savings {
            thead { tr {
                th { "Project" } th.num { "Reports" } th.num { "Reserved GB·h" } th.num { "Used GB·h" }
                th.num { "Before GB·h" } th.num { "First-attempt OOM" } th.num { "Retries succeeded" }
                th.num { "Runner min" } th.num { "Idle runner min" } th.num { "Wait p50" } th.num { "Wait p95" }
            } }
            tbody {
                @for p in &savings.projects { (row(p.project.as_deref().unwrap_or(""), p)) }
            }
            tfoot { (total_row(&savings)) }
        }
        h2 { "How each figure is computed" }
        dl.facts #how {
            @for (k, v) in &savings.how { dt { code { (k) } } dd { (v) } }
        }
    };
    Ok((format!("Savings over the last {since}"), Nav::Savings, body))
}

fn num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn cards(t: &Figures) -> Markup {
    let saved = t.before_gb_hours.map(|b| b - t.reserved_gb_hours);
    html! {
        div.cards #totals {
            div.card { div.value data-figure="reserved_gb_hours" { (num(t.reserved_gb_hours)) } div.label { "GB·h reserved" } }
            div.card { div.value data-figure="used_gb_hours" { (num(t.used_gb_hours)) } div.label { "GB·h used" } }
            @if let Some(b) = t.before_gb_hours {
                div.card { div.value data-figure="before_gb_hours" { (num(b)) } div.label { "GB·h before runyard" } }
            }
            @if let Some(s) = saved {
                div.card { div.value data-figure="saved_gb_hours" { (num(s)) } div.label { "GB·h saved" } }
            }
            div.card {
                div.value data-figure="first_attempt_oom_rate" {
                    (t.first_attempt_oom_rate.map_or("-".into(), view::percent))
                }
                div.label { "first-attempt OOM (target " (view::percent(t.target_oom)) ")" }
            }
            div.card { div.value data-figure="retries" { (t.retries_succeeded) " / " (t.retries) } div.label { "retries succeeded" } }
            div.card { div.value data-figure="runner_minutes" { (num(t.runner_minutes)) } div.label { "runner minutes (" (num(t.idle_runner_minutes)) " idle)" } }
            div.card {
                div.value data-figure="queue_wait_p95_seconds" { (t.queue_wait_p95_seconds.map_or("-".into(), view::duration)) }
                div.label { "queue wait p95 (p50 " (t.queue_wait_p50_seconds.map_or("-".into(), view::duration)) ")" }
            }
        }
    }
}

fn row(name: &str, f: &Figures) -> Markup {
    html! {
        tr data-project=(name) {
            td { @if name.is_empty() { span.muted { "(none)" } } @else { (name) } }
            (cells(f))
        }
    }
}

fn total_row(s: &Savings) -> Markup {
    html! { tr.total data-project="(all)" { td { "All projects" } (cells(&s.total)) } }
}

fn cells(f: &Figures) -> Markup {
    html! {
        td.num { (f.reports) }
        td.num { (num(f.reserved_gb_hours)) }
        td.num { (num(f.used_gb_hours)) }
        td.num { (f.before_gb_hours.map_or("-".into(), num)) }
        td.num {
            (f.first_attempt_oom_rate.map_or("-".into(), view::percent))
            " " span.muted { "(" (f.first_attempts_oom_killed) "/" (f.first_attempts) ")" }
        }
        td.num { (f.retries_succeeded) "/" (f.retries) }
        td.num { (num(f.runner_minutes)) }
        td.num { (num(f.idle_runner_minutes)) }
        td.num { (f.queue_wait_p50_seconds.map_or("-".into(), view::duration)) }
        td.num { (f.queue_wait_p95_seconds.map_or("-".into(), view::duration)) }
    }
}
