//! Reaching a NATS that wants more than a URL — TLS with a private CA, a
//! user and password, a token, an NKey seed, a `.creds` file in operator
//! mode — against
//! real nats-server processes, and settings that cannot work refused naming
//! their variable.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::Path;

use async_nats::ConnectErrorKind;
use runyard_bus::{Bus, BusError, NatsAccess, StreamSettings, TraceParent};
use runyard_testkit::nats_jwt::OperatorMode;
use runyard_testkit::synth::{base_time, usage_event};
use runyard_testkit::{
    decode_events, free_port, spawn_nats, stream_messages, unique_namespace, wait_for_port,
};

/// A bus in a fresh namespace on `url`, connecting once.
async fn connect(url: &str, access: &NatsAccess) -> Result<Bus, BusError> {
    Bus::connect_with(url, unique_namespace(), "test", false, access).await
}

/// A nats-server with JetStream and `extra` in its configuration, on a
/// free port; killed when dropped.
async fn server(dir: &Path, extra: &str) -> (tokio::process::Child, u16) {
    let port = free_port();
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?}, max_file_store: 1P }}\n{extra}\n",
            dir.join("js").display().to_string()
        ),
    )
    .unwrap();
    let child = spawn_nats(&conf);
    wait_for_port(([127, 0, 0, 1], port).into()).await;
    (child, port)
}

#[tokio::test]
async fn a_tls_nats_is_reached_with_its_ca_and_refused_without_it() {
    runyard_telemetry::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (crt, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.key_pair.serialize_pem()).unwrap();
    let (_server, port) = server(
        dir.path(),
        &format!("tls {{ cert_file: {:?}, key_file: {:?} }}", crt, key),
    )
    .await;
    let url = format!("nats://localhost:{port}");
    let with_ca = NatsAccess {
        tls_ca: Some(crt.clone()),
        ..NatsAccess::default()
    };
    let bus = connect(&url, &with_ca).await.unwrap();
    // Not just a handshake: JetStream answers over it.
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    assert!(bus.streams_exist().await);

    // Without the CA the server's certificate is not trusted.
    let err = connect(&url, &NatsAccess::default())
        .await
        .expect_err("a plaintext or untrusted connection is refused");
    assert!(matches!(err, BusError::Connect { .. }), "{err}");

    // A CA file that is not there is named, with its variable.
    let missing = NatsAccess {
        tls_ca: Some(dir.path().join("no-such-ca.pem")),
        ..NatsAccess::default()
    };
    let err = connect(&url, &missing).await.expect_err("missing CA");
    let text = err.to_string();
    assert!(
        text.starts_with("RUNYARD_NATS_TLS_CA: ") && text.contains("no-such-ca.pem"),
        "{text}"
    );
}

#[tokio::test]
async fn user_and_password_ride_in_the_url_and_a_wrong_one_is_refused_unlogged() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = server(
        dir.path(),
        "authorization { user: runyard, password: \"pa55-w0rd\" }",
    )
    .await;
    let good = format!("nats://runyard:pa55-w0rd@127.0.0.1:{port}");
    let bus = connect(&good, &NatsAccess::default()).await.unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();

    let wrong = format!("nats://runyard:guessed-pw@127.0.0.1:{port}");
    let err = connect(&wrong, &NatsAccess::default())
        .await
        .expect_err("wrong password refused");
    let text = format!("{err} / {err:?}");
    assert!(!text.contains("guessed-pw"), "{text}");
    assert!(text.contains("runyard:***@"), "{text}");
}

#[tokio::test]
async fn user_and_password_apart_from_the_url_or_from_a_file_log_in() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = server(
        dir.path(),
        "authorization { user: runyard, password: \"pa55-w0rd\" }",
    )
    .await;
    let url = format!("nats://127.0.0.1:{port}");
    let given = NatsAccess {
        user: Some("runyard".into()),
        password: Some("pa55-w0rd".to_owned().into()),
        ..NatsAccess::default()
    };
    let bus = connect(&url, &given).await.unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    // From a file, with the newline an editor leaves.
    let file = dir.path().join("nats-password");
    std::fs::write(&file, "pa55-w0rd\n").unwrap();
    let from_file = NatsAccess {
        user: Some("runyard".into()),
        password_file: Some(file.clone()),
        ..NatsAccess::default()
    };
    connect(&url, &from_file).await.unwrap();
    let wrong = NatsAccess {
        user: Some("runyard".into()),
        password: Some("guessed-pw".to_owned().into()),
        ..NatsAccess::default()
    };
    let err = connect(&url, &wrong)
        .await
        .expect_err("wrong password refused");
    let text = format!("{err} / {err:?}");
    assert!(!text.contains("guessed-pw"), "{text}");
    // A file that is not there is named with its variable.
    let missing = NatsAccess {
        user: Some("runyard".into()),
        password_file: Some(dir.path().join("nope")),
        ..NatsAccess::default()
    };
    let err = connect(&url, &missing).await.expect_err("no file");
    assert!(
        err.to_string().contains("RUNYARD_NATS_PASSWORD_FILE"),
        "{err}"
    );
}

