#!/usr/bin/env bash
# Installs Debian's PostgreSQL server binaries (initdb, pg_ctl, postgres, psql) for the tests that
# run the store against a real PostgreSQL. Idempotent: does nothing when they are already there.
# Only the binaries are needed: the tests start their own throw-away server
# (scripts/with-postgres.sh); the packaged cluster Debian may create is not used.
set -euo pipefail
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -n "$bindir" ] && [ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] && [ -x "$bindir/psql" ] && id postgres >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends postgresql postgresql-client
