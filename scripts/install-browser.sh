#!/usr/bin/env bash
# Installs Debian's Chromium and its WebDriver (chromedriver) for the web page's browser tests,
# and iproute2 (`ip`), with which the phone tests (tests/it/phone.rs) give their network
# namespace an address. Idempotent: does nothing when all three are already installed.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && command -v ip >/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver iproute2
