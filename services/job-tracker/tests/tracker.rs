//! job-tracker against a real nats-server and a real Postgres (a database per
//! test): ordering, duplicates, crashes, replicas, outages, poison, rebuild.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use runyard_bus::{Bus, Outgoing, StreamSettings, TraceParent};
use runyard_events::{Body, Event, JobStatus, Namespace};
use runyard_job_tracker::{App, Config, rebuild};
use runyard_testkit::postgres::PrivatePostgres;
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
        bus: runyard_config::Bus {
            nats_url: nats_url.to_owned(),
            namespace: ns.to_string(),
        },
        database: runyard_config::Database {
            url: db_url.to_owned(),
        },
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

/// The tracker binary on `db_url`, in batches of 100 with a 2 s ack wait.
fn spawn_batch_tracker(nats_url: &str, ns: &Namespace, db_url: &str) -> KillOnDrop {
    std::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"))
        .env("RUNYARD_NATS_URL", nats_url)
        .env("RUNYARD_NAMESPACE", ns.as_str())
        .env("RUNYARD_DATABASE_URL", db_url)
        .env("RUNYARD_TRACKER_HTTP_LISTEN", "127.0.0.1:0")
        .env("RUNYARD_TRACKER_BATCH_SIZE", "100")
        .env("RUNYARD_TRACKER_ACK_WAIT", "2s")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(KillOnDrop)
        .unwrap()
}

/// Waits until more than `n` events are applied; how many were.
async fn applied_beyond(url: &str, n: i64) -> i64 {
    let url = url.to_owned();
    eventually(WAIT, || {
        let url = url.clone();
        async move {
            let p = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .ok()?;
            let got = count(&p, "applied_events").await;
            p.close().await;
            (got > n).then_some(got)
        }
    })
    .await
    .expect("tracker made progress")
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

/// Publishes `job`'s observation (`word`, received `secs` after the base
/// time), waits until `applied` events are in, and returns the job's status.
async fn status_after(
    bus: &Bus,
    url: &str,
    applied: i64,
    job: u64,
    (status, word, secs): (JobStatus, &str, i64),
) -> i16 {
    publish(bus, &[synth::observation(job, status, word, secs)]).await;
    let p = wait_applied(url, applied).await;
    let got = status_and_queued_at(&p, job).await.0;
    p.close().await;
    got
}

#[tokio::test]
async fn queued_and_waiting_alternate_and_a_gitlab_created_job_waits_in_the_database() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let url = db.url.as_str();
    // Job 1: waited for an approval, then queued; the deliveries arrive
    // one by one (each its own transaction against the stored row).
    let waiting = (JobStatus::Waiting, "waiting", 1);
    assert_eq!(status_after(&bus, url, 1, 1, waiting).await, 2);
    let queued = (JobStatus::Queued, "queued", 60);
    assert_eq!(
        status_after(&bus, url, 2, 1, queued).await,
        1,
        "approved: queued"
    );
    // An older `waiting` redelivered late does not take it back.
    let late = (JobStatus::Waiting, "waiting", 0);
    assert_eq!(status_after(&bus, url, 3, 1, late).await, 1);
    // Job 2: GitLab's `created` hook arrives after `pending`.
    status_after(&bus, url, 4, 2, (JobStatus::Queued, "pending", 5)).await;
    let created = (JobStatus::Waiting, "created", 9);
    assert_eq!(
        status_after(&bus, url, 5, 2, created).await,
        1,
        "still pending"
    );
    // Job 3: running, then a late `waiting`: running stays.
    status_after(&bus, url, 6, 3, (JobStatus::InProgress, "in_progress", 5)).await;
    let late = (JobStatus::Waiting, "waiting", 99);
    assert_eq!(status_after(&bus, url, 7, 3, late).await, 3);
    t.stop().await;
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
    let spawn = || spawn_batch_tracker(&nats.url(), &ns, &db.url);
    let mut child = spawn();
    // Kill it once it is part-way through.
    let partway = applied_beyond(&db.url, 500).await;
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
async fn postgres_restarted_for_real_mid_batch_loses_and_doubles_nothing() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let pg = PrivatePostgres::start("test-restart");
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(3000, 11);
    publish(&bus, &events).await;
    let mut child = spawn_batch_tracker(&nats.url(), &ns, &pg.url());
    // Crash Postgres once the tracker is part-way through: batches are in
    // flight, some of them committed, one of them open.
    let partway = applied_beyond(&pg.url(), 1000).await;
    pg.crash_and_restart(Duration::from_secs(2));
    let p = wait_applied(&pg.url(), 12_000).await;
    assert!(partway < 12_000, "crashed part-way ({partway})");
    // The same process rode it out: no restart, nothing lost or doubled.
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "tracker still running"
    );
    assert_eq!(count(&p, "jobs").await, 3000);
    assert_eq!(count(&p, "usage_samples").await, 3000);
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE status = 4 AND queued_at IS NOT NULL")
            .fetch_one(&p)
            .await
            .unwrap();
    assert_eq!(done, 3000);
    let client = async_nats::connect(nats.url()).await.unwrap();
    let dead = runyard_testkit::stream_messages(&client, &ns.events_stream())
        .await
        .into_iter()
        .filter(|m| m.subject.as_str() == ns.deadletter_subject())
        .count();
    assert_eq!(dead, 0, "a restart dead-letters nothing");
    println!("restart: crashed with {partway} of 12000 applied; 12000 applied once, 3000 jobs");
    p.close().await;
}

#[tokio::test]
async fn a_tls_postgres_is_reached_with_its_ca_and_another_ca_is_refused_at_start() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let pki = runyard_testkit::pki::TestPki::new();
    let pg = PrivatePostgres::start_tls("test-tls", &pki.server.cert, &pki.server.key);
    let tls_url = |ca: &std::path::Path| {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            pg.url(),
            ca.display()
        )
    };

    // A CA that did not sign the server's certificate: the tracker refuses
    // to start, saying why, rather than waiting as if Postgres were down.
    let refused = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"))
        .env("RUNYARD_NATS_URL", nats.url())
        .env("RUNYARD_NAMESPACE", ns.as_str())
        .env("RUNYARD_DATABASE_URL", tls_url(&pki.other_ca_file))
        .env("RUNYARD_TRACKER_HTTP_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output();
    let refused = tokio::time::timeout(WAIT, refused)
        .await
        .expect("exits")
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("certificate"), "{stderr}");

    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(20, 5);
    publish(&bus, &events).await;
    let url = tls_url(&pki.ca_file);
    let _tracker = spawn_batch_tracker(&nats.url(), &ns, &url);
    let p = wait_applied(&url, 80).await;
    assert_eq!(count(&p, "jobs").await, 20);
    p.close().await;
    // Every connection of the tracker's is encrypted (this one, over TLS
    // too, left out).
    let mut own = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .unwrap();
    let (tracker, plain): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE NOT s.ssl) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) \
         WHERE a.backend_type = 'client backend' AND a.pid <> pg_backend_pid()",
    )
    .fetch_one(&mut own)
    .await
    .unwrap();
    assert!(tracker >= 1, "the tracker is connected");
    assert_eq!(plain, 0, "{plain} of {tracker} connections in plaintext");
    println!("tls postgres: 80 events applied; the tracker holds {tracker} connections, all TLS");
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
    assert!(text.contains("\nrunyard_tracker_stalled 0\n"), "{text}");
    assert!(text.contains("runyard_tracker_apply_latency_seconds"));
    t.stop().await;
    p.close().await;
    db.drop_db().await;
}

// ---------------------------------------------------------------------------
// Runners: the scaler's runner events projected into `runners`.

mod runner_events {
    use runyard_events::{
        Body, Event, Forge, JobKey, RunnerAssigned, RunnerCreated, RunnerDeleted, RunnerFailed,
        RunnerOnline, RunnerRef, RunnerRequested, Source, runner_event_id_for, timestamp,
    };

