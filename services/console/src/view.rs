//! The pages' frame and the small pieces every page uses: the layout with
//! its navigation and search, sizes, durations, times, links. Everything
//! is server-rendered HTML that works without JavaScript; maud escapes
//! every value it is given.

use maud::{DOCTYPE, Markup, PreEscaped, html};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::auth::Viewer;

/// The stylesheet, served at `/static/console.css`.
pub const CSS: &str = include_str!("../assets/console.css");

/// Which page the navigation marks as current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    /// The queue.
    Queue,
    /// The pools.
    Pools,
    /// Savings.
    Savings,
    /// Anything else (a job, a workload, search).
    Other,
}

/// A whole page: `title`, the navigation with `active` marked, who is
/// looking, and `body`.
pub fn page(title: &str, viewer: &Viewer, active: Nav, body: &Markup) -> Markup {
    let link = |href: &str, label: &str, nav: Nav| {
        html! {
            a href=(href) aria-current=[(active == nav).then_some("page")] { (label) }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header {
                    nav aria-label="Main" {
                        a.brand href="/queue" { "runyard" }
                        (link("/queue", "Queue", Nav::Queue))
                        (link("/pools", "Pools", Nav::Pools))
                        (link("/savings", "Savings", Nav::Savings))
                    }
                    form.search role="search" action="/search" method="get" {
                        label for="q" { "Search" }
                        input #q type="search" name="q"
                            placeholder="job id, repository, runner, package";
                        button type="submit" { "Find" }
                    }
                    div.who {
                        span { (viewer.label()) }
                        @if *viewer == Viewer::Token {
                            form method="post" action="/logout" {
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// Every page's `<head>`.
fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · runyard" }
            link rel="stylesheet" href="/static/console.css";
        }
    }
}

/// A page for someone not signed in (or a plain message page): no
/// navigation.
pub fn bare(title: &str, body: &Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body.bare {
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// `bytes` for people: `12.0 GiB`, `512 MiB`.
pub fn bytes(b: f64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    if b.abs() >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else if b.abs() >= MIB {
        format!("{:.0} MiB", b / MIB)
    } else {
        format!("{b:.0} B")
    }
}

/// A duration in seconds for people: `45s`, `3m 12s`, `2h 05m`, `4d 3h`.
pub fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A time as the pages show it: `2026-12-05 23:45:10 UTC`.
pub fn time(t: time::OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
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

/// A `<time>` element: the time, and how long ago.
pub fn when(t: time::OffsetDateTime, now: time::OffsetDateTime) -> Markup {
    let ago = (now - t).as_seconds_f64();
    let machine = t
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    html! {
        time datetime=(machine) title=(time(t)) {
            @if ago.abs() < 1.0 { "just now" }
            @else if ago >= 0.0 { (duration(ago)) " ago" }
            @else { "in " (duration(-ago)) }
        }
    }
}

/// A share as a percentage: `2.8 %`.
pub fn percent(x: f64) -> String {
    if x > 0.0 && x < 0.001 {
        format!("{:.2} %", x * 100.0)
    } else {
        format!("{:.1} %", x * 100.0)
    }
}

/// What a path segment or a query value keeps as it is: letters, digits
/// and `-._~` (RFC 3986's unreserved characters).
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `s` percent-encoded for a path segment or a query value.
pub fn encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// The URL of a job's story.
pub fn job_href(forge: &str, instance: &str, job_id: i64) -> String {
    format!("/jobs/{}/{}/{job_id}", encode(forge), encode(instance))
}

/// The URL of a workload's page.
pub fn workload_href(key: &str) -> String {
    format!("/workloads?key={}", encode(key))
}

/// A workload key for people: `package=py-torch;version=2.3.1` as
/// `py-torch 2.3.1 …` keeps every attribute, only lighter.
pub fn workload_label(key: &str) -> Markup {
    html! {
        span.workload {
            @for (i, part) in key.split(';').enumerate() {
                @if i > 0 { " " }
                @match part.split_once('=') {
                    Some((k, v)) => { span.attr { (k) "=" } (unescape(v)) }
                    None => { (part) }
                }
            }
        }
    }
}

/// A workload key's value as written (`%3B` → `;`).
fn unescape(v: &str) -> String {
    v.replace("%3D", "=")
        .replace("%3B", ";")
        .replace("%25", "%")
}

/// A short notice above a page's content (a service that did not answer).
pub fn notice(text: &str) -> Markup {
    html! { p.notice role="status" { (text) } }
}

/// An empty marker for absent values.
pub fn dash() -> Markup {
    PreEscaped("&mdash;".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_durations_and_shares_read_as_people_say_them() {
        assert_eq!(bytes(12.0 * (1u64 << 30) as f64), "12.0 GiB");
        assert_eq!(bytes(512.0 * (1u64 << 20) as f64), "512 MiB");
        assert_eq!(duration(45.2), "45s");
        assert_eq!(duration(192.0), "3m 12s");
        assert_eq!(duration(7500.0), "2h 05m");
        assert_eq!(duration(4.0 * 86_400.0 + 3.0 * 3600.0), "4d 3h");
        assert_eq!(percent(0.028), "2.8 %");
        assert_eq!(percent(0.0004), "0.04 %");
        assert_eq!(
            job_href("gitlab", "gitlab.example.com", 4711),
            "/jobs/gitlab/gitlab.example.com/4711"
        );
        assert_eq!(workload_href("a=b;c=d"), "/workloads?key=a%3Db%3Bc%3Dd");
    }
}
