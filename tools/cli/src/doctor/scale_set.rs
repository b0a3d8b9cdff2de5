//! The doctor's checks of the scaler's `mode = "scale-set"` pools: for each,
//! whether the scaler's GitHub credentials get an admin connection to the
//! Actions service of the pool's scope (`scale_set.<pool>.admin`), and
//! whether the scale set is there with the pool's labels
//! (`scale_set.<pool>.labels`). The credentials are read from the variables
//! the scaler reads, with its precedence (services/scaler `forges()`), so a
//! doctor run in the scaler's environment sees what the scaler will see.
//! Nothing is created: a missing scale set is reported, not made.

use std::path::Path;
use std::time::Duration;

use runyard_events::Forge;
use runyard_forge::api::github::{GitHubAuth, GitHubClient, GitHubScope, endpoint as rest};
use runyard_forge::api::scaleset::{ActionsClient, endpoint as service};
use runyard_forge::api::{ApiError, ClientOptions};
use runyard_scaler_config::{PoolConfig, ScalerFile, Scope};
use secrecy::SecretString;

use super::{Check, fail, ok, skipped};
use crate::{Global, redact};

/// The default of `RUNYARD_GITHUB_API_URL`, as the scaler's.
const DEFAULT_API_URL: &str = "https://api.github.com";

/// The runner group a scale set is in unless `runner_group` names another.
const DEFAULT_RUNNER_GROUP_ID: i64 = 1;

/// The first delay of the Actions client's retries: short, so a doctor
/// run against a service that is down ends within seconds.
const RETRY_BASE: Duration = Duration::from_millis(100);

