//! job-tracker against a real nats-server and a real Postgres (a database per
//! test): ordering, duplicates, crashes, replicas, outages, poison, rebuild.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use runyard_bus::{Bus, Outgoing, StreamSettings, TraceParent};
use runyard_events::{Event, JobStatus, Namespace};
use runyard_job_tracker::{App, Config, rebuild};
use runyard_testkit::proxy::TcpProxy;
use runyard_testkit::{TestDb, TestNats, eventually, synth, unique_namespace};
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(60);

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
    addr: SocketAddr,
}

impl Running {
    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        self.task.await.unwrap().unwrap();
    }
}

fn config(nats_url: &str, ns: &Namespace, db_url: &str) -> Config {
    Config {
        nats_url: nats_url.to_owned(),
        namespace: ns.to_string(),
        database_url: db_url.to_owned(),
        tracker_http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        tracker_batch_size: 200,
        tracker_batch_wait: Duration::from_millis(20),
        tracker_ack_wait: Duration::from_secs(5),
        ..Config::default()
    }
}

async fn start(config: Config) -> Running {
    runyard_telemetry::install_crypto_provider();
    let app = App::build(config).await.expect("tracker builds");
    let addr = app.local_addr();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    Running {
        stop: Some(tx),
        task,
        addr,
    }
}

async fn bus(nats: &TestNats, ns: &Namespace) -> Bus {
    let bus = Bus::connect(&nats.url(), ns.clone(), "test-publisher", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    bus
}

async fn publish(bus: &Bus, events: &[Event]) {
    let tp = TraceParent::new_root();
    for chunk in events.chunks(500) {
        let acks = chunk.iter().map(|e| bus.publish_event(e, &tp));
        for r in futures::future::join_all(acks).await {
            r.unwrap();
        }
    }
}

/// Publishes an event again under another `Nats-Msg-Id`, as if the dedup
/// window had passed: the stream holds it twice, the projection must not.
async fn publish_again(bus: &Bus, event: &Event, n: usize) {
    let tp = TraceParent::new_root();
    let mut msg = bus.event_message(event, &tp).unwrap();
    msg.id = format!("again-{n}-{}", event.id);
    bus.publish(msg).await.unwrap();
}

async fn pool(url: &str) -> PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(url)
        .await
        .unwrap()
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap_or(-1)
}

/// Waits until `n` distinct events are applied.
/// Kills the child process when dropped, so a failing test leaves nothing running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_applied(url: &str, n: i64) -> PgPool {
    let url = url.to_owned();
    let p = eventually(WAIT, || {
        let url = url.clone();
        async move {
            let p = sqlx::postgres::PgPoolOptions::new()
                .max_connections(2)
                .connect(&url)
                .await
                .ok()?;
            let got = count(&p, "applied_events").await;
            (got == n).then_some(p)
        }
    })
    .await;
    p.unwrap_or_else(|| panic!("{n} events were not applied in time"))
}

async fn status_and_queued_at(p: &PgPool, job_id: u64) -> (i16, Option<time::OffsetDateTime>) {
    sqlx::query_as("SELECT status, queued_at FROM jobs WHERE job_id = $1")
        .bind(job_id as i64)
        .fetch_one(p)
        .await
        .unwrap()
}

fn shuffled_lifecycles(jobs: u64, seed: u64) -> Vec<Event> {
    let t = synth::base_time();
    let mut events: Vec<Event> = (1..=jobs).flat_map(|j| synth::lifecycle(j, t)).collect();
    events.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    events
}

