//! What the metadata API hands an instance to set itself up with: the
//! runner's systemd service name and unit file, and a bash install script of
//! runyard's own (served on `install-script/`) that fetches the runner's
//! files from the metadata API with the instance's token and reports its
//! progress on the callback API.
//!
//! Every value put into a script is single-quoted for bash; every value put
//! into a unit file or a service name is limited to characters that need no
//! quoting there.

use runyard_events::Forge;

use super::InstanceSecrets;

/// `s` as one bash word: single-quoted, with `'` written as `'\''`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The host and path segments of an `https://host/a/b` URL.
fn host_and_path(url: &str) -> (&str, Vec<&str>) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let mut parts = rest.split('/');
    let host = parts.next().unwrap_or_default();
    (host, parts.filter(|p| !p.is_empty()).collect())
}

/// `scheme://host[:port]` of a URL (`https://` when it names no scheme).
pub fn origin(url: &str) -> String {
    let scheme = url.split_once("://").map_or("https", |(s, _)| s);
    let (host, _) = host_and_path(url);
    format!("{scheme}://{host}")
}

/// Characters a systemd unit name and an unquoted shell word both take.
fn unit_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The runner's systemd service name (without `.service`), laid out as
/// garm does for GitHub: `actions.runner.<org>` for an organization,
/// `actions.runner.<owner>.<repo>` for a repository,
/// `actions.runner.<enterprise>` for an enterprise and
/// `actions.runner.<host>` for a forge-wide runner. GitLab runners get
/// `runyard-gitlab-runner`.
pub fn service_name(secrets: &InstanceSecrets) -> String {
    if secrets.forge == Forge::Gitlab {
        return "runyard-gitlab-runner".into();
    }
    let (host, path) = host_and_path(&secrets.repo_url);
    let owner = match path.as_slice() {
        ["enterprises", e, ..] => (*e).to_owned(),
        [owner, repo, ..] => format!("{owner}.{repo}"),
        [org] => (*org).to_owned(),
        [] => host.to_owned(),
    };
    format!("actions.runner.{}", unit_safe(&owner))
}

