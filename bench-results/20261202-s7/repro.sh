#!/bin/sh
# Session 7's reproduction of "idle under load": a foreign session on the same database sends
# tally's wake-up channel names (as another schema's busy nodes did before schema version 9)
# while `tally bench --backend postgres` measures two idle nodes.
#   BIN=target/debug/tally bash scripts/with-postgres.sh bench-results/20261202-s7/repro.sh
# Before the fix the idle windows counted thousands of statements; after, 0 (its bare
# `tally_due`/`tally_lease` names no longer reach any node).
here=$(cd "$(dirname "$0")" && pwd)
PGB=$(ls -d /usr/lib/postgresql/*/bin | tail -1)/pgbench
$PGB -n -f "$here/notify.sql" -R "${RATE:-50}" -T 200 "$TALLY_TEST_PG_URL" > /dev/null 2>&1 &
G=$!
"$BIN" bench --backend postgres --quick --json --postgres-url "$TALLY_TEST_PG_URL" --out "$(mktemp -d)" > "${OUT:-/tmp/repro.json}"
echo "bench rc=$?"
kill $G
