//! A workload's memory chart, drawn on the server as SVG: one point per
//! usage report (its peak), the limit that attempt ran with beside it, a
//! cross where it was OOM-killed, retries in their own colour, and the
//! current recommendation as a dashed line. Each point links to its job's
//! story and says what it is on hover (`<title>`); no script is needed.
//! The table under it on the workload page holds the same numbers for
//! screen readers and copying.

use maud::{Markup, html};

use crate::view;

/// One point of the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// When it was reported (Unix seconds).
    pub at: f64,
    /// Peak memory.
    pub peak: f64,
    /// The limit it ran with.
    pub limit: Option<f64>,
    /// OOM-killed.
    pub killed: bool,
    /// A retry of a killed attempt.
    pub retry: bool,
    /// Its job's story.
    pub href: String,
    /// What its tooltip says.
    pub title: String,
}

const W: f64 = 900.0;
const H: f64 = 320.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 34.0;

/// A round step for about `n` ticks up to `max` bytes (powers of two of a
/// GiB, or of a MiB below one).
fn step(max: f64, n: f64) -> f64 {
    let gib = (1u64 << 30) as f64;
    let unit = if max >= gib { gib } else { (1u64 << 20) as f64 };
    let raw = (max / n / unit).max(1e-9);
    let mut s = 1.0;
    for candidate in [
        1.0, 2.0, 4.0, 5.0, 8.0, 10.0, 16.0, 20.0, 32.0, 50.0, 64.0, 100.0, 128.0,
    ] {
        s = candidate;
        if candidate >= raw {
            break;
        }
    }
    s * unit
}

/// The chart of `points`, with the current recommendation `recommended`.
pub fn memory(points: &[Point], recommended: Option<f64>) -> Markup {
    let kills = points.iter().filter(|p| p.killed).count();
    let top = points
        .iter()
        .flat_map(|p| [Some(p.peak), p.limit])
        .flatten()
        .chain(recommended)
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let ystep = step(top * 1.08, 5.0);
    let ymax = (top * 1.08 / ystep).ceil() * ystep;
    let y = |b: f64| TOP + (H - TOP - BOTTOM) * (1.0 - b / ymax);
    let (t0, t1) = points
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.at), b.max(p.at)));
    let span = t1 - t0;
    let plot_w = W - LEFT - RIGHT;
    // Reports at one instant are spread by their order instead.
    let by_time = span >= 1.0;
    let x = |i: usize, at: f64| {
        let f = if by_time {
            (at - t0) / span
        } else if points.len() > 1 {
            i as f64 / (points.len() - 1) as f64
        } else {
            0.5
        };
        LEFT + 12.0 + (plot_w - 24.0) * f
    };
    let ticks: Vec<f64> = (0..=((ymax / ystep).round() as usize))
        .map(|i| i as f64 * ystep)
        .collect();
    let label = format!(
        "{} samples, {kills} OOM kills; peaks {} to {}{}",
        points.len(),
        view::bytes(points.iter().map(|p| p.peak).fold(f64::MAX, f64::min)),
        view::bytes(points.iter().map(|p| p.peak).fold(0.0, f64::max)),
        recommended.map_or(String::new(), |r| format!("; limit now {}", view::bytes(r)))
    );
    let when = |t: f64| {
        time::OffsetDateTime::from_unix_timestamp(t as i64)
            .map(view::time)
            .unwrap_or_default()
    };
    html! {
        figure.chart {
            svg xmlns="http://www.w3.org/2000/svg" viewBox=(format!("0 0 {W} {H}"))
                role="img" aria-label=(label)
                data-samples=(points.len()) data-kills=(kills) {
                g.axis {
                    @for t in &ticks {
                        line x1=(LEFT) x2=(W - RIGHT) y1=(y(*t)) y2=(y(*t)) {}
                        text x=(LEFT - 8.0) y=(y(*t) + 4.0) text-anchor="end" {
                            @if *t == 0.0 { "0" } @else { (view::bytes(*t)) }
                        }
                    }
                    @if !points.is_empty() {
                        text x=(LEFT) y=(H - 10.0) text-anchor="start" { (when(t0)) }
                        @if by_time {
                            text x=(W - RIGHT) y=(H - 10.0) text-anchor="end" { (when(t1)) }
                        }
                    }
                }
                @if let Some(r) = recommended {
                    line.recommended x1=(LEFT) x2=(W - RIGHT) y1=(y(r)) y2=(y(r)) {
                        title { "current recommendation: " (view::bytes(r)) }
                    }
                    text.label x=(W - RIGHT - 4.0) y=(y(r) - 5.0) text-anchor="end" {
                        "now " (view::bytes(r))
                    }
                }
                @for (i, p) in points.iter().enumerate() {
                    @let cx = x(i, p.at);
                    @if let Some(l) = p.limit {
                        line class=(if p.retry { "limit retry" } else { "limit" })
                            x1=(cx - 7.0) x2=(cx + 7.0) y1=(y(l)) y2=(y(l)) {
                            title { "limit " (view::bytes(l)) }
                        }
                    }
                    g class=(if p.retry { "sample retry" } else { "sample" }) {
                        a href=(p.href) {
                            title { (p.title) }
                            circle cx=(cx) cy=(y(p.peak)) r="4.5" {}
                        }
                    }
                    @if p.killed {
                        g.kill {
                            path d=(format!(
                                "M{} {} L{} {} M{} {} L{} {}",
                                cx - 6.0, y(p.peak) - 6.0, cx + 6.0, y(p.peak) + 6.0,
                                cx - 6.0, y(p.peak) + 6.0, cx + 6.0, y(p.peak) - 6.0
                            )) {
                                title { "OOM-killed" }
                            }
                        }
                    }
                }
            }
            figcaption.legend {
                span { span.key.peak {} "peak of a build" }
                span { span.key.retry {} "a retry" }
                span { span.key.limit {} "the limit it ran with" }
                span { span.key.kill {} "OOM-killed (×)" }
                @if recommended.is_some() {
                    span { span.key.now {} "the limit a build gets now (dashed)" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at: f64, peak_gib: f64, killed: bool) -> Point {
        Point {
            at,
            peak: peak_gib * (1u64 << 30) as f64,
            limit: Some(12.0 * (1u64 << 30) as f64),
            killed,
            retry: false,
            href: format!("/jobs/gitlab/g/{at}"),
            title: "build".into(),
        }
    }

    #[test]
    fn one_point_per_sample_and_a_cross_per_kill() {
        let svg = memory(
            &[
                point(0.0, 9.0, false),
                point(60.0, 12.5, true),
                point(120.0, 10.0, false),
            ],
            Some(14.0 * (1u64 << 30) as f64),
        )
        .into_string();
        assert_eq!(svg.matches("<circle").count(), 3, "{svg}");
        assert_eq!(svg.matches("class=\"kill\"").count(), 1, "{svg}");
        assert!(svg.contains("data-samples=\"3\"") && svg.contains("data-kills=\"1\""));
        assert!(svg.contains("now 14.0 GiB"), "{svg}");
        assert!(svg.contains("href=\"/jobs/gitlab/g/60\""), "{svg}");
    }

    #[test]
    fn ticks_are_round_sizes() {
        let gib = (1u64 << 30) as f64;
        assert_eq!(step(20.0 * gib, 5.0), 4.0 * gib);
        assert_eq!(
            step(300.0 * (1u64 << 20) as f64, 5.0),
            64.0 * (1u64 << 20) as f64
        );
    }
}
