//! `GET /v1/queue`: every job without a runner and why, from the scaler's
//! own state.

use std::collections::BTreeMap;

use runyard_events::JobStatus;
use serde_json::Value;

use crate::support::{Stack, pool_toml, until_async};

/// `job id → (reason, detail)` of the queue's view.
fn reasons(queue: &Value) -> BTreeMap<u64, (String, String)> {
    queue["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            (
                j["job_id"].as_u64().unwrap_or_default(),
                (
                    j["reason"].as_str().unwrap_or_default().to_owned(),
                    j["detail"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_says_why_each_job_has_no_runner() {
    let stack = Stack::new(&pool_toml(1, 0, "")).await;
    let scaler = stack.start().await;
    // One runner at most: the first job gets it, two wait for room.
    for id in [501, 502, 503] {
        stack.queued(id).await;
    }
    // No pool serves a GPU, and GitHub holds a deployment back.
    stack
        .observe(504, JobStatus::Queued, "", &["self-hosted", "gpu"])
        .await;
    stack
        .observe(505, JobStatus::Waiting, "", &["self-hosted", "linux"])
        .await;
    until_async("every job in the queue's view", async || {
        let q = reasons(&scaler.queue().await);
        q.len() == 5
            && q.get(&501)
                .is_some_and(|r| r.0 == "booting" || r.0 == "creating")
    })
    .await;
    stack.settled(&scaler).await;
    let view = scaler.queue().await;
    let q = reasons(&view);
    assert!(
        matches!(q[&501].0.as_str(), "booting" | "creating"),
        "{view:#}"
    );
    assert!(q[&501].1.contains("pool linux"), "{view:#}");
    for id in [502, 503] {
        assert_eq!(q[&id].0, "pool_full", "{view:#}");
        assert!(q[&id].1.contains("1 of 1"), "{view:#}");
    }
    assert_eq!(q[&504].0, "no_matching_pool", "{view:#}");
    assert!(q[&504].1.contains("gpu"), "{view:#}");
    assert_eq!(q[&505].0, "forge_waiting", "{view:#}");
    assert!(q[&505].1.contains("approval"), "{view:#}");
    // Oldest first, each with its pool and age.
    let order: Vec<u64> = view["jobs"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|j| j["job_id"].as_u64().unwrap_or_default())
        .collect();
    assert_eq!(order, [501, 502, 503, 504, 505], "{view:#}");
    assert_eq!(view["jobs"][1]["pool"], "linux", "{view:#}");
    assert!(view["jobs"][4]["pool"].is_string(), "{view:#}");

    // The runner's job starts: it leaves the queue, the next one is due.
    let runner = view["jobs"][0]["runner"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    stack.started(501, &runner).await;
    until_async("the started job leaves the queue", async || {
        !reasons(&scaler.queue().await).contains_key(&501)
    })
    .await;
    scaler.stop().await;
}
