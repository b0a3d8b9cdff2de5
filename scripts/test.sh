#!/usr/bin/env bash
# The test command (README.md): installs what the tests need (a current
# nats-server; a running Postgres, a private one when none answers;
# Debian's Chromium and ChromeDriver for the console's page tests), starts
# a throwaway nats-server with JetStream, runs every test (each in its own namespace / database), and
# tears everything down. A run of the whole workspace first fails on a
# declared dependency no crate uses (scripts/check-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

# The whole workspace, unless the arguments name packages (-p/--package).
scope=(--workspace)
for a in "$@"; do
  case "$a" in -p | --package | -p* | --package=*) scope=() ;; esac
done
if [[ ${#scope[@]} -gt 0 ]]; then
  log "checking for unused dependencies"
  bash scripts/check-deps.sh
fi

export RUNYARD_TEST_DATABASE_URL="${RUNYARD_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
# No server there: a private one under .runyard/postgres/test, stopped at
# the end if this run started it.
EMBEDDED_POSTGRES_STARTED=""
ensure_postgres RUNYARD_TEST_DATABASE_URL test
# Test databases are named runyard_t_<run>_<id>, <run> being the pid of the
# test.sh that made them: a run drops its own at exit, and at start those of
# runs no longer alive (and unnamed ones), never another live run's.
export RUNYARD_TEST_RUN="$$"
drop_test_databases() {
  local only="${1:-}"
  psql "$RUNYARD_TEST_DATABASE_URL" -Atqc "SELECT datname FROM pg_database WHERE datname LIKE 'runyard\_t\_%'" 2>/dev/null |
    while read -r db; do
      run="$(sed -nE 's/^runyard_t_([0-9]+)_.*/\1/p' <<<"$db")"
      if [[ -n "$only" ]]; then
        [[ "$run" == "$only" ]] || continue
      elif [[ -n "$run" ]] && kill -0 "$run" 2>/dev/null; then
        continue
      fi
      psql "$RUNYARD_TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
    done
}
drop_test_databases

dir="$(mktemp -d "${TMPDIR:-/tmp}/runyard-test.XXXXXX")"
port="$(free_port)"
start_nats "$port" "$dir"
cleanup() {
  kill "$NATS_PID" 2>/dev/null || true
  wait "$NATS_PID" 2>/dev/null || true
  rm -rf "$dir"
  drop_test_databases "$RUNYARD_TEST_RUN"
  if [[ -n "$EMBEDDED_POSTGRES_STARTED" ]]; then embedded_postgres_stop test; fi
}
trap cleanup EXIT

ensure_chromium
log "$("$RUNYARD_TEST_CHROMIUM" --version 2>/dev/null) for the console's page tests"

export RUNYARD_TEST_NATS_URL="nats://127.0.0.1:${port}"
export RUNYARD_TEST_NATS_SERVER="$(nats_server_bin)"
log "nats-server $("$RUNYARD_TEST_NATS_SERVER" --version) on ${RUNYARD_TEST_NATS_URL}"

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run "${scope[@]}" --no-fail-fast "$@"
else
  cargo test "${scope[@]}" --no-fail-fast "$@"
fi
