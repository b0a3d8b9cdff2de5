#!/usr/bin/env bash
# Prints fresh random values for every secret runyard's operator chooses
# (docs/operations.md, "Secrets"), one KEY=value a line:
#
#   bash scripts/gen-secrets.sh > .env        # docker compose reads .env
#   bash scripts/gen-secrets.sh deploy/k8s/base/secrets.env.example \
#     > deploy/k8s/base/secrets.env           # then fill in what it leaves
#
# With a template (an env file), the template is printed with a fresh value
# for each of those secrets it names; every other line (the database URL,
# the forge's credentials, comments) is left for the operator to fill in.
# Each value is 32 random bytes in hex, what `openssl rand -hex 32` makes.
# RUNYARD_ALLOCATOR_CLIENT_TOKEN gets the value of RUNYARD_ALLOCATOR_TOKENS:
# the scaler presents the token the allocator accepts. The NATS passwords
# are `n` and the hex (nats-server needs them to start with a letter).
set -euo pipefail

# The operator-chosen secrets: the services refuse weak ones of their own
# at start; the NATS users' passwords (deploy/nats-auth.conf) and the
# Postgres passwords (docker-compose.yml's postgres: its superuser's, and
# the console's read-only login, deploy/postgres/console-role.sql) are
# checked by NATS and Postgres.
CHOSEN=(
  RUNYARD_GITHUB_WEBHOOK_SECRET
  RUNYARD_GITLAB_WEBHOOK_TOKEN
  RUNYARD_USAGE_TOKEN
  RUNYARD_SCALER_INSTANCE_TOKEN_KEY
  RUNYARD_ALLOCATOR_TOKENS
  RUNYARD_ALLOCATOR_CLIENT_TOKEN
  RUNYARD_CONSOLE_TOKENS
  RUNYARD_NATS_INGEST_PASSWORD
  RUNYARD_NATS_TRACKER_PASSWORD
  RUNYARD_NATS_ALLOCATOR_PASSWORD
  RUNYARD_NATS_SCALER_PASSWORD
  RUNYARD_NATS_CLI_PASSWORD
  RUNYARD_POSTGRES_PASSWORD
  RUNYARD_POSTGRES_CONSOLE_PASSWORD
)

random_hex() {
  if command -v openssl > /dev/null 2>&1; then
    openssl rand -hex 32
  else
    python3 -c 'import secrets; print(secrets.token_hex(32))'
  fi
}

allocator_token="$(random_hex)"
value_of() {
  case "$1" in
    RUNYARD_ALLOCATOR_TOKENS | RUNYARD_ALLOCATOR_CLIENT_TOKEN) echo "$allocator_token" ;;
    # nats-server reads a password variable as a configuration value: one
    # starting with a digit is taken for a number and the server refuses
    # its configuration. A letter first keeps it a string.
    RUNYARD_NATS_*_PASSWORD) echo "n$(random_hex)" ;;
    *) random_hex ;;
  esac
}

chosen() {
  local name
  for name in "${CHOSEN[@]}"; do [[ "$1" == "$name" ]] && return 0; done
  return 1
}

if [[ $# -eq 0 ]]; then
  for name in "${CHOSEN[@]}"; do echo "$name=$(value_of "$name")"; done
  exit 0
fi
if [[ $# -ne 1 || ! -f "$1" ]]; then
  echo "usage: $0 [TEMPLATE]  (TEMPLATE: an env file such as deploy/k8s/base/secrets.env.example)" >&2
  exit 2
fi
while IFS= read -r line || [[ -n "$line" ]]; do
  name="${line%%=*}"
  if [[ "$line" == *=* ]] && chosen "$name"; then
    echo "$name=$(value_of "$name")"
  else
    echo "$line"
  fi
done < "$1"