    pub const POOL: &str = "linux-x64";

    /// The name of test runner `n`.
    pub fn name(n: u64) -> String {
        format!("ry-{POOL}-{n:010x}")
    }

    fn job(job_id: u64) -> Option<JobKey> {
        Some(JobKey {
            forge: Forge::Github as i32,
            instance: "github.com".into(),
            job_id,
        })
    }

    /// An event about runner `n`, `secs` after the base time, with its
    /// contract id.
    pub fn at(n: u64, secs: i64, body: impl FnOnce(Option<RunnerRef>) -> Body) -> Event {
        let body = body(Some(RunnerRef {
            pool: POOL.into(),
            name: name(n),
            pool_id: "0b9e0f0a-5c1d-5f43-9a57-1f3e2c4d5e6f".into(),
            provider: "lxd".into(),
            forge: Forge::Github as i32,
            instance: "github.com".into(),
        }));
        let t = runyard_testkit::synth::base_time() + time::Duration::seconds(secs);
        Event {
            id: runner_event_id_for(&body).unwrap(),
            occurred_at: Some(timestamp(t)),
            received_at: Some(timestamp(t + time::Duration::milliseconds(3))),
            source: Some(Source {
                forge: Forge::Github as i32,
                instance: "github.com".into(),
                producer: "scaler".into(),
                ..Source::default()
            }),
            body: Some(body),
        }
    }

    pub fn requested(n: u64, job_id: Option<u64>) -> Event {
        at(n, 0, |runner| {
            Body::RunnerRequested(RunnerRequested {
                runner,
                job: job_id.and_then(job),
                run_attempt: 1,
                claim_key: job_id
                    .map(|j| format!("github.github_com.{j}.1"))
                    .unwrap_or_default(),
                reason: if job_id.is_some() {
                    "queued_job"
                } else {
                    "min_idle"
                }
                .into(),
                flavor: "small".into(),
                memory_bytes: 4 << 30,
                cpus: 2,
                recommended_memory_limit_bytes: Some(3 << 30),
                workload_key: "job=build;repo=acme/app;workflow=CI".into(),
                labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
                image: "ubuntu:24.04".into(),
                ..RunnerRequested::default()
            })
        })
    }

    pub fn failed(n: u64, secs: i64, attempt: u32, reason: &str, given_up: bool) -> Event {
        at(n, secs, |runner| {
            Body::RunnerFailed(RunnerFailed {
                runner,
                reason: reason.into(),
                error: format!("attempt {attempt}: provider said no"),
                attempt,
                given_up,
                job: job(42),
            })
        })
    }

    pub fn created(n: u64, secs: i64, attempt: u32) -> Event {
        at(n, secs, |runner| {
            Body::RunnerCreated(RunnerCreated {
                runner,
                provider_id: format!("lxd-{attempt}"),
                forge_runner_id: Some(77),
                attempt,
                status: "running".into(),
            })
        })
    }

    pub fn online(n: u64, secs: i64) -> Event {
        at(n, secs, |runner| {
            Body::RunnerOnline(RunnerOnline {
                runner,
                source: "callback".into(),
            })
        })
    }

    pub fn assigned(n: u64, secs: i64, job_id: u64) -> Event {
        at(n, secs, |runner| {
            Body::RunnerAssigned(RunnerAssigned {
                runner,
                job: job(job_id),
            })
        })
    }

    pub fn deleted(n: u64, secs: i64, reason: &str) -> Event {
        at(n, secs, |runner| {
            Body::RunnerDeleted(RunnerDeleted {
                runner,
                reason: reason.into(),
            })
        })
    }

    /// All six events of one runner's life: the first create fails, the
    /// second succeeds, the runner takes job 42 and is deleted after it.
    pub fn life(n: u64) -> Vec<Event> {
        vec![
            requested(n, Some(42)),
            failed(n, 10, 1, "create_failed", false),
            created(n, 20, 2),
            online(n, 30),
            assigned(n, 40, 42),
            deleted(n, 100, "job_completed"),
        ]
    }

    /// Events the id contract makes unlikely but a log may hold: a second
    /// assignment at the same time, a second online under another id,
    /// another failure of the same attempt.
    pub fn rivals(n: u64) -> Vec<Event> {
        let mut again = online(n, 30);
        again.id.push_str(":again");
        if let Some(Body::RunnerOnline(o)) = again.body.as_mut() {
            o.source = "forge_list".into();
        }
        let mut other = failed(n, 10, 1, "provider_error", false);
        other.id.push_str(":other");
        vec![assigned(n, 40, 44), again, other]
    }
}

/// Every runner row as it is stored.
async fn runner_rows(p: &PgPool) -> Vec<runyard_store::entities::runner::Model> {
    use runyard_store::entities::runner;
    use sea_orm::{EntityTrait as _, QueryOrder as _};
    let db = sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(p.clone());
    runner::Entity::find()
        .order_by_asc(runner::Column::Name)
        .all(&db)
        .await
        .unwrap()
}

async fn runner_state(p: &PgPool, name: &str) -> (String, Option<String>, i32) {
    sqlx::query_as("SELECT state, reason, attempts FROM runners WHERE name = $1")
        .bind(name)
        .fetch_one(p)
        .await
        .unwrap()
}

#[tokio::test]
async fn runner_events_in_any_order_and_duplicated_give_the_same_row() {
    use runner_events::{life, name, rivals};
    const RUNNERS: u64 = 30;
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let bus = bus(&nats, &ns).await;
    // Runners 0-5 get all six events of a life, each in its own order;
    // 6-11 the first 1..=6 of them (every state); the rest a random part of
    // a life and its rivals. The runners are interleaved.
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut lives = Vec::new();
    for n in 0..RUNNERS {
        let mut events = match n {
            0..6 => life(n),
            6..12 => life(n)[..(n - 5) as usize].to_vec(),
            _ => {
                let all: Vec<Event> = life(n).into_iter().chain(rivals(n)).collect();
                let mut some: Vec<Event> = all
                    .into_iter()
                    .filter(|_| rand::Rng::random_bool(&mut rng, 0.6))
                    .collect();
                if some.is_empty() {
                    some = rivals(n);
                }
                some
            }
        };
        events.shuffle(&mut rng);
        lives.push(events);
    }
    let mut events: Vec<Event> = lives.iter().flatten().cloned().collect();
    let distinct = events.len() as i64;
    events.shuffle(&mut rng);
    publish(&bus, &events).await;
    // Half again past the dedup window, some again within it.
    for (n, e) in events.iter().enumerate().step_by(2) {
        publish_again(&bus, e, n).await;
    }
    publish(&bus, &events[..10]).await;

    let live = TestDb::new();
    let t = start(config(&nats.url(), &ns, &live.url)).await;
    let p = wait_applied(&live.url, distinct).await;
    t.stop().await;

    // Whatever the order, each runner's row is the row of its events folded
    // in memory in the order they were made, and Postgres derives the same
    // state, reason and attempts as Rust.
    let rows = runner_rows(&p).await;
    assert_eq!(rows.len(), RUNNERS as usize);
    let mut made_in_order = lives.clone();
    for l in &mut made_in_order {
        l.sort_by_key(|e| e.occurred_at.map(|t| (t.seconds, t.nanos)));
    }
    for (events, row) in made_in_order.iter().zip(&rows) {
        let mut delta = runyard_job_tracker::projection::Delta::default();
        for e in events {
            delta.add(e).unwrap();
        }
        let mut want = delta.runners.remove(&row.name).unwrap();
        want.id = row.id;
        assert_eq!(row, &want, "runner {}", row.name);
    }
    // The six shuffled whole lives are one row, and it is right.
    for (n, row) in (0..6).zip(&rows) {
        assert_eq!(row.name, name(n));
        assert_eq!(
            (row.state.as_str(), row.reason.as_deref(), row.attempts),
            ("deleted", Some("job_completed"), 2)
        );
        assert_eq!((row.job_id, row.created_attempt), (Some(42), Some(2)));
        let strip = |r: &runyard_store::entities::runner::Model| {
            let mut r = r.clone();
            r.id = 0;
            let json = format!("{r:?}");
            json.replace(&r.name, "NAME")
        };
        assert_eq!(strip(row), strip(&rows[0]));
    }
    let states: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.state.as_str()).collect();
    assert_eq!(states.len(), 6, "every state is covered: {states:?}");

    // Applied one event per transaction (the SQL merge alone, in stream
    // order) or a few at a time, the projection is the same.
    let live_dump = runyard_store::canonical_dump(&p).await.unwrap();
    assert!(
        live_dump.contains(&format!("-- runners ({RUNNERS} rows)")),
        "{live_dump}"
    );
    for batch in [1, 4] {
        let other = TestDb::new();
        runyard_store::migrate(&other.url).await.unwrap();
        let po = pool(&other.url).await;
        rebuild::replay(&bus, &po, 1, batch).await.unwrap();
        assert_eq!(
            runyard_store::canonical_dump(&po).await.unwrap(),
            live_dump,
            "batches of {batch}"
        );
        po.close().await;
        other.drop_db().await;
    }
    p.close().await;
    live.drop_db().await;
}