/// A user name fit for a unit file and a home directory path
/// (`[a-z_][a-z0-9_-]*`, at most 32 characters, as `useradd` takes them).
pub fn valid_user(user: &str) -> bool {
    let mut chars = user.chars();
    user.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// The user runners run as when the instance does not say (garm's).
pub const DEFAULT_USER: &str = "runner";

/// How long (seconds) a GitLab runner waits for its job before its process
/// ends: a day, far past any idle timeout, so that only a runner the
/// scaler lost track of ever reaches it (it then stops asking GitLab for
/// work instead of holding a live token forever).
pub const GITLAB_WAIT_TIMEOUT_SECS: u64 = 86_400;

/// The runner's systemd unit, running as `user` (checked with
/// [`valid_user`]) from `/home/<user>/actions-runner` (GitHub, where
/// garm's install templates put the runner) or `/home/<user>/gitlab-runner`.
///
/// A GitLab runner runs `gitlab-runner run-single --max-builds 1`: one job,
/// then the process ends (a `gitlab-runner run` service would go on taking
/// jobs, and its registration would be deleted under a running one). Its
/// URL, token and name come from `runner.env` (the token is never on a
/// command line), and the unit does not restart it.
pub fn unit_file(secrets: &InstanceSecrets, user: &str) -> String {
    let service = service_name(secrets);
    if secrets.forge == Forge::Gitlab {
        let home = format!("/home/{user}/gitlab-runner");
        return format!(
            "[Unit]\n\
             Description=GitLab Runner ({service})\n\
             After=network-online.target\n\
             Wants=network-online.target\n\
             \n\
             [Service]\n\
             Type=simple\n\
             EnvironmentFile={home}/runner.env\n\
             ExecStart={home}/gitlab-runner run-single --executor shell --builds-dir {home}/builds --max-builds 1 --wait-timeout {GITLAB_WAIT_TIMEOUT_SECS}\n\
             Restart=no\n\
             User={user}\n\
             WorkingDirectory={home}\n\
             KillMode=process\n\
             KillSignal=SIGTERM\n\
             TimeoutStopSec=5min\n\
             \n\
             [Install]\n\
             WantedBy=multi-user.target\n"
        );
    }
    let home = format!("/home/{user}/actions-runner");
    format!(
        "[Unit]\n\
         Description=GitHub Actions Runner ({service})\n\
         After=network.target\n\
         \n\
         [Service]\n\
         ExecStart={home}/runsvc.sh\n\
         User={user}\n\
         WorkingDirectory={home}\n\
         KillMode=process\n\
         KillSignal=SIGTERM\n\
         TimeoutStopSec=5min\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// Shell functions every install script has after the shared callbacks
/// (`runyard_provider::template::SHELL_CALLBACKS`): system info, the runner
/// service.
const PRELUDE: &str = r#"
RUN_USER="${RUNYARD_RUN_USER:-$(id -un)}"

# system_info: what the instance runs, for the scaler's log.
system_info() {
	local os_name="" os_version=""
	if [ -r /etc/os-release ]; then
		os_name=$(. /etc/os-release && echo "${NAME:-}")
		os_version=$(. /etc/os-release && echo "${VERSION_ID:-}")
	fi
	curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s -X POST \
		-H 'Accept: application/json' -H "Authorization: Bearer ${BEARER_TOKEN}" \
		-d "{\"os_name\": \"${os_name//\"/}\", \"os_version\": \"${os_version//\"/}\", \"agent_id\": null}" \
		"${CALLBACK_URL}/system-info/" >/dev/null || true
}


# install_service: the runner's systemd unit, from the metadata API, started.
install_service() {
	local service
	service="$(curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s \
		-H "Authorization: Bearer ${BEARER_TOKEN}" "${METADATA_URL}/system/service-name/")" \
		|| fail "fetching the service name failed"
	service="${service}.service"
	fetch "systemd/unit-file/?runAsUser=${RUN_USER}" "/tmp/${service}" \
		|| fail "fetching the systemd unit failed"
	$SUDO mv "/tmp/${service}" "/etc/systemd/system/${service}" || fail "installing the systemd unit failed"
	$SUDO chown root:root "/etc/systemd/system/${service}" || fail "installing the systemd unit failed"
	if [ -e /sys/fs/selinux ]; then
		$SUDO chcon -h system_u:object_r:systemd_unit_file_t:s0 "/etc/systemd/system/${service}" || true
	fi
	$SUDO systemctl daemon-reload || fail "reloading systemd failed"
	$SUDO systemctl enable --now "${service}" || fail "starting the runner service failed"
}
"#;

/// GitHub: the runner application (unless the image has it), the JIT files,
/// the service.
const GITHUB: &str = r#"
RUN_HOME="/home/${RUN_USER}/actions-runner"

runner_arch() {
	case "$(uname -m)" in
		x86_64|amd64) echo x64 ;;
		aarch64|arm64) echo arm64 ;;
		armv7l|armv6l) echo arm ;;
		*) return 1 ;;
	esac
}

