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

use base64::Engine as _;

/// The shell functions every install script and template shares (a string
/// literal, so it can be `concat!`ed into constant scripts): `SUDO`,
/// `report <status> <message> [agent id]` (the status callback; never
/// fatal), `installing <message>`, `fail <message>` (reports and exits) and
/// `fetch <path under the metadata URL> <file>`. The script sets
/// `CALLBACK_URL`, `METADATA_URL` and `BEARER_TOKEN` before it.
#[macro_export]
macro_rules! shell_callbacks {
    () => {
        r#"SUDO=""
[ "$(id -u)" = "0" ] || SUDO="sudo"

# report <status> <message> [agent id]: the status callback (never fatal).
report() {
	curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s -X POST \
		-H 'Accept: application/json' -H "Authorization: Bearer ${BEARER_TOKEN}" \
		-d "{\"status\": \"$1\", \"message\": \"$2\", \"agent_id\": ${3:-null}}" \
		"${CALLBACK_URL}/status" >/dev/null || echo "runyard: status callback failed" >&2
}

installing() {
	report installing "$1"
}

fail() {
	report failed "$1"
	exit 1
}

# fetch <path under the metadata URL> <file>
fetch() {
	curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s \
		-H "Authorization: Bearer ${BEARER_TOKEN}" -o "$2" "${METADATA_URL}/$1"
}
"#
    };
}

/// GitHub runners on Linux: reports every step on the callback API,
/// installs the runner build the provider picked from the runner downloads
/// (unless the image has one), fetches the runner's just-in-time files and
/// its systemd unit from the metadata API with the instance token, and
/// starts the runner as a service.
pub const GITHUB_LINUX: &str = concat!(
    r#"#!/bin/bash
# runyard's default runner install template (GitHub, Linux). The provider
# renders it and runs it on the new machine as the runner user.
set -eu -o pipefail

CALLBACK_URL='{{ .CallbackURL }}'
METADATA_URL='{{ .MetadataURL }}'
BEARER_TOKEN='{{ .CallbackToken }}'
RUNNER_NAME='{{ .RunnerName }}'
DOWNLOAD_URL='{{ .DownloadURL }}'
DOWNLOAD_TOKEN='{{ .TempDownloadToken }}'
ARCHIVE_NAME='{{ .FileName }}'
RUN_USER='{{ .RunnerUsername }}'
RUN_GROUP='{{ .RunnerGroup }}'
RUN_HOME="/home/${RUN_USER}/actions-runner"

# The callback base, whether the URL was given with /status or without.
CALLBACK_URL="${CALLBACK_URL%/}"
CALLBACK_URL="${CALLBACK_URL%/status}"
METADATA_URL="${METADATA_URL%/}"

"#,
    crate::shell_callbacks!(),
    r#"
if [ -z "${METADATA_URL}" ]; then
	echo "runyard: no metadata URL; cannot configure the runner" >&2
	exit 1
fi

if [ ! -x "${RUN_HOME}/bin/Runner.Listener" ]; then
	[ -n "${DOWNLOAD_URL}" ] || fail "no runner download for this machine"
	installing "downloading the runner (${ARCHIVE_NAME})"
	ARCHIVE="$(mktemp)"
	if [ -n "${DOWNLOAD_TOKEN}" ]; then
		curl --retry 5 --retry-delay 5 --retry-connrefused --fail -sL \
			-H "Authorization: Bearer ${DOWNLOAD_TOKEN}" -o "${ARCHIVE}" "${DOWNLOAD_URL}" \
			|| fail "downloading the runner failed"
	else
		curl --retry 5 --retry-delay 5 --retry-connrefused --fail -sL \
			-o "${ARCHIVE}" "${DOWNLOAD_URL}" || fail "downloading the runner failed"
	fi
	installing "extracting the runner"
	$SUDO mkdir -p "${RUN_HOME}" || fail "creating the runner directory failed"
	$SUDO tar xzf "${ARCHIVE}" -C "${RUN_HOME}" || fail "extracting the runner failed"
	rm -f "${ARCHIVE}"
	installing "installing the runner's dependencies"
	TRIES=0
	until $SUDO "${RUN_HOME}/bin/installdependencies.sh" >/dev/null 2>&1; do
		TRIES=$((TRIES + 1))
		[ "${TRIES}" -lt 5 ] || fail "installing the runner's dependencies failed ${TRIES} times"
		installing "installing the runner's dependencies failed (try ${TRIES}); again in 15s"
		sleep 15
	done
else
	installing "using the runner found in ${RUN_HOME}"
fi

installing "fetching the runner's just-in-time configuration"
FILES="$(mktemp -d)"
fetch credentials/runner "${FILES}/.runner" || fail "fetching .runner failed"
fetch credentials/credentials "${FILES}/.credentials" || fail "fetching .credentials failed"
fetch credentials/credentials_rsaparams "${FILES}/.credentials_rsaparams" \
	|| fail "fetching .credentials_rsaparams failed"
SERVICE="$(curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s \
	-H "Authorization: Bearer ${BEARER_TOKEN}" "${METADATA_URL}/system/service-name")" \
	|| fail "fetching the service name failed"
SERVICE="${SERVICE}.service"
fetch "systemd/unit-file?runAsUser=${RUN_USER}" "${FILES}/${SERVICE}" \
	|| fail "fetching the systemd unit failed"

installing "installing the runner service"
$SUDO cp "${FILES}/.runner" "${FILES}/.credentials" "${FILES}/.credentials_rsaparams" "${RUN_HOME}/" \
	|| fail "writing the just-in-time configuration failed"
$SUDO mv "${FILES}/${SERVICE}" "/etc/systemd/system/${SERVICE}" || fail "installing the systemd unit failed"
$SUDO chown root:root "/etc/systemd/system/${SERVICE}" || fail "installing the systemd unit failed"
if [ -e /sys/fs/selinux ]; then
	$SUDO chcon -h system_u:object_r:systemd_unit_file_t:s0 "/etc/systemd/system/${SERVICE}" || true
fi
rm -rf "${FILES}"
$SUDO cp "${RUN_HOME}/bin/runsvc.sh" "${RUN_HOME}/runsvc.sh" || fail "copying runsvc.sh failed"
$SUDO chown -R "${RUN_USER}:${RUN_GROUP}" "${RUN_HOME}" || fail "changing the runner's owner failed"
$SUDO chmod 600 "${RUN_HOME}/.credentials" "${RUN_HOME}/.credentials_rsaparams" || true

installing "starting the runner service"
$SUDO systemctl daemon-reload || fail "reloading systemd failed"
$SUDO systemctl enable --now "${SERVICE}" || fail "starting the runner service failed"

AGENT_ID="$(grep -o '"agentId": *[0-9]*' "${RUN_HOME}/.runner" 2>/dev/null | tr -dc '0-9' || true)"
OS_NAME=""
OS_VERSION=""
if [ -r /etc/os-release ]; then
	OS_NAME="$(. /etc/os-release && echo "${NAME:-}")"
	OS_VERSION="$(. /etc/os-release && echo "${VERSION_ID:-}")"
fi
curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s -X POST \
	-H 'Accept: application/json' -H "Authorization: Bearer ${BEARER_TOKEN}" \
	-d "{\"os_name\": \"${OS_NAME//\"/}\", \"os_version\": \"${OS_VERSION//\"/}\", \"agent_id\": ${AGENT_ID:-null}}" \
	"${CALLBACK_URL}/system-info/" >/dev/null || true
report idle "runner ${RUNNER_NAME} installed" "${AGENT_ID:-null}"
"#,
);

