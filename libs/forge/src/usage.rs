//! Usage reports (`POST /v1/usage`) → `UsageReported`.

use runyard_events::{Body, Event, JobKey, UsageReported, ids, parse_forge};
use time::OffsetDateTime;

use crate::json::Obj;
use crate::{Envelope, Members, PayloadError, encoding, host_of, parse_json};

/// Normalizes one usage report (ARCHITECTURE.md, "Usage report body") into a
/// `UsageReported` event with id `usage:<forge>:<instance>:<job_id>:<attempt>`;
/// the same key is the event's `Source.delivery_id`, so a reporter that
/// retries a report is deduplicated like a forge redelivery.
///
/// `instance` may be a bare host or a base URL (`CI_SERVER_URL`,
/// `GITHUB_SERVER_URL`); it is reduced to the lower-cased host so the report
/// joins the job the webhooks describe. Unknown keys are ignored so a newer
/// reporter can talk to an older ingest. The report has no time of its own:
/// it occurred when it was received.
pub fn normalize_usage(
    content_type: Option<&str>,
    body: &[u8],
    received_at: OffsetDateTime,
) -> Result<Event, PayloadError> {
    encoding(content_type, false)?;
    let value = parse_json(body, "body", Members::All)?;
    let root = Obj::root(&value)?;

    let forge = parse_forge(root.req_str("forge")?)
        .ok_or_else(|| PayloadError::invalid("forge", "expected \"github\" or \"gitlab\""))?;
    let instance = root.req_str("instance")?;
    if instance.trim().is_empty() {
        return Err(PayloadError::invalid("instance", "must not be empty"));
    }
    let instance = host_of(instance)
        .ok_or_else(|| PayloadError::invalid("instance", "expected a host name or base URL"))?;
    let job_id = root.req_id("job_id")?;
    let attempt = match root.opt_id("attempt")? {
        None => 1,
        Some(n) => u32::try_from(n).map_err(|_| PayloadError::invalid("attempt", "too large"))?,
    };

    let reported = UsageReported {
        job: Some(JobKey {
            forge: forge as i32,
            instance: instance.clone(),
            job_id,
        }),
        attempt,
        r#ref: root.str_or_empty("ref")?,
        workload: root.opt_str_map("workload")?,
        peak_memory_bytes: root.req_u64("peak_memory_bytes")?,
        memory_request_bytes: root.opt_u64("memory_request_bytes")?,
        memory_limit_bytes: root.opt_u64("memory_limit_bytes")?,
        cpu_seconds: root.opt_f64("cpu_seconds")?.unwrap_or_default(),
        wall_seconds: root.opt_f64("wall_seconds")?.unwrap_or_default(),
        cpu_request_millicores: root.opt_u64("cpu_request_millicores")?,
        oom_killed: root.opt_bool("oom_killed")?.unwrap_or_default(),
        exit_code: root.opt_i32("exit_code")?,
        project: root.str_or_empty("project")?,
        cgroup: match root.str_or_empty("cgroup")?.as_str() {
            c @ ("" | "v1" | "v2") => c.to_owned(),
            _ => {
                return Err(PayloadError::invalid(
                    "cgroup",
                    "expected \"v1\", \"v2\" or absent",
                ));
            }
        },
        // Who sent it is ingest's to say (the body has no say in it).
        identity: None,
    };
    let id = ids::usage(forge, &instance, job_id, attempt);
    let envelope = Envelope {
        forge,
        instance: &instance,
        delivery_id: &id,
        hook_id: "",
        received_at,
    };
    Ok(envelope.event(id.clone(), received_at, Body::UsageReported(reported)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, removed, replaced};
    use runyard_events::Forge;
    use serde_json::{Value as Json, json};
    use time::macros::datetime;

    const RX: OffsetDateTime = datetime!(2024-06-01 12:17:00 UTC);
    const REPORT: &str = include_str!("../tests/fixtures/usage_report.json");

    fn usage(e: &Event) -> &UsageReported {
        match &e.body {
            Some(Body::UsageReported(u)) => u,
            other => panic!("not a UsageReported: {other:?}"),
        }
    }

    fn invalid_field(body: &[u8]) -> String {
        match normalize_usage(Some("application/json"), body, RX) {
            Err(e) => e.field().unwrap_or_default().to_owned(),
            Ok(e) => panic!("accepted: {e:?}"),
        }
    }

    #[test]
    fn documented_report_is_normalized() {
        let e = normalize_usage(Some("application/json"), REPORT.as_bytes(), RX).expect("valid");
        assert_eq!(e.id, "usage:gitlab:gitlab.example.com:4711:1");
        let src = e.source.as_ref().expect("source");
        assert_eq!(src.forge(), Forge::Gitlab);
        assert_eq!(src.instance, "gitlab.example.com");
        assert_eq!(src.delivery_id, e.id);
        assert_eq!(src.hook_id, "");
        assert_eq!(src.producer, "ingest");
        assert_eq!(at(&e.occurred_at), Some(RX));
        assert_eq!(at(&e.received_at), Some(RX));

        let u = usage(&e);
        let key = u.job.as_ref().expect("key");
        assert_eq!(
            (key.forge(), key.instance.as_str(), key.job_id),
            (Forge::Gitlab, "gitlab.example.com", 4711)
        );
        assert_eq!(u.attempt, 1);
        assert_eq!(u.r#ref, "develop");
        assert_eq!(u.workload.len(), 5);
        assert_eq!(
            u.workload.get("package").map(String::as_str),
            Some("py-torch")
        );
        assert_eq!(
            u.workload.get("variants").map(String::as_str),
            Some("+cuda~rocm")
        );
        assert_eq!(u.peak_memory_bytes, 9_123_456_789);
        assert_eq!(u.memory_request_bytes, Some(8_000_000_000));
        assert_eq!(u.memory_limit_bytes, Some(12_000_000_000));
        assert_eq!(u.cpu_seconds, 5400.5);
        assert_eq!(u.wall_seconds, 900.2);
        assert_eq!(u.cpu_request_millicores, Some(8000));
        assert!(!u.oom_killed);
        assert_eq!(u.exit_code, Some(0));
        assert_eq!(u.cgroup, "v2");
        assert_eq!(u.project, "");
    }

    #[test]
    fn minimal_report_gets_defaults() {
        let body = br#"{"forge":"github","instance":"github.com","job_id":21870573124,
                        "peak_memory_bytes":0}"#;
        let e = normalize_usage(None, body, RX).expect("valid");
        assert_eq!(e.id, "usage:github:github.com:21870573124:1");
        let u = usage(&e);
        assert_eq!(u.attempt, 1);
        assert_eq!((u.cpu_seconds, u.wall_seconds), (0.0, 0.0));
        assert!(!u.oom_killed);
        assert_eq!(u.exit_code, None);
        assert_eq!(
            (
                u.memory_request_bytes,
                u.memory_limit_bytes,
                u.cpu_request_millicores
            ),
            (None, None, None)
        );
        assert!(u.workload.is_empty());
    }

    #[test]
    fn optional_fields_are_read() {
        let body = replaced(REPORT, "/attempt", json!(3));
        let body = String::from_utf8(body).expect("utf-8");
        let body = replaced(&body, "/oom_killed", json!(true));
        let body = String::from_utf8(body).expect("utf-8");
        let body = replaced(&body, "/exit_code", json!(137));
        let mut v: Json = serde_json::from_slice(&body).expect("json");
        v["project"] = json!("ci/spack-packages");
        v["reporter_version"] = json!("0.2.0");
        let body = serde_json::to_vec(&v).expect("serializes");
        let e = normalize_usage(None, &body, RX).expect("valid");
        assert_eq!(e.id, "usage:gitlab:gitlab.example.com:4711:3");
        let u = usage(&e);
        assert_eq!(u.attempt, 3);
        assert!(u.oom_killed);
        assert_eq!(u.exit_code, Some(137));
        assert_eq!(u.project, "ci/spack-packages");
    }

    #[test]
    fn instance_is_reduced_to_its_host() {
        let body = replaced(REPORT, "/instance", json!("https://GitLab.example.com/"));
        let e = normalize_usage(None, &body, RX).expect("valid");
        assert_eq!(e.id, "usage:gitlab:gitlab.example.com:4711:1");
    }

    #[test]
    fn only_json_is_accepted() {
        assert_eq!(
            normalize_usage(Some("text/plain"), REPORT.as_bytes(), RX),
            Err(PayloadError::UnsupportedMediaType("text/plain".into()))
        );
        assert!(
            normalize_usage(
                Some("application/json; charset=utf-8"),
                REPORT.as_bytes(),
                RX
            )
            .is_ok()
        );
    }

    #[test]
    fn invalid_reports_name_their_field() {
        assert_eq!(invalid_field(b"forge=gitlab"), "body");
        assert_eq!(invalid_field(b"[]"), "body");
        let cases: &[(&str, Json, &str)] = &[
            ("/forge", json!("bitbucket"), "forge"),
            ("/forge", json!("GitLab"), "forge"),
            ("/forge", Json::Null, "forge"),
            ("/instance", json!(""), "instance"),
            ("/instance", json!("  "), "instance"),
            ("/instance", json!("gitlab example"), "instance"),
            ("/instance", json!(5), "instance"),
            ("/job_id", json!(0), "job_id"),
            ("/job_id", json!(-4711), "job_id"),
            ("/job_id", json!("4711"), "job_id"),
            ("/job_id", json!(4711.0), "job_id"),
            ("/attempt", json!(0), "attempt"),
            ("/attempt", json!(4294967296_u64), "attempt"),
            ("/attempt", json!("1"), "attempt"),
            ("/peak_memory_bytes", json!(-1), "peak_memory_bytes"),
            ("/peak_memory_bytes", json!("9G"), "peak_memory_bytes"),
            ("/peak_memory_bytes", json!(1.5e9), "peak_memory_bytes"),
            ("/peak_memory_bytes", Json::Null, "peak_memory_bytes"),
            ("/memory_request_bytes", json!(-8), "memory_request_bytes"),
            ("/memory_limit_bytes", json!("12G"), "memory_limit_bytes"),
            (
                "/cpu_request_millicores",
                json!(-1),
                "cpu_request_millicores",
            ),
            ("/cpu_seconds", json!(-0.5), "cpu_seconds"),
            ("/cpu_seconds", json!("5400"), "cpu_seconds"),
            ("/wall_seconds", json!(-1), "wall_seconds"),
            ("/oom_killed", json!("false"), "oom_killed"),
            ("/oom_killed", json!(0), "oom_killed"),
            ("/exit_code", json!(1_u64 << 40), "exit_code"),
            ("/exit_code", json!("0"), "exit_code"),
            ("/exit_code", json!(0.5), "exit_code"),
            ("/ref", json!(5), "ref"),
            ("/cgroup", json!("v3"), "cgroup"),
            ("/cgroup", json!(2), "cgroup"),
            ("/workload", json!(["py-torch"]), "workload"),
            ("/workload/version", json!(2.3), "workload.version"),
            ("/workload/package", Json::Null, "workload.package"),
        ];
        for (pointer, value, field) in cases {
            let body = replaced(REPORT, pointer, value.clone());
            assert_eq!(invalid_field(&body), *field, "{pointer} = {value}");
        }
        for required in ["/forge", "/instance", "/job_id", "/peak_memory_bytes"] {
            let body = removed(REPORT, required);
            assert_eq!(invalid_field(&body), &required[1..], "{required} removed");
        }
        // A hostile key is not echoed back.
        for key in ["coy\u{7f}bytes", "k".repeat(5000).as_str()] {
            let mut v: Json = serde_json::from_str(REPORT).expect("json");
            v["workload"][key] = json!(9123456789_u64);
            assert_eq!(
                invalid_field(&serde_json::to_vec(&v).expect("json")),
                "workload"
            );
        }
        let mut v: Json = serde_json::from_str(REPORT).expect("json");
        v["project"] = json!({"path": "x"});
        assert_eq!(
            invalid_field(&serde_json::to_vec(&v).expect("json")),
            "project"
        );
    }
}
