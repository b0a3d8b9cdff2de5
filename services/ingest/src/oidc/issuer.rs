//! `RUNYARD_USAGE_OIDC`: the CI identity token issuers usage reports are
//! accepted from, each with the audience its tokens must carry.

use runyard_events::Forge;

/// The variable the issuers are configured in, for messages.
pub const VAR: &str = "RUNYARD_USAGE_OIDC";

/// The variable that lists the projects each issuer's tokens may report
/// for.
pub const PROJECTS_VAR: &str = "RUNYARD_USAGE_OIDC_PROJECTS";

/// Issuers whose tokens any user of the forge can get (GitHub.com's Actions
/// issuer, GitLab.com): they must be given a project list.
const SHARED_ISSUERS: &[&str] = &[
    "https://token.actions.githubusercontent.com",
    "https://gitlab.com",
];

/// GitHub.com's Actions token issuer host; GitHub Enterprise Cloud's
/// per-enterprise issuers (`.../<enterprise>`) share it.
const GITHUB_ACTIONS_HOST: &str = "token.actions.githubusercontent.com";

/// The path of a GitHub Enterprise Server's Actions token issuer
/// (`https://HOST/_services/token`).
const GHES_TOKEN_PATH: &str = "/_services/token";

/// One accepted issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issuer {
    /// The issuer URL exactly as tokens carry it in `iss` (no trailing `/`).
    pub url: String,
    /// The `aud` its tokens must carry.
    pub audience: String,
    /// Which forge's claims its tokens carry: decided by the issuer's
    /// shape, since a token of one issuer can only speak for that forge.
    pub forge: Forge,
    /// The forge instance a verified report is about: `github.com` for
    /// GitHub's cloud issuer, else the issuer's host.
    pub instance: String,
    /// `RUNYARD_USAGE_OIDC_PROJECTS` entries of this issuer, lower-cased:
    /// `group/project`, or `group/*` for a namespace and everything below
    /// it; empty = every project of the instance.
    pub projects: Vec<String>,
}

impl Issuer {
    /// Whether its tokens may report for `project` (`owner/repo`, a GitLab
    /// `project_path`), compared case-insensitively.
    pub fn allows(&self, project: &str) -> bool {
        let project = project.to_ascii_lowercase();
        self.projects.is_empty()
            || self.projects.iter().any(|p| match p.strip_suffix("/*") {
                Some(ns) => project
                    .strip_prefix(ns)
                    .is_some_and(|rest| rest.starts_with('/')),
                None => *p == project,
            })
    }
}

/// Reads `RUNYARD_USAGE_OIDC_PROJECTS` into `issuers`: comma-separated
/// `issuer=project` entries (an issuer may be named several times), a
/// project being `group/project` or `group/*`. Every entry must name an
/// issuer of `RUNYARD_USAGE_OIDC`; a shared issuer (GitHub.com's Actions
/// issuer, GitLab.com) must have at least one, since any user of the forge
/// can get its tokens.
pub fn restrict(issuers: &mut [Issuer], list: &str) -> Result<(), String> {
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (url, project) = item
            .rsplit_once('=')
            .ok_or_else(|| format!("{PROJECTS_VAR}: {item:?} is not issuer=project"))?;
        let url = url.trim().trim_end_matches('/');
        let project = project.trim().trim_matches('/').to_ascii_lowercase();
        let namespace = project.strip_suffix("/*").unwrap_or(&project);
        let plausible = !namespace.is_empty()
            && !namespace.contains('*')
            && namespace.split('/').all(|part| !part.is_empty())
            && (project.ends_with("/*") || project.contains('/'));
        if !plausible {
            return Err(format!(
                "{PROJECTS_VAR}: {project:?} (issuer {url}) is neither group/project nor group/*"
            ));
        }
        let issuer = issuers
            .iter_mut()
            .find(|i| i.url == url)
            .ok_or_else(|| format!("{PROJECTS_VAR}: issuer {url} is not one of {VAR}"))?;
        issuer.projects.push(project);
    }
    if let Some(open) = issuers
        .iter()
        .find(|i| i.projects.is_empty() && SHARED_ISSUERS.contains(&i.url.as_str()))
    {
        return Err(format!(
            "{PROJECTS_VAR}: issuer {} gives tokens to every user of the forge; \
             list the projects (group/project or group/*) whose reports are accepted",
            open.url
        ));
    }
    Ok(())
}

/// Parses `RUNYARD_USAGE_OIDC`: comma-separated `issuer=audience` pairs,
/// e.g. `https://token.actions.githubusercontent.com=runyard,https://gitlab.example.com=runyard`.
/// An issuer is `https://` (plain `http://` only on a loopback host, for a
/// test issuer), without query or fragment; the audience is everything
/// after the first `=`. Empty → no issuer (OIDC off).
pub fn parse(list: &str) -> Result<Vec<Issuer>, String> {
    let mut issuers: Vec<Issuer> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (url, audience) = item
            .split_once('=')
            .ok_or_else(|| format!("{VAR}: {item:?} is not issuer=audience"))?;
        let url = url.trim().trim_end_matches('/').to_owned();
        let audience = audience.trim().to_owned();
        if audience.is_empty() {
            return Err(format!("{VAR}: issuer {url} has an empty audience"));
        }
        let (scheme, host, path) =
            split_url(&url).ok_or_else(|| format!("{VAR}: {url:?} is not an issuer URL"))?;
        if !(scheme == "https" || scheme == "http" && is_loopback(&host)) {
            return Err(format!(
                "{VAR}: issuer {url} must be https (http only on a loopback host)"
            ));
        }
        if issuers.iter().any(|i| i.url == url) {
            return Err(format!("{VAR}: issuer {url} is listed twice"));
        }
        let (forge, instance) = if host == GITHUB_ACTIONS_HOST {
            (Forge::Github, runyard_forge::GITHUB_DOT_COM.to_owned())
        } else if path == GHES_TOKEN_PATH {
            (Forge::Github, host)
        } else {
            (Forge::Gitlab, host)
        };
        issuers.push(Issuer {
            url,
            audience,
            forge,
            instance,
            projects: Vec::new(),
        });
    }
    Ok(issuers)
}

