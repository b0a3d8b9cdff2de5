//! The console in a real browser (Debian's Chromium, driven over WebDriver
//! by chromedriver, both installed by `scripts/test.sh`), against the whole
//! stack with sample traffic sent in through ingest. It checks what a
//! person would: they are refused until they sign in; the queue shows a
//! job blocked by a full pool with that reason; a job's story lists its
//! events in order; a workload's chart has one point per sample and marks
//! the kill; the savings totals are the figures worked out by hand. Each
//! page is captured as the README shows it (`docs/console/*.png`), so the
//! pictures cannot drift from the product.

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use runyard_testkit::{free_port, wait_for_port};
use serde_json::json;

use crate::TOKEN;
use crate::stack::{BEFORE_MEMORY, BUILDS, GITHUB_JOBS, HELD_JOB, LIMIT, Stack, WALL_SECONDS};

/// A browser session; chromedriver and the profile go when it is dropped.
struct Browser {
    client: Client,
    _driver: tokio::process::Child,
    _profile: tempfile::TempDir,
}

/// Where the README's pictures live.
fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/console")
}

impl Browser {
    async fn start() -> Self {
        let driver = std::env::var("RUNYARD_TEST_CHROMEDRIVER")
            .unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let chromium =
            std::env::var("RUNYARD_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        for (what, path) in [("chromedriver", &driver), ("chromium", &chromium)] {
            assert!(
                std::path::Path::new(path).exists(),
                "{what} is not at {path}: run the tests with scripts/test.sh, which installs Debian's chromium and chromium-driver"
            );
        }
        let port = free_port();
        let child = tokio::process::Command::new(&driver)
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {driver}: {e}"));
        wait_for_port(([127, 0, 0, 1], port).into()).await;
        let profile = tempfile::tempdir().unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                    "--window-size=1366,900", "--force-device-scale-factor=1",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("a browser session through {driver}: {e}"));
        Self {
            client,
            _driver: child,
            _profile: profile,
        }
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.unwrap();
    }

    async fn attr_all(&self, css: &str, attr: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in self.client.find_all(Locator::Css(css)).await.unwrap() {
            out.push(e.attr(attr).await.unwrap().unwrap_or_default());
        }
        out
    }

    async fn text(&self, css: &str) -> String {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .text()
            .await
            .unwrap()
    }

    async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.unwrap().len()
    }

    /// The page as a person sees it, the height of its content.
    async fn capture(&self, name: &str) {
        let height = self
            .client
            .execute("return document.documentElement.scrollHeight", vec![])
            .await
            .unwrap()
            .as_u64()
            .unwrap_or(900)
            .clamp(600, 2400);
        // The window's size holds the browser's own frame too.
        self.client
            .set_window_size(1366, u32::try_from(height + 140).unwrap_or(900))
            .await
            .unwrap();
        let png = self.client.screenshot().await.unwrap();
        std::fs::create_dir_all(screenshots()).unwrap();
        std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
        self.client.set_window_size(1366, 900).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_answers_what_a_team_is_asked() {
    let stack = Stack::start().await;
    stack.sample_traffic().await;
    let base = stack.console.url.clone();
    let b = Browser::start().await;

    // Refused until signed in: the sign-in page, nothing of the queue.
    let status = reqwest::get(format!("{base}/queue"))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401);
    b.goto(&format!("{base}/queue")).await;
    assert!(b.client.title().await.unwrap().starts_with("Sign in"));
    assert_eq!(b.count("table#queue").await, 0);
    b.client
        .find(Locator::Css("input#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    b.client
        .find(Locator::Css("button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(b.client.current_url().await.unwrap().path(), "/queue");

    // The queue: the second job waits for the pool's only runner, and says so.
    let [first, second] = GITHUB_JOBS;
    let blocked = format!("tr[data-job=\"{second}\"][data-reason=\"pool_full\"]");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while b.count(&blocked).await == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue never showed job {second} blocked by the full pool:\n{}",
            b.client.source().await.unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.client.refresh().await.unwrap();
    }
    let row = b.text(&blocked).await;
    assert!(row.contains("pool full"), "{row}");
    assert!(row.contains("max_runners: 1 of 1"), "{row}");
    assert!(row.contains("linux-x64"), "{row}");
    // The deploy job is held by its forge, and the queue says what for.
    let held = b
        .text(&format!(
            "tr[data-job=\"{HELD_JOB}\"][data-reason=\"forge_waiting\"]"
        ))
        .await;
    assert!(held.contains("its stage"), "{held}");
    b.capture("queue").await;

    // Its pool: the one runner, at its maximum.
    b.goto(&format!("{base}/pools")).await;
    let pool = b.text("#pool-numbers tr[data-pool=\"linux-x64\"]").await;
    assert!(pool.contains("linux-x64"), "{pool}");
    assert_eq!(b.count("#pool-linux-x64 table.runners tbody tr").await, 1);
    b.capture("pools").await;

    // The first job's story, from its link in the queue: its webhook, then
    // its runner requested and made, in the order they happened.
    b.goto(&format!("{base}/queue")).await;
    b.client
        .find(Locator::Css(&format!("tr[data-job=\"{first}\"] td a")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let kinds = b.attr_all("ol#timeline li", "data-kind").await;
        if kinds.iter().any(|k| k == "RunnerCreated") {
            assert_eq!(kinds[0], "JobObserved", "{kinds:?}");
            let requested = kinds.iter().position(|k| k == "RunnerRequested");
            let created = kinds.iter().position(|k| k == "RunnerCreated");
            assert!(requested.is_some() && requested < created, "{kinds:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the story never showed the runner made: {kinds:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        b.client.refresh().await.unwrap();
    }
    // One webhook's path is one trace: its runner's events ride in it.
    let traces = b.attr_all("ol#timeline li", "data-trace").await;
    assert!(!traces[0].is_empty(), "{traces:?}");
    assert!(traces.iter().all(|t| *t == traces[0]), "{traces:?}");
    let times = b.attr_all("ol#timeline li span.at", "title").await;
    let mut sorted = times.clone();
    sorted.sort();
    assert_eq!(times, sorted, "the timeline is oldest first");
    assert!(b.text("ol#timeline").await.contains("trace"));
    b.capture("job").await;

    // The workload, found by its package: a point per sample, the kill marked.
    b.goto(&format!("{base}/search?q=py-torch")).await;
    b.client
        .find(Locator::Css("table#workloads td a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(b.count("figure.chart svg g.sample").await, BUILDS.len());
    assert_eq!(b.count("figure.chart svg g.kill").await, 1);
    let killed = b
        .attr_all("table#samples tr[data-killed=\"true\"] td a", "href")
        .await;
    assert_eq!(
        killed,
        [format!("/jobs/gitlab/gitlab.example.com/{}", BUILDS[0].0)]
    );
    assert!(
        b.text("#recommendation")
            .await
            .contains("P(OOM) at the limit")
    );
    b.capture("workload").await;

    // Savings: the figures worked out by hand from the five reports.
    let gbh = |bytes: u64| bytes as f64 * WALL_SECONDS / 3.6e12;
    let reserved = gbh(LIMIT) * BUILDS.len() as f64;
    let used: f64 = BUILDS.iter().map(|(_, peak, _)| gbh(*peak)).sum();
    let before = gbh(BEFORE_MEMORY) * BUILDS.len() as f64;
    assert_eq!((reserved, used, before), (60.0, 51.0, 80.0));
    b.goto(&format!("{base}/savings?since=30d")).await;
    let figure = |name: &str| format!("#totals [data-figure=\"{name}\"]");
    assert_eq!(
        b.text(&figure("reserved_gb_hours")).await,
        format!("{reserved:.2}")
    );
    assert_eq!(b.text(&figure("used_gb_hours")).await, format!("{used:.2}"));
    assert_eq!(
        b.text(&figure("before_gb_hours")).await,
        format!("{before:.2}")
    );
    assert_eq!(
        b.text(&figure("saved_gb_hours")).await,
        format!("{:.2}", before - reserved)
    );
    assert_eq!(b.text(&figure("first_attempt_oom_rate")).await, "20.0 %");
    b.capture("savings").await;

    // The same figures on /metrics, for Prometheus.
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .contains("runyard_savings_reserved_gb_hours{project=\"(all)\",window=\"30d\"} 60.0"),
        "{metrics}"
    );
    b.client.clone().close().await.unwrap();
}
