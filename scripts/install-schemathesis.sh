#!/usr/bin/env bash
# Creates target/schemathesis-venv with schemathesis from PyPI, pinned with its dependencies in
# tests/openapi/requirements.txt, for the OpenAPI conformance test (tests/it/openapi.rs runs it
# against a real `tally serve` and its GET /v1/openapi.json). Kept apart from target/sdk-venv
# (the provider SDKs) so neither pins the other's dependencies. Idempotent and fast when the
# venv already matches the requirements file; installs Debian's python3 and python3-venv
# first when they are missing.
set -euo pipefail
exec bash "$(dirname "$0")/pinned-venv.sh" target/schemathesis-venv tests/openapi/requirements.txt bin/schemathesis
