//! The scaler's `Recommend` call carries `RUNYARD_ALLOCATOR_CLIENT_TOKEN`:
//! against a real allocator that wants a token (real NATS and Postgres), a
//! job is right-sized with the token and falls back to the first flavor
//! without it or with a wrong one.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use bytesize::ByteSize;
use runyard_bus::{Bus, StreamSettings};
use runyard_events::{Forge, JobStatus};
use runyard_scaler::config::Flavor;
use runyard_scaler::core::world::{Job, JobId};
use runyard_scaler::sizing::Allocator;
use runyard_testkit::{TestDb, TestNats, eventually, unique_namespace};

// As `openssl rand -hex 32` makes them (runyard refuses weak secrets).
const TOKEN: &str = "99a0eb2535e8f42155c3dd6a71d26e525fd23a4863b5ecd7aca9dc293f40d7b7";

fn job() -> Job {
    Job {
        id: JobId {
            forge: Forge::Github,
            instance: "github.com".into(),
            job_id: 42,
        },
        run_attempt: 1,
        pipeline_id: 7,
        labels: Some(vec!["self-hosted".into()]),
        status: JobStatus::Queued,
        seen: (runyard_events::Stage::Pending, Duration::ZERO),
        cancelled: false,
        queued_at: Duration::ZERO,
        project: "acme/widgets".into(),
        project_id: 7,
        workflow: "ci".into(),
        name: "build".into(),
        git_ref: "refs/heads/main".into(),
        runner_name: None,
        given_up: false,
        scale_set: None,
        forge_status: String::new(),
    }
}

/// A running allocator that wants [`TOKEN`] (real NATS and Postgres), with
/// `tweak` applied to its configuration.
struct Running {
    _nats: TestNats,
    db: TestDb,
    grpc: SocketAddr,
    http: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        // Its connections are closed before the database goes.
        let _ = self.task.await;
        self.db.drop_db().await;
    }
}

async fn allocator(tweak: impl FnOnce(&mut runyard_allocator::Config)) -> Running {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    runyard_store::migrate(&db.url).await.unwrap();
    Bus::connect(&nats.url(), ns.clone(), "test", false)
        .await
        .unwrap()
        .ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let mut config = runyard_allocator::Config {
        bus: runyard_config::Bus {
            nats_url: nats.url(),
            namespace: ns.to_string(),
        },
        database: runyard_config::Database {
            url: db.url.clone(),
        },
        allocator_listen: local,
        allocator_http_listen: local,
        allocator_tokens: runyard_allocator::auth::tokens([TOKEN]),
        ..runyard_allocator::Config::default()
    };
    tweak(&mut config);
    let app = runyard_allocator::App::build(config).await.unwrap();
    let (grpc, http) = (app.grpc_addr(), app.http_addr());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    Running {
        _nats: nats,
        db,
        grpc,
        http,
        stop,
        task,
    }
}

/// Any recommendation (the defaults, without history) is above the small
/// flavor: right-sizing picks the large one.
fn flavors() -> [Flavor; 2] {
    [("small", ByteSize::mib(1)), ("large", ByteSize::tib(1))].map(|(name, memory)| Flavor {
        name: name.into(),
        memory,
        cpus: 2,
    })
}

#[tokio::test]
async fn the_recommend_call_carries_the_client_token() {
    let a = allocator(|_| {}).await;
    let url = format!("http://{}", a.grpc);
    let http = format!("http://{}", a.http);
    let ready = eventually(Duration::from_secs(20), || async {
        let r = reqwest::get(format!("{http}/readyz")).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "allocator ready");

    let flavors = flavors();
    let timeout = Duration::from_secs(5);
    let sized = Allocator::new(&url, Some(TOKEN.to_owned().into()), timeout)
        .size(&job(), &flavors, None)
        .await;
    assert!(!sized.allocator_unavailable, "{sized:?}");
    assert!(
        sized
            .recommended_limit
            .is_some_and(|l| l > ByteSize::mib(1).as_u64())
    );
    assert_eq!(sized.flavor, 1, "{sized:?}");
    // A retried attempt the allocator refuses by name: sized as no retry,
    // not with the first flavor.
    let refused = runyard_allocator::proto::JobAttempt {
        forge: "svn".into(),
        instance: "github.com".into(),
        job_id: 42,
        attempt: 1,
        pipeline_id: 7,
    };
    let again = Allocator::new(&url, Some(TOKEN.to_owned().into()), timeout)
        .size(&job(), &flavors, Some(refused))
        .await;
    assert_eq!(
        (
            again.flavor,
            again.recommended_limit,
            again.allocator_unavailable
        ),
        (sized.flavor, sized.recommended_limit, false)
    );

    for token in [None, Some("not-the-token".to_owned().into())] {
        let sized = Allocator::new(&url, token, timeout)
            .size(&job(), &flavors, None)
            .await;
        assert!(sized.allocator_unavailable, "{sized:?}");
        assert_eq!((sized.flavor, sized.recommended_limit), (0, None));
    }

    let page = reqwest::get(format!("{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for reason in ["missing", "unknown"] {
        let series =
            format!("runyard_allocator_auth_refused_total{{api=\"grpc\",reason=\"{reason}\"}} 1");
        assert!(page.contains(&series), "{series} in\n{page}");
    }
    a.stop().await;
}

#[tokio::test]
async fn the_recommend_call_goes_over_mtls_with_the_client_certificate() {
    let pki = runyard_testkit::pki::TestPki::new();
    let a = allocator(|c| {
        c.tls.cert = Some(pki.server.cert.clone());
        c.tls.key = Some(pki.server.key.clone());
        c.tls.client_ca = Some(pki.ca_file.clone());
    })
    .await;
    let url = format!("https://127.0.0.1:{}", a.grpc.port());
    let http = format!("https://{}", a.http);
    let probe = pki.https_client(Some(&pki.client));
    let ready = eventually(Duration::from_secs(20), || async {
        let r = probe.get(format!("{http}/readyz")).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "allocator ready");

    let flavors = flavors();
    let timeout = Duration::from_secs(5);
    let tls = |identity: Option<&runyard_testkit::pki::Pair>| {
        runyard_tls::ClientFiles::new(
            Some(pki.ca_file.as_path()),
            identity.map(|p| p.cert.as_path()),
            identity.map(|p| p.key.as_path()),
        )
        .unwrap()
        .grpc()
        .unwrap()
    };
    let sized = Allocator::with_tls(
        &url,
        Some(TOKEN.to_owned().into()),
        timeout,
        Some(tls(Some(&pki.client))),
    )
    .size(&job(), &flavors, None)
    .await;
    assert!(!sized.allocator_unavailable, "{sized:?}");
    assert_eq!(sized.flavor, 1, "right-sized over mTLS: {sized:?}");

    // Without a client certificate, with another CA's, or trusting only
    // the public roots, the handshake fails: the first flavor.
    for tls in [Some(tls(None)), Some(tls(Some(&pki.other_client))), None] {
        let sized = Allocator::with_tls(&url, Some(TOKEN.to_owned().into()), timeout, tls)
            .size(&job(), &flavors, None)
            .await;
        assert!(sized.allocator_unavailable, "{sized:?}");
        assert_eq!((sized.flavor, sized.recommended_limit), (0, None));
    }
    a.stop().await;
}
