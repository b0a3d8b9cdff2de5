//! Input generators shared by the property tests: `tests/forge/fuzz.rs`,
//! and the filtered-parse equivalence tests inside the crate
//! (`src/filter/equivalence.rs`, which reach the normalizers' internal
//! switch).
//!
//! Three kinds of input: arbitrary bytes, arbitrary JSON built from the
//! vocabulary of the real payloads (so it reaches deep into the
//! normalizers), and the fixtures with random fields replaced or removed.

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Number, Value};
use time::OffsetDateTime;
use time::macros::datetime;

pub const FIXTURE_RX: OffsetDateTime = datetime!(2024-06-01 12:20:00 UTC);

pub const GITHUB_FIXTURES: &[&str] = &[
    include_str!("../../tests/fixtures/github_workflow_job_queued.json"),
    include_str!("../../tests/fixtures/github_workflow_job_waiting.json"),
    include_str!("../../tests/fixtures/github_workflow_job_in_progress.json"),
    include_str!("../../tests/fixtures/github_workflow_job_completed.json"),
];
pub const GITLAB_JOB_FIXTURES: &[&str] = &[
    include_str!("../../tests/fixtures/gitlab_job_pending.json"),
    include_str!("../../tests/fixtures/gitlab_job_running.json"),
    include_str!("../../tests/fixtures/gitlab_job_failed.json"),
    include_str!("../../tests/fixtures/gitlab_job_manual.json"),
];
pub const GITLAB_PIPELINE: &str = include_str!("../../tests/fixtures/gitlab_pipeline_failed.json");
pub const USAGE: &str = include_str!("../../tests/fixtures/usage_report.json");

/// Keys the normalizers look for, so random objects hit real code paths.
pub const KEYS: &[&str] = &[
    "action",
    "workflow_job",
    "id",
    "run_id",
    "run_attempt",
    "name",
    "workflow_name",
    "labels",
    "conclusion",
    "runner_id",
    "runner_name",
    "runner_group_id",
    "runner_group_name",
    "head_branch",
    "head_sha",
    "created_at",
    "started_at",
    "completed_at",
    "html_url",
    "repository",
    "full_name",
    "organization",
    "login",
    "enterprise",
    "slug",
    "object_kind",
    "build_id",
    "build_name",
    "build_stage",
    "build_status",
    "build_created_at",
    "build_started_at",
    "build_finished_at",
    "build_created_at_iso",
    "build_started_at_iso",
    "build_finished_at_iso",
    "build_duration",
    "build_queued_duration",
    "build_failure_reason",
    "build_allow_failure",
    "retries_count",
    "pipeline_id",
    "project_id",
    "project_name",
    "project",
    "path_with_namespace",
    "web_url",
    "homepage",
    "ref",
    "sha",
    "tag",
    "runner",
    "description",
    "tags",
    "object_attributes",
    "status",
    "source",
    "finished_at",
    "duration",
    "queued_duration",
    "url",
    "builds",
    "stage",
    "failure_reason",
    "allow_failure",
    "forge",
    "instance",
    "job_id",
    "attempt",
    "workload",
    "peak_memory_bytes",
    "memory_request_bytes",
    "memory_limit_bytes",
    "cpu_seconds",
    "wall_seconds",
    "cpu_request_millicores",
    "oom_killed",
    "exit_code",
];

/// Values that mean something to the normalizers.
pub const WORDS: &[&str] = &[
    "queued",
    "waiting",
    "in_progress",
    "completed",
    "success",
    "failure",
    "cancelled",
    "created",
    "pending",
    "running",
    "failed",
    "canceled",
    "skipped",
    "manual",
    "waiting_for_resource",
    "build",
    "pipeline",
    "github",
    "gitlab",
    "gitlab.example.com",
    "https://gitlab.example.com/a/b",
    "https://[::1",
    "http://",
    "2024-06-01T12:00:00Z",
    "2024-06-01 12:00:00 UTC",
    "2024-06-01 12:00:00 +0100",
    "1999-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "-0001-01-01T00:00:00Z",
    "2024-02-30 12:00:00 UTC",
    "2024-06-01T12:00:00.999999999999Z",
    "",
    " ",
    "a\r\nb",
];

pub fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(0_u64),
            Just(1),
            Just(u64::from(u32::MAX)),
            Just(u64::MAX)
        ]
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        prop::sample::select(WORDS).prop_map(|s| Value::String(s.to_owned())),
        any::<String>().prop_map(Value::String),
    ]
}

pub fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 96, 8, |inner| {
        let key = prop_oneof![
            4 => prop::sample::select(KEYS).prop_map(str::to_owned),
            1 => any::<String>(),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..10)
                .prop_map(|kvs| Value::Object(kvs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

pub fn content_type() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => Just(None),
        3 => Just(Some("application/json".to_owned())),
        1 => Just(Some("application/json; charset=utf-8".to_owned())),
        1 => Just(Some("application/x-www-form-urlencoded".to_owned())),
        1 => any::<String>().prop_map(Some),
    ]
}

pub fn received_at() -> impl Strategy<Value = OffsetDateTime> {
    prop_oneof![
        3 => Just(FIXTURE_RX),
        1 => (-377_705_116_800_i64..=253_402_300_799)
            .prop_filter_map("in range", |s| OffsetDateTime::from_unix_timestamp(s).ok()),
        1 => Just(datetime!(9999-12-31 23:59:59.999999999 UTC)),
    ]
}

/// Every JSON pointer in `v` (the root excluded).
pub fn pointers(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, &p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, &p, out);
            }
        }
        _ => {}
    }
}

/// Applies mutations to a fixture: each replaces (or, with `None`, removes)
/// the value at a randomly chosen pointer.
pub fn mutate(fixture: &str, mutations: &[(Index, Option<Value>)]) -> Vec<u8> {
    let mut v: Value = serde_json::from_str(fixture).expect("fixtures are JSON");
    for (index, replacement) in mutations {
        let mut all = Vec::new();
        pointers(&v, "", &mut all);
        if all.is_empty() {
            break;
        }
        let pointer = &all[index.index(all.len())];
        match replacement {
            Some(new) => {
                if let Some(slot) = v.pointer_mut(pointer) {
                    *slot = new.clone();
                }
            }
            None => {
                let (parent, key) = pointer.rsplit_once('/').expect("pointers have a slash");
                match v.pointer_mut(parent) {
                    Some(Value::Object(m)) => {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                    Some(Value::Array(items)) => {
                        if let Some(i) = key.parse::<usize>().ok().filter(|i| *i < items.len()) {
                            items.remove(i);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    serde_json::to_vec(&v).expect("serializes")
}

pub fn mutations() -> impl Strategy<Value = Vec<(Index, Option<Value>)>> {
    prop::collection::vec((any::<Index>(), prop::option::weighted(0.8, json())), 1..4)
}
