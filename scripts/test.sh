#!/usr/bin/env bash
# Axle's whole test suite, from a fresh machine: installs what the tests need
# (idempotently), then runs format, lint and every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the suite uses, each as "proof:package", the proof being a
# command on PATH or an absolute path that the package installs.
# kubectl renders deploy/'s kustomizations; machines that already have one
# (with kustomize v5) keep it: Debian's package ships the same /usr/bin/kubectl.
# etcd runs the store contract tests on a real etcd (hub/server/tests/
# store_contract.rs); etcd-client's build runs protoc, which needs the
# well-known .proto files of libprotobuf-dev.
PACKAGES=(
  "kubectl:kubernetes-client"
  "etcd:etcd-server"
  "protoc:protobuf-compiler"
  "/usr/include/google/protobuf/descriptor.proto:libprotobuf-dev"
)

missing=()
for pair in "${PACKAGES[@]}"; do
  proof=${pair%%:*}
  case $proof in
    /*) [ -e "$proof" ] || missing+=("${pair#*:}") ;;
    *) command -v "$proof" >/dev/null 2>&1 || missing+=("${pair#*:}") ;;
  esac
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "== kubectl kustomize deploy/"
# Render every base and overlay; tests/e2e/deploy.rs then types each object
# and checks the spoke's RBAC against the driver's calls.
while IFS= read -r k; do
  dir=$(dirname "$k")
  kubectl kustomize "$dir" >/dev/null || { echo "kustomize failed: $dir" >&2; exit 1; }
  echo "   $dir"
done < <(find deploy -name kustomization.yaml | sort)

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# One closing line for the whole suite (cargo prints one per test binary,
# the last of them for doc-tests).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
