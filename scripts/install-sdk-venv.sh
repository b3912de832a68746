#!/usr/bin/env bash
# Creates target/sdk-venv with the official provider SDKs pinned in tests/sdk/requirements.txt
# (openai, replicate, fal-client, dashscope and their dependencies, from PyPI), for the SDK contract tests
# (tests/providers/providers_sdk.rs runs tests/sdk/contract.py against a real `tally mock-provider`).
# Idempotent (see pinned-venv.sh).
set -euo pipefail
exec bash "$(dirname "$0")/pinned-venv.sh" target/sdk-venv tests/sdk/requirements.txt bin/python