#[tokio::test]
async fn a_deleted_runner_stays_deleted_when_a_late_online_arrives() {
    use runner_events::{created, deleted, failed, name, online, requested};
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    publish(
        &bus,
        &[
            requested(1, Some(42)),
            created(1, 20, 1),
            deleted(1, 60, "bootstrap_timeout"),
        ],
    )
    .await;
    let p = wait_applied(&db.url, 3).await;
    let deleted_state = (
        "deleted".to_owned(),
        Some("bootstrap_timeout".to_owned()),
        1,
    );
    assert_eq!(runner_state(&p, &name(1)).await, deleted_state);

    p.close().await;
    // Each in a batch of its own, so the stored row meets them in SQL.
    publish(&bus, &[online(1, 30)]).await;
    let p = wait_applied(&db.url, 4).await;
    assert_eq!(runner_state(&p, &name(1)).await, deleted_state);
    p.close().await;
    publish(&bus, &[failed(1, 90, 1, "bootstrap_timeout", false)]).await;
    let p = wait_applied(&db.url, 5).await;
    assert_eq!(runner_state(&p, &name(1)).await, deleted_state);
    let (online_at, failed_at): (Option<time::OffsetDateTime>, Option<time::OffsetDateTime>) =
        sqlx::query_as("SELECT online_at, failed_at FROM runners WHERE name = $1")
            .bind(name(1))
            .fetch_one(&p)
            .await
            .unwrap();
    assert!(
        online_at.is_some() && failed_at.is_some(),
        "late steps are recorded, just not as the state"
    );

    p.close().await;

    // Another runner's failed first attempt is overtaken by its second,
    // even when the failure arrives last ...
    publish(&bus, &[created(2, 20, 2)]).await;
    wait_applied(&db.url, 6).await.close().await;
    publish(&bus, &[failed(2, 10, 1, "create_failed", false)]).await;
    let p = wait_applied(&db.url, 7).await;
    assert_eq!(
        runner_state(&p, &name(2)).await,
        ("created".to_owned(), None, 2)
    );
    p.close().await;
    // ... while a failure of the attempt that was created counts.
    publish(&bus, &[created(3, 20, 1)]).await;
    wait_applied(&db.url, 8).await.close().await;
    publish(&bus, &[failed(3, 50, 1, "bootstrap_timeout", false)]).await;
    let p = wait_applied(&db.url, 9).await;
    assert_eq!(
        runner_state(&p, &name(3)).await,
        ("failed".to_owned(), Some("bootstrap_timeout".to_owned()), 1)
    );
    t.stop().await;
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn rebuild_command_reproduces_the_runners_table() {
    use runner_events::{created, failed, life, online, requested};
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let live = TestDb::new();
    let bus = bus(&nats, &ns).await;
    // Jobs and runners in one log: whole lives, a runner given up, a
    // min-idle runner still online.
    let mut events = shuffled_lifecycles(40, 21);
    for n in 0..6 {
        events.extend(life(n));
    }
    events.extend([
        requested(6, Some(43)),
        failed(6, 10, 1, "create_failed", false),
        failed(6, 40, 2, "gave_up", true),
        requested(7, None),
        created(7, 5, 1),
        online(7, 9),
    ]);
    events.shuffle(&mut rand::rngs::StdRng::seed_from_u64(5));
    publish(&bus, &events).await;
    for (n, e) in events.iter().step_by(7).enumerate() {
        publish_again(&bus, e, n).await;
    }
    let t = start(config(&nats.url(), &ns, &live.url)).await;
    let p = wait_applied(&live.url, events.len() as i64).await;
    t.stop().await;
    let live_dump = runyard_store::canonical_dump(&p).await.unwrap();
    assert!(live_dump.contains("-- runners (8 rows)"), "{live_dump}");
    let states: Vec<(String, String)> =
        sqlx::query_as("SELECT name, state FROM runners WHERE name IN ($1, $2)")
            .bind(runner_events::name(6))
            .bind(runner_events::name(7))
            .fetch_all(&p)
            .await
            .unwrap();
    assert_eq!(states.len(), 2);
    for (name, state) in states {
        let want = if name == runner_events::name(6) {
            "failed"
        } else {
            "online"
        };
        assert_eq!(state, want, "{name}");
    }
    p.close().await;

    // The command itself, in small batches so runner rows meet in SQL too.
    let target = format!("{}_rb", live.name);
    let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"))
        .args(["rebuild", "--into", &target, "--batch-size", "7"])
        .env("RUNYARD_NATS_URL", nats.url())
        .env("RUNYARD_NAMESPACE", ns.as_str())
        .env("RUNYARD_DATABASE_URL", &live.url)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .status()
        .await
        .unwrap();
    assert!(status.success(), "rebuild exited with {status}");
    let rebuilt = pool(&live.sibling(&target)).await;
    assert_eq!(
        runyard_store::canonical_dump(&rebuilt).await.unwrap(),
        live_dump
    );
    rebuilt.close().await;
    let admin = pool(&live.sibling("postgres")).await;
    let _ = sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{target}\" WITH (FORCE)"
    ))
    .execute(&admin)
    .await;
    admin.close().await;
    live.drop_db().await;
}

// ---------------------------------------------------------------------------
// Retries: the scaler's retry events projected into `retries`, one row each.

mod retry_events {
    use runyard_events::{
        Body, Event, Forge, JobKey, RetryIssued, RetryJob, RetryRefused, RetryRequested,
        RetryTarget, Source, ids, timestamp,
    };

    const GL: &str = "gitlab.example.com";
    const GH: &str = "github.com";

