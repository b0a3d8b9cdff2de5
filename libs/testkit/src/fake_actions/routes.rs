//! The fake's HTTP side: the registration steps (B, C) at its root and the
//! Actions service (E1–E19 of SCALESET.md §3) under `/tenant/123/`, with
//! the long poll of the message queue.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Shared;
use super::state::{AcState, Label, TENANT};
use crate::fake_github::{RecordedRequest, lock, param, query_pairs};

/// An answer before it is rendered (so the BOM and the log see it whole).
#[derive(Debug)]
pub(super) enum Reply {
    /// A JSON body.
    Json(u16, Value),
    /// No body.
    Empty(u16),
    /// A `text/plain` body.
    Text(u16, String),
}

/// What a route asks the handler to do next.
enum Step {
    Done(Reply),
    /// Hold a `GET` of the message queue.
    Poll {
        scale_set_id: i64,
        session: String,
        last: i64,
    },
}

/// One request, parsed.
struct Req<'a> {
    method: &'a Method,
    segs: Vec<&'a str>,
    query: Vec<(String, String)>,
    headers: &'a HeaderMap,
    body: &'a [u8],
    bearer: Option<&'a str>,
    remote_auth: Option<&'a str>,
}

/// The `typeName` of an exception: a namespaced class name.
fn type_name(short: &str) -> String {
    let ns = if short.starts_with("Agent") || short.starts_with("JobStillRunning") {
        "GitHub.DistributedTask.WebApi"
    } else {
        "GitHub.Actions.Runtime.WebApi"
    };
    format!("{ns}.{short}")
}

/// An error answer `{"typeName", "message"}`.
pub(super) fn exception(status: u16, short: &str, message: &str) -> Reply {
    Reply::Json(
        status,
        json!({"typeName": type_name(short), "typeKey": short, "errorCode": 0, "message": message}),
    )
}

fn github_error(status: u16, message: &str) -> Reply {
    Reply::Json(
        status,
        json!({"message": message, "documentation_url": "https://docs.github.com/rest"}),
    )
}

fn list(values: Vec<Value>) -> Reply {
    let count = values.len();
    Reply::Json(200, json!({"count": count, "value": Value::Array(values)}))
}

fn render(reply: Reply, bom: bool) -> Response {
    let code = |s: u16| StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = match reply {
        Reply::Json(status, v) => {
            let mut bytes = Vec::new();
            if bom {
                bytes.extend_from_slice(b"\xEF\xBB\xBF");
            }
            bytes.extend_from_slice(v.to_string().as_bytes());
            let mut r = (code(status), Body::from(bytes)).into_response();
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("application/json; charset=utf-8"),
            );
            r
        }
        Reply::Empty(status) => code(status).into_response(),
        Reply::Text(status, text) => (code(status), text).into_response(),
    };
    let id = uuid::Uuid::new_v4().to_string();
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("activityid", v.clone());
        response.headers_mut().insert("x-github-request-id", v);
    }
    response
}

/// Every request to the fake.
pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or("").to_owned();
    let credential = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let req = Req {
        method: &method,
        segs: path.split('/').filter(|s| !s.is_empty()).collect(),
        query: query_pairs(&query),
        headers: &headers,
        body: &body,
        bearer: credential.as_deref().and_then(|c| {
            c.strip_prefix("Bearer ")
                .or_else(|| c.strip_prefix("token "))
                .map(str::trim)
        }),
        remote_auth: credential
            .as_deref()
            .and_then(|c| c.strip_prefix("RemoteAuth "))
            .map(str::trim),
    };
    let step = {
        let mut st = lock(&shared.state);
        let step = route(&mut st, &req);
        if method != Method::GET {
            // Acquires, acks, new sessions...: a held poll looks again.
            shared.notify.notify_waiters();
        }
        step
    };
    let reply = match step {
        Step::Done(reply) => reply,
        Step::Poll {
            scale_set_id,
            session,
            last,
        } => poll(&shared, scale_set_id, &session, last).await,
    };
    let mut st = lock(&shared.state);
    let response = render(reply, st.bom);
    st.requests.push(RecordedRequest {
        method: method.to_string(),
        path,
        query,
        body: String::from_utf8_lossy(&body).into_owned(),
        credential,
        status: response.status().as_u16(),
    });
    response
}