#[tokio::test]
async fn shuffled_and_duplicated_events_give_the_right_rows() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(50, 7);
    publish(&bus, &events).await;
    for (n, e) in events.iter().take(30).enumerate() {
        publish_again(&bus, e, n).await;
    }
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let p = wait_applied(&db.url, 200).await;
    assert_eq!(count(&p, "jobs").await, 50);
    assert_eq!(count(&p, "usage_samples").await, 50);
    type Row = (i64, i16, Option<String>, Option<String>, bool, bool, bool);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT job_id, status, conclusion, runner_name, queued_at = created_at,
                started_at IS NOT NULL, completed_at > started_at
         FROM jobs ORDER BY job_id",
    )
    .fetch_all(&p)
    .await
    .unwrap();
    for (job_id, status, conclusion, runner, queued_ok, started, completed) in rows {
        assert_eq!(status, 4, "job {job_id}");
        let want = if job_id % 7 == 0 {
            "failure"
        } else {
            "success"
        };
        assert_eq!(conclusion.as_deref(), Some(want));
        assert_eq!(runner, Some(format!("runner-{}", job_id % 9)));
        assert!(
            queued_ok && started && completed,
            "timestamps of job {job_id}"
        );
    }
    // Usage joins its job.
    let joined: i64 = sqlx::query_scalar("SELECT count(*) FROM job_usage WHERE job_status = 4")
        .fetch_one(&p)
        .await
        .unwrap();
    assert_eq!(joined, 50);

    // Completed before queued; usage before the job.
    let late = 9_999;
    publish(&bus, &[synth::usage_event(late, synth::base_time())]).await;
    publish(
        &bus,
        &[synth::job_event(
            late,
            JobStatus::Completed,
            synth::base_time(),
        )],
    )
    .await;
    let p = wait_applied(&db.url, 202).await;
    let (status, queued) = status_and_queued_at(&p, late).await;
    assert_eq!((status, queued), (4, None));
    publish(
        &bus,
        &[synth::job_event(
            late,
            JobStatus::Queued,
            synth::base_time(),
        )],
    )
    .await;
    let p = wait_applied(&db.url, 203).await;
    let (status, queued) = status_and_queued_at(&p, late).await;
    assert_eq!(status, 4, "a late queued does not regress the status");
    assert_eq!(queued, Some(synth::base_time()), "but fills queued_at");
    t.stop().await;
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn batch_and_one_by_one_in_any_order_agree() {
    // The SQL merge and the in-memory merge are the same function.
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let (a, b) = (TestDb::new(), TestDb::new());
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(30, 11);
    publish(&bus, &events).await;
    runyard_store::migrate(&a.url).await.unwrap();
    runyard_store::migrate(&b.url).await.unwrap();
    let (pa, pb) = (pool(&a.url).await, pool(&b.url).await);
    rebuild::replay(&bus, &pa, 1, 10_000).await.unwrap();
    rebuild::replay(&bus, &pb, 1, 1).await.unwrap();
    let (da, db_) = (
        runyard_store::canonical_dump(&pa).await.unwrap(),
        runyard_store::canonical_dump(&pb).await.unwrap(),
    );
    assert!(da.contains("-- jobs (30 rows)"), "{da}");
    assert_eq!(da, db_);
    pa.close().await;
    pb.close().await;
    a.drop_db().await;
    b.drop_db().await;
}

#[tokio::test]
async fn two_trackers_build_the_same_projection_as_one() {
    let nats = TestNats::get().await;
    let (ns_two, ns_one) = (unique_namespace(), unique_namespace());
    let (db_two, db_one) = (TestDb::new(), TestDb::new());
    let events = shuffled_lifecycles(400, 3);
    for ns in [&ns_two, &ns_one] {
        let bus = bus(&nats, ns).await;
        publish(&bus, &events).await;
        for (n, e) in events.iter().step_by(9).enumerate() {
            publish_again(&bus, e, n).await;
        }
    }
    let r1 = start(config(&nats.url(), &ns_two, &db_two.url)).await;
    let r2 = start(config(&nats.url(), &ns_two, &db_two.url)).await;
    let single = start(config(&nats.url(), &ns_one, &db_one.url)).await;
    let p_two = wait_applied(&db_two.url, 1600).await;
    let p_one = wait_applied(&db_one.url, 1600).await;
    r1.stop().await;
    r2.stop().await;
    single.stop().await;
    let two = runyard_store::canonical_dump(&p_two).await.unwrap();
    let one = runyard_store::canonical_dump(&p_one).await.unwrap();
    assert!(one.contains("-- jobs (400 rows)"));
    assert_eq!(two, one);
    p_two.close().await;
    p_one.close().await;
    db_two.drop_db().await;
    db_one.drop_db().await;
}

