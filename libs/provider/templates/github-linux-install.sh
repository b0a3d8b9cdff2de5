
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
