#!/usr/bin/env bash
# The project's whole test suite: unit tests, the integration binary (API, CLI, engine, sets,
# provider adapters against the mock provider), and — because crash points are compiled in with
# `--features failpoints` — the crash matrix and the chaos soak against the real binary.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-targets --features failpoints