/// `(scheme, lower-cased host without port, path)` of an absolute URL
/// without query, fragment or credentials.
pub(crate) fn split_url(url: &str) -> Option<(String, String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    if rest.contains(['?', '#', '@']) {
        return None;
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let host = if let Some(v6) = authority.strip_prefix('[') {
        format!("[{}]", v6.split(']').next()?)
    } else {
        authority.split(':').next()?.to_owned()
    };
    let host = host.to_ascii_lowercase();
    let plausible = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'[' | b']' | b':'));
    plausible.then(|| (scheme.to_ascii_lowercase(), host, path.to_owned()))
}

pub(crate) fn is_loopback(host: &str) -> bool {
    host == "localhost" || host == "[::1]" || host.starts_with("127.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issuers_name_their_forge_and_instance() {
        let got = parse(
            " https://token.actions.githubusercontent.com=runyard ,
              https://ghe.example.com/_services/token=ry,
              https://GitLab.example.com:8443/=aud=with=equals",
        )
        .expect("valid");
        let view: Vec<_> = got
            .iter()
            .map(|i| {
                (
                    i.url.as_str(),
                    i.audience.as_str(),
                    i.forge,
                    i.instance.as_str(),
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                (
                    "https://token.actions.githubusercontent.com",
                    "runyard",
                    Forge::Github,
                    "github.com"
                ),
                (
                    "https://ghe.example.com/_services/token",
                    "ry",
                    Forge::Github,
                    "ghe.example.com"
                ),
                (
                    "https://GitLab.example.com:8443",
                    "aud=with=equals",
                    Forge::Gitlab,
                    "gitlab.example.com"
                ),
            ]
        );
        assert_eq!(parse("").expect("empty"), []);
        assert_eq!(
            parse("http://127.0.0.1:9/_services/token=a").expect("loopback")[0].instance,
            "127.0.0.1"
        );
    }

    #[test]
    fn project_lists_restrict_their_issuer() {
        let mut issuers =
            parse("https://gitlab.com=ry,https://gitlab.example.com=ry").expect("valid");
        restrict(
            &mut issuers,
            "https://gitlab.com=Spack/*, https://gitlab.com/=acme/app",
        )
        .expect("valid");
        let (com, own) = (&issuers[0], &issuers[1]);
        assert!(com.allows("spack/spack") && com.allows("spack/ci/packages"));
        assert!(com.allows("ACME/app"));
        assert!(!com.allows("spack") && !com.allows("spackish/spack"));
        assert!(!com.allows("acme/app2") && !com.allows("evil/spack"));
        assert!(own.allows("anyone/anything"), "no list: the whole instance");
        for (list, needle) in [
            (
                "https://gitlab.com=acme",
                "neither group/project nor group/*",
            ),
            ("https://gitlab.com=*", "neither"),
            ("https://gitlab.com=a//b", "neither"),
            ("acme/app", "not issuer=project"),
            (
                "https://other.example=acme/app",
                "not one of RUNYARD_USAGE_OIDC",
            ),
        ] {
            let mut issuers = parse("https://gitlab.com=ry").expect("valid");
            let e = restrict(&mut issuers, list).expect_err(list);
            assert!(
                e.starts_with(PROJECTS_VAR) && e.contains(needle),
                "{list}: {e}"
            );
        }
        for shared in [
            "https://gitlab.com",
            "https://token.actions.githubusercontent.com",
        ] {
            let mut issuers = parse(&format!("{shared}=ry")).expect("valid");
            let e = restrict(&mut issuers, "").expect_err(shared);
            assert!(e.contains("every user of the forge"), "{e}");
        }
        let mut own = parse("https://gitlab.example.com=ry").expect("valid");
        assert_eq!(restrict(&mut own, ""), Ok(()));
    }

    #[test]
    fn bad_lists_name_the_variable_and_the_entry() {
        for (list, needle) in [
            ("https://gitlab.com", "not issuer=audience"),
            ("https://gitlab.com=", "empty audience"),
            ("http://gitlab.com=a", "must be https"),
            ("gitlab.com=a", "not an issuer URL"),
            ("https://gitlab.com?x=1=a", "not an issuer URL"),
            ("https://gitlab.com=a,https://gitlab.com/=b", "listed twice"),
        ] {
            let e = parse(list).expect_err(list);
            assert!(e.starts_with(VAR) && e.contains(needle), "{list}: {e}");
        }
    }
}
