#!/usr/bin/env bash
# Installs the system packages Dolphin's build and tests need, when missing (Debian/Ubuntu,
# apt): protoc and its well-known types (the build), etcd and etcdctl (the end-to-end tests),
# setpriv (dolphinctl's parent-death signal), iproute2 (the multi-host tests' network
# namespaces), pip (scripts/fetch-model.sh) and venv (scripts/install-sdks.sh). Idempotent and quiet when all is there; uses
# sudo -n when not root. The quick start, scripts/test.sh, .ci/run and the container build call
# it, so they install the same things.
#   scripts/install-deps.sh           # everything
#   scripts/install-deps.sh --build   # only what `cargo build` needs (the container build)
set -euo pipefail

build_only=false
case "${1:-}" in
    --build) build_only=true ;;
    "") ;;
    *) echo "usage: $0 [--build]" >&2; exit 64 ;;
esac

need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
# protoc's well-known types (google/protobuf/*.proto): etcd-client's build imports them, and
# --no-install-recommends leaves them out of protobuf-compiler.
[[ -f /usr/include/google/protobuf/descriptor.proto ]] || need+=(libprotobuf-dev)
command -v cc >/dev/null 2>&1 || need+=(gcc libc6-dev)
if ! $build_only; then
    command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
    command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
    command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
    command -v ip >/dev/null 2>&1 || need+=(iproute2)
    if ! command -v python3 >/dev/null 2>&1; then
        need+=(python3 python3-pip)
    elif ! python3 -m pip --version >/dev/null 2>&1; then
        need+=(python3-pip)
    fi
    # scripts/install-sdks.sh makes a venv (Debian splits ensurepip out of python3).
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
        need+=(python3-venv)
    fi
fi
if ((${#need[@]} == 0)); then
    echo "install-deps: everything needed is present" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing ${need[*]} and no apt-get here; install them by hand" >&2
    exit 1
fi
sudo=()
if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo -n)
fi
echo "install-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
