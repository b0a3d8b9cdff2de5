#!/usr/bin/env bash
# Allocator serving benchmark (docs/benchmarks.md, "Allocator serving"):
# seeds 1M usage samples into a fresh database, starts the release allocator
# against it and drives gRPC load; the no-op baseline runs in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_postgres
export RUNYARD_TEST_NATS_SERVER="$(nats_server_bin)"
cargo build --release -p runyard-allocator --bin runyard-allocator
cargo bench -p runyard-allocator --bench serve -- "$@"