    fn instance(forge: Forge) -> &'static str {
        if forge == Forge::Github { GH } else { GL }
    }

    fn target(forge: Forge, unit: &str, pipeline_id: u64, run_attempt: u32) -> Option<RetryTarget> {
        Some(RetryTarget {
            forge: forge as i32,
            instance: instance(forge).into(),
            project_id: 12,
            project: "acme/app".into(),
            pipeline_id,
            run_attempt,
            r#ref: "main".into(),
            sha: "abc123".into(),
            unit: unit.into(),
        })
    }

    pub fn job(forge: Forge, job_id: u64, attempt: u32) -> RetryJob {
        RetryJob {
            job: Some(JobKey {
                forge: forge as i32,
                instance: instance(forge).into(),
                job_id,
            }),
            attempt,
            name: format!("build {job_id}"),
            workload_key: "package=py-torch".into(),
            oom_streak: 1,
            memory_limit_bytes: Some(4 << 30),
            peak_memory_bytes: (4 << 30) - 1,
            exit_code: Some(137),
        }
    }

    /// A retry event about `unit`, `secs` after the base time, with its
    /// contract id (`what` = `requested`, `job:<id>:issued`, ...).
    pub fn at(forge: Forge, unit: &str, what: &str, secs: i64, body: Body) -> Event {
        let t = runyard_testkit::synth::base_time() + time::Duration::seconds(secs);
        Event {
            id: ids::retry(forge, instance(forge), unit, what),
            occurred_at: Some(timestamp(t)),
            received_at: Some(timestamp(t + time::Duration::milliseconds(3))),
            source: Some(Source {
                forge: forge as i32,
                instance: instance(forge).into(),
                producer: "scaler".into(),
                ..Source::default()
            }),
            body: Some(body),
        }
    }

    /// GitLab pipeline 900: two OOM-killed jobs, a new pipeline created
    /// after one transient error.
    pub fn gitlab_pipeline_issued(new_pipeline_id: u64) -> Vec<Event> {
        let unit = ids::retry_unit_pipeline(900);
        let jobs = vec![job(Forge::Gitlab, 41, 1), job(Forge::Gitlab, 42, 1)];
        vec![
            at(
                Forge::Gitlab,
                &unit,
                "requested",
                0,
                Body::RetryRequested(RetryRequested {
                    target: target(Forge::Gitlab, &unit, 900, 0),
                    strategy: "pipeline".into(),
                    jobs: jobs.clone(),
                }),
            ),
            at(
                Forge::Gitlab,
                &unit,
                "issued",
                2,
                Body::RetryIssued(RetryIssued {
                    target: target(Forge::Gitlab, &unit, 900, 0),
                    strategy: "pipeline".into(),
                    jobs,
                    new_pipeline_id,
                    new_job_ids: vec![],
                    new_sha: "def456".into(),
                    new_run_attempt: 0,
                    web_url: "https://gitlab.example.com/acme/app/-/pipelines/901".into(),
                    forge_calls: 2,
                    errors: vec!["502 Bad Gateway".into()],
                    adopted: false,
                    note: String::new(),
                }),
            ),
        ]
    }

    /// GitLab job 43, attempt 4: refused, the streak is over.
    pub fn gitlab_job_refused() -> Event {
        let unit = ids::retry_unit_job(43, 4);
        at(
            Forge::Gitlab,
            &unit,
            "refused",
            5,
            Body::RetryRefused(RetryRefused {
                target: target(Forge::Gitlab, &unit, 905, 4),
                reason: "max_attempts".into(),
                detail: "4th consecutive OOM kill".into(),
                jobs: vec![job(Forge::Gitlab, 43, 4)],
                forge_status: None,
                forge_calls: 0,
            }),
        )
    }

    /// GitHub run 555 attempt 1: job 77 re-run on its own (adopted after a
    /// restart), and run 556 refused by the forge.
    pub fn github_runs() -> Vec<Event> {
        let unit = ids::retry_unit_run(555, 1);
        let refused = ids::retry_unit_run(556, 1);
        vec![
            at(
                Forge::Github,
                &unit,
                "job:77:requested",
                10,
                Body::RetryRequested(RetryRequested {
                    target: target(Forge::Github, &unit, 555, 1),
                    strategy: "rerun_job".into(),
                    jobs: vec![job(Forge::Github, 77, 1)],
                }),
            ),
            at(
                Forge::Github,
                &unit,
                "job:77:issued",
                11,
                Body::RetryIssued(RetryIssued {
                    target: target(Forge::Github, &unit, 555, 1),
                    strategy: "rerun_job".into(),
                    jobs: vec![job(Forge::Github, 77, 1)],
                    new_job_ids: vec![78],
                    new_run_attempt: 2,
                    forge_calls: 1,
                    adopted: true,
                    note: String::new(),
                    ..RetryIssued::default()
                }),
            ),
            at(
                Forge::Github,
                &refused,
                "refused",
                12,
                Body::RetryRefused(RetryRefused {
                    target: target(Forge::Github, &refused, 556, 1),
                    reason: "forge_rejected".into(),
                    detail: "403: re-runs are disabled".into(),
                    jobs: vec![job(Forge::Github, 79, 1)],
                    forge_status: Some(403),
                    forge_calls: 1,
                }),
            ),
        ]
    }

    /// Six retry events of every kind, both forges.
    pub fn all() -> Vec<Event> {
        let mut events = gitlab_pipeline_issued(901);
        events.push(gitlab_job_refused());
        events.extend(github_runs());
        events
    }
}

/// Every retry row as it is stored, by event id.
async fn retry_rows(p: &PgPool) -> Vec<runyard_store::entities::retry::Model> {
    use runyard_store::entities::retry;
    use sea_orm::{EntityTrait as _, QueryOrder as _};
    let db = sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(p.clone());
    retry::Entity::find()
        .order_by_asc(retry::Column::EventId)
        .all(&db)
        .await
        .unwrap()
}

/// The rows `events` project to, folded in memory, by event id.
fn folded_retries(events: &[Event]) -> Vec<runyard_store::entities::retry::Model> {
    let mut delta = runyard_job_tracker::projection::Delta::default();
    for e in events {
        delta.add(e).unwrap();
    }
    delta.retries.into_values().collect()
}

