//! GitHub `workflow_job` deliveries → `JobObserved`.

use runyard_events::{Body, Conclusion, Forge, JobKey, JobObserved, JobStatus, ids};
use time::OffsetDateTime;

use crate::filter::KeySet;
use crate::json::Obj;
use crate::{
    Encoding, Envelope, GITHUB_DOT_COM, Members, Normalized, PayloadError, encoding, host_of,
    non_empty, parse_json, seconds_between, short,
};

/// Every object key [`workflow_job`] reads, at any depth: the only
/// members the body is parsed into (see [`crate::filter`]). Reading a key
/// that is not listed here reads it as absent; the `filter` tests catch it.
pub(crate) static KEYS: KeySet = KeySet::new(&[
    "action",
    "completed_at",
    "conclusion",
    "created_at",
    "enterprise",
    "full_name",
    "head_branch",
    "head_sha",
    "html_url",
    "id",
    "labels",
    "login",
    "name",
    "organization",
    "repository",
    "run_attempt",
    "run_id",
    "runner_group_id",
    "runner_group_name",
    "runner_id",
    "runner_name",
    "slug",
    "started_at",
    "workflow_job",
    "workflow_name",
]);

/// One GitHub webhook delivery as ingest received it: the headers that matter
/// and the raw body. The signature is checked before this is built
/// ([`crate::github_signature`]).
#[derive(Debug, Clone, Copy)]
pub struct GithubDelivery<'a> {
    /// `X-GitHub-Event`: `workflow_job`, `ping`, ...
    pub event: Option<&'a str>,
    /// `X-GitHub-Delivery`: the delivery GUID, kept on redelivery, hence the
    /// event id. Required for `workflow_job`.
    pub delivery_id: Option<&'a str>,
    /// `X-GitHub-Hook-ID`, recorded as `Source.hook_id`.
    pub hook_id: Option<&'a str>,
    /// `X-GitHub-Enterprise-Host`, sent by GitHub Enterprise Server; the
    /// instance when present.
    pub enterprise_host: Option<&'a str>,
    /// `Content-Type`: `application/json` or
    /// `application/x-www-form-urlencoded` (JSON in the `payload` field).
    pub content_type: Option<&'a str>,
    /// The raw body, exactly as signed.
    pub body: &'a [u8],
    /// When ingest accepted the delivery.
    pub received_at: OffsetDateTime,
}

/// Normalizes one GitHub delivery.
///
/// `workflow_job` becomes one `JobObserved` with id `github:<delivery>`;
/// `ping` and every other event type are [`Normalized::Ignored`] (without
/// looking at the body, since there is nothing in it runyard records).
pub fn normalize_github(d: &GithubDelivery<'_>) -> Result<Normalized, PayloadError> {
    normalize(d, Members::Only(&KEYS))
}

/// [`normalize_github`], building `members` of the body (the tests compare
/// [`Members::All`] with the allowlist).
pub(crate) fn normalize(
    d: &GithubDelivery<'_>,
    members: Members,
) -> Result<Normalized, PayloadError> {
    match d.event {
        Some("workflow_job") => {}
        Some("ping") => return Ok(Normalized::Ignored("ping".into())),
        Some(other) => return Ok(Normalized::Ignored(format!("event {}", short(other)))),
        None => return Ok(Normalized::Ignored("event (none)".into())),
    }
    let enc = encoding(d.content_type, true)?;
    let delivery_id = non_empty(d.delivery_id)
        .ok_or_else(|| PayloadError::invalid("X-GitHub-Delivery", "missing"))?;
    let value = match enc {
        Encoding::Json => parse_json(d.body, "body", members)?,
        Encoding::Form => parse_json(form_payload(d.body)?.as_bytes(), "payload", members)?,
    };
    let root = Obj::root_named(
        &value,
        if enc == Encoding::Form {
            "payload"
        } else {
            "body"
        },
    )?;
    let event = workflow_job(d, delivery_id, &root)?;
    Ok(Normalized::Events(vec![event]))
}