/// The checks of every scale-set pool of the file at `path`; none when the
/// file has no scale-set pool. A file that cannot be read or is refused is
/// one failed `scaler.config` check.
pub(super) async fn checks(global: &Global, path: &Path) -> Vec<Check> {
    let file = match ScalerFile::load(path) {
        Ok(f) => f,
        Err(e) => {
            return vec![fail(
                "scaler.config",
                format!("the scaler's file {}: {e}", path.display()),
                "fix the file (the scaler refuses to start with it too), or point \
                 --scaler-config / RUNYARD_SCALER_CONFIG at the file the scaler uses",
            )];
        }
    };
    let pools: Vec<&PoolConfig> = file
        .pools
        .iter()
        .filter(|p| p.forge == Forge::Github && p.scale_set().is_some())
        .collect();
    if pools.is_empty() {
        return Vec::new();
    }
    let creds = Credentials::read(&|var| std::env::var(var).ok(), &file);
    let runs = pools.iter().map(|pool| pool_checks(global, &creds, pool));
    futures::future::join_all(runs)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// A personal access token and the variable it came from.
struct Pat {
    token: SecretString,
    var: &'static str,
}

/// A GitHub App's settings.
struct App {
    app_id: u64,
    key: SecretString,
    installation_id: Option<u64>,
}

/// The GitHub credentials the scaler would use.
struct Credentials {
    /// `RUNYARD_GITHUB_API_URL`.
    api_url: String,
    pat: Option<Pat>,
    app: Option<App>,
    /// A setting that could not be read (never its value): every pool's
    /// admin check fails with it.
    problem: Option<(String, String)>,
    /// Half an App (an id without a key, or the other way round), which
    /// the scaler ignores: said when no credential is found.
    half_app: Option<String>,
}

impl Credentials {
    /// Reads the scaler's variables through `env` (an empty value is not
    /// set) and the file's `[github]` section. The scaler's precedence: a
    /// variable over the file; `RUNYARD_GITHUB_TOKEN` over
    /// `RUNYARD_GITHUB_TOKEN_FILE`; an App needs its id and key.
    fn read(env: &dyn Fn(&str) -> Option<String>, file: &ScalerFile) -> Self {
        let env = |var: &str| env(var).filter(|v| !v.trim().is_empty());
        let gh = file.github.clone().unwrap_or_default();
        let mut creds = Self {
            api_url: env("RUNYARD_GITHUB_API_URL").unwrap_or_else(|| DEFAULT_API_URL.into()),
            pat: None,
            app: None,
            problem: None,
            half_app: None,
        };
        let number = |var: &str| -> Result<Option<u64>, (String, String)> {
            env(var)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| {
                        (
                            format!("{var} is not a number"),
                            format!("set {var} to the number GitHub shows for it"),
                        )
                    })
                })
                .transpose()
        };
        let ids = number("RUNYARD_GITHUB_APP_ID")
            .and_then(|a| Ok((a, number("RUNYARD_GITHUB_APP_INSTALLATION_ID")?)));
        let (app_id, installation_id) = match ids {
            Ok((a, i)) => (a.or(gh.app_id), i.or(gh.installation_id)),
            Err(problem) => {
                creds.problem = Some(problem);
                return creds;
            }
        };
        let key_file = match env("RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE") {
            Some(f) => Some((
                std::path::PathBuf::from(f),
                "RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE",
            )),
            None => gh
                .private_key_file
                .map(|f| (f, "[github] private_key_file")),
        };
        match (app_id, key_file) {
            (Some(app_id), Some((path, var))) => {
                match runyard_config::secrets::read_file(var, &path) {
                    Ok(key) => {
                        creds.app = Some(App {
                            app_id,
                            key,
                            installation_id,
                        });
                    }
                    Err(e) => {
                        creds.problem = Some((
                            format!("the GitHub App's private key: {e}"),
                            format!(
                                "point {var} at the App's private key (the PEM file GitHub \
                                 issued), readable by this user"
                            ),
                        ));
                        return creds;
                    }
                }
            }
            (Some(_), None) => {
                creds.half_app = Some(
                    "an App id is set but no private key (RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE \
                     or [github] private_key_file)"
                        .into(),
                );
            }
            (None, Some((_, var))) => {
                creds.half_app = Some(format!(
                    "{var} is set but no App id (RUNYARD_GITHUB_APP_ID or [github] app_id)"
                ));
            }
            (None, None) => {}
        }
        let token = match env("RUNYARD_GITHUB_TOKEN") {
            Some(t) => Some((SecretString::from(t), "RUNYARD_GITHUB_TOKEN")),
            None => match env("RUNYARD_GITHUB_TOKEN_FILE") {
                Some(f) => {
                    let var = "RUNYARD_GITHUB_TOKEN_FILE";
                    match runyard_config::secrets::read_file(var, Path::new(&f)) {
                        Ok(t) => Some((t, var)),
                        Err(e) => {
                            creds.problem = Some((
                                format!("the personal access token: {e}"),
                                format!("point {var} at a file holding the token"),
                            ));
                            return creds;
                        }
                    }
                }
                None => None,
            },
        };
        creds.pat = token
            .filter(|(t, _)| !secrecy::ExposeSecret::expose_secret(t).is_empty())
            .map(|(token, var)| Pat { token, var });
        creds
    }

    /// The credential the scaler uses for `scope`: the App, but the token
    /// for an enterprise (GitHub's enterprise runner endpoints refuse
    /// installation tokens) and when there is no App.
    fn pick(&self, pool: &str, scope: &Scope) -> Result<(GitHubAuth, Using), (String, String)> {
        if let Some(problem) = &self.problem {
            return Err(problem.clone());
        }
        let pat = || {
            self.pat.as_ref().map(|p| {
                (
                    GitHubAuth::Token(p.token.clone()),
                    Using::Pat { var: p.var },
                )
            })
        };
        let app = || {
            self.app.as_ref().map(|a| {
                (
                    GitHubAuth::App {
                        app_id: a.app_id,
                        private_key_pem: a.key.clone(),
                        installation_id: a.installation_id,
                    },
                    Using::App { app_id: a.app_id },
                )
            })
        };
        if scope.enterprise.is_some() {
            return pat().ok_or_else(|| {
                let why = if self.app.is_some() {
                    "only GitHub App credentials are set, and a GitHub App cannot manage \
                     enterprise runners"
                } else {
                    "no GitHub credentials are set"
                };
                (
                    format!("pool {pool:?} is enterprise-scoped and {why}"),
                    "set RUNYARD_GITHUB_TOKEN (or RUNYARD_GITHUB_TOKEN_FILE) to a classic \
                     personal access token with the manage_runners:enterprise scope, as the \
                     scaler has it"
                        .to_owned(),
                )
            });
        }
        app().or_else(pat).ok_or_else(|| {
            let half = self
                .half_app
                .as_ref()
                .map(|h| format!(" ({h})"))
                .unwrap_or_default();
            (
                format!("no GitHub credentials are set{half}: the Actions service cannot be asked"),
                "run the doctor with the scaler's GitHub settings: RUNYARD_GITHUB_TOKEN (or \
                 RUNYARD_GITHUB_TOKEN_FILE) for a personal access token, or \
                 RUNYARD_GITHUB_APP_ID and RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE (or the file's \
                 [github] section) for a GitHub App"
                    .to_owned(),
            )
        })
    }
}

