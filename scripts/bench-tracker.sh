#!/usr/bin/env bash
# The job-tracker benchmark (docs/benchmarks.md, "job-tracker"): builds the
# real runyard-job-tracker in release mode, then runs the `projection` bench
# (services/job-tracker/benches/projection.rs), which starts its own
# nats-server, pre-loads the stream with synthetic job lifecycles, measures
# plain multi-row INSERTs of the same rows as the baseline, then the tracker
# binary's steady projection rate, RSS and CPU, and a rebuild of 1,000,000
# events. Needs the local Postgres (127.0.0.1:5432, user postgres). Arguments
# go to the bench (see `-- --help`); the markdown report is printed on
# stdout, progress on stderr.
#
#   scripts/bench-tracker.sh                                   # 200k steady, 1M rebuild
#   scripts/bench-tracker.sh --events 50000 --rebuild-events 100000   # quick
#   scripts/bench-tracker.sh --batch-sizes 500,1000,2000 --rounds 3
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

ensure_postgres
RUNYARD_TEST_NATS_SERVER="$(nats_server_bin)"
export RUNYARD_TEST_NATS_SERVER

log "building runyard-job-tracker (release)"
cargo build --release -p runyard-job-tracker

target_dir="${CARGO_TARGET_DIR:-$(pwd)/target}"
log "running the projection bench $*"
exec cargo bench -p runyard-job-tracker --bench projection -- \
  --tracker-bin "${target_dir}/release/runyard-job-tracker" "$@"
