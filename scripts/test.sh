#!/usr/bin/env bash
# The project's whole test suite, both packages (`tally` and `tally-base`): unit tests, the
# integration binaries (API, CLI, engine, sets, provider adapters and kinds against the mock
# provider, the web page in headless Chromium,
# the store conformance suite on SQLite and on a real PostgreSQL), and — because crash points
# are compiled in with `--features failpoints` — the crash matrix and the bounded chaos soak
# against the real binary. The browser tests need Debian's Chromium and chromedriver, the SDK
# contract tests the pinned official provider SDKs in target/sdk-venv
# (scripts/install-sdk-venv.sh), the OpenAPI conformance test a pinned schemathesis in
# target/schemathesis-venv (scripts/install-schemathesis.sh), the `s3` delivery target's tests a
# pinned moto server in target/moto-venv (scripts/install-moto.sh), the renderer's check against
# Pillow a pinned Pillow in target/pillow-venv (scripts/install-pillow.sh), and the PostgreSQL tests
# Debian's PostgreSQL binaries: all are
# installed first (a no-op when they are already there). scripts/with-postgres.sh starts a
# throw-away PostgreSQL server for the whole run and stops it at the end; without it the
# PostgreSQL tests fail, never skip. The power-loss test needs LazyFS (built from
# vendor/lazyfs by scripts/install-lazyfs.sh; FUSE, as root). The soak and the
# power-loss run go last, uncaptured, so their summary lines are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-browser.sh
bash scripts/install-axe.sh
bash scripts/install-sdk-venv.sh
bash scripts/install-schemathesis.sh
bash scripts/install-moto.sh
bash scripts/install-pillow.sh
bash scripts/install-postgres.sh
TALLY_LAZYFS="$(bash scripts/install-lazyfs.sh)"
export TALLY_LAZYFS
exec bash scripts/with-postgres.sh bash -c '
    set -euo pipefail
    cargo test --workspace --all-targets --features failpoints -- --skip soak:: --skip powerloss::
    cargo test --features failpoints --test it soak:: -- --nocapture
    cargo test --features failpoints --test it powerloss:: -- --nocapture --test-threads=1
'
