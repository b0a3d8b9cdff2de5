//! The fake Actions service checked against the protocol it stands for
//! (SCALESET.md §1–§5; each item of §7's checklist has a test here),
//! driven with plain HTTP as a scale-set listener would.

use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::{Client, Method, Response};
use runyard_testkit::fake_actions::{FakeActions, FakeScaleSetJob, decode_scale_set_jit};
use runyard_testkit::fake_github::FakeGitHub;
use serde_json::{Value, json};

/// Short poll holds keep the suite fast.
const HOLD: Duration = Duration::from_millis(200);
const API: &str = "api-version=6.0-preview";
const RSS: &str = "_apis/runtime/runnerscalesets";
const AGENTS: &str = "_apis/distributedtask/pools/0/agents";

fn http() -> Client {
    runyard_telemetry::install_crypto_provider();
    Client::new()
}

/// A fake with short poll holds.
async fn fake() -> FakeActions {
    let f = FakeActions::start().await;
    f.set_poll_hold(HOLD);
    f
}

/// The body as JSON, a leading byte-order mark stripped.
async fn body(r: Response) -> Value {
    let bytes = r.bytes().await.expect("a body");
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes[..]);
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

/// The claims of a JWT (unverified).
fn claims(jwt: &str) -> Value {
    let payload = jwt.split('.').nth(1).expect("a JWT");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("base64url");
    serde_json::from_slice(&raw).expect("JSON claims")
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A client connected to the service (steps B and C done).
struct Conn {
    http: Client,
    service: String,
    admin: String,
}

impl Conn {
    async fn new(f: &FakeActions) -> Self {
        let http = http();
        let (service, admin) = register(&http, &f.github_url(), "ghp_any").await;
        Self {
            http,
            service,
            admin,
        }
    }

    /// An admin request (`api-version` added as clients do).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut req = self
            .http
            .request(method, format!("{}{path}{sep}{API}", self.service))
            .bearer_auth(&self.admin);
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.expect("the fake answers")
    }

    async fn scale_set(&self, name: &str) -> Value {
        let r = self
            .call(
                Method::POST,
                RSS,
                Some(json!({
                    "name": name,
                    "runnerGroupId": 1,
                    "labels": [{"name": name, "type": "System"}],
                    "RunnerSetting": {"ephemeral": true, "disableUpdate": true},
                    "createdOn": "0001-01-01T00:00:00Z",
                })),
            )
            .await;
        assert_eq!(r.status(), 200, "create answers 200");
        body(r).await
    }

    async fn session(&self, id: i64) -> Session {
        let r = self
            .call(
                Method::POST,
                &format!("{RSS}/{id}/sessions"),
                Some(json!({"ownerName": "listener-1", "sessionId": "00000000-0000-0000-0000-000000000000"})),
            )
            .await;
        assert_eq!(r.status(), 200, "session create answers 200");
        Session::from(&body(r).await)
    }

    async fn jit(&self, id: i64, name: &str) -> Response {
        self.call(
            Method::POST,
            &format!("{RSS}/{id}/generatejitconfig"),
            Some(json!({"name": name, "workFolder": ""})),
        )
        .await
    }

    async fn message(&self, s: &Session, last: i64) -> Response {
        let url = if last > 0 {
            format!("{}&lastMessageId={last}", s.queue_url)
        } else {
            s.queue_url.clone()
        };
        self.http
            .get(url)
            .header("accept", "application/json; api-version=6.0-preview")
            .header("x-scalesetmaxcapacity", "7")
            .bearer_auth(&s.token)
            .send()
            .await
            .expect("the fake answers")
    }

    /// The next message (200) within a few polls.
    async fn next(&self, s: &Session, last: i64) -> Value {
        for _ in 0..5 {
            let r = self.message(s, last).await;
            if r.status() == 200 {
                return body(r).await;
            }
            assert_eq!(r.status(), 202);
        }
        panic!("no message came");
    }

    async fn ack(&self, s: &Session, message_id: i64) -> Response {
        let (path, query) = s
            .queue_url
            .split_once('?')
            .expect("the queue URL has a query");
        self.http
            .delete(format!("{path}/{message_id}?{query}"))
            .bearer_auth(&s.token)
            .send()
            .await
            .expect("the fake answers")
    }

    async fn acquire(&self, id: i64, token: &str, ids: &[i64]) -> Response {
        self.http
            .post(format!("{}{RSS}/{id}/acquirejobs?{API}", self.service))
            .bearer_auth(token)
            .json(&ids)
            .send()
            .await
            .expect("the fake answers")
    }
}

/// Steps B and C against `root`: the service URL and the admin token.
async fn register(http: &Client, root: &str, token: &str) -> (String, String) {
    let r = http
        .post(format!(
            "{root}/orgs/acme/actions/runners/registration-token"
        ))
        .bearer_auth(token)
        .header("content-type", "application/vnd.github.v3+json")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 201);
    let reg = body(r).await;
    let r = http
        .post(format!("{root}/actions/runner-registration"))
        .header(
            "authorization",
            format!("RemoteAuth {}", reg["token"].as_str().expect("token")),
        )
        .json(&json!({"url": "https://github.com/acme", "runner_event": "register"}))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 201);
    let c = body(r).await;
    (
        c["url"].as_str().expect("url").to_owned(),
        c["token"].as_str().expect("token").to_owned(),
    )
}

#[derive(Debug, Clone)]
struct Session {
    id: String,
    queue_url: String,
    token: String,
}

impl From<&Value> for Session {
    fn from(v: &Value) -> Self {
        Self {
            id: v["sessionId"].as_str().expect("sessionId").to_owned(),
            queue_url: v["messageQueueUrl"].as_str().expect("url").to_owned(),
            token: v["messageQueueAccessToken"]
                .as_str()
                .expect("token")
                .to_owned(),
        }
    }
}

