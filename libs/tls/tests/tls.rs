//! runyard-tls against real sockets: a listener serving an axum router over
//! TLS and mTLS to real clients, files replaced under a running listener,
//! and the settings that must refuse to start.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use runyard_testkit::eventually;
use runyard_testkit::pki::TestPki;
use runyard_tls::{ClientAuth, ClientFiles, Listener, Peer, Protocols, ServerFiles, ServerTls};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

/// A running listener: `/` answers whether the client had a certificate.
struct Served {
    port: u16,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn serve(tls: Option<&ServerTls>, client_auth: ClientAuth) -> Served {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let acceptor = tls.map(|t| t.acceptor(client_auth, Protocols::Http).unwrap());
    let listener = Listener::new(tcp, acceptor);
    let port = listener.local_addr().unwrap().port();
    let router = axum::Router::new().route(
        "/",
        get(|ConnectInfo(peer): ConnectInfo<Peer>| async move {
            format!("client certificate: {}", peer.client_certificate)
        }),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<Peer>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stopped.await;
        })
        .await
    });
    Served { port, _stop: stop }
}

fn files(pki: &TestPki, client_ca: Option<&Path>) -> ServerFiles {
    ServerFiles::from_settings(
        "TEST",
        Some(pki.server.cert.as_path()),
        Some(pki.server.key.as_path()),
        client_ca,
    )
    .unwrap()
    .unwrap()
}

/// The leaf certificate a fresh TLS connection to `port` is shown.
async fn served_certificate(pki: &TestPki, port: u16) -> Option<CertificateDer<'static>> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&pki.ca_file).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
    tls.get_ref().1.peer_certificates()?.first().cloned()
}

fn pem_certificate(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

#[tokio::test]
async fn tls_answers_https_with_the_ca_and_nothing_in_plaintext() {
    runyard_telemetry::install_crypto_provider();
    let pki = TestPki::new();
    let tls = ServerTls::load(files(&pki, None)).unwrap();
    let s = serve(Some(&tls), ClientAuth::Required).await;
    let https = pki.https_client(None);
    let answer = https
        .get(format!("https://127.0.0.1:{}/", s.port))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "client certificate: false");
    // Plaintext to a TLS port gets no HTTP answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/", s.port))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // A client that does not trust the CA refuses the server.
    let untrusting = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .build()
        .unwrap()
        .get(format!("https://127.0.0.1:{}/", s.port))
        .send()
        .await;
    assert!(untrusting.is_err(), "{untrusting:?}");
}

#[tokio::test]
async fn mtls_refuses_no_certificate_and_another_cas_and_accepts_the_right_one() {
    runyard_telemetry::install_crypto_provider();
    let pki = TestPki::new();
    let tls = ServerTls::load(files(&pki, Some(pki.ca_file.as_path()))).unwrap();
    let s = serve(Some(&tls), ClientAuth::Required).await;
    let url = format!("https://127.0.0.1:{}/", s.port);
    for (who, client) in [
        ("no certificate", pki.https_client(None)),
        ("another CA's", pki.https_client(Some(&pki.other_client))),
    ] {
        let refused = client.get(&url).send().await;
        assert!(refused.is_err(), "{who}: {refused:?}");
    }
    let answer = pki
        .https_client(Some(&pki.client))
        .get(&url)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "client certificate: true");
}

#[tokio::test]
async fn optional_client_auth_lets_anyone_in_and_says_who_had_a_certificate() {
    runyard_telemetry::install_crypto_provider();
    let pki = TestPki::new();
    let tls = ServerTls::load(files(&pki, Some(pki.ca_file.as_path()))).unwrap();
    let s = serve(Some(&tls), ClientAuth::Optional).await;
    let url = format!("https://127.0.0.1:{}/", s.port);
    let get = |client: reqwest::Client| {
        let url = url.clone();
        async move { client.get(&url).send().await?.text().await }
    };
    assert_eq!(
        get(pki.https_client(None)).await.unwrap(),
        "client certificate: false"
    );
    assert_eq!(
        get(pki.https_client(Some(&pki.client))).await.unwrap(),
        "client certificate: true"
    );
    // A certificate that is given must verify.
    assert!(
        get(pki.https_client(Some(&pki.other_client)))
            .await
            .is_err()
    );
    // `Never` asks for none even with a client CA set.
    let never = serve(Some(&tls), ClientAuth::Never).await;
    let answer = pki
        .https_client(Some(&pki.client))
        .get(format!("https://127.0.0.1:{}/", never.port))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(answer, "client certificate: false");
}

#[tokio::test]
async fn plaintext_without_tls_files() {
    runyard_telemetry::install_crypto_provider();
    let s = serve(None, ClientAuth::Required).await;
    let answer = reqwest::get(format!("http://127.0.0.1:{}/", s.port))
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
}

