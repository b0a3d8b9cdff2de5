#!/usr/bin/env bash
# The local stack without Docker: `up` builds runyard, starts a current
# nats-server and the services in the background, and sends sample
# deliveries through them; `down` stops everything; `status` shows it.
#
# State (logs, pids, the JetStream store, the secrets) lives in .runyard/
# (git-ignored). The secrets are random ones scripts/gen-secrets.sh makes on
# the first `up` into .runyard/dev/secrets.env, reused by every later `up`
# (a variable already exported wins; one a newer runyard added is made and
# appended). They include a NATS password per service: nats-server runs
# the shipped accounts and permissions (deploy/nats-auth.conf, adapted to
# RUNYARD_NAMESPACE), each service logs in as its own user, nobody gets in
# without a password. The private PostgreSQL (when no other answers) wants
# RUNYARD_POSTGRES_PASSWORD over TCP. RUNYARD_INSECURE_DEV=1 is set, so the
# services also start with a weak secret you export (each says so in a
# WARN); export RUNYARD_INSECURE_DEV=0 to run the dev stack with the checks
# production has.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

STATE="$RUNYARD_STATE_DIR/dev"
NATS_PORT="${RUNYARD_DEV_NATS_PORT:-4333}"
INGEST_ADDR="${RUNYARD_DEV_INGEST_LISTEN:-127.0.0.1:8080}"
TRACKER_ADDR="${RUNYARD_DEV_TRACKER_LISTEN:-127.0.0.1:8082}"
ALLOC_GRPC="${RUNYARD_DEV_ALLOCATOR_LISTEN:-127.0.0.1:50051}"
ALLOC_HTTP="${RUNYARD_DEV_ALLOCATOR_HTTP_LISTEN:-127.0.0.1:8081}"
SCALER_ADDR="${RUNYARD_DEV_SCALER_LISTEN:-127.0.0.1:8083}"
CONSOLE_ADDR="${RUNYARD_DEV_CONSOLE_LISTEN:-127.0.0.1:8085}"
export RUNYARD_DATABASE_URL="${RUNYARD_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/runyard}"
export RUNYARD_NATS_URL="nats://127.0.0.1:${NATS_PORT}"
export RUNYARD_NAMESPACE="${RUNYARD_NAMESPACE:-runyard}"
SCALER_METADATA_ADDR="${RUNYARD_DEV_SCALER_METADATA_LISTEN:-127.0.0.1:8084}"
export RUNYARD_INSECURE_DEV="${RUNYARD_INSECURE_DEV:-1}"
export RUNYARD_LOG_FORMAT="${RUNYARD_LOG_FORMAT:-json}"
BIN=target/debug