/// The job messages of a queue message (`body` is a JSON string).
fn jobs_of(message: &Value) -> Vec<Value> {
    let text = message["body"].as_str().expect("body is a string");
    serde_json::from_str(text).expect("body holds a JSON array")
}

fn type_name(v: &Value) -> String {
    v["typeName"].as_str().unwrap_or_default().to_owned()
}

fn id_of(v: &Value) -> i64 {
    v["id"].as_i64().expect("id")
}

fn job(n: i64) -> FakeScaleSetJob {
    FakeScaleSetJob::new("acme/app", &format!("build {n}"), n, &["ry-linux"])
}

// ---------------------------------------------------------------------------

#[tokio::test]
async fn registration_hands_out_the_service_url_and_an_admin_jwt() {
    let f = fake().await;
    let http = http();
    let root = f.github_url();
    let reg_path = |scope: &str| format!("{root}/{scope}/actions/runners/registration-token");

    // Step B at every scope; any bearer until require_token.
    for scope in ["orgs/acme", "repos/acme/app", "enterprises/big"] {
        let r = http
            .post(reg_path(scope))
            .bearer_auth("t")
            .send()
            .await
            .expect("answers");
        assert_eq!(r.status(), 201, "{scope}");
        let v = body(r).await;
        assert!(!v["token"].as_str().unwrap_or_default().is_empty());
        assert!(v["expires_at"].as_str().unwrap_or_default().ends_with('Z'));
    }
    let r = http
        .post(reg_path("orgs/acme"))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 401, "no credential");
    f.require_token("ghp_right");
    let r = http
        .post(reg_path("orgs/acme"))
        .bearer_auth("ghp_wrong")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 401);

    // Step C refuses an unknown registration token...
    let step_c = |auth: String| {
        http.post(format!("{root}/actions/runner-registration"))
            .header("authorization", auth)
            .json(&json!({"url": "https://github.com/acme", "runner_event": "register"}))
            .send()
    };
    let r = step_c("RemoteAuth not-issued".into())
        .await
        .expect("answers");
    assert_eq!(r.status(), 401);

    // ...answers an injected 401 once, then the service URL and a JWT.
    let reg = body(
        http.post(reg_path("orgs/acme"))
            .bearer_auth("ghp_right")
            .send()
            .await
            .expect("answers"),
    )
    .await;
    let auth = format!("RemoteAuth {}", reg["token"].as_str().expect("token"));
    f.fail_next_registration(401);
    let r = step_c(auth.clone()).await.expect("answers");
    assert_eq!(r.status(), 401, "the injected failure");
    let r = step_c(auth).await.expect("answers");
    assert_eq!(r.status(), 201, "the retry succeeds");
    let c = body(r).await;
    assert_eq!(c["url"], f.service_url());
    assert!(f.service_url().ends_with("/tenant/123/"));
    let admin = c["token"].as_str().expect("token").to_owned();
    let exp = claims(&admin)["exp"].as_u64().expect("exp");
    assert!(exp > now_secs() + 3000, "about an hour by default");
    assert_eq!(
        f.registrations(),
        vec!["https://github.com/acme".to_owned()]
    );
    assert_eq!(f.admin_tokens_issued(), 1);

    // Admin endpoints take exactly that token.
    let groups = format!(
        "{}_apis/runtime/runnergroups/?groupName=Default&{API}",
        f.service_url()
    );
    let r = http.get(&groups).send().await.expect("answers");
    assert_eq!(r.status(), 401);
    let r = http
        .get(&groups)
        .bearer_auth("nope")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 401);
    let r = http
        .get(&groups)
        .bearer_auth(&admin)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 200);
    let v = body(r).await;
    assert_eq!(v["count"], 1);
    assert_eq!(v["value"][0]["id"], 1);
    assert_eq!(v["value"][0]["name"], "Default");
    assert_eq!(v["value"][0]["isDefaultGroup"], true);
}

