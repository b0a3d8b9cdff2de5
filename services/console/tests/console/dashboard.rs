//! `deploy/grafana/dashboards/runyard.json` against what a console serves:
//! its "Console" row queries only series the console exposes, with the
//! suffixes their types give them, and every family the console declares
//! is on a panel. (The other services' families are the allocator's and
//! the scaler's tests'.)

use std::collections::BTreeSet;

use runyard_testkit::synth::{lifecycle, runner_events};
use runyard_testkit::{TestDb, dashboard};
use time::{Duration, OffsetDateTime};

use crate::{Console, TOKEN, client, config, projected};

/// The console's series start with these; the dashboard's other series are
/// the other services'.
const PREFIXES: [&str; 2] = ["runyard_console_", "runyard_savings_"];

/// A renamed or new console metric fails here, not on a blank panel.
#[tokio::test]
async fn the_dashboard_covers_every_console_metric() {
    // Jobs of the last hours, each with its runner and its usage report (job
    // 31's first attempt OOM-killed), so every savings series of the window
    // has a value, and a baseline so that "before" has one too.
    let db = TestDb::new();
    let start = OffsetDateTime::now_utc() - Duration::hours(3);
    let mut events = Vec::new();
    for (i, job) in [7_u64, 8, 31].into_iter().enumerate() {
        let created = start + Duration::minutes(20 * i as i64);
        events.extend(lifecycle(job, created));
        events.extend(runner_events(job, "linux-x64", created));
    }
    projected(&db, &events).await;
    let mut config = config(&db).await;
    config.console_before_memory = Some(bytesize::ByteSize::gib(16));
    let console = Console::start(config).await;

    // A page refused, a page served: the request, latency and refusal
    // families get their children.
    let refused = client()
        .get(format!("{}/savings", console.url))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let served = client()
        .get(format!("{}/savings", console.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(served.status(), 200);

    let page = client()
        .get(format!("{}/metrics", console.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let declared = dashboard::declared(&page);
    assert!(
        declared.contains_key("runyard_savings_reserved_gb_hours"),
        "{page}"
    );
    let exposed = dashboard::exposed(&declared);
    // A series with a value on the page, not only its family declared.
    let has_value = |series: &str| {
        page.lines().any(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
    };

    let mut used = BTreeSet::new();
    for (title, exprs) in dashboard::panels(&dashboard::dashboard()) {
        for expr in &exprs {
            let ours = dashboard::series_in(expr)
                .into_iter()
                .filter(|s| PREFIXES.iter().any(|p| s.starts_with(p)));
            for series in ours {
                let family = exposed.get(series).unwrap_or_else(|| {
                    panic!("panel {title:?}: {expr} queries {series}, which the console does not expose: {declared:?}")
                });
                assert!(
                    has_value(series),
                    "panel {title:?} queries {series}, which has no value on /metrics:\n{page}"
                );
                used.insert(family.clone());
            }
        }
    }
    let unused: Vec<&String> = declared.keys().filter(|f| !used.contains(*f)).collect();
    assert!(unused.is_empty(), "console metrics on no panel: {unused:?}");
    db.drop_db().await;
}