#[tokio::test]
async fn a_token_rides_in_the_url_percent_encoded_like_any_userinfo() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, port) = server(dir.path(), "authorization { token: \"t0k/en+1\" }").await;
    let url = format!("nats://t0k%2Fen%2B1@127.0.0.1:{port}");
    let bus = connect(&url, &NatsAccess::default()).await.unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    let err = connect(
        &format!("nats://not-it@127.0.0.1:{port}"),
        &NatsAccess::default(),
    )
    .await
    .expect_err("a wrong token is refused");
    assert!(!format!("{err:?}").contains("not-it"), "{err:?}");
}

#[tokio::test]
async fn an_nkey_seed_file_logs_in_and_another_seed_or_a_bad_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let (_server, port) = server(
        dir.path(),
        &format!(
            "authorization {{ users: [ {{ nkey: {} }} ] }}",
            user.public_key()
        ),
    )
    .await;
    let url = format!("nats://127.0.0.1:{port}");
    let seed_file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        NatsAccess {
            nkey: Some(path),
            ..NatsAccess::default()
        }
    };
    let seed = user.seed().unwrap();
    let bus = connect(&url, &seed_file("user.nk", &format!("{seed}\n")))
        .await
        .unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    assert!(bus.streams_exist().await);

    // Without a seed, or with a user the server does not list: refused.
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    for access in [NatsAccess::default(), seed_file("stranger.nk", &stranger)] {
        let err = connect(&url, &access).await.expect_err("refused");
        assert!(matches!(&err, BusError::Connect { .. }), "{err}: {err:?}");
        let text = format!("{err} / {err:?}");
        assert!(!text.contains(&stranger) && !text.contains(&seed), "{text}");
    }
    // A file without a seed, a damaged seed, or a seed with a .creds file
    // too: named with the variable at start, the seed never echoed.
    let damaged = format!("{}X", &seed[..seed.len() - 1]);
    for (access, reason) in [
        (
            seed_file("empty.nk", "# nothing\n"),
            "holds no user NKey seed",
        ),
        (seed_file("damaged.nk", &damaged), "not a valid NKey seed"),
        (
            NatsAccess {
                creds: Some(dir.path().join("service.creds")),
                ..seed_file("user2.nk", &seed)
            },
            "both set",
        ),
    ] {
        let err = connect(&url, &access).await.expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains("RUNYARD_NATS_NKEY") && text.contains(reason),
            "{text}"
        );
        assert!(
            !text.contains(&seed[2..]) && !text.contains(&damaged[2..]),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_creds_file_that_cannot_be_read_is_named_with_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let access = NatsAccess {
        creds: Some(dir.path().join("service.creds")),
        ..NatsAccess::default()
    };
    let err = connect("nats://127.0.0.1:1", &access)
        .await
        .expect_err("no creds file");
    let text = err.to_string();
    assert!(
        text.starts_with("RUNYARD_NATS_CREDS: ") && text.contains("service.creds"),
        "{text}"
    );
}

#[tokio::test]
async fn a_creds_file_logs_in_to_an_operator_mode_nats_and_foreign_or_expired_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let operator = OperatorMode::new();
    let (_server, port) = server(dir.path(), operator.server_config()).await;
    let url = format!("nats://127.0.0.1:{port}");
    let with_creds = |creds: &Path| NatsAccess {
        creds: Some(creds.to_owned()),
        ..NatsAccess::default()
    };

    // The account's user is let in, and JetStream works for its account:
    // the streams are made and an event goes in and comes back out.
    let bus = connect(&url, &with_creds(&operator.creds)).await.unwrap();
    bus.ensure_streams(&StreamSettings::default())
        .await
        .unwrap();
    assert!(bus.streams_exist().await);
    let event = usage_event(42, base_time());
    let stored = bus
        .publish_event(&event, &TraceParent::new_root())
        .await
        .unwrap();
    assert_eq!((stored.sequence, stored.duplicate), (1, false));
    let msgs = stream_messages(bus.client(), &bus.namespace().events_stream()).await;
    assert_eq!(decode_events(&msgs), vec![event]);

    // No creds, a user of an account the operator never signed, a user
    // whose JWT has expired: each refused by the server, no seed in the
    // error.
    for (who, access) in [
        ("no creds", NatsAccess::default()),
        ("foreign account", with_creds(&operator.foreign_creds)),
        ("expired user", with_creds(&operator.expired_creds)),
    ] {
        let err = connect(&url, &access).await.expect_err(who);
        let text = format!("{err} / {err:?}");
        assert!(
            matches!(&err, BusError::Connect { source, .. }
                if source.kind() == ConnectErrorKind::AuthorizationViolation),
            "{who}: {text}"
        );
        assert!(text.contains("authorization violation"), "{who}: {text}");
        for seed in operator.seeds() {
            assert!(!text.contains(seed.as_str()), "{who}: a seed in {text}");
        }
    }
}