/// The long poll: a message as soon as there is one, else `202` once
/// the hold has passed.
async fn poll(shared: &Shared, scale_set_id: i64, session: &str, last: i64) -> Reply {
    let hold = lock(&shared.state).poll_hold;
    let deadline = tokio::time::Instant::now() + hold;
    loop {
        let notified = shared.notify.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before looking, so a change made just after the look
        // still wakes this poll.
        notified.as_mut().enable();
        {
            let mut st = lock(&shared.state);
            // A held poll is the session in use.
            st.touch_session(session);
            if st.down {
                return Reply::Text(503, "Service Unavailable".into());
            }
            if let Some(message) = st.next_message(scale_set_id, last) {
                return Reply::Json(200, message);
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            lock(&shared.state).touch_session(session);
            return Reply::Empty(202);
        }
    }
}

fn route(st: &mut AcState, req: &Req<'_>) -> Step {
    if st.down {
        return Step::Done(Reply::Text(503, "Service Unavailable".into()));
    }
    let segs = req.segs.as_slice();
    let m = req.method;
    match segs {
        [first, second, rest @ ..] if [*first, *second] == TENANT => {
            if let Some(status) = st.faults.pop_front() {
                return Step::Done(exception(
                    status,
                    "InjectedFailureException",
                    "injected failure",
                ));
            }
            service(st, req, rest)
        }
        ["orgs", _, "actions", "runners", "registration-token"]
        | ["enterprises", _, "actions", "runners", "registration-token"]
        | ["repos", _, _, "actions", "runners", "registration-token"]
            if m == Method::POST =>
        {
            Step::Done(registration_token(st, req))
        }
        ["actions", "runner-registration"] if m == Method::POST => {
            let (status, body) = st.runner_registration(req.remote_auth, req.body);
            Step::Done(Reply::Json(status, body))
        }
        _ => Step::Done(github_error(404, "Not Found")),
    }
}

/// Step B: any non-empty bearer token, or only the required one.
fn registration_token(st: &mut AcState, req: &Req<'_>) -> Reply {
    let ok = match (req.bearer.filter(|t| !t.is_empty()), &st.pat) {
        (None, _) => false,
        (Some(t), Some(pat)) => t == pat,
        (Some(_), None) => true,
    };
    if !ok {
        return github_error(401, "Bad credentials");
    }
    let (token, expires_at) = st.issue_registration_token();
    Reply::Json(201, json!({"token": token, "expires_at": expires_at}))
}

fn unauthorized() -> Reply {
    exception(
        401,
        "VssUnauthorizedException",
        "The token is not valid or has expired.",
    )
}

fn scale_set_missing(id: &str) -> Reply {
    exception(
        404,
        "RunnerScaleSetNotFoundException",
        &format!("The runner scale set {id} does not exist."),
    )
}

fn bad_request(message: &str) -> Reply {
    exception(400, "ArgumentException", message)
}

fn body_json(req: &Req<'_>) -> Option<Value> {
    serde_json::from_slice(req.body).ok()
}

/// The Actions service, `rest` = the path after `/tenant/123/`.
fn service(st: &mut AcState, req: &Req<'_>, rest: &[&str]) -> Step {
    st.reap_stale_sessions();
    let m = req.method;
    // The message queue and acquire take the session token.
    match rest {
        ["_apis", "queue", sid, "message"] if m == Method::GET => return get_message(st, req, sid),
        ["_apis", "queue", sid, "message", mid] if m == Method::DELETE => {
            return Step::Done(delete_message(st, req, sid, mid));
        }
        ["_apis", "runtime", "runnerscalesets", id, "acquirejobs"] if m == Method::POST => {
            return Step::Done(acquire_jobs(st, req, id));
        }
        _ => {}
    }
    if !st.admin_ok(req.bearer) {
        return Step::Done(unauthorized());
    }
    let reply = match rest {
        ["_apis", "runtime", "runnergroups"] if m == Method::GET => runner_groups(st, req),
        ["_apis", "runtime", "runnerscalesets"] if m == Method::GET => list_scale_sets(st, req),
        ["_apis", "runtime", "runnerscalesets"] if m == Method::POST => create_scale_set(st, req),
        ["_apis", "runtime", "runnerscalesets", id] => match id.parse::<i64>() {
            Ok(n) if st.scale_sets.contains_key(&n) => match *m {
                Method::GET => {
                    let ss = &st.scale_sets[&n];
                    Reply::Json(200, st.scale_set_json(ss))
                }
                Method::PATCH => update_scale_set(st, req, n),
                Method::DELETE => {
                    st.remove_scale_set(n);
                    Reply::Empty(204)
                }
                _ => exception(405, "MethodNotAllowedException", "method not allowed"),
            },
            _ => scale_set_missing(id),
        },
        ["_apis", "runtime", "runnerscalesets", id, action @ ..] => {
            match id
                .parse::<i64>()
                .ok()
                .filter(|n| st.scale_sets.contains_key(n))
            {
                Some(n) => scale_set_action(st, req, n, action),
                None => scale_set_missing(id),
            }
        }
        ["_apis", "distributedtask", "pools", "0", "agents"] if m == Method::GET => {
            let all: Vec<Value> = match param(&req.query, "agentName") {
                Some(name) => st
                    .agent_by_name(name)
                    .and_then(|id| st.agents.get(&id))
                    .map(|a| st.agent_json(a))
                    .into_iter()
                    .collect(),
                None => st.agents.values().map(|a| st.agent_json(a)).collect(),
            };
            list(all)
        }
        ["_apis", "distributedtask", "pools", "0", "agents", id] => {
            agent(st, req, id.parse().unwrap_or(-1))
        }
        _ => exception(404, "NotFoundException", "no such resource"),
    };
    Step::Done(reply)
}

/// E1: `?groupName=` (or every group).
fn runner_groups(st: &AcState, req: &Req<'_>) -> Reply {
    let wanted = param(&req.query, "groupName");
    let groups: Vec<Value> = st
        .groups
        .iter()
        .filter(|(_, name)| wanted.is_none_or(|w| name.eq_ignore_ascii_case(w)))
        .map(|(id, name)| st.group_json(*id, name))
        .collect();
    list(groups)
}

/// E2 (`?runnerGroupId=&name=`) and E4 (no filter).
fn list_scale_sets(st: &AcState, req: &Req<'_>) -> Reply {
    let group = param(&req.query, "runnerGroupId").and_then(|g| g.parse::<i64>().ok());
    let name = param(&req.query, "name");
    let sets: Vec<Value> = st
        .scale_sets
        .values()
        .filter(|s| group.is_none_or(|g| s.runner_group_id == g))
        .filter(|s| name.is_none_or(|n| s.name.eq_ignore_ascii_case(n)))
        .map(|s| st.scale_set_json(s))
        .collect();
    list(sets)
}

fn labels_of(v: &Value) -> Vec<Label> {
    let mut labels: Vec<Label> = Vec::new();
    for l in v
        .get("labels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = l.get("name").and_then(Value::as_str).unwrap_or_default();
        let kind = l
            .get("type")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .unwrap_or("System");
        if !name.is_empty() && !labels.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            labels.push((name.to_owned(), kind.to_owned()));
        }
    }
    labels
}

