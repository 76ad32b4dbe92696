#!/usr/bin/env bash
# Axle's whole test suite, from a fresh machine: installs what the tests need
# (idempotently), then runs format, lint and every test in the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."

# What the build and the suite need (Debian packages), installed if missing.
scripts/prereqs.sh test

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
