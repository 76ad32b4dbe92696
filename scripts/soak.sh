#!/usr/bin/env bash
# Soak test: the dev stack (a hub and two local spokes, release build) with
# short retention windows, under `axle bench soak` — a steady mixed load —
# printing the hub's RSS, open file descriptors, store size, disk use and
# file count every minute. Every figure should be flat once the first
# retention window (6 minutes here) has passed.
#
#   scripts/soak.sh                 # 30 minutes at 100 workloads/s
#   DURATION=5m RATE=50 scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-30m}
RATE=${RATE:-100}
HTTP_PORT=${HTTP_PORT:-17070}
GRPC_PORT=${GRPC_PORT:-17071}

cargo build --release --workspace --bins -q
bin=${CARGO_TARGET_DIR:-target}/release
work=$(mktemp -d /tmp/axle-soak.XXXXXX)
cp -r deploy/examples/policy "$work/policy"
# Retention in minutes instead of days, so a short run sees it at work.
sed -i -e 's/^  retainFinishedHours: .*/  retainFinishedHours: 0.1/' \
       -e 's/^  retainEventsDays: .*/  retainEventsDays: 0.005/' "$work/policy/settings.yaml"
grep -q 'retainFinishedHours: 0.1' "$work/policy/settings.yaml"

RUST_LOG=warn "$bin/axle-dev" --no-auth --policy "$work/policy" --data-dir "$work/data" \
  --http "127.0.0.1:$HTTP_PORT" --grpc "127.0.0.1:$GRPC_PORT" >"$work/dev.log" 2>&1 &
dev=$!
trap 'kill $dev 2>/dev/null || true; wait $dev 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$HTTP_PORT/healthz" >/dev/null && break
  sleep 0.1
done
# Both spokes registered.
for _ in $(seq 100); do
  [ "$(curl -sf "http://127.0.0.1:$HTTP_PORT/api/v1/clusters" | grep -o '"state":"Ready"' | wc -l)" -ge 2 ] && break
  sleep 0.1
done

echo "soak: dev stack pid $dev, data $work/data, log $work/dev.log"
AXLE_HUB="http://127.0.0.1:$HTTP_PORT" "$bin/axle" bench soak \
  --rate "$RATE" --duration "$DURATION" --hub-pid "$dev" --data-dir "$work/data"