#[tokio::test]
async fn admin_tokens_expire_with_their_ttl() {
    let f = fake().await;
    f.set_admin_token_ttl(Duration::from_millis(100));
    let c = Conn::new(&f).await;
    let exp = claims(&c.admin)["exp"].as_u64().expect("exp");
    assert!(exp <= now_secs() + 2, "the JWT says how short it lives");
    assert_eq!(c.call(Method::GET, RSS, None).await.status(), 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = c.call(Method::GET, RSS, None).await;
    assert_eq!(r.status(), 401);
    assert!(type_name(&body(r).await).ends_with("Exception"));

    // A fresh registration works again; expire_admin_tokens ends it too.
    f.set_admin_token_ttl(Duration::from_secs(3600));
    let c = Conn::new(&f).await;
    assert_eq!(c.call(Method::GET, RSS, None).await.status(), 200);
    f.expire_admin_tokens();
    assert_eq!(c.call(Method::GET, RSS, None).await.status(), 401);
}

#[tokio::test]
async fn scale_sets_are_created_listed_updated_and_deleted() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let gpu = f.add_runner_group("gpu");

    let set = c.scale_set("ry-linux").await;
    let id = id_of(&set);
    assert_eq!(set["name"], "ry-linux");
    assert_eq!(set["runnerGroupId"], 1);
    assert_eq!(set["runnerGroupName"], "Default");
    assert_eq!(
        set["labels"],
        json!([{"type": "System", "name": "ry-linux"}])
    );
    assert_eq!(
        set["RunnerSetting"]["disableUpdate"], true,
        "PascalCase key"
    );
    assert!(set.get("runnerSetting").is_none());
    assert!(set["statistics"].is_object());
    assert!(
        set["runnerJitConfigUrl"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/generatejitconfig")
    );
    assert_ne!(set["createdOn"], "0001-01-01T00:00:00Z");

    // The same name in the same group: 400; in another group: fine.
    let dup = c
        .call(
            Method::POST,
            RSS,
            Some(json!({"name": "ry-linux", "runnerGroupId": 1})),
        )
        .await;
    assert_eq!(dup.status(), 400);
    assert!(type_name(&body(dup).await).ends_with("Exception"));
    let other = c
        .call(
            Method::POST,
            RSS,
            Some(json!({"name": "ry-linux", "runnerGroupId": gpu, "labels": [{"name": "ry-linux", "type": ""}, {"name": "gpu", "type": ""}]})),
        )
        .await;
    assert_eq!(other.status(), 200);
    let other = body(other).await;
    assert_eq!(
        other["labels"],
        json!([{"type": "System", "name": "ry-linux"}, {"type": "System", "name": "gpu"}]),
        "an empty label type is System"
    );

    // Look-ups: by group and name, by id, all; lists are {count, value}.
    let by_name = body(
        c.call(
            Method::GET,
            &format!("{RSS}?runnerGroupId=1&name=ry-linux"),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(by_name["count"], 1);
    assert_eq!(by_name["value"][0]["id"], id);
    let none = body(
        c.call(
            Method::GET,
            &format!("{RSS}?runnerGroupId=1&name=absent"),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(none, json!({"count": 0, "value": []}));
    let all = body(c.call(Method::GET, RSS, None).await).await;
    assert_eq!(all["count"], 2);
    let one = c.call(Method::GET, &format!("{RSS}/{id}"), None).await;
    assert_eq!(one.status(), 200);
    assert_eq!(body(one).await["name"], "ry-linux");

    // Update: name and group change, labels are ignored.
    let patched = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}"),
            Some(json!({"name": "ry-linux-2", "labels": [{"name": "other", "type": "System"}]})),
        )
        .await;
    assert_eq!(patched.status(), 200);
    let patched = body(patched).await;
    assert_eq!(patched["name"], "ry-linux-2");
    assert_eq!(
        patched["labels"],
        json!([{"type": "System", "name": "ry-linux"}])
    );
    let moved = body(
        c.call(
            Method::PATCH,
            &format!("{RSS}/{id}"),
            Some(json!({"runnerGroupId": gpu})),
        )
        .await,
    )
    .await;
    assert_eq!(moved["runnerGroupId"], gpu);
    assert_eq!(moved["runnerGroupName"], "gpu");
    assert_eq!(moved["name"], "ry-linux-2");
    let fake_view = f.scale_sets();
    assert_eq!(fake_view[0].labels, vec!["ry-linux".to_owned()]);
    assert_eq!(fake_view[0].runner_group_id, gpu);

    // Delete: 204, then 404 RunnerScaleSetNotFoundException.
    assert_eq!(
        c.call(Method::DELETE, &format!("{RSS}/{id}"), None)
            .await
            .status(),
        204
    );
    let gone = c.call(Method::GET, &format!("{RSS}/{id}"), None).await;
    assert_eq!(gone.status(), 404);
    assert!(type_name(&body(gone).await).contains("RunnerScaleSetNotFoundException"));

    // Deleted server-side (garbage collection): E3, E9 and E2 notice.
    let other_id = id_of(&other);
    let s = c.session(other_id).await;
    f.delete_scale_set_server_side(other_id);
    for (method, path) in [
        (Method::GET, format!("{RSS}/{other_id}")),
        (Method::POST, format!("{RSS}/{other_id}/sessions")),
    ] {
        let r = c.call(method, &path, Some(json!({"ownerName": "x"}))).await;
        assert_eq!(r.status(), 404, "{path}");
        assert!(type_name(&body(r).await).contains("RunnerScaleSetNotFoundException"));
    }
    let listed = body(
        c.call(
            Method::GET,
            &format!("{RSS}?runnerGroupId={gpu}&name=ry-linux"),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(listed["count"], 0);
    assert_eq!(c.message(&s, 0).await.status(), 401, "its session went too");
    assert!(f.scale_sets().is_empty());
}

#[tokio::test]
async fn one_session_per_scale_set_with_refresh_and_delete() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let first = c
        .call(
            Method::POST,
            &format!("{RSS}/{id}/sessions"),
            Some(json!({"ownerName": "host-a"})),
        )
        .await;
    assert_eq!(first.status(), 200);
    let first = body(first).await;
    assert_eq!(first["ownerName"], "host-a");
    assert_eq!(first["runnerScaleSet"]["id"], id);
    assert!(first["statistics"].is_object(), "statistics are never null");
    assert!(claims(first["messageQueueAccessToken"].as_str().expect("token"))["exp"].is_u64());
    let s = Session::from(&first);
    assert!(s.queue_url.starts_with(&f.service_url()));
    assert!(s.queue_url.contains('?'), "the queue URL carries a query");
    assert_eq!(f.scale_sets()[0].sessions, 1);

    // A second listener: 409 until the first session is deleted.
    let conflict = c
        .call(
            Method::POST,
            &format!("{RSS}/{id}/sessions"),
            Some(json!({"ownerName": "host-b"})),
        )
        .await;
    assert_eq!(conflict.status(), 409);
    assert!(type_name(&body(conflict).await).contains("RunnerScaleSetSessionConflictException"));
    assert_eq!(f.session_conflicts(), 1);

    // Refresh rotates the token; the new one reads the queue.
    let refreshed = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{}", s.id),
            None,
        )
        .await;
    assert_eq!(refreshed.status(), 200);
    let refreshed = Session::from(&body(refreshed).await);
    assert_eq!(refreshed.id, s.id);
    assert_ne!(refreshed.token, s.token);
    assert_eq!(c.message(&refreshed, 0).await.status(), 202);

    // Unknown sessions: 404 on refresh, 400 SessionExpired on delete.
    let unknown = "6f1c4c8e-0000-4000-8000-000000000000";
    let r = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{unknown}"),
            None,
        )
        .await;
    assert_eq!(r.status(), 404);
    let r = c
        .call(
            Method::DELETE,
            &format!("{RSS}/{id}/sessions/{unknown}"),
            None,
        )
        .await;
    assert_eq!(r.status(), 400);
    assert!(type_name(&body(r).await).contains("RunnerScaleSetSessionExpiredException"));

    // Delete: 204; the token stops working; a new session is allowed.
    let r = c
        .call(
            Method::DELETE,
            &format!("{RSS}/{id}/sessions/{}", s.id),
            None,
        )
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(f.scale_sets()[0].sessions, 0);
    assert_eq!(c.message(&refreshed, 0).await.status(), 401);
    let again = c.session(id).await;
    assert_ne!(again.id, s.id);

    // A stale session the service expires frees the set as well.
    f.expire_sessions();
    let r = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{}", again.id),
            None,
        )
        .await;
    assert_eq!(r.status(), 404);
    let live = c.session(id).await;
    assert_eq!(f.sessions_created(), 3);

    // Optionally the service ends a session nobody uses any more.
    f.set_session_stale_after(Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{}", live.id),
            None,
        )
        .await;
    assert_eq!(r.status(), 404, "the stale session ended");
    let used = c.session(id).await;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(c.message(&used, 0).await.status(), 202);
    }
    let r = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{}", used.id),
            None,
        )
        .await;
    assert_eq!(r.status(), 200, "a session in use stays");
}

