#!/usr/bin/env bash
# Creates target/moto-venv with moto's server mode from PyPI, pinned with its dependencies in
# tests/s3/requirements.txt: the real S3-compatible server that tests/it/delivery_s3.rs starts
# (on a free loopback port, one per test) to test the `s3` delivery target. Idempotent and fast
# when the venv already matches the requirements file; installs Debian's python3 and
# python3-venv first when they are missing.
set -euo pipefail
exec bash "$(dirname "$0")/pinned-venv.sh" target/moto-venv tests/s3/requirements.txt bin/moto_server
