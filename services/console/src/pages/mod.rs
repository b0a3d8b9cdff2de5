//! The pages. Each handler reads what it shows (the projection through
//! [`runyard_insight`], the scaler's and the allocator's answers through
//! [`crate::upstream`]) and renders it; none writes anything. Bad input is
//! a 400 page naming the problem, something unknown a 404, a projection
//! that cannot be read a 503 saying why.

pub mod job;
pub mod login;
pub mod pools;
pub mod queue;
pub mod savings;
pub mod search;
pub mod workload;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use runyard_insight::InsightError;

use crate::auth::Viewer;
use crate::view::{self, Nav};

/// Why a page cannot be shown.
#[derive(Debug)]
pub enum PageError {
    /// The request names something malformed (400).
    BadInput(String),
    /// It names something runyard does not know (404).
    NotFound(String),
    /// The projection could not be read (503).
    Projection(InsightError),
}

impl From<InsightError> for PageError {
    fn from(e: InsightError) -> Self {
        Self::Projection(e)
    }
}

/// A page's title, its navigation mark and its content.
pub type Page = (String, Nav, Markup);

/// Renders a page's result for `viewer`.
pub fn render(viewer: &Viewer, result: Result<Page, PageError>) -> Response {
    match result {
        Ok((title, nav, body)) => view::page(&title, viewer, nav, &body).into_response(),
        Err(e) => {
            let (status, title, text) = match &e {
                PageError::BadInput(m) => (StatusCode::BAD_REQUEST, "Bad request", m.clone()),
                PageError::NotFound(m) => (StatusCode::NOT_FOUND, "Not found", m.clone()),
                PageError::Projection(e) => {
                    tracing::warn!(error = %e, "a page could not read the projection");
                    let hint = if e.schema_or_permission() {
                        " (has the job-tracker migrated the database, and may the console's role read it? see docs/console.md)"
                    } else {
                        ""
                    };
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "The projection cannot be read",
                        format!("reading {} failed{hint}", e.table),
                    )
                }
            };
            let body = html! { p.error role="alert" { (text) } };
            (status, view::page(title, viewer, Nav::Other, &body)).into_response()
        }
    }
}

/// The scaler's reason word as a tag people read.
pub fn reason_label(reason: &str) -> &str {
    match reason {
        "forge_waiting" => "held by the forge",
        "labels_unknown" => "reading its labels",
        "no_matching_pool" => "no matching pool",
        "given_up" => "runyard gave up",
        "creating" => "creating a runner",
        "rate_limited" => "waiting out a rate limit",
        "create_failing" => "create failing",
        "booting" => "runner booting",
        "runner_online" => "runner online",
        "pool_full" => "pool full",
        "runner_due" => "runner due",
        "scaler_unknown" => "not in the scaler's view",
        other => other,
    }
}

/// Labels as tags.
pub fn labels(labels: &[String]) -> Markup {
    html! {
        span.labels {
            @for l in labels { span.tag { (l) } " " }
        }
    }
}