#[tokio::test]
async fn the_long_poll_holds_then_answers_202_and_returns_early_for_a_message() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;

    let t = Instant::now();
    let r = c.message(&s, 0).await;
    assert_eq!(r.status(), 202);
    assert!(
        t.elapsed() >= HOLD - Duration::from_millis(20),
        "held {:?}",
        t.elapsed()
    );
    assert_eq!(f.scale_sets()[0].max_capacity_seen, Some(7));

    // A long hold ends as soon as a job arrives.
    f.set_poll_hold(Duration::from_secs(10));
    let t = Instant::now();
    let poll = {
        let c = Conn {
            http: c.http.clone(),
            service: c.service.clone(),
            admin: c.admin.clone(),
        };
        let s = s.clone();
        tokio::spawn(async move { c.message(&s, 0).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    f.queue_job(id, job(1));
    let r = poll.await.expect("the poll task");
    assert_eq!(r.status(), 200);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "returned early: {:?}",
        t.elapsed()
    );
    let m = body(r).await;
    assert_eq!(m["messageType"], "RunnerScaleSetJobMessages");
    assert_eq!(jobs_of(&m)[0]["messageType"], "JobAvailable");
}

#[tokio::test]
async fn unacked_messages_are_redelivered_until_deleted() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    f.queue_job(id, job(1));

    let m = c.next(&s, 0).await;
    let mid = m["messageId"].as_i64().expect("messageId");
    assert_eq!(mid, 100_000_170, "ids start where github.com's do");
    assert!(m["statistics"].is_object());
    // Not deleted: the next poll from 0 gets it again, with current stats.
    let again = c.next(&s, 0).await;
    assert_eq!(again["messageId"], mid);
    assert_eq!(again["body"], m["body"]);
    // lastMessageId past it: nothing newer.
    assert_eq!(c.message(&s, mid).await.status(), 202);

    // The queue URL's query is part of it: dropping it is refused.
    let (path, _) = s.queue_url.split_once('?').expect("query");
    let r = c
        .http
        .get(path)
        .bearer_auth(&s.token)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 400);

    // Delete acknowledges it; a repeat is 204 and not counted twice.
    assert_eq!(c.ack(&s, mid).await.status(), 204);
    assert_eq!(c.ack(&s, mid).await.status(), 204);
    assert_eq!(f.acks(), 1);
    assert_eq!(c.message(&s, 0).await.status(), 202, "gone for good");

    // The next message has the next id.
    f.queue_job(id, job(2));
    let m2 = c.next(&s, mid).await;
    assert_eq!(m2["messageId"], mid + 1);
}

#[tokio::test]
async fn lost_acknowledgements_leave_the_message_and_redelivery_can_ignore_the_last_id() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    f.queue_job(id, job(1));
    let m = c.next(&s, 0).await;
    let mid = m["messageId"].as_i64().expect("messageId");
    // Past it, the message is not offered by default.
    assert_eq!(c.message(&s, mid).await.status(), 202);
    f.set_redeliver_unacked(true);
    let again = c.next(&s, mid).await;
    assert_eq!(again["messageId"], mid, "un-acknowledged: handed out again");
    // A lost acknowledgement answers 204 and keeps the message.
    f.lose_next_acks(1);
    assert_eq!(c.ack(&s, mid).await.status(), 204);
    assert_eq!(f.acks(), 0);
    assert_eq!(c.next(&s, mid).await["messageId"], mid);
    assert_eq!(c.ack(&s, mid).await.status(), 204);
    assert_eq!(f.acks(), 1);
    assert_eq!(
        c.message(&s, mid).await.status(),
        202,
        "gone once acknowledged"
    );
}