#[tokio::test]
async fn retry_events_are_one_row_each_and_duplicates_change_nothing() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let events = retry_events::all();
    publish(&bus, &events).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let p = wait_applied(&db.url, 6).await;

    // Every column as Rust maps it, Postgres stores it.
    let rows = retry_rows(&p).await;
    assert_eq!(rows.len(), 6);
    let mut want = folded_retries(&events);
    want.sort_by(|a, b| a.event_id.cmp(&b.event_id));
    assert_eq!(rows, want);
    type Row = (
        String,
        String,
        String,
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<i32>,
        Option<i64>,
        Option<serde_json::Value>,
        Option<bool>,
    );
    let got: Vec<Row> = sqlx::query_as(
        "SELECT event_id, kind, unit, pipeline_id, strategy, reason, forge_status,
                new_pipeline_id, new_job_ids, adopted
         FROM retries ORDER BY occurred_at",
    )
    .fetch_all(&p)
    .await
    .unwrap();
    let gl = "retry:gitlab:gitlab.example.com";
    let gh = "retry:github:github.com";
    let expected: Vec<Row> = vec![
        (
            format!("{gl}:pipeline:900:requested"),
            "requested".into(),
            "pipeline:900".into(),
            Some(900),
            Some("pipeline".into()),
            None,
            None,
            None,
            None,
            None,
        ),
        (
            format!("{gl}:pipeline:900:issued"),
            "issued".into(),
            "pipeline:900".into(),
            Some(900),
            Some("pipeline".into()),
            None,
            None,
            Some(901),
            Some(serde_json::json!([])),
            Some(false),
        ),
        (
            format!("{gl}:job:43:4:refused"),
            "refused".into(),
            "job:43:4".into(),
            Some(905),
            None,
            Some("max_attempts".into()),
            None,
            None,
            None,
            None,
        ),
        (
            format!("{gh}:run:555:1:job:77:requested"),
            "requested".into(),
            "run:555:1".into(),
            Some(555),
            Some("rerun_job".into()),
            None,
            None,
            None,
            None,
            None,
        ),
        (
            format!("{gh}:run:555:1:job:77:issued"),
            "issued".into(),
            "run:555:1".into(),
            Some(555),
            Some("rerun_job".into()),
            None,
            None,
            None,
            Some(serde_json::json!([78])),
            Some(true),
        ),
        (
            format!("{gh}:run:556:1:refused"),
            "refused".into(),
            "run:556:1".into(),
            Some(556),
            None,
            Some("forge_rejected".into()),
            Some(403),
            None,
            None,
            None,
        ),
    ];
    assert_eq!(got, expected);
    // One `retry_jobs` row per job attempt covered.
    type JobRow = (String, i64, i32, Option<i64>, Option<i32>);
    let jobs: Vec<JobRow> = sqlx::query_as(
        "SELECT kind, job_id, attempt, memory_limit_bytes, exit_code FROM retry_jobs
         WHERE forge = 'gitlab' ORDER BY occurred_at, job_id",
    )
    .fetch_all(&p)
    .await
    .unwrap();
    let limit = Some(4_i64 << 30);
    assert_eq!(
        jobs,
        vec![
            ("requested".into(), 41, 1, limit, Some(137)),
            ("requested".into(), 42, 1, limit, Some(137)),
            ("issued".into(), 41, 1, limit, Some(137)),
            ("issued".into(), 42, 1, limit, Some(137)),
            ("refused".into(), 43, 4, limit, Some(137)),
        ]
    );

    // Every event again past the dedup window, one of them changed under
    // the same id, then one new event: only the new one adds a row.
    for (n, e) in events.iter().enumerate() {
        publish_again(&bus, e, n).await;
    }
    let mut changed = events[0].clone();
    if let Some(Body::RetryRequested(r)) = changed.body.as_mut() {
        r.strategy = "job".into();
        r.jobs.clear();
    }
    publish_again(&bus, &changed, 99).await;
    let mut new = retry_events::gitlab_job_refused();
    new.id = new.id.replace(":refused", ":refused:again");
    publish(&bus, &[new.clone()]).await;
    let p2 = wait_applied(&db.url, 7).await;
    let http = reqwest::Client::new();
    let metrics = format!("http://{}/metrics", t.addr);
    let counted = eventually(Duration::from_secs(20), || {
        let (http, url) = (http.clone(), metrics.clone());
        async move {
            let text = http.get(url).send().await.ok()?.text().await.ok()?;
            text.contains(r#"runyard_tracker_events_total{result="duplicate"} 7"#)
                .then_some(())
        }
    })
    .await;
    assert!(counted.is_some(), "the seven duplicates were seen");
    t.stop().await;
    let after = retry_rows(&p2).await;
    assert_eq!(after.len(), 7);
    let before: Vec<_> = after.into_iter().filter(|r| r.event_id != new.id).collect();
    assert_eq!(before, rows, "duplicates changed nothing");
    p.close().await;
    p2.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn rebuild_reproduces_the_retries_table() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let live = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let mut events = shuffled_lifecycles(20, 31);
    events.extend(retry_events::all());
    events.shuffle(&mut rand::rngs::StdRng::seed_from_u64(8));
    publish(&bus, &events).await;
    for (n, e) in events.iter().step_by(3).enumerate() {
        publish_again(&bus, e, n).await;
    }
    let t = start(config(&nats.url(), &ns, &live.url)).await;
    let p = wait_applied(&live.url, events.len() as i64).await;
    t.stop().await;
    let live_dump = runyard_store::canonical_dump(&p).await.unwrap();
    assert!(live_dump.contains("-- retries (6 rows)"), "{live_dump}");
    assert!(live_dump.contains("-- jobs (20 rows)"), "{live_dump}");
    p.close().await;

    // Small batches so retry rows and duplicates meet across transactions.
    let target = format!("{}_rb", live.name);
    let opts = rebuild::RebuildOptions {
        live_url: live.url.clone(),
        into: Some(target.clone()),
        swap: false,
        batch_size: 4,
    };
    let (url, done) = rebuild::rebuild(&bus, &opts).await.unwrap();
    assert_eq!(done.applied, events.len() as u64);
    let rebuilt = pool(&url).await;
    assert_eq!(
        runyard_store::canonical_dump(&rebuilt).await.unwrap(),
        live_dump
    );
    assert_eq!(
        retry_rows(&rebuilt).await.len(),
        6,
        "the rebuilt database has the rows, not only the dump"
    );
    rebuilt.close().await;
    let admin = pool(&live.sibling("postgres")).await;
    let _ = sqlx::query(&format!(
        "DROP DATABASE IF EXISTS \"{target}\" WITH (FORCE)"
    ))
    .execute(&admin)
    .await;
    admin.close().await;
    live.drop_db().await;
}

#[tokio::test]
async fn a_retry_event_with_an_id_that_cannot_be_stored_is_dead_lettered() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    // The request is fine; its issue names a new pipeline beyond bigint.
    let events = retry_events::gitlab_pipeline_issued(u64::MAX);
    let bad = events[1].id.clone();
    let mut all = events.clone();
    all.push(retry_events::gitlab_job_refused());
    publish(&bus, &all).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    // The refused event is dead-lettered, not recorded as applied.
    let p = wait_applied(&db.url, 2).await;
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
    t.stop().await;
    let headers = dead.headers.as_ref().unwrap();
    let reason = headers
        .get("Runyard-Deadletter-Reason")
        .unwrap()
        .as_str()
        .to_owned();
    assert!(reason.contains("new_pipeline_id"), "{reason}");
    assert_eq!(
        headers.get("Runyard-Original-Subject").unwrap().as_str(),
        ns.retry_subject(runyard_events::Forge::Gitlab)
    );
    let decoded = <Event as prost::Message>::decode(dead.payload.clone()).unwrap();
    assert_eq!(decoded.id, bad);
    // Nothing of it was written; the others were.
    let ids: Vec<String> = sqlx::query_scalar("SELECT event_id FROM retries ORDER BY event_id")
        .fetch_all(&p)
        .await
        .unwrap();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(!ids.contains(&bad), "{ids:?}");
    let huge: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM retries WHERE new_pipeline_id IS NOT NULL OR kind = 'issued'",
    )
    .fetch_one(&p)
    .await
    .unwrap();
    assert_eq!(huge, 0);
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn exit_137_near_the_limit_counts_as_an_oom_kill_only_without_cgroup_data() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let limit: u64 = 2_000_000_000;
    // (job, cgroup, the cgroup's oom flag, exit code, peak share of the limit)
    let cases = [
        (1, "", false, 137, 97),
        (2, "v2", false, 137, 97),
        (3, "v1", true, 0, 50),
        (4, "", false, 137, 50),
    ];
    let events: Vec<Event> = cases
        .iter()
        .map(|&(job, cgroup, oom, exit, share)| {
            let mut e = synth::usage_event(job, synth::base_time());
            if let Some(Body::UsageReported(u)) = e.body.as_mut() {
                u.cgroup = cgroup.into();
                u.oom_killed = oom;
                u.exit_code = Some(exit);
                u.memory_limit_bytes = Some(limit);
                u.peak_memory_bytes = limit / 100 * share;
            }
            e
        })
        .collect();
    publish(&bus, &events).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let p = wait_applied(&db.url, 4).await;
    t.stop().await;
    let rows: Vec<(i64, bool, Option<String>, Option<i32>)> = sqlx::query_as(
        "SELECT job_id, oom_killed, cgroup, exit_code FROM job_usage ORDER BY job_id",
    )
    .fetch_all(&p)
    .await
    .unwrap();
    assert_eq!(
        rows,
        vec![
            (1, true, None, Some(137)),
            (2, false, Some("v2".into()), Some(137)),
            (3, true, Some("v1".into()), Some(0)),
            (4, false, None, Some(137)),
        ]
    );
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn github_usage_is_keyed_from_the_jobs_webhook_and_keeps_its_reported_ref() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    let t0 = synth::base_time();
    // The report names the job by its YAML key and claims a protected ref.
    let report = |job: u64| {
        let mut e = synth::usage_event(job, t0);
        if let Some(Body::UsageReported(u)) = e.body.as_mut() {
            u.workload = [
                ("repo".to_owned(), "acme/other".to_owned()),
                ("workflow".to_owned(), "ci.yml".to_owned()),
                ("job".to_owned(), "build".to_owned()),
            ]
            .into();
            u.r#ref = "main".into();
        }
        e
    };
    let job = |id: u64| {
        let mut e = synth::job_event(id, JobStatus::Completed, t0);
        if let Some(Body::JobObserved(j)) = e.body.as_mut() {
            j.r#ref = "feature/x".into();
        }
        e
    };
    // Job 1: its webhook before the report; job 2: the report first, in an
    // earlier batch.
    publish(&bus, &[job(1), report(1), report(2)]).await;
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let p = wait_applied(&db.url, 3).await;
    publish(&bus, &[job(2)]).await;
    let p2 = wait_applied(&db.url, 4).await;
    t.stop().await;
    p2.close().await;
    let rows: Vec<(i64, String, Option<String>)> =
        sqlx::query_as("SELECT job_id, workload_key, ref FROM usage_samples ORDER BY job_id")
            .fetch_all(&p)
            .await
            .unwrap();
    let expected = |id: u64| {
        let (repo, name) = (
            format!("acme/repo-{}", id % 17),
            format!("build ({})", id % 5),
        );
        let w = runyard_store::workload::github(&repo, "CI", &name);
        runyard_store::workload::key(w.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    };
    assert_eq!(
        rows,
        vec![
            // The ref stays the report's: the allocator compares it with
            // the job's before it trains.
            (1, expected(1), Some("main".into())),
            (2, expected(2), Some("main".into())),
        ]
    );
    p.close().await;
    db.drop_db().await;
}

