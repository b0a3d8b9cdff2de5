//! The console over HTTP: who gets in, what bad input gets, and what the
//! pages say of a projection whose every row is known.

use runyard_events::{Body, JobStatus};
use runyard_testkit::TestDb;
use runyard_testkit::synth::{
    base_time, job_event, lifecycle, runner_events, runner_name, usage_event,
};

use crate::{Console, TOKEN, client, config, projected, trace_of};

/// Every page; none may answer without credentials.
const PAGES: [&str; 9] = [
    "/",
    "/queue",
    "/pools",
    "/jobs/github/github.com/7",
    "/runners/ry-x",
    "/workloads?key=package%3Dx",
    "/savings",
    "/search?q=7",
    "/savings?since=1d",
];

async fn get(url: &str, auth: Option<(&str, &str)>) -> (u16, String, reqwest::header::HeaderMap) {
    let mut req = client().get(url);
    if let Some((k, v)) = auth {
        req = req.header(k, v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, r.text().await.unwrap(), headers)
}

#[tokio::test]
async fn no_page_answers_without_credentials() {
    let db = TestDb::new();
    projected(&db, &lifecycle(7, base_time())).await;
    let console = Console::start(config(&db).await).await;
    for page in PAGES {
        let (status, body, headers) = get(&format!("{}{page}", console.url), None).await;
        assert_eq!(status, 401, "{page}: {body}");
        assert!(body.contains("Sign in"), "{page}: {body}");
        assert!(
            !body.contains("acme/repo"),
            "{page} shows the projection: {body}"
        );
        assert!(headers.contains_key("www-authenticate"), "{page}");
        // A wrong token, a forged session: refused the same.
        let (status, _, _) = get(
            &format!("{}{page}", console.url),
            Some((
                "authorization",
                "Bearer 0000000000000000000000000000000000000000000000000000000000000000",
            )),
        )
        .await;
        assert_eq!(status, 401, "{page} with a wrong token");
        let (status, _, _) = get(
            &format!("{}{page}", console.url),
            Some(("cookie", "runyard_console=99999999999.00ff")),
        )
        .await;
        assert_eq!(status, 401, "{page} with a forged session");
    }
    let r = client()
        .post(format!("{}/logout", console.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // What operators and probes need stays open.
    for open in [
        "/healthz",
        "/readyz",
        "/metrics",
        "/static/console.css",
        "/login",
    ] {
        let (status, _, _) = get(&format!("{}{open}", console.url), None).await;
        assert_eq!(status, 200, "{open}");
    }
    db.drop_db().await;
}

#[tokio::test]
async fn a_token_signs_in_and_its_session_opens_the_pages() {
    let db = TestDb::new();
    projected(&db, &lifecycle(7, base_time())).await;
    let console = Console::start(config(&db).await).await;
    let login = |token: &str| {
        client()
            .post(format!("{}/login", console.url))
            .form(&[("token", token), ("next", "/jobs/github/github.com/7")])
            .send()
    };
    let wrong = login("not-the-token").await.unwrap();
    assert_eq!(wrong.status(), 401);
    assert!(wrong.headers().get("set-cookie").is_none());
    assert!(wrong.text().await.unwrap().contains("not accepted"));

    let ok = login(TOKEN).await.unwrap();
    assert_eq!(ok.status(), 303);
    assert_eq!(ok.headers()["location"], "/jobs/github/github.com/7");
    let set = ok.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains(TOKEN));
    let cookie = set.split(';').next().unwrap().to_owned();
    for page in PAGES {
        let (status, body, headers) =
            get(&format!("{}{page}", console.url), Some(("cookie", &cookie))).await;
        assert!(matches!(status, 200 | 303 | 404), "{page}: {status} {body}");
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'none'")
        );
    }
    let (status, body, _) = get(
        &format!("{}/jobs/github/github.com/7", console.url),
        Some(("authorization", &format!("Bearer {TOKEN}"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("acme/repo-7"), "{body}");
    // Signing in never sends anyone to another site.
    let away = client()
        .post(format!("{}/login", console.url))
        .form(&[("token", TOKEN), ("next", "//evil.example/")])
        .send()
        .await
        .unwrap();
    assert_eq!(away.headers()["location"], "/queue");

    let out = client()
        .post(format!("{}/logout", console.url))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    assert!(
        out.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    db.drop_db().await;
}

#[tokio::test]
async fn only_a_trusted_proxy_names_who_is_looking() {
    let db = TestDb::new();
    projected(&db, &lifecycle(7, base_time())).await;
    // Behind a proxy on this host: its header is believed.
    let mut behind = config(&db).await;
    behind.console_tokens = Default::default();
    behind.console_trusted_proxies = "127.0.0.1".into();
    let console = Console::start(behind).await;
    let (status, body, _) = get(
        &format!("{}/queue", console.url),
        Some(("x-forwarded-user", "ada@example.com")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("ada@example.com"), "{body}");
    let (status, body, _) = get(&format!("{}/queue", console.url), None).await;
    assert_eq!(status, 401, "the proxy named nobody: {body}");
    assert!(
        !body.contains("<form method=\"post\" action=\"/login\""),
        "no token login: {body}"
    );

    // The proxy is elsewhere: the same header from here is anyone's.
    let mut elsewhere = config(&db).await;
    elsewhere.console_trusted_proxies = "10.9.9.9".into();
    let console = Console::start(elsewhere).await;
    let (status, _, _) = get(
        &format!("{}/queue", console.url),
        Some(("x-forwarded-user", "ada@example.com")),
    )
    .await;
    assert_eq!(status, 401);
    db.drop_db().await;
}

#[tokio::test]
async fn a_database_role_that_could_write_is_refused() {
    let db = TestDb::new();
    projected(&db, &[]).await;
    let mut c = config(&db).await;
    // The server's own user: a superuser, the owner of every table.
    c.database.url = db.url.clone();
    let e = runyard_console::App::build(c)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("read-only role"), "{e}");
    assert!(!e.contains("password"), "{e}");

    // Neither tokens nor a proxy: nobody could sign in.
    let mut c = config(&db).await;
    c.console_tokens = Default::default();
    let e = runyard_console::App::build(c)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no way to sign in"), "{e}");
    db.drop_db().await;
}

#[tokio::test]
async fn bad_input_is_named_and_changes_nothing() {
    let db = TestDb::new();
    projected(&db, &lifecycle(7, base_time())).await;
    let console = Console::start(config(&db).await).await;
    let bearer = format!("Bearer {TOKEN}");
    for (page, status, names) in [
        ("/jobs/github/github.com/seven", 400, "not a job id"),
        ("/jobs/bitbucket/b.org/7", 400, "not a forge"),
        ("/jobs/github/github.com/8", 404, "no github job 8"),
        ("/workloads", 400, "which workload"),
        ("/workloads?key=package%3Dx&n=0", 400, "n: "),
        ("/workloads?key=package%3Dnever", 404, "no usage report"),
        ("/savings?since=30x", 400, "since: "),
        ("/savings?since=0d", 400, "since: "),
        ("/search?q=", 400, "q: "),
        ("/runners/ry-nobody", 404, "no runner"),
    ] {
        let (got, body, _) = get(
            &format!("{}{page}", console.url),
            Some(("authorization", &bearer)),
        )
        .await;
        assert_eq!(got, status, "{page}: {body}");
        assert!(body.contains(names), "{page}: {body}");
    }
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 1);
    pool.close().await;
    db.drop_db().await;
}

#[tokio::test]
async fn a_jobs_story_lists_its_events_in_order_with_their_traces() {
    let db = TestDb::new();
    let created = base_time();
    let mut events = vec![
        job_event(7, JobStatus::Queued, created),
        job_event(7, JobStatus::InProgress, created),
        job_event(7, JobStatus::Completed, created),
    ];
    events.extend(runner_events(7, "linux", created));
    let mut usage = usage_event(7, created);
    if let Some(Body::UsageReported(u)) = usage.body.as_mut() {
        u.oom_killed = true;
        u.exit_code = Some(137);
    }
    events.push(usage);
    // Another job's events stay out of its story.
    events.extend(lifecycle(8, created));
    events.extend(runner_events(8, "linux", created));
    // Applied in a shuffled order: the story is by the events' own times.
    let mut shuffled = events.clone();
    shuffled.reverse();
    projected(&db, &shuffled).await;
    let console = Console::start(config(&db).await).await;
    let (status, body, _) = get(
        &format!("{}/jobs/github/github.com/7", console.url),
        Some(("authorization", &format!("Bearer {TOKEN}"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let kinds: Vec<&str> = body
        .split("data-kind=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert_eq!(
        kinds,
        [
            "JobObserved",
            "RunnerRequested",
            "RunnerCreated",
            "RunnerOnline",
            "RunnerAssigned",
            "JobObserved",
            "JobObserved",
            "RunnerDeleted",
            "UsageReported"
        ],
        "{body}"
    );
    // Each with the trace it rode in.
    for (i, e) in shuffled.iter().enumerate() {
        let mine = match &e.body {
            Some(Body::JobObserved(j)) => j.job.as_ref().is_some_and(|k| k.job_id == 7),
            Some(Body::UsageReported(u)) => u.job.as_ref().is_some_and(|k| k.job_id == 7),
            Some(b) => {
                runyard_events::runner_ref(b).is_some_and(|r| r.name == runner_name("linux", 7))
            }
            None => false,
        };
        let trace = format!("{:032x}", trace_of(i));
        assert_eq!(
            body.contains(&trace),
            mine,
            "event {i} ({}) trace {trace}",
            e.id
        );
    }
    assert!(body.contains("OOM-killed"), "{body}");
    // Why its runner got its size: the allocator's answer it was made from.
    assert!(body.contains("Why its runner got"), "{body}");
    assert!(body.contains("lognormal-q0.970"), "{body}");
    assert!(body.contains("3.0 %"), "P(OOM) at the limit: {body}");
    db.drop_db().await;
}

#[tokio::test]
async fn pools_show_their_runners_errors_and_queue_waits() {
    let db = TestDb::new();
    // Four jobs queued half an hour ago, each waiting 20 + (id % 40) s for
    // its runner: 21, 22, 23 and 24 s.
    let created = time::OffsetDateTime::now_utc() - time::Duration::minutes(30);
    let mut events = Vec::new();
    for id in 1..=4 {
        events.extend(lifecycle(id, created));
        events.extend(runner_events(id, "linux", created));
    }
    // A fifth still queued; its runner's create fails.
    events.push(job_event(5, JobStatus::Queued, created));
    let name = runner_name("linux", 5);
    let mut requested = runner_events(5, "linux", created).remove(0);
    requested.occurred_at = Some(runyard_events::timestamp(
        created + time::Duration::seconds(1),
    ));
    let mut failed = requested.clone();
    failed.id = format!("runner:{name}:failed:1");
    failed.body = Some(Body::RunnerFailed(runyard_events::RunnerFailed {
        runner: runyard_events::runner_ref(requested.body.as_ref().unwrap()).cloned(),
        reason: "create_failed".into(),
        error: "quota exceeded for instances in zone b".into(),
        attempt: 1,
        given_up: false,
        job: None,
    }));
    events.extend([requested, failed]);
    projected(&db, &events).await;
    let console = Console::start(config(&db).await).await;
    let (status, body, _) = get(
        &format!("{}/pools", console.url),
        Some(("authorization", &format!("Bearer {TOKEN}"))),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The scaler is not there: its numbers are missing, and the page says so.
    assert!(body.contains("the scaler"), "{body}");
    assert!(body.contains("Pool linux"), "{body}");
    // Median 22.5 s, p95 23.85 s, of 4 jobs, over the hour and the day.
    assert_eq!(body.matches("23s / 24s").count(), 2, "{body}");
    assert!(body.contains("(4)"), "{body}");
    // The failing runner, alive, and its error.
    assert!(body.contains(&name), "{body}");
    assert!(
        body.contains("quota exceeded for instances in zone b"),
        "{body}"
    );
    db.drop_db().await;
}
