//! The console against a real Postgres (a database per test, projected by
//! the job-tracker's own projection code and read through a read-only
//! role), over HTTP as a browser or a script reaches it. The page tests in
//! a real browser, against the whole stack, are in `browser`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod browser;
mod dashboard;
mod http;
mod stack;

use std::net::SocketAddr;
use std::time::Duration;

use runyard_events::Event;
use runyard_projection::apply::{Incoming, apply_batch};
use runyard_testkit::TestDb;
use tokio::sync::oneshot;

/// A login token (as `openssl rand -hex 32` makes them).
pub const TOKEN: &str = "6b1d0c3f9e8a7b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4";

pub const LOCAL: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A running console; stopped when dropped.
#[derive(Debug)]
pub struct Console {
    pub url: String,
    _stop: oneshot::Sender<()>,
}

impl Console {
    /// Starts `config`.
    pub async fn start(config: runyard_console::Config) -> Self {
        runyard_telemetry::install_crypto_provider();
        let app = runyard_console::App::build(config).await.unwrap();
        let url = format!("http://{}", app.local_addr());
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(app.run(async move {
            let _ = rx.await;
        }));
        Self { url, _stop: tx }
    }
}

/// A console reading `db` through the read-only role, with [`TOKEN`],
/// asking a scaler that is not there.
pub async fn config(db: &TestDb) -> runyard_console::Config {
    runyard_console::Config {
        database: runyard_config::Database {
            url: db.reader_url().await,
        },
        console_listen: LOCAL,
        scaler_url: format!("http://127.0.0.1:{}", runyard_testkit::free_port()),
        allocator_url: String::new(),
        console_tokens: runyard_forge::tokens::Tokens::new("RUNYARD_CONSOLE_TOKENS", [TOKEN]),
        ..runyard_console::Config::default()
    }
}

/// A migrated database with `events` projected, as the job-tracker
/// projects them (each with a trace header), readable by the read-only
/// role.
pub async fn projected(db: &TestDb, events: &[Event]) {
    // The migration grants the readers' role SELECT only if it exists.
    db.reader_url().await;
    runyard_store::migrate(&db.url).await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let batch: Vec<Incoming> = events
        .iter()
        .enumerate()
        .map(|(i, e)| Incoming {
            seq: i as u64 + 1,
            event: e.clone(),
            traceparent: Some(format!("00-{:032x}-{:016x}-01", trace_of(i), i + 1)),
        })
        .collect();
    apply_batch(&pool, &batch).await.unwrap();
    pool.close().await;
}

/// The trace id [`projected`] gives the `i`-th event.
pub fn trace_of(i: usize) -> u128 {
    0xabc0_0000_0000_0000_0000_0000_0000_0000 + i as u128
}

/// An HTTP client that follows no redirect and keeps no cookie.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}
