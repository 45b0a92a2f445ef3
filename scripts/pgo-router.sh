#!/usr/bin/env bash
# Builds the router with profile-guided optimization (PGO) and prints the binary's path.
#
#   1. builds an instrumented router (-Cprofile-generate) in target/pgo/gen;
#   2. runs router_overhead's local-path modes through it (HTTP, SSE and gRPC at 1 and 16
#      connections, 5 s each, the decode worker on the sim engine): the requests the router's hot
#      path serves, parsed, tokenized, routed and forwarded;
#   3. merges the profile with the toolchain's llvm-profdata (rustup component llvm-tools, added
#      here when missing) into target/pgo/router.profdata;
#   4. builds the router again with it (-Cprofile-use) in target/pgo/use.
#
# Paths are under cargo's target directory (CARGO_TARGET_DIR when set); RUSTFLAGS from the
# environment are kept. PGO_PROFILE picks the cargo profile (default release; dist adds fat
# LTO). On two cores about 12 minutes with release, 21 with dist (three builds). What it gains,
# measured: docs/architecture.md, "Profile-guided optimization"; how to A/B it:
# docs/dev/profiling.md. The container image ships the dist build of it (its PGO build arg).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${PGO_PROFILE:-release}
# Cargo's target directory (CARGO_TARGET_DIR when set, as CI's persistent one), absolute.
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
out=$target/pgo

if ! profdata=$(find "$(rustc --print sysroot)" -name llvm-profdata -type f 2>/dev/null | head -1) \
    || [[ -z $profdata ]]; then
    rustup component add llvm-tools >&2
    profdata=$(find "$(rustc --print sysroot)" -name llvm-profdata -type f | head -1)
fi
if [[ -z $profdata ]]; then
    echo "pgo-router: llvm-profdata not found (rustup component add llvm-tools)" >&2
    exit 1
fi

# The benchmark and the processes it starts (from target/<profile>, beside it).
cargo build --profile "$profile" --locked --bin dolphin-router --bin dolphin-decode-worker \
    --bin dolphin-prefill-worker -p dolphin-router -p dolphin-decode-worker \
    -p dolphin-prefill-worker -p dolphin-bench --bin router_overhead >&2

RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$out/raw" cargo build --profile "$profile" --locked \
    --bin dolphin-router --target-dir "$out/gen" >&2
# Build scripts and proc macros of that build wrote profiles too: only the router's count.
rm -rf "$out/raw"

# It reports targets it misses in its exit status; the profile is what is wanted here.
"$target/$profile/router_overhead" --duration-secs 5 --concurrency 1,16 \
    --modes direct_grpc,router_http,router_http_sse,router_grpc \
    --router-bin "$out/gen/$profile/dolphin-router" --out "$out/train.json" >&2 || true
shopt -s nullglob
raw=("$out"/raw/*.profraw)
if ((${#raw[@]} == 0)); then
    echo "pgo-router: the instrumented router wrote no profile (see the output above)" >&2
    exit 1
fi
"$profdata" merge -o "$out/router.profdata" "${raw[@]}"

RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$out/router.profdata" cargo build --profile "$profile" --locked \
    --bin dolphin-router --target-dir "$out/use" >&2
echo "$out/use/$profile/dolphin-router"
