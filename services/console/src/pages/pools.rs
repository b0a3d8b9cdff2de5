//! The pools: each pool's numbers as the scaler keeps them (desired,
//! actual, idle, creating, busy, queued, the limits), its runners that are
//! not deleted (state, flavor, age, the job they run), its provider's
//! recent errors and its queue waits over the last hour and day.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use maud::{Markup, html};
use runyard_insight::pools::{PoolWaits, ProviderError, RunnerLine, Waits};

use super::{Page, PageError};
use crate::Inner;
use crate::upstream::PoolNumbers;
use crate::view::{self, Nav};

/// How far back provider errors are listed.
const ERRORS_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Most errors listed per pool.
const MAX_ERRORS: usize = 10;

/// `GET /pools`.
pub async fn page(state: &Inner) -> Result<Page, PageError> {
    let now = time::OffsetDateTime::now_utc();
    let (numbers, runners, waits, errors) = tokio::join!(
        state.scaler.pools(),
        runyard_insight::pools::runners(&state.db, None),
        runyard_insight::pools::waits(&state.db),
        runyard_insight::pools::provider_errors(&state.db, ERRORS_WINDOW, 200),
    );
    let (runners, waits, errors) = (runners?, waits?, errors?);
    let unreachable = numbers.as_ref().err().map(ToString::to_string);
    let numbers: BTreeMap<String, PoolNumbers> = numbers
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.clone(), p))
        .collect();
    let names: BTreeSet<&str> = numbers
        .keys()
        .map(String::as_str)
        .chain(runners.iter().map(|r| r.pool.as_str()))
        .chain(waits.iter().map(|w| w.pool.as_str()))
        .collect();
    let body = html! {
        @if let Some(e) = &unreachable {
            (view::notice(&format!("{e}: the pools' numbers are missing; runners and waits come from the projection")))
        }
        @if names.is_empty() {
            p { "No pool has had a runner yet, and the scaler names none." }
        }
        @if !numbers.is_empty() {
            table #pool-numbers {
                thead { tr {
                    th { "Pool" } th.num { "Desired" } th.num { "Actual" } th.num { "Idle" }
                    th.num { "Creating" } th.num { "Busy" } th.num { "Queued" }
                    th.num { "Min idle" } th.num { "Max runners" }
                    th.num { "Wait p50 / p95, 1 h" } th.num { "Wait p50 / p95, 1 day" }
                } }
                tbody {
                    @for p in numbers.values() {
                        @let w = waits.iter().find(|w| w.pool == p.name);
                        tr data-pool=(p.name) {
                            td { a href=(format!("#pool-{}", view::encode(&p.name))) { (p.name) } }
                            td.num { (p.desired) } td.num { (p.actual) } td.num { (p.idle) }
                            td.num { (p.creating) } td.num { (p.busy) } td.num { (p.queued) }
                            td.num { (p.min_idle) } td.num { (p.max_runners) }
                            td.num { (wait_cell(w.map(|w| w.hour))) }
                            td.num { (wait_cell(w.map(|w| w.day))) }
                        }
                    }
                }
            }
        }
        @for name in &names {
            (pool(name, numbers.get(*name), &runners, waits.iter().find(|w| w.pool == *name), &errors, now))
        }
    };
    Ok(("Pools".into(), Nav::Pools, body))
}

fn wait_cell(w: Option<Waits>) -> Markup {
    match w {
        Some(w) if w.jobs > 0 => html! {
            (w.p50.map_or("-".into(), view::duration)) " / "
            (w.p95.map_or("-".into(), view::duration))
            " " span.muted { "(" (w.jobs) ")" }
        },
        _ => html! { span.muted { "no jobs" } },
    }
}

fn pool(
    name: &str,
    numbers: Option<&PoolNumbers>,
    runners: &[RunnerLine],
    waits: Option<&PoolWaits>,
    errors: &[ProviderError],
    now: time::OffsetDateTime,
) -> Markup {
    let mine: Vec<&RunnerLine> = runners.iter().filter(|r| r.pool == name).collect();
    let errors: Vec<&ProviderError> = errors
        .iter()
        .filter(|e| e.pool == name)
        .take(MAX_ERRORS)
        .collect();
    html! {
        section id=(format!("pool-{}", view::encode(name))) {
            h2 { "Pool " (name) }
            @if let Some(n) = numbers {
                div.cards {
                    (card("desired", n.desired)) (card("actual", n.actual)) (card("idle", n.idle))
                    (card("creating", n.creating)) (card("busy", n.busy))
                    (card(&format!("queued (max {})", n.max_runners), n.queued))
                }
            }
            @if let Some(w) = waits {
                p.muted {
                    "Queue wait over the last hour: " (wait_cell(Some(w.hour)))
                    "; over the last day: " (wait_cell(Some(w.day))) "."
                }
            }
            h3 { "Runners" }
            @if mine.is_empty() {
                p.muted { "None alive." }
            } @else {
                table.runners {
                    thead { tr {
                        th { "Runner" } th { "State" } th { "Flavor" } th.num { "Memory" }
                        th.num { "Age" } th { "Job" } th { "Note" }
                    } }
                    tbody {
                        @for r in &mine {
                            tr data-state=(r.state) {
                                td { code { (r.name) } }
                                td { (r.state) }
                                td { (r.flavor.as_deref().unwrap_or("-")) }
                                td.num { (r.memory_bytes.map_or("-".into(), |b| view::bytes(b as f64))) }
                                td.num {
                                    @match r.created_at.or(r.requested_at) {
                                        Some(t) => { (view::duration((now - t).as_seconds_f64())) }
                                        None => { (view::dash()) }
                                    }
                                }
                                td {
                                    @match &r.job {
                                        Some(j) => { a href=(view::job_href(&j.forge, &j.instance, j.job_id)) { "#" (j.job_id) } }
                                        None => { span.muted { "none (idle minimum)" } }
                                    }
                                }
                                td {
                                    @if let Some(reason) = &r.reason { (reason) }
                                    @if r.attempts > 1 { " " span.muted { "(" (r.attempts) " create attempts)" } }
                                }
                            }
                        }
                    }
                }
            }
            h3 { "Provider errors, last 24 h" }
            @if errors.is_empty() {
                p.muted { "None." }
            } @else {
                table.errors {
                    thead { tr { th { "When" } th { "Runner" } th { "Attempt" } th { "Error" } } }
                    tbody {
                        @for e in &errors {
                            tr {
                                td { (view::when(e.at, now)) }
                                td { code { (e.runner) } }
                                td.num { (e.attempt.map_or("-".into(), |a| a.to_string())) @if e.given_up { " (given up)" } }
                                td { (e.reason.as_deref().unwrap_or("")) ": " (e.error.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn card(label: &str, value: u32) -> Markup {
    html! {
        div.card { div.value { (value) } div.label { (label) } }
    }
}