/// Which credential a check used, for its messages (never its value).
#[derive(Debug, Clone, Copy)]
enum Using {
    Pat { var: &'static str },
    App { app_id: u64 },
}

impl std::fmt::Display for Using {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pat { var } => write!(f, "the personal access token of {var}"),
            Self::App { app_id } => write!(f, "GitHub App {app_id}"),
        }
    }
}

/// The scaler's scope of a pool.
fn github_scope(scope: &Scope) -> GitHubScope {
    if let Some(repo) = &scope.repo {
        let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
        GitHubScope::repo(owner, name)
    } else if let Some(org) = &scope.org {
        GitHubScope::Org(org.clone())
    } else {
        GitHubScope::Enterprise(scope.enterprise.clone().unwrap_or_default())
    }
}

/// The URL the registration names: `https://<host>/<org | owner/repo |
/// enterprises/slug>`, as the scaler builds it.
fn config_url(pool: &PoolConfig) -> String {
    let host = pool.instance.as_deref().unwrap_or("github.com");
    let path = match (&pool.scope.repo, &pool.scope.org) {
        (Some(repo), _) => repo.clone(),
        (None, Some(org)) => org.clone(),
        (None, None) => format!(
            "enterprises/{}",
            pool.scope.enterprise.clone().unwrap_or_default()
        ),
    };
    format!("https://{host}/{path}")
}

/// What a credential needs for a scope's scale sets.
fn permissions(scope: &GitHubScope, using: Using) -> String {
    match (scope, using) {
        (GitHubScope::Enterprise(_), _) => "an enterprise scale set needs a classic personal \
            access token with the manage_runners:enterprise scope"
            .to_owned(),
        (GitHubScope::Org(org), Using::Pat { .. }) => format!(
            "the token needs the organization permission \"Self-hosted runners: Read and \
             write\" on {org} (fine-grained token) or the admin:org scope (classic token)"
        ),
        (GitHubScope::Org(org), Using::App { .. }) => format!(
            "the App needs the organization permission \"Self-hosted runners: Read and \
             write\" and must be installed on {org}"
        ),
        (GitHubScope::Repo { owner, repo }, Using::Pat { .. }) => format!(
            "the token needs the repository permission \"Administration: Read and write\" on \
             {owner}/{repo} (fine-grained token) or the repo scope (classic token)"
        ),
        (GitHubScope::Repo { owner, repo }, Using::App { .. }) => format!(
            "the App needs the repository permission \"Administration: Read and write\" (and \
             \"Self-hosted runners: Read and write\") and must be installed on {owner}/{repo}"
        ),
    }
}

/// What the pool's checks know about it.
struct Target<'a> {
    pool: &'a PoolConfig,
    scope: GitHubScope,
    config_url: String,
    api_url: String,
    using: Using,
}