/// Spawns the real `runyard-job-tracker` binary with its HTTP on `port`;
/// stderr goes to `log` when given.
fn spawn_tracker(
    nats_url: &str,
    ns: &Namespace,
    db_url: &str,
    port: u16,
    log: Option<&std::path::Path>,
) -> KillOnDrop {
    let stderr = match log {
        Some(path) => std::process::Stdio::from(std::fs::File::create(path).unwrap()),
        None => std::process::Stdio::null(),
    };
    std::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"))
        .env("RUNYARD_NATS_URL", nats_url)
        .env("RUNYARD_NAMESPACE", ns.as_str())
        .env("RUNYARD_DATABASE_URL", db_url)
        .env("RUNYARD_TRACKER_HTTP_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "info")
        .env("RUNYARD_LOG_FORMAT", "json")
        .stdout(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .map(KillOnDrop)
        .unwrap()
}

/// The status `/readyz` answers on `port`, if anything answers.
async fn readyz(port: u16) -> Option<u16> {
    runyard_telemetry::install_crypto_provider();
    let r = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    Some(r.status().as_u16())
}

#[tokio::test]
async fn two_trackers_started_at_the_same_instant_on_a_fresh_database_both_come_up() {
    let nats = TestNats::get().await;
    // Several fresh databases: the race the advisory lock closes is hit
    // more often than not without it, once is not proof enough.
    for round in 0..4 {
        let ns = unique_namespace();
        let db = TestDb::new();
        let ports = [runyard_testkit::free_port(), runyard_testkit::free_port()];
        let mut children: Vec<KillOnDrop> = ports
            .iter()
            .map(|&port| spawn_tracker(&nats.url(), &ns, &db.url, port, None))
            .collect();
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut ready = [false, false];
        while ready != [true, true] {
            for (i, child) in children.iter_mut().enumerate() {
                if let Some(status) = child.0.try_wait().unwrap() {
                    panic!("round {round}: a tracker exited with {status}");
                }
                ready[i] = ready[i] || readyz(ports[i]).await == Some(200);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: not both ready: {ready:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let p = pool(&db.url).await;
        assert_eq!(count(&p, "seaql_migrations").await, 6, "round {round}");
        p.close().await;
        drop(children);
        db.drop_db().await;
    }
}

#[tokio::test]
async fn a_tracker_started_while_postgres_and_nats_are_down_waits_and_comes_up() {
    // NATS: a private server, stopped before the tracker starts.
    let mut server = runyard_testkit::NatsServer::start().await;
    server.stop().await;
    // Postgres: the shared server behind a proxy that refuses for now.
    let db = TestDb::new();
    let authority = db
        .url
        .split_once('@')
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(a, _)| a.to_owned())
        .unwrap();
    let upstream: SocketAddr = tokio::net::lookup_host(&authority)
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = TcpProxy::start(upstream).await;
    proxy.cut().await;
    // Credentials in both URLs, to see that no log line carries them (the
    // test servers do not ask for them).
    let via_proxy = db.url.replacen(
        &format!("@{authority}"),
        &format!(":pg-s3cret@{}", proxy.addr()),
        1,
    );
    let nats_url = server
        .url()
        .replacen("nats://", "nats://runyard:nats-s3cret@", 1);
    let ns = unique_namespace();
    let port = runyard_testkit::free_port();
    let log = std::env::temp_dir().join(format!("runyard-tracker-{}.log", ns.as_str()));
    let mut child = spawn_tracker(&nats_url, &ns, &via_proxy, port, Some(&log));

    // Alive and not ready while both are down, for longer than a start-up
    // that gives up would take.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut answered = 0;
    while tokio::time::Instant::now() < deadline {
        if let Some(status) = readyz(port).await {
            assert_eq!(status, 503, "ready with Postgres and NATS down");
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered > 0, "/readyz never answered while waiting");
    assert!(child.0.try_wait().unwrap().is_none(), "the tracker exited");

    // Both come up: the tracker follows without a restart.
    proxy.restore().await;
    server.start_again().await;
    let ready = eventually(WAIT, || async move {
        (readyz(port).await == Some(200)).then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "never ready once Postgres and NATS were up"
    );
    let publisher = Bus::connect(&server.url(), ns.clone(), "test-publisher", false)
        .await
        .unwrap();
    let events = shuffled_lifecycles(5, 1);
    publish(&publisher, &events).await;
    let p = wait_applied(&db.url, events.len() as i64).await;
    p.close().await;
    drop(child);

    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    assert!(text.contains("postgres not reachable"), "{text}");
    assert!(
        !text.contains("pg-s3cret"),
        "database password logged:\n{text}"
    );
    assert!(
        !text.contains("nats-s3cret"),
        "nats password logged:\n{text}"
    );
    db.drop_db().await;
}

#[tokio::test]
async fn the_rebuild_command_logs_the_database_without_its_password() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let live = TestDb::new();
    let publisher = bus(&nats, &ns).await;
    publish(&publisher, &shuffled_lifecycles(3, 2)).await;
    let with_password = live.url.replacen("postgres@", "postgres:pg-s3cret@", 1);
    assert_ne!(
        with_password, live.url,
        "the test URL names the user postgres"
    );
    let target = format!("{}_rb", live.name);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"))
        .args(["rebuild", "--into", &target])
        .env("RUNYARD_NATS_URL", nats.url())
        .env("RUNYARD_NAMESPACE", ns.as_str())
        .env("RUNYARD_DATABASE_URL", &with_password)
        .env("RUST_LOG", "info")
        .env("RUNYARD_LOG_FORMAT", "json")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "rebuild exited with {}", out.status);
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("rebuild finished"), "{text}");
    assert!(text.contains("postgres:***@"), "{text}");
    assert!(!text.contains("pg-s3cret"), "password logged:\n{text}");
    TestDb {
        url: live.sibling(&target),
        name: target,
    }
    .drop_db()
    .await;
    live.drop_db().await;
}

/// The job-tracker binary with `RUNYARD_TRACKER_TLS_*` set to `tls`.
fn spawn_tracker_with_tls(
    nats_url: &str,
    db_url: &str,
    port: u16,
    tls: &[(&str, &std::path::Path)],
) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_runyard-job-tracker"));
    command
        .env("RUNYARD_NATS_URL", nats_url)
        .env("RUNYARD_NAMESPACE", unique_namespace().as_str())
        .env("RUNYARD_DATABASE_URL", db_url)
        .env("RUNYARD_TRACKER_HTTP_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUNYARD_LOG_FORMAT", "json")
        .stdout(std::process::Stdio::null());
    for (var, path) in tls {
        command.env(var, path);
    }
    command
}

/// What `/readyz` over https answers `client` on `port`: the status and
/// body, or `None` when the connection is refused.
async fn readyz_over(client: &reqwest::Client, port: u16) -> Option<(u16, serde_json::Value)> {
    let r = client
        .get(format!("https://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .ok()?;
    Some((r.status().as_u16(), r.json().await.ok()?))
}

#[tokio::test]
async fn the_http_listener_speaks_mtls_while_starting_and_once_running() {
    runyard_telemetry::install_crypto_provider();
    let pki = runyard_testkit::pki::TestPki::new();
    let nats = TestNats::get().await;
    let tls = [
        ("RUNYARD_TRACKER_TLS_CERT", pki.server.cert.as_path()),
        ("RUNYARD_TRACKER_TLS_KEY", pki.server.key.as_path()),
        ("RUNYARD_TRACKER_TLS_CLIENT_CA", pki.ca_file.as_path()),
    ];
    let client = pki.https_client(Some(&pki.client));
    let refused = |port: u16| {
        let (pki, plain) = (&pki, reqwest::Client::new());
        async move {
            for (who, c) in [
                ("no certificate", pki.https_client(None)),
                ("another CA's", pki.https_client(Some(&pki.other_client))),
            ] {
                assert!(readyz_over(&c, port).await.is_none(), "{who} answered");
            }
            let plain = plain
                .get(format!("http://127.0.0.1:{port}/readyz"))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            assert!(plain.is_err(), "plaintext answered: {plain:?}");
        }
    };

    // Postgres unreachable: the starting listener answers, over mTLS.
    let port = runyard_testkit::free_port();
    let nowhere = format!(
        "postgres://postgres@127.0.0.1:{}/runyard",
        runyard_testkit::free_port()
    );
    let _starting = KillOnDrop(
        spawn_tracker_with_tls(&nats.url(), &nowhere, port, &tls)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let starting = eventually(WAIT, || readyz_over(&client, port)).await;
    assert_eq!(
        starting,
        Some((503, serde_json::json!({"starting": true}))),
        "the starting answer over mTLS"
    );
    refused(port).await;

    // Postgres there: the real router, over mTLS too.
    let db = TestDb::new();
    let port = runyard_testkit::free_port();
    let _running = KillOnDrop(
        spawn_tracker_with_tls(&nats.url(), &db.url, port, &tls)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready = eventually(WAIT, || async {
        readyz_over(&client, port)
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    assert!(ready.is_some(), "ready over mTLS");
    refused(port).await;
    drop(_running);
    db.drop_db().await;

    // A certificate without its key: the process refuses to start, naming
    // both variables.
    let out = spawn_tracker_with_tls(&nats.url(), &nowhere, port, &tls[..1])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RUNYARD_TRACKER_TLS_CERT") && stderr.contains("RUNYARD_TRACKER_TLS_KEY"),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// A broken environment stalls the tracker; it never empties the log into
// dead letters.

/// Messages on the namespace's dead-letter subject.
async fn dead_letters(nats: &TestNats, ns: &Namespace) -> Vec<async_nats::jetstream::Message> {
    let client = async_nats::connect(nats.url()).await.unwrap();
    runyard_testkit::stream_messages(&client, &ns.events_stream())
        .await
        .into_iter()
        .filter(|m| m.subject.as_str() == ns.deadletter_subject())
        .collect()
}

/// Polls the tracker's `/readyz` at `addr` until it answers `status`; its
/// body then.
async fn readyz_turns(addr: SocketAddr, status: u16) -> serde_json::Value {
    let http = reqwest::Client::new();
    eventually(WAIT, || {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://{addr}/readyz"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .ok()?;
            if r.status().as_u16() != status {
                return None;
            }
            r.json::<serde_json::Value>().await.ok()
        }
    })
    .await
    .unwrap_or_else(|| panic!("/readyz never answered {status}"))
}

/// The value of the sample `series` (name and labels, as exposed) in the
/// tracker's `/metrics`; 0 when absent.
async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

/// Runs every statement of `sql` on `url`, one connection.
async fn run_sql(url: &str, sql: &[String]) {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .unwrap();
    for statement in sql {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
}

/// How a test breaks the database under a running tracker and mends it,
/// as statements run by a superuser on `admin_url`.
struct Breakage<'a> {
    name: &'a str,
    admin_url: String,
    breaks: Vec<String>,
    mends: Vec<String>,
}

/// 100 job lifecycles (400 events): the first half projected, then the
/// database broken while the second half is delivered. The tracker must
/// stall — not ready, `stalled` 1, several failed attempts, nothing applied
/// and nothing dead-lettered — then, once the database is mended and with
/// no help, project every event exactly once and be ready again.
/// `tracker_url` is what the tracker connects with; `read_url` reads the
/// projection whatever the breakage.
#[allow(clippy::print_stdout)] // the figures, as the tests themselves print them
async fn stalls_then_resumes(tracker_url: &str, read_url: &str, how: Breakage<'_>) {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let bus = bus(&nats, &ns).await;
    let events = shuffled_lifecycles(100, 23);
    let (first, second) = events.split_at(200);
    publish(&bus, first).await;
    let t = start(config(&nats.url(), &ns, tracker_url)).await;
    let p = wait_applied(read_url, 200).await;
    readyz_turns(t.addr, 200).await;

    run_sql(&how.admin_url, &how.breaks).await;
    let broke = std::time::Instant::now();
    publish(&bus, second).await;
    let body = readyz_turns(t.addr, 503).await;
    assert_eq!(body["stalled"], true, "{}: {body}", how.name);
    // The stall outlasts several attempts (each would have dead-lettered
    // the whole batch, one event at a time, before).
    let failures = eventually(WAIT, || async {
        let n = metric(t.addr, "runyard_tracker_apply_failures_total").await;
        (n >= 4.0).then_some(n)
    })
    .await
    .unwrap_or_else(|| panic!("{}: the tracker did not keep trying", how.name));
    assert_eq!(metric(t.addr, "runyard_tracker_stalled").await, 1.0);
    assert_eq!(count(&p, "applied_events").await, 200, "{}", how.name);
    assert!(
        dead_letters(&nats, &ns).await.is_empty(),
        "{}: dead-lettered while stalled",
        how.name
    );
    let stalled_for = broke.elapsed();

    run_sql(&how.admin_url, &how.mends).await;
    let mended = std::time::Instant::now();
    let p = wait_applied(read_url, 400).await;
    let resumed_in = mended.elapsed();
    let body = readyz_turns(t.addr, 200).await;
    assert_eq!(body["stalled"], false, "{}: {body}", how.name);
    assert_eq!(metric(t.addr, "runyard_tracker_stalled").await, 0.0);
    assert_eq!(count(&p, "jobs").await, 100, "{}", how.name);
    assert_eq!(count(&p, "usage_samples").await, 100, "{}", how.name);
    let done: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE status = 4 AND queued_at IS NOT NULL")
            .fetch_one(&p)
            .await
            .unwrap();
    assert_eq!(done, 100, "{}", how.name);
    assert_eq!(
        metric(
            t.addr,
            r#"runyard_tracker_events_total{result="deadlettered"}"#
        )
        .await,
        0.0
    );
    assert!(dead_letters(&nats, &ns).await.is_empty(), "{}", how.name);
    println!(
        "{}: stalled {:.1} s through {failures} failed attempts, nothing dead-lettered; \
         400 events projected once, {:.1} s after the database was mended",
        how.name,
        stalled_for.as_secs_f64(),
        resumed_in.as_secs_f64()
    );
    t.stop().await;
    p.close().await;
}

/// Ends every session on database `name` but the caller's.
fn terminate_sessions_on(name: &str) -> String {
    format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = '{name}' AND pid <> pg_backend_pid()"
    )
}

#[tokio::test]
async fn a_read_only_database_stalls_the_tracker_and_dead_letters_nothing() {
    let db = TestDb::new();
    runyard_store::migrate(&db.url).await.unwrap();
    // As after a failover onto a standby: every new session is read-only
    // (25006), and the sessions opened meanwhile stay read-only after the
    // database is writable again — the tracker must drop them itself.
    let name = &db.name;
    stalls_then_resumes(
        &db.url,
        &db.url,
        Breakage {
            name: "read-only database",
            admin_url: db.sibling("postgres"),
            breaks: vec![
                format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"),
                terminate_sessions_on(name),
            ],
            mends: vec![format!(
                "ALTER DATABASE \"{name}\" RESET default_transaction_read_only"
            )],
        },
    )
    .await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_renamed_table_stalls_the_tracker_and_dead_letters_nothing() {
    let db = TestDb::new();
    runyard_store::migrate(&db.url).await.unwrap();
    // As with a migration not run yet: 42P01 undefined table.
    stalls_then_resumes(
        &db.url,
        &db.url,
        Breakage {
            name: "renamed table",
            admin_url: db.url.clone(),
            breaks: vec!["ALTER TABLE jobs RENAME TO jobs_elsewhere".into()],
            mends: vec!["ALTER TABLE jobs_elsewhere RENAME TO jobs".into()],
        },
    )
    .await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_rotated_password_stalls_the_tracker_and_dead_letters_nothing() {
    // The shared server trusts every local connection, so passwords mean
    // nothing there: a private cluster that asks for them.
    let pg = PrivatePostgres::start("test-password");
    pg.require_passwords();
    let server = format!("postgres://postgres@127.0.0.1:{}", pg.port());
    run_sql(
        &format!("{server}/postgres"),
        &[
            "SELECT pg_reload_conf()".into(),
            "CREATE ROLE tracker LOGIN PASSWORD 'first'".into(),
            "CREATE DATABASE tracked OWNER tracker".into(),
        ],
    )
    .await;
    let tracker_url = format!("postgres://tracker:first@127.0.0.1:{}/tracked", pg.port());
    let wrong_url = tracker_url.replace(":first@", ":wrong@");
    // The server really checks: a wrong password is refused (28P01).
    let refused = eventually(Duration::from_secs(10), || {
        let url = wrong_url.clone();
        async move {
            match <sqlx::PgConnection as sqlx::Connection>::connect(&url).await {
                Err(sqlx::Error::Database(e)) => e.code().map(|c| c.into_owned()),
                _ => None,
            }
        }
    })
    .await;
    assert_eq!(refused.as_deref(), Some("28P01"));
    stalls_then_resumes(
        &tracker_url,
        &format!("{server}/tracked"),
        Breakage {
            name: "rotated password",
            admin_url: format!("{server}/postgres"),
            // The password changes under the running tracker, whose
            // sessions end: every new one is refused with 28P01.
            breaks: vec![
                "ALTER ROLE tracker PASSWORD 'rotated'".into(),
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'tracker'"
                    .into(),
            ],
            mends: vec!["ALTER ROLE tracker PASSWORD 'first'".into()],
        },
    )
    .await;
}

#[tokio::test]
async fn an_event_whose_dead_letter_is_refused_is_dead_lettered_on_redelivery() {
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    let bus = bus(&nats, &ns).await;
    // One event that cannot be projected (a new pipeline id beyond
    // bigint) among 42 that can.
    let mut events = retry_events::gitlab_pipeline_issued(u64::MAX);
    let bad = events[1].id.clone();
    events.push(retry_events::gitlab_job_refused());
    events.extend(shuffled_lifecycles(10, 29));
    publish(&bus, &events).await;
    // The stream takes no more messages: the dead letter is refused.
    let js = bus.jetstream();
    let mut stream = js.get_stream(ns.events_stream()).await.unwrap();
    let open = stream.info().await.unwrap().config.clone();
    let held = stream.info().await.unwrap().state.messages;
    js.update_stream(async_nats::jetstream::stream::Config {
        max_messages: i64::try_from(held).unwrap(),
        discard: async_nats::jetstream::stream::DiscardPolicy::New,
        ..open.clone()
    })
    .await
    .unwrap();

    // A tracker applies the rest, keeps trying to store the dead letter,
    // and dies (kill -9) before it can.
    let child = spawn_batch_tracker(&nats.url(), &ns, &db.url);
    let applied = applied_beyond(&db.url, 0).await;
    assert_eq!(applied, 42, "the refused event is not recorded as applied");
    let p = pool(&db.url).await;
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM applied_events WHERE event_id = $1")
            .bind(&bad)
            .fetch_one(&p)
            .await
            .unwrap();
    assert_eq!(recorded, 0);
    drop(child);
    assert!(dead_letters(&nats, &ns).await.is_empty());

    // Room again: the next tracker gets the message again and dead-letters
    // it, rather than acking it as a duplicate.
    js.update_stream(open).await.unwrap();
    let t = start(config(&nats.url(), &ns, &db.url)).await;
    let dead = eventually(WAIT, || {
        let (nats, ns) = (&nats, &ns);
        async move {
            let dead = dead_letters(nats, ns).await;
            (!dead.is_empty()).then_some(dead)
        }
    })
    .await
    .expect("dead-lettered on redelivery");
    assert_eq!(dead.len(), 1);
    let decoded = <Event as prost::Message>::decode(dead[0].payload.clone()).unwrap();
    assert_eq!(decoded.id, bad);
    let reason = dead[0].headers.as_ref().unwrap();
    let reason = reason.get("Runyard-Deadletter-Reason").unwrap().as_str();
    assert!(reason.contains("new_pipeline_id"), "{reason}");
    assert_eq!(
        metric(
            t.addr,
            r#"runyard_tracker_events_total{result="deadlettered"}"#
        )
        .await,
        1.0
    );
    assert_eq!(count(&p, "applied_events").await, 42);
    t.stop().await;
    assert_eq!(dead_letters(&nats, &ns).await.len(), 1);
    p.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_swap_that_fails_half_way_renames_nothing() {
    let live = TestDb::new();
    runyard_store::migrate(&live.url).await.unwrap();
    let admin = live.sibling("postgres");
    let old = format!("{}_old", live.name);
    // The second rename fails (no such database) after the first one ran
    // in the same transaction.
    let missing = format!("{}_missing", live.name);
    let error = rebuild::swap(&admin, &live.name, &missing, &old)
        .await
        .unwrap_err();
    assert!(
        format!("{error:#}").contains("nothing was renamed"),
        "{error:#}"
    );
    let admin_pool = pool(&admin).await;
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE datname LIKE $1 ORDER BY 1")
            .bind(format!("{}%", live.name))
            .fetch_all(&admin_pool)
            .await
            .unwrap();
    assert_eq!(
        names,
        vec![live.name.clone()],
        "the live database is still live"
    );
    let p = pool(&live.url).await;
    assert_eq!(
        count(&p, "applied_events").await,
        0,
        "and still a projection"
    );
    p.close().await;
    admin_pool.close().await;
    live.drop_db().await;
}

#[tokio::test]
async fn no_nats_password_in_the_debug_log() {
    let nats = runyard_testkit::nats_auth::SecuredNats::start().await;
    let db = TestDb::new();
    let log = runyard_testkit::nats_auth::debug_log_of(
        &nats,
        std::path::Path::new(env!("CARGO_BIN_EXE_runyard-job-tracker")),
        "job-tracker",
        &[
            ("RUNYARD_DATABASE_URL", &db.url),
            ("RUNYARD_TRACKER_HTTP_LISTEN", "127.0.0.1:0"),
        ],
        "consumer bound",
    )
    .await;
    db.drop_db().await;
    runyard_testkit::nats_auth::assert_no_password(&nats, "job-tracker", &log);
    // Its durable consumer is bound under its own user's permissions.
    assert!(log.contains("consumer bound"), "{log}");
}