/// The JSON held in the `payload` field of a form-encoded delivery.
fn form_payload(body: &[u8]) -> Result<String, PayloadError> {
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(body)
        .map_err(|e| PayloadError::invalid("body", format!("not form-encoded: {e}")))?;
    fields
        .into_iter()
        .find_map(|(k, v)| (k == "payload").then_some(v))
        .ok_or_else(|| PayloadError::invalid("payload", "missing"))
}

fn workflow_job(
    d: &GithubDelivery<'_>,
    delivery_id: &str,
    root: &Obj<'_>,
) -> Result<runyard_events::Event, PayloadError> {
    let rx = d.received_at;
    let action = root.req_str("action")?;
    let status = match action {
        "queued" => JobStatus::Queued,
        "waiting" => JobStatus::Waiting,
        "in_progress" => JobStatus::InProgress,
        "completed" => JobStatus::Completed,
        _ => {
            return Err(PayloadError::invalid(
                "action",
                "expected queued, waiting, in_progress or completed",
            ));
        }
    };
    let job = root.req_obj("workflow_job")?;
    let repository = root.opt_obj("repository")?;
    let instance = instance(d.enterprise_host, repository.as_ref())?;

    let job_id = job.req_id("id")?;
    let run_attempt = match job.opt_id("run_attempt")? {
        None => 0,
        Some(n) => u32::try_from(n)
            .map_err(|_| PayloadError::invalid(job.path("run_attempt"), "too large"))?,
    };
    let created_at = job.opt_time("created_at", rx)?;
    let started_at = job.opt_time("started_at", rx)?;
    let completed_at = job.opt_time("completed_at", rx)?;
    // GitHub already fills `started_at` on `queued` (with the creation time),
    // so durations are only meaningful once the job really started.
    let queued_duration = match status {
        JobStatus::InProgress | JobStatus::Completed => seconds_between(created_at, started_at),
        _ => None,
    };
    let duration = match status {
        JobStatus::Completed => seconds_between(started_at, completed_at),
        _ => None,
    };
    let occurred_at = match status {
        JobStatus::Queued => created_at,
        JobStatus::InProgress => started_at,
        JobStatus::Completed => completed_at,
        // `waiting` (for an environment's approval) has no time of its own.
        JobStatus::Waiting | JobStatus::Unspecified => None,
    }
    .unwrap_or(rx);

    let mut observed = JobObserved {
        job: Some(JobKey {
            forge: Forge::Github as i32,
            instance: instance.clone(),
            job_id,
        }),
        project: match &repository {
            Some(r) => r.str_or_empty("full_name")?,
            None => String::new(),
        },
        project_id: match &repository {
            Some(r) => r.opt_id("id")?.unwrap_or_default(),
            None => 0,
        },
        pipeline_id: job.opt_id("run_id")?.unwrap_or_default(),
        run_attempt,
        name: job.str_or_empty("name")?,
        workflow_name: job.str_or_empty("workflow_name")?,
        labels: job.opt_str_array("labels")?,
        forge_status: action.to_owned(),
        conclusion: conclusion(&job)? as i32,
        // Runner fields stay `None` only when GitHub sends null (not yet
        // assigned); any integer, 0 included, is kept as given.
        runner_id: job.opt_u64("runner_id")?,
        runner_name: job.str_or_empty("runner_name")?,
        runner_group_id: job.opt_u64("runner_group_id")?,
        runner_group_name: job.str_or_empty("runner_group_name")?,
        r#ref: job.str_or_empty("head_branch")?,
        sha: job.str_or_empty("head_sha")?,
        created_at: created_at.map(runyard_events::timestamp),
        started_at: started_at.map(runyard_events::timestamp),
        completed_at: completed_at.map(runyard_events::timestamp),
        duration_seconds: duration,
        queued_duration_seconds: queued_duration,
        html_url: job.str_or_empty("html_url")?,
        organization: match root.opt_obj("organization")? {
            Some(o) => o.str_or_empty("login")?,
            None => String::new(),
        },
        enterprise: match root.opt_obj("enterprise")? {
            Some(e) => e.str_or_empty("slug")?,
            None => String::new(),
        },
        ..Default::default()
    };
    observed.set_status(status);

    let envelope = Envelope {
        forge: Forge::Github,
        instance: &instance,
        delivery_id,
        hook_id: non_empty(d.hook_id).unwrap_or_default(),
        received_at: rx,
    };
    Ok(envelope.event(
        ids::github(delivery_id),
        occurred_at,
        Body::JobObserved(observed),
    ))
}

