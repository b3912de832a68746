#!/usr/bin/env bash
# Creates target/schemathesis-venv with schemathesis from PyPI, pinned with its dependencies in
# tests/openapi/requirements.txt, for the OpenAPI conformance test (tests/it/openapi.rs runs it
# against a real `tally serve` and its GET /v1/openapi.json). Kept apart from target/sdk-venv
# (the provider SDKs) so neither pins the other's dependencies. Idempotent and fast when the
# venv already matches the requirements file; installs Debian's python3 and python3-venv
# first when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/schemathesis-venv
REQ=tests/openapi/requirements.txt
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [ -x "$VENV/bin/schemathesis" ] && [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    exit 0
fi
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends python3 python3-venv
fi
rm -rf "$VENV"
mkdir -p target
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-input -r "$REQ"
echo "$want" > "$VENV/.requirements.sha256"
