#!/usr/bin/env bash
# The project's test suite: every unit and integration test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --all-targets