#[tokio::test]
async fn messages_carry_at_most_50_jobs_and_statistics_in_a_double_encoded_body() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    let queued: Vec<String> = (0..120).map(|n| f.queue_job(id, job(n))).collect();

    let mut last = 0;
    let mut sizes = Vec::new();
    let mut seen = Vec::new();
    while let Ok(r) = tokio::time::timeout(Duration::from_secs(5), c.message(&s, last)).await {
        if r.status() == 202 {
            break;
        }
        let m = body(r).await;
        assert!(m["body"].is_string(), "body is a JSON string");
        assert_eq!(m["statistics"]["totalAvailableJobs"], 120);
        let jobs = jobs_of(&m);
        sizes.push(jobs.len());
        for j in &jobs {
            assert_eq!(j["messageType"], "JobAvailable");
            assert!(
                j["acquireJobUrl"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("/acquirejobs")
            );
            assert_eq!(j["ownerName"], "acme");
            assert_eq!(j["repositoryName"], "app");
            assert_eq!(
                j["jobWorkflowRef"],
                "acme/app/.github/workflows/ci.yml@refs/heads/main"
            );
            assert_eq!(j["eventName"], "push");
            assert_eq!(j["requestLabels"], json!(["ry-linux"]));
            assert_eq!(j["runnerAssignTime"], "0001-01-01T00:00:00Z");
            assert!(j["jobId"].is_string());
            seen.push(j["jobId"].as_str().unwrap_or_default().to_owned());
        }
        let mid = m["messageId"].as_i64().expect("id");
        assert!(mid > last);
        assert_eq!(c.ack(&s, mid).await.status(), 204);
        last = mid;
    }
    assert_eq!(sizes, vec![50, 50, 20]);
    assert_eq!(seen, queued, "in order, each once");
    let stats = f.statistics(id);
    for key in [
        "totalAvailableJobs",
        "totalAcquiredJobs",
        "totalAssignedJobs",
        "totalRunningJobs",
        "totalRegisteredRunners",
        "totalBusyRunners",
        "totalIdleRunners",
    ] {
        assert!(stats[key].is_i64(), "{key}");
    }
}

#[tokio::test]
async fn acquire_takes_a_bare_array_and_returns_the_acquired_subset() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let other = id_of(&c.scale_set("other").await);
    let s = c.session(id).await;
    for n in 0..3 {
        f.queue_job(id, job(n));
    }
    let foreign = f.queue_job(other, job(9));
    let m = c.next(&s, 0).await;
    let mid = m["messageId"].as_i64().expect("id");
    let ids: Vec<i64> = jobs_of(&m)
        .iter()
        .map(|j| j["runnerRequestId"].as_i64().expect("runnerRequestId"))
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(c.ack(&s, mid).await.status(), 204);

    // The admin token is not the session token.
    assert_eq!(c.acquire(id, &c.admin, &ids[..2]).await.status(), 401);
    let foreign_rr = f
        .jobs()
        .iter()
        .find(|j| j.job_id == foreign)
        .map(|j| j.runner_request_id)
        .expect("job");
    let r = c
        .acquire(id, &s.token, &[ids[0], ids[1], 999_999, foreign_rr])
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        body(r).await,
        json!({"count": 2, "value": [ids[0], ids[1]]})
    );
    let states: Vec<String> = f.jobs().iter().map(|j| j.state.clone()).collect();
    assert_eq!(states, ["acquired", "acquired", "available", "available"]);
    assert_eq!(f.statistics(id)["totalAcquiredJobs"], 2);
    assert_eq!(f.statistics(id)["totalAvailableJobs"], 1);

    // The one left is acquirable (E15); none left: 204.
    let r = c
        .call(Method::GET, &format!("{RSS}/{id}/acquirablejobs"), None)
        .await;
    assert_eq!(r.status(), 200);
    let acquirable = body(r).await;
    assert_eq!(acquirable["count"], 1);
    assert_eq!(acquirable["value"][0]["runnerRequestId"], ids[2]);

    // The next poll assigns what was acquired.
    let m = c.next(&s, mid).await;
    let assigned = jobs_of(&m);
    assert_eq!(assigned.len(), 2);
    assert!(assigned.iter().all(|j| j["messageType"] == "JobAssigned"));
    assert_ne!(assigned[0]["scaleSetAssignTime"], "0001-01-01T00:00:00Z");
    assert_eq!(m["statistics"]["totalAssignedJobs"], 2);
    assert_eq!(m["statistics"]["totalAcquiredJobs"], 0);
    c.ack(&s, m["messageId"].as_i64().expect("id")).await;

    let r = c.acquire(id, &s.token, &[ids[2]]).await;
    assert_eq!(body(r).await["value"], json!([ids[2]]));
    let r = c
        .call(Method::GET, &format!("{RSS}/{id}/acquirablejobs"), None)
        .await;
    assert_eq!(r.status(), 204);
    let r = c.acquire(id, &s.token, &[]).await;
    assert_eq!(body(r).await, json!({"count": 0, "value": []}));
    let r = c
        .http
        .post(format!("{}{RSS}/{id}/acquirejobs?{API}", c.service))
        .bearer_auth(&s.token)
        .json(&json!({"ids": [1]}))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 400, "only a bare array");
}

