//! A workload: every sample's peak memory over time beside the limit each
//! attempt ran with, the OOM kills, the retries and their bumped limits,
//! and the recommendation a build gets now with its basis (samples,
//! spread, P(OOM) at the limit, the site's prior for a new workload).

use maud::{Markup, html};
use runyard_allocator_api::Recommendation;

use super::{Page, PageError};
use crate::Inner;
use crate::chart::{self, Point};
use crate::view::{self, Nav};

/// Samples shown unless the page asks for another number.
pub const DEFAULT_SAMPLES: i64 = 200;

/// `GET /workloads?key=K&n=N`.
pub async fn page(state: &Inner, key: Option<&str>, n: Option<&str>) -> Result<Page, PageError> {
    let Some(key) = key.map(str::trim).filter(|k| !k.is_empty()) else {
        return Err(PageError::BadInput(
            "which workload? /workloads?key=<its key> (search finds it by package, repository or project)".into(),
        ));
    };
    if key.len() > 4096 {
        return Err(PageError::BadInput(
            "key: longer than any workload key (4096 bytes)".into(),
        ));
    }
    let n = match n.map(str::trim).filter(|n| !n.is_empty()) {
        None => DEFAULT_SAMPLES,
        Some(n) => match n.parse::<i64>() {
            Ok(n) if (1..=runyard_insight::workload::MAX_SAMPLES).contains(&n) => n,
            _ => {
                return Err(PageError::BadInput(format!(
                    "n: {n:?} is not a number of samples from 1 to {}",
                    runyard_insight::workload::MAX_SAMPLES
                )));
            }
        },
    };
    let history = runyard_insight::workload::history(&state.db, key, n).await?;
    if history.samples.is_empty() {
        return Err(PageError::NotFound(format!(
            "no usage report is filed under the workload {key:?}"
        )));
    }
    let now = time::OffsetDateTime::now_utc();
    let current = state.allocator.preview(&history.attributes).await;
    let points: Vec<Point> = history
        .samples
        .iter()
        .map(|s| Point {
            at: s.reported_at.unix_timestamp() as f64,
            peak: s.peak_memory_bytes as f64,
            limit: s.memory_limit_bytes.map(|l| l as f64),
            killed: s.oom_killed,
            retry: s.retry,
            href: view::job_href(&s.job.forge, &s.job.instance, s.job.job_id),
            title: format!(
                "{} job {} attempt {}: peak {}{}{}",
                view::time(s.reported_at),
                s.job.job_id,
                s.attempt,
                view::bytes(s.peak_memory_bytes as f64),
                s.memory_limit_bytes
                    .map_or(String::new(), |l| format!(" of {}", view::bytes(l as f64))),
                if s.oom_killed { ", OOM-killed" } else { "" }
            ),
        })
        .collect();
    let kills = history.samples.iter().filter(|s| s.oom_killed).count();
    let retries = history.samples.iter().filter(|s| s.retry).count();
    let recommended = current.as_ref().ok().map(|r| r.memory_limit_bytes as f64);
    let body = html! {
        p { (view::workload_label(key)) }
        p.muted {
            (history.total) " usage reports"
            @if (history.samples.len() as i64) < history.total {
                ", the newest " (history.samples.len()) " shown ("
                a href=(format!("{}&n={}", view::workload_href(key), runyard_insight::workload::MAX_SAMPLES)) { "more" } ")"
            }
            "; " (kills) " OOM-killed, " (retries) " retries."
        }
        @match &current {
            Ok(r) => { (basis(r)) }
            Err(e) => { (view::notice(&format!("{e}: the current recommendation is missing"))) }
        }
        h2 { "Peak memory of each build" }
        (chart::memory(&points, recommended))
        h2 { "Samples" }
        table #samples {
            thead { tr {
                th { "Reported" } th { "Job" } th.num { "Attempt" } th.num { "Peak" }
                th.num { "Limit" } th.num { "Peak / limit" } th { "Outcome" } th { "Ref" }
            } }
            tbody {
                @for s in history.samples.iter().rev() {
                    tr data-killed=(s.oom_killed) {
                        td { (view::when(s.reported_at, now)) }
                        td { a href=(view::job_href(&s.job.forge, &s.job.instance, s.job.job_id)) { "#" (s.job.job_id) } }
                        td.num { (s.attempt) @if s.retry { " " span.tag { "retry" } } }
                        td.num { (view::bytes(s.peak_memory_bytes as f64)) }
                        td.num { (s.memory_limit_bytes.map_or("-".into(), |l| view::bytes(l as f64))) }
                        td.num {
                            @if let Some(l) = s.memory_limit_bytes.filter(|l| *l > 0) {
                                (view::percent(s.peak_memory_bytes as f64 / l as f64))
                            } @else { "-" }
                        }
                        td {
                            @if s.oom_killed { strong { "OOM-killed" } }
                            @else if let Some(c) = s.exit_code { "exit " (c) }
                            @if s.wall_seconds > 0.0 { " " span.muted { "after " (view::duration(s.wall_seconds)) } }
                        }
                        td { code { (s.git_ref.as_deref().unwrap_or("")) } }
                    }
                }
            }
        }
    };
    Ok(("Workload".into(), Nav::Other, body))
}

fn basis(r: &Recommendation) -> Markup {
    let b = r.basis.clone().unwrap_or_default();
    html! {
        section #recommendation {
            h2 { "What a build gets now: " (view::bytes(r.memory_limit_bytes as f64)) }
            dl.facts {
                dt { "Limit / request" } dd {
                    strong { (view::bytes(r.memory_limit_bytes as f64)) } " / "
                    (view::bytes(r.memory_request_bytes as f64))
                    ", " (r.cpu_request_millicores) "m CPU, " (r.build_jobs) " build jobs"
                }
                dt { "Samples" } dd {
                    (b.samples) " at the level used"
                    @if !b.matched.is_empty() { " (matching " (b.matched.join(", ")) ")" }
                    ", " (b.workload_samples) " of this exact workload"
                }
                dt { "Spread" } dd {
                    @if b.spread >= 0.0 {
                        "±" (format!("{:.0}", (b.spread.exp() - 1.0) * 100.0)) " % around the typical peak "
                        span.muted { "(σ of ln peak " (format!("{:.3}", b.spread)) ")" }
                    } @else { "none: configured defaults" }
                }
                dt { "P(OOM) at the limit" } dd {
                    @if b.oom_probability >= 0.0 { (view::percent(b.oom_probability)) }
                    @else { "not predicted (configured defaults)" }
                }
                dt { "Statistic" } dd { code { (b.statistic) } }
                @if b.site_prior {
                    dt { "New workload" } dd { "sized by the site's prior for workloads it has not seen" }
                }
                @if b.defaults {
                    dt { "Defaults" } dd { "no history matched: the configured defaults" }
                }
                @if b.oom_bump {
                    dt { "OOM bump" } dd { "raised after " (r.retry_count) " consecutive OOM kill(s)" }
                }
                @if b.retries_exhausted {
                    dt { "Retries" } dd { "used up: no bump, no retry" }
                }
            }
        }
    }
}
