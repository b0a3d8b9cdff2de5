//! TLS and mTLS on the allocator's two listeners (real NATS and Postgres,
//! certificates from a throwaway CA): gRPC and HTTP answer over TLS and
//! nothing in plaintext; with a client CA a client without a certificate
//! or with another CA's is refused; with `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY`
//! the gantry endpoint alone answers clients without one.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use runyard_allocator::proto::RecommendRequest;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_allocator::{App, Config};
use runyard_bus::{Bus, StreamSettings};
use runyard_testkit::pki::{Pair, TestPki};
use runyard_testkit::{TestDb, TestNats, eventually, unique_namespace};
use runyard_tls::ClientFiles;
use tokio::sync::oneshot;
use tonic::transport::Endpoint;

const SPEC: &str = "zlib@1.3.1 arch=linux-ubuntu22.04-x86_64%gcc@12.3.0";

struct Running {
    grpc: SocketAddr,
    http: SocketAddr,
    _db: TestDb,
    _stop: oneshot::Sender<()>,
}

/// An allocator with the PKI's server certificate, the client CA when
/// `mtls`, and the gantry exception when `anonymous_gantry`; ready.
async fn start(pki: &TestPki, mtls: bool, anonymous_gantry: bool) -> Running {
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
    let app = App::build(Config {
        bus: runyard_config::Bus {
            nats_url: nats.url(),
            namespace: ns.to_string(),
        },
        database: runyard_config::Database {
            url: db.url.clone(),
        },
        allocator_listen: local,
        allocator_http_listen: local,
        allocator_anonymous_gantry: anonymous_gantry,
        tls: runyard_config::Tls {
            cert: Some(pki.server.cert.clone()),
            key: Some(pki.server.key.clone()),
            client_ca: mtls.then(|| pki.ca_file.clone()),
        },
        ..Config::default()
    })
    .await
    .unwrap();
    let (grpc, http) = (app.grpc_addr(), app.http_addr());
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    let client = pki.https_client(Some(&pki.client));
    let ready = eventually(Duration::from_secs(20), || async {
        let r = client
            .get(format!("https://{http}/readyz"))
            .send()
            .await
            .ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "allocator ready over https");
    Running {
        grpc,
        http,
        _db: db,
        _stop: stop,
    }
}

/// A `Recommend` over `https://127.0.0.1:<port>` trusting the test CA and
/// presenting `identity`: the memory limit, or why not.
async fn recommend(
    pki: &TestPki,
    grpc: SocketAddr,
    identity: Option<&Pair>,
) -> Result<u64, String> {
    let files = ClientFiles::new(
        Some(pki.ca_file.as_path()),
        identity.map(|p| p.cert.as_path()),
        identity.map(|p| p.key.as_path()),
    )
    .unwrap();
    let endpoint = Endpoint::from_shared(format!("https://127.0.0.1:{}", grpc.port()))
        .unwrap()
        .tls_config(files.grpc().unwrap())
        .unwrap()
        .timeout(Duration::from_secs(5));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let answer = AllocatorClient::new(channel)
        .recommend(RecommendRequest {
            workload: [("repo", "acme/app"), ("job", "build")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            r#ref: "main".into(),
            retry_of: None,
            preview: false,
        })
        .await
        .map_err(|s| format!("{s:?}"))?;
    Ok(answer.into_inner().memory_limit_bytes)
}

#[tokio::test]
async fn tls_serves_grpc_and_https_and_nothing_in_plaintext() {
    let pki = TestPki::new();
    let a = start(&pki, false, false).await;
    assert!(recommend(&pki, a.grpc, None).await.unwrap() > 0);
    let answer = pki
        .https_client(None)
        .get(format!("https://{}/v1/allocation", a.http))
        .query(&[("spec", SPEC)])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let plain = reqwest::Client::new()
        .get(format!("http://{}/healthz", a.http))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "plaintext HTTP answered: {plain:?}");
    let plain_grpc = AllocatorClient::connect(format!("http://{}", a.grpc))
        .await
        .unwrap()
        .recommend(RecommendRequest::default())
        .await;
    assert!(
        plain_grpc.is_err(),
        "plaintext gRPC answered: {plain_grpc:?}"
    );
}

#[tokio::test]
async fn mtls_refuses_clients_without_the_cas_certificate_on_both_listeners() {
    let pki = TestPki::new();
    let a = start(&pki, true, false).await;
    assert!(recommend(&pki, a.grpc, Some(&pki.client)).await.unwrap() > 0);
    for (who, identity) in [("none", None), ("another CA's", Some(&pki.other_client))] {
        let refused = recommend(&pki, a.grpc, identity).await;
        assert!(refused.is_err(), "gRPC with {who}: {refused:?}");
        for path in ["/healthz", "/v1/allocation"] {
            let refused = pki
                .https_client(identity)
                .get(format!("https://{}{path}", a.http))
                .query(&[("spec", SPEC)])
                .send()
                .await;
            assert!(refused.is_err(), "{path} with {who}: {refused:?}");
        }
    }
    let answer = pki
        .https_client(Some(&pki.client))
        .get(format!("https://{}/v1/allocation", a.http))
        .query(&[("spec", SPEC)])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn anonymous_gantry_answers_the_allocation_without_a_certificate_and_nothing_else() {
    let pki = TestPki::new();
    let a = start(&pki, true, true).await;
    let anonymous = pki.https_client(None);
    let get = |client: &reqwest::Client, path: &str| {
        client
            .get(format!("https://{}{path}", a.http))
            .query(&[("spec", SPEC)])
            .send()
    };
    let answer = get(&anonymous, "/v1/allocation").await.unwrap();
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = answer.json().await.unwrap();
    assert!(body["variables"].is_object(), "{body}");
    for path in ["/healthz", "/readyz", "/metrics", "/no-such-path"] {
        let refused = get(&anonymous, path).await.unwrap();
        assert_eq!(refused.status(), 403, "{path}");
        assert_eq!(
            refused.json::<serde_json::Value>().await.unwrap()["error"],
            "client certificate required"
        );
    }
    // A certificate that is given must be the CA's.
    let stranger = get(&pki.https_client(Some(&pki.other_client)), "/v1/allocation").await;
    assert!(stranger.is_err(), "{stranger:?}");
    let client = pki.https_client(Some(&pki.client));
    let metrics = get(&client, "/metrics").await.unwrap();
    assert_eq!(metrics.status(), 200);
    // The four refusals are counted, so an operator sees clients that lack
    // a certificate.
    let metrics = metrics.text().await.unwrap();
    assert!(
        metrics.contains(
            r#"runyard_allocator_auth_refused_total{api="http",reason="client_certificate"} 4"#
        ),
        "{metrics}"
    );
    // gRPC still wants the certificate at the handshake.
    let refused = recommend(&pki, a.grpc, None).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(recommend(&pki, a.grpc, Some(&pki.client)).await.unwrap() > 0);
}

#[tokio::test]
async fn half_a_tls_setting_or_an_unreadable_file_refuses_to_start() {
    runyard_telemetry::install_crypto_provider();
    let pki = TestPki::new();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let base = || Config {
        bus: runyard_config::Bus {
            nats_url: "nats://127.0.0.1:1".into(),
            ..Default::default()
        },
        allocator_listen: local,
        allocator_http_listen: local,
        ..Config::default()
    };
    let e = App::build(Config {
        tls: runyard_config::Tls {
            cert: Some(pki.server.cert.clone()),
            ..Default::default()
        },
        ..base()
    })
    .await
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("RUNYARD_ALLOCATOR_TLS_CERT") && e.contains("RUNYARD_ALLOCATOR_TLS_KEY"),
        "{e}"
    );
    let missing = pki.dir().join("gone.pem");
    let e = App::build(Config {
        tls: runyard_config::Tls {
            cert: Some(pki.server.cert.clone()),
            key: Some(pki.server.key.clone()),
            client_ca: Some(missing),
        },
        ..base()
    })
    .await
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("RUNYARD_ALLOCATOR_TLS_CLIENT_CA") && e.contains("gone.pem"),
        "{e}"
    );
}
