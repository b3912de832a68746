#!/usr/bin/env bash
# The project's test suite: every unit and integration test. The web page's browser tests need
# Debian's Chromium and chromedriver, installed first (a no-op when they are already there).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-browser.sh
cargo test --all-targets
