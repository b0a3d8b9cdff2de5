#!/usr/bin/env bash
# services/ingest/scripts/flood-rss.sh BIN [VAR=value ...]
#
# The memory test of issue 14 (docs/reliability.md): a fresh ingest (BIN,
# e.g. target/release/runyard-ingest) against a private nats-server takes
# 3 rounds of 16 parallel 24 MiB deliveries with bad signatures; prints its
# peak RSS (VmHWM) idle and after the flood, and the answers by status.
# Extra VAR=value arguments go into ingest's environment, e.g.
# RUNYARD_INGEST_MAX_IN_FLIGHT_BYTES=1GiB to see it without load shedding.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source scripts/lib.sh
bin="$1"; shift
dir="$(mktemp -d)"; port="$(free_port)"; start_nats "$port" "$dir" >/dev/null 2>&1
hport="$(free_port)"
env RUNYARD_NATS_URL="nats://127.0.0.1:$port" RUNYARD_NAMESPACE="rss$$" RUNYARD_INGEST_LISTEN="127.0.0.1:$hport" \
    RUNYARD_GITHUB_WEBHOOK_SECRET="$(openssl rand -hex 32)" RUST_LOG=warn RUNYARD_LOG_FORMAT=json "$@" "$bin" 2>"$dir/ingest.log" &
ipid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$hport/readyz" >/dev/null && break; sleep 0.1; done
head -c $((24*1024*1024)) /dev/zero | tr '\0' ' ' > "$dir/body"
idle=$(awk '/VmHWM/{print $2}' /proc/$ipid/status)
codes="$dir/codes"
for round in 1 2 3; do
  pids=()
  for i in $(seq 16); do
    curl -s -o /dev/null -w '%{http_code}\n' -X POST "http://127.0.0.1:$hport/webhooks/github" \
      -H 'X-GitHub-Event: workflow_job' -H "X-GitHub-Delivery: f-$round-$i" \
      -H "X-Hub-Signature-256: sha256=$(printf '0%.0s' $(seq 64))" -H 'Content-Type: application/json' \
      --data-binary @"$dir/body" >> "$codes" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
done
sleep 0.5
peak=$(awk '/VmHWM/{print $2}' /proc/$ipid/status)
echo "idle VmHWM $((idle/1024)) MiB, after flood VmHWM $((peak/1024)) MiB; answers: $(sort "$codes" | uniq -c | tr '\n' ' ')"
kill $ipid $NATS_PID; wait 2>/dev/null || true; rm -rf "$dir"