/// The GitHub host: GHES names itself in a header; otherwise the repository
/// URL's host (which is `github.com` for github.com, but also covers GHES
/// behind a proxy that drops the header).
fn instance(
    enterprise_host: Option<&str>,
    repository: Option<&Obj<'_>>,
) -> Result<String, PayloadError> {
    if let Some(h) = non_empty(enterprise_host) {
        return host_of(h)
            .ok_or_else(|| PayloadError::invalid("X-GitHub-Enterprise-Host", "not a host name"));
    }
    if let Some(repo) = repository
        && let Some(url) = repo.opt_str("html_url")?
    {
        return host_of(url)
            .ok_or_else(|| PayloadError::invalid(repo.path("html_url"), "not a URL with a host"));
    }
    Ok(GITHUB_DOT_COM.to_owned())
}

/// `workflow_job.conclusion`. A word GitHub adds later maps to `Unspecified`
/// instead of failing the delivery: GitHub does not redeliver on its own, so
/// rejecting would lose the job's completion for good.
fn conclusion(job: &Obj<'_>) -> Result<Conclusion, PayloadError> {
    Ok(match job.opt_str("conclusion")? {
        Some("success") => Conclusion::Success,
        Some("failure") => Conclusion::Failure,
        Some("cancelled") => Conclusion::Cancelled,
        Some("skipped") => Conclusion::Skipped,
        Some("timed_out") => Conclusion::TimedOut,
        Some("action_required") => Conclusion::ActionRequired,
        Some("neutral") => Conclusion::Neutral,
        Some(_) | None => Conclusion::Unspecified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, replaced};
    use runyard_events::Event;
    use serde_json::{Value as Json, json};
    use time::macros::datetime;

    const RX: OffsetDateTime = datetime!(2024-06-01 12:10:00 UTC);
    const QUEUED: &str = include_str!("../tests/fixtures/github_workflow_job_queued.json");
    const WAITING: &str = include_str!("../tests/fixtures/github_workflow_job_waiting.json");
    const IN_PROGRESS: &str =
        include_str!("../tests/fixtures/github_workflow_job_in_progress.json");
    const COMPLETED: &str = include_str!("../tests/fixtures/github_workflow_job_completed.json");

    fn delivery(body: &[u8]) -> GithubDelivery<'_> {
        GithubDelivery {
            event: Some("workflow_job"),
            delivery_id: Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            hook_id: Some("292430182"),
            enterprise_host: None,
            content_type: Some("application/json"),
            body,
            received_at: RX,
        }
    }

    fn one_event(d: &GithubDelivery<'_>) -> Event {
        match normalize_github(d).expect("normalizes") {
            Normalized::Events(mut events) => {
                assert_eq!(events.len(), 1);
                events.pop().expect("one event")
            }
            Normalized::Ignored(why) => panic!("ignored: {why}"),
        }
    }

    fn job(e: &Event) -> &JobObserved {
        match &e.body {
            Some(Body::JobObserved(j)) => j,
            other => panic!("not a JobObserved: {other:?}"),
        }
    }

    fn invalid_field(body: &[u8]) -> String {
        match normalize_github(&delivery(body)) {
            Err(e) => e.field().unwrap_or_default().to_owned(),
            Ok(n) => panic!("accepted: {n:?}"),
        }
    }

    #[test]
    fn queued_job_is_observed_with_envelope() {
        let e = one_event(&delivery(QUEUED.as_bytes()));
        assert_eq!(e.id, "github:72d3162e-cc78-11e3-81ab-4c9367dc0958");
        let src = e.source.as_ref().expect("source");
        assert_eq!(src.forge(), Forge::Github);
        assert_eq!(src.instance, "github.com");
        assert_eq!(src.delivery_id, "72d3162e-cc78-11e3-81ab-4c9367dc0958");
        assert_eq!(src.hook_id, "292430182");
        assert_eq!(src.producer, "ingest");
        assert_eq!(at(&e.received_at), Some(RX));
        // Queued: the fact happened when the job was created.
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:00:00 UTC)));

        let j = job(&e);
        let key = j.job.as_ref().expect("key");
        assert_eq!(
            (key.forge(), key.instance.as_str(), key.job_id),
            (Forge::Github, "github.com", 21870573124)
        );
        assert_eq!(j.status(), JobStatus::Queued);
        assert_eq!(j.forge_status, "queued");
        assert_eq!(j.conclusion(), Conclusion::Unspecified);
        assert_eq!(j.project, "octo-org/example-workflow");
        assert_eq!(j.project_id, 376034443);
        assert_eq!(j.pipeline_id, 9475318452);
        assert_eq!(j.run_attempt, 1);
        assert_eq!(j.name, "build (gpu)");
        assert_eq!(j.workflow_name, "CI");
        assert_eq!(j.labels, ["self-hosted", "linux", "x64", "gpu"]);
        assert_eq!(j.r#ref, "main");
        assert_eq!(j.sha, "e3103f8eb03e1ad7f2331c5446b23c070fc54055");
        assert_eq!(
            j.html_url,
            "https://github.com/octo-org/example-workflow/actions/runs/9475318452/job/21870573124"
        );
        assert_eq!(j.organization, "octo-org");
        assert_eq!(j.enterprise, "octo-enterprise");
        assert_eq!((j.runner_id, j.runner_group_id), (None, None));
        assert_eq!(j.runner_name, "");
        // GitHub fills started_at while queued; no durations from it yet.
        assert_eq!(j.queued_duration_seconds, None);
        assert_eq!(j.duration_seconds, None);
        assert_eq!(at(&j.completed_at), None);
    }

    #[test]
    fn waiting_job_occurs_when_received() {
        let e = one_event(&delivery(WAITING.as_bytes()));
        assert_eq!(job(&e).status(), JobStatus::Waiting);
        assert_eq!(job(&e).forge_status, "waiting");
        assert_eq!(job(&e).job.as_ref().map(|k| k.job_id), Some(21870573124));
        assert_eq!(at(&e.occurred_at), Some(RX));
    }

    #[test]
    fn in_progress_job_has_runner_and_queue_time() {
        let e = one_event(&delivery(IN_PROGRESS.as_bytes()));
        let j = job(&e);
        assert_eq!(j.status(), JobStatus::InProgress);
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:00:42 UTC)));
        assert_eq!(j.runner_id, Some(184));
        assert_eq!(j.runner_name, "runyard-gpu-7f3k2");
        assert_eq!(j.runner_group_id, Some(3));
        assert_eq!(j.runner_group_name, "runyard");
        assert_eq!(j.queued_duration_seconds, Some(42.0));
        assert_eq!(j.duration_seconds, None);
    }

    #[test]
    fn completed_job_has_conclusion_and_durations() {
        let e = one_event(&delivery(COMPLETED.as_bytes()));
        let j = job(&e);
        assert_eq!(j.status(), JobStatus::Completed);
        assert_eq!(j.conclusion(), Conclusion::Failure);
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:07:12 UTC)));
        assert_eq!(at(&j.created_at), Some(datetime!(2024-06-01 12:00:00 UTC)));
        assert_eq!(at(&j.started_at), Some(datetime!(2024-06-01 12:00:42 UTC)));
        assert_eq!(j.duration_seconds, Some(390.0));
        assert_eq!(j.queued_duration_seconds, Some(42.0));
        assert_eq!(j.enterprise, "octo-enterprise");
    }

    #[test]
    fn every_conclusion_maps() {
        for (word, want) in [
            (json!("success"), Conclusion::Success),
            (json!("failure"), Conclusion::Failure),
            (json!("cancelled"), Conclusion::Cancelled),
            (json!("skipped"), Conclusion::Skipped),
            (json!("timed_out"), Conclusion::TimedOut),
            (json!("action_required"), Conclusion::ActionRequired),
            (json!("neutral"), Conclusion::Neutral),
            (json!("startup_failure"), Conclusion::Unspecified),
            (Json::Null, Conclusion::Unspecified),
        ] {
            let body = replaced(COMPLETED, "/workflow_job/conclusion", word.clone());
            assert_eq!(
                job(&one_event(&delivery(&body))).conclusion(),
                want,
                "{word}"
            );
        }
    }

    #[test]
    fn every_action_maps() {
        for (action, want) in [
            ("queued", JobStatus::Queued),
            ("waiting", JobStatus::Waiting),
            ("in_progress", JobStatus::InProgress),
            ("completed", JobStatus::Completed),
        ] {
            let body = replaced(COMPLETED, "/action", json!(action));
            let e = one_event(&delivery(&body));
            assert_eq!(job(&e).status(), want, "{action}");
            assert_eq!(job(&e).forge_status, action);
        }
    }

    #[test]
    fn ping_and_other_events_are_ignored() {
        let d = |event| GithubDelivery {
            event,
            body: b"not even json",
            ..delivery(b"")
        };
        assert_eq!(
            normalize_github(&d(Some("ping"))),
            Ok(Normalized::Ignored("ping".into()))
        );
        assert_eq!(
            normalize_github(&d(Some("issues"))),
            Ok(Normalized::Ignored("event issues".into()))
        );
        assert!(matches!(
            normalize_github(&d(None)),
            Ok(Normalized::Ignored(_))
        ));
    }

    #[test]
    fn form_encoded_delivery_is_accepted() {
        let body = serde_urlencoded::to_string([("payload", COMPLETED)]).expect("encodes");
        let d = GithubDelivery {
            content_type: Some("application/x-www-form-urlencoded"),
            ..delivery(body.as_bytes())
        };
        assert_eq!(one_event(&d), one_event(&delivery(COMPLETED.as_bytes())));

        let no_payload = GithubDelivery {
            content_type: Some("application/x-www-form-urlencoded"),
            ..delivery(b"other=1")
        };
        let err = normalize_github(&no_payload).expect_err("no payload field");
        assert_eq!(err.field(), Some("payload"));

        let bad_json = GithubDelivery {
            content_type: Some("application/x-www-form-urlencoded"),
            ..delivery(b"payload=%7Bnope")
        };
        let err = normalize_github(&bad_json).expect_err("payload not JSON");
        assert_eq!(err.field(), Some("payload"));
    }

    #[test]
    fn charset_is_allowed_and_other_media_types_are_not() {
        let d = GithubDelivery {
            content_type: Some("application/json; charset=utf-8"),
            ..delivery(COMPLETED.as_bytes())
        };
        assert!(normalize_github(&d).is_ok());
        let d = GithubDelivery {
            content_type: None,
            ..delivery(COMPLETED.as_bytes())
        };
        assert!(normalize_github(&d).is_ok());
        let d = GithubDelivery {
            content_type: Some("text/xml"),
            ..delivery(COMPLETED.as_bytes())
        };
        assert_eq!(
            normalize_github(&d),
            Err(PayloadError::UnsupportedMediaType("text/xml".into()))
        );
    }

    #[test]
    fn enterprise_instances() {
        let d = GithubDelivery {
            enterprise_host: Some("GHES.corp.example"),
            ..delivery(COMPLETED.as_bytes())
        };
        let e = one_event(&d);
        assert_eq!(
            e.source.as_ref().map(|s| s.instance.as_str()),
            Some("ghes.corp.example")
        );
        assert_eq!(
            job(&e).job.as_ref().map(|k| k.instance.as_str()),
            Some("ghes.corp.example")
        );

        // Without the header, the repository URL's host.
        let body = replaced(
            COMPLETED,
            "/repository/html_url",
            json!("https://git.corp.example/octo-org/example-workflow"),
        );
        let e = one_event(&delivery(&body));
        assert_eq!(
            e.source.as_ref().map(|s| s.instance.as_str()),
            Some("git.corp.example")
        );

        let d = GithubDelivery {
            enterprise_host: Some("bad host"),
            ..delivery(COMPLETED.as_bytes())
        };
        let err = normalize_github(&d).expect_err("junk host");
        assert_eq!(err.field(), Some("X-GitHub-Enterprise-Host"));
    }

    #[test]
    fn missing_delivery_id_is_invalid() {
        for id in [None, Some(""), Some("  ")] {
            let d = GithubDelivery {
                delivery_id: id,
                ..delivery(COMPLETED.as_bytes())
            };
            let err = normalize_github(&d).expect_err("no delivery id");
            assert_eq!(err.field(), Some("X-GitHub-Delivery"));
        }
    }

    #[test]
    fn invalid_payloads_name_their_field() {
        assert_eq!(invalid_field(b"{not json"), "body");
        assert_eq!(invalid_field(b"[1, 2]"), "body");
        assert_eq!(invalid_field(b""), "body");
        let cases: &[(&str, Json, &str)] = &[
            ("/action", json!("started"), "action"),
            ("/action", json!(7), "action"),
            ("/action", Json::Null, "action"),
            ("/workflow_job", json!("job"), "workflow_job"),
            ("/workflow_job", Json::Null, "workflow_job"),
            ("/workflow_job/id", json!("21870573124"), "workflow_job.id"),
            ("/workflow_job/id", json!(-1), "workflow_job.id"),
            ("/workflow_job/id", json!(1.5), "workflow_job.id"),
            ("/workflow_job/id", json!(0), "workflow_job.id"),
            ("/workflow_job/id", Json::Null, "workflow_job.id"),
            ("/workflow_job/run_id", json!(-3), "workflow_job.run_id"),
            (
                "/workflow_job/run_attempt",
                json!(4294967296_u64),
                "workflow_job.run_attempt",
            ),
            ("/workflow_job/labels", json!("gpu"), "workflow_job.labels"),
            (
                "/workflow_job/labels",
                json!(["gpu", 1]),
                "workflow_job.labels[1]",
            ),
            (
                "/workflow_job/runner_id",
                json!("184"),
                "workflow_job.runner_id",
            ),
            ("/workflow_job/name", json!({}), "workflow_job.name"),
            (
                "/workflow_job/started_at",
                json!("noon"),
                "workflow_job.started_at",
            ),
            (
                "/workflow_job/started_at",
                json!("1999-12-31T23:59:59Z"),
                "workflow_job.started_at",
            ),
            (
                "/workflow_job/completed_at",
                json!("2024-06-03T00:00:00Z"),
                "workflow_job.completed_at",
            ),
            (
                "/workflow_job/created_at",
                json!(1717243200),
                "workflow_job.created_at",
            ),
            (
                "/workflow_job/conclusion",
                json!(false),
                "workflow_job.conclusion",
            ),
            ("/repository", json!([]), "repository"),
            ("/repository/id", json!("x"), "repository.id"),
            (
                "/repository/html_url",
                json!("not a url"),
                "repository.html_url",
            ),
            ("/organization/login", json!(1), "organization.login"),
            ("/enterprise", json!("octo"), "enterprise"),
        ];
        for (path, value, field) in cases {
            let body = replaced(COMPLETED, path, value.clone());
            assert_eq!(invalid_field(&body), *field, "{path} = {value}");
        }
    }
}
