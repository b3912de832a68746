#!/usr/bin/env bash
# The final sitting: A/B base vs new (3 interleaved rounds), side_by_side with the peers, a profile, images, PG.
set -u
OUT=${1:-/tmp/sitting}
NEW=${2:-/tmp/new-tally}
BASE=/tmp/base-tally
mkdir -p $OUT
log() { echo "$(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) $*" | tee -a $OUT/log.txt; }
log start
for r in 1 2 3; do
  for b in base new; do
    exe=$BASE; [ $b = new ] && exe=$NEW
    d=$(mktemp -d /tmp/sit-XXXX)
    $exe bench --quick --only e2e,pickup,images --json --out $d > $OUT/$b-$r.json 2>/dev/null
    rm -rf $d
    log "$b-$r done"
  done
done
(cd /tmp/bench-peers && python3 side_by_side.py $NEW 3 > $OUT/sbs.json 2>$OUT/sbs.err)
log "side_by_side done"
d=$(mktemp -d /tmp/sit-XXXX); $NEW bench --quick --only e2e --profile --json --out $d > $OUT/profile.json 2>/dev/null; rm -rf $d
log "profile done"
for r in 1 2; do
  (cd /work/main && bash scripts/with-postgres.sh sh -c "$NEW bench --quick --backend postgres --postgres-url \$TALLY_TEST_PG_URL --json" > $OUT/pg-$r.json 2>$OUT/pg-$r.err)
  log "pg-$r done"
done
log end
