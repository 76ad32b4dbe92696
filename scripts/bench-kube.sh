#!/usr/bin/env bash
# Dispatch rate through a kubernetes spoke: a release hub on the kube test
# policy (tests/fixtures/kube, plus a team `bench` that may use every GPU of
# the cluster), one `axle-spoke --driver kubernetes` against
# `axle-kube-testserver --auto-complete` (pods run and succeed at once), and
# `axle bench submit`, which prints jobs/s and submit→running latency.
#
#   scripts/bench-kube.sh [JOBS] [NODES]      (defaults: 2000 jobs, 4 × 8 H100)
#
# Everything listens on loopback and stops when the script exits.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${1:-2000}
NODES=${2:-4}

cargo build --release --workspace -q \
  --bin axle-hub --bin axle-spoke --bin axle --bin axle-kube-testserver
bin=target/release
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http=$(free_port); grpc=$(free_port); kube=$(free_port)

"$bin/axle-kube-testserver" --listen "127.0.0.1:$kube" --nodes "$NODES" --gpus-per-node 8 \
  --auto-complete --kubeconfig "$work/kubeconfig" >"$work/kube.log" 2>&1 &
pids+=($!)
mkdir -p "$work/policy"
cp tests/fixtures/kube/*.yaml "$work/policy/"
gpus=$((NODES * 8))
cat >"$work/policy/bench-team.yaml" <<YAML
apiVersion: axle.dev/v1
kind: Team
metadata:
  name: bench
spec:
  quotas:
    H100: {guaranteed: 0, limit: $gpus}
YAML
"$bin/axle-hub" --auth none --insecure-no-tls --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc" \
  --data-dir "$work/hub" --policy "$work/policy" >"$work/hub.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
"$bin/axle-spoke" --hub "http://127.0.0.1:$grpc" --cluster k8s --region eu-west \
  --data-dir "$work/spoke" --driver kubernetes --kubeconfig "$work/kubeconfig" \
  --default-image registry.example/axle/runner:1 >"$work/spoke.log" 2>&1 &
pids+=($!)

export AXLE_HUB="http://127.0.0.1:$http"
for _ in $(seq 300); do
  "$bin/axle" get clusters 2>/dev/null | grep -q Ready && break
  sleep 0.1
done
"$bin/axle" get clusters
"$bin/axle" bench submit --jobs "$JOBS" --gpus 1 --team bench --priority training \
  --concurrency 32 -- python train.py
