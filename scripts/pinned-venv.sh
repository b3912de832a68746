#!/usr/bin/env bash
# Usage: scripts/pinned-venv.sh VENV REQUIREMENTS EXE
# Creates the Python virtual environment VENV with the packages pinned in REQUIREMENTS (from
# PyPI). Idempotent and fast when VENV/EXE exists and VENV was built from this very
# requirements file (its sha256 is kept in VENV/.requirements.sha256); installs Debian's
# python3 and python3-venv first when they are missing. Shared by install-sdk-venv.sh and
# install-schemathesis.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$1
REQ=$2
EXE=$3
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ -x "$VENV/$EXE" ] && [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends python3 python3-venv
fi
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-input -r "$REQ"
echo "$want" > "$VENV/.requirements.sha256"