#[tokio::test]
async fn jit_runners_take_jobs_are_listed_and_leave_after_their_job() {
    let f = fake().await;
    f.set_acquire_required(false);
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;

    let r = c.jit(id, "ry-1 a+b").await;
    assert_eq!(r.status(), 200);
    let jit = body(r).await;
    let runner_id = jit["runner"]["id"].as_i64().expect("runner id");
    assert_eq!(jit["runner"]["name"], "ry-1 a+b");
    assert_eq!(jit["runner"]["runnerScaleSetId"], id);
    let encoded = jit["encodedJITConfig"].as_str().expect("config").to_owned();
    let files: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&encoded)
            .expect("base64"),
    )
    .expect("JSON");
    for file in [".runner", ".credentials", ".credentials_rsaparams"] {
        assert!(files[file].is_string(), "{file}");
    }
    assert_eq!(
        decode_scale_set_jit(&encoded),
        Some((runner_id, "ry-1 a+b".to_owned()))
    );
    assert_eq!(f.jit_configs_issued(), 1);

    // A name taken: AgentExistsException.
    let dup = c.jit(id, "ry-1 a+b").await;
    assert!(dup.status().is_client_error());
    assert!(type_name(&body(dup).await).contains("AgentExistsException"));

    // The agent list, by id and by (percent-encoded) name.
    let all = body(c.call(Method::GET, AGENTS, None).await).await;
    assert_eq!(all["count"], 1);
    assert_eq!(all["value"][0]["status"], "offline");
    let by_name = body(
        c.call(
            Method::GET,
            &format!("{AGENTS}?agentName=ry-1%20a%2Bb"),
            None,
        )
        .await,
    )
    .await;
    assert_eq!(by_name["count"], 1);
    assert_eq!(by_name["value"][0]["id"], runner_id);
    let none = body(
        c.call(Method::GET, &format!("{AGENTS}?agentName=absent"), None)
            .await,
    )
    .await;
    assert_eq!(none["count"], 0);
    let one = c
        .call(Method::GET, &format!("{AGENTS}/{runner_id}"), None)
        .await;
    assert_eq!(one.status(), 200);
    assert_eq!(body(one).await["busy"], false);
    let missing = c.call(Method::GET, &format!("{AGENTS}/424242"), None).await;
    assert_eq!(missing.status(), 404);
    assert!(type_name(&body(missing).await).contains("AgentNotFoundException"));

    // The runner connects and takes the job: JobStarted, busy.
    let job_id = f.queue_job(id, job(1));
    assert!(f.runner_online_by_jit(&encoded));
    assert!(!f.runner_online("no-such-runner"));
    let m = c.next(&s, 0).await;
    let kinds: Vec<Value> = jobs_of(&m)
        .iter()
        .map(|j| j["messageType"].clone())
        .collect();
    assert_eq!(kinds, ["JobAssigned", "JobStarted"]);
    let started = &jobs_of(&m)[1];
    assert_eq!(started["runnerName"], "ry-1 a+b");
    assert_eq!(started["runnerId"], runner_id);
    assert_eq!(started["jobId"], job_id.as_str());
    assert_eq!(m["statistics"]["totalRunningJobs"], 1);
    assert_eq!(m["statistics"]["totalBusyRunners"], 1);
    let mid = m["messageId"].as_i64().expect("id");
    c.ack(&s, mid).await;

    // A busy runner is not removed.
    let r = c
        .call(Method::DELETE, &format!("{AGENTS}/{runner_id}"), None)
        .await;
    assert!(r.status().is_client_error());
    assert!(type_name(&body(r).await).contains("JobStillRunningException"));
    assert_eq!(f.busy_refusals(), 1);
    assert_eq!(f.removed_while_busy(), 0);

    // The job completes: JobCompleted names the runner, which is gone.
    f.complete_job(&job_id, "succeeded");
    let m = c.next(&s, mid).await;
    let done = &jobs_of(&m)[0];
    assert_eq!(done["messageType"], "JobCompleted");
    assert_eq!(done["result"], "succeeded");
    assert_eq!(done["runnerName"], "ry-1 a+b");
    assert_ne!(done["finishTime"], "0001-01-01T00:00:00Z");
    assert_eq!(m["statistics"]["totalAssignedJobs"], 0);
    assert_eq!(m["statistics"]["totalRegisteredRunners"], 0);
    let all = body(c.call(Method::GET, AGENTS, None).await).await;
    assert_eq!(all["count"], 0);

    // An idle runner is removed: 204; the name is free again.
    let idle = id_of(&body(c.jit(id, "ry-2").await).await["runner"]);
    assert_eq!(
        c.call(Method::DELETE, &format!("{AGENTS}/{idle}"), None)
            .await
            .status(),
        204
    );
    assert_eq!(
        c.call(Method::DELETE, &format!("{AGENTS}/{idle}"), None)
            .await
            .status(),
        404
    );
    assert_eq!(c.jit(id, "ry-2").await.status(), 200);
}

#[tokio::test]
async fn early_completion_keeps_the_runner_busy_until_it_finishes() {
    let f = fake().await;
    f.set_acquire_required(false);
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    let runner = id_of(&body(c.jit(id, "ry-1").await).await["runner"]);
    assert!(f.runner_online("ry-1"));
    let job_id = f.queue_job(id, job(1));
    assert_eq!(f.runners()[0].job_id.as_deref(), Some(job_id.as_str()));

    f.send_completed_early(&job_id);
    let m = c.next(&s, 0).await;
    let kinds: Vec<Value> = jobs_of(&m)
        .iter()
        .map(|j| j["messageType"].clone())
        .collect();
    assert_eq!(kinds, ["JobAssigned", "JobStarted", "JobCompleted"]);
    assert_eq!(m["statistics"]["totalBusyRunners"], 1, "still running");
    let r = c
        .call(Method::DELETE, &format!("{AGENTS}/{runner}"), None)
        .await;
    assert!(type_name(&body(r).await).contains("JobStillRunningException"));

    f.finish_job(&job_id);
    assert!(f.runners().is_empty());
    assert_eq!(c.call(Method::GET, AGENTS, None).await.status(), 200);
    assert_eq!(f.removed_while_busy(), 0);

    // Kept runners stay listed, offline, and never take a second job.
    f.set_keep_completed_runners(true);
    c.jit(id, "ry-2").await;
    f.runner_online("ry-2");
    let second = f.queue_job(id, job(2));
    f.complete_job(&second, "failed");
    let kept = f.runners();
    assert_eq!(kept.len(), 1);
    assert!(!kept[0].online && !kept[0].busy);
    assert!(!f.runner_online("ry-2"));
    let third = f.queue_job(id, job(3));
    assert_eq!(
        f.jobs()
            .iter()
            .find(|j| j.job_id == third)
            .map(|j| j.state.clone()),
        Some("assigned".to_owned())
    );
}

