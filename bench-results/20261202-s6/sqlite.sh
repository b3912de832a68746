#!/usr/bin/env bash
# Interleaved SQLite A/B: A = main (2057a5a, no stage timing compiled in), B = perf (timing compiled in, off),
# P = perf with --profile. Three rounds, quick e2e.
set -u
out=/tmp/perfrun/sqlite; mkdir -p $out
for r in 1 2 3; do
  for v in A B P; do
    bin=/tmp/tally-$v; args=""
    [ $v = P ] && { bin=/tmp/tally-B; args="--profile"; }
    echo "$(date -u +%T) round $r $v load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
    $bin bench --quick --only e2e --json $args --out $(mktemp -d /tmp/perfrun/data/XXXX) > $out/$v-$r.json 2> $out/$v-$r.err
  done
done
echo "$(date -u +%T) done load $(cut -d' ' -f1 /proc/loadavg)" >> $out/log.txt
