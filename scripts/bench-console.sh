#!/usr/bin/env bash
# The console benchmark (docs/benchmarks.md, "Console"): seeds a busy
# site's month (500,000 jobs over 50,000 workloads in 30 days, through the
# job-tracker's projection code) into a fresh database, or reuses or
# finishes the one `--database-url` names, then serves it with the release
# console as a read-only role and times every page and the queries behind
# them. Needs the local Postgres (127.0.0.1:5432, user postgres). Arguments
# go to the bench (see `-- --help`); the markdown report is printed on
# stdout, progress on stderr.
#
#   scripts/bench-console.sh                                   # seeds (~3 min), times, drops
#   scripts/bench-console.sh --database-url postgres://postgres@127.0.0.1:5432/runyard_console_bench
#   scripts/bench-console.sh --jobs 20000 --workloads 3000 --requests 5   # quick
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

ensure_postgres
log "running the console's pages bench $*"
exec cargo bench -p runyard-console --bench pages -- "$@"
