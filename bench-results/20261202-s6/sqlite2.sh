#!/usr/bin/env bash
set -u
out=/tmp/perfrun/sqlite2
for r in 1 2 3 4; do
  for v in A B; do
    echo "$(date -u +%T) round $r $v load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
    /tmp/tally-$v bench --quick --only e2e --json --out $(mktemp -d /tmp/perfrun/data/XXXX) > $out/$v-$r.json 2> $out/$v-$r.err
  done
done
echo "$(date -u +%T) done load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
