#!/usr/bin/env bash
# Axle's dev stack from a fresh machine: installs what the build needs
# (idempotently), then builds and runs `axle-dev` (a hub with the example
# policy and two local spokes). Arguments go to axle-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/prereqs.sh build
exec cargo run --release --bin axle-dev -- "$@"