#[tokio::test]
async fn new_files_reach_new_connections_and_a_bad_file_keeps_the_old_certificate() {
    runyard_telemetry::install_crypto_provider();
    let pki = TestPki::new();
    let tls = ServerTls::load(files(&pki, None)).unwrap();
    tls.watch(Duration::from_millis(50));
    let s = serve(Some(&tls), ClientAuth::Required).await;
    let first = std::fs::read_to_string(&pki.server.cert).unwrap();
    assert_eq!(
        served_certificate(&pki, s.port).await,
        Some(pem_certificate(&first))
    );

    // The files are replaced (as a Secret update does): new connections
    // are shown the new certificate (serial 7) without a restart.
    let (cert, key) = pki.server_pem(7);
    std::fs::write(&pki.server.key, &key).unwrap();
    std::fs::write(&pki.server.cert, &cert).unwrap();
    let seen = eventually(Duration::from_secs(10), || async {
        served_certificate(&pki, s.port)
            .await
            .filter(|c| *c == pem_certificate(&cert))
    })
    .await;
    assert!(seen.is_some(), "the new certificate is served");

    // A certificate that cannot be used is refused, naming the file; the
    // served one stays.
    std::fs::write(&pki.server.cert, "not a certificate\n").unwrap();
    let error = format!("{:#}", tls.reload().unwrap_err());
    assert!(
        error.contains("RUNYARD_TEST_TLS_CERT") && error.contains("server.pem"),
        "{error}"
    );
    // A key that belongs to another certificate likewise.
    let (other_cert, _) = pki.server_pem(8);
    std::fs::write(&pki.server.cert, &other_cert).unwrap();
    let error = format!("{:#}", tls.reload().unwrap_err());
    assert!(
        error.contains("server.key") && error.contains("is not the key of the certificate"),
        "{error}"
    );
    assert!(!error.contains("PRIVATE KEY"), "{error}");
    assert_eq!(
        served_certificate(&pki, s.port).await,
        Some(pem_certificate(&cert))
    );
}

#[test]
fn settings_that_cannot_work_refuse_to_start_naming_the_variable_or_file() {
    let pki = TestPki::new();
    let p = |p: &Path| p.to_owned();
    for (cert, key) in [
        (Some(p(&pki.server.cert)), None),
        (None, Some(p(&pki.server.key))),
    ] {
        let e = ServerFiles::from_settings("INGEST", cert.as_deref(), key.as_deref(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("RUNYARD_INGEST_TLS_CERT") && e.contains("RUNYARD_INGEST_TLS_KEY"),
            "{e}"
        );
    }
    let e = ServerFiles::from_settings("TRACKER", None, None, Some(pki.ca_file.as_path()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("RUNYARD_TRACKER_TLS_CLIENT_CA"), "{e}");
    // Empty values are unset (compose's `${VAR:-}`).
    let empty = Path::new("");
    assert_eq!(
        ServerFiles::from_settings("SCALER", Some(empty), Some(empty), Some(empty)).unwrap(),
        None
    );

    let missing = pki.dir().join("absent.pem");
    let e = format!(
        "{:#}",
        ServerTls::load(
            ServerFiles::from_settings(
                "ALLOCATOR",
                Some(missing.as_path()),
                Some(pki.server.key.as_path()),
                None
            )
            .unwrap()
            .unwrap()
        )
        .unwrap_err()
    );
    assert!(
        e.contains("RUNYARD_ALLOCATOR_TLS_CERT") && e.contains("absent.pem"),
        "{e}"
    );
    // The client certificate's key is not the server certificate's.
    let e = format!(
        "{:#}",
        ServerTls::load(
            ServerFiles::from_settings(
                "ALLOCATOR",
                Some(pki.server.cert.as_path()),
                Some(pki.client.key.as_path()),
                None
            )
            .unwrap()
            .unwrap()
        )
        .unwrap_err()
    );
    assert!(e.contains("client.key") && e.contains("server.pem"), "{e}");
    // A key file that is not one: named, its content not repeated.
    let junk = pki.dir().join("junk.key");
    std::fs::write(
        &junk,
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==!!\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = format!(
        "{:#}",
        ServerTls::load(
            ServerFiles::from_settings(
                "INGEST",
                Some(pki.server.cert.as_path()),
                Some(junk.as_path()),
                None
            )
            .unwrap()
            .unwrap()
        )
        .unwrap_err()
    );
    assert!(
        e.contains("RUNYARD_INGEST_TLS_KEY") && e.contains("junk.key"),
        "{e}"
    );
    assert!(!e.contains("c2VjcmV0"), "{e}");

    let e = ClientFiles::new(None, Some(pki.client.cert.as_path()), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("RUNYARD_ALLOCATOR_CLIENT_CERT") && e.contains("RUNYARD_ALLOCATOR_CLIENT_KEY"),
        "{e}"
    );
    let e = format!(
        "{:#}",
        ClientFiles::new(Some(pki.server.key.as_path()), None, None).unwrap_err()
    );
    assert!(
        e.contains("RUNYARD_ALLOCATOR_CA_FILE") && e.contains("server.key"),
        "{e}"
    );
    assert!(
        ClientFiles::new(
            Some(pki.ca_file.as_path()),
            Some(pki.client.cert.as_path()),
            Some(pki.client.key.as_path())
        )
        .is_ok()
    );
}
