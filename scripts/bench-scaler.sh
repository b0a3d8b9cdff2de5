#!/usr/bin/env bash
# Scaler benchmark (docs/benchmarks.md, "Scaler: webhook to runner"): the
# release ingest and scaler against a nats-server, Postgres, a fake GitHub
# and the process provider; from a queued webhook's 202 to the runner's
# process, paced and in bursts, and runners created per second against the
# create path called directly. Flags go to the bench (`-- --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
export RUNYARD_TEST_NATS_SERVER="$(nats_server_bin)"
cargo build --release -p runyard-ingest -p runyard-scaler --bins
cargo bench -p runyard-scaler --bench webhook_to_runner -- "$@"
