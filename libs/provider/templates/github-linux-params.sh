#!/bin/bash
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

