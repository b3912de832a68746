#!/usr/bin/env bash
# Installs axe-core (the accessibility checker the web page's browser tests inject into every
# view) from the npm registry into target/axe, and npm itself from Debian when it is missing.
# Idempotent: does nothing when axe.min.js is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=target/axe
if [ -f "$DEST/node_modules/axe-core/axe.min.js" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends npm
fi
mkdir -p "$DEST"
npm install --prefix "$DEST" --no-save --no-audit --no-fund --loglevel=error axe-core@4
test -f "$DEST/node_modules/axe-core/axe.min.js"
