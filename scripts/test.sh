#!/usr/bin/env bash
# Builds every binary (the end-to-end tests in tests/ run the real dolphin-router, workers and
# dolphinctl from the target dir), then runs the tests. Arguments go to `cargo test`, e.g.
#   scripts/test.sh -p dolphin-tests --test streaming -- --nocapture
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --workspace --bins --locked

# `--workspace` unless the caller picked packages.
scope=(--workspace)
for arg in "$@"; do
    case "$arg" in
        -p | --package | --package=* | -p?*) scope=() ;;
        --) break ;;
    esac
done
cargo test "${scope[@]}" --locked "$@"
