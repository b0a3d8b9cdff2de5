//! Bearer tokens and the in-flight limit against the real allocator (real
//! NATS and Postgres): calls without an accepted token are refused on gRPC
//! and HTTP, counted, and leave no `AllocationIssued` event on the log;
//! health, readiness and metrics stay open; the gantry endpoint opens with
//! `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY`.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use runyard_allocator::auth::Tokens;
use runyard_allocator::proto::RecommendRequest;
use runyard_allocator::proto::allocator_client::AllocatorClient;
use runyard_allocator::{App, Config};
use runyard_bus::{Bus, StreamSettings};
use runyard_events::Namespace;
use runyard_testkit::{TestDb, TestNats, eventually, stream_messages, unique_namespace};
use tokio::sync::oneshot;
use tonic::transport::Channel;

// As `openssl rand -hex 32` makes them (weak tokens are refused).
const TOKEN: &str = "d8e88b3844e36254cf4b9f07a025d64e8e8e0dfe9502b9ebb76da7a2cda6f437";
const ROTATED: &str = "8cc38d7d56991a764898c1e1655bae38e54933fe5bf4f938d4d46c26c14bfaaa";
const SPEC: &str = "zlib@1.3.1 arch=linux-ubuntu22.04-x86_64%gcc@12.3.0";

struct Running {
    grpc: SocketAddr,
    http: String,
    ns: Namespace,
    nats: TestNats,
    db: TestDb,
    stop: oneshot::Sender<()>,
}

async fn start(tokens: Tokens, anonymous_gantry: bool) -> Running {
    start_with(|c| Config {
        allocator_tokens: tokens,
        allocator_anonymous_gantry: anonymous_gantry,
        ..c
    })
    .await
}