/// E5.
fn create_scale_set(st: &mut AcState, req: &Req<'_>) -> Reply {
    let Some(v) = body_json(req) else {
        return bad_request("the body is not JSON");
    };
    let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        return bad_request("name is required");
    }
    // 0 (an unset id): the default group.
    let group = v
        .get("runnerGroupId")
        .and_then(Value::as_i64)
        .filter(|g| *g != 0)
        .unwrap_or(1);
    if !st.groups.contains_key(&group) {
        return exception(
            404,
            "RunnerGroupNotFoundException",
            &format!("runner group {group} does not exist"),
        );
    }
    if st.find_scale_set(group, name, -1).is_some() {
        return exception(
            400,
            "RunnerScaleSetExistsException",
            &format!("a runner scale set named {name} already exists in runner group {group}"),
        );
    }
    let mut labels = labels_of(&v);
    if labels.is_empty() {
        labels.push((name.to_owned(), "System".to_owned()));
    }
    let setting = v.get("RunnerSetting").unwrap_or(&Value::Null);
    let flag = |k: &str, default: bool| setting.get(k).and_then(Value::as_bool).unwrap_or(default);
    let id = st.create_scale_set(
        name,
        group,
        labels,
        (
            flag("ephemeral", true),
            flag("isElastic", true),
            flag("disableUpdate", false),
        ),
    );
    let ss = &st.scale_sets[&id];
    Reply::Json(200, st.scale_set_json(ss))
}

