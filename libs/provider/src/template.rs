//! runyard's default runner install templates, handed to `external`
//! providers base64-encoded as the pool's `extra_specs.runner_install_template`
//! unless the pool sets its own.
//!
//! They are Go `text/template`s: garm's providers render them with garm's
//! install parameters (`CallbackURL`, `MetadataURL`, `CallbackToken`,
//! `RunnerName`, `DownloadURL`, `FileName`, `TempDownloadToken`,
//! `RunnerUsername`, `RunnerGroup`, picked by the provider from the bootstrap
//! JSON and its `tools`) and run the result on the new machine as the
//! runner user. Only plain `{{ .Field }}` actions are used. Each value is
//! put into a single-quoted bash word: none of them (URLs, the instance
//! token, names, a download token) holds a `'`.
//!
//! Windows pools get none: garm's providers then use their own Windows
//! template, which talks to the same metadata API.
//!
//! The scripts are the `.sh` files in `templates/`, read in at build time:
//! the GitHub template is its parameters, the shared callbacks
//! ([`SHELL_CALLBACKS`]) and its install steps, in that order.

use base64::Engine as _;
use runyard_events::Forge;

/// The shell functions every install script and template shares: `SUDO`,
/// `report <status> <message> [agent id]` (the status callback; never
/// fatal), `installing <message>`, `fail <message>` (reports and exits) and
/// `fetch <path under the metadata URL> <file>`. The script sets
/// `CALLBACK_URL`, `METADATA_URL` and `BEARER_TOKEN` before it.
pub const SHELL_CALLBACKS: &str = include_str!("../templates/callbacks.sh");

/// GitHub runners on Linux: reports every step on the callback API,
/// installs the runner build the provider picked from the runner downloads
/// (unless the image has one), fetches the runner's just-in-time files and
/// its systemd unit from the metadata API with the instance token, and
/// starts the runner as a service.
pub const GITHUB_LINUX: &str = concat!(
    include_str!("../templates/github-linux-params.sh"),
    include_str!("../templates/callbacks.sh"),
    include_str!("../templates/github-linux-install.sh"),
);

/// GitLab runners on Linux: the runner is not GitHub's, so the template
/// fetches the instance's own install script from the metadata API
/// (`install-script`, which registers `gitlab-runner` with the runner token)
/// and runs it.
pub const GITLAB_LINUX: &str = include_str!("../templates/gitlab-linux.sh");

/// The default template for a pool of `forge` on `os_type`, if runyard
/// has one.
pub fn default_for(forge: Forge, os_type: &str) -> Option<&'static str> {
    match (forge, os_type) {
        (Forge::Gitlab, "linux") => Some(GITLAB_LINUX),
        (_, "linux") => Some(GITHUB_LINUX),
        _ => None,
    }
}

/// `extra_specs` with `runner_install_template` set to the default
/// template (base64), unless it has one already, is not a JSON object, or
/// there is no default for the pool.
pub fn with_default(
    extra_specs: &serde_json::Value,
    forge: Forge,
    os_type: &str,
) -> serde_json::Value {
    let mut specs = extra_specs.clone();
    if specs.is_null() {
        specs = serde_json::json!({});
    }
    if let (Some(map), Some(tpl)) = (specs.as_object_mut(), default_for(forge, os_type))
        && !map.contains_key("runner_install_template")
    {
        map.insert(
            "runner_install_template".into(),
            base64::engine::general_purpose::STANDARD.encode(tpl).into(),
        );
    }
    specs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields garm's install parameters have.
    const FIELDS: &[&str] = &[
        "FileName",
        "DownloadURL",
        "RunnerUsername",
        "RunnerGroup",
        "RepoURL",
        "MetadataURL",
        "RunnerName",
        "RunnerLabels",
        "CallbackURL",
        "CallbackToken",
        "TempDownloadToken",
        "CABundle",
        "GitHubRunnerGroup",
        "EnableBootDebug",
        "ExtraContext",
        "UseJITConfig",
    ];

    /// Renders the plain `{{ .Field }}` actions the templates use, failing
    /// on anything else.
    fn render(tpl: &str) -> String {
        let mut out = String::new();
        let mut rest = tpl;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let end = rest[start..].find("}}").expect("closed action") + start;
            let action = rest[start + 2..end].trim();
            let field = action.strip_prefix('.').expect("a field action");
            assert!(FIELDS.contains(&field), "unknown field {field}");
            out.push_str(&format!("value-of-{field}"));
            rest = &rest[end + 2..];
        }
        // A `}}` outside an action is text to Go's templates.
        out.push_str(rest);
        out
    }

    #[test]
    fn the_templates_render_to_valid_bash() {
        for tpl in [GITHUB_LINUX, GITLAB_LINUX] {
            let script = render(tpl);
            let out = std::process::Command::new("bash")
                .args(["-n", "-c", &script])
                .output()
                .expect("bash");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn a_pool_template_is_kept() {
        let own = serde_json::json!({"runner_install_template": "eA==", "x": 1});
        assert_eq!(with_default(&own, Forge::Github, "linux"), own);
        let none = with_default(&serde_json::Value::Null, Forge::Github, "linux");
        assert!(none["runner_install_template"].is_string());
        assert!(
            with_default(&serde_json::json!({}), Forge::Github, "windows")
                .get("runner_install_template")
                .is_none()
        );
    }
}
