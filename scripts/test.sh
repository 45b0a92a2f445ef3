#!/usr/bin/env bash
# The test command: installs what is missing (system packages through scripts/install-deps.sh,
# the model through scripts/fetch-model.sh), builds every binary (the end-to-end tests in tests/
# run the real dolphin-router, workers and dolphinctl from the target dir, and start their own
# etcd), then runs the tests. Arguments go to `cargo test`, e.g.
#   scripts/test.sh -p dolphin-tests --test streaming -- --nocapture
# tests/tests/sdk.rs needs the SDKs (scripts/install-sdks.sh, called here).
# The multi-host tests need root for network namespaces; without it they skip, unless
# DOLPHIN_REQUIRE_NETNS=1 (CI) makes that a failure. The chart test needs helm
# (scripts/install-deploy-tools.sh); DOLPHIN_REQUIRE_HELM=1 makes its absence a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/fetch-model.sh >/dev/null
# The OpenAI and Anthropic SDKs for tests/tests/sdk.rs, which skips without them (unless
# DOLPHIN_REQUIRE_SDK=1, as in CI).
scripts/install-sdks.sh >/dev/null || echo "test: the SDK test will skip (see above)" >&2

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
