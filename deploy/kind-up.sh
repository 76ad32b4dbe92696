#!/usr/bin/env bash
# Axle's hub and a kubernetes spoke in a local kind cluster, with fake GPUs.
#
#   deploy/kind-up.sh            # create (or reuse) the cluster `axle`, deploy
#   deploy/kind-up.sh down       # delete it
#
# Needs docker, kind and kubectl. Not run by CI (no container runtime there);
# the kustomize output itself is checked by tests/deploy.
#
# kind nodes have no GPUs, so the script advertises 4 `nvidia.com/gpu` on the
# node (an extended resource patched into its status, as Kubernetes documents
# for "Advertise Extended Resources for a Node") and labels it as GPU Feature
# Discovery would. Pods then schedule against that count; the containers see
# no real GPU, which is enough to try quotas, gangs, preemption and logs.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${AXLE_KIND_CLUSTER:-axle}

if [[ "${1:-}" == "down" ]]; then
  kind delete cluster --name "$CLUSTER"
  exit 0
fi

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-up: $tool is needed" >&2; exit 1; }
done

docker build -t axle:dev .
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER"
kind load docker-image axle:dev --name "$CLUSTER"

NODE="$CLUSTER-control-plane"
kubectl label node "$NODE" --overwrite \
  nvidia.com/gpu.product=H100 nvidia.com/gpu.count=4 nvidia.com/gpu.memory=81559
kubectl patch node "$NODE" --subresource=status --type=json \
  -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"4"}]'

kubectl apply -k deploy/kustomize/overlays/dev
kubectl -n axle-system rollout status deploy/axle-hub --timeout=120s
kubectl -n axle-system rollout status deploy/axle-spoke --timeout=120s

cat <<MSG
Axle is up. In another shell:
  kubectl -n axle-system port-forward svc/axle-hub 7070:7070 7071:7071
then:
  cargo run --release --bin axle -- get clusters
  cargo run --release --bin axle -- submit --team vision --gpus 1 -- python -c 'print(42)'
MSG
