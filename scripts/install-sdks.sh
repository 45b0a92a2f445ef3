#!/usr/bin/env bash
# Installs the official OpenAI and Anthropic Python SDKs (pinned) into a venv, when missing, for
# tests/sdk/check_sdks.py (run by tests/tests/sdk.rs and scripts/check-sdks.sh): the clients
# applications call Dolphin's HTTP API with. Prints the venv's python on stdout.
#   ${DOLPHIN_SDK_VENV:-$HOME/.cache/dolphin/sdk-venv}
# Idempotent: pip runs only when the pinned versions are not there. Needs python3 with venv
# (scripts/install-deps.sh installs it) and PyPI. Exit status 2 when it cannot install.
set -euo pipefail

OPENAI_VERSION=3.63.0
ANTHROPIC_VERSION=2.17.0
venv=${DOLPHIN_SDK_VENV:-$HOME/.cache/dolphin/sdk-venv}
py=$venv/bin/python

say() { echo "install-sdks: $*" >&2; }

have() {
    [[ -x $py ]] && "$py" - "$OPENAI_VERSION" "$ANTHROPIC_VERSION" <<'PY' 2>/dev/null
import sys
import anthropic
import openai
sys.exit(0 if (openai.__version__, anthropic.__version__) == (sys.argv[1], sys.argv[2]) else 1)
PY
}

if ! have; then
    python=${PYTHON:-python3}
    if ! command -v "$python" >/dev/null 2>&1; then
        say "no $python: run scripts/install-deps.sh"
        exit 2
    fi
    say "installing openai==$OPENAI_VERSION anthropic==$ANTHROPIC_VERSION into $venv"
    mkdir -p "$(dirname "$venv")"
    if ! { [[ -x $py ]] || "$python" -m venv "$venv"; } \
        || ! "$py" -m pip install -q --disable-pip-version-check \
            "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" >&2 \
        || ! have; then
        say "could not install the SDKs into $venv"
        exit 2
    fi
fi
echo "$py"
