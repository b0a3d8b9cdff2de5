#!/bin/bash
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
