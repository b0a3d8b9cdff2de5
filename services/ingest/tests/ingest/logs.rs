//! The ingest binary's JSON logs against a real nats-server: a delivery's
//! log lines name the trace the sender started, the same trace its events
//! carry on to the other services.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use runyard_bus::TraceParent;
use runyard_testkit::{TestNats, stream_messages, unique_namespace};
use serde_json::{Value, json};

// As `openssl rand -hex 32` makes them (ingest refuses weak ones).
const USAGE_TOKEN: &str = "80c62daa6787d644dc33b247c9be7f40d83f20aefc9339ca45a22d4e7706c137";

/// The ingest binary with a clean environment and JSON logs.
fn command(nats: &str, ns: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_runyard-ingest"));
    command
        .env_clear()
        .env("RUNYARD_NATS_URL", nats)
        .env("RUNYARD_NAMESPACE", ns)
        .env("RUNYARD_INGEST_LISTEN", "127.0.0.1:0")
        .env("RUNYARD_LOG_FORMAT", "json")
        .env("RUST_LOG", "info,runyard_ingest=debug");
    command
}

struct Ingest {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Ingest {
    fn start(nats: &str, ns: &str) -> Self {
        Self::start_with(nats, ns, &[("RUNYARD_USAGE_TOKEN", USAGE_TOKEN)])
    }

    fn start_with(nats: &str, ns: &str, env: &[(&str, &str)]) -> Self {
        let mut child = command(nats, ns)
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("runyard-ingest starts");
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("a log line that is not JSON: {line}: {e}"));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        Self { child, lines }
    }

    /// The first line `pick` accepts within `limit`, every line read meanwhile.
    fn wait_for(
        &self,
        limit: Duration,
        pick: impl Fn(&Value) -> bool,
    ) -> (Option<Value>, Vec<Value>) {
        let deadline = std::time::Instant::now() + limit;
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if pick(&line) => return (Some(line), seen),
                Ok(line) => seen.push(line),
                Err(_) => break,
            }
        }
        (None, seen)
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_deliverys_log_lines_name_the_senders_trace() {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let ingest = Ingest::start(&nats.url(), &ns.to_string());
    let (listening, _) = ingest.wait_for(Duration::from_secs(30), |l| {
        l["message"] == "ingest listening"
    });
    let listening = listening.expect("ingest logs its address");
    let addr = listening["addr"].as_str().expect("the address").to_owned();
    assert!(
        listening.get("trace_id").is_none(),
        "a line outside any delivery names no trace: {listening}"
    );

    let sender = TraceParent::new_root();
    let report = json!({
        "forge": "gitlab", "instance": "gitlab.example.com", "job_id": 9001,
        "attempt": 1, "ref": "develop", "workload": {"package": "zlib"},
        "peak_memory_bytes": 1_000_000u64, "memory_limit_bytes": 2_000_000u64,
        "cpu_seconds": 1.0, "wall_seconds": 1.0, "oom_killed": false, "exit_code": 0
    });
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("http://{addr}/v1/usage"))
        .bearer_auth(USAGE_TOKEN)
        .header("traceparent", sender.to_string())
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 202, "{:?}", answer.text().await);

    let trace = format!("{:032x}", sender.trace_id);
    let (accepted, seen) = ingest.wait_for(Duration::from_secs(10), |l| {
        l["message"] == "delivery accepted"
    });
    let accepted = accepted.unwrap_or_else(|| panic!("a 'delivery accepted' line in {seen:?}"));
    assert_eq!(accepted["trace_id"], trace.as_str(), "{accepted}");
    let span_id = accepted["span_id"].as_str().expect("a span id").to_owned();
    assert_eq!(span_id.len(), 16);
    assert_ne!(
        span_id,
        format!("{:016x}", sender.span_id),
        "ingest's own span"
    );

    // The event the delivery became carries the same trace, from the span
    // the log line names.
    let client = async_nats::connect(nats.url()).await.unwrap();
    let msgs = stream_messages(&client, &ns.events_stream()).await;
    let carried: Vec<TraceParent> = msgs
        .iter()
        .filter_map(|m| m.headers.as_ref()?.get(runyard_bus::TRACEPARENT_HEADER))
        .filter_map(|v| TraceParent::parse(v.as_str()))
        .collect();
    assert_eq!(carried.len(), 1, "one event");
    assert_eq!(format!("{:032x}", carried[0].trace_id), trace);
    assert_eq!(format!("{:016x}", carried[0].span_id), span_id);
}

#[test]
fn the_binary_refuses_a_placeholder_secret_naming_the_variable() {
    // Nothing listens on the NATS URL: the check comes first.
    let out = command("nats://127.0.0.1:1", "weak")
        .env("RUNYARD_USAGE_TOKEN", "change-me")
        .stdout(Stdio::null())
        .output()
        .expect("runyard-ingest runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("RUNYARD_USAGE_TOKEN is a known placeholder")
            && stderr.contains("openssl rand -hex 32"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("change-me"),
        "the value stays out: {stderr}"
    );
}

#[tokio::test]
async fn insecure_dev_starts_with_a_weak_secret_and_warns_naming_it() {
    runyard_telemetry::install_crypto_provider();
    let nats = TestNats::get().await;
    let ns = unique_namespace();
    let ingest = Ingest::start_with(
        &nats.url(),
        &ns.to_string(),
        &[
            ("RUNYARD_USAGE_TOKEN", "change-me"),
            ("RUNYARD_INSECURE_DEV", "1"),
        ],
    );
    let (warning, seen) = ingest.wait_for(Duration::from_secs(30), |l| {
        l["level"] == "WARN" && l["variable"] == "RUNYARD_INSECURE_DEV"
    });
    let warning =
        warning.unwrap_or_else(|| panic!("a WARN about RUNYARD_INSECURE_DEV in {seen:?}"));
    assert!(
        warning["let_through"]
            .as_str()
            .is_some_and(|s| s.contains("RUNYARD_USAGE_TOKEN is a known placeholder")),
        "{warning}"
    );
    let (listening, seen) = ingest.wait_for(Duration::from_secs(30), |l| {
        l["message"] == "ingest listening"
    });
    assert!(listening.is_some(), "ingest starts: {seen:?}");
}

#[tokio::test]
async fn no_nats_password_in_the_debug_log() {
    let nats = runyard_testkit::nats_auth::SecuredNats::start().await;
    let log = runyard_testkit::nats_auth::debug_log_of(
        &nats,
        std::path::Path::new(env!("CARGO_BIN_EXE_runyard-ingest")),
        "ingest",
        &[
            ("RUNYARD_INGEST_LISTEN", "127.0.0.1:0"),
            ("RUNYARD_USAGE_TOKEN", USAGE_TOKEN),
        ],
        "event log streams ready",
    )
    .await;
    runyard_testkit::nats_auth::assert_no_password(&nats, "ingest", &log);
    // It got as far as its streams: the log shows it working, not refused.
    assert!(log.contains("event log streams ready"), "{log}");
}