impl Target<'_> {
    fn admin_id(&self) -> String {
        format!("scale_set.{}.admin", self.pool.name)
    }

    fn labels_id(&self) -> String {
        format!("scale_set.{}.labels", self.pool.name)
    }

    /// A failed call, in plain words, with what to do.
    fn failure(&self, e: &ApiError) -> (String, String) {
        let (scope, using, api) = (&self.scope, self.using, redact(&self.api_url));
        let needs = permissions(scope, using);
        match e {
            ApiError::Status {
                status: 401,
                endpoint_kind: rest::INSTALLATION | rest::ACCESS_TOKEN,
                ..
            } => (
                format!("GitHub refused {using}'s credentials ({e})"),
                "RUNYARD_GITHUB_APP_ID and the App's private key \
                 (RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE) must belong to the same App: check both"
                    .to_owned(),
            ),
            ApiError::Status {
                status: 404,
                endpoint_kind: rest::INSTALLATION,
                ..
            } => (
                format!("{using} is not installed on {scope} ({e})"),
                format!(
                    "install the App on {scope}, or set RUNYARD_GITHUB_APP_INSTALLATION_ID to \
                     the installation that covers it; {needs}"
                ),
            ),
            ApiError::Status {
                status: 401,
                endpoint_kind: rest::REGISTRATION_TOKEN,
                ..
            } => (
                format!(
                    "GitHub refused {using} when asked for {scope}'s runner registration \
                     token ({e}): the credential is wrong, expired or revoked"
                ),
                match using {
                    Using::Pat { var } if var.ends_with("_FILE") => format!(
                        "put a valid personal access token in the file {var} names; {needs}"
                    ),
                    Using::Pat { var } => {
                        format!("put a valid personal access token in {var}; {needs}")
                    }
                    Using::App { .. } => {
                        format!("check the App's id, key and installation; {needs}")
                    }
                },
            ),
            ApiError::Status {
                status: 403,
                endpoint_kind: rest::REGISTRATION_TOKEN,
                ..
            } => (
                format!(
                    "GitHub does not let {using} register runners for {scope} ({e}): a \
                     permission is missing"
                ),
                needs,
            ),
            ApiError::Status {
                status: 404,
                endpoint_kind: rest::REGISTRATION_TOKEN,
                ..
            } => (
                format!("GitHub does not know {scope}, or {using} cannot see it ({e})"),
                format!("check the pool's scope (the name as GitHub spells it); {needs}"),
            ),
            ApiError::Status {
                endpoint_kind: service::RUNNER_REGISTRATION,
                ..
            } => (
                format!(
                    "GitHub issued a registration token, but registering {} with the Actions \
                     service ({api}/actions/runner-registration) failed ({e})",
                    self.config_url
                ),
                format!(
                    "the pool's host ({}; `instance` in the pool) must be the GitHub that \
                     RUNYARD_GITHUB_API_URL ({api}) belongs to; {needs}",
                    self.pool.instance.as_deref().unwrap_or("github.com")
                ),
            ),
            ApiError::Status {
                status: 401 | 403, ..
            } => (
                format!("the Actions service refused the admin connection ({e})"),
                needs,
            ),
            ApiError::Transport { .. } => (
                format!(
                    "no answer from GitHub or the Actions service ({}); asked {api}",
                    crate::chain(e)
                ),
                "check RUNYARD_GITHUB_API_URL (https://api.github.com, or \
                 https://HOST/api/v3 for GitHub Enterprise Server) and that this machine \
                 reaches it"
                    .to_owned(),
            ),
            ApiError::RateLimited { .. } => (
                format!("GitHub's rate limit stopped the check ({e})"),
                "run the doctor again once the limit is reset".to_owned(),
            ),
            ApiError::Auth(_) => (
                format!("{using}'s credentials cannot be used ({e})"),
                "point RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE at the App's private key (the PEM \
                 file GitHub issued)"
                    .to_owned(),
            ),
            ApiError::Config(_) => (
                format!("the GitHub client cannot be built ({e})"),
                "give RUNYARD_GITHUB_API_URL as https://api.github.com or \
                 https://HOST/api/v3"
                    .to_owned(),
            ),
            _ => (
                format!("the Actions service for {scope} answered unexpectedly ({e})"),
                "run the doctor again; if it persists, see GitHub's status page and the \
                 scaler's log"
                    .to_owned(),
            ),
        }
    }

    /// Both checks failed at the admin connection.
    fn admin_failed(&self, (detail, fix): (String, String)) -> Vec<Check> {
        vec![
            fail(self.admin_id(), detail, fix),
            skipped(self.labels_id(), "the admin connection failed"),
        ]
    }
}

/// One pool's two checks.
async fn pool_checks(global: &Global, creds: &Credentials, pool: &PoolConfig) -> Vec<Check> {
    let admin_id = format!("scale_set.{}.admin", pool.name);
    let labels_id = format!("scale_set.{}.labels", pool.name);
    let (auth, using) = match creds.pick(&pool.name, &pool.scope) {
        Ok(got) => got,
        Err((detail, fix)) => {
            return vec![
                fail(admin_id, detail, fix),
                skipped(labels_id, "no credentials for the admin connection"),
            ];
        }
    };
    let target = Target {
        pool,
        scope: github_scope(&pool.scope),
        config_url: config_url(pool),
        api_url: creds.api_url.clone(),
        using,
    };
    let timeout = global.timeout();
    let options = ClientOptions::new(timeout).with_max_rate_limit_wait(timeout);
    let client = GitHubClient::with_options(&creds.api_url, auth, &options).and_then(|github| {
        ActionsClient::new(
            github,
            target.scope.clone(),
            &target.config_url,
            &creds.api_url,
            &options,
        )
    });
    let client = match client {
        Ok(c) => c.with_retry_base(RETRY_BASE),
        Err(e) => return target.admin_failed(target.failure(&e)),
    };
    // Bounded as a whole: the client retries each call a few times.
    let bound = timeout * 4;
    match tokio::time::timeout(bound, client.connect()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return target.admin_failed(target.failure(&e)),
        Err(_) => {
            return target.admin_failed((
                format!(
                    "the registration with the Actions service did not end within {bound:?} \
                     (asked {})",
                    redact(&target.api_url)
                ),
                "check RUNYARD_GITHUB_API_URL and that this machine reaches GitHub".to_owned(),
            ));
        }
    }
    let admin = ok(
        target.admin_id(),
        format!(
            "connected to the Actions service for {} ({}) with {using}",
            target.scope, target.config_url
        ),
    );
    let labels = match tokio::time::timeout(bound, scale_set(&target, &client)).await {
        Ok(check) => check,
        Err(_) => fail(
            target.labels_id(),
            format!("the Actions service did not answer within {bound:?}"),
            "run the doctor again; if it persists, see GitHub's status page",
        ),
    };
    vec![admin, labels]
}