mkdir -p "${RUN_HOME}" 2>/dev/null || $SUDO mkdir -p "${RUN_HOME}" || fail "creating the runner directory failed"
if [ ! -x "${RUN_HOME}/bin/Runner.Listener" ]; then
	installing "downloading the runner"
	ARCH="$(runner_arch)" || fail "unsupported architecture"
	VERSION="${RUNYARD_RUNNER_VERSION:-}"
	if [ -z "${VERSION}" ]; then
		VERSION="$(curl --retry 5 --retry-delay 5 --fail -sL https://api.github.com/repos/actions/runner/releases/latest \
			| sed -n 's/.*"tag_name": *"v\([^"]*\)".*/\1/p' | head -n 1)"
	fi
	[ -n "${VERSION}" ] || fail "cannot tell the runner version to download"
	TARBALL="$(mktemp)"
	curl --retry 5 --retry-delay 5 --retry-connrefused --fail -sL -o "${TARBALL}" \
		"https://github.com/actions/runner/releases/download/v${VERSION}/actions-runner-linux-${ARCH}-${VERSION}.tar.gz" \
		|| fail "downloading the runner failed"
	installing "extracting the runner"
	$SUDO tar xzf "${TARBALL}" -C "${RUN_HOME}" || fail "extracting the runner failed"
	rm -f "${TARBALL}"
	installing "installing the runner's dependencies"
	$SUDO "${RUN_HOME}/bin/installdependencies.sh" >/dev/null 2>&1 || installing "installing dependencies failed; going on"
else
	installing "using the runner found in ${RUN_HOME}"
fi

installing "fetching the runner's JIT configuration"
TMP_FILES="$(mktemp -d)"
fetch credentials/runner "${TMP_FILES}/.runner" || fail "fetching .runner failed"
fetch credentials/credentials "${TMP_FILES}/.credentials" || fail "fetching .credentials failed"
fetch credentials/credentials_rsaparams "${TMP_FILES}/.credentials_rsaparams" || fail "fetching .credentials_rsaparams failed"
$SUDO cp "${TMP_FILES}/.runner" "${TMP_FILES}/.credentials" "${TMP_FILES}/.credentials_rsaparams" "${RUN_HOME}/" || fail "writing the JIT configuration failed"
rm -rf "${TMP_FILES}"
$SUDO cp "${RUN_HOME}/bin/runsvc.sh" "${RUN_HOME}/runsvc.sh" || fail "copying runsvc.sh failed"
$SUDO chown -R "${RUN_USER}:" "${RUN_HOME}" || fail "changing the runner's owner failed"
$SUDO chmod 600 "${RUN_HOME}/.credentials" "${RUN_HOME}/.credentials_rsaparams" || true

installing "starting the runner service"
install_service
system_info
report idle "runner installed"
"#;

/// GitLab: `gitlab-runner` (unless the image has it), its URL, token and
/// name (the token from `runner-registration-token/`) in `runner.env`, and
/// the unit that runs it once (`run-single --max-builds 1`).
const GITLAB: &str = r#"
RUN_HOME="/home/${RUN_USER}/gitlab-runner"

runner_arch() {
	case "$(uname -m)" in
		x86_64|amd64) echo amd64 ;;
		aarch64|arm64) echo arm64 ;;
		armv7l|armv6l) echo arm ;;
		*) return 1 ;;
	esac
}

mkdir -p "${RUN_HOME}" 2>/dev/null || $SUDO mkdir -p "${RUN_HOME}" || fail "creating the runner directory failed"
if [ ! -x "${RUN_HOME}/gitlab-runner" ]; then
	if command -v gitlab-runner >/dev/null 2>&1; then
		$SUDO cp "$(command -v gitlab-runner)" "${RUN_HOME}/gitlab-runner" || fail "copying gitlab-runner failed"
	else
		installing "downloading gitlab-runner"
		ARCH="$(runner_arch)" || fail "unsupported architecture"
		$SUDO curl --retry 5 --retry-delay 5 --retry-connrefused --fail -sL -o "${RUN_HOME}/gitlab-runner" \
			"https://gitlab-runner-downloads.s3.amazonaws.com/${RUNYARD_GITLAB_RUNNER_VERSION:-latest}/binaries/gitlab-runner-linux-${ARCH}" \
			|| fail "downloading gitlab-runner failed"
	fi
	$SUDO chmod 755 "${RUN_HOME}/gitlab-runner" || fail "making gitlab-runner executable failed"
fi

installing "writing the runner's settings"
RUNNER_TOKEN="$(curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s \
	-H "Authorization: Bearer ${BEARER_TOKEN}" "${METADATA_URL}/runner-registration-token/")" \
	|| fail "fetching the runner token failed"
