#!/usr/bin/env bash
# The test command (README.md): installs what the tests need, starts a
# throwaway nats-server with JetStream, runs every test, and tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

dir="$(mktemp -d "${TMPDIR:-/tmp}/runyard-test.XXXXXX")"
port="$(free_port)"
start_nats "$port" "$dir"
cleanup() { kill "$NATS_PID" 2>/dev/null || true; wait "$NATS_PID" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

export RUNYARD_TEST_NATS_URL="nats://127.0.0.1:${port}"
export RUNYARD_TEST_NATS_SERVER="$(nats_server_bin)"
log "nats-server $("$RUNYARD_TEST_NATS_SERVER" --version) on ${RUNYARD_TEST_NATS_URL}"

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
