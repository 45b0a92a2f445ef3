#!/usr/bin/env bash
# The quick start: on a fresh machine with the Rust toolchain, installs what is missing
# (scripts/install-deps.sh), fetches SmolLM2-135M-Instruct (scripts/fetch-model.sh), builds the
# release binaries and brings up a local cluster serving it: the router, one prefill worker and
# one decode worker (`dolphinctl up --engine candle`). Ctrl-C stops it. Arguments go to
# `dolphinctl up`, e.g. `scripts/up.sh --prefill 2 --decode 2`; `--engine sim` serves the
# simulated model instead (no download).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
# The engine the caller chose (`--engine X` or `--engine=X`), else candle.
engine=
prev=
for arg in "$@"; do
    case "$arg" in
        --engine=*) engine=${arg#--engine=} ;;
        *) [[ $prev == --engine ]] && engine=$arg ;;
    esac
    prev=$arg
done
extra=()
if [[ -z $engine ]]; then
    engine=candle
    extra=(--engine candle)
fi
if [[ $engine == candle ]]; then
    scripts/fetch-model.sh >/dev/null
fi
cargo build --release --locked --bins
exec "${CARGO_TARGET_DIR:-target}/release/dolphinctl" up "${extra[@]}" "$@"
