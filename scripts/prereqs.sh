#!/usr/bin/env bash
# Installs (idempotently) the Debian packages Axle needs: `build` for
# building it, `test` for building it and running the whole suite.
#
#   scripts/prereqs.sh build|test
set -euo pipefail
what=${1:-build}

# Each entry is "proof:package", the proof being a command on PATH or an
# absolute path that the package installs.
# etcd-client's build runs protoc, which needs the well-known .proto files
# of libprotobuf-dev.
PACKAGES=(
  "protoc:protobuf-compiler"
  "/usr/include/google/protobuf/descriptor.proto:libprotobuf-dev"
)
if [ "$what" = test ]; then
  # kubectl renders deploy/'s kustomizations; machines that already have one
  # (with kustomize v5) keep it: Debian's package ships the same
  # /usr/bin/kubectl. etcd runs the store contract tests on a real etcd
  # (hub/server/tests/store_contract.rs).
  # curl is the HTTP/2 client of the adversary suite (tests/e2e/adversary):
  # it reports a stream reset where other clients hide it.
  PACKAGES+=("kubectl:kubernetes-client" "etcd:etcd-server" "curl:curl")
fi

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
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The EC2 adapter's tests run against moto's EC2 server (PyPI moto[server]).
if [ "$what" = test ] && ! command -v moto_server >/dev/null 2>&1; then
  echo "== installing moto[server]"
  python3 -m pip install -q 'moto[server]>=5.2,<6'
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
fi