case "${RUNNER_TOKEN}" in
	*[!A-Za-z0-9._-]*|"") fail "the runner token has unexpected characters" ;;
esac
# What gitlab-runner run-single reads (CI_SERVER_URL, CI_SERVER_TOKEN,
# RUNNER_NAME): in a file only the runner's user reads, not on its
# command line.
ENV_FILE="$(mktemp)"
chmod 600 "${ENV_FILE}"
printf 'CI_SERVER_URL=%s\nCI_SERVER_TOKEN=%s\nRUNNER_NAME=%s\n' "${FORGE_URL}" "${RUNNER_TOKEN}" "${RUNNER_NAME}" >"${ENV_FILE}"
unset RUNNER_TOKEN
$SUDO mv "${ENV_FILE}" "${RUN_HOME}/runner.env" || fail "writing the runner's settings failed"
$SUDO mkdir -p "${RUN_HOME}/builds" || fail "creating the builds directory failed"
$SUDO chown -R "${RUN_USER}:" "${RUN_HOME}" || fail "changing the runner's owner failed"
$SUDO chmod 600 "${RUN_HOME}/runner.env" || fail "protecting the runner's settings failed"

installing "starting the runner service"
install_service
system_info
report idle "runner installed"
"#;

/// The install script for the instance `secrets` describe, calling back on
/// `callback_url` and `metadata_url` with `token`.
pub fn install_script(
    secrets: &InstanceSecrets,
    callback_url: &str,
    metadata_url: &str,
    token: &str,
) -> String {
    let gitlab = secrets.forge == Forge::Gitlab;
    let forge_url = if gitlab {
        origin(&secrets.repo_url)
    } else {
        secrets.repo_url.clone()
    };
    let mut out = format!(
        "#!/bin/bash\n\
         # Installs runner {name} of runyard pool {pool}. Served by the runyard\n\
         # scaler's instance metadata API to this instance only; it reports its\n\
         # progress on the callback API. RUNYARD_RUN_USER, RUNYARD_RUNNER_VERSION\n\
         # and RUNYARD_GITLAB_RUNNER_VERSION, when set, override the defaults.\n\
         set -eu -o pipefail\n\
         \n\
         CALLBACK_URL={callback}\n\
         METADATA_URL={metadata}\n\
         BEARER_TOKEN={token}\n\
         RUNNER_NAME={name_q}\n\
         FORGE_URL={forge_url}\n\
         RUNNER_LABELS={labels}\n",
        name = unit_safe(&secrets.name),
        pool = unit_safe(&secrets.pool),
        callback = sh_quote(callback_url.trim_end_matches('/')),
        metadata = sh_quote(metadata_url.trim_end_matches('/')),
        token = sh_quote(token),
        name_q = sh_quote(&secrets.name),
        forge_url = sh_quote(&forge_url),
        labels = sh_quote(&secrets.labels.join(",")),
    );
    out.push('\n');
    out.push_str(runyard_provider::template::SHELL_CALLBACKS);
    out.push_str(PRELUDE);
    out.push_str(if gitlab { GITLAB } else { GITHUB });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(forge: Forge, repo_url: &str) -> InstanceSecrets {
        InstanceSecrets {
            name: "ry-linux-0123456789".into(),
            pool: "linux".into(),
            forge,
            jit_config: "secret".into(),
            repo_url: repo_url.into(),
            labels: vec!["self-hosted".into(), "it's".into()],
            runner_group: String::new(),
            nonce: String::new(),
        }
    }

    #[test]
    fn service_names_follow_the_scope() {
        let name = |url: &str| service_name(&secrets(Forge::Github, url));
        assert_eq!(name("https://github.com/acme"), "actions.runner.acme");
        assert_eq!(
            name("https://github.com/acme/app"),
            "actions.runner.acme.app"
        );
        assert_eq!(
            name("https://ghe.example.com/enterprises/big"),
            "actions.runner.big"
        );
        assert_eq!(name("https://github.com"), "actions.runner.github.com");
        assert_eq!(name("https://github.com/a b;rm"), "actions.runner.a-b-rm");
        assert_eq!(
            service_name(&secrets(Forge::Gitlab, "https://gitlab.example.com")),
            "runyard-gitlab-runner"
        );
    }

    #[test]
    fn values_are_quoted_for_bash() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
        let script = install_script(
            &secrets(Forge::Github, "https://github.com/acme"),
            "http://s:8084/api/v1/callbacks/",
            "http://s:8084/api/v1/metadata",
            "tok",
        );
        assert!(script.starts_with("#!/bin/bash\n"));
        assert!(script.contains("CALLBACK_URL='http://s:8084/api/v1/callbacks'\n"));
        assert!(script.contains("BEARER_TOKEN='tok'\n"));
        assert!(script.contains(r"RUNNER_LABELS='self-hosted,it'\''s'"));
        assert!(script.contains("credentials/credentials_rsaparams"));
        assert!(
            !script.contains("secret"),
            "the JIT config is fetched, not embedded"
        );
    }

    #[test]
    fn gitlab_scripts_register_against_the_instance() {
        let script = install_script(
            &secrets(
                Forge::Gitlab,
                "https://gitlab.example.com:8443/group/project",
            ),
            "http://s/api/v1/callbacks",
            "http://s/api/v1/metadata",
            "tok",
        );
        assert!(script.contains("FORGE_URL='https://gitlab.example.com:8443'\n"));
        assert!(script.contains("runner-registration-token/"));
        assert!(!script.contains("credentials/runner"));
        assert!(script.contains("CI_SERVER_TOKEN=%s"));
        assert!(script.contains("install_service"));
        assert!(
            !script.contains("gitlab-runner\" register"),
            "nothing registers a service-mode runner"
        );
    }

    #[test]
    fn gitlab_units_run_one_job_and_stop() {
        let unit = unit_file(&secrets(Forge::Gitlab, "https://gitlab.example.com"), "ci");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("ExecStart");
        let argv: Vec<&str> = exec.split_whitespace().collect();
        assert_eq!(
            argv[..2],
            ["/home/ci/gitlab-runner/gitlab-runner", "run-single"]
        );
        let flag = |name: &str| {
            argv.iter()
                .position(|a| *a == name)
                .and_then(|i| argv.get(i + 1))
                .copied()
        };
        assert_eq!(flag("--max-builds"), Some("1"));
        assert_eq!(flag("--wait-timeout"), Some("86400"));
        assert_eq!(flag("--executor"), Some("shell"));
        assert!(unit.contains("EnvironmentFile=/home/ci/gitlab-runner/runner.env\n"));
        assert!(unit.contains("Restart=no\n"));
        assert!(
            !unit.contains("glrt") && !unit.contains("secret"),
            "no token in the unit"
        );
    }

    #[test]
    fn the_scripts_are_valid_bash() {
        for forge in [Forge::Github, Forge::Gitlab] {
            let script = install_script(
                &secrets(forge, "https://example.com/acme"),
                "http://s/api/v1/callbacks",
                "http://s/api/v1/metadata",
                "a.b.c",
            );
            let out = std::process::Command::new("bash")
                .args(["-n", "-c", &script])
                .output()
                .expect("bash");
            assert!(
                out.status.success(),
                "{forge:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    #[test]
    fn users_are_checked() {
        assert!(valid_user("runner"));
        assert!(valid_user("_ci-user1"));
        assert!(!valid_user(""));
        assert!(!valid_user("Runner"));
        assert!(!valid_user("a/../b"));
        assert!(!valid_user("a\nExecStart=/bin/sh"));
        assert!(!valid_user(&"a".repeat(33)));
        let unit = unit_file(&secrets(Forge::Github, "https://github.com/acme"), "runner");
        assert!(unit.contains("ExecStart=/home/runner/actions-runner/runsvc.sh\n"));
        assert!(unit.contains("User=runner\n"));
    }
}