#[tokio::test]
async fn expired_session_tokens_answer_401_until_refreshed() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    f.queue_job(id, job(1));
    let m = c.next(&s, 0).await;
    let mid = m["messageId"].as_i64().expect("id");

    f.expire_session_tokens();
    assert_eq!(c.message(&s, 0).await.status(), 401);
    assert_eq!(c.ack(&s, mid).await.status(), 401);
    assert_eq!(c.acquire(id, &s.token, &[1]).await.status(), 401);

    let r = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{}", s.id),
            None,
        )
        .await;
    let fresh = Session::from(&body(r).await);
    assert_eq!(c.ack(&fresh, mid).await.status(), 204);

    // A short TTL runs out by itself.
    f.set_session_token_ttl(Duration::from_millis(100));
    let r = c
        .call(
            Method::PATCH,
            &format!("{RSS}/{id}/sessions/{}", s.id),
            None,
        )
        .await;
    let short = Session::from(&body(r).await);
    let exp = claims(&short.token)["exp"].as_u64().expect("exp");
    assert!(exp <= now_secs() + 2);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(c.message(&short, 0).await.status(), 401);
}

#[tokio::test]
async fn a_bom_can_prefix_every_json_answer() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    f.queue_job(id, job(1));
    f.set_bom(true);
    let r = c.call(Method::GET, RSS, None).await;
    let raw = r.bytes().await.expect("bytes");
    assert!(raw.starts_with(b"\xEF\xBB\xBF{"), "{raw:?}");
    let r = c.message(&s, 0).await;
    let raw = r.bytes().await.expect("bytes");
    assert!(raw.starts_with(b"\xEF\xBB\xBF"));
    let m: Value = serde_json::from_slice(&raw[3..]).expect("JSON after the BOM");
    assert_eq!(jobs_of(&m).len(), 1);
    f.set_bom(false);
    let raw = c
        .call(Method::GET, RSS, None)
        .await
        .bytes()
        .await
        .expect("bytes");
    assert!(raw.starts_with(b"{"));
}

#[tokio::test]
async fn reassignment_cancels_then_assigns_the_job_again() {
    let f = fake().await;
    f.set_acquire_required(false);
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    let job_id = f.queue_job(id, job(1));
    let m = c.next(&s, 0).await;
    let assigned = &jobs_of(&m)[0];
    assert_eq!(assigned["messageType"], "JobAssigned");
    let rr = assigned["runnerRequestId"].clone();
    let mut last = m["messageId"].as_i64().expect("id");
    c.ack(&s, last).await;

    f.unassign(&job_id);
    let m = c.next(&s, last).await;
    let jobs = jobs_of(&m);
    assert_eq!(jobs.len(), 1, "the cancellation alone");
    assert_eq!(jobs[0]["messageType"], "JobCompleted");
    assert_eq!(jobs[0]["result"], "canceled");
    assert_eq!(jobs[0]["runnerName"], "");
    assert_eq!(m["statistics"]["totalAssignedJobs"], 0);
    assert_eq!(f.jobs()[0].state, "requeued");
    last = m["messageId"].as_i64().expect("id");
    c.ack(&s, last).await;

    let m = c.next(&s, last).await;
    let again = &jobs_of(&m)[0];
    assert_eq!(again["messageType"], "JobAssigned");
    assert_eq!(again["jobId"], job_id.as_str());
    assert_eq!(again["runnerRequestId"], rr);
    assert_eq!(m["statistics"]["totalAssignedJobs"], 1);
    let j = &f.jobs()[0];
    assert_eq!((j.state.as_str(), j.times_assigned), ("assigned", 2));

    // And a runner can still run it.
    c.jit(id, "ry-1").await;
    assert!(f.runner_online("ry-1"));
    assert_eq!(f.jobs()[0].state, "running");
    assert_eq!(f.jobs()[0].runner_name.as_deref(), Some("ry-1"));
}

#[tokio::test]
async fn down_answers_503_everywhere_and_chaos_can_be_injected() {
    let f = fake().await;
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    let root = f.github_url();

    f.set_down(true);
    let r = c
        .http
        .post(format!(
            "{root}/orgs/acme/actions/runners/registration-token"
        ))
        .bearer_auth("t")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 503);
    let r = c
        .http
        .post(format!("{root}/actions/runner-registration"))
        .header("authorization", "RemoteAuth x")
        .json(&json!({"url": "https://github.com/acme", "runner_event": "register"}))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 503);
    assert_eq!(c.call(Method::GET, RSS, None).await.status(), 503);
    assert_eq!(c.message(&s, 0).await.status(), 503);
    f.set_down(false);
    assert_eq!(c.call(Method::GET, RSS, None).await.status(), 200);

    // Injected refusals, an empty 200 poll, an empty queue URL.
    f.fail_next(2, 429);
    assert_eq!(c.call(Method::GET, RSS, None).await.status(), 429);
    assert_eq!(c.message(&s, 0).await.status(), 429);
    assert_eq!(c.message(&s, 0).await.status(), 202);
    f.empty_next_message();
    let r = c.message(&s, 0).await;
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.expect("bytes").is_empty());
    c.call(
        Method::DELETE,
        &format!("{RSS}/{id}/sessions/{}", s.id),
        None,
    )
    .await;
    f.empty_queue_url_next_session();
    let r = c
        .call(
            Method::POST,
            &format!("{RSS}/{id}/sessions"),
            Some(json!({"ownerName": "x"})),
        )
        .await;
    assert_eq!(body(r).await["messageQueueUrl"], "");

    // The request log saw all of it, with the api-version query.
    assert!(f.count("GET", "/tenant/123/_apis/runtime/runnerscalesets") >= 3);
    assert!(
        f.requests()
            .iter()
            .filter(|r| r.path == "/tenant/123/_apis/runtime/runnerscalesets")
            .all(|r| r.query.contains(API))
    );
    assert!(f.requests().iter().any(|r| r.status == 503));
}

