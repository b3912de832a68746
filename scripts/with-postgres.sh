#!/usr/bin/env bash
# Runs a command with a throw-away PostgreSQL server: `scripts/with-postgres.sh CMD ARGS...`.
#
# The server is made from Debian's binaries (scripts/install-postgres.sh installs them) in a
# temporary directory, listens on a free loopback port only (its Unix socket in a private
# directory), trusts local connections, and is stopped by its PID when the command ends,
# whatever happened. `initdb` refuses root, so as root every server command runs as the
# `postgres` user. The command sees TALLY_TEST_PG_URL=postgres://postgres@127.0.0.1:PORT/postgres;
# the tests give each store its own schema in that database. fsync is off: the tests kill
# tally, never this server, so what PostgreSQL's own durability would add is not under test.
set -euo pipefail
if [ "$#" -eq 0 ]; then
    echo "usage: $0 COMMAND [ARGS...]" >&2
    exit 2
fi
bindir=${PG_BINDIR:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)}
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    echo "with-postgres: no PostgreSQL binaries under /usr/lib/postgresql (run scripts/install-postgres.sh)" >&2
    exit 1
fi
as_server=()
if [ "$(id -u)" = "0" ]; then
    as_server=(runuser -u postgres --)
fi
root=$(mktemp -d "${TMPDIR:-/tmp}/tally-pg.XXXXXX")
mkdir "$root/sock"
chmod 700 "$root/sock"
if [ "$(id -u)" = "0" ]; then
    chown -R postgres: "$root"
fi
pid=""
stop() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        "${as_server[@]}" "$bindir/pg_ctl" -D "$root/data" -m fast -w -t 20 stop >/dev/null 2>&1 || true
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -rf "$root"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
"${as_server[@]}" "$bindir/initdb" -D "$root/data" -A trust -U postgres -E UTF8 --no-sync >"$root/initdb.log" 2>&1 || {
    echo "with-postgres: initdb failed:" >&2
    tail -5 "$root/initdb.log" >&2
    exit 1
}
port=""
for _ in $(seq 1 20); do
    candidate=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$candidate") 2>/dev/null; then
        port=$candidate
        opts="-p $port -k $root/sock -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300"
        opts="$opts -c shared_buffers=32MB"
        if "${as_server[@]}" "$bindir/pg_ctl" -D "$root/data" -l "$root/server.log" -w -t 30 -o "$opts" start >/dev/null 2>&1; then
            break
        fi
        port=""
    fi
done
if [ -z "$port" ]; then
    echo "with-postgres: PostgreSQL did not start:" >&2
    tail -5 "$root/server.log" >&2 || true
    exit 1
fi
pid=$(head -1 "$root/data/postmaster.pid")
export TALLY_TEST_PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
echo "with-postgres: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') (pid $pid) at $TALLY_TEST_PG_URL" >&2
set +e
"$@"
rc=$?
set -e
exit $rc
