#!/usr/bin/env bash
# Runs tests/sdk/check_sdks.py (the official OpenAI and Anthropic Python SDKs against the
# router's HTTP API) against a running router, installing the SDKs first
# (scripts/install-sdks.sh). Arguments go to the script, e.g.
#   scripts/up.sh                       # in another terminal
#   scripts/check-sdks.sh http://127.0.0.1:8000
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(scripts/install-sdks.sh)
exec "$py" tests/sdk/check_sdks.py "${@:-http://127.0.0.1:8000}"