/// An allocator with `configure`'s settings over a fresh namespace and
/// database.
async fn start_with(configure: impl FnOnce(Config) -> Config) -> Running {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let db = TestDb::new();
    runyard_store::migrate(&db.url).await.unwrap();
    let bus = Bus::connect(&nats.url(), ns.clone(), "test", false)
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let app = App::build(configure(Config {
        bus: runyard_config::Bus {
            nats_url: nats.url(),
            namespace: ns.to_string(),
        },
        database: runyard_config::Database {
            url: db.url.clone(),
        },
        allocator_listen: local,
        allocator_http_listen: local,
        ..Config::default()
    }))
    .await
    .unwrap();
    let grpc = app.grpc_addr();
    let http = format!("http://{}", app.http_addr());
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    // Readiness needs no token.
    let ready = eventually(Duration::from_secs(20), || async {
        let r = reqwest::get(format!("{http}/readyz")).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "allocator ready");
    Running {
        grpc,
        http,
        ns,
        nats,
        db,
        stop,
    }
}

impl Running {
    async fn client(&self) -> AllocatorClient<Channel> {
        AllocatorClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// `AllocationIssued` events on the log now.
    async fn allocation_events(&self) -> usize {
        let c = async_nats::connect(self.nats.url()).await.unwrap();
        stream_messages(&c, &self.ns.events_stream())
            .await
            .iter()
            .filter(|m| m.subject.as_str() == self.ns.allocation_subject())
            .count()
    }

    /// Waits until exactly `n` `AllocationIssued` events are on the log, and
    /// checks no more arrive for a moment.
    async fn expect_allocation_events(&self, n: usize) {
        let seen = eventually(Duration::from_secs(10), || async {
            let got = self.allocation_events().await;
            (got >= n).then_some(got)
        })
        .await;
        assert_eq!(seen, Some(n), "AllocationIssued events");
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(self.allocation_events().await, n, "no late events");
    }

    /// A sample of the `/metrics` page, by series (with labels).
    async fn metric(&self, series: &str) -> f64 {
        let page = reqwest::get(format!("{}/metrics", self.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        page.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{series} not on the page:\n{page}"))
            .parse()
            .unwrap()
    }

    async fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut r = reqwest::Client::new().get(format!("{}{path}", self.http));
        if path == "/v1/allocation" {
            r = r.query(&[("spec", SPEC)]);
        }
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        let r = r.send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.db.drop_db().await;
    }
}

fn request(token: Option<&str>) -> tonic::Request<RecommendRequest> {
    let mut req = tonic::Request::new(RecommendRequest {
        workload: [("package".to_owned(), "zlib".to_owned())].into(),
        r#ref: "main".into(),
        retry_of: None,
        preview: false,
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    req
}

#[tokio::test]
async fn grpc_calls_without_a_known_token_are_refused_and_publish_nothing() {
    let running = start(runyard_allocator::auth::tokens([TOKEN]), false).await;
    let mut client = running.client().await;

    let err = client.recommend(request(None)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.message(), "missing bearer token");
    let err = client
        .recommend(request(Some("guessed")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.message(), "unknown token");
    assert!(!err.message().contains("guessed"));
    let mut batch = tonic::Request::new(runyard_allocator::proto::RecommendBatchRequest {
        requests: vec![request(None).into_inner()],
    });
    batch
        .metadata_mut()
        .insert("authorization", "Basic Y2k6dG9rZW4=".parse().unwrap());
    let err = client.recommend_batch(batch).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(err.message(), "missing bearer token");

    // Refused calls issue nothing: the one answered call is the one event.
    let answer = client.recommend(request(Some(TOKEN))).await.unwrap();
    assert!(answer.into_inner().memory_limit_bytes > 0);
    running.expect_allocation_events(1).await;

    let refused = |reason| {
        format!("runyard_allocator_auth_refused_total{{api=\"grpc\",reason=\"{reason}\"}}")
    };
    assert_eq!(running.metric(&refused("missing")).await, 2.0);
    assert_eq!(running.metric(&refused("unknown")).await, 1.0);
    assert_eq!(
        running.metric("runyard_allocator_calls_shed_total").await,
        0.0
    );

    // Health and reflection stay open.
    let channel = Channel::from_shared(format!("http://{}", running.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: "runyard.allocator.v1.Allocator".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(futures::stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .unwrap()
        .into_inner();
    assert!(answers.message().await.unwrap().is_some());
    running.stop().await;
}

#[tokio::test]
async fn http_wants_a_token_except_health_readiness_and_metrics() {
    let running = start(runyard_allocator::auth::tokens([TOKEN]), false).await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(running.get(path, None).await.0, 200, "{path}");
    }
    // Gantry's endpoint and any other path: 401, naming the problem.
    for path in ["/v1/allocation", "/v1/other"] {
        let (status, body) = running.get(path, None).await;
        assert_eq!(
            (status, body.as_str()),
            (401, r#"{"error":"missing bearer token"}"#)
        );
        let (status, body) = running.get(path, Some("guessed")).await;
        assert_eq!(
            (status, body.as_str()),
            (401, r#"{"error":"unknown token"}"#)
        );
    }
    running.expect_allocation_events(0).await;
    let (status, body) = running.get("/v1/allocation", Some(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("variables"), "{body}");
    // With a token an unknown path is just unknown.
    assert_eq!(running.get("/v1/other", Some(TOKEN)).await.0, 404);
    running.expect_allocation_events(1).await;

    let refused = |reason| {
        format!("runyard_allocator_auth_refused_total{{api=\"http\",reason=\"{reason}\"}}")
    };
    assert_eq!(running.metric(&refused("missing")).await, 2.0);
    assert_eq!(running.metric(&refused("unknown")).await, 2.0);
    running.stop().await;
}

#[tokio::test]
async fn anonymous_gantry_opens_only_the_gantry_endpoint() {
    let running = start(runyard_allocator::auth::tokens([TOKEN]), true).await;
    let (status, body) = running.get("/v1/allocation", None).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("variables"), "{body}");
    let (status, body) = running.get("/v1/other", None).await;
    assert_eq!(
        (status, body.as_str()),
        (401, r#"{"error":"missing bearer token"}"#)
    );
    let mut client = running.client().await;
    let err = client.recommend(request(None)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    running.expect_allocation_events(1).await;
    running.stop().await;
}

#[tokio::test]
async fn every_token_of_a_token_file_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(
        &file,
        format!("# old, until every client has the new one\n{TOKEN}\n\n{ROTATED}\n"),
    )
    .unwrap();
    let tokens = Tokens::from_vars(
        (runyard_allocator::auth::TOKENS_VAR, None),
        (
            runyard_allocator::auth::TOKENS_FILE_VAR,
            Some(file.to_str().unwrap().to_owned()),
        ),
    )
    .unwrap();
    let running = start(tokens, false).await;
    let mut client = running.client().await;
    for token in [TOKEN, ROTATED] {
        client.recommend(request(Some(token))).await.unwrap();
        assert_eq!(running.get("/v1/allocation", Some(token)).await.0, 200);
    }
    let err = client
        .recommend(request(Some("ci-token-2026-10")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    running.expect_allocation_events(4).await;
    running.stop().await;
}

#[tokio::test]
async fn without_tokens_anyone_is_answered() {
    let running = start(Tokens::default(), false).await;
    let mut client = running.client().await;
    client.recommend(request(None)).await.unwrap();
    // A token sent anyway is not checked.
    client.recommend(request(Some("anything"))).await.unwrap();
    assert_eq!(running.get("/v1/allocation", None).await.0, 200);
    running.expect_allocation_events(3).await;
    running.stop().await;
}

#[tokio::test]
async fn each_client_publishes_at_most_its_burst_of_allocation_events() {
    // A burst of 5 a client, then 1 a second.
    let running = start_with(|c| Config {
        allocator_tokens: runyard_allocator::auth::tokens([TOKEN, ROTATED]),
        allocator_events_per_second: 1,
        allocator_events_burst: 5,
        ..c
    })
    .await;
    let mut client = running.client().await;
    // One client asks 20 at once over gRPC, then once over HTTP: every
    // answer is served, at most its burst (and what a second refills) is
    // published.
    let mut batch = tonic::Request::new(runyard_allocator::proto::RecommendBatchRequest {
        requests: (0..20).map(|_| request(None).into_inner()).collect(),
    });
    batch
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let answers = client.recommend_batch(batch).await.unwrap().into_inner();
    assert_eq!(answers.recommendations.len(), 20);
    assert_eq!(running.get("/v1/allocation", Some(TOKEN)).await.0, 200);
    // Another client (the other token) is not held back by the first.
    for _ in 0..3 {
        client.recommend(request(Some(ROTATED))).await.unwrap();
    }
    let published = eventually(Duration::from_secs(10), || async {
        let n = running.allocation_events().await;
        (n >= 8).then_some(n)
    })
    .await
    .expect("the second client's 3 and the first's burst of 5 published");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = published.max(running.allocation_events().await);
    assert!((8..=9).contains(&published), "{published} published of 24");
    let limited = running
        .metric("runyard_allocator_allocations_rate_limited_total")
        .await;
    assert_eq!(limited as usize + published, 24, "each answer counted once");
    running.stop().await;
}

/// A gRPC client whose connections leave from `source` (any 127.x address
/// routes over Linux loopback).
async fn client_from(running: &Running, source: [u8; 4]) -> AllocatorClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", running.grpc))
        .unwrap()
        .local_address(Some(std::net::IpAddr::from(source)))
        .connect()
        .await
        .unwrap();
    AllocatorClient::new(channel)
}

#[tokio::test]
async fn anonymous_clients_are_limited_per_peer_address() {
    // No tokens: callers are known by their address. A burst of 5 each.
    let running = start_with(|c| Config {
        allocator_events_per_second: 1,
        allocator_events_burst: 5,
        ..c
    })
    .await;
    // gRPC: 127.0.0.1 asks 20 at once, its burst of 5 is published; then
    // 127.0.0.2 asks 3 times, not held back by the first.
    let mut first = client_from(&running, [127, 0, 0, 1]).await;
    let batch = runyard_allocator::proto::RecommendBatchRequest {
        requests: (0..20).map(|_| request(None).into_inner()).collect(),
    };
    let answers = first.recommend_batch(batch).await.unwrap().into_inner();
    assert_eq!(answers.recommendations.len(), 20);
    let mut second = client_from(&running, [127, 0, 0, 2]).await;
    for _ in 0..3 {
        second.recommend(request(None)).await.unwrap();
    }
    // HTTP: 127.0.0.4 asks 7 times (5 published), then 127.0.0.3 asks 3
    // times, not held back either.
    let gantry = async |source: [u8; 4], times: usize| {
        let http = reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(source))
            .build()
            .unwrap();
        for _ in 0..times {
            let r = http
                .get(format!("{}/v1/allocation", running.http))
                .query(&[("spec", SPEC)])
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "every answer is served");
        }
    };
    gantry([127, 0, 0, 4], 7).await;
    gantry([127, 0, 0, 3], 3).await;
    let published = eventually(Duration::from_secs(10), || async {
        let n = running.allocation_events().await;
        (n >= 16).then_some(n)
    })
    .await
    .expect("each address's own burst published: 5 + 3 + 5 + 3");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let published = published.max(running.allocation_events().await);
    // One more may be a second's refill of 127.0.0.4 between its calls.
    assert!(
        (16..=17).contains(&published),
        "{published} published of 33"
    );
    let limited = running
        .metric("runyard_allocator_allocations_rate_limited_total")
        .await;
    assert_eq!(limited as usize + published, 33, "each answer counted once");
    running.stop().await;
}

#[tokio::test]
async fn silent_connections_to_either_port_are_closed() {
    use tokio::io::AsyncReadExt as _;
    let running = start(Tokens::default(), false).await;
    let http = running.http.trim_start_matches("http://").to_owned();
    // Neither the HTTP/2 preface on the gRPC port nor a request head on the
    // HTTP port: both connections are closed after runyard_tls's head
    // timeout, and the ports still answer.
    let mut grpc = tokio::net::TcpStream::connect(running.grpc).await.unwrap();
    let mut web = tokio::net::TcpStream::connect(&http).await.unwrap();
    let limit = runyard_tls::HEAD_TIMEOUT + Duration::from_secs(5);
    for (port, conn) in [("grpc", &mut grpc), ("http", &mut web)] {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(limit, conn.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "{port}: still open after {limit:?}");
    }
    let mut client = running.client().await;
    let answer = client.recommend(request(None)).await;
    assert!(answer.is_ok(), "{answer:?}");
    running.stop().await;
}
