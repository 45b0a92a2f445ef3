#!/usr/bin/env bash
# Installs the peer routers the benchmark measures Dolphin against (bench/peers.md), when missing:
#   nginx  (Debian nginx-light) as a plain HTTP reverse proxy, and wrk to drive load;
#   smg    (SGLang's gateway, PyPI smg==1.13.0) in a venv under
#          ${DOLPHIN_PEERS_DIR:-$HOME/.cache/dolphin/peers}/smg-venv;
#   dynamo (NVIDIA Dynamo 1.6.1's mocker and its offline replay, PyPI ai-dynamo) in dynamo-venv
#          beside it, for bench/src/bin/mocker_crosscheck.rs.
# Idempotent: apt-get update runs only when a package must be installed, pip only when smg is not
# there at that version. Uses sudo -n when not root. A peer that fails to install is reported on
# stderr and the rest goes on. Prints the paths it found, one `name=path` a line, on stdout.
# Exit status: 0 when everything is installed, 2 when some peer is missing (the benchmark then
# reports that peer as missing), 64 on a usage error.
set -euo pipefail

if (($# > 0)); then
    echo "usage: $0   (env: DOLPHIN_PEERS_DIR, PYTHON)" >&2
    exit 64
fi

SMG_VERSION=1.13.0
DYNAMO_VERSION=1.6.1
peers_dir=${DOLPHIN_PEERS_DIR:-$HOME/.cache/dolphin/peers}
venv=$peers_dir/smg-venv
dynamo_venv=$peers_dir/dynamo-venv
missing=()

say() { echo "install-peers: $*" >&2; }

sudo=()
if [[ $(id -u) -ne 0 ]]; then
    sudo=(sudo -n)
fi

# --- apt packages: nginx-light (nginx) and wrk ---------------------------------------------------
nginx_bin() {
    command -v nginx 2>/dev/null || { [[ -x /usr/sbin/nginx ]] && echo /usr/sbin/nginx; } || true
}
need=()
[[ -n $(nginx_bin) ]] || need+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
if ((${#need[@]} > 0)); then
    if ! command -v apt-get >/dev/null 2>&1; then
        say "missing ${need[*]} and no apt-get here; install them by hand"
    else
        say "installing ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        # The nginx package's postinst starts the system nginx on port 80 unless policy-rc.d
        # forbids it; forbid it for the length of the install when nothing else does.
        made_policy=false
        if [[ ! -e /usr/sbin/policy-rc.d ]]; then
            if printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null \
                && "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d; then
                made_policy=true
            fi
        fi
        if ! "${sudo[@]}" apt-get update -qq; then
            say "apt-get update failed"
        fi
        # One package at a time, so that one failing does not keep the other out.
        for pkg in "${need[@]}"; do
            "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null \
                || say "apt-get install $pkg failed"
        done
        if $made_policy; then
            "${sudo[@]}" rm -f /usr/sbin/policy-rc.d
        fi
    fi
fi
nginx=$(nginx_bin)
if [[ -z $nginx ]]; then
    say "nginx is missing"
    missing+=(nginx)
fi
wrk=$(command -v wrk 2>/dev/null || true)
if [[ -z $wrk ]]; then
    say "wrk is missing"
    missing+=(wrk)
fi

# --- smg in its own venv -------------------------------------------------------------------------
smg=$venv/bin/smg
smg_installed() {
    [[ -x $smg && -x $venv/bin/python ]] || return 1
    compgen -G "$venv/lib/python*/site-packages/smg-$SMG_VERSION.dist-info" >/dev/null
}
if ! smg_installed; then
    say "installing smg==$SMG_VERSION into $venv"
    python=${PYTHON:-$(command -v python3 || true)}
    if [[ -z $python ]]; then
        say "no python3 to make the smg venv with"
    elif ! { mkdir -p "$peers_dir" \
        && { [[ -x $venv/bin/python ]] || "$python" -m venv "$venv"; } \
        && "$venv/bin/python" -m pip install -q "smg==$SMG_VERSION"; }; then
        say "installing smg==$SMG_VERSION failed"
    fi
fi
if ! smg_installed; then
    say "smg $SMG_VERSION is missing"
    missing+=(smg)
    smg=
fi

# --- Dynamo's mocker in its own venv --------------------------------------------------------------
# ai-dynamo pins aisimulate, a stub that fetches its wheel from pypi.nvidia.com at install time;
# the offline replay needs only the two Dynamo wheels (its engine is in ai-dynamo-runtime's
# native module) and pydantic, so those are installed without the rest of the dependency list.
dynamo_python=$dynamo_venv/bin/python
dynamo_installed() {
    [[ -x $dynamo_python ]] || return 1
    compgen -G "$dynamo_venv/lib/python*/site-packages/ai_dynamo-$DYNAMO_VERSION.dist-info" >/dev/null \
        && "$dynamo_python" -c 'import dynamo.replay.api' 2>/dev/null
}
if ! dynamo_installed; then
    say "installing ai-dynamo==$DYNAMO_VERSION (mocker and replay) into $dynamo_venv"
    python=${PYTHON:-$(command -v python3 || true)}
    if [[ -z $python ]]; then
        say "no python3 to make the dynamo venv with"
    elif ! { mkdir -p "$peers_dir" \
        && { [[ -x $dynamo_python ]] || "$python" -m venv "$dynamo_venv"; } \
        && "$dynamo_python" -m pip install -q --no-deps "ai-dynamo==$DYNAMO_VERSION" \
            "ai-dynamo-runtime==$DYNAMO_VERSION" \
        && "$dynamo_python" -m pip install -q "pydantic>=2.10.6,<=2.13.5" \
            2>"$peers_dir/dynamo-pip.log"; }; then
        # pip lists the dependencies left out on purpose; its log is kept for a real failure.
        say "installing ai-dynamo==$DYNAMO_VERSION failed (see $peers_dir/dynamo-pip.log)"
    fi
fi
if ! dynamo_installed; then
    say "dynamo $DYNAMO_VERSION is missing"
    missing+=(dynamo)
    dynamo_python=
fi

echo "nginx=$nginx"
echo "wrk=$wrk"
echo "smg=$smg"
echo "dynamo=$dynamo_python"
if ((${#missing[@]} > 0)); then
    say "missing: ${missing[*]}"
    exit 2
fi
say "all peers installed"
