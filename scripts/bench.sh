#!/usr/bin/env bash
# Builds the release binaries, then runs the benchmarks in bench/ (by default routing_decision,
# dolphin_decision, router_overhead, kv_transfer). Each prints its numbers and writes
# bench/results/<name>.json. Arguments pick benchmarks by name (any binary in bench/src/bin);
# after `--`, the rest goes to each benchmark run (so name one), e.g.
#   scripts/bench.sh                         # the default set
#   scripts/bench.sh router_overhead -- --duration-secs 5
# Also known, not in the default set (they need the model from scripts/fetch-model.sh and take
# minutes): engine_candle (the candle engine alone), cluster_candle (the same model through
# router, prefill and decode worker; run engine_candle first for the side-by-side table);
# sim_crosscheck (the cluster simulator against a live sim-engine cluster started with
# dolphinctl up, 1p1d and 2p2d, about 3 minutes); handoff_sim (token-level handoff runtimes on
# the Qwen3 sim profiles: lockstep, dispatcher, async, Markov-chain B, B sweep; about 3 minutes);
# handoff_real (handoff algorithms on SmolLM2 and its early exit: agreement curve, random
# control, quiz, throughput, handoff cost, depth sweep; needs the model, about 20 minutes);
# load_faults (10,000 concurrent streams through the router, decode workers SIGKILLed under
# load, etcd down for 30 s; needs etcd from scripts/install-deps.sh, about 3 minutes);
# tokenizer (SmolLM2's tokenizer on 1k- and 32k-token prompts; needs the model, seconds);
# mocker_crosscheck (the cluster simulator against Dynamo 1.6.1's mocker on the same requests,
# through Dynamo's offline replay; installs it with scripts/install-peers.sh, seconds).
# kv_transfer also runs on links of given rates, each a network namespace whose loopback is
# shaped to it (root and iproute2; writes kv_transfer_link.json):
#   scripts/bench.sh kv_transfer -- --link-gbit 10,15,20,25
# A benchmark that fails does not stop the others; the script then exits 1.
# BENCH_PROFILE picks the cargo profile (default release); `BENCH_PROFILE=dist` measures what the
# container image ships (fat LTO, one codegen unit: several minutes more to build), as the
# router_overhead results in docs/architecture.md do. BENCH_PGO=1 also builds the router with
# profile-guided optimization (scripts/pgo-router.sh, same profile; about 12 minutes with
# release) and runs router_overhead's Dolphin routers from that build, as the container image
# ships them.
set -euo pipefail
cd "$(dirname "$0")/.."

benches=()
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; break ;;
        *) benches+=("$1"); shift ;;
    esac
done
if [ ${#benches[@]} -eq 0 ]; then
    benches=(routing_decision dolphin_decision router_overhead kv_transfer)
fi

profile="${BENCH_PROFILE:-release}"

# Only the binaries needed: router_overhead starts the router and the workers from
# target/<profile>, beside itself.
bins=(--bin dolphin-router --bin dolphin-decode-worker --bin dolphin-prefill-worker)
pkgs=(-p dolphin-router -p dolphin-decode-worker -p dolphin-prefill-worker -p dolphin-bench)
for b in "${benches[@]}"; do
    bins+=(--bin "$b")
    # router_overhead measures nginx and smg in front of mock_http_worker; a peer that does
    # not install is reported as missing in its result.
    if [ "$b" = router_overhead ]; then
        bins+=(--bin mock_http_worker)
        scripts/install-peers.sh >/dev/null || echo "some peers are missing (see above)" >&2
    fi
    # mocker_crosscheck replays its cases on Dynamo's mocker from the peers' dynamo venv.
    if [ "$b" = mocker_crosscheck ]; then
        scripts/install-peers.sh >/dev/null || echo "some peers are missing (see above)" >&2
    fi
    # sim_crosscheck starts its cluster with dolphinctl up.
    if [ "$b" = sim_crosscheck ]; then
        bins+=(--bin dolphinctl)
        pkgs+=(-p dolphinctl)
    fi
done
cargo build --profile "$profile" --locked "${bins[@]}" "${pkgs[@]}"
router_bin=()
if [ "${BENCH_PGO:-0}" = 1 ]; then
    router_bin=(--router-bin "$(PGO_PROFILE="$profile" scripts/pgo-router.sh)")
fi

failed=()
for b in "${benches[@]}"; do
    echo
    echo "=== $b"
    extra=()
    if [ "$b" = router_overhead ]; then
        extra=("${router_bin[@]}")
    fi
    if ! "${CARGO_TARGET_DIR:-target}/$profile/$b" "${extra[@]}" "$@"; then
        failed+=("$b")
    fi
done

echo
ls -l bench/results/*.json 2>/dev/null || true
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
