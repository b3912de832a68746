#!/usr/bin/env bash
# Creates target/pillow-venv with Pillow pinned (version and wheel hashes) in
# tests/pillow/requirements.txt, for tests/it/pillow.rs, which checks the delivery renderer's
# output against Pillow's. Idempotent (see pinned-venv.sh).
set -euo pipefail
exec bash "$(dirname "$0")/pinned-venv.sh" target/pillow-venv tests/pillow/requirements.txt bin/python