/// E6: name, group and `disableUpdate`; labels are ignored, as GitHub does.
fn update_scale_set(st: &mut AcState, req: &Req<'_>, id: i64) -> Reply {
    let Some(v) = body_json(req) else {
        return bad_request("the body is not JSON");
    };
    let Some(current) = st.scale_sets.get(&id) else {
        return scale_set_missing(&id.to_string());
    };
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .unwrap_or(&current.name)
        .to_owned();
    let group = v
        .get("runnerGroupId")
        .and_then(Value::as_i64)
        .filter(|g| *g != 0)
        .unwrap_or(current.runner_group_id);
    if !st.groups.contains_key(&group) {
        return exception(
            404,
            "RunnerGroupNotFoundException",
            &format!("runner group {group} does not exist"),
        );
    }
    if st.find_scale_set(group, &name, id).is_some() {
        return exception(
            400,
            "RunnerScaleSetExistsException",
            &format!("a runner scale set named {name} already exists in runner group {group}"),
        );
    }
    let disable_update = v
        .get("RunnerSetting")
        .and_then(|s| s.get("disableUpdate"))
        .and_then(Value::as_bool);
    if let Some(ss) = st.scale_sets.get_mut(&id) {
        ss.name = name;
        ss.runner_group_id = group;
        if let Some(d) = disable_update {
            ss.disable_update = d;
        }
    }
    let ss = &st.scale_sets[&id];
    Reply::Json(200, st.scale_set_json(ss))
}

