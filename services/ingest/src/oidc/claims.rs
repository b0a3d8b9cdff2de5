//! What a verified identity token says of the job that holds it, and the
//! check that a usage report speaks only for that job.
//!
//! GitHub Actions tokens name the job by `check_run_id` (the job id of the
//! `workflow_job` webhook), the repository by `repository` and the ref as
//! `refs/heads/<branch>`, `refs/tags/<tag>` or `refs/pull/<n>/merge`; the
//! run attempt is `run_attempt`. GitLab `id_tokens` name the job by
//! `job_id`, the project by `project_path` and the ref by its short name.
//! Numbers may come as JSON strings (both forges send them so).

use runyard_events::{Forge, UsageIdentity, UsageReported};
use serde_json::{Map, Value};

use super::{Issuer, Refusal};

/// The job a verified token was issued to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub forge: Forge,
    /// The forge instance (host).
    pub instance: String,
    pub job_id: u64,
    /// GitHub's run attempt; GitLab has none (a retry is a new job).
    pub attempt: Option<u32>,
    /// Repository (GitHub) / project path (GitLab).
    pub project: String,
    /// The ref by its short name, as the CI's `GITHUB_REF_NAME` /
    /// `CI_COMMIT_REF_NAME` spell it.
    pub git_ref: String,
    /// `iss`.
    pub issuer: String,
    /// `sub`, when present.
    pub subject: String,
}

/// Reads the identity out of verified `claims` of `issuer`'s token.
pub fn identity(issuer: &Issuer, claims: &Map<String, Value>) -> Result<Identity, Refusal> {
    let text = |name: &'static str| -> Result<String, Refusal> {
        match claims.get(name) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
            _ => Err(Refusal::Claim(name)),
        }
    };
    let number = |name: &'static str| -> Result<u64, Refusal> {
        let n = match claims.get(name) {
            Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        n.filter(|n| *n > 0).ok_or(Refusal::Claim(name))
    };
    let subject = claims
        .get("sub")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let (job_id, attempt, project, git_ref) = match issuer.forge {
        Forge::Github => {
            let attempt =
                u32::try_from(number("run_attempt")?).map_err(|_| Refusal::Claim("run_attempt"))?;
            (
                number("check_run_id")?,
                Some(attempt),
                text("repository")?,
                github_ref_name(&text("ref")?),
            )
        }
        _ => (number("job_id")?, None, text("project_path")?, text("ref")?),
    };
    Ok(Identity {
        forge: issuer.forge,
        instance: issuer.instance.clone(),
        job_id,
        attempt,
        project,
        git_ref,
        issuer: issuer.url.clone(),
        subject,
    })
}

/// GitHub's full ref as `GITHUB_REF_NAME` spells it: `refs/heads/main` →
/// `main`, `refs/tags/v1` → `v1`, `refs/pull/7/merge` → `7/merge`.
fn github_ref_name(full: &str) -> String {
    ["refs/heads/", "refs/tags/", "refs/pull/"]
        .iter()
        .find_map(|p| full.strip_prefix(p))
        .unwrap_or(full)
        .to_owned()
}

/// A report that names another job than its token: the field that
/// disagrees (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The report's field.
    pub field: &'static str,
    /// The claim it disagrees with.
    pub claim: &'static str,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if (self.field, self.claim) == ("attempt", "job_id") {
            return write!(
                f,
                "attempt: must be 1 with a GitLab identity token: a GitLab job id is one attempt \
                 (a retry is a new job id, with a token of its own)"
            );
        }
        write!(
            f,
            "{}: not what the identity token says (claim {}); a report may only speak for the job it was sent from",
            self.field, self.claim
        )
    }
}