/// GitLab runners on Linux: the runner is not GitHub's, so the template
/// fetches the instance's own install script from the metadata API
/// (`install-script`, which registers `gitlab-runner` with the runner token)
/// and runs it.
pub const GITLAB_LINUX: &str = r#"#!/bin/bash
# runyard's default runner install template (GitLab, Linux): runs the
# install script runyard's metadata API has for this instance.
set -eu -o pipefail

CALLBACK_URL='{{ .CallbackURL }}'
METADATA_URL='{{ .MetadataURL }}'
BEARER_TOKEN='{{ .CallbackToken }}'

CALLBACK_URL="${CALLBACK_URL%/}"
CALLBACK_URL="${CALLBACK_URL%/status}"
METADATA_URL="${METADATA_URL%/}"

fail() {
	curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s -X POST \
		-H 'Accept: application/json' -H "Authorization: Bearer ${BEARER_TOKEN}" \
		-d "{\"status\": \"failed\", \"message\": \"$1\"}" \
		"${CALLBACK_URL}/status" >/dev/null || true
	exit 1
}

SCRIPT="$(mktemp)"
curl --retry 5 --retry-delay 5 --retry-connrefused --fail -s \
	-H "Authorization: Bearer ${BEARER_TOKEN}" -o "${SCRIPT}" "${METADATA_URL}/install-script/" \
	|| fail "fetching the install script failed"
STATUS=0
bash "${SCRIPT}" || STATUS=$?
rm -f "${SCRIPT}"
exit "${STATUS}"
"#;

/// The default template for a pool of `forge` (`github`, `gitlab`) on
/// `os_type`, if runyard has one.
pub fn default_for(forge: &str, os_type: &str) -> Option<&'static str> {
    match (forge, os_type) {
        ("gitlab", "linux") => Some(GITLAB_LINUX),
        (_, "linux") => Some(GITHUB_LINUX),
        _ => None,
    }
}

/// `extra_specs` with `runner_install_template` set to the default
/// template (base64), unless it has one already, is not a JSON object, or
/// there is no default for the pool.
pub fn with_default(
    extra_specs: &serde_json::Value,
    forge: &str,
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
        assert_eq!(with_default(&own, "github", "linux"), own);
        let none = with_default(&serde_json::Value::Null, "github", "linux");
        assert!(none["runner_install_template"].is_string());
        assert!(
            with_default(&serde_json::json!({}), "github", "windows")
                .get("runner_install_template")
                .is_none()
        );
    }
}
