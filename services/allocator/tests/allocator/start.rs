//! The `runyard-allocator` binary at start: token settings that cannot work
//! stop it with a message naming the variable (never the token); without
//! tokens it warns once that it answers anyone; with tokens it never logs
//! them.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runyard_testkit::{TestNats, unique_namespace};

// As `openssl rand -hex 32` makes them (weak tokens are refused).
const SECRET: &str = "467554999548c995fcef4502c71a40990eef784ee596468982a1c42542c8ef99";

fn allocator(env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runyard-allocator"));
    c.env_clear()
        .env("RUNYARD_ALLOCATOR_LISTEN", "127.0.0.1:0")
        .env("RUNYARD_ALLOCATOR_HTTP_LISTEN", "127.0.0.1:0")
        .env("RUNYARD_LOG_FORMAT", "json")
        .env("RUST_LOG", "info");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs the binary expecting it to refuse to start; its stderr.
fn refused(env: &[(&str, &str)]) -> String {
    let mut child = allocator(env)
        // Nothing listens here: were the settings accepted, it would wait.
        .env("RUNYARD_NATS_URL", "nats://127.0.0.1:1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running with {env:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!status.success(), "{env:?}: {stderr}");
    stderr
}

#[test]
fn token_settings_that_cannot_work_stop_the_binary_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "# no token yet\n\n").unwrap();
    let empty = empty.to_str().unwrap();

    let e = refused(&[
        ("RUNYARD_ALLOCATOR_TOKENS", SECRET),
        ("RUNYARD_ALLOCATOR_TOKENS_FILE", empty),
    ]);
    assert!(
        e.contains("RUNYARD_ALLOCATOR_TOKENS and RUNYARD_ALLOCATOR_TOKENS_FILE are both set"),
        "{e}"
    );
    assert!(!e.contains(SECRET), "{e}");
    let e = refused(&[("RUNYARD_ALLOCATOR_TOKENS_FILE", empty)]);
    assert!(e.contains("RUNYARD_ALLOCATOR_TOKENS_FILE: no token"), "{e}");
    for (tokens, why) in [
        (
            "change-me",
            "RUNYARD_ALLOCATOR_TOKENS item 1 is a known placeholder",
        ),
        (
            "k7Q2mZ9xR4vB",
            "RUNYARD_ALLOCATOR_TOKENS item 1 is 12 bytes long, shorter than 32",
        ),
    ] {
        let e = refused(&[("RUNYARD_ALLOCATOR_TOKENS", tokens)]);
        assert!(e.contains(why) && e.contains("openssl rand -hex 32"), "{e}");
        assert!(!e.contains(tokens), "{e}");
    }
    let e = refused(&[("RUNYARD_ALLOCATOR_TOKENS", "")]);
    assert!(e.contains("RUNYARD_ALLOCATOR_TOKENS: no token"), "{e}");
    let e = refused(&[("RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY", "yes please")]);
    assert!(e.contains("RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY:"), "{e}");
    let e = refused(&[("RUNYARD_ALLOCATOR_MAX_IN_FLIGHT", "0")]);
    assert!(e.contains("RUNYARD_ALLOCATOR_MAX_IN_FLIGHT:"), "{e}");
}

/// A started binary's stderr lines, read on a thread.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Running {
    fn start(nats: &str, env: &[(&str, &str)]) -> Self {
        let mut child = allocator(env)
            .env("RUNYARD_NATS_URL", nats)
            .env("RUNYARD_NAMESPACE", unique_namespace().to_string())
            // The history load may fail and retry: start-up logs come first.
            .env(
                "RUNYARD_DATABASE_URL",
                "postgres://postgres@127.0.0.1:1/none",
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// Every line up to and including the `allocator listening` one.
    fn until_listening(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            let Ok(line) = self.lines.recv_timeout(left) else {
                break;
            };
            let done = line.contains("allocator listening");
            seen.push(line);
            if done {
                return seen;
            }
        }
        panic!("never listening: {seen:#?}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn anonymous_is_one_warning_and_tokens_never_reach_the_log() {
    let nats = TestNats::get().await;
    let anonymous = Running::start(&nats.url(), &[]);
    let lines = anonymous.until_listening();
    let warnings: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("anonymous"))
        .collect();
    assert_eq!(warnings.len(), 1, "{lines:#?}");
    assert!(
        warnings[0].contains("RUNYARD_ALLOCATOR_TOKENS"),
        "{lines:#?}"
    );
    drop(anonymous);

    let list = format!("{SECRET}-1,{SECRET}-2");
    let guarded = Running::start(&nats.url(), &[("RUNYARD_ALLOCATOR_TOKENS", &list)]);
    let lines = guarded.until_listening();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("bearer token") && l.contains("\"tokens\":2")),
        "{lines:#?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("WARN") && l.contains("answers anyone")),
        "{lines:#?}"
    );
    // A little longer: the failing history load logs too.
    std::thread::sleep(Duration::from_millis(1500));
    let more: Vec<String> = guarded.lines.try_iter().collect();
    for line in lines.iter().chain(&more) {
        assert!(!line.contains(SECRET), "a token in the log: {line}");
    }
}

#[tokio::test]
async fn insecure_dev_lets_a_weak_token_through_with_a_warning_naming_it() {
    let nats = TestNats::get().await;
    let running = Running::start(
        &nats.url(),
        &[
            ("RUNYARD_ALLOCATOR_TOKENS", "change-me"),
            ("RUNYARD_INSECURE_DEV", "1"),
        ],
    );
    let lines = running.until_listening();
    assert!(
        lines.iter().any(|l| l.contains("WARN")
            && l.contains("RUNYARD_INSECURE_DEV")
            && l.contains("RUNYARD_ALLOCATOR_TOKENS item 1 is a known placeholder")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("change-me")), "{lines:#?}");
}

#[tokio::test]
async fn no_nats_password_in_the_debug_log() {
    let nats = runyard_testkit::nats_auth::SecuredNats::start().await;
    let log = runyard_testkit::nats_auth::debug_log_of(
        &nats,
        std::path::Path::new(env!("CARGO_BIN_EXE_runyard-allocator")),
        "allocator",
        &[
            // The history load may fail and retry: start-up logs come first.
            (
                "RUNYARD_DATABASE_URL",
                "postgres://postgres@127.0.0.1:1/none",
            ),
            ("RUNYARD_ALLOCATOR_LISTEN", "127.0.0.1:0"),
            ("RUNYARD_ALLOCATOR_HTTP_LISTEN", "127.0.0.1:0"),
        ],
        "allocator listening",
    )
    .await;
    runyard_testkit::nats_auth::assert_no_password(&nats, "allocator", &log);
}