#[tokio::test]
async fn kill_dash_nine_mid_batch_loses_and_duplicates_nothing() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(3000, 5);
    publish(&bus, &events).await;
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"))
            .env("RUNYARD_NATS_URL", nats.url())
            .env("RUNYARD_NAMESPACE", ns.as_str())
            .env("RUNYARD_DATABASE_URL", &db.url)
            .env("RUNYARD_TRACKER_HTTP_LISTEN", "127.0.0.1:0")
            .env("RUNYARD_TRACKER_BATCH_SIZE", "100")
            .env("RUNYARD_TRACKER_ACK_WAIT", "2s")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(KillOnDrop)
            .unwrap()
    };
    let mut child = spawn();
    // Kill it once it is part-way through.
    let url = db.url.clone();
    let partway = eventually(WAIT, || {
        let url = url.clone();
        async move {
            let p = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .ok()?;
            let n = count(&p, "applied_events").await;
            p.close().await;
            (n > 500).then_some(n)
        }
    })
    .await
    .expect("tracker made progress");
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    let p = pool(&db.url).await;
    let at_kill = count(&p, "applied_events").await;
    assert!(
        at_kill >= partway && at_kill < 12_000,
        "killed part-way ({at_kill})"
    );
    let child = spawn();
    let p2 = wait_applied(&db.url, 12_000).await;
    drop(child);
    assert_eq!(count(&p2, "jobs").await, 3000);
    assert_eq!(count(&p2, "usage_samples").await, 3000);
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE status = 4 AND queued_at IS NOT NULL")
            .fetch_one(&p2)
            .await
            .unwrap();
    assert_eq!(done, 3000);
    p.close().await;
    p2.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn postgres_outage_under_load_then_catch_up() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let proxy = TcpProxy::start(SocketAddr::from(([127, 0, 0, 1], 5432))).await;
    let via_proxy = db.url.replace("127.0.0.1:5432", &proxy.addr().to_string());
    assert_ne!(
        via_proxy, db.url,
        "test database url goes through the proxy"
    );
    let events = shuffled_lifecycles(600, 9);
    let (first, second) = events.split_at(1200);
    publish(&bus, first).await;
    let t = start(config(&nats.url(), &ns, &via_proxy)).await;
    let _ = wait_applied(&db.url, 1200).await;
    let http = reqwest::Client::new();
    let ready = format!("http://{}/readyz", t.addr);
    assert_eq!(http.get(&ready).send().await.unwrap().status(), 200);

    proxy.cut().await;
    publish(&bus, second).await;
    let red = eventually(Duration::from_secs(15), || {
        let (http, ready) = (http.clone(), ready.clone());
        async move {
            let s = http.get(&ready).send().await.ok()?.status();
            (s == 503).then_some(())
        }
    })
    .await;
    assert!(
        red.is_some(),
        "readyz turns red while Postgres is unreachable"
    );
    let p = pool(&db.url).await;
    assert_eq!(
        count(&p, "applied_events").await,
        1200,
        "nothing applied while cut"
    );

    proxy.restore().await;
    let p = wait_applied(&db.url, 2400).await;
    assert_eq!(count(&p, "jobs").await, 600);
    t.stop().await;
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn poison_message_is_dead_lettered_and_the_rest_applied() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(10, 1);
    publish(&bus, &events[..20]).await;
    bus.publish(Outgoing {
        subject: ns.job_subject(runyard_events::Forge::Github, JobStatus::Queued),
        id: "poison-1".into(),
        headers: vec![],
        payload: bytes::Bytes::from_static(b"\xff\xff definitely not protobuf"),
    })
    .await
    .unwrap();
    publish(&bus, &events[20..]).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let p = wait_applied(&db.url, 40).await;
    assert_eq!(count(&p, "jobs").await, 10);
    // The poison message sits on the dead-letter subject with its reason.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let dead = eventually(Duration::from_secs(20), || {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let msgs = runyard_testkit::stream_messages(&client, &ns.events_stream()).await;
            msgs.into_iter()
                .find(|m| m.subject.as_str() == ns.deadletter_subject())
        }
    })
    .await
    .expect("dead-lettered");
    let headers = dead.headers.as_ref().unwrap();
    assert!(
        headers
            .get("Runyard-Deadletter-Reason")
            .unwrap()
            .as_str()
            .contains("undecodable")
    );
    assert_eq!(dead.payload.as_ref(), b"\xff\xff definitely not protobuf");
    t.stop().await;
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn rebuild_equals_the_live_projection_and_swaps_in() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let live = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(120, 13);
    publish(&bus, &events).await;
    for (n, e) in events.iter().step_by(5).enumerate() {
        publish_again(&bus, e, n).await;
    }
    let t = start(config(&nats.url(), &ns, &live.url)).await;
    let p = wait_applied(&live.url, 480).await;
    t.stop().await;
    let live_dump = runyard_store::canonical_dump(&p).await.unwrap();
    p.close().await;

    let target = format!("{}_rb", live.name);
    let opts = rebuild::RebuildOptions {
        live_url: live.url.clone(),
        into: Some(target.clone()),
        swap: false,
        batch_size: 64,
    };
    let (url, done) = rebuild::rebuild(&bus, &opts).await.unwrap();
    assert_eq!(done.applied, 480);
    let p = pool(&url).await;
    assert_eq!(runyard_store::canonical_dump(&p).await.unwrap(), live_dump);
    p.close().await;

    // Swap: the live name now holds a rebuilt projection, equal to the old.
    let opts = rebuild::RebuildOptions { swap: true, ..opts };
    rebuild::rebuild(&bus, &opts).await.unwrap();
    let p = pool(&live.url).await;
    let meta: String =
        sqlx::query_scalar("SELECT value FROM projection_meta WHERE key = 'replayed_through'")
            .fetch_one(&p)
            .await
            .unwrap();
    assert!(meta.parse::<u64>().unwrap() >= 480);
    assert_eq!(runyard_store::canonical_dump(&p).await.unwrap(), live_dump);
    p.close().await;
    let admin = pool(&live.sibling("postgres")).await;
    let old: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1")
            .bind(format!("{}_old_%", live.name))
            .fetch_all(&admin)
            .await
            .unwrap();
    assert_eq!(old.len(), 1, "the previous projection is kept aside");
    for name in old.iter().chain([&target]) {
        let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
            .execute(&admin)
            .await;
    }
    admin.close().await;
    live.drop_db().await;
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    publish(&bus, &shuffled_lifecycles(5, 2)).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let p = wait_applied(&db.url, 20).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", t.addr);
    assert_eq!(
        http.get(format!("{base}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let ready = eventually(Duration::from_secs(10), || {
        let http = http.clone();
        let url = format!("{base}/readyz");
        async move { (http.get(url).send().await.ok()?.status() == 200).then_some(()) }
    })
    .await;
    assert!(ready.is_some());
    let text = eventually(Duration::from_secs(10), || {
        let http = http.clone();
        let url = format!("{base}/metrics");
        async move {
            let text = http.get(url).send().await.ok()?.text().await.ok()?;
            text.contains("runyard_tracker_consumer_lag 0")
                .then_some(text)
        }
    })
    .await
    .expect("lag reaches 0");
    assert!(
        text.contains(r#"runyard_tracker_events_total{result="applied"} 20"#),
        "{text}"
    );
    assert!(text.contains("runyard_tracker_batch_size_bucket"));
    assert!(text.contains("runyard_tracker_apply_latency_seconds"));
    t.stop().await;
    p.close().await;
    db.drop_db().await;
}