/// E8, E9, E10, E11, E15 on an existing scale set.
fn scale_set_action(st: &mut AcState, req: &Req<'_>, id: i64, action: &[&str]) -> Reply {
    let m = req.method;
    match action {
        ["generatejitconfig"] if m == Method::POST => {
            let Some(v) = body_json(req) else {
                return bad_request("the body is not JSON");
            };
            let name = v.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() {
                return bad_request("name is required");
            }
            if st.agent_by_name(name).is_some() {
                return exception(
                    409,
                    "AgentExistsException",
                    &format!("A runner named {name} already exists in the pool."),
                );
            }
            let work_folder = v
                .get("workFolder")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let (runner_id, encoded) = st.register_agent(id, name, work_folder);
            let runner = st.agents.get(&runner_id).map(|a| st.agent_json(a));
            Reply::Json(200, json!({"runner": runner, "encodedJITConfig": encoded}))
        }
        ["sessions"] if m == Method::POST => {
            let owner = body_json(req)
                .and_then(|v| {
                    v.get("ownerName")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_default();
            if let Some(ss) = st.scale_sets.get(&id)
                && ss.session.is_some()
            {
                st.session_conflicts += 1;
                let name = ss.name.clone();
                return exception(
                    409,
                    "RunnerScaleSetSessionConflictException",
                    &format!("The actions runner scaleset {name} already has an active session."),
                );
            }
            let sid = st.create_session(id, &owner);
            let body = st.session_json(&sid);
            st.empty_next_queue_url = false;
            Reply::Json(200, body)
        }
        ["sessions", sid] => {
            let known = st.sessions.get(*sid).is_some_and(|s| s.scale_set_id == id);
            match *m {
                Method::PATCH if known => {
                    st.touch_session(sid);
                    st.rotate_session(sid);
                    Reply::Json(200, st.session_json(sid))
                }
                Method::PATCH => exception(
                    404,
                    "RunnerAdminException",
                    &format!("The session {sid} does not exist."),
                ),
                Method::DELETE if known => {
                    st.drop_session(sid);
                    Reply::Empty(204)
                }
                Method::DELETE => exception(
                    400,
                    "RunnerScaleSetSessionExpiredException",
                    &format!("The session identifier {sid} is not valid."),
                ),
                _ => exception(405, "MethodNotAllowedException", "method not allowed"),
            }
        }
        ["acquirablejobs"] if m == Method::GET => {
            let jobs = st.acquirable(id);
            if jobs.is_empty() {
                Reply::Empty(204)
            } else {
                list(jobs)
            }
        }
        _ => exception(404, "NotFoundException", "no such resource"),
    }
}

/// E16 and E19.
fn agent(st: &mut AcState, req: &Req<'_>, id: i64) -> Reply {
    let Some(a) = st.agents.get(&id) else {
        return exception(
            404,
            "AgentNotFoundException",
            &format!("No runner with id {id} exists."),
        );
    };
    match *req.method {
        Method::GET => Reply::Json(200, st.agent_json(a)),
        Method::DELETE => {
            if a.busy {
                if st.remove_checks_busy {
                    st.busy_refusals += 1;
                    let name = a.name.clone();
                    return exception(
                        400,
                        "JobStillRunningException",
                        &format!("The runner {name} is still running a job."),
                    );
                }
                st.removed_while_busy += 1;
                // The job loses its runner mid-way: it fails.
                if let Some(r) = a.job_id.clone().and_then(|j| st.job_by_id(&j)) {
                    st.complete(r, "failed", true);
                }
            }
            st.agents.remove(&id);
            Reply::Empty(204)
        }
        _ => exception(405, "MethodNotAllowedException", "method not allowed"),
    }
}

/// The session a message-queue request is for, after the token and the
/// queue URL's query are checked.
fn queue_session(st: &mut AcState, req: &Req<'_>, sid: &str) -> Result<i64, Reply> {
    match st.session_of(req.bearer) {
        Some(s) if s == sid => {}
        _ => return Err(unauthorized()),
    }
    if param(&req.query, "sessionId") != Some(sid) {
        return Err(bad_request(
            "the message queue URL's query (sessionId) is missing",
        ));
    }
    st.touch_session(sid);
    st.sessions
        .get(sid)
        .map(|s| s.scale_set_id)
        .ok_or_else(unauthorized)
}

/// E12.
fn get_message(st: &mut AcState, req: &Req<'_>, sid: &str) -> Step {
    let scale_set_id = match queue_session(st, req, sid) {
        Ok(id) => id,
        Err(reply) => return Step::Done(reply),
    };
    let capacity = req
        .headers
        .get("x-scalesetmaxcapacity")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    if let Some(ss) = st.scale_sets.get_mut(&scale_set_id)
        && capacity.is_some()
    {
        ss.max_capacity_seen = capacity;
    }
    if std::mem::take(&mut st.empty_next_message) {
        return Step::Done(Reply::Text(200, String::new()));
    }
    let last = param(&req.query, "lastMessageId")
        .and_then(|v| v.parse::<i64>().ok())
        .unwrap_or(0);
    Step::Poll {
        scale_set_id,
        session: sid.to_owned(),
        last,
    }
}

/// E13.
fn delete_message(st: &mut AcState, req: &Req<'_>, sid: &str, mid: &str) -> Reply {
    let scale_set_id = match queue_session(st, req, sid) {
        Ok(id) => id,
        Err(reply) => return reply,
    };
    let Ok(message_id) = mid.parse::<i64>() else {
        return bad_request("the message id is not a number");
    };
    // A repeated delete is answered the same (and not counted again).
    st.ack(scale_set_id, message_id);
    Reply::Empty(204)
}

/// E14: session token, a bare array of runner request ids.
fn acquire_jobs(st: &mut AcState, req: &Req<'_>, id: &str) -> Reply {
    let Some((sid, scale_set_id)) = st.session_of(req.bearer).and_then(|sid| {
        let set = st.sessions.get(&sid).map(|s| s.scale_set_id)?;
        Some((sid, set))
    }) else {
        return unauthorized();
    };
    st.touch_session(&sid);
    if id.parse::<i64>().ok() != Some(scale_set_id) {
        return unauthorized();
    }
    let Ok(ids) = serde_json::from_slice::<Vec<i64>>(req.body) else {
        return bad_request("the body must be an array of runner request ids");
    };
    let acquired: Vec<Value> = st
        .acquire(scale_set_id, &ids)
        .into_iter()
        .map(Value::from)
        .collect();
    list(acquired)
}