/// Whether the pool's scale set is in its runner group with its labels.
async fn scale_set(target: &Target<'_>, client: &ActionsClient) -> Check {
    let pool = target.pool;
    let id = target.labels_id();
    let name = pool.scale_set().unwrap_or(&pool.name);
    let want = pool.scale_set_labels();
    let (group_id, group) = match pool.runner_group.as_deref() {
        None => (
            DEFAULT_RUNNER_GROUP_ID,
            "the default runner group".to_owned(),
        ),
        Some(g) if g.eq_ignore_ascii_case("default") => (
            DEFAULT_RUNNER_GROUP_ID,
            "the default runner group".to_owned(),
        ),
        Some(g) => match client.runner_group_by_name(g).await {
            Ok(Some(found)) => (found.id, format!("runner group {g:?} (id {})", found.id)),
            Ok(None) => {
                return fail(
                    id,
                    format!("there is no runner group named {g:?} in {}", target.scope),
                    format!(
                        "create the runner group on GitHub (Settings → Actions → Runner \
                         groups), or correct runner_group in pool {:?} (without it the scale \
                         set goes to the default group); the scaler does not start the pool \
                         until then",
                        pool.name
                    ),
                );
            }
            Err(e) => {
                let (detail, fix) = target.failure(&e);
                return fail(id, format!("looking up runner group {g:?}: {detail}"), fix);
            }
        },
    };
    let found = match client.scale_set_by_name(group_id, name).await {
        Ok(found) => found,
        Err(e) => {
            let (detail, fix) = target.failure(&e);
            return fail(id, format!("looking up scale set {name:?}: {detail}"), fix);
        }
    };
    let Some(set) = found else {
        return ok(
            id,
            format!(
                "scale set {name:?} does not exist yet in {group}: the scaler creates it at \
                 start with the labels {}",
                want.join(", ")
            ),
        );
    };
    if same_labels(&set.labels, &want) {
        ok(
            id,
            format!(
                "scale set {name:?} (id {}) in {group} has the pool's labels {}",
                set.id,
                want.join(", ")
            ),
        )
    } else {
        fail(
            id,
            format!(
                "scale set {name:?} (id {}) has the labels {} but pool {:?} asks for {}: the \
                 scaler does not start the pool",
                set.id,
                set.labels.join(", "),
                pool.name,
                want.join(", ")
            ),
            format!(
                "the Actions service sets labels only when a scale set is created: delete \
                 scale set {name:?} (the scaler makes it again at its next start) or give the \
                 pool another scale_set_name"
            ),
        )
    }
}