/// Checks that `u` is about the job `id` names, then makes the claims the
/// report's identity: `project` and `ref` the token's (a report that left
/// them out gets them), and `identity` says it was verified.
pub fn bind(id: &Identity, u: &mut UsageReported) -> Result<(), Mismatch> {
    let github = id.forge == Forge::Github;
    let (job_claim, project_claim) = if github {
        ("check_run_id", "repository")
    } else {
        ("job_id", "project_path")
    };
    let mismatch = |field, claim| Err(Mismatch { field, claim });
    let Some(key) = u.job.as_ref() else {
        return mismatch("job_id", job_claim);
    };
    if key.forge() != id.forge {
        return mismatch("forge", "iss");
    }
    if key.instance != id.instance {
        return mismatch("instance", "iss");
    }
    if key.job_id != id.job_id {
        return mismatch("job_id", job_claim);
    }
    match id.attempt {
        Some(attempt) if u.attempt != attempt => return mismatch("attempt", "run_attempt"),
        // GitLab's token names no attempt because its job has only one:
        // any other number would let one token file a report per number.
        None if u.attempt != 1 => return mismatch("attempt", "job_id"),
        _ => {}
    }
    if !u.project.is_empty() && u.project != id.project {
        return mismatch("project", project_claim);
    }
    if !u.r#ref.is_empty() && u.r#ref != id.git_ref {
        return mismatch("ref", "ref");
    }
    u.project.clone_from(&id.project);
    u.r#ref.clone_from(&id.git_ref);
    u.identity = Some(UsageIdentity {
        method: "oidc".into(),
        issuer: id.issuer.clone(),
        subject: id.subject.clone(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runyard_events::JobKey;
    use serde_json::json;

    fn issuer(url: &str) -> Issuer {
        super::super::issuer::parse(&format!("{url}=runyard"))
            .expect("issuer")
            .remove(0)
    }

    fn claims(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn github_claims_name_the_job_run_attempt_repository_and_ref() {
        let gh = issuer("https://token.actions.githubusercontent.com");
        let c = claims(json!({
            "iss": gh.url, "sub": "repo:acme/app:pull_request", "repository": "acme/app",
            "ref": "refs/pull/7/merge", "run_attempt": "2", "check_run_id": "21870573124"
        }));
        let id = identity(&gh, &c).expect("identity");
        assert_eq!(
            (
                id.forge,
                id.instance.as_str(),
                id.job_id,
                id.attempt,
                id.project.as_str(),
                id.git_ref.as_str()
            ),
            (
                Forge::Github,
                "github.com",
                21_870_573_124,
                Some(2),
                "acme/app",
                "7/merge"
            )
        );
        let mut without = c.clone();
        without.remove("check_run_id");
        assert_eq!(identity(&gh, &without), Err(Refusal::Claim("check_run_id")));
        assert_eq!(github_ref_name("refs/heads/develop"), "develop");
        assert_eq!(github_ref_name("refs/tags/v1.2"), "v1.2");
    }

    #[test]
    fn gitlab_claims_name_the_job_project_and_ref() {
        let gl = issuer("https://gitlab.example.com");
        let c = claims(json!({
            "iss": gl.url, "project_path": "spack/spack", "ref": "develop", "job_id": 4711
        }));
        let id = identity(&gl, &c).expect("identity");
        assert_eq!(
            (
                id.job_id,
                id.attempt,
                id.project.as_str(),
                id.git_ref.as_str()
            ),
            (4711, None, "spack/spack", "develop")
        );
        for bad in [json!("x"), json!(0), json!(-1), Value::Null] {
            let mut c = c.clone();
            c.insert("job_id".into(), bad);
            assert_eq!(identity(&gl, &c), Err(Refusal::Claim("job_id")));
        }
    }

    #[test]
    fn a_report_may_only_speak_for_its_job() {
        let gl = issuer("https://gitlab.example.com");
        let id = identity(
            &gl,
            &claims(json!({"project_path": "spack/spack", "ref": "feature", "job_id": "4711"})),
        )
        .expect("identity");
        let report = |edit: &dyn Fn(&mut UsageReported)| {
            let mut u = UsageReported {
                job: Some(JobKey {
                    forge: Forge::Gitlab as i32,
                    instance: "gitlab.example.com".into(),
                    job_id: 4711,
                }),
                attempt: 1,
                ..UsageReported::default()
            };
            edit(&mut u);
            bind(&id, &mut u).map(|()| u)
        };
        let bound = report(&|_| {}).expect("bound");
        assert_eq!(
            (bound.project.as_str(), bound.r#ref.as_str()),
            ("spack/spack", "feature")
        );
        assert_eq!(bound.identity.expect("identity").method, "oidc");
        let field = |edit: &dyn Fn(&mut UsageReported)| report(edit).expect_err("refused").field;
        assert_eq!(field(&|u| u.r#ref = "develop".into()), "ref");
        assert_eq!(field(&|u| u.project = "other/project".into()), "project");
        assert_eq!(
            field(&|u| u.job.as_mut().expect("key").job_id = 4712),
            "job_id"
        );
        assert_eq!(
            field(&|u| u.job.as_mut().expect("key").instance = "gitlab.com".into()),
            "instance"
        );
        assert_eq!(
            field(&|u| u.job.as_mut().expect("key").forge = Forge::Github as i32),
            "forge"
        );
        let other_attempt = report(&|u| u.attempt = 2).expect_err("refused");
        assert_eq!(other_attempt.field, "attempt");
        assert!(
            other_attempt.to_string().contains("must be 1"),
            "{other_attempt}"
        );
    }
}
