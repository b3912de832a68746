#!/usr/bin/env bash
# Interleaved PostgreSQL A/B of the dispatch change: S1 = perf before it (the provider-cap lock), B = after
# (slot rows); both with stage timing compiled in, off; then one --profile run of each.
set -u
out=/tmp/perfrun/pg; mkdir -p $out
url=$TALLY_TEST_PG_URL
for r in 1 2; do
  for v in S1 B; do
    echo "$(date -u +%T) round $r $v load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
    /tmp/tally-$v bench --quick --backend postgres --postgres-url $url --json --out $(mktemp -d /tmp/perfrun/data/XXXX) > $out/$v-$r.json 2> $out/$v-$r.err
  done
done
for v in S1 B; do
  echo "$(date -u +%T) profile $v load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
  /tmp/tally-$v bench --quick --backend postgres --postgres-url $url --json --profile --out $(mktemp -d /tmp/perfrun/data/XXXX) > $out/$v-profile.json 2> $out/$v-profile.err
done
echo "$(date -u +%T) done load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
