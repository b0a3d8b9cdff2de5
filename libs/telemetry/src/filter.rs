//! Per-layer filters that are asked at every span and event.
//!
//! tracing-subscriber hands a per-layer filter's verdict from `enabled` to
//! `on_new_span`/`on_event` through a thread-local. When every filter
//! answers `Interest::always` for a callsite, the `tracing` macros skip
//! `enabled` and the layers read whatever verdict the previous `enabled`
//! call left there. A `log` record checked with `log_enabled!` through the
//! `log` bridge (sqlx checks one after every query) leaves "disabled"
//! behind, and the next span of an always-enabled callsite then vanishes
//! from the OpenTelemetry layer (or a log line from the log layer).
//! [`Fresh`] keeps the verdict fresh: it never answers `always`, so
//! `enabled` runs before every span and event.

use tracing::Metadata;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing_subscriber::layer::{Context, Filter};

/// `F`, asked at every span and event instead of once per callsite.
#[derive(Debug)]
pub(crate) struct Fresh<F>(pub(crate) F);

impl<S, F: Filter<S>> Filter<S> for Fresh<F> {
    fn enabled(&self, meta: &Metadata<'_>, cx: &Context<'_, S>) -> bool {
        self.0.enabled(meta, cx)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        let interest = self.0.callsite_enabled(meta);
        if interest.is_never() {
            interest
        } else {
            Interest::sometimes()
        }
    }

    fn event_enabled(&self, event: &tracing::Event<'_>, cx: &Context<'_, S>) -> bool {
        self.0.event_enabled(event, cx)
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        self.0.max_level_hint()
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        self.0.on_new_span(attrs, id, cx);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        self.0.on_record(id, values, cx);
    }

    fn on_enter(&self, id: &Id, cx: Context<'_, S>) {
        self.0.on_enter(id, cx);
    }

    fn on_exit(&self, id: &Id, cx: Context<'_, S>) {
        self.0.on_exit(id, cx);
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        self.0.on_close(id, cx);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::prelude::*;

    use super::Fresh;

    /// Records the names of the spans it is shown.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Seen {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0
                .lock()
                .unwrap()
                .push(attrs.metadata().name().to_owned());
        }
    }

    /// A `log_enabled!`-style check between two spans of an always-enabled
    /// callsite: `dispatch.enabled` for metadata the filters refuse, with no
    /// event after it.
    fn spans_after_a_refused_check(fresh: bool) -> Vec<String> {
        let seen = Seen::default();
        let spans = |m: &tracing::Metadata<'_>| m.is_span() && m.target().starts_with("runyard");
        let logs = |m: &tracing::Metadata<'_>| *m.level() <= tracing::Level::INFO;
        let dispatch = if fresh {
            tracing::Dispatch::new(
                tracing_subscriber::registry()
                    .with(seen.clone().with_filter(Fresh(filter_fn(spans))))
                    .with(
                        tracing_subscriber::layer::Identity::new()
                            .with_filter(Fresh(filter_fn(logs))),
                    ),
            )
        } else {
            tracing::Dispatch::new(
                tracing_subscriber::registry()
                    .with(seen.clone().with_filter(filter_fn(spans)))
                    .with(tracing_subscriber::layer::Identity::new().with_filter(filter_fn(logs))),
            )
        };
        tracing::dispatcher::with_default(&dispatch, || {
            for _ in 0..3 {
                let span = tracing::info_span!(target: "runyard_test", "call");
                drop(span);
                // What the `log` bridge does for `log_enabled!(Debug)`.
                static CHECK: tracing::callsite::DefaultCallsite =
                    tracing::callsite::DefaultCallsite::new(&CHECK_META);
                static CHECK_META: tracing::Metadata<'static> = tracing::metadata!(
                    name: "log record",
                    target: "sqlx::query",
                    level: tracing::Level::DEBUG,
                    fields: &[],
                    callsite: &CHECK,
                    kind: tracing::metadata::Kind::EVENT,
                );
                tracing::dispatcher::get_default(|d| d.enabled(&CHECK_META));
            }
        });
        seen.0.lock().unwrap().clone()
    }

    #[test]
    fn a_refused_check_between_spans_loses_none_of_them() {
        assert_eq!(spans_after_a_refused_check(true), vec!["call"; 3]);
    }

    #[test]
    fn without_it_the_span_after_a_refused_check_is_lost() {
        // The failure `Fresh` exists for; if tracing-subscriber fixes it,
        // this test says so and `Fresh` can go.
        assert!(spans_after_a_refused_check(false).len() < 3);
    }
}
