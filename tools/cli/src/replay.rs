//! `runyard replay DIR`: signs and sends the fixture deliveries of a
//! directory to ingest, as the forges and the runners would, and sums up
//! what ingest answered.
//!
//! Every `*.json` file of the directory (sorted by name) is one delivery,
//! its kind read from its content:
//!
//! - a GitHub `workflow_job` payload (`"workflow_job"` key) →
//!   `POST /webhooks/github`, signed with the webhook secret;
//! - a GitLab Job Hook (`"object_kind": "build"`) or Pipeline Hook
//!   (`"pipeline"`) → `POST /webhooks/gitlab` with the webhook token;
//! - a usage report (`"peak_memory_bytes"`) → `POST /v1/usage` with the
//!   usage token.
//!
//! Delivery ids are derived from the file's name and content, so sending a
//! directory again is answered as duplicates and counted once. Every file
//! is read and checked before the first is sent: a bad file stops the
//! replay with nothing sent.

use std::path::{Path, PathBuf};

use clap::Args;
use hmac::{Hmac, Mac as _};
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::{EXIT_FAILED, EXIT_OK, Failure, Global, out, out_json, progress, redact, table};

/// `runyard replay`.
#[derive(Args, Clone)]
pub struct ReplayArgs {
    /// The directory of deliveries (`*.json`, sent in name order).
    pub dir: PathBuf,
    /// The secret GitHub deliveries are signed with.
    #[arg(long, env = "RUNYARD_GITHUB_WEBHOOK_SECRET", hide_env_values = true)]
    pub github_secret: Option<String>,
    /// The token GitLab deliveries carry.
    #[arg(long, env = "RUNYARD_GITLAB_WEBHOOK_TOKEN", hide_env_values = true)]
    pub gitlab_token: Option<String>,
    /// The bearer token usage reports carry.
    #[arg(long, env = "RUNYARD_USAGE_TOKEN", hide_env_values = true)]
    pub usage_token: Option<String>,
    /// `X-Gitlab-Instance` of GitLab deliveries (e.g.
    /// `https://gitlab.example.com`); without it ingest reads the instance
    /// from the payload.
    #[arg(long)]
    pub gitlab_instance: Option<String>,
}

/// The secrets as `***` (whether each is given shows, never its value).
impl std::fmt::Debug for ReplayArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self {
            dir,
            github_secret,
            gitlab_token,
            usage_token,
            gitlab_instance,
        } = self;
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "***");
        f.debug_struct("ReplayArgs")
            .field("dir", dir)
            .field("github_secret", &hidden(github_secret))
            .field("gitlab_token", &hidden(gitlab_token))
            .field("usage_token", &hidden(usage_token))
            .field("gitlab_instance", gitlab_instance)
            .finish()
    }
}

/// What a file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    GithubWorkflowJob,
    GitlabJobHook,
    GitlabPipelineHook,
    UsageReport,
}

impl Kind {
    fn of(body: &Value) -> Option<Self> {
        if body.get("workflow_job").is_some() {
            return Some(Self::GithubWorkflowJob);
        }
        match body.get("object_kind").and_then(Value::as_str) {
            Some("build") => return Some(Self::GitlabJobHook),
            Some("pipeline") => return Some(Self::GitlabPipelineHook),
            _ => {}
        }
        body.get("peak_memory_bytes").map(|_| Self::UsageReport)
    }

    fn path(self) -> &'static str {
        match self {
            Self::GithubWorkflowJob => "/webhooks/github",
            Self::GitlabJobHook | Self::GitlabPipelineHook => "/webhooks/gitlab",
            Self::UsageReport => "/v1/usage",
        }
    }
}

/// One file, read and checked.
#[derive(Debug)]
struct Delivery {
    file: String,
    kind: Kind,
    id: String,
    body: Vec<u8>,
}

/// What ingest answered for one file.
#[derive(Debug, Serialize)]
struct Sent {
    file: String,
    kind: Kind,
    status: u16,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    event_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// Reads and classifies every delivery of `dir`; the first problem is a
/// usage error.
fn load(dir: &Path, args: &ReplayArgs) -> Result<Vec<Delivery>, Failure> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Failure::Usage(format!("directory {}: {e}", dir.display())))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    if paths.is_empty() {
        return Err(Failure::Usage(format!(
            "directory {} holds no *.json deliveries",
            dir.display()
        )));
    }
    let mut out = Vec::new();
    for path in paths {
        let file = path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let body =
            std::fs::read(&path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| Failure::Usage(format!("{}: not JSON: {e}", path.display())))?;
        let kind = Kind::of(&value).ok_or_else(|| {
            Failure::Usage(format!(
                "{}: not a delivery runyard knows (a GitHub workflow_job payload, a GitLab \
                 Job or Pipeline Hook, or a usage report)",
                path.display()
            ))
        })?;
        let (needed, flag) = match kind {
            Kind::GithubWorkflowJob => (
                &args.github_secret,
                "--github-secret / RUNYARD_GITHUB_WEBHOOK_SECRET",
            ),
            Kind::GitlabJobHook | Kind::GitlabPipelineHook => (
                &args.gitlab_token,
                "--gitlab-token / RUNYARD_GITLAB_WEBHOOK_TOKEN",
            ),
            Kind::UsageReport => (&args.usage_token, "--usage-token / RUNYARD_USAGE_TOKEN"),
        };
        if needed.as_deref().is_none_or(str::is_empty) {
            return Err(Failure::Usage(format!(
                "{file} is a {kind:?} delivery: give {flag}"
            )));
        }
        let digest = Sha256::new()
            .chain_update(file.as_bytes())
            .chain_update([0])
            .chain_update(&body)
            .finalize();
        let id = format!("replay-{}", &hex::encode(digest)[..32]);
        out.push(Delivery {
            file,
            kind,
            id,
            body,
        });
    }
    Ok(out)
}

