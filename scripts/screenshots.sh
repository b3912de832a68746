#!/usr/bin/env bash
# Regenerates the web page's screenshots: the browser tests of tests/it/web_surface.rs save
# each main view at desktop (1280×800) and phone (390×844) width into docs/screenshots/, and
# the jobs list at desktop width becomes the README's docs/screenshot.png. Needs what the
# browser tests need (scripts/install-browser.sh, scripts/install-axe.sh; run here first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-browser.sh
bash scripts/install-axe.sh
rm -rf docs/screenshots
TALLY_SCREENSHOTS_DIR="$PWD/docs/screenshots" cargo test --features failpoints --test it web_surface:: -- --test-threads=1
cp docs/screenshots/jobs-desktop.png docs/screenshot.png
ls docs/screenshots
