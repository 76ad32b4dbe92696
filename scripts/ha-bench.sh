#!/usr/bin/env bash
# The highly available hub, measured with release binaries on loopback:
#  1. `axle bench submit` end to end (submit → Running → done, one local
#     spoke with 2 nodes of 8 declared H100s) on redb, then through 3 replicas on a
#     3-member etcd;
#  2. failover: KILLS times, SIGKILL the leader and time until another
#     replica's /readyz is 200 (the killed one is restarted as a follower);
#     min / median / max;
#  3. PENDING workloads kept (a cluster without a spoke): etcd's database
#     size, the leader's RSS and the followers' (their warm mirrors);
#  4. one more failover with those PENDING workloads stored, and where the
#     new leader restored from.
# Needs etcd (scripts/prereqs.sh test installs it).
#
#   scripts/ha-bench.sh            # JOBS=2000 KILLS=20 PENDING=100000
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2000} KILLS=${KILLS:-20} PENDING=${PENDING:-100000} TTL_MS=${TTL_MS:-5000}
cargo build --release --workspace -q
bin=target/release
free() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
policy=deploy/examples/policy
wait_http() { for _ in $(seq 300); do curl -sf "$1" >/dev/null && return 0; sleep 0.1; done; echo "no answer from $1" >&2; return 1; }

# The etcd cluster.
ec=(); ep=(); init=""
for i in 0 1 2; do ec[$i]=$(free); ep[$i]=$(free); init+="e$i=http://127.0.0.1:${ep[$i]},"; done
for i in 0 1 2; do
  etcd --name "e$i" --data-dir "$work/e$i" --listen-client-urls "http://127.0.0.1:${ec[$i]}" \
    --advertise-client-urls "http://127.0.0.1:${ec[$i]}" --listen-peer-urls "http://127.0.0.1:${ep[$i]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ep[$i]}" --initial-cluster "${init%,}" \
    --quota-backend-bytes $((8 << 30)) >"$work/e$i.log" 2>&1 &
  pids+=($!)
done
store="etcd://127.0.0.1:${ec[0]},127.0.0.1:${ec[1]},127.0.0.1:${ec[2]}"
for i in 0 1 2; do wait_http "http://127.0.0.1:${ec[$i]}/health"; done

spoke() { # hub-grpc-urls data-dir
  $bin/axle-spoke --hub "$1" --cluster eu-1 --region eu-west --gpus 8xH100:80GB --gpus 8xH100:80GB --data-dir "$2" \
    >"$2.log" 2>&1 &
  pids+=($!)
}
bench() { $bin/axle --hub "$1" bench submit --jobs "$JOBS" --gpus 0.25 --concurrency 64 --team nlp -- true \
  | grep -E "jobs_per_s|submitted=|latency" || true; }

echo "== 1a. bench submit on redb ($JOBS jobs)"
h=$(free); g=$(free)
$bin/axle-hub --auth none --insecure-no-tls --policy "$policy" --data-dir "$work/redb" --http "127.0.0.1:$h" --grpc "127.0.0.1:$g" >"$work/redb.log" 2>&1 &
redb=$!; pids+=($redb)
wait_http "http://127.0.0.1:$h/readyz"
spoke "http://127.0.0.1:$g" "$work/spoke-redb"; sleep 2
bench "http://127.0.0.1:$h"
kill "$redb" "${pids[-1]}"; sleep 1

echo "== 1b. bench submit through 3 replicas on 3-member etcd ($JOBS jobs)"
hp=(); gp=(); hub=()
start_replica() { # i
  $bin/axle-hub --auth none --insecure-no-tls --policy "$policy" --data-dir "$work/r$1" --http "127.0.0.1:${hp[$1]}" --grpc "127.0.0.1:${gp[$1]}" \
    --store "$store" --replica-id "r$1" --lease-ttl-ms "$TTL_MS" >>"$work/r$1.log" 2>&1 &
  hub[$1]=$!; pids+=($!)
}
for i in 0 1 2; do hp[$i]=$(free); gp[$i]=$(free); start_replica "$i"; done
urls="http://127.0.0.1:${hp[0]},http://127.0.0.1:${hp[1]},http://127.0.0.1:${hp[2]}"
grpcs="http://127.0.0.1:${gp[0]},http://127.0.0.1:${gp[1]},http://127.0.0.1:${gp[2]}"
leader() { for i in 0 1 2; do [ "$(curl -s -m 0.5 -o /dev/null -w '%{http_code}' "http://127.0.0.1:${hp[$i]}/readyz")" = 200 ] && { echo "$i"; return; }; done; echo -1; }
until [ "$(leader)" != -1 ]; do sleep 0.1; done
spoke "$grpcs" "$work/spoke-etcd"; sleep 3
bench "$urls"

echo "== 2. failover over $KILLS kills (lease TTL $TTL_MS ms)"
times=()
for k in $(seq "$KILLS"); do
  l=$(leader); until [ "$l" != -1 ]; do sleep 0.1; l=$(leader); done
  t0=$(date +%s%N); kill -9 "${hub[$l]}"
  while :; do n=$(leader); [ "$n" != -1 ] && [ "$n" != "$l" ] && break; sleep 0.02; done
  t=$(( ($(date +%s%N) - t0) / 1000000 )); times+=("$t"); echo "kill $k: r$l -> r$n in $t ms"
  start_replica "$l"; sleep 1
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "failover_ms min=%d median=%d max=%d n=%d\n", a[1], a[int((NR+1)/2)], a[NR], NR}'

echo "== 3. $PENDING pending workloads (A100s: no spoke has any)"
$bin/axle --hub "$urls" bench submit --jobs "$PENDING" --gpus 1 --gpu-model A100 --team nlp --concurrency 64 --no-wait -- true \
  | grep -E "submitted=|jobs_per_s" || true
l=$(leader)
curl -s "http://127.0.0.1:${ec[0]}/v3/maintenance/status" -X POST -d '{}' \
  | python3 -c 'import json,sys; s=json.load(sys.stdin); print("etcd_db_bytes=%s in_use=%s" % (s["dbSize"], s.get("dbSizeInUse", "?")))'
awk '/VmRSS|VmHWM/ {printf "leader_%s=%d MB ", $1, $2/1024} END {print ""}' "/proc/${hub[$l]}/status"
for i in 0 1 2; do
  [ "$i" = "$l" ] && continue
  awk -v r="r$i" '/VmRSS/ {printf "follower_%s_VmRSS=%d MB (its warm mirror)\n", r, $2/1024}' "/proc/${hub[$i]}/status"
done

echo "== 4. failover with $PENDING workloads stored"
t0=$(date +%s%N); kill -9 "${hub[$l]}"
while :; do n=$(leader); [ "$n" != -1 ] && [ "$n" != "$l" ] && break; sleep 0.02; done
echo "failover_ms=$(( ($(date +%s%N) - t0) / 1000000 )) (r$l -> r$n)"
curl -s "http://127.0.0.1:${hp[$n]}/api/v1/hubs" | python3 -c 'import json,sys; print("new leader:", json.load(sys.stdin).get("state"))'
