//! The credential a report is sent with. A CI identity token binds the
//! report to the job that sends it (ingest takes job, project and ref from
//! its claims), so it comes first: `RUNYARD_ID_TOKEN` as given (GitLab: an
//! `id_tokens` variable the pipeline defines), else on GitHub Actions one
//! requested from `ACTIONS_ID_TOKEN_REQUEST_URL` (the job needs
//! `permissions: id-token: write`), else the shared `RUNYARD_USAGE_TOKEN`.
//! No token is ever logged or put into an error.

use std::time::Duration;

use reqwest::Url;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::Error;

/// GitHub's variables for requesting the job's identity token.
pub const REQUEST_URL_VAR: &str = "ACTIONS_ID_TOKEN_REQUEST_URL";
/// The bearer token of that request.
pub const REQUEST_TOKEN_VAR: &str = "ACTIONS_ID_TOKEN_REQUEST_TOKEN";

/// Where the bearer credential of a report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--id-token` / `RUNYARD_ID_TOKEN`.
    Given,
    /// Requested from GitHub Actions.
    Requested,
    /// The shared usage token.
    Shared,
}

impl Source {
    /// How logs name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Given => "RUNYARD_ID_TOKEN",
            Source::Requested => REQUEST_URL_VAR,
            Source::Shared => "RUNYARD_USAGE_TOKEN",
        }
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    value: SecretString,
}

/// Requests the job's identity token for `audience` from GitHub Actions:
/// `GET <request url>&audience=<audience>` with the request token as the
/// bearer; `None` when the job has no such variables (not GitHub, or no
/// `id-token: write`).
pub async fn request_github_token(
    client: &reqwest::Client,
    env: &impl Fn(&str) -> Option<String>,
    audience: &str,
    timeout: Duration,
) -> Option<Result<SecretString, Error>> {
    let url = env(REQUEST_URL_VAR).filter(|v| !v.trim().is_empty())?;
    let request_token = env(REQUEST_TOKEN_VAR).filter(|v| !v.trim().is_empty())?;
    Some(request(client, &url, &request_token, audience, timeout).await)
}

async fn request(
    client: &reqwest::Client,
    url: &str,
    request_token: &str,
    audience: &str,
    timeout: Duration,
) -> Result<SecretString, Error> {
    let failed = |reason: String| Error::IdTokenRequest { reason };
    let mut url = Url::parse(url.trim())
        .map_err(|e| failed(format!("{REQUEST_URL_VAR} is not a URL: {e}")))?;
    url.query_pairs_mut().append_pair("audience", audience);
    let response = client
        .get(url)
        .bearer_auth(request_token)
        .header(reqwest::header::ACCEPT, "application/json")
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| failed(format!("request failed: {}", e.without_url())))?;
    let status = response.status();
    if !status.is_success() {
        return Err(failed(format!(
            "answered {status} (does the job have `permissions: id-token: write`?)"
        )));
    }
    let answer: TokenAnswer = response
        .json()
        .await
        .map_err(|_| failed("the answer has no token (`value`)".into()))?;
    if answer.value.expose_secret().trim().is_empty() {
        return Err(failed("the answer's token is empty".into()));
    }
    Ok(answer.value)
}
