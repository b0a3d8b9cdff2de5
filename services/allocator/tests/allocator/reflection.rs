//! gRPC server reflection against the real allocator, through both protocol
//! versions: v1 (current grpcurl, grpcui) and v1alpha (Python's
//! `grpcio-reflection`, Postman, older grpcurl/Evans, which get
//! `UNIMPLEMENTED` from a server with v1 alone).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use prost::Message as _;
use runyard_allocator::{App, Config};
use runyard_testkit::{TestDb, TestNats, eventually, unique_namespace};
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_reflection::pb::{v1, v1alpha};

/// What a client browsing the allocator must find, in either version.
const SERVICES: [&str; 4] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "runyard.allocator.v1.Allocator",
];

struct Running {
    channel: Channel,
    db: TestDb,
    stop: oneshot::Sender<()>,
    _nats: TestNats,
}

async fn start() -> Running {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let db = TestDb::new();
    runyard_store::migrate(&db.url).await.unwrap();
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let app = App::build(Config {
        bus: runyard_config::Bus {
            nats_url: nats.url(),
            namespace: unique_namespace().to_string(),
        },
        database: runyard_config::Database {
            url: db.url.clone(),
        },
        allocator_listen: local,
        allocator_http_listen: local,
        ..Config::default()
    })
    .await
    .unwrap();
    let grpc = app.grpc_addr();
    let http = format!("http://{}", app.http_addr());
    let (stop, rx) = oneshot::channel::<()>();
    tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    let ready = eventually(Duration::from_secs(20), || async {
        let r = reqwest::get(format!("{http}/readyz")).await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "allocator ready");
    let channel = Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Running {
        channel,
        db,
        stop,
        _nats: nats,
    }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.db.drop_db().await;
    }
}

/// One request on a fresh v1 reflection stream; the one answer.
async fn ask_v1(
    channel: &Channel,
    request: v1::server_reflection_request::MessageRequest,
) -> v1::server_reflection_response::MessageResponse {
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let outbound = futures::stream::iter([v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }]);
    let mut answers = client
        .server_reflection_info(outbound)
        .await
        .unwrap()
        .into_inner();
    answers
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap()
}

/// One request on a fresh v1alpha reflection stream; the one answer.
async fn ask_v1alpha(
    channel: &Channel,
    request: v1alpha::server_reflection_request::MessageRequest,
) -> v1alpha::server_reflection_response::MessageResponse {
    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let outbound = futures::stream::iter([v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    }]);
    let mut answers = client
        .server_reflection_info(outbound)
        .await
        .unwrap()
        .into_inner();
    answers
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap()
}

fn expected() -> BTreeSet<String> {
    SERVICES.iter().map(|s| (*s).to_owned()).collect()
}

/// The packages of the file descriptors a `FileContainingSymbol` answer holds.
fn packages(files: &[Vec<u8>]) -> BTreeSet<String> {
    files
        .iter()
        .map(|f| {
            prost_types::FileDescriptorProto::decode(f.as_slice())
                .unwrap()
                .package
                .unwrap_or_default()
        })
        .collect()
}

#[tokio::test]
async fn v1_lists_the_services_and_describes_the_allocator() {
    let running = start().await;
    use v1::server_reflection_request::MessageRequest as Ask;
    use v1::server_reflection_response::MessageResponse as Answer;

    let Answer::ListServicesResponse(list) =
        ask_v1(&running.channel, Ask::ListServices(String::new())).await
    else {
        panic!("v1: expected a service list");
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    assert_eq!(names, expected());

    let Answer::FileDescriptorResponse(files) = ask_v1(
        &running.channel,
        Ask::FileContainingSymbol("runyard.allocator.v1.Allocator".into()),
    )
    .await
    else {
        panic!("v1: expected the allocator's file descriptor");
    };
    assert!(
        packages(&files.file_descriptor_proto).contains("runyard.allocator.v1"),
        "v1 describes the allocator"
    );
    running.stop().await;
}

#[tokio::test]
async fn v1alpha_lists_the_services_and_describes_the_allocator() {
    let running = start().await;
    use v1alpha::server_reflection_request::MessageRequest as Ask;
    use v1alpha::server_reflection_response::MessageResponse as Answer;

    let Answer::ListServicesResponse(list) =
        ask_v1alpha(&running.channel, Ask::ListServices(String::new())).await
    else {
        panic!("v1alpha: expected a service list");
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    assert_eq!(names, expected());

    let Answer::FileDescriptorResponse(files) = ask_v1alpha(
        &running.channel,
        Ask::FileContainingSymbol("runyard.allocator.v1.Allocator".into()),
    )
    .await
    else {
        panic!("v1alpha: expected the allocator's file descriptor");
    };
    assert!(
        packages(&files.file_descriptor_proto).contains("runyard.allocator.v1"),
        "v1alpha describes the allocator"
    );

    running.stop().await;
}