#[tokio::test]
async fn a_connected_fake_github_answers_the_registration_steps() {
    let f = fake().await;
    let gh = FakeGitHub::start().await;
    gh.require_token("ghp_pat");
    gh.connect_actions(&f);
    let http = http();
    let r = http
        .post(format!(
            "{}/orgs/acme/actions/runners/registration-token",
            gh.url()
        ))
        .bearer_auth("ghp_other")
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 401, "GitHub's own credential rules");

    f.fail_next_registration(403);
    let r = http
        .post(format!("{}/actions/runner-registration", gh.url()))
        .header("authorization", "RemoteAuth whatever")
        .json(&json!({"url": "https://github.com/acme", "runner_event": "register"}))
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 403, "the Actions side's injected failure");

    let (service, admin) = register(&http, &gh.url(), "ghp_pat").await;
    assert_eq!(service, f.service_url());
    let r = http
        .get(format!("{service}{RSS}?{API}"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("answers");
    assert_eq!(r.status(), 200);
    assert_eq!(f.registration_tokens_issued(), 1);
    assert_eq!(f.admin_tokens_issued(), 1);
    assert_eq!(gh.count("POST", "/actions/runner-registration"), 2);
    assert_eq!(f.count("POST", "/actions/runner-registration"), 0);
}

/// A listener and a fleet of 50 runners through a burst of 300 jobs: poll,
/// ack, acquire, start runners for assigned jobs, complete what started.
#[tokio::test]
async fn a_burst_of_300_jobs_runs_on_50_runners() {
    const JOBS: usize = 300;
    const RUNNERS: usize = 50;
    let f = fake().await;
    f.set_poll_hold(Duration::from_millis(50));
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    let t = Instant::now();
    for n in 0..JOBS {
        f.queue_job(id, job(i64::try_from(n).unwrap_or(0)));
    }

    let mut last = 0;
    let mut fleet = 0usize;
    let mut started = std::collections::HashSet::new();
    let mut completed = 0usize;
    let mut next_name = 0;
    let mut max_batch = 0;
    while completed < JOBS {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "stuck at {completed} completed"
        );
        // Keep the fleet at 50 while work remains.
        while fleet < RUNNERS && fleet + completed < JOBS {
            next_name += 1;
            let r = c.jit(id, &format!("ry-{next_name}")).await;
            assert_eq!(r.status(), 200);
            let encoded = body(r).await["encodedJITConfig"]
                .as_str()
                .expect("config")
                .to_owned();
            assert!(f.runner_online_by_jit(&encoded));
            fleet += 1;
        }
        let r = c.message(&s, last).await;
        if r.status() == 202 {
            continue;
        }
        assert_eq!(r.status(), 200);
        let m = body(r).await;
        last = m["messageId"].as_i64().expect("id");
        assert_eq!(c.ack(&s, last).await.status(), 204);
        let jobs = jobs_of(&m);
        max_batch = max_batch.max(jobs.len());
        let available: Vec<i64> = jobs
            .iter()
            .filter(|j| j["messageType"] == "JobAvailable")
            .filter_map(|j| j["runnerRequestId"].as_i64())
            .collect();
        if !available.is_empty() {
            let r = c.acquire(id, &s.token, &available).await;
            assert_eq!(body(r).await["count"], available.len());
        }
        for j in &jobs {
            let job_id = j["jobId"].as_str().unwrap_or_default().to_owned();
            match j["messageType"].as_str() {
                Some("JobStarted") => {
                    assert!(started.insert(job_id.clone()), "started twice");
                    f.complete_job(&job_id, "succeeded");
                }
                Some("JobCompleted") => {
                    assert_eq!(j["result"], "succeeded");
                    completed += 1;
                    fleet -= 1;
                }
                _ => {}
            }
        }
    }
    assert_eq!(started.len(), JOBS);
    assert!(max_batch <= 50);
    assert!(f.jobs().iter().all(|j| j.state == "completed"));
    assert!(f.runners().is_empty(), "every ephemeral runner left");
    assert_eq!(f.jit_configs_issued(), u64::try_from(JOBS).unwrap_or(0));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn a_busy_runner_removed_anyway_is_counted_and_its_job_fails() {
    let f = fake().await;
    f.set_acquire_required(false);
    f.set_remove_checks_busy(false);
    let c = Conn::new(&f).await;
    let id = id_of(&c.scale_set("ry").await);
    let s = c.session(id).await;
    let runner = id_of(&body(c.jit(id, "ry-1").await).await["runner"]);
    f.runner_online("ry-1");
    let job_id = f.queue_job(id, job(1));
    let r = c
        .call(Method::DELETE, &format!("{AGENTS}/{runner}"), None)
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(f.removed_while_busy(), 1);
    assert_eq!(f.busy_refusals(), 0);
    let m = c.next(&s, 0).await;
    let last = jobs_of(&m).pop().expect("messages");
    assert_eq!(last["messageType"], "JobCompleted");
    assert_eq!(last["jobId"], job_id.as_str());
    assert_eq!(last["result"], "failed");
    assert_eq!(last["runnerName"], "ry-1");
}