/// Labels compare as the scaler compares them: without case, order or
/// repeats.
fn same_labels(have: &[String], want: &[String]) -> bool {
    let norm = |l: &[String]| {
        let mut v: Vec<String> = l.iter().map(|x| x.to_ascii_lowercase()).collect();
        v.sort();
        v.dedup();
        v
    };
    norm(have) == norm(want)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const FILE: &str = r#"
[providers.local]
kind = "process"
command = ["/bin/true"]

[[pools]]
name = "org-pool"
forge = "github"
mode = "scale-set"
scope = { org = "acme" }
labels = ["linux"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2

[[pools]]
name = "ent-pool"
forge = "github"
mode = "scale-set"
instance = "ghe.example.com"
scope = { enterprise = "big-corp" }
labels = []
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2
"#;

    fn read(vars: &[(&str, &str)], file: &ScalerFile) -> Credentials {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Credentials::read(&|k| vars.get(k).cloned(), file)
    }

    fn used(creds: &Credentials, pool: &PoolConfig) -> Result<String, String> {
        creds
            .pick(&pool.name, &pool.scope)
            .map(|(_, using)| using.to_string())
            .map_err(|(detail, fix)| format!("{detail} / {fix}"))
    }

    #[test]
    fn credentials_follow_the_scalers_precedence() {
        let file = ScalerFile::parse(FILE).unwrap();
        let (org, ent) = (&file.pools[0], &file.pools[1]);
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("app.pem");
        std::fs::write(&key, "-----BEGIN RSA PRIVATE KEY-----\n").unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "ghp_from_file\n").unwrap();
        let key = key.display().to_string();
        let token_file = token_file.display().to_string();

        // Nothing set: the fix names the variables.
        let none = read(&[], &file);
        assert_eq!(none.api_url, "https://api.github.com");
        let why = used(&none, org).unwrap_err();
        assert!(
            why.contains("RUNYARD_GITHUB_TOKEN") && why.contains("RUNYARD_GITHUB_APP_ID"),
            "{why}"
        );
        let why = used(&none, ent).unwrap_err();
        assert!(why.contains("manage_runners:enterprise"), "{why}");
        // An empty variable is not set.
        let empty = read(&[("RUNYARD_GITHUB_TOKEN", "")], &file);
        assert!(used(&empty, org).is_err());

        // The token, from the variable before its file.
        let pat = read(
            &[
                ("RUNYARD_GITHUB_TOKEN", "ghp_direct"),
                ("RUNYARD_GITHUB_TOKEN_FILE", &token_file),
            ],
            &file,
        );
        assert_eq!(
            used(&pat, org).unwrap(),
            "the personal access token of RUNYARD_GITHUB_TOKEN"
        );
        let from_file = read(&[("RUNYARD_GITHUB_TOKEN_FILE", &token_file)], &file);
        assert_eq!(
            used(&from_file, ent).unwrap(),
            "the personal access token of RUNYARD_GITHUB_TOKEN_FILE"
        );
        let Some(Pat { token, .. }) = &from_file.pat else {
            panic!("no token read")
        };
        assert_eq!(secrecy::ExposeSecret::expose_secret(token), "ghp_from_file");

        // With both, the App for the org, the token for the enterprise.
        let both = read(
            &[
                ("RUNYARD_GITHUB_TOKEN", "ghp_direct"),
                ("RUNYARD_GITHUB_APP_ID", "42"),
                ("RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE", &key),
            ],
            &file,
        );
        assert_eq!(used(&both, org).unwrap(), "GitHub App 42");
        assert_eq!(
            used(&both, ent).unwrap(),
            "the personal access token of RUNYARD_GITHUB_TOKEN"
        );
        // The App alone cannot serve the enterprise.
        let app = read(
            &[
                ("RUNYARD_GITHUB_APP_ID", "42"),
                ("RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE", &key),
            ],
            &file,
        );
        let why = used(&app, ent).unwrap_err();
        assert!(
            why.contains("only GitHub App") && why.contains("manage_runners:enterprise"),
            "{why}"
        );
        // Half an App is ignored, as the scaler does, and said.
        let half = read(&[("RUNYARD_GITHUB_APP_ID", "42")], &file);
        let why = used(&half, org).unwrap_err();
        assert!(why.contains("no private key"), "{why}");
        // Unreadable settings are named, never shown.
        let bad = read(&[("RUNYARD_GITHUB_APP_ID", "forty-two")], &file);
        let why = used(&bad, org).unwrap_err();
        assert!(
            why.contains("RUNYARD_GITHUB_APP_ID is not a number"),
            "{why}"
        );
        let missing = read(
            &[
                ("RUNYARD_GITHUB_APP_ID", "42"),
                (
                    "RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE",
                    "/nonexistent/key.pem",
                ),
            ],
            &file,
        );
        let why = used(&missing, org).unwrap_err();
        assert!(
            why.contains("RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE") && why.contains("/nonexistent"),
            "{why}"
        );
    }

    #[test]
    fn config_urls_name_the_host_and_the_scope() {
        let file = ScalerFile::parse(FILE).unwrap();
        assert_eq!(config_url(&file.pools[0]), "https://github.com/acme");
        assert_eq!(
            config_url(&file.pools[1]),
            "https://ghe.example.com/enterprises/big-corp"
        );
    }

    #[test]
    fn labels_compare_without_case_order_or_repeats() {
        let s = |l: &[&str]| l.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        assert!(same_labels(
            &s(&["Big", "linux"]),
            &s(&["linux", "big", "LINUX"])
        ));
        assert!(!same_labels(&s(&["big", "gpu"]), &s(&["big", "linux"])));
    }
}
