//! Property tests: no input makes a normalizer panic, and whatever a
//! normalizer accepts is a well-formed event. The inputs come from
//! `runyard_forge::testing::generators` (shared with the crate's
//! filtered-parse equivalence tests).

use proptest::prelude::*;
use proptest::sample::Index;
use runyard_events::{Body, Event};
use runyard_forge::testing::generators::{
    FIXTURE_RX, GITHUB_FIXTURES, GITLAB_JOB_FIXTURES, GITLAB_PIPELINE, USAGE, content_type, json,
    mutate, mutations, received_at,
};
use runyard_forge::{
    GithubDelivery, GitlabDelivery, Normalized, PayloadError, normalize_github, normalize_gitlab,
    normalize_usage,
};
use time::OffsetDateTime;

fn check_event(e: &Event, rx: OffsetDateTime) -> Result<(), TestCaseError> {
    // Ids travel as the `Nats-Msg-Id` header: visible ASCII only.
    prop_assert!(!e.id.is_empty());
    prop_assert!(e.id.bytes().all(|b| b.is_ascii_graphic()), "id {:?}", e.id);
    prop_assert!(e.occurred_at.is_some());
    prop_assert_eq!(e.received_at, Some(runyard_events::timestamp(rx)));
    let source = e.source.as_ref().expect("source");
    prop_assert_eq!(source.producer.as_str(), "ingest");
    prop_assert!(!source.instance.is_empty());
    prop_assert!(!source.delivery_id.is_empty());
    prop_assert!(e.body.is_some());
    if let Some(Body::JobObserved(j)) = &e.body {
        let key = j.job.as_ref().expect("job key");
        prop_assert!(key.job_id > 0);
        prop_assert_eq!(&key.instance, &source.instance);
    }
    Ok(())
}

fn check(
    result: Result<Normalized, PayloadError>,
    rx: OffsetDateTime,
) -> Result<(), TestCaseError> {
    match result {
        Ok(Normalized::Events(events)) => {
            prop_assert!(!events.is_empty());
            for e in &events {
                check_event(e, rx)?;
            }
        }
        Ok(Normalized::Ignored(reason)) => prop_assert!(!reason.is_empty()),
        Err(PayloadError::Invalid { field, reason }) => {
            prop_assert!(!field.is_empty());
            prop_assert!(!reason.is_empty());
        }
        Err(PayloadError::UnsupportedMediaType(_)) => {}
    }
    Ok(())
}

fn github<'a>(
    event: Option<&'a str>,
    ct: Option<&'a str>,
    body: &'a [u8],
    rx: OffsetDateTime,
) -> GithubDelivery<'a> {
    GithubDelivery {
        event,
        delivery_id: Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        hook_id: Some("292430182"),
        enterprise_host: None,
        content_type: ct,
        body,
        received_at: rx,
    }
}

fn gitlab<'a>(
    event: Option<&'a str>,
    ct: Option<&'a str>,
    body: &'a [u8],
    rx: OffsetDateTime,
) -> GitlabDelivery<'a> {
    GitlabDelivery {
        event,
        idempotency_key: Some("6c5f8a1e-1b0e-4f5e-9c55-2f1a7c7b9e10"),
        event_uuid: None,
        webhook_uuid: Some("a3f1c2d4"),
        instance: Some("https://gitlab.example.com"),
        content_type: ct,
        body,
        received_at: rx,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..512),
        ct in content_type(),
        rx in received_at(),
    ) {
        let ct = ct.as_deref();
        for event in ["workflow_job", "ping"] {
            check(normalize_github(&github(Some(event), ct, &body, rx)), rx)?;
        }
        for event in ["Job Hook", "Pipeline Hook"] {
            check(normalize_gitlab(&gitlab(Some(event), ct, &body, rx)), rx)?;
        }
        if let Ok(e) = normalize_usage(ct, &body, rx) {
            check_event(&e, rx)?;
        }
    }

    #[test]
    fn arbitrary_json_never_panics(value in json(), rx in received_at(), form in any::<bool>()) {
        let body = serde_json::to_vec(&value).expect("serializes");
        let encoded = serde_urlencoded::to_string([("payload", String::from_utf8_lossy(&body))])
            .expect("encodes");
        let gh = if form {
            github(Some("workflow_job"), Some("application/x-www-form-urlencoded"), encoded.as_bytes(), rx)
        } else {
            github(Some("workflow_job"), None, &body, rx)
        };
        check(normalize_github(&gh), rx)?;
        for event in ["Job Hook", "Pipeline Hook"] {
            check(normalize_gitlab(&gitlab(Some(event), None, &body, rx)), rx)?;
        }
        if let Ok(e) = normalize_usage(None, &body, rx) {
            check_event(&e, rx)?;
        }
    }

    #[test]
    fn mutated_github_fixtures_never_panic(
        which in any::<Index>(),
        muts in mutations(),
        rx in received_at(),
    ) {
        let body = mutate(GITHUB_FIXTURES[which.index(GITHUB_FIXTURES.len())], &muts);
        check(normalize_github(&github(Some("workflow_job"), None, &body, rx)), rx)?;
    }

    #[test]
    fn mutated_gitlab_fixtures_never_panic(
        which in any::<Index>(),
        muts in mutations(),
        rx in received_at(),
    ) {
        let body = mutate(GITLAB_JOB_FIXTURES[which.index(GITLAB_JOB_FIXTURES.len())], &muts);
        check(normalize_gitlab(&gitlab(Some("Job Hook"), None, &body, rx)), rx)?;
        let body = mutate(GITLAB_PIPELINE, &muts);
        let result = normalize_gitlab(&gitlab(Some("Pipeline Hook"), None, &body, rx));
        if let Ok(Normalized::Events(events)) = &result {
            let first_is_pipeline = matches!(events.first().and_then(|e| e.body.as_ref()), Some(Body::PipelineObserved(_)));
            prop_assert!(first_is_pipeline);
        }
        check(result, rx)?;
    }

    #[test]
    fn mutated_usage_reports_never_panic(muts in mutations(), rx in received_at()) {
        let body = mutate(USAGE, &muts);
        if let Ok(e) = normalize_usage(None, &body, rx) {
            check_event(&e, rx)?;
        }
    }
}

#[test]
fn unmutated_fixtures_are_accepted() {
    for fixture in GITHUB_FIXTURES {
        let d = github(Some("workflow_job"), None, fixture.as_bytes(), FIXTURE_RX);
        assert!(matches!(normalize_github(&d), Ok(Normalized::Events(_))));
    }
    for fixture in GITLAB_JOB_FIXTURES {
        let d = gitlab(Some("Job Hook"), None, fixture.as_bytes(), FIXTURE_RX);
        assert!(normalize_gitlab(&d).is_ok());
    }
    let d = gitlab(
        Some("Pipeline Hook"),
        None,
        GITLAB_PIPELINE.as_bytes(),
        FIXTURE_RX,
    );
    assert!(matches!(normalize_gitlab(&d), Ok(Normalized::Events(e)) if e.len() == 3));
    assert!(normalize_usage(None, USAGE.as_bytes(), FIXTURE_RX).is_ok());
}