# The dev stack's secrets: made once, kept in $STATE/secrets.env (mode
# 600), exported unless the variable already is.
load_secrets() {
  mkdir -p "$STATE"
  if [[ ! -s "$STATE/secrets.env" ]]; then
    (umask 077 && bash scripts/gen-secrets.sh > "$STATE/secrets.env.new")
    mv "$STATE/secrets.env.new" "$STATE/secrets.env"
    log "made random secrets for the dev stack: $STATE/secrets.env"
  fi
  local name value
  # Secrets added since this file was made (the NATS and Postgres
  # passwords, say): fresh values, appended.
  while IFS='=' read -r name value; do
    grep -q "^${name}=" "$STATE/secrets.env" || echo "$name=$value" >> "$STATE/secrets.env"
  done < <(bash scripts/gen-secrets.sh)
  while IFS='=' read -r name value; do
    [[ -n "$name" && "$name" != \#* ]] || continue
    [[ -n "${!name:-}" ]] || export "$name=$value"
  done < "$STATE/secrets.env"
  export EMBEDDED_POSTGRES_PASSWORD="$RUNYARD_POSTGRES_PASSWORD"
}

# Runs a command logged in to NATS as USER with the password in
# $PASSWORD_VAR (as the deployments do: RUNYARD_NATS_USER and
# RUNYARD_NATS_PASSWORD). The services are started the same way, with
# `env` itself, so that `$!` is the service's own pid (what `down` stops).
as_nats_user() { # USER PASSWORD_VAR COMMAND...
  local user="$1" var="$2"
  shift 2
  env RUNYARD_NATS_USER="$user" RUNYARD_NATS_PASSWORD="${!var}" "$@"
}

# deploy/nats-auth.conf for $RUNYARD_NAMESPACE: its subjects, streams and
# buckets are written for the namespace `runyard`.
nats_auth_for_namespace() {
  local ns="$RUNYARD_NAMESPACE" upper
  upper="$(tr '[:lower:]' '[:upper:]' <<<"$ns")"
  sed -E -e "s/\"runyard\./\"${ns}./g" \
    -e "s/RUNYARD_(EVENTS|RAW|LEASES|CLAIMS|INSTANCES)/${upper}_\1/g" deploy/nats-auth.conf \
    > "$STATE/nats-auth.conf"
  echo "$STATE/nats-auth.conf"
}

# A URL fit to print: its password replaced by ***.
shown() {
  python3 -c '
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
if p.password:
    p = p._replace(netloc=p.netloc.replace(":" + p.password + "@", ":***@"))
print(u.urlunsplit(p))' "$1"
}

running() { [[ -f "$STATE/$1.pid" ]] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

down() {
  for svc in console scaler fake-github allocator job-tracker ingest nats; do
    if running "$svc"; then
      kill "$(cat "$STATE/$svc.pid")" 2>/dev/null || true
      log "stopped $svc"
    fi
    rm -f "$STATE/$svc.pid"
  done
  rm -f "$STATE/stack.env"
  # Runner processes the scaler started (each in its own process group).
  for pidfile in $(find "$STATE/runners" -name '*.pid' 2>/dev/null); do
    kill -- "-$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  # The private PostgreSQL `up` ran when none answered (a no-op otherwise).
  embedded_postgres_stop dev
}

# The console's read-only login (docs/console.md): runyard_console, a
# member of runyard_reader, which every migration grants SELECT on every
# table. Made (or given the dev stack's password again) as the server's
# admin, before the job-tracker migrates.
console_role() {
  local admin
  admin="$(python3 -c '
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
print(u.urlunsplit(p._replace(path="/postgres")))' "$RUNYARD_DATABASE_URL")"
  psql "$admin" -v ON_ERROR_STOP=1 -q -v password="$RUNYARD_POSTGRES_CONSOLE_PASSWORD" \
    -f deploy/postgres/console-role.sql >/dev/null
}

# The console's database URL: the projection's, as runyard_console.
console_database_url() {
  python3 -c '
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
host = p.netloc.rsplit("@", 1)[-1]
print(u.urlunsplit(p._replace(netloc=f"runyard_console:{u.quote(sys.argv[2], safe=str())}@{host}")))' \
    "$RUNYARD_DATABASE_URL" "$RUNYARD_POSTGRES_CONSOLE_PASSWORD"
}

wait_http() {
  for _ in $(seq 1 100); do
    curl -fsS "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$1 did not become ready" >&2
  return 1
}

sign() { # body-file → sha256=<hex>
  python3 -c 'import hmac,hashlib,sys; print("sha256="+hmac.new(sys.argv[1].encode(), open(sys.argv[2],"rb").read(), hashlib.sha256).hexdigest())' \
    "$RUNYARD_GITHUB_WEBHOOK_SECRET" "$1"
}

# The stack's addresses for the CLI (tools/cli/src/stack_env.rs), the
# NATS login of its user (cli) in the URL. Mode 600: it holds secrets.
write_stack_env() {
  (umask 077 && cat > "$STATE/stack.env" <<ENV
# written by scripts/dev.sh up: the addresses of the dev stack
RUNYARD_NATS_URL=nats://cli:${RUNYARD_NATS_CLI_PASSWORD}@127.0.0.1:${NATS_PORT}
RUNYARD_NAMESPACE=${RUNYARD_NAMESPACE}
RUNYARD_DATABASE_URL=${RUNYARD_DATABASE_URL}
RUNYARD_INGEST_URL=http://${INGEST_ADDR}
RUNYARD_TRACKER_URL=http://${TRACKER_ADDR}
RUNYARD_ALLOCATOR_URL=http://${ALLOC_GRPC}
RUNYARD_ALLOCATOR_HTTP_URL=http://${ALLOC_HTTP}
RUNYARD_ALLOCATOR_CLIENT_TOKEN=${RUNYARD_ALLOCATOR_CLIENT_TOKEN}
RUNYARD_SCALER_URL=http://${SCALER_ADDR}
RUNYARD_CONSOLE_URL=http://${CONSOLE_ADDR}
ENV
  )
}

demo() {
  local base="http://${INGEST_ADDR}" fx=libs/forge/tests/fixtures
  log "GitHub workflow_job (queued), signed, delivered twice: the second is a duplicate"
  for _ in 1 2; do
    curl -sS -X POST "$base/webhooks/github" -H 'Content-Type: application/json' \
      -H 'X-GitHub-Event: workflow_job' -H 'X-GitHub-Delivery: 72d3162e-cc78-11e3-81ab-4c9367dc0958' \
      -H "X-Hub-Signature-256: $(sign $fx/github_workflow_job_queued.json)" \
      --data-binary @$fx/github_workflow_job_queued.json -w '  → HTTP %{http_code}\n'
  done
  log "a forged GitHub delivery is refused"
  curl -sS -X POST "$base/webhooks/github" -H 'X-GitHub-Event: workflow_job' \
    -H 'X-GitHub-Delivery: forged' -H 'X-Hub-Signature-256: sha256=00' \
    --data-binary @$fx/github_workflow_job_queued.json -w '  → HTTP %{http_code}\n'
  log "GitLab Pipeline Hook: one pipeline event plus one job event per build"
  curl -sS -X POST "$base/webhooks/gitlab" -H 'Content-Type: application/json' \
    -H 'X-Gitlab-Event: Pipeline Hook' -H "X-Gitlab-Token: $RUNYARD_GITLAB_WEBHOOK_TOKEN" \
    -H 'X-Gitlab-Instance: https://gitlab.example.com' -H "Idempotency-Key: demo-$(date +%s)" \
    --data-binary @$fx/gitlab_pipeline_failed.json -w '  → HTTP %{http_code}\n'
  log "four more finished builds of the same package, each with its Pipeline Hook"
  for i in 1 2 3 4; do
    python3 -c 'import json,sys; h=json.load(open(sys.argv[1])); i=int(sys.argv[2]); b=dict(h["builds"][1]); b.update(id=4711+10*i, status="success", failure_reason=None); h["object_attributes"].update(id=1234+i, status="success", detailed_status="passed"); h["builds"]=[b]; print(json.dumps(h))' \
      $fx/gitlab_pipeline_failed.json "$i" |
      curl -sS -X POST "$base/webhooks/gitlab" -H 'Content-Type: application/json' \
        -H 'X-Gitlab-Event: Pipeline Hook' -H "X-Gitlab-Token: $RUNYARD_GITLAB_WEBHOOK_TOKEN" \
        -H 'X-Gitlab-Instance: https://gitlab.example.com' -H "Idempotency-Key: demo-$i-$(date +%s)" \
        --data-binary @- -w '  → HTTP %{http_code}\n'
  done
  log "usage reports from the five builds (what runyard-report posts)"
  for i in 0 1 2 3 4; do
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); i=int(sys.argv[2]); r["job_id"]+=10*i; r["peak_memory_bytes"]=int(r["peak_memory_bytes"]*(1+0.04*i)); print(json.dumps(r))' \
      $fx/usage_report.json "$i" |
      curl -sS -X POST "$base/v1/usage" -H 'Content-Type: application/json' \
        -H "Authorization: Bearer $RUNYARD_USAGE_TOKEN" --data-binary @- -w '  → HTTP %{http_code}\n'
  done
  log "the event log now holds (runyard events tail):"
  as_nats_user cli RUNYARD_NATS_CLI_PASSWORD "$BIN/runyard" events tail
  log "job-tracker projected it into Postgres ($(shown "$RUNYARD_DATABASE_URL")): runyard jobs"
  for _ in $(seq 1 50); do
    [[ "$(psql "$RUNYARD_DATABASE_URL" -Atqc 'SELECT count(*) FROM usage_samples' 2>/dev/null)" -ge 5 ]] && break
    sleep 0.2
  done
  "$BIN/runyard" jobs
  log "the scaler made a runner for the queued job: runyard pools, runyard runners"
  for _ in $(seq 1 50); do
    curl -fsS "http://${SCALER_ADDR}/v1/pools" | grep -q '"actual":1' && break
    sleep 0.2
  done
  "$BIN/runyard" pools
  for _ in $(seq 1 50); do
    [[ "$(psql "$RUNYARD_DATABASE_URL" -Atqc 'SELECT count(*) FROM runners' 2>/dev/null)" -ge 1 ]] && break
    sleep 0.2
  done
  "$BIN/runyard" runners
  log "the allocator's answer for that workload (gantry-compatible HTTP; gRPC on ${ALLOC_GRPC}):"
  local spec='py-torch@2.3.1 +cuda~rocm %gcc@12.3.0'
  echo "GET /v1/allocation?spec=${spec}"
  curl -sS -G "http://${ALLOC_HTTP}/v1/allocation" --data-urlencode "spec=${spec}" \
    -H "Authorization: Bearer $RUNYARD_ALLOCATOR_CLIENT_TOKEN" -w '\n'
  log "what it came to (runyard savings --before-memory 16GiB: each build had a 16 GiB runner before):"
  "$BIN/runyard" savings --before-memory 16GiB
  local console="http://${CONSOLE_ADDR}" page code
  log "the console's pages (read-only; a browser signs in with RUNYARD_CONSOLE_TOKENS from $STATE/secrets.env):"
  echo "  without a token: $console/queue → HTTP $(curl -s -o /dev/null -w '%{http_code}' "$console/queue")"
  for page in /queue /pools /jobs/github/github.com/21870573124 '/search?q=py-torch' '/savings?since=30d'; do
    code="$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer ${RUNYARD_CONSOLE_TOKENS%%,*}" "$console$page")"
    echo "  $console$page → HTTP $code"
    [[ "$code" == 200 ]] || { echo "the console did not answer $page (log: $STATE/console.log)" >&2; return 1; }
  done
}

up() {
  mkdir -p "$STATE"
  load_secrets
  log "building runyard"
  cargo build --quiet --bin runyard-ingest --bin runyard --bin runyard-job-tracker --bin runyard-allocator \
    --bin runyard-scaler --bin runyard-fake-github --bin runyard-console
  if ! running nats; then
    start_nats "$NATS_PORT" "$STATE/nats" "$(nats_auth_for_namespace)"
    echo "$NATS_PID" > "$STATE/nats.pid"
    log "nats-server on $RUNYARD_NATS_URL (a user per service, passwords in $STATE/secrets.env)"
  fi
  if ! running ingest; then
    RUNYARD_INGEST_LISTEN="$INGEST_ADDR" env RUNYARD_NATS_USER=ingest \
      RUNYARD_NATS_PASSWORD="$RUNYARD_NATS_INGEST_PASSWORD" "$BIN/runyard-ingest" > "$STATE/ingest.log" 2>&1 &
    echo $! > "$STATE/ingest.pid"
    wait_http "http://${INGEST_ADDR}/readyz"
    log "runyard-ingest on http://${INGEST_ADDR} (log: $STATE/ingest.log)"
  fi
  ensure_postgres RUNYARD_DATABASE_URL dev
  # Before the job-tracker migrates: it grants runyard_reader SELECT on
  # every table when that role exists.
  console_role
  if ! running job-tracker; then
    RUNYARD_TRACKER_HTTP_LISTEN="$TRACKER_ADDR" env RUNYARD_NATS_USER=job-tracker \
      RUNYARD_NATS_PASSWORD="$RUNYARD_NATS_TRACKER_PASSWORD" "$BIN/runyard-job-tracker" > "$STATE/job-tracker.log" 2>&1 &
    echo $! > "$STATE/job-tracker.pid"
    wait_http "http://${TRACKER_ADDR}/readyz"
    log "runyard-job-tracker projecting into $(shown "$RUNYARD_DATABASE_URL") (log: $STATE/job-tracker.log)"
  fi
  if ! running allocator; then
    RUNYARD_ALLOCATOR_LISTEN="$ALLOC_GRPC" RUNYARD_ALLOCATOR_HTTP_LISTEN="$ALLOC_HTTP" \
      env RUNYARD_NATS_USER=allocator RUNYARD_NATS_PASSWORD="$RUNYARD_NATS_ALLOCATOR_PASSWORD" \
      "$BIN/runyard-allocator" > "$STATE/allocator.log" 2>&1 &
    echo $! > "$STATE/allocator.pid"
    wait_http "http://${ALLOC_HTTP}/readyz"
    log "runyard-allocator on grpc://${ALLOC_GRPC} and http://${ALLOC_HTTP} (log: $STATE/allocator.log)"
  fi
  if [[ -z "${RUNYARD_GITHUB_TOKEN:-}" ]]; then
    if ! running fake-github; then
      "$BIN/runyard-fake-github" > "$STATE/fake-github.url" 2> "$STATE/fake-github.log" &
      echo $! > "$STATE/fake-github.pid"
      for _ in $(seq 1 50); do [[ -s "$STATE/fake-github.url" ]] && break; sleep 0.1; done
      log "no RUNYARD_GITHUB_TOKEN: runyard-fake-github stands in for GitHub's API on $(head -1 "$STATE/fake-github.url")"
    fi
    export RUNYARD_GITHUB_API_URL="$(head -1 "$STATE/fake-github.url")" RUNYARD_GITHUB_TOKEN=dev-token
  fi
  if ! running scaler; then
    # A pool matching the sample job; each runner is a local process.
    cat > "$STATE/scaler.toml" <<TOML
[providers.local]
kind = "process"
command = ["/bin/sleep", "3600"]

[[pools]]
name = "linux-x64"
forge = "github"
scope = { org = "octo-org" }
labels = ["self-hosted", "linux", "x64", "gpu"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }, { name = "large", memory = "16GiB", cpus = 8 }]
max_runners = 5

[scaler]
state_dir = "$STATE/runners"
TOML
    RUNYARD_SCALER_HTTP_LISTEN="$SCALER_ADDR" RUNYARD_SCALER_CONFIG="$STATE/scaler.toml" \
      RUNYARD_SCALER_METADATA_LISTEN="$SCALER_METADATA_ADDR" \
      RUNYARD_SCALER_METADATA_URL="http://${SCALER_METADATA_ADDR}" \
      RUNYARD_ALLOCATOR_URL="http://${ALLOC_GRPC}" env RUNYARD_NATS_USER=scaler \
      RUNYARD_NATS_PASSWORD="$RUNYARD_NATS_SCALER_PASSWORD" "$BIN/runyard-scaler" > "$STATE/scaler.log" 2>&1 &
    echo $! > "$STATE/scaler.pid"
    wait_http "http://${SCALER_ADDR}/readyz"
    log "runyard-scaler on http://${SCALER_ADDR} (pools: $STATE/scaler.toml; log: $STATE/scaler.log)"
  fi
  if ! running console; then
    RUNYARD_CONSOLE_LISTEN="$CONSOLE_ADDR" RUNYARD_DATABASE_URL="$(console_database_url)" \
      RUNYARD_SCALER_URL="http://${SCALER_ADDR}" RUNYARD_ALLOCATOR_URL="http://${ALLOC_GRPC}" \
      RUNYARD_CONSOLE_BEFORE_MEMORY=16GiB "$BIN/runyard-console" > "$STATE/console.log" 2>&1 &
    echo $! > "$STATE/console.pid"
    wait_http "http://${CONSOLE_ADDR}/readyz"
    log "runyard-console on http://${CONSOLE_ADDR} (log: $STATE/console.log)"
  fi
  write_stack_env
  demo
  log "secrets: $STATE/secrets.env"
  log "the stack's addresses, which target/debug/runyard reads from here down (flags and variables still win): $STATE/stack.env"
  [[ "$STATE/stack.env" == "$(pwd)/.runyard/dev/stack.env" ]] ||
    log "this state directory is not the default: export RUNYARD_STACK_ENV=$STATE/stack.env"
  log "try: target/debug/runyard doctor"
  log "the console: http://${CONSOLE_ADDR}/queue (sign in with RUNYARD_CONSOLE_TOKENS from $STATE/secrets.env)"
  log "stack is up; stop it with: bash scripts/dev.sh down"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  demo) load_secrets && ensure_postgres RUNYARD_DATABASE_URL dev && write_stack_env && demo ;;
  status) for s in nats ingest job-tracker allocator fake-github scaler console; do running "$s" && echo "$s running" || echo "$s stopped"; done ;;
  *) echo "usage: $0 [up|down|demo|status]" >&2; exit 2 ;;
esac
