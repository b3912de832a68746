#!/usr/bin/env bash
# The project's whole test suite: unit tests, the integration binary (API, CLI, engine, sets,
# provider adapters and kinds against the mock provider, the web page in headless Chromium),
# and — because crash points are compiled in with `--features failpoints` — the crash matrix
# and the bounded chaos soak against the real binary. The browser tests need Debian's Chromium
# and chromedriver, installed first (a no-op when they are already there); the SDK contract tests
# need the pinned official provider SDKs in target/sdk-venv (scripts/install-sdk-venv.sh, likewise). The soak runs last,
# uncaptured, so its summary line is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-browser.sh
bash scripts/install-axe.sh
bash scripts/install-sdk-venv.sh
cargo test --all-targets --features failpoints -- --skip soak::
cargo test --features failpoints --test it soak:: -- --nocapture
