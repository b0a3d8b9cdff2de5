#!/usr/bin/env bash
# The ingest benchmark (docs/benchmarks.md, "Ingest"): builds runyard-ingest
# and the bench in release mode, then runs `ingest-bench`, which starts its
# own nats-server, measures raw acked JetStream publishes as the baseline and
# drives signed workflow_job deliveries at the real ingest binary over
# loopback. Arguments go to ingest-bench (see `--help`); the markdown report
# is printed on stdout, progress on stderr.
#
#   scripts/bench-ingest.sh                                  # C=32, RUST_LOG=warn
#   scripts/bench-ingest.sh --concurrency 16,32,64 --ingest-log warn,info
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

RUNYARD_TEST_NATS_SERVER="$(nats_server_bin)"
export RUNYARD_TEST_NATS_SERVER

log "building runyard-ingest and runyard-bench (release)"
cargo build --release -p runyard-ingest -p runyard-bench

log "running ingest-bench $*"
exec target/release/ingest-bench "$@"