fn github_signature(secret: &str, body: &[u8]) -> Result<String, Failure> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .map_err(|e| Failure::Usage(format!("--github-secret: {e}")))?;
    mac.update(body);
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    args: &ReplayArgs,
    d: &Delivery,
) -> Result<Sent, Failure> {
    let mut req = http
        .post(format!("{base}{}", d.kind.path()))
        .header("content-type", "application/json")
        .body(d.body.clone());
    match d.kind {
        Kind::GithubWorkflowJob => {
            let secret = args.github_secret.as_deref().unwrap_or_default();
            req = req
                .header("x-github-event", "workflow_job")
                .header("x-github-delivery", &d.id)
                .header("x-hub-signature-256", github_signature(secret, &d.body)?);
        }
        Kind::GitlabJobHook | Kind::GitlabPipelineHook => {
            let event = if d.kind == Kind::GitlabJobHook {
                "Job Hook"
            } else {
                "Pipeline Hook"
            };
            req = req
                .header("x-gitlab-event", event)
                .header(
                    "x-gitlab-token",
                    args.gitlab_token.as_deref().unwrap_or_default(),
                )
                .header("idempotency-key", &d.id);
            if let Some(i) = &args.gitlab_instance {
                req = req.header("x-gitlab-instance", i);
            }
        }
        Kind::UsageReport => {
            req = req.bearer_auth(args.usage_token.as_deref().unwrap_or_default());
        }
    }
    let answer = match req.send().await {
        Ok(a) => a,
        Err(e) => {
            return Ok(Sent {
                file: d.file.clone(),
                kind: d.kind,
                status: 0,
                outcome: "failed",
                event_id: None,
                error: Some(if e.is_connect() {
                    format!("nothing answers at {}", redact(base))
                } else {
                    crate::chain(&e.without_url())
                }),
            });
        }
    };
    let status = answer.status();
    let body: Value = answer.json().await.unwrap_or(Value::Null);
    let event_id = body["event_id"].as_str().map(str::to_owned);
    let (outcome, error) = if status.is_success() {
        if body["duplicate"].as_bool() == Some(true) {
            ("duplicate", None)
        } else if body.get("ignored").is_some() {
            ("ignored", None)
        } else {
            ("accepted", None)
        }
    } else {
        let msg = body["error"]
            .as_str()
            .map_or_else(|| body.to_string(), str::to_owned);
        ("failed", Some(msg))
    };
    Ok(Sent {
        file: d.file.clone(),
        kind: d.kind,
        status: status.as_u16(),
        outcome,
        event_id,
        error,
    })
}

/// Runs `runyard replay`.
pub async fn run(global: &Global, args: &ReplayArgs) -> Result<u8, Failure> {
    let deliveries = load(&args.dir, args)?;
    let http = global.http()?;
    let base = global.ingest_url.trim_end_matches('/').to_owned();
    let bar = progress(deliveries.len() as u64, global.json, "replay");
    let mut sent = Vec::with_capacity(deliveries.len());
    for d in &deliveries {
        bar.set_message(d.file.clone());
        sent.push(send(&http, &base, args, d).await?);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let count = |o: &str| sent.iter().filter(|s| s.outcome == o).count();
    let (accepted, duplicate, ignored, failed) = (
        count("accepted"),
        count("duplicate"),
        count("ignored"),
        count("failed"),
    );
    if global.json {
        out_json(&json!({
            "sent": sent.len(),
            "accepted": accepted,
            "duplicate": duplicate,
            "ignored": ignored,
            "failed": failed,
            "deliveries": sent,
        }));
    } else {
        let rows = sent
            .iter()
            .map(|s| {
                vec![
                    s.file.clone(),
                    s.kind.path().to_owned(),
                    if s.status == 0 {
                        "-".to_owned()
                    } else {
                        s.status.to_string()
                    },
                    s.outcome.to_owned(),
                    s.error
                        .clone()
                        .or_else(|| s.event_id.clone())
                        .unwrap_or_default(),
                ]
            })
            .collect();
        let mut text = table(&["file", "to", "status", "outcome", "event / error"], rows);
        text.push_str(&format!(
            "\n{} sent to {}: {accepted} accepted, {duplicate} duplicate, {ignored} ignored, {failed} failed\n",
            sent.len(),
            redact(&base)
        ));
        out(&text);
    }
    Ok(if failed == 0 { EXIT_OK } else { EXIT_FAILED })
}
