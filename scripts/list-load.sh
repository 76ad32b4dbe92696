#!/usr/bin/env bash
# Reads that never block writes, measured: a release hub (`--dev`, no
# spokes, so every workload stays stored) filled to FILL workloads, then
# ROUNDS rounds of JOBS submits alone and JOBS submits with POLLERS clients
# walking the whole list page by page at full speed (each poller walks the
# list once before the submits start: steady state, not a cold cache).
# Prints each round's `axle bench submit` summary and the hub's RSS (now and
# peak).
#
#   scripts/list-load.sh            # FILL=100000 JOBS=20000 POLLERS=32 ROUNDS=2
set -euo pipefail
cd "$(dirname "$0")/.."
FILL=${FILL:-100000} JOBS=${JOBS:-20000} POLLERS=${POLLERS:-32} ROUNDS=${ROUNDS:-2}
cargo build --release --workspace -q
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
grpc=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
data=$(mktemp -d)
target/release/axle-hub --dev --auth none --http "127.0.0.1:$port" --grpc "127.0.0.1:$grpc" --data-dir "$data" \
  >"$data/hub.log" 2>&1 &
hub=$!
trap 'kill $hub 2>/dev/null; wait $hub 2>/dev/null; rm -rf "$data"' EXIT
export AXLE_HUB="http://127.0.0.1:$port"
for _ in $(seq 100); do curl -sf "$AXLE_HUB/healthz" >/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS|VmHWM/ {printf "%s %d MB  ", $1, $2/1024}' "/proc/$hub/status"; echo; }
bench() { target/release/axle bench submit --gpus 1 --concurrency 64 --no-wait "$@" -- true | grep -E "submitted=|pollers=" ; }
echo "== fill to $FILL"; bench --jobs "$FILL"; rss
for r in $(seq "$ROUNDS"); do
  echo "== round $r: $JOBS submits alone"; bench --jobs "$JOBS"; rss
  echo "== round $r: $JOBS submits with $POLLERS pollers"; bench --jobs "$JOBS" --pollers "$POLLERS"; rss
done
